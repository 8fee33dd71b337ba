//! Waking `admit` calls when the kernel decides: one task drains the EVENTS ring buffer (and
//! aya-log's) and completes the waiter registered for each event's socket cookie.
//!
//! No lost wakeups: `admit` registers its waiter first and only then reads VERDICTS, and the
//! kernel writes VERDICTS before it emits the event. An event that finds no waiter is dropped;
//! its verdict is still in VERDICTS for whoever asks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use aya::maps::{MapData, RingBuf};
use ingress_common::{GateEvent, VerdictRecord, reason};
use tokio::io::unix::AsyncFd;
use tokio::sync::oneshot;

use super::{Shared, lock, record_of};

#[derive(Default)]
pub(super) struct Waiters(Mutex<HashMap<u64, oneshot::Sender<VerdictRecord>>>);

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
        lock(&self.0).insert(cookie, tx);
        Registration {
            waiters: self,
            cookie,
            verdict: rx,
        }
    }

    fn complete(&self, cookie: u64, record: VerdictRecord) {
        if let Some(tx) = lock(&self.0).remove(&cookie) {
            // The receiver may have just timed out; the verdict stays in VERDICTS either way.
            let _ = tx.send(record);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        lock(&self.0).len()
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        lock(&self.waiters.0).remove(&self.cookie);
    }
}

/// Drains the verdict events and the kernel's log records until the gate is dropped.
pub(super) async fn run(
    shared: Arc<Shared>,
    events: RingBuf<MapData>,
    logger: Option<aya_log::EbpfLogger<LogBridge>>,
) {
    // SAFETY (both registrations): the ring buffers own their map fds and keep them open and
    // unchanged for as long as the AsyncFd holds them.
    let mut events = match unsafe { AsyncFd::register(events) } {
        Ok(fd) => fd,
        Err(e) => {
            tracing::error!(error = %e, "cannot watch the gate's event ring buffer; admit falls back to polling");
            return;
        }
    };
    let mut logger = logger.and_then(|l| {
        unsafe { AsyncFd::register(l) }
            .inspect_err(|e| tracing::warn!(error = %e, "kernel log records will not be read"))
            .ok()
    });
    loop {
        tokio::select! {
            guard = events.readable_mut() => {
                let Ok(mut guard) = guard else { return };
                while let Some(item) = guard.get_inner_mut().next() {
                    if let Some(event) = parse(&item) {
                        trace(&event);
                        shared.waiters.complete(event.cookie, record_of(&event));
                    }
                }
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

fn parse(bytes: &[u8]) -> Option<GateEvent> {
    if bytes.len() < std::mem::size_of::<GateEvent>() {
        tracing::warn!(len = bytes.len(), "short gate event");
        return None;
    }
    // SAFETY: GateEvent is plain integers (any bit pattern is valid) and the buffer holds at
    // least one; the ring buffer gives no alignment promise, hence the unaligned read.
    Some(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<GateEvent>()) })
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
            route_id: 0,
            generation: 0,
            record_len: 5,
        }
    }

    #[tokio::test]
    async fn a_registered_waiter_gets_the_verdict_and_leaves_no_trace() {
        let waiters = Waiters::default();
        let mut reg = waiters.register(7);
        waiters.complete(7, record(1));
        assert_eq!((&mut reg.verdict).await.ok(), Some(record(1)));
        drop(reg);
        assert_eq!(waiters.len(), 0);
    }

    #[test]
    fn a_dropped_registration_removes_its_waiter_and_late_events_are_ignored() {
        let waiters = Waiters::default();
        drop(waiters.register(7));
        assert_eq!(waiters.len(), 0);
        waiters.complete(7, record(1));
        waiters.complete(8, record(1));
        assert_eq!(waiters.len(), 0);
    }

    #[test]
    fn short_events_are_refused() {
        assert!(parse(&[0u8; 10]).is_none());
        let mut bytes = vec![0u8; std::mem::size_of::<GateEvent>()];
        bytes[..8].copy_from_slice(&42u64.to_ne_bytes());
        assert_eq!(parse(&bytes).map(|e| e.cookie), Some(42));
    }
}
