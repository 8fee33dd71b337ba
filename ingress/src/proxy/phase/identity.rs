//! The client identity phase: who is on the other end of a connection, decided once when it is
//! accepted (the TCP peer, or with `--use-proxy-protocol` the client the load balancer's PROXY
//! protocol header names, `proxy::proxy_protocol`), and then per request when forwarded
//! headers are trusted (`use-forwarded-headers`): the client address their chain names, walked
//! from that peer past trusted hops only (`snapshot::global::ForwardedPolicy::client`), and
//! the scheme, host and port they name. Every later phase (access, the forwarding headers,
//! the access log) reads the client from here. On TLS, the client certificate its handshake
//! presented and what verifying it found (`auth-tls-*`) are part of who it is.
//!
//! ```text
//!   accept ── PROXY header? ──> ConnInfo (per connection)
//!   request ── forwarded headers trusted? ──> a ConnInfo for this request only
//! ```

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use ingress_wire::request::ClientFacts;

use super::RequestHeaders;
use crate::snapshot::annotations::snippet::RequestEdits;
use crate::snapshot::client_auth::{ClientAuth, PresentedCert, Verification};
use crate::snapshot::global::ForwardedPolicy;

/// What the proxy knows about one client connection.
#[derive(Clone, Debug)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub local_port: u16,
    pub https: bool,
    /// The TLS server name the client sent, if any, lower-case.
    pub sni: Option<String>,
    /// Forwarding header values, made once per connection.
    pub client: ClientSide,
    /// TLS negotiated HTTP/2 by ALPN.
    pub h2: bool,
    /// The client-certificate rules its SNI chose, and what verifying its certificate found
    /// (`None`: its host asks for none).
    pub client_cert: Option<Arc<ClientCert>>,
}

impl ConnInfo {
    pub fn new(peer: SocketAddr, local_port: u16, https: bool) -> Self {
        Self {
            peer,
            local_port,
            https,
            sni: None,
            client: ClientSide::new(peer.ip(), https, local_port),
            h2: false,
            client_cert: None,
        }
    }
}

impl ConnInfo {
    /// Takes `client` as the connection's client: what every later phase reads.
    pub fn believe(&mut self, client: SocketAddr) {
        self.peer = client;
        self.client = ClientSide::new(client.ip(), self.https, self.local_port);
    }

    /// The client side of one request, when `policy` makes it differ from the connection's
    /// (`None`: the connection's holds). The peer's hops are judged from `self.peer`, which
    /// is the PROXY-named client with PROXY protocol on.
    pub(crate) fn for_request(
        &self,
        policy: &ForwardedPolicy,
        headers: &dyn RequestHeaders,
    ) -> Option<Box<ConnInfo>> {
        if !policy.is_active() {
            return None;
        }
        let chain = headers.all(policy.header.as_str());
        let peer = self.peer.ip();
        let client = policy.client(peer, chain.iter().copied());
        let mut side = ClientSide::new(client, self.https, self.local_port);
        if policy.enabled && policy.trusts(peer, true) {
            if let Some(https) = headers.header("x-forwarded-proto").and_then(proto) {
                side.https = https;
            }
            if let Some(port) = headers.header("x-forwarded-port").and_then(port) {
                side.port = port;
            }
            side.host = headers
                .header("x-forwarded-host")
                .filter(|h| !h.is_empty() && h.iter().all(u8::is_ascii_graphic))
                .and_then(|h| HeaderValue::from_bytes(h).ok());
        }
        if policy.compute_full && !chain.is_empty() {
            // ingress-nginx's `$http_x_forwarded_for, $realip_remote_addr`: the list as it
            // came, with the address that connected to us (or the PROXY-named one) appended.
            let mut list = Vec::new();
            for value in &chain {
                if let Some(value) = ingress_wire::header::chain_value(value) {
                    list.extend_from_slice(value);
                    list.extend_from_slice(b", ");
                }
            }
            list.extend_from_slice(peer.to_string().as_bytes());
            if let Ok(value) = HeaderValue::from_bytes(&list) {
                side.forwarded_for = value;
            }
        }
        // Most requests from an untrusted peer, or without the headers, change nothing: no
        // copy of the connection's values for them.
        if side == self.client {
            return None;
        }
        let mut conn = self.clone();
        conn.peer = SocketAddr::new(client, self.peer.port());
        conn.client = side;
        Some(Box::new(conn))
    }
}

