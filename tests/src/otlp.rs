//! An OTLP/HTTP receiver for the tracing tests: it accepts `POST /v1/traces` (protobuf, as the
//! proxy's exporter sends it), decodes each export with the OpenTelemetry protocol's own types,
//! and keeps the spans for the test to read.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;

use crate::accept_loop::AcceptLoop;

/// One received span, as the tests compare them.
#[derive(Clone, Debug)]
pub struct ReceivedSpan {
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    pub name: String,
    /// OTLP's `SpanKind`: 2 server, 3 client, 1 internal.
    pub kind: i32,
    pub service: String,
    /// String and integer attributes, as `key=value`.
    pub attributes: Vec<String>,
}

/// A running receiver. Stops when dropped.
pub struct OtlpReceiver {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<ReceivedSpan>>>,
    _server: AcceptLoop,
}

impl OtlpReceiver {
    pub fn start() -> OtlpReceiver {
        let listener = crate::ports::listen_loopback();
        let addr = listener.local_addr().expect("addr");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let kept = spans.clone();
        let server = AcceptLoop::start(listener, move |stream| {
            let kept = kept.clone();
            async move {
                let service = service_fn(move |req| receive(req, kept.clone()));
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            }
        });
        OtlpReceiver {
            addr,
            spans,
            _server: server,
        }
    }

    /// The URL to give `--otlp-endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://{}/v1/traces", self.addr)
    }

    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The spans of `trace_id` once `count` of them have arrived, waiting up to `timeout`.
    pub fn wait_for(&self, trace_id: &str, count: usize, timeout: Duration) -> Vec<ReceivedSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            let found: Vec<ReceivedSpan> = self
                .spans()
                .into_iter()
                .filter(|s| s.trace_id == trace_id)
                .collect();
            if found.len() >= count || Instant::now() >= deadline {
                return found;
            }
            // A test helper, not async code: nothing to block.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

async fn receive(
    req: Request<Incoming>,
    kept: Arc<Mutex<Vec<ReceivedSpan>>>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let status = if req.uri().path() != "/v1/traces" {
        StatusCode::NOT_FOUND
    } else {
        match req.into_body().collect().await {
            Ok(body) => match ExportTraceServiceRequest::decode(body.to_bytes()) {
                Ok(export) => {
                    let spans = flatten(export);
                    if let Ok(mut all) = kept.lock() {
                        all.extend(spans);
                    }
                    StatusCode::OK
                }
                Err(_) => StatusCode::BAD_REQUEST,
            },
            Err(_) => StatusCode::BAD_REQUEST,
        }
    };
    let mut response = Response::new(Full::new(Bytes::new()));
    *response.status_mut() = status;
    Ok(response)
}

fn flatten(export: ExportTraceServiceRequest) -> Vec<ReceivedSpan> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let text = |v: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>| match v
        .as_ref()
        .and_then(|v| v.value.as_ref())
    {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        other => format!("{other:?}"),
    };
    let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let mut out = Vec::new();
    for resource in export.resource_spans {
        let service = resource
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for scope in resource.scope_spans {
            for span in scope.spans {
                out.push(ReceivedSpan {
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    service: service.clone(),
                    attributes: span
                        .attributes
                        .iter()
                        .map(|a| format!("{}={}", a.key, text(&a.value)))
                        .collect(),
                });
            }
        }
    }
    out
}
