#!/usr/bin/env bash
# schemathesis against a running inhook's /openapi.json: no 5xx, no undocumented
# status code, every response's content type, headers and body match the document.
#
#   tests/openapi/run.sh sqlite
#   tests/openapi/run.sh postgres://root@127.0.0.1:5432/test
#
# Starts target/debug/inhook (build it first) on a free port with a fresh store,
# seeds it through the real ingress (so the examples' ids exist and the read
# routes answer with data, not only 404s), then runs schemathesis.
set -euo pipefail
cd "$(dirname "$0")/../.."

store=${1:-sqlite}
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"' EXIT

case "$store" in
    sqlite) database="sqlite://$work/inhook.db" ;;
    postgres://*)
        # A database of its own, so the run starts empty and leaves the suite's alone.
        base=${store%/*}
        psql -q "$store" -c "DROP DATABASE IF EXISTS inhook_openapi" -c "CREATE DATABASE inhook_openapi"
        database="$base/inhook_openapi"
        ;;
    *) echo "usage: $0 sqlite|postgres://…" >&2; exit 2 ;;
esac

token=openapi-admin-token
cat > "$work/inhook.toml" <<TOML
listen = "127.0.0.1:0"
database = "$database"
admin_token = "$token"
TOML
export INHOOK_PRESENCE_SECRET=openapi-presence-secret
export INHOOK_SAVE_GAME_SECRET=openapi-save-secret

target/debug/inhook --config "$work/inhook.toml" serve >"$work/stdout" 2>"$work/stderr" &
server=$!
url=
for _ in $(seq 1 100); do
    url=$(sed -n 's/^inhook listening on //p' "$work/stdout")
    [ -n "$url" ] && break
    kill -0 "$server" 2>/dev/null || { cat "$work/stderr" >&2; exit 1; }
    sleep 0.1
done
[ -n "$url" ] || { echo "inhook did not start" >&2; cat "$work/stderr" >&2; exit 1; }

# The documented examples' ids: usr_A, evt_1, player_1024/slot_a; then some traffic.
printf '%s' '{"event_id":"evt_1","user_id":"usr_A","presence":"ONLINE","sequence_number":1,"timestamp":1764460800}' \
    | target/debug/inhook send --url "$url" --source presence -
printf '%s' '{"event_id":"evt_s1","event_type":"progress.saved","payload_version":1,"occurred_at":"2026-06-28T10:15:21Z","player_id":"player_1024","save_slot":"slot_a","sequence":1,"idempotency_key":"k1","data":{"chapter":1}}' \
    | target/debug/inhook send --url "$url" --source save-game -
target/debug/inhook simulate --url "$url" --events 300 --aggregates 20 --seed 7 --admin-token "$token" >/dev/null

schemathesis run "$url/openapi.json" \
    --header "Authorization: Bearer $token" \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance \
    --exclude-path /v1/stream \
    --max-examples "${SCHEMATHESIS_EXAMPLES:-100}" \
    --seed "${SCHEMATHESIS_SEED:-20261130}" \
    --no-color
