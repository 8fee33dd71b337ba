//! TLS passthrough spliced in the kernel: userspace connects, writes the client's first record,
//! and from then on only watches the two sockets while `splice_verdict` moves their bytes.
//!
//! ```text
//!   splice(client, upstream, prefix)
//!     SPLICE_STATE[both] = {}                             the kernel's view of each stream
//!     SPLICES[upstream] = {peer: client, consumed: 0}     its bytes go straight to the client
//!     SPLICES[client]   = {peer: upstream, UNARMED}       its bytes come to userspace for now
//!     SPLICE_SOCKS += upstream, client
//!     write prefix to upstream         (nothing is redirected to it yet, so it goes first)
//!   run()                (both sockets leave tokio's reactor for a private epoll: see Watch)
//!     arm the client with 0: its bytes go straight to the upstream from now on
//!     readable with data → what the kernel handed us: write it to the peer, then arm the side
//!                          with the bytes forwarded (the kernel redirects once it has caught up)
//!     EOF                → wait until the peer has written everything this side received
//!                          (TCP_INFO + SIOCOUTQ), then shutdown(write) on the peer
//!     error / reset      → RST the peer
//!     nothing received on either side for the idle timeout → close both
//!     the kernel marked a side broken (a retransmission it could not trim) → RST both
//!   drop: SPLICE_SOCKS entries removed (the kernel stops running the verdict for them), then
//!         SPLICES and SPLICE_STATE, then the sockets closed
//! ```
//!
//! Ordering: userspace writes to a socket only while nothing is redirected to it (the prefix
//! before the client is armed, catch-up bytes while the kernel holds the side back), so the
//! two paths never interleave.

use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use aya::maps::{HashMap as BpfHashMap, Map, MapData, SockHash};
use ingress_common::{SpliceEntry, SpliceState};
use rustix::event::epoll;
use tokio::io::AsyncWriteExt;
use tokio::io::unix::AsyncFd;
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};

use super::sys::{self, TcpCounts};
use super::{Gate, GateError, Result, Shared, lock, pins};

/// How often a quiet splice looks at its byte counts (for metrics and the idle timeout) and
/// retries a read, in case a wakeup was consumed by a spurious EAGAIN.
const TICK: Duration = Duration::from_secs(1);
/// How soon a pending half-close looks again whether the kernel has sent everything.
const FLUSH_FIRST: Duration = Duration::from_millis(1);
const FLUSH_MAX: Duration = Duration::from_millis(50);
/// Bytes read at a time when the kernel hands data to userspace.
const CATCH_UP_BUF: usize = 16 * 1024;

const CLIENT: usize = 0;
const UPSTREAM: usize = 1;

/// The setup step that failed, for the fallback counter's label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpliceStep {
    /// Reading a socket's cookie or TCP counters.
    Socket,
    /// Writing SPLICE_STATE or SPLICES (full, or a map error).
    Entries,
    /// Putting the upstream socket into SPLICE_SOCKS.
    UpstreamSocket,
    /// Putting the client socket into SPLICE_SOCKS.
    ClientSocket,
    /// Writing the first record to the upstream: the upstream failed, not the kernel.
    Prefix,
    /// This kernel's sockmap can send a partly sent message twice (see [`kernel_fit`]).
    Kernel,
}

impl SpliceStep {
    pub fn as_str(&self) -> &'static str {
        match self {
            SpliceStep::Socket => "socket",
            SpliceStep::Entries => "entries",
            SpliceStep::UpstreamSocket => "upstream_socket",
            SpliceStep::ClientSocket => "client_socket",
            SpliceStep::Prefix => "prefix",
            SpliceStep::Kernel => "kernel",
        }
    }
}

/// A splice that could not be set up. The kernel holds nothing of either socket any more.
/// Unless `step` is [`SpliceStep::Prefix`], nothing was written to the upstream, so the
/// connection can start over in userspace with the same prefix.
pub struct Unspliced {
    pub client: TcpStream,
    pub upstream: TcpStream,
    pub step: SpliceStep,
    pub error: GateError,
}

impl std::fmt::Debug for Unspliced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Unspliced")
            .field("step", &self.step)
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

/// Bytes that moved since the last report, by direction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub to_upstream: u64,
    pub to_client: u64,
}

