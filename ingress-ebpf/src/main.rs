//! The kernel half of the SNI gate.
//!
//! ```text
//!  gate_early (TC ingress; a shortcut, never the only path; see early.rs)
//!                         the first data segment of a connection still in the SYN queue of the
//!                         proxy's own listener (the listener defers accept), starting with a
//!                         whole TLS handshake record: the verdict's decision
//!                         drop → the client gets an RST|ACK from here, and the segment becomes
//!                              the client's RST: the request is dropped, nothing is accepted
//!                         pass → PASSED_EARLY[flow] for sock_ops; anything else goes on
//!  sock_ops (cgroup)      PASSIVE_ESTABLISHED on a gated port, in the proxy's netns, of a socket
//!     │                   whose listener the proxy marked (LISTENERS, cloned to each child):
//!     │                       passed early (PASSED_EARLY[flow]) → VERDICTS[cookie] = pass,
//!     │                         EVENTS, ask for STATE_CB; the socket stays out of SOCKS
//!     │                       otherwise → VERDICTS[cookie] = pending, SOCKS[cookie] = socket,
//!     │                         ask for STATE_CB
//!     │                   STATE_CB to TCP_CLOSE → delete the socket's VERDICTS, NEXT_MESSAGE,
//!     │                   SPLICES and SPLICE_STATE entries (userspace deletes them earlier,
//!     │                   when admission or the splice ends; this catches the rest)
//!     ▼
//!  stream parser (SOCKS)  pending → frame the first TLS record (0 = need more)
//!     │                   verdict exists → pass everything through unframed, from where
//!     │                   the message starts in the skb (NEXT_MESSAGE)
//!     ▼
//!  stream verdict         claim a workspace (work.rs) → classify the ClientHello → HOSTS (exact,
//!                         then *.parent) → policy → VERDICTS[cookie], EVENTS, COUNTERS;
//!                         SK_PASS / SK_DROP. No free workspace: action DEFER, userspace decides
//!  gate_probe (XDP, never attached): the same decision on a raw buffer through
//!                         BPF_PROG_TEST_RUN, result in PROBE, for the shared corpus
//!
//!  splice_verdict (SPLICE_SOCKS, no parser: whole skbs in order, no strparser)
//!                         no SPLICE_STATE (the splice is being taken down) → userspace
//!                         bytes before SPLICE_STATE.next_seq (a retransmission overlapping what
//!                             was delivered) → trimmed off; untrimmable → dropped, broken
//!                         SPLICES[cookie] armed, userspace caught up (consumed == passed)
//!                             → redirect to SPLICE_SOCKS[peer], out of the peer socket
//!                         otherwise → this socket's own receive queue, passed += len
//! ```
//!
//! Every per-connection map is sized from `MAX_CONNECTIONS`, and none is an LRU that could
//! evict a record still in use (PASSED_EARLY is an LRU on purpose: losing one of its entries
//! only sends that connection through the socket path).
//!
//! The splice half moves TLS passthrough streams between a client and its upstream without
//! userspace copying them. Userspace puts both sockets into SPLICE_SOCKS, writes the first
//! record itself, then arms each side with the count of bytes it has forwarded; the kernel
//! redirects only while that count matches what it handed userspace, so no byte overtakes
//! another.
//!
//! Map names are part of the userspace contract (`ingress::gate`), and `HostKey` / `GateEvent`
//! names are part of the xtask's BTF rewrite.
#![no_std]
#![no_main]
// Atomic compare-and-swap on map values (work.rs): the bpf target declares no atomic types.
#![feature(core_intrinsics)]
#![expect(
    internal_features,
    reason = "core::intrinsics is the only atomic CAS on this target"
)]

mod early;
mod hello;
mod proxy;
mod segment;
mod work;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        __sk_buff, BPF_ANY, BPF_F_CLONE, BPF_F_NO_PREALLOC, BPF_NOEXIST,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_TCP_CLOSE, TC_ACT_UNSPEC, bpf_map_type::BPF_MAP_TYPE_SK_STORAGE, bpf_sock, sk_action,
        xdp_action,
    },
    btf_maps::{
        Array, HashMap, LpmTrie, LruHashMap, PerCpuArray, RingBuf, SockHash, lpm_trie::Key,
    },
    helpers::{
        bpf_probe_read_kernel,
        generated::{
            bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_sk_storage_delete, bpf_sk_storage_get,
            bpf_skb_load_bytes,
        },
    },
    macros::{btf_map, classifier, sock_ops, stream_parser, stream_verdict, xdp},
    programs::{SkBuffContext, SockOpsContext, TcContext, XdpContext},
};
use aya_log_ebpf::debug;
use core::ptr::{null_mut, read_volatile};
use hello::{Frame, Outcome, Packet, ProbeBuffer, Skb, Workspace};
use ingress_common::{
    FlowKey, GateConfig, GateEvent, HostKey, HostValue, MAX_CONNECTIONS, MAX_DELIVERY_LEN,
    MAX_SOURCE_ENTRIES, SourceData, SourceValue, SpliceEntry, SpliceState, VerdictRecord, action,
    counter, reason, source_verdict,
};
use proxy::After;

const AF_INET: u32 = 2;

