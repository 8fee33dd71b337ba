//! Header rewriting between client and upstream, as ingress-nginx users expect it.
//!
//! Pure functions over `HeaderMap`, so every rule is table-tested without sockets.

use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

/// Headers that describe one hop and must not be forwarded (RFC 9110 section 7.6.1), plus the
/// non-standard ones proxies have historically honoured.
pub(crate) const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

pub static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
pub static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
pub static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");
pub static X_FORWARDED_PORT: HeaderName = HeaderName::from_static("x-forwarded-port");
pub static X_FORWARDED_SCHEME: HeaderName = HeaderName::from_static("x-forwarded-scheme");
pub static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Whether a request asks to switch protocols (WebSocket and friends).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE) && connection_has(headers, "upgrade")
}

fn connection_has(headers: &HeaderMap, token: &str) -> bool {
    headers.get_all(header::CONNECTION).iter().any(|v| {
        v.to_str()
            .is_ok_and(|s| s.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
    })
}

/// Removes hop-by-hop headers, including every header the `Connection` header lists. When
/// `keep_upgrade` is set the `Upgrade` header and a `Connection: upgrade` survive, because the
/// upstream must see them to agree to the switch.
pub fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    // Most messages carry none of these; one pass over the names is cheaper than eight
    // hash lookups that find nothing.
    if !keep_upgrade
        && !headers
            .keys()
            .any(|name| HOP_BY_HOP.contains(name) || name == header::UPGRADE)
    {
        return;
    }
    let listed: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|s| s.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .filter(|name| !(keep_upgrade && name == header::UPGRADE))
        .collect();
    for name in listed {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::UPGRADE);
    }
}

/// What the proxy knows about the client side of one connection, as header values made once
/// per connection rather than once per request.
#[derive(Clone, Debug)]
pub struct ClientSide {
    pub client_ip: HeaderValue,
    pub https: bool,
    /// The port the client connected to.
    pub port: HeaderValue,
}

impl ClientSide {
    pub fn new(client_ip: IpAddr, https: bool, port: u16) -> Self {
        let value = |s: String| {
            HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
        };
        Self {
            client_ip: value(client_ip.to_string()),
            https,
            port: value(port.to_string()),
        }
    }
}

/// Sets the forwarding headers. `X-Forwarded-For` is appended to (every such header the client
/// sent, in order), so the upstream sees the whole chain; the others describe this hop and overwrite whatever the client sent, so a client
/// cannot claim it came over HTTPS. `X-Forwarded-Host` is the Host the client sent, port
/// included, as ingress-nginx passes it.
pub fn add_forwarding(headers: &mut HeaderMap, client: &ClientSide, host: Option<&HeaderValue>) {
    let mut chain = Vec::new();
    for value in headers.get_all(&X_FORWARDED_FOR) {
        if let Some(value) = chain_value(value.as_bytes()) {
            chain.extend_from_slice(value);
            chain.extend_from_slice(b", ");
        }
    }
    chain.extend_from_slice(client.client_ip.as_bytes());
    match HeaderValue::from_bytes(&chain) {
        Ok(v) => headers.insert(X_FORWARDED_FOR.clone(), v),
        Err(_) => headers.insert(X_FORWARDED_FOR.clone(), client.client_ip.clone()),
    };
    headers.insert(X_REAL_IP.clone(), client.client_ip.clone());
    let proto = HeaderValue::from_static(if client.https { "https" } else { "http" });
    headers.insert(X_FORWARDED_PROTO.clone(), proto.clone());
    headers.insert(X_FORWARDED_SCHEME.clone(), proto);
    headers.insert(X_FORWARDED_PORT.clone(), client.port.clone());
    match host {
        Some(host) => headers.insert(X_FORWARDED_HOST.clone(), host.clone()),
        None => headers.remove(&X_FORWARDED_HOST),
    };
}

/// An existing `X-Forwarded-For` value worth keeping: trimmed, not empty, and printable (what
/// `HeaderValue::to_str` accepts).
pub fn chain_value(value: &[u8]) -> Option<&[u8]> {
    let value = value.trim_ascii();
    let printable = value
        .iter()
        .all(|&b| b == b'\t' || (b' '..0x7f).contains(&b));
    (!value.is_empty() && printable).then_some(value)
}

