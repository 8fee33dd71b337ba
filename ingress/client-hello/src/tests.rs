// The builder narrows lengths on purpose: forging wrong ones is its job.
#![allow(clippy::cast_possible_truncation)]

use proptest::prelude::*;

use super::*;

/// A length field of the hello, for breaking it on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Len {
    Record,
    Handshake,
    SessionId,
    Suites,
    Compression,
    Extensions,
}

/// Encodes a ClientHello field by field, so every length can be set off by a delta.
#[derive(Clone, Debug)]
struct Builder {
    record_type: u8,
    record_version: u16,
    handshake_type: u8,
    legacy_version: u16,
    session_id: Vec<u8>,
    suites: Vec<u8>,
    compression: Vec<u8>,
    extensions: Option<Vec<(u16, Vec<u8>)>>,
    skew: Option<(Len, i32)>,
}

impl Builder {
    /// A plausible TLS 1.3 hello with no extensions block yet.
    fn new() -> Self {
        Self {
            record_type: 22,
            record_version: 0x0301,
            handshake_type: 1,
            legacy_version: 0x0303,
            session_id: vec![7; 32],
            suites: vec![0x13, 0x01, 0x13, 0x02, 0xc0, 0x2f],
            compression: vec![0],
            extensions: None,
            skew: None,
        }
    }

    fn ext(mut self, ext_type: u16, data: Vec<u8>) -> Self {
        self.extensions
            .get_or_insert_with(Vec::new)
            .push((ext_type, data));
        self
    }

    fn sni(self, name: &str) -> Self {
        self.ext(EXT_SERVER_NAME, sni_data(name.as_bytes()))
    }

    fn skew(mut self, len: Len, delta: i32) -> Self {
        self.skew = Some((len, delta));
        self
    }

    fn len_of(&self, which: Len, actual: usize) -> u32 {
        let actual = u32::try_from(actual).unwrap();
        match self.skew {
            Some((len, delta)) if len == which => actual.wrapping_add_signed(delta),
            _ => actual,
        }
    }

    fn build(&self) -> Vec<u8> {
        let mut hello = Vec::new();
        hello.extend(self.legacy_version.to_be_bytes());
        hello.extend([0xab; 32]);
        hello.push(self.len_of(Len::SessionId, self.session_id.len()) as u8);
        hello.extend(&self.session_id);
        hello.extend((self.len_of(Len::Suites, self.suites.len()) as u16).to_be_bytes());
        hello.extend(&self.suites);
        hello.push(self.len_of(Len::Compression, self.compression.len()) as u8);
        hello.extend(&self.compression);
        if let Some(exts) = &self.extensions {
            let mut block = Vec::new();
            for (ext_type, data) in exts {
                block.extend(ext_type.to_be_bytes());
                block.extend((data.len() as u16).to_be_bytes());
                block.extend(data);
            }
            hello.extend((self.len_of(Len::Extensions, block.len()) as u16).to_be_bytes());
            hello.extend(block);
        }
        let mut handshake = vec![self.handshake_type];
        handshake.extend(&self.len_of(Len::Handshake, hello.len()).to_be_bytes()[1..]);
        handshake.extend(hello);
        let mut record = vec![self.record_type];
        record.extend(self.record_version.to_be_bytes());
        record.extend((self.len_of(Len::Record, handshake.len()) as u16).to_be_bytes());
        record.extend(handshake);
        record
    }
}

fn sni_data(name: &[u8]) -> Vec<u8> {
    sni_entries(&[(0, name)])
}

fn sni_entries(entries: &[(u8, &[u8])]) -> Vec<u8> {
    let mut list = Vec::new();
    for (name_type, name) in entries {
        list.push(*name_type);
        list.extend((name.len() as u16).to_be_bytes());
        list.extend(*name);
    }
    vec_u16(&list)
}

fn alpn_data(protocols: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for p in protocols {
        list.push(p.len() as u8);
        list.extend(*p);
    }
    vec_u16(&list)
}

fn versions_data(versions: &[u16]) -> Vec<u8> {
    let mut data = vec![(versions.len() * 2) as u8];
    for v in versions {
        data.extend(v.to_be_bytes());
    }
    data
}

fn vec_u16(data: &[u8]) -> Vec<u8> {
    let mut out = (data.len() as u16).to_be_bytes().to_vec();
    out.extend(data);
    out
}

/// What a test can see of a peek, in comparable form.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Got {
    NeedMore(usize),
    Hello {
        sni: Option<String>,
        alpn: Vec<String>,
        ech: bool,
        tls13: bool,
    },
    Reject(Reject),
}

