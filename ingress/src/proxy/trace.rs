//! Request tracing (`--otlp-endpoint`): W3C trace context in and out, and OpenTelemetry spans
//! for each request's phases. Off by default, and then nothing here runs: the proxy holds no
//! [`Tracing`] and every hook is behind that `Option`.
//!
//! ```text
//!   traceparent from the client (or none) ─ sampler (parent-based, or the ratio)
//!   "<METHOD>"  server span       request head read ─────────────────────── response ended
//!     "phases"   internal span     tls, route, access, rewrite, canary, upstream choice
//!     "upstream" client span       first attempt ───── response head; its context is the
//!                                  traceparent sent upstream (the client's is replaced)
//! ```
//!
//! Spans are built with the request's own timestamps and exported in batches by the runtime
//! (see `run.rs`), never on the request's path.
//!
//! A request without `traceparent` is sampled before anything is built: its trace id is drawn
//! and put to the sampler, and when the sampler drops it the request has no trace at all (no
//! span, no context, no `traceparent` upstream), which at a 1% ratio is 99 requests in 100.
//! When it is sampled, the span is built on that same id ([`PresetIds`]), so the SDK's sampler,
//! asked again, decides the same. A request with `traceparent` always takes the full path: its
//! context is propagated whether or not it is sampled.

use std::cell::Cell;
use std::net::IpAddr;
use std::time::{Duration, Instant, SystemTime};

use http::HeaderValue;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{
    Span as _, SpanId, SpanKind, Status, TraceContextExt, TraceId, Tracer as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    IdGenerator, RandomIdGenerator, Sampler, SamplingDecision, SdkTracer, ShouldSample, Span,
};

use super::access_log::Meter;
use super::connect::PoolKey;
use super::phase::RequestHeaders;
use crate::snapshot::Route;

/// The tracer requests are traced with; present only with `--otlp-endpoint`.
pub struct Tracing {
    tracer: SdkTracer,
    /// The tracer provider's sampler, asked first for requests that carry no context.
    sampler: Sampler,
    ids: RandomIdGenerator,
    propagator: TraceContextPropagator,
}

/// The tracer provider's id generator: random ids, except the trace id [`Tracing::start`] has
/// just drawn and sampled, which the next root span on this thread takes.
#[derive(Debug, Default)]
pub struct PresetIds {
    random: RandomIdGenerator,
}

thread_local! {
    static PRESET_TRACE_ID: Cell<Option<TraceId>> = const { Cell::new(None) };
}

impl IdGenerator for PresetIds {
    fn new_trace_id(&self) -> TraceId {
        PRESET_TRACE_ID
            .take()
            .unwrap_or_else(|| self.random.new_trace_id())
    }

    fn new_span_id(&self) -> SpanId {
        self.random.new_span_id()
    }
}

/// One request's spans while it is served.
pub(crate) struct RequestTrace {
    /// The server span, as the parent of the others.
    cx: Context,
    upstream: Option<Span>,
}

/// What the server span is told about the request when it starts.
pub(crate) struct Started<'a> {
    pub(crate) method: &'a str,
    pub(crate) target: &'a str,
    pub(crate) host: Option<&'a str>,
    pub(crate) protocol: &'static str,
    pub(crate) client: IpAddr,
    /// When the request's head was read.
    pub(crate) at: Instant,
}

impl Tracing {
    /// `tracer` must come from a provider with `sampler` and [`PresetIds`].
    pub fn new(tracer: SdkTracer, sampler: Sampler) -> Self {
        Self {
            tracer,
            sampler,
            ids: RandomIdGenerator::default(),
            propagator: TraceContextPropagator::new(),
        }
    }

    /// The server span of a request, continuing the client's trace when it sent one; nothing
    /// when the request carries no trace context and is not sampled.
    pub(crate) fn start(
        &self,
        s: &Started<'_>,
        headers: &dyn RequestHeaders,
    ) -> Option<RequestTrace> {
        if headers.header("traceparent").is_none() {
            let trace_id = self.ids.new_trace_id();
            let decision = self
                .sampler
                .should_sample(None, trace_id, "", &SpanKind::Server, &[], &[])
                .decision;
            if decision == SamplingDecision::Drop {
                return None;
            }
            PRESET_TRACE_ID.set(Some(trace_id));
        }
        let trace = self.start_span(s, headers);
        // Taken by the span's id generator; cleared in case the tracer made no root span.
        PRESET_TRACE_ID.set(None);
        Some(trace)
    }

