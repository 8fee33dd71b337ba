use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

use ingress::cli::{CheckArgs, CheckOutput, Cli, Command};
use ingress::snapshot::Snapshot;
use ingress::source::manifests;
use ingress::{check, migration};

// The proxy allocates per request (headers, buffers); mimalloc's thread-local free lists cost
// less per allocation than glibc's arenas on this path.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Version) => {
            println!("{}", version());
            Ok(ExitCode::SUCCESS)
        }
        Some(Command::Check(args)) => {
            install_crypto_provider();
            check(&args)
        }
        None => run(cli.run),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn version() -> String {
    let ebpf = if ingress::run::ebpf_object_embedded() {
        "eBPF object embedded"
    } else {
        "userspace-only build: no eBPF object embedded"
    };
    format!("ingress {} ({ebpf})", env!("CARGO_PKG_VERSION"))
}

fn run(args: ingress::cli::RunArgs) -> anyhow::Result<ExitCode> {
    let logging = ingress::telemetry::logging::init(&args.log.settings())?;
    install_crypto_provider();
    // One worker: a current-thread runtime, like one nginx worker, without work-stealing's
    // cross-thread bookkeeping. More: the multi-threaded scheduler.
    let mut runtime = match args.proxy.worker_threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            if n > 0 {
                builder.worker_threads(n);
            }
            builder
        }
    };
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(ingress::run::run(args, &logging))?;
    Ok(ExitCode::SUCCESS)
}

/// Names aws-lc-rs as the process's rustls provider, so no TLS client depends on which provider
/// features Cargo happens to unify into the build (with two linked, rustls would pick none).
fn install_crypto_provider() {
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

fn check(args: &CheckArgs) -> anyhow::Result<ExitCode> {
    let store = match args.source.manifests.as_deref() {
        Some(dir) => manifests::load_dir(dir),
        None => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(ingress::source::kube::list_once(
                args.source.kubeconfig.as_deref(),
                args.watch_namespace.as_deref(),
                args.source.configmap.as_ref(),
            ))?
        }
    };
    let settings = ingress::run::build_settings(
        &args.source,
        &args.tls,
        &args.policy,
        args.policy.global_settings(&args.tls),
    )?;
    let snapshot = Snapshot::build(&store, &settings, 1);
    let report = check::report(&snapshot);
    let migration = migration::report(&store, &snapshot, settings.unsupported_access);
    match args.output {
        CheckOutput::Text => print!(
            "{}{}",
            check::render_text(&report),
            migration::render_text(&migration)
        ),
        CheckOutput::Json => {
            #[derive(serde::Serialize)]
            struct Checked<'a> {
                #[serde(flatten)]
                routes: check::Report<'a>,
                migration: migration::Migration,
            }
            let checked = Checked {
                routes: report,
                migration,
            };
            println!("{}", serde_json::to_string_pretty(&checked)?);
        }
    }
    Ok(if snapshot.has_errors() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
