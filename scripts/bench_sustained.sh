#!/usr/bin/env bash
# Sustained load: a fixed offered rate (open loop) for a fixed time against a
# fresh SQLite store (or PostgreSQL with BENCH_DATABASE, as in bench.sh); reports
# latency, the time from receipt to decision of every event (read back from the
# event log), and the server's RSS per minute.
# Usage: scripts/bench_sustained.sh RATE [SECONDS] [CONNECTIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=$1
DURATION=${2:-600}
CONNECTIONS=${3:-64}
BIN=${INHOOK_BIN:-target/release/inhook}
export INHOOK_SAVE_GAME_SECRET=bench-secret INHOOK_PRESENCE_SECRET=bench-presence
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
database="sqlite://$work/inhook.db"
if [ -n "${BENCH_DATABASE:-}" ]; then
    psql -q "$BENCH_DATABASE" -c "DROP DATABASE IF EXISTS inhook_bench" -c "CREATE DATABASE inhook_bench"
    database="${BENCH_DATABASE%/*}/inhook_bench"
fi
printf 'listen = "127.0.0.1:0"\ndatabase = "%s"\n' "$database" > "$work/inhook.toml"
INHOOK_LOG=warn "$BIN" serve --config "$work/inhook.toml" > "$work/out" 2> "$work/err" &
pid=$!
for _ in $(seq 1 100); do grep -q listening "$work/out" && break; sleep 0.1; done
url=$(sed -n 's/inhook listening on //p' "$work/out")
"$BIN" bench --url "$url" --rate "$RATE" --duration-s "$DURATION" --connections "$CONNECTIONS" \
    --wait-applied --apply-lag --server-pid "$pid" --run-id sustained
kill "$pid"; wait "$pid" || true
