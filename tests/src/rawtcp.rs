//! A TCP client made of hand-written packets, for the cases an ordinary socket cannot produce:
//! segments sent out of order, a segment with a wrong checksum, the same first segment sent
//! twice.
//!
//! ```text
//!   client namespace                              server namespace
//!   AF_PACKET socket on veth0  ── Ethernet ──►    veth0, SERVER_IP
//!   speaks as RAW_IP / RAW_MAC                    a permanent neighbour entry RAW_IP → RAW_MAC
//! ```
//!
//! The peer's address exists on no interface: the client namespace's kernel sees the server's
//! answers as frames for another host and ignores them (no RST for a SYN-ACK it never asked
//! for), while the packet socket reads them. Frames leave as `CHECKSUM_NONE`, so the server's
//! TCP verifies every checksum, as it would for a packet from a real NIC.
//!
//! Blocking, with short timeouts: a test calls it from its own thread or between awaits.

use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::netns::NetNs;

/// The raw peer's IPv4 address, on the client side of the link.
pub const RAW_IP: Ipv4Addr = Ipv4Addr::new(10, 231, 0, 3);
/// Its MAC: locally administered, on no interface.
pub const RAW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];

const ETH_P_IP: u16 = 0x0800;
/// `AF_PACKET` in `sockaddr_ll`'s width.
const AF_PACKET: u16 = 17;
const ETH_HLEN: usize = 14;
const IP_HLEN: usize = 20;
const TCP_HLEN: usize = 20;

pub const FIN: u8 = 0x01;
pub const SYN: u8 = 0x02;
pub const RST: u8 = 0x04;
pub const PSH: u8 = 0x08;
pub const ACK: u8 = 0x10;

/// A packet socket on one interface of a namespace.
pub struct RawLink {
    fd: OwnedFd,
    ifindex: i32,
    mac: [u8; 6],
    peer_mac: [u8; 6],
}

impl RawLink {
    /// Opens a packet socket on `ifname` inside `ns`, sending from `mac` to `peer_mac`.
    pub fn open(ns: &NetNs, ifname: &str, mac: [u8; 6], peer_mac: [u8; 6]) -> io::Result<RawLink> {
        let name = std::ffi::CString::new(ifname).map_err(io::Error::other)?;
        let (fd, ifindex) = ns.run(move || -> io::Result<(OwnedFd, i32)> {
            // SAFETY: a plain socket(2) call; the result is checked before it is owned.
            let raw = unsafe {
                libc::socket(
                    libc::AF_PACKET,
                    libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                    i32::from(ETH_P_IP.to_be()),
                )
            };
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: a descriptor just created and owned by nothing else.
            let fd = unsafe { OwnedFd::from_raw_fd(raw) };
            // SAFETY: a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            if ifindex == 0 {
                return Err(io::Error::last_os_error());
            }
            let ifindex = i32::try_from(ifindex).map_err(io::Error::other)?;
            // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
            let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            addr.sll_family = AF_PACKET;
            addr.sll_protocol = ETH_P_IP.to_be();
            addr.sll_ifindex = ifindex;
            // SAFETY: `addr` is a valid sockaddr_ll of the size passed.
            let rc = unsafe {
                libc::bind(
                    fd.as_raw_fd(),
                    (&raw const addr).cast(),
                    socklen(std::mem::size_of::<libc::sockaddr_ll>()),
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok((fd, ifindex))
        })??;
        Ok(RawLink {
            fd,
            ifindex,
            mac,
            peer_mac,
        })
    }

    fn send_frame(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: as in `open`.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = AF_PACKET;
        addr.sll_protocol = ETH_P_IP.to_be();
        addr.sll_ifindex = self.ifindex;
        addr.sll_halen = 6;
        addr.sll_addr[..6].copy_from_slice(&self.peer_mac);
        // SAFETY: `frame` and `addr` are valid for the sizes passed.
        let n = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                0,
                (&raw const addr).cast(),
                socklen(std::mem::size_of::<libc::sockaddr_ll>()),
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The next frame, or `None` once `deadline` passes.
    fn recv_frame(&self, deadline: Instant) -> io::Result<Option<Vec<u8>>> {
        let mut buf = vec![0u8; 65536];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd.
            let rc = unsafe { libc::poll(&raw mut pfd, 1, ms) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            if rc == 0 {
                continue;
            }
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
                ) {
                    continue;
                }
                return Err(e);
            }
            let n = usize::try_from(n).map_err(io::Error::other)?;
            buf.truncate(n);
            return Ok(Some(buf));
        }
    }
}

/// A TCP segment the server sent to the raw peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    pub flags: u8,
    pub seq: u32,
    pub ack: u32,
    pub payload: Vec<u8>,
}

