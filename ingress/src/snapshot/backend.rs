//! Backends: an Ingress's `service.name` + `port` resolved to the ready endpoints of the
//! Service's EndpointSlices (never the ClusterIP), or to a DNS name for ExternalName Services.
//!
//! Endpoint addresses are judged by the [`AddressPolicy`] here, so a refused address never
//! reaches the proxy; ExternalName Services are refused unless allowed, and their names are
//! judged again when the proxy resolves them (`proxy::pool::open`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::address::AddressPolicy;
use crate::diagnostics::DiagnosticKind;
use crate::store::{ObjectKey, Store};

/// The label the EndpointSlice controller puts on every slice of a Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// A Service port as an Ingress names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PortRef {
    Number(i32),
    Name(String),
}

impl fmt::Display for PortRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PortRef::Number(n) => write!(f, "{n}"),
            PortRef::Name(n) => f.write_str(n),
        }
    }
}

/// One upstream address with its live load, which power-of-two-choices balancing reads.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    in_flight: AtomicU32,
}

impl Endpoint {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            in_flight: AtomicU32::new(0),
        }
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Counts a request against this endpoint until the guard drops.
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone())
    }
}

pub struct InFlight(Arc<Endpoint>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What backends may be: from flags, the same for every Service.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BackendPolicy {
    /// `--allow-external-name-services`: an ExternalName Service lets an Ingress send traffic
    /// to any name, so it is opt-in.
    pub allow_external_name: bool,
    /// Which endpoint addresses are refused.
    pub addresses: AddressPolicy,
}

/// An ExternalName Service's target: resolved through DNS on each new connection, when every
/// address it resolves to is judged by `addresses` (a name can resolve differently each time).
/// Compared and hashed by host and port: the policy is the same for every target.
#[derive(Clone, Debug)]
pub struct ExternalName {
    pub host: String,
    pub port: u16,
    pub addresses: AddressPolicy,
}

impl PartialEq for ExternalName {
    fn eq(&self, other: &Self) -> bool {
        (&self.host, self.port) == (&other.host, other.port)
    }
}

impl Eq for ExternalName {}

impl std::hash::Hash for ExternalName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.host.hash(state);
        self.port.hash(state);
    }
}

impl fmt::Display for ExternalName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Where a backend's traffic goes.
#[derive(Debug)]
pub enum Target {
    Endpoints(Vec<Arc<Endpoint>>),
    /// Resolved through DNS when a connection is made.
    ExternalName(Arc<ExternalName>),
    /// The Service or its port does not exist (or, for a refused Ingress, was not looked
    /// up); requests get 503.
    Unavailable,
}

#[derive(Debug)]
pub struct Backend {
    pub service: ObjectKey,
    pub port: PortRef,
    pub target: Target,
}

impl Backend {
    /// The endpoints, or nothing if there are none to pick from.
    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        match &self.target {
            Target::Endpoints(e) => e,
            _ => &[],
        }
    }

    /// Picks the less loaded of two random endpoints: nearly as good as least-loaded, without
    /// scanning, and without the herd effect of always picking the single minimum.
    pub fn pick(&self) -> Option<&Arc<Endpoint>> {
        let endpoints = self.endpoints();
        match endpoints.len() {
            0 => None,
            1 => endpoints.first(),
            n => {
                let a = fastrand::usize(..n);
                let mut b = fastrand::usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                let (ea, eb) = (&endpoints[a], &endpoints[b]);
                Some(if eb.in_flight() < ea.in_flight() {
                    eb
                } else {
                    ea
                })
            }
        }
    }
}

/// Why a backend could not be resolved, as the diagnostic to raise.
#[derive(Debug, PartialEq, Eq)]
pub struct Problem {
    pub kind: DiagnosticKind,
    pub message: String,
}

/// Resolves backends against one store, sharing each (Service, port) between the routes that
/// name it so endpoint load is counted once.
pub struct Resolver<'a> {
    store: &'a Store,
    policy: &'a BackendPolicy,
    state: ResolverState,
}

