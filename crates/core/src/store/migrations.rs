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
    (
        3,
        // The highest sequence received per aggregate, so that an event is counted out of
        // order by order of receipt; and the held events by sequence, so that settling reads
        // only the ones in reach instead of every held body.
        r#"
CREATE TABLE aggregate_seen (
    source       TEXT    NOT NULL,
    aggregate    TEXT    NOT NULL,
    max_sequence INTEGER NOT NULL,
    PRIMARY KEY (source, aggregate)
);
INSERT INTO aggregate_seen (source, aggregate, max_sequence)
    SELECT source, aggregate, MAX(sequence) FROM events GROUP BY source, aggregate;
CREATE INDEX events_held ON events (source, aggregate, sequence, received_at)
    WHERE status = 'held';
-- An aggregate's rows by sequence with their status: the columns settling and the hold
-- cap filter on sit after the body, so without them in the index every held row's
-- body overflow pages were walked on every arrival.
DROP INDEX events_aggregate;
CREATE INDEX events_aggregate ON events (source, aggregate, sequence, status, dead_reason);
"#,
    ),
    (
        4,
        // PostgreSQL's version 4 makes its text keys order by bytes; SQLite's BINARY
        // collation always has. The entry keeps both chains' versions in step.
        "-- Nothing to change: text keys already order by bytes.",
    ),
    (
        5,
        // One table for every kind's aggregate state (the kind seam): the built-in
        // kinds' rows are copied into it, their state as the kinds store it, and the
        // typed tables go. Deterministic: the same rows make the same rows.
        r#"
CREATE TABLE aggregate_state (
    source     TEXT    NOT NULL,
    aggregate  TEXT    NOT NULL,
    sequence   INTEGER,
    event_id   TEXT,
    event_type TEXT,
    state      TEXT    NOT NULL,
    tag        TEXT,
    watermark  INTEGER,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (source, aggregate)
);
CREATE INDEX aggregate_state_by_tag ON aggregate_state (source, tag, aggregate);
INSERT INTO aggregate_state
    (source, aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at)
SELECT source, user_id, sequence, NULL, 'presence.changed',
       json_object('presence', presence), presence, NULL, updated_at
FROM presence_state;
INSERT INTO aggregate_state
    (source, aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at)
SELECT source, aggregate, last_sequence, NULL, NULL,
       json_object('progress', json(progress), 'progress_sequence', progress_sequence,
                   'inventory', json(inventory), 'inventory_sequence', inventory_sequence,
                   'snapshot_sequence', snapshot_sequence, 'achievements', json(achievements)),
       NULL, last_sequence, updated_at
FROM save_state;
DROP TABLE presence_state;
DROP TABLE save_state;
"#,
    ),
    (
        6,
        // Forwarding (docs/forwarding.md): one row per (destination, applied event),
        // written in the decision's transaction; rising id is the applied order a queue sends in. A
        // queue is (destination, source, aggregate). A claim leases its in-flight row.
        r#"
CREATE TABLE deliveries (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    destination     TEXT    NOT NULL,
    source          TEXT    NOT NULL,
    event_row       INTEGER NOT NULL,
    event_id        TEXT    NOT NULL,
    aggregate       TEXT    NOT NULL,
    sequence        INTEGER NOT NULL,
    event_type      TEXT    NOT NULL,
    webhook_id      TEXT    NOT NULL,
    ordering        TEXT    NOT NULL,
    status          TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER,
    lease_owner     TEXT,
    lease_until     INTEGER,
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER
);
CREATE INDEX deliveries_queue ON deliveries (destination, source, aggregate, id);
CREATE INDEX deliveries_by_status ON deliveries (destination, status, id);
CREATE INDEX deliveries_event ON deliveries (event_row);

CREATE TABLE delivery_attempts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    delivery    INTEGER NOT NULL,
    attempt     INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    duration_ms INTEGER NOT NULL,
    http_status INTEGER,
    result      TEXT    NOT NULL
);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery, id);

-- Bulk replays of a destination's deliveries, walked queue by queue from a stored cursor.
CREATE TABLE delivery_replay_jobs (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    destination      TEXT    NOT NULL,
    status           TEXT    NOT NULL,
    aggregate        TEXT,
    state            TEXT    NOT NULL,
    total            INTEGER NOT NULL,
    requeued         INTEGER NOT NULL DEFAULT 0,
    cursor_source    TEXT,
    cursor_aggregate TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
"#,
    ),
    (
        7,
        // Reads that never scan the log: the dashboard's pages and the
        // destination figures by partial indexes. SQLite's counts are kept since version 2.
        r#"
-- Pages of the rare decided statuses (dead letters above all) by id, without walking the
-- log: only rows decided dead or ignored enter them, so ingest and settling pay nothing.
CREATE INDEX events_by_status ON events (status, id)
    WHERE status IN ('dead', 'ignored_stale', 'ignored_unsupported');
CREATE INDEX events_by_source_status ON events (source, status, id)
    WHERE status IN ('dead', 'ignored_stale', 'ignored_unsupported');
-- A source's page by id, however small its share of the log (a full index: one more
-- entry per event; the only one this version adds to ingest).
CREATE INDEX events_by_source ON events (source, id);
-- A destination's blocked aggregates (dead deliveries only) and its last failed attempt
-- (failures only), without reading its whole history; and its deliveries of one aggregate.
CREATE INDEX deliveries_dead ON deliveries (destination, ordering, source, aggregate)
    WHERE status = 'dead';
