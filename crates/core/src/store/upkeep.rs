//! Recording a failed attempt, replaying (one event, or a bulk job step by step)
//! and purging, written once for every store: each flow runs over [`Tx`],
//! which a store implements over one of its transactions, as [`super::settle`]
//! does for settling. Statements are written once, with `$n` placeholders; where
//! the dialects differ (row locks, a bound list of ids) the store supplies the words.

use super::backend::Param;
use super::backend::{int, one_int, string, text, Tx};
use super::bulk::BulkJob;
use super::filter::{self, json_err, parse_status, where_of};
use super::{sql, EventFilter, FailureReport, PurgeReport, ReplayJob, ReplayOutcome, StoreError};
use crate::domain::retry::{NextStep, RetryPolicy};
use crate::domain::EventStatus;

/// Puts the aggregate's due events back for a retry, or makes them dead once
/// `policy` gives up (the aggregate is held by the caller's transaction).
pub(crate) async fn record_failure<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    error: &str,
    now_ms: i64,
    (policy, jitter): (RetryPolicy, f64),
) -> Result<FailureReport, StoreError> {
    let due = io
        .query(
            &sql::DUE_WITH_FAILURES,
            &[text(source), text(aggregate), Param::Int(now_ms)],
        )
        .await?;
    let mut report = FailureReport::default();
    for row in &due {
        let (id, failed_before) = (int(row, 0)?, int(row, 1)?);
        let failed = u32::try_from(failed_before + 1).unwrap_or(u32::MAX);
        io.execute(
            sql::ADD_HISTORY,
            &[
                Param::Int(id),
                Param::Int(now_ms),
                text("failed"),
                Param::opt_text(Some(error)),
            ],
        )
        .await?;
        match policy.after_failure(failed, jitter) {
            NextStep::RetryIn(delay_ms) => {
                let params = [Param::Int(id), Param::Int(now_ms + delay_ms), text(error)];
                io.execute(sql::RETRY_LATER, &params).await?;
                report.retrying += 1;
            }
            NextStep::GiveUp => {
                let params = [Param::Int(id), text(error), Param::Int(now_ms)];
                io.execute(sql::DEAD_EXHAUSTED, &params).await?;
                report.dead += 1;
            }
        }
    }
    Ok(report)
}

/// Replays one event if it is dead or retrying.
pub(crate) async fn replay_event<I: Tx>(
    io: &I,
    source: &str,
    event_id: &str,
    now_ms: i64,
) -> Result<ReplayOutcome, StoreError> {
    let found = io
        .query(
            &format!(
                "SELECT id, status FROM events WHERE source = $1 AND event_id = $2{}",
                I::LOCK_ROWS
            ),
            &[text(source), text(event_id)],
        )
        .await?;
    let Some(row) = found.first() else {
        return Ok(ReplayOutcome::NotFound);
    };
    let status = parse_status(&string(row, 1)?)?;
    if !matches!(status, EventStatus::Dead | EventStatus::Retrying) {
        return Ok(ReplayOutcome::Unchanged(status));
    }
    requeue(io, "id = $1", vec![Param::Int(int(row, 0)?)], now_ms).await?;
    io.wake_workers().await?;
    Ok(ReplayOutcome::Requeued)
}

/// Persists a bulk replay of the events `filter` matches (dead ones when it names no status).
pub(crate) async fn create_replay_job<I: Tx>(
    io: &I,
    filter: &EventFilter,
    now_ms: i64,
) -> Result<ReplayJob, StoreError> {
    let mut filter = filter.clone();
    if filter.status.is_none() {
        filter.status = Some(EventStatus::Dead);
    }
    let (clauses, params) = filter_sql(&filter);
    let counted = io
        .query(
            &format!("SELECT COUNT(*) FROM events WHERE {}", where_of(&clauses)),
            &params,
        )
        .await?;
    let total = one_int(&counted)?;
    let filter_json = serde_json::to_string(&filter).map_err(json_err)?;
    let created = io
        .query(
            "INSERT INTO replay_jobs (filter, state, total, created_at, updated_at)
             VALUES ($1, 'running', $2, $3, $3) RETURNING id",
            &[
                Param::owned(filter_json),
                Param::Int(total),
                Param::Int(now_ms),
            ],
        )
        .await?;
    io.wake_workers().await?;
    Ok(ReplayJob {
        id: one_int(&created)?,
        filter,
        state: "running".into(),
        total,
        requeued: 0,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
    })
}

