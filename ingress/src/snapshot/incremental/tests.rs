//! Incremental builds equal builds from nothing, and redo only what changed.

use std::cell::Cell;
use std::sync::LazyLock;

use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::IngressClass;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::snapshot::backend::Target;
use crate::snapshot::testing;
use crate::store::Object;

/// The next build, from what changed since the last.
fn rebuild(
    cache: &mut BuildCache,
    store: &mut Store,
    settings: &BuildSettings,
    generation: u64,
) -> Snapshot {
    let changes = store.take_changes();
    cache.build(store, settings, generation, &changes)
}

/// Everything routing-relevant in a snapshot, as text; `Arc` identities left out.
fn describe(s: &Snapshot) -> String {
    fn route(r: &Route) -> String {
        let target = match &r.backend.target {
            Target::Endpoints(e) => format!(
                "{:?}",
                e.iter().map(|e| e.addr.to_string()).collect::<Vec<_>>()
            ),
            Target::ExternalName(n) => format!("dns {n}"),
            Target::Unavailable => "unavailable".into(),
        };
        format!(
            "{} tls={} {}:{} -> {target} {:?} {:?}",
            r.ingress, r.tls, r.backend.service, r.backend.port, r.policy, r.labels
        )
    }
    fn cert(c: &Certificate) -> String {
        format!("{:?} {:?}", c.source, c.dns_names)
    }
    let mut out = String::new();
    for (pattern, vhost) in s.hosts.iter() {
        out += &format!(
            "host {pattern} ({}) regex={} {:?}\n",
            vhost.pattern, vhost.nginx_regex, vhost.policy
        );
        for rule in vhost.paths.rules() {
            out += &format!(
                "  {} {} {}\n",
                rule.path,
                rule.kind.as_str(),
                route(&rule.target)
            );
        }
        if let Some(d) = &vhost.default_backend {
            out += &format!("  default {}\n", route(d));
        }
    }
    if let Some(d) = &s.default_backend {
        out += &format!("default {}\n", route(d));
    }
    for (pattern, r) in s.passthrough.iter() {
        out += &format!("passthrough {pattern} {}\n", route(r));
    }
    for (pattern, c) in s.tls.hosts.iter() {
        out += &format!("tls {pattern} {}\n", cert(c));
    }
    out += &format!("tls default {:?}\n", s.tls.default.as_deref().map(cert));
    for c in &s.tls.loaded {
        out += &format!("loaded {}\n", cert(c));
    }
    out += &format!("{:?}\n{:?}\n", s.sni, s.ingresses);
    for d in &s.diagnostics {
        out += &format!("{d:?}\n");
    }
    out
}

