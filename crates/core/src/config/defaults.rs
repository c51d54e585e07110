//! Every built-in default of the configuration, in one place (docs/configuration.md lists
//! each; keep the two in step). A key left out of the file and the environment takes the
//! value here; the checks a value must pass live with the section that reads it.

use crate::domain::kind::SourceKind;

const MINUTE_S: u64 = 60;
const HOUR_S: u64 = 60 * MINUTE_S;
const DAY_S: u64 = 24 * HOUR_S;

// Server: where inhook listens and stores, and how it logs.

/// `listen`: loopback only, so a first run exposes nothing to the network.
pub const LISTEN: &str = "127.0.0.1:8080";
/// `database`: a SQLite file in the working directory, so zero-config needs no server.
pub const DATABASE: &str = "sqlite://inhook.db";
/// `admin_open_to_loopback`: off, so no admin API answers without a token unless opted in.
pub const ADMIN_OPEN_TO_LOOPBACK: bool = false;
/// `log_format = "json"`: off (text), which reads best on a terminal.
pub const LOG_JSON: bool = false;

// Sources: the zero-config ones and every source's keys.

/// The sources served when the file has no `[[sources]]`: the two seed kinds, named after them.
pub const ZERO_CONFIG_SOURCES: [(&str, SourceKind); 2] = [
    ("presence", SourceKind::Presence),
    ("save-game", SourceKind::SaveGame),
];
/// `decide_at_ingest`: off, so an async delivery's answer waits for nothing but the log.
pub const DECIDE_AT_INGEST: bool = false;
/// `tolerance_s`: five minutes between a signed timestamp and receipt, as publishers allow.
pub const TOLERANCE_S: u64 = 5 * MINUTE_S;
/// `first_sequence`: sequences count from 1, as the seed publishers number them.
pub const FIRST_SEQUENCE: i64 = 1;
/// `hold_timeout_s`: time for a publisher's retry to fill a gap, without a long stall.
pub const HOLD_TIMEOUT_S: u64 = 30;
/// `stale_after_s`: fifteen minutes without an update, several missed heartbeats.
pub const STALE_AFTER_S: u64 = 15 * MINUTE_S;
/// `max_backlog`: a million undecided events, far above a healthy backlog, below a full disk.
pub const MAX_BACKLOG: u64 = 1_000_000;
/// `max_held_per_aggregate`: bounds what one lost event can hold back in its aggregate.
pub const MAX_HELD_PER_AGGREGATE: u64 = 1000;

// Retry: the top-level backoff, also every destination's unless it sets its own.

/// `retry_base_s`: the first retry after a second, quick enough for a passing fault.
pub const RETRY_BASE_S: u64 = 1;
/// `retry_max_delay_s`: at most five minutes between attempts, so a recovery is seen soon.
pub const RETRY_MAX_DELAY_S: u64 = 5 * MINUTE_S;
/// `max_attempts`: eight attempts, the first included, span about two minutes of backoff.
pub const MAX_ATTEMPTS: u32 = 8;

// Destinations: each `[[destinations]]` table's keys.

/// A destination's `timeout_s`: ample for an application that only queues the event.
pub const DESTINATION_TIMEOUT_S: u64 = 10;
/// A destination's `lease_margin_s`: time to read the event and record the answer.
pub const DESTINATION_LEASE_MARGIN_S: u64 = 30;
/// A destination's `concurrency`: 32 requests on the wire, enough to keep one endpoint busy.
pub const DESTINATION_CONCURRENCY: usize = 32;
/// The duplicate window of a NATS stream inhook creates (`create_stream`), in seconds: a
/// resend with the same `Nats-Msg-Id` inside it is dropped by the server.
pub const NATS_DUPLICATE_WINDOW_S: u64 = 600;

// Limits: bodies, connections, streams.

/// `max_body_bytes`: 256 KiB, well above a webhook's body and small enough to buffer many.
pub const MAX_BODY_BYTES: usize = 256 * 1024;
/// `body_read_timeout_s`: webhook bodies are small; one still arriving is slow or hostile.
pub const BODY_READ_TIMEOUT_S: u64 = 10;
/// `header_read_timeout_s`: a request head arrives at once; also the keep-alive idle time.
pub const HEADER_READ_TIMEOUT_S: u64 = 10;
/// `min_body_bytes_per_s`: the default largest body within a minute; a trickle is cut.
pub const MIN_BODY_BYTES_PER_S: u64 = 4096;
/// `max_header_bytes`: 16 KiB, twice hyper's floor, room for long signature headers.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// The least `max_header_bytes` can be: hyper's floor for its read buffer is 8 KiB.
pub const MIN_HEADER_BYTES: usize = 8 * 1024;
/// `max_connections`: 1024 open at once, which fits the common open-files limit.
pub const MAX_CONNECTIONS: usize = 1024;
/// `max_connections_per_peer`: a proxy's or a benchmark's 64 connections while they reconnect.
pub const MAX_CONNECTIONS_PER_PEER: usize = 128;
/// `max_buffered_body_bytes`: 64 MiB, 256 bodies of the default `max_body_bytes`.
pub const MAX_BUFFERED_BODY_BYTES: usize = 64 * 1024 * 1024;
/// `max_buffered_body_bytes_per_peer` is the budget over this: eight hosts to block every body.
pub const BUFFERED_BODY_BYTES_PEERS: usize = 8;
/// `max_streams`: 64 change streams per node, plenty of dashboards and consumers.
pub const MAX_STREAMS: usize = 64;
/// `stream_buffer`: 1024 changes held for a slow stream before it catches up from the store.
pub const STREAM_BUFFER: usize = 1024;

// Processing: workers, the store, retention, shutdown and the optional endpoints.

/// `workers`: four aggregates processed in parallel, a small machine's cores.
pub const WORKERS: usize = 4;
/// `busy_timeout_ms`: five seconds waiting for a lock, longer than any healthy transaction.
pub const BUSY_TIMEOUT_MS: u64 = 5_000;
/// `pool_size`: 16 PostgreSQL connections per node, well within the server's default 100.
pub const POOL_SIZE: usize = 16;
/// `group_commit`: on, one fsync for many concurrent deliveries.
pub const GROUP_COMMIT: bool = true;
/// `retention_s`: thirty days of decided events, time to notice and replay a problem.
pub const RETENTION_S: u64 = 30 * DAY_S;
/// `dedup_window_s`: thirty days, longer than publishers keep retrying a delivery.
pub const DEDUP_WINDOW_S: u64 = 30 * DAY_S;
/// `purge_interval_s`: hourly, so the log never grows far past `retention_s`.
pub const PURGE_INTERVAL_S: u64 = HOUR_S;
/// `stats_retention_days`: two weeks of figures per minute, enough to compare a week with the last.
pub const STATS_RETENTION_DAYS: u64 = 14;
/// `shutdown_timeout_s`: within the grace a supervisor usually gives before killing.
pub const SHUTDOWN_TIMEOUT_S: u64 = 10;
/// `forward_poll_ms`: a second; a safety net only, as commits and due retries wake a sender.
pub const FORWARD_POLL_MS: u64 = 1_000;
/// `metrics_public`: off, so `/metrics` needs the admin token.
pub const METRICS_PUBLIC: bool = false;
/// `bench_ceiling`: off, the endpoint is for benchmarks only.
pub const BENCH_CEILING: bool = false;
/// `alert_tick_ms`: the alert rules are evaluated every ten seconds.
pub const ALERT_TICK_MS: u64 = 10_000;