/// Per-connection maps are sized from one constant, so none fills before another.
const CONNS: usize = MAX_CONNECTIONS as usize;

#[btf_map]
static HOSTS: HashMap<HostKey, HostValue, 65536, { BPF_F_NO_PREALLOC as usize }> = HashMap::new();
/// Each judged host's source ranges, by policy id (the id in its HostValue): one
/// longest-prefix lookup per connection decides, with no loop over ranges.
#[btf_map]
static SOURCES: LpmTrie<SourceData, SourceValue, { MAX_SOURCE_ENTRIES as usize }> = LpmTrie::new();
#[btf_map]
static CONFIG: Array<GateConfig, 1> = Array::new();
#[btf_map]
static SOCKS: SockHash<u64, CONNS> = SockHash::new();
/// Not an LRU: a pending record evicted under load would make userspace treat a gated socket
/// as ungated and take it out of SOCKS with its half-assembled ClientHello.
#[btf_map]
static VERDICTS: HashMap<u64, VerdictRecord, CONNS> = HashMap::new();
/// Verdict events, and for admitted connections the first record behind each (see `Delivery`):
/// room for a few thousand ClientHellos between two drains.
#[btf_map]
static EVENTS: RingBuf<GateEvent, { 1 << 23 }> = RingBuf::new();
#[btf_map]
static COUNTERS: PerCpuArray<u64, { counter::LEN as usize }> = PerCpuArray::new();
/// Connections the TC program passed before their socket existed; sock_ops takes the verdict
/// from here and leaves the socket out of SOCKS. An LRU on purpose: entries for segments TCP
/// then discarded have no other way out, and a lost entry only means the socket path decides.
#[btf_map]
static PASSED_EARLY: LruHashMap<FlowKey, VerdictRecord, CONNS> = LruHashMap::new();
#[btf_map]
static PROBE: Array<GateEvent, 1> = Array::new();
#[btf_map]
static SPLICE_SOCKS: SockHash<u64, CONNS> = SockHash::new();
#[btf_map]
static SPLICES: HashMap<u64, SpliceEntry, CONNS, { BPF_F_NO_PREALLOC as usize }> = HashMap::new();
/// The TCP sequence number where the next stream-parser message of a decided gated socket
/// starts: the parser is shown whole skbs, and a message can start inside one.
#[btf_map]
static NEXT_MESSAGE: HashMap<u64, u32, CONNS> = HashMap::new();
#[btf_map]
static SPLICE_STATE: HashMap<u64, SpliceState, CONNS, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();
/// The proxy's own listeners: userspace marks each one (keyed by its fd), and the mark is
/// cloned to every child the listener makes, so sock_ops knows a connection is the proxy's and
/// not another listener's on the same port.
#[btf_map]
static LISTENERS: ListenerMarks = ListenerMarks::new();

/// A socket-local storage map whose values are cloned from a listener to its children
/// (`BPF_F_CLONE`), which aya's `SkStorage` cannot ask for. Same layout as aya's BTF map
/// definitions: the loader reads the map's shape from these fields' types.
#[repr(C)]
pub struct ListenerMarks {
    r#type: *const [i32; BPF_MAP_TYPE_SK_STORAGE as usize],
    key: *const i32,
    value: *const u32,
    max_entries: *const [i32; 0],
    map_flags: *const [i32; (BPF_F_NO_PREALLOC | BPF_F_CLONE) as usize],
}

// SAFETY: placeholder pointers the loader patches; never dereferenced from Rust.
unsafe impl Sync for ListenerMarks {}

impl ListenerMarks {
    const fn new() -> ListenerMarks {
        ListenerMarks {
            r#type: core::ptr::null(),
            key: core::ptr::null(),
            value: core::ptr::null(),
            max_entries: core::ptr::null(),
            map_flags: core::ptr::null(),
        }
    }

    #[inline(always)]
    fn as_ptr(&self) -> *mut core::ffi::c_void {
        core::ptr::from_ref(self).cast_mut().cast()
    }

    /// Whether `sk` carries the proxy's mark (its own, or cloned from its listener).
    #[inline(always)]
    fn marked(&self, sk: *mut bpf_sock) -> bool {
        // SAFETY: a socket pointer from the program's context; no value to create.
        !sk.is_null()
            && !unsafe { bpf_sk_storage_get(self.as_ptr(), sk.cast(), null_mut(), 0) }.is_null()
    }
}

/// `offsetof(struct sk_buff, cb)`: where TCP keeps a received skb's sequence numbers
/// (`TCP_SKB_CB(skb)->seq`, then `end_seq`). Stable across kernels for years (6.18 included);
/// each read is checked against the skb's length, so a kernel that moved it is noticed
/// (SEQ_UNREADABLE) instead of trusted.
const SKB_CB_OFFSET: usize = 40;
/// `bpf_skb_adjust_room` on an sk_skb trims at most this many bytes per call.
const TRIM_STEP: u32 = 0xfff;
/// Calls per message: up to about 256 KiB trimmed, past the largest GRO skb a receive queue
/// holds.
const TRIM_STEPS: u32 = 64;

