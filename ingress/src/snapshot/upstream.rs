//! The vocabulary of the upstream policy: which protocol a backend speaks (`backend-protocol`, a
//! Service port's `appProtocol`) and how TLS to it is made (`proxy-ssl-*`). Values are parsed
//! here, once, when the snapshot is built.
//!
//! ```text
//!   backend-protocol   HTTP  HTTPS  AUTO_HTTP          GRPC   GRPCS   (FCGI, other: an error)
//!   appProtocol        http  https  -          h2c     grpc   grpcs   (kubernetes.io/ws, wss)
//!   TLS                no    yes    as client  no      no     yes
//!   wire               HTTP/1.1 ------------   HTTP/2 (prior knowledge; ALPN h2 over TLS)
//! ```

use std::sync::Arc;

use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;

use crate::diagnostics::DiagnosticKind;
use crate::snapshot::certs;
use crate::store::{ObjectKey, Store};

/// The Secret key holding the CA bundle that verifies an upstream.
pub const CA_CRT: &str = "ca.crt";

/// Fills `tls` from the `proxy-ssl-secret` named `name` on the Ingress `ingress`: `ca.crt` as
/// the trusted roots, and `tls.crt` + `tls.key`, when both are present, as the client
/// certificate. The Secret must be in the Ingress's namespace.
pub fn secret_tls(
    store: &Store,
    ingress: &ObjectKey,
    name: &str,
    tls: &mut UpstreamTls,
) -> Result<(), (DiagnosticKind, String)> {
    let (namespace, secret_name) = name
        .split_once('/')
        .unwrap_or((ingress.namespace.as_str(), name));
    if namespace != ingress.namespace {
        return Err((
            DiagnosticKind::InvalidAnnotation,
            format!("proxy-ssl-secret {name}: only Secrets in the Ingress's namespace can be used"),
        ));
    }
    let key = ObjectKey::new(namespace.to_string(), secret_name.to_string());
    let Some(secret) = store.secret(&key) else {
        return Err((
            DiagnosticKind::SecretNotFound,
            format!("proxy-ssl-secret {key} not found"),
        ));
    };
    let invalid = |why: String| {
        (
            DiagnosticKind::SecretInvalid,
            format!("proxy-ssl-secret {key}: {why}"),
        )
    };
    let data = secret.data.as_ref();
    let field = |f: &str| data.and_then(|d| d.get(f)).map(|b| b.0.as_slice());
    if let Some(ca) = field(CA_CRT) {
        let roots: Vec<Vec<u8>> = CertificateDer::pem_slice_iter(ca)
            .map(|c| c.map(|c| c.as_ref().to_vec()))
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(format!("{CA_CRT}: {e}")))?;
        if roots.is_empty() {
            return Err(invalid(format!("{CA_CRT} holds no certificate")));
        }
        tls.ca = Some(Arc::from(roots));
    }
    if let (Some(crt), Some(pem_key)) = (field(certs::TLS_CRT), field(certs::TLS_KEY)) {
        let cert = certs::from_pem(crt, pem_key).map_err(|e| invalid(e.to_string()))?;
        tls.client = Some(Arc::new(ClientIdentity {
            chain: cert.key.cert.iter().map(|c| c.as_ref().to_vec()).collect(),
            key: pem_key.to_vec(),
        }));
    }
    if tls.ca.is_none() && tls.client.is_none() {
        return Err(invalid(format!(
            "holds neither {CA_CRT} nor {} and {}",
            certs::TLS_CRT,
            certs::TLS_KEY
        )));
    }
    Ok(())
}

/// `backend-protocol`, and the Service port `appProtocol` values that mean the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackendProtocol {
    /// HTTP/1.1 in cleartext: the default.
    #[default]
    Http,
    /// HTTP/1.1 over TLS.
    Https,
    /// The client's scheme: TLS to the upstream when the request came over HTTPS, cleartext
    /// when it came over HTTP (ingress-nginx's `$scheme://`).
    AutoHttp,
    /// HTTP/2 with prior knowledge, cleartext (`appProtocol: kubernetes.io/h2c`).
    H2c,
    /// gRPC: HTTP/2 in cleartext, and the proxy's own errors in gRPC form.
    Grpc,
    /// gRPC over TLS (ALPN `h2`).
    Grpcs,
}

/// How a connection to the upstream speaks HTTP.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Wire {
    Http1,
    Http2,
}