CREATE INDEX delivery_attempts_failed ON delivery_attempts (id)
    WHERE http_status IS NULL OR http_status < 200 OR http_status > 299;
CREATE INDEX deliveries_by_aggregate ON deliveries (destination, aggregate, id);
"#,
    ),
    (
        8,
        // A queue's active deliveries (and dead ones, which may block it) by id, without
        // its delivered history: a claim finds a queue's first undecided row and whether
        // an older one holds it back in a few index entries however long the queue ran.
        r#"
CREATE INDEX deliveries_active ON deliveries (destination, source, aggregate, id)
    WHERE status IN ('pending', 'in_flight', 'retrying', 'dead');
"#,
    ),
    (
        9,
        // An aggregate's undecided rows that are not held, without its decided history:
        // settling read them through `events_aggregate`, every event the aggregate ever had
        // (the rate fell as save slots grew to thousands of events). Only rows
        // waiting for a worker are in it. (PostgreSQL's version 9 also moves decisions off
        // the backlog row ingest locks; SQLite has one writer.)
        r#"
CREATE INDEX events_arriving ON events (source, aggregate, sequence)
    WHERE status IN ('received', 'retrying');
"#,
    ),
    (
        10,
        // The same partial indexes, their conditions written as ORs of equalities (issue
        // #14): SQLite evaluates a constant IN list of three or more terms through a
        // temporary b-tree it builds at every statement, and it evaluates each partial
        // index's condition at every insert and every change of status. Those 13
        // temporary b-trees per event were a quarter of the instructions of ingesting
        // and deciding it. PostgreSQL evaluates IN lists directly; its schema stays.
        r#"
DROP INDEX events_pending;
CREATE INDEX events_pending ON events (status, next_attempt_at)
    WHERE status = 'received' OR status = 'held' OR status = 'retrying';
DROP INDEX events_decided;
CREATE INDEX events_decided ON events (received_at)
    WHERE status = 'processed' OR status = 'ignored_stale' OR status = 'ignored_unsupported';
DROP INDEX events_by_status;
CREATE INDEX events_by_status ON events (status, id)
    WHERE status = 'dead' OR status = 'ignored_stale' OR status = 'ignored_unsupported';
DROP INDEX events_by_source_status;
CREATE INDEX events_by_source_status ON events (source, status, id)
    WHERE status = 'dead' OR status = 'ignored_stale' OR status = 'ignored_unsupported';
"#,
    ),
    (
        11,
        // The gaps a hold timeout skipped, per in-order aggregate (docs/contract.md,
        // in-order): below the watermark they tell a late event from a resend. NULL for the
        // aggregates of older releases: nothing at or below their watermark is known.
        "ALTER TABLE aggregate_state ADD COLUMN skipped_gaps TEXT;",
    ),
    (
        12,
        // Steps an upgrade runs once with the config, after the SQL: older releases kept
        // request headers the allowlist now refuses (credentials among them), hidden when
        // shown but still stored; the step rewrites those rows (docs/contract.md).
        UPGRADE_STEPS,
    ),
    (13, BODY_DEDUP),
    (
        14,
        // A destination's deliveries per status and its blocked aggregates, kept by triggers
        // in the writing transaction (SQLite has one writer), so that `/metrics` and
        // `GET /v1/destinations` read a few rows instead of counting dead deliveries on
        // the one connection ingest needs.
        SQLITE_DELIVERY_COUNTS,
    ),
    (15, SQLITE_ENCRYPTION),
    (16, FAILED_ATTEMPTS),
    (17, UNORDERED_EVENTS),
    (
        18,
        // The release that applied each version, so that an older binary refuses a store
        // a newer one wrote and names it; and, for a store written before every connection
        // had `secure_delete` on, the one-time scrub of what those releases deleted
        // (`SqliteStore::migrate` drops it for a new store, which has nothing to scrub).
        "ALTER TABLE schema_migrations ADD COLUMN release TEXT;
INSERT INTO pending_upgrade_steps (step) VALUES ('scrub_deleted_data');",
    ),
    (
        19,
        // Every alert notice decided (docs/api.md, alerts), newest first by id.
        "CREATE TABLE alerts (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    alert       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    on_kind     TEXT    NOT NULL,
    source      TEXT,
    destination TEXT,
    since       INTEGER NOT NULL,
    at          INTEGER NOT NULL,
    repeated    INTEGER NOT NULL,
    summary     TEXT    NOT NULL,
    figures     TEXT    NOT NULL
);",
    ),
    (20, STATS),
    (21, SQLITE_SEARCH),
    (22, SQLITE_ALERT_STATE),
    (
        23,
        // PostgreSQL's version 23 moves its backlog counting off the row ingest locks;
        // SQLite's one writer counts as before. Recorded, so that one version names one
        // schema.
        "-- nothing to change",
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
    (
        3,
        r#"
-- The highest sequence received per aggregate: out-of-order counting by order of receipt.
CREATE TABLE aggregate_seen (
    source       TEXT   NOT NULL,
    aggregate    TEXT   NOT NULL,
    max_sequence BIGINT NOT NULL,
    PRIMARY KEY (source, aggregate)
);
INSERT INTO aggregate_seen (source, aggregate, max_sequence)
    SELECT source, aggregate, MAX(sequence) FROM events GROUP BY source, aggregate;

-- The held events by sequence: settling reads only the ones in reach.
CREATE INDEX events_held ON events (source, aggregate, sequence, id, received_at)
    WHERE status = 'held';

-- Undecided events per source, kept by statement triggers in the writing transaction:
-- the ingest transaction reads its source's row, locked, so that max_backlog is a hard limit.
CREATE TABLE backlog_counts (
    source TEXT   PRIMARY KEY,
    n      BIGINT NOT NULL
);
INSERT INTO backlog_counts (source, n)
    SELECT source, COUNT(*) FILTER (WHERE status IN ('received', 'held', 'retrying'))
    FROM events GROUP BY source;

CREATE FUNCTION backlog_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO backlog_counts (source, n)
            SELECT source, COUNT(*) FROM new_rows
            WHERE status IN ('received', 'held', 'retrying') GROUP BY source ORDER BY source
            ON CONFLICT (source) DO UPDATE SET n = backlog_counts.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO backlog_counts (source, n)
            SELECT source, SUM(d) FROM (
                SELECT source, 1 AS d FROM new_rows
                WHERE status IN ('received', 'held', 'retrying')
                UNION ALL
                SELECT source, -1 FROM old_rows
                WHERE status IN ('received', 'held', 'retrying')) t
            GROUP BY source HAVING SUM(d) <> 0 ORDER BY source
            ON CONFLICT (source) DO UPDATE SET n = backlog_counts.n + EXCLUDED.n;
    ELSE
        UPDATE backlog_counts b SET n = b.n - d.n
            FROM (SELECT source, COUNT(*) AS n FROM old_rows
                  WHERE status IN ('received', 'held', 'retrying') GROUP BY source) d
            WHERE b.source = d.source;
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER backlog_counts_insert AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION backlog_counts_apply();
CREATE TRIGGER backlog_counts_update AFTER UPDATE ON events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION backlog_counts_apply();
CREATE TRIGGER backlog_counts_delete AFTER DELETE ON events
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION backlog_counts_apply();
"#,
    ),
    (
        4,
        // Pages and bulk replays walk these keys with `ORDER BY` and `>` cursors: by bytes,
        // as SQLite compares text, whatever collation the database was created with (an
        // `en_US` one puts `a_1` before `A1` before `Z_1`). Changing a column's collation
        // leaves its rows as they are and rebuilds the indexes on it, so pages still read
        // them in index order. Their other sides (parameters, UNNEST arrays, columns left at
        // the database default) take the column's collation, so joins keep their indexes.
        r#"
ALTER TABLE events
    ALTER COLUMN source TYPE TEXT COLLATE "C",
    ALTER COLUMN aggregate TYPE TEXT COLLATE "C";
ALTER TABLE presence_state ALTER COLUMN user_id TYPE TEXT COLLATE "C";
ALTER TABLE save_state ALTER COLUMN aggregate TYPE TEXT COLLATE "C";
"#,
    ),
    (
        5,
        // As SQLite's version 5: one aggregate-state table, the typed ones copied in.
        r#"
CREATE TABLE aggregate_state (
    source     TEXT COLLATE "C" NOT NULL,
    aggregate  TEXT COLLATE "C" NOT NULL,
    sequence   BIGINT,
    event_id   TEXT,
    event_type TEXT,
    state      TEXT   NOT NULL,
    tag        TEXT COLLATE "C",
    watermark  BIGINT,
    updated_at BIGINT NOT NULL,
    PRIMARY KEY (source, aggregate)
);
CREATE INDEX aggregate_state_by_tag ON aggregate_state (source, tag, aggregate);
INSERT INTO aggregate_state
    (source, aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at)
SELECT source, user_id, sequence, NULL, 'presence.changed',
       json_build_object('presence', presence)::text, presence, NULL, updated_at
FROM presence_state;
INSERT INTO aggregate_state
    (source, aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at)
SELECT source, aggregate, last_sequence, NULL, NULL,
       json_build_object('progress', progress::json, 'progress_sequence', progress_sequence,
                         'inventory', inventory::json, 'inventory_sequence', inventory_sequence,
                         'snapshot_sequence', snapshot_sequence,
                         'achievements', achievements::json)::text,
       NULL, last_sequence, updated_at
FROM save_state;
DROP TABLE presence_state;
DROP TABLE save_state;
"#,
    ),
    (
        6,
        // As SQLite's version 6; keys compared by bytes as version 4 made them.
        r#"
CREATE TABLE deliveries (
    id              BIGSERIAL PRIMARY KEY,
    destination     TEXT COLLATE "C" NOT NULL,
    source          TEXT COLLATE "C" NOT NULL,
    event_row       BIGINT NOT NULL,
    event_id        TEXT   NOT NULL,
    aggregate       TEXT COLLATE "C" NOT NULL,
    sequence        BIGINT NOT NULL,
    event_type      TEXT   NOT NULL,
    webhook_id      TEXT   NOT NULL,
    ordering        TEXT   NOT NULL,
    status          TEXT   NOT NULL,
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT,
    lease_owner     TEXT,
    lease_until     BIGINT,
    last_error      TEXT,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT
);
CREATE INDEX deliveries_queue ON deliveries (destination, source, aggregate, id);
CREATE INDEX deliveries_by_status ON deliveries (destination, status, id);
CREATE INDEX deliveries_event ON deliveries (event_row);

CREATE TABLE delivery_attempts (
    id          BIGSERIAL PRIMARY KEY,
    delivery    BIGINT NOT NULL,
    attempt     BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    duration_ms BIGINT NOT NULL,
    http_status BIGINT,
    result      TEXT   NOT NULL
);
CREATE INDEX delivery_attempts_delivery ON delivery_attempts (delivery, id);

CREATE TABLE delivery_replay_jobs (
    id               BIGSERIAL PRIMARY KEY,
    destination      TEXT COLLATE "C" NOT NULL,
    status           TEXT   NOT NULL,
    aggregate        TEXT COLLATE "C",
    state            TEXT   NOT NULL,
    total            BIGINT NOT NULL,
    requeued         BIGINT NOT NULL DEFAULT 0,
    cursor_source    TEXT COLLATE "C",
    cursor_aggregate TEXT COLLATE "C",
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
"#,
    ),
    (
        7,
        // As SQLite's version 7, and the overview's counts without a scan of the log. Every
        // statement writing events appends its net change per (source, status) to
        // `event_count_deltas` (plain inserts: no row two transactions both lock, so no
        // ingest waits for another's counter); readers fold the deltas into `event_counts`
        // one at a time (see `fold_counts`) and add up what is left.
        r#"
-- Pages of the rare decided statuses (dead letters above all) by id, without walking the
-- log: only rows decided dead or ignored enter them, so ingest and settling pay nothing.
CREATE INDEX events_by_status ON events (status, id)
    WHERE status IN ('dead', 'ignored_stale', 'ignored_unsupported');
CREATE INDEX events_by_source_status ON events (source, status, id)
    WHERE status IN ('dead', 'ignored_stale', 'ignored_unsupported');
-- A source's page by id, however small its share of the log (a full index: one more
-- entry per event; the only one this version adds to ingest).
CREATE INDEX events_by_source ON events (source, id);
-- A destination's blocked aggregates (dead deliveries only) and its last failed attempt
-- (failures only), without reading its whole history; and its deliveries of one aggregate.
CREATE INDEX deliveries_dead ON deliveries (destination, ordering, source, aggregate)
    WHERE status = 'dead';
CREATE INDEX delivery_attempts_failed ON delivery_attempts (id)
    WHERE http_status IS NULL OR http_status < 200 OR http_status > 299;
CREATE INDEX deliveries_by_aggregate ON deliveries (destination, aggregate, id);

CREATE TABLE event_counts (
    source TEXT COLLATE "C" NOT NULL,
    status TEXT   NOT NULL,
    n      BIGINT NOT NULL,
    PRIMARY KEY (source, status)
);
CREATE TABLE event_count_deltas (
    source TEXT COLLATE "C" NOT NULL,
    status TEXT   NOT NULL,
    n      BIGINT NOT NULL
);
INSERT INTO event_counts (source, status, n)
    SELECT source, status, COUNT(*) FROM events GROUP BY source, status;

CREATE FUNCTION event_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO event_count_deltas (source, status, n)
            SELECT source, status, COUNT(*) FROM new_rows GROUP BY source, status;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO event_count_deltas (source, status, n)
            SELECT source, status, SUM(d) FROM (
                SELECT source, status, 1 AS d FROM new_rows
                UNION ALL
                SELECT source, status, -1 FROM old_rows) t
            GROUP BY source, status HAVING SUM(d) <> 0;
    ELSE
        INSERT INTO event_count_deltas (source, status, n)
            SELECT source, status, -COUNT(*) FROM old_rows GROUP BY source, status;
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER event_counts_insert AFTER INSERT ON events
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION event_counts_apply();
CREATE TRIGGER event_counts_update AFTER UPDATE ON events
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION event_counts_apply();
CREATE TRIGGER event_counts_delete AFTER DELETE ON events
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION event_counts_apply();
"#,
    ),
    (
        8,
        // A queue's active deliveries (and dead ones, which may block it) by id, without
        // its delivered history: a claim finds a queue's first undecided row and whether
        // an older one holds it back in a few index entries however long the queue ran.
        r#"
CREATE INDEX deliveries_active ON deliveries (destination, source, aggregate, id)
    WHERE status IN ('pending', 'in_flight', 'retrying', 'dead');
"#,
    ),
    (
        9,
        // Decisions lower a source's backlog in one of 64 rows picked by the connection,
        // not in the row every ingest batch locks: before, every deciding transaction waited
        // for the ingest batch holding that row, and each batch for the deciders (on
        // PostgreSQL, much of the deciding time was that wait: docs/benchmarks.md). Ingest reads its locked row plus
        // the committed decrements; a decrement not yet committed is not seen, so the backlog
        // it reads is never below the true one and `max_backlog` stays a hard limit.
        r#"
-- As SQLite's version 9: settling reads an aggregate's waiting rows, not its history.
CREATE INDEX events_arriving ON events (source, aggregate, sequence)
    WHERE status IN ('received', 'retrying');

CREATE TABLE backlog_decrements (
    source TEXT   NOT NULL,
    shard  INT    NOT NULL,
    n      BIGINT NOT NULL,
    PRIMARY KEY (source, shard)
);

CREATE OR REPLACE FUNCTION backlog_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO backlog_counts (source, n)
            SELECT source, COUNT(*) FROM new_rows
            WHERE status IN ('received', 'held', 'retrying') GROUP BY source ORDER BY source
            ON CONFLICT (source) DO UPDATE SET n = backlog_counts.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        -- Increases (replays) on the row ingest locks, so that none is missed; decreases
        -- (decisions) on this connection's shard.
        WITH change AS (
            SELECT source, SUM(d) AS n FROM (
                SELECT source, 1 AS d FROM new_rows
                WHERE status IN ('received', 'held', 'retrying')
                UNION ALL
                SELECT source, -1 FROM old_rows
                WHERE status IN ('received', 'held', 'retrying')) t
            GROUP BY source HAVING SUM(d) <> 0),
        raised AS (
            INSERT INTO backlog_counts (source, n)
                SELECT source, n FROM change WHERE n > 0 ORDER BY source
                ON CONFLICT (source) DO UPDATE SET n = backlog_counts.n + EXCLUDED.n)
        INSERT INTO backlog_decrements (source, shard, n)
            SELECT source, pg_backend_pid() % 64, n FROM change WHERE n < 0 ORDER BY source
            ON CONFLICT (source, shard) DO UPDATE SET n = backlog_decrements.n + EXCLUDED.n;
    ELSE
        INSERT INTO backlog_decrements (source, shard, n)
            SELECT source, pg_backend_pid() % 64, -COUNT(*) FROM old_rows
            WHERE status IN ('received', 'held', 'retrying') GROUP BY source ORDER BY source
            ON CONFLICT (source, shard) DO UPDATE SET n = backlog_decrements.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$fn$;
"#,
    ),
    (
        10,
        // Version 10 rewrites SQLite's partial index conditions (a constant IN list costs
        // SQLite a temporary b-tree per statement); PostgreSQL evaluates IN lists directly,
        // so its schema is unchanged. Recorded, so that one version names one schema.
        "SELECT 1;",
    ),
    (
        11,
        // As SQLite's version 11.
        "ALTER TABLE aggregate_state ADD COLUMN skipped_gaps TEXT;",
    ),
    (12, UPGRADE_STEPS),
    (13, BODY_DEDUP),
    (
        14,
        // As SQLite's version 14 for the counts by status, written as event counts are
        // (version 7): statements append their net change to `delivery_count_deltas`, no
        // row two senders both lock, and readers fold them. Blocked aggregates are still
        // counted from the `deliveries_dead` index: PostgreSQL's readers wait for no writer.
        POSTGRES_DELIVERY_COUNTS,
    ),
    (15, POSTGRES_ENCRYPTION),
    (16, FAILED_ATTEMPTS),
    (17, UNORDERED_EVENTS),
    (
        18,
        // As SQLite's version 18, without the scrub: PostgreSQL's files are rewritten by
        // VACUUM (docs/encryption.md, erasure).
        "ALTER TABLE schema_migrations ADD COLUMN release TEXT;",
    ),
    (
        19,
        // As SQLite's version 19.
        "CREATE TABLE alerts (
    id          BIGSERIAL PRIMARY KEY,
    alert       TEXT    NOT NULL,
    state       TEXT    NOT NULL,
    on_kind     TEXT    NOT NULL,
    source      TEXT,
    destination TEXT,
    since       BIGINT  NOT NULL,
    at          BIGINT  NOT NULL,
    repeated    BIGINT  NOT NULL,
    summary     TEXT    NOT NULL,
    figures     TEXT    NOT NULL
);",
    ),
    (20, STATS),
    (21, POSTGRES_SEARCH),
    (22, POSTGRES_ALERT_STATE),
    (23, POSTGRES_BACKLOG_SHARDS),
];