/// A bulk replay of events: each aggregate's matching events requeued together (the
/// worker feeds them back in sequence order).
pub(crate) struct EventReplayJob {
    filter: EventFilter,
}

impl BulkJob for EventReplayJob {
    const JOBS: &'static str = "replay_jobs";
    const ROWS: &'static str = "events";
    const WAKES_WORKERS: bool = true;

    async fn load<I: Tx>(io: &I, id: i64) -> Result<Option<Self>, StoreError> {
        let found = io
            .query(
                "SELECT filter FROM replay_jobs WHERE id = $1",
                &[Param::Int(id)],
            )
            .await?;
        found
            .first()
            .map(|row| {
                let filter = serde_json::from_str(&string(row, 0)?).map_err(json_err)?;
                Ok(Self { filter })
            })
            .transpose()
    }

    fn conditions(&self) -> (Vec<String>, Vec<Param<'_>>) {
        filter_sql(&self.filter)
    }

    async fn requeue<I: Tx>(
        &self,
        io: &I,
        source: &str,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        let (mut clauses, mut params) = filter_sql(&self.filter);
        params.extend([text(source), text(aggregate)]);
        let n = params.len();
        clauses.push(format!("source = ${} AND aggregate = ${n}", n - 1));
        requeue(io, &where_of(&clauses), params, now_ms).await
    }
}

/// Deletes up to `batch` decided events received before `before_ms` (keeping their
/// dedup keys until `dedup_until_ms`), expired dedup keys and old state changes.
pub(crate) async fn purge<I: Tx>(
    io: &I,
    before_ms: i64,
    dedup_until_ms: i64,
    now_ms: i64,
    batch: usize,
) -> Result<PurgeReport, StoreError> {
    let chosen = io
        .query(
            &format!(
                // An event a destination still has to get (or may be replayed to) keeps
                // its body: the request carries it byte for byte.
                "SELECT id FROM events
                 WHERE {}
                   AND received_at < $1
                   AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_row = events.id
                                   AND d.status NOT IN ('delivered', 'skipped'))
                 LIMIT $2{}",
                sql::applied_or_ignored!(),
                I::SKIP_LOCKED
            ),
            &[Param::Int(before_ms), Param::Int(batch as i64)],
        )
        .await?;
    let chosen = Param::Ids(chosen.iter().map(|r| int(r, 0)).collect::<Result<_, _>>()?);
    if dedup_until_ms > now_ms {
        for (kind, column) in [
            ("event_id", "event_id"),
            ("idempotency_key", "idempotency_key"),
            ("body", "body_sha256"),
        ] {
            // A key kept already (an earlier event's, expired but not yet deleted)
            // now names the newer event. In key order, as every batch upsert takes its
            // keys: two nodes purging at once never wait on each other's keys crosswise.
            io.execute(
                &format!(
                    "INSERT INTO dedup_keys (source, kind, key, event_id, expires_at)
                     SELECT source, '{kind}', {column}, event_id, $2 FROM events
                     WHERE {column} IS NOT NULL AND {}
                     ORDER BY source, {column}
                     ON CONFLICT (source, kind, key) DO UPDATE
                         SET event_id = EXCLUDED.event_id, expires_at = EXCLUDED.expires_at",
                    I::in_ids("id", 1)
                ),
                &[chosen.clone(), Param::Int(dedup_until_ms)],
            )
            .await?;
        }
    }
    let history = format!(
        "DELETE FROM event_attempts WHERE {}",
        I::in_ids("event_row", 1)
    );
    io.execute(&history, std::slice::from_ref(&chosen)).await?;
    let search = format!(
        "DELETE FROM event_search WHERE {}",
        I::in_ids("event_row", 1)
    );
    io.execute(&search, std::slice::from_ref(&chosen)).await?;
    let events = format!("DELETE FROM events WHERE {}", I::in_ids("id", 1));
    let events = io.execute(&events, &[chosen]).await?;
    let dedup_keys = io
        .execute(sql::PURGE_DEDUP_KEYS, &[Param::Int(now_ms)])
        .await?;
    io.execute(
        sql::PURGE_CHANGES,
        &[Param::Int(before_ms), Param::Int(batch as i64)],
    )
    .await?;
    // Alert notices go with the events of their time (docs/api.md, alerts): a handful
    // per state change of a rule, so one statement takes them, and one their outbox rows.
    io.execute(
        "DELETE FROM alert_outbox WHERE alert_id IN (SELECT id FROM alerts WHERE at < $1)",
        &[Param::Int(before_ms)],
    )
    .await?;
    io.execute("DELETE FROM alerts WHERE at < $1", &[Param::Int(before_ms)])
        .await?;
    Ok(PurgeReport { events, dedup_keys })
}

