//! ingress: a Kubernetes ingress controller with an eBPF SNI gate.
//!
//! Data flows one way: sources → [`store::Store`] → [`snapshot::Snapshot`] (pure) → the proxy,
//! the kernel map sync and the reporter, which all read the same published `Arc<Snapshot>`.

pub mod admin;
pub mod check;
pub mod cli;
pub mod clock;
pub mod diagnostics;
pub mod errors;
pub mod gate;
pub mod mapsync;
pub mod migration;
pub mod object;
pub mod proxy;
pub mod publish;
pub mod report;
pub mod run;
pub mod snapshot;
pub mod source;
pub mod store;
pub mod telemetry;

/// The ClientHello parser lives in its own crate so the fuzz target can link it alone.
pub use ingress_client_hello as client_hello;

#[cfg(test)]
mod layering;
