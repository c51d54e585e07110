//! Storage: one [`Store`] trait over the event log and the projections. The
//! stores only load and save; what to decide comes from [`crate::domain::ordering`],
//! so every implementation applies the same rules.

pub mod alerts;
pub mod backend;
mod batch;
mod bulk;
mod engine;
pub mod erasure;
mod filter;
pub mod forwarding;
mod ingest;
mod migrations;
pub mod postgres;
mod postgres_stats;
pub mod postgres_tls;
mod reads;
pub mod reset;
mod rows;
pub(crate) mod settle;
mod sql;
pub mod sqlite;
pub mod stats;
mod upkeep;
pub mod vault;

use async_trait::async_trait;
use std::fmt;

use serde::Serialize;

use crate::domain::kind::{EventFields, Kind};
use crate::domain::ordering::Outcome;
use crate::domain::retry::RetryPolicy;
use crate::domain::{DeadReason, EventId, EventStatus};

pub use engine::SqlStore;
pub use forwarding::{
    DeliveryFilter, DeliveryPage, DeliveryRecord, DeliveryReplay, DeliveryReplayJob, DeliverySkip,
    DestinationStats, PendingVerdict,
};
pub use postgres::{PoolSettings, PostgresStore};
pub use sqlite::SqliteStore;

/// The schema version a migrated store records in `schema_migrations`: its last migration's.
pub const SCHEMA_VERSION: i64 = migrations::SQLITE[migrations::SQLITE.len() - 1].0;

#[cfg(test)]
mod schema_version_tests {
    use super::migrations::{POSTGRES, SQLITE};

    /// Both chains number their migrations 1, 2, 3, … in step, so that one version names one schema.
    #[test]
    fn both_migration_chains_count_the_same_versions_up_to_schema_version() {
        let versions = |chain: &[(i64, &str)]| chain.iter().map(|(v, _)| *v).collect::<Vec<_>>();
        let expected: Vec<i64> = (1..=super::SCHEMA_VERSION).collect();
        assert_eq!(versions(SQLITE), expected);
        assert_eq!(versions(POSTGRES), expected);
    }
}

/// Why a store operation failed. Every variant means nothing was committed.
#[derive(Debug, Clone)]
pub enum StoreError {
    /// The database cannot be reached or is busy; the caller may retry later.
    Unavailable(Failure),
    /// A stored value did not open under its key (answered 500 `undecryptable`).
    Undecryptable(crate::domain::encryption::Undecryptable),
    /// A delivery was sealed under a data key erased since it was cached (or that another
    /// node's first delivery beat): the store seals it again and logs it.
    StaleKey,
    /// A limit refused element `index` of a batch: nothing of the batch was kept.
    BatchRefused {
        /// The element refused.
        index: usize,
        /// The limit that refused it.
        refusal: Refusal,
    },
    /// Anything else: a bug or a corrupt database.
    Internal(Failure),
}

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreError::Unavailable(failure) => write!(f, "store unavailable: {failure}"),
            StoreError::Undecryptable(err) => write!(f, "store error: {err}"),
            StoreError::StaleKey => {
                f.write_str("store error: the data key a delivery was sealed under is gone")
            }
            StoreError::BatchRefused { index, .. } => {
                write!(f, "store error: batch element {index} refused by a limit")
            }
            StoreError::Internal(failure) => write!(f, "store error: {failure}"),
        }
    }
}

/// The cause is the database's own error where there is one (a [`Failure`]'s words already
/// describe it, so the failure itself is not a link of the chain).
impl std::error::Error for StoreError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StoreError::Unavailable(failure) | StoreError::Internal(failure) => failure
                .cause
                .as_deref()
                .map(|cause| cause as &(dyn std::error::Error + 'static)),
            StoreError::Undecryptable(err) => Some(err),
            StoreError::StaleKey | StoreError::BatchRefused { .. } => None,
        }
    }
}

/// What failed, in words for the log, and the error that caused it when there is one
/// (the words describe it too: a log line shows them without walking the causes).
#[derive(Debug, Clone)]
pub struct Failure {
    detail: String,
    cause: Option<std::sync::Arc<dyn std::error::Error + Send + Sync>>,
}

impl Failure {
    /// A failure caused by `cause`, described as `detail`.
    pub fn caused(
        detail: impl Into<String>,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            detail: detail.into(),
            cause: Some(std::sync::Arc::new(cause)),
        }
    }

    /// The error that caused it, if any.
    pub fn cause(&self) -> Option<&(dyn std::error::Error + Send + Sync + 'static)> {
        self.cause.as_deref()
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.detail)
    }
}

impl From<String> for Failure {
    fn from(detail: String) -> Self {
        Self {
            detail,
            cause: None,
        }
    }
}

impl From<&str> for Failure {
    fn from(detail: &str) -> Self {
        detail.to_owned().into()
    }
}

impl From<crate::domain::kind::CorruptState> for StoreError {
    fn from(err: crate::domain::kind::CorruptState) -> Self {
        StoreError::Internal(Failure::caused(err.to_string(), err))
    }
}

/// The ordering settings of one source, as the store needs them.
#[derive(Debug, Clone)]
pub struct SourceRules {
    /// The source's name.
    pub name: String,
    /// Its kind: contract, rules and views.
    pub kind: std::sync::Arc<dyn Kind>,
    /// The first sequence of every aggregate.
    pub first_sequence: i64,
    /// How long an in-order event waits for a gap, in milliseconds.
    pub hold_timeout_ms: i64,
    /// The configured destinations: settling writes a delivery for each that wants an applied event.
    pub destinations: std::sync::Arc<[crate::config::DestinationConfig]>,
}