#[sock_ops]
pub fn gate_sock_ops(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB => gate_socket(&ctx),
        BPF_SOCK_OPS_STATE_CB if ctx.arg(1) == BPF_TCP_CLOSE => {
            // SAFETY: the context pointer the kernel handed the program.
            let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
            if VERDICTS.remove(cookie).is_ok() {
                count(counter::RECORD_REAPED);
            }
            let _ = NEXT_MESSAGE.remove(cookie);
            // A spliced client socket: the kernel has unlinked it from SPLICE_SOCKS as it
            // closed, so nothing can recreate these any more.
            let _ = SPLICES.remove(cookie);
            let _ = SPLICE_STATE.remove(cookie);
        }
        _ => {}
    }
    1
}

fn gate_socket(ctx: &SockOpsContext) {
    let Some(config) = CONFIG.get(0) else { return };
    if config.netns_cookie != 0
        // SAFETY: the context pointer the kernel handed the program.
        && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } != config.netns_cookie
    {
        return;
    }
    if !port_gated(config, ctx.local_port()) {
        return;
    }
    // SAFETY: `ops` is the kernel's bpf_sock_ops for this callback; `sk` is a context field.
    let sk = unsafe { read_volatile(&raw const (*ctx.ops).__bindgen_anon_2.sk) };
    if !LISTENERS.marked(sk) {
        // Another listener's connection on the same port: none of the gate's business.
        count(counter::OTHER_LISTENER);
        return;
    }
    // The child needs no copy of the mark once it is known to be the proxy's.
    // SAFETY: as above; `sk` is not null (it carries the mark).
    let _ = unsafe { bpf_sk_storage_delete(LISTENERS.as_ptr(), sk.cast()) };
    // SAFETY: as above.
    let mut cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if passed_early(ctx, cookie) {
        return;
    }
    // Pending first: it tells userspace this socket is gated (a userspace lookup in a SOCKHASH
    // with 4-byte values always fails, so SOCKS itself cannot say), and a socket must never be
    // in SOCKS without one. Without a record the socket stays out of SOCKS: userspace decides.
    let pending = VerdictRecord {
        action: action::UNSET,
        reason: 0,
        generation: 0,
        record_len: 0,
        delivered: 0,
    };
    if VERDICTS
        .insert(cookie, pending, u64::from(BPF_NOEXIST))
        .is_err()
    {
        count(counter::RECORD_FAILED);
        return;
    }
    // SAFETY: `ops` is the kernel's bpf_sock_ops for this callback.
    let ops = unsafe { &mut *ctx.ops };
    match SOCKS.update(&mut cookie, ops, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            count(counter::SOCK_ADDED);
            // Ask for the close callback so the records never outlive the socket.
            let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
            debug!(ctx, "gated socket {} on port {}", cookie, ctx.local_port());
        }
        Err(_) => {
            let _ = VERDICTS.remove(cookie);
            count(counter::SOCK_ADD_FAILED);
        }
    }
}

/// Takes the TC program's pass verdict for this socket, if it gave one: recorded for userspace
/// (VERDICTS and an event, with `record_len` 0: nothing to take back out of a psock) and counted;
/// the socket stays out of SOCKS.
#[inline(always)]
fn passed_early(ctx: &SockOpsContext, cookie: u64) -> bool {
    let flow = flow_of(ctx);
    let Some(record) = PASSED_EARLY.get_ptr(flow) else {
        return false;
    };
    // SAFETY: a live map value, copied out at once.
    let record = unsafe { *record };
    let _ = PASSED_EARLY.remove(flow);
    if VERDICTS.insert(cookie, record, u64::from(BPF_ANY)).is_err() {
        count(counter::RECORD_FAILED);
    }
    let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
    match EVENTS.reserve(0) {
        Some(mut entry) => {
            // SAFETY: a GateEvent-sized reservation, every field written before submit.
            unsafe {
                let e = &mut *entry.as_mut_ptr();
                e.cookie = cookie;
                e.action = record.action;
                e.reason = record.reason;
                e._reserved = 0;
                e.generation = record.generation;
                e.record_len = 0;
                e.family = ctx.family();
                e.local_port = flow.local_port;
                e.remote_port = flow.remote_port;
                e.local_ip = flow.local_ip;
                e.remote_ip = flow.remote_ip;
                e.name_len = 0;
                e.payload_len = 0;
                hello::zero_key(&mut *(&raw mut e.name).cast::<HostKey>());
            }
            entry.submit(0);
        }
        None => count(counter::EVENT_LOST),
    }
    count(counter::for_reason(record.reason));
    count(counter::PASSED_BEFORE_ACCEPT);
    true
}

