# Shared by the benchmark scripts; sourced, not run. Expects to be in the repository root.

BIN=${INHOOK_BIN:-target/release/inhook}
[ -x "$BIN" ] || cargo build --release --locked
export INHOOK_SAVE_GAME_SECRET=bench-secret INHOOK_PRESENCE_SECRET=bench-presence
export INHOOK_STRIPE_SECRET=whsec_bench

# The ingest sources of the benchmarks, declared as the defaults would be plus a json one
# for `inhook bench --shape stripe`. DECIDE_AT_INGEST=1 decides ready events at ingest.
# bench_sources DECIDE: those sources, with `decide_at_ingest = DECIDE` (true or false).
bench_sources() {
    printf '%s\n' '
[[sources]]
name = "save-game"
kind = "save-game"
mode = "async"
decide_at_ingest = '"$1"'
signature = "hmac-timestamped"

[[sources]]
name = "stripe"
kind = "json"
mode = "async"
decide_at_ingest = '"$1"'
signature = "stripe"
event_id = "/id"
aggregate = ["/data/object/object", "/data/object/id"]
sequence = "/created"
event_type = "/type"
ordering = "latest-wins"
state = "/data/object"'
}
DECIDE=false; [ "${DECIDE_AT_INGEST:-0}" = 1 ] && DECIDE=true
BENCH_SOURCES=$(bench_sources "$DECIDE")

# bench_database DIR: a SQLite file in DIR, or with BENCH_DATABASE=postgres://USER@HOST:PORT/DB
# a fresh database beside DB (dropped and created again), named BENCH_DB_NAME (default
# `inhook_bench`): give two benchmarks run at once on one server different names.
bench_database() {
    if [ -n "${BENCH_DATABASE:-}" ]; then
        local name=${BENCH_DB_NAME:-inhook_bench}
        psql -q "$BENCH_DATABASE" -c "DROP DATABASE IF EXISTS \"$name\"" \
            -c "CREATE DATABASE \"$name\"" >&2
        echo "${BENCH_DATABASE%/*}/$name"
    else
        echo "sqlite://$1/inhook.db"
    fi
}

# start_server DIR DATABASE [EXTRA_CONFIG]: starts inhook on a free port with its config,
# output and log in DIR; sets PID and URL once it listens. Logs at BENCH_LOG (default warn).
start_server() {
    local dir=$1
    printf 'listen = "127.0.0.1:0"\ndatabase = "%s"\n%s\n' "$2" "${3:-}" > "$dir/inhook.toml"
    # Local runs read /v1/* without a token (older builds ignore the variable).
    INHOOK_ADMIN_OPEN_TO_LOOPBACK=true INHOOK_LOG=${BENCH_LOG:-warn} "$BIN" serve --config "$dir/inhook.toml" > "$dir/out" 2> "$dir/err" &
    PID=$!
    URL=
    for _ in $(seq 1 600); do
        # The server may not have opened its output yet: under `set -e` a failed read would end the script.
        URL=$(sed -n 's/inhook listening on //p' "$dir/out" 2>/dev/null || true)
        [ -n "$URL" ] && return 0
        sleep 0.1
    done
    cat "$dir/err" >&2
    return 1
}

# stop_server: stops the server start_server started.
stop_server() {
    kill "$PID"
    wait "$PID" 2>/dev/null || true
}