/// How a splice ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SpliceEnd {
    /// Both sides closed (FIN), each after the other had received everything.
    Closed,
    /// The client reset or failed; the upstream was reset.
    ClientReset,
    /// The upstream reset or failed; the client was reset.
    UpstreamReset,
    /// Nothing moved for the idle timeout; both were closed.
    Idle,
}

impl SpliceEnd {
    pub fn as_str(&self) -> &'static str {
        match self {
            SpliceEnd::Closed => "closed",
            SpliceEnd::ClientReset => "client_reset",
            SpliceEnd::UpstreamReset => "upstream_reset",
            SpliceEnd::Idle => "idle",
        }
    }
}

/// Whether this kernel's sockmap delivers redirected bytes once each.
///
/// `sk_psock_backlog` sends a redirected message out of the peer socket; when the peer's send
/// buffer fills part way through, it saves how far it got and retries later. From "bpf,
/// sockmap: Improved check for empty queue" (405df89dd52c) until "bpf, sockmap: fix duplicated
/// data transmission" (3b4f14b7) the retry overwrote the saved offset and sent the whole
/// message again: the peer receives a run of bytes twice, in the middle of a TLS record, and
/// its TLS stack fails on a bad record. That takes a full send buffer, so it shows under load
/// and with slow receivers. Kernels known to carry the fix, by stable line: 5.15.186, 6.1.142,
/// 6.6.94, 6.12.34, 6.15.3, and everything from 6.16; lines that left support unfixed (6.8,
/// 6.11, 6.13, 6.14, …) never got it. Before 5.15 the defect did not exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelFit {
    Splices,
    /// The version, for the log and the fallback's error.
    Duplicates(aya::util::KernelVersion),
}

/// [`KernelFit`] for the running kernel. A version that cannot be read is assumed fit: the
/// gate itself needs a kernel new enough to report one, so this does not happen in practice.
pub fn kernel_fit() -> KernelFit {
    match aya::util::KernelVersion::current() {
        Ok(version) => {
            let code = version.code();
            // LINUX_VERSION_CODE: major << 16 | minor << 8 | patch (capped at 255).
            let (major, minor, patch) = (code >> 16, (code >> 8) & 0xff, code & 0xff);
            if redirects_once(major, minor, patch) {
                KernelFit::Splices
            } else {
                KernelFit::Duplicates(version)
            }
        }
        Err(_) => KernelFit::Splices,
    }
}

/// See [`KernelFit`]: `false` for a version whose `sk_psock_backlog` may resend a partly sent
/// message.
fn redirects_once(major: u32, minor: u32, patch: u32) -> bool {
    match (major, minor) {
        (0..=4, _) | (5, 0..=14) => true,
        (5, 15) => patch >= 186,
        (6, 1) => patch >= 142,
        (6, 6) => patch >= 94,
        (6, 12) => patch >= 34,
        (6, 15) => patch >= 3,
        (6, 16..) | (7.., _) => true,
        // Every other 5.x and 6.x line either had the defect when it left support or is not
        // known to have been fixed.
        _ => false,
    }
}

/// Two sockets whose bytes the kernel moves. Dropping it (including when its task is
/// cancelled) removes every map entry, then closes both sockets.
pub struct Splice {
    // Field order is drop order: the entries go before the sockets close.
    entries: Entries,
    client: TcpStream,
    upstream: TcpStream,
    /// `written` of each socket before anything was written to it here.
    base_written: [u64; 2],
    /// Bytes userspace read from each side since it joined SPLICE_SOCKS.
    consumed: [u64; 2],
}

/// The kernel state of one splice, removed on drop.
struct Entries {
    shared: Arc<Shared>,
    cookies: [u64; 2],
    in_splices: bool,
    in_socks: [bool; 2],
}

