//! Helpers shared by the integration tests in `tests/tests/`.

pub mod apiserver;
pub mod client;
pub mod manifests;
pub mod netns;
pub mod pki;
pub mod ports;
pub mod process;
pub mod scratch;
pub mod upstream;
