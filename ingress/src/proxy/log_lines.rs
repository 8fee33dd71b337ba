//! Where every log line goes: one buffer that request threads append whole lines to, and one
//! background thread that writes what has gathered to stdout with one `write` per batch.
//!
//! ```text
//!   worker thread: line ──lock, append, unlock──┐      (wakes the writer only when it sleeps)
//!   worker thread: line ──lock, append, unlock──┤
//!                                                v
//!                                     pending: Vec<u8> ── swapped for an empty one ──> writer
//!                                                          thread: write(2) the batch, wait
//!                                                          40 ms for the next, repeat
//! ```
//!
//! Why not a channel of lines (tracing-appender's non-blocking writer): that is one allocation
//! and one send per line, and a wake-up of the writer thread for nearly every line, which under
//! full load cost more than formatting the line. Here a request pays a copy into a buffer that
//! is already there. The writer thread writes a quiet proxy's line at once, but under load it
//! takes what 40 ms brought, so it wakes 25 times a second however many lines there are, and
//! no request wakes it (profiled: writing as soon as anything was there, the writer woke for
//! nearly every line, and the context switches cost more than the lines; batches of 32 KiB
//! instead of up to 256 KiB cost about 3% more proxy CPU per JSON line, and 40 ms and 512 KiB
//! instead of 10 ms and 256 KiB 0.3% to 1% less in two runs, measured beside log-off
//! processes running at the same time). The access log and the other log lines share the
//! buffer, so they never interleave inside a line and keep their order. The other lines (warnings, errors, diagnostics: few, and
//! read by people following the log) are pushed with [`LogLines::push_now`], which ends the
//! linger: they and everything before them are written at once.
//!
//! A slow log reader (a full pipe) is felt only when [`LIMIT`] bytes are waiting: then a
//! request waits for room, as nginx's worker waits for its log `write`, and no line is lost.
//!
//! In a container stdout is a pipe (or FIFO) that the runtime drains, and Linux gives a pipe
//! 64 KiB. A batch is up to [`WAKE_AT`] and more, so with 64 KiB the writer blocked three or
//! four times per batch, and each time the reader made room it woke on the proxy's core and
//! preempted a request thread (measured: 400 writer wake-ups a second at 47k lines/s, against
//! 110 with the pipe widened). [`widen_pipe`] gives stdout room for a few batches.

use std::io::Write;
use std::os::fd::AsFd;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most bytes that wait for the writer before a line waits for room.
const LIMIT: usize = 8 << 20;
/// How long the writer waits after a batch for the next one to gather: the most a line waits
/// while lines keep coming (a first line after a quiet spell is written at once).
const LINGER: Duration = Duration::from_millis(40);
/// A batch this big is written without waiting out [`LINGER`].
const WAKE_AT: usize = 512 * 1024;

/// The room [`widen_pipe`] asks for: a few batches, and Linux's default `pipe-max-size`, the
/// most an unprivileged process may ask for.
const PIPE_SIZE: usize = 1 << 20;

/// Gives `fd` room for a few batches if it is a pipe, so that the writer thread writes a batch
/// without waiting for the reader in between (see the module doc). Anything else (a file, a
/// terminal), or a pipe the kernel will not widen, is left as it is: the lines still arrive,
/// with more wake-ups. Returns the pipe's size when it is one.
pub fn widen_pipe(fd: impl AsFd) -> Option<usize> {
    let fd = fd.as_fd();
    let size = rustix::pipe::fcntl_getpipe_size(fd).ok()?;
    if size >= PIPE_SIZE {
        return Some(size);
    }
    Some(rustix::pipe::fcntl_setpipe_size(fd, PIPE_SIZE).unwrap_or(size))
}

/// A handle to the log's buffer: cheap to clone, shared by every thread.
#[derive(Clone)]
pub struct LogLines {
    shared: Arc<Shared>,
}

/// Stops the writer thread when dropped, once every line pushed before has been written.
pub struct LogLinesGuard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    state: Mutex<State>,
    /// [`LINGER`]; a field so a test can make it long enough to tell.
    linger: Duration,
    /// Signalled when the first line arrives while the writer sleeps, and on close.
    wake_writer: Condvar,
    /// Signalled when the writer takes a full buffer.
    room: Condvar,
}