/// Puts the dead or retrying events matching `condition` (over `params`) back in
/// the queue, recording the replay in each one's history.
async fn requeue<I: Tx>(
    io: &I,
    condition: &str,
    mut params: Vec<Param<'_>>,
    now_ms: i64,
) -> Result<u64, StoreError> {
    let replayable = format!("({condition}) AND status IN ('dead', 'retrying')");
    params.push(Param::Int(now_ms));
    io.execute(
        &format!(
            "INSERT INTO event_attempts (event_row, at, kind)
             SELECT id, CAST(${} AS BIGINT), 'replayed' FROM events WHERE {replayable}",
            params.len()
        ),
        &params,
    )
    .await?;
    params.pop();
    io.execute(
        &format!(
            "UPDATE events SET status = 'received', replays = replays + 1, dead_reason = NULL,
                 next_attempt_at = NULL, decided_at = NULL
             WHERE {replayable}"
        ),
        &params,
    )
    .await
}

/// Whether the one-time upgrade step `step` (queued by a migration) is still to be done.
pub(crate) async fn upgrade_step_pending<I: Tx>(io: &I, step: &str) -> Result<bool, StoreError> {
    let rows = io
        .query(super::sql::UPGRADE_STEP_PENDING, &[text(step)])
        .await?;
    Ok(!rows.is_empty())
}

/// Records that the upgrade step `step` is done.
pub(crate) async fn finish_upgrade_step<I: Tx>(io: &I, step: &str) -> Result<(), StoreError> {
    io.execute(super::sql::FINISH_UPGRADE_STEP, &[text(step)])
        .await?;
    Ok(())
}

/// Passes the stored request headers of up to `batch` events after row `after` through
/// `keep`, writing back those it changes; answers the last row read (none when no row
/// was left) and how many were rewritten.
pub(crate) async fn prune_headers<I: Tx>(
    io: &I,
    after: i64,
    batch: usize,
    keep: &super::HeaderFilter,
) -> Result<(Option<i64>, u64), StoreError> {
    let rows = io
        .query(
            "SELECT id, source, headers FROM events
             WHERE id > $1 AND headers IS NOT NULL ORDER BY id LIMIT $2",
            &[Param::Int(after), Param::Int(batch as i64)],
        )
        .await?;
    let mut rewritten = 0;
    for row in &rows {
        let (id, source, stored) = (int(row, 0)?, string(row, 1)?, string(row, 2)?);
        // Sealed headers were written by this release, already pruned; the filter cannot
        // read them (docs/encryption.md).
        if crate::domain::encryption::is_sealed_text(&stored) {
            continue;
        }
        if let Some(kept) = keep(&source, &stored) {
            io.execute(
                "UPDATE events SET headers = $1 WHERE id = $2",
                &[Param::owned(kept), Param::Int(id)],
            )
            .await?;
            rewritten += 1;
        }
    }
    let last = rows.last().map(|row| int(row, 0)).transpose()?;
    Ok((last, rewritten))
}

/// A filter's conditions with `$n` placeholders.
fn filter_sql(filter: &EventFilter) -> (Vec<String>, Vec<Param<'_>>) {
    filter::filter_sql(filter, |n| format!("${n}"))
}
