//! The snapshot's SNI policy as the kernel's maps hold it (converted here, at the map boundary,
//! and nowhere else), and the pure diff that moves the HOSTS map from one policy to the next
//! without a gap.
//!
//! Invariant: while a plan is applied step by step, a name valid in both the old and the new
//! policy is present at every step (upserts first, then removals), so no known host is ever
//! dropped during an update. The proptest below checks exactly that.

use std::collections::BTreeMap;

use ingress_common::{
    GateConfig, HostKey, HostValue, MAX_PORTS, SourceData, SourceValue, source_verdict,
};

use crate::snapshot::gate_sources::{self, GateSources, SourceVerdict};
use crate::snapshot::sni::{Admit, SniPolicy, UnnamedPolicy};

/// The HOSTS entries for `policy`, and the names that cannot be keys (empty, NUL, 256 bytes or
/// more). Such names could never match a ClientHello, so leaving them out changes nothing.
pub fn entries(policy: &SniPolicy) -> (BTreeMap<HostKey, HostValue>, Vec<String>) {
    let mut entries = BTreeMap::new();
    let mut rejected = Vec::new();
    for (name, action) in &policy.names {
        match HostKey::new(name.as_bytes()) {
            Some(key) => {
                entries.insert(
                    key,
                    HostValue {
                        action: *action as u32,
                        policy: policy.sources.ids.get(name).copied().unwrap_or(0),
                    },
                );
            }
            None => rejected.push(name.clone()),
        }
    }
    (entries, rejected)
}

/// A SOURCES key as userspace keeps it: (prefix length from the start of the data, data).
pub type SourceKey = (u32, SourceData);

/// The SOURCES entries for the judged names' policies: each policy's LPM entries
/// ([`gate_sources::entries`]) under its id. The kernel's longest match for (id, client) is
/// then `SourcePolicy::admits` for that client (see the tests).
pub fn source_entries(sources: &GateSources) -> BTreeMap<SourceKey, SourceValue> {
    let mut out = BTreeMap::new();
    for (id, policy) in &sources.policies {
        for (net, verdict) in gate_sources::entries(policy) {
            let key = (
                SourceData::POLICY_BITS + u32::from(net.prefix_len()),
                SourceData {
                    policy: *id,
                    addr: net.network().octets(),
                },
            );
            let verdict = match verdict {
                SourceVerdict::Admit => source_verdict::ADMIT,
                SourceVerdict::Refuse => source_verdict::REFUSE,
            };
            out.insert(key, SourceValue { verdict });
        }
    }
    out
}

/// Pure: the SOURCES operations that move `current` to `desired`: upserts (applied before
/// HOSTS changes) and removals (applied after them).
pub fn plan_sources(
    current: &BTreeMap<SourceKey, SourceValue>,
    desired: &BTreeMap<SourceKey, SourceValue>,
) -> (Vec<(SourceKey, SourceValue)>, Vec<SourceKey>) {
    let upserts = desired
        .iter()
        .filter(|(key, value)| current.get(key) != Some(value))
        .map(|(key, value)| (*key, *value))
        .collect();
    let removals = current
        .keys()
        .filter(|key| !desired.contains_key(key))
        .copied()
        .collect();
    (upserts, removals)
}

/// The CONFIG entry for `policy`, published as snapshot `generation`.
pub fn config(policy: &SniPolicy, generation: u64, netns_cookie: u64, ports: &[u16]) -> GateConfig {
    let mut port_array = [0u16; MAX_PORTS];
    for (slot, &port) in port_array.iter_mut().zip(ports) {
        *slot = port;
    }
    let case = |admit: Admit| admit.action() as u32;
    GateConfig {
        netns_cookie,
        // The kernel field is 32 bits; the low half is enough to tell adjacent ones apart.
        generation: u32::try_from(generation & u64::from(u32::MAX)).unwrap_or(u32::MAX),
        catch_all: u32::from(policy.catch_all),
        no_sni: case(policy.unnamed.no_sni),
        malformed: case(policy.unnamed.malformed),
        not_tls: case(policy.unnamed.not_tls),
        port_count: u32::try_from(ports.len().min(MAX_PORTS)).unwrap_or(0),
        ports: port_array,
        proxy_protocol: u32::from(policy.proxy_protocol),
        _reserved: 0,
    }
}

/// A policy that admits every connection that names no host, for a CONFIG written before any
/// snapshot: userspace then decides, never the kernel from a policy nobody chose.
pub fn admitting_unnamed() -> SniPolicy {
    SniPolicy {
        unnamed: UnnamedPolicy {
            no_sni: Admit::Accept,
            malformed: Admit::Accept,
            not_tls: Admit::Accept,
        },
        ..SniPolicy::default()
    }
}

