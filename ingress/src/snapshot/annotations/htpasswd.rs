//! Basic auth's credential table: an htpasswd file (`auth-secret-type: auth-file`, the Secret's
//! `auth` key) or a map of user to hash (`auth-map`), parsed once per snapshot into typed
//! hashes, and the check of a password against one.
//!
//! ```text
//!   "user:$2y$…"      bcrypt ($2y$, $2b$, $2a$)        bcrypt crate (expensive: see `is_costly`)
//!   "user:$apr1$…"    Apache's MD5 (htpasswd -m)        MD5-crypt with the apr1 magic
//!   "user:$1$…"       MD5-crypt (openssl passwd -1)     the same algorithm, magic "$1$"
//!   "user:{SHA}…"     base64 SHA-1 (htpasswd -s)
//!   "user:{SSHA}…"    base64 of SHA-1(password salt) and the salt (slappasswd)
//!   "user:{PLAIN}…"   plain text (nginx accepts it)
//!   "user:$6$…", "$5$…", "$y$…", "abJnggxhB/yWI" (DES), ...: any other crypt(3) hash the
//!                     system's libxcrypt accepts (`crypt_checksalt`), checked by its `crypt_rn`
//!                     (expensive, except DES), as nginx hands whatever it does not know to crypt
//!   anything else (a hash libxcrypt rejects) → not parsed: the Ingress is refused
//! ```
//!
//! nginx reads the file the same way: one `user:hash[:comment]` a line, `#` lines and blank lines
//! skipped. A line this table cannot read is an error rather than a user silently left out, so a
//! file written for nginx is either honoured whole or not served at all.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use md5::{Digest as _, Md5};
use sha1::Sha1;
use subtle::ConstantTimeEq;

/// Users and their password hashes.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    users: BTreeMap<String, PasswordHash>,
}

impl fmt::Debug for Credentials {
    // Hashes stay out of logs and `ingress check`: only who is in the table.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.users.keys()).finish()
    }
}

/// One user's password hash, in a format this controller can check.
#[derive(Clone, PartialEq, Eq)]
pub enum PasswordHash {
    /// The whole `$2y$…` string, checked by the bcrypt crate.
    Bcrypt(String),
    /// `$apr1$salt$hash` (`apr1`) or `$1$salt$hash` (not `apr1`).
    Md5Crypt {
        apr1: bool,
        salt: String,
        hash: String,
    },
    /// `{SHA}` and the base64 of the SHA-1 digest.
    Sha1([u8; 20]),
    /// `{SSHA}`: the base64 of SHA-1(password ‖ salt) followed by the salt.
    SaltedSha1 { digest: [u8; 20], salt: Vec<u8> },
    /// `{PLAIN}` and the password.
    Plain(Vec<u8>),
    /// Any other crypt(3) hash (SHA-crypt, yescrypt, DES, ...), checked by the system's crypt.
    Crypt { hash: String, des: bool },
}

impl Credentials {
    /// An htpasswd file's lines.
    pub fn from_htpasswd(text: &[u8]) -> Result<Credentials, String> {
        let mut users = BTreeMap::new();
        for (n, line) in entry_lines(text)? {
            let Some((user, rest)) = line.split_once(':') else {
                return Err(format!("line {n}: no \"user:hash\""));
            };
            // What follows a second colon is a comment, as nginx reads it.
            let hash = rest.split(':').next().unwrap_or_default();
            insert(&mut users, user, hash).map_err(|e| format!("line {n}: {e}"))?;
        }
        Ok(Credentials { users })
    }

    /// `auth-map`: each key a user, each value that user's hash.
    pub fn from_map<'a>(
        entries: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    ) -> Result<Credentials, String> {
        let mut users = BTreeMap::new();
        for (user, value) in entries {
            let hash = std::str::from_utf8(value)
                .map_err(|_| format!("key {user:?}: not UTF-8 text"))?
                .trim();
            insert(&mut users, user, hash).map_err(|e| format!("key {user:?}: {e}"))?;
        }
        Ok(Credentials { users })
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    pub fn get(&self, user: &str) -> Option<&PasswordHash> {
        self.users.get(user)
    }
}

