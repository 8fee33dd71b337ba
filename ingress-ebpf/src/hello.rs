//! The kernel's ClientHello reader: the same rules as `ingress::client_hello` (see the table in
//! its header), reduced to the four outcomes the gate acts on.
//!
//! ```text
//!   frame(): first byte ∉ 20..=24 or version major ≠ 3 → decide now (not TLS)
//!            type ≠ handshake or length > 16384        → decide now (malformed)
//!            otherwise                                 → one record of 5 + length bytes
//!   classify(): handshake header, fixed ClientHello fields, then a bpf_loop over at most 32
//!               extensions (any order, duplicates malformed), then a bpf_loop over the name
//!               that validates and lowercases it in place
//! ```
//!
//! Every loop runs under `bpf_loop` and keeps no precise counter of its own (the slot for the
//! i-th extension is the loop index), so the verifier's states converge after an iteration or two
//! however long the input is. Duplicate extension types are found in a 65536-bit per-CPU bitmap
//! (one bit test per extension) rather than by comparing with every earlier type, which the
//! verifier would have to explore per pair; the bits set are cleared again before returning.
//! The bitmap lives in the run's own workspace, which no other run touches until this one
//! releases it (see `work.rs`), so a run interrupted half-way never leaves bits for another.
//! Offsets are plain integers handed to a load helper that bounds-checks them at run time, so a
//! hostile length can only ever make a load fail. The reader is generic over [`Packet`] so the
//! same code runs on the stream verdict's socket buffer and on the probe's test buffer.

use core::{
    ffi::c_void,
    ptr::{read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::{__sk_buff, xdp_md},
    helpers::generated::{bpf_loop, bpf_skb_load_bytes, bpf_xdp_get_buff_len, bpf_xdp_load_bytes},
};
use ingress_common::{
    HOST_KEY_LEN, HostKey, MAX_EXTENSIONS, MAX_FRAGMENT_LEN, MAX_NAME_LEN, RECORD_HEADER_LEN,
};

const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_FIRST: u8 = 20;
const CONTENT_LAST: u8 = 24;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const RANDOM_LEN: u32 = 32;
const MAX_SESSION_ID_LEN: u8 = 32;
const EXT_SERVER_NAME: u16 = 0;
const EXT_ALPN: u16 = 16;
const EXT_SUPPORTED_VERSIONS: u16 = 43;
const NAME_TYPE_HOST_NAME: u8 = 0;
/// The walk looks at one slot more than the limit, so a 33rd extension is seen and rejected.
const EXT_STEPS: u32 = MAX_EXTENSIONS + 1;
/// An ALPN list fits in one record, and every entry takes at least two bytes.
const ALPN_STEPS: u32 = MAX_FRAGMENT_LEN / 2;

/// How the first bytes of a connection are framed.
pub enum Frame {
    /// Too few bytes to decide.
    NeedMore,
    /// Decidable from the header alone (not TLS, not a handshake, too large): whatever arrived is
    /// the message.
    Now,
    /// A TLS handshake record of this many bytes, header included.
    Record(u32),
}

/// What the ClientHello says, for the policy to act on.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A valid name, lowercased into the key buffer; this many bytes.
    Name(u32),
    NoSni,
    Malformed,
    NotTls,
}

pub struct Classified {
    pub outcome: Outcome,
    /// Bytes the decision covers (see `VerdictRecord::record_len`).
    pub record_len: u32,
}

/// Working memory (a map value: the keys alone would fill the 512-byte stack); each decision
/// has one of its own (see `work.rs`).
pub use ingress_common::Workspace;

/// `MAX_NAME_LEN` in the width the walk computes in.
const MAX_NAME: u32 = 253;
const _: () = assert!(MAX_NAME as usize == MAX_NAME_LEN);

