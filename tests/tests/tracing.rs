//! Request tracing (`--otlp-endpoint`) through the real binary, with a real OTLP/HTTP receiver
//! decoding what it exports: over HTTP/1.1 and h2c, a request that carries a sampled
//! `traceparent` continues that trace (server span under the caller's span, "phases" and
//! "upstream" under the server span) and the upstream is sent the upstream span's context; one
//! without starts a new trace; an unsampled caller is followed (nothing exported, the context
//! still passed on); one without that is not sampled is not traced (no span, no traceparent
//! upstream); and with tracing off the client's `traceparent` reaches the upstream
//! untouched.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ingress_tests::curl::{self, VERSIONS};
use ingress_tests::manifests::{annotated_ingress, service};
use ingress_tests::otlp::{OtlpReceiver, ReceivedSpan};
use ingress_tests::process::Ingress;
use ingress_tests::scratch::Scratch;
use ingress_tests::upstream::Backend;

const WAIT: Duration = Duration::from_secs(15);

fn site(web: &Backend) -> Scratch {
    let dir = Scratch::new("tracing");
    dir.write(
        "all.yaml",
        &[
            service("shop", "web", &[web]),
            annotated_ingress(
                "shop",
                "front",
                1,
                &[],
                &[("trace.test", "/", "Prefix", "web")],
            ),
        ]
        .concat(),
    );
    dir
}

fn traced(dir: &Scratch, receiver: &OtlpReceiver) -> Ingress {
    traced_at(dir, receiver, "1")
}

fn traced_at(dir: &Scratch, receiver: &OtlpReceiver, ratio: &str) -> Ingress {
    Ingress::builder()
        .manifests(dir.path())
        .args([
            "--otlp-endpoint",
            &receiver.endpoint(),
            "--otel-sampler-ratio",
            ratio,
            "--otel-service-name",
            "edge",
        ])
        // Export every 100 ms rather than every 5 s, so the test does not wait.
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .start()
}

/// The traceparent the backend was sent, split: (trace id, parent id, flags).
fn sent_upstream(reply: &curl::Reply) -> (String, String, String) {
    let echo = reply.echo().expect("the backend answered");
    let value = echo
        .headers
        .get("traceparent")
        .unwrap_or_else(|| panic!("no traceparent upstream: {:?}", echo.headers));
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    assert_eq!(parts[0], "00", "{value}");
    (parts[1].into(), parts[2].into(), parts[3].into())
}

/// Sends a request carrying the caller's `traceparent` (`00-{trace}-{parent}-{flags}`) and
/// returns the trace id and flags the upstream was sent.
fn carried(ingress: &Ingress, version: &str, traceparent: &str) -> (String, String) {
    let header = format!("traceparent: {traceparent}");
    let reply = curl::get(ingress, "trace.test", "/", version, &["-H", &header]);
    let (trace, _, flags) = sent_upstream(&reply);
    (trace, flags)
}

fn one<'a>(spans: &'a [ReceivedSpan], name: &str) -> &'a ReceivedSpan {
    let found: Vec<&ReceivedSpan> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "{name} in {spans:#?}");
    found[0]
}

#[test]
fn a_sampled_callers_trace_is_continued_with_a_span_per_phase() {
    let web = Backend::start("web");
    let receiver = OtlpReceiver::start();
    let dir = site(&web);
    let ingress = traced(&dir, &receiver);
    for (n, version) in VERSIONS.into_iter().enumerate() {
        let trace_id = format!("4bf92f3577b34da6a3ce929d0e0e47{n:02}");
        let caller = "00f067aa0ba902b7";
        let reply = curl::get(
            &ingress,
            "trace.test",
            "/items?secret=1",
            version,
            &["-H", &format!("traceparent: 00-{trace_id}-{caller}-01")],
        );
        assert_eq!(reply.status, 200, "{version}");
        let (sent_trace, sent_parent, flags) = sent_upstream(&reply);
        assert_eq!(sent_trace, trace_id, "{version}");
        assert_eq!(flags, "01", "{version}");
        assert_ne!(
            sent_parent, caller,
            "{version}: the client's span id was passed on"
        );

        let spans = receiver.wait_for(&trace_id, 3, WAIT);
        let server = one(&spans, "GET");
        let phases = one(&spans, "phases");
        let upstream = one(&spans, "upstream");
        assert_eq!(server.parent_span_id, caller, "{version} {server:?}");
        assert_eq!(server.kind, 2, "server span {server:?}");
        assert_eq!(server.service, "edge");
        assert_eq!(phases.parent_span_id, server.span_id, "{phases:?}");
        assert_eq!(upstream.parent_span_id, server.span_id, "{upstream:?}");
        assert_eq!(upstream.kind, 3, "client span {upstream:?}");
        // What the upstream was told is the upstream span.
        assert_eq!(upstream.span_id, sent_parent, "{version}");
        for attribute in [
            "http.request.method=GET",
            "url.path=/items",
            "http.response.status_code=200",
            "server.address=trace.test",
        ] {
            assert!(
                server.attributes.iter().any(|a| a == attribute),
                "{attribute} in {server:?}"
            );
        }
        assert!(
            !server.attributes.iter().any(|a| a.contains("secret")),
            "the query is not recorded: {server:?}"
        );
        assert!(
            phases
                .attributes
                .iter()
                .any(|a| a == "ingress.decision=forward"),
            "{phases:?}"
        );
        assert!(
            upstream
                .attributes
                .iter()
                .any(|a| a == &format!("server.address={}", web.addr)),
            "{upstream:?}"
        );
    }
}

