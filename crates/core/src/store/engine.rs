//! The one [`Store`]: every operation is a flow written once ([`super::settle`],
//! [`super::reads`], [`super::upkeep`], [`super::forwarding`]) run in a
//! transaction of a [`Backend`]. Nothing here knows which database it runs on.

use std::sync::Arc;

use async_trait::async_trait;
use tokio::sync::Notify;

use super::backend::{Backend, Commit, Scrub, Tx};
use super::erasure::{self, ForgetReport, KeyStep};
use super::forwarding::{
    self, ClaimCursors, DeliveryFilter, DeliveryPage, DeliveryRecord, DeliveryReplay,
    DeliveryReplayJob, DeliverySkip, DestinationStats, PendingVerdict,
};
use super::reset::{self, ResetReport};
use super::vault::Vault;
use super::{bulk, ingest, reads, settle, upkeep};
use super::{
    Admission, AggregatePage, AggregateState, BatchAdmission, EventFilter, EventPage, EventRecord,
    EventRow, FailureReport, HeaderFilter, NewEvent, PurgeReport, ReplayJob, ReplayOutcome,
    SettleAt, SettleReport, SourceRules, StateChange, StoreError,
};
use super::{AlertLog, DeliveryQueue, EventLog, Figures, Keys, Reads, Repairs, Settling, Upkeep};
use crate::domain::encryption::DataKey;
use crate::domain::retry::RetryPolicy;
use crate::domain::EventStatus;
use crate::forward::answer::{AttemptRecord as DeliveryAttempt, Verdict};

/// The store over the database `B` (SQLite or PostgreSQL).
#[derive(Clone)]
pub struct SqlStore<B> {
    pub(super) backend: B,
    /// Where each destination's claims stand among its queues.
    claim_cursors: Arc<ClaimCursors>,
}

impl<B> SqlStore<B> {
    /// The store over `backend`.
    pub(super) fn over(backend: B) -> Self {
        Self {
            backend,
            claim_cursors: Arc::default(),
        }
    }
}

/// The data keys a batch made: the index of the row carrying each, its source, aggregate
/// and key.
type MadeKeys = Vec<(usize, String, String, Arc<DataKey>)>;

impl<B: Backend> SqlStore<B> {
    /// The store encrypting what it writes under `masters` (docs/encryption.md); what it
    /// stored before stays readable.
    pub fn with_encryption(
        mut self,
        masters: Option<Arc<crate::domain::encryption::MasterKeys>>,
    ) -> Self {
        self.backend = self.backend.with_vault(Arc::new(Vault::new(masters)));
        self
    }

    /// `row` sealed under its aggregate's data key: the cached one (`cached`), else the
    /// stored one, else a new one written with the row (and answered, to be remembered
    /// once the row is logged).
    async fn sealed(
        &self,
        mut row: EventRow,
        cached: bool,
    ) -> Result<(EventRow, Option<Arc<DataKey>>), StoreError> {
        let vault = self.backend.vault();
        let Some(masters) = vault.masters() else {
            return Ok((row, None));
        };
        if let Some(key) = cached
            .then(|| vault.cached_for(&row.source, &row.aggregate))
            .flatten()
        {
            row.seal(&key, None);
            return Ok((row, None));
        }
        let (source, aggregate) = (row.source.clone(), row.aggregate.clone());
        // Aside from the writer: a new aggregate's first delivery must not queue behind
        // the commits of the others for its lookup.
        let stored = self
            .backend
            .read_aside(move |io| {
                Box::pin(async move { io.vault().stored_key(io, &source, &aggregate).await })
            })
            .await?;
        match stored {
            Some(key) => {
                row.seal(&key, None);
                Ok((row, None))
            }
            None => {
                let (key, new) = vault.new_key(masters, &row.source, &row.aggregate);
                row.seal(&key, Some(new));
                Ok((row, Some(key)))
            }
        }
    }

    /// Logs `row` sealed as [`SqlStore::sealed`] says; remembers a key it made once the
    /// row that carries it is logged.
    async fn ingest_sealed(
        &self,
        row: EventRow,
        cached: bool,
        settle: SettleAt<'_>,
    ) -> Result<Admission, StoreError> {
        let (sealed, made) = self.sealed(row, cached).await?;
        // The names are copied only for a key made here, to be remembered after the commit.
        let made = made.map(|key| (sealed.source.clone(), sealed.aggregate.clone(), key));
        let admission = self.backend.ingest(sealed, settle).await?;
        if let (Some((source, aggregate, key)), Admission::Logged { .. }) = (made, &admission) {
            self.backend.vault().remember(&source, &aggregate, key);
        }
        Ok(admission)
    }

