//! The shared ClientHello corpus against the userspace parser: every file gives exactly its
//! manifest outcome, partial records never get a verdict, chunked reads agree with whole ones,
//! and mutated real hellos never panic or contradict themselves.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use ingress::client_hello::{
    ClientHello, Framing, HEADER_LEN, MAX_NAME_LEN, MAX_RECORD_LEN, Peek, Reject, gate, parse,
    peek, record_len,
};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
struct Manifest {
    files: Vec<Entry>,
}

#[derive(Debug, Deserialize)]
struct Entry {
    file: String,
    source: String,
    expect: Expect,
}

#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(untagged, deny_unknown_fields)]
enum Expect {
    Hello {
        sni: Option<String>,
        alpn: Vec<String>,
        ech: bool,
        tls13: bool,
        reason: Option<String>,
    },
    Reject {
        reject: String,
        field: Option<String>,
        reason: String,
    },
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/clienthello")
}

fn load() -> Vec<(Entry, Vec<u8>)> {
    let dir = corpus_dir();
    let manifest = std::fs::read_to_string(dir.join("corpus.json"))
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let manifest: Manifest =
        serde_json::from_str(&manifest).unwrap_or_else(|e| panic!("corpus.json: {e}"));
    manifest
        .files
        .into_iter()
        .map(|entry| {
            let bytes = std::fs::read(dir.join(&entry.file))
                .unwrap_or_else(|e| panic!("{}: {e}", entry.file));
            (entry, bytes)
        })
        .collect()
}

/// The manifest's view of a parse result.
fn outcome(result: &Result<ClientHello<'_>, Reject>) -> Expect {
    let reason = gate(result).err().map(|r| r.as_str().to_string());
    match result {
        Ok(hello) => Expect::Hello {
            sni: hello.server_name.map(|n| n.to_string()),
            alpn: hello
                .alpn
                .iter()
                .flat_map(|list| list.iter())
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .collect(),
            ech: hello.ech,
            tls13: hello.offers_tls13(),
            reason,
        },
        Err(reject) => Expect::Reject {
            reject: reject.as_str().to_string(),
            field: match reject {
                Reject::Malformed(field) => Some(field.as_str().to_string()),
                _ => None,
            },
            reason: reason.unwrap_or_default(),
        },
    }
}

fn is_real(entry: &Entry) -> bool {
    !entry.source.starts_with("synth")
}

#[test]
fn manifest_lists_every_file() {
    let listed: BTreeSet<String> = load().into_iter().map(|(e, _)| e.file).collect();
    let on_disk: BTreeSet<String> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".bin"))
        .collect();
    assert_eq!(listed, on_disk);
}