/// How the server answered what the raw peer sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// An RST, this long after the last segment was sent.
    Reset(Duration),
    /// Data: the first bytes (a ServerHello, say).
    Data(Vec<u8>),
    /// A FIN without data.
    Closed,
    /// Nothing but acknowledgements until the timeout.
    Silent,
}

/// What to get wrong in a segment on purpose.
#[derive(Clone, Copy, Debug, Default)]
pub struct Damage {
    /// The TCP checksum is off by one: the server's TCP discards the segment, but anything
    /// that looks at the packet before the checksum is checked (a TC program) sees it whole.
    pub bad_checksum: bool,
}

/// One connection from the raw peer, opened by hand.
pub struct RawTcp {
    link: RawLink,
    local: (Ipv4Addr, u16),
    remote: (Ipv4Addr, u16),
    /// Our initial sequence number.
    pub iss: u32,
    /// The server's initial sequence number.
    pub irs: u32,
    /// When the last segment left.
    sent: Instant,
}

impl RawTcp {
    /// SYN, the server's SYN-ACK, ACK: an established connection from `local_port` to
    /// `remote`, with nothing sent yet.
    pub fn connect(
        link: RawLink,
        local_port: u16,
        remote: (Ipv4Addr, u16),
        timeout: Duration,
    ) -> io::Result<RawTcp> {
        let iss = 0x1000_0000 ^ u32::from(local_port).wrapping_mul(2_654_435_761);
        let mut conn = RawTcp {
            link,
            local: (RAW_IP, local_port),
            remote,
            iss,
            irs: 0,
            sent: Instant::now(),
        };
        // MSS 1460, so the server's segments fit the link.
        let mss = [2, 4, 0x05, 0xb4];
        conn.send_raw(iss, 0, SYN, &mss, &[], Damage::default())?;
        let deadline = Instant::now() + timeout;
        loop {
            let Some(segment) = conn.next(deadline)? else {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "no SYN-ACK from the server",
                ));
            };
            if segment.flags & (SYN | ACK) == SYN | ACK && segment.ack == iss.wrapping_add(1) {
                conn.irs = segment.seq;
                break;
            }
            if segment.flags & RST != 0 {
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionRefused,
                    "the server reset the SYN",
                ));
            }
        }
        conn.send_raw(
            iss.wrapping_add(1),
            conn.irs.wrapping_add(1),
            ACK,
            &[],
            &[],
            Damage::default(),
        )?;
        Ok(conn)
    }

    /// Sends `payload` as one segment starting `offset` bytes into the stream (0: the first
    /// byte after the handshake), with ACK and PSH, damaged as asked.
    pub fn send_at(&mut self, offset: u32, payload: &[u8], damage: Damage) -> io::Result<()> {
        let seq = self.iss.wrapping_add(1).wrapping_add(offset);
        let ack = self.irs.wrapping_add(1);
        self.send_raw(seq, ack, ACK | PSH, &[], payload, damage)
    }

    /// Sends an RST, to end the connection without waiting for anything.
    pub fn reset(&mut self, offset: u32) -> io::Result<()> {
        let seq = self.iss.wrapping_add(1).wrapping_add(offset);
        self.send_raw(seq, 0, RST, &[], &[], Damage::default())
    }

    /// What the server does next: reset, data, close, or nothing but ACKs within `timeout`.
    pub fn answer(&self, timeout: Duration) -> io::Result<Answer> {
        let deadline = Instant::now() + timeout;
        while let Some(segment) = self.next(deadline)? {
            if segment.flags & RST != 0 {
                return Ok(Answer::Reset(self.sent.elapsed()));
            }
            if !segment.payload.is_empty() {
                return Ok(Answer::Data(segment.payload));
            }
            if segment.flags & FIN != 0 {
                return Ok(Answer::Closed);
            }
        }
        Ok(Answer::Silent)
    }

    /// The next segment of this connection from the server, or `None` at the deadline.
    pub fn next(&self, deadline: Instant) -> io::Result<Option<Segment>> {
        while let Some(frame) = self.link.recv_frame(deadline)? {
            if let Some(segment) = self.parse(&frame) {
                return Ok(Some(segment));
            }
        }
        Ok(None)
    }

    fn parse(&self, frame: &[u8]) -> Option<Segment> {
        let ip = frame.get(ETH_HLEN..)?;
        if u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]) != ETH_P_IP {
            return None;
        }
        let ihl = usize::from(ip.first()? & 0x0f) * 4;
        let total = usize::from(u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]));
        if *ip.get(9)? != 6 || ip.len() < total || ihl < IP_HLEN {
            return None;
        }
        let src = Ipv4Addr::new(*ip.get(12)?, *ip.get(13)?, *ip.get(14)?, *ip.get(15)?);
        let dst = Ipv4Addr::new(*ip.get(16)?, *ip.get(17)?, *ip.get(18)?, *ip.get(19)?);
        let tcp = ip.get(ihl..total)?;
        let sport = u16::from_be_bytes([*tcp.first()?, *tcp.get(1)?]);
        let dport = u16::from_be_bytes([*tcp.get(2)?, *tcp.get(3)?]);
        if (src, sport) != self.remote || (dst, dport) != self.local {
            return None;
        }
        let word = |at: usize| -> Option<u32> {
            Some(u32::from_be_bytes([
                *tcp.get(at)?,
                *tcp.get(at + 1)?,
                *tcp.get(at + 2)?,
                *tcp.get(at + 3)?,
            ]))
        };
        let doff = usize::from(tcp.get(12)? >> 4) * 4;
        Some(Segment {
            flags: *tcp.get(13)?,
            seq: word(4)?,
            ack: word(8)?,
            payload: tcp.get(doff..)?.to_vec(),
        })
    }

    fn send_raw(
        &mut self,
        seq: u32,
        ack: u32,
        flags: u8,
        options: &[u8],
        payload: &[u8],
        damage: Damage,
    ) -> io::Result<()> {
        let frame = frame(
            self.link.mac,
            self.link.peer_mac,
            self.local,
            self.remote,
            Fields {
                seq,
                ack,
                flags,
                options,
                payload,
            },
            damage,
        );
        self.link.send_frame(&frame)?;
        self.sent = Instant::now();
        Ok(())
    }
}

