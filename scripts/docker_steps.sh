#!/usr/bin/env bash
# Runs the Dockerfile's steps on this machine, for CI where no Docker engine runs: the
# build stage's command, then the image's command with the image's environment (its
# ENV lines, read from the Dockerfile) and a temporary folder as the volume, then the
# image's HEALTHCHECK command, which must succeed. Usage: scripts/docker_steps.sh
set -euo pipefail
cd "$(dirname "$0")/.."

dockerfile=Dockerfile
build_cmd=$(sed -n 's/^RUN \(cargo build .*\)$/\1/p' "$dockerfile")
health_cmd=$(sed -n 's/^HEALTHCHECK .* CMD \(.*\)$/\1/p' "$dockerfile")
[ -n "$build_cmd" ] && [ -n "$health_cmd" ] || { echo "Dockerfile: no build or HEALTHCHECK step found" >&2; exit 1; }

echo "build stage: $build_cmd"
eval "$build_cmd"

volume=$(mktemp -d)
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$volume"' EXIT
# The image's environment, with the volume's path and a free port in place of its own.
declare -A env_lines
while read -r name value; do env_lines[$name]=$value; done < <(sed -n 's/^ENV \([A-Z_]*\)=\(.*\)$/\1 \2/p' "$dockerfile")
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
listen=${env_lines[INHOOK_LISTEN]/0.0.0.0:8080/127.0.0.1:$port}
database=${env_lines[INHOOK_DATABASE]/\/var\/lib\/inhook/$volume}
(cd "$volume" && INHOOK_LISTEN=$listen INHOOK_DATABASE=$database \
    INHOOK_PRESENCE_SECRET=docker-steps-presence INHOOK_SAVE_GAME_SECRET=docker-steps-save \
    INHOOK_ADMIN_TOKEN=docker-steps-admin-token-0123 \
    exec "$OLDPWD/target/release/inhook" serve >"$volume/stdout" 2>"$volume/stderr") &
pid=$!
for _ in $(seq 1 100); do grep -q '^inhook listening on' "$volume/stdout" 2>/dev/null && break; sleep 0.1; done
grep -q "^inhook store: sqlite:$volume/inhook.db" "$volume/stdout" || { cat "$volume/stdout" "$volume/stderr" >&2; exit 1; }
echo "healthcheck: ${health_cmd/8080/$port}"
eval "${health_cmd/8080/$port}"
echo
[ -f "$volume/inhook.db" ] || { echo "the store is not on the volume" >&2; exit 1; }
echo "docker steps: ok"
