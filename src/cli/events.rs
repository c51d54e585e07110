//! `inhook events` (docs/api.md, command line): the event log, newest first.

use std::path::PathBuf;

use super::{parse_aggregate, parse_status};
use crate::app::open_existing_store;
use crate::clock;
use crate::config::Config;
use crate::domain::{AggregateKey, EventStatus};
use crate::store::EventFilter;

/// Arguments of `inhook events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Only this status (received, processed, ignored_stale, ignored_unsupported, held, retrying,
    /// dead, erased).
    #[arg(long, value_parser = parse_status)]
    pub status: Option<EventStatus>,
    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this aggregate, in text form: a user id, or `player/slot`, with `%`
    /// and `/` inside an id written `%25` and `%2F`.
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: Option<AggregateKey>,
    /// How many events, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// Runs `inhook events`.
pub async fn events(config_path: Option<PathBuf>, args: EventsArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let store = open_existing_store(&config).await?;
    let filter = EventFilter {
        source: args.source,
        status: args.status,
        aggregate: args.aggregate.as_ref().map(AggregateKey::storage_key),
        ..EventFilter::default()
    };
    let page = store
        .events(&filter, args.limit.clamp(1, 10_000), None)
        .await?;
    println!(
        "{:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<20} {:>3} reason",
        "received_at", "source", "event_id", "event_type", "aggregate", "sequence", "status", "try"
    );
    for e in &page.items {
        println!(
            "{:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<20} {:>3} {}",
            clock::rfc3339_fixed(e.received_at_ms),
            e.source,
            e.event_id,
            e.event_type,
            AggregateKey::text_of_stored(&e.aggregate),
            e.sequence,
            e.status.as_str(),
            e.attempts,
            e.dead_reason.map(|r| r.as_str()).unwrap_or("")
        );
    }
    if page.next_cursor.is_some() {
        println!("(more: raise --limit or narrow the filter)");
    }
    Ok(())
}
