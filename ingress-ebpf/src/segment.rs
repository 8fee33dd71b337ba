//! Reading a TCP segment as a TC program sees it on an Ethernet (or loopback) device: the
//! headers up to the payload, and the payload as a [`Packet`] for the ClientHello reader.
//!
//! ```text
//!   [eth 14][IPv4 20..60 | IPv6 40][TCP 20..60][payload ...]
//!                                                ^ Payload.base, Payload.len bytes
//! ```
//!
//! Anything this reader does not follow (VLAN tags, IPv6 extension headers, IP fragments, a
//! truncated header) is `None`: the segment goes on untouched and the socket path decides.

use aya_ebpf::{
    bindings::{__sk_buff, bpf_sock_tuple},
    helpers::generated::bpf_skb_load_bytes,
};

use ingress_common::FlowKey;

use crate::hello::Packet;

const ETH_HLEN: u32 = 14;
const _: () = assert!(
    TUPLE_V4 as usize
        == core::mem::size_of::<aya_ebpf::bindings::bpf_sock_tuple__bindgen_ty_1__bindgen_ty_1>()
);
const _: () = assert!(
    TUPLE_V6 as usize
        == core::mem::size_of::<aya_ebpf::bindings::bpf_sock_tuple__bindgen_ty_1__bindgen_ty_2>()
);
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const IPPROTO_TCP: u8 = 6;
const IPV6_HLEN: u32 = 40;
/// More-fragments flag and fragment offset.
const IPV4_FRAGMENT: u16 = 0x3fff;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;
pub const TCP_ACK: u8 = 0x10;
/// Where the IP header starts: right after the Ethernet header.
pub const L3: u32 = ETH_HLEN;
/// The 16-bit word holding the data offset and the flags.
pub const TCP_FLAGS_WORD: u32 = 12;
pub const TCP_CHECKSUM: u32 = 16;

/// A TCP segment's addresses, where its header sits and where its payload is.
pub struct Segment {
    /// Offset of the TCP header in the skb.
    pub tcp: u32,
    /// The sequence and acknowledgement numbers, host byte order.
    pub seq: u32,
    pub ack: u32,
    /// The data-offset/flags word, as it is on the wire.
    pub flags_word: [u8; 2],
    /// Local and remote port, host byte order.
    pub local_port: u16,
    pub remote_port: u16,
    pub payload: Payload,
    /// The lookup key for `bpf_skc_lookup_tcp`: addresses and ports as the packet has them.
    pub tuple: bpf_sock_tuple,
    /// Which half of `tuple` is filled.
    pub v6: bool,
    /// The connection as sock_ops will see the socket this segment creates.
    pub flow: FlowKey,
}

/// `bpf_skc_lookup_tcp`'s key sizes: the helper takes the size as a constant.
pub const TUPLE_V4: u32 = 12;
pub const TUPLE_V6: u32 = 36;

impl Segment {
    pub fn flags(&self) -> u8 {
        self.flags_word[1]
    }
}

impl Segment {
    /// A placeholder for `read_into` to fill.
    pub const EMPTY: Segment = Segment {
        tcp: 0,
        seq: 0,
        ack: 0,
        flags_word: [0; 2],
        local_port: 0,
        remote_port: 0,
        payload: Payload {
            skb: core::ptr::null_mut(),
            base: 0,
            len: 0,
        },
        // SAFETY: zeroed bytes are a valid tuple (a union of integer arrays).
        tuple: unsafe { core::mem::zeroed() },
        v6: false,
        flow: FlowKey {
            local_ip: [0; 4],
            remote_ip: [0; 4],
            local_port: 0,
            remote_port: 0,
            seq: 0,
        },
    };
}

/// Whether the skb may be a data segment to a port `gated` accepts: TCP with ACK set, SYN and RST
/// clear. Three loads rule out nearly all traffic (every segment of every other port, on a
/// node that carries much more than the gated listeners) before [`read`] does its dozen, so the
/// hook costs the rest of the node's packets next to nothing.
#[inline(always)]
pub fn may_be_gated_data(skb: *mut __sk_buff, gated: impl Fn(u32) -> bool) -> bool {
    let l3 = ETH_HLEN;
    let Some(ethertype) = load::<2>(skb, 12) else {
        return false;
    };
    let tcp = match u16::from_be_bytes(ethertype) {
        ETH_P_IP => {
            // Version and header length, then (at 9) the protocol.
            let Some(ip) = load::<10>(skb, l3) else {
                return false;
            };
            if ip[0] >> 4 != 4 || ip[9] != IPPROTO_TCP {
                return false;
            }
            l3 + u32::from(ip[0] & 0x0f) * 4
        }
        ETH_P_IPV6 => {
            let Some(ip) = load::<7>(skb, l3) else {
                return false;
            };
            if ip[6] != IPPROTO_TCP {
                return false;
            }
            l3 + 40
        }
        _ => return false,
    };
    // Ports, sequence and acknowledgement numbers, data offset, flags.
    let Some(tcp) = load::<14>(skb, tcp) else {
        return false;
    };
    let flags = tcp[13];
    flags & TCP_ACK != 0
        && flags & (TCP_SYN | TCP_RST) == 0
        && gated(u32::from(u16::from_be_bytes([tcp[2], tcp[3]])))
}

/// `read`, into `out`: not inlined, so the header loads' temporaries live in a frame of their
/// own rather than in the caller's for its whole run (the verifier allows 512 bytes of stack
/// for a whole chain of calls).
#[inline(never)]
pub fn read_into(skb: *mut __sk_buff, out: &mut Segment) -> bool {
    match read(skb) {
        Some(segment) => {
            *out = segment;
            true
        }
        None => false,
    }
}

