//! Log and trace output: `tracing` lines on stderr (text or JSON), and, when
//! `otlp_endpoint` is set, the same spans exported over OTLP/HTTP (off by default).

use std::io::IsTerminal;

use anyhow::Context;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

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

/// Installs the global subscriber: level from `INHOOK_LOG` (default `info`).
pub fn init(json: bool, otlp_endpoint: Option<&str>) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_from_env("INHOOK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let lines = if json {
        lines.json().boxed()
    } else {
        lines.boxed()
    };
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
    let traces = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer("inhook")));
    tracing_subscriber::registry()
        .with(filter)
        .with(lines)
        .with(traces)
        .init();
    Ok(Telemetry { provider })
}