/// Mirrors `client_hello::record_len`.
#[inline(always)]
pub fn frame<P: Packet>(pkt: P) -> Frame {
    let Some(content_type) = pkt.load_u8(0) else {
        return Frame::NeedMore;
    };
    if !(CONTENT_FIRST..=CONTENT_LAST).contains(&content_type) {
        return Frame::Now;
    }
    let Some(major) = pkt.load_u8(1) else {
        return Frame::NeedMore;
    };
    if major != 3 || content_type != CONTENT_HANDSHAKE {
        return Frame::Now;
    }
    if pkt.len() < RECORD_HEADER_LEN {
        return Frame::NeedMore;
    }
    let Some(body) = pkt.load_u16(3) else {
        return Frame::NeedMore;
    };
    let body = u32::from(body);
    if body > MAX_FRAGMENT_LEN {
        return Frame::Now;
    }
    Frame::Record(RECORD_HEADER_LEN + body)
}

/// Classifies the first record in `pkt`. On `Outcome::Name`, `work.key` holds the lowercased,
/// zero-padded name.
#[inline(always)]
pub fn classify<P: Packet>(pkt: P, work: &mut Workspace) -> Classified {
    let len = pkt.len();
    let (outcome, record_len) = match frame(pkt) {
        // A message shorter than its header: what `client_hello::parse` calls truncated.
        Frame::NeedMore => (Outcome::Malformed, len),
        Frame::Now => (header_outcome(pkt), len),
        // Bytes past the record belong to later messages; only the first record is read.
        Frame::Record(total) if total <= len => (client_hello(pkt, total, work), total),
        Frame::Record(_) => (Outcome::Malformed, len),
    };
    Classified {
        outcome,
        record_len,
    }
}

/// Why a header was decidable on its own.
#[inline(always)]
fn header_outcome<P: Packet>(pkt: P) -> Outcome {
    match (pkt.load_u8(0), pkt.load_u8(1)) {
        (Some(t), Some(3)) if (CONTENT_FIRST..=CONTENT_LAST).contains(&t) => Outcome::Malformed,
        _ => Outcome::NotTls,
    }
}

/// Parses the handshake message filling the record `[5, end)`.
#[inline(always)]
fn client_hello<P: Packet>(pkt: P, end: u32, work: &mut Workspace) -> Outcome {
    match fixed_fields(pkt, end) {
        None => Outcome::Malformed,
        Some(None) => Outcome::NoSni,
        Some(Some(ext_start)) => extensions(pkt, ext_start, end, work),
    }
}

/// The handshake header and the ClientHello fields before the extensions. `None`: malformed;
/// `Some(None)`: valid with no extension block; `Some(Some(p))`: extensions fill `[p, end)`.
#[inline(always)]
fn fixed_fields<P: Packet>(pkt: P, end: u32) -> Option<Option<u32>> {
    let mut p = RECORD_HEADER_LEN;
    // Every read is checked against `end` first: bytes past the record may be in the buffer.
    if p + 1 > end || pkt.load_u8(p)? != HANDSHAKE_CLIENT_HELLO {
        return None;
    }
    if p + 4 > end {
        return None;
    }
    let hello_len = pkt.load_u24(p + 1)?;
    p += 4;
    // The message must fill the record exactly: longer is fragmented, shorter leaves trailing
    // bytes; both malformed.
    if p + hello_len != end {
        return None;
    }
    if p + 2 > end || pkt.load_u8(p)? != 3 {
        return None;
    }
    p += 2 + RANDOM_LEN;
    if p + 1 > end {
        return None;
    }
    let session_id = pkt.load_u8(p)?;
    if session_id > MAX_SESSION_ID_LEN {
        return None;
    }
    p += 1 + u32::from(session_id);
    if p + 2 > end {
        return None;
    }
    let suites = u32::from(pkt.load_u16(p)?);
    if suites == 0 || suites % 2 != 0 {
        return None;
    }
    p += 2 + suites;
    if p + 1 > end {
        return None;
    }
    let compression = pkt.load_u8(p)?;
    if compression == 0 {
        return None;
    }
    p += 1 + u32::from(compression);
    if p > end {
        return None;
    }
    if p == end {
        return Some(None);
    }
    if p + 2 > end {
        return None;
    }
    let block = u32::from(pkt.load_u16(p)?);
    p += 2;
    if p + block != end {
        return None;
    }
    Some(Some(p))
}