/// The lines of a password file that hold an entry, numbered from 1, as nginx reads them:
/// UTF-8, CRLF or LF, `#` lines and blank lines skipped. Shared with htdigest files.
pub(super) fn entry_lines(text: &[u8]) -> Result<impl Iterator<Item = (usize, &str)>, String> {
    let text = std::str::from_utf8(text).map_err(|_| "not UTF-8 text".to_string())?;
    Ok(text
        .lines()
        .enumerate()
        .map(|(n, line)| (n + 1, line.trim_end_matches('\r')))
        .filter(|(_, line)| !line.trim().is_empty() && !line.starts_with('#')))
}

fn insert(
    users: &mut BTreeMap<String, PasswordHash>,
    user: &str,
    hash: &str,
) -> Result<(), String> {
    if user.is_empty() {
        return Err("empty user name".into());
    }
    let parsed = PasswordHash::parse(hash)?;
    if users.insert(user.to_string(), parsed).is_some() {
        return Err(format!("user {user:?} appears twice"));
    }
    Ok(())
}

impl PasswordHash {
    /// One hash as htpasswd writes it.
    pub fn parse(hash: &str) -> Result<PasswordHash, String> {
        if let Some(rest) = hash.strip_prefix("{SHA}") {
            let digest = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()
                .and_then(|d| <[u8; 20]>::try_from(d).ok())
                .ok_or("{SHA} is not followed by the base64 of a SHA-1 digest")?;
            return Ok(PasswordHash::Sha1(digest));
        }
        if let Some(rest) = hash.strip_prefix("{SSHA}") {
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(rest)
                .ok()
                .filter(|d| d.len() > 20)
                .ok_or("{SSHA} is not followed by the base64 of a SHA-1 digest and a salt")?;
            let (digest, salt) = decoded.split_at(20);
            return Ok(PasswordHash::SaltedSha1 {
                digest: <[u8; 20]>::try_from(digest).unwrap_or_default(),
                salt: salt.to_vec(),
            });
        }
        if let Some(rest) = hash.strip_prefix("{PLAIN}") {
            return Ok(PasswordHash::Plain(rest.as_bytes().to_vec()));
        }
        for (magic, apr1) in [("$apr1$", true), ("$1$", false)] {
            if let Some(rest) = hash.strip_prefix(magic) {
                let (salt, digest) = rest
                    .split_once('$')
                    .ok_or("MD5-crypt hash without a salt")?;
                let b64 = |s: &str| s.bytes().all(|b| ITOA64.contains(&b));
                if salt.is_empty()
                    || salt.len() > 8
                    || !b64(salt)
                    || digest.len() != 22
                    || !b64(digest)
                {
                    return Err("malformed MD5-crypt hash".into());
                }
                return Ok(PasswordHash::Md5Crypt {
                    apr1,
                    salt: salt.to_string(),
                    hash: digest.to_string(),
                });
            }
        }
        if ["$2y$", "$2b$", "$2a$"].iter().any(|p| hash.starts_with(p)) {
            return match hash.parse::<bcrypt::HashParts>() {
                Ok(_) => Ok(PasswordHash::Bcrypt(hash.to_string())),
                Err(e) => Err(format!("malformed bcrypt hash: {e}")),
            };
        }
        // nginx hands every other hash to crypt(3): so do we, to the same library, after asking
        // it whether it reads the hash at all (a file it cannot read refuses the Ingress now,
        // not each user at their first request).
        let des = hash.len() == 13 && hash.bytes().all(|b| ITOA64.contains(&b));
        if hash.starts_with('$') || des {
            return match system_crypt::reads(hash) {
                Ok(()) => Ok(PasswordHash::Crypt {
                    hash: hash.to_string(),
                    des,
                }),
                Err(why) => Err(why),
            };
        }
        Err("not a hash format nginx reads (bcrypt, $apr1$, $1$, {SHA}, {SSHA}, {PLAIN} or another crypt(3) hash such as $6$, $5$, $y$ or DES)".into())
    }

    /// Whether checking a password costs enough (bcrypt: milliseconds) that it must not run on
    /// the proxy's async threads.
    pub fn is_costly(&self) -> bool {
        matches!(
            self,
            PasswordHash::Bcrypt(_) | PasswordHash::Crypt { des: false, .. }
        )
    }

    /// Whether a success is worth remembering: bcrypt, MD5-crypt's 1000 rounds (about
    /// 150 µs) and the system's crypt (DES's 25 rounds included) cost far more than the SHA-1 of
    /// the cache key; `{SHA}`, `{SSHA}` and `{PLAIN}` do not.
    pub fn is_slow(&self) -> bool {
        matches!(
            self,
            PasswordHash::Bcrypt(_) | PasswordHash::Md5Crypt { .. } | PasswordHash::Crypt { .. }
        )
    }