/// Certificates made once: for a.test and *.w.test; for b.test, valid only until 2030.
static PEMS: LazyLock<[(String, String); 2]> = LazyLock::new(|| {
    let pem = |names: &[&str], until: i32| {
        let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(until, 1, 1);
        (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
    };
    [pem(&["a.test", "*.w.test"], 2099), pem(&["b.test"], 2030)]
});

const HOSTS: [Option<&str>; 6] = [
    Some("a.test"),
    Some("b.test"),
    Some("x.w.test"),
    Some("*.w.test"),
    None,
    Some("www.a.test"),
];

#[derive(Clone, Debug)]
enum Op {
    Ingress {
        i: u8,
        created: u8,
        class: bool,
        rules: Vec<(u8, Vec<(u8, bool, u8, u8)>)>,
        default: Option<u8>,
        tls: Option<(u8, u8)>,
        /// Indexes into [`annotation`], merged.
        annotations: Vec<u8>,
    },
    DeleteIngress(u8),
    Service {
        j: u8,
        port: u8,
        external: bool,
    },
    DeleteService(u8),
    Slice {
        k: u8,
        service: u8,
        port: u8,
        endpoints: Vec<(u8, bool)>,
    },
    DeleteSlice(u8),
    Secret {
        s: u8,
        which: u8,
    },
    DeleteSecret(u8),
    /// An htpasswd Secret `auth-{0}`: valid, or not.
    AuthSecret(u8, bool),
    /// A ConfigMap of headers `hdr-{0}`: one header, or a name no header may have.
    Headers(u8, bool),
    DeleteHeaders(u8),
    /// The whole store read again (a manifests directory), without Ingress `ing-{0}` (0 to 4)
    /// or EndpointSlice `slice-{0 - 5}` (5 to 8) if set.
    Reread(Option<u8>),
    /// The same objects in new `Arc`s, as a relist gives them.
    Relist,
    Class(bool),
    Now(bool),
}

fn op() -> impl Strategy<Value = Op> {
    // Mostly a.test and /, so that Ingresses meet: conflicts, and canaries that find their
    // main route.
    let path = (
        prop_oneof![2 => Just(0u8), 1 => 0u8..3],
        prop::bool::weighted(0.25),
        0u8..4,
        0u8..3,
    );
    let rule = (
        prop_oneof![2 => Just(0u8), 3 => 0u8..6],
        prop::collection::vec(path, 0..3),
    );
    prop_oneof![
        6 => (
            0u8..5,
            0u8..3,
            prop::bool::weighted(0.9),
            prop::collection::vec(rule, 0..3),
            prop::option::of(0u8..4),
            prop::option::of((0u8..3, 0u8..6)),
            // Canaries often, or few would find their main route.
            prop::collection::vec(
                prop_oneof![2 => 5u8..7, 3 => 0u8..ANNOTATIONS],
                0..3
            ),
        )
            .prop_map(|(i, created, class, rules, default, tls, annotations)| Op::Ingress {
                i,
                created,
                class,
                rules,
                default,
                tls,
                annotations,
            }),
        1 => (0u8..5).prop_map(Op::DeleteIngress),
        3 => (0u8..3, 0u8..3, prop::bool::weighted(0.15))
            .prop_map(|(j, port, external)| Op::Service { j, port, external }),
        1 => (0u8..3).prop_map(Op::DeleteService),
        4 => (0u8..4, 0u8..4, 0u8..2, prop::collection::vec((0u8..4, any::<bool>()), 0..3))
            .prop_map(|(k, service, port, endpoints)| Op::Slice {
                k,
                service,
                port,
                endpoints,
            }),
        1 => (0u8..4).prop_map(Op::DeleteSlice),
        1 => (0u8..2, 0u8..3).prop_map(|(s, which)| Op::Secret { s, which }),
        1 => (0u8..2).prop_map(Op::DeleteSecret),
        1 => (0u8..2, any::<bool>()).prop_map(|(s, valid)| Op::AuthSecret(s, valid)),
        1 => (0u8..2, any::<bool>()).prop_map(|(c, valid)| Op::Headers(c, valid)),
        1 => (0u8..2).prop_map(Op::DeleteHeaders),
        1 => Just(Op::Relist),
        1 => prop::option::of(0u8..9).prop_map(Op::Reread),
        1 => any::<bool>().prop_map(Op::Class),
        1 => any::<bool>().prop_map(Op::Now),
    ]
}

const ANNOTATIONS: u8 = 22;

/// The annotations an Ingress of the property test may carry, among them every one whose
/// effect crosses Ingresses: canary, use-regex and rewrite-target (a host's regex mode),
/// server-alias and from-to-www-redirect (names beyond the host), app-root (per host); and
/// every one that reads another object: basic auth's Secret, custom-headers' ConfigMap,
/// default-backend's Service, auth-tls's and proxy-ssl's Secrets.
fn annotation(which: u8) -> Value {
    let n = |k: &str| format!("nginx.ingress.kubernetes.io/{k}");
    match which {
        1 => json!({n("ssl-passthrough"): "true"}),
        2 => json!({n("whitelist-source-range"): "10.0.0.0/8"}),
        3 => json!({n("ssl-redirect"): "false", n("use-regex"): "true"}),
        4 => json!({n("force-ssl-redirect"): "maybe"}),
        5 => json!({n("canary"): "true", n("canary-weight"): "30"}),
        6 => {
            json!({n("canary"): "true", n("canary-by-header"): "x-canary", n("proxy-body-size"): "1k"})
        }
        7 => json!({n("use-regex"): "true"}),
        8 => json!({n("rewrite-target"): "/$1"}),
        9 => json!({n("server-alias"): "b.test, alias.test, *.w.test"}),
        10 => json!({n("server-alias"): "alias.test, www.a.test"}),
        11 => json!({n("from-to-www-redirect"): "true"}),
        12 => json!({n("app-root"): "/app"}),
        13 => json!({n("whitelist-source-range"): "not a range"}),
        14 => json!({n("auth-type"): "basic", n("auth-secret"): "auth-0"}),
        15 => {
            json!({n("auth-type"): "basic", n("auth-secret"): "auth-1", n("auth-secret-type"): "auth-map"})
        }
        16 => json!({n("custom-headers"): "t/hdr-0"}),
        17 => json!({n("default-backend"): "svc-1", n("custom-http-errors"): "503"}),
        18 => json!({n("service-upstream"): "true"}),
        19 => json!({n("auth-tls-secret"): "t/sec-0"}),
        20 => json!({n("proxy-ssl-secret"): "t/sec-1", n("backend-protocol"): "HTTPS"}),
        21 => json!({n("custom-http-errors"): "404,503"}),
        _ => json!({}),
    }
}

fn from<T: serde::de::DeserializeOwned>(value: Value) -> Arc<T> {
    Arc::new(serde_json::from_value(value).expect("a valid object"))
}

fn meta(name: String) -> Value {
    json!({"name": name, "namespace": "t"})
}

fn backend(service: u8, port: u8) -> Value {
    let port = match port {
        0 => json!({"number": 80}),
        1 => json!({"name": "http"}),
        2 => json!({"number": 81}),
        _ => json!({}),
    };
    json!({"service": {"name": format!("svc-{service}"), "port": port}})
}

fn apply(store: &mut Store, settings: &mut BuildSettings, op: Op) {
    match op {
        Op::Ingress {
            i,
            created,
            class,
            rules,
            default,
            tls,
            annotations: chosen,
        } => {
            let rules: Vec<Value> = rules
                .into_iter()
                .map(|(host, paths)| {
                    let paths: Vec<Value> = paths
                        .into_iter()
                        .map(|(path, exact, service, port)| {
                            let text = ["/", "/x", "/(bad"][usize::from(path)];
                            let kind = if path == 2 {
                                "ImplementationSpecific"
                            } else if exact {
                                "Exact"
                            } else {
                                "Prefix"
                            };
                            json!({
                                "path": text,
                                "pathType": kind,
                                "backend": backend(service, port),
                            })
                        })
                        .collect();
                    let mut rule = json!({"http": {"paths": paths}});
                    if let Some(host) = HOSTS[usize::from(host)] {
                        rule["host"] = json!(host);
                    }
                    rule
                })
                .collect();
            let mut annotations = json!({});
            for which in chosen {
                if let (Some(all), Value::Object(more)) =
                    (annotations.as_object_mut(), annotation(which))
                {
                    all.extend(more);
                }
            }
            let mut spec = json!({"rules": rules});
            if class {
                spec["ingressClassName"] = json!("ingress");
            }
            if let Some(service) = default {
                spec["defaultBackend"] = backend(service, 0);
            }
            if let Some((secret, host)) = tls {
                let mut entry = json!({"secretName": format!("sec-{secret}")});
                if let Some(host) = HOSTS[usize::from(host)] {
                    entry["hosts"] = json!([host]);
                }
                spec["tls"] = json!([entry]);
            }
            let mut metadata = meta(format!("ing-{i}"));
            metadata["annotations"] = annotations;
            metadata["creationTimestamp"] = json!(format!("2024-01-0{}T00:00:00Z", created + 1));
            store.apply(Object::Ingress(from::<Ingress>(
                json!({"metadata": metadata, "spec": spec}),
            )));
        }
        Op::DeleteIngress(i) => {
            store.delete(Kind::Ingress, &ObjectKey::new("t", format!("ing-{i}")));
        }
        Op::Service { j, port, external } => {
            let mut spec = json!({"ports": [{"name": "http", "port": 80 + i32::from(port)}]});
            if external {
                spec["type"] = json!("ExternalName");
                spec["externalName"] = json!("backend.example");
            }
            store.apply(Object::Service(from::<Service>(
                json!({"metadata": meta(format!("svc-{j}")), "spec": spec}),
            )));
        }
        Op::DeleteService(j) => {
            store.delete(Kind::Service, &ObjectKey::new("t", format!("svc-{j}")));
        }
        Op::Slice {
            k,
            service,
            port,
            endpoints,
        } => {
            let mut metadata = meta(format!("slice-{k}"));
            if service < 3 {
                metadata["labels"] =
                    json!({"kubernetes.io/service-name": format!("svc-{service}")});
            }
            let endpoints: Vec<Value> = endpoints
                .into_iter()
                .map(|(e, ready)| {
                    // 10.9.9.9 is this node's address: refused.
                    let address = ["10.0.0.1", "10.0.0.2", "10.9.9.9", "fd00::1"][usize::from(e)];
                    json!({"addresses": [address], "conditions": {"ready": ready}})
                })
                .collect();
            let name = if port == 0 { "http" } else { "other" };
            store.apply(Object::EndpointSlice(from::<EndpointSlice>(json!({
                "metadata": metadata,
                "addressType": "IPv4",
                "ports": [{"name": name, "port": 8080}],
                "endpoints": endpoints,
            }))));
        }
        Op::DeleteSlice(k) => {
            store.delete(
                Kind::EndpointSlice,
                &ObjectKey::new("t", format!("slice-{k}")),
            );
        }
        Op::Secret { s, which } => {
            let (crt, key) = match which {
                0 | 1 => PEMS[usize::from(which)].clone(),
                _ => ("garbage".to_string(), "garbage".to_string()),
            };
            let data = json!({
                "tls.crt": k8s_openapi::ByteString(crt.into_bytes()),
                "tls.key": k8s_openapi::ByteString(key.into_bytes()),
            });
            store.apply(Object::Secret(from::<Secret>(json!({
                "metadata": meta(format!("sec-{s}")),
                "type": "kubernetes.io/tls",
                "data": data,
            }))));
        }
        Op::DeleteSecret(s) => {
            store.delete(Kind::Secret, &ObjectKey::new("t", format!("sec-{s}")));
        }
        Op::AuthSecret(s, valid) => {
            // "user:pass" in htpasswd's {SHA} form, or a line no format reads.
            let line = if valid {
                "user:{SHA}nU4eI71bcnBGqeO0t9tXvY1u5oQ="
            } else {
                "user:$9$unknown"
            };
            let data = json!({"auth": k8s_openapi::ByteString(line.as_bytes().to_vec())});
            store.apply(Object::Secret(from::<Secret>(json!({
                "metadata": meta(format!("auth-{s}")),
                "data": data,
            }))));
        }
        Op::Headers(c, valid) => {
            let name = if valid { "x-team" } else { "bad header" };
            store.apply(Object::ConfigMap(from::<ConfigMap>(json!({
                "metadata": meta(format!("hdr-{c}")),
                "data": {name: "blue"},
            }))));
        }
        Op::DeleteHeaders(c) => {
            store.delete(Kind::ConfigMap, &ObjectKey::new("t", format!("hdr-{c}")));
        }
        Op::Reread(without) => {
            let mut again = Store::default();
            let dropped = |kind: Kind, key: &ObjectKey| match (kind, without) {
                (Kind::Ingress, Some(i)) if i < 5 => key.name == format!("ing-{i}"),
                (Kind::EndpointSlice, Some(i)) if i >= 5 => key.name == format!("slice-{}", i - 5),
                _ => false,
            };
            for object in copies(store, |kind, key| !dropped(kind, key)) {
                again.apply(object);
            }
            store.apply_event(crate::store::SourceEvent::Replace(Box::new(again)));
        }
        Op::Relist => {
            let relisted = |kind, _: &ObjectKey| {
                matches!(
                    kind,
                    Kind::Ingress | Kind::Service | Kind::EndpointSlice | Kind::Secret
                )
            };
            for object in copies(store, relisted) {
                store.apply(object);
            }
        }
        Op::Class(present) => {
            let key = ObjectKey::new("", "ingress");
            if present {
                store.apply(Object::IngressClass(from::<IngressClass>(json!({
                    "metadata": {"name": "ingress", "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"}},
                    "spec": {"controller": "ingress.rs/controller"},
                }))));
            } else {
                store.delete(Kind::IngressClass, &key);
            }
        }
        // Past b.test's certificate's expiry, and back.
        Op::Now(late) => settings.tls.now = if late { 1_900_000_000 } else { 1_700_000_000 },
    }
}

