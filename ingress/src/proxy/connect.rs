//! Connections to upstreams: TCP, then TLS when the route's protocol asks for it
//! (`backend-protocol: HTTPS`, `GRPCS`, `AUTO_HTTP` from an HTTPS client, `appProtocol: https`).
//!
//! ```text
//!   open(key) ── TCP (Nagle off) ──┬── plain ─────────────────────────────> UpstreamStream::Plain
//!                                  └── rustls ClientConfig for (proxy-ssl-*, wire)
//!                                      verify? ca.crt + depth : any certificate
//!                                      SNI? proxy-ssl-server-name    ALPN: h2 | http/1.1
//!                                      resumption: the config's session cache ──> ::Tls
//!   all of it within the connect timeout
//! ```
//!
//! One `ClientConfig` is made per distinct TLS policy and wire protocol and kept for the life
//! of the process, so its session cache lets later connections to the same upstream name
//! resume (TLS 1.3 tickets, TLS 1.2 session ids) rather than repeat the full handshake.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::upstream::{TlsFailure, UpstreamError};
use crate::snapshot::backend::ExternalName;
use crate::snapshot::certs;
use crate::snapshot::policy::{UpstreamTls, Wire};

/// Where a pooled connection goes: an endpoint address, or a DNS name for ExternalName.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PoolKey {
    Addr(SocketAddr),
    Name(Arc<ExternalName>),
}

impl std::fmt::Display for PoolKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolKey::Addr(a) => write!(f, "{a}"),
            PoolKey::Name(name) => write!(f, "{name}"),
        }
    }
}

/// Opens a new connection to `key`, with Nagle off: requests and responses are written whole.
/// Both HTTP paths (hyper's and the HTTP/1.1 fast path) connect through here.
pub async fn open(key: &PoolKey, timeout: Duration) -> Result<TcpStream, UpstreamError> {
    let connect = async {
        let stream = match key {
            // Endpoint addresses were judged when the snapshot was built.
            PoolKey::Addr(addr) => TcpStream::connect(addr)
                .await
                .map_err(|e| UpstreamError::Connect(e.to_string()))?,
            PoolKey::Name(name) => connect_to_any(&resolve_external(name).await?).await?,
        };
        let _ = stream.set_nodelay(true);
        Ok(stream)
    };
    tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| UpstreamError::ConnectTimeout)?
}

/// Resolves an ExternalName with the system resolver (on each new connection, so DNS changes
/// apply) and judges every address it returns: one refused address refuses the name, since a
/// name that resolves to this node's loopback is a mistake or an attack either way. The caller
/// connects to the addresses returned, never to the name, so what was judged is what is used.
pub async fn resolve_external(name: &ExternalName) -> Result<Vec<SocketAddr>, UpstreamError> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.host.as_str(), name.port))
        .await
        .map_err(|e| UpstreamError::Connect(format!("resolving {name}: {e}")))?
        .collect();
    for addr in &addrs {
        if let Err(refusal) = name.addresses.check(addr.ip()) {
            tracing::warn!(
                external_name = %name,
                addr = %addr.ip(),
                reason = refusal.as_str(),
                "ExternalName resolved to an address refused as a backend (--allow-local-backends)"
            );
            return Err(UpstreamError::AddressRefused {
                name: name.to_string(),
                addr: addr.ip(),
                refusal,
            });
        }
    }
    Ok(addrs)
}

/// Connects to the first address that accepts, in the resolver's order.
pub async fn connect_to_any(addrs: &[SocketAddr]) -> Result<TcpStream, UpstreamError> {
    let mut last = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => return Ok(stream),
            Err(err) => last = Some(err),
        }
    }
    Err(UpstreamError::Connect(match last {
        Some(err) => err.to_string(),
        None => "the name resolved to no address".into(),
    }))
}

/// How a request's upstream connection is made: cleartext, or TLS with this policy.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    Plain,
    Tls(Arc<UpstreamTls>),
}

/// The TLS client configurations made so far, one per (policy, wire).
#[derive(Default)]
pub struct Connectors {
    configs: Mutex<HashMap<(Arc<UpstreamTls>, Wire), Arc<ClientConfig>>>,
}