struct Fields<'a> {
    seq: u32,
    ack: u32,
    flags: u8,
    options: &'a [u8],
    payload: &'a [u8],
}

/// An Ethernet + IPv4 + TCP frame with correct checksums (unless damaged).
fn frame(
    mac: [u8; 6],
    peer_mac: [u8; 6],
    local: (Ipv4Addr, u16),
    remote: (Ipv4Addr, u16),
    fields: Fields<'_>,
    damage: Damage,
) -> Vec<u8> {
    let tcp_len = TCP_HLEN + fields.options.len() + fields.payload.len();
    let total = IP_HLEN + tcp_len;
    let mut out = Vec::with_capacity(ETH_HLEN + total);
    out.extend_from_slice(&peer_mac);
    out.extend_from_slice(&mac);
    out.extend_from_slice(&ETH_P_IP.to_be_bytes());
    let mut ip = [0u8; IP_HLEN];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&u16::try_from(total).unwrap_or(u16::MAX).to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64;
    ip[9] = 6;
    ip[12..16].copy_from_slice(&local.0.octets());
    ip[16..20].copy_from_slice(&remote.0.octets());
    let sum = checksum(&[&ip]);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    out.extend_from_slice(&ip);
    let mut tcp = Vec::with_capacity(tcp_len);
    tcp.extend_from_slice(&local.1.to_be_bytes());
    tcp.extend_from_slice(&remote.1.to_be_bytes());
    tcp.extend_from_slice(&fields.seq.to_be_bytes());
    tcp.extend_from_slice(&fields.ack.to_be_bytes());
    let doff = u8::try_from((TCP_HLEN + fields.options.len()) / 4).unwrap_or(15);
    tcp.push(doff << 4);
    tcp.push(fields.flags);
    tcp.extend_from_slice(&0xffffu16.to_be_bytes()); // window
    tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
    tcp.extend_from_slice(fields.options);
    tcp.extend_from_slice(fields.payload);
    let mut pseudo = [0u8; 12];
    pseudo[..4].copy_from_slice(&local.0.octets());
    pseudo[4..8].copy_from_slice(&remote.0.octets());
    pseudo[9] = 6;
    pseudo[10..12].copy_from_slice(&u16::try_from(tcp_len).unwrap_or(u16::MAX).to_be_bytes());
    let mut sum = checksum(&[&pseudo, &tcp]);
    if damage.bad_checksum {
        sum = sum.wrapping_add(1);
    }
    tcp[16..18].copy_from_slice(&sum.to_be_bytes());
    out.extend_from_slice(&tcp);
    out
}

/// The Internet checksum of the concatenated parts (each but the last of even length).
fn checksum(parts: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for part in parts {
        let mut chunks = part.chunks_exact(2);
        for pair in &mut chunks {
            sum += u32::from(u16::from_be_bytes([pair[0], pair[1]]));
        }
        if let [last] = chunks.remainder() {
            sum += u32::from(*last) << 8;
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

fn socklen(size: usize) -> libc::socklen_t {
    libc::socklen_t::try_from(size).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checksum_of_a_known_header() {
        // RFC 1071's example words.
        let bytes = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(checksum(&[&bytes]), !0xddf2);
        // Split at an even boundary, the sum is the same.
        assert_eq!(checksum(&[&bytes[..4], &bytes[4..]]), !0xddf2);
    }
}
