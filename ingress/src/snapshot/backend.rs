//! Backends: an Ingress's `service.name` + `port` resolved to the ready endpoints of the
//! Service's EndpointSlices (never the ClusterIP), or to a DNS name for ExternalName Services.
//!
//! Endpoint addresses are judged by the [`AddressPolicy`] here, so a refused address never
//! reaches the proxy; ExternalName Services are refused unless allowed, and their names are
//! judged again when the proxy resolves them (`proxy::pool::open`).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use k8s_openapi::api::core::v1::{Service, ServicePort};

use super::address::AddressPolicy;
use super::upstream::{BackendProtocol, Balance};
use crate::diagnostics::DiagnosticKind;
use crate::store::{Kind, ObjectKey, Store};

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

/// One upstream address with its live load, which the balancers read: requests in flight, and
/// (for `ewma`) an average time to the response head.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// `addr` as `Display` writes it, once: session affinity hashes it for every endpoint of
    /// every new session.
    addr_text: Box<str>,
    in_flight: AtomicU32,
    /// Exponentially weighted average time to the response head, in microseconds; 0 before
    /// the first sample.
    ewma_us: AtomicU64,
}

impl Endpoint {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            addr_text: addr.to_string().into_boxed_str(),
            in_flight: AtomicU32::new(0),
            ewma_us: AtomicU64::new(0),
        }
    }

    pub fn addr_text(&self) -> &str {
        &self.addr_text
    }

    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn ewma_us(&self) -> u64 {
        self.ewma_us.load(Ordering::Relaxed)
    }

    /// Counts a request against this endpoint until the guard drops; with `timed`, the time
    /// until then is a sample of the endpoint's response time.
    pub fn start(self: &Arc<Self>, timed: bool) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self.clone(), timed.then(Instant::now))
    }

    /// Folds one response time into the average, weighting it 1/8 (racing updates may lose
    /// a sample, which an average can afford).
    fn sample(&self, us: u64) {
        let old = self.ewma_us.load(Ordering::Relaxed);
        let new = if old == 0 {
            us.max(1)
        } else {
            (old.saturating_mul(7).saturating_add(us) / 8).max(1)
        };
        self.ewma_us.store(new, Ordering::Relaxed);
    }

    /// The `ewma` score: lower is better; an endpoint never measured scores best.
    fn ewma_score(&self) -> u64 {
        self.ewma_us()
            .saturating_mul(u64::from(self.in_flight()) + 1)
    }
}

/// Holds a request's place on an endpoint until its response head (or its failure).
pub struct InFlight(Arc<Endpoint>, Option<Instant>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Some(started) = self.1 {
            let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            self.0.sample(us);
        }
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
    /// The `round_robin` cursor.
    pub next: AtomicUsize,
    /// The Service port's `appProtocol`, when it names a way to speak HTTP.
    pub app_protocol: Option<BackendProtocol>,
}

impl Backend {
    /// The endpoints, or nothing if there are none to pick from.
    pub fn endpoints(&self) -> &[Arc<Endpoint>] {
        match &self.target {
            Target::Endpoints(e) => e,
            _ => &[],
        }
    }

