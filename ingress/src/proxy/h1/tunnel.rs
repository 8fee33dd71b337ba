//! Protocol upgrades (WebSocket): the request goes to a fresh upstream connection with its
//! `Upgrade`; a `101` turns both connections into one byte tunnel, anything else is an ordinary
//! response.
//!
//! ```text
//!   Upgrade offered ─ every protocol in it allowed by the route? ─ no: forwarded without it
//!        │ (websocket by default; `ingress.rs/upgrades` lists others)
//!   fresh upstream connection → head with `Connection: upgrade` → response head
//!        ├─ 101 for the protocol asked ─> 101 to the client → copy both ways until both sides
//!        │                                 have closed, or neither sent anything for the
//!        │                                 route's read timeout
//!        └─ anything else ───────────────> relayed as a response; that connection is not kept
//! ```
//!
//! The routing rules only hold while the proxy reads requests; after a `101` it reads none. So
//! only protocols an operator allowed may switch (an `h2c` upgrade to a backend that accepts it
//! would otherwise carry any number of unrouted requests).

use crate::proxy::access_log::UpstreamMeter;
use std::time::{Duration, Instant};

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::deadline::Deadline;
use super::response::{self, ResponseContext, ResponseParse};
use super::{Client, MAX_RESPONSE_HEAD, Prepared, READ_SIZE, write_timed};
use crate::proxy::upstream::UpstreamError;
use crate::proxy::{Forward, Outcome};

impl<IO: AsyncRead + AsyncWrite + Unpin> Client<'_, IO> {
    pub(super) async fn upgrade(
        &mut self,
        forward: Forward,
        p: &Prepared,
        ctx: &mut ResponseContext<'_>,
    ) -> (u16, Outcome, bool) {
        let Forward {
            key,
            transport,
            in_flight,
            timeout,
            connect_timeout,
            send_timeout,
            ..
        } = forward;
        self.send_timeout = send_timeout;
        let fail = |this: &mut Self, error: UpstreamError, ctx: &ResponseContext<'_>| {
            let code = error.status();
            response::write_local(&mut this.response, code, None, ctx);
            (code, error)
        };
        self.upstream_due.set(p.forwarded + timeout);
        let connected = tokio::select! {
            up = self.proxy.streams.connect(&key, &transport, connect_timeout) => up,
            () = self.upstream_due.expired() => Err(UpstreamError::ResponseTimeout(timeout)),
        };
        let head = match connected {
            Ok(mut up) => {
                let send_timeout = self.send_timeout;
                match write_timed(
                    &mut up.stream,
                    &self.request,
                    &mut self.upstream_due,
                    send_timeout,
                )
                .await
                {
                    Ok(()) => self.upgrade_head(up, p, timeout, ctx).await,
                    Err(err) => Err(UpstreamError::Protocol(err.to_string())),
                }
            }
            Err(error) => Err(error),
        };
        drop(in_flight);
        let (response, mut up) = match head {
            Ok(pair) => pair,
            Err(error) => {
                let (code, error) = fail(self, error, ctx);
                self.meter.upstream = Some(UpstreamMeter::failed(key.clone(), p.started));
                let outcome = Outcome {
                    upstream: Some(key),
                    error: Some(error),
                    refused: None,
                };
                return (code.as_u16(), outcome, self.write_response().await);
            }
        };
        let status = response.status;
        self.meter.upstream = Some(UpstreamMeter::answered(key.clone(), p.started, status));
        let outcome = Outcome {
            upstream: Some(key),
            error: None,
            refused: None,
        };
        if !response.switching {
            // An ordinary answer: relayed, and the connection is not reused (it was opened
            // for an upgrade and may still expect one).
            let (keep_open, _) = self.relay(response, up, timeout, None).await;
            return (status, outcome, keep_open);
        }
        // 101: the head to the client, then whatever either side sent behind its head.
        if !self.write_response().await {
            return (status, outcome, false);
        }
        let send_timeout = self.proxy.settings.client_send_timeout;
        if !up.buf.is_empty() {
            let early = up.buf.split();
            if write_timed(&mut self.io, &early, &mut self.client_due, send_timeout)
                .await
                .is_err()
            {
                return (status, outcome, false);
            }
        }
        if !self.inbuf.is_empty() {
            let early = self.inbuf.split();
            let upstream_send = self.send_timeout;
            if write_timed(
                &mut up.stream,
                &early,
                &mut self.upstream_due,
                upstream_send,
            )
            .await
            .is_err()
            {
                return (status, outcome, false);
            }
        }
        let moved = copy_both_ways(&mut self.io, &mut up.stream, timeout).await;
        tracing::debug!(peer = %self.conn.peer, upstream = %outcome.upstream.as_ref().map_or_else(String::new, ToString::to_string), ?moved, "upgraded connection ended");
        (status, outcome, false)
    }

    /// Reads the response to an upgrade request into `self.response`.
    async fn upgrade_head(
        &mut self,
        mut up: crate::proxy::streams::Upstream,
        p: &Prepared,
        timeout: Duration,
        ctx: &mut ResponseContext<'_>,
    ) -> Result<(response::Response, crate::proxy::streams::Upstream), UpstreamError> {
        self.upstream_due.set(p.forwarded + timeout);
        loop {
            if !up.buf.is_empty() {
                match response::rewrite(&up.buf, ctx, &mut self.response) {
                    ResponseParse::Complete(r) if r.informational => {
                        up.buf.advance(r.head_len);
                        if !r.withheld && !self.write_response().await {
                            return Err(UpstreamError::Protocol("client went away".into()));
                        }
                        continue;
                    }
                    ResponseParse::Complete(r) => {
                        up.buf.advance(r.head_len);
                        return Ok((r, up));
                    }
                    ResponseParse::Partial if up.buf.len() < MAX_RESPONSE_HEAD => {}
                    ResponseParse::Partial => {
                        return Err(UpstreamError::Protocol("response head too large".into()));
                    }
                    ResponseParse::Invalid(why) => return Err(UpstreamError::Protocol(why.into())),
                }
            }
            up.buf.reserve(READ_SIZE);
            let read = tokio::select! {
                read = up.stream.read_buf(&mut up.buf) => read,
                () = self.upstream_due.expired() => return Err(UpstreamError::ResponseTimeout(timeout)),
            };
            match read {
                Ok(0) => {
                    return Err(UpstreamError::Protocol(
                        "connection closed before a response".into(),
                    ));
                }
                Ok(_) => {}
                Err(err) => return Err(UpstreamError::Protocol(err.to_string())),
            }
        }
    }
}

