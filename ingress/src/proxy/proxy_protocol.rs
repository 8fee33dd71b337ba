//! The PROXY protocol (v1 text and v2 binary, as haproxy and cloud load balancers send it):
//! with `--use-proxy-protocol` every connection on the HTTP and HTTPS listeners must start with
//! a header naming the real client, which the identity phase then believes.
//!
//! The header is read with `MSG_PEEK` and then consumed to its exact length, so the bytes after
//! it (a request head, a ClientHello) stay in the socket for whatever reads next: nothing needs
//! replaying. A connection without a valid header within the timeout is closed; nothing is
//! guessed. The parsing itself is the `ppp` crate's.

use std::net::SocketAddr;
use std::time::Duration;

use ppp::{HeaderResult, PartialResult, v1, v2};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Longer than any header a load balancer sends (v1 is at most 107 bytes; v2 is 16 plus its
/// addresses and TLVs): a bound on what a client can make us buffer.
pub const MAX_HEADER: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProxyHeaderError {
    #[error("no complete PROXY protocol header within the timeout")]
    Timeout,
    #[error("the connection closed before a PROXY protocol header")]
    Closed,
    #[error("not a PROXY protocol header: {0}")]
    Invalid(String),
    #[error("the PROXY protocol header is longer than {MAX_HEADER} bytes")]
    TooLong,
}

impl ProxyHeaderError {
    /// The metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            ProxyHeaderError::Timeout => "timeout",
            ProxyHeaderError::Closed => "closed",
            ProxyHeaderError::Invalid(_) => "invalid",
            ProxyHeaderError::TooLong => "too_long",
        }
    }
}

/// What the start of a connection says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parse {
    /// More bytes are needed.
    Incomplete,
    /// A header of `len` bytes. `source` is the client it names; `None` when it names none
    /// (v2 `LOCAL`, a health check; v1 `UNKNOWN`; a v2 address family other than IP), in
    /// which case the connection's own peer stands.
    Header {
        len: usize,
        source: Option<SocketAddr>,
    },
    Invalid(String),
}

/// Judges the first bytes of a connection.
pub fn parse(bytes: &[u8]) -> Parse {
    let result = HeaderResult::parse(bytes);
    if result.is_incomplete() {
        return if bytes.len() >= MAX_HEADER {
            Parse::Invalid(format!("no header within {MAX_HEADER} bytes"))
        } else {
            Parse::Incomplete
        };
    }
    match result {
        HeaderResult::V1(Ok(header)) => {
            let source = match header.addresses {
                v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
                v1::Addresses::Unknown => None,
            };
            Parse::Header {
                len: header.header.len(),
                source,
            }
        }
        HeaderResult::V2(Ok(header)) => {
            let source = match (header.command, header.addresses) {
                (v2::Command::Local, _) => None,
                (_, v2::Addresses::IPv4(a)) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                (_, v2::Addresses::IPv6(a)) => {
                    Some(SocketAddr::from((a.source_address, a.source_port)))
                }
                (_, v2::Addresses::Unix(_) | v2::Addresses::Unspecified) => None,
            };
            if header.len() > MAX_HEADER {
                return Parse::Invalid(format!("a {}-byte header", header.len()));
            }
            Parse::Header {
                len: header.len(),
                source,
            }
        }
        HeaderResult::V1(Err(err)) => Parse::Invalid(err.to_string()),
        HeaderResult::V2(Err(err)) => Parse::Invalid(err.to_string()),
    }
}

/// Reads and consumes the header at the start of `stream`, leaving every byte after it unread.
/// Returns the client it names (`None`: keep the TCP peer).
pub async fn read_header(
    stream: &mut TcpStream,
    timeout: Duration,
) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let (len, source) = tokio::time::timeout(timeout, peek_header(stream))
        .await
        .map_err(|_| ProxyHeaderError::Timeout)??;
    let mut header = vec![0u8; len];
    // The bytes are already in the socket's queue (they were just peeked): this returns at once.
    stream
        .read_exact(&mut header)
        .await
        .map_err(|_| ProxyHeaderError::Closed)?;
    Ok(source)
}