/// What a resolver keeps from one build to the next: which slices belong to which Service, and
/// the backend of each (Service, port) resolved so far. An entry stays valid as long as its
/// Service and that Service's slices are unchanged ([`ResolverState::forget`] drops the others).
#[derive(Debug, Default)]
pub struct ResolverState {
    slices: HashMap<ObjectKey, BTreeSet<ObjectKey>>,
    resolved: HashMap<(ObjectKey, PortRef), (Arc<Backend>, Vec<Problem>)>,
}

impl ResolverState {
    /// The slice index of a whole store, nothing resolved yet.
    pub fn index(store: &Store) -> Self {
        let mut state = Self::default();
        for (key, slice) in &store.endpoint_slices {
            state.slice_changed(key, None, Some(slice));
        }
        state
    }

    /// Moves slice `key` in the index from the Service `old` named to the one `new` names.
    pub fn slice_changed(
        &mut self,
        key: &ObjectKey,
        old: Option<&EndpointSlice>,
        new: Option<&EndpointSlice>,
    ) {
        if let Some(service) = old.and_then(|s| service_of(key, s))
            && let Some(keys) = self.slices.get_mut(&service)
        {
            keys.remove(key);
            if keys.is_empty() {
                self.slices.remove(&service);
            }
        }
        if let Some(service) = new.and_then(|s| service_of(key, s)) {
            self.slices.entry(service).or_default().insert(key.clone());
        }
    }

    /// Drops what was resolved for these Services (they or their slices changed).
    pub fn forget(&mut self, services: &HashSet<ObjectKey>) {
        if !services.is_empty() {
            self.resolved
                .retain(|(service, _), _| !services.contains(service));
        }
    }
}

/// The Service an EndpointSlice (stored under `key`) belongs to, by its label.
pub fn service_of(key: &ObjectKey, slice: &EndpointSlice) -> Option<ObjectKey> {
    let name = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(ObjectKey::new(key.namespace.clone(), name.clone()))
}

impl<'a> Resolver<'a> {
    pub fn new(store: &'a Store, policy: &'a BackendPolicy) -> Self {
        Self::resume(store, policy, ResolverState::index(store))
    }

    /// A resolver over `store` that starts from `state`, which must describe the same store.
    pub fn resume(store: &'a Store, policy: &'a BackendPolicy, state: ResolverState) -> Self {
        Self {
            store,
            policy,
            state,
        }
    }

    pub fn into_state(self) -> ResolverState {
        self.state
    }

    /// The backend for `service`:`port`, and the problems with it. Callers attach the problems
    /// to their own Ingress.
    pub fn resolve(&mut self, service: ObjectKey, port: PortRef) -> (Arc<Backend>, &[Problem]) {
        let Self {
            store,
            policy,
            state,
        } = self;
        let ResolverState { slices, resolved } = state;
        let (backend, problems) =
            resolved
                .entry((service, port))
                .or_insert_with_key(|(service, port)| {
                    let service_slices = slices
                        .get(service)
                        .into_iter()
                        .flatten()
                        .filter_map(|k| store.endpoint_slices.get(k))
                        .map(AsRef::as_ref);
                    let (target, problems) =
                        resolve_target(store, policy, service_slices, service, port);
                    let backend = Backend {
                        service: service.clone(),
                        port: port.clone(),
                        target,
                    };
                    (Arc::new(backend), problems)
                });
        (backend.clone(), problems)
    }
}