/// Bytes moved each way, and why the tunnel ended.
#[derive(Debug)]
pub struct Moved {
    pub to_upstream: u64,
    pub to_client: u64,
    pub idle: bool,
}

/// Copies bytes both ways until both sides have closed (a side that closes has its peer's
/// write side shut down, so half-closed protocols work) or nothing moved for `idle`.
pub async fn copy_both_ways<A, B>(a: &mut A, b: &mut B, idle: Duration) -> Moved
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let mut from_a = vec![0u8; READ_SIZE];
    let mut from_b = vec![0u8; READ_SIZE];
    let (mut a_open, mut b_open) = (true, true);
    let mut due = Deadline::new();
    let mut moved = Moved {
        to_upstream: 0,
        to_client: 0,
        idle: false,
    };
    while a_open || b_open {
        due.set(Instant::now() + idle);
        tokio::select! {
            read = a.read(&mut from_a), if a_open => match read {
                Ok(0) | Err(_) => {
                    a_open = false;
                    let _ = b.shutdown().await;
                }
                Ok(n) => {
                    if write_timed(b, &from_a[..n], &mut due, idle).await.is_err() {
                        break;
                    }
                    moved.to_upstream += n as u64;
                }
            },
            read = b.read(&mut from_b), if b_open => match read {
                Ok(0) | Err(_) => {
                    b_open = false;
                    let _ = a.shutdown().await;
                }
                Ok(n) => {
                    if write_timed(a, &from_b[..n], &mut due, idle).await.is_err() {
                        break;
                    }
                    moved.to_client += n as u64;
                }
            },
            () = due.expired() => {
                moved.idle = true;
                break;
            }
        }
    }
    moved
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn copies_both_ways_and_propagates_half_close() {
        let (mut client, mut a) = tokio::io::duplex(1024);
        let (mut b, mut upstream) = tokio::io::duplex(1024);
        let tunnel =
            tokio::spawn(
                async move { copy_both_ways(&mut a, &mut b, Duration::from_secs(5)).await },
            );
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        upstream.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
        upstream.write_all(b"pong").await.unwrap();
        client.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"pong");
        client.shutdown().await.unwrap();
        // The upstream sees the client's end, and can still answer.
        let mut rest = Vec::new();
        upstream.write_all(b"bye").await.unwrap();
        upstream.shutdown().await.unwrap();
        let n = upstream.read_to_end(&mut rest).await.unwrap();
        assert_eq!(n, 0);
        client.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"bye");
        let moved = tunnel.await.unwrap();
        assert_eq!(
            (moved.to_upstream, moved.to_client, moved.idle),
            (4, 7, false)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_idle_tunnel_closes() {
        let (_client, mut a) = tokio::io::duplex(64);
        let (mut b, _upstream) = tokio::io::duplex(64);
        let moved = copy_both_ways(&mut a, &mut b, Duration::from_secs(30)).await;
        assert!(moved.idle);
    }
}