impl Connectors {
    /// Opens a connection to `key` over `transport`, the TCP and TLS handshakes both within
    /// `timeout`.
    pub async fn open(
        &self,
        key: &PoolKey,
        transport: &Transport,
        wire: Wire,
        timeout: Duration,
    ) -> Result<UpstreamStream, UpstreamError> {
        let tls = match transport {
            Transport::Plain => return Ok(UpstreamStream::Plain(open(key, timeout).await?)),
            Transport::Tls(tls) => tls,
        };
        let config = self.config(tls, wire)?;
        let name = server_name(tls, key)?;
        let handshake = async {
            let tcp = open(key, timeout).await?;
            TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(|err| tls_error(&err))
        };
        match tokio::time::timeout(timeout, handshake).await {
            Ok(Ok(stream)) => Ok(UpstreamStream::Tls(Box::new(stream))),
            Ok(Err(err)) => Err(err),
            Err(_) => Err(UpstreamError::ConnectTimeout),
        }
    }

    fn config(
        &self,
        tls: &Arc<UpstreamTls>,
        wire: Wire,
    ) -> Result<Arc<ClientConfig>, UpstreamError> {
        let mut configs = self.configs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(config) = configs.get(&(tls.clone(), wire)) {
            return Ok(config.clone());
        }
        let config = Arc::new(client_config(tls, wire)?);
        configs.insert((tls.clone(), wire), config.clone());
        Ok(config)
    }
}

/// The name verified and, with `proxy-ssl-server-name: on`, sent as SNI: `proxy-ssl-name`, or
/// the Service's DNS name, or the ExternalName.
fn server_name(tls: &UpstreamTls, key: &PoolKey) -> Result<ServerName<'static>, UpstreamError> {
    let name = match (&tls.name, key) {
        (Some(name), _) => name.clone(),
        (None, PoolKey::Name(external)) => external.host.clone(),
        (None, PoolKey::Addr(addr)) => addr.ip().to_string(),
    };
    ServerName::try_from(name.clone()).map_err(|_| {
        UpstreamError::Tls(
            TlsFailure::Config,
            format!("{name:?} is not a usable TLS name"),
        )
    })
}