fn resolve_target<'s>(
    store: &Store,
    policy: &BackendPolicy,
    slices: impl Iterator<Item = &'s EndpointSlice>,
    service_key: &ObjectKey,
    port: &PortRef,
) -> (Target, Vec<Problem>) {
    let unavailable = |kind, message| (Target::Unavailable, vec![Problem { kind, message }]);
    let Some(service) = store.services.get(service_key) else {
        return unavailable(
            DiagnosticKind::ServiceNotFound,
            format!("service {service_key} not found"),
        );
    };
    let spec = service.spec.as_ref();
    let service_port = find_port(service, port);
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        if !policy.allow_external_name {
            return unavailable(
                DiagnosticKind::ExternalNameDisabled,
                format!(
                    "service {service_key} is an ExternalName Service, which could send traffic anywhere (this node's loopback, a metadata service); they are off unless --allow-external-name-services is set"
                ),
            );
        }
        let external = spec
            .and_then(|s| s.external_name.clone())
            .unwrap_or_default();
        let number = match (service_port, port) {
            (Some(p), _) => Some(p.port),
            (None, PortRef::Number(n)) => Some(*n),
            (None, PortRef::Name(_)) => None,
        };
        if external.is_empty() {
            return unavailable(
                DiagnosticKind::UnsupportedBackend,
                format!("service {service_key} is ExternalName without externalName"),
            );
        }
        let Some(port) = number.and_then(|n| u16::try_from(n).ok()) else {
            return (Target::Unavailable, vec![port_problem(service_key, port)]);
        };
        // Names the resolver answers locally are judged now; every other name is judged
        // each time it is resolved.
        if let Some(refusal) = local_name(&external).and_then(|ip| policy.addresses.check(ip).err())
        {
            return unavailable(
                DiagnosticKind::BackendAddressRefused,
                format!(
                    "service {service_key} is ExternalName {external}, {refusal}; local backends are refused (--allow-local-backends)"
                ),
            );
        }
        let target = ExternalName {
            host: external,
            port,
            addresses: policy.addresses.clone(),
        };
        return (Target::ExternalName(Arc::new(target)), Vec::new());
    }
    let Some(service_port) = service_port else {
        return (Target::Unavailable, vec![port_problem(service_key, port)]);
    };
    let (endpoints, refused) = ready_endpoints(slices, &policy.addresses, service_port);
    let mut problems = Vec::new();
    if !refused.is_empty() {
        let listed: Vec<String> = refused
            .iter()
            .map(|(addr, why)| format!("{addr} ({why})"))
            .collect();
        problems.push(Problem {
            kind: DiagnosticKind::BackendAddressRefused,
            message: format!(
                "service {service_key} port {port}: endpoints refused as backends, left out: {}; local backends are refused (--allow-local-backends)",
                listed.join(", ")
            ),
        });
    }
    if endpoints.is_empty() {
        problems.push(Problem {
            kind: DiagnosticKind::NoReadyEndpoints,
            message: format!("service {service_key} port {port} has no ready endpoints"),
        });
    }
    (Target::Endpoints(endpoints), problems)
}

/// The address an ExternalName stands for without asking DNS: an IP literal, or a name the
/// resolver answers from this host (`localhost` and its subdomains, RFC 6761).
fn local_name(name: &str) -> Option<std::net::IpAddr> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    if let Ok(ip) = name.parse() {
        return Some(ip);
    }
    (name == "localhost" || name.ends_with(".localhost"))
        .then_some(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST))
}

/// Ready endpoints of every slice of the Service, matched to the Service port by name, as the
/// EndpointSlice controller names them, and the ready addresses the policy refused. Deduplicated:
/// an address can be in two slices while the controller moves it.
fn ready_endpoints<'s>(
    slices: impl Iterator<Item = &'s EndpointSlice>,
    policy: &AddressPolicy,
    port: &ServicePort,
) -> (
    Vec<Arc<Endpoint>>,
    Vec<(SocketAddr, super::address::Refusal)>,
) {
    let port_name = port.name.as_deref().unwrap_or("");
    let mut addrs: Vec<SocketAddr> = Vec::new();
    let mut refused = Vec::new();
    for slice in slices {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let number = slice.ports.iter().flatten().find_map(|p| {
            (p.name.as_deref().unwrap_or("") == port_name)
                .then_some(p.port)
                .flatten()
        });
        let Some(number) = number.and_then(|n| u16::try_from(n).ok()) else {
            continue;
        };
        for endpoint in slice.endpoints.iter().flatten() {
            // The API says an unknown readiness should be read as ready.
            let ready = endpoint
                .conditions
                .as_ref()
                .and_then(|c| c.ready)
                .unwrap_or(true);
            // Addresses of one endpoint are fungible; the first is enough.
            let ip = endpoint
                .addresses
                .first()
                .and_then(|a| a.parse::<IpAddr>().ok());
            if let (true, Some(ip)) = (ready, ip) {
                let addr = SocketAddr::new(ip, number);
                match policy.check(ip) {
                    Ok(()) => addrs.push(addr),
                    Err(why) => refused.push((addr, why)),
                }
            }
        }
    }
    addrs.sort();
    addrs.dedup();
    refused.sort();
    refused.dedup();
    let endpoints = addrs
        .into_iter()
        .map(|a| Arc::new(Endpoint::new(a)))
        .collect();
    (endpoints, refused)
}

