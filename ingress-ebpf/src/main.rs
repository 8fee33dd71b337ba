//! The kernel half of the SNI gate.
//!
//! ```text
//!  sock_ops (cgroup)      PASSIVE_ESTABLISHED on a gated port, in the proxy's netns
//!     │                       passed early (PASSED_EARLY[flow]) → VERDICTS[cookie] = pass,
//!     │                         EVENTS, ask for STATE_CB; the socket stays out of SOCKS
//!     │                       otherwise → SOCKS[cookie] = socket, VERDICTS[cookie] = pending,
//!     │                         ask for STATE_CB
//!     │                   STATE_CB to TCP_CLOSE → delete VERDICTS[cookie]
//!     ▼
//!  stream parser (SOCKS)  pending → frame the first TLS record (0 = need more)
//!     │                   verdict exists → pass everything through unframed, from where
//!     │                   the message starts in the skb (NEXT_MESSAGE)
//!     ▼
//!  stream verdict         classify the ClientHello → HOSTS (exact, then *.parent) → policy
//!                             → VERDICTS[cookie], EVENTS, COUNTERS; SK_PASS / SK_DROP
//!  gate_early (TC ingress, before any of the above; a shortcut, never the only path)
//!                         the first data of a connection still in the SYN queue (the listener
//!                         defers accept) holding a whole first record: the verdict's decision
//!                         drop → set SYN on it: the kernel answers RST and forgets the request,
//!                              so no socket, no accept, no userspace work
//!                         pass → PASSED_EARLY[flow] for sock_ops; anything else goes on
//!  gate_probe (XDP, never attached): the same decision on a raw buffer through
//!                         BPF_PROG_TEST_RUN, result in PROBE, for the shared corpus
//!
//!  splice_verdict (SPLICE_SOCKS, no parser: whole skbs in order, no strparser)
//!                         bytes before SPLICE_STATE.next_seq (a retransmission overlapping what
//!                             was delivered) → trimmed off; untrimmable → dropped, broken
//!                         SPLICES[cookie] armed, userspace caught up (consumed == passed)
//!                             → redirect to SPLICE_SOCKS[peer], out of the peer socket
//!                         otherwise → this socket's own receive queue, passed += len
//! ```
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

mod hello;
mod segment;

use aya_ebpf::{
    EbpfContext as _,
    bindings::{
        __sk_buff, BPF_ANY, BPF_F_CURRENT_NETNS, BPF_F_NO_PREALLOC, BPF_NOEXIST,
        BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB, BPF_SOCK_OPS_STATE_CB, BPF_SOCK_OPS_STATE_CB_FLAG,
        BPF_TCP_CLOSE, BPF_TCP_NEW_SYN_RECV, TC_ACT_UNSPEC, sk_action, xdp_action,
    },
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf, SockHash},
    helpers::{
        bpf_probe_read_kernel,
        generated::{
            bpf_get_netns_cookie, bpf_get_socket_cookie, bpf_sk_release, bpf_skc_lookup_tcp,
        },
    },
    macros::{btf_map, classifier, sock_ops, stream_parser, stream_verdict, xdp},
    programs::{SkBuffContext, SockOpsContext, TcContext, XdpContext},
};
use aya_log_ebpf::debug;
use core::ptr::read_volatile;
use hello::{Frame, Outcome, Packet, ProbeBuffer, Skb, Workspace};
use ingress_common::{
    FlowKey, GateConfig, GateEvent, HostKey, HostValue, SpliceEntry, SpliceState, VerdictRecord,
    action, counter, reason,
};

const AF_INET: u32 = 2;

