//! Digest auth's user table: an htdigest file (`auth-secret-type: auth-file`, the Secret's `auth`
//! key) or a map of user to `realm:HA1` (`auth-map`, which ingress-nginx writes out as
//! `user:realm:HA1` lines), as nginx's digest module reads it.
//!
//! ```text
//!   "user:realm:5f4dcc3b5aa765d61d8327deb882cf99"   HA1 = MD5(user:realm:password), 32 hex digits
//!   "# ...", blank lines                            skipped
//!   anything else                                   an error: the Ingress is refused
//! ```
//!
//! The module matches a line by the user and the realm the client's `Authorization` names, so
//! one file may hold several realms; HA1 is all it ever needs, and all htdigest stores.

use std::collections::BTreeMap;
use std::fmt;

/// `(user, realm)` → HA1, as 32 lower-case hex digits (the bytes the response hash is made of).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct DigestUsers {
    users: BTreeMap<(String, String), [u8; 32]>,
}

impl fmt::Debug for DigestUsers {
    // HA1 is as good as the password for this realm: only who is in the table is shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set()
            .entries(
                self.users
                    .keys()
                    .map(|(user, realm)| format!("{user}@{realm}")),
            )
            .finish()
    }
}

impl DigestUsers {
    /// An htdigest file's lines.
    pub fn from_htdigest(text: &[u8]) -> Result<DigestUsers, String> {
        let mut table = DigestUsers::default();
        for (n, line) in super::htpasswd::entry_lines(text)? {
            let mut fields = line.splitn(3, ':');
            let (Some(user), Some(realm), Some(ha1)) =
                (fields.next(), fields.next(), fields.next())
            else {
                return Err(format!("line {n}: no \"user:realm:HA1\""));
            };
            table
                .insert(user, realm, ha1)
                .map_err(|e| format!("line {n}: {e}"))?;
        }
        Ok(table)
    }

    /// `auth-map`: each key a user, each value `realm:HA1`.
    pub fn from_map<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<DigestUsers, String> {
        let mut table = DigestUsers::default();
        for (user, value) in entries {
            let value = std::str::from_utf8(value)
                .map_err(|_| format!("key {user:?}: not UTF-8 text"))?
                .trim();
            let Some((realm, ha1)) = value.split_once(':') else {
                return Err(format!("key {user:?}: no \"realm:HA1\""));
            };
            table
                .insert(user, realm, ha1)
                .map_err(|e| format!("key {user:?}: {e}"))?;
        }
        Ok(table)
    }

    fn insert(&mut self, user: &str, realm: &str, ha1: &str) -> Result<(), String> {
        if user.is_empty() {
            return Err("empty user name".into());
        }
        if realm.is_empty() {
            return Err("empty realm".into());
        }
        // What follows the digest is a comment, as the module reads it (it stops at `:`, `#`).
        let ha1 = ha1.split([':', '#']).next().unwrap_or_default().trim_end();
        let Ok(ha1) = <[u8; 32]>::try_from(ha1.as_bytes()) else {
            return Err("HA1 is not 32 hex digits".into());
        };
        if !ha1.iter().all(u8::is_ascii_hexdigit) {
            return Err("HA1 is not 32 hex digits".into());
        }
        let key = (user.to_string(), realm.to_string());
        if self
            .users
            .insert(key, ha1.map(|b| b.to_ascii_lowercase()))
            .is_some()
        {
            return Err(format!("user {user:?} appears twice in realm {realm:?}"));
        }
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether any user belongs to `realm`.
    pub fn has_realm(&self, realm: &str) -> bool {
        self.users.keys().any(|(_, r)| r == realm)
    }

    /// HA1 of `user` in `realm`.
    pub fn ha1(&self, user: &str, realm: &str) -> Option<&[u8; 32]> {
        // BTreeMap<(String, String), _> wants an owned key to look up; the table is small and
        // this runs once per authenticated request, after the header parsed.
        self.users.get(&(user.to_string(), realm.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn htdigest_files_are_read_as_the_digest_module_reads_them() {
        // htdigest -c file "Staff only" alice (password "password").
        let file = b"# made with htdigest\n\nalice:Staff only:8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\r\nbob:other:8B84B0B7B4B1B3F9B0BC1D5E4F0E5F9A:comment\n";
        let table = DigestUsers::from_htdigest(file).expect("parses");
        assert_eq!(table.len(), 2);
        assert!(table.ha1("alice", "Staff only").is_some());
        assert!(
            table.ha1("alice", "other").is_none(),
            "realms are kept apart"
        );
        assert_eq!(
            table.ha1("bob", "other").map(|h| h.as_slice()),
            Some(&b"8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a"[..]),
            "HA1 is kept in lower case, as clients compute it"
        );
        assert!(table.has_realm("Staff only"));
        assert!(!table.has_realm("Staff"));
        assert_eq!(
            format!("{table:?}"),
            r#"{"alice@Staff only", "bob@other"}"#,
            "no HA1 in Debug output"
        );
        let bad: &[&[u8]] = &[
            b"alice\n",
            b"alice:realm\n",
            b":realm:8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\n",
            b"alice::8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\n",
            b"alice:realm:8b84b0b7\n",
            b"alice:realm:zz84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\n",
            b"alice:realm:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\n",
            b"a:r:8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\na:r:8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\n",
            b"\xff:r:8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a\n",
        ];
        for file in bad {
            assert!(
                DigestUsers::from_htdigest(file).is_err(),
                "{}",
                String::from_utf8_lossy(file)
            );
        }
    }

    #[test]
    fn auth_maps_are_user_to_realm_and_ha1() {
        let table = DigestUsers::from_map([
            ("alice", &b"Staff only:8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a"[..]),
            ("bob", b"Staff only:00000000000000000000000000000000\n"),
        ])
        .expect("parses");
        assert!(table.ha1("alice", "Staff only").is_some());
        assert!(table.ha1("bob", "Staff only").is_some());
        assert!(
            DigestUsers::from_map([("alice", &b"8b84b0b7b4b1b3f9b0bc1d5e4f0e5f9a"[..])]).is_err()
        );
    }
}
