//! Source ranges in the SNI gate: which admitted names also have their clients judged by source
//! address before accept, and the longest-prefix-match entries that encode each policy.
//!
//! ```text
//!   host name ─ every route of the host (all paths and the fallback, or the passthrough route)
//!       │        the same judgeable, non-empty SourcePolicy?  ── no ─> id 0: the kernel does
//!       │                                                            not judge sources, the
//!       │                                                            access phase's 403 stays
//!       └ yes ─> id = content hash of the policy (never 0)
//!   id ─> entries: (policy, ::ffff:v4 or v6 prefix) -> admit | refuse, one LPM lookup per client
//! ```
//!
//! Ids are given only while the kernel sees the client the access phase judges
//! (`kernel_sees_client`). With trusted forwarded headers on it does not: the client is named
//! per request, after accept, so no name gets an id. Behind PROXY protocol the programs read the
//! client the header names, so names get ids unless `proxy-real-ip-cidr` is set: then whether
//! a header is believed depends on its peer, which the kernel leaves to the access phase. A
//! route refused outright (503) or with `satisfy: any` and authentication (a client outside the
//! ranges may still log in) is not judgeable either.
//!
//! Ids are a hash of the policy's content (probed on a collision, in sorted order), not a rank:
//! the same policy keeps its id from one snapshot to the next, so a policy's entries never
//! change meaning while an update is written (see [`GateSources::union`]).
//!
//! ingress-nginx's order (deny ranges, then allow ranges, then `deny all` with an allow-list)
//! becomes one longest-prefix match: a deny range inside an allow range is longer and wins, as
//! its earlier `deny` line would; an allow range inside (or equal to) a deny range can never
//! match in nginx, so it is left out. Every policy also has a `/0` entry (no range matched:
//! refuse iff there is an allow-list) and one for `::ffff:0:0/96`, so an IPv6 range that covers
//! the IPv4-mapped space (`::/0`) never judges an IPv4 client, as [`SourcePolicy::admits`] never
//! lets an IPv6 range match one.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr};

use ipnet::{IpNet, Ipv6Net};

use super::policy::AccessPolicy;
use super::sources::SourcePolicy;
use crate::snapshot::annotations::auth::Satisfy;

/// The prefix of the IPv4-mapped IPv6 space (`::ffff:0:0/96`), where IPv4 clients and ranges
/// are keyed.
pub const V4_MAPPED_PREFIX: u8 = 96;

/// Per admitted name, the source policy the gate applies before accept, by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GateSources {
    /// Keyed by the gate's names (`SniPolicy::names`, wildcards as `*.parent`); a name that is
    /// absent has id 0: its sources are not judged by the gate.
    pub ids: BTreeMap<String, u32>,
    /// Each id in `ids`, with its policy.
    pub policies: BTreeMap<u32, SourcePolicy>,
}

impl GateSources {
    /// Assigns ids to the judged names' policies: `names` maps each gate name to its host's
    /// policy (already [`uniform`] and non-empty).
    pub fn assign(names: BTreeMap<String, SourcePolicy>) -> GateSources {
        let distinct: BTreeSet<&SourcePolicy> = names.values().collect();
        let mut by_policy: BTreeMap<&SourcePolicy, u32> = BTreeMap::new();
        let mut policies = BTreeMap::new();
        for policy in distinct {
            let mut id = policy_hash(policy);
            while id == 0 || policies.contains_key(&id) {
                id = id.wrapping_add(1);
            }
            policies.insert(id, policy.clone());
            by_policy.insert(policy, id);
        }
        let ids = names
            .iter()
            .filter_map(|(name, policy)| Some((name.clone(), *by_policy.get(policy)?)))
            .collect();
        GateSources { ids, policies }
    }

    /// The policy of gate name `key` (the key `SniPolicy::lookup` matched), if the gate judges it.
    pub fn policy(&self, key: &str) -> Option<&SourcePolicy> {
        self.policies.get(self.ids.get(key)?)
    }

