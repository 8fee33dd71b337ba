//! Upstream HTTP/1.1 exchanges for HTTP/2 requests, over the HTTP/1.x fast path's kept
//! connections ([`StreamPool`]): one idle list per endpoint and transport, whichever protocol
//! the client spoke.
//!
//! ```text
//!   checkout(endpoint) ── idle connection (still open?) or a new one ──┐ no connection: the
//!   head written (Content-Length, or chunked when the length is unknown)│ request comes back
//!   body streamed; the upstream answering early stops the upload ───────┤ unsent (retried
//!   response head parsed (1xx skipped) into the HTTP/2 response ────────┤ elsewhere)
//!   body: read as framed, passed on as it comes ────────────────────────┤
//!   body ended, nothing extra, reusable → back to idle; else closed ────┘
//! ```
//!
//! A reused connection that fails before any answer to a request sent whole with its head is
//! retried once on a new one, as on the HTTP/1.x path. The response head is read with the same
//! rules as there (`h1::response`): a Content-Length that disagrees with itself is refused,
//! Transfer-Encoding wins over Content-Length, and a message with both never leaves its
//! connection reusable.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming, SizeHint};
use ingress_wire::chunked::{self, ChunkError, Chunked};
use ingress_wire::header::{Kind, kind};
use ingress_wire::request::{MAX_HEADERS, push};
use ingress_wire::response::{self, Parsed};
use tokio::io::AsyncWriteExt;

use super::connect::Transport;
pub use super::connect::{PoolKey, connect_to_any, open, resolve_external};
use super::streams::{MAX_RESPONSE_HEAD, READ_SIZE, StreamPool, Upstream};
pub use super::streams::{PoolLimits, PoolLimitsHook};
use super::upstream::UpstreamError;

/// A client's request body on its way upstream, failing if the client pauses too long.
pub type RequestBody = super::idle::IdleBody<ClientBody>;

/// A request body as a client sends it: an HTTP/2 stream's (hyper's), or one the HTTP/1.x path
/// reads itself and hands over a piece at a time (`h1::bridge`, for HTTP/2-only upstreams).
pub enum ClientBody {
    /// None at all: the upstream's stream ends with the head.
    Empty,
    H2(Incoming),
    /// Pieces read from an HTTP/1.x client, then `None` for its end. The channel holds one
    /// piece, so the client is read no faster than the upstream takes it. A channel closed
    /// without that `None` (the client went away or stalled, or sent a malformed chunk) fails
    /// the body, so the upstream's stream is reset and never sees a cut-short body as whole.
    H1 {
        pieces: tokio::sync::mpsc::Receiver<Option<Bytes>>,
        /// The declared `Content-Length`, for the size hint.
        length: Option<u64>,
        ended: bool,
    },
}

/// Why a body an HTTP/1.x client was sending did not arrive whole.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body was cut short")]
pub struct CutShort;

impl Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match self.get_mut() {
            Self::Empty => Poll::Ready(None),
            Self::H2(body) => Pin::new(body).poll_frame(cx).map_err(Into::into),
            Self::H1 { ended: true, .. } => Poll::Ready(None),
            Self::H1 { pieces, ended, .. } => match pieces.poll_recv(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Some(Some(piece))) => Poll::Ready(Some(Ok(Frame::data(piece)))),
                Poll::Ready(Some(None)) => {
                    *ended = true;
                    Poll::Ready(None)
                }
                Poll::Ready(None) => Poll::Ready(Some(Err(CutShort.into()))),
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Self::Empty => true,
            Self::H2(body) => body.is_end_stream(),
            Self::H1 { ended, .. } => *ended,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Empty => SizeHint::with_exact(0),
            Self::H2(body) => body.size_hint(),
            Self::H1 {
                length: Some(n), ..
            } => SizeHint::with_exact(*n),
            Self::H1 { length: None, .. } => SizeHint::default(),
        }
    }
}

pub struct Pool {
    streams: Arc<StreamPool>,
}

/// A request that could not be sent, with the request itself when no connection could be made
/// for it (nothing of it reached an upstream, so it can go to another: `proxy-next-upstream`).
pub struct SendError {
    pub error: UpstreamError,
    pub unsent: Option<Request<RequestBody>>,
}

impl SendError {
    pub fn unsent(error: UpstreamError, req: Request<RequestBody>) -> Self {
        Self {
            error,
            unsent: Some(req),
        }
    }

