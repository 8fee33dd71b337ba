//! Helpers shared by the integration tests in `tests/tests/`.

// Test support: a failed setup step should stop the test at once with its message, and blocking
// waits are fine outside the proxy.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

pub mod apiserver;
pub mod client;
pub mod manifests;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod process;
pub mod raw;
pub mod rawtcp;
pub mod scratch;
pub mod scripted;
pub mod tcx;
pub mod upstream;

/// Whether this is a CI run (`CI=true`, or `CI=1` as some CI systems set it): there, a test that
/// cannot load its kernel program fails instead of skipping.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}
