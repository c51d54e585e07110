#!/usr/bin/env bash
# End to end, in one invocation (issue #14), each line on a fresh server and store:
#   logs: the cost of default logging: flat-out runs of LOG_EVENTS events (until every
#         event is decided) at INHOOK_LOG=info and =warn, alternated LOG_PAIRS times;
#   flat: FLAT_S seconds flat out, reading /v1/overview every second: accepted and
#         decided so far and the backlog, then accepted/s, decided/s during the run,
#         decided ÷ accepted, the highest backlog, the drain time and the RSS per minute;
#   sustained: SECONDS at 80 % of the flat-out run's accepted/s (open loop), with the
#         time from receipt to decision of every event (p99) and the RSS per minute.
# flat and sustained run on SQLite, then on PostgreSQL when BENCH_DATABASE=postgres://USER@HOST:PORT/DB
# is set (a fresh database `inhook_bench` beside DB, as in bench.sh). The server logs at WARN
# outside the logs pairs, as in bench.sh.
# Usage: scripts/bench_e2e.sh [SECONDS]   (sustained; default 600, 0 skips the sustained runs)
# Env: FLAT_S (60; 0 skips flat and sustained), LOG_PAIRS (2; 0 skips), LOG_EVENTS (20000), CONNECTIONS (32),
#      SUSTAINED_CONNECTIONS (64), SUSTAINED_SAMPLE_MS (10000), INHOOK_BIN (the binary),
#      STORES (which of "sqlite postgres" to run; default SQLite, and PostgreSQL with BENCH_DATABASE).
#      DECIDE_AT_INGEST=1: the save-game source decides ready events at ingest (lib.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
SUSTAINED=${1:-600}
FLAT_S=${FLAT_S:-60}
LOG_PAIRS=${LOG_PAIRS:-2}
LOG_EVENTS=${LOG_EVENTS:-20000}
CONNECTIONS=${CONNECTIONS:-32}
. scripts/lib.sh
PG=${BENCH_DATABASE:-}
unset BENCH_DATABASE
DEFAULT_STORES=sqlite
[ -n "$PG" ] && DEFAULT_STORES="sqlite postgres"
STORES=${STORES:-$DEFAULT_STORES}

# run LABEL STORE LOG_LEVEL BENCH_ARGS...: one fresh server and store; prints the bench's
# report and sets OUT, RPS, CPU (µs per event) and LOG_BYTES (the server's log per request).
run() {
    local label=$1 store=$2 level=$3 dir database; shift 3
    dir=$(mktemp -d)
    if [ "$store" = postgres ]; then
        database=$(BENCH_DATABASE=$PG bench_database "$dir")
    else
        database=$(bench_database "$dir")
    fi
    # The built-in sources, or with DECIDE_AT_INGEST=1 lib.sh's, deciding at ingest.
    local sources=""; [ "${DECIDE_AT_INGEST:-0}" = 1 ] && sources=$BENCH_SOURCES
    BENCH_LOG=$level start_server "$dir" "$database" "$sources"
    OUT=$("$BIN" bench --url "$URL" --server-pid "$PID" --run-id "e$RANDOM$RANDOM" "$@")
    stop_server
    echo "== $label ($store, INHOOK_LOG=$level) =="; echo "$OUT"
    RPS=$(echo "$OUT" | sed -n 's/.* = \([0-9]*\) req\/s.*/\1/p')
    CPU=$(echo "$OUT" | sed -n 's/.* = \([0-9.]*\) µs per event.*/\1/p')
    local requests; requests=$(echo "$OUT" | sed -n 's/^bench: \([0-9]*\) requests in.*/\1/p')
    LOG_BYTES=$(awk -v b="$(wc -c < "$dir/err")" -v n="$requests" 'BEGIN { printf "%.0f", b / (n > 0 ? n : 1) }')
    rm -rf "$dir"
}
mean() { printf '%s\n' "$@" | awk -v f="${MEAN_FORMAT:-%.0f}" '{ s += $1 } END { printf f, s / NR }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

SUMMARY=()
if [ "$LOG_PAIRS" -gt 0 ]; then
    INFO_RPS=(); WARN_RPS=(); INFO_CPU=(); WARN_CPU=(); INFO_LOG=()
    for _ in $(seq 1 "$LOG_PAIRS"); do
        for level in info warn; do
            run "logs: flat out, $LOG_EVENTS events" sqlite "$level" \
                --events "$LOG_EVENTS" --connections "$CONNECTIONS" --wait-applied
            if [ "$level" = info ]; then
                INFO_RPS+=("$RPS"); INFO_CPU+=("$CPU"); INFO_LOG+=("$LOG_BYTES")
            else
                WARN_RPS+=("$RPS"); WARN_CPU+=("$CPU")
            fi
        done
    done
    i=$(mean "${INFO_RPS[@]}"); w=$(mean "${WARN_RPS[@]}")
    ic=$(MEAN_FORMAT=%.1f mean "${INFO_CPU[@]}"); wc=$(MEAN_FORMAT=%.1f mean "${WARN_CPU[@]}")
    SUMMARY+=("logs: INFO ${INFO_RPS[*]} req/s (mean $i), WARN ${WARN_RPS[*]} req/s (mean $w): INFO/WARN = $(ratio "$i" "$w")")
    SUMMARY+=("logs: server CPU µs per event INFO ${INFO_CPU[*]} (mean $ic), WARN ${WARN_CPU[*]} (mean $wc): INFO/WARN = $(ratio "$ic" "$wc"); INFO log ${INFO_LOG[*]} bytes per event")
fi

for store in $STORES; do
    [ "$FLAT_S" -gt 0 ] || break
    run "flat: ${FLAT_S}s flat out" "$store" warn \
        --duration-s "$FLAT_S" --sample-ms 1000 --connections "$CONNECTIONS"
    SUMMARY+=("flat $store: $(echo "$OUT" | sed -n 's/^bench: end to end: //p')")
    SUMMARY+=("flat $store: $(echo "$OUT" | sed -n 's/^bench: server RSS MiB, //p')")
    accepted=$(echo "$OUT" | sed -n 's/^bench: end to end: accepted [0-9]* = \([0-9]*\)\/s.*/\1/p')
    [ "$SUSTAINED" -gt 0 ] || continue
    rate=$((accepted * 8 / 10))
    run "sustained: ${SUSTAINED}s at $rate req/s (80 % of flat out)" "$store" warn \
        --rate "$rate" --duration-s "$SUSTAINED" --connections "${SUSTAINED_CONNECTIONS:-64}" \
        --sample-ms "${SUSTAINED_SAMPLE_MS:-10000}" --wait-applied --apply-lag
    SUMMARY+=("sustained $store at $rate req/s: $(echo "$OUT" | sed -n 's/^bench: latency ms //p')")
    SUMMARY+=("sustained $store: $(echo "$OUT" | sed -n 's/^bench: receipt to applied, //p')")
    SUMMARY+=("sustained $store: $(echo "$OUT" | sed -n 's/^bench: server RSS MiB, //p')")
done
echo
printf '%s\n' "${SUMMARY[@]}"