impl BackendProtocol {
    /// The annotation's value, compared as ingress-nginx does (case-insensitive, trimmed).
    /// `FCGI` and anything else is an error: FastCGI is not spoken here.
    pub fn from_annotation(value: &str) -> Result<BackendProtocol, String> {
        match value.trim().to_ascii_uppercase().as_str() {
            "HTTP" => Ok(BackendProtocol::Http),
            "HTTPS" => Ok(BackendProtocol::Https),
            "AUTO_HTTP" => Ok(BackendProtocol::AutoHttp),
            "GRPC" => Ok(BackendProtocol::Grpc),
            "GRPCS" => Ok(BackendProtocol::Grpcs),
            "FCGI" => Err("FCGI (FastCGI) is not supported by this controller".to_string()),
            _ => Err(format!(
                "{value:?} is not one of HTTP, HTTPS, AUTO_HTTP, GRPC, GRPCS"
            )),
        }
    }

    /// A Service port's `appProtocol` (KEP-3726 standard names and IANA service names), or
    /// `None` for a value that says nothing about how to speak HTTP to it (`tcp`, `mysql`, …).
    pub fn from_app_protocol(value: &str) -> Option<BackendProtocol> {
        match value.trim().to_ascii_lowercase().as_str() {
            "http" | "kubernetes.io/ws" => Some(BackendProtocol::Http),
            "https" | "kubernetes.io/wss" => Some(BackendProtocol::Https),
            "kubernetes.io/h2c" | "h2c" => Some(BackendProtocol::H2c),
            "grpc" => Some(BackendProtocol::Grpc),
            "grpcs" => Some(BackendProtocol::Grpcs),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            BackendProtocol::Http => "HTTP",
            BackendProtocol::Https => "HTTPS",
            BackendProtocol::AutoHttp => "AUTO_HTTP",
            BackendProtocol::H2c => "H2C",
            BackendProtocol::Grpc => "GRPC",
            BackendProtocol::Grpcs => "GRPCS",
        }
    }

    /// Whether the upstream connection is TLS, for a request that came over HTTPS or not.
    pub fn tls(self, client_https: bool) -> bool {
        match self {
            BackendProtocol::Http | BackendProtocol::H2c | BackendProtocol::Grpc => false,
            BackendProtocol::Https | BackendProtocol::Grpcs => true,
            BackendProtocol::AutoHttp => client_https,
        }
    }

    pub fn wire(self) -> Wire {
        match self {
            BackendProtocol::Http | BackendProtocol::Https | BackendProtocol::AutoHttp => {
                Wire::Http1
            }
            BackendProtocol::H2c | BackendProtocol::Grpc | BackendProtocol::Grpcs => Wire::Http2,
        }
    }

    /// Whether the proxy's own errors on this route are in gRPC form (for gRPC requests).
    pub fn grpc(self) -> bool {
        matches!(self, BackendProtocol::Grpc | BackendProtocol::Grpcs)
    }
}

/// `load-balance`: how a request picks among a backend's endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Balance {
    /// The less loaded (requests in flight) of two random endpoints: this project's default.
    #[default]
    TwoChoices,
    /// `round_robin` (ingress-nginx's default): each endpoint in turn.
    RoundRobin,
    /// `ewma`: the better of two random endpoints by response-time average (exponentially
    /// weighted) times requests in flight.
    Ewma,
}

impl Balance {
    /// The annotation's value. ingress-nginx's own values only; `chash…` is `upstream-hash-by`.
    pub fn from_annotation(value: &str) -> Result<Balance, String> {
        match value.trim() {
            "round_robin" => Ok(Balance::RoundRobin),
            "ewma" => Ok(Balance::Ewma),
            // Not an ingress-nginx value, but the way to say "the default" explicitly.
            "p2c" => Ok(Balance::TwoChoices),
            other => Err(format!("{other:?} is not round_robin, ewma or p2c")),
        }
    }
}

/// `proxy-next-upstream`, `-tries`, `-timeout`: when a failed attempt is made again on another
/// endpoint. ingress-nginx's defaults: on `error` and `timeout`, 3 tries in all, no time limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NextUpstream {
    /// `error`: the connection could not be made, or failed before a response head.
    pub error: bool,
    /// `timeout`: connecting or waiting for the response head timed out.
    pub timeout: bool,
    /// `non_idempotent`: POST, PATCH, LOCK too (otherwise only methods that may be repeated).
    pub non_idempotent: bool,
    /// `proxy-next-upstream-tries`: attempts in all, the first included; 0 is no limit (as
    /// many as there are endpoints).
    pub tries: u32,
    /// `proxy-next-upstream-timeout`: no new attempt after this long since the first; `None`
    /// is no limit.
    pub within: Option<std::time::Duration>,
}

impl Default for NextUpstream {
    fn default() -> Self {
        Self {
            error: true,
            timeout: true,
            non_idempotent: false,
            tries: 3,
            within: None,
        }
    }
}

