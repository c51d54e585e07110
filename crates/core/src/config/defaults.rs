//! The built-in defaults of the sources' and destinations' keys (docs/configuration.md
//! lists each; keep the two in step). A top-level key's default is in its section's
//! `Default` (config/http.rs, store.rs, admin.rs, processing.rs, observability.rs),
//! next to the field it fills.

use crate::domain::kind::SourceKind;

const MINUTE_S: u64 = 60;

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
