//! Telemetry: the process's log subscriber, and the metrics registry that every subsystem
//! registers its own metrics into at startup (each defines and counts its own; this module
//! only holds them, adds what describes the whole process and the published snapshot, and
//! encodes them for `/metrics`).
//!
//! ```text
//!   source::kube::WatchMetrics ─┐
//!   publish::PipelineMetrics ───┤
//!   proxy::metrics::ProxyMetrics┼─ register(&mut Registry) ──> Telemetry ──> /metrics (admin)
//!   mapsync::GateMetrics ───────┤                                  │
//!   report::ReportMetrics ──────┤     SnapshotMetrics: read from the published snapshot
//!   admin::AdminMetrics ────────┘     at scrape time (one snapshot per scrape, never half)
//! ```

pub mod compat;
pub mod logging;
pub mod metrics;
pub mod otel;

pub use metrics::Telemetry;
