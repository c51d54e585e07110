#!/usr/bin/env bash
# Do the dashboard's reads slow processing as the log grows? (issue #14) Seeds a store with
# N decided events (scripts/seed_reads.sh), then runs an ingest burst of BURST events and
# measures the drain time (from the burst's first request until no event is undecided, read
# straight from the store by its partial index) with the dashboard's periodic reads polled
# every 0.5 s (/v1/overview, the event log's first page, the dead letters' first page,
# /metrics and the overview's chart of the last hour, /v1/stats) and without, alternately ROUNDS times each on a fresh copy of the seeded store,
# and prints both and their ratio (target: polled within 1.2x of quiet).
# Usage: scripts/bench_reads.sh [N] [BURST] [CONNECTIONS]
# SQLite by default; with BENCH_DATABASE=postgres://USER@HOST:PORT/DB on PostgreSQL (databases
# inhook_reads_seed and inhook_reads beside DB, dropped and created again).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}
BURST=${2:-20000}
CONNECTIONS=${3:-32}
ROUNDS=${ROUNDS:-2}
. scripts/lib.sh
work=$(mktemp -d)
POLLER=
trap '[ -n "$POLLER" ] && kill "$POLLER" 2>/dev/null; rm -rf "$work"' EXIT
SOURCES='
[[sources]]
name = "save-game"
kind = "save-game"
mode = "async"
signature = "hmac-timestamped"'

if [ -n "${BENCH_DATABASE:-}" ]; then
    SERVER=${BENCH_DATABASE%/*}
    psql -q "$BENCH_DATABASE" -c "DROP DATABASE IF EXISTS inhook_reads" \
        -c "DROP DATABASE IF EXISTS inhook_reads_seed" -c "CREATE DATABASE inhook_reads_seed"
    scripts/seed_reads.sh "$SERVER/inhook_reads_seed" "$N"
    fresh() { # a fresh copy of the seeded store; prints its URL
        psql -q "$BENCH_DATABASE" -c "DROP DATABASE IF EXISTS inhook_reads" \
            -c "CREATE DATABASE inhook_reads TEMPLATE inhook_reads_seed" >&2
        echo "$SERVER/inhook_reads"
    }
    undecided() {
        psql -At "$SERVER/inhook_reads" -c \
            "SELECT COUNT(*) FROM events WHERE status IN ('received', 'held', 'retrying')"
    }
else
    scripts/seed_reads.sh "sqlite://$work/seed.db" "$N"
    fresh() {
        rm -rf "$work/run"; mkdir "$work/run"; cp "$work/seed.db" "$work/run/inhook.db"
        echo "sqlite://$work/run/inhook.db"
    }
    undecided() {
        sqlite3 "$work/run/inhook.db" \
            "SELECT COUNT(*) FROM events WHERE status IN ('received', 'held', 'retrying')"
    }
fi
echo "seeded $N events"

# poll URL: the dashboard's periodic reads every 0.5 s, until killed.
poll() {
    while true; do
        for path in /v1/overview '/v1/events?limit=50' '/v1/events?status=dead&limit=50' /metrics \
            '/v1/stats?source=save-game'; do
            curl -fs -o /dev/null "$1$path" || true
        done
        sleep 0.5
    done
}

# drain MODE: one burst on a fresh store, polled or quiet; sets DRAIN (seconds).
drain() {
    local db; db=$(fresh)
    mkdir -p "$work/srv"
    start_server "$work/srv" "$db" "$SOURCES"
    [ "$1" = polled ] && { poll "$URL" & POLLER=$!; }
    local start; start=$(date +%s.%N)
    "$BIN" bench --url "$URL" --events "$BURST" --connections "$CONNECTIONS" \
        --run-id "r$RANDOM" --source save-game --shape save-game | grep ' req/s' || true
    until [ "$(undecided)" = 0 ]; do sleep 0.1; done
    DRAIN=$(echo "$(date +%s.%N) - $start" | bc)
    [ -n "$POLLER" ] && { kill "$POLLER"; wait "$POLLER" 2>/dev/null || true; POLLER=; }
    stop_server
    printf '%s: drained %s events in %.2f s\n' "$1" "$BURST" "$DRAIN"
}

QUIET=(); POLLED=()
for _ in $(seq 1 "$ROUNDS"); do
    drain quiet; QUIET+=("$DRAIN")
    drain polled; POLLED+=("$DRAIN")
done
mean() { printf '%s\n' "$@" | awk '{ s += $1 } END { printf "%.2f", s / NR }'; }
Q=$(mean "${QUIET[@]}"); P=$(mean "${POLLED[@]}")
echo
echo "log of $N events, bursts of $BURST: drain quiet ${QUIET[*]} s (mean $Q), polled every 0.5 s ${POLLED[*]} s (mean $P): polled/quiet = $(awk -v p="$P" -v q="$Q" 'BEGIN { printf "%.2f", p / q }')"