impl Gate {
    /// Splices a passthrough client to its upstream: puts both into SPLICE_SOCKS, writes
    /// `prefix` (the client's bytes read so far) to the upstream, and returns the splice for
    /// [`Splice::run`]. `upstream` must be freshly connected, with nothing written to it.
    pub async fn splice(
        &self,
        client: TcpStream,
        upstream: TcpStream,
        prefix: &[u8],
    ) -> Result<Splice, Box<Unspliced>> {
        let fail = |client, upstream, step, error| {
            Box::new(Unspliced {
                client,
                upstream,
                step,
                error,
            })
        };
        if let KernelFit::Duplicates(version) = self.shared.splice_kernel {
            return Err(fail(
                client,
                upstream,
                SpliceStep::Kernel,
                GateError::SpliceDuplicates(version.to_string()),
            ));
        }
        let setup = (|| {
            let cookies = [
                sys::socket_cookie(client.as_fd())?,
                sys::socket_cookie(upstream.as_fd())?,
            ];
            let base = [
                sys::tcp_counts(client.as_fd())?.written,
                sys::tcp_counts(upstream.as_fd())?.written,
            ];
            Ok::<_, std::io::Error>((cookies, base))
        })();
        let (cookies, base_written) = match setup {
            Ok(found) => found,
            Err(e) => {
                return Err(fail(
                    client,
                    upstream,
                    SpliceStep::Socket,
                    GateError::Socket(e),
                ));
            }
        };
        let mut splice = Splice {
            entries: Entries {
                shared: self.shared.clone(),
                cookies,
                in_splices: false,
                in_socks: [false; 2],
            },
            client,
            upstream,
            base_written,
            consumed: [0; 2],
        };
        if let Err((step, error)) = splice.install() {
            let (client, upstream) = splice.dismantle();
            return Err(fail(client, upstream, step, error));
        }
        let write = timeout(self.shared.timeout, splice.upstream.write_all(prefix)).await;
        let error = match write {
            Ok(Ok(())) => return Ok(splice),
            Ok(Err(e)) => GateError::Socket(e),
            Err(_) => GateError::Socket(std::io::ErrorKind::TimedOut.into()),
        };
        let (client, upstream) = splice.dismantle();
        Err(fail(client, upstream, SpliceStep::Prefix, error))
    }
}

impl Splice {
    /// The map steps, each undone by `Entries::drop` if a later one fails. The upstream goes in
    /// first: it has been sent nothing, so it has nothing to say until the prefix is written.
    fn install(&mut self) -> Result<(), (SpliceStep, GateError)> {
        let entries = &mut self.entries;
        let [client, upstream] = entries.cookies;
        let map_err = |name, source| GateError::Map { name, source };
        {
            let mut state = lock(&entries.shared.splice_state);
            let mut splices = lock(&entries.shared.splices);
            entries.in_splices = true;
            for cookie in [upstream, client] {
                state
                    .insert(cookie, SpliceState::default(), 0)
                    .map_err(|e| (SpliceStep::Entries, map_err("SPLICE_STATE", e)))?;
            }
            let arm = SpliceEntry {
                peer: client,
                consumed: 0,
            };
            let hold = SpliceEntry {
                peer: upstream,
                consumed: SpliceEntry::UNARMED,
            };
            splices
                .insert(upstream, arm, 0)
                .and_then(|()| splices.insert(client, hold, 0))
                .map_err(|e| (SpliceStep::Entries, map_err("SPLICES", e)))?;
        }
        let mut socks = lock(&entries.shared.splice_socks);
        socks
            .insert(upstream, self.upstream.as_fd(), 0)
            .map_err(|e| (SpliceStep::UpstreamSocket, map_err("SPLICE_SOCKS", e)))?;
        entries.in_socks[UPSTREAM] = true;
        socks
            .insert(client, self.client.as_fd(), 0)
            .map_err(|e| (SpliceStep::ClientSocket, map_err("SPLICE_SOCKS", e)))?;
        entries.in_socks[CLIENT] = true;
        Ok(())
    }

    /// Takes the kernel state down and hands the sockets back.
    fn dismantle(self) -> (TcpStream, TcpStream) {
        let Splice {
            entries,
            client,
            upstream,
            ..
        } = self;
        drop(entries);
        (client, upstream)
    }

