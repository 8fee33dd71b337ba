//! Test certificates: a CA and leaf certificates it issues, in the PEM formats operators really
//! have (PKCS#8, PKCS#1 RSA, SEC1 EC), plus a rustls client that trusts the CA.

use std::process::{Command, Stdio};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    pub pem: String,
}

/// A leaf certificate and its key.
pub struct Leaf {
    /// Leaf first, then the CA: a chain as a Secret holds it.
    pub chain: String,
    pub key: String,
    pub common_name: String,
}

#[derive(Clone, Copy, Debug)]
pub enum KeyKind {
    EcdsaP256,
    Rsa2048,
}

#[derive(Clone, Copy, Debug)]
pub enum KeyFormat {
    Pkcs8,
    /// `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY`.
    Traditional,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.self_signed(&key).expect("CA cert");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// An intermediate CA this CA signs: its `pem` is its own certificate, which a chain from
    /// it must carry after the leaf.
    pub fn intermediate(&self, name: &str) -> Ca {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("sign intermediate");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names`, valid now (or expired in 2021).
    pub fn leaf(
        &self,
        common_name: &str,
        names: &[&str],
        kind: KeyKind,
        format: KeyFormat,
        expired: bool,
    ) -> Leaf {
        let alg = match kind {
            KeyKind::EcdsaP256 => &rcgen::PKCS_ECDSA_P256_SHA256,
            KeyKind::Rsa2048 => &rcgen::PKCS_RSA_SHA256,
        };
        let key = KeyPair::generate_for(alg).expect("leaf key");
        let mut params =
            CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = if expired {
            rcgen::date_time_ymd(2021, 1, 1)
        } else {
            rcgen::date_time_ymd(2099, 1, 1)
        };
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        let key_pem = match format {
            KeyFormat::Pkcs8 => key.serialize_pem(),
            KeyFormat::Traditional => openssl_traditional(&key.serialize_pem()),
        };
        Leaf {
            chain: format!("{}{}", cert.pem(), self.pem),
            key: key_pem,
            common_name: common_name.into(),
        }
    }

    /// A server certificate for `names` with an ECDSA P-256 key in PKCS#8, valid now: what a
    /// test wants when neither the key nor the expiry is what it is about.
    pub fn server(&self, common_name: &str, names: &[&str]) -> Leaf {
        self.leaf(
            common_name,
            names,
            KeyKind::EcdsaP256,
            KeyFormat::Pkcs8,
            false,
        )
    }

    /// A client certificate (`auth-tls-*`) with subject `CN=<common_name>,O=Example` and
    /// `serial`, valid now (or expired in 2021). `chain` holds the certificate alone.
    pub fn client(&self, common_name: &str, serial: u64, expired: bool) -> Leaf {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("client key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
        params
            .distinguished_name
            .push(DnType::OrganizationName, "Example");
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.serial_number = Some(rcgen::SerialNumber::from(serial));
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = if expired {
            rcgen::date_time_ymd(2021, 1, 1)
        } else {
            rcgen::date_time_ymd(2099, 1, 1)
        };
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).expect("sign client");
        Leaf {
            chain: cert.pem(),
            key: key.serialize_pem(),
            common_name: common_name.into(),
        }
    }

    /// A CRL from this CA revoking `serials`, current until 2099, as PEM.
    pub fn crl(&self, serials: &[u64]) -> String {
        rcgen::CertificateRevocationListParams {
            this_update: rcgen::date_time_ymd(2020, 1, 1),
            next_update: rcgen::date_time_ymd(2099, 1, 1),
            crl_number: rcgen::SerialNumber::from(1u64),
            issuing_distribution_point: None,
            revoked_certs: serials
                .iter()
                .map(|&serial| rcgen::RevokedCertParams {
                    serial_number: rcgen::SerialNumber::from(serial),
                    revocation_time: rcgen::date_time_ymd(2021, 1, 1),
                    reason_code: Some(rcgen::RevocationReason::KeyCompromise),
                    invalidity_date: None,
                })
                .collect(),
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        }
        .signed_by(&self.issuer)
        .expect("sign CRL")
        .pem()
        .expect("CRL PEM")
    }

    /// A rustls client config trusting only this CA, offering `alpn`.
    pub fn client_config(&self, alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls_pki_types_certs(&self.pem) {
            roots.add(cert).expect("add CA");
        }
        // Both crypto providers are linked into the tests (kube brings ring), so name one.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }
}

/// A rustls client config that accepts any server certificate: for connections whose point
/// is what happens after the handshake (no SNI, say, where the default certificate is served).
pub fn any_server_config(alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    any_server_config_with(rustls::crypto::aws_lc_rs::default_provider(), alpn)
}

/// The same, offering X25519 alone: rustls's default post-quantum key share makes its hello
/// about 1.5 KB, more than one segment across a veth; this one fits in one.
pub fn one_segment_hello_config(alpn: &[&[u8]]) -> Arc<rustls::ClientConfig> {
    let provider = rustls::crypto::CryptoProvider {
        kx_groups: vec![rustls::crypto::aws_lc_rs::kx_group::X25519],
        ..rustls::crypto::aws_lc_rs::default_provider()
    };
    any_server_config_with(provider, alpn)
}

/// [`any_server_config`] presenting `client` (a [`Ca::client`] leaf) when asked for a client
/// certificate.
pub fn any_server_config_with_client_cert(
    alpn: &[&[u8]],
    client: &Leaf,
) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(client.key.as_bytes())
        .expect("client key");
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(rustls_pki_types_certs(&client.chain), key)
        .expect("client certificate");
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

fn any_server_config_with(
    provider: rustls::crypto::CryptoProvider,
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let provider = Arc::new(provider);
    let mut config = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

#[derive(Debug)]
struct AnyServer(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
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
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

fn rustls_pki_types_certs(pem: &str) -> Vec<rustls::pki_types::CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .expect("CA pem")
}

/// Converts a PKCS#8 key to the traditional format with the real `openssl`, as many operators'
/// Secrets were made.
fn openssl_traditional(pkcs8: &str) -> String {
    let mut child = Command::new("openssl")
        .args(["pkey", "-traditional"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("openssl runs");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), pkcs8.as_bytes())
        .expect("write key");
    let out = child.wait_with_output().expect("openssl finishes");
    assert!(out.status.success(), "openssl pkey -traditional failed");
    String::from_utf8(out.stdout).expect("pem is text")
}

/// A `kubernetes.io/tls` Secret manifest using `stringData`.
pub fn secret_yaml(namespace: &str, name: &str, chain: &str, key: &str) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: kubernetes.io/tls\nstringData:\n  tls.crt: |\n{}  tls.key: |\n{}",
        indent(chain),
        indent(key)
    )
}

/// A `kubernetes.io/tls` Secret that also carries `ca.crt`, as `proxy-ssl-secret` reads it.
pub fn secret_yaml_with_ca(
    namespace: &str,
    name: &str,
    chain: &str,
    key: &str,
    ca: &str,
) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    format!(
        "{}  ca.crt: |\n{}",
        secret_yaml(namespace, name, chain, key),
        indent(ca)
    )
}

/// An `Opaque` Secret with `ca.crt` (and `ca.crl`), as `kubectl create secret generic ca
/// --from-file=ca.crt` makes it for `auth-tls-secret`.
pub fn ca_secret_yaml(namespace: &str, name: &str, ca: &str, crl: Option<&str>) -> String {
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let mut yaml = format!(
        "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: {name}, namespace: {namespace}}}\ntype: Opaque\nstringData:\n  ca.crt: |\n{}",
        indent(ca)
    );
    if let Some(crl) = crl {
        yaml.push_str(&format!("  ca.crl: |\n{}", indent(crl)));
    }
    yaml
}
