//! `--metrics-compat ingress-nginx`, the controller's side: what ingress-nginx's dashboards and
//! alerts read about the controller itself, from this process's own state, read at scrape
//! time.
//!
//! ```text
//!   config_hash, config_last_reload_successful(_timestamp_seconds), success, errors
//!        "reload" is a snapshot publish: it cannot fail half-way (a bad object is a
//!        diagnostic, and the rest is published), so the last one is always successful
//!   ssl_expire_time_seconds{namespace, class, host, secret_name, identifier}
//!   nginx_process_connections{state}, nginx_process_connections_total{state},
//!   nginx_process_cpu_seconds_total, nginx_process_resident_memory_bytes
//!        this process stands in for nginx's worker processes
//! ```
//!
//! The request families are the proxy's (`proxy::metrics::compat`).

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};

use crate::proxy::metrics::ProxyMetrics;
use crate::proxy::metrics::compat::Controller;
use crate::publish::Published;
use crate::snapshot::certs::CertSource;

/// The listeners whose connections nginx's connection counts stand for.
const LISTENERS: [&str; 2] = ["http", "https"];

/// See the module docs.
pub struct CompatController {
    pub controller: Controller,
    pub published: Arc<Published>,
    pub proxy: Arc<ProxyMetrics>,
    /// Snapshots published, and when the last one was (Unix seconds).
    pub publishes: Counter,
    pub last_publish: Gauge,
}

impl std::fmt::Debug for CompatController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CompatController")
    }
}

const PREFIX: &str = "nginx_ingress_controller_";

impl Collector for CompatController {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let c = &self.controller;
        let controller: [(&str, &str); 3] = [
            ("controller_namespace", &c.namespace),
            ("controller_class", &c.class),
            ("controller_pod", &c.pod),
        ];
        let snapshot = self.published.load_full();
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: i64| {
            let name = format!("{PREFIX}{name}");
            let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Gauge)?;
            ConstGauge::new(value).encode(family.encode_family(&controller.as_slice())?)
        };
        let counter = |encoder: &mut DescriptorEncoder, name: &str, help: &str, value: u64| {
            // Bare names, typed `unknown`: see `proxy::metrics::compat::BareCounter`.
            let name = format!("{PREFIX}{name}");
            let mut family = encoder.encode_descriptor(&name, help, None, MetricType::Unknown)?;
            ConstGauge::new(value).encode(family.encode_family(&controller.as_slice())?)
        };
        gauge(
            &mut encoder,
            "config_hash",
            "Running configuration hash actually running (here: the snapshot generation)",
            i64::try_from(snapshot.generation).unwrap_or(i64::MAX),
        )?;
        gauge(
            &mut encoder,
            "config_last_reload_successful",
            "Whether the last configuration reload attempt was successful (a snapshot publish always is)",
            1,
        )?;
        gauge(
            &mut encoder,
            "config_last_reload_successful_timestamp_seconds",
            "Timestamp of the last successful configuration reload (snapshot publish)",
            self.last_publish.get(),
        )?;
        counter(
            &mut encoder,
            "success",
            "Cumulative number of configuration reloads (snapshot publishes)",
            self.publishes.get(),
        )?;
        counter(
            &mut encoder,
            "errors",
            "Cumulative number of errors during reloads (a snapshot publish cannot fail)",
            0,
        )?;

        let mut family = encoder.encode_descriptor(
            concat!("nginx_ingress_controller_", "ssl_expire_time_seconds"),
            "Number of seconds since 1970 to the SSL Certificate expire",
            None,
            MetricType::Gauge,
        )?;
        for cert in &snapshot.tls.loaded {
            let CertSource::Secret(secret) = &cert.source else {
                continue;
            };
            // ingress-nginx's identifier names the certificate; the Secret does here.
            let identifier = secret.to_string();
            for host in &cert.dns_names {
                let labels: [(&str, &str); 5] = [
                    ("namespace", &secret.namespace),
                    ("class", &c.class),
                    ("host", host),
                    ("secret_name", &secret.name),
                    ("identifier", &identifier),
                ];
                ConstGauge::new(cert.not_after)
                    .encode(family.encode_family(&labels.as_slice())?)?;
            }
        }

        let listeners =
            LISTENERS.map(|listener| crate::proxy::metrics::ListenerLabels { listener });
        let active: i64 = listeners
            .iter()
            .map(|l| self.proxy.connections_active.get_or_create(l).get())
            .sum();
        let accepted: u64 = listeners
            .iter()
            .map(|l| self.proxy.connections.get_or_create(l).get())
            .sum();
        let mut family = encoder.encode_descriptor(
            concat!("nginx_ingress_controller_", "nginx_process_connections"),
            "Current number of client connections, by state (active only)",
            None,
            MetricType::Gauge,
        )?;
        let mut with_state = controller.to_vec();
        with_state.push(("state", "active"));
        ConstGauge::new(active).encode(family.encode_family(&with_state.as_slice())?)?;
        let mut family = encoder.encode_descriptor(
            concat!(
                "nginx_ingress_controller_",
                "nginx_process_connections_total"
            ),
            "Total number of client connections, by state (accepted, handled)",
            None,
            MetricType::Unknown,
        )?;
        for state in ["accepted", "handled"] {
            let mut labels = controller.to_vec();
            labels.push(("state", state));
            ConstGauge::new(accepted).encode(family.encode_family(&labels.as_slice())?)?;
        }
        if let Some(usage) = process_usage() {
            let mut family = encoder.encode_descriptor(
                concat!(
                    "nginx_ingress_controller_",
                    "nginx_process_cpu_seconds_total"
                ),
                "CPU seconds this process has used (user and system)",
                None,
                MetricType::Unknown,
            )?;
            ConstGauge::new(usage.cpu_seconds)
                .encode(family.encode_family(&controller.as_slice())?)?;
            gauge(
                &mut encoder,
                "nginx_process_resident_memory_bytes",
                "Resident memory of this process",
                i64::try_from(usage.resident_bytes).unwrap_or(i64::MAX),
            )?;
        }
        Ok(())
    }
}

struct Usage {
    cpu_seconds: f64,
    resident_bytes: u64,
}

/// CPU time and resident memory of this process, from `getrusage` and `/proc/self/statm`.
fn process_usage() -> Option<Usage> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `getrusage` fills the struct it is given; RUSAGE_SELF is always valid.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(Usage {
        cpu_seconds: seconds(usage.ru_utime) + seconds(usage.ru_stime),
        // SAFETY: sysconf only reads a system constant.
        resident_bytes: pages * u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).ok()?,
    })
}
