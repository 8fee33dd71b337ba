//! A pure, fuzzable TLS ClientHello parser: the reference for the kernel's SNI gate.
//!
//! The HTTPS listener decides from the first TLS record alone, before any handshake work, whether
//! the connection names a host we serve. The eBPF verdict program makes the same decision from the
//! same bytes with its own parser; the corpus in `tests/data/clienthello/` holds the two to
//! identical outcomes, so every rule below is one a bounded kernel walk can also compute.
//!
//! ```text
//!   bytes ──record_len──► NeedMore(n) ─ read more
//!     │                   Reject(NotTls | NotHandshake | TooLarge)
//!     └─ Complete(len) ──parse──► ClientHello { server_name, alpn, ech, supported_versions }
//!                               └► Reject(..)
//!   gate(): Ok(name) → host lookup (pass / unknown host); Err(Reason) → configured policy
//! ```
//!
//! | Outcome                     | `Reject::as_str`   | `Reason`    | Kernel verdict        |
//! |-----------------------------|--------------------|-------------|-----------------------|
//! | valid, `server_name` known  | –                  | –           | pass (or steer)       |
//! | valid, `server_name` other  | –                  | –           | unknown host          |
//! | valid, no `server_name`     | –                  | `NoSni`     | no-SNI policy         |
//! | first byte / major version  | `not_tls`          | `NotTls`    | not-TLS policy        |
//! | TLS record, not handshake   | `not_handshake`    | `Malformed` | malformed policy      |
//! | handshake, not ClientHello  | `not_client_hello` | `Malformed` | malformed policy      |
//! | record length > 16384       | `too_large`        | `Malformed` | malformed policy      |
//! | buffer shorter than record  | `truncated`        | `Malformed` | (never: strparser)    |
//! | hello longer than record    | `fragmented`       | `Malformed` | malformed policy      |
//! | a length or field is wrong  | `malformed`        | `Malformed` | malformed policy      |
//! | `server_name` value invalid | `bad_server_name`  | `Malformed` | malformed policy      |
//!
//! Rules, each chosen so the kernel can mirror it exactly:
//! - Framing: content type byte in 20..=24 and record major version 3, else not TLS (decided from
//!   the first two bytes, so plain HTTP is classified at once). The minor version is not checked.
//!   Type other than 22 (handshake) is `not_handshake`. Record length above 16384 is `too_large`.
//! - The record must hold exactly one handshake message: a ClientHello whose length runs past the
//!   record is `fragmented` (the kernel only ever sees the first record); bytes after it are
//!   malformed.
//! - legacy_version major must be 3; session id at most 32 bytes; cipher suites non-empty and
//!   even; at least one compression method. The extension block may be absent (TLS 1.2); if present
//!   its length must exactly fill the rest of the hello, and each extension must fit inside it.
//! - At most [`MAX_EXTENSIONS`] extensions, any order; a type seen twice is malformed (RFC 8446
//!   §4.2), for every type, not only the ones we read.
//! - `server_name` (0): the list must be exactly one `host_name` (type 0) entry filling the
//!   extension. RFC 6066 forbids two names of one type and no other type was ever defined, so
//!   anything else is malformed and the kernel needs no loop here. The name must be 1..=253 bytes
//!   of ASCII letters, digits, `-`, `_` and `.`, with no empty label (so no leading, trailing or
//!   doubled dot); otherwise `bad_server_name`. Underscores are admitted because real hosts use
//!   them; they can only ever match as an unknown host. IP literals are not special-cased: they
//!   never equal an Ingress host, so they end as unknown host. The name is returned lowercased.
//! - ALPN (16): a non-empty list, exactly filling the extension, of non-empty protocol names.
//! - supported_versions (43): a non-empty, even-length list exactly filling the extension.
//! - encrypted_client_hello (0xfe0d): only its presence is recorded; the outer `server_name` is the
//!   ECH public name, which is what the gate decides on.
//! - Other extensions are skipped unread.

mod name;
mod reader;
#[cfg(test)]
mod tests;

pub use name::ServerName;
use reader::Reader;

/// Bytes in a TLS record header: type, version (2), length (2).
pub const HEADER_LEN: usize = 5;
/// The largest record body a peer may send (RFC 8446 §5.1); longer is `too_large`.
pub const MAX_FRAGMENT_LEN: usize = 16384;
/// The largest first record we ever need to buffer.
pub const MAX_RECORD_LEN: usize = HEADER_LEN + MAX_FRAGMENT_LEN;
/// The extension walk's bound, shared with the kernel's bounded loop. Real clients send 10–20.
pub const MAX_EXTENSIONS: usize = 32;
/// The longest `server_name` accepted (a DNS name's maximum text length).
pub const MAX_NAME_LEN: usize = 253;