/// A rustls client configuration for one `proxy-ssl-*` policy.
fn client_config(tls: &UpstreamTls, wire: Wire) -> Result<ClientConfig, UpstreamError> {
    let config_error = |why: String| UpstreamError::Tls(TlsFailure::Config, why);
    let provider = certs::provider().clone();
    let mut versions: Vec<&'static rustls::SupportedProtocolVersion> = Vec::new();
    if tls.versions.tls13 {
        versions.push(&rustls::version::TLS13);
    }
    if tls.versions.tls12 {
        versions.push(&rustls::version::TLS12);
    }
    let verifier: Arc<dyn ServerCertVerifier> = if tls.verify {
        let Some(ca) = &tls.ca else {
            return Err(config_error(
                "proxy-ssl-verify is on but proxy-ssl-secret gives no ca.crt to verify against"
                    .into(),
            ));
        };
        let mut roots = RootCertStore::empty();
        for der in ca.iter() {
            roots
                .add(CertificateDer::from(der.clone()))
                .map_err(|e| config_error(format!("ca.crt: {e}")))?;
        }
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| config_error(format!("ca.crt: {e}")))?;
        Arc::new(DepthVerifier {
            inner,
            depth: usize::from(tls.verify_depth),
            roots: ca.clone(),
        })
    } else {
        Arc::new(AnyCertificate(provider.clone()))
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&versions)
        .map_err(|e| config_error(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut config = match &tls.client {
        Some(identity) => {
            let chain = identity
                .chain
                .iter()
                .map(|c| CertificateDer::from(c.clone()))
                .collect();
            let key = PrivateKeyDer::from_pem_slice(&identity.key)
                .map_err(|e| config_error(format!("tls.key: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| config_error(format!("client certificate: {e}")))?
        }
        None => builder.with_no_client_auth(),
    };
    config.enable_sni = tls.send_sni;
    config.alpn_protocols = match wire {
        Wire::Http1 => vec![b"http/1.1".to_vec()],
        Wire::Http2 => vec![b"h2".to_vec()],
    };
    Ok(config)
}

/// A handshake error as the upstream error it is: a certificate the policy refuses, or a
/// failed handshake.
fn tls_error(err: &io::Error) -> UpstreamError {
    let certificate = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .is_some_and(|e| {
            matches!(
                e,
                rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
            )
        });
    let kind = if certificate {
        TlsFailure::Certificate
    } else {
        TlsFailure::Handshake
    };
    UpstreamError::Tls(kind, err.to_string())
}

/// `proxy-ssl-verify: on`: the chain must lead to `ca.crt` (webpki), through at most
/// `depth - 1` intermediates, as nginx's `proxy_ssl_verify_depth` counts (1: the leaf is issued
/// by a trusted CA itself). A trusted root the upstream sends along is not counted.
#[derive(Debug)]
struct DepthVerifier {
    inner: Arc<WebPkiServerVerifier>,
    depth: usize,
    roots: Arc<[Vec<u8>]>,
}

impl ServerCertVerifier for DepthVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let between = intermediates
            .iter()
            .filter(|c| !self.roots.iter().any(|r| r.as_slice() == c.as_ref()))
            .count();
        if between >= self.depth.max(1) {
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Other(rustls::OtherError(Arc::new(DepthExceeded(
                    between, self.depth,
                )))),
            ));
        }
        self.inner
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0} intermediate certificates are deeper than proxy-ssl-verify-depth {1} allows")]
struct DepthExceeded(usize, usize);

/// `proxy-ssl-verify: off` (ingress-nginx's default): any certificate is accepted, but the
/// handshake's signatures are still checked, so the session is with whoever holds the key.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// An upstream connection, cleartext or TLS.
pub enum UpstreamStream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl UpstreamStream {
    fn tcp(&self) -> &TcpStream {
        match self {
            UpstreamStream::Plain(s) => s,
            UpstreamStream::Tls(s) => s.get_ref().0,
        }
    }

    /// Waits until the socket has something to read (for TLS, a record, which may carry no
    /// application data).
    pub async fn readable(&self) -> io::Result<()> {
        self.tcp().readable().await
    }

    /// Reads what is there without waiting; `WouldBlock` when nothing is.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            UpstreamStream::Plain(s) => s.try_read_buf(buf),
            UpstreamStream::Tls(s) => {
                let mut cx = Context::from_waker(Waker::noop());
                match tokio_util::io::poll_read_buf(Pin::new(s), &mut cx, buf) {
                    Poll::Ready(result) => result,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
        }
    }

    /// The negotiated ALPN protocol, for TLS.
    pub fn alpn(&self) -> Option<&[u8]> {
        match self {
            UpstreamStream::Plain(_) => None,
            UpstreamStream::Tls(s) => s.get_ref().1.alpn_protocol(),
        }
    }
}

impl AsyncRead for UpstreamStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for UpstreamStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            UpstreamStream::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            UpstreamStream::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            UpstreamStream::Plain(s) => s.is_write_vectored(),
            UpstreamStream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_flush(cx),
            UpstreamStream::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            UpstreamStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            UpstreamStream::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::policy::TlsVersions;

    #[test]
    fn verify_without_a_ca_is_a_configuration_error() {
        let tls = UpstreamTls {
            verify: true,
            ..UpstreamTls::default()
        };
        match client_config(&tls, Wire::Http1) {
            Err(UpstreamError::Tls(TlsFailure::Config, why)) => {
                assert!(why.contains("ca.crt"), "{why}")
            }
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn configs_follow_the_policy() {
        let cases = [
            // (versions, sni, wire) -> (sni enabled, ALPN)
            (
                TlsVersions::default(),
                false,
                Wire::Http1,
                b"http/1.1".as_slice(),
            ),
            (
                TlsVersions {
                    tls12: false,
                    tls13: true,
                },
                true,
                Wire::Http2,
                b"h2".as_slice(),
            ),
        ];
        for (versions, sni, wire, alpn) in cases {
            let tls = UpstreamTls {
                versions,
                send_sni: sni,
                ..UpstreamTls::default()
            };
            let config = client_config(&tls, wire).expect("config");
            assert_eq!(config.enable_sni, sni);
            assert_eq!(config.alpn_protocols, vec![alpn.to_vec()]);
        }
    }

    #[test]
    fn the_same_policy_shares_one_config_and_so_one_session_cache() {
        let connectors = Connectors::default();
        let tls = Arc::new(UpstreamTls::default());
        let a = connectors.config(&tls, Wire::Http1).expect("config");
        let b = connectors
            .config(&Arc::new(UpstreamTls::default()), Wire::Http1)
            .expect("config");
        let c = connectors.config(&tls, Wire::Http2).expect("config");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &c));
    }
}
