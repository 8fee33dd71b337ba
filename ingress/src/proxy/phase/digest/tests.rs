use std::sync::Arc;

use super::*;
use crate::snapshot::annotations::htdigest::DigestUsers;
use crate::store::ObjectKey;

/// A client's side of RFC 2617, written out here on its own.
fn md5_hex(text: &str) -> String {
    let digest = Md5::digest(text.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn ha1(user: &str, realm: &str, password: &str) -> String {
    md5_hex(&format!("{user}:{realm}:{password}"))
}

fn authorization(
    user: &str,
    password: &str,
    nonce: &str,
    method: &str,
    uri: &str,
    nc: u32,
) -> String {
    let realm = "Staff";
    let nc = format!("{nc:08x}");
    let cnonce = "0a4f113b";
    let ha2 = md5_hex(&format!("{method}:{uri}"));
    let response = md5_hex(&format!(
        "{}:{nonce}:{nc}:{cnonce}:auth:{ha2}",
        ha1(user, realm, password)
    ));
    format!(
        "Digest username=\"{user}\", realm=\"{realm}\", nonce=\"{nonce}\", uri=\"{uri}\", qop=auth, nc={nc}, cnonce=\"{cnonce}\", response=\"{response}\", algorithm=MD5"
    )
}

fn route() -> DigestAuth {
    let line = format!("alice:Staff:{}\n", ha1("alice", "Staff", "Circle Of Life"));
    DigestAuth {
        realm: Arc::from("Staff"),
        users: DigestUsers::from_htdigest(line.as_bytes()).expect("htdigest"),
        secret: ObjectKey::new("ns", "users"),
    }
}

fn facts(client: &str, uri: &str) -> DigestFacts {
    DigestFacts {
        method: "GET".into(),
        request_uri: uri.into(),
        client: client.parse().expect("address"),
    }
}

/// The nonce of a 401's challenge, and whether it said stale.
fn challenged(result: &DigestResult) -> (String, bool) {
    let (DigestResult::Denied(denial) | DigestResult::Stale(denial)) = result else {
        panic!("a challenge, not {}", result.label());
    };
    assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
    let value = denial.headers[0].1.to_str().expect("ASCII").to_string();
    assert!(
        value.starts_with("Digest algorithm=\"MD5\", qop=\"auth\", realm=\"Staff\", nonce=\""),
        "{value}"
    );
    let nonce = value
        .split("nonce=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .expect("nonce")
        .to_string();
    (nonce, value.ends_with(", stale=\"true\""))
}

#[test]
fn the_response_hash_is_rfc_2617s() {
    // RFC 2617 section 3.5's example.
    let fields = Fields {
        username: b"Mufasa",
        realm: b"testrealm@host.com",
        nonce: b"dcd98b7102dd2f0e8b11d0f600bfb0c093",
        uri: b"/dir/index.html",
        qop: b"auth",
        nc: b"00000001",
        cnonce: b"0a4f113b",
        response: b"6629fae49393a05397450978507c4ef1",
    };
    let ha1 = hex(&Md5::digest(b"Mufasa:testrealm@host.com:Circle Of Life"));
    let ha2 = hex(&Md5::digest(b"GET:/dir/index.html"));
    assert_eq!(&response(&ha1, &fields, &ha2), fields.response);
}

#[test]
fn authorization_headers_are_read_strictly() {
    let good = br#"Digest username="Mufasa", realm="testrealm@host.com", nonce="dcd9", uri="/dir/index.html", qop=auth, nc=00000001, cnonce="0a4f113b", response="6629", opaque="5ccc""#;
    let fields = Fields::parse(good).expect("parses");
    assert_eq!(fields.username, b"Mufasa");
    assert_eq!(fields.qop, b"auth");
    assert_eq!(fields.uri, b"/dir/index.html");
    // The scheme in any case, fields in any order and case, commas and blanks as RFC 7235 allows.
    let shuffled = br#"  dIgEsT  RESPONSE="6629" ,, nc=00000001,qop="auth" , CNonce="0a4f113b", uri="/dir/index.html", nonce="dcd9", realm="testrealm@host.com", username="Mufasa""#;
    assert_eq!(Fields::parse(shuffled), Some(fields));
    let bad: &[&[u8]] = &[
        b"Basic YWxpY2U6cHc=",
        b"Digest",
        b"Digest username=\"Mufasa\"",
        // An empty required field.
        br#"Digest username="", realm="r", nonce="n", uri="/", qop=auth, nc=1, cnonce="c", response="x""#,
        // An unterminated quote, an escape, a control character, garbage between fields.
        br#"Digest username="Mufasa, realm="r", nonce="n", uri="/", qop=auth, nc=1, cnonce="c", response="x"#,
        br#"Digest username="Mu\"fasa", realm="r", nonce="n", uri="/", qop=auth, nc=1, cnonce="c", response="x""#,
        b"Digest username=\"Mu\x01fasa\", realm=\"r\", nonce=\"n\", uri=\"/\", qop=auth, nc=1, cnonce=\"c\", response=\"x\"",
        br#"Digest username="Mufasa" junk, realm="r", nonce="n", uri="/", qop=auth, nc=1, cnonce="c", response="x""#,
        br#"Digest =x, username="Mufasa", realm="r", nonce="n", uri="/", qop=auth, nc=1, cnonce="c", response="x""#,
    ];
    for header in bad {
        assert_eq!(
            Fields::parse(header),
            None,
            "{}",
            String::from_utf8_lossy(header)
        );
    }
}

#[test]
fn a_session_follows_the_digest_modules_rules() {
    let state = DigestState::new();
    let route = route();
    let client = facts("192.0.2.1", "/private/x?y=1");
    let check = |header: Option<&str>, facts: &DigestFacts, now: u32| {
        state.check_at(&route, facts, header.map(str::as_bytes), now)
    };

    // No credentials: a challenge, not stale, and no failure counted.
    let (nonce, stale) = challenged(&check(None, &client, 0));
    assert!(!stale);
    assert_eq!(nonce.len(), 32);

    let auth = |nonce: &str, nc: u32| {
        authorization(
            "alice",
            "Circle Of Life",
            nonce,
            "GET",
            "/private/x?y=1",
            nc,
        )
    };
    // The right answer: in, with rspauth for the client.
    let DigestResult::Allowed(Some(info)) = check(Some(&auth(&nonce, 1)), &client, 5) else {
        panic!("allowed");
    };
    let info = info.to_str().expect("ASCII");
    assert!(
        info.starts_with("qop=\"auth\", rspauth=\"")
            && info.ends_with("\", cnonce=\"0a4f113b\", nc=00000001"),
        "{info}"
    );
    // The next nc on the same nonce: in. The same nc again: a replay, refused.
    assert!(matches!(
        check(Some(&auth(&nonce, 2)), &client, 6),
        DigestResult::Allowed(_)
    ));
    assert!(matches!(
        check(Some(&auth(&nonce, 2)), &client, 6),
        DigestResult::Denied(_)
    ));
    // nc 20 is beyond the module's 20 replays: stale, so the browser asks again silently.
    assert!(matches!(
        check(Some(&auth(&nonce, 20)), &client, 6),
        DigestResult::Stale(_)
    ));
    // 10 s after the first use the nonce is stale.
    let late = check(Some(&auth(&nonce, 3)), &client, 15);
    assert!(challenged(&late).1, "stale after expiry");

    // Each part below from another address: the failures above count toward evasion.
    let client = facts("192.0.2.2", "/private/x?y=1");
    // A fresh nonce left unanswered for 60 s is stale at its first use.
    let (old, _) = challenged(&check(None, &client, 100));
    assert!(challenged(&check(Some(&auth(&old, 1)), &client, 160)).1);
    // A nonce this instance never made is refused, not stale; so is another spelling of one.
    let forged = format!("{}{}", &old[..16], "0000000000000000");
    let refused = check(Some(&auth(&forged, 1)), &client, 101);
    assert!(!challenged(&refused).1);
    let signed = format!("+{}", &old[1..]);
    assert!(old.starts_with('0'), "issued at 100 s: {old}");
    let refused = check(Some(&auth(&signed, 1)), &client, 101);
    assert!(!challenged(&refused).1);
    // Another instance's (another key's) nonce is refused too.
    let (theirs, _) = challenged(&DigestState::new().check_at(&route, &client, None, 100));
    assert!(matches!(
        check(Some(&auth(&theirs, 1)), &client, 101),
        DigestResult::Denied(_)
    ));

    // The uri must be the request's target, or the target without its query (.NET's client).
    let client = facts("192.0.2.3", "/private/x?y=1");
    let (nonce, _) = challenged(&check(None, &client, 200));
    let other_target = authorization("alice", "Circle Of Life", &nonce, "GET", "/other", 1);
    assert!(matches!(
        check(Some(&other_target), &client, 201),
        DigestResult::Denied(_)
    ));
    let without_query = authorization("alice", "Circle Of Life", &nonce, "GET", "/private/x", 1);
    assert!(matches!(
        check(Some(&without_query), &client, 201),
        DigestResult::Allowed(_)
    ));
    // The method is part of the hash.
    let post = authorization(
        "alice",
        "Circle Of Life",
        &nonce,
        "POST",
        "/private/x?y=1",
        2,
    );
    assert!(matches!(
        check(Some(&post), &client, 201),
        DigestResult::Denied(_)
    ));
}

#[test]
fn five_failures_from_an_address_are_ignored_for_a_while() {
    let state = DigestState::new();
    let route = route();
    let client = facts("192.0.2.7", "/");
    let other = facts("192.0.2.8", "/");
    let (nonce, _) = challenged(&state.check_at(&route, &client, None, 0));
    let wrong = authorization("alice", "wrong", &nonce, "GET", "/", 1);
    let right = |nc| authorization("alice", "Circle Of Life", &nonce, "GET", "/", nc);
    for _ in 0..4 {
        assert!(matches!(
            state.check_at(&route, &client, Some(wrong.as_bytes()), 1),
            DigestResult::Denied(_)
        ));
    }
    // A success clears the count.
    assert!(matches!(
        state.check_at(&route, &client, Some(right(1).as_bytes()), 1),
        DigestResult::Allowed(_)
    ));
    for _ in 0..5 {
        state.check_at(&route, &client, Some(wrong.as_bytes()), 2);
    }
    // Now even the right answer gets a bare 401, for this address only.
    let DigestResult::Evading(denial) =
        state.check_at(&route, &client, Some(right(2).as_bytes()), 3)
    else {
        panic!("evading");
    };
    assert_eq!(denial.status, StatusCode::UNAUTHORIZED);
    assert!(denial.headers.is_empty(), "no challenge while evading");
    assert!(matches!(
        state.check_at(&route, &other, Some(right(2).as_bytes()), 3),
        DigestResult::Allowed(_)
    ));
    // 300 s after the last failure the address is heard again.
    let (fresh, _) = challenged(&state.check_at(&route, &client, None, 303));
    let again = authorization("alice", "Circle Of Life", &fresh, "GET", "/", 1);
    assert!(matches!(
        state.check_at(&route, &client, Some(again.as_bytes()), 303),
        DigestResult::Allowed(_)
    ));
}