    pub fn sent(error: UpstreamError) -> Self {
        Self {
            error,
            unsent: None,
        }
    }
}

impl Pool {
    pub fn new(streams: Arc<StreamPool>) -> Arc<Self> {
        Arc::new(Self { streams })
    }

    /// Sends `req` to `key` and returns the response, whose body reads the rest of the
    /// exchange from the connection and gives it back to the pool at its end.
    pub async fn send(
        self: &Arc<Self>,
        key: PoolKey,
        transport: Transport,
        connect_timeout: Duration,
        req: Request<RequestBody>,
    ) -> Result<Response<UpstreamBody>, SendError> {
        let up = match (self.streams)
            .checkout(&key, &transport, connect_timeout, Instant::now())
            .await
        {
            Ok(up) => up,
            Err(error) => return Err(SendError::unsent(error, req)),
        };
        let (parts, mut body) = req.into_parts();
        let (head, upload) = request_head(&parts, &body);
        let head_request = parts.method == Method::HEAD;
        let reused = up.reused;
        let mut result = exchange(up, &head, upload, &mut body, head_request).await;
        if let Err(Failed { error, stale: true }) = &result
            && reused
            && upload == Upload::WithHead
        {
            tracing::debug!(upstream = %key, %error, "kept-alive upstream connection was closed; retrying on a new one");
            let fresh = match self
                .streams
                .connect(&key, &transport, connect_timeout)
                .await
            {
                Ok(fresh) => fresh,
                Err(error) => {
                    return Err(SendError::unsent(error, Request::from_parts(parts, body)));
                }
            };
            result = exchange(fresh, &head, upload, &mut body, head_request).await;
        }
        let (parsed, up) = result.map_err(|failed| SendError::sent(failed.error))?;
        let body = UpstreamBody::new(
            up,
            parsed.framing,
            parsed.reusable,
            self.streams.clone(),
            key,
            transport,
        );
        Ok(parsed.response.map(|()| body))
    }

    /// Idle connections held right now, for tests and metrics.
    pub fn idle_count(&self) -> usize {
        self.streams.idle_count()
    }
}

/// How the request body goes upstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upload {
    /// None: the head is the whole request, and can be sent again.
    WithHead,
    /// As it comes, `Content-Length` declared.
    Length,
    /// As it comes, chunked: its length is not known.
    Chunked,
}

/// The request head as the upstream reads it, and how its body follows. The framing is the
/// proxy's: the client's HTTP/2 request has none of its own (its `content-length`, which
/// HTTP/2 holds its DATA frames to, is kept).
fn request_head(parts: &http::request::Parts, body: &RequestBody) -> (Vec<u8>, Upload) {
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut head = Vec::with_capacity(512);
    push(
        &mut head,
        &[
            parts.method.as_str().as_bytes(),
            b" ",
            target.as_bytes(),
            b" HTTP/1.1\r\n",
        ],
    );
    for (name, value) in &parts.headers {
        if name == header::CONTENT_LENGTH || name == header::TRANSFER_ENCODING {
            continue;
        }
        push(
            &mut head,
            &[name.as_str().as_bytes(), b": ", value.as_bytes(), b"\r\n"],
        );
    }
    let upload = if body.is_end_stream() {
        // A method whose request carries content says it has none, as hyper's client did.
        if matches!(parts.method, Method::POST | Method::PUT | Method::PATCH)
            || parts.headers.contains_key(header::CONTENT_LENGTH)
        {
            head.extend_from_slice(b"content-length: 0\r\n");
        }
        Upload::WithHead
    } else if let Some(length) = body.size_hint().exact() {
        push(
            &mut head,
            &[
                b"content-length: ",
                itoa::Buffer::new().format(length).as_bytes(),
                b"\r\n",
            ],
        );
        Upload::Length
    } else {
        head.extend_from_slice(b"transfer-encoding: chunked\r\n");
        Upload::Chunked
    };
    head.extend_from_slice(b"\r\n");
    (head, upload)
}

/// Why an exchange failed, and whether it failed before any answer on a connection that may
/// only have been closed while it sat idle.
struct Failed {
    error: UpstreamError,
    stale: bool,
}

impl Failed {
    fn stale(error: UpstreamError) -> Self {
        Self { error, stale: true }
    }

    fn error(error: UpstreamError) -> Self {
        Self {
            error,
            stale: false,
        }
    }
}

