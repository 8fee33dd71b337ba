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
pub mod scratch;
pub mod upstream;
