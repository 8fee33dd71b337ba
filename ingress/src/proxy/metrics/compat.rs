//! `--metrics-compat ingress-nginx`: the request metrics under ingress-nginx's names, labels and
//! buckets, so its Grafana dashboards and alerts read this proxy unchanged.
//!
//! ```text
//!   nginx_ingress_controller_requests                      counter
//!   nginx_ingress_controller_request_duration_seconds      request head to response end
//!   nginx_ingress_controller_response_duration_seconds     upstream: first attempt to body end
//!   nginx_ingress_controller_header_duration_seconds       upstream: first attempt to its head
//!   nginx_ingress_controller_connect_duration_seconds      upstream: first attempt to its head *
//!   nginx_ingress_controller_request_size                  request head and body bytes
//!   nginx_ingress_controller_response_size                 response body bytes
//!     labels: controller_namespace, controller_class, controller_pod (constant), status,
//!             method, path, namespace, ingress, service, canary, and host with
//!             --metrics-per-host
//! ```
//!
//! \* The proxy reuses upstream connections and does not time a connect apart from the wait for
//! the head; as nginx reports `0` for a reused connection's connect time, this reports the time
//! to the head, an upper bound. Upstream series are observed only for requests that reached an
//! upstream, as ingress-nginx's (`-` in the log is not observed there either).
//!
//! Cardinality: one series per (route, status, method) and, with `--metrics-per-host`, host;
//! each histogram series has 12 (time) or 11 (size) buckets. `method` is one of the standard
//! methods or `OTHER`, so a client inventing methods cannot add series.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, LabelSetEncoder, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::proxy::access_log::{Meter, upstream_name};
use crate::snapshot::Route;

/// Prometheus' default buckets, which ingress-nginx's `--time-buckets` defaults to.
const TIME_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// ingress-nginx's `--length-buckets` default: 10, 20, … 100.
const LENGTH_BUCKETS: [f64; 10] = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 100.0];

/// Who is reporting: ingress-nginx's constant labels.
#[derive(Clone, Debug, Default)]
pub struct Controller {
    pub namespace: Arc<str>,
    pub class: Arc<str>,
    pub pod: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq)]
struct Labels {
    controller_namespace: Arc<str>,
    controller_class: Arc<str>,
    controller_pod: Arc<str>,
    status: u16,
    method: &'static str,
    path: Arc<str>,
    namespace: Arc<str>,
    ingress: Arc<str>,
    service: Arc<str>,
    canary: Arc<str>,
    host: Option<Arc<str>>,
}

/// By hand rather than derived: without `--metrics-per-host` there is no `host` label at all,
/// as in ingress-nginx, rather than an empty one.
impl EncodeLabelSet for Labels {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> std::fmt::Result {
        let status = self.status.to_string();
        let mut pairs: Vec<(&str, &str)> = vec![
            ("controller_namespace", &self.controller_namespace),
            ("controller_class", &self.controller_class),
            ("controller_pod", &self.controller_pod),
            ("status", &status),
            ("method", self.method),
            ("path", &self.path),
            ("namespace", &self.namespace),
            ("ingress", &self.ingress),
            ("service", &self.service),
            ("canary", &self.canary),
        ];
        if let Some(host) = &self.host {
            pairs.push(("host", host));
        }
        pairs.as_slice().encode(encoder)
    }
}

/// A counter under its bare name, as ingress-nginx's Go client exposes counters: OpenMetrics
/// would add `_total` to a counter's samples, which its dashboards do not query. Typed
/// `unknown`, which OpenMetrics allows under any name; PromQL's `rate` reads it the same.
#[derive(Clone, Debug, Default)]
pub struct BareCounter(Counter);

impl BareCounter {
    fn inc(&self) {
        self.0.inc();
    }
}

impl TypedMetric for BareCounter {
    const TYPE: MetricType = MetricType::Unknown;
}

