//! An HTTPS upstream for the proxy's TLS-to-backend tests: the same echo as [`crate::upstream`]
//! (HTTP/1.1 and HTTP/2 by ALPN), behind rustls with a certificate from [`crate::pki`], and it
//! remembers what each handshake looked like (SNI, ALPN, resumed or full, client certificate).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::accept_loop::AcceptLoop;
use crate::pki::{Ca, Leaf};

/// What one accepted TLS connection looked like.
#[derive(Clone, Debug)]
pub struct Handshake {
    pub sni: Option<String>,
    pub alpn: Option<Vec<u8>>,
    pub resumed: bool,
    pub client_cert: bool,
    pub version: Option<rustls::ProtocolVersion>,
}

/// How the upstream is set up.
#[derive(Default)]
pub struct HttpsOptions<'a> {
    /// Require a client certificate issued by this CA.
    pub client_ca: Option<&'a Ca>,
    /// Close the connection after each response (HTTP/1.1), so every request makes a new
    /// connection and resumption shows.
    pub close_each: bool,
    /// ALPN protocols offered; `["h2", "http/1.1"]` when empty.
    pub alpn: Vec<Vec<u8>>,
}

/// A running HTTPS upstream. Stops when dropped.
pub struct HttpsBackend {
    pub addr: SocketAddr,
    handshakes: Arc<Mutex<Vec<Handshake>>>,
    failed: Arc<AtomicUsize>,
    served: Arc<AtomicUsize>,
    _server: AcceptLoop,
}

impl HttpsBackend {
    pub fn start(name: &str, leaf: &Leaf, options: HttpsOptions<'_>) -> HttpsBackend {
        let config = server_config(leaf, &options);
        let listener = crate::ports::listen_loopback();
        let addr = listener.local_addr().expect("addr");
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicUsize::new(0));
        let served = Arc::new(AtomicUsize::new(0));
        let (name, close_each) = (Arc::<str>::from(name), options.close_each);
        let (seen, failures, counter) = (handshakes.clone(), failed.clone(), served.clone());
        let acceptor = TlsAcceptor::from(config);
        let server = AcceptLoop::start(listener, move |stream| {
            let (acceptor, name, seen) = (acceptor.clone(), name.clone(), seen.clone());
            let (failures, counter) = (failures.clone(), counter.clone());
            async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    failures.fetch_add(1, Ordering::Relaxed);
                    return;
                };
                let conn = tls.get_ref().1;
                seen.lock().expect("handshakes").push(Handshake {
                    sni: conn.server_name().map(str::to_string),
                    alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
                    resumed: conn.handshake_kind() == Some(rustls::HandshakeKind::Resumed),
                    client_cert: conn.peer_certificates().is_some_and(|c| !c.is_empty()),
                    version: conn.protocol_version(),
                });
                let service = service_fn(move |req| {
                    crate::upstream::handle(req, name.clone(), counter.clone())
                });
                let mut builder =
                    hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http1().keep_alive(!close_each);
                let _ = builder
                    .serve_connection_with_upgrades(TokioIo::new(tls), service)
                    .await;
            }
        });
        HttpsBackend {
            addr,
            handshakes,
            failed,
            served,
            _server: server,
        }
    }

    /// The handshakes completed so far.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.handshakes.lock().expect("handshakes").clone()
    }

    /// Connections whose handshake failed.
    pub fn failed(&self) -> usize {
        self.failed.load(Ordering::Relaxed)
    }

    /// Requests answered.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }
}

fn server_config(leaf: &Leaf, options: &HttpsOptions<'_>) -> Arc<rustls::ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(leaf.chain.as_bytes())
        .collect::<Result<_, _>>()
        .expect("chain pem");
    let key = PrivateKeyDer::from_pem_slice(leaf.key.as_bytes()).expect("key pem");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions");
    let builder = match options.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(ca.pem.as_bytes()) {
                roots.add(cert.expect("CA pem")).expect("add CA");
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .expect("client verifier");
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .expect("server certificate");
    config.alpn_protocols = if options.alpn.is_empty() {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        options.alpn.clone()
    };
    Arc::new(config)
}
