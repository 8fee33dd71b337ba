//! Chunked bodies (RFC 9112 section 7.1), walked one byte of framing at a time and in bulk over
//! data: `advance` finds where a body ends (responses are relayed byte for byte), `decode` also
//! says which bytes are data (request bodies are re-encoded for the upstream, and responses
//! de-chunked for HTTP/1.0 clients).
//!
//! Strict by design: hex sizes only, CRLF exactly where the grammar puts it (no bare CR or LF
//! anywhere in the framing), bounded extension and trailer lines. Every disagreement about where
//! a chunked message ends is a request-smuggling bug waiting for a peer that disagrees.

/// Longest chunk size accepted, in hex digits: 15 keeps the size inside a u64.
const MAX_SIZE_DIGITS: u8 = 15;
/// Longest chunk extension or trailer line accepted.
const MAX_LINE: u32 = 8 * 1024;

#[derive(Clone, Copy, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChunkError {
    #[error("invalid chunk size")]
    Size,
    #[error("chunk size too large")]
    TooLarge,
    #[error("chunk extension or trailer line too long")]
    LineTooLong,
    #[error("missing CRLF after chunk")]
    Crlf,
    #[error("a trailer line that is not a header field")]
    Trailer,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Reading hex digits; `digits` so far.
    Size {
        digits: u8,
    },
    /// Whitespace after the size (RFC 9112's BWS): more of it, `;` or CR.
    SizeWs,
    /// After `;`: an extension up to CR.
    Extension {
        len: u32,
    },
    SizeLf,
    Data {
        left: u64,
    },
    DataCr,
    DataLf,
    /// At the start of a trailer line, or of the final empty line.
    TrailerStart,
    /// A trailer field's name: token characters up to the colon.
    TrailerName {
        len: u32,
    },
    /// After the colon, up to CR.
    TrailerValue {
        len: u32,
    },
    TrailerLf,
    EndLf,
    Done,
}

/// One step of `Chunked::decode`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decoded {
    /// Bytes of the input walked.
    pub consumed: usize,
    /// The data bytes among them (empty when none).
    pub data: std::ops::Range<usize>,
    /// The body ended (last chunk and trailers read).
    pub done: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunked {
    state: State,
    size: u64,
}

impl Default for Chunked {
    fn default() -> Self {
        Self {
            state: State::Size { digits: 0 },
            size: 0,
        }
    }
}

impl Chunked {
    /// Walks `buf`, the next bytes of the body. Returns how many of them belong to the body
    /// (all of them unless it ended inside `buf`) and whether it has ended.
    pub fn advance(&mut self, buf: &[u8]) -> Result<(usize, bool), ChunkError> {
        let mut i = 0;
        while i < buf.len() {
            if let State::Data { left } = self.state {
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(buf.len() - i);
                i += take;
                let left = left - take as u64;
                self.state = if left == 0 {
                    State::DataCr
                } else {
                    State::Data { left }
                };
                continue;
            }
            let byte = buf[i];
            i += 1;
            self.state = self.step(byte)?;
            if self.state == State::Done {
                return Ok((i, true));
            }
        }
        Ok((i, self.state == State::Done))
    }