    /// Watches the splice until it ends, reporting bytes moved to `progress` now and then and
    /// at the end. See the module documentation for what happens on each event.
    pub async fn run(self, idle: Duration, mut progress: impl FnMut(Progress)) -> SpliceEnd {
        let mut watch = match Watch::new(self) {
            Ok(watch) => watch,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch a spliced connection; closing it");
                return SpliceEnd::ClientReset;
            }
        };
        let mut meter = Meter::new(idle);
        // The client was held until the first record had gone ahead of it; it goes straight
        // to the upstream from here unless the kernel already handed userspace some of it.
        // Arming both also learns whether either side has bytes waiting in userspace.
        watch.arm(CLIENT);
        watch.arm(UPSTREAM);
        let mut end = watch.catch_up_all(idle).await.err();
        let mut flush_wait = FLUSH_FIRST;
        while end.is_none() {
            end = watch
                .step(idle, &mut flush_wait, &mut meter, &mut progress)
                .await;
        }
        let end = end.unwrap_or(SpliceEnd::Closed);
        meter.report(&watch, &mut progress);
        if matches!(end, SpliceEnd::ClientReset | SpliceEnd::UpstreamReset) {
            for stream in &watch.streams {
                let _ = socket2::SockRef::from(stream).set_linger(Some(Duration::ZERO));
            }
        }
        end
    }
}

/// A splice being watched. Its sockets are out of tokio's reactor: registered there, every
/// segment the kernel redirects would still wake this process (the socket's data-ready
/// callback runs after each verdict). Instead a private epoll instance listens for only what
/// userspace acts on, and is itself the one descriptor tokio polls:
///
/// ```text
///   always        EPOLLRDHUP (FIN), EPOLLERR / EPOLLHUP (reset)
///   EPOLLIN       while the kernel may be handing this side's bytes to userspace
///   EPOLLOUT      while a catch-up write to this side waits for room
/// ```
struct Watch {
    // Field order is drop order: the entries go before the sockets close.
    entries: Entries,
    streams: [std::net::TcpStream; 2],
    poller: Poller,
    /// `written` of each socket before anything was written to it here.
    base_written: [u64; 2],
    /// Bytes userspace read from each side since it joined SPLICE_SOCKS.
    consumed: [u64; 2],
    sides: [Side; 2],
    /// Events seen but not acted on yet (gathered while waiting for something else).
    pending: [u32; 2],
}

impl Watch {
    fn new(splice: Splice) -> std::io::Result<Watch> {
        let Splice {
            entries,
            client,
            upstream,
            base_written,
            consumed,
        } = splice;
        let streams = [client.into_std()?, upstream.into_std()?];
        let poller = Poller::new([streams[CLIENT].as_fd(), streams[UPSTREAM].as_fd()])?;
        Ok(Watch {
            entries,
            streams,
            poller,
            base_written,
            consumed,
            sides: [Side::default(), Side::default()],
            pending: [0; 2],
        })
    }

    /// Waits for something to happen and acts on it; `Some` once the splice is over.
    async fn step(
        &mut self,
        idle: Duration,
        flush_wait: &mut Duration,
        meter: &mut Meter,
        progress: &mut impl FnMut(Progress),
    ) -> Option<SpliceEnd> {
        if self
            .sides
            .iter()
            .all(|s| !s.reading && s.flush_to.is_none())
        {
            return Some(SpliceEnd::Closed);
        }
        let flushing = self.sides.iter().any(|s| s.flush_to.is_some());
        let nap = if flushing { *flush_wait } else { TICK };
        if let Err(e) = self.listen() {
            return Some(self.unwatchable(&e));
        }
        match self.poller.wait(Instant::now() + nap).await {
            Ok(events) => self.note(events),
            Err(e) => return Some(self.unwatchable(&e)),
        }
        let outcome = if self.pending == [0, 0] {
            // A quiet tick: try the reads anyway, in case bytes came to userspace unannounced.
            self.catch_up_all(idle).await
        } else {
            self.on_events(idle).await
        };
        if let Err(end) = outcome {
            return Some(end);
        }
        match self.finish_flushes(idle).await {
            Ok(true) => *flush_wait = FLUSH_FIRST,
            Ok(false) => *flush_wait = (*flush_wait * 2).min(FLUSH_MAX),
            Err(end) => return Some(end),
        }
        meter.observe(self, progress)
    }

    /// Registers each side for what it needs now (see the type's documentation).
    fn listen(&mut self) -> std::io::Result<()> {
        for side in [CLIENT, UPSTREAM] {
            let mut events = 0;
            if self.sides[side].reading {
                events |= libc::EPOLLRDHUP as u32;
                if self.sides[side].handed {
                    events |= libc::EPOLLIN as u32;
                }
            }
            self.poller.set(side, self.streams[side].as_fd(), events)?;
        }
        Ok(())
    }

