//! Log and trace output: `tracing` lines on stderr (text or JSON), and, when
//! `otlp_endpoint` is set, the same spans exported over OTLP/HTTP (off by default).
//!
//! Log lines carry their own fields only, never their spans': the span fields
//! repeated in every line doubled its size, and formatting them cost every request an
//! allocation even when no line was written. Without an exporter no span is even built.

use std::io::IsTerminal;

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::subscriber::Interest;
use tracing::Metadata;
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::{self, Filter, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Keeps the OTLP exporter alive; dropping it flushes the spans not yet sent.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.shutdown();
        }
    }
}

/// The level filter of `INHOOK_LOG` (default `info`); each layer has its own.
fn level() -> EnvFilter {
    EnvFilter::try_from_env("INHOOK_LOG").unwrap_or_else(|_| EnvFilter::new("info"))
}

/// Lets through everything but spans: the line writer never sees a span.
struct NoSpans;

impl<S> Filter<S> for NoSpans {
    fn enabled(&self, metadata: &Metadata<'_>, _: &layer::Context<'_, S>) -> bool {
        !metadata.is_span()
    }

    fn callsite_enabled(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.is_span() {
            Interest::never()
        } else {
            Interest::always()
        }
    }
}

/// Installs the global subscriber: level from `INHOOK_LOG` (default `info`).
pub fn init(json: bool, otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let lines = if json {
        lines.json().boxed()
    } else {
        lines.boxed()
    };
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> =
        vec![lines.with_filter(level().and(NoSpans)).boxed()];
    let provider = otlp_endpoint
        .map(|endpoint| {
            let exporter = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary)
                .with_endpoint(endpoint)
                .build()
                .context("building the OTLP exporter")?;
            anyhow::Ok(
                SdkTracerProvider::builder()
                    .with_batch_exporter(exporter)
                    .with_resource(
                        opentelemetry_sdk::Resource::builder()
                            .with_service_name("inhook")
                            .build(),
                    )
                    .build(),
            )
        })
        .transpose()?;
    // Only with an exporter: a layer that is absent lets no span be built at all.
    if let Some(p) = &provider {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(p.tracer("inhook"))
                .with_filter(level())
                .boxed(),
        );
    }
    tracing_subscriber::registry().with(layers).init();
    Ok(Telemetry { provider })
}