/// State shared with the extension-walk callback.
#[repr(C)]
struct ExtWalk<P> {
    pkt: P,
    work: *mut Workspace,
    pos: u32,
    end: u32,
    malformed: u32,
    /// Entries of `work.types` in use.
    recorded: u32,
    sni_found: u32,
    sni_off: u32,
    sni_len: u32,
    _pad: u32,
}

#[inline(always)]
fn extensions<P: Packet>(pkt: P, start: u32, end: u32, work: &mut Workspace) -> Outcome {
    let mut walk = ExtWalk {
        pkt,
        work,
        pos: start,
        end,
        malformed: 0,
        recorded: 0,
        sni_found: 0,
        sni_off: 0,
        sni_len: 0,
        _pad: 0,
    };
    // SAFETY: `ext_step` has the callback signature bpf_loop expects, and `walk` outlives the
    // call.
    unsafe {
        bpf_loop(
            EXT_STEPS,
            ext_step::<P> as *mut c_void,
            (&raw mut walk).cast(),
            0,
        );
    }
    let mut clear = ClearWalk {
        work,
        recorded: walk.recorded,
    };
    // SAFETY: as above.
    unsafe {
        bpf_loop(
            MAX_EXTENSIONS,
            clear_step as *mut c_void,
            (&raw mut clear).cast(),
            0,
        );
    }
    if walk.malformed != 0 || walk.pos != walk.end {
        return Outcome::Malformed;
    }
    if walk.sni_found == 0 {
        return Outcome::NoSni;
    }
    name(pkt, walk.sni_off, walk.sni_len, work)
}

/// One extension: `[type u16][len u16][data]`, the `index`-th. Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn ext_step<P: Packet>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `ExtWalk` pointer given to it.
    let walk = unsafe { &mut *ctx.cast::<ExtWalk<P>>() };
    if walk.pos >= walk.end {
        return 1;
    }
    match ext_one(walk, index) {
        Some(()) => 0,
        None => {
            walk.malformed = 1;
            1
        }
    }
}

/// Reads and checks one extension at `walk.pos`; `None` if it is malformed.
#[inline(always)]
fn ext_one<P: Packet>(walk: &mut ExtWalk<P>, index: u64) -> Option<()> {
    // A 33rd extension: too many.
    let slot = slot(index, MAX_EXTENSIONS)?;
    let head = walk.pos;
    if head + 4 > walk.end {
        return None;
    }
    let ext_type = walk.pkt.load_u16(head)?;
    let data_len = u32::from(walk.pkt.load_u16(head + 2)?);
    let data = head + 4;
    if data + data_len > walk.end {
        return None;
    }
    // SAFETY: `work` is this CPU's workspace, valid for the whole program run.
    let work = unsafe { &mut *walk.work };
    let word = work.seen.get_mut(usize::from(ext_type >> 6))?;
    let bit = 1u64 << (ext_type & 63);
    if *word & bit != 0 {
        return None;
    }
    *word |= bit;
    *work.types.get_mut(slot as usize)? = ext_type;
    walk.recorded = slot + 1;
    match ext_type {
        EXT_SERVER_NAME => {
            let (off, len) = server_name(walk.pkt, data, data_len)?;
            walk.sni_found = 1;
            walk.sni_off = off;
            walk.sni_len = len;
        }
        EXT_ALPN => alpn(walk.pkt, data, data_len)?,
        EXT_SUPPORTED_VERSIONS => supported_versions(walk.pkt, data, data_len)?,
        _ => {}
    }
    walk.pos = data + data_len;
    Some(())
}

#[repr(C)]
struct ClearWalk {
    work: *mut Workspace,
    recorded: u32,
}

