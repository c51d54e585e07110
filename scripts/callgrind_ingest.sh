#!/usr/bin/env bash
# Instructions per save-game event, counted by callgrind: stable where CPU time is not
# (a shared or loaded machine), so two builds can be compared run by run.
# Usage: scripts/callgrind_ingest.sh BIN [SMALL] [LARGE]
# Runs one server under `valgrind --tool=callgrind` per count (SQLite, async save-game
# source), sends that many events with `BIN bench --wait-applied`, and prints the total
# instructions of each run and the marginal (LARGE - SMALL) / (LARGE - SMALL events),
# which leaves out start-up and shutdown. The callgrind files stay in the printed
# directories for `callgrind_annotate --inclusive=yes`. SOURCE_EXTRA adds lines to the
# source's table (for example SOURCE_EXTRA='decide_at_ingest = true').
set -euo pipefail
BIN=$1 SMALL=${2:-1000} LARGE=${3:-4000}
export INHOOK_SAVE_GAME_SECRET=bench-secret INHOOK_PRESENCE_SECRET=bench-presence
# One token for the server and for `bench --wait-applied`, which reads /v1/overview: without
# it the server makes its own and the wait is refused, so the run would end before the
# workers applied every event and the count would depend on timing.
export INHOOK_ADMIN_TOKEN=callgrind-admin-token-0123456789abcdef

# run EVENTS: prints the run's total instructions; the run's directory goes to stderr.
run() {
    local dir pid url=
    dir=$(mktemp -d)
    printf 'listen = "127.0.0.1:0"\ndatabase = "sqlite://%s/inhook.db"\n%s\n' "$dir" '
[[sources]]
name = "save-game"
kind = "save-game"
mode = "async"
signature = "hmac-timestamped"
'"${SOURCE_EXTRA:-}" > "$dir/inhook.toml"
    # tokio's blocking pool (SQLite) may start more threads than valgrind's default 500.
    INHOOK_LOG=warn valgrind --tool=callgrind --max-threads=4000 --callgrind-out-file="$dir/callgrind.out" \
        "$BIN" serve --config "$dir/inhook.toml" > "$dir/out" 2> "$dir/err" &
    pid=$!
    for _ in $(seq 1 1200); do
        url=$(sed -n 's/inhook listening on //p' "$dir/out" 2>/dev/null || true)
        [ -n "$url" ] && break
        sleep 0.1
    done
    [ -n "$url" ] || { cat "$dir/err" >&2; return 1; }
    "$BIN" bench --url "$url" --path /webhooks/save-game --events "$1" --connections 8 \
        --rate 0 --run-id "cg$RANDOM" --source save-game --shape save-game --wait-applied \
        > "$dir/bench" 2> "$dir/bench.err" || { cat "$dir/bench.err" >&2; return 1; }
    kill "$pid"
    wait "$pid" || true
    grep -q "\"202\": $1}" "$dir/bench" || { cat "$dir/bench" >&2; return 1; }
    echo "$1 events: $dir" >&2
    sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$dir/err"
}

small=$(run "$SMALL"); large=$(run "$LARGE")
echo "instructions: $SMALL events $small, $LARGE events $large"
awk -v s="$small" -v l="$large" -v n=$((LARGE - SMALL)) \
    'BEGIN { printf "instructions per event: %.0f\n", (l - s) / n }'
