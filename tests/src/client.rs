//! Clients for the tests: a blocking one for admin endpoints, and hyper clients (HTTP/1.1 and
//! h2c) for proxied traffic.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::upstream::Echo;

/// GET over a fresh connection with `Connection: close`; returns (status, body).
pub fn blocking_get(addr: SocketAddr, path: &str, host: &str) -> (u16, String) {
    let attempt = || -> std::io::Result<(u16, String)> {
        let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw)?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let chunked = head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked");
        Ok((
            status,
            if chunked {
                dechunk(body)
            } else {
                body.to_string()
            },
        ))
    };
    attempt().unwrap_or((0, String::new()))
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Finds a sample in Prometheus text output: `name{labels…} value`, where every given label
/// pair must be present.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, label_text) = match series.split_once('{') {
                Some((m, rest)) => (m, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            if metric != name {
                return None;
            }
            let all = labels.iter().all(|(k, v)| {
                label_text
                    .split(',')
                    .any(|pair| pair == format!("{k}=\"{v}\""))
            });
            if all { value.parse().ok() } else { None }
        })
}

pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

pub fn http1() -> HttpClient {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// HTTP/2 with prior knowledge (h2c), as `curl --http2-prior-knowledge` speaks it.
pub fn h2c() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build(HttpConnector::new())
}

/// A response, fully read.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The upstream's echo, if a test backend answered.
    pub fn echo(&self) -> Option<Echo> {
        serde_json::from_slice(&self.body).ok()
    }

    pub fn backend(&self) -> String {
        self.echo()
            .map(|e| e.backend)
            .unwrap_or_else(|| format!("<{}>", self.status.as_u16()))
    }
}

/// GET `url` with a Host header; panics with context on transport errors.
pub async fn get(client: &HttpClient, url: &str, host: &str) -> Reply {
    try_get(client, url, host)
        .await
        .unwrap_or_else(|e| panic!("GET {url} (host {host}): {e}"))
}

pub async fn try_get(client: &HttpClient, url: &str, host: &str) -> Result<Reply, String> {
    let req = Request::get(url)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    send(client, req).await
}

pub async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Result<Reply, String> {
    let response = client.request(req).await.map_err(|e| format!("{e:?}"))?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}