/// Clears the `seen` bit of the `index`-th recorded type.
#[inline(never)]
extern "C" fn clear_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `ClearWalk` pointer given to it.
    let clear = unsafe { &mut *ctx.cast::<ClearWalk>() };
    let Some(i) = slot(index, clear.recorded) else {
        return 1;
    };
    // SAFETY: as in `ext_one`.
    let work = unsafe { &mut *clear.work };
    let Some(&ext_type) = work.types.get(i as usize) else {
        return 1;
    };
    if let Some(word) = work.seen.get_mut(usize::from(ext_type >> 6)) {
        *word &= !(1u64 << (ext_type & 63));
    }
    0
}

/// A `server_name` list of exactly one `host_name` entry filling the extension; returns the
/// name's offset and length, unvalidated.
#[inline(always)]
fn server_name<P: Packet>(pkt: P, data: u32, len: u32) -> Option<(u32, u32)> {
    if len < 2 {
        return None;
    }
    let list = u32::from(pkt.load_u16(data)?);
    if list + 2 != len || list < 3 {
        return None;
    }
    if pkt.load_u8(data + 2)? != NAME_TYPE_HOST_NAME {
        return None;
    }
    let name_len = u32::from(pkt.load_u16(data + 3)?);
    if name_len + 3 != list {
        return None;
    }
    Some((data + 5, name_len))
}

/// A non-empty list of non-empty protocol names, exactly filling the extension.
#[inline(always)]
fn alpn<P: Packet>(pkt: P, data: u32, len: u32) -> Option<()> {
    if len < 2 {
        return None;
    }
    let list = u32::from(pkt.load_u16(data)?);
    if list + 2 != len || list == 0 {
        return None;
    }
    let mut walk = AlpnWalk {
        pkt,
        pos: data + 2,
        end: data + len,
        malformed: 0,
    };
    // SAFETY: as in `extensions`.
    unsafe {
        bpf_loop(
            ALPN_STEPS,
            alpn_step::<P> as *mut c_void,
            (&raw mut walk).cast(),
            0,
        );
    }
    (walk.malformed == 0 && walk.pos == walk.end).then_some(())
}

#[repr(C)]
struct AlpnWalk<P> {
    pkt: P,
    pos: u32,
    end: u32,
    malformed: u32,
}

#[inline(never)]
extern "C" fn alpn_step<P: Packet>(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `AlpnWalk` pointer given to it.
    let walk = unsafe { &mut *ctx.cast::<AlpnWalk<P>>() };
    if walk.pos >= walk.end {
        return 1;
    }
    let next = match walk.pkt.load_u8(walk.pos) {
        Some(n) if n > 0 => walk.pos + 1 + u32::from(n),
        _ => u32::MAX,
    };
    if next > walk.end {
        walk.malformed = 1;
        return 1;
    }
    walk.pos = next;
    0
}

/// A non-empty, even-length list exactly filling the extension.
#[inline(always)]
fn supported_versions<P: Packet>(pkt: P, data: u32, len: u32) -> Option<()> {
    if len < 1 {
        return None;
    }
    let list = u32::from(pkt.load_u8(data)?);
    (list + 1 == len && list != 0 && list % 2 == 0).then_some(())
}

/// Copies the name into `work.key`, then validates and lowercases it as `ServerName::parse`
/// does: 1..=253 bytes of letters, digits, `-`, `_` and `.`, no empty label.
#[inline(always)]
fn name<P: Packet>(pkt: P, off: u32, len: u32, work: &mut Workspace) -> Outcome {
    if len == 0 || len > MAX_NAME {
        return Outcome::Malformed;
    }
    zero_key(&mut work.key);
    let key = &mut work.key.name;
    // The mask restates the bound in a form the verifier tracks through the helper call.
    let len = len & 0xff;
    // `key` has HOST_KEY_LEN > len bytes.
    if !pkt.load(off, key.as_mut_ptr(), len) {
        return Outcome::Malformed;
    }
    let mut walk = NameWalk {
        key: key.as_mut_ptr(),
        previous: b'.' as u32,
        invalid: 0,
    };
    // SAFETY: as in `extensions`.
    unsafe {
        bpf_loop(len, name_step as *mut c_void, (&raw mut walk).cast(), 0);
    }
    if walk.invalid != 0 || walk.previous == b'.' as u32 {
        return Outcome::Malformed;
    }
    Outcome::Name(len)
}

