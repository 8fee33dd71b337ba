//! The ClientHello corpus in `tests/data/clienthello` (real clients' first records and
//! synthetic edge cases), and the reproducible mutations the parity tests make of it.

use std::path::{Path, PathBuf};

/// The corpus directory.
pub fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("data/clienthello")
}

/// One corpus file's bytes.
pub fn corpus(file: &str) -> Vec<u8> {
    let path = dir().join(file);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.bin` in the corpus as (file name, bytes), sorted by name.
pub fn all() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir())
        .expect("corpus dir")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin"))
        .map(|n| {
            let bytes = corpus(&n);
            (n, bytes)
        })
        .collect();
    files.sort();
    files
}

/// `bytes` with every occurrence of `from` replaced by `to` (same length, so every length field
/// stays right).
pub fn renamed(bytes: &[u8], from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    let mut out = bytes.to_vec();
    let mut found = 0;
    let mut at = 0;
    while let Some(pos) = out[at..]
        .windows(from.len())
        .position(|w| w == from.as_bytes())
    {
        let start = at + pos;
        out[start..start + to.len()].copy_from_slice(to.as_bytes());
        at = start + to.len();
        found += 1;
    }
    assert!(found > 0, "{from} is not in the hello");
    out
}

/// A fixed xorshift64, so a failing mutant or payload is reproducible from its seed and index.
pub struct Xorshift(u64);

impl Xorshift {
    pub fn new(seed: u64) -> Xorshift {
        Xorshift(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value below `n` (as the tests always drew them: the next value modulo `n`).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64()).expect("64-bit usize") % n
    }

    pub fn byte(&mut self) -> u8 {
        self.next_u64().to_le_bytes()[0]
    }
}
