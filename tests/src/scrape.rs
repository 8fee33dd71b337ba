//! One `/metrics` answer from the proxy, read the way the gate tests read it: the decisions the
//! proxy acted on (`ingress_sni_gate_total`), the kernel's own count (`ingress_ebpf_gate_total`)
//! and the handshakes that followed.

use crate::client::metric_value;

/// The reasons the gate decides for, as the metrics label them.
pub const REASONS: [&str; 7] = [
    "pass",
    "unknown",
    "no_sni",
    "malformed",
    "not_tls",
    "passthrough",
    "source_refused",
];

/// The text of one scrape.
pub struct Scrape(pub String);

impl Scrape {
    /// The first sample of `name` with every `labels` pair; 0 when there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        metric_value(&self.0, name, labels).unwrap_or(0.0)
    }

    /// The sum of every sample of `name`, whatever its labels.
    pub fn sum(&self, name: &str) -> f64 {
        self.0
            .lines()
            .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
            .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
            .sum()
    }

    /// `ingress_sni_gate_total{reason}`: the decisions the proxy acted on.
    pub fn gate(&self, reason: &str) -> f64 {
        self.value("ingress_sni_gate_total", &[("reason", reason)])
    }

    /// `ingress_ebpf_gate_total{counter}`: the kernel's own count.
    pub fn kernel(&self, counter: &str) -> f64 {
        self.value("ingress_ebpf_gate_total", &[("counter", counter)])
    }

    /// Every TLS handshake, whatever its result.
    pub fn handshakes(&self) -> f64 {
        self.sum("ingress_tls_handshakes_total")
    }

    /// Whether any line starts with `name`.
    pub fn has(&self, name: &str) -> bool {
        self.0.lines().any(|l| l.starts_with(name))
    }
}

/// The reasons whose counter moved between two scrapes (one, or none if nothing was decided).
pub fn moved(
    before: &Scrape,
    after: &Scrape,
    counter: impl Fn(&Scrape, &str) -> f64,
) -> Vec<String> {
    REASONS
        .iter()
        .filter(|r| counter(after, r) > counter(before, r))
        .map(|r| r.to_string())
        .collect()
}
