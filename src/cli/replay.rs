//! `inhook replay` (docs/api.md, command line): requeue one event, or create a bulk replay job.

use std::path::PathBuf;

use anyhow::bail;

use super::{parse_aggregate, parse_status};
use inhook::config::Config;
use inhook::domain::clock;
use inhook::domain::search::{TypePattern, Where};
use inhook::domain::{AggregateKey, EventStatus};
use inhook::http::api::search::resolve;
use inhook::runtime::app::open_existing_store;
use inhook::store::{EventFilter, ReplayOutcome};

/// Arguments of `inhook replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Replay this one event (needs --source).
    #[arg(long, requires = "source")]
    pub event_id: Option<String>,
    /// Which events to replay in bulk: dead (default) or retrying.
    #[arg(long, value_parser = parse_status, default_value = "dead")]
    pub status: EventStatus,
    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this aggregate, in text form: a user id, or `player/slot`, with `%`
    /// and `/` inside an id written `%25` and `%2F`.
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: Option<AggregateKey>,
    /// Only events of this type, or of every type a `prefix*` pattern starts (`invoice.*`).
    #[arg(long = "type", value_parser = TypePattern::parse)]
    pub event_type: Option<TypePattern>,
    /// `/pointer=value`, repeatable: only events whose body holds the value at a pointer of
    /// the source's `search_fields` (docs/api.md, search).
    #[arg(long = "where", value_parser = Where::parse)]
    pub wheres: Vec<Where>,
}

/// Runs `inhook replay`.
pub async fn replay(config_path: Option<PathBuf>, args: ReplayArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let store = open_existing_store(&config).await?;
    let now_ms = clock::now_ms();
    if let (Some(event_id), Some(source)) = (&args.event_id, &args.source) {
        match store.replay_event(source, event_id, now_ms).await? {
            ReplayOutcome::NotFound => bail!("no event {event_id} in source {source}"),
            ReplayOutcome::Requeued => println!("requeued {source}/{event_id}"),
            ReplayOutcome::Unchanged(status) => {
                println!("unchanged: {source}/{event_id} is {}", status.as_str())
            }
        }
        return Ok(());
    }
    if !matches!(args.status, EventStatus::Dead | EventStatus::Retrying) {
        bail!("only dead or retrying events can be replayed");
    }
    let (search, _) = resolve(
        &config,
        store.as_ref(),
        args.source.as_deref(),
        args.wheres,
        false,
    )
    .map_err(anyhow::Error::msg)?;
    let filter = EventFilter {
        source: args.source,
        status: Some(args.status),
        aggregate: args.aggregate.as_ref().map(AggregateKey::storage_key),
        event_type: args.event_type,
        search,
        ..EventFilter::default()
    };
    let job = store.create_replay_job(&filter, now_ms).await?;
    println!(
        "replay job {} created for {} events; a running `inhook serve` on this database carries it out",
        job.id, job.total
    );
    Ok(())
}
