//! What an upstream's HTTP/1.x response head says about its own framing and connection, read
//! once for both client protocols (RFC 9112 section 6.3): a `Content-Length` that disagrees
//! with itself is refused; only the last transfer coding says how the message ends.

use crate::header::{Kind, kind, tokens};
use crate::request::content_length;

/// A response head as both client paths start reading it.
pub enum Parsed<'h, 'b> {
    /// Not whole yet.
    Partial,
    Invalid(&'static str),
    Complete {
        /// Bytes of the head, its blank line included.
        len: usize,
        /// 100 to 599.
        status: u16,
        /// HTTP/1.`minor`.
        minor: u8,
        headers: &'h [httparse::Header<'b>],
    },
}

/// Parses the head at the start of `buf` into `storage`, refusing a status outside 100-599.
pub fn parse<'h, 'b>(buf: &'b [u8], storage: &'h mut [httparse::Header<'b>]) -> Parsed<'h, 'b> {
    let mut res = httparse::Response::new(storage);
    let len = match res.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Invalid("malformed response head"),
    };
    let (Some(status), Some(minor)) = (res.code, res.version) else {
        return Parsed::Invalid("malformed response head");
    };
    if !(100..=599).contains(&status) {
        return Parsed::Invalid("status code outside 100-599");
    }
    Parsed::Complete {
        len,
        status,
        minor,
        headers: res.headers,
    }
}

/// The framing and connection facts of one response head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeadFacts<'a> {
    /// Its `Content-Length` (repeats of the same value are one).
    pub length: Option<u64>,
    /// It has a `Transfer-Encoding`.
    pub coded: bool,
    /// And its last coding is `chunked`.
    pub chunked: bool,
    /// The connection may carry another exchange (HTTP/1.1 unless `close`; HTTP/1.0 only with
    /// `keep-alive`).
    pub keep_alive: bool,
    /// `Connection` lists header names (other than `close`, `keep-alive` and `upgrade`), which
    /// are then hop-by-hop.
    pub lists_headers: bool,
    /// The `Upgrade` value.
    pub upgrade_to: Option<&'a [u8]>,
    pub has_date: bool,
    pub has_hsts: bool,
}

impl HeadFacts<'_> {
    /// A message with both framing headers may have been framed differently by someone on
    /// the way: its connection is never trusted again.
    pub fn both_framings(&self) -> bool {
        self.coded && self.length.is_some()
    }
}

/// Reads the facts of `headers` (an HTTP/1.`minor` head), or why they are unusable.
pub fn facts<'a>(
    headers: &[httparse::Header<'a>],
    minor: u8,
) -> Result<HeadFacts<'a>, &'static str> {
    let mut facts = HeadFacts {
        keep_alive: minor == 1,
        ..HeadFacts::default()
    };
    for h in headers {
        match kind(h.name) {
            Kind::ContentLength => match (content_length(h.value), facts.length) {
                (Some(n), None) => facts.length = Some(n),
                (Some(n), Some(m)) if n == m => {}
                _ => return Err("invalid content-length"),
            },
            Kind::TransferEncoding => {
                facts.coded = true;
                for coding in tokens(h.value) {
                    facts.chunked = coding.eq_ignore_ascii_case(b"chunked");
                }
            }
            Kind::Connection => {
                for token in tokens(h.value) {
                    if token.eq_ignore_ascii_case(b"close") {
                        facts.keep_alive = false;
                    } else if token.eq_ignore_ascii_case(b"keep-alive") {
                        facts.keep_alive |= minor == 0;
                    } else if !token.eq_ignore_ascii_case(b"upgrade") {
                        facts.lists_headers = true;
                    }
                }
            }
            Kind::Upgrade => facts.upgrade_to = Some(h.value),
            Kind::Date => facts.has_date = true,
            Kind::Hsts => facts.has_hsts = true,
            _ => {}
        }
    }
    Ok(facts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(head: &str) -> Result<HeadFacts<'_>, &'static str> {
        let mut storage = [httparse::EMPTY_HEADER; 16];
        let mut res = httparse::Response::new(&mut storage);
        let Ok(httparse::Status::Complete(_)) = res.parse(head.as_bytes()) else {
            panic!("not a whole head: {head:?}");
        };
        let minor = res.version.unwrap_or(1);
        facts(res.headers, minor)
    }

    #[test]
    fn framing_and_connection_facts() {
        let cases: &[(&str, Result<HeadFacts<'_>, &str>)] = &[
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\n",
                Ok(HeadFacts {
                    length: Some(5),
                    keep_alive: true,
                    ..HeadFacts::default()
                }),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n",
                Err("invalid content-length"),
            ),
            (
                "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
                Err("invalid content-length"),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
                Ok(HeadFacts {
                    coded: true,
                    chunked: true,
                    keep_alive: true,
                    ..HeadFacts::default()
                }),
            ),
            (
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n",
                Ok(HeadFacts {
                    coded: true,
                    keep_alive: true,
                    ..HeadFacts::default()
                }),
            ),
            (
                "HTTP/1.1 200 OK\r\nConnection: close, x-secret\r\n\r\n",
                Ok(HeadFacts {
                    lists_headers: true,
                    ..HeadFacts::default()
                }),
            ),
            ("HTTP/1.0 200 OK\r\n\r\n", Ok(HeadFacts::default())),
            (
                "HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\n\r\n",
                Ok(HeadFacts {
                    keep_alive: true,
                    ..HeadFacts::default()
                }),
            ),
            (
                "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
                Ok(HeadFacts {
                    keep_alive: true,
                    upgrade_to: Some(b"websocket"),
                    ..HeadFacts::default()
                }),
            ),
            (
                "HTTP/1.1 200 OK\r\nDate: x\r\nStrict-Transport-Security: max-age=1\r\n\r\n",
                Ok(HeadFacts {
                    keep_alive: true,
                    has_date: true,
                    has_hsts: true,
                    ..HeadFacts::default()
                }),
            ),
        ];
        for (head, want) in cases {
            assert_eq!(&read(head), want, "{head:?}");
        }
        let both =
            read("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(both.is_ok_and(|f| f.both_framings()));
    }
}
