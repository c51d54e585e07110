#!/usr/bin/env bash
# Where PostgreSQL's time goes, per statement: one save-game ingest run on a fresh database,
# every event decided, then pg_stat_statements for that database (nested statements too:
# what the triggers run), per event: calls, execution time, rows.
# Needs `shared_preload_libraries = 'pg_stat_statements'` on the server (a restart).
# Usage: scripts/pg_statements.sh [EVENTS] [BIN]   (default 20000, target/release/inhook)
# Env: BENCH_DATABASE (default postgres://root@127.0.0.1:5432/test), BENCH_DB_NAME
#      (default inhook_statements), DECIDE_AT_INGEST (scripts/lib.sh), TOP (rows shown, 25),
#      AUTO_EXPLAIN_MS (log the plan of every statement slower than that, auto_explain, in
#      the server's log).
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-20000}
INHOOK_BIN=${2:-target/release/inhook}
export BENCH_DATABASE=${BENCH_DATABASE:-postgres://root@127.0.0.1:5432/test}
export BENCH_DB_NAME=${BENCH_DB_NAME:-inhook_statements}
. scripts/lib.sh
dir=$(mktemp -d)
database=$(bench_database "$dir")
psql -q "$BENCH_DATABASE" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "ALTER DATABASE \"$BENCH_DB_NAME\" SET pg_stat_statements.track = 'all'"
if [ -n "${AUTO_EXPLAIN_MS:-}" ]; then
    psql -q "$BENCH_DATABASE" -c "ALTER DATABASE \"$BENCH_DB_NAME\" SET session_preload_libraries = 'auto_explain'" \
        -c "ALTER DATABASE \"$BENCH_DB_NAME\" SET auto_explain.log_min_duration = '${AUTO_EXPLAIN_MS}ms'" \
        -c "ALTER DATABASE \"$BENCH_DB_NAME\" SET auto_explain.log_nested_statements = on"
fi
start_server "$dir" "$database" "$BENCH_SOURCES"
psql -Atq "$BENCH_DATABASE" -c "SELECT pg_stat_statements_reset()" > /dev/null
"$BIN" bench --url "$URL" --path /webhooks/save-game --events "$EVENTS" --connections 32 \
    --server-pid "$PID" --run-id "s$RANDOM" --source save-game --shape save-game --wait-applied \
    | grep -E 'req/s|applied|µs per event'
stop_server
psql -q "$BENCH_DATABASE" -P pager=off -c "
SELECT round(calls::numeric / $EVENTS, 3) AS calls_per_event,
       round((total_exec_time * 1000 / $EVENTS)::numeric, 1) AS exec_us_per_event,
       round(rows::numeric / $EVENTS, 2) AS rows_per_event,
       left(regexp_replace(query, '\s+', ' ', 'g'), 110) AS statement
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '$BENCH_DB_NAME')
ORDER BY total_exec_time DESC LIMIT ${TOP:-25}" -c "
SELECT round(sum(calls)::numeric / $EVENTS, 2) AS statements_per_event,
       round((sum(total_exec_time) FILTER (WHERE toplevel) * 1000 / $EVENTS)::numeric, 1)
           AS top_level_exec_us_per_event
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = '$BENCH_DB_NAME') AND toplevel"
rm -rf "$dir"
