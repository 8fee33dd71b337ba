//! `gate_early`: judging a connection on its first data segment, before the kernel makes a
//! socket for it (the HTTPS listener defers accept, so the connection is still a request in
//! the SYN queue when that segment arrives).
//!
//! ```text
//!   a data segment on a gated port that starts with a whole TLS handshake record
//!     └ a request sock (NEW_SYN_RECV) of the proxy's own listener (LISTENERS mark)
//!       └ the first segment it expects: seq == rcv_isn + 1, ack == snt_isn + 1
//!         └ decide (the stream verdict's code, against the same maps)
//!             pass → PASSED_EARLY[flow] for sock_ops
//!             drop → refuse(): a copy rewritten into the server's RST|ACK leaves through the
//!                    interface the segment came in on (clone redirect), and the segment itself
//!                    becomes the client's RST|ACK at the same sequence number, which TCP takes
//!                    as the end of the request (dropped quietly) and conntrack as a valid close
//!   anything else goes on untouched; the socket path judges it after the kernel reassembled it
//! ```
//!
//! Why not set SYN on the segment and let `tcp_check_req` answer with an RST: netfilter sees
//! the segment first, and conntrack classes a client SYN on an established entry as INVALID,
//! which most node firewalls drop; the client then hangs until its timeout. The RST built here
//! never passes the server's netfilter (it leaves from TC), and the segment left behind is one
//! conntrack accepts.
//!
//! The TC hook runs before the TCP checksum check, PAWS and netfilter, so what it records can
//! belong to a segment TCP later discards: a pass here only spares the socket path, and
//! userspace checks the name of an early-passed connection again on the bytes TCP delivered.

use aya_ebpf::{
    bindings::{
        __sk_buff, BPF_ANY, BPF_F_CURRENT_NETNS, BPF_F_RECOMPUTE_CSUM, BPF_TCP_NEW_SYN_RECV,
    },
    helpers::{
        bpf_probe_read_kernel,
        generated::{
            bpf_clone_redirect, bpf_csum_diff, bpf_get_listener_sock, bpf_l4_csum_replace,
            bpf_sk_release, bpf_sk_storage_get, bpf_skb_change_tail, bpf_skb_load_bytes,
            bpf_skb_pull_data, bpf_skb_store_bytes, bpf_skc_lookup_tcp,
            bpf_skc_to_tcp_request_sock,
        },
    },
    programs::TcContext,
};
use core::ptr::{null_mut, read_volatile};
use ingress_common::{VerdictRecord, action, counter};

use crate::hello::{self, Frame, Packet as _};
use crate::proxy::After;
use crate::segment::{self, L3, Payload, Segment};
use crate::{CONFIG, LISTENERS, PASSED_EARLY, address_bytes, count, decide, port_gated, work};

/// `offsetof(struct tcp_request_sock, rcv_isn)` and `snt_isn` on the running kernel, from its
/// BTF, written by userspace at load. Until then (`u32::MAX`) nothing is judged here.
#[unsafe(no_mangle)]
static TCP_REQ_RCV_ISN: u32 = u32::MAX;
#[unsafe(no_mangle)]
static TCP_REQ_SNT_ISN: u32 = u32::MAX;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_RST_ACK: u8 = segment::TCP_RST | segment::TCP_ACK;
const IPV4_HLEN: usize = 20;
const IPV6_HLEN: usize = 40;
const TCP_HLEN: usize = 20;
/// The same lengths in the widths the headers and helpers take.
const TCP_HLEN_U8: u8 = 20;
const TCP_HLEN_U32: u32 = 20;
const V4_TOTAL_LEN: u16 = 40;
/// An RST's frame: Ethernet, an IP header without options, a TCP header without options.
const V4_FRAME: usize = L3 as usize + IPV4_HLEN + TCP_HLEN;
const V6_FRAME: usize = L3 as usize + IPV6_HLEN + TCP_HLEN;
const V4_FRAME_U32: u32 = L3 + 40;
const V6_FRAME_U32: u32 = L3 + 60;
const _: () = assert!(V4_FRAME_U32 as usize == V4_FRAME && V6_FRAME_U32 as usize == V6_FRAME);