/// Writes the request, streams its body, and reads the response head.
async fn exchange(
    mut up: Upstream,
    head: &[u8],
    upload: Upload,
    body: &mut RequestBody,
    head_request: bool,
) -> Result<(Head, Upstream), Failed> {
    if let Err(err) = up.stream.write_all(head).await {
        return Err(Failed::stale(UpstreamError::Protocol(err.to_string())));
    }
    let mut early = false;
    if upload != Upload::WithHead {
        early = stream_body(&mut up, upload, body).await?;
    }
    let mut answered = false;
    loop {
        if !up.buf.is_empty() {
            answered = true;
            match parse_head(&up.buf, head_request) {
                HeadParse::Complete(mut parsed) => {
                    up.buf.advance(parsed.head_len);
                    // The rest of an upload the upstream did not wait for was never sent.
                    parsed.reusable &= !early;
                    return Ok((parsed, up));
                }
                HeadParse::Interim(len) => {
                    up.buf.advance(len);
                    continue;
                }
                HeadParse::Partial if up.buf.len() < MAX_RESPONSE_HEAD => {}
                HeadParse::Partial => {
                    let error = UpstreamError::Protocol("response head too large".into());
                    return Err(Failed::error(error));
                }
                HeadParse::Invalid(why) => {
                    return Err(Failed::error(UpstreamError::Protocol(why.into())));
                }
            }
        }
        up.buf.reserve(READ_SIZE);
        let stale = !answered && upload == Upload::WithHead;
        match tokio::io::AsyncReadExt::read_buf(&mut up.stream, &mut up.buf).await {
            Ok(0) => {
                let error = UpstreamError::Protocol("connection closed before a response".into());
                return Err(Failed { error, stale });
            }
            Ok(_) => {}
            Err(err) => {
                let error = UpstreamError::Protocol(err.to_string());
                return Err(Failed { error, stale });
            }
        }
    }
}

/// Streams the client's body upstream, chunked when its length is unknown (trailers are not
/// passed to an HTTP/1.1 upstream). Returns whether the upstream answered before it was all
/// sent; the rest is then not sent.
async fn stream_body(
    up: &mut Upstream,
    upload: Upload,
    body: &mut RequestBody,
) -> Result<bool, Failed> {
    let mut out = Vec::new();
    loop {
        let frame = tokio::select! {
            biased;
            ready = up.stream.readable() => {
                if ready.is_ok() && up.answered_early() {
                    return Ok(true);
                }
                continue;
            }
            frame = body.frame() => frame,
        };
        let data = match frame {
            None => {
                let done = upload != Upload::Chunked || write(up, chunked::LAST_CHUNK).await?;
                return Ok(!done);
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(_trailers) => continue,
            },
            Some(Err(err)) => {
                let error = UpstreamError::Protocol(format!("the request body failed: {err}"));
                return Err(Failed::error(error));
            }
        };
        let written = if upload == Upload::Chunked {
            out.clear();
            chunked::encode_chunk(&data, &mut out);
            write(up, &out).await?
        } else {
            write(up, &data).await?
        };
        if !written {
            return Ok(true);
        }
    }
}

/// Writes `bytes` upstream. `Ok(false)`: the write failed because the upstream answered (and
/// perhaps closed) before reading the rest, and its answer is worth reading.
async fn write(up: &mut Upstream, bytes: &[u8]) -> Result<bool, Failed> {
    match up.stream.write_all(bytes).await {
        Ok(()) => Ok(true),
        Err(_) if up.answered_early() => Ok(false),
        Err(err) => Err(Failed::error(UpstreamError::Protocol(err.to_string()))),
    }
}

/// An upstream's response head, as the HTTP/2 client is sent it.
struct Head {
    head_len: usize,
    response: Response<()>,
    framing: Framing,
    /// The connection may serve another request once the body has been read.
    reusable: bool,
}

