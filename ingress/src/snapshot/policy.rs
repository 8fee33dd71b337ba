//! A route's policy: what each proxy phase does for the requests on it, typed, built once per
//! snapshot from the Ingress, its annotations and the controller's settings. The proxy reads
//! these fields and nothing else about the Ingress.
//!
//! ```text
//!   phase (proxy::phase)   reads
//!   access                 AccessPolicy     refused (an access control that cannot be honoured)
//!   redirect               RedirectPolicy   ssl-redirect, force-ssl-redirect, the host's TLS
//!   upstream               UpstreamPolicy   backend-protocol (or the Service port's appProtocol),
//!                                           proxy-ssl-*, proxy-read-timeout, the upgrades allowed
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::annotations::Options;
pub use super::upstream::{
    BackendProtocol, Balance, ClientIdentity, NextUpstream, ProtocolSource, TlsVersions,
    UpstreamTls, Wire,
};

/// Everything per route, by phase.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RoutePolicy {
    pub access: AccessPolicy,
    pub redirect: RedirectPolicy,
    pub upstream: UpstreamPolicy,
}

/// Who may reach the backend.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Nobody, and why: the Ingress asks for an access control this controller cannot honour
    /// (`--unsupported-access-annotations=refuse`), so every request is answered 503 rather
    /// than served unprotected.
    pub refused: Option<Arc<str>>,
}

/// Redirects made before the upstream is asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RedirectPolicy {
    /// Plain HTTP is redirected to HTTPS: `force-ssl-redirect`, or `ssl-redirect` (default on)
    /// when the Ingress lists the host under `spec.tls`.
    pub to_https: bool,
}

/// How the upstream is spoken to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamPolicy {
    /// The protocol toward the upstream, and where that choice came from.
    pub protocol: BackendProtocol,
    pub protocol_source: ProtocolSource,
    /// How TLS to the upstream is made, for the protocols that use TLS (`proxy-ssl-*`).
    pub tls: Arc<UpstreamTls>,
    /// `proxy-read-timeout`: how long the upstream has to send its response head, and may
    /// pause while sending the body; `None` is `--upstream-response-timeout`.
    pub read_timeout: Option<Duration>,
    /// `proxy-connect-timeout`: for a new connection (TCP and TLS); `None` is
    /// `--upstream-connect-timeout`.
    pub connect_timeout: Option<Duration>,
    /// `proxy-send-timeout`: how long a write of the request to the upstream may block; `None`
    /// is `--upstream-send-timeout`.
    pub send_timeout: Option<Duration>,
    /// `upstream-vhost`: the `Host` (`:authority`) sent upstream instead of the client's.
    pub vhost: Option<Arc<str>>,
    /// `load-balance`.
    pub balance: Balance,
    /// `proxy-next-upstream`, `-tries`, `-timeout`.
    pub next_upstream: NextUpstream,
    /// `service-upstream`: the backend is the Service's ClusterIP and port, not its endpoints
    /// (read when the route's backend is resolved).
    pub service_upstream: bool,
    /// The protocols a client may switch to with `Upgrade` (lower-case).
    pub upgrades: Arc<[String]>,
}

impl Default for UpstreamPolicy {
    fn default() -> Self {
        Self {
            protocol: BackendProtocol::Http,
            protocol_source: ProtocolSource::Default,
            tls: Arc::new(UpstreamTls::default()),
            read_timeout: None,
            connect_timeout: None,
            send_timeout: None,
            vhost: None,
            balance: Balance::TwoChoices,
            next_upstream: NextUpstream::default(),
            service_upstream: false,
            upgrades: Arc::from(["websocket".to_string()]),
        }
    }
}

impl RoutePolicy {
    /// The policy of a route of an Ingress with `options`, for a host it lists under
    /// `spec.tls` or not, refused or not.
    pub fn new(options: &Options, tls: bool, refused: Option<&Arc<str>>) -> RoutePolicy {
        RoutePolicy {
            access: AccessPolicy {
                refused: refused.cloned(),
            },
            redirect: RedirectPolicy {
                to_https: options.force_ssl_redirect
                    || (tls && options.ssl_redirect.unwrap_or(true)),
            },
            upstream: UpstreamPolicy {
                protocol: options.backend_protocol.unwrap_or_default(),
                protocol_source: if options.backend_protocol.is_some() {
                    ProtocolSource::Annotation
                } else {
                    ProtocolSource::Default
                },
                tls: Arc::new(options.upstream_tls.clone()),
                read_timeout: options.read_timeout,
                connect_timeout: options.connect_timeout,
                send_timeout: options.send_timeout,
                vhost: options.upstream_vhost.as_deref().map(Arc::from),
                balance: options.load_balance.unwrap_or_default(),
                next_upstream: options.next_upstream,
                service_upstream: options.service_upstream,
                upgrades: options.upgrades.clone(),
            },
        }
    }

