//! Header rules between client and upstream, as ingress-nginx applies them, in one place for
//! both the HTTP/1.1 byte writer (`h1/request.rs`) and the HTTP/2 `HeaderMap` path.
//!
//! ```text
//!   request header class             what the upstream gets
//!   hop-by-hop (Connection and what   nothing (an allowed WebSocket upgrade is re-added by the
//!     it lists, Keep-Alive, TE, …)     HTTP/1.1 path itself)
//!   set by the proxy (Host,           the proxy's value only: a client cannot claim another
//!     X-Forwarded-*, X-Real-IP,        address, scheme, port or original URI
//!     X-Scheme, X-Original-URI, …)
//!   spoofable trust headers           nothing (Forwarded, X-Forwarded-Prefix, Proxy)
//!   names with `_`                    nothing, unless --enable-underscores-in-headers
//!   X-Request-ID                      the client's when it is a sensible id, else a new one
//! ```
//!
//! Backends set up for ingress-nginx trust these headers, so the proxy sets every one of them
//! itself, from the client identity phase's values: `X-Forwarded-For` is the client's address
//! (the peer's, or the one trusted forwarded headers name), or with
//! `compute-full-forwarded-for` the incoming list with the peer appended; what the client sent
//! there travels as `X-Original-Forwarded-For`, as ingress-nginx passes it.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use ingress_wire::header::{Kind, chain_value, kind, passes, same_name, tokens, usable_request_id};

use super::phase::identity::ClientSide;

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
/// Sent only when a route's policy asks (`x-forwarded-prefix` with `rewrite-target`); a client's
/// own is dropped as spoofable.
pub static X_FORWARDED_PREFIX: HeaderName = HeaderName::from_static("x-forwarded-prefix");
pub static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
pub static X_FORWARDED_SCHEME: HeaderName = HeaderName::from_static("x-forwarded-scheme");
pub static X_SCHEME: HeaderName = HeaderName::from_static("x-scheme");
pub static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
pub static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
pub static X_ORIGINAL_FORWARDED_FOR: HeaderName =
    HeaderName::from_static("x-original-forwarded-for");
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Per-request values of the headers the proxy sets.
#[derive(Clone, Copy, Debug)]
pub struct RequestSide<'a> {
    /// The validated authority: the upstream's `Host` and `X-Forwarded-Host`.
    pub authority: &'a str,
    /// A `Host` to send instead (`upstream-vhost`); `X-Forwarded-Host` keeps `authority`.
    pub host: Option<&'a str>,
    /// The target as the client sent it: `X-Original-URI`.
    pub original_uri: &'a str,
}

/// Options for request headers; from flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeaderOptions {
    /// Pass on header names containing `_` (`--enable-underscores-in-headers`).
    pub underscores: bool,
}

/// Rewrites an HTTP/2 request's headers for an HTTP/1.1 upstream with the same rules the
/// HTTP/1.1 path applies byte by byte (a table test in `h1/request.rs` holds them together).
pub fn rewrite_request(
    headers: &mut HeaderMap,
    client: &ClientSide,
    request: &RequestSide<'_>,
    options: &HeaderOptions,
) {
    let mut chain = Vec::new();
    for value in headers.get_all(&X_FORWARDED_FOR) {
        if let Some(value) = chain_value(value.as_bytes()) {
            if !chain.is_empty() {
                chain.extend_from_slice(b", ");
            }
            chain.extend_from_slice(value);
        }
    }
    let request_id = headers
        .get(&X_REQUEST_ID)
        .filter(|v| usable_request_id(v.as_bytes()))
        .cloned();
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| tokens(v.as_bytes()))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    headers.retain_names(|name| passes(name.as_str(), kind(name.as_str()), options.underscores));
    for name in listed {
        headers.remove(name);
    }
    let value = |s: &str| HeaderValue::from_str(s).ok();
    if let Some(host) = value(request.authority) {
        let sent = request.host.and_then(value).unwrap_or_else(|| host.clone());
        headers.insert(header::HOST, sent);
        headers.insert(
            X_FORWARDED_HOST.clone(),
            client.host.clone().unwrap_or(host),
        );
    }
    headers.insert(X_FORWARDED_FOR.clone(), client.forwarded_for.clone());
    if let Ok(chain) = HeaderValue::from_bytes(&chain)
        && !chain.is_empty()
    {
        headers.insert(X_ORIGINAL_FORWARDED_FOR.clone(), chain);
    }
    headers.insert(X_REAL_IP.clone(), client.client_ip.clone());
    let proto = HeaderValue::from_static(client.proto());
    headers.insert(X_FORWARDED_PROTO.clone(), proto.clone());
    headers.insert(X_FORWARDED_SCHEME.clone(), proto.clone());
    headers.insert(X_SCHEME.clone(), proto);
    headers.insert(X_FORWARDED_PORT.clone(), client.port.clone());
    if let Some(uri) = value(request.original_uri) {
        headers.insert(X_ORIGINAL_URI.clone(), uri);
    }
    let id = request_id.unwrap_or_else(|| {
        HeaderValue::from_bytes(&new_request_id()).unwrap_or_else(|_| HeaderValue::from_static("0"))
    });
    headers.insert(X_REQUEST_ID.clone(), id);
}