/// PostgreSQL's version 23: a delivery's insert counts into its connection's shard of
/// `backlog_decrements` (signed now), as decisions do (version 9), not into the source's
/// counter row. Before, the insert's trigger locked that row until commit, so every ingest
/// batch of a source waited for the one before it to commit, 913 µs per event
/// (docs/benchmarks.md, issue #45). A batch now locks the row only to check `max_backlog`,
/// after its insert, and reads the total in a statement of its own once it holds it: every
/// increment committed by an earlier holder is then seen, so the limit stays hard. Raises
/// by replays stay on the counter row, which they lock, so that no check misses them.
const POSTGRES_BACKLOG_SHARDS: &str = r#"
CREATE OR REPLACE FUNCTION backlog_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO backlog_decrements (source, shard, n)
            SELECT source, pg_backend_pid() % 64, COUNT(*) FROM new_rows
            WHERE status IN ('received', 'held', 'retrying') GROUP BY source ORDER BY source
            ON CONFLICT (source, shard) DO UPDATE SET n = backlog_decrements.n + EXCLUDED.n;
    ELSIF TG_OP = 'UPDATE' THEN
        WITH change AS (
            SELECT source, SUM(d) AS n FROM (
                SELECT source, 1 AS d FROM new_rows
                WHERE status IN ('received', 'held', 'retrying')
                UNION ALL
                SELECT source, -1 FROM old_rows
                WHERE status IN ('received', 'held', 'retrying')) t
            GROUP BY source HAVING SUM(d) <> 0),
        raised AS (
            INSERT INTO backlog_counts (source, n)
                SELECT source, n FROM change WHERE n > 0 ORDER BY source
                ON CONFLICT (source) DO UPDATE SET n = backlog_counts.n + EXCLUDED.n)
        INSERT INTO backlog_decrements (source, shard, n)
            SELECT source, pg_backend_pid() % 64, n FROM change WHERE n < 0 ORDER BY source
            ON CONFLICT (source, shard) DO UPDATE SET n = backlog_decrements.n + EXCLUDED.n;
    ELSE
        INSERT INTO backlog_decrements (source, shard, n)
            SELECT source, pg_backend_pid() % 64, -COUNT(*) FROM old_rows
            WHERE status IN ('received', 'held', 'retrying') GROUP BY source ORDER BY source
            ON CONFLICT (source, shard) DO UPDATE SET n = backlog_decrements.n + EXCLUDED.n;
    END IF;
    RETURN NULL;