    /// The rows of a batch sealed as [`SqlStore::sealed`] seals one, one data key per
    /// aggregate (a new one written with its aggregate's first row only); answers the keys
    /// made, with the index of the row that carries each, to be remembered once that row
    /// is logged.
    async fn sealed_batch(
        &self,
        rows: Vec<EventRow>,
        cached: bool,
    ) -> Result<(Vec<EventRow>, MadeKeys), StoreError> {
        if !self.backend.vault().encrypting() {
            return Ok((rows, Vec::new()));
        }
        let mut keys: std::collections::HashMap<(String, String), Arc<DataKey>> =
            std::collections::HashMap::new();
        let mut made = Vec::new();
        let mut sealed_rows = Vec::with_capacity(rows.len());
        for mut row in rows {
            let at = (row.source.clone(), row.aggregate.clone());
            if let Some(key) = keys.get(&at) {
                row.seal(key, None);
                sealed_rows.push(row);
                continue;
            }
            let (row, new) = self.sealed(row, cached).await?;
            if let Some(key) = row.sealed.as_ref().map(|s| Arc::clone(&s.key)) {
                if let Some(new) = new {
                    made.push((sealed_rows.len(), at.0.clone(), at.1.clone(), new));
                }
                keys.insert(at, key);
            }
            sealed_rows.push(row);
        }
        Ok((sealed_rows, made))
    }

    /// Logs a batch's rows (sealed first when encrypting) in one durable transaction.
    async fn log_batch(
        &self,
        rows: Vec<EventRow>,
        cached: bool,
        rules: Vec<Option<(SourceRules, bool)>>,
    ) -> Result<Vec<Admission>, StoreError> {
        let (rows, made) = self.sealed_batch(rows, cached).await?;
        let admissions = self
            .write(move |io| Box::pin(async move { ingest::log_batch(io, &rows, &rules).await }))
            .await?;
        // As for one row: a key is remembered only once the row that carries it is logged.
        for (index, source, aggregate, key) in made {
            if let Some(Admission::Logged { .. }) = admissions.get(index) {
                self.backend.vault().remember(&source, &aggregate, key);
            }
        }
        Ok(admissions)
    }

    /// Runs a write flow durably.
    async fn write<T, F>(&self, flow: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t B::Tx<'t>) -> super::backend::FlowFuture<'t, T> + Send + 'static,
    {
        self.backend.write(Commit::Durable, flow).await
    }
}

#[async_trait]
impl<B: Backend> EventLog for SqlStore<B> {
    fn keys(&self) -> Option<&super::vault::Vault> {
        Some(self.backend.vault())
    }

    async fn ingest(
        &self,
        event: NewEvent<'_>,
        settle: SettleAt<'_>,
    ) -> Result<Admission, StoreError> {
        let vault = self.backend.vault();
        let row = EventRow::of(&event, vault);
        if !vault.encrypting() {
            return self.backend.ingest(row, settle).await;
        }
        // A key cached here may have been erased by another node since: the row's guard
        // then refuses it, and the delivery is sealed again under the aggregate's key now.
        match self.ingest_sealed(row, true, settle).await {
            Err(StoreError::StaleKey) => {
                let row = EventRow::of(&event, vault);
                tracing::info!(
                    source = %row.source,
                    event_id = %row.event_id,
                    "sealed again: the aggregate's cached data key was erased (or another node made its first)"
                );
                vault.forget_cached(&row.source, &row.aggregate);
                self.ingest_sealed(row, false, settle).await
            }
            done => done,
        }
    }

