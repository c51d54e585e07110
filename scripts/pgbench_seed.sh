#!/usr/bin/env bash
# The seed design's PostgreSQL line, run by pgbench: one transaction per event, a dedup row
# (`processed_webhook_events`) and a conditional upsert of `user_presence` (applied only
# above the stored sequence), 1,000 users, synchronous_commit as the server has it (on).
# What inhook's PostgreSQL store is measured against in docs/benchmarks.md.
# Usage: scripts/pgbench_seed.sh [SECONDS] [CLIENTS]   (default 40 s, 32 clients)
# Env: BENCH_DATABASE (server, default postgres://root@127.0.0.1:5432/test); the run uses a
# fresh database `inhook_seed` beside it (SEED_DB_NAME names another).
# Prints pgbench's transactions per second (one per event) and PostgreSQL's CPU per event
# (the run's connections, and the background processes in brackets; scripts/pg_cpu.py).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-40}
CLIENTS=${2:-32}
URL=${BENCH_DATABASE:-postgres://root@127.0.0.1:5432/test}
NAME=${SEED_DB_NAME:-inhook_seed}
DB="${URL%/*}/$NAME"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
psql -q "$URL" -c "DROP DATABASE IF EXISTS \"$NAME\"" -c "CREATE DATABASE \"$NAME\""
psql -q "$DB" <<'SQL'
CREATE TABLE user_presence (
    user_id VARCHAR(64) PRIMARY KEY,
    status VARCHAR(32) NOT NULL,
    last_sequence BIGINT NOT NULL,
    updated_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP
);
CREATE TABLE processed_webhook_events (
    event_id VARCHAR(64) PRIMARY KEY,
    user_id VARCHAR(64) NOT NULL,
    processed_at TIMESTAMPTZ DEFAULT CURRENT_TIMESTAMP
);
SQL
# Event ids from the client and a per-client counter are unique without a sequence; the
# sequence rises with time, so most events apply and some arrive stale, as deliveries do.
cat > "$dir/event.sql" <<'SQL'
\set user random(1, 1000)
\set n random(1, 1000000000000)
BEGIN;
INSERT INTO processed_webhook_events (event_id, user_id)
    VALUES ('evt_' || :client_id || '_' || :n, 'user_' || :user)
    ON CONFLICT (event_id) DO NOTHING;
INSERT INTO user_presence (user_id, status, last_sequence, updated_at)
    VALUES ('user_' || :user, 'online', (extract(epoch FROM clock_timestamp()) * 1000000)::bigint, NOW())
    ON CONFLICT (user_id) DO UPDATE
    SET status = EXCLUDED.status, last_sequence = EXCLUDED.last_sequence, updated_at = NOW()
    WHERE EXCLUDED.last_sequence > user_presence.last_sequence;
COMMIT;
SQL
python3 scripts/pg_cpu.py "$URL" "$NAME" "$dir/pg_cpu" &
cpu_pid=$!
pgbench -n -M prepared -c "$CLIENTS" -j 2 -T "$SECONDS_EACH" -f "$dir/event.sql" "$DB" > "$dir/out"
kill "$cpu_pid"; wait "$cpu_pid" || true
tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$dir/out")
events=$(sed -n 's/^number of transactions actually processed: \([0-9]*\).*/\1/p' "$dir/out")
latency=$(sed -n 's/^latency average = \([0-9.]*\) ms/\1/p' "$dir/out")
db_cpu=$(sed -n 's/database_cpu_s //p' "$dir/pg_cpu")
server_cpu=$(sed -n 's/background_cpu_s //p' "$dir/pg_cpu")
echo "seed design (pgbench, $CLIENTS clients, ${SECONDS_EACH}s): $events events, $(printf '%.0f' "$tps") events/s," \
    "mean latency $latency ms, PostgreSQL CPU $(awk -v c="$db_cpu" -v n="$events" 'BEGIN { printf "%.1f", c * 1e6 / n }') µs/event" \
    "(background processes $(awk -v c="$server_cpu" -v n="$events" 'BEGIN { printf "%.1f", c * 1e6 / n }'))"
psql -q "$URL" -c "DROP DATABASE IF EXISTS \"$NAME\""