impl SourceRules {
    /// The ordering and forwarding settings of a configured source (`destinations`: every
    /// configured one).
    pub fn for_source(
        source: &crate::config::SourceConfig,
        destinations: &std::sync::Arc<[crate::config::DestinationConfig]>,
    ) -> Self {
        Self {
            name: source.name.clone(),
            kind: std::sync::Arc::clone(&source.kind),
            first_sequence: source.first_sequence,
            hold_timeout_ms: (source.hold_timeout_s as i64).saturating_mul(1000),
            destinations: std::sync::Arc::clone(destinations),
        }
    }
}

/// A verified, parsed delivery about to be logged.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    /// The source it was posted to.
    pub source: &'a str,
    /// The parsed event's fields.
    pub event: &'a EventFields,
    /// The raw body exactly as received.
    pub body: &'a [u8],
    /// Request headers worth keeping for triage (never signatures or credentials).
    pub headers: &'a [(String, String)],
    /// Time of receipt, unix milliseconds.
    pub received_at_ms: i64,
    /// The signed timestamp, for timestamped schemes.
    pub signed_at: Option<i64>,
    /// The source's admission limits, enforced inside the ingest transaction.
    pub limits: IngestLimits,
    /// A type outside the source's `event_types`: logged `ignored_unsupported`, decided
    /// at once, never settled, under no limit (it is no backlog item) (docs/contract.md, json
    /// sources).
    pub ignored: bool,
    /// What besides its ids makes it a duplicate of a logged event of the source: its raw
    /// body, what its signature covers, or nothing (docs/contract.md, duplicates).
    pub body_key: BodyKey,
    /// The source's `search_fields`: the values its body holds there are indexed with it
    /// (docs/api.md, search).
    pub search_fields: &'a [crate::domain::search::SearchField],
}

/// The body key of a delivery: what, besides its `event_id` and `idempotency_key`, makes
/// it a duplicate of a logged event of its source (docs/contract.md, duplicates). Stored
/// hashed (keyed with encryption on) in the event's `body_sha256`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BodyKey {
    /// Nothing more: the scheme signs a delivery id or a time that bounds a replay.
    #[default]
    None,
    /// The raw body, byte for byte: the scheme signs neither a delivery id nor a time, so
    /// its headers cannot tell a resent capture from a new delivery.
    RawBody,
    /// The SHA-256 of what the signature covers, which is less than the raw body (an
    /// `hmac` `signed_content` without `{body}`) or a canonical form of it (`twilio`): any
    /// delivery carrying the same signature is the same delivery.
    SignedContent([u8; 32]),
}

impl BodyKey {
    /// The key of the element at `index` of a batch verified as a whole: a signed content
    /// is the whole batch's, so each element's is told apart by its place in the array.
    pub fn for_element(self, index: usize) -> Self {
        match self {
            BodyKey::SignedContent(digest) => {
                use sha2::Digest;
                let mut hash = sha2::Sha256::new();
                hash.update(digest);
                hash.update((index as u64).to_be_bytes());
                BodyKey::SignedContent(hash.finalize().into())
            }
            other => other,
        }
    }
}

/// Limits a delivery is admitted under. The store decides them in the transaction
/// that logs the delivery, so that concurrent deliveries can never overshoot them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IngestLimits {
    /// Undecided events (received, held, retrying) of the source logging may leave at most.
    pub max_backlog: u64,
    /// In-order events of one aggregate waiting ahead of a gap that logging may leave at most.
    pub max_held_per_aggregate: u64,
    /// The source's first sequence: an aggregate without state waits for it.
    pub first_sequence: i64,
}

impl IngestLimits {
    /// The limits a configured source's deliveries are admitted under.
    pub fn for_source(source: &crate::config::SourceConfig) -> Self {
        Self {
            max_backlog: source.max_backlog,
            max_held_per_aggregate: source.max_held_per_aggregate,
            first_sequence: source.first_sequence,
        }
    }

    /// No limit at all.
    pub const NONE: Self = Self {
        max_backlog: u64::MAX,
        max_held_per_aggregate: u64::MAX,
        first_sequence: 1,
    };
}

/// A delivery as one row of the event log, owned so that it can wait in a
/// group-commit queue until a writer takes its batch.
#[derive(Debug, Clone)]
pub struct EventRow {
    pub(crate) source: String,
    pub(crate) event_id: String,
    pub(crate) event_type: String,
    pub(crate) aggregate: String,
    pub(crate) sequence: i64,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) body: Vec<u8>,
    /// The kept headers as JSON.
    pub(crate) headers: Option<String>,
    /// The body key ([`NewEvent::body_key`]) as stored: the body's SHA-256 (hex), or
    /// `signed:` and the signed content's; each keyed when encryption is on.
    pub(crate) body_sha256: Option<String>,
    pub(crate) received_at: i64,
    pub(crate) signed_at: Option<i64>,
    pub(crate) limits: IngestLimits,
    /// Whether the event is an in-order delta, the only kind that can be held.
    pub(crate) may_hold: bool,
    /// Whether it is logged already decided, `ignored_unsupported` ([`NewEvent::ignored`]).
    pub(crate) ignored: bool,
    /// Why a source that orders events applies it unordered (docs/contract.md).
    pub(crate) unordered: Option<String>,
    /// The kind's parse of the body, for settling at ingest.
    pub(crate) parsed: Option<crate::domain::kind::ParsedBody>,
    /// What the row stores instead of its body and headers when encryption is on.
    pub(crate) sealed: Option<SealedRow>,
    /// Its search index rows: each declared field its body holds, with the value's
    /// index key ([`vault::Vault::search_key`]).
    pub(crate) search: Vec<(String, String)>,
}