END
$fn$;
"#;

/// The search index (docs/api.md, search), version 21 of SQLite: one row per declared
/// field an event's body holds, written with the event; the value in clear, or its keyed
/// hash when encryption is on. A lookup by field and value (and source) reads its key's
/// prefix; a purge or an erasure deletes an event's rows by `event_row`.
const SQLITE_SEARCH: &str = "
CREATE TABLE event_search (
    field     TEXT    NOT NULL,
    value     TEXT    NOT NULL,
    source    TEXT    NOT NULL,
    event_row INTEGER NOT NULL,
    PRIMARY KEY (field, value, source, event_row)
) WITHOUT ROWID;
CREATE INDEX event_search_row ON event_search (event_row);
";

/// PostgreSQL's version 21, as SQLite's (texts compared by bytes, as every key since version 4).
const POSTGRES_SEARCH: &str = r#"
CREATE TABLE event_search (
    field     TEXT COLLATE "C" NOT NULL,
    value     TEXT COLLATE "C" NOT NULL,
    source    TEXT COLLATE "C" NOT NULL,
    event_row BIGINT NOT NULL,
    PRIMARY KEY (field, value, source, event_row)
);
CREATE INDEX event_search_row ON event_search (event_row);
"#;

/// Alerts decided once across nodes and sent after a restart (docs/configuration.md, alerts),
/// version 22 of SQLite: the alerts firing now, one row per rule and subject (a source, a
/// destination or '' for the store), whose conditional writes decide which node tells a
/// transition; the node a per-node notice was decided on; and the outbox, one row per
/// notice and channel, sent in id order per channel by one node at a time (a lease).
const SQLITE_ALERT_STATE: &str = "
CREATE TABLE alerts_firing (
    alert     TEXT    NOT NULL,
    subject   TEXT    NOT NULL,
    since     INTEGER NOT NULL,
    last_sent INTEGER NOT NULL,
    repeats   INTEGER NOT NULL,
    PRIMARY KEY (alert, subject)
);
ALTER TABLE alerts ADD COLUMN node TEXT;
CREATE TABLE alert_outbox (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    alert_id        INTEGER NOT NULL,
    channel         TEXT    NOT NULL,
    state           TEXT    NOT NULL,
    attempts        INTEGER NOT NULL,
    next_attempt_at INTEGER NOT NULL,
    leased_by       TEXT,
    lease_until     INTEGER,
    sent_at         INTEGER,
    error           TEXT
);
CREATE INDEX alert_outbox_pending ON alert_outbox (channel, id) WHERE state = 'pending';
CREATE INDEX alert_outbox_alert ON alert_outbox (alert_id);
";

