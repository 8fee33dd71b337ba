//! An upstream that speaks HTTP/2 with prior knowledge only (h2c), as a gRPC server or an h2c
//! web UI does: what an HTTP/1.1 request to it gets is an HTTP/2 connection preface error. Each
//! path scripts an answer:
//!
//! ```text
//!   /length     "0123456789" with content-length
//!   /stream     "hello " and "world" in two DATA frames, no content-length
//!   /trailers   "data", then trailers grpc-status: 0 and x-trailer: yes
//!   /nothing    204
//!   otherwise   an echo, with content-length: "METHOD PATH VERSION", the request's header
//!               lines ("name: value", as received), an empty line, then its body
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::accept_loop::AcceptLoop;

pub struct H2cUpstream {
    pub addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    _server: AcceptLoop,
}

impl H2cUpstream {
    pub fn start() -> H2cUpstream {
        let listener = crate::ports::listen_loopback();
        let addr = listener.local_addr().expect("addr");
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let server = AcceptLoop::start(listener, move |stream| {
            counter.fetch_add(1, Ordering::Relaxed);
            async move {
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service_fn(answer))
                    .await;
            }
        });
        H2cUpstream {
            addr,
            connections,
            _server: server,
        }
    }

    /// HTTP/2 connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

type Body = BoxBody<Bytes, Infallible>;

fn full(text: impl Into<Bytes>) -> Body {
    Full::new(text.into()).boxed()
}

fn frames(frames: Vec<Frame<Bytes>>) -> Body {
    let stream = futures_util::stream::iter(frames.into_iter().map(Ok::<_, Infallible>));
    StreamBody::new(stream).boxed()
}

async fn answer(req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let response = match req.uri().path() {
        "/length" => Response::new(full("0123456789")),
        "/stream" => Response::new(frames(vec![
            Frame::data(Bytes::from_static(b"hello ")),
            Frame::data(Bytes::from_static(b"world")),
        ])),
        "/trailers" => {
            let mut trailers = HeaderMap::new();
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
            trailers.insert("x-trailer", HeaderValue::from_static("yes"));
            Response::new(frames(vec![
                Frame::data(Bytes::from_static(b"data")),
                Frame::trailers(trailers),
            ]))
        }
        "/nothing" => {
            let mut response = Response::new(full(""));
            *response.status_mut() = http::StatusCode::NO_CONTENT;
            response
        }
        _ => {
            let mut text = format!(
                "{} {} {:?}\n",
                req.method(),
                req.uri()
                    .path_and_query()
                    .map_or("/", http::uri::PathAndQuery::as_str),
                req.version()
            );
            if let Some(authority) = req.uri().authority() {
                text.push_str(&format!(":authority: {authority}\n"));
            }
            for (name, value) in req.headers() {
                text.push_str(&format!(
                    "{name}: {}\n",
                    String::from_utf8_lossy(value.as_bytes())
                ));
            }
            text.push('\n');
            let body = match req.into_body().collect().await {
                Ok(body) => body.to_bytes(),
                Err(err) => Bytes::from(format!("<body failed: {err}>")),
            };
            let mut out = text.into_bytes();
            out.extend_from_slice(&body);
            let len = out.len();
            let mut response = Response::new(full(out));
            response
                .headers_mut()
                .insert(http::header::CONTENT_LENGTH, HeaderValue::from(len));
            response
        }
    };
    Ok(response)
}