/// The socket's FlowKey, as `segment::read` builds it from the packet that created it. Every
/// context field is read once, unconditionally and on its own: the verifier only allows
/// fixed-offset context loads, and loads inside the family branches get merged into one with a
/// variable offset.
#[inline(always)]
fn flow_of(ctx: &SockOpsContext) -> FlowKey {
    let ops = ctx.ops;
    // SAFETY: the kernel's bpf_sock_ops for this callback, read field by field.
    let (family, local4, remote4, local6, remote6, local_port, remote_port, seq) = unsafe {
        (
            read_volatile(&raw const (*ops).family),
            read_volatile(&raw const (*ops).local_ip4),
            read_volatile(&raw const (*ops).remote_ip4),
            [
                read_volatile(&raw const (*ops).local_ip6[0]),
                read_volatile(&raw const (*ops).local_ip6[1]),
                read_volatile(&raw const (*ops).local_ip6[2]),
                read_volatile(&raw const (*ops).local_ip6[3]),
            ],
            [
                read_volatile(&raw const (*ops).remote_ip6[0]),
                read_volatile(&raw const (*ops).remote_ip6[1]),
                read_volatile(&raw const (*ops).remote_ip6[2]),
                read_volatile(&raw const (*ops).remote_ip6[3]),
            ],
            read_volatile(&raw const (*ops).local_port),
            read_volatile(&raw const (*ops).remote_port),
            read_volatile(&raw const (*ops).rcv_nxt),
        )
    };
    let (local_ip, remote_ip) = if family == AF_INET {
        (FlowKey::v4_mapped(local4), FlowKey::v4_mapped(remote4))
    } else {
        (local6, remote6)
    };
    FlowKey {
        local_ip,
        remote_ip,
        local_port,
        // Network byte order in the upper 16 bits, as in `__sk_buff`.
        remote_port: u32::from(u16::from_be((remote_port >> 16) as u16)),
        // Established on the segment that carried the first data: the next byte expected is
        // that segment's first.
        seq,
    }
}

#[inline(always)]
pub(crate) fn port_gated(config: &GateConfig, port: u32) -> bool {
    let used = config.port_count as usize;
    let mut gated = false;
    for (i, &p) in config.ports.iter().enumerate() {
        if i < used && u32::from(p) == port {
            gated = true;
        }
    }
    gated
}

#[stream_parser]
pub fn gate_parser(ctx: SkBuffContext) -> u32 {
    let skb = ctx.skb.skb;
    // SAFETY: the context pointer the kernel handed the program.
    let len = unsafe { (*skb).len };
    // SAFETY: as above.
    let cookie = unsafe { bpf_get_socket_cookie(skb.cast()) };
    // After the verdict the parser is handed whole packets, not message offsets, so framing
    // later records would mis-split them: pass everything through.
    if decided(cookie).is_some() {
        return rest_of_skb(skb, cookie, len);
    }
    // Behind PROXY protocol the message is the header and the first record behind it.
    let base = proxy_header_len(Skb(skb));
    if base == FRAME_NEED_MORE {
        count(counter::PARSER_WAITED);
        return 0;
    }
    if base == FRAME_NOW {
        return len;
    }
    match hello::frame(After {
        pkt: Skb(skb),
        base,
    }) {
        Frame::NeedMore => {
            count(counter::PARSER_WAITED);
            0
        }
        Frame::Now => len,
        Frame::Record(total) => {
            let total = base + total;
            // The strparser asks again only once it holds `total` bytes, so a split record is
            // seen here exactly once, short.
            if total > len {
                count(counter::PARSER_WAITED);
            }
            total
        }
    }
}

/// `proxy_header_len`: too few bytes to find where the first record starts.
pub(crate) const FRAME_NEED_MORE: u32 = u32::MAX - 1;
/// `proxy_header_len`: the header is invalid: whatever arrived is the message, and the verdict
/// refuses it.
pub(crate) const FRAME_NOW: u32 = u32::MAX;

/// Where the first record starts: 0 without PROXY protocol (`GateConfig`), else after the
/// header; or one of the two values above.
#[inline(always)]
pub(crate) fn proxy_header_len<P: Packet>(pkt: P) -> u32 {
    let expected = CONFIG.get(0).is_some_and(|c| c.proxy_protocol != 0);
    if !expected {
        return 0;
    }
    let mut client = [0u8; 16];
    let header = proxy::header(pkt, &mut client);
    match header.status {
        proxy::SKIP => header.len,
        proxy::NEED_MORE => FRAME_NEED_MORE,
        _ => FRAME_NOW,
    }
}

#[stream_verdict]
pub fn gate_verdict(ctx: SkBuffContext) -> u32 {
    let skb = ctx.skb.skb;
    // SAFETY: the context pointer the kernel handed the program.
    let cookie = unsafe { bpf_get_socket_cookie(skb.cast()) };
    if let Some(action) = decided(cookie) {
        return sk_result(action);
    }
    let Some(claim) = work::claim() else {
        defer(skb, cookie);
        return sk_action::SK_PASS;
    };
    // SAFETY: the claimed slot is this run's alone until it is released below.
    let result = judge_message(&ctx, cookie, unsafe { &mut *claim.work });
    work::release(claim);
    result
}