/// A row's body and headers sealed under its aggregate's data key (docs/encryption.md).
#[derive(Debug, Clone)]
pub(crate) struct SealedRow {
    /// The data key (its id is stored with the row), which a settle at ingest seals the
    /// aggregate's writes under.
    pub key: std::sync::Arc<crate::domain::encryption::DataKey>,
    /// The sealed body.
    pub body: Vec<u8>,
    /// The sealed kept headers.
    pub headers: Option<String>,
    /// The data key itself, when the aggregate had none: written before the row.
    pub new_key: Option<vault::NewDataKey>,
}

impl EventRow {
    /// Seals the row's body and headers under `key` (`new`: the key is to be written first).
    pub(crate) fn seal(
        &mut self,
        key: &std::sync::Arc<crate::domain::encryption::DataKey>,
        new: Option<vault::NewDataKey>,
    ) {
        use crate::domain::encryption::{Binding, Column};
        let body = key.seal(&self.body, Binding::event(Column::Body, &self.event_id));
        let headers = self
            .headers
            .as_deref()
            .map(|h| key.seal_text(h, Binding::event(Column::Headers, &self.event_id)));
        self.sealed = Some(SealedRow {
            key: std::sync::Arc::clone(key),
            body,
            headers,
            new_key: new,
        });
    }

    /// The body as stored: sealed when encryption is on.
    pub(crate) fn stored_body(&self) -> &[u8] {
        self.sealed.as_ref().map_or(&self.body, |s| &s.body)
    }

    /// The kept headers as stored.
    pub(crate) fn stored_headers(&self) -> Option<&str> {
        match &self.sealed {
            Some(sealed) => sealed.headers.as_deref(),
            None => self.headers.as_deref(),
        }
    }

    /// The data key its columns are sealed under.
    pub(crate) fn data_key(&self) -> Option<i64> {
        self.sealed.as_ref().map(|s| s.key.id())
    }

    /// The row `event` is logged as (unsealed; its body hash keyed when `vault` encrypts).
    pub(crate) fn of(event: &NewEvent<'_>, vault: &vault::Vault) -> Self {
        Self {
            source: event.source.to_owned(),
            event_id: event.event.event_id.as_str().to_owned(),
            event_type: event.event.event_type.clone(),
            aggregate: event.event.aggregate.storage_key(),
            sequence: event.event.sequence,
            idempotency_key: event
                .event
                .idempotency_key
                .as_ref()
                .map(|k| k.as_str().to_owned()),
            body: event.body.to_vec(),
            headers: filter::headers_json(event.headers),
            body_sha256: match event.body_key {
                BodyKey::None => None,
                BodyKey::RawBody => Some(vault.body_hash(event.body)),
                BodyKey::SignedContent(digest) => Some(vault.signed_content_hash(&digest)),
            },
            received_at: event.received_at_ms,
            signed_at: event.signed_at,
            limits: event.limits,
            may_hold: event.event.may_hold,
            ignored: event.ignored,
            unordered: event.event.unordered.clone(),
            parsed: event.event.parsed.clone(),
            sealed: None,
            search: crate::domain::search::values(event.search_fields, event.body)
                .into_iter()
                .map(|(field, value)| {
                    let key = vault.search_key(field.as_str(), &value);
                    (field.as_str().to_owned(), key)
                })
                .collect(),
        }
    }

    /// The status it is logged with.
    pub(crate) fn logged_status(&self) -> &'static str {
        if self.ignored {
            crate::domain::EventStatus::IgnoredUnsupported.as_str()
        } else {
            crate::domain::EventStatus::Received.as_str()
        }
    }

    /// When it was decided: at receipt for an ignored type, else not yet.
    pub(crate) fn logged_decided_at(&self) -> Option<i64> {
        self.ignored.then_some(self.received_at)
    }

    /// The row as settling reads an arriving event, known by `row`.
    pub(crate) fn pending(&self, row: i64) -> crate::domain::kind::PendingRow {
        crate::domain::kind::PendingRow {
            row,
            event_id: self.event_id.clone(),
            event_type: self.event_type.clone(),
            sequence: self.sequence,
            idempotency_key: self.idempotency_key.clone(),
            body: self.body.clone(),
            received_at_ms: self.received_at,
            replayed: false,
            was_held: false,
            unordered: self.unordered.is_some(),
            parsed: self.parsed.clone(),
        }
    }
}

/// Where a newly logged delivery's aggregate is settled.
#[derive(Debug, Clone, Copy)]
pub enum SettleAt<'a> {
    /// By the worker, later.
    Worker,
    /// In the ingest transaction, whatever comes of it (sync mode); an event of an
    /// aggregate ready there is written once, already decided, as with `IfReady`.
    Ingest(&'a SourceRules),
    /// In the ingest transaction when the aggregate is ready there (async mode, issue
    /// #14: one transaction instead of two); else by the worker.
    IfReady(&'a SourceRules),
}

impl<'a> SettleAt<'a> {
    /// The rules of a settle at ingest, sync or when ready.
    pub fn rules(self) -> Option<&'a SourceRules> {
        match self {
            SettleAt::Worker => None,
            SettleAt::Ingest(rules) | SettleAt::IfReady(rules) => Some(rules),
        }
    }
}

