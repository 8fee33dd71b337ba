//! curl as the client: a real HTTP/1.1 or h2c client whose reply is read back as status,
//! headers and the echo backend's body, for the tests of per-route behaviour.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use crate::process::Ingress;
use crate::upstream::Echo;

/// The two protocol paths of the proxy: HTTP/1.1 (its own parser) and h2c (hyper).
pub const VERSIONS: [&str; 2] = ["--http1.1", "--http2-prior-knowledge"];

/// What curl saw.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    /// Lower-case names; the last value of a repeated header.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl Reply {
    /// The echo backend's report, when a backend answered.
    pub fn echo(&self) -> Option<Echo> {
        serde_json::from_str(&self.body).ok()
    }

    /// The answering backend's name, or `<status>` when the proxy answered itself.
    pub fn backend(&self) -> String {
        self.echo()
            .map(|e| e.backend)
            .unwrap_or_else(|| format!("<{}>", self.status))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }
}

/// GET `path` (as sent, curl does not normalise it) with `Host: host`, over `version` (one of
/// [`VERSIONS`]), with `extra` curl arguments (`-H`, `-b`, …). Redirects are not followed.
pub fn get(ingress: &Ingress, host: &str, path: &str, version: &str, extra: &[&str]) -> Reply {
    let out = Command::new("curl")
        .args([
            "-s",
            "-S",
            "--path-as-is",
            "--max-time",
            "10",
            "-D",
            "-",
            version,
        ])
        .args(["-H", &format!("Host: {host}")])
        .args(extra)
        .arg(ingress.url(path))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    parse(&text).unwrap_or_else(|| {
        panic!(
            "curl {version} {host}{path} {extra:?}: no reply in {text:?}; {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// What curl's `-w format` says of one request made with `args` (the URL among them), the
/// body thrown away: for a test that looks only at the status, the HTTP version or where a
/// redirect points. Empty when curl could not say.
pub fn write_out(format: &str, args: &[&str]) -> String {
    let out = Command::new("curl")
        .args(["-s", "-o", "/dev/null", "--max-time", "10", "-w", format])
        .args(args)
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The status of one request made with `args` (the URL among them); 0 when none came back.
pub fn status(args: &[&str]) -> u16 {
    write_out("%{http_code}", args).parse().unwrap_or(0)
}

/// The response head of GET `https://<host>:<port><path>` sent to 127.0.0.1 (SNI and Host
/// `host`), the server's certificate verified against `ca_file`: for what a real client sees
/// of headers such as HSTS. Empty when no answer came.
pub fn verified_https_head(ca_file: &Path, host: &str, port: u16, path: &str) -> String {
    let out = Command::new("curl")
        .args([
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "--max-time",
            "10",
            "--cacert",
        ])
        .arg(ca_file)
        .args([
            "--resolve",
            &format!("{host}:{port}:127.0.0.1"),
            &format!("https://{host}:{port}{path}"),
        ])
        .output()
        .expect("curl runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// GET `https://<host><path>` on the HTTPS listener (SNI and Host `host`, the server's
/// certificate not checked), over `version` (`--http1.1` or `--http2`), with `extra` curl
/// arguments (`--cert`, `--key`, `-H`, …). `None` when no HTTP reply came (the TLS handshake
/// failed, or the connection was reset).
pub fn https_get(
    ingress: &Ingress,
    host: &str,
    path: &str,
    version: &str,
    extra: &[&str],
) -> Option<Reply> {
    let port = ingress.https.port();
    let out = Command::new("curl")
        .args([
            "-s",
            "-S",
            "-k",
            "--path-as-is",
            "--max-time",
            "10",
            "-D",
            "-",
            version,
        ])
        .args(["--resolve", &format!("{host}:{port}:127.0.0.1")])
        .args(extra)
        .arg(format!("https://{host}:{port}{path}"))
        .output()
        .expect("curl runs");
    parse(&String::from_utf8_lossy(&out.stdout))
}

/// The head curl dumped with `-D -`, then the body; interim (1xx) heads are skipped.
fn parse(mut text: &str) -> Option<Reply> {
    let (mut head, mut body) = text.split_once("\r\n\r\n")?;
    while head
        .split_whitespace()
        .nth(1)
        .is_some_and(|s| s.starts_with('1'))
    {
        text = body;
        (head, body) = text.split_once("\r\n\r\n")?;
    }
    let mut lines = head.lines();
    let status = lines.next()?.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Some(Reply {
        status,
        headers,
        body: body.to_string(),
    })
}