    /// What the kernel holds while a publish from `old` to `new` is under way: every policy of
    /// either (an id means the same policy in both, as ids are content hashes; an id that would
    /// not is left out, with its names), `new`'s id for a name only `new` has and `old`'s for
    /// one only `old` has. A name whose id differs between the two gets none: until the proxy
    /// serves `new`, the access phase alone judges it, so the kernel never applies a policy the
    /// proxy does not.
    pub fn union(new: &GateSources, old: &GateSources) -> GateSources {
        let mut policies = new.policies.clone();
        let mut clashing = BTreeSet::new();
        for (id, policy) in &old.policies {
            match policies.get(id) {
                Some(same) if same == policy => {}
                Some(_) => {
                    clashing.insert(*id);
                }
                None => {
                    policies.insert(*id, policy.clone());
                }
            }
        }
        let mut ids = BTreeMap::new();
        for (name, id) in &new.ids {
            match old.ids.get(name) {
                Some(old_id) if old_id != id => {}
                _ => {
                    ids.insert(name.clone(), *id);
                }
            }
        }
        for (name, id) in &old.ids {
            if !new.ids.contains_key(name) {
                ids.insert(name.clone(), *id);
            }
        }
        ids.retain(|_, id| !clashing.contains(id));
        policies.retain(|id, _| ids.values().any(|used| used == id));
        GateSources { ids, policies }
    }
}

/// The source policy the gate may apply for a route: `None` when the kernel must leave the
/// route to the access phase (refused outright, or `satisfy: any` with authentication, where a
/// client outside the ranges can still get in).
pub fn judgeable(access: &AccessPolicy) -> Option<&SourcePolicy> {
    if access.refused.is_some() {
        return None;
    }
    if access.auth.satisfy == Satisfy::Any && access.auth.is_on() {
        return None;
    }
    Some(&access.sources)
}

/// The one policy every route of a host has, if they all have the same judgeable, non-empty
/// one; `None` otherwise (also for a host without routes).
pub fn uniform<'a>(mut routes: impl Iterator<Item = &'a AccessPolicy>) -> Option<SourcePolicy> {
    let first = judgeable(routes.next()?)?;
    if first.is_open() {
        return None;
    }
    for access in routes {
        if judgeable(access)? != first {
            return None;
        }
    }
    Some(first.clone())
}

/// A stable 32-bit hash (FNV-1a) of the policy's ranges: the same in every build and process, so
/// pinned maps reused by a restart keep their meaning.
fn policy_hash(policy: &SourcePolicy) -> u32 {
    const OFFSET: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    let mut hash = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    let mut nets = |tag: u8, nets: &[IpNet]| {
        eat(&[tag]);
        for net in nets {
            match net {
                IpNet::V4(net) => {
                    eat(&[4]);
                    eat(&net.addr().octets());
                }
                IpNet::V6(net) => {
                    eat(&[6]);
                    eat(&net.addr().octets());
                }
            }
            eat(&[net.prefix_len()]);
        }
    };
    match &policy.allow {
        Some(allow) => nets(b'a', allow),
        None => nets(b'n', &[]),
    }
    nets(b'd', &policy.deny);
    hash
}

/// What one LPM entry says about the clients it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SourceVerdict {
    Admit,
    Refuse,
}

/// A range as the kernel keys it: IPv4 as `::ffff:a.b.c.d` with its prefix + 96.
pub fn mapped(net: &IpNet) -> Ipv6Net {
    match net {
        // An IPv4 prefix is at most 32, so the sum is at most 128 and `new` cannot fail; the
        // fallback (the whole IPv4 space) is never taken.
        IpNet::V4(net) => Ipv6Net::new(
            net.addr().to_ipv6_mapped(),
            net.prefix_len() + V4_MAPPED_PREFIX,
        )
        .unwrap_or(V4_SPACE),
        IpNet::V6(net) => *net,
    }
}

