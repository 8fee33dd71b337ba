//! A recording tap under a TLS session, and what a damaged stream looked like.
//!
//! ```text
//!   client: TlsStream<Tap<TcpStream>>   records the ciphertext it wrote   ─┐
//!   backend: TlsStream<Tap<TcpStream>>  records the ciphertext it read    ─┴─► describe()
//! ```
//!
//! TLS authenticates every record, so a byte the splice lost, duplicated or reordered never
//! shows up as wrong plaintext: rustls reports a bad record (a deframe or decrypt error) and
//! the plaintext just stops. Where the ciphertext went wrong is the evidence, so both ends keep
//! what crossed their socket (the first [`CAP`] bytes each way; beyond that only the count), and
//! a failure names the first differing offset, the record it fell in, and whether the bytes
//! there came from earlier in the stream (duplicated), from later (lost) or from nowhere.

use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::payload::{MIB, pattern_block};

/// Bytes kept per direction; the test streams of interest are a few MiB.
pub const CAP: usize = 64 * MIB;

/// Every byte a stream read and wrote, shared with whoever holds a clone.
#[derive(Clone, Default)]
pub struct TapLog(Arc<Mutex<Recorded>>);

#[derive(Default)]
pub struct Recorded {
    pub read: Vec<u8>,
    pub read_total: u64,
    pub written: Vec<u8>,
    pub written_total: u64,
}

impl TapLog {
    pub fn lock(&self) -> MutexGuard<'_, Recorded> {
        // A test thread that panicked while holding it left whole bytes behind: still usable.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl std::fmt::Debug for TapLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let r = self.lock();
        write!(
            f,
            "TapLog(read {}, written {})",
            r.read_total, r.written_total
        )
    }
}

/// A stream whose reads and writes are recorded into a [`TapLog`].
pub struct Tap<S> {
    inner: S,
    log: TapLog,
}

impl<S> Tap<S> {
    pub fn new(inner: S) -> Tap<S> {
        Tap {
            inner,
            log: TapLog::default(),
        }
    }

    pub fn log(&self) -> TapLog {
        self.log.clone()
    }

    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The stream under the tap: what is written here is not recorded, as bytes a network
    /// path added would not be.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }
}

impl<S: std::os::fd::AsRawFd> std::os::fd::AsRawFd for Tap<S> {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.inner.as_raw_fd()
    }
}

fn keep(into: &mut Vec<u8>, total: &mut u64, data: &[u8]) {
    *total += data.len() as u64;
    let room = CAP.saturating_sub(into.len()).min(data.len());
    into.extend_from_slice(&data[..room]);
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            let mut log = this.log.lock();
            let log = &mut *log;
            keep(&mut log.read, &mut log.read_total, &buf.filled()[before..]);
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, data);
        if let Poll::Ready(Ok(n)) = polled {
            let mut log = this.log.lock();
            let log = &mut *log;
            keep(&mut log.written, &mut log.written_total, &data[..n]);
        }
        polled
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Where the TLS record framing of `raw` (a byte stream as one side saw it) first breaks: a
/// header whose type, version or length no TLS peer sends. `None` if every record header
/// is plausible (the last record may be cut short).
pub fn framing_break(raw: &[u8]) -> Option<String> {
    let mut at = 0usize;
    let mut records = 0usize;
    while at + 5 <= raw.len() {
        let header = &raw[at..at + 5];
        let kind = header[0];
        let version = u16::from_be_bytes([header[1], header[2]]);
        let len = usize::from(u16::from_be_bytes([header[3], header[4]]));
        // RFC 8446 §5.1/5.2: content types 20..=23 on the wire, legacy versions 0x0301..=0x0303,
        // and a ciphertext of at most 2^14 + 256 bytes.
        if !(20..=23).contains(&kind) || !(0x0301..=0x0303).contains(&version) || len > 16640 {
            return Some(format!(
                "record {records} at byte {at} has an impossible header {}",
                hex(header)
            ));
        }
        at += 5 + len;
        records += 1;
    }
    None
}

/// The first offset at which `a` and `b` differ (the shorter one's length if one is a prefix
/// of the other); `None` if they are equal.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    let common = a.len().min(b.len());
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(at) => Some(at),
        None if a.len() == b.len() => None,
        None => Some(common),
    }
}

