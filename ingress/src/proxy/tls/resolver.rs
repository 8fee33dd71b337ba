//! Certificate selection per handshake, over whichever snapshot is current at that moment: a
//! rotated Secret is served to the next handshake, while open connections keep theirs; and the
//! server configuration per handshake, with or without a client certificate request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use rustls::DigitallySignedStruct;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::snapshot::client_auth::ClientAuth;

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

/// The server configurations: one without client authentication, and one per set of CA names
/// a host's `auth-tls-secret` asks for, chosen per handshake by SNI (`accept.rs`). They share
/// the certificate resolver, the ticket keys and the session cache: a resumed session keeps its
/// client certificate, and it is verified again against the current rules after the handshake,
/// so sharing them cannot carry a verdict from one host to another.
pub struct ServerConfigs {
    plain: Arc<rustls::ServerConfig>,
    resolver: Arc<CertResolver>,
    ticketer: Arc<dyn rustls::server::ProducesTickets>,
    sessions: Arc<dyn rustls::server::StoresServerSessions>,
    /// By the CA names the CertificateRequest carries; rebuilt if it ever grows past
    /// `MAX_CLIENT_AUTH_CONFIGS` (stale entries from old snapshots go then).
    client_auth: Mutex<HashMap<Vec<Vec<u8>>, Arc<rustls::ServerConfig>>>,
}

const MAX_CLIENT_AUTH_CONFIGS: usize = 256;

impl std::fmt::Debug for ServerConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfigs").finish_non_exhaustive()
    }
}

impl ServerConfigs {
    pub fn new(published: Arc<Published>) -> Result<Self, rustls::Error> {
        let resolver = Arc::new(CertResolver::new(published));
        let ticketer = rustls::crypto::aws_lc_rs::Ticketer::new()?;
        let sessions: Arc<dyn rustls::server::StoresServerSessions> =
            rustls::server::ServerSessionMemoryCache::new(64 * 1024);
        let plain = build(
            Arc::new(rustls::server::NoClientAuth),
            &resolver,
            &ticketer,
            &sessions,
        )?;
        Ok(Self {
            plain,
            resolver,
            ticketer,
            sessions,
            client_auth: Mutex::new(HashMap::new()),
        })
    }

    /// The configuration for a handshake whose SNI selected `auth` (none: no certificate is
    /// asked for).
    pub fn for_handshake(&self, auth: Option<&ClientAuth>) -> Arc<rustls::ServerConfig> {
        let Some(auth) = auth.filter(|a| a.requests_certificate()) else {
            return self.plain.clone();
        };
        let key: Vec<Vec<u8>> = auth.subjects.iter().map(|s| s.as_ref().to_vec()).collect();
        let mut configs = self
            .client_auth
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(config) = configs.get(&key) {
            return config.clone();
        }
        let verifier = Arc::new(RequestClientCert {
            subjects: auth.subjects.clone(),
            algorithms: crate::snapshot::certs::provider().signature_verification_algorithms,
        });
        match build(verifier, &self.resolver, &self.ticketer, &self.sessions) {
            Ok(config) => {
                if configs.len() >= MAX_CLIENT_AUTH_CONFIGS {
                    configs.clear();
                }
                configs.insert(key, config.clone());
                config
            }
            // The builder only fails on a protocol/provider mismatch, which `new` already ruled
            // out; without a config the handshake cannot ask for a certificate, and the
            // request phase refuses what comes without one.
            Err(err) => {
                tracing::warn!(%err, "building a client-certificate TLS configuration");
                self.plain.clone()
            }
        }
    }
}

/// TLS 1.3 and 1.2 with the provider's AEAD suites only, ALPN h2 then http/1.1, stateless
/// resumption tickets whose keys rotate, and a session cache for TLS 1.2.
fn build(
    verifier: Arc<dyn ClientCertVerifier>,
    resolver: &Arc<CertResolver>,
    ticketer: &Arc<dyn rustls::server::ProducesTickets>,
    sessions: &Arc<dyn rustls::server::StoresServerSessions>,
) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
    let mut config =
        rustls::ServerConfig::builder_with_provider(crate::snapshot::certs::provider().clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(resolver.clone());
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.ticketer = ticketer.clone();
    config.session_storage = sessions.clone();
    Ok(Arc::new(config))
}

/// Asks for a client certificate and lets the handshake complete whatever it is, as nginx's
/// `ssl_verify_client` does: the chain is verified after the handshake
/// (`ClientAuth::verify`) and the request phase answers 400 for a missing or bad one. The
/// client must still prove it holds the certificate's key: the handshake signature is checked
/// here as usual.
#[derive(Debug)]
struct RequestClientCert {
    subjects: Vec<rustls::DistinguishedName>,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for RequestClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &self.subjects
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