/// What logging a delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Newly logged. `decided` is its outcome when it was settled in the same transaction.
    Logged {
        /// The event log row.
        row: i64,
        /// The outcome, when settled at ingest ([`SettleAt`]).
        decided: Option<Decided>,
        /// Whether an event of a higher sequence of its aggregate was received before it.
        out_of_order: bool,
    },
    /// Refused by a limit: nothing was stored.
    Refused(Refusal),
    /// Already logged: nothing was stored.
    Duplicate {
        /// The key that matched.
        key: DedupKey,
        /// The `event_id` of the event already logged.
        original: EventId,
        /// Whether the stored body differs from this one (a publisher error when the key is `event_id`).
        body_differs: bool,
    },
}

/// What logging a batch (`batch = true`) did: all of it, or none of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchAdmission {
    /// Every element logged (or found a duplicate) in one transaction, in order.
    Logged(Vec<Admission>),
    /// A limit refused the element at `index`: nothing of the batch was stored.
    Refused {
        /// The element refused, from 0.
        index: usize,
        /// Which limit.
        refusal: Refusal,
    },
}

/// Which limit refused a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The source's undecided events would exceed `max_backlog`.
    BacklogFull,
    /// The aggregate's events waiting ahead of a gap would exceed `max_held_per_aggregate`.
    AggregateBacklogFull,
}

/// The outcome of a sync-mode event and the aggregate's sequence after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// What became of the event.
    pub outcome: Outcome,
    /// Everything the settle step decided (the aggregate may have had other pending events).
    pub report: SettleReport,
    /// The aggregate's current sequence after settling (presence: the applied sequence; save: `last_sequence`).
    pub current_sequence: Option<i64>,
}

/// What settling one aggregate did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Events applied.
    pub applied: u64,
    /// Events older than the state: nothing applied.
    pub stale: u64,
    /// Events of an unknown type: nothing applied.
    pub unsupported: u64,
    /// Events left held, of those the step read (held events out of reach are not read).
    pub held: u64,
    /// Events held for the first time (they arrived ahead of a gap).
    pub newly_held: u64,
    /// Events that went dead, with their reasons.
    pub dead: Vec<DeadReason>,
    /// Missing sequences skipped by a hold timeout.
    pub gaps_skipped: u64,
    /// Events applied on a sequence equal to the current one (latest-wins `json`).
    pub ties: u64,
    /// Delivery rows written for destinations (docs/forwarding.md): the senders are woken
    /// when any were.
    pub deliveries: u64,
    /// For each decided event, milliseconds from receipt to decision.
    pub lags_ms: Vec<i64>,
    /// One line per decision (held only the first time), for the log.
    pub decided: Vec<DecisionLine>,
}

/// One decision about one event, as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecisionLine {
    /// The event's id.
    pub event_id: String,
    /// Its idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// Its sequence, when its body still parses.
    pub sequence: Option<i64>,
    /// The status it now has.
    pub decision: EventStatus,
}

pub use crate::domain::kind::AggregateState;
pub use crate::domain::DedupKey;

impl AggregatePage {
    /// The page of the `limit + 1` items read: the extra item says another page follows.
    pub(crate) fn of(mut items: Vec<AggregateState>, limit: usize) -> Self {
        let next_cursor = cut_page(&mut items, limit).map(|a| a.aggregate.clone());
        Self { items, next_cursor }
    }
}

/// Cuts the `limit + 1` items a page query read to `limit`; returns the last item kept
/// when the extra one was there (the next page starts after it).
pub(crate) fn cut_page<T>(items: &mut Vec<T>, limit: usize) -> Option<&T> {
    if items.len() <= limit {
        return None;
    }
    items.truncate(limit);
    items.last()
}

/// A page of aggregate states, ordered by stored key.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregatePage {
    /// The states.
    pub items: Vec<AggregateState>,
    /// The cursor for the next page (the last item's stored key), if there is one.
    pub next_cursor: Option<String>,
}

/// Which events a listing or a bulk replay covers. Every field narrows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct EventFilter {
    /// Only this source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Only this status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<EventStatus>,
    /// Only this aggregate, in its stored form ([`AggregateKey::storage_key`](crate::domain::AggregateKey::storage_key)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<String>,
    /// Only events received at or after this time, unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_from_ms: Option<i64>,
    /// Only events received before this time, unix milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub received_to_ms: Option<i64>,
    /// Only the event of this id (with `source`, of that source).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// Only events whose type fits this pattern (`invoice.paid`, `invoice.*`).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub event_type: Option<crate::domain::search::TypePattern>,
    /// Only events whose indexed fields hold these values (docs/api.md, search).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<SearchMatch>,
}

/// One condition on the search index: the events whose body holds, at a declared
/// `search_fields` pointer, the value whose index key is `key` ([`vault::Vault::search_key`]:
/// the value itself, or its keyed hash when encryption is on).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SearchMatch {
    /// The pointer.
    pub field: String,
    /// The value's index key.
    pub key: String,
}

/// One entry of an event's attempt history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AttemptRecord {
    /// When, unix milliseconds.
    pub at_ms: i64,
    /// `failed`, `exhausted` or `replayed`.
    pub kind: String,
    /// The error of a failed attempt.
    pub error: Option<String>,
}

