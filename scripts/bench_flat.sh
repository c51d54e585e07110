#!/usr/bin/env bash
# "Cost stays flat as work grows": the same flat-out ingest run against a store
# holding a large decided history (scripts/seed_large.sh) and against an empty
# one, alternated RUNS times so that both see the same machine.
# Usage: scripts/bench_flat.sh LARGE_DB_FILE [RUNS] [EVENTS]
# DECIDE_AT_INGEST=1: the save-game source decides ready events at ingest (lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
LARGE=$1
RUNS=${2:-3}
EVENTS=${3:-20000}
. scripts/lib.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

flat() { # $1 = database file, $2 = run id
    local sources=""; [ "${DECIDE_AT_INGEST:-0}" = 1 ] && sources=$BENCH_SOURCES
    start_server "$work" "sqlite://$1" "$sources"
    "$BIN" bench --url "$URL" --events "$EVENTS" --connections 32 --wait-applied \
        --run-id "$2" --server-pid "$PID" | grep -v answers
    stop_server
}

for i in $(seq 1 "$RUNS"); do
    echo "== large store, run $i"
    flat "$LARGE" "flat$i$RANDOM$RANDOM"
    echo "== empty store, run $i"
    rm -f "$work"/empty.db*
    flat "$work/empty.db" "empty$i"
done