#[derive(Default)]
struct State {
    pending: Vec<u8>,
    /// The writer is waiting for lines: the next push must wake it.
    writer_asleep: bool,
    /// A line that must not wait out the linger is pending.
    urgent: bool,
    /// Threads waiting for room.
    waiting_for_room: usize,
    closed: bool,
}

impl std::fmt::Debug for LogLines {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogLines").finish_non_exhaustive()
    }
}

impl LogLines {
    /// Starts the writer thread, writing to `out`.
    pub fn start(out: impl Write + Send + 'static) -> std::io::Result<(LogLines, LogLinesGuard)> {
        Self::start_lingering(out, LINGER)
    }

    fn start_lingering(
        mut out: impl Write + Send + 'static,
        linger: Duration,
    ) -> std::io::Result<(LogLines, LogLinesGuard)> {
        let shared = Arc::new(Shared {
            linger,
            state: Mutex::new(State {
                pending: Vec::with_capacity(64 * 1024),
                ..State::default()
            }),
            wake_writer: Condvar::new(),
            room: Condvar::new(),
        });
        let writer = shared.clone();
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer.write_all_to(&mut out))?;
        Ok((
            LogLines {
                shared: shared.clone(),
            },
            LogLinesGuard {
                shared,
                thread: Some(thread),
            },
        ))
    }

    /// Appends `line`, which must be whole lines (each ending with `\n`); it is written with
    /// the next batch.
    pub fn push(&self, line: &[u8]) {
        self.append(line, false);
    }

    /// Appends `line` and has it written now, with whatever waited before it: for the few
    /// lines a person is waiting to read (a diagnostic, a warning), not for access lines.
    pub fn push_now(&self, line: &[u8]) {
        self.append(line, true);
    }

    fn append(&self, line: &[u8], urgent: bool) {
        let mut state = self.shared.lock();
        while state.pending.len() >= LIMIT && !state.closed {
            state.waiting_for_room += 1;
            state = self
                .shared
                .room
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting_for_room -= 1;
        }
        if state.closed {
            return;
        }
        let before = state.pending.len();
        state.pending.extend_from_slice(line);
        state.urgent |= urgent;
        let wake = std::mem::take(&mut state.writer_asleep)
            || urgent
            || (before < WAKE_AT && state.pending.len() >= WAKE_AT);
        drop(state);
        if wake {
            self.shared.wake_writer.notify_one();
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A thread that panicked while holding the lock left whole lines behind (a push is one
        // `extend_from_slice`): the state is still good.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The writer thread: takes the whole buffer, writes it, then lingers [`LINGER`] (unless
    /// [`WAKE_AT`] bytes gather first) so that under load the next batch is many lines and no
    /// request has to wake it; only after a linger that brought nothing does it sleep until
    /// the next line wakes it.
    fn write_all_to(&self, out: &mut dyn Write) {
        let mut batch = Vec::with_capacity(64 * 1024);
        let mut failed = false;
        let mut wrote = false;
        loop {
            let mut state = self.lock();
            if wrote {
                let until = Instant::now() + self.linger;
                while state.pending.len() < WAKE_AT && !state.closed && !state.urgent {
                    let left = until.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    state = self
                        .wake_writer
                        .wait_timeout(state, left)
                        .map_or_else(|e| e.into_inner().0, |(state, _)| state);
                }
            }
            while state.pending.is_empty() && !state.closed {
                state.writer_asleep = true;
                state = self
                    .wake_writer
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            state.writer_asleep = false;
            state.urgent = false;
            if state.pending.is_empty() {
                return;
            }
            std::mem::swap(&mut state.pending, &mut batch);
            let waiting = state.waiting_for_room > 0;
            drop(state);
            if waiting {
                self.room.notify_all();
            }
            if let Err(err) = out.write_all(&batch).and_then(|()| out.flush())
                && !failed
            {
                // Nowhere else to say it; once, not per batch.
                failed = true;
                eprintln!("log lines are being lost: writing them failed: {err}");
            }
            batch.clear();
            wrote = true;
        }
    }
}

impl Drop for LogLinesGuard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake_writer.notify_one();
        self.shared.room.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` that keeps what it is given, and counts the writes.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            kept.0.extend_from_slice(buf);
            kept.1 += 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_pipe_is_widened_and_anything_else_left_alone() {
        let (_read, write) = rustix::pipe::pipe().unwrap_or_else(|e| panic!("pipe: {e}"));
        assert_eq!(widen_pipe(&write), Some(PIPE_SIZE));
        assert_eq!(
            rustix::pipe::fcntl_getpipe_size(&write).ok(),
            Some(PIPE_SIZE),
            "the kernel's own view of the pipe"
        );
        // Already wide enough: left as it is.
        assert_eq!(widen_pipe(&write), Some(PIPE_SIZE));
        let file = std::fs::File::open("/dev/null").unwrap_or_else(|e| panic!("/dev/null: {e}"));
        assert_eq!(widen_pipe(&file), None);
    }

    #[test]
    fn every_line_is_written_whole_and_in_order_before_the_guard_returns() {
        let kept = Kept::default();
        let (lines, guard) = LogLines::start(kept.clone()).unwrap_or_else(|e| panic!("{e}"));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    for n in 0..10_000 {
                        lines.push(format!("thread {t} line {n}\n").as_bytes());
                    }
                })
            })
            .collect();
        for thread in threads {
            thread
                .join()
                .unwrap_or_else(|_| panic!("a pushing thread panicked"));
        }
        drop(guard);
        let kept = kept.0.lock().unwrap_or_else(PoisonError::into_inner);
        let text = String::from_utf8_lossy(&kept.0);
        let mut next = [0usize; 4];
        for line in text.lines() {
            let words: Vec<&str> = line.split(' ').collect();
            assert_eq!(words.len(), 4, "{line:?}");
            let t: usize = words[1].parse().unwrap_or_else(|_| panic!("{line:?}"));
            let n: usize = words[3].parse().unwrap_or_else(|_| panic!("{line:?}"));
            assert_eq!(n, next[t], "thread {t}'s lines out of order");
            next[t] += 1;
        }
        assert_eq!(next, [10_000; 4]);
        // Batched: far fewer writes than lines (each thread's first push may wake the writer).
        assert!(kept.1 < 40_000, "{} writes for 40000 lines", kept.1);
    }

    #[test]
    // A plain test thread paces its lines: no runtime to block.
    #[allow(clippy::disallowed_methods)]
    fn a_steady_trickle_is_written_in_batches_not_line_by_line() {
        let kept = Kept::default();
        let (lines, guard) = LogLines::start(kept.clone()).unwrap_or_else(|e| panic!("{e}"));
        let started = std::time::Instant::now();
        let mut pushed = 0;
        while started.elapsed() < std::time::Duration::from_millis(300) {
            lines.push(b"a line\n");
            pushed += 1;
            std::thread::sleep(std::time::Duration::from_micros(100));
        }
        drop(guard);
        let kept = kept.0.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(kept.0.len(), pushed * 7);
        // About one write per 40 ms: 8, and a margin for a loaded machine.
        assert!(kept.1 <= 30, "{} writes for {pushed} lines", kept.1);
    }

    /// With a linger far longer than the test, a batched line after a write waits; a line
    /// pushed now is written at once, and takes the waiting one with it, in order.
    #[test]
    // A plain test thread polls: no runtime to block.
    #[allow(clippy::disallowed_methods)]
    fn a_line_pushed_now_does_not_wait_out_the_linger() {
        let kept = Kept::default();
        let (lines, _guard) =
            LogLines::start_lingering(kept.clone(), std::time::Duration::from_secs(600))
                .unwrap_or_else(|e| panic!("{e}"));
        let written = || {
            String::from_utf8_lossy(&kept.0.lock().unwrap_or_else(PoisonError::into_inner).0)
                .into_owned()
        };
        let wait_for = |want: &str| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while written() != want {
                assert!(
                    std::time::Instant::now() < deadline,
                    "held back: {:?}",
                    written()
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        };
        lines.push(b"first\n");
        wait_for("first\n");
        lines.push(b"batched\n");
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(written(), "first\n", "a batched line waits for the linger");
        lines.push_now(b"diagnostic\n");
        wait_for("first\nbatched\ndiagnostic\n");
    }

    #[test]
    // A plain test thread polls: no runtime to block.
    #[allow(clippy::disallowed_methods)]
    fn a_quiet_log_is_written_without_waiting_for_more() {
        let kept = Kept::default();
        let (lines, _guard) = LogLines::start(kept.clone()).unwrap_or_else(|e| panic!("{e}"));
        lines.push(b"alone\n");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            if kept.0.lock().unwrap_or_else(PoisonError::into_inner).0 == b"alone\n" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the line was held back"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}
