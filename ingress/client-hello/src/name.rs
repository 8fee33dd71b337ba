//! The `server_name` a client asks for, validated and lowercased into an inline buffer so the
//! hot path never allocates.

use std::fmt;

use super::MAX_NAME_LEN;

/// A lowercased host name of 1..=253 bytes from `[a-z0-9._-]`, with no empty label.
#[derive(Clone, Copy)]
pub struct ServerName {
    buf: [u8; MAX_NAME_LEN],
    len: u8,
}

impl ServerName {
    /// Validates raw `host_name` bytes by the rules at the top of the parent module.
    pub(super) fn parse(raw: &[u8]) -> Option<Self> {
        if raw.is_empty() || raw.len() > MAX_NAME_LEN {
            return None;
        }
        let mut buf = [0u8; MAX_NAME_LEN];
        let mut previous = b'.';
        for (slot, &b) in buf.iter_mut().zip(raw) {
            let valid = match b {
                b'.' => previous != b'.',
                b'-' | b'_' => true,
                _ => b.is_ascii_alphanumeric(),
            };
            if !valid {
                return None;
            }
            *slot = b.to_ascii_lowercase();
            previous = b;
        }
        if previous == b'.' {
            return None;
        }
        Some(Self {
            buf,
            len: u8::try_from(raw.len()).ok()?,
        })
    }

    pub fn as_str(&self) -> &str {
        let bytes = self.as_bytes();
        // Only ASCII is ever stored, so this cannot fail; the fallback keeps it panic-free.
        std::str::from_utf8(bytes).unwrap_or_default()
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.buf.get(..usize::from(self.len)).unwrap_or_default()
    }
}

impl std::ops::Deref for ServerName {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for ServerName {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for ServerName {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for ServerName {}

impl std::hash::Hash for ServerName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl PartialEq<str> for ServerName {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for ServerName {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl fmt::Display for ServerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for ServerName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}