    fn note(&mut self, events: [u32; 2]) {
        for (pending, new) in self.pending.iter_mut().zip(events) {
            *pending |= new;
        }
    }

    async fn on_events(&mut self, idle: Duration) -> Result<(), SpliceEnd> {
        for side in [CLIENT, UPSTREAM] {
            let events = std::mem::take(&mut self.pending[side]);
            if events & !(libc::EPOLLOUT as u32) != 0 {
                self.catch_up(side, idle).await?;
            }
        }
        Ok(())
    }

    async fn catch_up_all(&mut self, idle: Duration) -> Result<(), SpliceEnd> {
        for side in [CLIENT, UPSTREAM] {
            self.catch_up(side, idle).await?;
        }
        Ok(())
    }

    /// Reads whatever the kernel handed userspace on `side`, forwards it, and arms the side
    /// with the new count; notices EOF and errors.
    async fn catch_up(&mut self, side: usize, idle: Duration) -> Result<(), SpliceEnd> {
        let reading = self.sides[side].reading;
        if !reading && let Ok(Some(e)) | Err(e) = self.streams[side].take_error() {
            // A reset after the EOF (reads report EOF before errors once a FIN came).
            return Err(reset_by(side, "error after EOF", Some(&e)));
        }
        let mut buf = [0u8; CATCH_UP_BUF];
        let before = self.consumed[side];
        loop {
            match (&self.streams[side]).read(&mut buf) {
                // After EOF, reads still deliver bytes the kernel queued for userspace before
                // the FIN but had not handed over yet; only those are forwarded here.
                Ok(0) if !reading => break,
                Ok(0) => {
                    if let Ok(Some(e)) | Err(e) = self.streams[side].take_error() {
                        return Err(reset_by(side, "error at EOF", Some(&e)));
                    }
                    let received = self
                        .counts(side)
                        .map_err(|e| reset_by(side, "counts at EOF", Some(&e)))?
                        .received;
                    self.sides[side].reading = false;
                    // The FIN took one sequence number; the rest is data the peer must carry.
                    self.sides[1 - side].flush_to = Some(received.saturating_sub(1));
                    break;
                }
                Ok(n) => {
                    let data = buf.get(..n).unwrap_or_default();
                    self.write_to(1 - side, data, idle).await?;
                    self.consumed[side] += n as u64;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reset_by(side, "read", Some(&e))),
            }
        }
        if self.consumed[side] != before {
            self.arm(side);
        }
        Ok(())
    }