/// An event as logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventRecord {
    /// Log row id; listings page by it.
    pub row: i64,
    /// The source.
    pub source: String,
    /// The publisher's event id.
    pub event_id: String,
    /// The event type.
    pub event_type: String,
    /// The aggregate, in stored form.
    pub aggregate: String,
    /// The sequence.
    pub sequence: i64,
    /// The idempotency key, if any.
    pub idempotency_key: Option<String>,
    /// The raw body as received.
    pub body: Vec<u8>,
    /// Verdict of the signature check at ingress (only verified events are logged).
    pub signature_valid: bool,
    /// Signed timestamp, for timestamped schemes.
    pub signed_at: Option<i64>,
    /// Time of receipt, unix milliseconds.
    pub received_at_ms: i64,
    /// Current status.
    pub status: EventStatus,
    /// Attempts made so far.
    pub attempts: i64,
    /// When the event is due again (retrying, held).
    pub next_attempt_at_ms: Option<i64>,
    /// The last error or the reason's detail.
    pub last_error: Option<String>,
    /// Why it is dead.
    pub dead_reason: Option<DeadReason>,
    /// When it was decided.
    pub decided_at_ms: Option<i64>,
    /// How many times a person replayed it.
    pub replays: i64,
    /// The kept request headers, as a JSON object text.
    pub headers: Option<String>,
    /// Why it was applied unordered though its source orders events (docs/contract.md).
    pub unordered: Option<String>,
    /// Failures and replays, oldest first (filled by [`Reads::event`] only).
    pub history: Vec<AttemptRecord>,
    /// Whether a sealed column did not open (tampered with, or moved from another row):
    /// its body, headers and error are left empty (docs/encryption.md).
    pub undecryptable: bool,
}

impl EventPage {
    /// The page of the `limit + 1` events read: the extra one says another page follows.
    pub(crate) fn of(mut items: Vec<EventRecord>, limit: usize) -> Self {
        let next_cursor = cut_page(&mut items, limit).map(|e| e.row);
        Self { items, next_cursor }
    }
}

/// A page of the event log, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    /// The events.
    pub items: Vec<EventRecord>,
    /// Row id to pass as cursor for the next page.
    pub next_cursor: Option<i64>,
}

/// What a single replay did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplayOutcome {
    /// No such event.
    NotFound,
    /// Put back in the queue; the worker will decide it again.
    Requeued,
    /// Already decided without failure (processed, stale, unsupported) or still pending: nothing changed.
    Unchanged(EventStatus),
}

/// A persisted bulk replay.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReplayJob {
    /// The job's id.
    pub id: i64,
    /// Which events it replays.
    pub filter: EventFilter,
    /// `running` or `done`.
    pub state: String,
    /// Matching events when the job was created.
    pub total: i64,
    /// Events requeued so far.
    pub requeued: i64,
    /// Creation time, unix milliseconds.
    pub created_at_ms: i64,
    /// Last progress, unix milliseconds.
    pub updated_at_ms: i64,
}

/// What one retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Events deleted from the log.
    pub events: u64,
    /// Expired dedup keys deleted.
    pub dedup_keys: u64,
}

/// What recording a failed attempt did to an aggregate's pending events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailureReport {
    /// Events scheduled for another attempt.
    pub retrying: u64,
    /// Events that ran out of attempts.
    pub dead: u64,
}

/// One applied state change, as streamed by `GET /v1/stream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateChange {
    /// Position in the change log; clients resume after it (`Last-Event-ID`).
    pub id: i64,
    /// The source.
    pub source: String,
    /// The aggregate, in stored form.
    pub aggregate: String,
    /// The kind's label: `presence`, `save` or `json`.
    pub kind: String,
    /// When it was applied, unix milliseconds.
    pub at_ms: i64,
    /// The new state in its API shape, as JSON text.
    pub state: String,
}

/// The event log as ingress writes it: each delivery logged once, by its unique keys,
/// before the answer.
#[async_trait]
pub trait EventLog: Send + Sync {
    /// The store's keys, where it has them: a search keys its values as ingest indexed
    /// them (docs/api.md, search). None: no keys, values indexed in clear.
    fn keys(&self) -> Option<&vault::Vault> {
        None
    }

    /// Logs a delivery unless its `event_id` or `idempotency_key` is known, and settles
    /// its aggregate in the same transaction as `settle` says: `decided` is then its
    /// outcome. Returns only after the commit.
    async fn ingest(
        &self,
        event: NewEvent<'_>,
        settle: SettleAt<'_>,
    ) -> Result<Admission, StoreError>;