    /// Walks `buf` up to and including its first run of data bytes: the caller copies those
    /// and calls again with the rest.
    pub fn decode(&mut self, buf: &[u8]) -> Result<Decoded, ChunkError> {
        let mut i = 0;
        while i < buf.len() {
            if let State::Data { left } = self.state {
                let take = usize::try_from(left)
                    .unwrap_or(usize::MAX)
                    .min(buf.len() - i);
                let left = left - take as u64;
                self.state = if left == 0 {
                    State::DataCr
                } else {
                    State::Data { left }
                };
                return Ok(Decoded {
                    consumed: i + take,
                    data: i..i + take,
                    done: false,
                });
            }
            let byte = buf[i];
            i += 1;
            self.state = self.step(byte)?;
            if self.state == State::Done {
                return Ok(Decoded {
                    consumed: i,
                    data: i..i,
                    done: true,
                });
            }
        }
        Ok(Decoded {
            consumed: i,
            data: i..i,
            done: self.state == State::Done,
        })
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    fn step(&mut self, byte: u8) -> Result<State, ChunkError> {
        Ok(match self.state {
            State::Size { digits } => match hex(byte) {
                Some(d) => {
                    if digits >= MAX_SIZE_DIGITS {
                        return Err(ChunkError::TooLarge);
                    }
                    self.size = self.size * 16 + u64::from(d);
                    State::Size { digits: digits + 1 }
                }
                None if digits == 0 => return Err(ChunkError::Size),
                None => match byte {
                    b'\r' => State::SizeLf,
                    b';' => State::Extension { len: 0 },
                    b' ' | b'\t' => State::SizeWs,
                    _ => return Err(ChunkError::Size),
                },
            },
            State::SizeWs => match byte {
                b' ' | b'\t' => State::SizeWs,
                b';' => State::Extension { len: 0 },
                b'\r' => State::SizeLf,
                _ => return Err(ChunkError::Size),
            },
            State::Extension { len } => match byte {
                b'\r' => State::SizeLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff if len < MAX_LINE => {
                    State::Extension { len: len + 1 }
                }
                b'\t' | b' '..=b'~' | 0x80..=0xff => return Err(ChunkError::LineTooLong),
                _ => return Err(ChunkError::Crlf),
            },
            State::SizeLf => match (byte, self.size) {
                (b'\n', 0) => State::TrailerStart,
                (b'\n', left) => State::Data { left },
                _ => return Err(ChunkError::Crlf),
            },
            State::DataCr => match byte {
                b'\r' => State::DataLf,
                _ => return Err(ChunkError::Crlf),
            },
            State::DataLf => match byte {
                b'\n' => {
                    self.size = 0;
                    State::Size { digits: 0 }
                }
                _ => return Err(ChunkError::Crlf),
            },
            State::TrailerStart => match byte {
                b'\r' => State::EndLf,
                b if tchar(b) => State::TrailerName { len: 1 },
                _ => return Err(ChunkError::Trailer),
            },
            // A trailer section is header fields; anything else (a request line, say) is
            // something another reader might take for the next message.
            State::TrailerName { len } => match byte {
                b':' => State::TrailerValue { len: len + 1 },
                b if tchar(b) && len < MAX_LINE => State::TrailerName { len: len + 1 },
                b if tchar(b) => return Err(ChunkError::LineTooLong),
                _ => return Err(ChunkError::Trailer),
            },
            State::TrailerValue { len } => match byte {
                b'\r' => State::TrailerLf,
                b'\t' | b' '..=b'~' | 0x80..=0xff if len < MAX_LINE => {
                    State::TrailerValue { len: len + 1 }
                }
                b'\t' | b' '..=b'~' | 0x80..=0xff => return Err(ChunkError::LineTooLong),
                _ => return Err(ChunkError::Crlf),
            },
            State::TrailerLf => match byte {
                b'\n' => State::TrailerStart,
                _ => return Err(ChunkError::Crlf),
            },
            State::EndLf => match byte {
                b'\n' => State::Done,
                _ => return Err(ChunkError::Crlf),
            },
            // `advance` handles data in bulk and stops at Done.
            State::Data { .. } | State::Done => self.state,
        })
    }
}

/// Appends one chunk holding `data` (nothing for empty data, which would end the body).
pub fn encode_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut size = [0u8; 16];
    let mut i = size.len();
    let mut n = data.len();
    loop {
        i -= 1;
        size[i] = DIGITS[n & 0xf];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&size[i..]);
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// The last chunk, with no trailers: what ends every body the proxy re-encodes.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// RFC 9110's token characters, which a field name is made of.
fn tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn hex(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` split at every position, and as single bytes, and checks each way agrees.
    fn body_len(input: &[u8]) -> Result<Option<usize>, ChunkError> {
        let whole = {
            let mut c = Chunked::default();
            let (n, done) = c.advance(input)?;
            done.then_some(n)
        };
        for split in 0..=input.len() {
            let mut c = Chunked::default();
            let (a, done_a) = c.advance(&input[..split])?;
            let got = if done_a {
                Some(a)
            } else {
                let (b, done_b) = c.advance(&input[split..])?;
                done_b.then_some(split + b)
            };
            assert_eq!(got, whole, "split at {split} of {:?}", input);
        }
        let mut c = Chunked::default();
        let mut bytewise = None;
        for (i, byte) in input.iter().enumerate() {
            let (n, done) = c.advance(std::slice::from_ref(byte))?;
            assert_eq!(n, 1);
            if done {
                bytewise = Some(i + 1);
                break;
            }
        }
        assert_eq!(bytewise, whole, "byte by byte {:?}", input);
        Ok(whole)
    }

    #[test]
    fn finds_the_end_of_chunked_bodies() {
        let cases: &[(&[u8], Result<Option<usize>, ChunkError>)] = &[
            (b"0\r\n\r\n", Ok(Some(5))),
            (b"5\r\nhello\r\n0\r\n\r\n", Ok(Some(15))),
            (b"5\r\nhello\r\n0\r\n\r\nGET / HTTP/1.1", Ok(Some(15))),
            (b"A\r\n0123456789\r\n0\r\n\r\n", Ok(Some(20))),
            (b"a;name=value\r\n0123456789\r\n0\r\n\r\n", Ok(Some(31))),
            (b"5 \r\nhello\r\n0\r\n\r\n", Ok(Some(16))),
            (
                b"3\r\nabc\r\n0\r\nExpires: never\r\nX-A: b\r\n\r\n",
                Ok(Some(37)),
            ),
            (b"5\r\nhel", Ok(None)),
            (b"5\r\nhello\r\n", Ok(None)),
            (b"0\r\n\r", Ok(None)),
            (b"\r\n", Err(ChunkError::Size)),
            (b"x\r\n", Err(ChunkError::Size)),
            (b"5\r\nhelloX", Err(ChunkError::Crlf)),
            (b"5\nhello", Err(ChunkError::Size)),
            (b"0\r\n\n", Err(ChunkError::Trailer)),
            (b"1000000000000000\r\n", Err(ChunkError::TooLarge)),
        ];
        for (input, want) in cases {
            assert_eq!(
                &body_len(input),
                want,
                "{:?}",
                String::from_utf8_lossy(input)
            );
        }
    }

    /// Decodes `input` fed in pieces of `step` bytes; returns the data and whether it ended.
    fn decode_all(input: &[u8], step: usize) -> Result<(Vec<u8>, bool), ChunkError> {
        let mut c = Chunked::default();
        let mut data = Vec::new();
        for piece in input.chunks(step) {
            let mut at = 0;
            while at < piece.len() {
                let d = c.decode(&piece[at..])?;
                data.extend_from_slice(&piece[at..][d.data.clone()]);
                at += d.consumed;
                if d.done {
                    return Ok((data, true));
                }
            }
        }
        Ok((data, false))
    }

    #[test]
    fn decodes_data_in_any_pieces() {
        let cases: &[(&[u8], Result<(&[u8], bool), ChunkError>)] = &[
            (b"0\r\n\r\n", Ok((b"", true))),
            (
                b"5\r\nhello\r\n6;x=y\r\n world\r\n0\r\nT: v\r\n\r\nNEXT",
                Ok((b"hello world", true)),
            ),
            (b"5\r\nhel", Ok((b"hel", false))),
            (b"5\r\nhelloX", Err(ChunkError::Crlf)),
            (b"5\r\nhello\n", Err(ChunkError::Crlf)),
            (b"1;a\rb\r\nx\r\n", Err(ChunkError::Crlf)),
            (b"-1\r\n", Err(ChunkError::Size)),
            (b"5 xyz\r\nhello\r\n0\r\n\r\n", Err(ChunkError::Size)),
            (b"5 ;a=b\r\nhello\r\n0\r\n\r\n", Ok((b"hello", true))),
            (b"1;a\x00\r\nx\r\n", Err(ChunkError::Crlf)),
            (
                b"000\r\nGET / HTTP/\r\n04\r\nhello\r\n0\r\n\r\n",
                Err(ChunkError::Trailer),
            ),
            (b"0\r\n: v\r\n\r\n", Err(ChunkError::Trailer)),
            (b"0\r\nA : v\r\n\r\n", Err(ChunkError::Trailer)),
            (b"0\r\nA:\r\nB: c d\r\n\r\n", Ok((b"", true))),
            (b"0x5\r\n", Err(ChunkError::Size)),
        ];
        for (input, want) in cases {
            for step in [1, 2, 3, 7, input.len().max(1)] {
                let got = decode_all(input, step);
                let want = want
                    .as_ref()
                    .map(|(d, done)| (d.to_vec(), *done))
                    .map_err(|e| *e);
                assert_eq!(
                    got,
                    want,
                    "{:?} in pieces of {step}",
                    String::from_utf8_lossy(input)
                );
            }
        }
    }

    #[test]
    fn chunks_are_encoded_in_hex() {
        for (data, want) in [
            (&b""[..], &b""[..]),
            (b"a", b"1\r\na\r\n"),
            (&[b'x'; 255], b"ff\r\n"),
            (&[b'x'; 16384], b"4000\r\n"),
        ] {
            let mut out = Vec::new();
            encode_chunk(data, &mut out);
            assert!(out.starts_with(want), "{}", data.len());
            if !data.is_empty() {
                let (_, done) = Chunked::default()
                    .advance(&[out.as_slice(), LAST_CHUNK].concat())
                    .unwrap();
                assert!(done);
            }
        }
    }

    #[test]
    fn long_lines_are_refused() {
        let mut input = b"1;".to_vec();
        input.extend(std::iter::repeat_n(b'x', MAX_LINE as usize + 1));
        assert_eq!(
            Chunked::default().advance(&input),
            Err(ChunkError::LineTooLong)
        );
    }
}
