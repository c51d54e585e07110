//! `inhook reset` (docs/api.md, docs/contract.md, a publisher's bad version): deletes one
//! aggregate's state and highest received sequence, so that its next event applies,
//! keeping its events; works on the store directly, safe while servers serve it.

use std::path::PathBuf;

use anyhow::bail;

use super::keys::audit;
use super::parse_aggregate;
use inhook::config::Config;
use inhook::domain::AggregateKey;
use inhook::runtime::app::open_existing_store;

/// Arguments of `inhook reset`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    /// The source.
    #[arg(long)]
    pub source: String,
    /// The aggregate, in text form: a user id, or `player/slot`, with `%` and `/` inside
    /// an id written `%25` and `%2F`.
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: AggregateKey,
}

/// Runs `inhook reset`: resets one aggregate and says what was reset.
pub async fn reset(config_path: Option<PathBuf>, args: ResetArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    if config.source(&args.source).is_none() {
        bail!(
            "unknown source {}: no source of that name is configured",
            args.source
        );
    }
    let store = open_existing_store(&config).await?;
    let report = store
        .reset_aggregate(&args.source, &args.aggregate.storage_key())
        .await?;
    if !report.found() {
        bail!(
            "nothing is stored for aggregate {} of source {}",
            args.aggregate,
            args.source
        );
    }
    let shown = |n: Option<i64>| n.map_or_else(|| "none".to_owned(), |n| n.to_string());
    audit(
        "aggregate reset on request",
        &args.source,
        &args.aggregate,
        &format!(
            "sequence={} highest_received={}",
            shown(report.sequence),
            shown(report.highest_received)
        ),
    );
    let state = if report.state_deleted {
        format!("state deleted (sequence {})", shown(report.sequence))
    } else {
        "no state".to_owned()
    };
    println!(
        "reset {}/{}: {state}, highest received sequence {} forgotten; its next event applies \
         as a new aggregate's first, and its events stay in the log",
        args.source,
        args.aggregate,
        shown(report.highest_received),
    );
    Ok(())
}