#[test]
fn every_file_parses_to_its_expected_outcome() {
    let mut failures = Vec::new();
    for (entry, bytes) in load() {
        let have = outcome(&parse(&bytes));
        if have != entry.expect {
            failures.push(format!(
                "{}: want {:?}\n    have {:?}",
                entry.file, entry.expect, have
            ));
        }
        // The incremental path must agree, except that it waits where parse says truncated.
        match peek(&bytes) {
            Peek::Done(result) => assert_eq!(outcome(&result), have, "{}", entry.file),
            Peek::NeedMore(n) => {
                assert_eq!(parse(&bytes), Err(Reject::Truncated), "{}", entry.file);
                assert!(n > bytes.len(), "{}", entry.file);
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn real_captures_cover_the_clients_we_promise() {
    let entries = load();
    let real: Vec<_> = entries.iter().filter(|(e, _)| is_real(e)).collect();
    let prefixes = ["curl-", "openssl-tls13-", "openssl-tls12-", "chromium-"];
    for prefix in prefixes {
        assert!(
            real.iter().any(|(e, _)| e.file.starts_with(prefix)),
            "no {prefix} capture"
        );
    }
    // Modern browsers' post-quantum key shares push the hello past one MTU-sized segment.
    let largest = real.iter().map(|(_, b)| b.len()).max().unwrap();
    assert!(largest > 1500, "largest real hello is {largest} bytes");
}

/// Valid records: a reader that fetches what `NeedMore` asks for never gets an early verdict
/// and reads exactly the record, even with the next record already queued behind it.
#[test]
fn prefixes_of_valid_records_never_get_a_verdict() {
    for (entry, bytes) in load() {
        let Ok(hello) = parse(&bytes) else { continue };
        assert_eq!(hello.record_len, bytes.len(), "{}", entry.file);
        for cut in 0..bytes.len() {
            let prefix = &bytes[..cut];
            let want = if cut < HEADER_LEN {
                HEADER_LEN
            } else {
                bytes.len()
            };
            assert_eq!(
                peek(prefix),
                Peek::NeedMore(want),
                "{} prefix {cut}",
                entry.file
            );
            assert_eq!(
                record_len(prefix),
                Framing::NeedMore(want),
                "{} prefix {cut}",
                entry.file
            );
            assert_eq!(
                parse(prefix),
                Err(Reject::Truncated),
                "{} prefix {cut}",
                entry.file
            );
        }

        let mut stream = bytes.clone();
        stream.extend([23, 3, 3, 0, 5, 1, 2, 3, 4, 5]);
        let mut buf = Vec::new();
        let verdict = loop {
            match peek(&buf) {
                Peek::NeedMore(n) => buf.extend_from_slice(&stream[buf.len()..n]),
                Peek::Done(result) => break outcome(&result),
            }
        };
        assert_eq!(buf, bytes, "{}: read past the first record", entry.file);
        assert_eq!(verdict, entry.expect, "{}", entry.file);
    }
}

/// A hello arriving in three reads, cut anywhere, ends in the same verdict as the whole.
#[test]
fn three_chunks_give_the_same_result() {
    for (entry, bytes) in load() {
        let Ok(_) = parse(&bytes) else { continue };
        let len = bytes.len();
        let mut cuts = vec![
            (1, 2),
            (4, 5),
            (5, 6),
            (len / 3, 2 * len / 3),
            (len - 2, len - 1),
        ];
        let mut rng = Lcg(len as u64);
        cuts.extend((0..50).map(|_| {
            let a = 1 + rng.below(len - 2);
            (a, a + 1 + rng.below(len - a - 1))
        }));
        for (a, b) in cuts {
            let mut buf = Vec::new();
            let mut verdict = None;
            for chunk in [&bytes[..a], &bytes[a..b], &bytes[b..]] {
                assert!(
                    verdict.is_none(),
                    "{}: verdict before the last chunk",
                    entry.file
                );
                buf.extend_from_slice(chunk);
                if let Peek::Done(result) = peek(&buf) {
                    verdict = Some(outcome(&result));
                }
            }
            assert_eq!(
                verdict.as_ref(),
                Some(&entry.expect),
                "{} cut at {a},{b}",
                entry.file
            );
        }
    }
}

/// Single-byte mutations and truncations of every real hello: no panic, framing, peek and parse
/// agree, accepted names are valid, and bytes nobody reads (the random) never change the verdict.
#[test]
fn mutations_of_real_hellos_are_handled() {
    let mut runs = 0usize;
    for (entry, bytes) in load().into_iter().filter(|(e, _)| is_real(e)) {
        let original = outcome(&parse(&bytes));
        let mut rng = Lcg(0x1234_5678 ^ bytes.len() as u64);
        for _ in 0..300 {
            let mut mutated = bytes.clone();
            let at = rng.below(bytes.len());
            let value = match rng.below(4) {
                0 => mutated[at] ^ 0xff,
                1 => mutated[at].wrapping_add(1),
                2 => mutated[at].wrapping_sub(1),
                _ => u8::try_from(rng.below(256)).unwrap(),
            };
            mutated[at] = value;
            let result = check_consistent(&mutated, &entry.file);
            // Record header, handshake header and legacy_version come first: 11..43 is the random.
            if (11..43).contains(&at) {
                assert_eq!(
                    result,
                    Some(original.clone()),
                    "{} random byte {at}",
                    entry.file
                );
            }
            runs += 1;
        }
        for cut in 0..bytes.len() {
            // Cut with the record length fixed up: the hello now overruns its record.
            let mut short = bytes[..cut].to_vec();
            if cut >= HEADER_LEN {
                let body = u16::try_from(cut - HEADER_LEN).unwrap();
                short[3..5].copy_from_slice(&body.to_be_bytes());
                let want = if cut == HEADER_LEN {
                    "malformed"
                } else {
                    "fragmented"
                };
                let have = outcome(&parse(&short));
                assert!(
                    matches!(&have, Expect::Reject { reject, .. } if reject == want),
                    "{} cut {cut}: {have:?}",
                    entry.file
                );
            }
            check_consistent(&short, &entry.file);
            runs += 1;
        }
    }
    assert!(runs > 3000, "only {runs} mutations");
}

/// The invariants that hold for any input; returns the outcome when there is a verdict.
fn check_consistent(bytes: &[u8], file: &str) -> Option<Expect> {
    let peeked = peek(bytes);
    match (record_len(bytes), &peeked) {
        (Framing::NeedMore(n), Peek::NeedMore(m)) => {
            assert!(n == *m && n > bytes.len() && n <= MAX_RECORD_LEN, "{file}");
            None
        }
        (Framing::Reject(r), Peek::Done(Err(e))) => {
            assert_eq!(&r, e, "{file}");
            Some(outcome(&Err(r)))
        }
        (Framing::Complete(n), Peek::Done(result)) => {
            assert_eq!(&parse(&bytes[..n]), result, "{file}");
            if let Ok(hello) = result {
                assert_eq!(hello.record_len, n, "{file}");
                if let Some(name) = &hello.server_name {
                    let ok = name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b)
                    });
                    assert!(
                        ok && !name.is_empty() && name.len() <= MAX_NAME_LEN,
                        "{file}: {name:?}"
                    );
                }
            }
            Some(outcome(result))
        }
        other => panic!("{file}: framing and peek disagree: {other:?}"),
    }
}

/// A fixed-seed generator: the mutations are the same on every run, so failures reproduce.
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: usize) -> usize {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        usize::try_from((self.0 >> 33) % n.max(1) as u64).unwrap_or(0)
    }
}