/// Judges the segment if it is a connection's first; see the module documentation.
#[inline(always)]
pub fn judge(ctx: &TcContext) -> Option<()> {
    let config = CONFIG.get(0)?;
    let skb = ctx.skb.skb;
    if !segment::may_be_gated_data(skb, |port| port_gated(config, port)) {
        return None;
    }
    let mut seg = Segment::EMPTY;
    if !segment::read_into(skb, &mut seg) {
        return None;
    }
    let flags = seg.flags();
    if flags & segment::TCP_ACK == 0
        || flags & (segment::TCP_SYN | segment::TCP_RST) != 0
        || seg.payload.len() == 0
        || !port_gated(config, u32::from(seg.local_port))
    {
        return None;
    }
    if !judgeable(&seg.payload) {
        return None;
    }
    if !first_of_ours(skb, &mut seg) {
        return None;
    }
    let mut record = VerdictRecord {
        action: action::UNSET,
        reason: 0,
        generation: 0,
        record_len: 0,
        delivered: 0,
    };
    if !decide_segment(&seg.payload, seg.flow.remote_ip, &mut record) {
        return None;
    }
    match record.action {
        action::PASS => {
            // Passthrough stays with the socket path, which hands userspace the first record.
            // Nothing to take back out of a psock: record_len stays 0.
            let _ = PASSED_EARLY.insert(seg.flow, record, u64::from(BPF_ANY));
            None
        }
        action::DROP => {
            // A copy of this segment may have passed before the policy changed (and then been
            // lost on the way to TCP): that pass must not outlive this connection.
            let _ = PASSED_EARLY.remove(seg.flow);
            let sent = match refuse(skb, &seg) {
                Refused::Sent => true,
                Refused::Unsent => false,
                Refused::Untouched => return None,
            };
            count(counter::for_reason(record.reason));
            count(counter::DROPPED);
            match counter::reset_before_accept(record.reason) {
                Some(slot) if sent => count(slot),
                _ => count(counter::EARLY_RESET_UNSENT),
            }
            Some(())
        }
        _ => {
            let _ = PASSED_EARLY.remove(seg.flow);
            None
        }
    }
}

/// Whether the payload can be a judgeable first segment: a whole TLS handshake record at its
/// start (behind its PROXY protocol header, when the listener expects one). Established
/// connections' records (application data) are skipped before any socket lookup. A frame of
/// its own, as `first_of_ours`: the header reader's buffers would not fit in `judge`'s.
#[inline(never)]
fn judgeable(payload: &Payload) -> bool {
    let base = crate::proxy_header_len(*payload);
    if base == crate::FRAME_NEED_MORE {
        return false;
    }
    // An invalid header is refused (decide says so) if this is a connection's first segment.
    if base == crate::FRAME_NOW {
        return true;
    }
    let record = After {
        pkt: *payload,
        base,
    };
    if record.load_u8(0) != Some(22) {
        return false;
    }
    matches!(hello::frame(record), Frame::Record(total) if base + total <= payload.len())
}

/// The decision on the segment's payload, in `record` (`record_len` left 0); `false` if there
/// is none (no free workspace, no config). A frame of its own, as `first_of_ours`.
#[inline(never)]
fn decide_segment(payload: &Payload, client: [u32; 4], record: &mut VerdictRecord) -> bool {
    let Some(claim) = work::claim() else {
        return false;
    };
    // SAFETY: the claimed slot is this run's alone until it is released below.
    let work = unsafe { &mut *claim.work };
    // The flow holds the client v4-mapped, as SOURCES keys it.
    work.client = address_bytes(client);
    let decision = decide(*payload, work);
    work::release(claim);
    let Some(decision) = decision else {
        return false;
    };
    record.action = decision.action;
    record.reason = decision.reason;
    record.generation = decision.generation;
    true
}

