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
    slices: SliceIndex<'a>,
    cache: HashMap<(ObjectKey, PortRef), (Arc<Backend>, Vec<Problem>)>,
}

impl<'a> Resolver<'a> {
    pub fn new(store: &'a Store, policy: &'a BackendPolicy) -> Self {
        let mut slices: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
        for (key, slice) in &store.endpoint_slices {
            let service = slice
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(SERVICE_NAME_LABEL));
            if let Some(service) = service {
                slices
                    .entry((key.namespace.as_str(), service.as_str()))
                    .or_default()
                    .push(slice);
            }
        }
        Self {
            store,
            policy,
            slices,
            cache: HashMap::new(),
        }
    }

    /// The first port of `service` (ingress-nginx's choice for a `default-backend`
    /// annotation), if the Service exists and has one.
    pub fn first_port(&self, service: &ObjectKey) -> Option<PortRef> {
        let ports = self
            .store
            .services
            .get(service)?
            .spec
            .as_ref()?
            .ports
            .as_ref()?;
        ports.first().map(|p| PortRef::Number(p.port))
    }

    /// The backend for `service`:`port`, and the problems with it. Callers attach the problems
    /// to their own Ingress.
    pub fn resolve(&mut self, service: ObjectKey, port: PortRef) -> (Arc<Backend>, &[Problem]) {
        let Self {
            store,
            policy,
            slices,
            cache,
        } = self;
        let (backend, problems) =
            cache
                .entry((service, port))
                .or_insert_with_key(|(service, port)| {
                    let (target, problems) = resolve_target(store, policy, slices, service, port);
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

type SliceIndex<'a> = HashMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>;

fn resolve_target(
    store: &Store,
    policy: &BackendPolicy,
    slices: &SliceIndex<'_>,
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
    let (endpoints, refused) =
        ready_endpoints(slices, &policy.addresses, service_key, service_port);
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
fn ready_endpoints(
    slices: &SliceIndex<'_>,
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
    let slices = slices.get(&(service.namespace.as_str(), service.name.as_str()));
    for slice in slices.into_iter().flatten() {
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