impl NextUpstream {
    /// `proxy-next-upstream`'s value: space-separated conditions, or `off`. The `http_…` and
    /// `invalid_header` conditions are refused (not honoured here yet), so the value is an
    /// error rather than half applied.
    pub fn parse_conditions(value: &str, into: &mut NextUpstream) -> Result<(), String> {
        let (mut error, mut timeout, mut non_idempotent) = (false, false, false);
        for word in value.split_whitespace() {
            match word {
                "error" => error = true,
                "timeout" => timeout = true,
                "non_idempotent" => non_idempotent = true,
                "off" => {}
                "invalid_header" | "http_500" | "http_502" | "http_503" | "http_504"
                | "http_403" | "http_404" | "http_429" => {
                    return Err(format!(
                        "{word} is not supported by this controller (error, timeout, non_idempotent and off are)"
                    ));
                }
                other => return Err(format!("{other:?} is not a proxy-next-upstream condition")),
            }
        }
        if value.split_whitespace().any(|w| w == "off") && (error || timeout) {
            return Err("off cannot be combined with other conditions".into());
        }
        into.error = error;
        into.timeout = timeout;
        into.non_idempotent = non_idempotent;
        Ok(())
    }

    /// Whether attempt number `made + 1` may be made.
    pub fn allows_another(&self, made: u32) -> bool {
        (self.error || self.timeout) && (self.tries == 0 || made < self.tries)
    }
}

/// Where a route's protocol came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ProtocolSource {
    #[default]
    Default,
    /// The `backend-protocol` annotation, which wins.
    Annotation,
    /// The Service port's `appProtocol`, used when there is no annotation.
    AppProtocol,
}

/// TLS to the upstream (`proxy-ssl-*`), as ingress-nginx defines it: no verification unless
/// asked for, no SNI unless asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UpstreamTls {
    /// `proxy-ssl-verify`: check the upstream's certificate against `ca`.
    pub verify: bool,
    /// `proxy-ssl-verify-depth`: the most certificates above the leaf the upstream may present.
    pub verify_depth: u8,
    /// `proxy-ssl-server-name`: send SNI.
    pub send_sni: bool,
    /// `proxy-ssl-name`: the name verified, and sent as SNI; `None` is the Service's DNS name
    /// (`name.namespace.svc`), filled in when the route is built.
    pub name: Option<String>,
    /// `proxy-ssl-protocols`: which TLS versions are offered.
    pub versions: TlsVersions,
    /// `proxy-ssl-secret` `ca.crt`: the trusted roots, DER.
    pub ca: Option<Arc<[Vec<u8>]>>,
    /// `proxy-ssl-secret` `tls.crt` and `tls.key`: the client certificate presented to the
    /// upstream.
    pub client: Option<Arc<ClientIdentity>>,
}

impl Default for UpstreamTls {
    fn default() -> Self {
        Self {
            verify: false,
            verify_depth: 1,
            send_sni: false,
            name: None,
            versions: TlsVersions::default(),
            ca: None,
            client: None,
        }
    }
}

/// A client certificate for mTLS to an upstream: the chain as DER, the key as the PEM it came
/// in (already checked to match the chain).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientIdentity {
    pub chain: Vec<Vec<u8>>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "ClientIdentity({} certificates, key hidden)",
            self.chain.len()
        )
    }
}

/// TLS versions offered to an upstream; rustls speaks only 1.2 and 1.3.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TlsVersions {
    pub tls12: bool,
    pub tls13: bool,
}

impl Default for TlsVersions {
    fn default() -> Self {
        Self {
            tls12: true,
            tls13: true,
        }
    }
}

