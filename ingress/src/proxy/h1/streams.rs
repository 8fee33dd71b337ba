//! Kept-alive upstream connections for the fast path: plain TCP streams, each with the read
//! buffer it came back with, one idle list per endpoint.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use bytes::BytesMut;
use futures_util::FutureExt;
use tokio::net::TcpStream;

use crate::proxy::pool::{self, PoolKey, PoolSettings};
use crate::proxy::upstream::UpstreamError;

/// An upstream connection checked out for one request.
pub struct Upstream {
    pub stream: TcpStream,
    pub buf: BytesMut,
    /// It served a request before, so a failure before any answer may only mean the upstream
    /// closed it while it sat idle.
    pub reused: bool,
}

struct Idle {
    stream: TcpStream,
    buf: BytesMut,
    since: Instant,
}

pub struct StreamPool {
    idle: Mutex<HashMap<PoolKey, Vec<Idle>, foldhash::fast::RandomState>>,
    settings: PoolSettings,
}

impl StreamPool {
    pub fn new(settings: PoolSettings) -> Self {
        Self {
            idle: Mutex::new(HashMap::default()),
            settings,
        }
    }

    /// An idle connection that is still open, or a new one.
    pub async fn checkout(&self, key: &PoolKey, now: Instant) -> Result<Upstream, UpstreamError> {
        while let Some(idle) = self.pop(key) {
            if now.saturating_duration_since(idle.since) < self.settings.idle_timeout
                && still_open(&idle.stream)
            {
                return Ok(Upstream {
                    stream: idle.stream,
                    buf: idle.buf,
                    reused: true,
                });
            }
        }
        self.connect(key).await
    }

    pub async fn connect(&self, key: &PoolKey) -> Result<Upstream, UpstreamError> {
        Ok(Upstream {
            stream: pool::open(key, self.settings.connect_timeout).await?,
            buf: BytesMut::new(),
            reused: false,
        })
    }

    /// Takes back a connection whose last response was read to its end and nothing more.
    pub fn checkin(&self, key: &PoolKey, upstream: Upstream, now: Instant) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = match idle.get_mut(key) {
            Some(list) => list,
            None => idle.entry(key.clone()).or_default(),
        };
        if list.len() < self.settings.max_idle_per_endpoint {
            list.push(Idle {
                stream: upstream.stream,
                buf: upstream.buf,
                since: now,
            });
        }
    }

    fn pop(&self, key: &PoolKey) -> Option<Idle> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.get_mut(key).and_then(Vec::pop)
    }

    /// Idle connections held right now, for tests and metrics.
    pub fn idle_count(&self) -> usize {
        self.idle
            .lock()
            .map(|i| i.values().map(Vec::len).sum())
            .unwrap_or(0)
    }
}

/// An idle connection has nothing to say: if the reactor saw it become readable, the upstream
/// closed it (or sent something unasked). Costs a syscall only when readiness is set.
fn still_open(stream: &TcpStream) -> bool {
    match stream.readable().now_or_never() {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(())) => {
            let mut byte = [0u8; 1];
            matches!(stream.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
        }
    }
}
