#!/usr/bin/env bash
# Side-by-side ingest benchmark, one run, same generator and machine:
#   (a) inhook ingest (SQLite, durable commits, group commit),
#   (j) the same for a latest-wins `kind = "json"` source fed Stripe-shaped events
#       of about the save-game body's size (the issue's target: within 10 % of (a)),
#   (b) the HTTP ceiling: the same HTTP stack answering a fixed 202 with no work,
#   (c) the naive design: one transaction and one fsync per request.
# Then each again at a fixed offered rate of half of (a)'s maximum, for latency.
# Usage: scripts/bench.sh [EVENTS] [CONNECTIONS]   (builds the release binary first)
# (a) and (j) alternate KIND_PAIRS times (default 2), so that the machine's drift falls on
# both; their figures are the means of the pairs. KINDS_ONLY=1 runs only those pairs.
# With BENCH_DATABASE=postgres://USER@HOST:PORT/DB the ingest lines run on PostgreSQL,
# each on a fresh database `inhook_bench` beside DB (`BENCH_DB_NAME` names another); the default is SQLite.
# DECIDE_AT_INGEST=1 sets `decide_at_ingest = true` on both ingest sources (scripts/lib.sh).
# ENCRYPTION_ONLY=1 compares ingest with encryption at rest off and on (below).
# PRESET_ONLY=1 compares the json source (j) with the same events into a `preset = "stripe"` source (below).
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS=${1:-20000}
CONNECTIONS=${2:-32}
KIND_PAIRS=${KIND_PAIRS:-2}
. scripts/lib.sh

bench() { # $1 = label, $2 = extra config, $3 = path, $4 = rate, $5 = shape (default save-game)
    local dir; dir=$(mktemp -d)
    start_server "$dir" "$(bench_database "$dir")" "bench_ceiling = true
$2
${SOURCES:-$BENCH_SOURCES}"
    local shape=${5:-save-game} source=save-game out
    [ "$shape" = stripe ] && source=stripe
    out=$("$BIN" bench --url "$URL" --path "$3" --events "$EVENTS" --connections "$CONNECTIONS" \
        --rate "$4" --server-pid "$PID" --run-id "b$RANDOM" --source "$source" --shape "$shape" \
        $( [ "$3" != /bench/ceiling ] && echo --wait-applied ))
    stop_server; rm -rf "$dir"
    echo "== $1 (rate ${4:-0}) =="; echo "$out"
    RPS=$(echo "$out" | sed -n 's/.* = \([0-9]*\) req\/s.*/\1/p')
    P99=$(echo "$out" | sed -n 's/.* p99 \([0-9.]*\) .*/\1/p')
    CPU=$(echo "$out" | sed -n 's/.* = \([0-9.]*\) µs per event.*/\1/p')
}

