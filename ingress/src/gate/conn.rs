//! The per-connection calls the proxy's accept loop makes in eBPF mode.

use std::os::fd::{AsFd, BorrowedFd};
use std::time::Duration;

use ingress_common::{MAX_PROXY_HEADER, MAX_RECORD_LEN};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout, timeout_at};

use super::{Admission, Gate, GateError, KernelVerdict, Result, events, lock, sys};

/// How often a waiting `admit` looks at VERDICTS itself, in case the event was lost (ring
/// buffer full) — counted as `event_lost`, never a hang.
const RECHECK: Duration = Duration::from_millis(100);
/// How long a read waits on readiness before trying anyway: while the socket is in SOCKS its
/// reads can report EAGAIN spuriously, and a consumed wakeup must not strand queued bytes.
const READ_RETRY: Duration = Duration::from_millis(5);
/// Bytes already queued behind the first record that are read before leaving SOCKS (leaving
/// discards whatever is still queued there).
const DRAIN_LIMIT: usize = 64 * 1024;
/// How long bytes TCP has received may take to come out of the kernel's psock before the
/// socket leaves SOCKS anyway.
const DRAIN_SETTLE: Duration = Duration::from_millis(100);

/// What the accept loop learned about a connection: its cookie, and the kernel's verdict when
/// the whole first record is in (as it usually is: the listener defers accept until the
/// client's first bytes arrive).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Screened {
    pub cookie: u64,
    pub early: Option<Admission>,
}

impl Gate {
    /// Reads the socket's cookie and the kernel's verdict if it can have one now, without
    /// waiting and without a map lookup: cheap enough for the accept loop itself.
    ///
    /// With deferred accept the first bytes come with the segment that establishes the
    /// connection, before sock_ops has put the socket in SOCKS, so the stream parser has not
    /// seen them yet: the peek kick makes it run, and the verdict program with it, inside this
    /// call. Its event is then in the ring buffer.
    pub fn screen(&self, socket: BorrowedFd<'_>) -> Result<Screened> {
        let cookie = sys::socket_cookie(socket).map_err(GateError::Socket)?;
        let early = self.early(cookie).or_else(|| {
            sys::peek_kick(socket);
            self.early(cookie)
        });
        Ok(Screened { cookie, early })
    }

    /// Waits for the kernel's verdict on a just-accepted connection. Reads nothing.
    pub async fn admit(&self, stream: &TcpStream) -> Result<Admission> {
        let screened = self.screen(stream.as_fd())?;
        self.admit_screened(stream, screened).await
    }

    /// [`Gate::admit`] for a connection already screened.
    pub async fn admit_screened(
        &self,
        stream: &TcpStream,
        screened: Screened,
    ) -> Result<Admission> {
        if let Some(admission) = screened.early {
            return Ok(admission);
        }
        let shared = &self.shared;
        let cookie = screened.cookie;
        let mut registration = shared.waiters.register(cookie);
        // An event drained between the screen and the registration went to the early table.
        if let Some(admission) = self.early(cookie) {
            return Ok(admission);
        }
        sys::peek_kick(stream.as_fd());
        match self.state(cookie)? {
            // sock_ops writes a pending record before accept() returns; none means not gated.
            // Make sure the kernel stays out of it, so userspace sees a plain socket.
            None => {
                let _ = lock(&shared.socks).remove(&cookie);
                return Ok(Admission::Ungated);
            }
            Some(Some(admission)) => {
                // Its event may be on its way to the early table; nobody would take it there.
                let _ = shared.waiters.take_early(cookie);
                return Ok(admission);
            }
            Some(None) => {}
        }
        let deadline = Instant::now() + shared.timeout;
        loop {
            match timeout_at(
                deadline.min(Instant::now() + RECHECK),
                &mut registration.verdict,
            )
            .await
            {
                Ok(Ok(record)) => {
                    if let Some(admission) = shared.admission(cookie, &record) {
                        return Ok(admission);
                    }
                }
                // The events task is gone; VERDICTS still answers.
                Ok(Err(_)) => {
                    tokio::time::sleep_until(deadline.min(Instant::now() + RECHECK)).await
                }
                Err(_) => {}
            }
            if let Some(Some(admission)) = self.state(cookie)? {
                let _ = shared.waiters.take_early(cookie);
                return Ok(admission);
            }
            if Instant::now() >= deadline {
                return Ok(Admission::Timeout);
            }
        }
    }

