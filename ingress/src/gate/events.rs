//! Waking `admit` calls when the kernel decides: the EVENTS ring buffer is drained (by its own
//! task, and by `Gate::screen` in the accept loop) and each event completes the waiter
//! registered for its socket cookie, or is kept as an early verdict if nobody waits yet.
//!
//! No lost wakeups: `admit` registers its waiter first and only then reads the early table and
//! VERDICTS, and the kernel writes VERDICTS before it emits the event.
//!
//! An admitted connection's event carries its first record (see `ingress_common::Delivery`):
//! those bytes are kept here, by cookie, until `take_first_record` takes them (or they expire
//! with the early verdicts).
//!
//! Early verdicts are the cheap path. The HTTPS listener defers accept until the client's first
//! bytes arrive, and the kernel decides as those bytes land, before accept() returns; so the
//! accept loop usually finds the verdict here, having read only the socket's cookie, and resets
//! a dropped connection before it costs a task, a reactor registration or a map lookup.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ingress_common::{GateEvent, VerdictRecord, reason};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::{Shared, lock, record_of};

/// Early verdicts nobody asked for within this long are forgotten (a connection the kernel
/// decided on and userspace never accepted, say); VERDICTS still holds them until close.
const EARLY_TTL: Duration = Duration::from_secs(10);
/// At most this many early verdicts are kept; beyond it, `admit` finds them in VERDICTS.
const EARLY_LIMIT: usize = 65_536;

#[derive(Default)]
pub(super) struct Waiters(Mutex<Table>);

#[derive(Default)]
struct Table {
    waiting: HashMap<u64, oneshot::Sender<VerdictRecord>>,
    early: HashMap<u64, (VerdictRecord, Instant)>,
    /// First records delivered in their event, until taken.
    records: HashMap<u64, (Vec<u8>, Instant)>,
    pruned: Option<Instant>,
}

/// Removes the waiter when `admit` returns, however it returns, so the table only ever holds
/// connections being admitted right now.
pub(super) struct Registration<'a> {
    waiters: &'a Waiters,
    cookie: u64,
    pub(super) verdict: oneshot::Receiver<VerdictRecord>,
}

impl Waiters {
    pub(super) fn register(&self, cookie: u64) -> Registration<'_> {
        let (tx, rx) = oneshot::channel();
        lock(&self.0).waiting.insert(cookie, tx);
        Registration {
            waiters: self,
            cookie,
            verdict: rx,
        }
    }

    /// The verdict that arrived for `cookie` before anyone waited for it, if any; taking it
    /// removes it.
    pub(super) fn take_early(&self, cookie: u64) -> Option<VerdictRecord> {
        lock(&self.0)
            .early
            .remove(&cookie)
            .map(|(record, _)| record)
    }

    /// The first record delivered for `cookie`, if it has been drained; taking it removes it.
    pub(super) fn take_record(&self, cookie: u64) -> Option<Vec<u8>> {
        lock(&self.0)
            .records
            .remove(&cookie)
            .map(|(bytes, _)| bytes)
    }

    fn complete(&self, cookie: u64, record: VerdictRecord, payload: Option<Vec<u8>>, now: Instant) {
        let mut table = lock(&self.0);
        if let Some(payload) = payload {
            if table.records.len() >= EARLY_LIMIT {
                table
                    .records
                    .retain(|_, (_, at)| now.duration_since(*at) < EARLY_TTL);
            }
            // Beyond the limit the bytes are lost; `take_first_record` then resets the
            // connection rather than serve it without its ClientHello.
            if table.records.len() < EARLY_LIMIT {
                table.records.insert(cookie, (payload, now));
            }
        }
        if let Some(tx) = table.waiting.remove(&cookie) {
            // The receiver may have just timed out; the verdict stays in VERDICTS either way.
            let _ = tx.send(record);
            return;
        }
        let due = table
            .pruned
            .is_none_or(|at| now.duration_since(at) >= EARLY_TTL);
        if due || table.early.len() >= EARLY_LIMIT {
            table
                .early
                .retain(|_, (_, at)| now.duration_since(*at) < EARLY_TTL);
            table
                .records
                .retain(|_, (_, at)| now.duration_since(*at) < EARLY_TTL);
            table.pruned = Some(now);
        }
        if table.early.len() < EARLY_LIMIT {
            table.early.insert(cookie, (record, now));
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        let table = lock(&self.0);
        table.waiting.len() + table.early.len() + table.records.len()
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        lock(&self.waiters.0).waiting.remove(&self.cookie);
    }
}

