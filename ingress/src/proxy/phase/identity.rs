//! The client identity phase: who is on the other end of a connection, decided once when it is
//! accepted (the TCP peer, or with `--use-proxy-protocol` the client the load balancer's PROXY
//! protocol header names, `proxy::proxy_protocol`), and then per request when forwarded
//! headers are trusted (`use-forwarded-headers`): the client address their chain names, walked
//! from that peer past trusted hops only (`snapshot::global::ForwardedPolicy::client`), and
//! the scheme, host and port they name. Every later phase (access, the forwarding headers,
//! the access log) reads the client from here.
//!
//! ```text
//!   accept ── PROXY header? ──> ConnInfo (per connection)
//!   request ── forwarded headers trusted? ──> a ConnInfo for this request only
//! ```

use std::net::{IpAddr, SocketAddr};

use http::HeaderValue;
use ingress_wire::request::ClientFacts;

use super::RequestHeaders;
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
        let mut conn = self.clone();
        conn.peer = SocketAddr::new(client, self.peer.port());
        conn.client = ClientSide::new(client, self.https, self.local_port);
        if policy.enabled && policy.trusts(peer, true) {
            if let Some(https) = headers.header("x-forwarded-proto").and_then(proto) {
                conn.client.https = https;
            }
            if let Some(port) = headers.header("x-forwarded-port").and_then(port) {
                conn.client.port = port;
            }
            conn.client.host = headers
                .header("x-forwarded-host")
                .filter(|h| !h.is_empty() && h.iter().all(u8::is_ascii_graphic))
                .and_then(|h| HeaderValue::from_bytes(h).ok());
        }
        if policy.compute_full {
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
                conn.client.forwarded_for = value;
            }
        }
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
#[derive(Clone, Debug)]
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