    /// A decided verdict for `cookie` from the events drained so far (draining them first).
    fn early(&self, cookie: u64) -> Option<Admission> {
        let shared = &self.shared;
        let record = match shared.waiters.take_early(cookie) {
            Some(record) => record,
            None => {
                events::drain(shared);
                shared.waiters.take_early(cookie)?
            }
        };
        shared.admission(cookie, &record)
    }

    /// After `Pass`, `Passthrough` or `Deferred` (with that verdict): reads exactly the first
    /// record (plus any bytes already queued behind it), takes the socket out of SOCKS and
    /// deletes its records. Hand the bytes to TLS ahead of the socket. Reading before leaving
    /// SOCKS is the point: leaving discards whatever the kernel still holds for the socket.
    pub async fn take_first_record(
        &self,
        stream: &mut TcpStream,
        verdict: &KernelVerdict,
    ) -> Result<Vec<u8>> {
        let cookie = verdict.cookie;
        // Passed before accept: the socket never joined SOCKS, and every byte is still in its
        // receive queue for TLS to read.
        if verdict.record_len == 0 {
            self.forget(cookie);
            return Ok(Vec::new());
        }
        let want = usize::try_from(verdict.record_len)
            .unwrap_or(usize::MAX)
            // With PROXY protocol the message is the header and the record behind it.
            .min((MAX_PROXY_HEADER + MAX_RECORD_LEN) as usize);
        let mut buf = if verdict.delivered {
            let bytes = self.delivered_record(cookie).await?;
            // Nothing has been read from the socket, so tokio may not have seen its first
            // readiness yet: without this, TLS's first write (the alert of a handshake that
            // fails at once) can find it "not writable" and be given up, as the client then
            // sees: a close with no alert. A connected socket is writable at once.
            let _ = timeout(READ_RETRY, stream.writable()).await;
            bytes
        } else {
            self.read_record(stream, want).await?
        };
        self.drain_and_leave(stream, cookie, &mut buf, want).await?;
        Ok(buf)
    }