/// Hands every event in the ring buffer to its waiter (or the early table). Reading the ring
/// is plain memory access, no syscall, so the accept loop can afford it per connection.
pub(super) fn drain(shared: &Shared) {
    let mut events = lock(&shared.events);
    let now = Instant::now();
    while let Some(item) = events.next() {
        if let Some((event, payload)) = parse(&item) {
            trace(&event);
            shared
                .waiters
                .complete(event.cookie, record_of(&event), payload, now);
        }
    }
}

/// The ring buffer's descriptor, for readiness only: the ring itself lives in `Shared` (behind
/// its lock, since the accept loop drains it too), which this task keeps alive.
struct RingFd(std::os::fd::RawFd);

impl std::os::fd::AsRawFd for RingFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0
    }
}

/// Drains the verdict events and the kernel's log records until the gate is dropped.
pub(super) async fn run(shared: Arc<Shared>, logger: Option<aya_log::EbpfLogger<LogBridge>>) {
    let ring = {
        use std::os::fd::AsRawFd;
        RingFd(lock(&shared.events).as_raw_fd())
    };
    // SAFETY: the fd is the ring buffer map's, which `shared` owns; this task holds `shared`,
    // so the fd stays open and unchanged for as long as the AsyncFd exists.
    let events = match unsafe { AsyncFd::register(ring) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the gate's event ring buffer; admit falls back to polling");
            return;
        }
    };
    let mut logger = logger.and_then(|l| {
        // SAFETY: the logger owns its ring buffer's fd and keeps it open and unchanged for as
        // long as the AsyncFd holds it.
        unsafe { AsyncFd::register(l) }
            .inspect_err(|e| tracing::warn!(error = %e, "kernel log records will not be read"))
            .ok()
    });
    loop {
        tokio::select! {
            guard = events.readable() => {
                let Ok(mut guard) = guard else { return };
                drain(&shared);
                guard.clear_ready();
            }
            guard = readable(&mut logger) => {
                let Ok(mut guard) = guard else { logger = None; continue };
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
        }
    }
}

/// Forwards aya-log records from the programs to `tracing`, under the target
/// `ingress::gate::kernel` (whose debug level also switches the kernel's logging on at load).
pub(super) struct LogBridge;

impl log::Log for LogBridge {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let message = record.args();
        match record.level() {
            log::Level::Error => tracing::error!(target: "ingress::gate::kernel", "{message}"),
            log::Level::Warn => tracing::warn!(target: "ingress::gate::kernel", "{message}"),
            log::Level::Info => tracing::info!(target: "ingress::gate::kernel", "{message}"),
            log::Level::Debug => tracing::debug!(target: "ingress::gate::kernel", "{message}"),
            log::Level::Trace => tracing::trace!(target: "ingress::gate::kernel", "{message}"),
        }
    }

    fn flush(&self) {}
}

/// Readiness of the logger, or never if there is none.
async fn readable<T: std::os::fd::AsRawFd>(
    fd: &mut Option<AsyncFd<T>>,
) -> std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, T>> {
    match fd {
        Some(fd) => fd.readable_mut().await,
        None => std::future::pending().await,
    }
}

/// An event, and the first record behind it when the kernel delivered one.
fn parse(bytes: &[u8]) -> Option<(GateEvent, Option<Vec<u8>>)> {
    let header = std::mem::size_of::<GateEvent>();
    if bytes.len() < header {
        tracing::warn!(len = bytes.len(), "short gate event");
        return None;
    }
    // SAFETY: GateEvent is plain integers (any bit pattern is valid) and the buffer holds at
    // least one; the ring buffer gives no alignment promise, hence the unaligned read.
    let event = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<GateEvent>()) };
    let payload = match usize::try_from(event.payload_len).unwrap_or(usize::MAX) {
        0 => None,
        len => match bytes.get(header..header.saturating_add(len)) {
            Some(record) => Some(record.to_vec()),
            None => {
                tracing::warn!(
                    len,
                    have = bytes.len() - header,
                    "gate event shorter than its record"
                );
                return None;
            }
        },
    };
    Some((event, payload))
}

