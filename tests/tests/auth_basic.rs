//! Basic auth (`auth-type: basic`, `auth-secret`, `auth-secret-type`, `auth-realm`) and
//! `satisfy`, through the real binary with curl (HTTP/1.1 and h2c) and exact bytes: every hash
//! format htpasswd files hold, every way of getting the credentials wrong, the path tricks that
//! must not reach a protected backend without them, and the Ingresses that must be refused
//! (503) rather than served open. Digest auth (`auth-type: digest`) with curl's `--digest`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use base64::Engine as _;
use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, opaque_secret, service};
use ingress_tests::path_tricks;
use ingress_tests::process::Ingress;
use ingress_tests::raw::exchange;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

/// One user per hash format, with the password each hash was made from.
const USERS: &[(&str, &str, &str)] = &[
    ("alice", "$apr1$lZL6V/ci$eIMz/iKDkbtys/uU7LEK00", "password"),
    (
        "bob",
        "$2a$05$CCCCCCCCCCCCCCCCCCCCC.E5YPO9kmyuRGyh0XouQYb4YMJKvyOeW",
        "U*U",
    ),
    ("carol", "{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=", "password"),
    ("dave", "$1$saltsalt$9xy1btjgzLYfb7hivXtC//", "secret"),
    (
        "ivan",
        "{SSHA}hmXRfRfdFUgYyS/FvjP8zb12D/QBAnNhbHR4",
        "password",
    ),
    // The system's crypt(3), as nginx calls it: DES (htpasswd -d), SHA-512-crypt
    // (openssl passwd -6) and yescrypt (mkpasswd's default on Debian).
    ("frank", "xOAFZqRz5RduI", "password"),
    (
        "grace",
        "$6$rounds=5000$saltstring$adDbXsJjcDlq2662QPgd.tkSOVmnG9Tt3oXl4HR60SusC3AGjirnDenVZp3DGwLwqy6iYKCzannhaX9DR72nN1",
        "password",
    ),
    (
        "heidi",
        "$y$j9T$abcdefgh$79JhsKZwfY/UU2qrk3QcffpHl7EyEEJK0pA5pD1wu73",
        "password",
    ),
];

fn basic(user: &str, password: &str) -> String {
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Authorization: Basic {token}")
}

struct Site {
    ingress: Ingress,
    open: Backend,
    admin: Backend,
    _dir: Scratch,
}

fn start() -> Site {
    let (open, admin) = (Backend::start("open"), Backend::start("admin"));
    let dir = Scratch::new("auth-basic");
    let htpasswd: String = USERS
        .iter()
        .map(|(u, h, _)| format!("{u}:{h}\n"))
        .collect::<String>()
        + "# a comment, as htpasswd files may have\n";
    let protected = |name: &str, day: u8, annotations: &[(&str, &str)], host: &str, path: &str| {
        annotated_ingress(
            "t",
            name,
            day,
            annotations,
            &[(host, path, "Prefix", "admin")],
        )
    };
    let basic_on = [
        ("auth-type", "basic"),
        ("auth-secret", "users"),
        ("auth-realm", "Staff only"),
    ];
    let manifests = [
        service("t", "open", &[&open]),
        service("t", "admin", &[&admin]),
        opaque_secret("t", "users", &[("auth", &htpasswd)]),
        opaque_secret("t", "map", &[("erin", "{PLAIN}letmein")]),
        // A SHA-512-crypt hash cut short: crypt could never match it.
        opaque_secret(
            "t",
            "broken",
            &[("auth", "alice:$6$saltstring$adDbXsJjcDlq\n")],
        ),
        opaque_secret("other", "users", &[("auth", &htpasswd)]),
        // htdigest -c file "Staff only" alice (password "password").
        opaque_secret(
            "t",
            "digest-users",
            &[(
                "auth",
                "# htdigest\nalice:Staff only:97bab12ad29b7618b471b3e7991b6df3\n",
            )],
        ),
        // digest-ok.test: digest auth, as ingress-nginx's nginx runs its digest module.
        protected(
            "digest-ok",
            9,
            &[
                ("auth-type", "digest"),
                ("auth-secret", "digest-users"),
                ("auth-realm", "Staff only"),
            ],
            "digest-ok.test",
            "/",
        ),
        // basic.test: `/` open, `/admin` behind basic auth.
        annotated_ingress(
            "t",
            "open",
            1,
            &[],
            &[("basic.test", "/", "Prefix", "open")],
        ),
        protected("admin", 2, &basic_on, "basic.test", "/admin"),
        protected(
            "mapped",
            3,
            &[
                ("auth-type", "basic"),
                ("auth-secret", "t/map"),
                ("auth-secret-type", "auth-map"),
            ],
            "map.test",
            "/",
        ),
        // Refused (503), never served open.
        protected(
            "missing",
            4,
            &[("auth-type", "basic"), ("auth-secret", "nope")],
            "missing.test",
            "/",
        ),
        protected(
            "digest",
            5,
            &[("auth-type", "digest"), ("auth-secret", "users")],
            "digest.test",
            "/",
        ),
        protected(
            "broken",
            6,
            &[("auth-type", "basic"), ("auth-secret", "broken")],
            "broken.test",
            "/",
        ),
        protected(
            "elsewhere",
            7,
            &[("auth-type", "basic"), ("auth-secret", "other/users")],
            "elsewhere.test",
            "/",
        ),
        // satisfy: the client (127.0.0.1) inside or outside the allow-list.
        protected(
            "any-inside",
            8,
            &[
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("satisfy", "any"),
                ("allowlist-source-range", "127.0.0.0/8"),
            ],
            "any-inside.test",
            "/",
        ),
        protected(
            "any-outside",
            9,
            &[
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("satisfy", "any"),
                ("allowlist-source-range", "10.0.0.0/8"),
            ],
            "any-outside.test",
            "/",
        ),
        protected(
            "all-outside",
            10,
            &[
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("allowlist-source-range", "10.0.0.0/8"),
            ],
            "all-outside.test",
            "/",
        ),
        protected(
            "all-inside",
            11,
            &[
                ("auth-type", "basic"),
                ("auth-secret", "users"),
                ("satisfy", "all"),
                ("allowlist-source-range", "127.0.0.0/8"),
            ],
            "all-inside.test",
            "/",
        ),
    ]
    .concat();
    dir.write("all.yaml", &manifests);
    Site {
        ingress: Ingress::start(dir.path()),
        open,
        admin,
        _dir: dir,
    }
}

