# inhook in a container: a multi-stage build, a non-root user, the SQLite file on a volume.
#   docker build -t inhook .
#   docker run -p 8080:8080 -v inhook-data:/var/lib/inhook \
#     -e INHOOK_PRESENCE_SECRET=… -e INHOOK_SAVE_GAME_SECRET=… -e INHOOK_ADMIN_TOKEN=… inhook
# A config file: mount it and pass `--config /etc/inhook/inhook.toml` after the image name
# (`serve` is the default command). scripts/docker_steps.sh runs these steps without Docker.

FROM rust:1.95-slim-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin inhook

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --home-dir /var/lib/inhook --create-home inhook
COPY --from=build /src/target/release/inhook /usr/local/bin/inhook
USER inhook
WORKDIR /var/lib/inhook
ENV INHOOK_LISTEN=0.0.0.0:8080
ENV INHOOK_DATABASE=sqlite:///var/lib/inhook/inhook.db
VOLUME ["/var/lib/inhook"]
EXPOSE 8080
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD curl -fsS http://127.0.0.1:8080/healthz
ENTRYPOINT ["inhook"]
CMD ["serve"]