/// Whether the segment is the first one a request sock of the proxy's own listener expects.
/// Not inlined, like `refuse`: each has a stack frame of its own, and the verifier allows 512
/// bytes for a whole chain of calls, not per function.
#[inline(never)]
fn first_of_ours(skb: *mut __sk_buff, seg: &mut Segment) -> bool {
    // SAFETY: reads of globals userspace may have rewritten before load.
    let (rcv_isn_at, snt_isn_at) = unsafe {
        (
            read_volatile(&TCP_REQ_RCV_ISN),
            read_volatile(&TCP_REQ_SNT_ISN),
        )
    };
    if rcv_isn_at == u32::MAX || snt_isn_at == u32::MAX {
        return false;
    }
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
    // SAFETY: a referenced socket the helper returned; released below on every path.
    let state = unsafe { read_volatile(&raw const (*sk).state) };
    let mut first = false;
    if state == BPF_TCP_NEW_SYN_RECV {
        // SAFETY: `sk` is a request sock: its listener (no reference taken; valid while the
        // request holds one) and the request's sequence numbers.
        unsafe {
            let listener = bpf_get_listener_sock(sk);
            let ours = !listener.is_null()
                && !bpf_sk_storage_get(LISTENERS.as_ptr(), listener.cast(), null_mut(), 0)
                    .is_null();
            let req = bpf_skc_to_tcp_request_sock(sk.cast());
            if ours && !req.is_null() {
                let base = req.cast::<u8>();
                let rcv_isn =
                    bpf_probe_read_kernel(base.wrapping_add(rcv_isn_at as usize).cast::<u32>());
                let snt_isn =
                    bpf_probe_read_kernel(base.wrapping_add(snt_isn_at as usize).cast::<u32>());
                if let (Ok(rcv_isn), Ok(snt_isn)) = (rcv_isn, snt_isn) {
                    first =
                        seg.seq == rcv_isn.wrapping_add(1) && seg.ack == snt_isn.wrapping_add(1);
                    if !first {
                        count(counter::EARLY_NOT_FIRST);
                    }
                }
            }
        }
    }
    // SAFETY: releasing the reference taken by the lookup.
    unsafe { bpf_sk_release(sk.cast()) };
    first
}

/// What `refuse` did.
#[repr(u32)]
enum Refused {
    /// The RST went out from here, and the request was dropped.
    Sent,
    /// Only the request was dropped: the client meets the listener's reset when it
    /// retransmits.
    Unsent,
    /// Nothing could be changed: the socket path decides.
    Untouched,
}

/// Refuses the connection (see the module documentation).
#[inline(never)]
fn refuse(skb: *mut __sk_buff, seg: &Segment) -> Refused {
    // Linear and writable headers first, so no write below can fail for want of memory.
    // SAFETY: the context pointer the kernel handed the program.
    if unsafe { bpf_skb_pull_data(skb, seg.tcp + TCP_HLEN_U32) } != 0 {
        return Refused::Untouched;
    }
    let cut = if seg.v6 {
        refuse_v6(skb, seg)
    } else {
        refuse_v4(skb, seg)
    };
    match cut {
        Some(true) => Refused::Sent,
        Some(false) => Refused::Unsent,
        None if rst_in_place(skb, seg) => Refused::Unsent,
        None => Refused::Untouched,
    }
}