/// What happened to the stream `got` that should have been `sent`: lengths, the first differing
/// offset, the record it falls in, and where the bytes found there came from.
pub fn describe(sent: &[u8], sent_total: u64, got: &[u8], got_total: u64) -> String {
    let mut text = format!(
        "sent {sent_total} bytes (kept {}), received {got_total} (kept {})",
        sent.len(),
        got.len()
    );
    let Some(at) = first_difference(sent, got) else {
        text.push_str("; the kept bytes are identical");
        return text;
    };
    if at == got.len() {
        text.push_str(&format!(
            "; the received bytes are a prefix of the sent ones: nothing after byte {at} arrived"
        ));
        return text;
    }
    text.push_str(&format!("; first difference at byte {at}"));
    if let Some(start) = record_start(sent, at) {
        text.push_str(&format!(" (in the sent record starting at byte {start})"));
    }
    let window = &got[at..got.len().min(at + 32)];
    text.push_str(&format!(
        "; sent there: {}; received there: {}",
        hex(&sent[at..sent.len().min(at + 32)]),
        hex(window)
    ));
    // Where the received bytes at the difference came from in the sent stream.
    if window.len() >= 16 {
        match sent.windows(window.len()).position(|w| w == window) {
            Some(from) if from < at => text.push_str(&format!(
                "; they are sent bytes {from}.. again: {} bytes duplicated",
                at - from
            )),
            Some(from) => text.push_str(&format!(
                "; they are sent bytes {from}..: {} bytes lost",
                from - at
            )),
            None => text.push_str("; they appear nowhere in the sent stream"),
        }
    }
    text
}

/// The offset of the TLS record of `raw` that holds byte `at`, walking headers from the start.
fn record_start(raw: &[u8], at: usize) -> Option<usize> {
    let mut start = 0usize;
    while start + 5 <= raw.len() {
        let len = usize::from(u16::from_be_bytes([raw[start + 3], raw[start + 4]]));
        if at < start + 5 + len {
            return Some(start);
        }
        start += 5 + len;
    }
    None
}

/// How much of `plain` (bytes received from offset 0 of a [`super::payload::send_pattern`]
/// stream) matches the pattern: `None` if all of it, else the first differing offset.
pub fn pattern_mismatch(plain: &[u8]) -> Option<usize> {
    let block = pattern_block();
    plain.iter().enumerate().position(|(at, &byte)| {
        let (index, within) = (at / MIB, at % MIB);
        let expected = if within < 8 {
            (index as u64).to_le_bytes()[within]
        } else {
            block[within]
        };
        byte != expected
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damage_is_located_and_classified() {
        // Random bytes, as ciphertext is: any 32-byte window occurs once.
        let mut random = crate::corpus::Xorshift::new(7);
        let sent: Vec<u8> = (0..512)
            .flat_map(|_| random.next_u64().to_le_bytes())
            .collect();
        let cases: [(&str, Vec<u8>, &str); 4] = [
            ("same", sent.clone(), "identical"),
            ("cut", sent[..1000].to_vec(), "nothing after byte 1000"),
            (
                "lost",
                [&sent[..1000], &sent[1100..]].concat(),
                "first difference at byte 1000",
            ),
            (
                "duplicated",
                [&sent[..1000], &sent[900..]].concat(),
                "duplicated",
            ),
        ];
        for (name, got, expect) in cases {
            let text = describe(&sent, sent.len() as u64, &got, got.len() as u64);
            assert!(text.contains(expect), "{name}: {text}");
        }
        let lost = [&sent[..1000], &sent[1100..]].concat();
        let text = describe(&sent, 0, &lost, 0);
        assert!(text.contains("100 bytes lost"), "{text}");
        let dup = [&sent[..1000], &sent[900..]].concat();
        let text = describe(&sent, 0, &dup, 0);
        assert!(text.contains("100 bytes duplicated"), "{text}");
    }

    #[test]
    fn framing_breaks_are_found() {
        let record = |len: u16| {
            let mut r = vec![23, 3, 3];
            r.extend_from_slice(&len.to_be_bytes());
            r.extend(std::iter::repeat_n(0xaa, usize::from(len)));
            r
        };
        let good = [record(10), record(300), record(3)].concat();
        assert_eq!(framing_break(&good), None);
        // Three bytes lost from a record's tail: the next header is read three bytes late.
        let first = record(10);
        let cut = [&first[..first.len() - 3], &record(3)[..]].concat();
        let found = framing_break(&cut).expect("a break");
        assert!(found.contains("record 1 at byte 15"), "{found}");
    }

    #[test]
    fn the_pattern_is_checked_with_its_stamps() {
        let mut plain = pattern_block().to_vec();
        plain.extend_from_slice(pattern_block());
        // send_pattern stamps each MiB with its index.
        plain[..8].copy_from_slice(&0u64.to_le_bytes());
        plain[MIB..MIB + 8].copy_from_slice(&1u64.to_le_bytes());
        assert_eq!(pattern_mismatch(&plain), None);
        plain[MIB + 5000] ^= 1;
        assert_eq!(pattern_mismatch(&plain), Some(MIB + 5000));
    }
}