/// Drops the client's headers that a backend reading `_` as `-` would take for one of `set`,
/// the names the proxy sets on this request (auth response headers, `proxy-set-headers`):
/// only names with `_` can be such, so only `--enable-underscores-in-headers` leaves any.
pub fn drop_underscore_aliases<'n>(
    headers: &mut HeaderMap,
    set: impl Iterator<Item = &'n HeaderName> + Clone,
) {
    headers.retain_names(|name| {
        let name = name.as_str();
        !name.contains('_') || !set.clone().any(|s| same_name(s.as_str(), name))
    });
}

/// Removes hop-by-hop headers from an upstream's response, including every header its
/// `Connection` header lists.
pub fn strip_response_hop_by_hop(headers: &mut HeaderMap) {
    let hop = |name: &HeaderName| {
        matches!(
            kind(name.as_str()),
            Kind::Connection | Kind::HopByHop | Kind::TransferEncoding | Kind::Upgrade
        )
    };
    // Most responses carry none of these; one pass over the names is cheaper than lookups
    // that find nothing.
    if !headers.keys().any(hop) {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|v| tokens(v.as_bytes()))
        .filter_map(|t| HeaderName::from_bytes(t).ok())
        .collect();
    for name in listed {
        headers.remove(name);
    }
    headers.retain_names(|name| !hop(name));
}

/// 128 random bits as 32 hex digits.
pub fn new_request_id() -> [u8; 32] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut id = [0u8; 32];
    let random = fastrand::u128(..);
    for (i, slot) in id.iter_mut().enumerate() {
        *slot = HEX[((random >> (i * 4)) & 0xf) as usize];
    }
    id
}

/// `HeaderMap::retain` by name, which `http` does not offer.
trait RetainNames {
    fn retain_names(&mut self, keep: impl FnMut(&HeaderName) -> bool);
}