enum HeadParse {
    Partial,
    Invalid(&'static str),
    /// A 1xx head of this length: the response follows it.
    Interim(usize),
    Complete(Head),
}

/// How the response body is delimited.
#[derive(Debug, PartialEq, Eq)]
enum Framing {
    Empty,
    Length(u64),
    Chunked(Chunked),
    UntilClose,
}

/// Parses the upstream's response head in `buf` (RFC 9112 section 6.3, with the HTTP/1.x
/// path's rules).
fn parse_head(buf: &[u8], head_request: bool) -> HeadParse {
    let mut storage = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (head_len, code, version, parsed_headers) = match response::parse(buf, &mut storage) {
        Parsed::Complete {
            len,
            status,
            minor,
            headers,
        } => (len, status, minor, headers),
        Parsed::Partial => return HeadParse::Partial,
        Parsed::Invalid(why) => return HeadParse::Invalid(why),
    };
    let Ok(status) = StatusCode::from_u16(code) else {
        return HeadParse::Invalid("status code outside 100-599");
    };
    if code == 101 {
        return HeadParse::Invalid("switching protocols without an upgrade");
    }
    if status.is_informational() {
        return HeadParse::Interim(head_len);
    }
    let facts = match response::facts(parsed_headers, version) {
        Ok(facts) => facts,
        Err(why) => return HeadParse::Invalid(why),
    };
    let mut headers = HeaderMap::with_capacity(parsed_headers.len());
    let mut lengths = 0;
    for h in parsed_headers {
        // The same length said twice is said once.
        if kind(h.name) == Kind::ContentLength {
            lengths += 1;
            if lengths > 1 {
                continue;
            }
        }
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(h.name.as_bytes()),
            HeaderValue::from_bytes(h.value),
        ) else {
            return HeadParse::Invalid("invalid response header");
        };
        headers.append(name, value);
    }
    let (length, chunked, coded) = (facts.length, facts.chunked, facts.coded);
    let framing = if head_request || code == 204 || code == 304 {
        Framing::Empty
    } else if chunked {
        Framing::Chunked(Chunked::default())
    } else if coded {
        Framing::UntilClose
    } else if let Some(n) = length {
        Framing::Length(n)
    } else {
        Framing::UntilClose
    };
    if coded || code == 204 {
        // The coding delimits the body, and a 204 has none: a Content-Length beside either
        // says nothing true (the HTTP/1.x path drops it too).
        headers.remove(header::CONTENT_LENGTH);
    }
    let mut response = Response::new(());
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    HeadParse::Complete(Head {
        head_len,
        response,
        // A message with both Transfer-Encoding and Content-Length may have been framed
        // differently by someone on the way: never trust that connection again.
        reusable: facts.keep_alive && framing != Framing::UntilClose && !facts.both_framings(),
        framing,
    })
}