    /// Logs the elements of one batch (docs/contract.md, batches) in one transaction, each
    /// as [`EventLog::ingest`] logs a delivery (its own dedup, `settle[i]` for `events[i]`):
    /// every element is logged or none is. Returns only after the commit.
    async fn ingest_batch(
        &self,
        events: &[NewEvent<'_>],
        settle: &[SettleAt<'_>],
    ) -> Result<BatchAdmission, StoreError> {
        let _ = (events, settle);
        Err(StoreError::Internal(
            "this store does not log batches".into(),
        ))
    }
}

/// What workers need: the aggregates due, and settling them.
#[async_trait]
pub trait Settling: Send + Sync {
    /// Wakes `wake` whenever another process logs work (a no-op for a single-process store).
    fn subscribe(&self, wake: std::sync::Arc<tokio::sync::Notify>) {
        let _ = wake;
    }

    /// Aggregates with events to decide now: received, or held or retrying and due.
    async fn due_aggregates(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError>;

    /// Decides every pending event of one aggregate and saves the result, in one transaction.
    async fn settle(
        &self,
        rules: &SourceRules,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<SettleReport, StoreError>;

    /// Settles several aggregates, in one transaction where the store can; all or nothing.
    async fn settle_many(
        &self,
        work: &[(SourceRules, String)],
        now_ms: i64,
    ) -> Result<Vec<SettleReport>, StoreError> {
        let mut reports = Vec::with_capacity(work.len());
        for (rules, aggregate) in work {
            reports.push(self.settle(rules, aggregate, now_ms).await?);
        }
        Ok(reports)
    }

    /// Records a failed attempt at an aggregate's due events: each is retried after the
    /// policy's backoff (with `jitter` in `[0, 1)`), or dead with `exhausted`.
    async fn record_failure(
        &self,
        rules: &SourceRules,
        aggregate: &str,
        error: &str,
        now_ms: i64,
        policy: RetryPolicy,
        jitter: f64,
    ) -> Result<FailureReport, StoreError>;
}

/// The forwarding queue as a sender works it (docs/forwarding.md): claims, releases,
/// verdicts.
#[async_trait]
pub trait DeliveryQueue: Send + Sync {
    /// Wakes `wake` whenever another process commits delivery rows (a no-op for a
    /// single-process store, whose committers wake this node's senders themselves).
    fn subscribe_deliveries(&self, wake: std::sync::Arc<tokio::sync::Notify>) {
        let _ = wake;
    }

    /// Claims up to `limit` deliveries of `destination` that may be sent at `now_ms`
    /// (docs/forwarding.md): per queue (destination, source, aggregate) only what
    /// [`crate::forward::queue::next_send`] allows, marking superseded replays skipped on
    /// the way; each claimed one is `in_flight`, its attempts counted, leased to `owner`
    /// until `lease_until_ms`. An expired lease (a dead node) is claimed again, same
    /// `webhook_id`. Several nodes claiming at once never lease two of one queue.
    async fn claim_deliveries(
        &self,
        destination: &str,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, StoreError>;

    /// Gives back deliveries `ids` that `owner` claimed but never sent (a sender's buffer
    /// at shutdown, or when its circuit opens): those it still holds in flight go back to
    /// `pending` (or `retrying`, due at `now_ms`, when attempted before), the claim's
    /// attempt taken back and the lease cleared, and the senders are rung, so that this or
    /// another node sends them at once rather than when the lease runs out. Answers how
    /// many it released (one taken over by another node, or already recorded, is not).
    async fn release_deliveries(
        &self,
        owner: &str,
        ids: &[i64],
        now_ms: i64,
    ) -> Result<u64, StoreError>;

    /// Records an attempt at an in-flight delivery and its verdict, if `owner` still holds
    /// its lease; answers whether it did (false: another node took it over, nothing written).
    async fn record_delivery_attempt(
        &self,
        id: i64,
        owner: &str,
        verdict: &crate::forward::answer::Verdict,
        attempt: &crate::forward::answer::AttemptRecord,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Records several verdicts as [`DeliveryQueue::record_delivery_attempt`] does each, in one
    /// transaction where the store allows (a sender's finished requests, batched); answers,
    /// in order, whether each was recorded.
    async fn record_delivery_attempts(
        &self,
        owner: &str,
        verdicts: &[PendingVerdict],
    ) -> Result<Vec<bool>, StoreError> {
        let mut recorded = Vec::with_capacity(verdicts.len());
        for v in verdicts {
            recorded.push(
                self.record_delivery_attempt(v.id, owner, &v.verdict, &v.attempt, v.at_ms)
                    .await?,
            );
        }
        Ok(recorded)
    }

    /// When, after `now_ms`, `destination`'s next delivery falls due by time: a retry's
    /// next attempt or a lease running out. An idle sender sleeps until then at most.
    async fn next_delivery_due(
        &self,
        destination: &str,
        now_ms: i64,
    ) -> Result<Option<i64>, StoreError>;
}

/// What the read API and the command line read: events, states, changes, deliveries,
/// replays' progress.
#[async_trait]
pub trait Reads: Send + Sync {
    /// One aggregate's stored state (`aggregate` in stored form).
    async fn aggregate(
        &self,
        source: &str,
        aggregate: &str,
    ) -> Result<Option<AggregateState>, StoreError>;

    /// Aggregate states of a source, optionally of one `tag`, ordered by stored key,
    /// after `cursor` (a stored key).
    async fn aggregates_page(
        &self,
        source: &str,
        tag: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<AggregatePage, StoreError>;

    /// One event with its attempt history.
    async fn event(&self, source: &str, event_id: &str) -> Result<Option<EventRecord>, StoreError>;

    /// A page of the event log, newest first, before row `cursor`.
    async fn events(
        &self,
        filter: &EventFilter,
        limit: usize,
        cursor: Option<i64>,
    ) -> Result<EventPage, StoreError>;

    /// Events per source and status.
    async fn status_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError>;

    /// Undecided events (received, held, retrying) per source and status: what the
    /// backlog limit and gauges need, read without scanning decided history.
    async fn undecided_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError>;

    /// The id of the latest applied state change (0 when there is none).
    async fn last_change_id(&self) -> Result<i64, StoreError>;

    /// Applied state changes after id `after`, oldest first, optionally of one source and aggregate.
    async fn changes_after(
        &self,
        after: i64,
        source: Option<&str>,
        aggregate: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StateChange>, StoreError>;

    /// The ids of the applied state changes after id `after`, oldest first: what the
    /// change feed follows while no stream listens, without opening a sealed state.
    async fn change_ids_after(&self, after: i64, limit: usize) -> Result<Vec<i64>, StoreError>;

    /// A bulk replay's progress.
    async fn replay_job(&self, id: i64) -> Result<Option<ReplayJob>, StoreError>;

    /// One delivery of `destination` with its attempts, oldest first.
    async fn delivery(
        &self,
        destination: &str,
        id: i64,
    ) -> Result<Option<DeliveryRecord>, StoreError>;

    /// A page of `destination`'s deliveries matching `filter`, newest first, before id `cursor`.
    async fn deliveries(
        &self,
        destination: &str,
        filter: &DeliveryFilter,
        limit: usize,
        cursor: Option<i64>,
    ) -> Result<DeliveryPage, StoreError>;

    /// A bulk replay of deliveries' progress.
    async fn delivery_replay_job(&self, id: i64) -> Result<Option<DeliveryReplayJob>, StoreError>;

    /// `destination`'s backlog, in flight, dead, blocked aggregates and last error.
    async fn destination_stats(&self, destination: &str) -> Result<DestinationStats, StoreError>;
}

/// An operator's repairs: replays of events and deliveries, skips, resets.
#[async_trait]
pub trait Repairs: Send + Sync {
    /// Puts a dead or retrying event back in the queue.
    async fn replay_event(
        &self,
        source: &str,
        event_id: &str,
        now_ms: i64,
    ) -> Result<ReplayOutcome, StoreError>;

    /// Persists a bulk replay of the dead or retrying events matching `filter`.
    async fn create_replay_job(
        &self,
        filter: &EventFilter,
        now_ms: i64,
    ) -> Result<ReplayJob, StoreError>;

    /// Moves running bulk replays forward by up to `aggregates` aggregates, each requeued
    /// whole so the worker feeds it back in sequence order. Returns events requeued.
    async fn advance_replay_jobs(&self, now_ms: i64, aggregates: usize) -> Result<u64, StoreError>;

    /// Replays a dead or skipped delivery as [`crate::forward::queue::replay`] decides.
    async fn replay_delivery(
        &self,
        destination: &str,
        id: i64,
    ) -> Result<DeliveryReplay, StoreError>;

    /// Skips a dead or retrying delivery ([`crate::forward::queue::may_skip`]).
    async fn skip_delivery(&self, destination: &str, id: i64) -> Result<DeliverySkip, StoreError>;

    /// Persists a bulk replay of `destination`'s deliveries matching `filter` (dead ones
    /// when it names no status), advanced by [`Repairs::advance_delivery_replay_jobs`].
    async fn create_delivery_replay_job(
        &self,
        destination: &str,
        filter: &DeliveryFilter,
        now_ms: i64,
    ) -> Result<DeliveryReplayJob, StoreError>;

    /// Moves the oldest running bulk replay of deliveries on by up to `queues` queues,
    /// each matching delivery replayed as [`Repairs::replay_delivery`] does, in applied
    /// order. Returns deliveries requeued.
    async fn advance_delivery_replay_jobs(
        &self,
        now_ms: i64,
        queues: usize,
    ) -> Result<u64, StoreError>;

    /// Resets one aggregate on request (docs/contract.md, a publisher's bad version): its
    /// state and its highest received sequence are deleted, so that its next event applies
    /// as a new aggregate's first would; its events stay as they are.
    async fn reset_aggregate(
        &self,
        source: &str,
        aggregate: &str,
    ) -> Result<reset::ResetReport, StoreError>;
}

/// Keys and erasure (docs/encryption.md): unlocking, rekeying, sealing what was stored in
/// clear, forgetting.
#[async_trait]
pub trait Keys: Send + Sync {
    /// Checks that every master key the store's data is wrapped under is configured, and
    /// loads the keyed body hasher: once at start (docs/encryption.md).
    async fn unlock(&self) -> Result<(), StoreError>;

    /// Whether the store encrypts what it writes.
    fn encrypting(&self) -> bool;

    /// Forgets one aggregate (docs/encryption.md, erasure): its events `erased`, its state
    /// and change rows deleted, its undelivered forwards skipped, its data key destroyed.
    async fn forget(
        &self,
        source: &str,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<erasure::ForgetReport, StoreError>;

    /// Rewraps up to `batch` data keys after key id `after` under the first master key.
    async fn rekey_step(&self, after: i64, batch: usize) -> Result<erasure::KeyStep, StoreError>;

    /// How many data keys are not wrapped under the first master key.
    async fn rekey_left(&self) -> Result<u64, StoreError>;

    /// Seals the plaintext rows of the aggregates of up to `batch` events after row
    /// `after` (then of the states and change rows left), one transaction per step.
    async fn encrypt_step(&self, after: i64, batch: usize) -> Result<erasure::KeyStep, StoreError>;

    /// How many events are stored in plaintext.
    async fn plaintext_left(&self) -> Result<u64, StoreError>;

    /// Rewrites the database's files so that nothing deleted or overwritten is left in
    /// them (SQLite: VACUUM and a WAL checkpoint; PostgreSQL: nothing, VACUUM is the DBA's).
    async fn compact(&self) -> Result<(), StoreError>;

    /// Rids the database's files of what a rekey overwrote (an erasure does it itself):
    /// [`backend::Backend::scrub`].
    async fn scrub(&self, after: backend::Scrub) -> Result<(), StoreError>;
}

/// The schema, liveness, retention and one-time upgrade steps.
#[async_trait]
pub trait Upkeep: Send + Sync {
    /// Creates or upgrades the schema.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Whether the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Deletes up to `batch` decided events received before `before_ms`, keeping their
    /// dedup keys until `dedup_until_ms`; and deletes dedup keys expired at `now_ms`.
    async fn purge(
        &self,
        before_ms: i64,
        dedup_until_ms: i64,
        now_ms: i64,
        batch: usize,
    ) -> Result<PurgeReport, StoreError>;

    /// Deletes the figures of minutes before `before_ms`.
    async fn purge_stats(&self, before_ms: i64) -> Result<u64, StoreError>;

    /// Whether the one-time upgrade step `step` (queued by a migration) is still to be done.
    async fn upgrade_step_pending(&self, step: &str) -> Result<bool, StoreError>;

    /// Records that the upgrade step `step` is done.
    async fn finish_upgrade_step(&self, step: &str) -> Result<(), StoreError>;

    /// Passes the stored request headers of up to `batch` events after row `after` through
    /// `keep`, in one transaction; answers the last row read (none when no row was left)
    /// and how many were rewritten.
    async fn prune_headers(
        &self,
        after: i64,
        batch: usize,
        keep: std::sync::Arc<HeaderFilter>,
    ) -> Result<(Option<i64>, u64), StoreError>;
}

/// Figures over time (docs/api.md, stats): flushed per minute, read per step.
#[async_trait]
pub trait Figures: Send + Sync {
    /// Adds one flush of per-minute figures (docs/api.md, stats) in one transaction.
    async fn add_stats(&self, rows: Vec<stats::StatRow>) -> Result<(), StoreError>;

    /// The figures of one source or destination in `[from_ms, to_ms)`, summed per step of
    /// `step_ms` counted from `from_ms`.
    async fn stats_series(
        &self,
        scope: stats::StatScope,
        name: &str,
        window: (i64, i64, i64),
    ) -> Result<Vec<stats::StatCell>, StoreError>;

    /// Per source of `names`: its rejections by reason since `since_ms` (`(source,
    /// figure, count)`) and the time of its last delivery, as flushed.
    async fn source_stats(
        &self,
        names: Vec<String>,
        since_ms: i64,
    ) -> Result<stats::SourceStats, StoreError>;
}

/// The alerts' history and the marks the alert rules read (docs/api.md, alerts).
#[async_trait]
pub trait AlertLog: Send + Sync {
    /// Keeps one alert notice (docs/api.md, alerts); the new row's id.
    async fn record_alert(&self, alert: &alerts::AlertRecord) -> Result<i64, StoreError>;

    /// Keeps `alert` with one pending outbox row per channel of `channels` if `transition`'s
    /// conditional write succeeds ([`alerts::keep`]): the notice kept, or none when another
    /// node decided this transition.
    async fn keep_alert(
        &self,
        alert: alerts::AlertRecord,
        transition: alerts::Transition,
        channels: Vec<String>,
    ) -> Result<Option<alerts::AlertRecord>, StoreError>;

    /// Every alert firing now (the alerts decided across nodes).
    async fn alerts_firing(&self) -> Result<Vec<alerts::Firing>, StoreError>;

    /// Takes the lease of `channel`'s next notice for `node` ([`alerts::claim`]).
    async fn claim_alert_notice(
        &self,
        channel: &str,
        node: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<alerts::Claim, StoreError>;

    /// Records one attempt at an outbox row and gives its lease up ([`alerts::attempted`]).
    async fn alert_notice_attempted(
        &self,
        outbox_id: i64,
        node: &str,
        attempts: i64,
        outcome: alerts::Attempted,
        now_ms: i64,
    ) -> Result<bool, StoreError>;

    /// Kept alert notices, newest first, before the id `before` when given.
    async fn alerts(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<alerts::AlertRecord>, StoreError>;

    /// When `source` last received a delivery and holds its oldest held event, for the
    /// alert rules.
    async fn source_marks(&self, source: &str) -> Result<alerts::SourceMarks, StoreError>;
}

/// The durable store behind inhook: event log, dedup keys, projections; every role
/// at once, for the wiring that hands each caller its own ([`EventLog`], [`Settling`],
/// [`DeliveryQueue`], [`Reads`], [`Repairs`], [`Keys`], [`Upkeep`], [`Figures`], [`AlertLog`]).
pub trait Store:
    EventLog + Settling + DeliveryQueue + Reads + Repairs + Keys + Upkeep + Figures + AlertLog + 'static
{
}

impl<T> Store for T where
    T: EventLog
        + Settling
        + DeliveryQueue
        + Reads
        + Repairs
        + Keys
        + Upkeep
        + Figures
        + AlertLog
        + 'static
{
}

/// What an event's stored request headers (JSON text) become, given its source; `None`
/// when they stay as they are.
pub type HeaderFilter = dyn Fn(&str, &str) -> Option<String> + Send + Sync;

/// The upgrade step that applies the kept-headers allowlist to rows of older releases.
pub const PRUNE_HEADERS_STEP: &str = "prune_stored_headers";

/// The upgrade step migration 18 queues on a SQLite store written by a release without
/// `secure_delete`: the file is rewritten once (`VACUUM`), at the first erasure, rekey or
/// `rekey --encrypt-existing` (docs/encryption.md, erasure).
pub const SCRUB_STEP: &str = "scrub_deleted_data";

/// The outcome of a stored event row, for answers and tests.
pub fn status_of(outcome: &Outcome) -> (crate::domain::EventStatus, Option<DeadReason>) {
    use crate::domain::EventStatus as S;
    match outcome {
        Outcome::Applied => (S::Processed, None),
        Outcome::Stale => (S::IgnoredStale, None),
        Outcome::Unsupported => (S::IgnoredUnsupported, None),
        Outcome::Held => (S::Held, None),
        Outcome::Dead { reason, .. } => (S::Dead, Some(*reason)),
    }
}