/// The client address as the kernel keys it.
pub fn mapped_addr(client: IpAddr) -> Ipv6Addr {
    match client {
        IpAddr::V4(addr) => addr.to_ipv6_mapped(),
        IpAddr::V6(addr) => addr,
    }
}

/// The LPM entries for `policy`, whose longest match for a client address is
/// [`SourcePolicy::admits`]'s verdict for it (see the module doc for why).
pub fn entries(policy: &SourcePolicy) -> BTreeMap<Ipv6Net, SourceVerdict> {
    let no_match = if policy.allow.is_some() {
        SourceVerdict::Refuse
    } else {
        SourceVerdict::Admit
    };
    let v4_space = V4_SPACE;
    let mut entries = BTreeMap::new();
    entries.insert(Ipv6Net::default(), no_match);
    entries.insert(v4_space, no_match);
    // An IPv6 range inside the IPv4-mapped space never matches a client in userspace (an IPv4
    // client is judged as IPv4, and no IPv6 client has such an address): left out.
    let keyed = |net: &IpNet| {
        let key = mapped(net);
        (matches!(net, IpNet::V4(_)) || !v4_space.contains(&key))
            .then_some((matches!(net, IpNet::V4(_)), key))
    };
    let deny: Vec<(bool, Ipv6Net)> = policy.deny.iter().filter_map(keyed).collect();
    for (_, net) in &deny {
        entries.insert(*net, SourceVerdict::Refuse);
    }
    for net in policy.allow.iter().flat_map(|allow| allow.iter()) {
        let Some((v4, net)) = keyed(net) else {
            continue;
        };
        // Nested only within a family: an IPv6 deny range covering the mapped space (`::/0`)
        // never refuses an IPv4 client, so it does not hide an IPv4 allow range.
        if deny.iter().any(|(d4, d)| *d4 == v4 && d.contains(&net)) {
            continue;
        }
        entries.insert(net, SourceVerdict::Admit);
    }
    entries
}

/// `::ffff:0:0/96` (checked at compile time).
const V4_SPACE: Ipv6Net =
    Ipv6Net::new_assert(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0), V4_MAPPED_PREFIX);