fn got(bytes: &[u8]) -> Got {
    match peek(bytes) {
        Peek::NeedMore(n) => Got::NeedMore(n),
        Peek::Done(Err(reject)) => Got::Reject(reject),
        Peek::Done(Ok(hello)) => Got::Hello {
            sni: hello.server_name.map(|n| n.to_string()),
            alpn: hello
                .alpn
                .iter()
                .flat_map(|l| l.iter())
                .map(|p| String::from_utf8_lossy(p).into())
                .collect(),
            ech: hello.ech,
            tls13: hello.offers_tls13(),
        },
    }
}

fn sni(name: Option<&str>) -> Got {
    Got::Hello {
        sni: name.map(Into::into),
        alpn: vec![],
        ech: false,
        tls13: false,
    }
}

fn rej(reject: Reject) -> Got {
    Got::Reject(reject)
}

fn mal(field: Field) -> Got {
    Got::Reject(Reject::Malformed(field))
}

#[test]
fn hellos() {
    let b = Builder::new;
    let full = |order: &[u16]| {
        order.iter().fold(b(), |h, &t| match t {
            EXT_SERVER_NAME => h.sni("Example.COM"),
            EXT_ALPN => h.ext(EXT_ALPN, alpn_data(&[b"h2", b"http/1.1"])),
            EXT_SUPPORTED_VERSIONS => h.ext(t, versions_data(&[0x0a0a, TLS13, 0x0303])),
            EXT_ECH => h.ext(t, vec![0, 0, 1, 0, 1, 7, 0, 0]),
            other => h.ext(other, vec![1, 2, 3]),
        })
    };
    let full_got = Got::Hello {
        sni: Some("example.com".into()),
        alpn: vec!["h2".into(), "http/1.1".into()],
        ech: true,
        tls13: true,
    };
    let name253 = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    let name254 = format!("{name253}e");
    let max_padding = MAX_FRAGMENT_LEN - (b().ext(21, vec![]).build().len() - HEADER_LEN);
    let many = |n: u16| (0..n).fold(b(), |h, t| h.ext(100 + t, vec![]));

    let cases: Vec<(&str, Vec<u8>, Got)> = vec![
        // Shapes of valid hellos.
        ("tls12 without extensions", b().build(), sni(None)),
        (
            "empty extension block",
            Builder {
                extensions: Some(vec![]),
                ..b()
            }
            .build(),
            sni(None),
        ),
        (
            "sni only",
            b().sni("example.com").build(),
            sni(Some("example.com")),
        ),
        (
            "sni first",
            full(&[0, 16, 43, 0xfe0d, 23, 5]).build(),
            full_got.clone(),
        ),
        (
            "sni middle",
            full(&[16, 43, 0, 0xfe0d, 23]).build(),
            full_got.clone(),
        ),
        (
            "sni last",
            full(&[0x1a1a, 16, 43, 0xfe0d, 23, 0]).build(),
            full_got.clone(),
        ),
        (
            "no sni, rest present",
            full(&[16, 43, 23]).build(),
            Got::Hello {
                sni: None,
                alpn: vec!["h2".into(), "http/1.1".into()],
                ech: false,
                tls13: true,
            },
        ),
        (
            "tls12 versions only",
            b().ext(43, versions_data(&[0x0303])).build(),
            sni(None),
        ),
        (
            "ech with empty body",
            b().ext(EXT_ECH, vec![]).build(),
            Got::Hello {
                sni: None,
                alpn: vec![],
                ech: true,
                tls13: false,
            },
        ),
        (
            "legacy record version 3.3",
            Builder {
                record_version: 0x0303,
                ..b()
            }
            .build(),
            sni(None),
        ),
        ("32 extensions", many(32).build(), sni(None)),
        (
            "largest record",
            b().ext(21, vec![0; max_padding]).build(),
            sni(None),
        ),
        (
            "one byte over",
            b().ext(21, vec![0; max_padding + 1]).build(),
            rej(Reject::TooLarge),
        ),
        // Names.
        (
            "uppercase lowered",
            b().sni("WWW.Example.Com").build(),
            sni(Some("www.example.com")),
        ),
        (
            "single label",
            b().sni("localhost").build(),
            sni(Some("localhost")),
        ),
        (
            "underscore and digits",
            b().sni("_acme-1.x9.io").build(),
            sni(Some("_acme-1.x9.io")),
        ),
        ("253 bytes", b().sni(&name253).build(), sni(Some(&name253))),
        (
            "254 bytes",
            b().sni(&name254).build(),
            rej(Reject::BadServerName),
        ),
        (
            "empty name",
            b().sni("").build(),
            rej(Reject::BadServerName),
        ),
        (
            "NUL in name",
            b().ext(0, sni_data(b"evil.com\0.example.com")).build(),
            rej(Reject::BadServerName),
        ),
        (
            "non-ascii name",
            b().ext(0, sni_data("café.fr".as_bytes())).build(),
            rej(Reject::BadServerName),
        ),
        (
            "space in name",
            b().sni("a b.com").build(),
            rej(Reject::BadServerName),
        ),
        (
            "leading dot",
            b().sni(".example.com").build(),
            rej(Reject::BadServerName),
        ),
        (
            "trailing dot",
            b().sni("example.com.").build(),
            rej(Reject::BadServerName),
        ),
        (
            "double dot",
            b().sni("example..com").build(),
            rej(Reject::BadServerName),
        ),
        (
            "wildcard star",
            b().sni("*.example.com").build(),
            rej(Reject::BadServerName),
        ),
        // server_name list structure.
        (
            "two host names",
            b().ext(0, sni_entries(&[(0, b"a.com"), (0, b"b.com")]))
                .build(),
            mal(Field::ServerName),
        ),
        (
            "host name then other",
            b().ext(0, sni_entries(&[(0, b"a.com"), (1, b"x")])).build(),
            mal(Field::ServerName),
        ),
        (
            "other name type",
            b().ext(0, sni_entries(&[(1, b"a.com")])).build(),
            mal(Field::ServerName),
        ),
        (
            "empty name list",
            b().ext(0, vec_u16(&[])).build(),
            mal(Field::ServerName),
        ),
        (
            "empty server_name ext",
            b().ext(0, vec![]).build(),
            mal(Field::ServerName),
        ),
        (
            "byte after list",
            b().ext(0, [sni_data(b"a.com"), vec![0]].concat()).build(),
            mal(Field::ServerName),
        ),
        (
            "list length +1",
            b().ext(0, [&[0, 9][..], &[0, 0, 5], b"a.com"].concat())
                .build(),
            mal(Field::ServerName),
        ),
        (
            "list length -1",
            b().ext(0, [&[0, 7][..], &[0, 0, 5], b"a.com"].concat())
                .build(),
            mal(Field::ServerName),
        ),
        (
            "name length +1",
            b().ext(0, [&[0, 8][..], &[0, 0, 6], b"a.com"].concat())
                .build(),
            mal(Field::ServerName),
        ),
        (
            "name length -1",
            b().ext(0, [&[0, 8][..], &[0, 0, 4], b"a.com"].concat())
                .build(),
            mal(Field::ServerName),
        ),
        // ALPN and supported_versions.
        (
            "alpn empty list",
            b().ext(16, vec_u16(&[])).build(),
            mal(Field::Alpn),
        ),
        (
            "alpn empty name",
            b().ext(16, alpn_data(&[b"h2", b""])).build(),
            mal(Field::Alpn),
        ),
        (
            "alpn list length +1",
            b().ext(16, vec![0, 4, 2, b'h', b'2']).build(),
            mal(Field::Alpn),
        ),
        (
            "alpn list length -1",
            b().ext(16, vec![0, 2, 2, b'h', b'2']).build(),
            mal(Field::Alpn),
        ),
        (
            "alpn name length +1",
            b().ext(16, vec![0, 3, 3, b'h', b'2']).build(),
            mal(Field::Alpn),
        ),
        (
            "alpn name length -1",
            b().ext(16, vec![0, 3, 1, b'h', b'2']).build(),
            mal(Field::Alpn),
        ),
        (
            "versions odd",
            b().ext(43, vec![3, 3, 4, 3]).build(),
            mal(Field::SupportedVersions),
        ),
        (
            "versions empty",
            b().ext(43, vec![0]).build(),
            mal(Field::SupportedVersions),
        ),
        (
            "versions length +1",
            b().ext(43, vec![3, 3, 4]).build(),
            mal(Field::SupportedVersions),
        ),
        (
            "versions length -1",
            b().ext(43, vec![1, 3, 4]).build(),
            mal(Field::SupportedVersions),
        ),
        // Extension block.
        (
            "duplicate sni",
            b().sni("a.com").sni("a.com").build(),
            mal(Field::DuplicateExtension),
        ),
        (
            "duplicate unknown",
            b().ext(99, vec![]).sni("a.com").ext(99, vec![1]).build(),
            mal(Field::DuplicateExtension),
        ),
        (
            "33 extensions",
            many(33).build(),
            mal(Field::TooManyExtensions),
        ),
        (
            "extensions length +1",
            b().sni("a.com").skew(Len::Extensions, 1).build(),
            mal(Field::Extensions),
        ),
        (
            "extensions length -1",
            b().sni("a.com").skew(Len::Extensions, -1).build(),
            mal(Field::Extensions),
        ),
        (
            "half an extensions length",
            with_trailer(b(), &[0]),
            mal(Field::Extensions),
        ),
        (
            "garbage after extensions",
            with_trailer(b().sni("a.com"), &[1, 2, 3]),
            mal(Field::Extensions),
        ),
        (
            "extension overruns block",
            with_trailer(b(), &[0, 4, 0, 21, 0, 1]),
            mal(Field::Extensions),
        ),
        (
            "half an extension header",
            with_trailer(b(), &[0, 2, 0, 21]),
            mal(Field::Extensions),
        ),
        // Hello fields.
        (
            "legacy version 2.0",
            Builder {
                legacy_version: 0x0200,
                ..b()
            }
            .build(),
            mal(Field::LegacyVersion),
        ),
        (
            "session id 33",
            Builder {
                session_id: vec![1; 33],
                ..b()
            }
            .build(),
            mal(Field::SessionId),
        ),
        (
            "session id empty",
            Builder {
                session_id: vec![],
                ..b()
            }
            .build(),
            sni(None),
        ),
        (
            "suites empty",
            Builder {
                suites: vec![],
                ..b()
            }
            .build(),
            mal(Field::CipherSuites),
        ),
        (
            "suites odd",
            Builder {
                suites: vec![0x13, 0x01, 0x13],
                ..b()
            }
            .build(),
            mal(Field::CipherSuites),
        ),
        (
            "compression empty",
            Builder {
                compression: vec![],
                ..b()
            }
            .build(),
            mal(Field::CompressionMethods),
        ),
        (
            "session id length past the hello",
            b().skew(Len::SessionId, 200).build(),
            mal(Field::SessionId),
        ),
        (
            "random cut short",
            cut_hello(b(), 2 + 20),
            mal(Field::Random),
        ),
        (
            "legacy version cut short",
            cut_hello(b(), 1),
            mal(Field::LegacyVersion),
        ),
        // Handshake layer.
        (
            "server hello",
            Builder {
                handshake_type: 2,
                ..b()
            }
            .build(),
            rej(Reject::NotClientHello),
        ),
        (
            "handshake length +1",
            b().sni("a.com").skew(Len::Handshake, 1).build(),
            rej(Reject::Fragmented),
        ),
        (
            "handshake length -1",
            b().sni("a.com").skew(Len::Handshake, -1).build(),
            mal(Field::TrailingData),
        ),
        (
            "handshake length huge",
            b().skew(Len::Handshake, 1 << 20).build(),
            rej(Reject::Fragmented),
        ),
        (
            "handshake header split",
            vec![22, 3, 1, 0, 2, 1, 0],
            rej(Reject::Fragmented),
        ),
        (
            "empty record",
            vec![22, 3, 1, 0, 0],
            mal(Field::EmptyRecord),
        ),
        (
            "record length -1",
            b().sni("a.com").skew(Len::Record, -1).build(),
            rej(Reject::Fragmented),
        ),
        // Record layer.
        (
            "record length 16385",
            vec![22, 3, 1, 0x40, 0x01],
            rej(Reject::TooLarge),
        ),
        (
            "record length 65535",
            vec![22, 3, 3, 0xff, 0xff, 1],
            rej(Reject::TooLarge),
        ),
        (
            "alert record",
            vec![21, 3, 3, 0, 2, 2, 40],
            rej(Reject::NotHandshake),
        ),
        (
            "application data",
            vec![23, 3, 3, 0, 1, 0],
            rej(Reject::NotHandshake),
        ),
        (
            "plain http",
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\n".to_vec(),
            rej(Reject::NotTls),
        ),
        (
            "sslv2 hello",
            vec![0x80, 0x2e, 1, 0, 2, 0, 0x15],
            rej(Reject::NotTls),
        ),
        (
            "major version 2",
            vec![22, 2, 0, 0, 1, 1],
            rej(Reject::NotTls),
        ),
        (
            "content type 0",
            vec![0, 3, 1, 0, 1, 1],
            rej(Reject::NotTls),
        ),
        ("one G", b"G".to_vec(), rej(Reject::NotTls)),
        ("empty", vec![], Got::NeedMore(5)),
        ("header only", vec![22, 3, 1], Got::NeedMore(5)),
        (
            "record length +1",
            b().skew(Len::Record, 1).build(),
            Got::NeedMore(b().build().len() + 1),
        ),
        // Bytes after the first record are the next record's business.
        (
            "trailing record",
            [b().sni("a.com").build(), vec![23, 3, 3, 0, 1, 0]].concat(),
            sni(Some("a.com")),
        ),
    ];

    let failures: Vec<String> = cases
        .into_iter()
        .filter_map(|(name, bytes, want)| {
            let have = got(&bytes);
            (have != want).then(|| format!("{name}: want {want:?}, have {have:?}"))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A hello whose extension block is replaced by raw bytes.
fn with_trailer(builder: Builder, trailer: &[u8]) -> Vec<u8> {
    let mut bytes = Builder {
        extensions: None,
        ..builder.clone()
    }
    .build();
    if let Some(exts) = &builder.extensions {
        let mut block = Vec::new();
        for (t, d) in exts {
            block.extend(t.to_be_bytes());
            block.extend((d.len() as u16).to_be_bytes());
            block.extend(d);
        }
        bytes.extend(vec_u16(&block));
    }
    bytes.extend(trailer);
    fix_lengths(bytes)
}

/// A hello cut `keep` bytes into its body, with consistent record and handshake lengths.
fn cut_hello(builder: Builder, keep: usize) -> Vec<u8> {
    let mut bytes = builder.build();
    bytes.truncate(HEADER_LEN + 4 + keep);
    fix_lengths(bytes)
}

fn fix_lengths(mut bytes: Vec<u8>) -> Vec<u8> {
    let body = (bytes.len() - HEADER_LEN) as u16;
    bytes[3..5].copy_from_slice(&body.to_be_bytes());
    let hello = (bytes.len() - HEADER_LEN - 4) as u32;
    bytes[6..9].copy_from_slice(&hello.to_be_bytes()[1..]);
    bytes
}

/// Every length field off by one in either direction never yields a hello.
#[test]
fn off_by_one_lengths_are_rejected() {
    let base = Builder::new()
        .ext(0x0a0a, vec![])
        .sni("a.example.com")
        .ext(EXT_ALPN, alpn_data(&[b"h2"]))
        .ext(EXT_SUPPORTED_VERSIONS, versions_data(&[TLS13]));
    for len in [
        Len::Record,
        Len::Handshake,
        Len::SessionId,
        Len::Suites,
        Len::Compression,
        Len::Extensions,
    ] {
        for delta in [-1, 1] {
            let bytes = base.clone().skew(len, delta).build();
            match peek(&bytes) {
                Peek::Done(Ok(hello)) => panic!("{len:?} {delta:+}: accepted {hello:?}"),
                Peek::Done(Err(reject)) => {
                    assert_eq!(reject.reason(), Reason::Malformed, "{len:?} {delta:+}")
                }
                Peek::NeedMore(n) => {
                    assert_eq!((len, delta, n), (Len::Record, 1, bytes.len() + 1));
                    assert_eq!(parse(&bytes), Err(Reject::Truncated));
                }
            }
        }
    }
}

#[test]
fn parse_wants_exactly_one_record() {
    let record = Builder::new().sni("a.com").build();
    assert_eq!(parse(&record).map(|h| h.record_len), Ok(record.len()));
    let longer = [record.clone(), vec![0]].concat();
    assert_eq!(parse(&longer), Err(Reject::Malformed(Field::TrailingData)));
    assert_eq!(parse(&record[..record.len() - 1]), Err(Reject::Truncated));
    assert_eq!(parse(&record[..3]), Err(Reject::Truncated));
}

#[test]
fn framing_reports_totals() {
    let record = Builder::new().sni("a.com").build();
    let total = record.len();
    assert_eq!(record_len(&record), Framing::Complete(total));
    assert_eq!(
        record_len(&[record.clone(), vec![9; 9]].concat()),
        Framing::Complete(total)
    );
    for cut in 0..total {
        let want = if cut < HEADER_LEN { HEADER_LEN } else { total };
        assert_eq!(
            record_len(&record[..cut]),
            Framing::NeedMore(want),
            "prefix {cut}"
        );
        assert_eq!(peek(&record[..cut]), Peek::NeedMore(want), "prefix {cut}");
    }
}

#[test]
fn gate_maps_outcomes_to_reasons() {
    let named = parse_owned(Builder::new().sni("A.com").build());
    assert_eq!(
        named.as_ref().ok().and_then(|h| h.server_name),
        Some(fixed("a.com"))
    );
    let cases = [
        (Builder::new().build(), Err(Reason::NoSni)),
        (Builder::new().sni("a..b").build(), Err(Reason::Malformed)),
        (
            Builder {
                handshake_type: 2,
                ..Builder::new()
            }
            .build(),
            Err(Reason::Malformed),
        ),
        (b"GET /".to_vec(), Err(Reason::NotTls)),
    ];
    for (bytes, want) in cases {
        let result = parse(&bytes);
        assert_eq!(gate(&result).map(|n| n.to_string()), want, "{bytes:?}");
    }
}

fn parse_owned(bytes: Vec<u8>) -> Result<ClientHello<'static>, Reject> {
    parse(Vec::leak(bytes))
}

fn fixed(name: &str) -> ServerName {
    ServerName::parse(name.as_bytes()).unwrap()
}

#[test]
fn server_name_behaves_like_its_text() {
    let name = fixed("Api.Example.com");
    assert_eq!(name, "api.example.com");
    assert_eq!(name.len(), 15);
    assert_eq!(
        format!("{name} {name:?}"),
        "api.example.com \"api.example.com\""
    );
    assert_eq!(name, fixed("API.EXAMPLE.COM"));
}

#[test]
fn labels_are_stable() {
    let all = [
        (Reject::NotTls, "not_tls", Reason::NotTls),
        (Reject::NotHandshake, "not_handshake", Reason::Malformed),
        (
            Reject::NotClientHello,
            "not_client_hello",
            Reason::Malformed,
        ),
        (Reject::Truncated, "truncated", Reason::Malformed),
        (Reject::TooLarge, "too_large", Reason::Malformed),
        (Reject::Fragmented, "fragmented", Reason::Malformed),
        (
            Reject::Malformed(Field::Alpn),
            "malformed",
            Reason::Malformed,
        ),
        (Reject::BadServerName, "bad_server_name", Reason::Malformed),
    ];
    for (reject, label, reason) in all {
        assert_eq!((reject.as_str(), reject.reason()), (label, reason));
    }
    assert_eq!(
        Reject::Malformed(Field::SessionId).to_string(),
        "malformed ClientHello: bad session_id"
    );
}

/// Checks the invariants that hold for any input; returns the verdict for further checks.
fn check_consistent(bytes: &[u8]) -> Peek<'_> {
    let framing = record_len(bytes);
    let peeked = peek(bytes);
    match (&framing, &peeked) {
        (Framing::NeedMore(n), Peek::NeedMore(m)) => assert!(n == m && *n > bytes.len()),
        (Framing::Reject(r), Peek::Done(Err(e))) => assert_eq!(r, e),
        (Framing::Complete(n), Peek::Done(result)) => {
            assert!(*n <= bytes.len() && *n <= MAX_RECORD_LEN);
            assert_eq!(&parse(&bytes[..*n]), result);
            if let Ok(hello) = result {
                assert_eq!(hello.record_len, *n);
                if let Some(name) = &hello.server_name {
                    let valid = name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)
                    });
                    assert!(
                        valid && !name.is_empty() && name.len() <= MAX_NAME_LEN,
                        "{name:?}"
                    );
                }
            }
        }
        other => panic!("framing and peek disagree: {other:?}"),
    }
    peeked
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        check_consistent(&bytes);
    }

    #[test]
    fn tls_shaped_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..400), hs_type in 0u8..3) {
        let mut bytes = vec![22, 3, 1];
        bytes.extend(((body.len() + 4) as u16).to_be_bytes());
        bytes.push(hs_type);
        bytes.extend(&(body.len() as u32).to_be_bytes()[1..]);
        bytes.extend(&body);
        check_consistent(&bytes);
    }

    #[test]
    fn mutated_hellos_never_panic(pos in any::<prop::sample::Index>(), value in any::<u8>()) {
        let mut bytes = Builder::new()
            .sni("a.example.com")
            .ext(EXT_ALPN, alpn_data(&[b"h2", b"http/1.1"]))
            .ext(EXT_SUPPORTED_VERSIONS, versions_data(&[TLS13]))
            .ext(EXT_ECH, vec![0; 8])
            .build();
        let i = pos.index(bytes.len());
        bytes[i] = value;
        check_consistent(&bytes);
    }
}