#[test]
fn every_hash_format_lets_its_user_in_and_nothing_else_does() {
    let site = start();
    let ingress = &site.ingress;
    for version in VERSIONS {
        for (user, _, password) in USERS {
            // Twice: bcrypt's second check comes from the cache of recent successes.
            for _ in 0..2 {
                let reply = curl::get(
                    ingress,
                    "basic.test",
                    "/admin/x",
                    version,
                    &["-H", &basic(user, password)],
                );
                assert_eq!(reply.backend(), "admin", "{version} {user}: {reply:?}");
                let echo = reply.echo().expect("echo");
                assert!(
                    !echo.headers.contains_key("authorization"),
                    "{version} {user}: the password went upstream: {:?}",
                    echo.headers
                );
            }
        }
        let map = curl::get(
            ingress,
            "map.test",
            "/",
            version,
            &["-H", &basic("erin", "letmein")],
        );
        assert_eq!(map.backend(), "admin", "{version} auth-map");

        let denied: Vec<(&str, Vec<String>)> = vec![
            ("no credentials", vec![]),
            (
                "wrong password",
                vec!["-H".into(), basic("alice", "Password")],
            ),
            (
                "bcrypt, wrong password",
                vec!["-H".into(), basic("bob", "U*V")],
            ),
            (
                "yescrypt, wrong password",
                vec!["-H".into(), basic("heidi", "passwort")],
            ),
            (
                "DES, wrong password",
                vec!["-H".into(), basic("frank", "passwore")],
            ),
            ("empty password", vec!["-H".into(), basic("alice", "")]),
            (
                "unknown user",
                vec!["-H".into(), basic("mallory", "password")],
            ),
            (
                "another user's password",
                vec!["-H".into(), basic("dave", "password")],
            ),
            (
                "user name case",
                vec!["-H".into(), basic("Alice", "password")],
            ),
            (
                "malformed base64",
                vec!["-H".into(), "Authorization: Basic !!!!".into()],
            ),
            (
                "no colon",
                vec!["-H".into(), "Authorization: Basic YWxpY2U=".into()],
            ),
            (
                "bearer",
                vec!["-H".into(), "Authorization: Bearer abc".into()],
            ),
            (
                "a user of another map",
                vec!["-H".into(), basic("erin", "letmein")],
            ),
        ];
        for (what, args) in &denied {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let reply = curl::get(ingress, "basic.test", "/admin/x", version, &args);
            assert_eq!(reply.status, 401, "{version} {what}: {reply:?}");
            assert_eq!(
                reply.header("www-authenticate"),
                Some("Basic realm=\"Staff only\""),
                "{version} {what}"
            );
        }
        // The open part of the host is not affected.
        assert_eq!(
            curl::get(ingress, "basic.test", "/", version, &[]).backend(),
            "open"
        );
    }
    assert_eq!(
        site.admin.served(),
        2 * (2 * USERS.len() + 1),
        "only the right credentials got through"
    );
    let metric = |result| {
        ingress
            .metric(
                "ingress_auth_requests_total",
                &[("kind", "basic"), ("result", result)],
            )
            .unwrap_or(0.0)
    };
    assert!(metric("denied") >= 22.0, "denied: {}", metric("denied"));
    assert!(metric("cached") >= 1.0, "the bcrypt success was not cached");
    assert!(metric("allowed") >= 8.0, "allowed: {}", metric("allowed"));
}