/// The kernel's lookup, emulated: the longest entry containing `client` decides.
pub fn lpm_verdict(entries: &BTreeMap<Ipv6Net, SourceVerdict>, client: IpAddr) -> SourceVerdict {
    let addr = mapped_addr(client);
    entries
        .iter()
        .filter(|(net, _)| net.contains(&addr))
        .max_by_key(|(net, _)| net.prefix_len())
        .map_or(SourceVerdict::Admit, |(_, verdict)| *verdict)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;
    use crate::snapshot::annotations::auth::BasicAuth;
    use crate::snapshot::annotations::htpasswd::Credentials;
    use crate::snapshot::sources::parse_ranges;
    use crate::store::ObjectKey;

    fn policy(allow: Option<&str>, deny: &str) -> SourcePolicy {
        SourcePolicy {
            allow: allow.map(|a| parse_ranges(a).unwrap().unwrap()),
            deny: parse_ranges(deny).unwrap().unwrap_or_else(|| Arc::from([])),
        }
    }

    fn admits(entries: &BTreeMap<Ipv6Net, SourceVerdict>, client: IpAddr) -> bool {
        lpm_verdict(entries, client) == SourceVerdict::Admit
    }

    #[test]
    fn the_longest_match_gives_ingress_nginx_verdicts() {
        let policies = [
            policy(Some("10.0.0.0/8"), ""),
            policy(Some("10.0.0.0/8"), "10.1.0.0/16"),
            policy(Some("10.1.0.0/16"), "10.0.0.0/8"),
            policy(Some("10.1.0.0/16"), "10.1.0.0/16"),
            policy(None, "192.0.2.0/24"),
            policy(Some("2001:db8::/32, 10.0.0.0/8"), "2001:db8:1::/48"),
            policy(None, "::/0"),
            policy(Some("::/0"), ""),
            policy(Some("0.0.0.0/0"), "::/0"),
            policy(Some("::/0"), "0.0.0.0/0"),
            policy(Some("::ffff:10.0.0.0/104"), ""),
            policy(Some("0.0.0.0/0"), "10.0.0.1"),
            policy(Some("10.0.0.0/8, 10.2.0.0/16"), "10.2.3.0/24, 10.0.0.0/8"),
        ];
        let clients = [
            "10.1.2.3",
            "10.2.3.4",
            "10.2.4.4",
            "10.0.0.1",
            "11.0.0.1",
            "192.0.2.1",
            "192.0.3.1",
            "2001:db8::1",
            "2001:db8:1::1",
            "2001:db9::1",
            "::ffff:10.1.2.3",
            "::1",
        ];
        for policy in &policies {
            let entries = entries(policy);
            for client in clients {
                let client: IpAddr = client.parse().unwrap();
                assert_eq!(
                    admits(&entries, client),
                    policy.admits(client),
                    "{policy:?} {client} entries {entries:?}"
                );
            }
        }
    }

    #[test]
    fn nested_allow_ranges_are_left_out_and_every_policy_has_its_defaults() {
        let got = entries(&policy(Some("10.1.0.0/16, 10.0.0.0/8"), "10.0.0.0/8"));
        let want: Vec<(String, SourceVerdict)> = vec![
            ("::/0".into(), SourceVerdict::Refuse),
            ("::ffff:0.0.0.0/96".into(), SourceVerdict::Refuse),
            ("::ffff:10.0.0.0/104".into(), SourceVerdict::Refuse),
        ];
        let got: Vec<(String, SourceVerdict)> =
            got.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        assert_eq!(got, want);
    }

    fn access(sources: SourcePolicy) -> AccessPolicy {
        AccessPolicy {
            sources,
            ..AccessPolicy::default()
        }
    }

    #[test]
    fn a_host_is_judged_only_when_all_its_routes_agree() {
        let a = access(policy(Some("10.0.0.0/8"), ""));
        let b = access(policy(Some("10.0.0.0/16"), ""));
        let open = access(SourcePolicy::default());
        let refused = AccessPolicy {
            refused: Some("unsupported".into()),
            ..a.clone()
        };
        let mut any = a.clone();
        any.auth.satisfy = Satisfy::Any;
        let basic = Some(Arc::new(BasicAuth {
            realm: Arc::from(""),
            credentials: Credentials::default(),
            secret: ObjectKey::new("ns", "s"),
        }));
        let mut any_with_auth = any.clone();
        any_with_auth.auth.basic = basic.clone();
        let mut all_with_auth = a.clone();
        all_with_auth.auth.basic = basic;
        let cases: [(&[&AccessPolicy], bool); 9] = [
            (&[], false),
            (&[&a], true),
            (&[&a, &a], true),
            (&[&a, &b], false),
            (&[&a, &open], false),
            (&[&open], false),
            (&[&a, &refused], false),
            // satisfy any only matters with authentication.
            (&[&a, &any], true),
            (&[&any_with_auth], false),
        ];
        for (routes, judged) in cases {
            let got = uniform(routes.iter().copied());
            assert_eq!(got.is_some(), judged, "{routes:?}");
            if let Some(got) = got {
                assert_eq!(got, a.sources);
            }
        }
        assert_eq!(
            uniform([&all_with_auth].into_iter()),
            Some(a.sources.clone())
        );
    }

    #[test]
    fn ids_are_stable_content_hashes_never_zero() {
        let p = policy(Some("10.0.0.0/8"), "");
        let q = policy(None, "192.0.2.0/24");
        let names = |list: &[(&str, &SourcePolicy)]| {
            list.iter()
                .map(|(n, p)| (n.to_string(), (*p).clone()))
                .collect::<BTreeMap<_, _>>()
        };
        let one = GateSources::assign(names(&[("a.test", &p), ("b.test", &q), ("c.test", &p)]));
        let two = GateSources::assign(names(&[("c.test", &p)]));
        assert_eq!(one.ids["a.test"], one.ids["c.test"]);
        assert_ne!(one.ids["a.test"], one.ids["b.test"]);
        assert_eq!(
            one.ids["c.test"], two.ids["c.test"],
            "ids do not depend on the others"
        );
        assert_eq!(one.policies.len(), 2);
        assert!(!one.policies.contains_key(&0));
        assert_eq!(one.policy("b.test"), Some(&q));
        assert_eq!(one.policy("d.test"), None);
    }

    #[test]
    fn the_union_defers_names_whose_policy_changes() {
        let p = policy(Some("10.0.0.0/8"), "");
        let q = policy(None, "192.0.2.0/24");
        let r = policy(Some("10.0.0.0/16"), "");
        let names = |list: &[(&str, &SourcePolicy)]| {
            GateSources::assign(
                list.iter()
                    .map(|(n, p)| (n.to_string(), (*p).clone()))
                    .collect(),
            )
        };
        let old = names(&[("kept.test", &p), ("changed.test", &q), ("gone.test", &q)]);
        let new = names(&[("kept.test", &p), ("changed.test", &r), ("new.test", &r)]);
        let union = GateSources::union(&new, &old);
        assert_eq!(union.policy("kept.test"), Some(&p));
        assert_eq!(union.policy("changed.test"), None);
        assert_eq!(union.policy("gone.test"), Some(&q));
        assert_eq!(union.policy("new.test"), Some(&r));
        assert_eq!(union.policies.len(), 3);
        // A clash of ids (two policies, one hash, across snapshots) judges nobody by it.
        let id = new.ids["new.test"];
        let mut clash = old.clone();
        clash.policies.insert(id, p.clone());
        clash.ids.insert("other.test".into(), id);
        let union = GateSources::union(&new, &clash);
        assert_eq!(union.policy("new.test"), None);
        assert_eq!(union.policy("other.test"), None);
    }

    fn net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, p)| {
                IpNet::V4(ipnet::Ipv4Net::new(a.into(), p).unwrap().trunc())
            }),
            // Few distinct prefixes, so ranges nest and overlap often.
            (prop::sample::select(vec![8u8, 12, 16, 24]), 0u8..=32).prop_map(|(a, p)| {
                IpNet::V4(
                    ipnet::Ipv4Net::new([10, a, 0, 0].into(), p)
                        .unwrap()
                        .trunc(),
                )
            }),
            (any::<u16>(), 0u8..=128).prop_map(|(a, p)| {
                let addr = Ipv6Addr::new(0x2001, 0xdb8, a, 0, 0, 0, 0, 1);
                IpNet::V6(Ipv6Net::new(addr, p).unwrap().trunc())
            }),
        ]
    }

    fn client() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            (any::<u8>(), any::<u8>()).prop_map(|(b, c)| IpAddr::from([10, b, c, 1])),
            any::<u16>().prop_map(|a| IpAddr::from(Ipv6Addr::new(0x2001, 0xdb8, a, 0, 0, 0, 0, 1))),
            any::<[u8; 4]>()
                .prop_map(|a| IpAddr::from(std::net::Ipv4Addr::from(a).to_ipv6_mapped())),
        ]
    }

    proptest! {
        /// For any ranges and any client, the kernel's longest match equals the access phase's
        /// verdict.
        #[test]
        fn the_lpm_verdict_is_the_access_phase_verdict(
            allow in prop::option::of(prop::collection::vec(net(), 0..5)),
            deny in prop::collection::vec(net(), 0..5),
            clients in prop::collection::vec(client(), 1..16),
        ) {
            let policy = SourcePolicy { allow: allow.map(Into::into), deny: deny.into() };
            let entries = entries(&policy);
            for client in clients {
                prop_assert_eq!(admits(&entries, client), policy.admits(client), "{:?} {}", policy, client);
            }
        }
    }
}
