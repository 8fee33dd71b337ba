//! Accept loops. Each accepted connection gets its own task; the loop itself only accepts, so a
//! slow handshake never delays the next client.
//!
//! Shutdown: the loop stops accepting when told to, then every open connection is asked to
//! finish its in-flight requests (hyper's graceful shutdown) for at most the drain timeout.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::{ConnInfo, Proxy};
use crate::metrics::{ListenerLabels, Metrics};

#[derive(Clone, Debug)]
pub struct HttpSettings {
    pub header_read_timeout: Duration,
    pub max_header_size: usize,
}

/// Builds the HTTP/1.1 + HTTP/2 connection server shared by the listeners.
pub fn http_server(settings: &HttpSettings) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout)
        .max_buf_size(settings.max_header_size.max(8192))
        .keep_alive(true);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_header_list_size(u32::try_from(settings.max_header_size).unwrap_or(u32::MAX))
        .max_concurrent_streams(256);
    builder
}

/// Turns an accepted TCP connection into the stream HTTP is spoken over (plain, or TLS).
pub trait Handshake: Send + Sync + 'static {
    type Io: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static;
    /// `None` closes the connection (the reason is logged and counted by the implementation).
    fn handshake(
        &self,
        stream: TcpStream,
        conn: ConnInfo,
    ) -> impl Future<Output = Option<(Self::Io, ConnInfo)>> + Send;
}

/// Plain HTTP: nothing to do.
pub struct Plain;

impl Handshake for Plain {
    type Io = TokioIo<TcpStream>;
    async fn handshake(&self, stream: TcpStream, conn: ConnInfo) -> Option<(Self::Io, ConnInfo)> {
        Some((TokioIo::new(stream), conn))
    }
}

pub struct Listener<H> {
    pub name: &'static str,
    pub listener: TcpListener,
    pub handshake: Arc<H>,
    pub https: bool,
}

impl<H: Handshake> Listener<H> {
    pub async fn run(
        self,
        proxy: Arc<Proxy>,
        server: Arc<auto::Builder<TokioExecutor>>,
        metrics: Arc<Metrics>,
        stop: CancellationToken,
        drain_timeout: Duration,
    ) {
        let graceful = GracefulShutdown::new();
        let labels = ListenerLabels {
            listener: self.name,
        };
        let local_port = self
            .listener
            .local_addr()
            .map(|a| a.port())
            .unwrap_or_default();
        loop {
            let (stream, peer) = tokio::select! {
                () = stop.cancelled() => break,
                accepted = self.listener.accept() => match accepted {
                    Ok(pair) => pair,
                    Err(err) => {
                        // EMFILE and friends: back off briefly instead of spinning.
                        tracing::warn!(listener = self.name, %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
            };
            let _ = stream.set_nodelay(true);
            metrics.connections.get_or_create(&labels).inc();
            let conn = ConnInfo::new(peer, local_port, self.https);
            let handshake = self.handshake.clone();
            let proxy = proxy.clone();
            let server = server.clone();
            let watcher = graceful.watcher();
            let active = metrics.connections_active.get_or_create(&labels).clone();
            tokio::spawn(async move {
                active.inc();
                if let Some((io, conn)) = handshake.handshake(stream, conn).await {
                    let conn = Arc::new(conn);
                    let service = service_fn(move |req| proxy.clone().handle(req, conn.clone()));
                    let connection = server.serve_connection_with_upgrades(io, service);
                    if let Err(err) = watcher.watch(connection.into_owned()).await {
                        tracing::debug!(%err, "connection ended with an error");
                    }
                }
                active.dec();
            });
        }
        drop(self.listener);
        tracing::info!(
            listener = self.name,
            "stopped accepting; draining open connections"
        );
        if tokio::time::timeout(drain_timeout, graceful.shutdown())
            .await
            .is_err()
        {
            tracing::warn!(
                listener = self.name,
                ?drain_timeout,
                "drain timeout reached; closing remaining connections"
            );
        }
    }
}
