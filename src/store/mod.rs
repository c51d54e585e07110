//! Storage: one [`Store`] trait over the event log and the projections. The
//! stores only load and save; what to decide comes from [`crate::ordering`],
//! so every implementation applies the same rules.

mod migrations;
pub mod sqlite;

use async_trait::async_trait;

use crate::contract::{Event, Presence, SourceKind};
use crate::domain::{AggregateKey, DeadReason, EventId, Sequence};
use crate::ordering::Outcome;
use crate::projection::{PresenceState, SaveState};

pub use sqlite::SqliteStore;

/// Why a store operation failed. Every variant means nothing was committed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database cannot be reached or is busy; the caller may retry later.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// Anything else: a bug or a corrupt database.
    #[error("store error: {0}")]
    Internal(String),
}

/// The ordering settings of one source, as the store needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceRules {
    /// The source's name.
    pub name: String,
    /// Which contract and projection it feeds.
    pub kind: SourceKind,
    /// The first sequence of every aggregate.
    pub first_sequence: i64,
    /// How long an in-order event waits for a gap, in milliseconds.
    pub hold_timeout_ms: i64,
}

/// A verified, parsed delivery about to be logged.
#[derive(Debug, Clone)]
pub struct NewEvent<'a> {
    /// The source it was posted to.
    pub source: &'a str,
    /// The parsed event.
    pub event: &'a Event,
    /// The raw body exactly as received.
    pub body: &'a [u8],
    /// Time of receipt, unix milliseconds.
    pub received_at_ms: i64,
    /// The signed timestamp, for timestamped schemes.
    pub signed_at: Option<i64>,
}

/// Which unique key made a delivery a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupKey {
    /// The same `event_id` was already logged.
    EventId,
    /// Another event with the same `idempotency_key` was already logged.
    IdempotencyKey,
}

impl DedupKey {
    /// The label used in answers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DedupKey::EventId => "event_id",
            DedupKey::IdempotencyKey => "idempotency_key",
        }
    }
}

/// What logging a delivery did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Newly logged. For a sync source, `decided` is its outcome, settled in the same transaction.
    Logged {
        /// The event log row.
        row: i64,
        /// The outcome when the source is in sync mode.
        decided: Option<Decided>,
    },
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

/// The outcome of a sync-mode event and the aggregate's sequence after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    /// What became of the event.
    pub outcome: Outcome,
    /// The aggregate's current sequence after settling (presence: the applied sequence; save: `last_sequence`).
    pub current_sequence: Option<i64>,
}

/// What settling one aggregate did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Events applied.
    pub applied: u64,
    /// Events decided without change (stale, unsupported).
    pub ignored: u64,
    /// Events left held.
    pub held: u64,
    /// Events that went dead, with their reasons.
    pub dead: Vec<DeadReason>,
    /// Missing sequences skipped by a hold timeout.
    pub gaps_skipped: u64,
}

/// A page of presence states.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresencePage {
    /// `(user_id, state)`, ordered by user id.
    pub items: Vec<(String, PresenceState)>,
    /// The cursor for the next page, if there is one.
    pub next_cursor: Option<String>,
}

/// The durable store behind inhook: event log, dedup keys, projections.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Creates or upgrades the schema.
    async fn migrate(&self) -> Result<(), StoreError>;

    /// Whether the store answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Logs a delivery unless its `event_id` or `idempotency_key` is known. With
    /// `settle_now`, also settles its aggregate in the same transaction (sync mode).
    /// Returns only after the commit.
    async fn ingest(
        &self,
        event: NewEvent<'_>,
        settle_now: Option<&SourceRules>,
    ) -> Result<Admission, StoreError>;

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

    /// A user's presence in a source.
    async fn presence(
        &self,
        source: &str,
        user_id: &str,
    ) -> Result<Option<PresenceState>, StoreError>;

    /// Presence states of a source, optionally of one status, after `cursor` (a user id).
    async fn presence_page(
        &self,
        source: &str,
        status: Option<Presence>,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<PresencePage, StoreError>;

    /// A save slot's state in a source.
    async fn save(
        &self,
        source: &str,
        aggregate: &AggregateKey,
    ) -> Result<Option<SaveState>, StoreError>;
}

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

/// Keeps `Sequence` in the store's vocabulary for implementations.
pub(crate) fn sequence_of(raw: i64) -> Result<Sequence, StoreError> {
    Sequence::new(raw)
        .ok_or_else(|| StoreError::Internal(format!("negative sequence {raw} in store")))
}