/// The verdict on a socket's first message, with this run's own workspace. An admitted
/// record goes to userspace in the verdict's event and is dropped from the socket (see
/// `ingress_common::Delivery` for why); if the ring buffer has no room, it is passed to the
/// socket for userspace to read, as it used to be.
#[inline(always)]
fn judge_message(ctx: &SkBuffContext, cookie: u64, work: &mut Workspace) -> u32 {
    let skb = ctx.skb.skb;
    client_of(skb, work);
    let Some(decision) = decide(Skb(skb), work) else {
        return sk_action::SK_PASS;
    };
    let delivered = decision.action != action::DROP && deliver(skb, cookie, &decision, work);
    let record = VerdictRecord {
        action: decision.action,
        reason: decision.reason,
        generation: decision.generation,
        record_len: decision.record_len,
        delivered: u32::from(delivered),
    };
    if VERDICTS.insert(cookie, record, u64::from(BPF_ANY)).is_err() {
        count(counter::RECORD_FAILED);
    }
    if decision.action != action::DROP {
        next_message(skb, cookie, decision.record_len);
    }
    if !delivered {
        match EVENTS.reserve(0) {
            Some(mut entry) => {
                fill_event(entry.as_mut_ptr(), cookie, &decision);
                fill_addresses(entry.as_mut_ptr(), skb);
                entry.submit(0);
            }
            None => count(counter::EVENT_LOST),
        }
        if decision.action != action::DROP {
            count(counter::UNDELIVERED);
        }
    }
    count(counter::for_reason(decision.reason));
    if decision.action == action::DROP {
        count(counter::DROPPED);
    }
    debug!(
        ctx,
        "verdict socket {} reason {} action {} bytes {}",
        cookie,
        decision.reason,
        decision.action,
        decision.record_len
    );
    if delivered {
        // Userspace has the bytes; the socket must not see them a second time.
        sk_action::SK_DROP
    } else {
        sk_result(decision.action)
    }
}

/// Writes the verdict's event followed by the whole message (the first record) to EVENTS;
/// `false` if it is too long or the ring buffer has no room.
#[inline(always)]
fn deliver(skb: *mut __sk_buff, cookie: u64, decision: &Decision, work: &mut Workspace) -> bool {
    let len = decision.record_len;
    // SAFETY: the context pointer the kernel handed the program.
    let message = unsafe { (*skb).len };
    // The message is exactly the record (the parser framed it); anything else stays with the
    // socket.
    if len == 0 || len != message || len > MAX_DELIVERY_LEN {
        return false;
    }
    let delivery = &raw mut work.delivery;
    // SAFETY: the event and the record are fields of this run's own workspace; `decision.key`
    // points at another field of it.
    unsafe {
        let event = &raw mut (*delivery).event;
        fill_event(event, cookie, decision);
        fill_addresses(event, skb);
        (*event).payload_len = len;
        let record = (&raw mut (*delivery).record).cast::<u8>();
        if bpf_skb_load_bytes(skb.cast(), 0, record.cast(), len) != 0 {
            return false;
        }
        let bytes = core::slice::from_raw_parts(
            delivery.cast::<u8>(),
            core::mem::size_of::<GateEvent>() + len as usize,
        );
        EVENTS.output_untyped::<[u8]>(bytes, 0).is_ok()
    }
}

/// No workspace was free: the first message goes to the socket as for a pass, and the record
/// tells userspace to read it and decide itself.
#[inline(always)]
fn defer(skb: *mut __sk_buff, cookie: u64) {
    // SAFETY: the context pointer the kernel handed the program.
    let len = unsafe { (*skb).len };
    let record = VerdictRecord {
        action: action::DEFER,
        reason: reason::UNKNOWN,
        generation: 0,
        record_len: len,
        delivered: 0,
    };
    if VERDICTS.insert(cookie, record, u64::from(BPF_ANY)).is_err() {
        count(counter::RECORD_FAILED);
    }
    next_message(skb, cookie, len);
    match EVENTS.reserve(0) {
        Some(mut entry) => {
            let decision = Decision {
                action: action::DEFER,
                reason: reason::UNKNOWN,
                generation: 0,
                record_len: len,
                name_len: 0,
                key: core::ptr::null(),
            };
            fill_event(entry.as_mut_ptr(), cookie, &decision);
            fill_addresses(entry.as_mut_ptr(), skb);
            entry.submit(0);
        }
        None => count(counter::EVENT_LOST),
    }
    count(counter::DEFERRED);
}

/// Where the message after the first record starts. The first message starts the stream, and
/// is the first record: the next one starts right after it. The message may have been
/// gathered from several skbs, so the lengths cannot be checked against the first one's
/// sequence numbers here.
#[inline(always)]
fn next_message(skb: *mut __sk_buff, cookie: u64, record_len: u32) {
    if let Some([seq, _]) = tcp_seqs(skb) {
        let next = seq.wrapping_add(record_len);
        let _ = NEXT_MESSAGE.insert(cookie, next, u64::from(BPF_ANY));
    }
}

/// What the parser asks for on a decided socket: the rest of the skb from where the message
/// starts. Returning the skb's whole length for a message that starts inside it (bytes that
/// came in the same skb as the first record, or a retransmission overlapping bytes already
/// read) would make the strparser wait for that many more bytes, holding the tail of the
/// stream until then, and losing it when the socket leaves SOCKS.
#[inline(always)]
fn rest_of_skb(skb: *mut __sk_buff, cookie: u64, len: u32) -> u32 {
    let Some(next) = NEXT_MESSAGE.get_ptr_mut(cookie) else {
        return len;
    };
    let Some([seq, end_seq]) = tcp_seqs(skb) else {
        return len;
    };
    // A fresh skb: its sequence numbers span exactly its data (and a FIN).
    let span = end_seq.wrapping_sub(seq);
    if span != len && span != len.wrapping_add(1) {
        count(counter::SEQ_UNREADABLE);
        return len;
    }
    // SAFETY: a live map value of this socket; the parser runs for one socket at a time.
    let start = unsafe { *next }.wrapping_sub(seq);
    // SAFETY: as above.
    unsafe { *next = seq.wrapping_add(len) };
    if start == 0 || start >= len {
        return len;
    }
    len - start
}