/// The IPv4 refusal; `Some(sent)` once the packet was cut to an RST's size, `None` if it could
/// not be (nothing changed). Everything is built in one frame-sized buffer, to keep the stack
/// small.
#[inline(never)]
fn refuse_v4(skb: *mut __sk_buff, seg: &Segment) -> Option<bool> {
    const IP: usize = L3 as usize;
    const TCP: usize = IP + IPV4_HLEN;
    const TCP_U32: u32 = L3 + 20;
    let mut frame = [0u8; V4_FRAME + 2];
    // The Ethernet header and the fixed part of the IP header, as they came.
    if !load_into(skb, 0, &mut frame, TCP_U32) {
        return None;
    }
    let window = segment::load::<2>(skb, seg.tcp + 14)?;
    let (tos, id, ttl) = (frame[IP + 1], [frame[IP + 4], frame[IP + 5]], frame[IP + 8]);
    // The addresses' sum is the same whichever comes first: one pseudo-header sum serves both.
    let mut rest = [0u8, 6, 0, TCP_HLEN_U8];
    let pseudo = sum(&mut frame, IP + 12, 8, sum(&mut rest, 0, 4, 0));

    // The server's answer: addresses and ports swapped, acknowledging the whole segment.
    swap_ethernet(&mut frame);
    swap(&mut frame, IP + 12, IP + 16, 4);
    ipv4_fields(&mut frame, tos, [0, 0], 64);
    tcp_fields(
        &mut frame,
        TCP,
        [seg.local_port, seg.remote_port],
        [seg.ack, seg.seq.wrapping_add(seg.payload.len())],
        [0, 0],
        pseudo,
    );
    // SAFETY: the context pointer; a constant length.
    if unsafe { bpf_skb_change_tail(skb, V4_FRAME_U32, 0) } != 0 {
        return None;
    }
    let sent = store(skb, &frame, V4_FRAME_U32) && redirect_back(skb);

    // The client's own segment, now its RST at the same sequence number.
    swap_ethernet(&mut frame);
    swap(&mut frame, IP + 12, IP + 16, 4);
    ipv4_fields(&mut frame, tos, id, ttl);
    tcp_fields(
        &mut frame,
        TCP,
        [seg.remote_port, seg.local_port],
        [seg.seq, seg.ack],
        window,
        pseudo,
    );
    store(skb, &frame, V4_FRAME_U32);
    Some(sent)
}

/// The IPv6 refusal, as `refuse_v4`.
#[inline(never)]
fn refuse_v6(skb: *mut __sk_buff, seg: &Segment) -> Option<bool> {
    const IP: usize = L3 as usize;
    const TCP: usize = IP + IPV6_HLEN;
    const TCP_U32: u32 = L3 + 40;
    let mut frame = [0u8; V6_FRAME + 2];
    if !load_into(skb, 0, &mut frame, TCP_U32) {
        return None;
    }
    let window = segment::load::<2>(skb, seg.tcp + 14)?;
    let hop_limit = frame[IP + 7];
    let mut rest = [0u8, 0, 0, TCP_HLEN_U8, 0, 0, 0, 6];
    let pseudo = sum(&mut frame, IP + 8, 32, sum(&mut rest, 0, 8, 0));

    swap_ethernet(&mut frame);
    swap(&mut frame, IP + 8, IP + 24, 16);
    ipv6_fields(&mut frame, 64);
    tcp_fields(
        &mut frame,
        TCP,
        [seg.local_port, seg.remote_port],
        [seg.ack, seg.seq.wrapping_add(seg.payload.len())],
        [0, 0],
        pseudo,
    );
    // SAFETY: as in `refuse_v4`.
    if unsafe { bpf_skb_change_tail(skb, V6_FRAME_U32, 0) } != 0 {
        return None;
    }
    let sent = store(skb, &frame, V6_FRAME_U32) && redirect_back(skb);

    swap_ethernet(&mut frame);
    swap(&mut frame, IP + 8, IP + 24, 16);
    ipv6_fields(&mut frame, hop_limit);
    tcp_fields(
        &mut frame,
        TCP,
        [seg.remote_port, seg.local_port],
        [seg.seq, seg.ack],
        window,
        pseudo,
    );
    store(skb, &frame, V6_FRAME_U32);
    Some(sent)
}

