#!/usr/bin/env bash
# Fills a store (SQLite file or PostgreSQL database) with a large, mostly decided log for the
# read-cost benchmark and EXPLAIN audits: N events of source save-game over N/10 aggregates
# (97 % processed, 1 % dead, 1 % ignored_stale, 1 % ignored_unsupported), one delivery row per
# event to destination `app` (99 % delivered, 1 % dead) with one attempt each, written straight
# into the schema that `inhook migrate` creates.
# Usage: scripts/seed_reads.sh DATABASE [N]   (DATABASE: sqlite://FILE or postgres://...)
set -euo pipefail
cd "$(dirname "$0")/.."
DB=$1
N=${2:-1000000}
BIN=${INHOOK_BIN:-target/release/inhook}
# Received over the last hours, so that the default 30-day retention leaves them be.
NOW_MS=$(( $(date +%s) * 1000 - N ))
INHOOK_DATABASE="$DB" INHOOK_SAVE_GAME_SECRET=x INHOOK_PRESENCE_SECRET=x "$BIN" migrate >/dev/null
STATUS="CASE WHEN i % 100 = 1 THEN 'dead' WHEN i % 100 = 2 THEN 'ignored_stale'
             WHEN i % 100 = 3 THEN 'ignored_unsupported' ELSE 'processed' END"
EVENTS="INSERT INTO events (source, event_id, event_type, aggregate, sequence, idempotency_key,
                    body, signature_valid, received_at, status, decided_at, dead_reason)
SELECT 'save-game', 'seed_' || i, 'inventory.updated', 'seed_' || (i % ($N / 10 + 1)) || '/slot_a',
       i / ($N / 10 + 1) + 1, 'seed_' || i, BODY, SIGNED_VALUE, $NOW_MS + i, $STATUS, $NOW_MS + i,
       CASE WHEN i % 100 = 1 THEN 'exhausted' END
FROM n;
INSERT INTO deliveries (destination, source, event_row, event_id, aggregate, sequence, event_type,
                        webhook_id, ordering, status, attempts, created_at, delivered_at)
SELECT 'app', source, id, event_id, aggregate, sequence, event_type, 'wh_' || id, 'none',
       CASE WHEN id % 100 = 5 THEN 'dead' ELSE 'delivered' END, 1, received_at, received_at
FROM events;
INSERT INTO delivery_attempts (delivery, attempt, at, duration_ms, http_status, result)
SELECT id, 1, created_at, 3, CASE WHEN status = 'dead' THEN 500 ELSE 200 END,
       CASE WHEN status = 'dead' THEN 'http 500' ELSE 'delivered' END
FROM deliveries;"
BODY_JSON='{"added_items":[{"item_id":"gem","qty":1}]}'
# fill BODY SIGNED: the statements with the store's body and boolean literals.
fill() { local sql=${EVENTS//BODY/$1}; echo "${sql//SIGNED_VALUE/$2}"; }
case "$DB" in
sqlite://*)
    FILE=${DB#sqlite://}
    sqlite3 "$FILE" <<SQL
PRAGMA synchronous = OFF;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < $N - 1)
$(fill "CAST('$BODY_JSON' AS BLOB)" 1)
COMMIT;
ANALYZE;
SQL
    ;;
*)
    psql -q "$DB" <<SQL
SET synchronous_commit = off;
BEGIN;
WITH n(i) AS (SELECT generate_series(0, $N - 1))
$(fill "convert_to('$BODY_JSON', 'UTF8')" TRUE)
COMMIT;
VACUUM ANALYZE;
SQL
    ;;
esac
