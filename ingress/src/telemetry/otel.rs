//! The OpenTelemetry pipeline behind `--otlp-endpoint`: a tracer provider whose spans are
//! batched and sent over OTLP/HTTP (protobuf) by a task on the proxy's runtime, sampled
//! parent-based or by ratio. The proxy's side (what is traced) is `proxy::trace`.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};

use crate::proxy::trace::{PresetIds, Tracing};

/// What `--otlp-endpoint` and the `--otel-*` flags ask for.
#[derive(Clone, Debug)]
pub struct OtelSettings {
    /// Where spans are POSTed, e.g. `http://otel-collector:4318/v1/traces`.
    pub endpoint: String,
    pub service_name: String,
    /// The share of new traces sampled, 0.0 to 1.0.
    pub ratio: f64,
    /// Follow the caller's decision when the request carries a trace context.
    pub parent_based: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("--otlp-endpoint {endpoint}: {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// The provider (keep it: dropping the last handle flushes and stops the exporter) and the
/// tracing requests are traced with. Must be called on the Tokio runtime.
pub fn start(settings: &OtelSettings) -> Result<(SdkTracerProvider, Tracing), OtelError> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|source| OtelError::Exporter {
            endpoint: settings.endpoint.clone(),
            source,
        })?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let ratio = Sampler::TraceIdRatioBased(settings.ratio);
    let sampler = if settings.parent_based {
        Sampler::ParentBased(Box::new(ratio))
    } else {
        ratio
    };
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_sampler(sampler.clone())
        .with_id_generator(PresetIds::default())
        .with_resource(
            Resource::builder()
                .with_service_name(settings.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("ingress");
    Ok((provider, Tracing::new(tracer, sampler)))
}
