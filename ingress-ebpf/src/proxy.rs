//! The PROXY protocol header in front of the ClientHello (`--use-proxy-protocol`,
//! `GateConfig::proxy_protocol`): found, checked and skipped, so the ClientHello reader sees
//! the record behind it at offset 0 (through [`After`]).
//!
//! ```text
//!   v2: "\r\n\r\n\0\r\nQUIT\n" [ver 2|cmd 0..1] [family 0..3|proto 0..2] [len u16] [len bytes]
//!       checked field by field as userspace (the `ppp` crate) checks it; the source address
//!       of a PROXY over IPv4/IPv6 is the client, LOCAL or another family keeps the peer
//!   v1: "PROXY " ("TCP4 " | "TCP6 " | "UNKNOWN") ... "\r\n", at most 107 bytes: the line is
//!       found and its start checked; TCP4's source address is parsed (the client); the rest
//!       of the line's grammar (TCP6 addresses, the destination, the ports) is left to
//!       userspace, which parses every header the kernel passes again and closes the
//!       connection on one it refuses, so an invalid header is refused either way
//! ```
//!
//! A header longer than userspace accepts (`MAX_PROXY_HEADER`) is invalid here too. Loops are a
//! fixed unrolled prefix compare and one `bpf_loop` over at most 107 bytes.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_loop;
use ingress_common::MAX_PROXY_HEADER;

use crate::hello::Packet;

/// The v2 signature.
const V2_SIG: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
const V2_FIXED: u32 = 16;
/// Address bytes each v2 family needs at least: unspecified, IPv4, IPv6, AF_UNIX.
const V2_FAMILY_BYTES: [u32; 4] = [0, 12, 36, 216];
const V1_PREFIX: [u8; 6] = *b"PROXY ";
/// The longest v1 line, CRLF included.
const V1_MAX: u32 = 107;

/// What the start of a connection says. A plain struct with every field always set, not an
/// enum with data: LLVM leaves an unused variant's fields undefined, and the verifier refuses
/// the arithmetic it then does on whatever register held them.
#[derive(Clone, Copy)]
pub struct Header {
    /// `SKIP`, `NEED_MORE` or `INVALID`.
    pub status: u32,
    /// `SKIP`: the header's length.
    pub len: u32,
    /// Non-zero: it named the client, now in the caller's buffer.
    pub named: u32,
    /// Zero when it named one the kernel did not read (v1 TCP6): source ranges are then left
    /// to userspace.
    pub known: u32,
}

/// A header of `Header::len` bytes.
pub const SKIP: u32 = 0;
/// Too few bytes to tell.
pub const NEED_MORE: u32 = 1;
/// Not a header userspace accepts.
pub const INVALID: u32 = 2;

impl Header {
    pub const NEED_MORE: Header = Header {
        status: NEED_MORE,
        len: 0,
        named: 0,
        known: 1,
    };
    pub const INVALID: Header = Header {
        status: INVALID,
        len: 0,
        named: 0,
        known: 1,
    };

    #[inline(always)]
    fn skip(len: u32, named: bool, known: bool) -> Header {
        Header {
            status: SKIP,
            len,
            named: u32::from(named),
            known: u32::from(known),
        }
    }
}

/// Reads the header at the start of `pkt`; on a named IPv4 or IPv6 client, writes it to
/// `client` (v4-mapped, as SOURCES keys it).
#[inline(always)]
pub fn header<P: Packet>(pkt: P, client: &mut [u8; 16]) -> Header {
    match pkt.load_u8(0) {
        None => Header::NEED_MORE,
        Some(b'\r') => v2(pkt, client),
        Some(b'P') => v1(pkt, client),
        Some(_) => Header::INVALID,
    }
}

