//! The client identity phase: who is on the other end of a connection, decided once when it is
//! accepted: the TCP peer, or with `--use-proxy-protocol` the client the load balancer's PROXY
//! protocol header names (`proxy::proxy_protocol`). Trusted forwarded headers will change what
//! is believed here too; every later phase (access, the forwarding headers, the access log)
//! reads the client from here. On TLS, the client certificate its handshake presented and what
//! verifying it found (`auth-tls-*`) are part of who it is.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use ingress_wire::request::ClientFacts;

use crate::snapshot::annotations::snippet::RequestEdits;
use crate::snapshot::client_auth::{ClientAuth, PresentedCert, Verification};

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
}

/// What the upstream is told about the client side of one connection, as header values made
/// once per connection rather than once per request.
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

    pub fn proto(&self) -> &'static str {
        if self.https { "https" } else { "http" }
    }

    /// The same, as the HTTP/1.1 writer takes them.
    pub fn facts(&self) -> ClientFacts<'_> {
        ClientFacts {
            ip: self.client_ip.as_bytes(),
            port: self.port.as_bytes(),
            https: self.https,
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
