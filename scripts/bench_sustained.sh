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
. scripts/lib.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
start_server "$work" "$(bench_database "$work")"
"$BIN" bench --url "$URL" --rate "$RATE" --duration-s "$DURATION" --connections "$CONNECTIONS" \
    --wait-applied --apply-lag --server-pid "$PID" --run-id sustained
stop_server
