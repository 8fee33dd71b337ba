//! `--access-log-format upstream` through the real binary: every request, over HTTP/1.1 and
//! h2c, forwarded or answered by the proxy, gets one line that the regular expression log
//! shippers use for ingress-nginx's default format (Fluent Bit's `k8s-nginx-ingress` parser)
//! reads, with the values the request really had; and a header full of quotes and control
//! bytes cannot break a line or a quoted field.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;
use regex::Regex;

/// Fluent Bit's `k8s-nginx-ingress` parser, as its `parsers.conf` ships it.
const SHIPPER_REGEX: &str = r#"^(?<host>[^ ]*) - (?<user>[^ ]*) \[(?<time>[^\]]*)\] "(?<method>\S+)(?: +(?<path>[^\"]*?)(?: +\S*)?)?" (?<code>[^ ]*) (?<size>[^ ]*)(?: "(?<referer>[^\"]*)" "(?<agent>[^\"]*)")? (?<request_length>[^ ]*) (?<request_time>[^ ]*) \[(?<proxy_upstream_name>[^ ]*)\] (\[(?<proxy_alternative_upstream_name>[^ ]*)\] )?(?<upstream_addr>[^ ]*) (?<upstream_response_length>[^ ]*) (?<upstream_response_time>[^ ]*) (?<upstream_status>[^ ]*) (?<reg_id>[^ ]*).*$"#;

/// The access line that carries `id`, waited for (lines are written by a background thread).
fn line_with(ingress: &Ingress, id: &str) -> String {
    assert!(
        ingress.wait_for_log(id, Duration::from_secs(5)),
        "no access line with {id}:\n{}",
        ingress.logs()
    );
    let logs = ingress.logs();
    logs.lines().find(|l| l.contains(id)).unwrap().to_string()
}

fn fields(line: &str) -> regex::Captures<'_> {
    let re = Regex::new(SHIPPER_REGEX).unwrap();
    re.captures(line)
        .unwrap_or_else(|| panic!("the shippers' regex does not read {line:?}"))
}

fn site() -> (Backend, Scratch) {
    let web = Backend::start("web");
    let dir = Scratch::new("access-log");
    dir.write(
        "all.yaml",
        &[
            service("shop", "web", &[&web]),
            annotated_ingress(
                "shop",
                "front",
                1,
                &[],
                &[("log.test", "/", "Prefix", "web")],
            ),
        ]
        .concat(),
    );
    (web, dir)
}

#[test]
fn each_request_is_one_line_the_shippers_parse_with_its_real_values() {
    let (web, dir) = site();
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--access-log-format", "upstream"])
        .start();
    for (n, version) in VERSIONS.into_iter().enumerate() {
        let id = format!("{n}aaaabbbbccccddddeeeeffff000011112");
        let id = &id[..32];
        let reply = curl::get(
            &ingress,
            "log.test",
            "/items?page=2",
            version,
            &[
                "-H",
                &format!("X-Request-ID: {id}"),
                "-H",
                "Referer: https://shop.example/cart",
                "-A",
                "shopper/1.0",
                "-u",
                "alice:secret",
            ],
        );
        assert_eq!(reply.status, 200, "{version}");
        let line = line_with(&ingress, id);
        let f = fields(&line);
        let protocol = if n == 0 { "HTTP/1.1" } else { "HTTP/2.0" };
        assert_eq!(&f["host"], "127.0.0.1", "{line}");
        assert_eq!(&f["user"], "alice", "{line}");
        assert_eq!(&f["method"], "GET", "{line}");
        assert_eq!(&f["path"], "/items?page=2", "{line}");
        assert!(
            line.contains(&format!("/items?page=2 {protocol}\"")),
            "{line}"
        );
        assert_eq!(&f["code"], "200", "{line}");
        assert_eq!(
            f["size"].parse::<usize>().unwrap(),
            reply.body.len(),
            "{line}"
        );
        assert_eq!(&f["referer"], "https://shop.example/cart", "{line}");
        assert_eq!(&f["agent"], "shopper/1.0", "{line}");
        assert!(f["request_length"].parse::<u64>().unwrap() > 50, "{line}");
        assert!(f["request_time"].parse::<f64>().is_ok(), "{line}");
        assert_eq!(&f["proxy_upstream_name"], "shop-web-80", "{line}");
        assert_eq!(
            f.name("proxy_alternative_upstream_name")
                .map(|m| m.as_str()),
            Some(""),
            "{line}"
        );
        assert_eq!(&f["upstream_addr"], web.addr.to_string(), "{line}");
        assert_eq!(
            f["upstream_response_length"].parse::<usize>().unwrap(),
            reply.body.len(),
            "{line}"
        );
        assert!(f["upstream_response_time"].parse::<f64>().is_ok(), "{line}");
        assert_eq!(&f["upstream_status"], "200", "{line}");
        assert_eq!(&f["reg_id"], id, "{line}");
        // The id logged is the id the upstream was sent.
        assert_eq!(
            reply
                .echo()
                .unwrap()
                .headers
                .get("x-request-id")
                .map(String::as_str),
            Some(id),
            "{line}"
        );
    }
}