/// When the packet cannot be cut down: its flags become RST|ACK where it stands (an RST may
/// carry data, which TCP ignores), with the checksum adjusted for the two changed bytes. On
/// failure the flags are put back, so the packet is never left half-changed.
#[inline(always)]
fn rst_in_place(skb: *mut __sk_buff, seg: &Segment) -> bool {
    let old = seg.flags_word;
    let new = [
        old[0],
        (old[1] & !(TCP_PSH | TCP_FIN | segment::TCP_SYN)) | TCP_RST_ACK,
    ];
    let at = seg.tcp + segment::TCP_FLAGS_WORD;
    // SAFETY: the context pointer; two bytes from a local of two.
    let stored =
        |bytes: &[u8; 2]| unsafe { bpf_skb_store_bytes(skb, at, bytes.as_ptr().cast(), 2, 0) == 0 };
    if !stored(&new) {
        return false;
    }
    // The helper leaves a partial checksum (loopback, veth) alone, as it must.
    // SAFETY: the context pointer; the checksum field of the header pulled above.
    let summed = unsafe {
        bpf_l4_csum_replace(
            skb,
            seg.tcp + segment::TCP_CHECKSUM,
            u64::from(u16::from_ne_bytes(old)),
            u64::from(u16::from_ne_bytes(new)),
            2,
        )
    };
    if summed != 0 {
        stored(&old);
        return false;
    }
    true
}

/// Writes the first `len` bytes of `frame` over the start of the packet, keeping a receive
/// checksum (CHECKSUM_COMPLETE) in step.
#[inline(always)]
fn store<const N: usize>(skb: *mut __sk_buff, frame: &[u8; N], len: u32) -> bool {
    if len as usize > N {
        return false;
    }
    // SAFETY: the context pointer; `len` bytes of a local of N >= len bytes.
    unsafe {
        bpf_skb_store_bytes(
            skb,
            0,
            frame.as_ptr().cast(),
            len,
            u64::from(BPF_F_RECOMPUTE_CSUM),
        ) == 0
    }
}

/// Reads the packet's first `len` bytes into `frame`.
#[inline(always)]
fn load_into<const N: usize>(skb: *mut __sk_buff, off: u32, frame: &mut [u8; N], len: u32) -> bool {
    if len as usize > N {
        return false;
    }
    // SAFETY: the context pointer; `len` bytes into a local of N >= len bytes.
    unsafe { bpf_skb_load_bytes(skb.cast(), off, frame.as_mut_ptr().cast(), len) == 0 }
}

/// Sends a copy of the packet out of the interface it arrived on.
#[inline(always)]
fn redirect_back(skb: *mut __sk_buff) -> bool {
    // SAFETY: the context pointer the kernel handed the program.
    unsafe {
        let ifindex = read_volatile(&raw const (*skb).ifindex);
        bpf_clone_redirect(skb, ifindex, 0) == 0
    }
}

/// Swaps the Ethernet addresses. Whole 16-bit words move, so the packet's checksum is unchanged.
#[inline(always)]
fn swap_ethernet<const N: usize>(frame: &mut [u8; N]) {
    swap(frame, 0, 6, 6);
}

/// Swaps `len` bytes at `a` with `len` bytes at `b`.
#[inline(always)]
fn swap<const N: usize>(frame: &mut [u8; N], a: usize, b: usize, len: usize) {
    for i in 0..len {
        if a + i < N && b + i < N {
            frame.swap(a + i, b + i);
        }
    }
}

