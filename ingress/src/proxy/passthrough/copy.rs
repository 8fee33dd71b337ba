//! The userspace copy: both directions pumped through the proxy, used in userspace mode and
//! when a splice cannot be set up.
//!
//! ```text
//!   prefix ─► upstream                        the client's bytes read before routing
//!   client ─read─► buf ─write─► upstream      each direction on its own, in one task
//!   upstream ─read─► buf ─write─► client
//!   EOF from one side    → shutdown(write) on the other; the other direction goes on
//!   read error on a side → that side reset: RST the other
//!   write error          → the receiving side reset: RST the sender
//!   nothing read for the idle timeout → close both
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::gate::SpliceEnd;

/// The first read buffer; it doubles while reads fill it, up to `MAX_BUF`, so idle connections
/// stay small and bulk ones make few system calls.
const FIRST_BUF: usize = 16 * 1024;
const MAX_BUF: usize = 256 * 1024;

/// Which socket failed, so the other one is the one to reset.
#[derive(Clone, Copy, Debug)]
enum Broken {
    Client,
    Upstream,
}

/// Copies until both directions end, one side fails, or nothing moves for `idle`. `prefix` goes
/// to the upstream first. `bytes` counts (client → upstream, upstream → client).
pub async fn run(
    mut client: TcpStream,
    mut upstream: TcpStream,
    prefix: &[u8],
    idle: Duration,
    bytes: &[Counter; 2],
) -> SpliceEnd {
    let activity = Activity::new();
    let end = {
        let (mut client_rx, mut client_tx) = client.split();
        let (mut upstream_rx, mut upstream_tx) = upstream.split();
        let [to_upstream, to_client] = bytes;
        let work = async {
            if !prefix.is_empty() {
                upstream_tx
                    .write_all(prefix)
                    .await
                    .map_err(|_| Broken::Upstream)?;
                to_upstream.inc_by(prefix.len() as u64);
            }
            let up = pump(
                &mut client_rx,
                &mut upstream_tx,
                (Broken::Client, Broken::Upstream),
                to_upstream,
                &activity,
            );
            let down = pump(
                &mut upstream_rx,
                &mut client_tx,
                (Broken::Upstream, Broken::Client),
                to_client,
                &activity,
            );
            tokio::try_join!(up, down).map(|_| ())
        };
        tokio::select! {
            result = work => match result {
                Ok(()) => SpliceEnd::Closed,
                Err(Broken::Client) => SpliceEnd::ClientReset,
                Err(Broken::Upstream) => SpliceEnd::UpstreamReset,
            },
            () = activity.expired(idle) => SpliceEnd::Idle,
        }
    };
    if matches!(end, SpliceEnd::ClientReset | SpliceEnd::UpstreamReset) {
        for stream in [&client, &upstream] {
            let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
        }
    }
    end
}

/// One direction: read, write, count; at EOF, half-close the writer.
async fn pump<R, W>(
    reader: &mut R,
    writer: &mut W,
    (from, to): (Broken, Broken),
    counter: &Counter,
    activity: &Activity,
) -> Result<(), Broken>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; FIRST_BUF];
    loop {
        let n = match reader.read(&mut buf).await {
            Ok(0) => break,
            Ok(n) => n,
            Err(_) => return Err(from),
        };
        activity.touch();
        let data = buf.get(..n).unwrap_or_default();
        writer.write_all(data).await.map_err(|_| to)?;
        activity.touch();
        counter.inc_by(n as u64);
        if n == buf.len() && buf.len() < MAX_BUF {
            buf.resize(buf.len() * 2, 0);
        }
    }
    writer.shutdown().await.map_err(|_| to)
}

/// When bytes last moved, shared by both directions of one connection.
struct Activity {
    start: Instant,
    /// Milliseconds after `start`.
    last: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            last: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.store(ms, Ordering::Relaxed);
    }

    /// Completes once nothing has moved for `idle`.
    async fn expired(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}
