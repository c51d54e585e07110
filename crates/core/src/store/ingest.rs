//! Logging one delivery, written once for every store over [`Tx`]: dedup against the
//! log and the kept keys of purged events, the ready-at-ingest plan (an event whose
//! aggregate is ready is written once, already decided), the aggregate's highest
//! received sequence, the settle in sync mode and the backlog limits. A backend runs it
//! inside the transaction its committer chose (one per group commit on SQLite, one per
//! delivery on PostgreSQL) and rolls back a [`Admission::Refused`] delivery's writes;
//! PostgreSQL's multi-row batch insert (`postgres.rs`) reuses the duplicate lookups.

use std::borrow::Cow;

use super::backend::{int, one_int, opt_bytes, opt_string, string, text, Param, Tx};
use super::filter::{parse_event_id, CONFLICTING_DUPLICATE, CONFLICT_DETAIL};
use super::settle;
use super::vault;
use super::{
    sql, status_of, Admission, DedupKey, EventRow, Refusal, SettleAt, SourceRules, StoreError,
};
use crate::domain::encryption::{Binding, Column};

/// Logs a delivery as a row of the event log; no row when a unique key makes it a duplicate.
pub(crate) const LOG_EVENT: &str =
    "INSERT INTO events (source, event_id, event_type, aggregate, sequence,
         idempotency_key, body, signature_valid, signed_at, received_at, status,
         headers, decided_at, attempts, body_sha256, data_key, unordered)
     VALUES ($1, $2, $3, $4, $5, $6, $7, TRUE, $8, $9, $10, $11, $12, $13, $14, $15, $16)
     ON CONFLICT DO NOTHING";

/// The aggregate's highest received sequence.
const HIGHEST_RECEIVED: &str =
    "SELECT max_sequence FROM aggregate_seen WHERE source = $1 AND aggregate = $2";

/// Raises the aggregate's highest received sequence (the caller read it lower).
const RAISE_HIGHEST_RECEIVED: &str =
    "INSERT INTO aggregate_seen (source, aggregate, max_sequence) VALUES ($1, $2, $3)
     ON CONFLICT (source, aggregate) DO UPDATE SET max_sequence = excluded.max_sequence";

/// How many in-order events wait behind the aggregate's gap, when the event `$4` is
/// itself behind it (a contiguous event is never refused for a full aggregate).
const WAITING_BEHIND_GAP: &str = "SELECT COUNT(*) FROM events e
     WHERE e.source = $1 AND e.aggregate = $2 AND e.status IN ('received', 'held')
       AND e.sequence > 1 + COALESCE(
           (SELECT watermark FROM aggregate_state s
            WHERE s.source = $1 AND s.aggregate = $2), $3 - 1)
       AND $4 > 1 + COALESCE(
           (SELECT watermark FROM aggregate_state s
            WHERE s.source = $1 AND s.aggregate = $2), $3 - 1)";

/// How one delivery of a group commit is kept from failing the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Guard {
    /// By the batch as a whole: any refusal or failure fails the delivery, and the
    /// committer runs the batch again with savepoints.
    Batch,
    /// The settle at ingest in a savepoint of its own: one that fails leaves the event
    /// to be logged undecided, for the worker, its retries and backoff.
    Savepoints,
}