    /// Whether `password` is the one this hash was made from.
    pub fn verify(&self, password: &[u8]) -> bool {
        match self {
            PasswordHash::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
            PasswordHash::Md5Crypt { apr1, salt, hash } => {
                let magic: &[u8] = if *apr1 { b"$apr1$" } else { b"$1$" };
                md5_crypt(password, salt.as_bytes(), magic)
                    .as_bytes()
                    .ct_eq(hash.as_bytes())
                    .into()
            }
            PasswordHash::Sha1(digest) => Sha1::digest(password).as_slice().ct_eq(digest).into(),
            PasswordHash::SaltedSha1 { digest, salt } => Sha1::new()
                .chain_update(password)
                .chain_update(salt)
                .finalize()
                .as_slice()
                .ct_eq(digest)
                .into(),
            PasswordHash::Plain(plain) => plain.as_slice().ct_eq(password).into(),
            PasswordHash::Crypt { hash, .. } => system_crypt::crypt(password, hash)
                .is_some_and(|made| made.as_bytes().ct_eq(hash.as_bytes()).into()),
        }
    }

    /// A stable text of this hash, for keying a cache of checks made against it: a changed hash
    /// (the Secret updated) never finds a result made against the old one.
    pub fn fingerprint(&self) -> Vec<u8> {
        match self {
            PasswordHash::Bcrypt(hash) => hash.as_bytes().to_vec(),
            PasswordHash::Md5Crypt { apr1, salt, hash } => {
                format!("{apr1}${salt}${hash}").into_bytes()
            }
            PasswordHash::Sha1(digest) => digest.to_vec(),
            PasswordHash::SaltedSha1 { digest, salt } => [&digest[..], salt].concat(),
            PasswordHash::Plain(plain) => plain.clone(),
            PasswordHash::Crypt { hash, .. } => hash.as_bytes().to_vec(),
        }
    }
}

/// The system's crypt(3): libxcrypt, the library nginx's `auth_basic` calls for the hashes it
/// does not check itself. Debian's reads DES, MD5-crypt, bcrypt, SHA-crypt and yescrypt
/// (`man 5 crypt`).
mod system_crypt {
    use std::ffi::{CStr, CString, c_char, c_int, c_void};

    /// `sizeof(struct crypt_data)` in libxcrypt's `crypt.h` (its size is part of the ABI).
    const CRYPT_DATA_SIZE: usize = 32768;
    const CRYPT_SALT_OK: c_int = 0;
    /// Usable, only weak (DES, MD5-crypt).
    const CRYPT_SALT_METHOD_LEGACY: c_int = 3;
    /// A passphrase longer than this is refused by crypt (`CRYPT_MAX_PASSPHRASE_SIZE`).
    const MAX_PASSPHRASE: usize = 512;

    #[link(name = "crypt")]
    unsafe extern "C" {
        fn crypt_rn(
            phrase: *const c_char,
            setting: *const c_char,
            data: *mut c_void,
            size: c_int,
        ) -> *mut c_char;
        fn crypt_checksalt(setting: *const c_char) -> c_int;
    }

    /// Whether crypt reads `hash`: its method is known and its salt and parameters well
    /// formed. Nothing is hashed (a yescrypt check costs milliseconds and megabytes).
    pub(super) fn reads(hash: &str) -> Result<(), String> {
        let scheme = || match hash.split('$').nth(1) {
            Some(id) if hash.starts_with('$') => format!("${id}$ hash"),
            _ => "DES crypt hash".to_string(),
        };
        // crypt_checksalt judges the setting (method, parameters, salt), not what follows it:
        // the digest's length is checked here for the methods real files use.
        let digest = hash.rsplit('$').next().unwrap_or_default();
        let digest_len = match hash.split('$').nth(1) {
            Some("5" | "y" | "gy" | "7") => Some(43),
            Some("6") => Some(86),
            _ => None,
        };
        if hash.starts_with('$')
            && (digest_len.is_some_and(|n| digest.len() != n)
                || !digest.bytes().all(|b| super::ITOA64.contains(&b)))
        {
            return Err(format!("malformed {}", scheme()));
        }
        let Ok(setting) = CString::new(hash) else {
            return Err("a hash with a NUL byte".into());
        };
        // SAFETY: `setting` is a NUL-terminated string that outlives the call, which only
        // reads it.
        match unsafe { crypt_checksalt(setting.as_ptr()) } {
            CRYPT_SALT_OK | CRYPT_SALT_METHOD_LEGACY => Ok(()),
            _ => Err(format!(
                "malformed or unsupported {} (the system's crypt(3) does not read it)",
                scheme()
            )),
        }
    }

