//! Records ClientHellos for the shared parser corpus in `tests/data/clienthello/`.
//!
//! `capture-clienthello listen <addr> <out.bin>` accepts one connection on a loopback address,
//! reads exactly the first TLS record (framed by the parser under test's own `record_len`, so
//! what is saved is what the gate would see), writes it and closes the connection.
//!
//! `capture-clienthello synth <dir>` writes the synthetic cases: hellos no client we can run
//! will send (maximum size, GREASE ECH, broken fields) and bytes that are not TLS.
//!
//! `tests/data/clienthello/capture.sh` drives both; its README says which command made each file.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use ingress::client_hello::{Framing, MAX_FRAGMENT_LEN, record_len};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["listen", addr, out] => listen(addr.parse()?, Path::new(out)),
        ["synth", dir] => synth(Path::new(dir)),
        _ => bail!("usage: capture-clienthello listen <127.0.0.1:port> <out.bin> | synth <dir>"),
    }
}

fn listen(addr: SocketAddr, out: &Path) -> anyhow::Result<()> {
    ensure!(
        addr.ip().is_loopback(),
        "only loopback addresses are captured from"
    );
    let listener = TcpListener::bind(addr).with_context(|| format!("bind {addr}"))?;
    eprintln!("listening on {addr}");
    let (mut conn, peer) = listener.accept()?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut buf = Vec::new();
    let len = loop {
        match record_len(&buf) {
            Framing::Complete(len) => break len,
            Framing::Reject(reject) => bail!("{peer} did not send a handshake record: {reject}"),
            Framing::NeedMore(n) => {
                let mut chunk = vec![0; n - buf.len()];
                let got = conn.read(&mut chunk).context("read first record")?;
                ensure!(got > 0, "{peer} closed after {} bytes", buf.len());
                buf.extend_from_slice(&chunk[..got]);
            }
        }
    };
    buf.truncate(len);
    std::fs::write(out, &buf).with_context(|| format!("write {}", out.display()))?;
    eprintln!("{peer}: {len} bytes -> {}", out.display());
    Ok(())
}

fn synth(dir: &Path) -> anyhow::Result<()> {
    let files = synthetic();
    for (name, bytes) in &files {
        let path: PathBuf = dir.join(name);
        std::fs::File::create(&path)
            .and_then(|mut f| f.write_all(bytes))
            .with_context(|| format!("write {}", path.display()))?;
        eprintln!("{name}: {} bytes", bytes.len());
    }
    Ok(())
}

/// Every synthetic corpus file, by name. Deterministic: rerunning rewrites identical bytes.
fn synthetic() -> Vec<(&'static str, Vec<u8>)> {
    let tls13 = || {
        Hello::new()
            .ext(0x0a0a, vec![])
            .sni(b"synth.example.test")
            .ext(10, vec![0, 4, 0x00, 0x1d, 0x00, 0x17]) // supported_groups
            .ext(13, vec![0, 4, 0x04, 0x03, 0x08, 0x04]) // signature_algorithms
            .ext(16, alpn(&[b"h2", b"http/1.1"]))
            .ext(43, vec![4, 0x03, 0x04, 0x03, 0x03])
            .ext(51, key_share())
    };
    let padding_to_max = {
        let base = tls13().ext(21, vec![]).record();
        MAX_FRAGMENT_LEN - (base.len() - 5)
    };
    let mut fragmented = tls13().ext(21, vec![0; 3000]).record();
    fragmented.truncate(5 + 1200);
    fragmented[3..5].copy_from_slice(&1200u16.to_be_bytes());
    let mut truncated = tls13().record();
    truncated.truncate(100);
    let mut too_large = vec![22, 3, 1, 0x40, 0x01];
    too_large.extend(
        tls13()
            .ext(21, vec![0; MAX_FRAGMENT_LEN])
            .record()
            .get(5..5 + 16385)
            .unwrap_or_default(),
    );

    vec![
        ("synth-ech-grease.bin", {
            Hello::new()
                .sni(b"public.example.test")
                .ext(16, alpn(&[b"h2"]))
                .ext(43, vec![2, 0x03, 0x04])
                .ext(51, key_share())
                .ext(0xfe0d, grease_ech())
                .record()
        }),
        ("synth-max-record.bin", tls13().ext(21, vec![0; padding_to_max]).record()),
        ("synth-too-large.bin", too_large),
        // server_name after 1600 bytes of padding: across an MTU-1500 link it is in segment two.
        ("synth-sni-late.bin", {
            Hello::new().ext(21, vec![0; 1600]).ext(43, vec![2, 3, 4]).sni(b"late.example.test").record()
        }),
        ("synth-uppercase-sni.bin", Hello::new().sni(b"MiXeD.Example.TEST").record()),
        ("synth-no-extensions.bin", Hello { extensions: None, ..Hello::new() }.record()),
        ("synth-bad-sni-nul.bin", Hello::new().sni(b"good.example.test\0.evil").record()),
        ("synth-bad-sni-trailing-dot.bin", Hello::new().sni(b"example.test.").record()),
        ("synth-duplicate-sni.bin", Hello::new().sni(b"a.example.test").sni(b"b.example.test").record()),
        ("synth-fragmented.bin", fragmented),
        ("synth-truncated.bin", truncated),
        ("synth-server-hello.bin", Hello { handshake_type: 2, ..Hello::new() }.record()),
        ("synth-alert.bin", vec![21, 3, 3, 0, 2, 2, 40]),
        ("synth-tls-noise.bin", {
            // A ClientHello header and version, then random bytes where the fields should be.
            let mut noise = vec![22, 3, 1, 1, 0, 1, 0, 0, 252, 3, 3];
            noise.extend(noise_bytes(0x5eed, 250));
            noise
        }),
        ("http-get.bin", b"GET / HTTP/1.1\r\nHost: plain.example.test\r\nUser-Agent: curl/7.88.1\r\nAccept: */*\r\n\r\n".to_vec()),
        ("garbage.bin", {
            let mut garbage = vec![0x9c];
            garbage.extend(noise_bytes(0xdead_beef, 511));
            garbage
        }),
        // The SSLv2-compatible hello that old OpenSSL sent, with a TLS 1.0 version inside.
        ("sslv2-compat.bin", {
            let mut v2 = vec![0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15, 0x00, 0x00, 0x00, 0x10];
            v2.extend([0x00, 0x00, 0x39, 0x00, 0x00, 0x38, 0x00, 0x00, 0x35, 0x00, 0x00, 0x16, 0x00, 0x00, 0x13]);
            v2.extend([0x00, 0x00, 0x0a, 0x07, 0x00, 0xc0]);
            v2.extend(noise_bytes(16, 16));
            v2
        }),
    ]
}