pub const EXT_SERVER_NAME: u16 = 0;
pub const EXT_ALPN: u16 = 16;
pub const EXT_SUPPORTED_VERSIONS: u16 = 43;
pub const EXT_ECH: u16 = 0xfe0d;

/// TLS 1.3's code in `supported_versions`.
pub const TLS13: u16 = 0x0304;

const CONTENT_HANDSHAKE: u8 = 22;
const CONTENT_TYPES: std::ops::RangeInclusive<u8> = 20..=24;
const HANDSHAKE_CLIENT_HELLO: u8 = 1;
const RANDOM_LEN: usize = 32;
const MAX_SESSION_ID_LEN: usize = 32;
const NAME_TYPE_HOST_NAME: u8 = 0;

/// What the record header says about a buffer that starts a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// Not decidable yet: the buffer must grow to at least this many bytes in total.
    NeedMore(usize),
    /// The first record is whole and is this many bytes (header included).
    Complete(usize),
    /// Decided from the header alone.
    Reject(Reject),
}

/// The result of looking at the bytes received so far.
// Boxing the hello would allocate once per connection to save a ~300-byte move.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peek<'a> {
    /// Read until at least this many bytes are buffered in total, then peek again.
    NeedMore(usize),
    /// The verdict on the first record; later bytes were not looked at.
    Done(Result<ClientHello<'a>, Reject>),
}

/// Why a first record is not a usable ClientHello. Kernel mirrors only [`Reject::reason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    #[error("not TLS")]
    NotTls,
    #[error("first TLS record is not a handshake record")]
    NotHandshake,
    #[error("first handshake message is not a ClientHello")]
    NotClientHello,
    #[error("buffer ends before the record does")]
    Truncated,
    #[error("record length exceeds 16384")]
    TooLarge,
    #[error("ClientHello continues past the first record")]
    Fragmented,
    #[error("malformed ClientHello: bad {0}")]
    Malformed(Field),
    #[error("server_name is not a valid host name")]
    BadServerName,
}

/// The part of a ClientHello that was wrong, for logs and metric labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Zero-length handshake record.
    EmptyRecord,
    /// Bytes after the ClientHello, or after the record when calling [`parse`].
    TrailingData,
    LegacyVersion,
    Random,
    SessionId,
    CipherSuites,
    CompressionMethods,
    /// The extension block's length does not fill the hello, or an extension overruns it.
    Extensions,
    TooManyExtensions,
    DuplicateExtension,
    ServerName,
    Alpn,
    SupportedVersions,
}

/// Why a connection is decided as it is, shared with the kernel programs: the parser yields
/// `NoSni`, `Malformed` or `NotTls` when there is no name to look up.
pub use ingress_common::Reason;

/// A parsed ClientHello: only what the gate and the proxy need, borrowed from the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientHello<'a> {
    /// Bytes of the record, header included: what to read before handing the socket to TLS.
    pub record_len: usize,
    pub legacy_version: u16,
    /// Lowercased; `None` if the extension is absent.
    pub server_name: Option<ServerName>,
    pub alpn: Option<ProtocolList<'a>>,
    pub supported_versions: Option<VersionList<'a>>,
    /// An `encrypted_client_hello` extension is present (real or GREASE).
    pub ech: bool,
}

/// The ALPN protocol names a client offers, in its order of preference.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProtocolList<'a>(&'a [u8]);

/// The versions listed in `supported_versions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VersionList<'a>(&'a [u8]);

/// Looks at the record header of the first bytes of a connection.
pub fn record_len(buf: &[u8]) -> Framing {
    let Some(&content_type) = buf.first() else {
        return Framing::NeedMore(HEADER_LEN);
    };
    if !CONTENT_TYPES.contains(&content_type) {
        return Framing::Reject(Reject::NotTls);
    }
    let Some(&major) = buf.get(1) else {
        return Framing::NeedMore(HEADER_LEN);
    };
    if major != 3 {
        return Framing::Reject(Reject::NotTls);
    }
    if content_type != CONTENT_HANDSHAKE {
        return Framing::Reject(Reject::NotHandshake);
    }
    let Some(&[hi, lo]) = buf.get(3..HEADER_LEN) else {
        return Framing::NeedMore(HEADER_LEN);
    };
    let body = usize::from(u16::from_be_bytes([hi, lo]));
    if body > MAX_FRAGMENT_LEN {
        return Framing::Reject(Reject::TooLarge);
    }
    let total = HEADER_LEN + body;
    if buf.len() < total {
        Framing::NeedMore(total)
    } else {
        Framing::Complete(total)
    }
}