/// Why a response body did not arrive whole.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamBodyError {
    #[error("the upstream closed the connection before the response body ended")]
    CutShort,
    #[error("malformed chunked response body: {0}")]
    Chunked(#[from] ChunkError),
    #[error("reading the response body: {0}")]
    Read(#[from] std::io::Error),
}

/// A response body read from its upstream connection as the client takes it. When it ends
/// cleanly (and the upstream sent nothing past it) the connection goes back to the pool; if it
/// is dropped early or fails, the connection is closed, since a half-read response cannot be
/// resumed.
pub struct UpstreamBody {
    up: Option<Upstream>,
    framing: Framing,
    reusable: bool,
    streams: Arc<StreamPool>,
    key: PoolKey,
    transport: Transport,
}

impl UpstreamBody {
    fn new(
        up: Upstream,
        framing: Framing,
        reusable: bool,
        streams: Arc<StreamPool>,
        key: PoolKey,
        transport: Transport,
    ) -> Self {
        let mut body = Self {
            up: Some(up),
            framing,
            reusable,
            streams,
            key,
            transport,
        };
        if matches!(body.framing, Framing::Empty | Framing::Length(0)) {
            body.finish();
        }
        body
    }

    fn finish(&mut self) {
        self.framing = Framing::Empty;
        if let Some(up) = self.up.take()
            && self.reusable
            && up.buf.is_empty()
        {
            self.streams
                .checkin(&self.key, &self.transport, up, Instant::now());
        }
    }

    fn fail(
        &mut self,
        error: UpstreamBodyError,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamBodyError>>> {
        self.up = None;
        self.framing = Framing::Empty;
        Poll::Ready(Some(Err(error)))
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = UpstreamBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, UpstreamBodyError>>> {
        let this = &mut *self;
        loop {
            let Some(up) = this.up.as_mut() else {
                return Poll::Ready(None);
            };
            if !up.buf.is_empty() {
                let data = match &mut this.framing {
                    Framing::Empty => return Poll::Ready(None),
                    Framing::Length(left) => {
                        let n = usize::try_from(*left)
                            .unwrap_or(usize::MAX)
                            .min(up.buf.len());
                        *left -= n as u64;
                        up.buf.split_to(n).freeze()
                    }
                    Framing::UntilClose => up.buf.split().freeze(),
                    Framing::Chunked(decoder) => match decoder.decode(&up.buf) {
                        Ok(step) => {
                            let data = Bytes::copy_from_slice(&up.buf[step.data.clone()]);
                            up.buf.advance(step.consumed);
                            if step.done {
                                this.framing = Framing::Empty;
                            }
                            data
                        }
                        Err(err) => return this.fail(err.into()),
                    },
                };
                if matches!(this.framing, Framing::Empty | Framing::Length(0)) {
                    this.finish();
                }
                if data.is_empty() {
                    continue;
                }
                return Poll::Ready(Some(Ok(Frame::data(data))));
            }
            up.buf.reserve(READ_SIZE);
            match tokio_util::io::poll_read_buf(Pin::new(&mut up.stream), cx, &mut up.buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(0)) if this.framing == Framing::UntilClose => {
                    this.up = None;
                    this.framing = Framing::Empty;
                    return Poll::Ready(None);
                }
                Poll::Ready(Ok(0)) => return this.fail(UpstreamBodyError::CutShort),
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(err)) => return this.fail(err.into()),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.up.is_none() && self.framing == Framing::Empty
    }

    fn size_hint(&self) -> SizeHint {
        match self.framing {
            Framing::Empty => SizeHint::with_exact(0),
            Framing::Length(left) => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::global::UpstreamKeepalive;

    /// What a parsed head says, for a table.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Partial,
        Invalid(&'static str),
        Interim(usize),
        Complete {
            status: u16,
            framing: Framing,
            reusable: bool,
            content_length: Option<String>,
        },
    }

    fn seen(head: &str, head_request: bool) -> Seen {
        match parse_head(head.as_bytes(), head_request) {
            HeadParse::Partial => Seen::Partial,
            HeadParse::Invalid(why) => Seen::Invalid(why),
            HeadParse::Interim(len) => Seen::Interim(len),
            HeadParse::Complete(head) => Seen::Complete {
                status: head.response.status().as_u16(),
                framing: head.framing,
                reusable: head.reusable,
                content_length: head
                    .response
                    .headers()
                    .get_all(header::CONTENT_LENGTH)
                    .iter()
                    .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                    .reduce(|a, b| format!("{a},{b}")),
            },
        }
    }

    fn complete(status: u16, framing: Framing, reusable: bool, length: Option<&str>) -> Seen {
        Seen::Complete {
            status,
            framing,
            reusable,
            content_length: length.map(str::to_string),
        }
    }

    #[test]
    fn response_heads_are_framed_as_the_http1_path_frames_them() {
        let chunked = || Framing::Chunked(Chunked::default());
        let cases: Vec<(&str, &str, bool, Seen)> = vec![
            (
                "length",
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                false,
                complete(200, Framing::Length(5), true, Some("5")),
            ),
            (
                "the same length twice is one",
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\nContent-Length: 5\r\n\r\n",
                false,
                complete(200, Framing::Length(5), true, Some("5")),
            ),
            (
                "two lengths",
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ncontent-length: 6\r\n\r\n",
                false,
                Seen::Invalid("invalid content-length"),
            ),
            (
                "a signed length",
                "HTTP/1.1 200 OK\r\ncontent-length: +5\r\n\r\n",
                false,
                Seen::Invalid("invalid content-length"),
            ),
            (
                "a list of lengths",
                "HTTP/1.1 200 OK\r\ncontent-length: 5, 5\r\n\r\n",
                false,
                Seen::Invalid("invalid content-length"),
            ),
            (
                "chunked wins over a length, which is dropped, and the connection is not reused",
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n",
                false,
                complete(200, chunked(), false, None),
            ),
            (
                "chunked",
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                false,
                complete(200, chunked(), true, None),
            ),
            (
                "chunked not last: until close",
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked, gzip\r\n\r\n",
                false,
                complete(200, Framing::UntilClose, false, None),
            ),
            (
                "no framing: until close",
                "HTTP/1.1 200 OK\r\n\r\n",
                false,
                complete(200, Framing::UntilClose, false, None),
            ),
            (
                "HEAD: no body whatever the length says",
                "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n",
                true,
                complete(200, Framing::Empty, true, Some("5")),
            ),
            (
                "204, its Content-Length dropped",
                "HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n",
                false,
                complete(204, Framing::Empty, true, None),
            ),
            (
                "304",
                "HTTP/1.1 304 Not Modified\r\ncontent-length: 9\r\n\r\n",
                false,
                complete(304, Framing::Empty, true, Some("9")),
            ),
            (
                "connection: close",
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n",
                false,
                complete(200, Framing::Length(1), false, Some("1")),
            ),
            (
                "HTTP/1.0 closes unless kept alive",
                "HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n",
                false,
                complete(200, Framing::Length(1), false, Some("1")),
            ),
            (
                "HTTP/1.0 kept alive",
                "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n",
                false,
                complete(200, Framing::Length(1), true, Some("1")),
            ),
            (
                "100 Continue",
                "HTTP/1.1 100 Continue\r\n\r\n",
                false,
                Seen::Interim(25),
            ),
            (
                "103 Early Hints",
                "HTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n",
                false,
                Seen::Interim(40),
            ),
            (
                "101 unasked",
                "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n",
                false,
                Seen::Invalid("switching protocols without an upgrade"),
            ),
            (
                "status 600",
                "HTTP/1.1 600 Odd\r\ncontent-length: 0\r\n\r\n",
                false,
                Seen::Invalid("status code outside 100-599"),
            ),
            (
                "a control byte in a value",
                "HTTP/1.1 200 OK\r\nx-a: a\x01b\r\ncontent-length: 0\r\n\r\n",
                false,
                Seen::Invalid("malformed response head"),
            ),
            (
                "a bare LF ends a header line, as on the HTTP/1.x path",
                "HTTP/1.1 200 OK\r\nx-a: a\nb: c\r\ncontent-length: 0\r\n\r\n",
                false,
                complete(200, Framing::Length(0), true, Some("0")),
            ),
            (
                "not yet whole",
                "HTTP/1.1 200 OK\r\ncontent-le",
                false,
                Seen::Partial,
            ),
            (
                "not HTTP",
                "SSH-2.0-OpenSSH\r\n\r\n",
                false,
                Seen::Invalid("malformed response head"),
            ),
        ];
        for (what, head, head_request, want) in cases {
            assert_eq!(seen(head, head_request), want, "{what}");
        }
    }

    fn body(client: ClientBody) -> RequestBody {
        super::super::idle::IdleBody::new(client, Duration::from_secs(5))
    }

    fn parts(method: Method, target: &str, headers: &[(&str, &str)]) -> http::request::Parts {
        let mut req = Request::builder().method(method).uri(target);
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.body(())
            .map(|r| r.into_parts().0)
            .expect("a valid request")
    }

    #[test]
    fn request_heads_say_how_the_body_follows() {
        let (_tx, pieces) = tokio::sync::mpsc::channel(1);
        let (_tx2, pieces2) = tokio::sync::mpsc::channel(1);
        let cases: Vec<(&str, http::request::Parts, RequestBody, &str, Upload)> = vec![
            (
                "GET without a body",
                parts(Method::GET, "/a?b", &[("host", "h"), ("x-a", "1")]),
                body(ClientBody::Empty),
                "GET /a?b HTTP/1.1\r\nhost: h\r\nx-a: 1\r\n\r\n",
                Upload::WithHead,
            ),
            (
                "POST without a body says so",
                parts(Method::POST, "/", &[("host", "h")]),
                body(ClientBody::Empty),
                "POST / HTTP/1.1\r\nhost: h\r\ncontent-length: 0\r\n\r\n",
                Upload::WithHead,
            ),
            (
                "a known length, the client's framing headers replaced",
                parts(
                    Method::PUT,
                    "/",
                    &[
                        ("host", "h"),
                        ("content-length", "3"),
                        ("transfer-encoding", "chunked"),
                    ],
                ),
                body(ClientBody::H1 {
                    pieces,
                    length: Some(3),
                    ended: false,
                }),
                "PUT / HTTP/1.1\r\nhost: h\r\ncontent-length: 3\r\n\r\n",
                Upload::Length,
            ),
            (
                "an unknown length is chunked",
                parts(Method::POST, "/", &[("host", "h")]),
                body(ClientBody::H1 {
                    pieces: pieces2,
                    length: None,
                    ended: false,
                }),
                "POST / HTTP/1.1\r\nhost: h\r\ntransfer-encoding: chunked\r\n\r\n",
                Upload::Chunked,
            ),
        ];
        for (what, parts, body, want_head, want_upload) in cases {
            let (head, upload) = request_head(&parts, &body);
            assert_eq!(String::from_utf8_lossy(&head), want_head, "{what}");
            assert_eq!(upload, want_upload, "{what}");
        }
    }

    /// A response body read off a real connection: what the client gets, and whether the
    /// connection went back to the pool.
    async fn read_body(
        framing: Framing,
        reusable: bool,
        sent: &'static [u8],
    ) -> (Result<Bytes, String>, usize) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.expect("accept");
            conn.write_all(sent).await.expect("write");
            conn.shutdown().await.ok();
            // Held open until the test is done reading.
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let streams = Arc::new(StreamPool::new(
            PoolLimits::new(&UpstreamKeepalive::default()),
            Arc::new(super::super::connect::Connectors::default()),
        ));
        let up = Upstream {
            stream: super::super::connect::UpstreamStream::Plain(stream),
            buf: bytes::BytesMut::new(),
            reused: false,
        };
        let key = PoolKey::Addr(addr);
        let body = UpstreamBody::new(
            up,
            framing,
            reusable,
            streams.clone(),
            key,
            Transport::Plain,
        );
        let got = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .map_err(|e| e.to_string());
        server.await.ok();
        (got, streams.idle_count())
    }

    #[tokio::test]
    async fn response_bodies_end_where_their_framing_says_and_only_then_are_reused() {
        let chunked = || Framing::Chunked(Chunked::default());
        let cases: Vec<(
            &str,
            Framing,
            bool,
            &'static [u8],
            Result<&[u8], &str>,
            usize,
        )> = vec![
            (
                "length",
                Framing::Length(5),
                true,
                b"hello",
                Ok(b"hello"),
                1,
            ),
            (
                "length, then bytes nobody asked for",
                Framing::Length(5),
                true,
                b"helloEXTRA",
                Ok(b"hello"),
                0,
            ),
            (
                "length cut short",
                Framing::Length(9),
                true,
                b"hello",
                Err("the upstream closed the connection before the response body ended"),
                0,
            ),
            (
                "chunked",
                chunked(),
                true,
                b"5\r\nhello\r\n1\r\n!\r\n0\r\n\r\n",
                Ok(b"hello!"),
                1,
            ),
            (
                "chunked with trailers",
                chunked(),
                true,
                b"5\r\nhello\r\n0\r\nx-t: 1\r\n\r\n",
                Ok(b"hello"),
                1,
            ),
            (
                "chunked, malformed size",
                chunked(),
                true,
                b"5x\r\nhello\r\n0\r\n\r\n",
                Err("malformed chunked response body"),
                0,
            ),
            (
                "chunked, not to be reused (it came with a length too)",
                chunked(),
                false,
                b"5\r\nhello\r\n0\r\n\r\n",
                Ok(b"hello"),
                0,
            ),
            (
                "until close",
                Framing::UntilClose,
                false,
                b"all of it",
                Ok(b"all of it"),
                0,
            ),
            ("empty", Framing::Empty, true, b"", Ok(b""), 1),
        ];
        for (what, framing, reusable, sent, want, idle) in cases {
            let (got, kept) = read_body(framing, reusable, sent).await;
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(&got[..], want, "{what}"),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{what}: {got}"),
                (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
            }
            assert_eq!(kept, idle, "{what}: connections back in the pool");
        }
    }

    #[tokio::test]
    async fn an_http1_body_ends_only_when_its_end_was_sent() {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut whole = ClientBody::H1 {
            pieces: rx,
            length: Some(1),
            ended: false,
        };
        let sender = tokio::spawn(async move {
            tx.send(Some(Bytes::from_static(b"a"))).await.ok();
            tx.send(None).await.ok();
        });
        let first = whole.frame().await.and_then(Result::ok);
        assert_eq!(
            first.and_then(|f| f.into_data().ok()),
            Some(Bytes::from_static(b"a"))
        );
        assert!(whole.frame().await.is_none());
        assert!(whole.is_end_stream());
        sender.await.ok();

        let (tx, rx) = tokio::sync::mpsc::channel(1);
        let mut cut = ClientBody::H1 {
            pieces: rx,
            length: None,
            ended: false,
        };
        tx.send(Some(Bytes::from_static(b"a"))).await.ok();
        drop(tx);
        assert!(matches!(cut.frame().await, Some(Ok(_))));
        assert!(
            matches!(cut.frame().await, Some(Err(_))),
            "a body whose sender went away without its end is an error, not an end"
        );
    }
}
