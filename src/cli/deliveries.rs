//! `inhook deliveries` (docs/forwarding.md): a destination's deliveries from the store.

use std::path::Path;

use inhook::config::Config;
use inhook::domain::clock;
use inhook::domain::AggregateKey;
use inhook::forward::queue::DeliveryStatus;
use inhook::runtime::app::open_existing_store;
use inhook::store::DeliveryFilter;

use super::UnknownValue;

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
    #[arg(long, value_parser = super::parse_aggregate)]
    pub aggregate: Option<AggregateKey>,
    /// How many deliveries, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

fn parse_delivery_status(raw: &str) -> Result<DeliveryStatus, UnknownValue> {
    DeliveryStatus::ALL
        .iter()
        .copied()
        .find(|s| s.as_str() == raw)
        .ok_or_else(|| {
            let names = DeliveryStatus::ALL.iter().map(|s| s.as_str());
            UnknownValue::new("status", raw, names)
        })
}

/// Prints a destination's deliveries, newest first.
pub async fn deliveries(config_path: Option<&Path>, args: DeliveriesArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path)?;
    let store = open_existing_store(&config).await?;
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
            clock::rfc3339_fixed(d.created_at_ms),
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