/// Random sequences of changes, each batch built both ways. It also counts the incremental
/// builds: a run that only ever compared full builds with full builds would prove nothing.
#[test]
fn incremental_builds_equal_builds_from_scratch() {
    let strategy = prop::collection::vec(prop::collection::vec(op(), 1..4), 1..25);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    });
    let builds = Cell::new(0usize);
    let incremental = Cell::new(0usize);
    let result = runner.run(&strategy, |batches| {
        let mut store = Store::default();
        let mut settings = testing::settings();
        let mut cache = BuildCache::default();
        for (generation, batch) in batches.into_iter().enumerate() {
            for op in batch {
                apply(&mut store, &mut settings, op);
            }
            let changes = store.take_changes();
            let built = cache.build(&store, &settings, generation as u64, &changes);
            builds.set(builds.get() + 1);
            if cache.last_kind() != BuildKind::Full {
                incremental.set(incremental.get() + 1);
            }
            let scratch = Snapshot::build(&store, &settings, generation as u64);
            prop_assert_eq!(describe(&built), describe(&scratch));
        }
        Ok(())
    });
    if let Err(err) = result {
        panic!("{err}");
    }
    let (builds, incremental) = (builds.get(), incremental.get());
    println!("{incremental} of {builds} builds were incremental");
    assert!(
        incremental * 3 >= builds,
        "only {incremental} of {builds} builds were incremental"
    );
}

