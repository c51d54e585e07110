//! Statements whose text is the same in both dialects, written once. They use
//! `$n` placeholders, each first appearing in order: SQLite reads `$1` as a named
//! parameter and numbers them by first appearance, so positional binding holds.

/// One aggregate's state.
pub(crate) const LOAD_AGGREGATE: &str =
    "SELECT aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at
     FROM aggregate_state WHERE source = $1 AND aggregate = $2";

/// A page of a source's aggregate states, optionally of one tag, after a cursor.
pub(crate) const AGGREGATES_PAGE: &str =
    "SELECT aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at
     FROM aggregate_state
     WHERE source = $1 AND (CAST($2 AS TEXT) IS NULL OR tag = $2)
       AND (CAST($3 AS TEXT) IS NULL OR aggregate > $3)
     ORDER BY aggregate LIMIT $4";

/// Writes an aggregate's new state (the caller holds the aggregate).
pub(crate) const SAVE_AGGREGATE: &str = "INSERT INTO aggregate_state
         (source, aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
     ON CONFLICT (source, aggregate) DO UPDATE SET
         sequence = EXCLUDED.sequence, event_id = EXCLUDED.event_id,
         event_type = EXCLUDED.event_type, state = EXCLUDED.state, tag = EXCLUDED.tag,
         watermark = EXCLUDED.watermark, updated_at = EXCLUDED.updated_at";

/// Appends an applied change for the stream.
pub(crate) const ADD_CHANGE: &str = "INSERT INTO state_changes (source, aggregate, kind, at, state)
     VALUES ($1, $2, $3, $4, $5)";

/// The columns of a [`crate::kind::PendingRow`], in the order the stores read them.
macro_rules! pending_columns {
    () => {
        "id, body, received_at, replays > 0, event_id, sequence, event_type, idempotency_key"
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
pub(crate) const OCCUPIED: &str = "SELECT sequence FROM events
     WHERE source = $1 AND aggregate = $2 AND sequence >= $3
       AND (status IN ('processed', 'ignored_stale', 'ignored_unsupported')
            OR (status = 'dead' AND dead_reason <> 'sequence_conflict'))";

/// One event's pending columns by id, for SQLite's per-row reads of held events.
pub(crate) const PENDING_BY_ID: &str =
    concat!("SELECT ", pending_columns!(), " FROM events WHERE id = $1");

/// Events' pending columns by a list of ids, for PostgreSQL's one read of held events.
pub(crate) const PENDING_BY_IDS: &str = concat!(
    "SELECT ",
    pending_columns!(),
    " FROM events WHERE id = ANY($1)"
);