#[test]
fn the_proxys_own_answers_and_new_request_ids_are_logged_too() {
    let (_web, dir) = site();
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--access-log-format", "upstream"])
        .start();
    let mut sizes = Vec::new();
    for version in VERSIONS {
        let reply = curl::get(
            &ingress,
            "nobody.test",
            "/missing",
            version,
            &["-A", "probe/404"],
        );
        assert_eq!(reply.status, 404);
        sizes.push(reply.body.len());
    }
    assert!(ingress.wait_for_log("HTTP/2.0\" 404", Duration::from_secs(5)));
    let logs = ingress.logs();
    let lines: Vec<&str> = logs.lines().filter(|l| l.contains("probe/404")).collect();
    assert_eq!(lines.len(), 2, "{logs}");
    for (line, size) in lines.into_iter().zip(sizes) {
        let f = fields(line);
        assert_eq!(&f["code"], "404", "{line}");
        assert_eq!(&f["user"], "-", "{line}");
        assert_eq!(&f["referer"], "-", "{line}");
        assert_eq!(
            &f["proxy_upstream_name"], "upstream-default-backend",
            "{line}"
        );
        assert_eq!(&f["upstream_addr"], "-", "{line}");
        assert_eq!(&f["upstream_status"], "-", "{line}");
        assert_eq!(f["size"].parse::<usize>().unwrap(), size, "{line}");
        // A fresh id: 32 hex digits.
        assert!(
            f["reg_id"].len() == 32 && f["reg_id"].bytes().all(|b| b.is_ascii_hexdigit()),
            "{line}"
        );
    }
}

#[test]
#[allow(clippy::disallowed_methods)] // a plain blocking test, no async runtime to block
fn hostile_header_bytes_stay_inside_their_field() {
    let (_web, dir) = site();
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--access-log-format", "upstream"])
        .start();
    // A User-Agent that would close its quotes and fake the rest of a line, with a backslash
    // and a byte above ASCII: exact bytes, over a raw connection. (Control bytes in a header
    // never get this far: the request is refused with 400.)
    let mut stream = TcpStream::connect(ingress.http).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    stream
        .write_all(
            b"GET /x HTTP/1.1\r\nHost: log.test\r\nUser-Agent: evil\" 200 1 \"-\" \"x\\\xff\r\nReferer: \"\r\nX-Request-ID: feedfacefeedfacefeedfacefeedface\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    assert!(
        reply.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    let line = line_with(&ingress, "feedfacefeedfacefeedfacefeedface");
    let f = fields(&line);
    assert_eq!(
        &f["agent"], "evil\\x22 200 1 \\x22-\\x22 \\x22x\\x5C\\xFF",
        "{line}"
    );
    assert_eq!(&f["referer"], "\\x22", "{line}");
    assert_eq!(&f["code"], "200", "{line}");
}

#[test]
fn a_request_the_canary_took_names_it_as_the_alternative_upstream() {
    let (web, canary) = (Backend::start("web"), Backend::start("canary"));
    let dir = Scratch::new("access-log-canary");
    dir.write(
        "all.yaml",
        &[
            service("shop", "web", &[&web]),
            service("shop", "web-next", &[&canary]),
            annotated_ingress(
                "shop",
                "front",
                1,
                &[],
                &[("log.test", "/", "Prefix", "web")],
            ),
            annotated_ingress(
                "shop",
                "front-canary",
                2,
                &[("canary", "true"), ("canary-by-header", "X-Canary")],
                &[("log.test", "/", "Prefix", "web-next")],
            ),
        ]
        .concat(),
    );
    let ingress = Ingress::builder()
        .manifests(dir.path())
        .args(["--access-log-format", "upstream"])
        .start();
    for version in VERSIONS {
        for (choice, id, backend, alternative) in [
            (
                "always",
                "c1000000000000000000000000000000",
                "canary",
                "shop-web-next-80",
            ),
            ("never", "c2000000000000000000000000000000", "web", ""),
        ] {
            let id = &format!(
                "{}{}",
                &id[..31],
                if version == VERSIONS[0] { "a" } else { "b" }
            );
            let reply = curl::get(
                &ingress,
                "log.test",
                "/",
                version,
                &[
                    "-H",
                    &format!("X-Canary: {choice}"),
                    "-H",
                    &format!("X-Request-ID: {id}"),
                ],
            );
            assert_eq!(reply.backend(), backend, "{version} {choice}");
            let line = line_with(&ingress, id);
            let f = fields(&line);
            assert_eq!(&f["proxy_upstream_name"], "shop-web-80", "{line}");
            assert_eq!(
                f.name("proxy_alternative_upstream_name")
                    .map(|m| m.as_str()),
                Some(alternative),
                "{line}"
            );
        }
    }
}