#[inline(always)]
fn v2<P: Packet>(pkt: P, client: &mut [u8; 16]) -> Header {
    let mut fixed = [0u8; V2_FIXED as usize];
    if !pkt.load(0, fixed.as_mut_ptr(), V2_FIXED) {
        // A short start is judged once more bytes arrive (or refused as truncated).
        return Header::NEED_MORE;
    }
    // Word compares: a byte loop with an exit per byte multiplies the verifier's states.
    let word = |i: usize| u32::from_ne_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]);
    let sig =
        |i: usize| u32::from_ne_bytes([V2_SIG[i], V2_SIG[i + 1], V2_SIG[i + 2], V2_SIG[i + 3]]);
    if (word(0) ^ sig(0)) | (word(4) ^ sig(4)) | (word(8) ^ sig(8)) != 0 {
        return Header::INVALID;
    }
    let (version, command) = (fixed[12] >> 4, fixed[12] & 0x0f);
    let (family, protocol) = (fixed[13] >> 4, fixed[13] & 0x0f);
    if version != 2 || command > 1 || family > 3 || protocol > 2 {
        return Header::INVALID;
    }
    let length = u32::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    let needed = match V2_FAMILY_BYTES.get(usize::from(family)) {
        Some(&n) => n,
        None => return Header::INVALID,
    };
    let len = V2_FIXED + length;
    if length < needed || len > MAX_PROXY_HEADER {
        return Header::INVALID;
    }
    if len > pkt.len() {
        return Header::NEED_MORE;
    }
    // LOCAL (a health check) and non-IP families name no client: the peer stays.
    let named = command == 1 && (family == 1 || family == 2);
    if named {
        let ok = if family == 1 {
            *client = [0; 16];
            client[10] = 0xff;
            client[11] = 0xff;
            // SAFETY: four bytes into the last four of the 16-byte buffer.
            pkt.load(V2_FIXED, unsafe { client.as_mut_ptr().add(12) }, 4)
        } else {
            pkt.load(V2_FIXED, client.as_mut_ptr(), 16)
        };
        if !ok {
            return Header::NEED_MORE;
        }
    }
    Header::skip(len, named, true)
}

#[inline(always)]
fn v1<P: Packet>(pkt: P, client: &mut [u8; 16]) -> Header {
    let mut start = [0u8; 11];
    if !pkt.load(0, start.as_mut_ptr(), 11) {
        // Shorter than "PROXY TCP4 ": judged once more bytes arrive (or refused as truncated).
        return Header::NEED_MORE;
    }
    let prefix = u32::from_ne_bytes([start[0], start[1], start[2], start[3]]);
    let want = u32::from_ne_bytes([V1_PREFIX[0], V1_PREFIX[1], V1_PREFIX[2], V1_PREFIX[3]]);
    if prefix != want || start[4] != V1_PREFIX[4] || start[5] != V1_PREFIX[5] {
        return Header::INVALID;
    }
    let Some(cr) = find_cr(pkt) else {
        return if pkt.len() >= V1_MAX {
            Header::INVALID
        } else {
            Header::NEED_MORE
        };
    };
    let len = cr + 2;
    if len > V1_MAX {
        return Header::INVALID;
    }
    match pkt.load_u8(cr + 1) {
        None => return Header::NEED_MORE,
        Some(b'\n') => {}
        Some(_) => return Header::INVALID,
    }
    let protocol = u32::from_ne_bytes([start[6], start[7], start[8], start[9]]);
    let space = start[10] == b' ';
    if protocol == u32::from_ne_bytes(*b"TCP4") && space {
        return match tcp4_source(pkt, cr) {
            Some(ip) => {
                *client = [0; 16];
                client[10] = 0xff;
                client[11] = 0xff;
                client[12] = ip[0];
                client[13] = ip[1];
                client[14] = ip[2];
                client[15] = ip[3];
                Header::skip(len, true, true)
            }
            None => Header::INVALID,
        };
    }
    if protocol == u32::from_ne_bytes(*b"TCP6") && space {
        return Header::skip(len, true, false);
    }
    // "UNKNOWN" followed by a space or the CR; the rest of the line is ignored.
    if protocol != u32::from_ne_bytes(*b"UNKN") || start[10] != b'O' {
        return Header::INVALID;
    }
    let mut rest = [0u8; 3];
    if !pkt.load(11, rest.as_mut_ptr(), 3) {
        return Header::INVALID;
    }
    if rest[0] == b'W' && rest[1] == b'N' && (rest[2] == b' ' || rest[2] == b'\r') {
        Header::skip(len, false, true)
    } else {
        Header::INVALID
    }
}

#[repr(C)]
struct CrWalk<P> {
    pkt: P,
    found: u32,
    at: u32,
}