/// A minimal ClientHello encoder; lengths are always computed, never forged.
struct Hello {
    handshake_type: u8,
    extensions: Option<Vec<(u16, Vec<u8>)>>,
}

impl Hello {
    fn new() -> Self {
        Self {
            handshake_type: 1,
            extensions: Some(Vec::new()),
        }
    }

    fn ext(mut self, ext_type: u16, data: Vec<u8>) -> Self {
        self.extensions
            .get_or_insert_with(Vec::new)
            .push((ext_type, data));
        self
    }

    fn sni(self, name: &[u8]) -> Self {
        let mut entry = vec![0];
        entry.extend(prefixed16(name));
        self.ext(0, prefixed16(&entry))
    }

    fn record(&self) -> Vec<u8> {
        let mut hello = vec![0x03, 0x03];
        hello.extend(noise_bytes(1, 32));
        hello.push(32);
        hello.extend(noise_bytes(2, 32));
        hello.extend(prefixed16(&[
            0x13, 0x01, 0x13, 0x02, 0x13, 0x03, 0xc0, 0x2b, 0xc0, 0x2f,
        ]));
        hello.extend([1, 0]);
        if let Some(exts) = &self.extensions {
            let mut block = Vec::new();
            for (ext_type, data) in exts {
                block.extend(ext_type.to_be_bytes());
                block.extend(prefixed16(data));
            }
            hello.extend(prefixed16(&block));
        }
        let len = u32::try_from(hello.len()).unwrap_or(u32::MAX).to_be_bytes();
        let mut handshake = vec![self.handshake_type, len[1], len[2], len[3]];
        handshake.extend(hello);
        let mut record = vec![22, 3, 1];
        record.extend(prefixed16(&handshake));
        record
    }
}

fn prefixed16(data: &[u8]) -> Vec<u8> {
    let mut out = u16::try_from(data.len())
        .unwrap_or(u16::MAX)
        .to_be_bytes()
        .to_vec();
    out.extend(data);
    out
}

fn alpn(protocols: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for p in protocols {
        list.push(u8::try_from(p.len()).unwrap_or(u8::MAX));
        list.extend(*p);
    }
    prefixed16(&list)
}

/// One x25519 key share, as every TLS 1.3 client sends.
fn key_share() -> Vec<u8> {
    let mut entry = vec![0x00, 0x1d];
    entry.extend(prefixed16(&noise_bytes(3, 32)));
    prefixed16(&entry)
}

/// A GREASE ECH outer extension as Chrome sends it (draft-ietf-tls-esni §6.2): outer type,
/// HKDF-SHA256 / AES-128-GCM, a random config id, a 32-byte X25519 enc and a random payload.
fn grease_ech() -> Vec<u8> {
    let mut ech = vec![0x00, 0x00, 0x01, 0x00, 0x01, 0x7a];
    ech.extend(prefixed16(&noise_bytes(4, 32)));
    ech.extend(prefixed16(&noise_bytes(5, 144)));
    ech
}

/// Deterministic filler (xorshift64*), so the corpus regenerates byte for byte.
fn noise_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_be_bytes()[0]
        })
        .collect()
}
