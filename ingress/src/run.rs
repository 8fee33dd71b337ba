//! Wiring for `ingress` (the default command): sources → pipeline → published snapshot →
//! proxy listeners, admin listener; then SIGTERM → not ready → stop accepting → drain.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::admin::{Admin, Health};
use crate::cli::RunArgs;
use crate::metrics::Metrics;
use crate::proxy::listener::{self, HttpSettings, Listener, Plain};
use crate::proxy::{Proxy, ProxySettings};
use crate::publish::{Pipeline, Published};
use crate::snapshot::BuildSettings;
use crate::snapshot::class::ClassSelector;
use crate::source::watch;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot listen on {addr} ({what}): {source}")]
    Bind { what: &'static str, addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Watch(#[from] watch::WatchError),
    #[error("no configuration source: pass --manifests DIR")]
    NoSource,
    #[error("cannot install signal handler: {0}")]
    Signal(std::io::Error),
}

/// Whether this binary carries its kernel programs (set by build.rs).
pub fn ebpf_object_embedded() -> bool {
    cfg!(ebpf_embedded)
}

pub async fn run(args: RunArgs) -> Result<(), RunError> {
    if ebpf_object_embedded() {
        tracing::info!(version = env!("CARGO_PKG_VERSION"), "starting; eBPF object embedded");
    } else {
        tracing::warn!(
            version = env!("CARGO_PKG_VERSION"),
            "starting; this is a userspace-only build (no eBPF object embedded: build with `cargo xtask build`)"
        );
    }
    let metrics = Arc::new(Metrics::new(ebpf_object_embedded()));
    let published = Published::new();
    let health = Arc::new(Health::default());
    let stop = CancellationToken::new();

    let admin_addr = SocketAddr::new(args.listen.bind, args.listen.admin_port);
    let admin_listener = bind("admin", admin_addr).await?;
    let admin = Arc::new(Admin { published: published.clone(), metrics: metrics.clone(), health: health.clone() });
    tokio::spawn(admin.serve(admin_listener, stop.clone()));

    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let pipeline = Pipeline {
        settings: BuildSettings {
            class: ClassSelector {
                ingress_class: args.source.ingress_class.clone(),
                controller_class: args.source.controller_class.clone(),
            },
        },
        published: published.clone(),
        metrics: metrics.clone(),
        debounce: args.proxy.debounce,
        max_delay: args.proxy.debounce * 5,
    };
    tokio::spawn(pipeline.run(events_rx));
    let _dir_watch = match &args.source.manifests {
        Some(dir) => watch::start(dir, events_tx)?,
        None => return Err(RunError::NoSource),
    };

    let proxy = Arc::new(Proxy::new(
        published.clone(),
        metrics.clone(),
        ProxySettings {
            connect_timeout: args.proxy.upstream_connect_timeout,
            response_timeout: args.proxy.upstream_response_timeout,
            access_log: args.log.access_log,
            https_port: args.listen.https_port,
        },
    ));
    let server = Arc::new(listener::http_server(&HttpSettings {
        header_read_timeout: args.proxy.header_read_timeout,
        max_header_size: args.proxy.max_header_size,
    }));
    let http_addr = SocketAddr::new(args.listen.bind, args.listen.http_port);
    let http = Listener { name: "http", listener: bind("http", http_addr).await?, handshake: Arc::new(Plain), https: false };
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(http.run(proxy.clone(), server.clone(), metrics.clone(), stop.clone(), args.proxy.drain_timeout));
    health.set_listening();
    tracing::info!(http = %http_addr, admin = %admin_addr, "listening");

    wait_for_shutdown_signal().await?;
    tracing::info!(drain_timeout = ?args.proxy.drain_timeout, "shutting down: readiness off, draining");
    health.set_draining();
    stop.cancel();
    while tasks.join_next().await.is_some() {}
    tracing::info!("drained; exiting");
    Ok(())
}

async fn bind(what: &'static str, addr: SocketAddr) -> Result<TcpListener, RunError> {
    // A restarted pod may find its previous sockets in TIME_WAIT; SO_REUSEADDR lets it bind.
    let socket = match addr {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
    }
    .map_err(|source| RunError::Bind { what, addr, source })?;
    socket.set_reuseaddr(true).map_err(|source| RunError::Bind { what, addr, source })?;
    socket.bind(addr).map_err(|source| RunError::Bind { what, addr, source })?;
    socket.listen(4096).map_err(|source| RunError::Bind { what, addr, source })
}

async fn wait_for_shutdown_signal() -> Result<(), RunError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(RunError::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(RunError::Signal)?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