#[repr(C)]
struct NameWalk {
    key: *mut u8,
    previous: u32,
    invalid: u32,
}

#[inline(never)]
extern "C" fn name_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `NameWalk` pointer given to it.
    let walk = unsafe { &mut *ctx.cast::<NameWalk>() };
    let Some(i) = slot(index, MAX_NAME) else {
        return 1;
    };
    // SAFETY: i < 253 < HOST_KEY_LEN, the size of the buffer behind `key`.
    let slot = unsafe { &mut *walk.key.add(i as usize) };
    let b = *slot;
    let valid = match b {
        b'.' => walk.previous != b'.' as u32,
        b'-' | b'_' => true,
        _ => b.is_ascii_alphanumeric(),
    };
    if !valid {
        walk.invalid = 1;
        return 1;
    }
    *slot = b.to_ascii_lowercase();
    walk.previous = u32::from(b);
    0
}

/// Builds `*.parent` for the `len`-byte name in `work.key` into `work.wild`; `false` if the name
/// has a single label.
#[inline(always)]
pub fn wildcard(work: &mut Workspace, len: u32) -> bool {
    zero_key(&mut work.wild);
    let wild = &mut work.wild.name;
    let mut walk = WildWalk {
        key: work.key.name.as_ptr(),
        wild: wild.as_mut_ptr(),
        len,
        dot: 0,
        found: 0,
    };
    // SAFETY: as in `extensions`.
    unsafe {
        bpf_loop(len, wild_step as *mut c_void, (&raw mut walk).cast(), 0);
    }
    if walk.found == 0 {
        return false;
    }
    wild[0] = b'*';
    true
}

#[repr(C)]
struct WildWalk {
    key: *const u8,
    wild: *mut u8,
    len: u32,
    dot: u32,
    found: u32,
}

/// Finds the first dot, then copies from it: `wild[1 + i - dot] = key[i]`.
#[inline(never)]
extern "C" fn wild_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `WildWalk` pointer given to it.
    let walk = unsafe { &mut *ctx.cast::<WildWalk>() };
    let Some(i) = slot(index, MAX_NAME) else {
        return 1;
    };
    // SAFETY: i < 253 < HOST_KEY_LEN.
    let b = unsafe { *walk.key.add(i as usize) };
    if walk.found == 0 {
        if b == b'.' {
            walk.found = 1;
            walk.dot = i;
        } else {
            return 0;
        }
    }
    let to = 1 + i - walk.dot;
    if to as usize >= HOST_KEY_LEN {
        return 1;
    }
    // SAFETY: bounds-checked just above.
    unsafe { *walk.wild.add(to as usize) = b };
    0
}

/// The `bpf_loop` index as a slot below `bound`, or `None` to stop the loop.
#[inline(always)]
fn slot(index: u64, bound: u32) -> Option<u32> {
    u32::try_from(index).ok().filter(|&i| i < bound)
}

/// Zeroes a key with word stores; a plain assignment becomes a call to a byte-by-byte `memset`.
#[inline(always)]
pub fn zero_key(key: &mut HostKey) {
    let words = (&raw mut key.name).cast::<u64>();
    for i in 0..HOST_KEY_LEN / 8 {
        // SAFETY: in bounds of the 256-byte array, which sits 8-byte aligned in a map value.
        unsafe { write_volatile(words.add(i), 0) };
    }
}

