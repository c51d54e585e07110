//! The seam between the store's flows and a database: every flow (ingest's
//! bookkeeping, settling, reads, replay and purge, forwarding's deliveries) is
//! written once over [`Tx`], the statements of one transaction, and run by a
//! [`Backend`], which owns the connections, commits and wakes other nodes. A
//! backend supplies only what really differs between databases: its pool, its
//! committer and the few dialect words below. Statements are written once, with
//! `$n` placeholders.

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use tokio::sync::Notify;

use super::vault::Vault;
use super::{Admission, EventRow, SettleAt, StoreError};
use crate::domain::ordering::Outcome;

/// A flow's future over one transaction: boxed, so that a flow is a plain closure.
pub type FlowFuture<'t, T> = Pin<Box<dyn Future<Output = Result<T, StoreError>> + Send + 't>>;

/// How far a write transaction's commit must reach before the caller goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Commit {
    /// On disk: an answered request survives power loss.
    Durable,
    /// Forwarding's bookkeeping (a claim, a verdict): a power cut may lose it only as a
    /// crash during the request would (the delivery is sent again with the same
    /// `webhook-id`, docs/forwarding.md); a process crash loses nothing.
    Relaxed,
}

/// A database the one store runs on.
pub trait Backend: Clone + Send + Sync + 'static {
    /// The statements of one transaction.
    type Tx<'t>: Tx;

    /// The store's keys, which every transaction carries.
    fn vault(&self) -> &Arc<Vault>;

    /// The backend with `vault` as its keys (set before the store is used).
    fn with_vault(self, vault: Arc<Vault>) -> Self;

    /// Runs `flow` in one write transaction and commits it when the flow succeeds.
    fn write<T, F>(
        &self,
        commit: Commit,
        flow: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t Self::Tx<'t>) -> FlowFuture<'t, T> + Send + 'static;

    /// Runs `flow`, which only reads, on whatever connection reads cheapest (SQLite: the
    /// writing one, whose cache holds what was just written).
    fn read<T, F>(&self, flow: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t Self::Tx<'t>) -> FlowFuture<'t, T> + Send + 'static;

    /// Runs `flow`, which only reads, aside from the writers when the backend can (SQLite:
    /// on its read-only connection, so that a slow count never holds the writer up; its
    /// cache is cold after every commit, so the hot reads take [`Backend::read`]).
    fn read_aside<T, F>(&self, flow: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t Self::Tx<'t>) -> FlowFuture<'t, T> + Send + 'static,
    {
        self.read(flow)
    }

    /// Brings the schema up to the latest migration (once, if nodes start together).
    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Logs one verified delivery: the committer is the backend's (group commit).
    fn ingest<'a>(
        &'a self,
        row: EventRow,
        settle: SettleAt<'a>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send + 'a;

    /// Rewrites the database's files so that nothing deleted or overwritten is left in
    /// them: SQLite `VACUUM`s the database and truncates its write-ahead log; PostgreSQL
    /// leaves old row versions to VACUUM.
    fn compact(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Rids the database's files of what an erasure or a rekey just deleted or overwrote
    /// (docs/encryption.md), once it has committed. SQLite zeroes what it frees as it
    /// goes (`secure_delete`, on every connection): it truncates its write-ahead log,
    /// whose older page images still hold it, and rewrites the file once for a store
    /// written by a release without `secure_delete` ([`super::SCRUB_STEP`]). PostgreSQL
    /// rewrites the key tables (`VACUUM FULL`), whose dead row versions hold the keys.
    fn scrub(&self, _after: Scrub) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    /// Wakes `wake` whenever another node logs an event for the workers.
    fn subscribe(&self, _wake: Arc<Notify>) {}

    /// Wakes `wake` whenever another node writes deliveries for the senders.
    fn subscribe_deliveries(&self, _wake: Arc<Notify>) {}
}

/// What [`Backend::scrub`] follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scrub {
    /// An erasure, which destroyed the aggregate's data key or not (encryption off).
    Erasure {
        /// Whether a data key was deleted.
        data_key_destroyed: bool,
    },
    /// A rekey: every data key and the store's own keys rewrapped under the first master key.
    Rekey,
}

/// A bound value of a statement written once for both stores. Texts and bytes may
/// borrow what the caller holds (the delivery being logged): each backend binds a
/// `Param` by reference, so a statement copies none of its values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param<'a> {
    /// A text value.
    Text(Cow<'a, str>),
    /// An integer value.
    Int(i64),
    /// A text value or NULL.
    OptText(Option<Cow<'a, str>>),
    /// An integer value or NULL.
    OptInt(Option<i64>),
    /// Bytes (an event's body).
    Bytes(Cow<'a, [u8]>),
    /// A list of row ids, tested by the store's `in_ids` condition.
    Ids(Vec<i64>),
    /// A list of texts, read by the store's `source_aggregate_pairs`.
    Texts(Vec<String>),
}

impl<'a> Param<'a> {
    /// A text value owned by the parameter.
    pub fn owned(value: String) -> Self {
        Param::Text(Cow::Owned(value))
    }

    /// A text value or NULL, owned by the parameter.
    pub fn opt_owned(value: Option<String>) -> Self {
        Param::OptText(value.map(Cow::Owned))
    }

    /// A text value or NULL, borrowed from the caller.
    pub fn opt_text(value: Option<&'a str>) -> Self {
        Param::OptText(value.map(Cow::Borrowed))
    }
}

/// One value of a row read through [`Tx::query`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cell {
    /// An integer.
    Int(i64),
    /// A text.
    Text(String),
    /// Bytes (an event's body).
    Bytes(Vec<u8>),
    /// SQL NULL.
    Null,
}

/// The statements the flows run, inside one store transaction.
pub trait Tx: Sync {
    /// Appended to a query whose rows must stay as read until commit: PostgreSQL
    /// locks them against other nodes; SQLite's one writer already holds them.
    const LOCK_ROWS: &'static str;
    /// Like [`Tx::LOCK_ROWS`], skipping rows another node holds.
    const SKIP_LOCKED: &'static str;
    /// A query waiting for the lock of the key text bound at `$1` until commit; answers 1.
    const LOCK_KEY: &'static str;
    /// Whether the triggers keep each destination's blocked aggregates among its delivery
    /// counts (SQLite's one writer can); otherwise they are counted from the dead deliveries.
    const COUNTS_BLOCKED_AGGREGATES: bool;
    /// The query answering `(source, status, n)` for every status of every source.
    const STATUS_COUNTS: &'static str;
    /// Like [`Tx::STATUS_COUNTS`], for the undecided statuses only.
    const UNDECIDED_COUNTS: &'static str;
    /// The query answering the undecided events of the source bound at `$1`, in the
    /// writing transaction of a delivery just logged for it (ingest's backlog limit).
    const BACKLOG: &'static str;
    /// A statement run before [`Tx::BACKLOG`], with the same parameter, that holds the
    /// source's backlog until commit where other writers could count into it meanwhile
    /// (PostgreSQL); none where the writer is alone (SQLite).
    const LOCK_BACKLOG: Option<&'static str> = None;
    /// Whether a worker step reads its aggregates' states, arriving rows and held refs in
    /// one statement per table (`settle::read_step`): where each statement is a round trip
    /// and a plan (PostgreSQL), not where it is a function call (SQLite).
    const SETTLE_READS_BY_STEP: bool = false;

    /// A condition taking the lock of the key text `key` (an SQL expression) until commit:
    /// true when it took it, false when another node holds it (SQLite's one writer always
    /// takes it). The lock of a key is the same on every node and version.
    fn try_lock(key: &str) -> String;

    /// The condition "`column` is one of the ids bound at placeholder `n`" ([`Param::Ids`]).
    fn in_ids(column: &str, n: usize) -> String;

    /// A `FROM` item named `alias` with text columns `source` and `aggregate`, one row per
    /// place of the equally long lists bound at placeholders `n` and `n + 1` ([`Param::Texts`]).
    fn source_aggregate_pairs(n: usize, alias: &str) -> String;

    /// Runs a statement; returns the rows it changed.
    fn execute(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Runs a query; returns its rows.
    fn query(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Vec<Vec<Cell>>, StoreError>> + Send;

    /// Runs an `INSERT … ON CONFLICT DO NOTHING` of one row into a table keyed by `id`;
    /// the new row's id, or `None` when a unique key kept it out.
    fn insert_row(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send;

    /// Holds the given aggregates until commit against every other node settling or
    /// logging them, taken in one order so that two transactions never deadlock
    /// (SQLite's one writer holds everything already).
    fn lock_aggregates(
        &self,
        aggregates: &[(&str, &str)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Folds the event count deltas into their totals where the store keeps deltas
    /// (PostgreSQL, so that writers never wait on one counter row), one node at a time.
    fn fold_event_counts(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Like [`Tx::fold_event_counts`], for the delivery counts.
    fn fold_delivery_counts(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Writes a settle's decisions (and a history entry per dead event), in as few
    /// statements as the dialect allows.
    fn record_decisions(
        &self,
        decisions: &[(i64, Outcome)],
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Saves aggregates' new states, each aggregate once, in as few statements as the
    /// dialect allows ([`crate::store::settle::Writes`]).
    fn save_states(
        &self,
        states: &[StateRow],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Appends applied changes for the stream, in the order given, in as few statements
    /// as the dialect allows.
    fn add_changes(
        &self,
        changes: &[ChangeRow],
    ) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Wakes the workers of every node once the transaction commits (SQLite's
    /// workers share the process and need no word).
    fn wake_workers(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Wakes the senders of every other node once the transaction commits, because it
    /// wrote delivery rows (SQLite's senders share the process and need no word).
    fn wake_senders(&self) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// The store's keys: what the flow seals its writes and opens its reads with.
    fn vault(&self) -> &Vault;
}

/// A text parameter, borrowed from the caller.
pub(crate) fn text(value: &str) -> Param<'_> {
    Param::Text(Cow::Borrowed(value))
}

fn cell(row: &[Cell], at: usize) -> Result<&Cell, StoreError> {
    row.get(at)
        .ok_or_else(|| StoreError::Internal(format!("a row without column {at}").into()))
}

/// An integer column.
pub(crate) fn int(row: &[Cell], at: usize) -> Result<i64, StoreError> {
    match cell(row, at)? {
        Cell::Int(value) => Ok(*value),
        other => Err(StoreError::Internal(
            (format!("column {at}: an integer expected, got {other:?}")).into(),
        )),
    }
}

/// A text column that may be NULL.
pub(crate) fn opt_string(row: &[Cell], at: usize) -> Result<Option<String>, StoreError> {
    match cell(row, at)? {
        Cell::Text(value) => Ok(Some(value.clone())),
        Cell::Null => Ok(None),
        other => Err(StoreError::Internal(
            (format!("column {at}: a text expected, got {other:?}")).into(),
        )),
    }
}

/// A bytes column that may be NULL.
pub(crate) fn opt_bytes(row: &[Cell], at: usize) -> Result<Option<Vec<u8>>, StoreError> {
    match cell(row, at)? {
        Cell::Bytes(value) => Ok(Some(value.clone())),
        Cell::Null => Ok(None),
        other => Err(StoreError::Internal(
            (format!("column {at}: bytes expected, got {other:?}")).into(),
        )),
    }
}

/// An integer column that may be NULL.
pub(crate) fn opt_int(row: &[Cell], at: usize) -> Result<Option<i64>, StoreError> {
    match cell(row, at)? {
        Cell::Int(value) => Ok(Some(*value)),
        Cell::Null => Ok(None),
        other => Err(StoreError::Internal(
            (format!("column {at}: an integer expected, got {other:?}")).into(),
        )),
    }
}

/// A text column.
pub(crate) fn string(row: &[Cell], at: usize) -> Result<String, StoreError> {
    opt_string(row, at)?.ok_or_else(|| {
        StoreError::Internal(format!("column {at}: a text expected, got NULL").into())
    })
}

/// The one integer a one-row, one-column answer holds.
pub(crate) fn one_int(rows: &[Vec<Cell>]) -> Result<i64, StoreError> {
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Internal("a query answered no row".into()))?;
    int(row, 0)
}

/// An aggregate's new state, as [`super::sql::SAVE_AGGREGATE`] writes it (the state text sealed
/// already when encryption is on).
#[derive(Debug, Clone)]
pub struct StateRow {
    /// The source.
    pub source: String,
    /// The aggregate, as stored.
    pub aggregate: String,
    /// The current sequence.
    pub sequence: Option<i64>,
    /// The event that made the state.
    pub event_id: Option<String>,
    /// Its type.
    pub event_type: Option<String>,
    /// The state text, sealed when encryption is on.
    pub state: String,
    /// The kind's tag of the state.
    pub tag: Option<String>,
    /// The highest sequence applied without a gap.
    pub watermark: Option<i64>,
    /// When the state was written.
    pub updated_at_ms: i64,
    /// The gaps skipped past.
    pub skipped_gaps: Option<String>,
}

impl StateRow {
    /// The parameters of [`super::sql::SAVE_AGGREGATE`].
    pub fn params(&self) -> [Param<'_>; 10] {
        [
            text(&self.source),
            text(&self.aggregate),
            Param::OptInt(self.sequence),
            Param::opt_text(self.event_id.as_deref()),
            Param::opt_text(self.event_type.as_deref()),
            text(&self.state),
            Param::opt_text(self.tag.as_deref()),
            Param::OptInt(self.watermark),
            Param::Int(self.updated_at_ms),
            Param::opt_text(self.skipped_gaps.as_deref()),
        ]
    }
}

/// An applied change for the stream, as [`super::sql::ADD_CHANGE`] writes it.
#[derive(Debug, Clone)]
pub struct ChangeRow {
    /// The source.
    pub source: String,
    /// The aggregate, as stored.
    pub aggregate: String,
    /// The change stream's label of the source's kind.
    pub kind: &'static str,
    /// When the change was applied.
    pub at_ms: i64,
    /// The state as the stream shows it, sealed when encryption is on.
    pub state: String,
}

impl ChangeRow {
    /// The parameters of [`super::sql::ADD_CHANGE`].
    pub fn params(&self) -> [Param<'_>; 5] {
        [
            text(&self.source),
            text(&self.aggregate),
            text(self.kind),
            Param::Int(self.at_ms),
            text(&self.state),
        ]
    }
}
