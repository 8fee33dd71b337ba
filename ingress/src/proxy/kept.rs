//! Idle HTTP/1.1 client connections kept for the next bodiless request to the same place: the
//! auth services' (`auth-keepalive`, `auth_client.rs`) and the error backends'
//! (`custom-http-errors` pages, `phase/error_page.rs`).
//!
//! ```text
//!   checkout(key) ── the newest idle connection younger than the timeout and still open ──> reuse
//!   checkin(key)  ── used fewer than `requests` times, room for `connections` ──> kept
//!                 └─ otherwise dropped (hyper closes it)
//! ```
//!
//! Neither sends a request body (nginx's `proxy_pass_request_body off` for the auth location,
//! and an error page is asked with GET or HEAD), so the request type is `Empty`, and the pools
//! of `pool.rs` (built around a client's streamed body) do not fit.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use bytes::Bytes;
use http_body_util::Empty;
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};

pub(crate) use crate::snapshot::annotations::auth::Keepalive;

/// A connection ready for a bodiless request.
pub(crate) type Sender = http1::SendRequest<Empty<Bytes>>;

/// Idle connections by where they go.
pub(crate) struct Kept<K> {
    idle: Mutex<HashMap<K, Vec<Idle>>>,
}

/// An idle connection, and how many requests it carried.
pub(crate) struct Idle {
    pub(crate) sender: Sender,
    pub(crate) used: u32,
    since: Instant,
}

impl<K> Default for Kept<K> {
    fn default() -> Self {
        Self {
            idle: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone> Kept<K> {
    /// An idle connection to `key` that `keepalive` still allows, if there is one; the ones
    /// it no longer allows are dropped on the way.
    pub(crate) fn checkout(&self, key: &K, keepalive: Keepalive) -> Option<Idle> {
        if keepalive.connections == 0 {
            return None;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.get_mut(key)?;
        std::iter::from_fn(|| list.pop()).find(|conn| usable(conn, keepalive))
    }

    /// Keeps `sender`, which has now carried `used` requests, for the next request to `key`,
    /// if `keepalive` allows it.
    pub(crate) fn checkin(&self, key: &K, sender: Sender, used: u32, keepalive: Keepalive) {
        if keepalive.connections == 0 || used >= keepalive.requests || sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(PoisonError::into_inner);
        let list = idle.entry(key.clone()).or_default();
        list.retain(|conn| usable(conn, keepalive));
        if list.len() < keepalive.connections {
            list.push(Idle {
                sender,
                used,
                since: Instant::now(),
            });
        }
    }
}

fn usable(conn: &Idle, keepalive: Keepalive) -> bool {
    conn.since.elapsed() < keepalive.timeout && !conn.sender.is_closed()
}

/// An HTTP/1.1 client connection on `stream`, driven by its own task until the peer closes it
/// or its last [`Sender`] is dropped; `what` names the peer in the debug line that ends it.
pub(crate) async fn handshake<S>(stream: S, what: &'static str) -> Result<Sender, hyper::Error>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::debug!(%err, "{what} connection ended");
        }
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const KEEP_TWO: Keepalive = Keepalive {
        connections: 2,
        requests: 3,
        timeout: Duration::from_secs(60),
    };

    /// A connection whose peer stays open while the returned half is held.
    async fn connection() -> (Sender, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let sender = handshake(ours, "test peer").await.expect("handshake");
        (sender, theirs)
    }

    #[tokio::test]
    async fn keeps_what_the_limits_allow_and_hands_back_the_newest() {
        let kept = Kept::<&str>::default();
        let mut peers = Vec::new();
        for used in [1, 2, 1] {
            let (sender, peer) = connection().await;
            peers.push(peer);
            kept.checkin(&"a", sender, used, KEEP_TWO);
        }
        // Two idle at most: the third found no room.
        let first = kept.checkout(&"a", KEEP_TWO).expect("kept");
        let second = kept.checkout(&"a", KEEP_TWO).expect("kept");
        assert_eq!((first.used, second.used), (2, 1));
        assert!(kept.checkout(&"a", KEEP_TWO).is_none());
        assert!(kept.checkout(&"b", KEEP_TWO).is_none(), "kept by key");

        // A connection that carried `requests` is done; keepalive off keeps nothing.
        let (sender, _peer) = connection().await;
        kept.checkin(&"a", sender, 3, KEEP_TWO);
        let (sender, _peer2) = connection().await;
        let off = Keepalive {
            connections: 0,
            ..KEEP_TWO
        };
        kept.checkin(&"a", sender, 1, off);
        assert!(kept.checkout(&"a", KEEP_TWO).is_none());
    }

    #[tokio::test]
    async fn a_closed_or_stale_connection_is_never_handed_back() {
        let kept = Kept::<&str>::default();
        let (sender, peer) = connection().await;
        kept.checkin(&"a", sender, 1, KEEP_TWO);
        drop(peer);
        // The connection task sees the end of its stream and closes the sender.
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert!(kept.checkout(&"a", KEEP_TWO).is_none(), "closed");

        let (sender, _peer) = connection().await;
        kept.checkin(&"a", sender, 1, KEEP_TWO);
        let stale = Keepalive {
            timeout: Duration::ZERO,
            ..KEEP_TWO
        };
        assert!(
            kept.checkout(&"a", stale).is_none(),
            "older than the timeout"
        );
    }
}
