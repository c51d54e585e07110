#!/usr/bin/env bash
# "Cost stays flat as work grows": the same flat-out ingest run against a store
# holding a large decided history (scripts/seed_large.sh) and against an empty
# one, alternated RUNS times so that both see the same machine.
# Usage: scripts/bench_flat.sh LARGE_DB_FILE [RUNS] [EVENTS]
set -euo pipefail
cd "$(dirname "$0")/.."
LARGE=$1
RUNS=${2:-3}
EVENTS=${3:-20000}
BIN=${INHOOK_BIN:-target/release/inhook}
export INHOOK_SAVE_GAME_SECRET=bench-secret INHOOK_PRESENCE_SECRET=bench-presence
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

flat() { # $1 = database file, $2 = run id
    printf 'listen = "127.0.0.1:0"\ndatabase = "sqlite://%s"\n' "$1" > "$work/inhook.toml"
    INHOOK_LOG=warn "$BIN" serve --config "$work/inhook.toml" > "$work/out" 2> "$work/err" &
    local pid=$!
    for _ in $(seq 1 600); do grep -q listening "$work/out" && break; sleep 0.1; done
    local url; url=$(sed -n 's/inhook listening on //p' "$work/out")
    "$BIN" bench --url "$url" --events "$EVENTS" --connections 32 --wait-applied \
        --run-id "$2" --server-pid "$pid" | grep -v answers
    kill "$pid"; wait "$pid" || true
}

for i in $(seq 1 "$RUNS"); do
    echo "== large store, run $i"
    flat "$LARGE" "flat$i$RANDOM$RANDOM"
    echo "== empty store, run $i"
    rm -f "$work"/empty.db*
    flat "$work/empty.db" "empty$i"
done
