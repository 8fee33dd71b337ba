//! The SNI gate's policy: which names the HTTPS port admits, and what happens to a connection
//! from its first TLS record. One pure function decides for both modes: the kernel program
//! mirrors it from the HOSTS map, and userspace mode calls it directly.
//!
//! ```text
//!   ClientHello ─ name ─ lookup(exact, then "*." + parent) ─ Pass        → pass
//!        │                                                └ Passthrough → passthrough
//!        │                                                └ none: catch-all ? pass : drop (unknown)
//!        └ no name / malformed / not TLS ─ the configured action for that case (unnamed)
//! ```
//!
//! The action and reason types are the kernel's own (`ingress_common`), converted to and from
//! their map values once, in `gate::policy`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use super::gate_sources::GateSources;
use crate::client_hello::{self, ClientHello, Reject};
pub use ingress_common::{Action, Reason};

/// The names the gate admits, and what it does with connections that name none. Wildcards are
/// stored as `*.parent`, which is also what `bpftool map dump` shows for them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SniPolicy {
    /// Each known name's action: [`Action::Pass`] (TLS terminated here) or
    /// [`Action::Passthrough`] (TLS left to the backend, the stream routed by SNI alone).
    pub names: BTreeMap<String, Action>,
    /// Admit every name: some Ingress has host-less rules or a default backend.
    pub catch_all: bool,
    /// What happens when there is no name to look up.
    pub unnamed: UnnamedPolicy,
    /// The names whose clients are also judged by source address before accept.
    pub sources: GateSources,
    /// `use-proxy-protocol`: every connection starts with a PROXY protocol header, the
    /// ClientHello behind it. Here so that the kernel and the listeners switch with the same
    /// snapshot.
    pub proxy_protocol: bool,
}

impl SniPolicy {
    /// Exact name first, then the wildcard one label up.
    pub fn lookup(&self, name: &str) -> Option<Action> {
        self.lookup_entry(name).map(|(_, action)| action)
    }

    /// The entry [`SniPolicy::lookup`] matches: its key (the name, or `*.parent`) and action.
    pub fn lookup_entry<'a>(&'a self, name: &str) -> Option<(&'a str, Action)> {
        if let Some((key, action)) = self.names.get_key_value(name) {
            return Some((key, *action));
        }
        let (first, parent) = name.split_once('.')?;
        if first.is_empty() {
            return None;
        }
        let (key, action) = self.names.get_key_value(&format!("*.{parent}"))?;
        Some((key, *action))
    }

    /// Whether the gate refuses `client` for `name` by source address before accept: the name's
    /// host has one source policy for all its routes, and it does not admit `client`.
    pub fn source_refuses(&self, name: &str, client: IpAddr) -> bool {
        self.lookup_entry(name)
            .and_then(|(key, _)| self.sources.policy(key))
            .is_some_and(|policy| !policy.admits(client))
    }

    /// The policy with `name` (lower-cased) added: for tests and callers building by hand.
    pub fn with_host(mut self, name: &str, action: Action) -> SniPolicy {
        self.names.insert(name.to_ascii_lowercase(), action);
        self
    }
}

/// Accept or reject, for the cases without a name to look up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    Accept,
    Reject,
}

impl Admit {
    /// The gate's action for a connection in this case.
    pub fn action(self) -> Action {
        match self {
            Admit::Accept => Action::Pass,
            Admit::Reject => Action::Drop,
        }
    }
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

/// The decision for one connection's first record: what to do, and why.
pub fn decide(policy: &SniPolicy, hello: &Result<ClientHello<'_>, Reject>) -> (Action, Reason) {
    match client_hello::gate(hello) {
        Ok(name) => match policy.lookup(name.as_str()) {
            Some(Action::Passthrough) => (Action::Passthrough, Reason::Passthrough),
            Some(_) => (Action::Pass, Reason::Pass),
            None if policy.catch_all => (Action::Pass, Reason::Pass),
            None => (Action::Drop, Reason::Unknown),
        },
        Err(reason) => {
            let admit = match reason {
                Reason::NoSni => policy.unnamed.no_sni,
                Reason::NotTls => policy.unnamed.not_tls,
                _ => policy.unnamed.malformed,
            };
            (admit.action(), reason)
        }
    }
}

/// [`decide`] for a connection from `client`: a known name whose host's source ranges refuse
/// it is dropped (reason source_refused), as the kernel's SOURCES lookup does.
pub fn decide_for(
    policy: &SniPolicy,
    hello: &Result<ClientHello<'_>, Reject>,
    client: IpAddr,
) -> (Action, Reason) {
    let (action, reason) = decide(policy, hello);
    if matches!(reason, Reason::Pass | Reason::Passthrough)
        && let Ok(name) = client_hello::gate(hello)
        && policy.source_refuses(name.as_str(), client)
    {
        return (Action::Drop, Reason::SourceRefused);
    }
    (action, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(names: &[(&str, Action)], catch_all: bool) -> SniPolicy {
        SniPolicy {
            names: names.iter().map(|(n, a)| (n.to_string(), *a)).collect(),
            catch_all,
            unnamed: UnnamedPolicy::default(),
            ..SniPolicy::default()
        }
    }

    #[test]
    fn lookup_table() {
        let p = policy(
            &[
                ("a.example.com", Action::Pass),
                ("*.w.example.com", Action::Passthrough),
            ],
            false,
        );
        let cases = [
            ("a.example.com", Some(Action::Pass)),
            ("x.w.example.com", Some(Action::Passthrough)),
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
        let with = |unnamed: UnnamedPolicy| SniPolicy {
            unnamed,
            ..policy(&[], false)
        };
        let strict = with(UnnamedPolicy {
            no_sni: Admit::Reject,
            malformed: Admit::Reject,
            not_tls: Admit::Reject,
        });
        let lax = with(UnnamedPolicy {
            no_sni: Admit::Accept,
            malformed: Admit::Accept,
            not_tls: Admit::Accept,
        });
        let not_tls: Result<ClientHello<'_>, Reject> = Err(Reject::NotTls);
        let malformed: Result<ClientHello<'_>, Reject> = Err(Reject::NotClientHello);
        assert_eq!(decide(&strict, &not_tls), (Action::Drop, Reason::NotTls));
        assert_eq!(decide(&lax, &not_tls), (Action::Pass, Reason::NotTls));
        assert_eq!(
            decide(&strict, &malformed),
            (Action::Drop, Reason::Malformed)
        );
        assert_eq!(
            decide(&policy(&[], false), &malformed),
            (Action::Drop, Reason::Malformed)
        );
    }
}