/// The offset of the first CR within the first 107 bytes.
#[inline(always)]
fn find_cr<P: Packet>(pkt: P) -> Option<u32> {
    let mut walk = CrWalk {
        pkt,
        found: 0,
        at: 0,
    };
    // SAFETY: `cr_step` has the callback signature bpf_loop expects, and `walk` outlives the
    // call.
    unsafe {
        bpf_loop(
            V1_MAX,
            cr_step::<P> as *mut c_void,
            (&raw mut walk).cast(),
            0,
        );
    }
    (walk.found != 0).then_some(walk.at)
}

#[inline(never)]
extern "C" fn cr_step<P: Packet>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `CrWalk` pointer given to it.
    let walk = unsafe { &mut *ctx.cast::<CrWalk<P>>() };
    let Ok(i) = u32::try_from(index) else {
        return 1;
    };
    match walk.pkt.load_u8(i) {
        Some(b'\r') => {
            walk.found = 1;
            walk.at = i;
            1
        }
        Some(_) => 0,
        None => 1,
    }
}

#[repr(C)]
struct Ipv4Walk<P> {
    pkt: P,
    /// Where the address ends (the CR): a space must come first.
    end: u32,
    octet: u32,
    digits: u32,
    /// Octets finished so far.
    done: u32,
    invalid: u32,
    finished: u32,
    ip: [u8; 4],
}

/// The source address of a v1 TCP4 line (from byte 11 to the next space), parsed as strictly
/// as Rust's `Ipv4Addr` parser does: four decimal octets of one to three digits, no leading
/// zero, at most 255.
#[inline(always)]
fn tcp4_source<P: Packet>(pkt: P, end: u32) -> Option<[u8; 4]> {
    let mut walk = Ipv4Walk {
        pkt,
        end,
        octet: 0,
        digits: 0,
        done: 0,
        invalid: 0,
        finished: 0,
        ip: [0; 4],
    };
    // SAFETY: as in `find_cr`.
    unsafe {
        bpf_loop(16, ipv4_step::<P> as *mut c_void, (&raw mut walk).cast(), 0);
    }
    (walk.invalid == 0 && walk.finished != 0).then_some(walk.ip)
}

#[inline(never)]
extern "C" fn ipv4_step<P: Packet>(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: bpf_loop passes back the `Ipv4Walk` pointer given to it.
    let walk = unsafe { &mut *ctx.cast::<Ipv4Walk<P>>() };
    let Ok(i) = u32::try_from(index) else {
        return 1;
    };
    let at = 11 + i;
    let b = if at < walk.end {
        walk.pkt.load_u8(at)
    } else {
        None
    };
    let Some(b) = b else {
        walk.invalid = 1;
        return 1;
    };
    match b {
        b'0'..=b'9' => {
            // A second digit after a leading zero, a fourth digit, or past 255.
            if (walk.digits == 1 && walk.octet == 0) || walk.digits == 3 {
                walk.invalid = 1;
                return 1;
            }
            walk.octet = walk.octet * 10 + u32::from(b - b'0');
            walk.digits += 1;
            if walk.octet > 255 {
                walk.invalid = 1;
                return 1;
            }
            0
        }
        b'.' | b' ' => {
            let last = b == b' ';
            if walk.digits == 0 || (last && walk.done != 3) || (!last && walk.done >= 3) {
                walk.invalid = 1;
                return 1;
            }
            if let Some(slot) = walk.ip.get_mut(walk.done as usize) {
                // At most 255: checked as each digit was added.
                *slot = walk.octet.to_le_bytes()[0];
            }
            walk.done += 1;
            walk.octet = 0;
            walk.digits = 0;
            if last {
                walk.finished = 1;
                return 1;
            }
            0
        }
        _ => {
            walk.invalid = 1;
            1
        }
    }
}

/// The bytes of `pkt` from `base` on, as the ClientHello reader's buffer.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct After<P> {
    pub pkt: P,
    pub base: u32,
}

impl<P: Packet> Packet for After<P> {
    #[inline(always)]
    fn len(self) -> u32 {
        self.pkt.len().saturating_sub(self.base)
    }

    /// No branch on `off` here: a comparison would make the verifier track the callers' walk
    /// positions precisely, and their `bpf_loop` states would never converge. Offsets are
    /// bounded by sums of 16-bit lengths and `base` by `MAX_PROXY_HEADER`, far from wrapping;
    /// the load helper bounds-checks whatever it is given.
    #[inline(always)]
    fn load(self, off: u32, to: *mut u8, len: u32) -> bool {
        self.pkt.load(off.wrapping_add(self.base), to, len)
    }
}
