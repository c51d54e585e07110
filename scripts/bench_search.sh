#!/usr/bin/env bash
# Search on a large log (docs/benchmarks.md, search): fills a store with ROWS processed
# events of a json source `shop` declaring `search_fields = ["/customer"]`, each with its
# search index row (CUSTOMERS customers, ROWS / CUSTOMERS events each), written straight
# into the schema `inhook migrate` creates; then serves it and times searches through the
# API: an indexed `where`, the same with a type pattern, an event id, and a bounded scan
# of an undeclared field.
# Usage: scripts/bench_search.sh sqlite|postgres [ROWS] [CUSTOMERS]
#   postgres uses $BENCH_DATABASE (default postgres://root@127.0.0.1:5432/inhook_search_bench),
#   dropped and created again.
set -euo pipefail
cd "$(dirname "$0")/.."
STORE=$1
ROWS=${2:-1000000}
CUSTOMERS=${3:-100000}
BIN=${INHOOK_BIN:-target/release/inhook}
DIR=$(mktemp -d)
SERVER=
DROP=
cleanup() {
  if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true; fi
  [ -n "$DROP" ] && psql -q "$ADMIN" -c "DROP DATABASE IF EXISTS $NAME" || true
  rm -rf "$DIR"
}
trap cleanup EXIT
NOW_MS=$(( $(date +%s) * 1000 - ROWS ))
case $STORE in
  sqlite) DATABASE="sqlite://$DIR/inhook.db" ;;
  postgres)
    DATABASE=${BENCH_DATABASE:-postgres://root@127.0.0.1:5432/inhook_search_bench}
    ADMIN=${DATABASE%/*}/postgres
    NAME=${DATABASE##*/}
    psql -q "$ADMIN" -c "DROP DATABASE IF EXISTS $NAME" -c "CREATE DATABASE $NAME"
    DROP=1 ;;
  *) echo "usage: $0 sqlite|postgres [ROWS] [CUSTOMERS]" >&2; exit 2 ;;
esac
cat > "$DIR/inhook.toml" <<TOML
listen = "127.0.0.1:0"
database = "$DATABASE"
admin_token = "bench-token-0123456789abcdef"

[[sources]]
name = "shop"
kind = "json"
signature = "hmac-hex"
secrets = ["bench-secret"]
event_id = "/id"
aggregate = "/customer"
event_type = "/type"
ordering = "unordered"
search_fields = ["/customer"]
TOML
"$BIN" migrate --config "$DIR/inhook.toml" >/dev/null
# One statement per table, the same on both stores but for the series and the blob cast.
if [ "$STORE" = sqlite ]; then
  SERIES="WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < $ROWS - 1)"
  FROM="FROM n"
  BODY="CAST('{\"id\":\"ev_' || i || '\",\"type\":\"' || CASE WHEN i % 3 = 0 THEN 'charge.succeeded' ELSE 'invoice.paid' END || '\",\"customer\":\"cus_' || (i % $CUSTOMERS) || '\",\"note\":\"n' || i || '\"}' AS BLOB)"
  RUN() { sqlite3 "$DIR/inhook.db"; }
else
  SERIES=""
  FROM="FROM generate_series(0, $ROWS - 1) AS i"
  BODY="convert_to('{\"id\":\"ev_' || i || '\",\"type\":\"' || CASE WHEN i % 3 = 0 THEN 'charge.succeeded' ELSE 'invoice.paid' END || '\",\"customer\":\"cus_' || (i % $CUSTOMERS) || '\",\"note\":\"n' || i || '\"}', 'UTF8')"
  RUN() { psql -q "$DATABASE"; }
fi
START=$(date +%s)
RUN <<SQL
$( [ "$STORE" = sqlite ] && echo "PRAGMA synchronous = OFF;" )
BEGIN;
$SERIES
INSERT INTO events (source, event_id, event_type, aggregate, sequence, body, signature_valid,
                    received_at, status, decided_at)
SELECT 'shop', 'ev_' || i, CASE WHEN i % 3 = 0 THEN 'charge.succeeded' ELSE 'invoice.paid' END,
       'cus_' || (i % $CUSTOMERS), 0, $BODY, TRUE, $NOW_MS + i, 'processed', $NOW_MS + i
$FROM;
INSERT INTO event_search (field, value, source, event_row)
SELECT '/customer', aggregate, source, id FROM events;
COMMIT;
SQL
[ "$STORE" = postgres ] && psql -q "$DATABASE" -c "VACUUM ANALYZE"
echo "seeded $ROWS events ($CUSTOMERS customers) on $STORE in $(( $(date +%s) - START )) s"
"$BIN" serve --config "$DIR/inhook.toml" > "$DIR/out" 2> "$DIR/err" &
SERVER=$!
for _ in $(seq 100); do grep -q listening "$DIR/out" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/^inhook listening on //p' "$DIR/out")
probe() {
  local what=$1 query=$2
  # The first read warms the caches; the best of five after it is reported.
  curl -sf -o /dev/null -H "Authorization: Bearer bench-token-0123456789abcdef" "$URL/v1/events?$query"
  local best=999
  for _ in 1 2 3 4 5; do
    t=$(curl -sf -o "$DIR/page" -w '%{time_total}' -H "Authorization: Bearer bench-token-0123456789abcdef" "$URL/v1/events?$query")
    best=$(echo "$t $best" | awk '{print ($1 < $2) ? $1 : $2}')
  done
  printf '%-44s %8.1f ms  %s items\n' "$what" "$(echo "$best * 1000" | bc -l)" \
    "$(grep -o '"event_id"' "$DIR/page" | wc -l)"
}
C=$(( CUSTOMERS / 2 ))
probe "where=/customer=cus_$C (indexed)" "where=/customer=cus_$C"
probe "where + source + type=invoice.*" "source=shop&where=/customer=cus_$C&type=invoice.*"
probe "event_id (with source)" "source=shop&event_id=ev_$(( ROWS / 2 ))"
probe "event_id (without source: a scan)" "event_id=ev_$(( ROWS / 2 ))"
probe "type=charge.* (newest page)" "type=charge.*"
FROM_T=$(date -u -d "@$(( (NOW_MS + ROWS / 2) / 1000 ))" +%Y-%m-%dT%H:%M:%SZ)
probe "from=<the middle> (newest page)" "from=$FROM_T"
probe "to=<the middle> (newest page before it)" "to=$FROM_T"
probe "where=/note=... (undeclared: scan, bounded)" "where=/note=n$(( ROWS - 5 ))"
probe "the log, no filter" ""