/// The map operations that move HOSTS from `current` to `desired`, in the order to apply them.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SyncPlan {
    /// New names and names whose value changed. Applied first.
    pub upserts: Vec<(HostKey, HostValue)>,
    /// Names no longer wanted. Applied last, after the config is written.
    pub removals: Vec<HostKey>,
}

impl SyncPlan {
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.removals.is_empty()
    }
}

/// Pure: what to write and delete so HOSTS equals `desired`, upserts before removals.
pub fn plan(
    current: &BTreeMap<HostKey, HostValue>,
    desired: &BTreeMap<HostKey, HostValue>,
) -> SyncPlan {
    let upserts = desired
        .iter()
        .filter(|(key, value)| current.get(key) != Some(value))
        .map(|(key, value)| (*key, *value))
        .collect();
    let removals = current
        .keys()
        .filter(|key| !desired.contains_key(key))
        .copied()
        .collect();
    SyncPlan { upserts, removals }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ingress_common::{Action, action};
    use proptest::prelude::*;

    fn key(name: &str) -> HostKey {
        HostKey::new(name.as_bytes()).unwrap()
    }

    fn value(action: u32) -> HostValue {
        HostValue { action, policy: 0 }
    }

    fn map(entries: &[(&str, u32)]) -> BTreeMap<HostKey, HostValue> {
        entries.iter().map(|(n, a)| (key(n), value(*a))).collect()
    }

    #[test]
    fn plans_only_what_changed() {
        let (p, t) = (action::PASS, action::PASSTHROUGH);
        type Entries<'a> = &'a [(&'a str, u32)];
        // (current, desired, upserted names, removed names)
        let cases: [(Entries, Entries, &[&str], &[&str]); 5] = [
            (&[], &[], &[], &[]),
            (&[], &[("a.test", p)], &["a.test"], &[]),
            (&[("a.test", p)], &[], &[], &["a.test"]),
            (
                &[("a.test", p), ("b.test", p)],
                &[("a.test", p), ("b.test", t)],
                &["b.test"],
                &[],
            ),
            (
                &[("a.test", p), ("*.b.test", p)],
                &[("c.test", p), ("*.b.test", p)],
                &["c.test"],
                &["a.test"],
            ),
        ];
        for (current, desired, upserts, removals) in cases {
            let got = plan(&map(current), &map(desired));
            let got_upserts: Vec<HostKey> = got.upserts.iter().map(|(k, _)| *k).collect();
            let want_upserts: Vec<HostKey> = upserts.iter().map(|n| key(n)).collect();
            let want_removals: Vec<HostKey> = removals.iter().map(|n| key(n)).collect();
            assert_eq!(got_upserts, want_upserts, "{current:?} -> {desired:?}");
            assert_eq!(got.removals, want_removals, "{current:?} -> {desired:?}");
        }
    }

    #[test]
    fn entries_lowercase_and_set_aside_names_that_cannot_be_keys() {
        let long = "a".repeat(256);
        let policy = SniPolicy::default()
            .with_host("Shop.Example", Action::Pass)
            .with_host("*.tls.example", Action::Passthrough)
            .with_host(&long, Action::Pass)
            .with_host("", Action::Pass);
        let (entries, rejected) = entries(&policy);
        assert_eq!(
            entries.get(&key("shop.example")),
            Some(&value(action::PASS))
        );
        assert_eq!(
            entries.get(&key("*.tls.example")),
            Some(&value(action::PASSTHROUGH))
        );
        assert_eq!(entries.len(), 2);
        assert_eq!(rejected, vec![String::new(), long]);
    }

    /// The kernel's LPM lookup over SOURCES keys, emulated bit by bit: the longest key whose
    /// first `prefixlen` bits of (policy, address) equal the lookup's.
    fn lpm(
        entries: &BTreeMap<SourceKey, SourceValue>,
        policy: u32,
        client: std::net::IpAddr,
    ) -> Option<u32> {
        let bytes = |policy: u32, addr: [u8; 16]| {
            let mut out = [0u8; 20];
            out[..4].copy_from_slice(&policy.to_ne_bytes());
            out[4..].copy_from_slice(&addr);
            out
        };
        let want = bytes(policy, gate_sources::mapped_addr(client).octets());
        let bit = |b: &[u8; 20], i: u32| (b[(i / 8) as usize] >> (7 - i % 8)) & 1;
        entries
            .iter()
            .filter(|((prefixlen, data), _)| {
                let have = bytes(data.policy, data.addr);
                (0..*prefixlen).all(|i| bit(&have, i) == bit(&want, i))
            })
            .max_by_key(|((prefixlen, _), _)| *prefixlen)
            .map(|(_, value)| value.verdict)
    }

    #[test]
    fn source_entries_give_the_access_phase_verdict_per_policy() {
        use crate::snapshot::sources::{SourcePolicy, parse_ranges};
        let policy = |allow: Option<&str>, deny: &str| SourcePolicy {
            allow: allow.map(|a| parse_ranges(a).unwrap().unwrap()),
            deny: parse_ranges(deny).unwrap().unwrap_or_else(|| [].into()),
        };
        let names = [
            ("a.test", policy(Some("10.0.0.0/8"), "10.1.0.0/16")),
            ("b.test", policy(None, "192.0.2.0/24, 2001:db8::/32")),
            ("c.test", policy(Some("2001:db8::/32"), "")),
        ];
        let sources = GateSources::assign(
            names
                .iter()
                .map(|(n, p)| (n.to_string(), p.clone()))
                .collect(),
        );
        let entries = source_entries(&sources);
        assert!(
            entries
                .keys()
                .all(|(prefix, _)| *prefix >= SourceData::POLICY_BITS)
        );
        let clients = [
            "10.2.0.1",
            "10.1.0.1",
            "11.0.0.1",
            "192.0.2.9",
            "2001:db8::1",
            "2001:db9::1",
        ];
        for (name, policy) in &names {
            let id = sources.ids[*name];
            for client in clients {
                let client = client.parse().unwrap();
                let want = if policy.admits(client) {
                    source_verdict::ADMIT
                } else {
                    source_verdict::REFUSE
                };
                assert_eq!(lpm(&entries, id, client), Some(want), "{name} {client}");
            }
        }
        // An id no policy has matches nothing: never judged by another policy's ranges.
        let unused = (1..).find(|id| !sources.policies.contains_key(id)).unwrap();
        assert_eq!(lpm(&entries, unused, "10.2.0.1".parse().unwrap()), None);
    }

    #[test]
    fn config_carries_the_cases_and_ports() {
        let policy = SniPolicy {
            catch_all: true,
            unnamed: UnnamedPolicy {
                no_sni: Admit::Reject,
                malformed: Admit::Accept,
                not_tls: Admit::Reject,
            },
            ..SniPolicy::default()
        };
        let config = config(&policy, (7u64 << 32) | 9, 42, &[443, 8443]);
        assert_eq!(config.netns_cookie, 42);
        assert_eq!(config.generation, 9);
        assert_eq!(config.catch_all, 1);
        assert_eq!(
            (config.no_sni, config.malformed, config.not_tls),
            (action::DROP, action::PASS, action::DROP)
        );
        assert_eq!(config.port_count, 2);
        assert_eq!(&config.ports[..3], &[443, 8443, 0]);
    }

    fn names() -> impl Strategy<Value = BTreeMap<HostKey, HostValue>> {
        // A small name space so old and new policies overlap often.
        let name = prop::sample::select(vec![
            "a.test", "b.test", "c.test", "*.d.test", "e.test", "f.test",
        ]);
        let action = prop::sample::select(vec![action::PASS, action::PASSTHROUGH]);
        prop::collection::btree_map(name.prop_map(key), action.prop_map(value), 0..6)
    }

    proptest! {
        /// Applying the plan one map operation at a time never leaves out a name that both
        /// policies contain, and ends exactly at the desired map.
        #[test]
        fn no_name_valid_in_both_policies_is_ever_absent(old in names(), new in names()) {
            let steps = plan(&old, &new);
            let mut state = old.clone();
            let kept: Vec<HostKey> = old.keys().filter(|k| new.contains_key(k)).copied().collect();
            let check = |state: &BTreeMap<HostKey, HostValue>| {
                for k in &kept {
                    prop_assert!(state.contains_key(k), "{k:?} missing mid-update");
                }
                Ok(())
            };
            for (k, v) in &steps.upserts {
                state.insert(*k, *v);
                check(&state)?;
            }
            for k in &steps.removals {
                state.remove(k);
                check(&state)?;
            }
            prop_assert_eq!(state, new);
        }

        /// A plan from a state to itself is empty, so an unchanged snapshot costs no syscalls.
        #[test]
        fn an_unchanged_policy_plans_nothing(old in names()) {
            prop_assert!(plan(&old, &old).is_empty());
        }
    }
}