#[btf_map]
static HOSTS: HashMap<HostKey, HostValue, 65536, { BPF_F_NO_PREALLOC as usize }> = HashMap::new();
#[btf_map]
static CONFIG: Array<GateConfig, 1> = Array::new();
#[btf_map]
static SOCKS: SockHash<u64, 65536> = SockHash::new();
#[btf_map]
static VERDICTS: LruHashMap<u64, VerdictRecord, 32768> = LruHashMap::new();
#[btf_map]
static EVENTS: RingBuf<GateEvent, { 1 << 19 }> = RingBuf::new();
#[btf_map]
static COUNTERS: PerCpuArray<u64, { counter::LEN as usize }> = PerCpuArray::new();
#[btf_map]
static SCRATCH: PerCpuArray<Workspace, 1> = PerCpuArray::new();
/// The TC program's own working memory: it runs in softirq, which can interrupt a stream
/// verdict that runs in process context on the same CPU.
#[btf_map]
static EARLY_SCRATCH: PerCpuArray<Workspace, 1> = PerCpuArray::new();
/// Connections the TC program passed before their socket existed; sock_ops takes the verdict
/// from here and leaves the socket out of SOCKS.
#[btf_map]
static PASSED_EARLY: LruHashMap<FlowKey, VerdictRecord, 16384> = LruHashMap::new();
#[btf_map]
static PROBE: Array<GateEvent, 1> = Array::new();
#[btf_map]
static SPLICE_SOCKS: SockHash<u64, 65536> = SockHash::new();
#[btf_map]
static SPLICES: HashMap<u64, SpliceEntry, 65536, { BPF_F_NO_PREALLOC as usize }> = HashMap::new();
/// The TCP sequence number where the next stream-parser message of a decided gated socket
/// starts: the parser is shown whole skbs, and a message can start inside one.
#[btf_map]
static NEXT_MESSAGE: LruHashMap<u64, u32, 32768> = LruHashMap::new();
#[btf_map]
static SPLICE_STATE: HashMap<u64, SpliceState, 65536, { BPF_F_NO_PREALLOC as usize }> =
    HashMap::new();

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
        }
        _ => {}
    }
    1
}

