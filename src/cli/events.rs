//! `inhook events` (docs/api.md, command line): the event log, newest first.

use std::path::PathBuf;

use super::{parse_aggregate, parse_status};
use inhook::config::Config;
use inhook::domain::clock;
use inhook::domain::search::{TypePattern, Where};
use inhook::domain::{AggregateKey, EventStatus};
use inhook::http::api::search::{resolve, scan_page, SCAN_LIMIT};
use inhook::runtime::app::open_existing_store;
use inhook::store::EventFilter;

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
    /// Only the event of this id.
    #[arg(long)]
    pub event_id: Option<String>,
    /// Only events of this type, or of every type a `prefix*` pattern starts (`invoice.*`).
    #[arg(long = "type", value_parser = TypePattern::parse)]
    pub event_type: Option<TypePattern>,
    /// `/pointer=value`, repeatable: only events whose body holds the value at the JSON
    /// pointer (docs/api.md, search): looked up in the index for a source's `search_fields`,
    /// else scanned (at most 10,000 events) on a store without encryption at rest.
    #[arg(long = "where", value_parser = Where::parse)]
    pub wheres: Vec<Where>,
    /// How many events, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// Runs `inhook events`.
pub async fn events(config_path: Option<PathBuf>, args: EventsArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let store = open_existing_store(&config).await?;
    let (search, scans) = resolve(
        &config,
        store.as_ref(),
        args.source.as_deref(),
        args.wheres,
        true,
    )
    .map_err(anyhow::Error::msg)?;
    let filter = EventFilter {
        source: args.source,
        status: args.status,
        aggregate: args.aggregate.as_ref().map(AggregateKey::storage_key),
        event_id: args.event_id,
        event_type: args.event_type,
        search,
        ..EventFilter::default()
    };
    let limit = args.limit.clamp(1, 10_000);
    let (items, more, scan) = if scans.is_empty() {
        let page = store.events(&filter, limit, None).await?;
        (page.items, page.next_cursor.is_some(), None)
    } else {
        let (items, next, scan) =
            scan_page(store.as_ref(), &filter, &scans, limit, None, SCAN_LIMIT).await?;
        (items, next.is_some(), Some(scan))
    };
    println!(
        "{:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<20} {:>3} reason",
        "received_at", "source", "event_id", "event_type", "aggregate", "sequence", "status", "try"
    );
    for e in &items {
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
    if let Some(scan) = scan.filter(|s| s.stopped) {
        println!(
            "(scan stopped after {} events: search a field in the source's search_fields, or narrow the filter)",
            scan.scanned
        );
    } else if more {
        println!("(more: raise --limit or narrow the filter)");
    }
    Ok(())
}