/// `TCP_SKB_CB(skb)->seq` and `end_seq` of the kernel skb behind the context. Stream-parser
/// clones carry them too (the strparser's own state lives further into `cb`).
#[inline(always)]
fn tcp_seqs(skb: *mut __sk_buff) -> Option<[u32; 2]> {
    // SAFETY: the program's context is the kernel's `struct sk_buff`; the helper reads kernel
    // memory without faulting and reports a failed read.
    unsafe {
        bpf_probe_read_kernel(
            skb.cast::<u8>()
                .wrapping_add(SKB_CB_OFFSET)
                .cast::<[u32; 2]>(),
        )
    }
    .ok()
}

/// Steers a spliced socket's bytes: to the peer while userspace has forwarded everything it was
/// handed (so nothing overtakes it), to userspace otherwise. Runs on whole skbs, in order, for
/// one socket at a time.
#[stream_verdict]
pub fn splice_verdict(ctx: SkBuffContext) -> u32 {
    let skb = ctx.skb.skb;
    // SAFETY: the context pointer the kernel handed the program.
    let cookie = unsafe { bpf_get_socket_cookie(skb.cast()) };
    // SAFETY: as above.
    let len = unsafe { (*skb).len };
    // A data-less skb carries only a FIN, which TCP has already recorded (userspace reads EOF
    // either way). Redirected, or passed while the socket's queue is busy, the kernel would
    // process it as a zero-byte send or receive, which it treats as a broken pipe.
    if len == 0 {
        return sk_action::SK_DROP;
    }
    // Userspace seeds the entry before the socket joins SPLICE_SOCKS and deletes it only after
    // the socket left, so a missing entry means the splice is being taken down: the bytes go
    // to userspace, which has stopped forwarding. Never recreate it: nothing would delete it.
    let Some(state) = SPLICE_STATE.get_ptr_mut(cookie) else {
        count(counter::SPLICE_PASSED);
        return sk_action::SK_PASS;
    };
    // SAFETY: a live map value of this socket, only ever written by this program (after
    // userspace seeded it), which the kernel runs for one socket at a time.
    let state = unsafe { &mut *state };
    if state.broken != 0 {
        return sk_action::SK_DROP;
    }
    let len = match trim_delivered(&ctx, state, len) {
        Trimmed::Len(len) => len,
        Trimmed::Nothing => return sk_action::SK_DROP,
        Trimmed::Failed => {
            state.broken = 1;
            count(counter::SPLICE_UNTRIMMABLE);
            return sk_action::SK_DROP;
        }
    };
    if let Some(entry) = SPLICES.get_ptr(cookie) {
        // SAFETY: a live map value, copied out at once.
        let entry = unsafe { *entry };
        if entry.consumed == state.passed {
            let mut peer = entry.peer;
            if SPLICE_SOCKS.redirect_skb(&ctx, &mut peer, 0) == i64::from(sk_action::SK_PASS) {
                count(counter::SPLICE_REDIRECTED);
                return sk_action::SK_PASS;
            }
            count(counter::SPLICE_NO_PEER);
        }
    }
    state.passed += u64::from(len);
    count(counter::SPLICE_PASSED);
    sk_action::SK_PASS
}

/// What is left of a message once the bytes the stream already delivered are cut off.
enum Trimmed {
    /// This many new bytes.
    Len(u32),
    /// None: the whole message had been delivered.
    Nothing,
    /// The overlap could not be cut off.
    Failed,
}

/// Cuts off the head of a message that repeats bytes already delivered, and records where the
/// stream now stands. TCP queues a retransmission that overlaps received bytes with its old
/// head still attached and skips it by offset when reading, but the skb handed to this program
/// keeps it; forwarded whole, those bytes would arrive twice.
#[inline(always)]
fn trim_delivered(ctx: &SkBuffContext, state: &mut SpliceState, len: u32) -> Trimmed {
    let Some([seq, end_seq]) = tcp_seqs(ctx.skb.skb) else {
        count(counter::SEQ_UNREADABLE);
        return Trimmed::Len(len);
    };
    // end_seq covers the data and a FIN; anything else means these are not sequence numbers.
    let span = end_seq.wrapping_sub(seq);
    if span != len && span != len.wrapping_add(1) {
        count(counter::SEQ_UNREADABLE);
        return Trimmed::Len(len);
    }
    let known = state.seq_known != 0;
    let overlap = state.next_seq.wrapping_sub(seq);
    // Each message ends past what was delivered (TCP drops a retransmission that adds
    // nothing), so the stream's position only moves forward.
    state.next_seq = seq.wrapping_add(len);
    state.seq_known = 1;
    // Sequence arithmetic: the overlap is real only if next_seq is after seq (mod 2^32).
    if !known || overlap == 0 || overlap >= 1 << 31 {
        return Trimmed::Len(len);
    }
    let overlap = overlap.min(len);
    let mut left = overlap;
    for _ in 0..TRIM_STEPS {
        if left == 0 {
            break;
        }
        let step = left.min(TRIM_STEP);
        if ctx.adjust_room(-(step as i32), 0, 0).is_err() {
            return Trimmed::Failed;
        }
        left -= step;
    }
    if left != 0 {
        return Trimmed::Failed;
    }
    count(counter::SPLICE_TRIMMED);
    if overlap == len {
        Trimmed::Nothing
    } else {
        Trimmed::Len(len - overlap)
    }
}

