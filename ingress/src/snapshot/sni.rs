//! The SNI gate's policy: which names the HTTPS port admits, and what happens to a connection
//! from its first TLS record. One pure function decides for both modes: the kernel program
//! mirrors it from the HOSTS map, and userspace mode calls it directly.
//!
//! ```text
//!   ClientHello ─ name ─ lookup(exact, then "*." + parent) ─ Terminate   → pass
//!        │                                                └ Passthrough → passthrough
//!        │                                                └ none: catch-all ? pass : drop (unknown)
//!        └ no name / malformed / not TLS ─ the configured verdict for that case
//! ```

use std::collections::BTreeMap;
use std::fmt;

use crate::client_hello::{self, ClientHello, Reason, Reject};

/// What a known name does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum HostAction {
    /// TLS is terminated here and the request routed by the proxy.
    Terminate,
    /// TLS is left to the backend; the stream is routed by SNI alone.
    Passthrough,
}

/// The names the gate admits. Wildcards are stored as `*.parent`, which is also what
/// `bpftool map dump` shows for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SniPolicy {
    pub names: BTreeMap<String, HostAction>,
    /// Admit every name: some Ingress has host-less rules or a default backend.
    pub catch_all: bool,
}

impl SniPolicy {
    /// Exact name first, then the wildcard one label up.
    pub fn lookup(&self, name: &str) -> Option<HostAction> {
        if let Some(action) = self.names.get(name) {
            return Some(*action);
        }
        let (first, parent) = name.split_once('.')?;
        if first.is_empty() {
            return None;
        }
        self.names.get(&format!("*.{parent}")).copied()
    }
}

/// What happens to a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Verdict {
    Pass,
    Drop,
    Passthrough,
}

/// Why; these are the gate's counter labels, and the kernel counts the same six.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GateReason {
    Pass,
    Unknown,
    NoSni,
    Malformed,
    NotTls,
    Passthrough,
}

impl GateReason {
    pub const ALL: [GateReason; 6] = [
        GateReason::Pass,
        GateReason::Unknown,
        GateReason::NoSni,
        GateReason::Malformed,
        GateReason::NotTls,
        GateReason::Passthrough,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            GateReason::Pass => "pass",
            GateReason::Unknown => "unknown",
            GateReason::NoSni => "no_sni",
            GateReason::Malformed => "malformed",
            GateReason::NotTls => "not_tls",
            GateReason::Passthrough => "passthrough",
        }
    }
}

impl fmt::Display for GateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Accept or reject, for the cases without a name to look up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Accept,
    Reject,
}

/// The configured verdicts for first records that name no host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnnamedPolicy {
    /// A valid ClientHello without `server_name` (clients connecting by IP address).
    pub no_sni: Admit,
    /// TLS, but not a ClientHello that parses.
    pub malformed: Admit,
    /// Not TLS at all, such as plain HTTP sent to the HTTPS port.
    pub not_tls: Admit,
}

impl Default for UnnamedPolicy {
    /// ingress-nginx serves the default certificate to clients without SNI; garbage and plain
    /// HTTP on the HTTPS port have nothing to gain from a handshake.
    fn default() -> Self {
        Self {
            no_sni: Admit::Accept,
            malformed: Admit::Reject,
            not_tls: Admit::Reject,
        }
    }
}

/// The decision for one connection's first record.
pub fn decide(
    policy: &SniPolicy,
    unnamed: &UnnamedPolicy,
    hello: &Result<ClientHello<'_>, Reject>,
) -> (Verdict, GateReason) {
    match client_hello::gate(hello) {
        Ok(name) => match policy.lookup(name.as_str()) {
            Some(HostAction::Terminate) => (Verdict::Pass, GateReason::Pass),
            Some(HostAction::Passthrough) => (Verdict::Passthrough, GateReason::Passthrough),
            None if policy.catch_all => (Verdict::Pass, GateReason::Pass),
            None => (Verdict::Drop, GateReason::Unknown),
        },
        Err(reason) => {
            let (admit, reason) = match reason {
                Reason::NoSni => (unnamed.no_sni, GateReason::NoSni),
                Reason::Malformed => (unnamed.malformed, GateReason::Malformed),
                Reason::NotTls => (unnamed.not_tls, GateReason::NotTls),
            };
            let verdict = if admit == Admit::Accept {
                Verdict::Pass
            } else {
                Verdict::Drop
            };
            (verdict, reason)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(names: &[(&str, HostAction)], catch_all: bool) -> SniPolicy {
        SniPolicy {
            names: names.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
            catch_all,
        }
    }

    #[test]
    fn lookup_table() {
        let p = policy(
            &[
                ("a.example.com", HostAction::Terminate),
                ("*.w.example.com", HostAction::Passthrough),
            ],
            false,
        );
        let cases = [
            ("a.example.com", Some(HostAction::Terminate)),
            ("x.w.example.com", Some(HostAction::Passthrough)),
            ("y.x.w.example.com", None),
            ("w.example.com", None),
            ("b.example.com", None),
            (".w.example.com", None),
        ];
        for (name, want) in cases {
            assert_eq!(p.lookup(name), want, "{name}");
        }
    }

    #[test]
    fn unnamed_cases_follow_configuration() {
        let p = policy(&[], false);
        let strict = UnnamedPolicy {
            no_sni: Admit::Reject,
            malformed: Admit::Reject,
            not_tls: Admit::Reject,
        };
        let lax = UnnamedPolicy {
            no_sni: Admit::Accept,
            malformed: Admit::Accept,
            not_tls: Admit::Accept,
        };
        let not_tls: Result<ClientHello<'_>, Reject> = Err(Reject::NotTls);
        let malformed: Result<ClientHello<'_>, Reject> = Err(Reject::NotClientHello);
        assert_eq!(
            decide(&p, &strict, &not_tls),
            (Verdict::Drop, GateReason::NotTls)
        );
        assert_eq!(
            decide(&p, &lax, &not_tls),
            (Verdict::Pass, GateReason::NotTls)
        );
        assert_eq!(
            decide(&p, &strict, &malformed),
            (Verdict::Drop, GateReason::Malformed)
        );
        assert_eq!(
            decide(&p, &UnnamedPolicy::default(), &malformed),
            (Verdict::Drop, GateReason::Malformed)
        );
    }
}
