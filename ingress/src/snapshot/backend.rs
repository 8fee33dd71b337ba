//! Backends: an Ingress's `service.name` + `port` resolved to the ready endpoints of the
//! Service's EndpointSlices (never the ClusterIP), or to a DNS name for ExternalName Services.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use k8s_openapi::api::core::v1::{Service, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;

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

/// Where a backend's traffic goes.
#[derive(Debug)]
pub enum Target {
    Endpoints(Vec<Arc<Endpoint>>),
    /// Resolved through DNS when a connection is made.
    ExternalName {
        host: String,
        port: u16,
    },
    /// The Service or its port does not exist; requests get 503.
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
    slices: SliceIndex<'a>,
    cache: HashMap<(ObjectKey, PortRef), (Arc<Backend>, Option<Problem>)>,
}

impl<'a> Resolver<'a> {
    pub fn new(store: &'a Store) -> Self {
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
            slices,
            cache: HashMap::new(),
        }
    }

    /// The backend for `service`:`port`, and the problem with it, if any. Callers attach the
    /// problem to their own Ingress.
    pub fn resolve(
        &mut self,
        service: ObjectKey,
        port: PortRef,
    ) -> (Arc<Backend>, Option<&Problem>) {
        let Self {
            store,
            slices,
            cache,
        } = self;
        let (backend, problem) =
            cache
                .entry((service, port))
                .or_insert_with_key(|(service, port)| {
                    let (target, problem) = resolve_target(store, slices, service, port);
                    let backend = Backend {
                        service: service.clone(),
                        port: port.clone(),
                        target,
                    };
                    (Arc::new(backend), problem)
                });
        (backend.clone(), problem.as_ref())
    }
}

type SliceIndex<'a> = HashMap<(&'a str, &'a str), Vec<&'a EndpointSlice>>;

fn resolve_target(
    store: &Store,
    slices: &SliceIndex<'_>,
    service_key: &ObjectKey,
    port: &PortRef,
) -> (Target, Option<Problem>) {
    let Some(service) = store.services.get(service_key) else {
        let message = format!("service {service_key} not found");
        return (
            Target::Unavailable,
            Some(Problem {
                kind: DiagnosticKind::ServiceNotFound,
                message,
            }),
        );
    };
    let spec = service.spec.as_ref();
    let service_port = find_port(service, port);
    if spec.and_then(|s| s.type_.as_deref()) == Some("ExternalName") {
        let external = spec
            .and_then(|s| s.external_name.clone())
            .unwrap_or_default();
        let number = match (service_port, port) {
            (Some(p), _) => Some(p.port),
            (None, PortRef::Number(n)) => Some(*n),
            (None, PortRef::Name(_)) => None,
        };
        return match (
            external.is_empty(),
            number.and_then(|n| u16::try_from(n).ok()),
        ) {
            (false, Some(port)) => (
                Target::ExternalName {
                    host: external,
                    port,
                },
                None,
            ),
            (true, _) => {
                let message = format!("service {service_key} is ExternalName without externalName");
                (
                    Target::Unavailable,
                    Some(Problem {
                        kind: DiagnosticKind::UnsupportedBackend,
                        message,
                    }),
                )
            }
            (false, None) => (Target::Unavailable, Some(port_problem(service_key, port))),
        };
    }
    let Some(service_port) = service_port else {
        return (Target::Unavailable, Some(port_problem(service_key, port)));
    };
    let endpoints = ready_endpoints(slices, service_key, service_port);
    let problem = endpoints.is_empty().then(|| Problem {
        kind: DiagnosticKind::NoReadyEndpoints,
        message: format!("service {service_key} port {port} has no ready endpoints"),
    });
    (Target::Endpoints(endpoints), problem)
}

/// Ready endpoints of every slice of the Service, matched to the Service port by name, as the
/// EndpointSlice controller names them. Deduplicated: an address can be in two slices while the
/// controller moves it.
fn ready_endpoints(
    slices: &SliceIndex<'_>,
    service: &ObjectKey,
    port: &ServicePort,
) -> Vec<Arc<Endpoint>> {
    let port_name = port.name.as_deref().unwrap_or("");
    let mut addrs: Vec<SocketAddr> = Vec::new();
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
                addrs.push(SocketAddr::new(ip, number));
            }
        }
    }
    addrs.sort();
    addrs.dedup();
    addrs
        .into_iter()
        .map(|a| Arc::new(Endpoint::new(a)))
        .collect()
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