/// Decides on the first record of `buf`, or says how many bytes are needed to.
pub fn peek(buf: &[u8]) -> Peek<'_> {
    match record_len(buf) {
        Framing::NeedMore(n) => Peek::NeedMore(n),
        Framing::Reject(reject) => Peek::Done(Err(reject)),
        Framing::Complete(n) => Peek::Done(match buf.get(..n) {
            Some(record) => parse(record),
            None => Err(Reject::Truncated),
        }),
    }
}

/// Parses exactly one complete TLS record holding a ClientHello.
pub fn parse(record: &[u8]) -> Result<ClientHello<'_>, Reject> {
    let total = match record_len(record) {
        Framing::NeedMore(_) => return Err(Reject::Truncated),
        Framing::Reject(reject) => return Err(reject),
        Framing::Complete(total) => total,
    };
    if record.len() != total {
        return Err(Reject::Malformed(Field::TrailingData));
    }
    let body = record.get(HEADER_LEN..).unwrap_or_default();
    let mut hello = parse_handshake(body)?;
    hello.record_len = total;
    Ok(hello)
}

/// The name to look up, or the reason the policy decides instead.
pub fn gate<'r>(result: &'r Result<ClientHello<'_>, Reject>) -> Result<&'r ServerName, Reason> {
    match result {
        Ok(hello) => hello.server_name.as_ref().ok_or(Reason::NoSni),
        Err(reject) => Err(reject.reason()),
    }
}

fn parse_handshake(body: &[u8]) -> Result<ClientHello<'_>, Reject> {
    let mut r = Reader::new(body);
    let msg_type = r.u8().ok_or(Reject::Malformed(Field::EmptyRecord))?;
    if msg_type != HANDSHAKE_CLIENT_HELLO {
        return Err(Reject::NotClientHello);
    }
    // A handshake header split across records is still a (fragmented) ClientHello.
    let len = r.u24().ok_or(Reject::Fragmented)?;
    let hello = r.take(len).ok_or(Reject::Fragmented)?;
    if !r.is_empty() {
        return Err(Reject::Malformed(Field::TrailingData));
    }
    parse_hello(hello)
}

fn parse_hello(hello: &[u8]) -> Result<ClientHello<'_>, Reject> {
    use Field::*;
    let bad = |field| move || Reject::Malformed(field);
    let mut r = Reader::new(hello);

    let legacy_version = r.u16().ok_or_else(bad(LegacyVersion))?;
    if legacy_version >> 8 != 3 {
        return Err(Reject::Malformed(LegacyVersion));
    }
    r.take(RANDOM_LEN).ok_or_else(bad(Random))?;
    let session_id = r.vec_u8().ok_or_else(bad(SessionId))?;
    if session_id.len() > MAX_SESSION_ID_LEN {
        return Err(Reject::Malformed(SessionId));
    }
    let suites = r.vec_u16().ok_or_else(bad(CipherSuites))?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return Err(Reject::Malformed(CipherSuites));
    }
    let compression = r.vec_u8().ok_or_else(bad(CompressionMethods))?;
    if compression.is_empty() {
        return Err(Reject::Malformed(CompressionMethods));
    }

    let mut out = ClientHello {
        record_len: 0,
        legacy_version,
        server_name: None,
        alpn: None,
        supported_versions: None,
        ech: false,
    };
    if r.is_empty() {
        return Ok(out);
    }
    let block = r.vec_u16().ok_or_else(bad(Extensions))?;
    if !r.is_empty() {
        return Err(Reject::Malformed(Extensions));
    }
    parse_extensions(block, &mut out)?;
    Ok(out)
}

fn parse_extensions<'a>(block: &'a [u8], out: &mut ClientHello<'a>) -> Result<(), Reject> {
    let mut r = Reader::new(block);
    let mut seen = [0u16; MAX_EXTENSIONS];
    let mut count = 0;
    while !r.is_empty() {
        let malformed = Reject::Malformed(Field::Extensions);
        let ext_type = r.u16().ok_or(malformed)?;
        let data = r.vec_u16().ok_or(malformed)?;
        if seen.iter().take(count).any(|&t| t == ext_type) {
            return Err(Reject::Malformed(Field::DuplicateExtension));
        }
        let slot = seen
            .get_mut(count)
            .ok_or(Reject::Malformed(Field::TooManyExtensions))?;
        *slot = ext_type;
        count += 1;
        match ext_type {
            EXT_SERVER_NAME => out.server_name = Some(parse_server_name(data)?),
            EXT_ALPN => out.alpn = Some(ProtocolList::parse(data)?),
            EXT_SUPPORTED_VERSIONS => out.supported_versions = Some(VersionList::parse(data)?),
            EXT_ECH => out.ech = true,
            _ => {}
        }
    }
    Ok(())
}

