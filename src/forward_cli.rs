//! Forwarding's command line (SPEC §9): `inhook deliveries` reads a destination's
//! deliveries from the store; `inhook listen` is a local application for development
//! that verifies forwarded requests and prints one line each.

use std::path::Path;

use anyhow::Context;
use axum::http::{HeaderMap, StatusCode};

use crate::app::open_store;
use crate::clock;
use crate::config::Config;
use crate::domain::AggregateKey;
use crate::forward::queue::DeliveryStatus;
use crate::signature::{self, Scheme, Secret};
use crate::store::DeliveryFilter;

/// How far a forwarded request's `webhook-timestamp` may be from now, as the official
/// Standard Webhooks libraries allow.
const LISTEN_TOLERANCE_S: u64 = 300;

/// Arguments of `inhook deliveries`.
#[derive(Debug, clap::Args)]
pub struct DeliveriesArgs {
    /// The destination whose deliveries to list.
    #[arg(long)]
    pub destination: String,
    /// Only this status (pending, in_flight, retrying, delivered, dead, skipped).
    #[arg(long, value_parser = parse_delivery_status)]
    pub status: Option<DeliveryStatus>,
    /// Only this aggregate, in text form: a user id, or `player/slot`.
    #[arg(long, value_parser = crate::cli::parse_aggregate)]
    pub aggregate: Option<AggregateKey>,
    /// How many deliveries, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// Arguments of `inhook listen`.
#[derive(Debug, clap::Args)]
pub struct ListenArgs {
    /// The port to listen on, on 127.0.0.1 (0: any free port, printed first).
    #[arg(long, default_value_t = 8081)]
    pub port: u16,
    /// The destination's `secret` (`whsec_…`) the requests are signed with.
    #[arg(long, env = "INHOOK_LISTEN_SECRET", hide_env_values = true)]
    pub secret: String,
}

fn parse_delivery_status(raw: &str) -> Result<DeliveryStatus, String> {
    DeliveryStatus::ALL
        .iter()
        .copied()
        .find(|s| s.as_str() == raw)
        .ok_or_else(|| {
            let names: Vec<_> = DeliveryStatus::ALL.iter().map(|s| s.as_str()).collect();
            format!(
                "unknown status {raw:?}: expected one of {}",
                names.join(", ")
            )
        })
}

/// Prints a destination's deliveries, newest first.
pub async fn deliveries(config_path: Option<&Path>, args: DeliveriesArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path)?;
    let store = open_store(&config).await?;
    let filter = DeliveryFilter {
        status: args.status,
        aggregate: args.aggregate.as_ref().map(AggregateKey::storage_key),
    };
    let page = store
        .deliveries(
            &args.destination,
            &filter,
            args.limit.clamp(1, 10_000),
            None,
        )
        .await?;
    println!(
        "{:>8} {:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<10} {:>3} last_error",
        "id",
        "created_at",
        "source",
        "event_id",
        "event_type",
        "aggregate",
        "sequence",
        "status",
        "try"
    );
    for d in &page.items {
        println!(
            "{:>8} {:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<10} {:>3} {}",
            d.id,
            clock::rfc3339(d.created_at_ms),
            d.source,
            d.event_id,
            d.event_type,
            AggregateKey::text_of_stored(&d.aggregate),
            d.sequence,
            d.status.as_str(),
            d.attempts,
            d.last_error.as_deref().unwrap_or("")
        );
    }
    if page.next_cursor.is_some() {
        println!("(more: raise --limit or narrow the filter)");
    }
    Ok(())
}

/// Serves 127.0.0.1:`port` until interrupted: each request verified against `secret`
/// (401 when it does not verify) and printed as one line.
pub async fn listen(args: ListenArgs) -> anyhow::Result<()> {
    let secret = Secret::new(args.secret.as_str());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", args.port))?;
    println!("listening on http://{}", listener.local_addr()?);
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
        let secret = secret.clone();
        async move { received(&headers, &body, &secret) }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(crate::app::shutdown_signal())
        .await?;
    Ok(())
}

/// Verifies one forwarded request and prints it: `aggregate sequence type id`.
fn received(headers: &HeaderMap, body: &[u8], secret: &Secret) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    };
    let now_s = clock::now_ms() / 1000;
    let verdict = signature::verify(
        Scheme::StandardWebhooks,
        headers,
        body,
        std::slice::from_ref(secret),
        now_s,
        LISTEN_TOLERANCE_S,
    );
    if let Err(err) = verdict {
        eprintln!(
            "rejected {}: {err}",
            header("inhook-event-id")
                .chars()
                .take(200)
                .collect::<String>()
        );
        return StatusCode::UNAUTHORIZED;
    }
    println!(
        "aggregate={} sequence={} type={} id={}",
        header("inhook-aggregate"),
        header("inhook-sequence"),
        header("inhook-event-type"),
        header("inhook-event-id")
    );
    StatusCode::NO_CONTENT
}
