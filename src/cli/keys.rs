//! `inhook rekey` and `inhook forget` (docs/encryption.md): move every data key under the
//! first master key, seal rows written before encryption was on, and erase an aggregate
//! on request. Each works on the store directly, safe while servers serve it.

use std::path::PathBuf;

use anyhow::{bail, Context};

use super::parse_aggregate;
use inhook::config::Config;
use inhook::domain::clock;
use inhook::domain::AggregateKey;
use inhook::runtime::app::open_existing_store;
use inhook::store::backend::Scrub;
use inhook::store::erasure::KeyStep;
use inhook::store::{Store, StoreError};

/// Rows or keys rewritten per transaction: short transactions, so servers on the same
/// store wait for none of them long.
const STEP: usize = 200;

/// Arguments of `inhook rekey`.
#[derive(Debug, clap::Args)]
pub struct RekeyArgs {
    /// Also seal every row written before encryption was turned on (and leave no
    /// plaintext in SQLite's files).
    #[arg(long)]
    pub encrypt_existing: bool,
}

/// Arguments of `inhook forget`.
#[derive(Debug, clap::Args)]
pub struct ForgetArgs {
    /// The source.
    #[arg(long)]
    pub source: String,
    /// The aggregate, in text form: a user id, or `player/slot`, with `%` and `/` inside
    /// an id written `%25` and `%2F`.
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: AggregateKey,
}

/// Runs `inhook rekey`: rewraps every data key under the first master key, then (with
/// `--encrypt-existing`) seals the plaintext rows. Killed, it resumes where it stopped.
pub async fn rekey(config_path: Option<PathBuf>, args: RekeyArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let Some(masters) = &config.store.encryption else {
        bail!(
            "encryption is not configured: set [encryption] keys or INHOOK_ENCRYPTION_KEYS \
             (docs/encryption.md)"
        );
    };
    let first = masters.first().id().clone();
    let store = open_existing_store(&config).await?;
    rewrap_all(store.as_ref(), first.as_str()).await?;
    if args.encrypt_existing {
        encrypt_all(store.as_ref()).await?;
    }
    Ok(())
}

async fn rewrap_all(store: &dyn Store, first: &str) -> anyhow::Result<()> {
    let total = store.rekey_left().await?;
    println!("rekey: {total} data keys to rewrap under {first}");
    steps("rekey", |after| store.rekey_step(after, STEP)).await?;
    let left = store.rekey_left().await?;
    if left > 0 {
        bail!("rekey: {left} data keys are still wrapped under other keys: run it again");
    }
    // The keys' versions wrapped under the older master keys leave the database's files
    // too (SQLite: the write-ahead log; PostgreSQL: the key tables' dead rows).
    store.scrub(Scrub::Rekey).await.context(
        "rekey: scrubbing the keys' old versions from the database's files (run it again)",
    )?;
    println!("rekey: done; every data key is wrapped under {first}: the older keys can be dropped");
    Ok(())
}

async fn encrypt_all(store: &dyn Store) -> anyhow::Result<()> {
    let total = store.plaintext_left().await?;
    println!("encrypt-existing: {total} events stored in plaintext");
    steps("encrypt-existing", |after| store.encrypt_step(after, STEP)).await?;
    store
        .compact()
        .await
        .context("rewriting the database file")?;
    println!("encrypt-existing: done; no plaintext body, header, state or dead detail is left");
    Ok(())
}

/// Runs `step` from 0 on, each from where the last one stopped, until none is left,
/// printing a running count of what was rewritten (a transaction per step: killed, the
/// next run goes on from what is left).
async fn steps<F, Fut>(label: &str, mut step: F) -> anyhow::Result<()>
where
    F: FnMut(i64) -> Fut,
    Fut: std::future::Future<Output = Result<KeyStep, StoreError>>,
{
    let (mut after, mut done) = (0, 0);
    loop {
        let this = step(after).await?;
        done += this.done;
        if this.done > 0 {
            println!("{label}: {done} rewritten so far");
        }
        match this.next {
            Some(next) => after = next,
            None => return Ok(()),
        }
    }
}

/// Runs `inhook forget`: erases one aggregate and says what was erased.
pub async fn forget(config_path: Option<PathBuf>, args: ForgetArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let store = open_existing_store(&config).await?;
    let storage = args.aggregate.storage_key();
    let report = store
        .forget(&args.source, &storage, clock::now_ms())
        .await?;
    if !report.found() {
        bail!(
            "nothing is stored for aggregate {} of source {}",
            args.aggregate,
            args.source
        );
    }
    audit(
        "aggregate erased on request",
        &args.source,
        &args.aggregate,
        &format!(
            "events_erased={} data_key_destroyed={}",
            report.events_erased, report.data_key_destroyed
        ),
    );
    println!(
        "erased {}/{}: {} events erased, state {}, {} forwards skipped, data key {}",
        args.source,
        args.aggregate,
        report.events_erased,
        if report.state_deleted {
            "deleted"
        } else {
            "none"
        },
        report.deliveries_skipped,
        if report.data_key_destroyed {
            "destroyed"
        } else {
            "none (encryption off)"
        }
    );
    println!(
        "{}",
        inhook::store::erasure::backups_note(store.encrypting())
    );
    if let Some(why) = &report.unscrubbed {
        eprintln!(
            "warning: the database's files were not rid of the erased copies: {why}; the \
             next erasure or rekey tries again"
        );
    }
    Ok(())
}

/// Writes a command's audit line on standard error, where a command's log goes (the
/// server's own admin actions log theirs under the target `inhook::audit`): what was done
/// to which aggregate, by whom, when, and `details`.
pub(super) fn audit(what: &str, source: &str, aggregate: &AggregateKey, details: &str) {
    eprintln!(
        "audit: {what}: source={source} aggregate={aggregate} by={} at={} {details}",
        invoking_user(),
        clock::rfc3339(clock::now_ms()),
    );
}

/// Who ran the command, for the audit line: the login name the environment gives.
fn invoking_user() -> String {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME"));
    format!(
        "command line (user {})",
        user.as_deref().unwrap_or("unknown")
    )
}