/// PostgreSQL's version 22, as SQLite's.
const POSTGRES_ALERT_STATE: &str = r#"
CREATE TABLE alerts_firing (
    alert     TEXT COLLATE "C" NOT NULL,
    subject   TEXT COLLATE "C" NOT NULL,
    since     BIGINT NOT NULL,
    last_sent BIGINT NOT NULL,
    repeats   BIGINT NOT NULL,
    PRIMARY KEY (alert, subject)
);
ALTER TABLE alerts ADD COLUMN node TEXT;
CREATE TABLE alert_outbox (
    id              BIGSERIAL PRIMARY KEY,
    alert_id        BIGINT NOT NULL,
    channel         TEXT COLLATE "C" NOT NULL,
    state           TEXT   NOT NULL,
    attempts        BIGINT NOT NULL,
    next_attempt_at BIGINT NOT NULL,
    leased_by       TEXT,
    lease_until     BIGINT,
    sent_at         BIGINT,
    error           TEXT
);
CREATE INDEX alert_outbox_pending ON alert_outbox (channel, id) WHERE state = 'pending';
CREATE INDEX alert_outbox_alert ON alert_outbox (alert_id);
"#;

/// A broker's confirmed publish has no HTTP status: the index of failed attempts (a
/// destination's `last_error`) leaves it out by its result (`forward::answer::CONFIRMED`),
/// so that a healthy broker destination shows no error and its scrape reads no history
/// (version 16, both stores).
const FAILED_ATTEMPTS: &str = "
DROP INDEX delivery_attempts_failed;
CREATE INDEX delivery_attempts_failed ON delivery_attempts (id)
    WHERE (http_status IS NULL AND result <> 'delivered') OR http_status < 200 OR http_status > 299;
