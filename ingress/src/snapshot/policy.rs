//! A route's policy: what each proxy phase does for the requests on it, typed, built once per
//! snapshot from the Ingress, its annotations and the controller's settings. The proxy reads
//! these fields and nothing else about the Ingress.
//!
//! ```text
//!   phase (proxy::phase)   reads
//!   access                 AccessPolicy     refused (an access control that cannot be honoured),
//!                                           source ranges (allow- and deny-lists)
//!   redirect               RedirectPolicy   ssl-redirect, force-ssl-redirect, the host's TLS
//!   upstream               UpstreamPolicy   proxy-read-timeout, the upgrades allowed
//! ```

use std::sync::Arc;
use std::time::Duration;

use super::annotations::Options;
use super::sources::SourcePolicy;

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
    /// `allowlist-source-range` / `denylist-source-range`: who may, by source address (403).
    pub sources: SourcePolicy,
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
    /// `proxy-read-timeout`: how long the upstream has to send its response head, and may
    /// pause while sending the body; `None` is `--upstream-response-timeout`.
    pub read_timeout: Option<Duration>,
    /// The protocols a client may switch to with `Upgrade` (lower-case).
    pub upgrades: Arc<[String]>,
}

impl Default for UpstreamPolicy {
    fn default() -> Self {
        Self {
            read_timeout: None,
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
                sources: SourcePolicy::default(),
            },
            redirect: RedirectPolicy {
                to_https: options.force_ssl_redirect
                    || (tls && options.ssl_redirect.unwrap_or(true)),
            },
            upstream: UpstreamPolicy {
                read_timeout: options.read_timeout,
                upgrades: options.upgrades.clone(),
            },
        }
    }
}

impl RoutePolicy {
    /// The same policy with the Ingress's source ranges.
    pub fn with_sources(mut self, sources: &SourcePolicy) -> RoutePolicy {
        self.access.sources = sources.clone();
        self
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