mean() { printf '%s\n' "$@" | awk -v f="${MEAN_FORMAT:-%.0f}" '{ s += $1 } END { printf f, s / NR }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# ENCRYPTION_ONLY=1: (a) against (e), the same ingest with encryption at rest on
# (docs/encryption.md), alternating ENCRYPTION_PAIRS times (default 2).
if [ "${ENCRYPTION_ONLY:-0}" = 1 ]; then
    KEY="bench:$(head -c 32 /dev/urandom | base64)"
    P_ALL=(); E_ALL=(); P_CPU=(); E_CPU=()
    for _ in $(seq 1 "${ENCRYPTION_PAIRS:-2}"); do
        bench "a: inhook ingest, plaintext" "" /webhooks/save-game 0; P_ALL+=("$RPS"); P_CPU+=("$CPU")
        bench "e: inhook ingest, encryption at rest" "encryption = { keys = [\"$KEY\"] }" /webhooks/save-game 0
        E_ALL+=("$RPS"); E_CPU+=("$CPU")
    done
    P=$(mean "${P_ALL[@]}"); E=$(mean "${E_ALL[@]}")
    echo
    echo "plaintext ${P_ALL[*]} req/s (mean $P), encrypted ${E_ALL[*]} req/s (mean $E): encrypted/plaintext = $(ratio "$E" "$P")"
    p=$(MEAN_FORMAT=%.1f mean "${P_CPU[@]}"); e=$(MEAN_FORMAT=%.1f mean "${E_CPU[@]}")
    echo "server CPU µs per event: plaintext ${P_CPU[*]} (mean $p), encrypted ${E_CPU[*]} (mean $e): encrypted/plaintext = $(ratio "$e" "$p")"
    exit 0
fi
# PRESET_ONLY=1: (j) against (p), the same Stripe-shaped ingest into a source declared only
# as `preset = "stripe"` (docs/providers.md), alternating PRESET_PAIRS times (default 2).
if [ "${PRESET_ONLY:-0}" = 1 ]; then
    PRESET_SOURCES='
[[sources]]
name = "stripe"
preset = "stripe"
mode = "async"
decide_at_ingest = '"$DECIDE"
    J_ALL=(); P_ALL=(); J_CPU=(); P_CPU=()
    for _ in $(seq 1 "${PRESET_PAIRS:-2}"); do
        bench "j: inhook ingest, json source" "" /webhooks/stripe 0 stripe; J_ALL+=("$RPS"); J_CPU+=("$CPU")
        SOURCES=$PRESET_SOURCES bench "p: inhook ingest, preset = \"stripe\"" "" /webhooks/stripe 0 stripe
        P_ALL+=("$RPS"); P_CPU+=("$CPU")
    done
    J=$(mean "${J_ALL[@]}"); P=$(mean "${P_ALL[@]}")
    echo
    echo "json ${J_ALL[*]} req/s (mean $J), preset ${P_ALL[*]} req/s (mean $P): preset/json = $(ratio "$P" "$J")"
    j=$(MEAN_FORMAT=%.1f mean "${J_CPU[@]}"); p=$(MEAN_FORMAT=%.1f mean "${P_CPU[@]}")
    echo "server CPU µs per event: json ${J_CPU[*]} (mean $j), preset ${P_CPU[*]} (mean $p): preset/json = $(ratio "$p" "$j")"
    exit 0
fi
A_ALL=(); J_ALL=(); A_CPU=(); J_CPU=()
for _ in $(seq 1 "$KIND_PAIRS"); do
    bench "a: inhook ingest, group commit" "" /webhooks/save-game 0; A_ALL+=("$RPS"); A_CPU+=("$CPU")
    bench "j: inhook ingest, json source (Stripe-shaped, latest-wins)" "" /webhooks/stripe 0 stripe; J_ALL+=("$RPS"); J_CPU+=("$CPU")
done
A=$(mean "${A_ALL[@]}"); J=$(mean "${J_ALL[@]}")
# Throughput moves with whatever else the machine runs; the server's CPU per event far less.
kinds() {
    echo "save-game ingest ${A_ALL[*]} req/s (mean $A), json ingest ${J_ALL[*]} req/s (mean $J): json/save-game = $(ratio "$J" "$A")"
    local a j; a=$(MEAN_FORMAT=%.1f mean "${A_CPU[@]}"); j=$(MEAN_FORMAT=%.1f mean "${J_CPU[@]}")
    echo "server CPU µs per event: save-game ${A_CPU[*]} (mean $a), json ${J_CPU[*]} (mean $j): json/save-game = $(ratio "$j" "$a")"
}
if [ "${KINDS_ONLY:-0}" = 1 ]; then echo; kinds; exit 0; fi

bench "b: HTTP ceiling" "" /bench/ceiling 0; B=$RPS
bench "c: naive, one fsync per request" "group_commit = false" /webhooks/save-game 0; C=$RPS
HALF=$((A / 2))
bench "a at 50%" "" /webhooks/save-game "$HALF"; AP99=$P99
bench "b at the same rate" "" /bench/ceiling "$HALF"; BP99=$P99
echo
kinds
echo "ratios: ingest/ceiling = $(ratio "$A" "$B")  ingest/naive = $(ratio "$A" "$C")"
echo "p99 at ${HALF} req/s: ingest ${AP99} ms, ceiling ${BP99} ms, ratio $(ratio "$AP99" "$BP99")"
