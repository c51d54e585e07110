//! Statements whose text is the same in both dialects, written once, with
//! PostgreSQL's `$n` placeholders; SQLite runs them through `sqlite()`, which
//! writes them `?n` (numbered parameters in SQLite too).

/// The undecided statuses, the condition of SQLite's partial index `events_pending` term
/// for term and in the same order: SQLite uses a partial index only for a query that names
/// its condition (or one term of it). ORs of equalities rather than an IN list (migration
/// 10): SQLite evaluates a constant IN list of three or more terms through a temporary
/// b-tree built at every statement.
macro_rules! undecided {
    () => {
        "(status = 'received' OR status = 'held' OR status = 'retrying')"
    };
}
pub(crate) use undecided;

/// The applied and ignored statuses, as the partial index `events_decided` is written.
macro_rules! applied_or_ignored {
    () => {
        "(status = 'processed' OR status = 'ignored_stale' OR status = 'ignored_unsupported')"
    };
}
pub(crate) use applied_or_ignored;

/// The decided statuses other than `processed`, as `events_by_status` and
/// `events_by_source_status` are written: rare enough that those indexes cost ingest nothing.
macro_rules! rare_decided {
    () => {
        "(status = 'dead' OR status = 'ignored_stale' OR status = 'ignored_unsupported')"
    };
}
pub(crate) use rare_decided;

/// One aggregate's state.
pub(crate) const LOAD_AGGREGATE: &str =
    "SELECT aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at,
            skipped_gaps
     FROM aggregate_state WHERE source = $1 AND aggregate = $2";

/// A page of a source's aggregate states, optionally of one tag, after a cursor.
pub(crate) const AGGREGATES_PAGE: &str =
    "SELECT aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at,
            skipped_gaps
     FROM aggregate_state
     WHERE source = $1 AND (CAST($2 AS TEXT) IS NULL OR tag = $2)
       AND (CAST($3 AS TEXT) IS NULL OR aggregate > $3)
     ORDER BY aggregate LIMIT $4";

/// Writes an aggregate's new state (the caller holds the aggregate).
pub(crate) const SAVE_AGGREGATE: &str = "INSERT INTO aggregate_state
         (source, aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at,
          skipped_gaps)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
     ON CONFLICT (source, aggregate) DO UPDATE SET
         sequence = EXCLUDED.sequence, event_id = EXCLUDED.event_id,
         event_type = EXCLUDED.event_type, state = EXCLUDED.state, tag = EXCLUDED.tag,
         watermark = EXCLUDED.watermark, updated_at = EXCLUDED.updated_at,
         skipped_gaps = EXCLUDED.skipped_gaps";

/// Appends an applied change for the stream.
pub(crate) const ADD_CHANGE: &str = "INSERT INTO state_changes (source, aggregate, kind, at, state)
     VALUES ($1, $2, $3, $4, $5)";

/// The columns of a [`crate::domain::kind::PendingRow`], in the order the stores read them.
macro_rules! pending_columns {
    () => {
        "id, body, received_at, replays > 0, event_id, sequence, event_type, idempotency_key,
         unordered IS NOT NULL"
    };
}

/// An aggregate's pending events that are not held: received, or retrying and due
/// (the partial index's own condition first, so only undecided rows are read).
pub(crate) const ARRIVING_ROWS: &str = concat!(
    "SELECT ",
    pending_columns!(),
    " FROM events WHERE source = $1 AND aggregate = $2 AND status IN ('received', 'retrying')
       AND (status = 'received' OR next_attempt_at <= $3)"
);

/// An aggregate's held events, without their bodies, by sequence.
pub(crate) const HELD_REFS: &str = "SELECT sequence, id, received_at FROM events
     WHERE source = $1 AND aggregate = $2 AND status = 'held'
     ORDER BY sequence, id";