";

/// Why an event was applied unordered though its source orders events: its type carries no
/// version, or its body lacks a location (docs/contract.md, missing locations), version 17
/// of both stores. NULL for ordered events and for every row of older releases.
const UNORDERED_EVENTS: &str = "ALTER TABLE events ADD COLUMN unordered TEXT;";

/// Figures over time (docs/api.md, stats), version 20 of both stores: one row per minute and
/// figure, which every node's flush adds to; pruned by minute after `stats_retention_days`.
const STATS: &str = "
CREATE TABLE stats (
    scope TEXT NOT NULL,
    name TEXT NOT NULL,
    minute BIGINT NOT NULL,
    figure TEXT NOT NULL,
    value BIGINT NOT NULL,
    PRIMARY KEY (scope, name, minute, figure)
);
CREATE INDEX stats_by_minute ON stats (minute);
";

/// The release this binary is, as it records itself beside the schema versions it applies.
pub(crate) const RELEASE: &str = env!("CARGO_PKG_VERSION");

/// The highest schema version `chain` knows.
pub(crate) fn latest(chain: &[(i64, &str)]) -> i64 {
    chain.last().map_or(0, |(version, _)| *version)
}

/// Why a store whose schema is at `version`, above every version of `chain`, is not
/// opened: a newer release wrote it (`release`, when it recorded itself), and this one
/// would read and write it as a schema it does not know.
pub(crate) fn newer_schema(
    version: i64,
    release: Option<String>,
    chain: &[(i64, &str)],
) -> super::StoreError {
    let (writer, run) = match release {
        Some(release) => (
            format!("inhook {release}"),
            format!("run inhook {release} or later on it"),
        ),
        None => (
            "a newer inhook release (which did not record itself)".to_owned(),
            "run the release that wrote it, or a later one".to_owned(),
        ),
    };
    super::StoreError::Internal(
        format!(
            "the store's schema version {version} was written by {writer}; this inhook {RELEASE} \
             knows schema versions up to {}, and does not open a store it cannot read and \
             write correctly: {run} (a schema is never migrated back)",
            latest(chain)
        )
        .into(),
    )
}