/// Logs `logged` (and settles it in sync mode) inside the caller's transaction. A
/// [`Admission::Refused`] answer leaves the delivery's writes for the caller to roll back.
pub(crate) async fn log_one<I: Tx>(
    io: &I,
    logged: &EventRow,
    settle: SettleAt<'_>,
    guard: Guard,
) -> Result<Admission, StoreError> {
    if let Some(admission) = purged_duplicate(io, logged).await? {
        return Ok(admission);
    }
    // Serialize with any other node logging or settling this aggregate: its highest
    // received sequence, its waiting events and (sync) its state are read below.
    io.lock_aggregates(&[(&logged.source, &logged.aggregate)])
        .await?;
    prepare_key(io, logged).await?;
    // Sync mode too: an aggregate ready at ingest is written once, already decided; the
    // rest is logged and settled below, where the rules may hold it.
    if let (Some(rules), false) = (settle.rules(), logged.ignored) {
        if let Some(admission) = log_decided(io, rules, logged, guard).await? {
            return Ok(admission);
        }
    }
    let inserted = insert(
        io,
        logged,
        logged.logged_status(),
        logged.logged_decided_at(),
        0,
    )
    .await?;
    let Some(row) = inserted else {
        vault::drop_unused_key(io, logged).await?;
        // A conflicting body is recorded in the original's history: the caller commits it.
        return find_duplicate(io, logged).await;
    };
    if logged.ignored {
        return Ok(Admission::Logged {
            row,
            decided: None,
            out_of_order: false,
        });
    }
    // An unordered event has no sequence to raise the aggregate's highest with.
    let out_of_order = logged.unordered.is_none() && record_received(io, logged).await?;
    let decided = match settle {
        SettleAt::Ingest(rules) => {
            let settled = settle::settle(io, rules, &logged.aggregate, logged.received_at).await?;
            Some(settled.decided(row)?)
        }
        // Not ready at ingest (`log_decided` looked): the worker settles it.
        SettleAt::IfReady(_) | SettleAt::Worker => {
            io.wake_workers().await?;
            None
        }
    };
    if let Some(refusal) = over_limits(io, logged).await? {
        return Ok(Admission::Refused(refusal));
    }
    Ok(Admission::Logged {
        row,
        decided,
        out_of_order,
    })
}

/// Logs every row of a batch inside the caller's one transaction, each as [`log_one`]
/// does (`settle[i]` for `rows[i]`, `None`: by the worker). Every aggregate is locked
/// first, in one sorted step, so that two batches never wait on each other's locks in
/// opposite orders. A refused element fails the whole flow with [`StoreError::BatchRefused`]: the
/// caller's transaction then rolls back and nothing of the batch is kept.
pub(crate) async fn log_batch<I: Tx>(
    io: &I,
    rows: &[EventRow],
    settle: &[Option<(SourceRules, bool)>],
) -> Result<Vec<Admission>, StoreError> {
    let aggregates: Vec<(&str, &str)> = rows
        .iter()
        .map(|row| (row.source.as_str(), row.aggregate.as_str()))
        .collect();
    io.lock_aggregates(&aggregates).await?;
    let mut admissions = Vec::with_capacity(rows.len());
    for (index, (row, rules)) in rows.iter().zip(settle).enumerate() {
        let at = match rules {
            Some((rules, true)) => SettleAt::IfReady(rules),
            Some((rules, false)) => SettleAt::Ingest(rules),
            None => SettleAt::Worker,
        };
        match log_one(io, row, at, Guard::Batch).await? {
            Admission::Refused(refusal) => {
                return Err(StoreError::BatchRefused { index, refusal });
            }
            admission => admissions.push(admission),
        }
    }
    Ok(admissions)
}

/// Writes the new data key `logged` was sealed under, or checks that the cached one it
/// was sealed under is still stored: a key erased by another node since makes the
/// delivery fail with [`StoreError::StaleKey`], to be sealed again (docs/encryption.md).
pub(crate) async fn prepare_key<I: Tx>(io: &I, logged: &EventRow) -> Result<(), StoreError> {
    let Some(sealed) = &logged.sealed else {
        return Ok(());
    };
    if let Some(new) = &sealed.new_key {
        io.execute(
            vault::ADD_DATA_KEY,
            &new.params(&logged.source, &logged.aggregate),
        )
        .await?;
    }
    vault::check_key(io, logged).await
}

/// Logs `logged` already decided when its aggregate is ready at ingest: settled before
/// its row is written, so that the row is written once, with its outcome, and the
/// worker never sees it. `None`: not ready (or, under [`Guard::Savepoints`], settling
/// failed and left nothing). A decided event is no backlog item: no limit refuses it.
async fn log_decided<I: Tx>(
    io: &I,
    rules: &SourceRules,
    logged: &EventRow,
    guard: Guard,
) -> Result<Option<Admission>, StoreError> {
    if guard == Guard::Batch {
        return decide_and_log(io, rules, logged).await;
    }
    io.execute("SAVEPOINT decide", &[]).await?;
    match decide_and_log(io, rules, logged).await {
        Ok(Some(admission)) => {
            io.execute("RELEASE decide", &[]).await?;
            Ok(Some(admission))
        }
        Ok(None) | Err(_) => {
            io.execute("ROLLBACK TO decide", &[]).await?;
            io.execute("RELEASE decide", &[]).await?;
            Ok(None)
        }
    }
}

