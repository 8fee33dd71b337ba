//! Runs the in-memory test API server on its own, for poking at it with kubectl or curl:
//!
//! ```text
//! test-apiserver --port 6443 --kubeconfig /tmp/test.kubeconfig &
//! kubectl --kubeconfig /tmp/test.kubeconfig get ingress -A
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use ingress_tests::apiserver::{ServerOptions, TestApiServer};

#[derive(Debug, Parser)]
#[command(about = "In-memory Kubernetes API server for tests")]
struct Args {
    /// Loopback port to listen on (0: let the OS choose).
    #[arg(long, env = "TEST_APISERVER_PORT", default_value_t = 0)]
    port: u16,
    /// Write a kubeconfig pointing at the server here.
    #[arg(long, env = "TEST_APISERVER_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Watch history length; older resourceVersions get 410 Expired.
    #[arg(long, env = "TEST_APISERVER_HISTORY", default_value_t = 10_000)]
    history: usize,
    /// Milliseconds between watch bookmarks.
    #[arg(long, env = "TEST_APISERVER_BOOKMARK_MS", default_value_t = 1000)]
    bookmark_ms: u64,
    /// Kubernetes minor version to report (1.<minor>.0).
    #[arg(long, env = "TEST_APISERVER_MINOR_VERSION", default_value_t = 33)]
    minor_version: u16,
    /// Answer 404 for creates into a missing namespace instead of creating it.
    #[arg(long, env = "TEST_APISERVER_STRICT_NAMESPACES")]
    strict_namespaces: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let options = ServerOptions {
        port: args.port,
        history_limit: args.history,
        bookmark_interval: Duration::from_millis(args.bookmark_ms),
        strict_namespaces: args.strict_namespaces,
        minor_version: args.minor_version,
        ..ServerOptions::default()
    };
    let server = TestApiServer::start_with(options)
        .await
        .context("starting the server")?;
    if let Some(path) = &args.kubeconfig {
        server
            .write_kubeconfig(path)
            .context("writing the kubeconfig")?;
        tracing::info!(path = %path.display(), "kubeconfig written");
    }
    println!("{}", server.url());
    tokio::signal::ctrl_c()
        .await
        .context("waiting for ctrl-c")?;
    server.stop().await;
    Ok(())
}