#[test]
fn path_tricks_do_not_reach_the_protected_path_without_credentials() {
    let site = start();
    // The edge-hardening corpus, as exact bytes over HTTP/1.1: each must be refused (400) or
    // challenged (401), or go to the open backend; none may reach the admin backend.
    for target in path_tricks::toward("admin", "open") {
        let target = target.as_str();
        let raw = format!("GET {target} HTTP/1.1\r\nHost: basic.test\r\n\r\n");
        let reply = exchange(site.ingress.http, raw.as_bytes());
        assert!(
            matches!(reply.status, 400 | 401) || reply.echo().backend == "open",
            "{target}: {} {}",
            reply.status,
            reply.text()
        );
        // And with the wrong password, the same.
        let raw = format!(
            "GET {target} HTTP/1.1\r\nHost: BASIC.test\r\n{}\r\n\r\n",
            basic("alice", "wrong")
        );
        let reply = exchange(site.ingress.http, raw.as_bytes());
        assert!(
            matches!(reply.status, 400 | 401) || reply.echo().backend == "open",
            "{target} (wrong password): {} {}",
            reply.status,
            reply.text()
        );
        for version in VERSIONS
            .iter()
            .filter(|_| path_tricks::curl_can_send(target))
        {
            let reply = curl::get(&site.ingress, "basic.test", target, version, &[]);
            assert!(
                matches!(reply.status, 400 | 401) || reply.backend() == "open",
                "{version} {target}: {reply:?}"
            );
        }
    }
    // A second Authorization header cannot smuggle the right credentials past a wrong first.
    let raw = format!(
        "GET /admin/x HTTP/1.1\r\nHost: basic.test\r\n{}\r\n{}\r\n\r\n",
        basic("alice", "wrong"),
        basic("alice", "password")
    );
    let reply = exchange(site.ingress.http, raw.as_bytes());
    assert!(
        matches!(reply.status, 400 | 401),
        "{}: {}",
        reply.status,
        reply.text()
    );
    assert_eq!(
        site.admin.served(),
        0,
        "a trick reached the protected backend"
    );
    assert!(site.open.served() > 0);
}

#[test]
fn unusable_auth_refuses_the_ingress_and_satisfy_combines_with_the_allow_list() {
    let site = start();
    let ingress = &site.ingress;
    let right = basic("alice", "password");
    for version in VERSIONS {
        for host in [
            "missing.test",
            "digest.test",
            "broken.test",
            "elsewhere.test",
        ] {
            for args in [vec![], vec!["-H", right.as_str()]] {
                let reply = curl::get(ingress, host, "/", version, &args);
                assert_eq!(reply.status, 503, "{version} {host} {args:?}: {reply:?}");
            }
        }
        // (host, with credentials?, want)
        let cases = [
            // satisfy any: inside the allow-list, no credentials needed.
            ("any-inside.test", false, 200),
            ("any-inside.test", true, 200),
            // satisfy any, outside: the credentials decide.
            ("any-outside.test", false, 401),
            ("any-outside.test", true, 200),
            // satisfy all (the default), outside: 403 whatever the credentials.
            ("all-outside.test", false, 403),
            ("all-outside.test", true, 403),
            // satisfy all, inside: the credentials are still needed.
            ("all-inside.test", false, 401),
            ("all-inside.test", true, 200),
        ];
        for (host, credentials, want) in cases {
            let args = if credentials {
                vec!["-H", right.as_str()]
            } else {
                vec![]
            };
            let reply = curl::get(ingress, host, "/", version, &args);
            assert_eq!(
                reply.status, want,
                "{version} {host} credentials={credentials}: {reply:?}"
            );
            if let Some(echo) = reply.echo() {
                assert!(
                    !echo.headers.contains_key("authorization"),
                    "{version} {host}: Authorization reached the backend"
                );
            }
        }
    }
    let logs = ingress.logs();
    for needle in [
        "not found",
        "digest needs auth-realm",
        "malformed $6$ hash",
        "namespace",
    ] {
        assert!(logs.contains(needle), "{needle:?} not in the logs:\n{logs}");
    }
}

