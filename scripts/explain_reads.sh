#!/usr/bin/env bash
# Prints the plan (PostgreSQL: EXPLAIN ANALYZE; SQLite: EXPLAIN QUERY PLAN and the run time) of
# every read the dashboard and the API's list routes make, with the values a request would bind,
# on a store seeded by scripts/seed_reads.sh: a read that scans the log or the deliveries shows
# a Seq Scan / SCAN over `events` or `deliveries`, or a walk of the primary key that finds no row.
# Usage: scripts/explain_reads.sh DATABASE   (sqlite://FILE or postgres://...)
set -euo pipefail
DB=$1
COLS="id, source, event_id, event_type, aggregate, sequence, idempotency_key, body, signature_valid,
      signed_at, received_at, status, attempts, next_attempt_at, last_error, dead_reason, decided_at,
      replays, headers"
case "$DB" in sqlite://*) PG=0 ;; *) PG=1 ;; esac
if [ "$PG" = 1 ]; then
    OVERVIEW="SELECT source, status, SUM(n) FROM (SELECT source, status, n FROM event_counts
        UNION ALL SELECT source, status, n FROM event_count_deltas) c GROUP BY source, status"
    [ "$(psql -At "$DB" -c "SELECT to_regclass('event_counts') IS NULL")" = t ] &&
        OVERVIEW="SELECT source, status, COUNT(*) FROM events GROUP BY source, status"
else
    OVERVIEW="SELECT source, status, n FROM event_counts WHERE n > 0"
fi
QUERIES=(
"overview (GET /v1/overview)|$OVERVIEW"
"backlog gauges (GET /metrics)|SELECT source, status, COUNT(*) FROM events WHERE status IN ('received', 'held', 'retrying') GROUP BY source, status"
"event log, first page|SELECT $COLS FROM events WHERE TRUE ORDER BY id DESC LIMIT 51"
"event log, a later page|SELECT $COLS FROM events WHERE id < 500000 ORDER BY id DESC LIMIT 51"
"dead letters (status=dead)|SELECT $COLS FROM events WHERE status IN ('dead', 'ignored_stale', 'ignored_unsupported') AND status = 'dead' ORDER BY id DESC LIMIT 51"
"dead letters of a source|SELECT $COLS FROM events WHERE source = 'save-game' AND status IN ('dead', 'ignored_stale', 'ignored_unsupported') AND status = 'dead' ORDER BY id DESC LIMIT 51"
"event log, status=received (none)|SELECT $COLS FROM events WHERE status IN ('received', 'held', 'retrying') AND status = 'received' ORDER BY id DESC LIMIT 51"
"event log, status=processed|SELECT $COLS FROM events WHERE status = 'processed' ORDER BY id DESC LIMIT 51"
"event log, a source with no events|SELECT $COLS FROM events WHERE source = 'presence' ORDER BY id DESC LIMIT 51"
"event log, source and status of none|SELECT $COLS FROM events WHERE source = 'presence' AND status = 'processed' ORDER BY id DESC LIMIT 51"
"event log of an aggregate|SELECT $COLS FROM events WHERE source = 'save-game' AND aggregate = 'seed_42/slot_a' ORDER BY id DESC LIMIT 51"
"event log, received in a window|SELECT $COLS FROM events WHERE received_at >= 0 AND received_at < 1000 ORDER BY id DESC LIMIT 51"
"event detail|SELECT $COLS FROM events WHERE source = 'save-game' AND event_id = 'seed_4242'"
"event history|SELECT at, kind, error FROM event_attempts WHERE event_row = 4242 ORDER BY id"
"aggregates page|SELECT aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at FROM aggregate_state WHERE source = 'save-game' AND (CAST(NULL AS TEXT) IS NULL OR tag = NULL) AND (CAST('seed_1' AS TEXT) IS NULL OR aggregate > 'seed_1') ORDER BY aggregate LIMIT 51"
"presence page by status|SELECT aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at FROM aggregate_state WHERE source = 'presence' AND (CAST('online' AS TEXT) IS NULL OR tag = 'online') AND (CAST(NULL AS TEXT) IS NULL OR aggregate > NULL) ORDER BY aggregate LIMIT 51"
"stream, last change|SELECT COALESCE(MAX(id), 0) FROM state_changes"
"stream, changes after|SELECT id, source, aggregate, kind, at, state FROM state_changes WHERE id > 0 ORDER BY id LIMIT 100"
"destination stats, counts|SELECT status, COUNT(*) FROM deliveries WHERE destination = 'app' AND status IN ('pending', 'retrying', 'in_flight', 'dead') GROUP BY status"
"destination stats, blocked|SELECT COUNT(*) FROM (SELECT DISTINCT source, aggregate FROM deliveries WHERE destination = 'app' AND status = 'dead' AND ordering IN ('strict')) b"
"destination stats, last error|SELECT a.result FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery WHERE d.destination = 'app' AND (a.http_status IS NULL OR a.http_status < 200 OR a.http_status > 299) ORDER BY a.id DESC LIMIT 1"
"destination stats, last error (other destination)|SELECT a.result FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery WHERE d.destination = 'other' AND (a.http_status IS NULL OR a.http_status < 200 OR a.http_status > 299) ORDER BY a.id DESC LIMIT 1"
"deliveries page|SELECT id, status FROM deliveries WHERE destination = 'app' ORDER BY id DESC LIMIT 51"
"deliveries page, status=dead|SELECT id, status FROM deliveries WHERE destination = 'app' AND status = 'dead' ORDER BY id DESC LIMIT 51"
"deliveries page, status=pending (none)|SELECT id, status FROM deliveries WHERE destination = 'app' AND status = 'pending' ORDER BY id DESC LIMIT 51"
"deliveries page of an aggregate|SELECT id, status FROM deliveries WHERE destination = 'app' AND aggregate = 'seed_42/slot_a' ORDER BY id DESC LIMIT 51"
)
for entry in "${QUERIES[@]}"; do
    name=${entry%%|*}; sql=${entry#*|}
    echo "== $name"
    if [ "$PG" = 1 ]; then
        psql -At "$DB" -c "EXPLAIN (ANALYZE, COSTS OFF, SUMMARY OFF) $sql" | grep -v '^ *Buffers' | sed 's/^/   /'
    else
        sqlite3 "${DB#sqlite://}" "EXPLAIN QUERY PLAN $sql" | sed 's/^/   /'
        start=$(date +%s%N); sqlite3 "${DB#sqlite://}" "$sql" > /dev/null; end=$(date +%s%N)
        echo "   run: $(( (end - start) / 1000000 )) ms"
    fi
done
