//! The proxy's HTTP/1.x reading and writing against hyper's reading of the same bytes
//! (`ingress_wire::differential::check`): any request the proxy accepts, hyper must read the same
//! way, and the bytes the proxy would send upstream must read back exactly as meant.
//!
//! ```text
//!   cargo +nightly fuzz run h1_differential corpus/h1_differential
//! ```
//!
//! Inputs worth keeping go into `corpus/h1_differential/`, which `tests/tests/h1_differential.rs`
//! runs on every `cargo test`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Err(why) = ingress_wire::differential::check(data) {
        panic!("{why}");
    }
});