impl TlsVersions {
    /// `proxy-ssl-protocols`: space-separated `TLSv1.2` and `TLSv1.3`. Older versions are an
    /// error (rustls does not speak them), as is a list naming none.
    pub fn parse(value: &str) -> Result<TlsVersions, String> {
        let mut versions = TlsVersions {
            tls12: false,
            tls13: false,
        };
        for word in value.split_whitespace() {
            match word {
                "TLSv1.2" => versions.tls12 = true,
                "TLSv1.3" => versions.tls13 = true,
                "SSLv2" | "SSLv3" | "TLSv1" | "TLSv1.1" => {
                    return Err(format!(
                        "{word} is not offered by this controller (TLSv1.2 and TLSv1.3 only)"
                    ));
                }
                other => return Err(format!("{other:?} is not a TLS protocol name")),
            }
        }
        if !versions.tls12 && !versions.tls13 {
            return Err("names no protocol".to_string());
        }
        Ok(versions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_protocol_annotation_values() {
        let cases = [
            ("HTTP", Ok(BackendProtocol::Http)),
            ("https", Ok(BackendProtocol::Https)),
            (" GRPC ", Ok(BackendProtocol::Grpc)),
            ("grpcs", Ok(BackendProtocol::Grpcs)),
            ("AUTO_HTTP", Ok(BackendProtocol::AutoHttp)),
            ("FCGI", Err("FastCGI")),
            ("H2C", Err("is not one of")),
            ("", Err("is not one of")),
            ("HTTP2", Err("is not one of")),
        ];
        for (value, want) in cases {
            match (BackendProtocol::from_annotation(value), want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{value:?}"),
                (Err(got), Err(want)) => assert!(got.contains(want), "{value:?}: {got}"),
                (got, want) => panic!("{value:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn app_protocol_values() {
        let cases = [
            ("kubernetes.io/h2c", Some(BackendProtocol::H2c)),
            ("kubernetes.io/ws", Some(BackendProtocol::Http)),
            ("kubernetes.io/wss", Some(BackendProtocol::Https)),
            ("HTTPS", Some(BackendProtocol::Https)),
            ("http", Some(BackendProtocol::Http)),
            ("grpc", Some(BackendProtocol::Grpc)),
            ("tcp", None),
            ("example.com/custom", None),
        ];
        for (value, want) in cases {
            assert_eq!(BackendProtocol::from_app_protocol(value), want, "{value}");
        }
    }

    #[test]
    fn protocol_tls_and_wire() {
        use BackendProtocol::*;
        let cases = [
            // (protocol, client over HTTPS) -> (TLS upstream, wire, gRPC errors)
            (Http, true, false, Wire::Http1, false),
            (Https, false, true, Wire::Http1, false),
            (AutoHttp, false, false, Wire::Http1, false),
            (AutoHttp, true, true, Wire::Http1, false),
            (H2c, true, false, Wire::Http2, false),
            (Grpc, true, false, Wire::Http2, true),
            (Grpcs, false, true, Wire::Http2, true),
        ];
        for (p, https, tls, wire, grpc) in cases {
            assert_eq!(p.tls(https), tls, "{p:?} {https}");
            assert_eq!(p.wire(), wire, "{p:?}");
            assert_eq!(p.grpc(), grpc, "{p:?}");
        }
    }

    #[test]
    fn balance_values() {
        let cases = [
            ("round_robin", Ok(Balance::RoundRobin)),
            (" ewma ", Ok(Balance::Ewma)),
            ("p2c", Ok(Balance::TwoChoices)),
            ("least_conn", Err(())),
            ("chash", Err(())),
            ("", Err(())),
        ];
        for (value, want) in cases {
            assert_eq!(
                Balance::from_annotation(value).map_err(|_| ()),
                want,
                "{value:?}"
            );
        }
    }

    #[test]
    fn next_upstream_conditions() {
        let d = NextUpstream::default();
        let cases = [
            ("error timeout", Ok((true, true, false))),
            ("error", Ok((true, false, false))),
            ("timeout non_idempotent", Ok((false, true, true))),
            ("off", Ok((false, false, false))),
            ("error http_502", Err(())),
            ("invalid_header", Err(())),
            ("error off", Err(())),
            ("sometimes", Err(())),
        ];
        for (value, want) in cases {
            let mut n = d;
            let got = NextUpstream::parse_conditions(value, &mut n)
                .map(|()| (n.error, n.timeout, n.non_idempotent))
                .map_err(|_| ());
            assert_eq!(got, want, "{value:?}");
        }
        assert!(d.allows_another(1) && d.allows_another(2) && !d.allows_another(3));
        let off = NextUpstream {
            error: false,
            timeout: false,
            ..d
        };
        assert!(!off.allows_another(1));
        let unlimited = NextUpstream { tries: 0, ..d };
        assert!(unlimited.allows_another(100));
    }

    #[test]
    fn tls_versions() {
        let v = |tls12, tls13| Ok(TlsVersions { tls12, tls13 });
        let cases = [
            ("TLSv1.2", v(true, false)),
            ("TLSv1.3", v(false, true)),
            ("TLSv1.2 TLSv1.3", v(true, true)),
            ("  TLSv1.3   TLSv1.2 ", v(true, true)),
            ("TLSv1.1 TLSv1.2", Err(())),
            ("SSLv3", Err(())),
            ("tls1.3", Err(())),
            ("", Err(())),
        ];
        for (value, want) in cases {
            assert_eq!(TlsVersions::parse(value).map_err(|_| ()), want, "{value:?}");
        }
    }
}