fn find_port<'s>(service: &'s Service, port: &PortRef) -> Option<&'s ServicePort> {
    let ports = service.spec.as_ref()?.ports.as_ref()?;
    ports.iter().find(|p| match port {
        PortRef::Number(n) => p.port == *n,
        PortRef::Name(name) => p.name.as_deref() == Some(name.as_str()),
    })
}

fn port_problem(service: &ObjectKey, port: &PortRef) -> Problem {
    Problem {
        kind: DiagnosticKind::ServicePortNotFound,
        message: format!("service {service} has no port {port}"),
    }
}

#[cfg(test)]
mod tests {
    //! The resolver on its own, table-driven: a Service reference and a store in, the target
    //! and the problems out.

    use std::path::Path;

    use super::*;
    use crate::snapshot::testing::{self, HOST_ADDRESS};
    use crate::source::manifests;

    fn store_of(yaml: &str) -> Store {
        let parsed = manifests::parse_file(Path::new("test.yaml"), yaml);
        assert!(parsed.diagnostics.is_empty(), "{:?}", parsed.diagnostics);
        let mut store = Store::default();
        for object in parsed.objects {
            store.apply(object);
        }
        store
    }

    /// The target as a string ("10.0.0.1:8080 10.0.0.3:8080", "dns backend.example:443",
    /// "unavailable", "none" for no endpoints) and the problems' kinds.
    fn resolve(
        yaml: &str,
        policy: &BackendPolicy,
        service: &str,
        port: PortRef,
    ) -> (String, Vec<DiagnosticKind>) {
        let store = store_of(yaml);
        let mut resolver = Resolver::new(&store, policy);
        let (backend, problems) = resolver.resolve(ObjectKey::new("shop", service), port.clone());
        assert_eq!(backend.service, ObjectKey::new("shop", service));
        assert_eq!(backend.port, port);
        let target = match &backend.target {
            Target::Endpoints(e) if e.is_empty() => "none".to_string(),
            Target::Endpoints(e) => e
                .iter()
                .map(|e| e.addr.to_string())
                .collect::<Vec<_>>()
                .join(" "),
            Target::ExternalName(name) => format!("dns {name}"),
            Target::Unavailable => "unavailable".into(),
        };
        (target, problems.iter().map(|p| p.kind).collect())
    }

    fn kube() -> BackendPolicy {
        testing::settings().backends
    }

    fn external_allowed() -> BackendPolicy {
        BackendPolicy {
            allow_external_name: true,
            ..kube()
        }
    }

    fn local_allowed() -> BackendPolicy {
        let mut policy = kube();
        policy.addresses.allow_local = true;
        policy
    }

    const WEB: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec: {ports: [{name: http, port: 80}, {name: admin, port: 9000}, {name: huge, port: 7000}]}
---
apiVersion: v1
kind: Service
metadata: {name: plain, namespace: shop}
spec: {ports: [{port: 8080}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-a, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}, {name: admin, port: 9090}, {name: huge, port: 70000}]
endpoints:
- addresses: [10.0.0.1]
  conditions: {ready: true}
- addresses: [10.0.0.2]
  conditions: {ready: false}
- addresses: [10.0.0.3]
- addresses: [10.0.0.4]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: [10.0.0.5, 10.0.0.6]
  conditions: {ready: true, serving: true, terminating: false}
- addresses: [not-an-ip]
- addresses: []
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-b, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv6
ports: [{name: http, port: 8080}]
endpoints:
- addresses: ["fd00::1"]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-dup, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.0.1]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-fqdn, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [web.example.com]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-other-port, namespace: shop, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: metrics, port: 9100}]
endpoints:
- addresses: [10.0.0.9]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: unlabelled, namespace: shop}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.0.10]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-elsewhere, namespace: other, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints:
- addresses: [10.0.0.11]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: plain-a, namespace: shop, labels: {kubernetes.io/service-name: plain}}
addressType: IPv4
ports: [{port: 3000}]
endpoints:
- addresses: [10.1.0.1]
- addresses: [127.0.0.1]
- addresses: [10.9.9.9]
- addresses: [169.254.169.254]
  conditions: {ready: false}