/// Reads the headers of the skb at the TC hook.
#[inline(always)]
pub fn read(skb: *mut __sk_buff) -> Option<Segment> {
    let l3 = ETH_HLEN;
    // SAFETY: zeroed bytes are a valid tuple (a union of integer arrays).
    let mut tuple: bpf_sock_tuple = unsafe { core::mem::zeroed() };
    let (tcp, ip_end, v6) = match u16::from_be_bytes(load::<2>(skb, 12)?) {
        ETH_P_IP => {
            let [version_ihl] = load::<1>(skb, l3)?;
            let ihl = u32::from(version_ihl & 0x0f) * 4;
            if version_ihl >> 4 != 4 || ihl < 20 {
                return None;
            }
            let total = u32::from(u16::from_be_bytes(load::<2>(skb, l3 + 2)?));
            let fragment = u16::from_be_bytes(load::<2>(skb, l3 + 6)?);
            let [protocol] = load::<1>(skb, l3 + 9)?;
            if fragment & IPV4_FRAGMENT != 0 || protocol != IPPROTO_TCP {
                return None;
            }
            // SAFETY: choosing the IPv4 member of a union of plain integers.
            let v4 = unsafe { &mut tuple.__bindgen_anon_1.ipv4 };
            v4.saddr = u32::from_ne_bytes(load::<4>(skb, l3 + 12)?);
            v4.daddr = u32::from_ne_bytes(load::<4>(skb, l3 + 16)?);
            (l3 + ihl, l3 + total, false)
        }
        ETH_P_IPV6 => {
            let payload = u32::from(u16::from_be_bytes(load::<2>(skb, l3 + 4)?));
            let [next] = load::<1>(skb, l3 + 6)?;
            if next != IPPROTO_TCP {
                return None;
            }
            // SAFETY: choosing the IPv6 member of a union of plain integers.
            let v6 = unsafe { &mut tuple.__bindgen_anon_1.ipv6 };
            for (word, off) in v6.saddr.iter_mut().zip([8, 12, 16, 20]) {
                *word = u32::from_ne_bytes(load::<4>(skb, l3 + off)?);
            }
            for (word, off) in v6.daddr.iter_mut().zip([24, 28, 32, 36]) {
                *word = u32::from_ne_bytes(load::<4>(skb, l3 + off)?);
            }
            (l3 + IPV6_HLEN, l3 + IPV6_HLEN + payload, true)
        }
        _ => return None,
    };
    let ports = load::<4>(skb, tcp)?;
    let seq = u32::from_be_bytes(load::<4>(skb, tcp + 4)?);
    let ack = u32::from_be_bytes(load::<4>(skb, tcp + 8)?);
    let flags_word = load::<2>(skb, tcp + TCP_FLAGS_WORD)?;
    let data = tcp + u32::from(flags_word[0] >> 4) * 4;
    // SAFETY: the context pointer the kernel handed the program.
    let skb_len = unsafe { (*skb).len };
    if data < tcp + 20 || ip_end > skb_len || data > ip_end {
        return None;
    }
    let (sport, dport) = (
        u16::from_ne_bytes([ports[0], ports[1]]),
        u16::from_ne_bytes([ports[2], ports[3]]),
    );
    let mut flow = FlowKey {
        local_port: u32::from(u16::from_be(dport)),
        remote_port: u32::from(u16::from_be(sport)),
        seq,
        ..FlowKey::default()
    };
    // SAFETY: reading back the union member the match above filled.
    unsafe {
        if v6 {
            tuple.__bindgen_anon_1.ipv6.sport = sport;
            tuple.__bindgen_anon_1.ipv6.dport = dport;
            flow.local_ip = tuple.__bindgen_anon_1.ipv6.daddr;
            flow.remote_ip = tuple.__bindgen_anon_1.ipv6.saddr;
        } else {
            tuple.__bindgen_anon_1.ipv4.sport = sport;
            tuple.__bindgen_anon_1.ipv4.dport = dport;
            flow.local_ip = FlowKey::v4_mapped(tuple.__bindgen_anon_1.ipv4.daddr);
            flow.remote_ip = FlowKey::v4_mapped(tuple.__bindgen_anon_1.ipv4.saddr);
        }
    }
    Some(Segment {
        tcp,
        seq,
        ack,
        flags_word,
        local_port: u16::from_be_bytes([ports[2], ports[3]]),
        remote_port: u16::from_be_bytes([ports[0], ports[1]]),
        payload: Payload {
            skb,
            base: data,
            len: ip_end - data,
        },
        tuple,
        v6,
        flow,
    })
}

#[inline(always)]
pub fn load<const N: usize>(skb: *mut __sk_buff, off: u32) -> Option<[u8; N]> {
    let mut bytes = [0u8; N];
    let len = u32::try_from(N).ok()?;
    // SAFETY: N bytes into a local of N bytes; the helper bounds-checks the packet.
    let ret = unsafe { bpf_skb_load_bytes(skb.cast(), off, bytes.as_mut_ptr().cast(), len) };
    (ret == 0).then_some(bytes)
}

/// A segment's payload: what the ClientHello reader sees as the start of the stream.
#[derive(Clone, Copy)]
pub struct Payload {
    skb: *mut __sk_buff,
    base: u32,
    len: u32,
}

impl Packet for Payload {
    #[inline(always)]
    fn len(self) -> u32 {
        self.len
    }

    #[inline(always)]
    fn load(self, off: u32, to: *mut u8, len: u32) -> bool {
        if u64::from(off) + u64::from(len) > u64::from(self.len) {
            return false;
        }
        // SAFETY: callers pass a destination of at least `len` bytes.
        unsafe { bpf_skb_load_bytes(self.skb.cast(), self.base + off, to.cast(), len) == 0 }
    }
}