    async fn ingest_batch(
        &self,
        events: &[NewEvent<'_>],
        settle: &[SettleAt<'_>],
    ) -> Result<BatchAdmission, StoreError> {
        let vault = self.backend.vault();
        let rules: Vec<Option<(SourceRules, bool)>> = settle
            .iter()
            .map(|at| {
                at.rules()
                    .map(|rules| (rules.clone(), matches!(at, SettleAt::IfReady(_))))
            })
            .collect();
        let rows = || events.iter().map(|e| EventRow::of(e, vault)).collect();
        let mut logged = self.log_batch(rows(), true, rules.clone()).await;
        if matches!(logged, Err(StoreError::StaleKey)) {
            // As for one delivery: a cached key erased since; sealed again under the stored ones.
            for row in rows() {
                vault.forget_cached(&row.source, &row.aggregate);
            }
            logged = self.log_batch(rows(), false, rules).await;
        }
        match logged {
            Ok(admissions) => Ok(BatchAdmission::Logged(admissions)),
            Err(StoreError::BatchRefused { index, refusal }) => {
                Ok(BatchAdmission::Refused { index, refusal })
            }
            Err(err) => Err(err),
        }
    }
}

#[async_trait]
impl<B: Backend> Settling for SqlStore<B> {
    fn subscribe(&self, wake: Arc<Notify>) {
        self.backend.subscribe(wake);
    }

    async fn due_aggregates(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.backend
            .read(move |io| Box::pin(reads::due_aggregates(io, now_ms, limit)))
            .await
    }

    async fn settle(
        &self,
        rules: &SourceRules,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<SettleReport, StoreError> {
        let (rules, aggregate) = (rules.clone(), aggregate.to_owned());
        self.write(move |io| {
            Box::pin(async move {
                io.lock_aggregates(&[(&rules.name, &aggregate)]).await?;
                let settled = settle::settle(io, &rules, &aggregate, now_ms).await?;
                Ok(settled.report)
            })
        })
        .await
    }

    /// One transaction for all: a transaction per aggregate made every decision pay its
    /// own commit, and most aggregates have one or two events waiting under load.
    async fn settle_many(
        &self,
        work: &[(SourceRules, String)],
        now_ms: i64,
    ) -> Result<Vec<SettleReport>, StoreError> {
        let work = work.to_vec();
        self.write(move |io| {
            Box::pin(async move {
                let keys: Vec<(&str, &str)> = work
                    .iter()
                    .map(|(rules, aggregate)| (rules.name.as_str(), aggregate.as_str()))
                    .collect();
                io.lock_aggregates(&keys).await?;
                // Different aggregates touch different rows: where the backend pipelines
                // statements (PostgreSQL), their settles share the round trips, and their
                // writes are made together, one statement per table (settle::Writes).
                let mut first = settle::read_step(io, &work, now_ms).await?;
                let settles = work.iter().map(|(rules, aggregate)| {
                    let reads = first.remove(&(rules.name.clone(), aggregate.clone()));
                    settle::settle_deferred(io, rules, aggregate, now_ms, reads)
                });
                let mut writes = settle::Writes::default();
                let mut reports = Vec::with_capacity(work.len());
                for settled in futures_util::future::join_all(settles).await {
                    let (settled, more) = settled?;
                    writes.append(more);
                    reports.push(settled.report);
                }
                writes.apply(io, now_ms).await?;
                Ok(reports)
            })
        })
        .await
    }

    async fn record_failure(
        &self,
        rules: &SourceRules,
        aggregate: &str,
        error: &str,
        now_ms: i64,
        policy: RetryPolicy,
        jitter: f64,
    ) -> Result<FailureReport, StoreError> {
        let source = rules.name.clone();
        let (aggregate, error) = (aggregate.to_owned(), error.to_owned());
        self.write(move |io| {
            Box::pin(async move {
                io.lock_aggregates(&[(&source, &aggregate)]).await?;
                let retry = (policy, jitter);
                upkeep::record_failure(io, &source, &aggregate, &error, now_ms, retry).await
            })
        })
        .await
    }
}

#[async_trait]
impl<B: Backend> DeliveryQueue for SqlStore<B> {
    fn subscribe_deliveries(&self, wake: Arc<Notify>) {
        self.backend.subscribe_deliveries(wake);
    }

    async fn claim_deliveries(
        &self,
        destination: &str,
        owner: &str,
        now_ms: i64,
        lease_until_ms: i64,
        limit: usize,
    ) -> Result<Vec<DeliveryRecord>, StoreError> {
        let (destination, owner) = (destination.to_owned(), owner.to_owned());
        let cursors = Arc::clone(&self.claim_cursors);
        let lease = (now_ms, lease_until_ms);
        self.backend
            .write(Commit::Relaxed, move |io| {
                Box::pin(async move {
                    forwarding::claim(io, &destination, &owner, lease, limit, &cursors).await
                })
            })
            .await
    }

    async fn release_deliveries(
        &self,
        owner: &str,
        ids: &[i64],
        now_ms: i64,
    ) -> Result<u64, StoreError> {
        if ids.is_empty() {
            return Ok(0);
        }
        let (owner, ids) = (owner.to_owned(), ids.to_vec());
        self.backend
            .write(Commit::Relaxed, move |io| {
                Box::pin(async move { forwarding::release(io, &owner, &ids, now_ms).await })
            })
            .await
    }

    async fn record_delivery_attempt(
        &self,
        id: i64,
        owner: &str,
        verdict: &Verdict,
        attempt: &DeliveryAttempt,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let (owner, verdict, attempt) = (owner.to_owned(), verdict.clone(), attempt.clone());
        self.backend
            .write(Commit::Relaxed, move |io| {
                Box::pin(async move {
                    forwarding::record_verdict(io, id, &owner, &verdict, &attempt, now_ms).await
                })
            })
            .await
    }

    async fn record_delivery_attempts(
        &self,
        owner: &str,
        verdicts: &[PendingVerdict],
    ) -> Result<Vec<bool>, StoreError> {
        let (owner, verdicts) = (owner.to_owned(), verdicts.to_vec());
        self.backend
            .write(Commit::Relaxed, move |io| {
                Box::pin(async move { forwarding::record_verdicts(io, &owner, &verdicts).await })
            })
            .await
    }

    async fn next_delivery_due(
        &self,
        destination: &str,
        now_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let destination = destination.to_owned();
        self.backend
            .read(move |io| {
                Box::pin(async move { forwarding::next_due(io, &destination, now_ms).await })
            })
            .await
    }
}

#[async_trait]
impl<B: Backend> Reads for SqlStore<B> {
    async fn aggregate(
        &self,
        source: &str,
        aggregate: &str,
    ) -> Result<Option<AggregateState>, StoreError> {
        let (source, aggregate) = (source.to_owned(), aggregate.to_owned());
        self.backend
            .read(move |io| {
                Box::pin(async move { reads::aggregate(io, &source, &aggregate).await })
            })
            .await
    }

    async fn aggregates_page(
        &self,
        source: &str,
        tag: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<AggregatePage, StoreError> {
        let source = source.to_owned();
        let (tag, cursor) = (tag.map(str::to_owned), cursor.map(str::to_owned));
        self.backend
            .read(move |io| {
                Box::pin(
                    async move { reads::aggregates_page(io, &source, tag, limit, cursor).await },
                )
            })
            .await
    }

    async fn event(&self, source: &str, event_id: &str) -> Result<Option<EventRecord>, StoreError> {
        let (source, event_id) = (source.to_owned(), event_id.to_owned());
        self.backend
            .read(move |io| Box::pin(async move { reads::event(io, &source, &event_id).await }))
            .await
    }

    async fn events(
        &self,
        filter: &EventFilter,
        limit: usize,
        cursor: Option<i64>,
    ) -> Result<EventPage, StoreError> {
        let filter = filter.clone();
        self.backend
            .read(move |io| {
                Box::pin(async move { reads::events(io, &filter, limit, cursor).await })
            })
            .await
    }

    async fn status_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
        self.backend
            .read_aside(|io| Box::pin(reads::status_counts(io)))
            .await
    }

    async fn undecided_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
        self.backend
            .read(|io| Box::pin(reads::undecided_counts(io)))
            .await
    }

    async fn last_change_id(&self) -> Result<i64, StoreError> {
        self.backend
            .read(|io| Box::pin(reads::last_change_id(io)))
            .await
    }

    async fn changes_after(
        &self,
        after: i64,
        source: Option<&str>,
        aggregate: Option<&str>,
        limit: usize,
    ) -> Result<Vec<StateChange>, StoreError> {
        let (source, aggregate) = (source.map(str::to_owned), aggregate.map(str::to_owned));
        self.backend
            .read(move |io| Box::pin(reads::changes_after(io, after, source, aggregate, limit)))
            .await
    }

    async fn replay_job(&self, id: i64) -> Result<Option<ReplayJob>, StoreError> {
        self.backend
            .read(move |io| Box::pin(reads::replay_job(io, id)))
            .await
    }

    async fn delivery(
        &self,
        destination: &str,
        id: i64,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let destination = destination.to_owned();
        self.backend
            .read(move |io| {
                Box::pin(async move { forwarding::delivery(io, &destination, id).await })
            })
            .await
    }

    async fn deliveries(
        &self,
        destination: &str,
        filter: &DeliveryFilter,
        limit: usize,
        cursor: Option<i64>,
    ) -> Result<DeliveryPage, StoreError> {
        let (destination, filter) = (destination.to_owned(), filter.clone());
        self.backend
            .read(move |io| {
                Box::pin(async move {
                    forwarding::deliveries(io, &destination, &filter, limit, cursor).await
                })
            })
            .await
    }

    async fn delivery_replay_job(&self, id: i64) -> Result<Option<DeliveryReplayJob>, StoreError> {
        self.backend
            .read(move |io| Box::pin(forwarding::replay_job(io, id)))
            .await
    }

    async fn destination_stats(&self, destination: &str) -> Result<DestinationStats, StoreError> {
        let destination = destination.to_owned();
        self.backend
            .read_aside(move |io| {
                Box::pin(async move {
                    io.fold_delivery_counts().await?;
                    forwarding::stats(io, &destination).await
                })
            })
            .await
    }

    async fn change_ids_after(&self, after: i64, limit: usize) -> Result<Vec<i64>, StoreError> {
        self.backend
            .read(move |io| Box::pin(reads::change_ids_after(io, after, limit)))
            .await
    }
}

#[async_trait]
impl<B: Backend> Repairs for SqlStore<B> {
    async fn replay_event(
        &self,
        source: &str,
        event_id: &str,
        now_ms: i64,
    ) -> Result<ReplayOutcome, StoreError> {
        let (source, event_id) = (source.to_owned(), event_id.to_owned());
        self.write(move |io| {
            Box::pin(async move { upkeep::replay_event(io, &source, &event_id, now_ms).await })
        })
        .await
    }

    async fn create_replay_job(
        &self,
        filter: &EventFilter,
        now_ms: i64,
    ) -> Result<ReplayJob, StoreError> {
        let filter = filter.clone();
        self.write(move |io| {
            Box::pin(async move { upkeep::create_replay_job(io, &filter, now_ms).await })
        })
        .await
    }

    async fn advance_replay_jobs(&self, now_ms: i64, aggregates: usize) -> Result<u64, StoreError> {
        self.write(move |io| {
            Box::pin(bulk::advance::<upkeep::EventReplayJob, _>(
                io, now_ms, aggregates,
            ))
        })
        .await
    }

    async fn replay_delivery(
        &self,
        destination: &str,
        id: i64,
    ) -> Result<DeliveryReplay, StoreError> {
        let destination = destination.to_owned();
        self.write(move |io| {
            Box::pin(async move { forwarding::replay(io, &destination, id).await })
        })
        .await
    }

    async fn skip_delivery(&self, destination: &str, id: i64) -> Result<DeliverySkip, StoreError> {
        let destination = destination.to_owned();
        self.write(move |io| Box::pin(async move { forwarding::skip(io, &destination, id).await }))
            .await
    }

    async fn create_delivery_replay_job(
        &self,
        destination: &str,
        filter: &DeliveryFilter,
        now_ms: i64,
    ) -> Result<DeliveryReplayJob, StoreError> {
        let (destination, filter) = (destination.to_owned(), filter.clone());
        self.write(move |io| {
            Box::pin(async move {
                forwarding::create_replay_job(io, &destination, &filter, now_ms).await
            })
        })
        .await
    }

    async fn advance_delivery_replay_jobs(
        &self,
        now_ms: i64,
        queues: usize,
    ) -> Result<u64, StoreError> {
        self.write(move |io| Box::pin(bulk::advance::<DeliveryReplayJob, _>(io, now_ms, queues)))
            .await
    }

    async fn reset_aggregate(
        &self,
        source: &str,
        aggregate: &str,
    ) -> Result<ResetReport, StoreError> {
        let (source, aggregate) = (source.to_owned(), aggregate.to_owned());
        self.write(move |io| Box::pin(async move { reset::reset(io, &source, &aggregate).await }))
            .await
    }
}

#[async_trait]
impl<B: Backend> Keys for SqlStore<B> {
    async fn unlock(&self) -> Result<(), StoreError> {
        // Without keys it only reads (which master keys the store needs); with keys it
        // may write the body-hash key.
        if !self.backend.vault().encrypting() {
            return self
                .backend
                .read(|io| Box::pin(async move { io.vault().unlock(io).await }))
                .await;
        }
        self.write(|io| Box::pin(async move { io.vault().unlock(io).await }))
            .await
    }

    fn encrypting(&self) -> bool {
        self.backend.vault().encrypting()
    }

    async fn forget(
        &self,
        source: &str,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<ForgetReport, StoreError> {
        let (source, aggregate) = (source.to_owned(), aggregate.to_owned());
        let (s, a) = (source.clone(), aggregate.clone());
        let mut report = self
            .write(move |io| Box::pin(async move { erasure::forget(io, &s, &a, now_ms).await }))
            .await?;
        self.backend.vault().forget_cached(&source, &aggregate);
        // What the erasure overwrote leaves the files now (SQLite: the write-ahead log's
        // older page images; PostgreSQL: the key's dead row version), not at some later
        // checkpoint or vacuum; the erasure is committed whatever comes of it.
        let scrub = Scrub::Erasure {
            data_key_destroyed: report.data_key_destroyed,
        };
        if let Err(err) = self.backend.scrub(scrub).await {
            tracing::warn!(
                error = %err,
                "the database's files were not scrubbed after an erasure: the erased \
                 aggregate's old copies may stay in them until the next erasure or rekey"
            );
            report.unscrubbed = Some(err.to_string());
        }
        Ok(report)
    }

    async fn rekey_step(&self, after: i64, batch: usize) -> Result<KeyStep, StoreError> {
        self.write(move |io| Box::pin(async move { erasure::rekey_step(io, after, batch).await }))
            .await
    }

    async fn rekey_left(&self) -> Result<u64, StoreError> {
        self.backend
            .read(|io| Box::pin(async move { erasure::rekey_left(io).await }))
            .await
    }

    async fn encrypt_step(&self, after: i64, batch: usize) -> Result<KeyStep, StoreError> {
        self.write(move |io| Box::pin(async move { erasure::encrypt_step(io, after, batch).await }))
            .await
    }

    async fn plaintext_left(&self) -> Result<u64, StoreError> {
        self.backend
            .read(|io| Box::pin(async move { erasure::plaintext_left(io).await }))
            .await
    }

    async fn compact(&self) -> Result<(), StoreError> {
        self.backend.compact().await
    }

    async fn scrub(&self, after: Scrub) -> Result<(), StoreError> {
        self.backend.scrub(after).await
    }
}

#[async_trait]
impl<B: Backend> Upkeep for SqlStore<B> {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.backend.migrate().await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.backend
            .read_aside(|io| Box::pin(async move { reads::ping(io).await }))
            .await
    }

    async fn purge(
        &self,
        before_ms: i64,
        dedup_until_ms: i64,
        now_ms: i64,
        batch: usize,
    ) -> Result<PurgeReport, StoreError> {
        self.write(move |io| {
            Box::pin(async move {
                let report = upkeep::purge(io, before_ms, dedup_until_ms, now_ms, batch).await?;
                // The retention task runs on every node whether anyone reads the counts or
                // not: it keeps the deltas few.
                io.fold_event_counts().await?;
                Ok(report)
            })
        })
        .await
    }

    async fn purge_stats(&self, before_ms: i64) -> Result<u64, StoreError> {
        self.write(move |io| Box::pin(async move { super::stats::purge(io, before_ms).await }))
            .await
    }

    async fn upgrade_step_pending(&self, step: &str) -> Result<bool, StoreError> {
        let step = step.to_owned();
        self.backend
            .read(move |io| Box::pin(async move { upkeep::upgrade_step_pending(io, &step).await }))
            .await
    }

    async fn finish_upgrade_step(&self, step: &str) -> Result<(), StoreError> {
        let step = step.to_owned();
        self.write(move |io| Box::pin(async move { upkeep::finish_upgrade_step(io, &step).await }))
            .await
    }

    async fn prune_headers(
        &self,
        after: i64,
        batch: usize,
        keep: Arc<HeaderFilter>,
    ) -> Result<(Option<i64>, u64), StoreError> {
        self.write(move |io| {
            Box::pin(async move { upkeep::prune_headers(io, after, batch, &*keep).await })
        })
        .await
    }
}

#[async_trait]
impl<B: Backend> Figures for SqlStore<B> {
    async fn add_stats(&self, rows: Vec<super::stats::StatRow>) -> Result<(), StoreError> {
        // Relaxed: a power cut may lose the last minute's figures, never an event.
        self.backend
            .write(Commit::Relaxed, move |io| {
                Box::pin(async move { super::stats::add(io, &rows).await })
            })
            .await
    }

    async fn stats_series(
        &self,
        scope: super::stats::StatScope,
        name: &str,
        window: (i64, i64, i64),
    ) -> Result<Vec<super::stats::StatCell>, StoreError> {
        let name = name.to_owned();
        self.backend
            .read_aside(move |io| {
                Box::pin(async move { super::stats::series(io, scope, &name, window).await })
            })
            .await
    }

    async fn source_stats(
        &self,
        names: Vec<String>,
        since_ms: i64,
    ) -> Result<super::stats::SourceStats, StoreError> {
        self.backend
            .read_aside(move |io| {
                Box::pin(async move { super::stats::source_stats(io, &names, since_ms).await })
            })
            .await
    }
}

#[async_trait]
impl<B: Backend> AlertLog for SqlStore<B> {
    async fn record_alert(&self, alert: &super::alerts::AlertRecord) -> Result<i64, StoreError> {
        let alert = alert.clone();
        self.write(move |io| Box::pin(async move { super::alerts::insert(io, &alert).await }))
            .await
    }

    async fn keep_alert(
        &self,
        alert: super::alerts::AlertRecord,
        transition: super::alerts::Transition,
        channels: Vec<String>,
    ) -> Result<Option<super::alerts::AlertRecord>, StoreError> {
        self.write(move |io| {
            Box::pin(async move { super::alerts::keep(io, alert, &transition, &channels).await })
        })
        .await
    }

    async fn alerts_firing(&self) -> Result<Vec<super::alerts::Firing>, StoreError> {
        self.backend
            .read(|io| Box::pin(super::alerts::firing(io)))
            .await
    }

    async fn claim_alert_notice(
        &self,
        channel: &str,
        node: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<super::alerts::Claim, StoreError> {
        let (channel, node) = (channel.to_owned(), node.to_owned());
        // A look first: an idle channel, or one waiting, takes no write transaction.
        let head = {
            let (channel, node) = (channel.clone(), node.clone());
            self.backend
                .read(move |io| {
                    Box::pin(async move { super::alerts::head(io, &channel, &node, now_ms).await })
                })
                .await?
        };
        if let super::alerts::Head::Not(claim) = head {
            return Ok(claim);
        }
        // Relaxed: a lease lost to a power cut only lets another attempt go sooner.
        self.backend
            .write(Commit::Relaxed, move |io| {
                Box::pin(async move {
                    super::alerts::claim(io, &channel, &node, now_ms, lease_ms).await
                })
            })
            .await
    }

    async fn alert_notice_attempted(
        &self,
        outbox_id: i64,
        node: &str,
        attempts: i64,
        outcome: super::alerts::Attempted,
        now_ms: i64,
    ) -> Result<bool, StoreError> {
        let node = node.to_owned();
        self.write(move |io| {
            Box::pin(async move {
                super::alerts::attempted(io, outbox_id, &node, attempts, &outcome, now_ms).await
            })
        })
        .await
    }

    async fn alerts(
        &self,
        before: Option<i64>,
        limit: usize,
    ) -> Result<Vec<super::alerts::AlertRecord>, StoreError> {
        self.backend
            .read_aside(move |io| Box::pin(super::alerts::page(io, before, limit)))
            .await
    }

    async fn source_marks(&self, source: &str) -> Result<super::alerts::SourceMarks, StoreError> {
        let source = source.to_owned();
        self.backend
            .read_aside(move |io| {
                Box::pin(async move { super::alerts::source_marks(io, &source).await })
            })
            .await
    }
}