/// The sequences at or above `$3` taken by decided events (a conflict takes none).
pub(crate) const OCCUPIED: &str = concat!(
    "SELECT sequence FROM events
     WHERE source = $1 AND aggregate = $2 AND sequence >= $3
       AND (",
    applied_or_ignored!(),
    " OR (status = 'dead' AND dead_reason <> 'sequence_conflict'))"
);

/// Events' pending columns, for a condition to follow (held events read back by id).
pub(crate) const PENDING_FROM_EVENTS: &str = concat!("SELECT ", pending_columns!(), " FROM events");

/// The schema version a store is at.
pub(crate) const CURRENT_VERSION: &str = "SELECT COALESCE(MAX(version), 0) FROM schema_migrations";

/// Records an applied migration.
pub(crate) const RECORD_MIGRATION: &str =
    "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)";

/// Names the release (`$1`) that applied the migrations after version `$2` (migration 18
/// added the column; older versions' rows have none).
pub(crate) const RECORD_RELEASE: &str =
    "UPDATE schema_migrations SET release = $1 WHERE version > $2";

/// The release that applied schema version `$1`, if recorded.
pub(crate) const WRITTEN_BY: &str = "SELECT release FROM schema_migrations WHERE version = $1";

/// Whether the one-time upgrade step `$1` is still to be done.
pub(crate) const UPGRADE_STEP_PENDING: &str = "SELECT 1 FROM pending_upgrade_steps WHERE step = $1";

/// Records that the upgrade step `$1` is done.
pub(crate) const FINISH_UPGRADE_STEP: &str = "DELETE FROM pending_upgrade_steps WHERE step = $1";

/// Whether the store answers.
pub(crate) const PING: &str = "SELECT 1";

/// Aggregates with events to decide now (the partial index's own condition first).
pub(crate) const DUE_AGGREGATES: &str = concat!(
    "SELECT DISTINCT source, aggregate FROM events WHERE ",
    undecided!(),
    " AND (status = 'received' OR next_attempt_at <= $1) LIMIT $2"
);

/// Schedules a failed event for another attempt.
pub(crate) const RETRY_LATER: &str =
    "UPDATE events SET status = 'retrying', attempts = attempts + 1,
                             next_attempt_at = $2, last_error = $3
                         WHERE id = $1";

/// Gives up on an event that ran out of attempts.
pub(crate) const DEAD_EXHAUSTED: &str =
    "UPDATE events SET status = 'dead', dead_reason = 'exhausted',
                             attempts = attempts + 1, next_attempt_at = NULL, last_error = $2,
                             decided_at = $3
                         WHERE id = $1";

/// An event's latest 100 failures, replays and conflicts, oldest first: what the detail
/// shows, bounded however often an event was replayed (docs/api.md).
pub(crate) const ATTEMPT_HISTORY: &str = "SELECT at, kind, error FROM
         (SELECT id, at, kind, error FROM event_attempts WHERE event_row = $1
          ORDER BY id DESC LIMIT 100) latest
     ORDER BY id";

/// A bulk replay's progress.
pub(crate) const REPLAY_JOB: &str = "SELECT filter, state, total, requeued, created_at, updated_at
                 FROM replay_jobs WHERE id = $1";

/// Deletes expired dedup keys.
pub(crate) const PURGE_DEDUP_KEYS: &str = "DELETE FROM dedup_keys WHERE expires_at <= $1";

/// Deletes a batch of old state changes.
pub(crate) const PURGE_CHANGES: &str = "DELETE FROM state_changes WHERE id IN
                 (SELECT id FROM state_changes WHERE at < $1 LIMIT $2)";

/// Adds an entry to an event's history.
pub(crate) const ADD_HISTORY: &str =
    "INSERT INTO event_attempts (event_row, at, kind, error) VALUES ($1, $2, $3, $4)";

/// Records in an event's history that its event_id came again with another body, once:
/// later ones are only counted, so a flood of them cannot grow the history.
pub(crate) const ADD_CONFLICT_ONCE: &str = "INSERT INTO event_attempts (event_row, at, kind, error)
     SELECT CAST($1 AS BIGINT), CAST($2 AS BIGINT), CAST($3 AS TEXT), CAST($4 AS TEXT)
     WHERE NOT EXISTS (SELECT 1 FROM event_attempts WHERE event_row = $1 AND kind = $3)";

/// The event_id logged with a body (its SHA-256) by a source that dedups by body.
pub(crate) const EVENT_ID_BY_BODY: &str =
    "SELECT event_id FROM events WHERE source = $1 AND body_sha256 = $2";

/// The kept dedup key of a purged event with the same event_id, idempotency_key or body
/// (`$5`, its SHA-256; NULL for a source that does not dedup by body), event_id first.
pub(crate) const PURGED_DUPLICATE: &str = "SELECT kind, event_id FROM dedup_keys
             WHERE source = $1 AND expires_at > $4
               AND ((kind = 'event_id' AND key = $2) OR (kind = 'idempotency_key' AND key = $3)
                    OR (kind = 'body' AND key = $5))
             ORDER BY CASE kind WHEN 'event_id' THEN 0 WHEN 'idempotency_key' THEN 1 ELSE 2 END
             LIMIT 1";

/// The row and body of a logged event_id.
pub(crate) const BODY_BY_EVENT_ID: &str =
    "SELECT id, body FROM events WHERE source = $1 AND event_id = $2";

/// The event_id logged under an idempotency key.
pub(crate) const EVENT_ID_BY_IDEMPOTENCY_KEY: &str =
    "SELECT event_id FROM events WHERE source = $1 AND idempotency_key = $2";

/// One event of a source by its event_id, with every column a record shows.
pub(crate) static EVENT_BY_ID: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT {} FROM events WHERE source = $1 AND event_id = $2",
        EVENT_COLUMNS
    )
});

/// An aggregate's due events with the failures each had since its last replay.
pub(crate) static DUE_WITH_FAILURES: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT id, {} FROM events
         WHERE source = $1 AND aggregate = $2
           AND (status = 'received' OR (status = 'retrying' AND next_attempt_at <= $3))",
        FAILURES_SINCE_REPLAY
    )
});

/// The columns each store's `event_record` reads, in this order.
pub(crate) const EVENT_COLUMNS: &str = "id, source, event_id, event_type, aggregate, sequence,
    idempotency_key, body, signature_valid, signed_at, received_at, status, attempts,
    next_attempt_at, last_error, dead_reason, decided_at, replays, headers, unordered";

/// An `events` row's failed attempts since it was last replayed (or ever, if never), as
/// an SQL expression over `events.id`: a replay gives an event a fresh attempt budget
/// while `attempts` keeps counting every attempt.
pub(crate) const FAILURES_SINCE_REPLAY: &str = "(SELECT COUNT(*) FROM event_attempts f
    WHERE f.event_row = events.id AND f.kind = 'failed'
      AND f.id > COALESCE((SELECT MAX(r.id) FROM event_attempts r
                           WHERE r.event_row = events.id AND r.kind = 'replayed'), 0))";