/// Copies of the store's objects that `keep` accepts: new `Arc`s, equal contents.
fn copies(store: &Store, keep: impl Fn(Kind, &ObjectKey) -> bool) -> Vec<Object> {
    fn each<T: Clone>(
        map: &BTreeMap<ObjectKey, Arc<T>>,
        kind: Kind,
        keep: &impl Fn(Kind, &ObjectKey) -> bool,
        wrap: fn(Arc<T>) -> Object,
    ) -> impl Iterator<Item = Object> {
        map.iter()
            .filter(move |(key, _)| keep(kind, key))
            .map(move |(_, object)| wrap(Arc::new((**object).clone())))
    }
    let mut out: Vec<Object> =
        each(&store.ingresses, Kind::Ingress, &keep, Object::Ingress).collect();
    out.extend(each(
        &store.ingress_classes,
        Kind::IngressClass,
        &keep,
        Object::IngressClass,
    ));
    out.extend(each(&store.services, Kind::Service, &keep, Object::Service));
    out.extend(each(
        &store.endpoint_slices,
        Kind::EndpointSlice,
        &keep,
        Object::EndpointSlice,
    ));
    out.extend(each(&store.secrets, Kind::Secret, &keep, Object::Secret));
    out.extend(each(
        &store.config_maps,
        Kind::ConfigMap,
        &keep,
        Object::ConfigMap,
    ));
    out
}