/// A raw body equal to a logged one of the source is a duplicate when its scheme signs
/// neither a delivery id nor a timestamp (docs/contract.md, duplicates): the body's
/// SHA-256, unique per source where set (version 13). Rows of older releases have none.
const BODY_DEDUP: &str = "
ALTER TABLE events ADD COLUMN body_sha256 TEXT;
CREATE UNIQUE INDEX events_body ON events (source, body_sha256) WHERE body_sha256 IS NOT NULL;
";

/// The queue of one-time upgrade steps, with the headers step in it (version 12).
const UPGRADE_STEPS: &str = "
CREATE TABLE pending_upgrade_steps (step TEXT PRIMARY KEY);
INSERT INTO pending_upgrade_steps (step) VALUES ('prune_stored_headers');
";

/// SQLite's version 14. A queue is blocked while it holds a dead delivery of an in-order
/// lane (`DeliveryOrder::blocks_when_dead`: the orders named `in-order…`); the count of
/// blocked queues is the pseudo-status `blocked_aggregates`. The deltas table stays empty
/// here (the one writer updates the counts in place); it is read as PostgreSQL's is.
const SQLITE_DELIVERY_COUNTS: &str = r#"
CREATE TABLE delivery_counts (
    destination TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    n           INTEGER NOT NULL,
    PRIMARY KEY (destination, status)
);
CREATE TABLE delivery_count_deltas (
    destination TEXT    NOT NULL,
    status      TEXT    NOT NULL,
    n           INTEGER NOT NULL
);
INSERT INTO delivery_counts (destination, status, n)
    SELECT destination, status, COUNT(*) FROM deliveries GROUP BY destination, status;
CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries BEGIN
    INSERT INTO delivery_counts (destination, status, n) VALUES (new.destination, new.status, 1)
        ON CONFLICT (destination, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER delivery_counts_update AFTER UPDATE OF status ON deliveries
    WHEN old.status <> new.status BEGIN
    UPDATE delivery_counts SET n = n - 1
        WHERE destination = old.destination AND status = old.status;
    INSERT INTO delivery_counts (destination, status, n) VALUES (new.destination, new.status, 1)
        ON CONFLICT (destination, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries BEGIN
    UPDATE delivery_counts SET n = n - 1
        WHERE destination = old.destination AND status = old.status;
END;

CREATE TABLE blocked_queues (
    destination TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    aggregate   TEXT    NOT NULL,
    n           INTEGER NOT NULL,
    PRIMARY KEY (destination, source, aggregate)
);
INSERT INTO blocked_queues (destination, source, aggregate, n)
    SELECT destination, source, aggregate, COUNT(*) FROM deliveries
    WHERE status = 'dead' AND ordering LIKE 'in-order%'
    GROUP BY destination, source, aggregate;
INSERT INTO delivery_counts (destination, status, n)
    SELECT destination, 'blocked_aggregates', COUNT(*) FROM blocked_queues GROUP BY destination;
CREATE TRIGGER blocked_queues_inserted AFTER INSERT ON deliveries
    WHEN new.status = 'dead' AND new.ordering LIKE 'in-order%' BEGIN
    INSERT INTO blocked_queues (destination, source, aggregate, n)
        VALUES (new.destination, new.source, new.aggregate, 1)
        ON CONFLICT (destination, source, aggregate) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER blocked_queues_died AFTER UPDATE OF status ON deliveries
    WHEN new.status = 'dead' AND old.status <> 'dead' AND new.ordering LIKE 'in-order%' BEGIN
    INSERT INTO blocked_queues (destination, source, aggregate, n)
        VALUES (new.destination, new.source, new.aggregate, 1)
        ON CONFLICT (destination, source, aggregate) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER blocked_queues_revived AFTER UPDATE OF status ON deliveries
    WHEN old.status = 'dead' AND new.status <> 'dead' AND old.ordering LIKE 'in-order%' BEGIN
    UPDATE blocked_queues SET n = n - 1
        WHERE destination = old.destination AND source = old.source AND aggregate = old.aggregate;
    DELETE FROM blocked_queues
        WHERE destination = old.destination AND source = old.source AND aggregate = old.aggregate
          AND n <= 0;
END;
CREATE TRIGGER blocked_queues_deleted AFTER DELETE ON deliveries
    WHEN old.status = 'dead' AND old.ordering LIKE 'in-order%' BEGIN
    UPDATE blocked_queues SET n = n - 1
        WHERE destination = old.destination AND source = old.source AND aggregate = old.aggregate;
    DELETE FROM blocked_queues
        WHERE destination = old.destination AND source = old.source AND aggregate = old.aggregate
          AND n <= 0;
END;
CREATE TRIGGER blocked_count_up AFTER INSERT ON blocked_queues BEGIN
    INSERT INTO delivery_counts (destination, status, n)
        VALUES (new.destination, 'blocked_aggregates', 1)
        ON CONFLICT (destination, status) DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER blocked_count_down AFTER DELETE ON blocked_queues BEGIN
    UPDATE delivery_counts SET n = n - 1
        WHERE destination = old.destination AND status = 'blocked_aggregates';
END;
"#;

/// PostgreSQL's version 14.
const POSTGRES_DELIVERY_COUNTS: &str = r#"
CREATE TABLE delivery_counts (
    destination TEXT COLLATE "C" NOT NULL,
    status      TEXT   NOT NULL,
    n           BIGINT NOT NULL,
    PRIMARY KEY (destination, status)
);
CREATE TABLE delivery_count_deltas (
    destination TEXT COLLATE "C" NOT NULL,
    status      TEXT   NOT NULL,
    n           BIGINT NOT NULL
);
INSERT INTO delivery_counts (destination, status, n)
    SELECT destination, status, COUNT(*) FROM deliveries GROUP BY destination, status;

CREATE FUNCTION delivery_counts_apply() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO delivery_count_deltas (destination, status, n)
            SELECT destination, status, COUNT(*) FROM new_rows GROUP BY destination, status;
    ELSIF TG_OP = 'UPDATE' THEN
        INSERT INTO delivery_count_deltas (destination, status, n)
            SELECT destination, status, SUM(d) FROM (
                SELECT destination, status, 1 AS d FROM new_rows
                UNION ALL
                SELECT destination, status, -1 FROM old_rows) t
            GROUP BY destination, status HAVING SUM(d) <> 0;
    ELSE
        INSERT INTO delivery_count_deltas (destination, status, n)
            SELECT destination, status, -COUNT(*) FROM old_rows GROUP BY destination, status;
    END IF;
    RETURN NULL;
END
$fn$;
CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION delivery_counts_apply();
CREATE TRIGGER delivery_counts_update AFTER UPDATE ON deliveries
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION delivery_counts_apply();
CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries
    REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION delivery_counts_apply();
"#;

/// Encryption at rest (docs/encryption.md), SQLite's version 15: each aggregate's data
/// key wrapped by a master key, apart from the rows it seals (a forget deletes it); the
/// store's own keys (the body hasher's); the data key an event's columns are sealed
/// under (NULL: written before encryption was on, or erased); an aggregate's change rows
/// found without a scan of the feed (a forget deletes them).
const SQLITE_ENCRYPTION: &str = "
CREATE TABLE data_keys (
    id         INTEGER PRIMARY KEY,
    source     TEXT    NOT NULL,
    aggregate  TEXT    NOT NULL,
    master_key TEXT    NOT NULL,
    wrapped    BLOB    NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (source, aggregate)
);
CREATE INDEX data_keys_master ON data_keys (master_key);
CREATE TABLE store_keys (
    name       TEXT    PRIMARY KEY,
    master_key TEXT    NOT NULL,
    wrapped    BLOB    NOT NULL,
    created_at INTEGER NOT NULL
);
ALTER TABLE events ADD COLUMN data_key INTEGER;
CREATE INDEX state_changes_aggregate ON state_changes (source, aggregate);
";

/// PostgreSQL's version 15, as SQLite's.
const POSTGRES_ENCRYPTION: &str = r#"
CREATE TABLE data_keys (
    id         BIGINT PRIMARY KEY,
    source     TEXT COLLATE "C" NOT NULL,
    aggregate  TEXT COLLATE "C" NOT NULL,
    master_key TEXT COLLATE "C" NOT NULL,
    wrapped    BYTEA  NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (source, aggregate)
);
CREATE INDEX data_keys_master ON data_keys (master_key);
CREATE TABLE store_keys (
    name       TEXT PRIMARY KEY,
    master_key TEXT COLLATE "C" NOT NULL,
    wrapped    BYTEA  NOT NULL,
    created_at BIGINT NOT NULL
);
ALTER TABLE events ADD COLUMN data_key BIGINT;
CREATE INDEX state_changes_aggregate ON state_changes (source, aggregate);
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scrub_step_queued_is_the_one_the_store_runs() {
        let (version, eighteen) = SQLITE[17];
        assert_eq!(version, 18);
        assert!(eighteen.contains(&format!("'{}'", super::super::SCRUB_STEP)));
    }

    #[test]
    fn a_newer_schema_is_refused_naming_its_version_and_release() {
        let refused = newer_schema(99, Some("9.8.7".into()), SQLITE).to_string();
        assert!(
            refused.contains("schema version 99 was written by inhook 9.8.7"),
            "{refused}"
        );
        assert!(
            refused.contains(&format!("up to {}", latest(SQLITE))),
            "{refused}"
        );
        assert!(refused.contains("run inhook 9.8.7 or later"), "{refused}");
        let unknown = newer_schema(99, None, POSTGRES).to_string();
        assert!(unknown.contains("a newer inhook release"), "{unknown}");
    }
}