fn gate_socket(ctx: &SockOpsContext) {
    let Some(config) = CONFIG.get(0) else { return };
    // SAFETY: the context pointer the kernel handed the program.
    if config.netns_cookie != 0
        && unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } != config.netns_cookie
    {
        return;
    }
    if !port_gated(config, ctx.local_port()) {
        return;
    }
    // SAFETY: as above.
    let mut cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    if passed_early(ctx, cookie) {
        return;
    }
    // SAFETY: `ops` is the kernel's bpf_sock_ops for this callback.
    let ops = unsafe { &mut *ctx.ops };
    match SOCKS.update(&mut cookie, ops, u64::from(BPF_NOEXIST)) {
        Ok(()) => {
            count(counter::SOCK_ADDED);
            // Pending: tells userspace this socket is gated (a userspace lookup in a SOCKHASH
            // with 4-byte values always fails, so SOCKS itself cannot say).
            let pending = VerdictRecord {
                action: action::UNSET,
                reason: 0,
                route_id: 0,
                generation: 0,
                record_len: 0,
            };
            let _ = VERDICTS.insert(cookie, pending, u64::from(BPF_NOEXIST));
            // Ask for the close callback so the verdict record never outlives the socket.
            let _ = ctx.set_cb_flags((ctx.cb_flags() | BPF_SOCK_OPS_STATE_CB_FLAG) as i32);
            debug!(ctx, "gated socket {} on port {}", cookie, ctx.local_port());
        }
        Err(_) => count(counter::SOCK_ADD_FAILED),
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
                e.route_id = record.route_id;
                e.generation = record.generation;
                e.record_len = 0;
                e.family = ctx.family();
                e.local_port = flow.local_port;
                e.remote_port = flow.remote_port;
                e.local_ip = flow.local_ip;
                e.remote_ip = flow.remote_ip;
                e.name_len = 0;
                e._reserved = 0;
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
fn port_gated(config: &GateConfig, port: u32) -> bool {
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
    match hello::frame(Skb(skb)) {
        Frame::NeedMore => {
            count(counter::PARSER_WAITED);
            0
        }
        Frame::Now => len,
        Frame::Record(total) => {
            // The strparser asks again only once it holds `total` bytes, so a split record is
            // seen here exactly once, short.
            if total > len {
                count(counter::PARSER_WAITED);
            }
            total
        }
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
    // SAFETY: per-CPU scratch, used only for the length of this program run.
    let Some(work) = SCRATCH.get_ptr_mut(0).map(|w| unsafe { &mut *w }) else {
        return sk_action::SK_PASS;
    };
    let Some(decision) = decide(Skb(skb), work) else {
        return sk_action::SK_PASS;
    };
    let record = VerdictRecord {
        action: decision.action,
        reason: decision.reason,
        route_id: decision.route_id,
        generation: decision.generation,
        record_len: decision.record_len,
    };
    if VERDICTS.insert(cookie, record, u64::from(BPF_ANY)).is_err() {
        count(counter::RECORD_FAILED);
    }
    // The first message starts the stream, and is the first record: the next one starts
    // right after it. The message may have been gathered from several skbs, so the lengths
    // cannot be checked against the first one's sequence numbers here.
    if decision.action != action::DROP
        && let Some([seq, _]) = tcp_seqs(skb)
    {
        let next = seq.wrapping_add(decision.record_len);
        let _ = NEXT_MESSAGE.insert(cookie, next, u64::from(BPF_ANY));
    }
    match EVENTS.reserve(0) {
        Some(mut entry) => {
            fill_event(entry.as_mut_ptr(), cookie, &decision);
            fill_addresses(entry.as_mut_ptr(), skb);
            entry.submit(0);
        }
        None => count(counter::EVENT_LOST),
    }
    count(counter::for_reason(decision.reason));
    if decision.action == action::DROP {
        count(counter::DROPPED);
    }
    debug!(
        &ctx,
        "verdict socket {} reason {} action {} bytes {}",
        cookie,
        decision.reason,
        decision.action,
        decision.record_len
    );
    sk_result(decision.action)
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
    let state = match SPLICE_STATE.get_ptr_mut(cookie) {
        Some(state) => state,
        None => {
            // Userspace seeds the entry before the socket joins SPLICE_SOCKS; if that raced
            // with a delete, start afresh. A failed insert leaves the socket with userspace,
            // which then never sees a matching count: slow, but every byte stays in order.
            let _ = SPLICE_STATE.insert(cookie, SpliceState::default(), u64::from(BPF_ANY));
            match SPLICE_STATE.get_ptr_mut(cookie) {
                Some(state) => state,
                None => return sk_action::SK_PASS,
            }
        }
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

/// Resets, before any socket exists, a connection whose first data the stream verdict would
/// drop. With TCP_DEFER_ACCEPT on the listener the handshake's last ACK leaves the connection a
/// request in the SYN queue; its first data segment is what would create the socket. Seen here
/// first, a drop verdict turns the segment into one carrying SYN, which the kernel's request
/// handling (`tcp_check_req`) answers with an RST before dropping the request: the client is
/// reset at once, and the proxy never accepts, peeks or closes anything. A pass is left for
/// sock_ops, which then keeps the socket out of SOCKS: no psock to build, run or tear down.
///
/// Only a whole first record in one segment is judged (most ClientHellos fit one; a split one
/// is left to the socket path, which reassembles it), and only for a request socket, so an
/// established connection's data is never touched. Always returns "next": other TC programs on
/// the device still run.
#[classifier]
pub fn gate_early(ctx: TcContext) -> i32 {
    let _ = early_reset(&ctx);
    TC_ACT_UNSPEC
}

#[inline(always)]
fn early_reset(ctx: &TcContext) -> Option<()> {
    let config = CONFIG.get(0)?;
    let skb = ctx.skb.skb;
    let mut seg = segment::read(skb)?;
    let flags = seg.flags();
    if flags & segment::TCP_ACK == 0
        || flags & (segment::TCP_SYN | segment::TCP_RST) != 0
        || seg.payload.len() == 0
        || !port_gated(config, u32::from(seg.local_port))
    {
        return None;
    }
    match hello::frame(seg.payload) {
        Frame::NeedMore => return None,
        Frame::Record(total) if total > seg.payload.len() => return None,
        Frame::Now | Frame::Record(_) => {}
    }
    if !in_syn_queue(skb, &mut seg) {
        return None;
    }
    // SAFETY: per-CPU scratch, used only for the length of this program run.
    let work = unsafe { &mut *EARLY_SCRATCH.get_ptr_mut(0)? };
    let decision = decide(seg.payload, work)?;
    if decision.action == action::PASS {
        // Passthrough stays with the socket path, which hands userspace the first record.
        let record = VerdictRecord {
            action: decision.action,
            reason: decision.reason,
            route_id: decision.route_id,
            generation: decision.generation,
            record_len: 0,
        };
        let _ = PASSED_EARLY.insert(seg.flow, record, u64::from(BPF_ANY));
        return None;
    }
    if decision.action != action::DROP {
        return None;
    }
    let old = seg.flags_word;
    let new = [old[0], old[1] | segment::TCP_SYN];
    let at = (seg.tcp + segment::TCP_FLAGS_WORD) as usize;
    ctx.store(at, &new, 0).ok()?;
    // Two bytes of the sum changed; the helper leaves a partial checksum (loopback, veth)
    // alone, as it must.
    ctx.l4_csum_replace(
        (seg.tcp + segment::TCP_CHECKSUM) as usize,
        u64::from(u16::from_ne_bytes(old)),
        u64::from(u16::from_ne_bytes(new)),
        2,
    )
    .ok()?;
    count(counter::for_reason(decision.reason));
    count(counter::DROPPED);
    if let Some(slot) = counter::reset_before_accept(decision.reason) {
        count(slot);
    }
    Some(())
}

/// Whether the segment belongs to a connection the kernel has not made a socket for yet.
#[inline(always)]
fn in_syn_queue(skb: *mut __sk_buff, seg: &mut segment::Segment) -> bool {
    let tuple = &raw mut seg.tuple;
    let netns = BPF_F_CURRENT_NETNS as u64;
    // SAFETY: the context pointer the kernel handed the program and a tuple of the size given
    // (a constant in each call, as the verifier requires).
    let sk = unsafe {
        if seg.v6 {
            bpf_skc_lookup_tcp(skb.cast(), tuple, segment::TUPLE_V6, netns, 0)
        } else {
            bpf_skc_lookup_tcp(skb.cast(), tuple, segment::TUPLE_V4, netns, 0)
        }
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a referenced socket the helper returned, released right after one field read.
    let state = unsafe { read_volatile(&raw const (*sk).state) };
    // SAFETY: as above.
    unsafe { bpf_sk_release(sk.cast()) };
    state == BPF_TCP_NEW_SYN_RECV
}

/// Runs the verdict's decision on a raw buffer (`BPF_PROG_TEST_RUN`, layout in
/// [`hello::ProbeBuffer`]) and writes it to PROBE. Nothing attaches it; it exists so one corpus
/// can hold the kernel and userspace parsers to the same answers without a socket per case.
#[xdp(frags)]
pub fn gate_probe(ctx: XdpContext) -> u32 {
    // SAFETY: per-CPU scratch, used only for the length of this program run.
    let work = SCRATCH.get_ptr_mut(0).map(|w| unsafe { &mut *w });
    if let Some(decision) = ProbeBuffer::new(ctx.ctx)
        .zip(work)
        .and_then(|(buffer, work)| decide(buffer, work))
        && let Some(slot) = PROBE.get_ptr_mut(0)
    {
        fill_event(slot, 0, &decision);
    }
    xdp_action::XDP_PASS
}

struct Decision {
    action: u32,
    reason: u32,
    route_id: u32,
    generation: u32,
    record_len: u32,
    name_len: u32,
    /// The name, in SCRATCH, for the event.
    key: *const HostKey,
}

#[inline(always)]
#[expect(
    clippy::needless_borrows_for_generic_args,
    reason = "by value, each 256-byte key would be copied onto the 512-byte stack"
)]
fn decide<P: Packet>(pkt: P, work: &mut Workspace) -> Option<Decision> {
    let config = CONFIG.get(0)?;
    let classified = hello::classify(pkt, work);
    let mut decision = Decision {
        action: action::PASS,
        reason: reason::UNKNOWN,
        route_id: 0,
        generation: config.generation,
        record_len: classified.record_len,
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
            decision.route_id = host.route_id;
            if host.action == action::PASSTHROUGH {
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
    // into this CPU's SCRATCH.
    unsafe {
        let e = &mut *event;
        e.cookie = cookie;
        e.action = decision.action;
        e.reason = decision.reason;
        e.route_id = decision.route_id;
        e.generation = decision.generation;
        e.record_len = decision.record_len;
        e.family = 0;
        e.local_port = 0;
        e.remote_port = 0;
        e.local_ip = [0; 4];
        e.remote_ip = [0; 4];
        e.name_len = decision.name_len;
        e._reserved = 0;
        if decision.name_len != 0 {
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

#[inline(always)]
fn count(index: u32) {
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
