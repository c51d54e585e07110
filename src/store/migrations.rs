//! Versioned schema migrations. A migration is never edited once released:
//! a change is a new entry at the end.

/// `(version, SQL)` in order; the SQL is valid for SQLite.
pub(crate) const SQLITE: &[(i64, &str)] = &[
    (
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
    decided_at      INTEGER,
    replays         INTEGER NOT NULL DEFAULT 0,
    headers         TEXT
);
CREATE UNIQUE INDEX events_source_event_id ON events (source, event_id);
CREATE UNIQUE INDEX events_source_idempotency_key ON events (source, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_aggregate ON events (source, aggregate, sequence);
CREATE INDEX events_pending ON events (status, next_attempt_at)
    WHERE status IN ('received', 'held', 'retrying');

CREATE INDEX events_decided ON events (received_at)
    WHERE status IN ('processed', 'ignored_stale', 'ignored_unsupported');

-- Failures and replays of each event, for triage.
CREATE TABLE event_attempts (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    event_row INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    kind      TEXT    NOT NULL,
    error     TEXT
);
CREATE INDEX event_attempts_event ON event_attempts (event_row, id);

-- Dedup keys of purged events, kept for the dedup window.
CREATE TABLE dedup_keys (
    source     TEXT    NOT NULL,
    kind       TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    event_id   TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (source, kind, key)
);

CREATE TABLE replay_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    filter           TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    total            INTEGER NOT NULL,
    requeued         INTEGER NOT NULL DEFAULT 0,
    cursor_source    TEXT,
    cursor_aggregate TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);

-- Every applied state change, in order: the source of GET /v1/stream.
CREATE TABLE state_changes (
    id        INTEGER PRIMARY KEY AUTOINCREMENT,
    source    TEXT    NOT NULL,
    aggregate TEXT    NOT NULL,
    kind      TEXT    NOT NULL,
    at        INTEGER NOT NULL,
    state     TEXT    NOT NULL
);

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
    ),
    (
        2,
        // Events per source and status, kept by triggers in the writing transaction, so that
        // counting does not scan the log (SQLite has one writer: no contention on these rows).
        r#"
CREATE TABLE event_counts (
    source TEXT    NOT NULL,
    status TEXT    NOT NULL,
    n      INTEGER NOT NULL,
    PRIMARY KEY (source, status)
);
INSERT INTO event_counts (source, status, n)
    SELECT source, status, COUNT(*) FROM events GROUP BY source, status;
CREATE TRIGGER event_counts_insert AFTER INSERT ON events BEGIN
    INSERT INTO event_counts (source, status, n) VALUES (new.source, new.status, 1)
        ON CONFLICT (source, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER event_counts_update AFTER UPDATE OF status ON events
    WHEN old.status <> new.status BEGIN
    UPDATE event_counts SET n = n - 1 WHERE source = old.source AND status = old.status;
    INSERT INTO event_counts (source, status, n) VALUES (new.source, new.status, 1)
        ON CONFLICT (source, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER event_counts_delete AFTER DELETE ON events BEGIN
    UPDATE event_counts SET n = n - 1 WHERE source = old.source AND status = old.status;
END;

-- The retention task's expiry scans, by index rather than over the whole table.
CREATE INDEX dedup_keys_expiry ON dedup_keys (expires_at);
CREATE INDEX state_changes_at ON state_changes (at);
"#,
    ),
];

/// `(version, SQL)` in order, for PostgreSQL; the same schema as [`SQLITE`].
pub(crate) const POSTGRES: &[(i64, &str)] = &[
    (
        1,
        r#"
CREATE TABLE events (
    id              BIGSERIAL PRIMARY KEY,
    source          TEXT    NOT NULL,
    event_id        TEXT    NOT NULL,
    event_type      TEXT    NOT NULL,
    aggregate       TEXT    NOT NULL,
    sequence        BIGINT  NOT NULL,
    idempotency_key TEXT,
    body            BYTEA   NOT NULL,
    signature_valid BOOLEAN NOT NULL,
    signed_at       BIGINT,
    received_at     BIGINT  NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    last_error      TEXT,
    dead_reason     TEXT,
    decided_at      BIGINT,
    replays         INTEGER NOT NULL DEFAULT 0,
    headers         TEXT
);
CREATE UNIQUE INDEX events_source_event_id ON events (source, event_id);
CREATE UNIQUE INDEX events_source_idempotency_key ON events (source, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX events_aggregate ON events (source, aggregate, sequence);
CREATE INDEX events_pending ON events (status, next_attempt_at)
    WHERE status IN ('received', 'held', 'retrying');
CREATE INDEX events_decided ON events (received_at)
    WHERE status IN ('processed', 'ignored_stale', 'ignored_unsupported');

CREATE TABLE event_attempts (
    id        BIGSERIAL PRIMARY KEY,
    event_row BIGINT  NOT NULL,
    at        BIGINT  NOT NULL,
    kind      TEXT    NOT NULL,
    error     TEXT
);
CREATE INDEX event_attempts_event ON event_attempts (event_row, id);

CREATE TABLE dedup_keys (
    source     TEXT   NOT NULL,
    kind       TEXT   NOT NULL,
    key        TEXT   NOT NULL,
    event_id   TEXT   NOT NULL,
    expires_at BIGINT NOT NULL,
    PRIMARY KEY (source, kind, key)
);

CREATE TABLE replay_jobs (
    id               BIGSERIAL PRIMARY KEY,
    filter           TEXT    NOT NULL,
    state            TEXT    NOT NULL,
    total            BIGINT  NOT NULL,
    requeued         BIGINT  NOT NULL DEFAULT 0,
    cursor_source    TEXT,
    cursor_aggregate TEXT,
    created_at       BIGINT  NOT NULL,
    updated_at       BIGINT  NOT NULL
);

CREATE TABLE state_changes (
    id        BIGSERIAL PRIMARY KEY,
    source    TEXT   NOT NULL,
    aggregate TEXT   NOT NULL,
    kind      TEXT   NOT NULL,
    at        BIGINT NOT NULL,
    state     TEXT   NOT NULL
);

CREATE TABLE presence_state (
    source     TEXT   NOT NULL,
    user_id    TEXT   NOT NULL,
    presence   TEXT   NOT NULL,
    sequence   BIGINT NOT NULL,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (source, user_id)
);
CREATE INDEX presence_state_by_status ON presence_state (source, presence, user_id);

CREATE TABLE save_state (
    source             TEXT   NOT NULL,
    aggregate          TEXT   NOT NULL,
    last_sequence      BIGINT NOT NULL,
    progress           TEXT,
    progress_sequence  BIGINT,
    inventory          TEXT   NOT NULL,
    inventory_sequence BIGINT,
    snapshot_sequence  BIGINT,
    achievements       TEXT   NOT NULL,
    updated_at         BIGINT NOT NULL,
    PRIMARY KEY (source, aggregate)
);
"#,
    ),
    (
        2,
        r#"
-- The retention task's expiry scans, by index rather than over the whole table.
CREATE INDEX dedup_keys_expiry ON dedup_keys (expires_at);
CREATE INDEX state_changes_at ON state_changes (at);
"#,
    ),
];