/// [`log_decided`]'s plan and writes, with no savepoint.
async fn decide_and_log<I: Tx>(
    io: &I,
    rules: &SourceRules,
    logged: &EventRow,
) -> Result<Option<Admission>, StoreError> {
    let Some(plan) = settle::plan_unlogged(io, rules, &logged.aggregate, &[logged]).await? else {
        return Ok(None);
    };
    let status = status_of(plan.outcome(0)?).0;
    let decided_at = Some(logged.received_at);
    let Some(row) = insert(io, logged, status.as_str(), decided_at, 1).await? else {
        vault::drop_unused_key(io, logged).await?;
        return find_duplicate(io, logged).await.map(Some);
    };
    // An unordered event has no sequence to raise the aggregate's highest with.
    let out_of_order = logged.unordered.is_none() && record_received(io, logged).await?;
    let decided = plan.write_logged(io, rules, &[row]).await?.pop();
    Ok(Some(Admission::Logged {
        row,
        decided,
        out_of_order,
    }))
}

/// Writes `logged` as a new row of the log; its id, or `None` when a unique key makes it
/// a duplicate.
async fn insert<I: Tx>(
    io: &I,
    logged: &EventRow,
    status: &str,
    decided_at: Option<i64>,
    attempts: i64,
) -> Result<Option<i64>, StoreError> {
    let params = [
        text(&logged.source),
        text(&logged.event_id),
        text(&logged.event_type),
        text(&logged.aggregate),
        Param::Int(logged.sequence),
        Param::opt_text(logged.idempotency_key.as_deref()),
        Param::Bytes(Cow::Borrowed(logged.stored_body())),
        Param::OptInt(logged.signed_at),
        Param::Int(logged.received_at),
        text(status),
        Param::opt_text(logged.stored_headers()),
        Param::OptInt(decided_at),
        Param::Int(attempts),
        Param::opt_text(logged.body_sha256.as_deref()),
        Param::OptInt(logged.data_key()),
        Param::opt_text(logged.unordered.as_deref()),
    ];
    let row = io.insert_row(LOG_EVENT, &params).await?;
    if let Some(row) = row {
        super::filter::write_search(io, row, logged).await?;
    }
    Ok(row)
}

/// Raises the aggregate's highest received sequence; says whether `logged` came in below it.
async fn record_received<I: Tx>(io: &I, logged: &EventRow) -> Result<bool, StoreError> {
    let aggregate = [text(&logged.source), text(&logged.aggregate)];
    let found = io.query(HIGHEST_RECEIVED, &aggregate).await?;
    let highest = found.first().map(|row| int(row, 0)).transpose()?;
    if highest.is_none_or(|h| logged.sequence > h) {
        let [source, aggregate] = aggregate;
        io.execute(
            RAISE_HIGHEST_RECEIVED,
            &[source, aggregate, Param::Int(logged.sequence)],
        )
        .await?;
    }
    Ok(highest.is_some_and(|h| logged.sequence < h))
}