fn trace(event: &GateEvent) {
    let remote = match event.family {
        2 => std::net::IpAddr::from(event.remote_ip[0].to_ne_bytes()),
        _ => {
            let mut octets = [0u8; 16];
            for (chunk, word) in octets.chunks_exact_mut(4).zip(event.remote_ip) {
                chunk.copy_from_slice(&word.to_ne_bytes());
            }
            std::net::IpAddr::from(octets)
        }
    };
    tracing::debug!(
        target: "ingress::gate::kernel",
        cookie = event.cookie,
        reason = reason::as_str(event.reason),
        action = event.action,
        record_len = event.record_len,
        sni = %String::from_utf8_lossy(event.name()),
        remote = %std::net::SocketAddr::new(remote, u16::try_from(event.remote_port).unwrap_or(0)),
        local_port = event.local_port,
        "kernel verdict"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(action: u32) -> VerdictRecord {
        VerdictRecord {
            action,
            reason: reason::PASS,
            generation: 0,
            record_len: 5,
            delivered: 0,
        }
    }

    #[tokio::test]
    async fn a_registered_waiter_gets_the_verdict_and_leaves_no_trace() {
        let waiters = Waiters::default();
        let mut reg = waiters.register(7);
        waiters.complete(7, record(1), None, Instant::now());
        assert_eq!((&mut reg.verdict).await.ok(), Some(record(1)));
        drop(reg);
        assert_eq!(waiters.len(), 0);
    }

    #[test]
    fn a_dropped_registration_removes_its_waiter_and_late_events_are_kept_early() {
        let waiters = Waiters::default();
        drop(waiters.register(7));
        assert_eq!(waiters.len(), 0);
        // Nobody waits for either now: both are kept as early verdicts, each taken once.
        let now = Instant::now();
        waiters.complete(7, record(1), None, now);
        waiters.complete(8, record(2), Some(b"hello".to_vec()), now);
        assert_eq!(waiters.take_record(8).as_deref(), Some(b"hello".as_slice()));
        assert_eq!(waiters.take_record(8), None);
        assert_eq!(waiters.take_early(8), Some(record(2)));
        assert_eq!(waiters.take_early(8), None);
        assert_eq!(waiters.len(), 1);
    }

    #[test]
    fn early_verdicts_expire() {
        let waiters = Waiters::default();
        let start = Instant::now();
        waiters.complete(1, record(1), Some(vec![1]), start);
        // The next event after the time to live prunes what nobody took.
        waiters.complete(
            2,
            record(1),
            None,
            start + EARLY_TTL + Duration::from_secs(1),
        );
        assert_eq!(waiters.take_early(1), None);
        assert_eq!(waiters.take_record(1), None);
        assert_eq!(waiters.take_early(2), Some(record(1)));
    }

    #[test]
    fn short_events_are_refused() {
        assert!(parse(&[0u8; 10]).is_none());
        let mut bytes = vec![0u8; std::mem::size_of::<GateEvent>()];
        bytes[..8].copy_from_slice(&42u64.to_ne_bytes());
        assert_eq!(parse(&bytes).map(|(e, p)| (e.cookie, p)), Some((42, None)));
    }

    #[test]
    fn a_delivered_record_follows_its_event_and_must_all_be_there() {
        let header = std::mem::size_of::<GateEvent>();
        let mut bytes = vec![0u8; header];
        // payload_len sits right before the name.
        let at = header - ingress_common::HOST_KEY_LEN - 4;
        bytes[at..at + 4].copy_from_slice(&3u32.to_ne_bytes());
        assert!(parse(&bytes).is_none(), "the record is missing");
        bytes.extend_from_slice(&[22, 3, 1, 9]);
        assert_eq!(
            parse(&bytes).and_then(|(_, p)| p),
            Some(vec![22, 3, 1]),
            "exactly payload_len bytes"
        );
    }
}
