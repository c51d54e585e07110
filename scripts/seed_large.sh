#!/usr/bin/env bash
# Fills a SQLite store with a large, decided history, for the "cost stays flat as
# work grows" benchmark: ROWS processed save-game events spread over AGGREGATES
# slots (each with its aggregate_state row), written straight into the schema that
# `inhook migrate` creates.
# Usage: scripts/seed_large.sh DB_FILE [AGGREGATES] [ROWS]
set -euo pipefail
cd "$(dirname "$0")/.."
DB=$1
AGGREGATES=${2:-1000000}
ROWS=${3:-10000000}
BIN=${INHOOK_BIN:-target/release/inhook}
# Received over the last hours, so that the default 30-day retention leaves them be.
NOW_MS=$(( $(date +%s) * 1000 - ROWS ))
INHOOK_DATABASE="sqlite://$DB" INHOOK_SAVE_GAME_SECRET=x INHOOK_PRESENCE_SECRET=x "$BIN" migrate
sqlite3 "$DB" <<SQL
PRAGMA synchronous = OFF;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS - 1)
INSERT INTO events (source, event_id, event_type, aggregate, sequence, idempotency_key, body,
                    signature_valid, received_at, status, decided_at)
SELECT 'save-game', 'seed_' || i, 'inventory.updated',
       'seed_' || (i % $AGGREGATES) || char(31) || 'slot_a', i / $AGGREGATES + 1, 'seed_' || i,
       CAST('{"added_items":[{"item_id":"gem","qty":1}]}' AS BLOB), 1,
       $NOW_MS + i, 'processed', $NOW_MS + i
FROM n;
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < $AGGREGATES - 1)
INSERT INTO aggregate_state (source, aggregate, sequence, event_id, event_type, state, tag,
                             watermark, updated_at)
SELECT 'save-game', 'seed_' || i || char(31) || 'slot_a', $ROWS / $AGGREGATES, NULL, NULL,
       json_object('progress', NULL, 'progress_sequence', NULL,
                   'inventory', json_object('gem', $ROWS / $AGGREGATES),
                   'inventory_sequence', $ROWS / $AGGREGATES, 'snapshot_sequence', NULL,
                   'achievements', json_array()),
       NULL, $ROWS / $AGGREGATES, $NOW_MS
FROM n;
INSERT INTO aggregate_seen (source, aggregate, max_sequence)
SELECT source, aggregate, watermark FROM aggregate_state WHERE source = 'save-game';
COMMIT;
SQL
echo "seeded $DB: $(sqlite3 "$DB" 'SELECT count(*) FROM events') events, $(sqlite3 "$DB" 'SELECT count(*) FROM aggregate_state') slots"
