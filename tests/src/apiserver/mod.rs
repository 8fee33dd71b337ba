//! An in-memory Kubernetes API server that speaks the real wire protocol, for tests.
//!
//! ```text
//!   kubectl / kube-rs ──HTTP/1.1──> server.rs (listener; stop / restart / resume)
//!                                     │ request log, injected failures (faults.rs)
//!                                     v
//!                                routes.rs  path + query -> Route
//!                                     │
//!         discovery.rs <──────────────┼──────────────> handlers.rs  get/list/create/update/patch/delete
//!         /api /apis /version         │                  │  objects.rs  system fields, defaults, schema
//!         aggregated discovery        │                  │  patch.rs    merge / strategic / json / apply
//!         /openapi/v3                 v                  │  managed.rs  managedFields for server-side apply
//!                                  watch.rs <── changes ─┴─ store.rs    one lock, one resourceVersion, history
//! ```
//!
//! Usage:
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use ingress_tests::apiserver::{RestartOptions, TestApiServer};
//!
//! let server = TestApiServer::start().await?;
//! let client = server.client()?; // kube-rs; or write_kubeconfig() for kubectl / KUBECONFIG
//! server.faults().drop_watches(); // every open watch breaks now
//! server.faults().expire_next_watches(1); // the next watch gets 410 Expired
//! server.faults().fail_matching("/ingresses", 2); // two 500s for matching requests
//! server.restart(RestartOptions { reset_history: true, ..Default::default() }).await?;
//! let tls_lists = server.requests().matching(|r| {
//!     r.param("fieldSelector").as_deref() == Some("type=kubernetes.io/tls")
//! });
//! # Ok(()) }
//! ```
//!
//! Behaviour a test can rely on, and where it deliberately differs from a real cluster:
//! - One global resourceVersion counter, never reset (not even by a wiping restart), so an
//!   old resourceVersion can only ever be too old, never ambiguous.
//! - Watch history is bounded ([`ServerOptions::history_limit`]); a watch from before it gets
//!   an `ERROR` event carrying a 410 `Expired` Status, as kube-apiserver sends it.
//! - Lists ignore `limit` and never return a `continue` token (clients handle that).
//! - A namespaced create into a missing namespace creates the namespace, unless
//!   [`ServerOptions::strict_namespaces`] is set (then it is a 404 like the real server).
//!   Deleting a namespace deletes its contents at once; there is no Terminating phase.
//! - Strategic merge patch is JSON merge patch that drops `$`-directives: lists are replaced,
//!   never merged by key.
//! - Server-side apply merges the applied configuration into the live object, removes fields
//!   the same manager applied before and no longer applies, and reports conflicts with other
//!   managers' fields unless `force=true`. Lists are atomic (owned and replaced whole).
//! - `fieldValidation` (Strict / Warn / Ignore, default Warn) is checked by decoding into the
//!   k8s-openapi type: unknown fields are rejected, warned about or dropped.
//! - Secret `stringData` is merged into `data` on every write and never returned.
//! - A list with `resourceVersionMatch=Exact` is served only at the current resourceVersion
//!   (there are no snapshots of the past); older ones get 410.
//! - Objects with finalizers get a deletionTimestamp and disappear when the finalizers are
//!   removed. There is no garbage collection of ownerReferences.
//! - kube-rs 5 retries 429/503/504 by itself, so injected 503s are seen in the request log,
//!   not by callers; use 500 to make a call fail.
//! - kubectl 1.29 and later validate through `/openapi/v3` (served: operations, no schemas)
//!   and `fieldValidation`; older ones want protobuf OpenAPI v2 (not served) and need
//!   `--validate=false`. Clients that ask for aggregated discovery v2 get it; others
//!   (kube-rs, kubectl before 1.30) read the per-group documents.

mod discovery;
mod faults;
mod handlers;
mod kubeconfig;
mod log;
mod managed;
mod objects;
mod patch;
mod resource;
mod routes;
mod selectors;
mod server;
mod status;
mod store;
mod table;
mod watch;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Event as CoreEvent, Namespace, Node, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

pub use faults::{FailRule, Faults};
pub use log::{RequestLog, RequestRecord};
pub use resource::{ResourceDef, View};
pub use server::{Error, RestartOptions, ServerOptions, TestApiServer};
pub use store::{ObjectKey, Store};

/// Every served resource. Serving another one is one more row.
#[rustfmt::skip]
pub static RESOURCES: &[ResourceDef] = &[
    ResourceDef::new("", "v1", "namespaces", "Namespace").cluster_scoped().short(&["ns"]).status().typed::<Namespace>().defaults(objects::namespace_defaults).fields(&[("status.phase", "status.phase")]).columns(table::NAMESPACE),
    ResourceDef::new("", "v1", "nodes", "Node").cluster_scoped().short(&["no"]).status().typed::<Node>().fields(&[("spec.unschedulable", "spec.unschedulable")]),
    ResourceDef::new("", "v1", "services", "Service").short(&["svc"]).categories(&["all"]).status().typed::<Service>().defaults(objects::service_defaults).fields(&[("spec.clusterIP", "spec.clusterIP"), ("spec.type", "spec.type")]).columns(table::SERVICE),
    ResourceDef::new("", "v1", "endpoints", "Endpoints").short(&["ep"]).typed::<Endpoints>(),
    ResourceDef::new("", "v1", "secrets", "Secret").typed::<Secret>().defaults(objects::secret_defaults).normalize(objects::secret_string_data).fields(&[("type", "type")]).columns(table::SECRET),
    ResourceDef::new("", "v1", "configmaps", "ConfigMap").short(&["cm"]).typed::<ConfigMap>(),
    ResourceDef::new("", "v1", "events", "Event").short(&["ev"]).typed::<CoreEvent>().fields(objects::CORE_EVENT_FIELDS).columns(table::EVENT),
    ResourceDef::new("networking.k8s.io", "v1", "ingresses", "Ingress").short(&["ing"]).status().generation().typed::<Ingress>().columns(table::INGRESS),
    ResourceDef::new("networking.k8s.io", "v1", "ingressclasses", "IngressClass").cluster_scoped().generation().typed::<IngressClass>().columns(table::INGRESS_CLASS),
    ResourceDef::new("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice").generation().typed::<EndpointSlice>().fields(&[("addressType", "addressType")]).columns(table::ENDPOINT_SLICE),
    ResourceDef::new("coordination.k8s.io", "v1", "leases", "Lease").typed::<Lease>().columns(table::LEASE),
    ResourceDef::new("events.k8s.io", "v1", "events", "Event").short(&["ev"]).typed::<Event>().fields(objects::EVENTS_V1_FIELDS).view(objects::EVENTS_V1_VIEW),
];

/// The row for `group`/`version`/`resource`, if served.
pub fn resource(group: &str, version: &str, resource: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|d| d.group == group && d.version == version && d.resource == resource)
}

/// The row for a kind in an `apiVersion`, e.g. (`networking.k8s.io/v1`, `Ingress`).
pub fn resource_for_kind(api_version: &str, kind: &str) -> Option<&'static ResourceDef> {
    RESOURCES
        .iter()
        .find(|d| d.api_version() == api_version && d.kind == kind)
}