/// Reads the header from `taken` (bytes already taken off the socket, as the kernel gate hands
/// over the header with the first record behind it) and, while it is incomplete, from the
/// socket into `taken`; removes the header from `taken`, leaving whatever followed it there.
/// Returns the client it names (`None`: keep the TCP peer).
pub async fn take_header(
    stream: &mut TcpStream,
    taken: &mut Vec<u8>,
    timeout: Duration,
) -> Result<Option<SocketAddr>, ProxyHeaderError> {
    let (len, source) = tokio::time::timeout(timeout, async {
        loop {
            match parse(taken) {
                Parse::Header { len, source } => return Ok((len, source)),
                Parse::Invalid(_) if taken.len() >= MAX_HEADER => {
                    return Err(ProxyHeaderError::TooLong);
                }
                Parse::Invalid(reason) => return Err(ProxyHeaderError::Invalid(reason)),
                Parse::Incomplete => {}
            }
            // Bounded: `parse` refuses anything still incomplete at MAX_HEADER bytes.
            match stream.read_buf(taken).await {
                Ok(0) | Err(_) => return Err(ProxyHeaderError::Closed),
                Ok(_) => {}
            }
        }
    })
    .await
    .map_err(|_| ProxyHeaderError::Timeout)??;
    taken.drain(..len.min(taken.len()));
    Ok(source)
}