/// Gives the request an `X-Request-ID` if it has none, so logs on both sides can be joined.
pub fn ensure_request_id(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(existing) = headers.get(&X_REQUEST_ID) {
        return existing.clone();
    }
    // Hex digits are always a valid header value.
    let id = HeaderValue::from_bytes(&new_request_id())
        .unwrap_or_else(|_| HeaderValue::from_static("0"));
    headers.insert(X_REQUEST_ID.clone(), id.clone());
    id
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

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn hop_by_hop_table() {
        let cases: &[(&[(&str, &str)], bool, &[&str])] = &[
            (
                &[
                    ("connection", "keep-alive"),
                    ("keep-alive", "timeout=5"),
                    ("accept", "*/*"),
                ],
                false,
                &["accept"],
            ),
            (
                &[
                    ("connection", "x-secret, close"),
                    ("x-secret", "1"),
                    ("x-other", "2"),
                ],
                false,
                &["x-other"],
            ),
            (
                &[
                    ("te", "trailers"),
                    ("trailer", "x"),
                    ("transfer-encoding", "chunked"),
                ],
                false,
                &[],
            ),
            (
                &[
                    ("proxy-authorization", "basic x"),
                    ("proxy-connection", "keep-alive"),
                ],
                false,
                &[],
            ),
            (
                &[("upgrade", "websocket"), ("connection", "Upgrade")],
                false,
                &[],
            ),
            (
                &[
                    ("upgrade", "websocket"),
                    ("connection", "Upgrade"),
                    ("sec-websocket-key", "k"),
                ],
                true,
                &["connection", "sec-websocket-key", "upgrade"],
            ),
        ];
        for (input, keep_upgrade, want) in cases {
            let mut h = headers(input);
            strip_hop_by_hop(&mut h, *keep_upgrade);
            assert_eq!(names(&h), *want, "{input:?}");
        }
    }

    #[test]
    fn upgrade_detection() {
        assert!(is_upgrade(&headers(&[
            ("upgrade", "websocket"),
            ("connection", "keep-alive, Upgrade")
        ])));
        assert!(!is_upgrade(&headers(&[("upgrade", "websocket")])));
        assert!(!is_upgrade(&headers(&[("connection", "upgrade")])));
    }

    #[test]
    fn forwarding_table() {
        let ip: IpAddr = "192.0.2.7".parse().unwrap();
        let plain = ClientSide::new(ip, false, 80);
        let tls = ClientSide::new(ip, true, 443);
        let host = HeaderValue::from_static("shop.example.com:8080");
        let cases: &[(
            &[(&str, &str)],
            &ClientSide,
            Option<&HeaderValue>,
            &[(&str, &str)],
        )] = &[
            (
                &[],
                &plain,
                Some(&host),
                &[
                    ("x-forwarded-for", "192.0.2.7"),
                    ("x-real-ip", "192.0.2.7"),
                    ("x-forwarded-proto", "http"),
                    ("x-forwarded-host", "shop.example.com:8080"),
                    ("x-forwarded-port", "80"),
                    ("x-forwarded-scheme", "http"),
                ],
            ),
            (
                &[("x-forwarded-for", "10.0.0.1")],
                &plain,
                Some(&host),
                &[("x-forwarded-for", "10.0.0.1, 192.0.2.7")],
            ),
            (
                &[("x-forwarded-proto", "https"), ("x-real-ip", "1.1.1.1")],
                &plain,
                Some(&host),
                &[("x-forwarded-proto", "http"), ("x-real-ip", "192.0.2.7")],
            ),
            (
                &[],
                &tls,
                Some(&host),
                &[("x-forwarded-proto", "https"), ("x-forwarded-port", "443")],
            ),
            (&[("x-forwarded-host", "evil")], &plain, None, &[]),
            (
                &[
                    ("x-forwarded-for", "10.0.0.1"),
                    ("x-forwarded-for", " "),
                    ("x-forwarded-for", "10.0.0.2, 10.0.0.3"),
                ],
                &plain,
                Some(&host),
                &[("x-forwarded-for", "10.0.0.1, 10.0.0.2, 10.0.0.3, 192.0.2.7")],
            ),
        ];
        for (input, client, host, want) in cases {
            let mut h = headers(input);
            add_forwarding(&mut h, client, *host);
            for (k, v) in *want {
                assert_eq!(
                    h.get(*k).and_then(|v| v.to_str().ok()),
                    Some(*v),
                    "{input:?} {k}"
                );
            }
            if host.is_none() {
                assert!(h.get("x-forwarded-host").is_none());
            }
        }
    }

    #[test]
    fn request_id_is_kept_or_made() {
        let mut h = headers(&[("x-request-id", "abc")]);
        assert_eq!(ensure_request_id(&mut h), "abc");
        let mut h = HeaderMap::new();
        let id = ensure_request_id(&mut h);
        assert_eq!(id.len(), 32);
        assert_eq!(h.get("x-request-id"), Some(&id));
    }
}
