//! `cargo xtask <task>`: what plain cargo cannot do on its own.
//!
//! ```text
//!   setup        Debian packages, bpf-linker, cargo-fuzz, cargo-machete, cargo-deny (idempotent)
//!   build-ebpf   ingress-ebpf for bpfel-unknown-none → <target>/ebpf-object/ingress-ebpf.o
//!   build        build-ebpf, then `cargo build -p ingress` with that object embedded
//!   clippy-ebpf  clippy -D warnings for ingress-ebpf, on its own target
//!   test         everything CI checks: fmt, unused dependencies and deny.toml, clippy (host
//!                and eBPF), the build, the fuzz targets, all tests
//!   demo         set up, build, and run the controller on deploy/examples with demo backends
//!   bench        ingress against nginx on one machine, printed as ratios
//!   fuzz         run one fuzz target (cargo-fuzz, nightly) for a while
//! ```
//!
//! One module per task; `toolchain` finds how to compile for BPF on this machine and
//! `workspace` knows where things live.

// xtask is synchronous: no runtime exists for a blocking sleep or connect to stall.
#![allow(clippy::disallowed_methods)]

mod bench;
mod btf;
mod build;
mod build_ebpf;
mod clippy_ebpf;
mod demo;
mod deps;
mod fuzz;
mod setup;
mod test;
mod toolchain;
mod workspace;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "Project tasks beyond plain cargo")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what the Debian eBPF route, the tests and the dependency checks need, if missing.
    Setup(setup::Args),
    /// Build the eBPF object that the ingress binary embeds.
    BuildEbpf(build_ebpf::Args),
    /// Build the eBPF object, then the ingress binary with it embedded.
    Build(build::Args),
    /// Run clippy with -D warnings on the eBPF crate, for its own target.
    ClippyEbpf(toolchain::RouteArg),
    /// Everything CI checks: fmt, dependency checks (machete, deny), clippy (host and eBPF),
    /// the eBPF build, the fuzz targets, all tests.
    Test(test::Args),
    /// Set up, build, and run the controller on deploy/examples with demo backends.
    Demo(demo::Args),
    /// Benchmark ingress against nginx on this machine and print the ratios.
    Bench(bench::Args),
    /// Run one fuzz target for a while (cargo-fuzz on nightly).
    Fuzz(fuzz::Args),
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup(args) => setup::run(&args),
        Task::BuildEbpf(args) => build_ebpf::run(&args).map(|_| ()),
        Task::Build(args) => build::run(&args),
        Task::ClippyEbpf(args) => clippy_ebpf::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Demo(args) => demo::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Fuzz(args) => fuzz::run(&args),
    }
}