    fn start_span(&self, s: &Started<'_>, headers: &dyn RequestHeaders) -> RequestTrace {
        let parent = self.propagator.extract(&HeaderSource(headers));
        let mut attributes = vec![
            KeyValue::new("http.request.method", s.method.to_string()),
            KeyValue::new("url.path", path_of(s.target).to_string()),
            KeyValue::new("network.protocol.version", s.protocol),
            KeyValue::new("client.address", s.client.to_string()),
        ];
        if let Some(host) = s.host {
            attributes.push(KeyValue::new("server.address", host.to_string()));
        }
        let span = self
            .tracer
            .span_builder(s.method.to_string())
            .with_kind(SpanKind::Server)
            .with_start_time(wall_clock(s.at))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        RequestTrace {
            cx: parent.with_span(span),
            upstream: None,
        }
    }

    /// The phases' span: from `at` to now, saying what they decided.
    pub(crate) fn phases(
        &self,
        trace: &RequestTrace,
        at: Instant,
        route: Option<&Route>,
        decision: &'static str,
    ) {
        // An unsampled request exports nothing: its child spans would be built for nothing.
        if !trace.sampled() {
            return;
        }
        let mut attributes = vec![KeyValue::new("ingress.decision", decision)];
        if let Some(route) = route {
            attributes.push(KeyValue::new("ingress.ingress", route.ingress.to_string()));
            attributes.push(KeyValue::new(
                "ingress.service",
                route.backend.service.to_string(),
            ));
            attributes.push(KeyValue::new("http.route", route.labels.path.to_string()));
        }
        let mut span = self
            .tracer
            .span_builder("phases")
            .with_kind(SpanKind::Internal)
            .with_start_time(wall_clock(at))
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &trace.cx);
        span.end();
    }

    /// Starts the upstream span and returns the headers that carry it upstream
    /// (`traceparent`, and `tracestate` when there is one).
    pub(crate) fn upstream(
        &self,
        trace: &mut RequestTrace,
        upstream: &PoolKey,
    ) -> Vec<(&'static str, HeaderValue)> {
        let mut headers = HeaderSink(Vec::with_capacity(2));
        if !trace.sampled() {
            // Nothing is recorded: the upstream is told the trace and the server span, with
            // the caller's decision not to sample, and no upstream span is made.
            self.propagator.inject_context(&trace.cx, &mut headers);
            return headers.0;
        }
        let span = self
            .tracer
            .span_builder("upstream")
            .with_kind(SpanKind::Client)
            .with_attributes([KeyValue::new("server.address", upstream.to_string())])
            .start_with_context(&self.tracer, &trace.cx);
        let cx = trace
            .cx
            .with_remote_span_context(span.span_context().clone());
        self.propagator.inject_context(&cx, &mut headers);
        trace.upstream = Some(span);
        headers.0
    }
}

impl RequestTrace {
    /// Whether this request's spans are recorded and exported.
    fn sampled(&self) -> bool {
        self.cx.span().span_context().is_sampled()
    }

    /// Ends the spans once the response has ended: the upstream one when its response head
    /// came (or when it was given up on), the server one now.
    pub(crate) fn finish(mut self, status: u16, meter: &Meter) {
        if let Some(mut span) = self.upstream.take() {
            match meter.upstream.as_ref() {
                Some(up) => {
                    let header = up.response.map_or(up.spent, |r| r.header);
                    if let Some(answered) = up.response {
                        span.set_attribute(KeyValue::new(
                            "http.response.status_code",
                            i64::from(answered.status),
                        ));
                    } else {
                        span.set_status(Status::error("no response from the upstream"));
                    }
                    span.set_attribute(KeyValue::new("server.address", up.addr.to_string()));
                    span.end_with_timestamp(wall_clock(up.started + header));
                }
                None => span.end(),
            }
        }
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        span.set_attribute(KeyValue::new(
            "http.response.body.size",
            i64::try_from(meter.body_bytes_sent).unwrap_or(i64::MAX),
        ));
        if meter.canary {
            span.set_attribute(KeyValue::new("ingress.canary", true));
        }
        if status >= 500 {
            span.set_status(Status::error(format!("answered {status}")));
        }
        span.end();
    }
}

/// The wall-clock time of `at`, an instant in the past (spans carry wall-clock times).
fn wall_clock(at: Instant) -> SystemTime {
    let ago = at.elapsed();
    SystemTime::now()
        .checked_sub(ago)
        .unwrap_or_else(|| SystemTime::now() - Duration::ZERO)
}