    /// This policy for a route whose Service port says `app_protocol`, and whose Service is
    /// reachable by `service_dns` (the name verified when `proxy-ssl-name` is not set). `None`
    /// when nothing changes, so routes keep sharing one policy.
    pub fn for_backend(
        &self,
        app_protocol: Option<BackendProtocol>,
        service_dns: &str,
    ) -> Option<RoutePolicy> {
        let protocol = match (self.upstream.protocol_source, app_protocol) {
            (ProtocolSource::Default, Some(p)) => Some(p),
            _ => None,
        };
        let name = (self.upstream.tls.name.is_none()).then(|| service_dns.to_string());
        if protocol.is_none() && name.is_none() {
            return None;
        }
        let mut policy = self.clone();
        if let Some(p) = protocol {
            policy.upstream.protocol = p;
            policy.upstream.protocol_source = ProtocolSource::AppProtocol;
        }
        if let Some(name) = name {
            let mut tls = (*policy.upstream.tls).clone();
            tls.name = Some(name);
            policy.upstream.tls = Arc::new(tls);
        }
        Some(policy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_redirects_follow_the_annotations_and_the_hosts_tls() {
        let options = |ssl: Option<bool>, force: bool| Options {
            ssl_redirect: ssl,
            force_ssl_redirect: force,
            ..Options::default()
        };
        let cases = [
            // (ssl-redirect, force-ssl-redirect, host has TLS) -> redirect
            (None, false, false, false),
            (None, false, true, true),
            (Some(false), false, true, false),
            (Some(true), false, false, false),
            (Some(false), true, false, true),
            (None, true, true, true),
        ];
        for (ssl, force, tls, want) in cases {
            let policy = RoutePolicy::new(&options(ssl, force), tls, None);
            assert_eq!(policy.redirect.to_https, want, "{ssl:?} {force} {tls}");
        }
    }

    #[test]
    fn the_annotation_wins_over_app_protocol() {
        let annotated = Options {
            backend_protocol: Some(BackendProtocol::Https),
            ..Options::default()
        };
        let cases = [
            // (options, appProtocol) -> (protocol, source)
            (
                Options::default(),
                None,
                BackendProtocol::Http,
                ProtocolSource::Default,
            ),
            (
                Options::default(),
                Some(BackendProtocol::H2c),
                BackendProtocol::H2c,
                ProtocolSource::AppProtocol,
            ),
            (
                annotated.clone(),
                Some(BackendProtocol::H2c),
                BackendProtocol::Https,
                ProtocolSource::Annotation,
            ),
            (
                annotated,
                None,
                BackendProtocol::Https,
                ProtocolSource::Annotation,
            ),
        ];
        for (options, app, protocol, source) in cases {
            let base = RoutePolicy::new(&options, false, None);
            let policy = base.for_backend(app, "svc.ns.svc").unwrap_or(base);
            assert_eq!(policy.upstream.protocol, protocol, "{options:?} {app:?}");
            assert_eq!(
                policy.upstream.protocol_source, source,
                "{options:?} {app:?}"
            );
            assert_eq!(policy.upstream.tls.name.as_deref(), Some("svc.ns.svc"));
        }
        // proxy-ssl-name is kept.
        let named = Options {
            upstream_tls: UpstreamTls {
                name: Some("backend.example".into()),
                ..UpstreamTls::default()
            },
            ..Options::default()
        };
        let base = RoutePolicy::new(&named, false, None);
        assert_eq!(base.for_backend(None, "svc.ns.svc"), None);
    }

    #[test]
    fn a_refused_ingress_keeps_its_reason() {
        let reason: Arc<str> = Arc::from("auth-url is not supported");
        let policy = RoutePolicy::new(&Options::default(), false, Some(&reason));
        assert_eq!(
            policy.access.refused.as_deref(),
            Some("auth-url is not supported")
        );
        assert_eq!(
            RoutePolicy::new(&Options::default(), false, None)
                .access
                .refused,
            None
        );
    }
}