    /// crypt(3) of `password` with `hash` as its setting: equal to `hash` when the password is
    /// the one it was made from. `None` when crypt cannot use them (a NUL in the password, as
    /// C strings cannot carry one, or a passphrase longer than crypt takes).
    pub(super) fn crypt(password: &[u8], hash: &str) -> Option<String> {
        if password.len() > MAX_PASSPHRASE {
            return None;
        }
        let phrase = CString::new(password).ok()?;
        let setting = CString::new(hash).ok()?;
        // crypt_rn wants its scratch zeroed before the call.
        let mut data = vec![0u8; CRYPT_DATA_SIZE];
        // SAFETY: both strings are NUL-terminated and live across the call; `data` is a
        // writable, zeroed buffer of exactly `size` bytes, the size libxcrypt's crypt_rn asks
        // for, owned by this call alone (so threads never share it). The result, when not
        // null, points into `data`, and is copied out before `data` is dropped.
        unsafe {
            let out = crypt_rn(
                phrase.as_ptr(),
                setting.as_ptr(),
                data.as_mut_ptr().cast(),
                c_int::try_from(CRYPT_DATA_SIZE).ok()?,
            );
            if out.is_null() {
                return None;
            }
            CStr::from_ptr(out).to_str().ok().map(str::to_string)
        }
    }
}