/// The path of a request target, without its query (which may carry secrets).
fn path_of(target: &str) -> &str {
    target.split_once('?').map_or(target, |(path, _)| path)
}

/// The request's headers, as the propagator reads them: only `traceparent` and `tracestate`,
/// which must be UTF-8 (anything else is no context, and a new trace starts).
struct HeaderSource<'a>(&'a dyn RequestHeaders);

impl Extractor for HeaderSource<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.header(key).and_then(|v| std::str::from_utf8(v).ok())
    }

    fn keys(&self) -> Vec<&str> {
        // The W3C propagator only asks for its two headers by name.
        Vec::new()
    }
}

/// What the propagator writes, as headers for the upstream request.
struct HeaderSink(Vec<(&'static str, HeaderValue)>);

impl Injector for HeaderSink {
    fn set(&mut self, key: &str, value: String) {
        let name = match key {
            "traceparent" => "traceparent",
            "tracestate" => "tracestate",
            _ => return,
        };
        if let Ok(value) = HeaderValue::from_str(&value) {
            self.0.push((name, value));
        }
    }
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;

    use super::*;

    fn tracing(sampler: Sampler) -> (SdkTracerProvider, Tracing) {
        let provider = SdkTracerProvider::builder()
            .with_sampler(sampler.clone())
            .with_id_generator(PresetIds::default())
            .build();
        let tracer = provider.tracer("test");
        (provider, Tracing::new(tracer, sampler))
    }

    fn started() -> Started<'static> {
        Started {
            method: "GET",
            target: "/",
            host: Some("a.example"),
            protocol: "1.1",
            client: IpAddr::from([127, 0, 0, 1]),
            at: Instant::now(),
        }
    }

    fn traceparent(flags: &str) -> http::HeaderMap {
        let mut headers = http::HeaderMap::new();
        let value = format!("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-{flags}");
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert("traceparent", value);
        }
        headers
    }

    #[test]
    fn an_unsampled_request_without_context_gets_no_trace_at_all() {
        let (_provider, tracing) = tracing(Sampler::ParentBased(Box::new(
            Sampler::TraceIdRatioBased(0.0),
        )));
        assert!(tracing.start(&started(), &http::HeaderMap::new()).is_none());
    }

    #[test]
    fn the_early_decision_is_the_sdks_decision() {
        for parent_based in [false, true] {
            let ratio = Sampler::TraceIdRatioBased(0.5);
            let sampler = if parent_based {
                Sampler::ParentBased(Box::new(ratio))
            } else {
                ratio
            };
            let (_provider, tracing) = tracing(sampler);
            let mut traced = 0;
            for _ in 0..400 {
                if let Some(trace) = tracing.start(&started(), &http::HeaderMap::new()) {
                    // Sampled early, so sampled by the SDK on the same trace id.
                    assert!(trace.sampled(), "parent-based {parent_based}");
                    traced += 1;
                }
            }
            assert!((120..=280).contains(&traced), "{traced} of 400 at 0.5");
        }
    }

    #[test]
    fn a_request_with_context_is_always_propagated() {
        let (_provider, tracing) = tracing(Sampler::ParentBased(Box::new(
            Sampler::TraceIdRatioBased(0.0),
        )));
        for (flags, sampled) in [("00", false), ("01", true)] {
            let mut trace = tracing
                .start(&started(), &traceparent(flags))
                .unwrap_or_else(|| panic!("flags {flags}: no trace"));
            assert_eq!(trace.sampled(), sampled, "flags {flags}");
            let sent = tracing.upstream(&mut trace, &PoolKey::Addr(([127, 0, 0, 1], 80).into()));
            let value = sent
                .iter()
                .find(|(name, _)| *name == "traceparent")
                .map(|(_, v)| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_else(|| panic!("flags {flags}: no traceparent upstream"));
            assert!(
                value.starts_with("00-4bf92f3577b34da6a3ce929d0e0e4736-"),
                "{value}"
            );
            assert!(value.ends_with(&format!("-{flags}")), "{value}");
            trace.finish(200, &Meter::default());
        }
    }

    #[test]
    fn the_path_never_carries_the_query() {
        for (target, path) in [
            ("/a/b?token=secret", "/a/b"),
            ("/", "/"),
            ("/x?", "/x"),
            ("*", "*"),
        ] {
            assert_eq!(path_of(target), path);
        }
    }
}