/// Refuses, before any socket exists, a connection whose first data the stream verdict would
/// drop, and records a pass for sock_ops (see `early`). Always returns "next": other TC
/// programs on the device still run.
#[classifier]
pub fn gate_early(ctx: TcContext) -> i32 {
    let _ = early::judge(&ctx);
    TC_ACT_UNSPEC
}

/// Runs the verdict's decision on a raw buffer (`BPF_PROG_TEST_RUN`, layout in
/// [`hello::ProbeBuffer`]) and writes it to PROBE. Nothing attaches it; it exists so one corpus
/// can hold the kernel and userspace parsers to the same answers without a socket per case.
#[xdp(frags)]
pub fn gate_probe(ctx: XdpContext) -> u32 {
    let Some(claim) = work::claim() else {
        return xdp_action::XDP_PASS;
    };
    // SAFETY: the claimed slot is this run's alone until it is released below.
    let work = unsafe { &mut *claim.work };
    // The corpus judges names, not addresses: `::`, which no source range admits or refuses
    // unless it names it.
    work.client = [0; 16];
    if let Some(decision) = ProbeBuffer::new(ctx.ctx).and_then(|buffer| decide(buffer, work))
        && let Some(slot) = PROBE.get_ptr_mut(0)
    {
        fill_event(slot, 0, &decision);
    }
    work::release(claim);
    xdp_action::XDP_PASS
}

pub(crate) struct Decision {
    action: u32,
    reason: u32,
    generation: u32,
    record_len: u32,
    name_len: u32,
    /// The name, in the run's workspace, for the event.
    key: *const HostKey,
}

#[inline(always)]
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "by value, each 256-byte key would be copied onto the 512-byte stack"
)]
pub(crate) fn decide<P: Packet>(pkt: P, work: &mut Workspace) -> Option<Decision> {
    let config = CONFIG.get(0)?;
    // Behind PROXY protocol: the header must be there and valid (userspace closes a
    // connection without one, whatever its policy for unnamed ClientHellos), and the client
    // it names is the one source ranges judge.
    let mut base = 0;
    let mut sources_known = true;
    if config.proxy_protocol != 0 {
        let header = proxy::header(pkt, &mut work.client);
        if header.status == proxy::SKIP {
            base = header.len;
            sources_known = header.known != 0 || header.named == 0;
        } else {
            count(counter::PROXY_HEADER_REFUSED);
            return Some(Decision {
                action: action::DROP,
                reason: reason::MALFORMED,
                generation: config.generation,
                record_len: pkt.len(),
                name_len: 0,
                key: &raw const work.key,
            });
        }
    }
    let classified = hello::classify(After { pkt, base }, work);
    let mut decision = Decision {
        action: action::PASS,
        reason: reason::UNKNOWN,
        generation: config.generation,
        record_len: base + classified.record_len,
        name_len: 0,
        key: &raw const work.key,
    };
    let name_len = match classified.outcome {
        Outcome::Name(len) => len,
        Outcome::NoSni => return Some(by_policy(decision, reason::NO_SNI, config.no_sni)),
        Outcome::Malformed => {
            return Some(by_policy(decision, reason::MALFORMED, config.malformed));
        }
        Outcome::NotTls => return Some(by_policy(decision, reason::NOT_TLS, config.not_tls)),
    };
    decision.name_len = name_len;
    let host = match HOSTS.get_ptr(&work.key) {
        Some(host) => Some(host),
        None if hello::wildcard(work, name_len) => HOSTS.get_ptr(&work.wild),
        None => None,
    };
    match host {
        Some(host) => {
            // SAFETY: a live map value, copied out at once.
            let host = unsafe { *host };
            // A client the kernel could not read from the header (v1 TCP6): the access
            // phase judges its source after accept.
            if host.policy != 0 && sources_known && source_refused(host.policy, work) {
                decision.action = action::DROP;
                decision.reason = reason::SOURCE_REFUSED;
            } else if host.action == action::PASSTHROUGH {
                decision.action = action::PASSTHROUGH;
                decision.reason = reason::PASSTHROUGH;
            } else {
                decision.reason = reason::PASS;
            }
        }
        None => {
            decision.action = if config.catch_all != 0 {
                action::PASS
            } else {
                action::DROP
            };
        }
    }
    Some(decision)
}

/// Whether the client in `work.client` is refused by source policy `policy`. Every policy has
/// a `/0` entry, so a lookup without a match (a policy userspace is still writing) admits: the
/// access phase judges such a connection after accept.
#[inline(always)]
fn source_refused(policy: u32, work: &Workspace) -> bool {
    let key = Key::new(
        SourceData::FULL_BITS,
        SourceData {
            policy,
            addr: work.client,
        },
    );
    SOURCES
        .get(&key)
        .is_some_and(|value| value.verdict == source_verdict::REFUSE)
}

