//! The listener and its lifecycle: start on a port the OS picks, stop (the API is down,
//! every connection is cut), resume on the same port, restart with or without state.

use std::convert::Infallible;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::faults::Faults;
use super::handlers;
use super::kubeconfig;
use super::log::RequestLog;
use super::store::Store;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("binding the test API server to {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("writing kubeconfig {path}: {source}")]
    Kubeconfig { path: PathBuf, source: io::Error },
    #[error("building a kube client: {0}")]
    Client(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Loopback port to listen on; 0 lets the OS choose.
    pub port: u16,
    /// Changes kept for watches to resume from; older resourceVersions get 410 Expired.
    pub history_limit: usize,
    /// How often watches that allow bookmarks get one.
    pub bookmark_interval: Duration,
    /// Refuse namespaced creates into a missing namespace (404), like a real cluster,
    /// instead of creating the namespace.
    pub strict_namespaces: bool,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
    /// Reported as Kubernetes `1.<minor_version>.0` by `/version`. Version-dispatching
    /// kubectl packages (Google Cloud SDK's) pick their client by this.
    pub minor_version: u16,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            port: 0,
            history_limit: 10_000,
            bookmark_interval: Duration::from_secs(1),
            strict_namespaces: false,
            max_body_bytes: 3 * 1024 * 1024,
            minor_version: super::discovery::DEFAULT_MINOR,
        }
    }
}

/// What a restart does besides cutting every connection and listening again.
#[derive(Debug, Clone, Default)]
pub struct RestartOptions {
    /// Start from an empty store (plus the default namespaces).
    pub wipe_state: bool,
    /// Forget the change history, so a watch from any earlier resourceVersion gets 410 and
    /// clients must relist. Implied by `wipe_state`.
    pub reset_history: bool,
    /// How long the port stays closed.
    pub downtime: Duration,
}

/// What request handlers share.
pub(super) struct Shared {
    pub store: Store,
    pub faults: Faults,
    pub log: RequestLog,
    pub options: ServerOptions,
    pub addr: SocketAddr,
}

struct Serving {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A running test API server. Dropping it stops it.
pub struct TestApiServer {
    shared: Arc<Shared>,
    serving: Mutex<Option<Serving>>,
}

impl TestApiServer {
    /// Starts on a loopback port chosen by the OS.
    pub async fn start() -> Result<Self> {
        Self::start_with(ServerOptions::default()).await
    }

    pub async fn start_with(options: ServerOptions) -> Result<Self> {
        // kube-rs builds a TLS connector even for http:// servers, and with both rustls
        // providers compiled into the workspace rustls cannot pick one by itself. Installing
        // one is a no-op if the process already has a default.
        let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
        let listener = bind(SocketAddr::from((Ipv4Addr::LOCALHOST, options.port)))?;
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, options.port)),
            source,
        })?;
        let shared = Arc::new(Shared {
            store: Store::new(options.history_limit),
            faults: Faults::default(),
            log: RequestLog::default(),
            options,
            addr,
        });
        let server = Self {
            shared,
            serving: Mutex::new(None),
        };
        server.serve(listener);
        info!(%addr, "test API server listening");
        Ok(server)
    }

    fn serving(&self) -> MutexGuard<'_, Option<Serving>> {
        self.serving.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn serve(&self, listener: TcpListener) {
        let stop = CancellationToken::new();
        let task = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&self.shared),
            stop.clone(),
        ));
        *self.serving() = Some(Serving { stop, task });
    }

    pub fn addr(&self) -> SocketAddr {
        self.shared.addr
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.shared.addr)
    }

    /// The objects, for assertions that bypass the HTTP API.
    pub fn store(&self) -> &Store {
        &self.shared.store
    }

    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    pub fn requests(&self) -> &RequestLog {
        &self.shared.log
    }

    pub fn is_running(&self) -> bool {
        self.serving().is_some()
    }

    /// The API goes down: the listener closes and every open connection (watches included)
    /// is cut. State is kept.
    pub async fn stop(&self) {
        let serving = self.serving().take();
        if let Some(Serving { stop, task }) = serving {
            stop.cancel();
            if let Err(err) = task.await {
                warn!(%err, "test API server task ended badly");
            }
            info!(addr = %self.shared.addr, "test API server stopped");
        }
    }

    /// Listens again on the same port after [`stop`](Self::stop). No-op if running.
    pub async fn resume(&self) -> Result<()> {
        if self.is_running() {
            return Ok(());
        }
        let addr = self.shared.addr;
        let mut attempt = 0;
        let listener = loop {
            match bind(addr) {
                Ok(listener) => break listener,
                // The old socket can take a moment to be released; anything else is final.
                Err(Error::Bind { source, .. })
                    if source.kind() == io::ErrorKind::AddrInUse && attempt < 50 =>
                {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(err) => return Err(err),
            }
        };
        self.serve(listener);
        info!(%addr, "test API server resumed");
        Ok(())
    }

    /// Stops, optionally forgets history or state, waits `downtime`, and listens again on
    /// the same port.
    pub async fn restart(&self, options: RestartOptions) -> Result<()> {
        self.stop().await;
        if options.wipe_state {
            self.shared.store.wipe();
        } else if options.reset_history {
            self.shared.store.reset_history();
        }
        if !options.downtime.is_zero() {
            tokio::time::sleep(options.downtime).await;
        }
        self.resume().await
    }

    /// A kubeconfig document pointing at this server, default namespace `default`.
    pub fn kubeconfig(&self) -> String {
        kubeconfig::document(&self.url(), "default")
    }

    /// Writes [`kubeconfig`](Self::kubeconfig) to `path`.
    pub fn write_kubeconfig(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.kubeconfig()).map_err(|source| Error::Kubeconfig {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A kube-rs client configuration for this server.
    pub fn kube_config(&self) -> Result<kube::Config> {
        let uri: http::Uri = self
            .url()
            .parse()
            .map_err(|e: http::uri::InvalidUri| Error::Client(e.to_string()))?;
        Ok(kube::Config::new(uri))
    }

    pub fn client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.kube_config()?).map_err(|e| Error::Client(e.to_string()))
    }
}

impl Drop for TestApiServer {
    fn drop(&mut self) {
        if let Some(serving) = self.serving().take() {
            serving.stop.cancel();
        }
    }
}

fn bind(addr: SocketAddr) -> Result<TcpListener> {
    let err = |source| Error::Bind { addr, source };
    let socket = TcpSocket::new_v4().map_err(err)?;
    // Rebinding the same port after a stop must not wait for TIME_WAIT connections.
    socket.set_reuseaddr(true).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(1024).map_err(err)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, stop: CancellationToken) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(serve_connection(stream, peer, Arc::clone(&shared)));
                }
                Err(err) => {
                    // Out of file descriptors and the like: back off rather than spin.
                    warn!(%err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    // Aborting the tasks drops their sockets: clients see the connections reset mid-flight.
    connections.shutdown().await;
}

async fn serve_connection(stream: TcpStream, peer: SocketAddr, shared: Arc<Shared>) {
    let service = service_fn(move |req| {
        let shared = Arc::clone(&shared);
        async move { Ok::<_, Infallible>(handlers::handle(&shared, req).await) }
    });
    if let Err(err) = http1::Builder::new()
        .serve_connection(TokioIo::new(stream), service)
        .await
    {
        debug!(%peer, %err, "connection ended with an error");
    }
}