impl EncodeMetric for BareCounter {
    fn encode(&self, mut encoder: MetricEncoder) -> std::fmt::Result {
        encoder.encode_gauge(&self.0.get())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// The request families; see the module docs.
pub struct CompatMetrics {
    controller: Controller,
    per_host: bool,
    requests: Family<Labels, BareCounter>,
    request_duration: Histograms,
    response_duration: Histograms,
    header_duration: Histograms,
    connect_duration: Histograms,
    request_size: Histograms,
    response_size: Histograms,
}

/// One finished request, as the families need it.
pub(crate) struct Observed<'a> {
    pub(crate) route: Option<&'a Route>,
    pub(crate) status: u16,
    pub(crate) method: &'a str,
    pub(crate) host: Option<&'a str>,
    pub(crate) elapsed: Duration,
    pub(crate) meter: &'a Meter,
}

impl CompatMetrics {
    /// Registers the families into `registry` (one without a prefix: the names are whole).
    pub fn register(registry: &mut Registry, controller: Controller, per_host: bool) -> Self {
        let time = || Histograms::new_with_constructor(|| Histogram::new(TIME_BUCKETS));
        let length = || Histograms::new_with_constructor(|| Histogram::new(LENGTH_BUCKETS));
        let metrics = CompatMetrics {
            controller,
            per_host,
            requests: Family::default(),
            request_duration: time(),
            response_duration: time(),
            header_duration: time(),
            connect_duration: time(),
            request_size: length(),
            response_size: length(),
        };
        let name = |n: &str| format!("nginx_ingress_controller_{n}");
        registry.register(
            name("requests"),
            "The total number of client requests",
            metrics.requests.clone(),
        );
        for (n, help, family) in [
            (
                "request_duration_seconds",
                "The request processing time in seconds, from its head to the end of the response",
                &metrics.request_duration,
            ),
            (
                "response_duration_seconds",
                "The time spent receiving the response from the upstream server",
                &metrics.response_duration,
            ),
            (
                "header_duration_seconds",
                "The time spent receiving the first header from the upstream server",
                &metrics.header_duration,
            ),
            (
                "connect_duration_seconds",
                "The time spent establishing a connection with the upstream server (here: until its response head)",
                &metrics.connect_duration,
            ),
            (
                "request_size",
                "The request length (including request line, header, and request body)",
                &metrics.request_size,
            ),
            (
                "response_size",
                "The response body length sent to the client",
                &metrics.response_size,
            ),
        ] {
            registry.register(name(n), help, family.clone());
        }
        metrics
    }

    /// Whether requests are labelled with their host (`--metrics-per-host`).
    pub fn per_host(&self) -> bool {
        self.per_host
    }

    pub(crate) fn observe(&self, o: &Observed<'_>) {
        let empty = || Arc::<str>::from("");
        let (path, namespace, ingress, service) = match o.route {
            Some(route) => (
                route.labels.path.clone(),
                route.labels.namespace.clone(),
                route.labels.ingress.clone(),
                route.labels.service.clone(),
            ),
            None => (empty(), empty(), empty(), empty()),
        };
        let canary = match (o.route, o.meter.canary) {
            // ingress-nginx labels it with the canary's upstream name.
            (Some(route), true) => route
                .policy
                .canary
                .as_ref()
                .map_or_else(empty, |c| upstream_name(&c.backend).into()),
            _ => empty(),
        };
        let labels = Labels {
            controller_namespace: self.controller.namespace.clone(),
            controller_class: self.controller.class.clone(),
            controller_pod: self.controller.pod.clone(),
            status: o.status,
            method: method(o.method),
            path,
            namespace,
            ingress,
            service,
            canary,
            host: self.per_host.then(|| o.host.map_or_else(empty, Arc::from)),
        };
        self.requests.get_or_create(&labels).inc();
        self.request_duration
            .get_or_create(&labels)
            .observe(o.elapsed.as_secs_f64());
        self.request_size
            .get_or_create(&labels)
            .observe(o.meter.request_bytes as f64);
        self.response_size
            .get_or_create(&labels)
            .observe(o.meter.body_bytes_sent as f64);
        if let Some(answered) = o.meter.upstream.as_ref().and_then(|u| u.response) {
            let header = answered.header.as_secs_f64();
            self.header_duration.get_or_create(&labels).observe(header);
            self.connect_duration.get_or_create(&labels).observe(header);
            self.response_duration
                .get_or_create(&labels)
                .observe(answered.response.as_secs_f64());
        }
    }
}

/// A standard method's name, else `OTHER`: the label never takes a value a client made up.
fn method(m: &str) -> &'static str {
    const KNOWN: [&str; 9] = [
        "GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH",
    ];
    KNOWN.into_iter().find(|k| *k == m).unwrap_or("OTHER")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_clients_make_up_share_one_label() {
        for (m, want) in [
            ("GET", "GET"),
            ("PATCH", "PATCH"),
            ("get", "OTHER"),
            ("PROPFIND", "OTHER"),
            ("X".repeat(100).as_str(), "OTHER"),
        ] {
            assert_eq!(method(m), want, "{m}");
        }
    }
}