impl RetainNames for HeaderMap {
    fn retain_names(&mut self, mut keep: impl FnMut(&HeaderName) -> bool) {
        let dropped: Vec<HeaderName> = self.keys().filter(|n| !keep(n)).cloned().collect();
        for name in dropped {
            self.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use ingress_wire::request::{self, MAX_HEADERS, RequestParse, Upstream, UpstreamBody};
    use ingress_wire::target::{self, PathSettings};

    use super::*;
    use std::net::IpAddr;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn names(h: &HeaderMap) -> Vec<String> {
        let mut n: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        n.sort();
        n
    }

    const SET: [&str; 11] = [
        "host",
        "x-forwarded-for",
        "x-forwarded-host",
        "x-forwarded-port",
        "x-forwarded-proto",
        "x-forwarded-scheme",
        "x-original-uri",
        "x-real-ip",
        "x-request-id",
        "x-scheme",
        "",
    ];

    #[test]
    fn request_header_classes() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let client = ClientSide::new(ip, false, 80);
        let request = RequestSide {
            host: None,
            authority: "shop.example.com:8080",
            original_uri: "/a/../b?x",
        };
        let plain = HeaderOptions::default();
        let cases: &[(&[(&str, &str)], &HeaderOptions, &[&str])] = &[
            (&[("accept", "*/*")], &plain, &["accept"]),
            (
                &[
                    ("connection", "x-secret, close"),
                    ("x-secret", "1"),
                    ("keep-alive", "timeout=5"),
                    ("te", "trailers"),
                    ("trailer", "x"),
                    ("proxy-authorization", "basic x"),
                    ("proxy-connection", "keep-alive"),
                    ("upgrade", "h2c"),
                ],
                &plain,
                &[],
            ),
            (
                &[
                    ("forwarded", "for=1.2.3.4;proto=https"),
                    ("x-forwarded-prefix", "/admin"),
                    ("proxy", "http://evil"),
                    ("x-original-uri", "/admin"),
                    ("x-scheme", "https"),
                ],
                &plain,
                &[],
            ),
            (&[("x_forwarded_for", "1.2.3.4")], &plain, &[]),
            (
                &[("x_custom", "1")],
                &HeaderOptions { underscores: true },
                &["x_custom"],
            ),
        ];
        for (input, options, kept) in cases {
            let mut h = headers(input);
            rewrite_request(&mut h, &client, &request, options);
            let mut want: Vec<String> = SET
                .iter()
                .chain(kept.iter())
                .filter(|n| !n.is_empty())
                .map(|n| n.to_string())
                .collect();
            want.sort();
            assert_eq!(names(&h), want, "{input:?}");
        }
    }

    #[test]
    fn values_the_proxy_sets() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let tls = ClientSide::new(ip, true, 443);
        let request = RequestSide {
            host: None,
            authority: "shop.example.com",
            original_uri: "/p?q=1",
        };
        let mut h = headers(&[
            ("x-forwarded-for", "10.0.0.1"),
            ("x-forwarded-for", " "),
            ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
            ("x-forwarded-proto", "http"),
            ("x-real-ip", "1.1.1.1"),
            ("x-forwarded-host", "evil"),
            ("host", "ignored"),
            ("x-request-id", "abc"),
        ]);
        rewrite_request(&mut h, &tls, &request, &HeaderOptions::default());
        let get = |n: &str| h.get(n).and_then(|v| v.to_str().ok()).unwrap_or("-");
        assert_eq!(get("host"), "shop.example.com");
        assert_eq!(get("x-forwarded-host"), "shop.example.com");
        assert_eq!(get("x-forwarded-for"), "192.0.2.7");
        assert_eq!(
            get("x-original-forwarded-for"),
            "10.0.0.1, 10.0.0.2, 10.0.0.3"
        );
        assert_eq!(get("x-real-ip"), "192.0.2.7");
        assert_eq!(get("x-forwarded-proto"), "https");
        assert_eq!(get("x-scheme"), "https");
        assert_eq!(get("x-forwarded-port"), "443");
        assert_eq!(get("x-original-uri"), "/p?q=1");
        assert_eq!(get("x-request-id"), "abc");
        assert_eq!(h.get_all("x-forwarded-for").iter().count(), 1);

        let mut h = headers(&[("x-request-id", "has space")]);
        rewrite_request(&mut h, &tls, &request, &HeaderOptions::default());
        assert_eq!(h.get("x-request-id").unwrap().len(), 32);
    }