/// Which limit, if any, the just-logged `logged` takes its source or aggregate over. Read
/// in the writing transaction, which holds the aggregate and (PostgreSQL: locked by
/// [`Tx::LOCK_BACKLOG`]) the source's counter row: no concurrent delivery can overshoot.
async fn over_limits<I: Tx>(io: &I, logged: &EventRow) -> Result<Option<Refusal>, StoreError> {
    let limits = &logged.limits;
    if logged.may_hold && limits.max_held_per_aggregate < u64::MAX {
        let found = io
            .query(
                WAITING_BEHIND_GAP,
                &[
                    text(&logged.source),
                    text(&logged.aggregate),
                    Param::Int(limits.first_sequence),
                    Param::Int(logged.sequence),
                ],
            )
            .await?;
        if one_int(&found)? as u64 > limits.max_held_per_aggregate {
            return Ok(Some(Refusal::AggregateBacklogFull));
        }
    }
    if limits.max_backlog < u64::MAX {
        if let Some(lock) = I::LOCK_BACKLOG {
            io.execute(lock, &[text(&logged.source)]).await?;
        }
        let found = io.query(I::BACKLOG, &[text(&logged.source)]).await?;
        if one_int(&found)? as u64 > limits.max_backlog {
            return Ok(Some(Refusal::BacklogFull));
        }
    }
    Ok(None)
}

/// A duplicate of an event already purged from the log, caught by its kept dedup key.
pub(crate) async fn purged_duplicate<I: Tx>(
    io: &I,
    logged: &EventRow,
) -> Result<Option<Admission>, StoreError> {
    let found = io
        .query(
            sql::PURGED_DUPLICATE,
            &[
                text(&logged.source),
                text(&logged.event_id),
                Param::opt_text(logged.idempotency_key.as_deref()),
                Param::Int(logged.received_at),
                Param::opt_text(logged.body_sha256.as_deref()),
            ],
        )
        .await?;
    found
        .first()
        .map(|row| {
            Ok(Admission::Duplicate {
                key: DedupKey::of_kept(&string(row, 0)?),
                original: parse_event_id(&string(row, 1)?)?,
                body_differs: false,
            })
        })
        .transpose()
}

/// What `logged`, which a unique key kept out of the log, is a duplicate of.
pub(crate) async fn find_duplicate<I: Tx>(
    io: &I,
    logged: &EventRow,
) -> Result<Admission, StoreError> {
    let source = text(&logged.source);
    let by_id = io
        .query(
            sql::BODY_BY_EVENT_ID,
            &[source.clone(), text(&logged.event_id)],
        )
        .await?;
    if let Some(stored) = by_id.first() {
        let keys = io.vault().keys_for(io, &by_id).await?;
        let stored_body = opt_bytes(stored, 1)?.unwrap_or_default();
        // An erased original has no body left, and one that does not open cannot be
        // compared: neither is recorded as a conflict.
        let body_differs =
            match keys.open(stored_body, Binding::event(Column::Body, &logged.event_id)) {
                Ok(body) => !body.is_empty() && body != logged.body,
                Err(_) => false,
            };
        if body_differs {
            // A publisher error worth a person's look: kept in the original's history, once.
            io.execute(
                sql::ADD_CONFLICT_ONCE,
                &[
                    Param::Int(int(stored, 0)?),
                    Param::Int(crate::domain::clock::now_ms()),
                    text(CONFLICTING_DUPLICATE),
                    text(CONFLICT_DETAIL),
                ],
            )
            .await?;
        }
        return Ok(Admission::Duplicate {
            key: DedupKey::EventId,
            original: parse_event_id(&logged.event_id)?,
            body_differs,
        });
    }
    let by_key = io
        .query(
            sql::EVENT_ID_BY_IDEMPOTENCY_KEY,
            &[
                source.clone(),
                Param::opt_text(logged.idempotency_key.as_deref()),
            ],
        )
        .await?;
    let (key, found) = match by_key.first() {
        Some(_) => (DedupKey::IdempotencyKey, by_key),
        None => {
            let by_body = io
                .query(
                    sql::EVENT_ID_BY_BODY,
                    &[source, Param::opt_text(logged.body_sha256.as_deref())],
                )
                .await?;
            (DedupKey::Body, by_body)
        }
    };
    // The conflicting row was committed by another node and is visible now; if not
    // (deleted meanwhile), the publisher's retry will settle it.
    let original = found
        .first()
        .map(|row| opt_string(row, 0))
        .transpose()?
        .flatten()
        .ok_or_else(|| StoreError::Unavailable("duplicate key of a concurrent delivery".into()))?;
    Ok(Admission::Duplicate {
        key,
        original: parse_event_id(&original)?,
        body_differs: false,
    })
}
