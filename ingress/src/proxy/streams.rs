//! Kept-alive HTTP/1.1 upstream connections, for HTTP/1.x clients (`h1`) and HTTP/2 ones
//! (`pool`) alike: TCP or TLS streams, each with the read buffer it came back with, one idle
//! list per endpoint and transport (a TLS connection made under one `proxy-ssl-*` policy is
//! never handed to a route with another).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::FutureExt;

use crate::proxy::connect::PoolKey;
use crate::proxy::connect::{Connectors, Transport, UpstreamStream};
use crate::proxy::upstream::UpstreamError;
use crate::publish::PublishHook;
use crate::snapshot::Snapshot;
use crate::snapshot::global::UpstreamKeepalive;
use crate::snapshot::policy::Wire;

/// Bytes asked for per read of a body, in either direction.
pub(crate) const READ_SIZE: usize = 16 * 1024;
/// Largest upstream response head accepted (then 502).
pub(crate) const MAX_RESPONSE_HEAD: usize = 64 * 1024;

/// Per endpoint, the idle connections of each transport (nearly always just one).
type IdleLists = Vec<(Transport, Vec<Idle>)>;

/// An upstream connection checked out for one request.
pub struct Upstream {
    pub stream: UpstreamStream,
    pub buf: BytesMut,
    /// It served a request before, so a failure before any answer may only mean the upstream
    /// closed it while it sat idle.
    pub reused: bool,
}

impl Upstream {
    /// Reads what the upstream has sent so far, without waiting. True if it answered (or
    /// closed) before the request was complete; a `100 Continue` it sent unasked is dropped.
    pub fn answered_early(&mut self) -> bool {
        self.buf.reserve(READ_SIZE);
        match self.stream.try_read_buf(&mut self.buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(err) => return err.kind() != std::io::ErrorKind::WouldBlock,
        }
        let mut storage = [httparse::EMPTY_HEADER; 16];
        let mut head = httparse::Response::new(&mut storage);
        match head.parse(&self.buf) {
            Ok(httparse::Status::Complete(len)) if head.code == Some(100) => {
                bytes::Buf::advance(&mut self.buf, len);
                !self.buf.is_empty()
            }
            // Part of a head: whatever it is, it is an answer.
            _ => true,
        }
    }
}

struct Idle {
    stream: UpstreamStream,
    buf: BytesMut,
    since: Instant,
}

pub struct StreamPool {
    idle: Mutex<HashMap<PoolKey, IdleLists, foldhash::fast::RandomState>>,
    settings: Arc<PoolLimits>,
    connectors: Arc<Connectors>,
}

impl StreamPool {
    pub fn new(settings: Arc<PoolLimits>, connectors: Arc<Connectors>) -> Self {
        Self {
            idle: Mutex::new(HashMap::default()),
            settings,
            connectors,
        }
    }

    /// An idle connection that is still open, or a new one.
    pub async fn checkout(
        &self,
        key: &PoolKey,
        transport: &Transport,
        connect_timeout: Duration,
        now: Instant,
    ) -> Result<Upstream, UpstreamError> {
        while let Some(mut idle) = self.pop(key, transport) {
            if now.saturating_duration_since(idle.since) < self.settings.idle_timeout()
                && still_open(&mut idle.stream)
            {
                return Ok(Upstream {
                    stream: idle.stream,
                    buf: idle.buf,
                    reused: true,
                });
            }
        }
        self.connect(key, transport, connect_timeout).await
    }

    /// A new connection, made within `connect_timeout` (the route's `proxy-connect-timeout`).
    pub async fn connect(
        &self,
        key: &PoolKey,
        transport: &Transport,
        connect_timeout: Duration,
    ) -> Result<Upstream, UpstreamError> {
        let stream = self
            .connectors
            .open(key, transport, Wire::Http1, connect_timeout)
            .await?;
        Ok(Upstream {
            stream,
            buf: BytesMut::new(),
            reused: false,
        })
    }

    /// Takes back a connection whose last response was read to its end and nothing more.
    pub fn checkin(&self, key: &PoolKey, transport: &Transport, upstream: Upstream, now: Instant) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let lists = match idle.get_mut(key) {
            Some(lists) => lists,
            None => idle.entry(key.clone()).or_default(),
        };
        let at = match lists.iter().position(|(t, _)| t == transport) {
            Some(at) => at,
            None => {
                lists.push((transport.clone(), Vec::new()));
                lists.len() - 1
            }
        };
        let Some((_, list)) = lists.get_mut(at) else {
            return;
        };
        if list.len() < self.settings.max_idle_per_endpoint() {
            list.push(Idle {
                stream: upstream.stream,
                buf: upstream.buf,
                since: now,
            });
        }
    }

    fn pop(&self, key: &PoolKey, transport: &Transport) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(key)?
            .iter_mut()
            .find(|(t, _)| t == transport)
            .and_then(|(_, list)| list.pop())
    }

    /// Idle connections held right now, for tests and metrics.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|i| i.values().flatten().map(|(_, list)| list.len()).sum())
            .unwrap_or(0)
    }
}

/// An idle connection has nothing to say: if the reactor saw it become readable, the upstream
/// closed it (or sent something unasked). Costs a syscall only when readiness is set.
fn still_open(stream: &mut UpstreamStream) -> bool {
    match stream.readable().now_or_never() {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(())) => {
            let mut byte = BytesMut::with_capacity(1);
            matches!(stream.try_read_buf(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
    }
}

/// How many idle upstream connections are kept and for how long: the ConfigMap's
/// `upstream-keepalive-connections` and `upstream-keepalive-timeout`, set from each published
/// snapshot by [`PoolLimitsHook`] and read with one atomic load where a pool needs them.
#[derive(Debug)]
pub struct PoolLimits {
    idle_timeout_ms: AtomicU64,
    max_idle_per_endpoint: AtomicUsize,
}

impl PoolLimits {
    pub fn new(keepalive: &UpstreamKeepalive) -> Arc<Self> {
        let limits = Arc::new(Self {
            idle_timeout_ms: AtomicU64::new(0),
            max_idle_per_endpoint: AtomicUsize::new(0),
        });
        limits.set(keepalive);
        limits
    }

    pub fn set(&self, keepalive: &UpstreamKeepalive) {
        let ms = u64::try_from(keepalive.idle_timeout.as_millis()).unwrap_or(u64::MAX);
        self.idle_timeout_ms.store(ms, Ordering::Relaxed);
        self.max_idle_per_endpoint
            .store(keepalive.max_idle, Ordering::Relaxed);
    }

    /// Idle connections older than this are closed rather than reused.
    pub fn idle_timeout(&self) -> Duration {
        Duration::from_millis(self.idle_timeout_ms.load(Ordering::Relaxed))
    }

    /// Idle connections kept per endpoint (and protocol); `0` keeps none.
    pub fn max_idle_per_endpoint(&self) -> usize {
        self.max_idle_per_endpoint.load(Ordering::Relaxed)
    }
}

/// Keeps [`PoolLimits`] in step with the published snapshot's global settings.
pub struct PoolLimitsHook(pub Arc<PoolLimits>);

impl PublishHook for PoolLimitsHook {
    fn before(&self, _new: &Snapshot, _old: &Snapshot) {}

    fn after(&self, new: &Snapshot, _old: &Snapshot) {
        self.0.set(&new.global.keepalive);
    }
}
