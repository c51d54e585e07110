//! Versioned schema migrations. A migration is never edited once released:
//! a change is a new entry at the end.

/// `(version, SQL)` in order; the SQL is valid for SQLite.
pub(crate) const SQLITE: &[(i64, &str)] = &[(
    1,
    r#"
CREATE TABLE events (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    source          TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    aggregate       TEXT    NOT NULL,
    sequence        INTEGER NOT NULL,
    idempotency_key TEXT,
    body            BLOB    NOT NULL,
    signature_valid INTEGER NOT NULL,
    signed_at       INTEGER,
    received_at     INTEGER NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    last_error      TEXT,
    dead_reason     TEXT,
    decided_at      INTEGER
);
CREATE UNIQUE INDEX events_source_event_id ON events (source, event_id);
CREATE UNIQUE INDEX events_source_idempotency_key ON events (source, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_aggregate ON events (source, aggregate, sequence);
CREATE INDEX events_pending ON events (status, next_attempt_at)
    WHERE status IN ('received', 'held', 'retrying');

CREATE TABLE presence_state (
    source     TEXT    NOT NULL,
    user_id    TEXT    NOT NULL,
    presence   TEXT    NOT NULL,
    sequence   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (source, user_id)
);
CREATE INDEX presence_state_by_status ON presence_state (source, presence, user_id);

CREATE TABLE save_state (
    source             TEXT    NOT NULL,
    aggregate          TEXT    NOT NULL,
    last_sequence      INTEGER NOT NULL,
    progress           TEXT,
    progress_sequence  INTEGER,
    inventory          TEXT    NOT NULL,
    inventory_sequence INTEGER,
    snapshot_sequence  INTEGER,
    achievements       TEXT    NOT NULL,
    updated_at         INTEGER NOT NULL,
    PRIMARY KEY (source, aggregate)
);
"#,
)];
