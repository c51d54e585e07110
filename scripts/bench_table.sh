#!/usr/bin/env bash
# The table docs/benchmarks.md leads with: SQLite and PostgreSQL side by side in one run, each
# flat out and then at half of its own flat-out rate, every event decided before a figure is
# taken. Per line: events decided per second (events ÷ time until the last was decided), CPU
# per event of inhook and (PostgreSQL) of the database's processes serving the run, answer
# p50 / p99. fsync on for both (SQLite `synchronous = FULL`, PostgreSQL
# `synchronous_commit = on`).
# Usage: scripts/bench_table.sh [SECONDS] [ROUNDS]   (default 40 s, 1 round)
# Env: BINS (builds to alternate, default target/release/inhook), STORES ("sqlite postgres"),
#      CONNECTIONS (32), HALF (1: the half-load lines too), BENCH_DATABASE (the PostgreSQL
#      server, default postgres://root@127.0.0.1:5432/test; each run gets a fresh database
#      `inhook_bench` beside it, or BENCH_DB_NAME), DECIDE_AT_INGEST (scripts/lib.sh).
# Then the seed design's line: scripts/pgbench_seed.sh for SECONDS (SEED=0 leaves it out).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${1:-40}
ROUNDS=${2:-1}
CONNECTIONS=${CONNECTIONS:-32}
PG_URL=${BENCH_DATABASE:-postgres://root@127.0.0.1:5432/test}
BINS=${BINS:-target/release/inhook}
INHOOK_BIN=${BINS%% *} . scripts/lib.sh

# line BIN STORE RATE: one run; prints its figures and sets DECIDED (events decided per second).
line() {
    local bin=$1 store=$2 rate=$3 dir db database out cpu_pid= db_cpu=- server_cpu=-
    dir=$(mktemp -d)
    if [ "$store" = postgres ]; then
        database=$(BENCH_DATABASE=$PG_URL bench_database "$dir")
        db=${database##*/}
    else
        database="sqlite://$dir/inhook.db"
    fi
    BIN=$bin start_server "$dir" "$database" "$BENCH_SOURCES"
    if [ "$store" = postgres ]; then
        python3 scripts/pg_cpu.py "$PG_URL" "$db" "$dir/pg_cpu" &
        cpu_pid=$!
    fi
    out=$("$bin" bench --url "$URL" --path /webhooks/save-game --duration-s "$SECONDS_EACH" \
        --connections "$CONNECTIONS" --rate "$rate" --server-pid "$PID" \
        --run-id "t$RANDOM$RANDOM" --source save-game --shape save-game --wait-applied)
    if [ -n "$cpu_pid" ]; then
        kill "$cpu_pid"; wait "$cpu_pid" || true
        db_cpu=$(sed -n 's/database_cpu_s //p' "$dir/pg_cpu")
        server_cpu=$(sed -n 's/background_cpu_s //p' "$dir/pg_cpu")
    fi
    stop_server; rm -rf "$dir"
    local events total p50 p99 inhook_us
    events=$(echo "$out" | sed -n 's/^bench: \([0-9]*\) requests in.*/\1/p')
    total=$(echo "$out" | sed -n 's/.*every event applied \([0-9.]*\)s after the first request.*/\1/p')
    p50=$(echo "$out" | sed -n 's/.*latency ms p50 \([0-9.]*\) .*/\1/p')
    p99=$(echo "$out" | sed -n 's/.* p99 \([0-9.]*\) p99.9.*/\1/p')
    inhook_us=$(echo "$out" | sed -n 's/.* = \([0-9.]*\) µs per event.*/\1/p')
    DECIDED=$(awk -v n="$events" -v t="$total" 'BEGIN { printf "%.0f", n / t }')
    local db_us=- server_us=-
    [ "$db_cpu" != - ] && db_us=$(awk -v c="$db_cpu" -v n="$events" 'BEGIN { printf "%.1f", c * 1e6 / n }')
    [ "$server_cpu" != - ] && server_us=$(awk -v c="$server_cpu" -v n="$events" 'BEGIN { printf "%.1f", c * 1e6 / n }')
    printf '| %s | %s | %s | %s | %s | %s | %s | %s / %s |\n' "$bin" "$store" \
        "$([ "$rate" = 0 ] && echo "flat out" || echo "$rate/s offered")" "$events" "$DECIDED" \
        "$inhook_us" "$db_us ($server_us)" "$p50" "$p99"
}

echo "| build | store | load | events | decided/s | inhook CPU µs/event | database CPU µs/event (background processes) | answer p50 / p99 ms |"
echo "|---|---|---|---|---|---|---|---|"
for _ in $(seq 1 "$ROUNDS"); do
    for bin in $BINS; do
        for store in ${STORES:-sqlite postgres}; do
            line "$bin" "$store" 0
            if [ "${HALF:-1}" = 1 ]; then line "$bin" "$store" $((DECIDED / 2)); fi
        done
    done
done
if [ "${SEED:-1}" = 1 ]; then
    scripts/pgbench_seed.sh "$SECONDS_EACH" "$CONNECTIONS"
fi