/// curl's own digest client against `digest-ok.test`: the status of its last response, the
/// body (the echo backend's report when it got through) and curl's account of the exchange.
fn curl_digest(
    ingress: &Ingress,
    version: &str,
    user: &str,
    password: &str,
) -> (u16, String, String) {
    let out = std::process::Command::new("curl")
        .args(["-s", "-v", "--max-time", "10", version, "--digest", "-u"])
        .arg(format!("{user}:{password}"))
        .args(["-H", "Host: digest-ok.test", "-w", "\n%{http_code}"])
        .arg(ingress.url("/private?x=1"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or_default();
    (
        status.parse().unwrap_or(0),
        body.to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A digest client written here: asks for a challenge, then answers it with `nc` 1 and 2
/// (curl 7.88's own client sends nothing after the challenge on a reused h2c connection).
/// The statuses and the two answered replies.
fn digest_by_hand(ingress: &Ingress, version: &str, password: &str) -> Vec<curl::Reply> {
    use md5::{Digest as _, Md5};
    let hex = |text: String| -> String {
        Md5::digest(text.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let challenge = curl::get(ingress, "digest-ok.test", "/private?x=1", version, &[]);
    assert_eq!(challenge.status, 401, "{version}: {challenge:?}");
    let nonce = challenge.headers["www-authenticate"]
        .split("nonce=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .expect("a nonce")
        .to_string();
    let ha1 = hex(format!("alice:Staff only:{password}"));
    let ha2 = hex("GET:/private?x=1".to_string());
    (1..=2)
        .map(|nc| {
            let nc = format!("{nc:08x}");
            let response = hex(format!("{ha1}:{nonce}:{nc}:c0ffee:auth:{ha2}"));
            let header = format!(
                "Authorization: Digest username=\"alice\", realm=\"Staff only\", nonce=\"{nonce}\", uri=\"/private?x=1\", qop=auth, nc={nc}, cnonce=\"c0ffee\", response=\"{response}\""
            );
            curl::get(
                ingress,
                "digest-ok.test",
                "/private?x=1",
                version,
                &["-H", &header],
            )
        })
        .collect()
}

#[test]
fn digest_auth_lets_its_users_in_and_nothing_else() {
    let site = start();
    let ingress = &site.ingress;
    for version in VERSIONS {
        for reply in digest_by_hand(ingress, version, "password") {
            assert_eq!(reply.backend(), "admin", "{version}: {reply:?}");
            let echo = reply.echo().expect("echo");
            assert!(
                !echo.headers.contains_key("authorization"),
                "{version}: Authorization went upstream"
            );
            assert!(
                reply.headers["authentication-info"].starts_with("qop=\"auth\", rspauth=\""),
                "{version}: {reply:?}"
            );
        }
        for reply in digest_by_hand(ingress, version, "Password") {
            assert_eq!(reply.status, 401, "{version}: {reply:?}");
        }
    }
    // curl's own digest client, over HTTP/1.1.
    for version in ["--http1.1"] {
        let (status, body, exchange) = curl_digest(ingress, version, "alice", "password");
        assert_eq!(status, 200, "{version}: {body}\n{exchange}");
        assert!(
            body.contains("\"admin\"") && !body.to_ascii_lowercase().contains("authorization"),
            "{version}: the backend got the request, without Authorization: {body}"
        );
        assert!(
            exchange.contains("< authentication-info: qop=\"auth\", rspauth=\""),
            "{version}: {exchange}"
        );
        for (user, password) in [
            ("alice", "Password"),
            ("mallory", "password"),
            ("alice", ""),
        ] {
            let (status, _, _) = curl_digest(ingress, version, user, password);
            assert_eq!(status, 401, "{version} {user}:{password}");
        }
        // The challenge is the digest module's.
        let challenge = curl::get(ingress, "digest-ok.test", "/", version, &[]);
        assert_eq!(challenge.status, 401);
        let www = &challenge.headers["www-authenticate"];
        assert!(
            www.starts_with(
                "Digest algorithm=\"MD5\", qop=\"auth\", realm=\"Staff only\", nonce=\""
            ),
            "{www}"
        );
        // Basic credentials are no way in.
        let basic = curl::get(
            ingress,
            "digest-ok.test",
            "/",
            version,
            &["-H", &basic("alice", "password")],
        );
        assert_eq!(basic.status, 401);
    }
    let metric = |result: &str| {
        ingress.scrape().value(
            "ingress_auth_requests_total",
            &[("kind", "digest"), ("result", result)],
        )
    };
    assert!(metric("allowed") >= 5.0, "allowed");
    assert!(metric("denied") >= 7.0, "denied");
}