fn parse_server_name(data: &[u8]) -> Result<ServerName, Reject> {
    let malformed = Reject::Malformed(Field::ServerName);
    let mut r = Reader::new(data);
    let list = r.vec_u16().ok_or(malformed)?;
    if !r.is_empty() {
        return Err(malformed);
    }
    let mut entries = Reader::new(list);
    if entries.u8() != Some(NAME_TYPE_HOST_NAME) {
        return Err(malformed);
    }
    let name = entries.vec_u16().ok_or(malformed)?;
    if !entries.is_empty() {
        return Err(malformed);
    }
    ServerName::parse(name).ok_or(Reject::BadServerName)
}

impl Reject {
    /// The policy class; the kernel computes the same one for the same bytes.
    pub fn reason(&self) -> Reason {
        match self {
            Reject::NotTls => Reason::NotTls,
            Reject::NotHandshake
            | Reject::NotClientHello
            | Reject::Truncated
            | Reject::TooLarge
            | Reject::Fragmented
            | Reject::Malformed(_)
            | Reject::BadServerName => Reason::Malformed,
        }
    }

    /// A stable label, used in metrics and in the corpus manifest.
    pub fn as_str(&self) -> &'static str {
        match self {
            Reject::NotTls => "not_tls",
            Reject::NotHandshake => "not_handshake",
            Reject::NotClientHello => "not_client_hello",
            Reject::Truncated => "truncated",
            Reject::TooLarge => "too_large",
            Reject::Fragmented => "fragmented",
            Reject::Malformed(_) => "malformed",
            Reject::BadServerName => "bad_server_name",
        }
    }
}

impl Field {
    pub fn as_str(&self) -> &'static str {
        match self {
            Field::EmptyRecord => "empty_record",
            Field::TrailingData => "trailing_data",
            Field::LegacyVersion => "legacy_version",
            Field::Random => "random",
            Field::SessionId => "session_id",
            Field::CipherSuites => "cipher_suites",
            Field::CompressionMethods => "compression_methods",
            Field::Extensions => "extensions",
            Field::TooManyExtensions => "too_many_extensions",
            Field::DuplicateExtension => "duplicate_extension",
            Field::ServerName => "server_name",
            Field::Alpn => "alpn",
            Field::SupportedVersions => "supported_versions",
        }
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ClientHello<'_> {
    /// TLS 1.3 is only negotiable if `supported_versions` lists it.
    pub fn offers_tls13(&self) -> bool {
        self.supported_versions.is_some_and(|v| v.contains(TLS13))
    }
}

impl<'a> ProtocolList<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, Reject> {
        let malformed = Reject::Malformed(Field::Alpn);
        let mut r = Reader::new(data);
        let list = r.vec_u16().ok_or(malformed)?;
        if !r.is_empty() || list.is_empty() {
            return Err(malformed);
        }
        let mut names = Reader::new(list);
        while !names.is_empty() {
            match names.vec_u8() {
                Some(name) if !name.is_empty() => {}
                _ => return Err(malformed),
            }
        }
        Ok(Self(list))
    }

    /// Protocol names, most preferred first.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let mut r = Reader::new(self.0);
        std::iter::from_fn(move || r.vec_u8())
    }

    pub fn contains(&self, protocol: &[u8]) -> bool {
        self.iter().any(|p| p == protocol)
    }
}

impl<'a> VersionList<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, Reject> {
        let malformed = Reject::Malformed(Field::SupportedVersions);
        let mut r = Reader::new(data);
        let list = r.vec_u8().ok_or(malformed)?;
        if !r.is_empty() || list.is_empty() || list.len() % 2 != 0 {
            return Err(malformed);
        }
        Ok(Self(list))
    }

    /// Versions in the client's order (GREASE values included).
    pub fn iter(&self) -> impl Iterator<Item = u16> + use<'a> {
        self.0.chunks_exact(2).filter_map(|pair| match *pair {
            [hi, lo] => Some(u16::from_be_bytes([hi, lo])),
            _ => None,
        })
    }

    pub fn contains(&self, version: u16) -> bool {
        self.iter().any(|v| v == version)
    }
}
