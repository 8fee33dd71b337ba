//! Certificate selection per handshake, over whichever snapshot is current at that moment: a
//! rotated Secret is served to the next handshake, while open connections keep theirs.

use std::sync::Arc;

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::publish::Published;

pub struct CertResolver {
    published: Arc<Published>,
}

impl CertResolver {
    pub fn new(published: Arc<Published>) -> Self {
        Self { published }
    }
}

impl std::fmt::Debug for CertResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertResolver").finish_non_exhaustive()
    }
}

impl ResolvesServerCert for CertResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let snapshot = self.published.load();
        let name = hello.server_name().map(str::to_ascii_lowercase);
        snapshot
            .tls
            .resolve(name.as_deref())
            .map(|cert| cert.key.clone())
    }
}

/// The server configuration: TLS 1.3 and 1.2 with the provider's AEAD suites only, ALPN h2 then
/// http/1.1, stateless resumption tickets whose keys rotate, and a session cache for TLS 1.2.
pub fn server_config(
    published: Arc<Published>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config =
        rustls::ServerConfig::builder_with_provider(crate::snapshot::certs::provider().clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(CertResolver::new(published)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
    config.session_storage = rustls::server::ServerSessionMemoryCache::new(64 * 1024);
    Ok(Arc::new(config))
}
