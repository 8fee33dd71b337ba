//! Helpers shared by the integration tests in `tests/tests/`: everything a test needs besides
//! its own scenario is written once here.
//!
//! ```text
//!   process      the real binary: one builder for every way a test starts it
//!   accept_loop  the thread, runtime and accept loop behind every test upstream
//!   auth_service an auth service for `auth-url` whose answer each path scripts
//!   poll         eventually: wait for a live change to reach traffic
//!   h2c_upstream an upstream speaking HTTP/2 (prior knowledge) only, answers scripted by path
//!   preflight    root / BTF / embedded eBPF object, or skip (fail under CI=true)
//!   modes        Mode and both_modes!: one scenario, an _ebpf and a _userspace test
//!   netns, pins  network namespaces (NetPair, NetChain) and a bpffs directory per test
//!   gate_site    the kernel-gate site: namespaces, backend, certificate, manifests, proxies
//!   gate_server  the gate loaded from the library behind a TLS-less test server
//!   passthrough  the passthrough site: client, proxy and backend namespaces and backends
//!   tls_client, scrape, corpus, bpftool, sockopt, rawtcp, tcx: what those sites are driven
//!                and checked with
//! ```

// Test support: a failed setup step should stop the test at once with its message, and blocking
// waits are fine outside the proxy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

pub mod accept_loop;
pub mod apiserver;
pub mod auth_service;
pub mod bpftool;
pub mod client;
pub mod corpus;
pub mod curl;
pub mod gate_server;
pub mod gate_site;
pub mod h2c_upstream;
pub mod https_upstream;
pub mod manifests;
pub mod modes;
pub mod netns;
pub mod otlp;
pub mod passthrough;
pub mod path_tricks;
pub mod pins;
pub mod pki;
pub mod poll;
pub mod ports;
pub mod preflight;
pub mod process;
pub mod raw;
pub mod rawtcp;
pub mod scrape;
pub mod scratch;
pub mod scripted;
pub mod sockopt;
pub mod tcx;
pub mod tls_client;
pub mod upstream;

pub use modes::Mode;
// For `both_modes!`, so a test file needs no dependency of its own to paste test names.
#[doc(hidden)]
pub use pastey;

/// Whether this is a CI run (`CI=true`, or `CI=1` as some CI systems set it): there, a test that
/// cannot load its kernel program fails instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