    /// Writes all of `data` to `side`, waiting for room at most `idle` at a time.
    async fn write_to(
        &mut self,
        side: usize,
        data: &[u8],
        idle: Duration,
    ) -> Result<(), SpliceEnd> {
        let mut written = 0;
        while written < data.len() {
            let rest = data.get(written..).unwrap_or_default();
            match (&self.streams[side]).write(rest) {
                Ok(n) => written += n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let wanted = self.poller.events[side] | libc::EPOLLOUT as u32;
                    let registered = self.poller.set(side, self.streams[side].as_fd(), wanted);
                    if let Err(e) = registered {
                        return Err(reset_by(side, "catch-up wait", Some(&e)));
                    }
                    let deadline = Instant::now() + idle;
                    loop {
                        match self.poller.wait(deadline).await {
                            Ok([0, 0]) => return Err(SpliceEnd::Idle),
                            Ok(events) => self.note(events),
                            Err(e) => return Err(reset_by(side, "catch-up wait", Some(&e))),
                        }
                        let room = libc::EPOLLOUT | libc::EPOLLERR | libc::EPOLLHUP;
                        if self.pending[side] & room as u32 != 0 {
                            self.pending[side] &= !(libc::EPOLLOUT as u32);
                            break;
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(reset_by(side, "catch-up write", Some(&e))),
            }
        }
        Ok(())
    }

    /// Tells the kernel how many of `side`'s bytes userspace has forwarded: it redirects again
    /// once its own count matches. A failed write leaves the side with userspace, which is
    /// slower but still correct; the next catch-up tries again.
    fn arm(&mut self, side: usize) {
        let [client, upstream] = self.entries.cookies;
        let (cookie, peer) = if side == CLIENT {
            (client, upstream)
        } else {
            (upstream, client)
        };
        let entry = SpliceEntry {
            peer,
            consumed: self.consumed[side],
        };
        let shared = &self.entries.shared;
        if let Err(e) = lock(&shared.splices).insert(cookie, entry, 0) {
            tracing::debug!(cookie, error = %e, "could not arm a spliced socket; it stays with userspace");
            self.sides[side].handed = true;
            return;
        }
        // Read back after arming: if the kernel handed over more in the meantime, this side
        // stays with userspace until those bytes are forwarded too, so keep listening.
        let passed = lock(&shared.splice_state)
            .get(&cookie, 0)
            .map(|state| state.passed);
        self.sides[side].handed = passed.is_ok_and(|passed| passed != self.consumed[side]);
    }

    /// Half-closes each peer whose other side ended once it has written everything that side
    /// received. `Ok(true)` if a pending half-close completed.
    async fn finish_flushes(&mut self, idle: Duration) -> Result<bool, SpliceEnd> {
        let mut done = false;
        for side in [CLIENT, UPSTREAM] {
            let Some(target) = self.sides[side].flush_to else {
                continue;
            };
            // Late bytes of the side that ended count toward the target too.
            self.catch_up(1 - side, idle).await?;
            let written = self
                .counts(side)
                .map_err(|e| reset_by(side, "counts", Some(&e)))?
                .written;
            if written.saturating_sub(self.base_written[side]) >= target {
                if let Err(e) = self.streams[side].shutdown(std::net::Shutdown::Write) {
                    return Err(reset_by(side, "half-close", Some(&e)));
                }
                self.sides[side].flush_to = None;
                done = true;
            }
        }
        Ok(done)
    }

    /// The side whose stream the kernel gave up on (see `SpliceState::broken`), if any.
    fn broken_side(&self) -> Option<usize> {
        let state = lock(&self.entries.shared.splice_state);
        [CLIENT, UPSTREAM].into_iter().find(|&side| {
            state
                .get(&self.entries.cookies[side], 0)
                .is_ok_and(|s| s.broken != 0)
        })
    }

    fn counts(&self, side: usize) -> std::io::Result<TcpCounts> {
        sys::tcp_counts(self.streams[side].as_fd())
    }

    /// The end when the sockets can no longer be watched: both are reset.
    fn unwatchable(&self, error: &std::io::Error) -> SpliceEnd {
        tracing::warn!(%error, "cannot watch a spliced connection; resetting it");
        SpliceEnd::ClientReset
    }
}

/// An epoll instance of one splice's own, registered in tokio's reactor as a single readable
/// descriptor: it becomes readable when either socket has an event registered here.
struct Poller {
    epoll: AsyncFd<OwnedFd>,
    /// What each side is registered for (besides EPOLLET and the implicit ERR / HUP).
    events: [u32; 2],
}

impl Poller {
    fn new(fds: [BorrowedFd<'_>; 2]) -> std::io::Result<Poller> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        for (side, fd) in fds.into_iter().enumerate() {
            epoll::add(&epoll, fd, data(side), edge_triggered(0))?;
        }
        Ok(Poller {
            // SAFETY: an OwnedFd: its descriptor stays open, and the same, until it drops.
            epoll: unsafe {
                AsyncFd::register_with_interest(epoll, tokio::io::Interest::READABLE)?
            },
            events: [0; 2],
        })
    }

    /// Registers `side` (whose socket is `fd`) for `events`, if that is a change.
    fn set(&mut self, side: usize, fd: BorrowedFd<'_>, events: u32) -> std::io::Result<()> {
        if self.events[side] == events {
            return Ok(());
        }
        epoll::modify(self.epoll.get_ref(), fd, data(side), edge_triggered(events))?;
        self.events[side] = events;
        Ok(())
    }

    /// The events that arrived, by side; waits for some until `deadline` (then `[0, 0]`).
    async fn wait(&self, deadline: Instant) -> std::io::Result<[u32; 2]> {
        loop {
            let mut guard = match tokio::time::timeout_at(deadline, self.epoll.readable()).await {
                Ok(guard) => guard?,
                Err(_) => return self.take(),
            };
            let events = self.take()?;
            if events != [0, 0] {
                return Ok(events);
            }
            guard.clear_ready();
        }
    }

    /// Whatever events are ready, without waiting.
    fn take(&self) -> std::io::Result<[u32; 2]> {
        let mut buffer = [MaybeUninit::<epoll::Event>::uninit(); 4];
        let no_wait = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let ready = match epoll::wait(self.epoll.get_ref(), &mut buffer, Some(&no_wait)) {
            Ok((ready, _)) => ready,
            Err(rustix::io::Errno::INTR) => return Ok([0, 0]),
            Err(e) => return Err(e.into()),
        };
        let mut events = [0u32; 2];
        for event in ready.iter() {
            // Copied out: the struct is packed, as the kernel's is on x86_64.
            let (side, flags) = (event.data.u64(), event.flags);
            if let Some(slot) = usize::try_from(side).ok().and_then(|s| events.get_mut(s)) {
                *slot |= flags.bits();
            }
        }
        Ok(events)
    }
}

/// A side's key in the epoll set.
fn data(side: usize) -> epoll::EventData {
    epoll::EventData::new_u64(side as u64)
}

/// `events` (EPOLLIN and the like), edge-triggered: every new event is reported once.
fn edge_triggered(events: u32) -> epoll::EventFlags {
    epoll::EventFlags::from_bits_retain(events) | epoll::EventFlags::ET
}

/// The end for a failure on `side`, logged with what failed.
fn reset_by(side: usize, what: &'static str, error: Option<&std::io::Error>) -> SpliceEnd {
    tracing::debug!(
        side = if side == CLIENT { "client" } else { "upstream" },
        what,
        error = error.map(tracing::field::display),
        "splice side failed"
    );
    if side == CLIENT {
        SpliceEnd::ClientReset
    } else {
        SpliceEnd::UpstreamReset
    }
}

/// Per socket: whether it may still send, whether the kernel may be handing its bytes to
/// userspace, and the half-close waiting for its peer's bytes.
#[derive(Clone, Copy, Debug)]
struct Side {
    /// No EOF or error seen yet.
    reading: bool,
    /// The kernel may hand this side's bytes to userspace (it is not armed with a count that
    /// matches what the kernel handed over), so readable events matter.
    handed: bool,
    /// This socket is to be half-closed once it has written this many bytes (since the splice
    /// began, the prefix included).
    flush_to: Option<u64>,
}

impl Default for Side {
    fn default() -> Self {
        Side {
            reading: true,
            handed: true,
            flush_to: None,
        }
    }
}

/// Bytes received on each side (what the kernel and userspace forwarded), for progress reports
/// and the idle timeout. Counts come from TCP_INFO, so they include bytes the kernel moved.
struct Meter {
    idle: Duration,
    reported: [u64; 2],
    last_move: Instant,
    last_check: Instant,
}

impl Meter {
    fn new(idle: Duration) -> Meter {
        let now = Instant::now();
        Meter {
            idle,
            reported: [0; 2],
            last_move: now,
            last_check: now,
        }
    }

    /// Reports progress at most once a tick; ends the splice if nothing moved for `idle` or
    /// the kernel gave up on a side.
    fn observe(&mut self, watch: &Watch, progress: &mut impl FnMut(Progress)) -> Option<SpliceEnd> {
        let now = Instant::now();
        if now.duration_since(self.last_check) < TICK.min(self.idle) {
            return None;
        }
        self.last_check = now;
        if let Some(side) = watch.broken_side() {
            tracing::warn!(
                side = if side == CLIENT { "client" } else { "upstream" },
                "the kernel could not trim a retransmitted message on a spliced socket; resetting both sides rather than forward bytes twice"
            );
            return Some(reset_by(side, "untrimmable retransmission", None));
        }
        if self.report(watch, progress) {
            self.last_move = now;
        } else if now.duration_since(self.last_move) >= self.idle {
            return Some(SpliceEnd::Idle);
        }
        None
    }

    /// `true` if anything moved since the last report.
    fn report(&mut self, watch: &Watch, progress: &mut impl FnMut(Progress)) -> bool {
        let mut delta = [0u64; 2];
        for side in [CLIENT, UPSTREAM] {
            let Ok(counts) = watch.counts(side) else {
                continue;
            };
            // Once a FIN arrived the count includes its sequence number, which is not a byte.
            let fin = counts.fin_received || !watch.sides[side].reading;
            let data = counts.received.saturating_sub(u64::from(fin));
            delta[side] = data.saturating_sub(self.reported[side]);
            self.reported[side] = self.reported[side].max(data);
        }
        if delta == [0, 0] {
            return false;
        }
        progress(Progress {
            to_upstream: delta[CLIENT],
            to_client: delta[UPSTREAM],
        });
        true
    }
}

impl Drop for Entries {
    /// The sockets leave SPLICE_SOCKS first: once they are out, the splice verdict no longer
    /// runs for them, so nothing can touch the entries deleted after.
    fn drop(&mut self) {
        let shared = &self.shared;
        {
            let mut socks = lock(&shared.splice_socks);
            for (cookie, inserted) in self.cookies.iter().zip(self.in_socks) {
                if !inserted {
                    continue;
                }
                match socks.remove(cookie) {
                    // Gone already if the socket closed first: the kernel removes closed sockets.
                    Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(e) => {
                        tracing::warn!(cookie, error = %e, "could not remove a spliced socket")
                    }
                }
            }
        }
        if self.in_splices {
            let mut state = lock(&shared.splice_state);
            let mut splices = lock(&shared.splices);
            for cookie in self.cookies {
                match splices.remove(&cookie) {
                    Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(e) => tracing::warn!(cookie, error = %e, "could not delete a splice entry"),
                }
                match state.remove(&cookie) {
                    Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                    Err(e) => tracing::warn!(cookie, error = %e, "could not delete a splice state"),
                }
            }
        }
    }
}

/// Entries in a gate's splice maps, read from their pins (for tests and diagnostics: every
/// one belongs to a live splice, so at rest all three are zero).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinnedSpliceEntries {
    pub splices: usize,
    pub splice_socks: usize,
    pub splice_state: usize,
}

/// Counts the entries of the splice maps pinned under `pin_dir`.
pub fn pinned_entries(pin_dir: &Path) -> Result<PinnedSpliceEntries> {
    let open = |name: &'static str| {
        let path = pin_dir.join(name);
        MapData::from_pin(&path).map_err(|source| GateError::Map { name, source })
    };
    let map_err = |name| move |source| GateError::Map { name, source };
    let splices: BpfHashMap<MapData, u64, SpliceEntry> =
        BpfHashMap::try_from(Map::HashMap(open(pins::SPLICES)?)).map_err(map_err("SPLICES"))?;
    let state: BpfHashMap<MapData, u64, SpliceState> =
        BpfHashMap::try_from(Map::HashMap(open(pins::SPLICE_STATE)?))
            .map_err(map_err("SPLICE_STATE"))?;
    let socks: SockHash<MapData, u64> =
        SockHash::try_from(Map::SockHash(open(pins::SPLICE_SOCKS)?))
            .map_err(map_err("SPLICE_SOCKS"))?;
    Ok(PinnedSpliceEntries {
        splices: splices.keys().filter(|k| k.is_ok()).count(),
        splice_socks: socks.keys().filter(|k| k.is_ok()).count(),
        splice_state: state.keys().filter(|k| k.is_ok()).count(),
    })
}

#[cfg(test)]
mod tests {
    use super::redirects_once;

    #[test]
    fn kernels_that_resend_partly_sent_messages_are_not_spliced() {
        let cases = [
            ((5, 10, 200), true),
            ((5, 15, 185), false),
            ((5, 15, 186), true),
            ((6, 1, 141), false),
            ((6, 1, 142), true),
            ((6, 5, 0), false),
            ((6, 6, 93), false),
            ((6, 6, 94), true),
            ((6, 8, 0), false),
            ((6, 11, 11), false),
            ((6, 12, 33), false),
            ((6, 12, 34), true),
            ((6, 14, 8), false),
            ((6, 15, 2), false),
            ((6, 15, 3), true),
            ((6, 16, 0), true),
            ((6, 18, 44), true),
            ((7, 0, 0), true),
        ];
        for ((major, minor, patch), fit) in cases {
            assert_eq!(
                redirects_once(major, minor, patch),
                fit,
                "{major}.{minor}.{patch}"
            );
        }
    }
}