/// Copies a key with word loads and stores, for the same reason as `zero_key`.
#[inline(always)]
pub fn copy_key(to: *mut [u8; HOST_KEY_LEN], from: &HostKey) {
    let src = (&raw const from.name).cast::<u64>();
    let dst = to.cast::<u64>();
    for i in 0..HOST_KEY_LEN / 8 {
        // SAFETY: both are 256-byte, 8-byte-aligned arrays in map or ring-buffer memory.
        unsafe { write_volatile(dst.add(i), read_volatile(src.add(i))) };
    }
}

/// Where the bytes come from: the verdict's socket buffer, or the probe's test buffer.
pub trait Packet: Copy {
    /// Bytes available.
    fn len(self) -> u32;
    /// Copies `len` bytes at `off` to `to`; `false` if they are not all there.
    fn load(self, off: u32, to: *mut u8, len: u32) -> bool;

    #[inline(always)]
    fn load_u8(self, off: u32) -> Option<u8> {
        let mut b = 0u8;
        self.load(off, &raw mut b, 1).then_some(b)
    }

    #[inline(always)]
    fn load_u16(self, off: u32) -> Option<u16> {
        let mut b = [0u8; 2];
        self.load(off, b.as_mut_ptr(), 2)
            .then_some(u16::from_be_bytes(b))
    }

    #[inline(always)]
    fn load_u24(self, off: u32) -> Option<u32> {
        let mut b = [0u8; 4];
        // SAFETY: three bytes into the last three of a four-byte local.
        let to = unsafe { b.as_mut_ptr().add(1) };
        self.load(off, to, 3).then_some(u32::from_be_bytes(b))
    }
}

/// A stream message: `bpf_skb_load_bytes` bounds-checks against the message at run time.
#[derive(Clone, Copy)]
pub struct Skb(pub *mut __sk_buff);

impl Packet for Skb {
    #[inline(always)]
    fn len(self) -> u32 {
        // SAFETY: the context pointer the kernel handed the program.
        unsafe { (*self.0).len }
    }

    #[inline(always)]
    fn load(self, off: u32, to: *mut u8, len: u32) -> bool {
        // SAFETY: callers pass a destination of at least `len` bytes.
        unsafe { bpf_skb_load_bytes(self.0.cast(), off, to.cast(), len) == 0 }
    }
}

/// A `BPF_PROG_TEST_RUN` buffer for the XDP probe: `[len: u32 LE][12 bytes][len bytes][pad]`.
/// XDP because its test runs take up to 64 KiB in fragments (a full 16 KiB record), where a
/// socket filter's stop at one page; the prefix because a test frame must be at least 14 bytes,
/// and padding must not count as data.
#[derive(Clone, Copy)]
pub struct ProbeBuffer {
    pub ctx: *mut xdp_md,
    pub len: u32,
}

/// Bytes before the data in a probe buffer.
pub const PROBE_PREFIX: u32 = 16;

impl ProbeBuffer {
    /// `None` if the buffer is shorter than its prefix says.
    #[inline(always)]
    pub fn new(ctx: *mut xdp_md) -> Option<ProbeBuffer> {
        let mut prefix = [0u8; 4];
        // SAFETY: the context pointer of the probe program; four bytes into a local.
        let ret = unsafe { bpf_xdp_load_bytes(ctx, 0, prefix.as_mut_ptr().cast(), 4) };
        if ret != 0 {
            return None;
        }
        let len = u32::from_le_bytes(prefix);
        // SAFETY: as above.
        let total = unsafe { bpf_xdp_get_buff_len(ctx) };
        (u64::from(len) + u64::from(PROBE_PREFIX) <= total).then_some(ProbeBuffer { ctx, len })
    }
}

impl Packet for ProbeBuffer {
    #[inline(always)]
    fn len(self) -> u32 {
        self.len
    }

    #[inline(always)]
    fn load(self, off: u32, to: *mut u8, len: u32) -> bool {
        if u64::from(off) + u64::from(len) > u64::from(self.len) {
            return false;
        }
        // SAFETY: as in `Skb::load`.
        unsafe { bpf_xdp_load_bytes(self.ctx, PROBE_PREFIX + off, to.cast(), len) == 0 }
    }
}