    /// The first record the kernel delivered in the verdict's event (usually drained already:
    /// the kernel submits the event before userspace can see the verdict).
    async fn delivered_record(&self, cookie: u64) -> Result<Vec<u8>> {
        let deadline = Instant::now() + RECHECK;
        loop {
            if let Some(bytes) = self.shared.waiters.take_record(cookie) {
                return Ok(bytes);
            }
            events::drain(&self.shared);
            if let Some(bytes) = self.shared.waiters.take_record(cookie) {
                return Ok(bytes);
            }
            if Instant::now() >= deadline {
                return Err(GateError::RecordLost);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Reads the first record the kernel left in the socket.
    async fn read_record(&self, stream: &mut TcpStream, want: usize) -> Result<Vec<u8>> {
        let mut buf = vec![0u8; want];
        let deadline = Instant::now() + self.shared.timeout;
        let mut read = 0;
        while read < want {
            // Err here only means the retry interval passed; try the read regardless.
            let _ = timeout(READ_RETRY, stream.readable()).await;
            match stream.try_read(buf.get_mut(read..).unwrap_or_default()) {
                Ok(0) => return Err(GateError::Closed { read, want }),
                Ok(n) => read += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(GateError::Socket(e)),
            }
            if read < want && Instant::now() >= deadline {
                return Err(GateError::RecordTimeout(self.shared.timeout));
            }
        }
        Ok(buf)
    }

    /// Reads whatever else the kernel holds for the socket, takes it out of SOCKS, deletes its
    /// records, and checks that every byte TCP received is accounted for.
    async fn drain_and_leave(
        &self,
        stream: &mut TcpStream,
        cookie: u64,
        buf: &mut Vec<u8>,
        want: usize,
    ) -> Result<()> {
        // Drain with real reads until everything TCP received has come out: tokio's try_read
        // answers from a cached readiness the last read cleared, and bytes still inside the
        // kernel's psock (a client that sends right behind its ClientHello, as TLS 1.3 early
        // data does) are discarded when the socket leaves SOCKS.
        let mut chunk = [0u8; 4096];
        let settle = Instant::now() + DRAIN_SETTLE;
        while buf.len() < want + DRAIN_LIMIT {
            match sys::recv_now(stream.as_fd(), &mut chunk) {
                Ok(n) if n > 0 => {
                    buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
                    continue;
                }
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(GateError::Socket(e)),
            }
            let received = data_received(stream)?;
            if received <= buf.len() as u64 || Instant::now() >= settle {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let removed = lock(&self.shared.socks).remove(&cookie);
        match removed {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(source) => {
                return Err(GateError::Map {
                    name: "SOCKS",
                    source,
                });
            }
        }
        // Out of SOCKS, no program runs for the socket any more: its records are done with.
        self.forget(cookie);
        // Whatever TCP received is now either read or in the plain receive queue; anything
        // else went with the psock, and the stream can no longer be served whole (the caller
        // resets it).
        let received = data_received(stream)?;
        let queued = sys::unread(stream.as_fd()).map_err(GateError::Socket)?;
        // A read position past the data (negative FIONREAD): the kernel counted bytes as read
        // twice, and the next bytes the client sends would never wake us. Refuse to serve it
        // rather than let the handshake time out.
        let queued =
            u64::try_from(queued).map_err(|_| GateError::ReadPastData(queued.unsigned_abs()))?;
        let read = buf.len() as u64;
        if received > read + queued {
            return Err(GateError::Discarded {
                received,
                read,
                queued,
            });
        }
        Ok(())
    }

    /// After `Drop`: resets the connection at once (SO_LINGER 0 + close) without reading. The
    /// kernel deletes its verdict record as the socket closes.
    pub fn reject(&self, stream: TcpStream) -> Result<()> {
        socket2::SockRef::from(&stream)
            .set_linger(Some(Duration::ZERO))
            .map_err(GateError::Socket)?;
        drop(stream);
        Ok(())
    }

    /// Deletes what the kernel kept for a connection whose admission is over (it would also go
    /// when the socket closes, but a served connection can stay open for hours).
    fn forget(&self, cookie: u64) {
        for (name, result) in [
            ("VERDICTS", lock(&self.shared.verdicts).remove(&cookie)),
            (
                "NEXT_MESSAGE",
                lock(&self.shared.next_message).remove(&cookie),
            ),
        ] {
            match result {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => {
                    tracing::debug!(cookie, map = name, error = %e, "could not delete a record")
                }
            }
        }
    }

    /// `None`: no record (not gated); `Some(None)`: gated, pending; else the decision.
    fn state(&self, cookie: u64) -> Result<Option<Option<Admission>>> {
        let record = match lock(&self.shared.verdicts).get(&cookie, 0) {
            Ok(record) => record,
            Err(aya::maps::MapError::KeyNotFound) => return Ok(None),
            Err(source) => {
                return Err(GateError::Map {
                    name: "VERDICTS",
                    source,
                });
            }
        };
        Ok(Some(self.shared.admission(cookie, &record)))
    }
}

/// Data bytes TCP has received on the socket (its FIN, if any, not counted).
fn data_received(stream: &TcpStream) -> Result<u64> {
    let counts = sys::tcp_counts(stream.as_fd()).map_err(GateError::Socket)?;
    Ok(counts
        .received
        .saturating_sub(u64::from(counts.fin_received)))
}