/// Service svc-0 with one slice of one ready endpoint.
fn svc_0() -> [Op; 2] {
    [
        Op::Service {
            j: 0,
            port: 0,
            external: false,
        },
        Op::Slice {
            k: 0,
            service: 0,
            port: 0,
            endpoints: vec![(0, true)],
        },
    ]
}

/// Ingress ing-`i`: `/` on `HOSTS[host]` to svc-0.
fn on_svc_0(i: u8, host: u8) -> Op {
    Op::Ingress {
        i,
        created: 0,
        class: true,
        rules: vec![(host, vec![(0, false, 0, 0)])],
        default: None,
        tls: None,
        annotations: Vec::new(),
    }
}

/// A change to one Ingress compiles that Ingress alone: the others' routes stay the same
/// `Arc`s, and so does an untouched host.
#[test]
fn unchanged_ingresses_are_not_compiled_again() {
    let mut store = Store::default();
    let mut settings = testing::settings();
    for op in svc_0().into_iter().chain([on_svc_0(0, 0), on_svc_0(1, 1)]) {
        apply(&mut store, &mut settings, op);
    }
    let mut cache = BuildCache::default();
    let first = rebuild(&mut cache, &mut store, &settings, 1);
    apply(
        &mut store,
        &mut settings,
        Op::Ingress {
            i: 1,
            created: 0,
            class: true,
            rules: vec![(1, vec![(1, false, 0, 0)])],
            default: None,
            tls: None,
            annotations: Vec::new(),
        },
    );
    let second = rebuild(&mut cache, &mut store, &settings, 2);
    let a = |s: &Snapshot| s.hosts.lookup("a.test").cloned().expect("a.test");
    let b = |s: &Snapshot| s.hosts.lookup("b.test").cloned().expect("b.test");
    assert!(Arc::ptr_eq(&a(&first), &a(&second)), "a.test untouched");
    assert!(!Arc::ptr_eq(&b(&first), &b(&second)), "b.test rebuilt");
    // A slice change recompiles the Ingresses of its Service: both here.
    apply(
        &mut store,
        &mut settings,
        Op::Slice {
            k: 0,
            service: 0,
            port: 0,
            endpoints: vec![(1, true)],
        },
    );
    let third = rebuild(&mut cache, &mut store, &settings, 3);
    assert!(!Arc::ptr_eq(&a(&second), &a(&third)));
    assert_eq!(
        third
            .route(Some("a.test"), "/")
            .unwrap()
            .backend
            .endpoints()[0]
            .addr
            .to_string(),
        "10.0.0.2:8080"
    );
}