"#;

    #[test]
    fn endpoints_by_port_and_readiness() {
        use DiagnosticKind::*;
        let name = |n: &str| PortRef::Name(n.into());
        let cases: Vec<(
            &str,
            BackendPolicy,
            &str,
            PortRef,
            &str,
            Vec<DiagnosticKind>,
        )> = vec![
            (
                // Ready, unknown readiness (read as ready), the first address of an endpoint,
                // IPv6, deduplicated across slices; not ready (terminating or not) left out,
                // FQDN slices, other ports, unlabelled slices and other namespaces ignored.
                "by number, matched to the slice by the port's name",
                kube(),
                "web",
                PortRef::Number(80),
                "10.0.0.1:8080 10.0.0.3:8080 10.0.0.5:8080 [fd00::1]:8080",
                vec![],
            ),
            (
                "by name",
                kube(),
                "web",
                name("http"),
                "10.0.0.1:8080 10.0.0.3:8080 10.0.0.5:8080 [fd00::1]:8080",
                vec![],
            ),
            (
                "a second port, only in one slice",
                kube(),
                "web",
                name("admin"),
                "10.0.0.1:9090 10.0.0.3:9090 10.0.0.5:9090",
                vec![],
            ),
            (
                "a slice port that is not a port number leaves its slice out",
                kube(),
                "web",
                PortRef::Number(7000),
                "none",
                vec![NoReadyEndpoints],
            ),
            (
                "no such port number",
                kube(),
                "web",
                PortRef::Number(81),
                "unavailable",
                vec![ServicePortNotFound],
            ),
            (
                "no such port name",
                kube(),
                "web",
                name("https"),
                "unavailable",
                vec![ServicePortNotFound],
            ),
            (
                "names are not numbers",
                kube(),
                "web",
                name("80"),
                "unavailable",
                vec![ServicePortNotFound],
            ),
            (
                "no such Service",
                kube(),
                "gone",
                PortRef::Number(80),
                "unavailable",
                vec![ServiceNotFound],
            ),
            (
                // The unnamed Service port matches the unnamed slice port; loopback and this
                // node's address are refused, with a diagnostic; a refused address that is not
                // ready is not mentioned.
                "local addresses refused",
                kube(),
                "plain",
                PortRef::Number(8080),
                "10.1.0.1:3000",
                vec![BackendAddressRefused],
            ),
            (
                "local addresses allowed",
                local_allowed(),
                "plain",
                PortRef::Number(8080),
                "10.1.0.1:3000 10.9.9.9:3000 127.0.0.1:3000",
                vec![],
            ),
        ];
        for (what, policy, service, port, want, want_problems) in cases {
            let (target, problems) = resolve(WEB, &policy, service, port);
            assert_eq!(target, want, "{what}");
            assert_eq!(problems, want_problems, "{what}");
        }
    }

    #[test]
    fn every_endpoint_refused_is_also_no_ready_endpoints() {
        let yaml = r#"
apiVersion: v1
kind: Service
metadata: {name: local, namespace: shop}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: local-a, namespace: shop, labels: {kubernetes.io/service-name: local}}
addressType: IPv4
ports: [{port: 80}]
endpoints:
- addresses: [127.0.0.1]
- addresses: [0.0.0.0]
"#;
        let (target, problems) = resolve(yaml, &kube(), "local", PortRef::Number(80));
        assert_eq!(target, "none");
        assert_eq!(
            problems,
            [
                DiagnosticKind::BackendAddressRefused,
                DiagnosticKind::NoReadyEndpoints
            ]
        );
        let store = store_of(yaml);
        let policy = kube();
        let mut resolver = Resolver::new(&store, &policy);
        let (_, problems) = resolver.resolve(ObjectKey::new("shop", "local"), PortRef::Number(80));
        assert!(
            problems[0]
                .message
                .contains("0.0.0.0:80 (an unspecified address), 127.0.0.1:80 (a loopback address)"),
            "{}",
            problems[0].message
        );
    }

    #[test]
    fn external_name_services() {
        use DiagnosticKind::*;
        let service = |external: &str, ports: &str| {
            format!(
                "apiVersion: v1\nkind: Service\nmetadata: {{name: ext, namespace: shop}}\nspec: {{type: ExternalName, externalName: {external:?}, ports: {ports}}}\n"
            )
        };
        let cases: Vec<(
            &str,
            String,
            BackendPolicy,
            PortRef,
            &str,
            Vec<DiagnosticKind>,
        )> = vec![
            (
                "off unless allowed",
                service("backend.example", "[]"),
                kube(),
                PortRef::Number(443),
                "unavailable",
                vec![ExternalNameDisabled],
            ),
            (
                "a port number the Service does not list is used as it is",
                service("backend.example", "[]"),
                external_allowed(),
                PortRef::Number(443),
                "dns backend.example:443",
                vec![],
            ),
            (
                "a named port is looked up",
                service("backend.example", "[{name: https, port: 8443}]"),
                external_allowed(),
                PortRef::Name("https".into()),
                "dns backend.example:8443",
                vec![],
            ),
            (
                "a named port the Service does not list",
                service("backend.example", "[]"),
                external_allowed(),
                PortRef::Name("https".into()),
                "unavailable",
                vec![ServicePortNotFound],
            ),
            (
                "a port number out of range",
                service("backend.example", "[]"),
                external_allowed(),
                PortRef::Number(70000),
                "unavailable",
                vec![ServicePortNotFound],
            ),
            (
                "no externalName",
                service("", "[]"),
                external_allowed(),
                PortRef::Number(80),
                "unavailable",
                vec![UnsupportedBackend],
            ),
            (
                "localhost is refused at build time",
                service("LocalHost.", "[]"),
                external_allowed(),
                PortRef::Number(80),
                "unavailable",
                vec![BackendAddressRefused],
            ),
            (
                "so are its subdomains",
                service("db.localhost", "[]"),
                external_allowed(),
                PortRef::Number(80),
                "unavailable",
                vec![BackendAddressRefused],
            ),
            (
                "and this node's address as a literal",
                service(HOST_ADDRESS, "[]"),
                external_allowed(),
                PortRef::Number(80),
                "unavailable",
                vec![BackendAddressRefused],
            ),
            (
                "a local literal, allowed",
                service("127.0.0.1", "[]"),
                BackendPolicy {
                    allow_external_name: true,
                    ..local_allowed()
                },
                PortRef::Number(80),
                "dns 127.0.0.1:80",
                vec![],
            ),
            (
                "a name that only DNS can judge is judged when resolved",
                service("localhost.example", "[]"),
                external_allowed(),
                PortRef::Number(80),
                "dns localhost.example:80",
                vec![],
            ),
        ];
        for (what, yaml, policy, port, want, want_problems) in cases {
            let (target, problems) = resolve(&yaml, &policy, "ext", port);
            assert_eq!(target, want, "{what}");
            assert_eq!(problems, want_problems, "{what}");
        }
    }

    #[test]
    fn routes_naming_the_same_service_port_share_one_backend() {
        let store = store_of(WEB);
        let policy = kube();
        let mut resolver = Resolver::new(&store, &policy);
        let web = ObjectKey::new("shop", "web");
        let (a, _) = resolver.resolve(web.clone(), PortRef::Number(80));
        let (b, _) = resolver.resolve(web.clone(), PortRef::Number(80));
        let (c, _) = resolver.resolve(web, PortRef::Name("http".into()));
        assert!(
            Arc::ptr_eq(&a, &b),
            "shared, so endpoint load is counted once"
        );
        // A port named differently is a different reference, resolved on its own.
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn pick_prefers_the_less_loaded_endpoint() {
        let endpoints: Vec<Arc<Endpoint>> = ["10.0.0.1:80", "10.0.0.2:80"]
            .iter()
            .map(|a| Arc::new(Endpoint::new(a.parse().unwrap())))
            .collect();
        let backend = Backend {
            service: ObjectKey::new("shop", "web"),
            port: PortRef::Number(80),
            target: Target::Endpoints(endpoints.clone()),
        };
        let _busy = endpoints[0].start();
        for _ in 0..50 {
            assert_eq!(backend.pick().unwrap().addr, endpoints[1].addr);
        }
        let empty = Backend {
            target: Target::Unavailable,
            ..backend
        };
        assert!(empty.pick().is_none());
    }
}
