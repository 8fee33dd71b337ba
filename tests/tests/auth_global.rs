//! Global external auth (the ConfigMap's `global-auth-url` and its companions) through the
//! real binary with curl (HTTP/1.1 and h2c), against the auth service the `auth-url` tests use
//! (`ingress_tests::auth_service`): every route asks it unless its Ingress has its own
//! `auth-url` or `enable-global-auth: "false"`, or its rule path is under `no-auth-locations`
//! (the ACME default); a denial, a signin redirect, an auth service that does not answer and
//! a ConfigMap that cannot be honoured never reach the backend; and every change is live.

// A plain #[test] with no runtime: blocking sleeps between polls are what it should do.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use ingress_tests::auth_service::AuthService;
use ingress_tests::curl::{self, Reply, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, config_map, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const ACME: &str = "/.well-known/acme-challenge/tok3n";

struct Site {
    ingress: Ingress,
    auth: AuthService,
    _app: Backend,
    dir: Scratch,
}

impl Site {
    fn start(global: &[(&str, &str)]) -> Site {
        let auth = AuthService::start();
        let app = Backend::start("app");
        let dir = Scratch::new("auth-global");
        let own = auth.url("/deny");
        let manifests = [
            service("t", "app", &[&app]),
            // cert-manager's HTTP-01 solver path beside the site's `/`.
            annotated_ingress(
                "t",
                "plain",
                1,
                &[],
                &[
                    ("plain.test", "/", "Prefix", "app"),
                    ("plain.test", ACME, "Exact", "app"),
                ],
            ),
            annotated_ingress(
                "t",
                "off",
                2,
                &[("enable-global-auth", "false")],
                &[("off.test", "/", "Prefix", "app")],
            ),
            annotated_ingress(
                "t",
                "own",
                3,
                &[("auth-url", &own)],
                &[("own.test", "/", "Prefix", "app")],
            ),
        ]
        .concat();
        dir.write("site.yaml", &manifests);
        dir.write("config.yaml", &config_map("t", "ingress-config", global));
        let ingress = Ingress::builder()
            .manifests(dir.path())
            .args(["--configmap", "t/ingress-config"])
            .start();
        Site {
            ingress,
            auth,
            _app: app,
            dir,
        }
    }

    fn get(&self, host: &str, path: &str, version: &str) -> Reply {
        curl::get(&self.ingress, host, path, version, &[])
    }

    /// Replaces the ConfigMap, then waits until `host path` answers `status` (a live change
    /// takes a debounce and a build).
    fn configure(&self, global: &[(&str, &str)], host: &str, path: &str, status: u16) {
        self.dir
            .replace("config.yaml", &config_map("t", "ingress-config", global));
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reply = self.get(host, path, "--http1.1");
            if reply.status == status {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{global:?}: {host}{path} answers {reply:?}, wanted {status}; logs:\n{}",
                self.ingress.logs()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `host path` answered by the app, and how many checks the auth service got for it.
    fn served(&self, host: &str, path: &str, version: &str) -> (Reply, usize) {
        let before = self.auth.requests();
        let reply = self.get(host, path, version);
        assert_eq!(reply.backend(), "app", "{version} {host}{path}: {reply:?}");
        (reply, self.auth.requests() - before)
    }
}

#[test]
fn global_auth_protects_every_route_but_the_exempt_ones() {
    let ok = AuthService::start();
    let site = Site::start(&[
        ("global-auth-url", &ok.url("/ok")),
        ("global-auth-response-headers", "X-Auth-Request-User"),
    ]);
    for version in VERSIONS {
        // Allowed: the global auth service was asked, its header reached the upstream, and a
        // client's own copy of it did not.
        let before = ok.requests();
        let reply = curl::get(
            &site.ingress,
            "plain.test",
            "/page?q=1",
            version,
            &["-H", "X-Auth-Request-User: mallory"],
        );
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
        let echo = reply.echo().unwrap();
        assert_eq!(
            echo.headers.get("x-auth-request-user").map(String::as_str),
            Some("alice"),
            "{version}"
        );
        assert_eq!(ok.requests(), before + 1, "{version}: one check");
        let seen = ok.seen().pop().unwrap();
        assert_eq!(seen.path, "/ok");
        assert_eq!(
            seen.header("x-original-url"),
            Some("http://plain.test/page?q=1")
        );

        // The ACME solver's path is under no-auth-locations: nobody is asked.
        let before = ok.requests();
        let reply = site.get("plain.test", ACME, version);
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
        assert_eq!(ok.requests(), before, "{version}: the ACME path asked");
        // The exemption is the rule's path, not the request's: `/` takes this one, and `/`
        // is protected.
        let before = ok.requests();
        let reply = site.get("plain.test", "/.well-known/acme-challenge/other", version);
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
        assert_eq!(ok.requests(), before + 1, "{version}: `/` asks");

        // enable-global-auth: "false" opts out.
        let before = ok.requests();
        let reply = site.get("off.test", "/", version);
        assert_eq!(reply.backend(), "app", "{version}: {reply:?}");
        assert_eq!(
            ok.requests(),
            before,
            "{version}: the opted-out Ingress asked"
        );

        // An Ingress's own auth-url wins: its auth service says no, the global one is not
        // asked.
        let before = ok.requests();
        let reply = site.get("own.test", "/", version);
        assert_eq!(reply.status, 401, "{version}: {reply:?}");
        assert_eq!(
            ok.requests(),
            before,
            "{version}: the global auth service asked"
        );
    }
}

#[test]
fn denials_and_failures_never_reach_the_backend_and_changes_are_live() {
    let site = Site::start(&[("global-auth-url", "")]);
    // No global auth yet: served, nobody asked.
    for version in VERSIONS {
        let (_, asked) = site.served("plain.test", "/", version);
        assert_eq!(asked, 0, "{version}");
    }

    // Denied: the auth service's 401 (and its WWW-Authenticate) reaches the client.
    let deny = site.auth.url("/deny");
    site.configure(&[("global-auth-url", &deny)], "plain.test", "/", 401);
    for version in VERSIONS {
        let reply = site.get("plain.test", "/", version);
        assert_eq!(reply.status, 401, "{version}: {reply:?}");
        assert_eq!(
            reply.header("www-authenticate"),
            Some("Bearer realm=\"auth\""),
            "{version}"
        );
        let (_, asked) = site.served("plain.test", ACME, version);
        assert_eq!(asked, 0, "{version}: the ACME path asked");
        site.served("off.test", "/", version);
    }

    // With global-auth-signin, the 401 becomes a redirect there, with `rd` (and the
    // redirect parameter the ConfigMap names).
    site.configure(
        &[
            ("global-auth-url", &deny),
            ("global-auth-signin", "https://login.example/start"),
        ],
        "plain.test",
        "/",
        302,
    );
    for version in VERSIONS {
        let reply = site.get("plain.test", "/path?q=1", version);
        assert_eq!(reply.status, 302, "{version}: {reply:?}");
        assert_eq!(
            reply.header("location"),
            Some("https://login.example/start?rd=http://plain.test%2Fpath%3Fq%3D1"),
            "{version}"
        );
    }
    site.configure(
        &[
            ("global-auth-url", &deny),
            ("global-auth-signin", "https://login.example/start"),
            ("global-auth-signin-redirect-param", "next"),
        ],
        "off.test",
        "/",
        200,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = site.get("plain.test", "/p", "--http1.1");
        if reply.header("location")
            == Some("https://login.example/start?next=http://plain.test%2Fp")
        {
            break;
        }
        assert!(Instant::now() < deadline, "{reply:?}");
        std::thread::sleep(Duration::from_millis(50));
    }

    // The auth service down (a port nothing listens on): 500, never the backend.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let down = format!("http://{closed}/ok");
    site.configure(&[("global-auth-url", &down)], "plain.test", "/", 500);
    for version in VERSIONS {
        let reply = site.get("plain.test", "/", version);
        assert_eq!(reply.status, 500, "{version}: {reply:?}");
        assert_ne!(reply.backend(), "app");
        site.served("plain.test", ACME, version);
        site.served("off.test", "/", version);
    }

    // Values that cannot be honoured: the protected routes answer 503 (never opened), the
    // exempt ones stay up.
    let ok = site.auth.url("/ok");
    let broken: [&[(&str, &str)]; 3] = [
        &[("global-auth-url", "auth.svc/check")],
        &[("global-auth-url", &ok), ("global-auth-method", "get")],
        &[
            ("global-auth-url", &ok),
            ("global-auth-snippet", "proxy_set_header X-A b;"),
        ],
    ];
    for global in broken {
        // Through a good configuration first, so each bad one is seen to take effect.
        site.configure(&[("global-auth-url", &ok)], "plain.test", "/", 200);
        site.configure(global, "plain.test", "/", 503);
        for version in VERSIONS {
            let reply = site.get("plain.test", "/", version);
            assert_eq!(reply.status, 503, "{global:?} {version}: {reply:?}");
            site.served("plain.test", ACME, version);
            site.served("off.test", "/", version);
            assert_eq!(
                site.get("own.test", "/", version).status,
                401,
                "{global:?} {version}: the Ingress with its own auth-url"
            );
        }
    }
    assert!(
        site.ingress
            .wait_for_log("InvalidConfigValue", Duration::from_secs(5)),
        "{}",
        site.ingress.logs()
    );

    // Removed: served again without a check.
    site.configure(&[], "plain.test", "/", 200);
    for version in VERSIONS {
        let (_, asked) = site.served("plain.test", "/", version);
        assert_eq!(asked, 0, "{version}");
    }
}