    #[test]
    fn response_hop_by_hop() {
        let mut h = headers(&[
            ("connection", "close, x-hop"),
            ("x-hop", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("content-type", "text/plain"),
        ]);
        strip_response_hop_by_hop(&mut h);
        assert_eq!(names(&h), ["content-type"]);
    }

    #[test]
    fn underscore_aliases_of_the_headers_a_route_sets_are_dropped() {
        let mut h = headers(&[
            ("x_auth_request_user", "root"),
            ("X_Auth_Request_Email", "root@example"),
            ("x-auth-request-user", "exact, replaced by the caller"),
            ("x_other", "kept"),
            ("accept", "kept"),
        ]);
        let set = [
            HeaderName::from_static("x-auth-request-user"),
            HeaderName::from_static("x-auth-request-email"),
        ];
        drop_underscore_aliases(&mut h, set.iter());
        assert_eq!(names(&h), ["accept", "x-auth-request-user", "x_other"]);
    }

    /// The HTTP/1.1 path's upstream head and the HTTP/2 path's HeaderMap rewrite agree.
    #[test]
    fn upstream_heads_match_the_header_map_rules() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let cases: &[(&[(&str, &str)], bool, bool)] = &[
            (&[("host", "shop.example.com:8080")], false, false),
            (
                &[
                    ("Host", "a"),
                    ("X-Forwarded-For", "10.0.0.1"),
                    ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
                    ("X-Forwarded-Proto", "https"),
                    ("X-Real-IP", "1.1.1.1"),
                    ("X-Forwarded-Host", "evil"),
                    ("X-Original-URI", "/admin"),
                    ("X-Scheme", "https"),
                    ("Forwarded", "for=1.1.1.1"),
                    ("X-Forwarded-Prefix", "/x"),
                    ("Proxy", "http://evil"),
                    ("Accept", "*/*"),
                ],
                true,
                false,
            ),
            (
                &[
                    ("host", "a"),
                    ("connection", "x-secret, keep-alive"),
                    ("x-secret", "1"),
                    ("keep-alive", "timeout=5"),
                    ("te", "trailers"),
                    ("trailer", "x"),
                    ("proxy-authorization", "basic x"),
                    ("proxy-connection", "keep-alive"),
                    ("x-other", "2"),
                    ("x-request-id", "abc"),
                ],
                false,
                false,
            ),
            (&[("host", "a"), ("x-forwarded-for", "  ")], false, false),
            (
                &[("host", "a"), ("x_forwarded_for", "1.2.3.4"), ("x_ok", "1")],
                false,
                false,
            ),
            (
                &[("host", "a"), ("x_forwarded_for", "1.2.3.4"), ("x_ok", "1")],
                false,
                true,
            ),
            (&[("host", "a"), ("x-request-id", "bad id")], false, false),
            (
                &[
                    ("host", "a"),
                    ("X_Real_IP", "1.1.1.1"),
                    ("x-forwarded_proto", "https"),
                    ("ssl_client_verify", "SUCCESS"),
                    ("SSL_CLIENT_SUBJECT_DN", "CN=admin"),
                    ("x_request_id", "abc"),
                    ("content_length", "5"),
                    ("x_custom", "kept"),
                ],
                true,
                true,
            ),
        ];
        let paths = PathSettings::default();
        for (pairs, https, underscores) in cases {
            let client = ClientSide::new(ip, *https, if *https { 443 } else { 80 });
            let options = HeaderOptions {
                underscores: *underscores,
            };
            let mut text = "GET /p/../q?x=1 HTTP/1.1\r\n".to_string();
            for (k, v) in *pairs {
                text.push_str(&format!("{k}: {v}\r\n"));
            }
            text.push_str("\r\n");
            let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let RequestParse::Complete(req) = request::parse(text.as_bytes(), &mut storage) else {
                panic!("not complete: {text:?}");
            };
            let target = target::parse(&req.target, &paths).unwrap();
            let authority = req.authority.as_ref().unwrap().raw;
            let mut out = Vec::new();
            request::write_upstream(
                &mut out,
                &req,
                &Upstream {
                    target: &target,
                    authority,
                    host: Some("internal.example"),
                    client: client.facts(),
                    underscores: options.underscores,
                    body: UpstreamBody::None,
                    upgrade: false,
                    new_request_id: new_request_id(),
                    forwarded_prefix: None,
                    set_headers: &[],
                },
            );

            let mut fast = HeaderMap::new();
            let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut parsed = httparse::Request::new(&mut storage);
            assert!(parsed.parse(&out).unwrap().is_complete(), "{out:?}");
            assert_eq!(parsed.path, Some("/q?x=1"), "the normalised target is sent");
            for h in parsed.headers.iter() {
                fast.append(
                    HeaderName::from_bytes(h.name.as_bytes()).unwrap(),
                    HeaderValue::from_bytes(h.value).unwrap(),
                );
            }

            let mut slow = HeaderMap::new();
            for (k, v) in *pairs {
                slow.append(
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                );
            }
            let request = RequestSide {
                authority,
                host: Some("internal.example"),
                original_uri: "/p/../q?x=1",
            };
            rewrite_request(&mut slow, &client, &request, &options);

            let names = |m: &HeaderMap| {
                let mut n: Vec<String> = m.keys().map(|k| k.to_string()).collect();
                n.sort();
                n
            };
            assert_eq!(names(&fast), names(&slow), "{pairs:?}");
            // Whatever `_` passed is no header the proxy owns, however a backend spells it.
            for name in slow.keys().filter(|n| n.as_str().contains('_')) {
                assert!(*underscores, "{name}");
                assert_eq!(
                    ingress_wire::header::kind_as_dashes(name.as_str()),
                    Kind::Other,
                    "{name}"
                );
            }
            for name in slow.keys() {
                if name == "x-request-id" && slow.get(name).is_some_and(|v| v.len() == 32) {
                    assert_eq!(fast.get(name).unwrap().len(), 32);
                    continue;
                }
                let all = |m: &HeaderMap| {
                    m.get_all(name)
                        .iter()
                        .map(|v| v.to_str().unwrap().to_string())
                        .collect::<Vec<_>>()
                };
                assert_eq!(all(&fast), all(&slow), "{pairs:?} {name}");
            }
        }
    }
}
