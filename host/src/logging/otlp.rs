//! Exporting spans over OTLP/HTTP (`[traces] otlp_endpoint`): the
//! handler-call and GetRecords spans of [`crate::telemetry::spans`] go to
//! an OpenTelemetry collector through `tracing-opentelemetry` and
//! `opentelemetry-otlp` (protobuf over HTTP, a batch exporter on its own
//! thread with a blocking client), whatever the log filter says about them
//! (the log keeps them off by default; the exporter takes every span of
//! [`crate::telemetry::spans::TARGET`] at `info`).
//!
//! Spans are exported in batches in the background; a collector that is
//! down costs dropped spans (the exporter's queue is bounded), never a
//! stalled pipeline. At exit the provider is shut down, which exports what
//! is queued.

use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::Targets;

use crate::config::TracesConfig;
use crate::telemetry::spans::TARGET;

/// Longest an export request may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The tracer provider exporting to `config`'s collector. Call outside any
/// async runtime (the exporter's blocking HTTP client is made here).
///
/// # Errors
/// When the exporter cannot be built (e.g. an unusable endpoint).
pub(super) fn provider(config: &TracesConfig) -> anyhow::Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(config.traces_url.as_str())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| anyhow::anyhow!("traces.otlp_endpoint {}: {e}", config.traces_url))?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
                .build(),
        )
        .build())
}

/// The layer that hands the spans of [`TARGET`] to `provider`.
pub(super) fn layer<S>(provider: &SdkTracerProvider) -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a> + Send + Sync,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("shardlane"))
        .with_filter(Targets::new().with_target(TARGET, Level::INFO))
}

/// Exports what is queued and stops the exporter.
pub(super) fn shutdown(provider: SdkTracerProvider) {
    if let Err(e) = provider.shutdown() {
        eprintln!("shardlane: traces not all exported at exit: {e}");
    }
}