/// `X-Forwarded-Proto`: `http` or `https` only; anything else is not believed.
fn proto(value: &[u8]) -> Option<bool> {
    let value = value.trim_ascii();
    if value.eq_ignore_ascii_case(b"https") {
        Some(true)
    } else if value.eq_ignore_ascii_case(b"http") {
        Some(false)
    } else {
        None
    }
}

/// `X-Forwarded-Port`: a port number.
fn port(value: &[u8]) -> Option<HeaderValue> {
    let value = value.trim_ascii();
    std::str::from_utf8(value)
        .ok()?
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .and_then(|_| HeaderValue::from_bytes(value).ok())
}

/// What the upstream is told about the client side of one connection, as header values made
/// once per connection rather than once per request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSide {
    /// `X-Real-IP`: the client's address.
    pub client_ip: HeaderValue,
    /// `X-Forwarded-For`: the client's address, or with `compute-full-forwarded-for` the
    /// incoming list with the peer appended.
    pub forwarded_for: HeaderValue,
    pub https: bool,
    /// The port the client connected to.
    pub port: HeaderValue,
    /// `X-Forwarded-Host` from a trusted proxy, instead of the request's own authority.
    pub host: Option<HeaderValue>,
}

impl ClientSide {
    pub fn new(client_ip: IpAddr, https: bool, port: u16) -> Self {
        let value = |s: String| {
            HeaderValue::from_str(&s).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
        };
        let client_ip = value(client_ip.to_string());
        Self {
            forwarded_for: client_ip.clone(),
            client_ip,
            https,
            port: value(port.to_string()),
            host: None,
        }
    }

