#!/usr/bin/env bash
# Forwarding benchmark (SPEC §9, issue #12), one fresh server per line, same generator
# and machine, each event forwarded to a local application (`inhook listen --quiet`,
# which verifies every request's signature):
#   (0) ingest alone, no destination: the rate (a) is fed at;
#   (a) the same flat-out ingest with a destination that answers at once: does
#       forwarding keep up (the backlog stays bounded)? applied → delivered p50/p99;
#   (b) a destination that answers after 50 ms, concurrency = 32: throughput against
#       32 / 0.05 s = 640 req/s (the target is 80 %, 512 req/s).
#   (nats), (rabbitmq), (redis): line (a)'s flat-out ingest with the destination a broker
#       sink on this machine's NATS JetStream, RabbitMQ or Redis (SPEC §12, issue #27):
#       delivered means the broker's confirm (PubAck, publisher confirm, XADD reply), so
#       applied → delivered is receipt → broker-confirmed. Names carry the run's id and are
#       deleted afterwards; RabbitMQ needs a queue bound to the exchange (python3 + pika,
#       installed if missing) or every message would come back unroutable.
#       SINK_CONCURRENCY=N sets the sinks' `concurrency` (default 32, as line a's).
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
LINES=${LINES:-0 a b nats rabbitmq redis}
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

# sink_destination TYPE RUN: the [[destinations]] table of a broker sink named by RUN.
sink_destination() {
    case $1 in
        nats) printf '%s\n' "type = \"nats\"" "url = \"nats://127.0.0.1:4222\"" \
            "subject = \"bench$2.{source}.{aggregate}\"" "stream = \"BENCH$2\"" "create_stream = true" ;;
        rabbitmq) printf '%s\n' "type = \"rabbitmq\"" "url = \"amqp://guest:guest@127.0.0.1:5672/%2f\"" \
            "exchange = \"bench$2\"" "declare = true" "routing_key = \"{source}.{aggregate}\"" ;;
        redis) printf '%s\n' "type = \"redis\"" "url = \"redis://127.0.0.1:6379/0\"" \
            "stream = \"bench$2:{source}\"" ;;
    esac
}

# amqp RUN declare|delete: declares the run's exchange and a queue bound to all of it, or
# deletes both (python3 with pika).
amqp() {
    python3 -c 'import pika' 2>/dev/null || pip install -q pika >&2
    python3 - "$1" "$2" <<'PY'
import sys, pika
run, action = sys.argv[1], sys.argv[2]
channel = pika.BlockingConnection(pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2f")).channel()
if action == "declare":
    channel.exchange_declare(f"bench{run}", "topic", durable=True)
    channel.queue_declare(f"bench{run}", durable=True)
    channel.queue_bind(f"bench{run}", f"bench{run}", "#")
else:
    channel.queue_delete(f"bench{run}")
    channel.exchange_delete(f"bench{run}")
PY
}

# nats_delete_stream NAME: deletes a JetStream stream over the plain protocol (no CLI needed).
nats_delete_stream() {
    exec 3<>/dev/tcp/127.0.0.1/4222
    printf 'CONNECT {"verbose":false}\r\nPUB $JS.API.STREAM.DELETE.%s 0\r\n\r\nPING\r\n' "$1" >&3
    timeout 2 grep -q PONG <&3 || true
    exec 3<&-
}

# sink_cleanup TYPE RUN: removes what the run put in the broker.
sink_cleanup() {
    case $1 in
        nats) nats_delete_stream "BENCH$2" ;;
        rabbitmq) amqp "$2" delete ;;
        redis) redis-cli -n 0 --scan --pattern "bench$2:*" | xargs -r redis-cli -n 0 DEL > /dev/null ;;
    esac
}

line() { # $1 = label, $2 = the application's delay in ms, "none" for no destination, or a sink type
    local dir destination="" forward=() out run=$RANDOM
    dir=$(mktemp -d)
    case $2 in
        none) ;;
        nats|rabbitmq|redis)
            [ "$2" = rabbitmq ] && amqp "$run" declare
            destination="
[[destinations]]
name = \"app\"
sources = [\"$SOURCE\"]
concurrency = ${SINK_CONCURRENCY:-32}
$(sink_destination "$2" "$run")"
            forward=(--forward app) ;;
        *)
            start_listener "$dir" "$2"
            destination="
[[destinations]]
name = \"app\"
url = \"$LURL/hooks\"
sources = [\"$SOURCE\"]
secret = \"$DEST_SECRET\"
concurrency = 32"
            forward=(--forward app) ;;
    esac
    start_server "$dir" "$(bench_database "$dir")" "$BENCH_SOURCES
$destination"
    out=$("$BIN" bench --url "$URL" --events "$EVENTS" --aggregates "$AGGREGATES" \
        --connections "$CONNECTIONS" --server-pid "$PID" --run-id "f$RANDOM" --source "$SOURCE" \
        --shape "$SHAPE" --wait-applied "${forward[@]}" | grep -v 'answers\|RSS')
    stop_server
    echo "== $1 =="
    echo "$out"
    case $2 in
        none) ;;
        nats|rabbitmq|redis) sink_cleanup "$2" "$run" ;;
        *)
            kill -INT "$LPID"
            wait "$LPID" 2>/dev/null || true
            echo "application: $(sed -n 's/^received //p' "$dir/listen.out")" ;;
    esac
    rm -rf "$dir"
}

for l in $LINES; do
    case $l in
        0) line "0: ingest alone, no destination ($SHAPE, $AGGREGATES aggregates)" none ;;
        a) line "a: ingest with a destination answering at once" 0 ;;
        b) line "b: a destination answering after 50 ms, concurrency 32 (target 512 of 640 req/s)" 50 ;;
        nats|rabbitmq|redis) line "$l: ingest with a $l sink (delivered = the broker's confirm)" "$l" ;;
    esac
done
