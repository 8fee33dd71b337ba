//! What moves through a passthrough connection and how it ends: a 1 MiB random block, each
//! copy stamped with its index, written and hashed as it goes; SHA-256 from the TLS provider the
//! tests already link; and a reader that drains a stream to its end and says how it ended.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::corpus::Xorshift;

pub const MIB: usize = 1 << 20;

/// How a backend connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    Eof,
    Reset,
    Other(String),
}

/// How a read or write error ended a connection.
pub fn ending(e: &std::io::Error) -> End {
    match e.kind() {
        std::io::ErrorKind::ConnectionReset => End::Reset,
        std::io::ErrorKind::UnexpectedEof => End::Eof,
        _ => End::Other(e.to_string()),
    }
}

/// Reads to the end, hashing; how it ended.
pub async fn drain<S: AsyncRead + Unpin>(stream: &mut S) -> (u64, Vec<u8>, End) {
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut received = 0u64;
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return (received, hash.finish(), End::Eof),
            Ok(n) => {
                hash.update(&buf[..n]);
                received += n as u64;
            }
            Err(e) => return (received, hash.finish(), ending(&e)),
        }
    }
}

/// SHA-256 from the TLS provider the tests already link (aws-lc), fast even in debug builds.
pub struct Sha256(Box<dyn rustls::crypto::hash::Context>);

impl Default for Sha256 {
    fn default() -> Sha256 {
        Sha256::new()
    }
}

impl Sha256 {
    pub fn new() -> Sha256 {
        let suite = rustls::crypto::aws_lc_rs::cipher_suite::TLS13_AES_128_GCM_SHA256;
        let rustls::SupportedCipherSuite::Tls13(suite) = suite else {
            unreachable!("a TLS 1.3 suite")
        };
        Sha256(suite.common.hash_provider.start())
    }

    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    pub fn finish(self) -> Vec<u8> {
        self.0.finish().as_ref().to_vec()
    }
}

/// 1 MiB of xorshift output: incompressible, and the same in every run.
pub fn pattern_block() -> &'static [u8] {
    static BLOCK: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    BLOCK.get_or_init(|| {
        let mut random = Xorshift::new(0x9e37_79b9_7f4a_7c15);
        let mut block = Vec::with_capacity(MIB);
        while block.len() < MIB {
            block.extend_from_slice(&random.next_u64().to_le_bytes());
        }
        block
    })
}

/// Writes `len` bytes of the pattern; returns (bytes, SHA-256 of them).
pub async fn send_pattern<W: AsyncWrite + Unpin>(
    writer: &mut W,
    len: usize,
) -> std::io::Result<(usize, Vec<u8>)> {
    let mut block = pattern_block().to_vec();
    let mut hash = Sha256::new();
    let mut sent = 0;
    let mut index = 0u64;
    while sent < len {
        block[..8].copy_from_slice(&index.to_le_bytes());
        let n = (len - sent).min(MIB);
        writer.write_all(&block[..n]).await?;
        hash.update(&block[..n]);
        sent += n;
        index += 1;
    }
    Ok((sent, hash.finish()))
}
