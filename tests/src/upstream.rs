//! Upstream servers for the proxy tests: real HTTP/1.1 servers on loopback that say who they
//! are and echo what they received, so a test can assert on routing and on forwarded headers.
//!
//! Behaviour by request:
//! - any request: 200 with a JSON body `{backend, method, uri, headers, body_len}`;
//! - query `delay_ms=N`: wait N ms before answering;
//! - query `status=N`: answer with status N;
//! - otherwise a request header `X-Code: N` (what ingress-nginx sends its error backend): answer
//!   with status N, as ingress-nginx's custom error pages backend does;
//! - query `header=NAME:VALUE`: add that response header;
//! - `Upgrade` request: 101, then echo every byte back on the upgraded connection.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};

use crate::accept_loop::AcceptLoop;

/// What a backend saw, as it reports it in its response body.
#[derive(Debug, Serialize, Deserialize)]
pub struct Echo {
    pub backend: String,
    pub method: String,
    pub uri: String,
    pub headers: BTreeMap<String, String>,
    pub body_len: usize,
}

/// A running upstream. Stops when dropped.
pub struct Backend {
    pub name: String,
    pub addr: SocketAddr,
    served: Arc<AtomicUsize>,
    accepted: Arc<AtomicUsize>,
    _server: AcceptLoop,
}

impl Backend {
    pub fn start(name: &str) -> Backend {
        let listener = crate::ports::listen_loopback();
        let addr = listener.local_addr().expect("addr");
        let served = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::new(AtomicUsize::new(0));
        let shared_name: Arc<str> = name.into();
        let (counter, accepted_counter) = (served.clone(), accepted.clone());
        let server = AcceptLoop::start(listener, move |stream| {
            accepted_counter.fetch_add(1, Ordering::Relaxed);
            let (name, counter) = (shared_name.clone(), counter.clone());
            async move {
                let service = service_fn(move |req| handle(req, name.clone(), counter.clone()));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            }
        });
        Backend {
            name: name.to_string(),
            addr,
            served,
            accepted,
            _server: server,
        }
    }

    /// Requests answered so far.
    pub fn served(&self) -> usize {
        self.served.load(Ordering::Relaxed)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }
}

/// The echo every test upstream answers with (also behind TLS, `https_upstream`).
pub async fn handle(
    mut req: Request<Incoming>,
    name: Arc<str>,
    served: Arc<AtomicUsize>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let query: BTreeMap<String, String> = req
        .uri()
        .query()
        .map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default();
    if let Some(ms) = query.get("delay_ms").and_then(|v| v.parse::<u64>().ok()) {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    if req.headers().contains_key(header::UPGRADE) {
        let on_upgrade = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(upgraded) = on_upgrade.await {
                let mut io = TokioIo::new(upgraded);
                let (mut r, mut w) = tokio::io::split(&mut io);
                let _ = tokio::io::copy(&mut r, &mut w).await;
            }
        });
        served.fetch_add(1, Ordering::Relaxed);
        let mut response = Response::new(Full::new(Bytes::new()));
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let upgrade = req
            .headers()
            .get(header::UPGRADE)
            .cloned()
            .unwrap_or(header::HeaderValue::from_static("echo"));
        response.headers_mut().insert(header::UPGRADE, upgrade);
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("upgrade"),
        );
        return Ok(response);
    }
    // `?size=N`: N bytes of `x` instead of the echo, for tests of large responses.
    if let Some(size) = query.get("size").and_then(|v| v.parse::<usize>().ok()) {
        served.fetch_add(1, Ordering::Relaxed);
        return Ok(Response::new(Full::new(Bytes::from(vec![b'x'; size]))));
    }
    let x_code = req
        .headers()
        .get("x-code")
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok());
    let method = req.method().to_string();
    let uri = req.uri().to_string();
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.to_string(),
                String::from_utf8_lossy(v.as_bytes()).into_owned(),
            )
        })
        .collect();
    let body_len = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().len())
        .unwrap_or(0);
    let echo = Echo {
        backend: name.to_string(),
        method,
        uri,
        headers,
        body_len,
    };
    served.fetch_add(1, Ordering::Relaxed);
    let mut response = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(&echo).unwrap_or_default(),
    )));
    if let Some(status) = query
        .get("status")
        .and_then(|s| s.parse::<u16>().ok())
        .and_then(|s| StatusCode::from_u16(s).ok())
    {
        *response.status_mut() = status;
    } else if let Some(status) = x_code {
        *response.status_mut() = status;
    }
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    if let Some((name, value)) = query.get("header").and_then(|h| h.split_once(':'))
        && let (Ok(name), Ok(value)) = (
            header::HeaderName::from_bytes(name.as_bytes()),
            header::HeaderValue::from_str(value),
        )
    {
        response.headers_mut().append(name, value);
    }
    Ok(response)
}