/// The IPv4 header for a 20-byte TCP segment: no options, don't fragment, and its checksum.
#[inline(always)]
fn ipv4_fields<const N: usize>(frame: &mut [u8; N], tos: u8, id: [u8; 2], ttl: u8) {
    const IP: usize = L3 as usize;
    if IP + IPV4_HLEN > N {
        return;
    }
    let total = V4_TOTAL_LEN.to_be_bytes();
    frame[IP] = 0x45;
    frame[IP + 1] = tos;
    frame[IP + 2] = total[0];
    frame[IP + 3] = total[1];
    frame[IP + 4] = id[0];
    frame[IP + 5] = id[1];
    frame[IP + 6] = 0x40;
    frame[IP + 7] = 0;
    frame[IP + 8] = ttl;
    frame[IP + 9] = 6;
    frame[IP + 10] = 0;
    frame[IP + 11] = 0;
    let check = fold(sum(frame, IP, IPV4_HLEN, 0)).to_ne_bytes();
    frame[IP + 10] = check[0];
    frame[IP + 11] = check[1];
}

/// The IPv6 header's payload length (a 20-byte TCP segment), next header and hop limit.
#[inline(always)]
fn ipv6_fields<const N: usize>(frame: &mut [u8; N], hop_limit: u8) {
    const IP: usize = L3 as usize;
    if IP + IPV6_HLEN > N {
        return;
    }
    frame[IP + 4] = 0;
    frame[IP + 5] = TCP_HLEN_U8;
    frame[IP + 6] = 6;
    frame[IP + 7] = hop_limit;
}

/// A 20-byte TCP header at `at` with RST|ACK, and its checksum over `pseudo` and itself.
#[inline(always)]
fn tcp_fields<const N: usize>(
    frame: &mut [u8; N],
    at: usize,
    ports: [u16; 2],
    numbers: [u32; 2],
    window: [u8; 2],
    pseudo: i64,
) {
    if at + TCP_HLEN > N {
        return;
    }
    let [sport, dport] = [ports[0].to_be_bytes(), ports[1].to_be_bytes()];
    let [seq, ack] = [numbers[0].to_be_bytes(), numbers[1].to_be_bytes()];
    frame[at] = sport[0];
    frame[at + 1] = sport[1];
    frame[at + 2] = dport[0];
    frame[at + 3] = dport[1];
    frame[at + 4] = seq[0];
    frame[at + 5] = seq[1];
    frame[at + 6] = seq[2];
    frame[at + 7] = seq[3];
    frame[at + 8] = ack[0];
    frame[at + 9] = ack[1];
    frame[at + 10] = ack[2];
    frame[at + 11] = ack[3];
    frame[at + 12] = 5 << 4;
    frame[at + 13] = TCP_RST_ACK;
    frame[at + 14] = window[0];
    frame[at + 15] = window[1];
    frame[at + 16] = 0;
    frame[at + 17] = 0;
    frame[at + 18] = 0;
    frame[at + 19] = 0;
    let check = fold(sum(frame, at, TCP_HLEN, pseudo)).to_ne_bytes();
    frame[at + 16] = check[0];
    frame[at + 17] = check[1];
}

/// The one's-complement sum of `len` bytes (a multiple of 4) at `at` in `bytes`, added to
/// `seed`; 0 if they are not all there.
#[inline(always)]
fn sum<const N: usize>(bytes: &mut [u8; N], at: usize, len: usize, seed: i64) -> i64 {
    let (Ok(size), Ok(seed)) = (u32::try_from(len), u32::try_from(seed & 0xffff_ffff)) else {
        return 0;
    };
    if at + len > N {
        return 0;
    }
    // SAFETY: `len` bytes of a local, starting `at` bytes in, checked above; no "from" buffer.
    unsafe { bpf_csum_diff(null_mut(), 0, bytes.as_mut_ptr().add(at).cast(), size, seed) }
}

/// The 16-bit checksum field for a sum, in the byte order `bpf_csum_diff` sums in.
#[inline(always)]
fn fold(sum: i64) -> u16 {
    let mut s = sum & 0xffff_ffff;
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !u16::try_from(s & 0xffff).unwrap_or(0)
}
