#!/usr/bin/env bash
# Two (or more) builds side by side: the same flat-out (or fixed-rate) save-game ingest run
# against each, alternated ROUNDS times so that the machine's drift falls on all of them.
# Each run is a fresh server and store, waits until every event is decided, and prints
# its req/s and the server's CPU per event.
# Usage: scripts/bench_ab.sh EVENTS BIN_A BIN_B [BIN…]; BIN@decide runs BIN with
# `decide_at_ingest = true`, BIN@worker with `false` (so one build can face itself).
# Env: ROUNDS (3), RATE (open loop at that rate; default flat out), CONNECTIONS (32),
#      BENCH_DATABASE (PostgreSQL instead of SQLite, as in bench.sh), DECIDE_AT_INGEST (lib.sh),
#      GENERATOR (the binary whose `bench` sends the load to every line; default each line's own,
#      so that builds which differ in what the generator runs too, such as the allocator, set it).
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=$1; shift
ROUNDS=${ROUNDS:-3}
CONNECTIONS=${CONNECTIONS:-32}
INHOOK_BIN=${1%@*} . scripts/lib.sh

for _ in $(seq 1 "$ROUNDS"); do
    for line in "$@"; do
        bin=${line%@*} sources=$BENCH_SOURCES
        case $line in
            *@decide) sources=$(bench_sources true) ;;
            *@worker) sources=$(bench_sources false) ;;
        esac
        dir=$(mktemp -d)
        BIN=$bin start_server "$dir" "$(bench_database "$dir")" "$sources"
        out=$("${GENERATOR:-$bin}" bench --url "$URL" --path /webhooks/save-game --events "$EVENTS" \
            --connections "$CONNECTIONS" --rate "${RATE:-0}" --server-pid "$PID" \
            --run-id "ab$RANDOM$RANDOM" --source save-game --shape save-game --wait-applied)
        stop_server; rm -rf "$dir"
        echo "$line: $(echo "$out" | grep -o '= [0-9]* req/s') $(echo "$out" | grep -o '[0-9.]* µs per event')"
    done
done