    pub fn proto(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// The same, as the HTTP/1.1 writer takes them.
    pub fn facts(&self) -> ClientFacts<'_> {
        ClientFacts {
            ip: self.client_ip.as_bytes(),
            forwarded_for: self.forwarded_for.as_bytes(),
            port: self.port.as_bytes(),
            https: self.https,
            host: self.host.as_ref().map(HeaderValue::as_bytes),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::sources::parse_ranges;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut map = http::HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    /// What the upstream is told, per request, by policy and peer.
    #[test]
    fn the_requests_client_side() {
        let trusted = ForwardedPolicy {
            enabled: true,
            trusted: parse_ranges("10.0.0.0/8").unwrap(),
            ..ForwardedPolicy::default()
        };
        let full = ForwardedPolicy {
            compute_full: true,
            ..trusted.clone()
        };
        let full_only = ForwardedPolicy {
            compute_full: true,
            ..ForwardedPolicy::default()
        };
        let off = ForwardedPolicy::default();
        let sent = [
            ("x-forwarded-for", "198.51.100.1, 203.0.113.9"),
            ("x-forwarded-proto", "HTTPS"),
            ("x-forwarded-port", "8443"),
            ("x-forwarded-host", "www.example.com"),
        ];
        let junk = [
            ("x-forwarded-proto", "gopher"),
            ("x-forwarded-port", "99999"),
            ("x-forwarded-host", "a b"),
        ];
        // (policy, peer, headers, X-Real-IP, X-Forwarded-For, https, port, host)
        type Case<'a> = (
            &'a ForwardedPolicy,
            &'a str,
            &'a [(&'a str, &'a str)],
            Option<(&'a str, &'a str, bool, &'a str, Option<&'a str>)>,
        );
        let cases: &[Case] = &[
            (&off, "10.1.1.1", &sent, None),
            (
                &trusted,
                "10.1.1.1",
                &sent,
                Some((
                    "203.0.113.9",
                    "203.0.113.9",
                    true,
                    "8443",
                    Some("www.example.com"),
                )),
            ),
            // An untrusted peer: none of it is believed (the connection's values hold).
            (&trusted, "192.0.2.1", &sent, None),
            // Values that are not a scheme, a port or a host are not believed either.
            (&trusted, "10.1.1.1", &junk, None),
            (
                &full,
                "10.1.1.1",
                &sent,
                Some((
                    "203.0.113.9",
                    "198.51.100.1, 203.0.113.9, 10.1.1.1",
                    true,
                    "8443",
                    Some("www.example.com"),
                )),
            ),
            // compute-full-forwarded-for alone appends the peer and believes nothing.
            (
                &full_only,
                "192.0.2.1",
                &sent,
                Some((
                    "192.0.2.1",
                    "198.51.100.1, 203.0.113.9, 192.0.2.1",
                    false,
                    "80",
                    None,
                )),
            ),
            (
                // Nothing to append to: the connection's values hold.
                &full_only,
                "192.0.2.1",
                &[],
                None,
            ),
        ];
        for (policy, peer, pairs, want) in cases {
            let conn = ConnInfo::new(SocketAddr::new(peer.parse().unwrap(), 40000), 80, false);
            let got = conn.for_request(policy, &headers(pairs)).map(|c| {
                (
                    c.client.client_ip.to_str().unwrap().to_string(),
                    c.client.forwarded_for.to_str().unwrap().to_string(),
                    c.client.https,
                    c.client.port.to_str().unwrap().to_string(),
                    c.client
                        .host
                        .as_ref()
                        .map(|h| h.to_str().unwrap().to_string()),
                    c.peer.ip().to_string(),
                )
            });
            let want = want.map(|(ip, xff, https, port, host)| {
                (
                    ip.to_string(),
                    xff.to_string(),
                    https,
                    port.to_string(),
                    host.map(str::to_string),
                    ip.to_string(),
                )
            });
            assert_eq!(got, want, "{peer} {pairs:?}");
        }
    }
}

pub static SSL_CLIENT_CERT: HeaderName = HeaderName::from_static("ssl-client-cert");
pub static SSL_CLIENT_VERIFY: HeaderName = HeaderName::from_static("ssl-client-verify");
pub static SSL_CLIENT_SUBJECT_DN: HeaderName = HeaderName::from_static("ssl-client-subject-dn");
pub static SSL_CLIENT_ISSUER_DN: HeaderName = HeaderName::from_static("ssl-client-issuer-dn");

/// A TLS connection's client certificate, judged once after its handshake.
#[derive(Debug)]
pub struct ClientCert {
    /// The rules its SNI chose.
    pub auth: Arc<ClientAuth>,
    pub verification: Verification,
    pub presented: PresentedCert,
    /// The `ssl-client-*` headers for its requests, made once.
    pub headers: Arc<RequestEdits>,
}

impl ClientCert {
    pub fn new(
        auth: Arc<ClientAuth>,
        verification: Verification,
        presented: PresentedCert,
    ) -> Self {
        let value = |s: &str| {
            (!s.is_empty())
                .then(|| HeaderValue::from_str(s).ok())
                .flatten()
        };
        let mut set = vec![
            (
                SSL_CLIENT_VERIFY.clone(),
                value(&verification.header_value()),
            ),
            (SSL_CLIENT_SUBJECT_DN.clone(), value(&presented.subject_dn)),
            (SSL_CLIENT_ISSUER_DN.clone(), value(&presented.issuer_dn)),
        ];
        if auth.pass_certificate {
            set.push((SSL_CLIENT_CERT.clone(), value(&presented.escaped_pem)));
        }
        Self {
            auth,
            verification,
            presented,
            headers: Arc::new(RequestEdits { set }),
        }
    }
}