/// A canary is a user of its main route's host: adding, changing or removing it rebuilds
/// that host (and only it), and the main route gets or loses its canary.
#[test]
fn a_canary_change_rebuilds_its_main_host_alone() {
    let mut store = Store::default();
    let mut settings = testing::settings();
    let ingress = |i, service, host, annotations| Op::Ingress {
        i,
        created: i,
        class: true,
        rules: vec![(host, vec![(0, false, service, 0)])],
        default: None,
        tls: None,
        annotations,
    };
    for op in [ingress(0, 0, 0, vec![]), ingress(1, 0, 1, vec![])] {
        apply(&mut store, &mut settings, op);
    }
    let canary = |s: &Snapshot| {
        s.route(Some("a.test"), "/")
            .and_then(|r| r.policy.canary.as_ref())
            .map(|c| c.ingress.name.clone())
    };
    let host = |s: &Snapshot, name: &str| s.hosts.lookup(name).cloned().expect("host");
    let mut cache = BuildCache::default();
    let first = rebuild(&mut cache, &mut store, &settings, 1);
    assert_eq!(canary(&first), None);
    apply(&mut store, &mut settings, ingress(2, 1, 0, vec![5]));
    let second = rebuild(&mut cache, &mut store, &settings, 2);
    assert_eq!(canary(&second).as_deref(), Some("ing-2"));
    assert!(!Arc::ptr_eq(
        &host(&first, "a.test"),
        &host(&second, "a.test")
    ));
    assert!(Arc::ptr_eq(
        &host(&first, "b.test"),
        &host(&second, "b.test")
    ));
    store.delete(Kind::Ingress, &ObjectKey::new("t", "ing-2"));
    let third = rebuild(&mut cache, &mut store, &settings, 3);
    assert_eq!(canary(&third), None);
    assert!(Arc::ptr_eq(
        &host(&first, "b.test"),
        &host(&third, "b.test")
    ));
}

/// A manifests directory read again costs what it changed: nothing, when nothing did; and a
/// slice it no longer has takes its endpoints away from the routes of its Service.
#[test]
fn a_reread_rebuilds_what_it_changed() {
    let mut store = Store::default();
    let mut settings = testing::settings();
    for op in svc_0().into_iter().chain([on_svc_0(0, 0), Op::Class(true)]) {
        apply(&mut store, &mut settings, op);
    }
    let mut cache = BuildCache::default();
    let first = rebuild(&mut cache, &mut store, &settings, 1);
    let endpoints = |s: &Snapshot| {
        s.route(Some("a.test"), "/")
            .map(|r| r.backend.endpoints().len())
    };
    assert_eq!(endpoints(&first), Some(1));
    apply(&mut store, &mut settings, Op::Reread(None));
    let second = rebuild(&mut cache, &mut store, &settings, 2);
    assert_eq!(cache.last_kind(), BuildKind::Incremental { ingresses: 0 });
    assert_eq!(describe(&second), describe(&first));
    apply(&mut store, &mut settings, Op::Reread(Some(5)));
    let third = rebuild(&mut cache, &mut store, &settings, 3);
    assert_eq!(cache.last_kind(), BuildKind::Incremental { ingresses: 1 });
    assert_eq!(endpoints(&third), Some(0));
    assert_eq!(
        describe(&third),
        describe(&Snapshot::build(&store, &settings, 3))
    );
}