    /// Picks an endpoint by `balance`. The default takes the less loaded of two random
    /// endpoints: nearly as good as least-loaded, without scanning, and without the herd
    /// effect of always picking the single minimum. `ewma` does the same with response time
    /// times load; `round_robin` takes each in turn.
    pub fn pick(&self, balance: Balance) -> Option<&Arc<Endpoint>> {
        let endpoints = self.endpoints();
        match endpoints.len() {
            0 => None,
            1 => endpoints.first(),
            n if balance == Balance::RoundRobin => {
                endpoints.get(self.next.fetch_add(1, Ordering::Relaxed) % n)
            }
            n => {
                let a = fastrand::usize(..n);
                let mut b = fastrand::usize(..n - 1);
                if b >= a {
                    b += 1;
                }
                let (ea, eb) = (&endpoints[a], &endpoints[b]);
                let b_better = match balance {
                    Balance::Ewma => eb.ewma_score() < ea.ewma_score(),
                    _ => eb.in_flight() < ea.in_flight(),
                };
                Some(if b_better { eb } else { ea })
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
    cache: Resolved,
}

/// The backends a resolver made, by (Service, port, `service-upstream`), with their problems:
/// kept between builds for the Services that did not change, so that routes built at different
/// times still share one backend (and its endpoints' load).
pub type Resolved = HashMap<(ObjectKey, PortRef, bool), (Arc<Backend>, Vec<Problem>)>;

impl<'a> Resolver<'a> {
    pub fn new(store: &'a Store, policy: &'a BackendPolicy) -> Self {
        Self::with(store, policy, Resolved::new())
    }

    /// A resolver that starts from what an earlier one resolved; the caller has removed every
    /// entry of a Service that changed since.
    pub fn with(store: &'a Store, policy: &'a BackendPolicy, cache: Resolved) -> Self {
        Self {
            store,
            policy,
            cache,
        }
    }

    /// What it resolved, for the next build.
    pub fn into_resolved(self) -> Resolved {
        self.cache
    }

    /// The first port of `service` (ingress-nginx's choice for a `default-backend`
    /// annotation), if the Service exists and has one.
    pub fn first_port(&self, service: &ObjectKey) -> Option<PortRef> {
        let ports = self.store.service(service)?.spec.as_ref()?.ports.as_ref()?;
        ports.first().map(|p| PortRef::Number(p.port))
    }

    /// The backend for `service`:`port` (its endpoints, or with `cluster_ip` the Service's own
    /// ClusterIP and port, `service-upstream`), and the problems with it. Callers attach the
    /// problems to their own Ingress.
    pub fn resolve(
        &mut self,
        service: ObjectKey,
        port: PortRef,
        cluster_ip: bool,
    ) -> (Arc<Backend>, &[Problem]) {
        let Self {
            store,
            policy,
            cache,
        } = self;
        // A backend found in the cache was read from the Service all the same.
        store.note_read(Kind::Service, &service);
        let (backend, problems) = cache.entry((service, port, cluster_ip)).or_insert_with_key(
            |(service, port, cluster_ip)| {
                let (target, problems) = match cluster_ip {
                    true => resolve_cluster_ip(store, policy, service, port)
                        .unwrap_or_else(|| resolve_target(store, policy, service, port)),
                    false => resolve_target(store, policy, service, port),
                };
                let app_protocol = store
                    .service(service)
                    .and_then(|s| find_port(s, port))
                    .and_then(|p| p.app_protocol.as_deref())
                    .and_then(BackendProtocol::from_app_protocol);
                let backend = Backend {
                    service: service.clone(),
                    port: port.clone(),
                    target,
                    next: AtomicUsize::new(0),
                    app_protocol,
                };
                (Arc::new(backend), problems)
            },
        );
        (backend.clone(), problems)
    }
}

fn resolve_target(
    store: &Store,
    policy: &BackendPolicy,
    service_key: &ObjectKey,
    port: &PortRef,
) -> (Target, Vec<Problem>) {
    let unavailable = |kind, message| (Target::Unavailable, vec![Problem { kind, message }]);
    let Some(service) = store.service(service_key) else {
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
    let (endpoints, refused) = ready_endpoints(store, &policy.addresses, service_key, service_port);
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

/// `service-upstream`: the Service's ClusterIP and port as the one endpoint, so kube-proxy (or
/// whatever implements Services) balances. `None` for a Service without a usable ClusterIP
/// (headless, ExternalName, missing), which falls back to its endpoints as ingress-nginx does.
fn resolve_cluster_ip(
    store: &Store,
    policy: &BackendPolicy,
    service_key: &ObjectKey,
    port: &PortRef,
) -> Option<(Target, Vec<Problem>)> {
    let service = store.service(service_key)?;
    let spec = service.spec.as_ref()?;
    if spec.type_.as_deref() == Some("ExternalName") {
        return None;
    }
    let ip: IpAddr = spec.cluster_ip.as_deref()?.parse().ok()?;
    let number = u16::try_from(find_port(service, port)?.port).ok()?;
    let addr = SocketAddr::new(ip, number);
    if let Err(why) = policy.addresses.check(ip) {
        let problem = Problem {
            kind: DiagnosticKind::BackendAddressRefused,
            message: format!(
                "service {service_key} port {port}: ClusterIP {addr} ({why}) refused as a backend (service-upstream); local backends are refused (--allow-local-backends)"
            ),
        };
        return Some((Target::Endpoints(Vec::new()), vec![problem]));
    }
    Some((
        Target::Endpoints(vec![Arc::new(Endpoint::new(addr))]),
        Vec::new(),
    ))
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
fn ready_endpoints(
    store: &Store,
    policy: &AddressPolicy,
    service: &ObjectKey,
    port: &ServicePort,
) -> (
    Vec<Arc<Endpoint>>,
    Vec<(SocketAddr, super::address::Refusal)>,
) {
    let port_name = port.name.as_deref().unwrap_or("");
    let mut addrs: Vec<SocketAddr> = Vec::new();
    let mut refused = Vec::new();
    for slice in store.slices_of(service) {
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
mod balance_tests {
    use super::*;

    fn backend(n: u8) -> Backend {
        let endpoints = (0..n)
            .map(|i| Arc::new(Endpoint::new(SocketAddr::from(([10, 0, 0, i], 80)))))
            .collect();
        Backend {
            service: ObjectKey::new("t".to_string(), "s".to_string()),
            port: PortRef::Number(80),
            target: Target::Endpoints(endpoints),
            next: AtomicUsize::new(0),
            app_protocol: None,
        }
    }

    #[test]
    fn round_robin_takes_each_in_turn() {
        let b = backend(3);
        let picked: Vec<u8> = (0..6)
            .filter_map(|_| b.pick(Balance::RoundRobin))
            .map(|e| match e.addr.ip() {
                IpAddr::V4(v4) => v4.octets()[3],
                IpAddr::V6(_) => 255,
            })
            .collect();
        assert_eq!(picked, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn ewma_avoids_the_slow_endpoint_and_two_choices_the_busy_one() {
        let b = backend(2);
        let endpoints = b.endpoints();
        for _ in 0..20 {
            endpoints[0].sample(100_000);
            endpoints[1].sample(1_000);
        }
        assert!(
            endpoints[0].ewma_us() > 50_000,
            "{}",
            endpoints[0].ewma_us()
        );
        for _ in 0..50 {
            let e = b.pick(Balance::Ewma).expect("an endpoint");
            assert_eq!(e.addr, endpoints[1].addr);
        }
        // Two choices ignores response times and goes by requests in flight.
        let _busy: Vec<InFlight> = (0..5).map(|_| endpoints[1].start(false)).collect();
        for _ in 0..50 {
            let e = b.pick(Balance::TwoChoices).expect("an endpoint");
            assert_eq!(e.addr, endpoints[0].addr);
        }
    }

    #[test]
    fn a_timed_request_is_a_sample() {
        let b = backend(1);
        let e = &b.endpoints()[0];
        drop(e.start(false));
        assert_eq!(e.ewma_us(), 0);
        drop(e.start(true));
        assert!(e.ewma_us() >= 1);
        assert_eq!(e.in_flight(), 0);
    }
}
