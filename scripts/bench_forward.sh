#!/usr/bin/env bash
# Forwarding benchmark (SPEC §9, issue #12), one fresh server per line, same generator
# and machine, each event forwarded to a local application (`inhook listen --quiet`,
# which verifies every request's signature):
#   (0) ingest alone, no destination: the rate (a) is fed at;
#   (a) the same flat-out ingest with a destination that answers at once: does
#       forwarding keep up (the backlog stays bounded)? applied → delivered p50/p99;
#   (b) a destination that answers after 50 ms, concurrency = 32: throughput against
#       32 / 0.05 s = 640 req/s (the target is 80 %, 512 req/s).
# Each line prints ingest req/s, the destination's backlog every second, the drain time
# after the last answer, deliveries per second during ingest and overall, applied →
# delivered percentiles (the delivery rows' own timestamps), and the application's
# busiest second (it shares the cores with the server and the generator).
# Usage: scripts/bench_forward.sh [EVENTS] [AGGREGATES] [CONNECTIONS]
# SHAPE=stripe feeds the latest-wins json source instead of save-game's in-order deltas;
# LINES="0 a b" picks lines; BENCH_DATABASE=postgres://USER@HOST:PORT/DB as in bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-20000}
AGGREGATES=${2:-1000}
CONNECTIONS=${3:-32}
SHAPE=${SHAPE:-save-game}
LINES=${LINES:-0 a b}
. scripts/lib.sh
SOURCE=save-game
[ "$SHAPE" = stripe ] && SOURCE=stripe
DEST_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw

# start_listener DIR DELAY_MS: starts the application; sets LPID and LURL once it listens.
start_listener() {
    "$BIN" listen --port 0 --secret "$DEST_SECRET" --quiet --delay-ms "$2" > "$1/listen.out" 2> "$1/listen.err" &
    LPID=$!
    LURL=
    for _ in $(seq 1 100); do
        LURL=$(sed -n 's/^listening on //p' "$1/listen.out" 2>/dev/null || true)
        [ -n "$LURL" ] && return 0
        sleep 0.1
    done
    cat "$1/listen.err" >&2
    return 1
}

line() { # $1 = label, $2 = the application's delay in ms, or "none" for no destination
    local dir destination="" forward=() out
    dir=$(mktemp -d)
    if [ "$2" != none ]; then
        start_listener "$dir" "$2"
        destination="
[[destinations]]
name = \"app\"
url = \"$LURL/hooks\"
sources = [\"$SOURCE\"]
secret = \"$DEST_SECRET\"
concurrency = 32"
        forward=(--forward app)
    fi
    start_server "$dir" "$(bench_database "$dir")" "$BENCH_SOURCES
$destination"
    out=$("$BIN" bench --url "$URL" --events "$EVENTS" --aggregates "$AGGREGATES" \
        --connections "$CONNECTIONS" --server-pid "$PID" --run-id "f$RANDOM" --source "$SOURCE" \
        --shape "$SHAPE" --wait-applied "${forward[@]}" | grep -v 'answers\|RSS')
    stop_server
    echo "== $1 =="
    echo "$out"
    if [ "$2" != none ]; then
        kill -INT "$LPID"
        wait "$LPID" 2>/dev/null || true
        echo "application: $(sed -n 's/^received //p' "$dir/listen.out")"
    fi
    rm -rf "$dir"
}

for l in $LINES; do
    case $l in
        0) line "0: ingest alone, no destination ($SHAPE, $AGGREGATES aggregates)" none ;;
        a) line "a: ingest with a destination answering at once" 0 ;;
        b) line "b: a destination answering after 50 ms, concurrency 32 (target 512 of 640 req/s)" 50 ;;
    esac
done