/// crypt(3)'s base64 alphabet.
const ITOA64: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Poul-Henning Kamp's MD5-crypt (FreeBSD's `$1$`; Apache's `$apr1$` is the same with another
/// magic string): the 22-character hash part for `password` and `salt`.
fn md5_crypt(password: &[u8], salt: &[u8], magic: &[u8]) -> String {
    let alternate = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .chain_update(password)
        .finalize();
    let mut ctx = Md5::new()
        .chain_update(password)
        .chain_update(magic)
        .chain_update(salt);
    for chunk in password.chunks(16) {
        ctx.update(&alternate[..chunk.len()]);
    }
    let mut n = password.len();
    while n > 0 {
        if n & 1 == 1 {
            ctx.update([0u8]);
        } else {
            ctx.update(&password[..1]);
        }
        n >>= 1;
    }
    let mut digest = ctx.finalize();
    for round in 0..1000 {
        let mut ctx = Md5::new();
        if round & 1 == 1 {
            ctx.update(password);
        } else {
            ctx.update(digest);
        }
        if round % 3 != 0 {
            ctx.update(salt);
        }
        if round % 7 != 0 {
            ctx.update(password);
        }
        if round & 1 == 1 {
            ctx.update(digest);
        } else {
            ctx.update(password);
        }
        digest = ctx.finalize();
    }
    let d = digest.as_slice();
    let mut out = String::with_capacity(22);
    let mut put = |value: u32, chars: usize| {
        let mut v = value;
        for _ in 0..chars {
            out.push(char::from(ITOA64[(v & 0x3f) as usize]));
            v >>= 6;
        }
    };
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        put(
            u32::from(d[a]) << 16 | u32::from(d[b]) << 8 | u32::from(d[c]),
            4,
        );
    }
    put(u32::from(d[11]), 2);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_checks_its_known_vectors() {
        // (hash, right password, wrong password); vectors from openssl passwd, Apache's docs
        // and OpenBSD's bcrypt tests.
        let cases = [
            (
                "$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00",
                "password",
                "Password",
            ),
            ("$1$saltsalt$9xy1btjgzLYfb7hivXtC//", "secret", "secret "),
            (
                "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW",
                "U*U",
                "U*V",
            ),
            ("{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "password", "passwor"),
            ("{PLAIN}hunter2", "hunter2", "hunter3"),
            // SHA-1 of "password" and the salt 01 02 "saltx", made with Python's hashlib.
            (
                "{SSHA}hmXRfRfdFUgYyS/FvjP8zb12D/QBAnNhbHR4",
                "password",
                "Password",
            ),
            // The system's crypt: DES (htpasswd -d; only 8 characters count), SHA-crypt
            // (glibc's test vectors), yescrypt (Debian's mkpasswd default), each made by
            // libxcrypt's crypt(3).
            ("xOAFZqRz5RduI", "password", "passwore"),
            (
                "$5$saltstring$5B8vYYiY.CVt1RlTTf8KbXBH3hsxY/GNooZaBBGWEc5",
                "Hello world!",
                "Hello world",
            ),
            (
                "$6$rounds=5000$saltstring$adDbXsJjcDlq2662QPgd.tkSOVmnG9Tt3oXl4HR60SusC3AGjirnDenVZp3DGwLwqy6iYKCzannhaX9DR72nN1",
                "password",
                "passwort",
            ),
            (
                "$y$j9T$abcdefgh$79JhsKZwfY/UU2qrk3QcffpHl7EyEEJK0pA5pD1wu73",
                "password",
                "password!",
            ),
        ];
        for (hash, right, wrong) in cases {
            let parsed = PasswordHash::parse(hash).unwrap_or_else(|e| panic!("{hash}: {e}"));
            assert!(parsed.verify(right.as_bytes()), "{hash} with {right:?}");
            assert!(!parsed.verify(wrong.as_bytes()), "{hash} with {wrong:?}");
            assert!(!parsed.verify(b""), "{hash} with an empty password");
        }
        // bcrypt's other prefixes, made here at the cheapest cost.
        let made = bcrypt::hash("s3cret", 4).expect("bcrypt hash");
        for prefix in ["$2y$", "$2b$", "$2a$"] {
            let hash = format!("{prefix}{}", &made[4..]);
            let parsed = PasswordHash::parse(&hash).expect("bcrypt parses");
            assert!(parsed.is_costly());
            assert!(parsed.verify(b"s3cret"), "{hash}");
            assert!(!parsed.verify(b"s3cre"), "{hash}");
        }
    }

    #[test]
    fn unreadable_hashes_are_errors() {
        let cases = [
            "",
            "plaintext",
            "abJnggxhB/yWI!", // DES crypt is 13 characters of crypt's alphabet
            "$5$rounds=5000$salt$hash",
            "$6$salt$hash",
            "$7$nonsense",
            "$unknown$salt$hash",
            "$apr1$nosalt",
            "$apr1$toolongsalt$eIMz/iKDkbtys/uU7LEK00",
            "$apr1$lZL6V/ci$short",
            "$2y$05$short",
            "{SHA}notbase64!",
            "{SHA}c2hvcnQ=",
        ];
        for hash in cases {
            assert!(PasswordHash::parse(hash).is_err(), "{hash:?} parsed");
        }
    }

    #[test]
    fn htpasswd_files_are_read_as_nginx_reads_them() {
        let file = b"# a comment\n\nalice:$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00\r\nbob:{PLAIN}pw:a comment\n";
        let table = Credentials::from_htpasswd(file).expect("parses");
        assert!(table.get("alice").is_some_and(|h| h.verify(b"password")));
        assert!(table.get("bob").is_some_and(|h| h.verify(b"pw")));
        assert!(table.get("carol").is_none());
        assert!(
            table.get("Alice").is_none(),
            "user names are case-sensitive"
        );
        // Hashes never reach Debug output.
        assert_eq!(format!("{table:?}"), r#"{"alice", "bob"}"#);

        let bad: &[&[u8]] = &[
            b"alice\n",
            b":{PLAIN}x\n",
            b"alice:des12345678901\n", // 14 characters: not DES
            b"alice:des!234567890\n",
            b"alice:{SSHA}c2hvcnQ=\n",
            b"alice:{PLAIN}a\nalice:{PLAIN}b\n",
            b"\xff:{PLAIN}x\n",
        ];
        for file in bad {
            assert!(
                Credentials::from_htpasswd(file).is_err(),
                "{}",
                String::from_utf8_lossy(file)
            );
        }
        assert!(
            Credentials::from_htpasswd(b"# only comments\n")
                .expect("parses")
                .is_empty()
        );
    }

    #[test]
    fn auth_maps_are_user_to_hash() {
        let table = Credentials::from_map([
            ("alice", &b"{PLAIN}a"[..]),
            ("bob", b"$1$saltsalt$9xy1btjgzLYfb7hivXtC//\n"),
        ])
        .expect("parses");
        assert!(table.get("alice").is_some_and(|h| h.verify(b"a")));
        assert!(table.get("bob").is_some_and(|h| h.verify(b"secret")));
        assert!(Credentials::from_map([("alice", &b"nope"[..])]).is_err());
    }
}