async fn peek_header(
    stream: &mut TcpStream,
) -> Result<(usize, Option<SocketAddr>), ProxyHeaderError> {
    let mut buf = vec![0u8; MAX_HEADER];
    let mut seen = 0;
    let mut pause = Duration::from_millis(1);
    loop {
        let n = stream
            .peek(&mut buf)
            .await
            .map_err(|_| ProxyHeaderError::Closed)?;
        if n == 0 {
            return Err(ProxyHeaderError::Closed);
        }
        match parse(&buf[..n]) {
            Parse::Header { len, source } => return Ok((len, source)),
            Parse::Invalid(reason) if n >= MAX_HEADER => {
                let _ = reason;
                return Err(ProxyHeaderError::TooLong);
            }
            Parse::Invalid(reason) => return Err(ProxyHeaderError::Invalid(reason)),
            Parse::Incomplete => {}
        }
        // A peek returns what is queued at once, even if nothing new arrived: wait a little
        // before looking again (headers almost always arrive in one segment, so this is rare).
        if n == seen {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(50));
        }
        seen = n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut out = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        out.push(0x20 | command);
        out.push(family);
        let len = u16::try_from(addresses.len() + tlvs.len()).unwrap();
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(addresses);
        out.extend_from_slice(tlvs);
        out
    }

    #[test]
    fn headers_as_load_balancers_send_them() {
        let v4 = [203, 0, 113, 7, 10, 0, 0, 1, 0xC3, 0x50, 0x01, 0xBB];
        let mut v6 = Vec::new();
        v6.extend_from_slice(
            &"2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend_from_slice(
            &"2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        v6.extend_from_slice(&[0xC3, 0x50, 0x01, 0xBB]);
        let aws_tlv = [0xEA, 0x00, 0x05, 0x01, b'v', b'p', b'c', b'e'];
        let cases: Vec<(&str, Vec<u8>, Parse)> = vec![
            (
                "v1 TCP4",
                b"PROXY TCP4 203.0.113.7 10.0.0.1 50000 443\r\nGET / HTTP/1.1\r\n".to_vec(),
                Parse::Header {
                    len: 43,
                    source: Some("203.0.113.7:50000".parse().unwrap()),
                },
            ),
            (
                "v1 TCP6",
                b"PROXY TCP6 2001:db8::7 2001:db8::1 50000 443\r\n".to_vec(),
                Parse::Header {
                    len: 46,
                    source: Some("[2001:db8::7]:50000".parse().unwrap()),
                },
            ),
            (
                "v1 UNKNOWN keeps the peer",
                b"PROXY UNKNOWN\r\n".to_vec(),
                Parse::Header {
                    len: 15,
                    source: None,
                },
            ),
            (
                "v2 PROXY over IPv4, with the first bytes after it",
                [v2(1, 0x11, &v4, &[]), b"\x16\x03\x01".to_vec()].concat(),
                Parse::Header {
                    len: 28,
                    source: Some("203.0.113.7:50000".parse().unwrap()),
                },
            ),
            (
                "v2 over IPv6 with a TLV (as AWS's NLB adds)",
                v2(1, 0x21, &v6, &aws_tlv),
                Parse::Header {
                    len: 16 + 36 + aws_tlv.len(),
                    source: Some("[2001:db8::7]:50000".parse().unwrap()),
                },
            ),
            (
                "v2 LOCAL (a health check) keeps the peer",
                v2(0, 0x00, &[], &[]),
                Parse::Header {
                    len: 16,
                    source: None,
                },
            ),
            (
                "v1 cut short",
                b"PROXY TCP4 203.0.1".to_vec(),
                Parse::Incomplete,
            ),
            (
                "v2 cut short",
                v2(1, 0x11, &v4, &[])[..20].to_vec(),
                Parse::Incomplete,
            ),
            ("one byte", b"P".to_vec(), Parse::Incomplete),
        ];
        for (what, bytes, want) in cases {
            assert_eq!(parse(&bytes), want, "{what}");
        }
    }

    /// The gate's path: the header comes in bytes already taken off the socket, whole or cut
    /// short (the rest then read from the socket); what follows it stays for TLS.
    #[tokio::test]
    async fn take_header_leaves_what_follows() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut client = TcpStream::connect(addr).await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let header = b"PROXY TCP4 203.0.113.7 10.0.0.1 50000 443\r\n";
        let wait = Duration::from_secs(1);

        let mut taken = [&header[..], b"\x16\x03\x01"].concat();
        let source = take_header(&mut server, &mut taken, wait).await;
        assert_eq!(source, Ok(Some("203.0.113.7:50000".parse().unwrap())));
        assert_eq!(taken, b"\x16\x03\x01");

        let mut taken = header[..10].to_vec();
        tokio::io::AsyncWriteExt::write_all(&mut client, &[&header[10..], b"\x16"].concat())
            .await
            .unwrap();
        let source = take_header(&mut server, &mut taken, wait).await;
        assert_eq!(source, Ok(Some("203.0.113.7:50000".parse().unwrap())));
        assert_eq!(taken, b"\x16");

        let mut taken = b"\x16\x03\x01\x00\x05".to_vec();
        let refused = take_header(&mut server, &mut taken, wait).await;
        assert!(
            matches!(refused, Err(ProxyHeaderError::Invalid(_))),
            "{refused:?}"
        );
    }

    #[test]
    fn anything_else_is_refused() {
        let cases: [(&str, &[u8]); 6] = [
            (
                "a request without a header",
                b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
            ),
            (
                "a ClientHello without a header",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
            ),
            (
                "v1 with a bad address",
                b"PROXY TCP4 203.0.113.999 10.0.0.1 1 2\r\n",
            ),
            (
                "v1 with a bad port",
                b"PROXY TCP4 203.0.113.7 10.0.0.1 99999 2\r\n",
            ),
            ("v1 lower case", b"proxy TCP4 203.0.113.7 10.0.0.1 1 2\r\n"),
            ("v2 with version 3", b"\r\n\r\n\0\r\nQUIT\n\x31\x11\x00\x0c"),
        ];
        for (what, bytes) in cases {
            assert!(
                matches!(parse(bytes), Parse::Invalid(_)),
                "{what}: {:?}",
                parse(bytes)
            );
        }
        // An endless v1 line is not waited for beyond the bound.
        let mut long = b"PROXY TCP4 ".to_vec();
        long.resize(MAX_HEADER, b'1');
        assert!(matches!(parse(&long), Parse::Invalid(_)));
    }
}