#[test]
fn a_request_without_context_starts_a_trace_and_an_unsampled_caller_is_followed() {
    let web = Backend::start("web");
    let receiver = OtlpReceiver::start();
    let dir = site(&web);
    let ingress = traced(&dir, &receiver);
    for version in VERSIONS {
        let reply = curl::get(&ingress, "trace.test", "/", version, &[]);
        let (trace_id, parent, flags) = sent_upstream(&reply);
        assert_eq!(flags, "01", "ratio 1 samples every new trace");
        let spans = receiver.wait_for(&trace_id, 3, WAIT);
        let server = one(&spans, "GET");
        assert!(server.parent_span_id.is_empty(), "a root span: {server:?}");
        assert_eq!(one(&spans, "upstream").span_id, parent);

        // The caller decided not to sample: its decision is kept and passed on, nothing is
        // exported for that trace.
        let unsampled = "0af7651916cd43dd8448eb211c80319c";
        let (sent_trace, flags) = carried(
            &ingress,
            version,
            &format!("00-{unsampled}-b7ad6b7169203331-00"),
        );
        assert_eq!((sent_trace.as_str(), flags.as_str()), (unsampled, "00"));
    }
    // Long enough for any export of the unsampled trace to have arrived (a plain test: no
    // runtime to block).
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(Duration::from_millis(1500));
    let unsampled: Vec<ReceivedSpan> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == "0af7651916cd43dd8448eb211c80319c")
        .collect();
    assert!(unsampled.is_empty(), "{unsampled:#?}");
}

#[test]
fn an_unsampled_request_without_context_is_not_traced_at_all() {
    let web = Backend::start("web");
    let receiver = OtlpReceiver::start();
    let dir = site(&web);
    let ingress = traced_at(&dir, &receiver, "0");
    for version in VERSIONS {
        // No context and not sampled: no span, and no traceparent made up for the upstream.
        let reply = curl::get(&ingress, "trace.test", "/", version, &[]);
        let echo = reply.echo().expect("the backend answered");
        assert_eq!(echo.headers.get("traceparent"), None, "{version}");
        // A caller's context is still carried on, with its decision.
        let sampled = "4bf92f3577b34da6a3ce929d0e0e4736";
        let (sent_trace, flags) = carried(
            &ingress,
            version,
            &format!("00-{sampled}-00f067aa0ba902b7-01"),
        );
        assert_eq!((sent_trace.as_str(), flags.as_str()), (sampled, "01"));
        receiver.wait_for(sampled, 3, WAIT);
    }
    // Long enough for any export of an unsampled request to have arrived.
    #[allow(clippy::disallowed_methods)]
    std::thread::sleep(Duration::from_millis(1500));
    let others: Vec<ReceivedSpan> = receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id != "4bf92f3577b34da6a3ce929d0e0e4736")
        .collect();
    assert!(others.is_empty(), "{others:#?}");
}

#[test]
fn without_an_endpoint_traceparent_passes_through_untouched() {
    let web = Backend::start("web");
    let dir = site(&web);
    let ingress = Ingress::start(dir.path());
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    for version in VERSIONS {
        let reply = curl::get(
            &ingress,
            "trace.test",
            "/",
            version,
            &["-H", &format!("traceparent: {traceparent}")],
        );
        let echo = reply.echo().unwrap();
        assert_eq!(
            echo.headers.get("traceparent").map(String::as_str),
            Some(traceparent),
            "{version}"
        );
    }
}