/// The configured action for a case without a name: only an explicit drop drops.
#[inline(always)]
fn by_policy(mut decision: Decision, why: u32, configured: u32) -> Decision {
    decision.reason = why;
    decision.action = if configured == action::DROP {
        action::DROP
    } else {
        action::PASS
    };
    decision
}

/// The action already decided for a socket; `None` while it is pending or unknown.
#[inline(always)]
fn decided(cookie: u64) -> Option<u32> {
    let record = VERDICTS.get_ptr(cookie)?;
    // SAFETY: a live map value; only its action is read.
    let action = unsafe { (*record).action };
    (action != action::UNSET).then_some(action)
}

#[inline(always)]
fn sk_result(action: u32) -> u32 {
    if action == action::DROP {
        sk_action::SK_DROP
    } else {
        sk_action::SK_PASS
    }
}

#[inline(always)]
fn fill_event(event: *mut GateEvent, cookie: u64, decision: &Decision) {
    // SAFETY: `event` points at a GateEvent-sized reservation or map value, and `decision.key`
    // into the run's workspace.
    unsafe {
        let e = &mut *event;
        e.cookie = cookie;
        e.action = decision.action;
        e.reason = decision.reason;
        e._reserved = 0;
        e.generation = decision.generation;
        e.record_len = decision.record_len;
        e.family = 0;
        e.local_port = 0;
        e.remote_port = 0;
        e.local_ip = [0; 4];
        e.remote_ip = [0; 4];
        e.name_len = decision.name_len;
        e.payload_len = 0;
        if decision.name_len != 0 && !decision.key.is_null() {
            hello::copy_key(&raw mut e.name, &*decision.key);
        } else {
            hello::zero_key(&mut *(&raw mut e.name).cast::<HostKey>());
        }
    }
}

/// The connection's addresses. Each context field is read on its own: the verifier only allows
/// fixed-offset loads from the context, never a copy through a derived pointer.
#[inline(always)]
fn fill_addresses(event: *mut GateEvent, skb: *mut __sk_buff) {
    // SAFETY: as in `fill_event`; `skb` is the program's context.
    unsafe {
        let e = &mut *event;
        let family = read_volatile(&raw const (*skb).family);
        e.family = family;
        e.local_port = read_volatile(&raw const (*skb).local_port);
        // The kernel keeps the remote port in network order in the upper 16 bits.
        let remote = read_volatile(&raw const (*skb).remote_port);
        e.remote_port = u32::from(u16::from_be((remote >> 16) as u16));
        if family == AF_INET {
            e.local_ip[0] = read_volatile(&raw const (*skb).local_ip4);
            e.remote_ip[0] = read_volatile(&raw const (*skb).remote_ip4);
        } else {
            e.local_ip[0] = read_volatile(&raw const (*skb).local_ip6[0]);
            e.local_ip[1] = read_volatile(&raw const (*skb).local_ip6[1]);
            e.local_ip[2] = read_volatile(&raw const (*skb).local_ip6[2]);
            e.local_ip[3] = read_volatile(&raw const (*skb).local_ip6[3]);
            e.remote_ip[0] = read_volatile(&raw const (*skb).remote_ip6[0]);
            e.remote_ip[1] = read_volatile(&raw const (*skb).remote_ip6[1]);
            e.remote_ip[2] = read_volatile(&raw const (*skb).remote_ip6[2]);
            e.remote_ip[3] = read_volatile(&raw const (*skb).remote_ip6[3]);
        }
    }
}

/// The socket's remote address into `work.client`, v4-mapped for IPv4 as SOURCES keys it.
/// Every field is read whatever the family, and the choice made on the values: reads chosen by
/// a branch get merged by the compiler into one load at a variable context offset, which the
/// verifier refuses.
#[inline(always)]
fn client_of(skb: *mut __sk_buff, work: &mut Workspace) {
    // SAFETY: fixed-offset reads of the program's context, as in `fill_addresses`.
    let (family, v4, v6) = unsafe {
        (
            read_volatile(&raw const (*skb).family),
            read_volatile(&raw const (*skb).remote_ip4),
            [
                read_volatile(&raw const (*skb).remote_ip6[0]),
                read_volatile(&raw const (*skb).remote_ip6[1]),
                read_volatile(&raw const (*skb).remote_ip6[2]),
                read_volatile(&raw const (*skb).remote_ip6[3]),
            ],
        )
    };
    let ip = if family == AF_INET {
        FlowKey::v4_mapped(v4)
    } else {
        v6
    };
    work.client = address_bytes(ip);
}

/// Four network-order words as the sixteen bytes they hold in memory.
#[inline(always)]
pub(crate) fn address_bytes(ip: [u32; 4]) -> [u8; 16] {
    let mut out = [0u8; 16];
    let [a, b, c, d] = ip.map(u32::to_ne_bytes);
    out[..4].copy_from_slice(&a);
    out[4..8].copy_from_slice(&b);
    out[8..12].copy_from_slice(&c);
    out[12..].copy_from_slice(&d);
    out
}

#[inline(always)]
pub(crate) fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot; nothing else on this CPU runs concurrently with this program.
        unsafe { *slot += 1 };
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // Unreachable in a verified program: the verifier rejects any path into this loop.
    loop {}
}
