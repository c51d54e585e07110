//! The PostgreSQL store, for production and for several inhook nodes on one
//! database. Correctness holds across nodes because the database does the
//! work: unique keys deduplicate, a transaction-scoped advisory lock per
//! aggregate serializes settling (and is released if the node dies, when its
//! connection closes), and `LISTEN/NOTIFY` wakes every node's workers.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use tokio::sync::Notify;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use tokio_postgres_rustls::MakeRustlsConnect;

use super::backend::Param;
use super::backend::{Backend, Cell, Commit, FlowFuture, Scrub, Tx};
use super::backend::{ChangeRow, StateRow};
use super::batch::BatchQueue;
use super::engine::SqlStore;
use super::ingest::{self, Guard};
use super::migrations::{self, POSTGRES as MIGRATIONS};
use super::postgres_stats::StatsTender;
use super::settle;
use super::sql;
use super::vault::Vault;
use super::Failure;
use super::{status_of, Admission, EventRow, Refusal, SettleAt, SourceRules, StoreError};
use crate::domain::ordering::Outcome;
use crate::domain::{DeadReason, EventStatus};

/// The channel async ingests notify and workers listen on.
const CHANNEL: &str = "inhook_events";
/// The channel commits that write delivery rows notify and senders listen on (docs/contract.md,
/// forwarding).
const DELIVERIES_CHANNEL: &str = "inhook_deliveries";
/// Advisory lock key held while migrating, so that nodes starting together migrate once.
const MIGRATION_LOCK: i64 = 0x696e_686f_6f6b;
/// Advisory lock key held while folding count deltas, so that one transaction folds at a time.
const FOLD_LOCK: i64 = 0x696e_686f_6f6c;

/// The advisory lock of the node folding delivery count deltas.
const FOLD_DELIVERIES_LOCK: i64 = 0x696e_686f_6f64;

/// Statements through the connection's statement cache: each SQL text is parsed and
/// planned once per connection, and every later run is one round trip instead of two.
/// Object-safe, unlike `GenericClient`, so that one [`PgIo`] runs the flows over a
/// transaction and over a bare connection alike.
#[async_trait]
trait CachedStatements: Sync {
    /// `query` with a cached statement.
    async fn cached_query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error>;

    /// `query_one` with a cached statement.
    async fn cached_query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error>;

    /// `execute` with a cached statement.
    async fn cached_execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error>;
}

#[async_trait]
impl<C: GenericClient> CachedStatements for C {
    async fn cached_query(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        GenericClient::query(self, &statement, params).await
    }

    async fn cached_query_one(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        GenericClient::query_one(self, &statement, params).await
    }

    async fn cached_execute(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let statement = self.prepare_cached(sql).await?;
        GenericClient::execute(self, &statement, params).await
    }
}

/// Sizing and timeouts of the connection pool.
#[derive(Debug, Clone, Copy)]
pub struct PoolSettings {
    /// Most connections one node opens.
    pub max_size: usize,
    /// How long a request waits for a connection or a lock before answering 503.
    pub timeout: Duration,
}

/// The PostgreSQL store: the one store over [`Postgres`].
pub type PostgresStore = SqlStore<Postgres>;

/// The PostgreSQL database. Async deliveries are group-committed: concurrent ingests
/// share one transaction (their statements pipelined on one connection) and one WAL
/// flush, each answered only after the commit.
#[derive(Clone)]
pub struct Postgres {
    pool: Pool,
    pg_config: tokio_postgres::Config,
    tls: MakeRustlsConnect,
    group_commit: bool,
    queue: Arc<BatchQueue<PgJob>>,
    writers: Arc<tokio::sync::Semaphore>,
    /// The store's keys (docs/encryption.md).
    vault: Arc<Vault>,
    /// Keeps the planner's statistics up with the tables' growth (`postgres_stats`).
    stats: Arc<StatsTender>,
}

/// Most deliveries committed in one transaction.
const MAX_BATCH: usize = 256;
/// Batches committed at once on one node: one fills while another flushes.
const BATCH_WRITERS: usize = 2;

/// An async delivery waiting for a batch.
struct PgJob {
    row: EventRow,
    /// The source's rules, when the delivery is settled at ingest if ready ([`SettleAt::IfReady`]).
    rules: Option<SourceRules>,
    reply: tokio::sync::oneshot::Sender<Result<Admission, StoreError>>,
}

/// What became of a delivery the batch insert did not insert: a duplicate, of a logged
/// event (maybe earlier in the same batch) or of a purged one.
async fn not_inserted(
    tx: &dyn CachedStatements,
    vault: &Vault,
    job: &PgJob,
) -> Result<Admission, StoreError> {
    let io = PgIo::of(tx, vault);
    // Kept out by its guard, not by a unique key: sealed under an erased data key.
    super::vault::check_key(&io, &job.row).await?;
    super::vault::drop_unused_key(&io, &job.row).await?;
    if let Some(admission) = ingest::purged_duplicate(&io, &job.row).await? {
        return Ok(admission);
    }
    ingest::find_duplicate(&io, &job.row).await
}

/// Logs `jobs` in one transaction with one multi-row insert; with `decide`, settles there
/// the aggregates ready at ingest; wakes the workers when anything is left to them.
async fn log_batch(
    pool: &Pool,
    vault: &Vault,
    jobs: &[PgJob],
    decide: bool,
) -> Result<Vec<Admission>, StoreError> {
    let mut client = pool.get().await.map_err(no_connection)?;
    let tx = client.transaction().await.map_err(pg_err)?;
    let rows: Vec<&EventRow> = jobs.iter().map(|j| &j.row).collect();
    // The limits are decided here, in the writing transaction: first the batch's aggregates,
    // then, after the insert, its sources' counter rows (`lock_backlogs`), so that no
    // concurrent delivery or batch can overshoot either limit.
    lock_aggregates(
        &tx,
        rows.iter()
            .map(|r| (r.source.as_str(), r.aggregate.as_str())),
    )
    .await?;
    let mut highest = highest_received(&tx, &rows).await?;
    let mut waiting = waiting_ahead(&tx, &rows).await?;
    // Settled before the insert, so that a row ready at ingest is written once, decided.
    let ready = if decide {
        plan_ready(&tx, vault, jobs).await?
    } else {
        Vec::new()
    };
    let mut statuses = vec![EventStatus::Received.as_str(); jobs.len()];
    for group in &ready {
        for (nth, at) in group.members.iter().enumerate() {
            statuses[*at] = status_of(group.plan.outcome(nth)?).0.as_str();
        }
    }
    let decided_at: Vec<Option<i64>> = rows
        .iter()
        .zip(&statuses)
        .map(|(r, status)| (*status != EventStatus::Received.as_str()).then_some(r.received_at))
        .collect();
    let attempts: Vec<i64> = decided_at.iter().map(|d| i64::from(d.is_some())).collect();
    let text = |f: fn(&EventRow) -> &str| rows.iter().map(|r| f(r)).collect::<Vec<_>>();
    let sources = text(|r| &r.source);
    let event_ids = text(|r| &r.event_id);
    let event_types = text(|r| &r.event_type);
    let aggregates = text(|r| &r.aggregate);
    let sequences: Vec<i64> = rows.iter().map(|r| r.sequence).collect();
    let keys: Vec<Option<&str>> = rows.iter().map(|r| r.idempotency_key.as_deref()).collect();
    let bodies: Vec<&[u8]> = rows.iter().map(|r| r.stored_body()).collect();
    let signed_at: Vec<Option<i64>> = rows.iter().map(|r| r.signed_at).collect();
    let received_at: Vec<i64> = rows.iter().map(|r| r.received_at).collect();
    let headers: Vec<Option<&str>> = rows.iter().map(|r| r.stored_headers()).collect();
    let data_keys: Vec<Option<i64>> = rows.iter().map(|r| r.data_key()).collect();
    let unordered: Vec<Option<&str>> = rows.iter().map(|r| r.unordered.as_deref()).collect();
    write_new_keys(&tx, &rows).await?;
    let body_sha256: Vec<Option<&str>> = rows.iter().map(|r| r.body_sha256.as_deref()).collect();
    // In batch order, so that of two deliveries with one key the first is the one logged;
    // a key of a purged event (dedup_keys) is left to `not_inserted`. Two batches insert at
    // once: one that waits for the other's uncommitted key while the other waits for one of
    // its own (two keys sent twice, in opposite orders) is a deadlock PostgreSQL breaks,
    // and the batch it fails is logged again one delivery at a time (`commit_batch`).
    let inserted = tx
        .cached_query(
            "INSERT INTO events (source, event_id, event_type, aggregate, sequence,
                 idempotency_key, body, signature_valid, signed_at, received_at, status, headers,
                 decided_at, attempts, body_sha256, data_key, unordered)
             SELECT b.source, b.event_id, b.event_type, b.aggregate, b.sequence,
                    b.idempotency_key, b.body, TRUE, b.signed_at, b.received_at, b.status, b.headers,
                    b.decided_at, b.attempts, b.body_sha256, b.data_key, b.unordered
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::int8[], $6::text[],
                         $7::bytea[], $8::int8[], $9::int8[], $10::text[], $11::text[],
                         $12::int8[], $13::int8[], $14::text[], $15::int8[], $16::text[])
                  WITH ORDINALITY
                  AS b(source, event_id, event_type, aggregate, sequence, idempotency_key, body,
                       signed_at, received_at, headers, status, decided_at, attempts, body_sha256,
                       data_key, unordered, ord)
             -- A row sealed under a data key erased since it was cached is kept out
             -- (docs/encryption.md): `not_inserted` tells it from a duplicate.
             WHERE (b.data_key IS NULL
                    OR EXISTS (SELECT 1 FROM data_keys k WHERE k.id = b.data_key))
               AND NOT EXISTS (
                 SELECT 1 FROM dedup_keys d
                 WHERE d.source = b.source AND d.expires_at > b.received_at
                   AND ((d.kind = 'event_id' AND d.key = b.event_id)
                     OR (d.kind = 'idempotency_key' AND d.key = b.idempotency_key)
                     OR (d.kind = 'body' AND d.key = b.body_sha256)))
             ORDER BY b.ord
             ON CONFLICT DO NOTHING
             RETURNING id, source, event_id",
            &[
                &sources,
                &event_ids,
                &event_types,
                &aggregates,
                &sequences,
                &keys,
                &bodies,
                &signed_at,
                &received_at,
                &headers,
                &statuses,
                &decided_at,
                &attempts,
                &body_sha256,
                &data_keys,
                &unordered,
            ],
        )
        .await
        .map_err(deadlock_fails_the_batch)?;
    let mut rows = std::collections::HashMap::with_capacity(inserted.len());
    for row in &inserted {
        rows.insert(
            (col::<String>(row, 1)?, col::<String>(row, 2)?),
            col::<i64>(row, 0)?,
        );
    }
    let (ready, undone) = logged_whole(jobs, ready, &rows);
    if !undone.is_empty() {
        // A plan one of whose events turned out a duplicate decided too much: its rows
        // are left to the worker, as if never planned.
        tx.cached_execute(
            "UPDATE events SET status = 'received', decided_at = NULL, attempts = 0
             WHERE id = ANY($1)",
            &[&undone],
        )
        .await
        .map_err(pg_err)?;
    }
    let mut decided_here = vec![false; jobs.len()];
    for group in &ready {
        group.members.iter().for_each(|at| decided_here[*at] = true);
    }
    // The backlog as it stands with this batch's undecided rows counted, less them: the
    // loop below admits them one by one against the limit.
    let mut source_names: Vec<&str> = rows.keys().map(|(source, _)| source.as_str()).collect();
    source_names.sort_unstable();
    source_names.dedup();
    let mut backlog = lock_backlogs(&tx, &source_names).await?;
    let mut counted = std::collections::HashSet::new();
    for (at, job) in jobs.iter().enumerate() {
        let key = (job.row.source.as_str(), job.row.event_id.as_str());
        // Of two deliveries with one event_id, the first got the row (and is counted).
        if counted.insert(key)
            && !decided_here[at]
            && rows.contains_key(&(key.0.to_owned(), key.1.to_owned()))
        {
            *backlog.entry(job.row.source.clone()).or_insert(0) -= 1;
        }
    }
    let mut admissions = Vec::with_capacity(jobs.len());
    let mut refused = Vec::new();
    let mut accepted = Vec::new();
    let mut logged_ids = vec![0; jobs.len()];
    for (at, job) in jobs.iter().enumerate() {
        // `remove`: of two deliveries with one event_id, only the first gets the row.
        let Some(row) = rows.remove(&(job.row.source.clone(), job.row.event_id.clone())) else {
            admissions.push(not_inserted(&tx, vault, job).await?);
            continue;
        };
        logged_ids[at] = row;
        let r = &job.row;
        let id = (r.source.clone(), r.aggregate.clone());
        // A row logged decided is no backlog item: no limit refuses it.
        if !decided_here[at] {
            let ahead = waiting
                .get_mut(&id)
                .filter(|(last, _)| r.sequence > *last + 1);
            if let Some((_, count)) = &ahead {
                if *count as u64 >= r.limits.max_held_per_aggregate {
                    refused.push(row);
                    admissions.push(Admission::Refused(Refusal::AggregateBacklogFull));
                    continue;
                }
            }
            let undecided = backlog.entry(r.source.clone()).or_insert(0);
            if *undecided as u64 >= r.limits.max_backlog {
                refused.push(row);
                admissions.push(Admission::Refused(Refusal::BacklogFull));
                continue;
            }
            *undecided += 1;
            if let Some((_, count)) = ahead {
                *count += 1;
            }
        }
        // An unordered event has no sequence to compare (docs/contract.md).
        let out_of_order = r.unordered.is_none() && {
            let seen = highest.entry(id).or_insert(r.sequence);
            let below = r.sequence < *seen;
            *seen = (*seen).max(r.sequence);
            below
        };
        accepted.push(r);
        admissions.push(Admission::Logged {
            row,
            decided: None,
            out_of_order,
        });
    }
    if !refused.is_empty() {
        tx.cached_execute("DELETE FROM events WHERE id = ANY($1)", &[&refused])
            .await
            .map_err(pg_err)?;
    }
    raise_highest_received(&tx, &accepted).await?;
    write_search_rows(&tx, jobs, &logged_ids, &refused).await?;
    let decided = write_ready(&tx, vault, ready, &logged_ids, &mut admissions).await?;
    // A decided event needs no worker; its deliveries notify the senders themselves.
    if decided < accepted.len() {
        notify(&tx, CHANNEL).await?;
    }
    tx.commit().await.map_err(pg_err)?;
    Ok(admissions)
}

/// Writes the search index rows of the batch's logged events (docs/api.md, search) in one
/// multi-row insert; `logged_ids[at]` is job `at`'s row (0: not logged), `refused` the rows
/// deleted again.
async fn write_search_rows(
    tx: &dyn CachedStatements,
    jobs: &[PgJob],
    logged_ids: &[i64],
    refused: &[i64],
) -> Result<(), StoreError> {
    let (mut fields, mut values, mut sources, mut rows) = (vec![], vec![], vec![], vec![]);
    for (job, &row) in jobs.iter().zip(logged_ids) {
        if row == 0 || refused.contains(&row) {
            continue;
        }
        for (field, key) in &job.row.search {
            fields.push(field.as_str());
            values.push(key.as_str());
            sources.push(job.row.source.as_str());
            rows.push(row);
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    tx.cached_execute(
        "INSERT INTO event_search (field, value, source, event_row)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[])
         ON CONFLICT DO NOTHING",
        &[&fields, &values, &sources, &rows],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Writes the data keys made for aggregates that had none, before the rows they seal.
async fn write_new_keys(tx: &dyn CachedStatements, rows: &[&EventRow]) -> Result<(), StoreError> {
    for row in rows {
        if let Some(new) = row.sealed.as_ref().and_then(|s| s.new_key.as_ref()) {
            let params = new.params(&row.source, &row.aggregate);
            tx.cached_execute(super::vault::ADD_DATA_KEY, &refs(&params))
                .await
                .map_err(pg_err)?;
        }
    }
    Ok(())
}

/// One aggregate's deliveries of a batch, settled together before they are logged.
struct ReadyGroup<'a> {
    rules: &'a SourceRules,
    /// Their places in the batch, in the order they were planned in.
    members: Vec<usize>,
    plan: settle::UnloggedPlan,
}

/// Plans, in the batch's transaction (which holds their aggregates' locks), the
/// aggregates of `jobs` ready at ingest: each aggregate once, over all its deliveries
/// of the batch; different aggregates concurrently, their statements pipelined.
async fn plan_ready<'a>(
    tx: &dyn CachedStatements,
    vault: &Vault,
    jobs: &'a [PgJob],
) -> Result<Vec<ReadyGroup<'a>>, StoreError> {
    let mut groups: Vec<(&SourceRules, &str, Vec<usize>)> = Vec::new();
    let mut group_of: HashMap<(&str, &str), usize> = HashMap::new();
    for (at, job) in jobs.iter().enumerate() {
        let Some(rules) = job.rules.as_ref() else {
            continue;
        };
        let key = (job.row.source.as_str(), job.row.aggregate.as_str());
        let group = *group_of.entry(key).or_insert_with(|| {
            groups.push((rules, &job.row.aggregate, Vec::new()));
            groups.len() - 1
        });
        groups[group].2.push(at);
    }
    let plans = groups.iter().map(|(rules, aggregate, members)| async move {
        let rows: Vec<&EventRow> = members.iter().map(|at| &jobs[*at].row).collect();
        settle::plan_unlogged(&PgIo::of(tx, vault), rules, aggregate, &rows).await
    });
    let plans = futures_util::future::join_all(plans).await;
    let mut ready = Vec::new();
    for ((rules, _, members), plan) in groups.into_iter().zip(plans) {
        if let Some(plan) = plan? {
            ready.push(ReadyGroup {
                rules,
                members,
                plan,
            });
        }
    }
    Ok(ready)
}

/// The groups of `ready` whose every delivery got its own row (`logged`, by source and
/// event id), and the rows of the others, logged decided by a plan that no longer holds.
fn logged_whole<'a>(
    jobs: &[PgJob],
    ready: Vec<ReadyGroup<'a>>,
    logged: &HashMap<(String, String), i64>,
) -> (Vec<ReadyGroup<'a>>, Vec<i64>) {
    // Of two deliveries with one event_id, the first got the row.
    let mut first: HashMap<(&str, &str), usize> = HashMap::new();
    for (at, job) in jobs.iter().enumerate() {
        first
            .entry((job.row.source.as_str(), job.row.event_id.as_str()))
            .or_insert(at);
    }
    let row_of = |at: usize| {
        let r = &jobs[at].row;
        let key = (r.source.as_str(), r.event_id.as_str());
        (first.get(&key) == Some(&at))
            .then(|| logged.get(&(r.source.clone(), r.event_id.clone())).copied())
            .flatten()
    };
    let (whole, broken): (Vec<_>, Vec<_>) = ready
        .into_iter()
        .partition(|group| group.members.iter().all(|at| row_of(*at).is_some()));
    let undone = broken
        .iter()
        .flat_map(|group| group.members.iter().filter_map(|at| row_of(*at)))
        .collect();
    (whole, undone)
}

/// Writes the plans of `ready`, whose rows were logged decided as `logged_ids` (by place
/// in the batch), concurrently; fills in `admissions`' outcomes; returns how many.
async fn write_ready(
    tx: &dyn CachedStatements,
    vault: &Vault,
    ready: Vec<ReadyGroup<'_>>,
    logged_ids: &[i64],
    admissions: &mut [Admission],
) -> Result<usize, StoreError> {
    let io = PgIo::of(tx, vault);
    let writes = ready.into_iter().map(|group| {
        let io = &io;
        async move {
            let ids: Vec<i64> = group.members.iter().map(|at| logged_ids[*at]).collect();
            let now_ms = group.plan.now_ms();
            let each = group
                .plan
                .write_logged_deferred(io, group.rules, &ids)
                .await;
            (group.members, now_ms, each)
        }
    });
    let mut count = 0;
    // The groups' state, change and event rows in one statement per table; the plans of
    // one batch decided at different receipts, so the events' rows by time.
    let mut all: Vec<(i64, settle::Writes)> = Vec::new();
    for (members, now_ms, each) in futures_util::future::join_all(writes).await {
        let (each, writes) = each?;
        match all.iter_mut().find(|(at, _)| *at == now_ms) {
            Some((_, same)) => same.append(writes),
            None => all.push((now_ms, writes)),
        }
        for (at, outcome) in members.into_iter().zip(each) {
            if let Admission::Logged { decided, .. } = &mut admissions[at] {
                *decided = Some(outcome);
                count += 1;
            }
        }
    }
    for (now_ms, writes) in all {
        writes.apply(&io, now_ms).await?;
    }
    Ok(count)
}

/// Commits a batch and answers each delivery. If a statement fails, the transaction is
/// gone for all, so each delivery is retried in a transaction of its own: one bad
/// delivery never fails the others.
async fn commit_batch(pool: &Pool, vault: &Vault, batch: Vec<PgJob>) {
    match log_batch(pool, vault, &batch, true).await {
        Ok(admissions) => {
            for (job, admission) in batch.into_iter().zip(admissions) {
                let _ = job.reply.send(Ok(admission));
            }
        }
        Err(StoreError::Unavailable(detail)) => {
            for job in batch {
                let _ = job.reply.send(Err(StoreError::Unavailable(detail.clone())));
            }
        }
        // Alone and only logged: a settle at ingest that fails must not fail the delivery.
        Err(_) => {
            for job in batch {
                let result = log_batch(pool, vault, std::slice::from_ref(&job), false).await;
                let _ = job.reply.send(result.map(|mut one| one.remove(0)));
            }
        }
    }
}

impl PostgresStore {
    /// Builds the pool for `url` (`postgres://user@host:port/db`, with libpq's `sslmode`
    /// and `sslrootcert`); connects lazily.
    pub fn connect(url: &str, settings: PoolSettings) -> Result<Self, StoreError> {
        // Words only: the error reaches the operator through anyhow's `{:#}`, which would
        // print a cause held beside words that already describe it twice.
        let (mut pg_config, tls) = super::postgres_tls::configure(url)
            .map_err(|e| StoreError::Internal(super::postgres_tls::describe(&e).into()))?;
        let timeout_ms = settings.timeout.as_millis();
        // A lock held elsewhere (a migration, an operator) becomes a quick 503, not a hung request.
        pg_config.options(format!("-c lock_timeout={timeout_ms}"));
        pg_config.connect_timeout(settings.timeout);
        pg_config.application_name("inhook");
        let manager = Manager::from_config(
            pg_config.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.max_size.max(2))
            .wait_timeout(Some(settings.timeout))
            .create_timeout(Some(settings.timeout))
            .recycle_timeout(Some(settings.timeout))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| {
                StoreError::Internal(Failure::caused(format!("building the pool: {e}"), e))
            })?;
        Ok(SqlStore::over(Postgres {
            pool,
            pg_config,
            tls,
            group_commit: true,
            queue: Arc::default(),
            writers: Arc::new(tokio::sync::Semaphore::new(BATCH_WRITERS)),
            vault: Arc::default(),
            stats: Arc::default(),
        }))
    }

    /// Logs every delivery in a transaction of its own, as a naive receiver would:
    /// the baseline that benchmarks compare group commit against.
    pub fn without_group_commit(mut self) -> Self {
        self.backend.group_commit = false;
        self
    }
}

impl Postgres {
    /// Queues an async delivery for the next batch and waits for its commit.
    async fn ingest_batched(
        &self,
        row: EventRow,
        rules: Option<&SourceRules>,
    ) -> Result<Admission, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = PgJob {
            row,
            rules: rules.cloned(),
            reply,
        };
        if self.queue.push(job) {
            self.start_committer();
        }
        answer
            .await
            .map_err(|_| StoreError::Internal("the writer dropped a delivery".into()))?
    }

    /// Starts a task that waits for a writer and commits every delivery queued by then
    /// (flat combining: batches form only under load, so a lone request waits for nothing).
    /// A task of its own, so that a caller that goes away never abandons a batch; started
    /// only when none is waiting ([`BatchQueue`]), so a second batch fills while one flushes.
    fn start_committer(&self) {
        self.stats.tend(&self.pool);
        let this = self.clone();
        tokio::spawn(async move {
            let Ok(_writer) = this.writers.acquire().await else {
                return;
            };
            let (batch, more) = this.queue.take(MAX_BATCH);
            if more {
                this.start_committer();
            }
            if !batch.is_empty() {
                commit_batch(&this.pool, &this.vault, batch).await;
            }
        });
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        self.stats.tend(&self.pool);
        self.pool.get().await.map_err(no_connection)
    }

    /// Keeps a connection listening on `channel` and wakes `wake` on each
    /// notification, reconnecting with backoff when PostgreSQL goes away.
    fn listen(&self, channel: &'static str, wake: Arc<Notify>) {
        let (config, tls) = (self.pg_config.clone(), self.tls.clone());
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(200);
            loop {
                match listen_once(&config, tls.clone(), channel, &wake).await {
                    Ok(()) => backoff = Duration::from_millis(200),
                    Err(err) => {
                        tracing::debug!(error = %err, "LISTEN connection lost; reconnecting")
                    }
                }
                // A missed notification is covered by the workers' polling; wake them anyway.
                wake.notify_one();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        });
    }
}

async fn listen_once(
    config: &tokio_postgres::Config,
    tls: MakeRustlsConnect,
    channel: &str,
    wake: &Arc<Notify>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tls).await?;
    let notified = Arc::clone(wake);
    // The connection task delivers notifications; it ends when the connection does.
    let driver = tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = futures_util::StreamExt::next(&mut messages).await {
            match message {
                Ok(tokio_postgres::AsyncMessage::Notification(_)) => notified.notify_one(),
                Ok(_) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    });
    client.batch_execute(&format!("LISTEN {channel}")).await?;
    let ended = driver.await;
    drop(client);
    match ended {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}

impl Postgres {
    /// Brings the schema up to date, one node at a time.
    async fn migrate_now(&self) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        tx.cached_execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
            .await
            .map_err(pg_err)?;
        tx.batch_execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (
                 version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)",
        )
        .await
        .map_err(pg_err)?;
        let current: i64 = col(
            &tx.cached_query_one(sql::CURRENT_VERSION, &[])
                .await
                .map_err(pg_err)?,
            0,
        )?;
        if current > migrations::latest(MIGRATIONS) {
            let release = match tx.query_opt(sql::WRITTEN_BY, &[&current]).await {
                Ok(row) => row.and_then(|r| r.get::<_, Option<String>>(0)),
                Err(_) => None,
            };
            return Err(migrations::newer_schema(current, release, MIGRATIONS));
        }
        for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
            tx.batch_execute(sql).await.map_err(pg_err)?;
            tx.cached_execute(
                sql::RECORD_MIGRATION,
                &[version, &crate::domain::clock::now_ms()],
            )
            .await
            .map_err(pg_err)?;
        }
        if current < migrations::latest(MIGRATIONS) {
            // Not a cached statement: the column is new to this connection's plans.
            tx.execute(sql::RECORD_RELEASE, &[&migrations::RELEASE, &current])
                .await
                .map_err(pg_err)?;
        }
        tx.commit().await.map_err(pg_err)
    }

    /// Rewrites `tables` (`VACUUM FULL`), so that no dead row version of theirs is left in
    /// the database's files: what an erasure deleted or a rekey overwrote. It locks each
    /// table while it copies it (every sealed ingest reads `data_keys`, and waits), after
    /// waiting at most `lock_timeout` (the busy timeout) for the transactions using it. A
    /// table larger than `at_most` bytes, or one it cannot lock in time, gets a plain
    /// `VACUUM` instead (no lock that stops anyone; most dead versions' bytes go, not
    /// all), and the answer says so, for an operator to rewrite it at a quiet hour.
    async fn rewrite_tables(
        &self,
        tables: &[&str],
        at_most: Option<i64>,
    ) -> Result<(), StoreError> {
        let client = self.client().await?;
        wait_for_older_snapshots(&client).await?;
        let mut left = Vec::new();
        for table in tables {
            let size: i64 = client
                .query_one(
                    "SELECT pg_total_relation_size($1::text::regclass)",
                    &[table],
                )
                .await
                .map_err(pg_err)?
                .get(0);
            let rewritten = if at_most.is_some_and(|most| size > most) {
                Err(format!(
                    "{table} ({} MB) is not rewritten after an erasure, to spare ingest its lock",
                    size >> 20
                ))
            } else {
                client
                    .batch_execute(&format!("VACUUM (FULL) {table}"))
                    .await
                    .map_err(|err| format!("VACUUM FULL {table} did not run: {err}"))
            };
            if let Err(why) = rewritten {
                client
                    .batch_execute(&format!("VACUUM {table}"))
                    .await
                    .map_err(pg_err)?;
                left.push(why);
            }
        }
        if left.is_empty() {
            return Ok(());
        }
        Err(StoreError::Unavailable(
            format!(
                "{}: old row versions may stay in the files until `VACUUM FULL {}` runs \
                 (docs/encryption.md, what an erasure leaves in the files)",
                left.join("; "),
                tables.join(", ")
            )
            .into(),
        ))
    }

    /// Logs one delivery: batched, or in a transaction of its own.
    async fn ingest_now(
        &self,
        row: EventRow,
        settle: SettleAt<'_>,
    ) -> Result<Admission, StoreError> {
        // An ignored type takes the single path: it is logged decided, outside every limit.
        if self.group_commit && !matches!(settle, SettleAt::Ingest(_)) && !row.ignored {
            return self.ingest_batched(row, settle.rules()).await;
        }
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let admission =
            ingest::log_one(&PgIo::of(&tx, &self.vault), &row, settle, Guard::Savepoints).await?;
        // A refused delivery leaves nothing: its transaction rolls back when dropped.
        if !matches!(admission, Admission::Refused(_)) {
            tx.commit().await.map_err(pg_err)?;
        }
        Ok(admission)
    }
}

/// The largest `data_keys` (with its indexes) an erasure rewrites: about 250 000
/// aggregates, a second or two of ingest waiting on the table's lock (docs/encryption.md,
/// erasure). A larger one gets a plain VACUUM.
const ERASURE_REWRITE_AT_MOST: i64 = 64 << 20;

/// How long a scrub waits for the transactions that began before it to end.
const SNAPSHOTS_WAIT: Duration = Duration::from_secs(10);

/// Waits until no transaction that began before now is still running (in any database
/// of the server: a snapshot's horizon, `VACUUM FULL`'s own included, is the oldest one
/// running anywhere), nor any snapshot of this database taken before now: `VACUUM FULL`
/// copies every row version such a snapshot may still see, so a deleted key's version
/// would outlive the rewrite. The transactions in hand (an ingest batch, a settle) end
/// in milliseconds; one still open after [`SNAPSHOTS_WAIT`] is reported, and the rewrite
/// goes on without waiting for it.
async fn wait_for_older_snapshots(client: &deadpool_postgres::Object) -> Result<(), StoreError> {
    // A transaction id assigned now: every transaction that began before has a lower one.
    let now: String = client
        .query_one("SELECT pg_current_xact_id()::text", &[])
        .await
        .map_err(pg_err)?
        .get(0);
    let deadline = tokio::time::Instant::now() + SNAPSHOTS_WAIT;
    loop {
        let clear: bool = client
            .query_one(
                "SELECT pg_snapshot_xmin(pg_current_snapshot()) >= $1::text::xid8
                    AND NOT EXISTS (
                        SELECT 1 FROM pg_stat_activity
                        WHERE datname = current_database() AND pid <> pg_backend_pid()
                          AND age(backend_xmin)
                              > age((($1::text::numeric % 4294967296)::bigint)::text::xid))",
                &[&now],
            )
            .await
            .map_err(pg_err)?
            .get(0);
        if clear {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            tracing::warn!(
                "a transaction that began before the scrub is still open: the row versions \
                 it may see stay in the files until the next VACUUM FULL"
            );
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Backend for Postgres {
    type Tx<'t> = PgIo<'t>;

    fn vault(&self) -> &Arc<Vault> {
        &self.vault
    }

    fn with_vault(mut self, vault: Arc<Vault>) -> Self {
        self.vault = vault;
        self
    }

    async fn write<T, F>(&self, _commit: Commit, flow: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t PgIo<'t>) -> FlowFuture<'t, T> + Send + 'static,
    {
        let mut client = self.client().await?;
        let tx = client.transaction().await.map_err(pg_err)?;
        let done = flow(&PgIo::of(&tx, &self.vault)).await?;
        tx.commit().await.map_err(pg_err)?;
        Ok(done)
    }

    async fn read<T, F>(&self, flow: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t PgIo<'t>) -> FlowFuture<'t, T> + Send + 'static,
    {
        let client = self.client().await?;
        flow(&PgIo::of(&client, &self.vault)).await
    }

    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.migrate_now()
    }

    fn ingest<'a>(
        &'a self,
        row: EventRow,
        settle: SettleAt<'a>,
    ) -> impl Future<Output = Result<Admission, StoreError>> + Send + 'a {
        self.ingest_now(row, settle)
    }

    async fn scrub(&self, after: Scrub) -> Result<(), StoreError> {
        match after {
            // The data key's deleted row: with it in the files (and the master key), what
            // the erased aggregate's dead rows hold decrypts. Rewritten while it is small
            // (a lock of a second or two); the erased rows' dead versions elsewhere, sealed
            // under the destroyed key, go at autovacuum's pace.
            Scrub::Erasure {
                data_key_destroyed: true,
            } => {
                self.rewrite_tables(&["data_keys"], Some(ERASURE_REWRITE_AT_MOST))
                    .await
            }
            Scrub::Erasure {
                data_key_destroyed: false,
            } => Ok(()),
            // Every key's version wrapped under the retired master key: a rekey is planned
            // work, and the rewrite is what lets that master key go.
            Scrub::Rekey => {
                self.rewrite_tables(&["data_keys", "store_keys"], None)
                    .await
            }
        }
    }

    fn subscribe(&self, wake: Arc<Notify>) {
        self.listen(CHANNEL, wake);
    }

    fn subscribe_deliveries(&self, wake: Arc<Notify>) {
        self.listen(DELIVERIES_CHANNEL, wake);
    }
}

/// A pool that could not hand out a connection, with the cause (a TLS check, say) spelled out.
fn no_connection(err: deadpool_postgres::PoolError) -> StoreError {
    let described = super::postgres_tls::describe(&err);
    StoreError::Unavailable(Failure::caused(
        format!("no PostgreSQL connection: {described}"),
        err,
    ))
}

fn pg_err(err: tokio_postgres::Error) -> StoreError {
    use tokio_postgres::error::SqlState;
    let transient = err.is_closed()
        || err.code().is_none()
        || err.code().is_some_and(|code| {
            let class = &code.code()[..2];
            // Connection exceptions, insufficient resources, operator intervention,
            // lock timeouts, serialization failures and deadlocks are worth a retry.
            matches!(class, "08" | "53" | "57" | "40")
                || *code == SqlState::LOCK_NOT_AVAILABLE
                || *code == SqlState::QUERY_CANCELED
        });
    let failure = Failure::caused(err.to_string(), err);
    if transient {
        StoreError::Unavailable(failure)
    } else {
        StoreError::Internal(failure)
    }
}

fn col<'a, T: tokio_postgres::types::FromSql<'a>>(
    row: &'a Row,
    idx: usize,
) -> Result<T, StoreError> {
    row.try_get(idx).map_err(pg_err)
}

/// A stable 64-bit key for an aggregate's advisory lock.
fn lock_key(source: &str, aggregate: &str) -> i64 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(source.as_bytes())
        .chain_update([0u8])
        .chain_update(aggregate.as_bytes())
        .finalize();
    i64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}

/// A bound value in PostgreSQL's terms, bound by reference. `accepts` cannot know the
/// variant, so the type check is made per value in `to_sql_checked`, by the type each
/// variant binds as (an integer as [`AnyInt`], of whatever integer type its column has).
impl ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Param::Text(t) => <&str as ToSql>::to_sql(&&**t, ty, out),
            Param::Int(i) => AnyInt(*i).to_sql(ty, out),
            Param::OptText(t) => t.as_deref().to_sql(ty, out),
            Param::OptInt(i) => i.map(AnyInt).to_sql(ty, out),
            Param::Bytes(b) => <&[u8] as ToSql>::to_sql(&&**b, ty, out),
            Param::Ids(ids) => ids.to_sql(ty, out),
            Param::Texts(texts) => texts.to_sql(ty, out),
        }
    }

    fn accepts(_ty: &tokio_postgres::types::Type) -> bool {
        true
    }

    fn to_sql_checked(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Param::Text(t) => <&str as ToSql>::to_sql_checked(&&**t, ty, out),
            Param::Int(i) => AnyInt(*i).to_sql_checked(ty, out),
            Param::OptText(t) => t.as_deref().to_sql_checked(ty, out),
            Param::OptInt(i) => i.map(AnyInt).to_sql_checked(ty, out),
            Param::Bytes(b) => <&[u8] as ToSql>::to_sql_checked(&&**b, ty, out),
            Param::Ids(ids) => ids.to_sql_checked(ty, out),
            Param::Texts(texts) => texts.to_sql_checked(ty, out),
        }
    }
}

/// An integer bound to whichever integer type its column has: the statements are
/// written once, and SQLite knows one integer type.
#[derive(Debug)]
struct AnyInt(i64);

impl ToSql for AnyInt {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::Type;
        match *ty {
            Type::INT2 => i16::try_from(self.0)?.to_sql(ty, out),
            Type::INT4 => i32::try_from(self.0)?.to_sql(ty, out),
            _ => self.0.to_sql(ty, out),
        }
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        use tokio_postgres::types::Type;
        matches!(*ty, Type::INT2 | Type::INT4 | Type::INT8)
    }

    tokio_postgres::types::to_sql_checked!();
}

/// The parameters as `tokio_postgres` takes them: references, nothing copied.
fn refs<'p>(params: &'p [Param<'_>]) -> Vec<&'p (dyn ToSql + Sync)> {
    params.iter().map(|p| p as &(dyn ToSql + Sync)).collect()
}

/// An aggregate's identity in the maps below.
type AggregateId = (String, String);

/// The highest sequence received so far for each of the rows' aggregates.
async fn highest_received(
    tx: &dyn CachedStatements,
    rows: &[&EventRow],
) -> Result<HashMap<AggregateId, i64>, StoreError> {
    let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate.as_str()).collect();
    let found = tx
        .cached_query(
            "SELECT s.source, s.aggregate, s.max_sequence FROM aggregate_seen s
             JOIN (SELECT DISTINCT * FROM UNNEST($1::text[], $2::text[])) AS a(source, aggregate)
               ON s.source = a.source AND s.aggregate = a.aggregate",
            &[&sources, &aggregates],
        )
        .await
        .map_err(pg_err)?;
    found
        .iter()
        .map(|r| Ok(((col(r, 0)?, col(r, 1)?), col(r, 2)?)))
        .collect()
}

/// Raises each aggregate's highest received sequence to the rows' sequences.
async fn raise_highest_received(
    tx: &dyn CachedStatements,
    rows: &[&EventRow],
) -> Result<(), StoreError> {
    if rows.is_empty() {
        return Ok(());
    }
    let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate.as_str()).collect();
    let sequences: Vec<i64> = rows.iter().map(|r| r.sequence).collect();
    tx.cached_execute(
        "INSERT INTO aggregate_seen (source, aggregate, max_sequence)
         SELECT source, aggregate, MAX(sequence)
         FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS r(source, aggregate, sequence)
         GROUP BY source, aggregate ORDER BY source, aggregate
         ON CONFLICT (source, aggregate) DO UPDATE
             SET max_sequence = GREATEST(aggregate_seen.max_sequence, EXCLUDED.max_sequence)",
        &[&sources, &aggregates, &sequences],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// For the aggregates of the rows that may be held: the sequence events wait behind
/// (`last_sequence`) and how many in-order events wait ahead of the gap after it.
async fn waiting_ahead(
    tx: &dyn CachedStatements,
    rows: &[&EventRow],
) -> Result<HashMap<AggregateId, (i64, i64)>, StoreError> {
    let rows: Vec<&&EventRow> = rows
        .iter()
        .filter(|r| r.may_hold && r.limits.max_held_per_aggregate < u64::MAX)
        .collect();
    if rows.is_empty() {
        return Ok(HashMap::new());
    }
    let sources: Vec<&str> = rows.iter().map(|r| r.source.as_str()).collect();
    let aggregates: Vec<&str> = rows.iter().map(|r| r.aggregate.as_str()).collect();
    let firsts: Vec<i64> = rows.iter().map(|r| r.limits.first_sequence).collect();
    let found = tx
        .cached_query(
            "SELECT a.source, a.aggregate, a.last,
                    (SELECT COUNT(*) FROM events e
                     WHERE e.source = a.source AND e.aggregate = a.aggregate
                       AND e.status IN ('received', 'held')
                       AND e.sequence > a.last + 1)
             FROM (SELECT DISTINCT u.source, u.aggregate,
                          COALESCE(s.watermark, u.first - 1) AS last
                   FROM UNNEST($1::text[], $2::text[], $3::int8[]) AS u(source, aggregate, first)
                   LEFT JOIN aggregate_state s
                     ON s.source = u.source AND s.aggregate = u.aggregate) a",
            &[&sources, &aggregates, &firsts],
        )
        .await
        .map_err(pg_err)?;
    found
        .iter()
        .map(|r| Ok(((col(r, 0)?, col(r, 1)?), (col(r, 2)?, col(r, 3)?))))
        .collect()
}

/// Folds the committed count deltas into `event_counts`, unless another transaction is
/// folding now (then its fold serves): one folder at a time, so the counts rows are never
/// a lock two writers wait on, and ingest never touches them.
async fn fold_counts(tx: &dyn CachedStatements) -> Result<(), StoreError> {
    tx.cached_execute(
        "WITH folder AS (SELECT pg_try_advisory_xact_lock($1) AS mine),
              gone AS (DELETE FROM event_count_deltas WHERE (SELECT mine FROM folder)
                       RETURNING source, status, n)
         INSERT INTO event_counts (source, status, n)
         SELECT source, status, SUM(n) FROM gone GROUP BY source, status ORDER BY source, status
         ON CONFLICT (source, status) DO UPDATE SET n = event_counts.n + EXCLUDED.n",
        &[&FOLD_LOCK],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Folds the delivery count deltas into `delivery_counts`, as [`fold_counts`] does for
/// events: one node at a time, the others read counts plus deltas meanwhile.
async fn fold_delivery_counts(tx: &dyn CachedStatements) -> Result<(), StoreError> {
    tx.cached_execute(
        "WITH folder AS (SELECT pg_try_advisory_xact_lock($1) AS mine),
              gone AS (DELETE FROM delivery_count_deltas WHERE (SELECT mine FROM folder)
                       RETURNING destination, status, n)
         INSERT INTO delivery_counts (destination, status, n)
         SELECT destination, status, SUM(n) FROM gone GROUP BY destination, status
         ORDER BY destination, status
         ON CONFLICT (destination, status) DO UPDATE SET n = delivery_counts.n + EXCLUDED.n",
        &[&FOLD_DELIVERIES_LOCK],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Undecided events per source, this transaction's own inserts included: the counter rows
/// locked (in source order) until the transaction ends, made for a source's first delivery,
/// then read with the committed shards (migration 23) by a statement of its own. Its
/// snapshot is taken once the locks are held, so it sees every increment committed by the
/// transactions that held them before: a statement that waited for a lock keeps the
/// snapshot it began with, which would miss them.
async fn lock_backlogs(
    tx: &dyn CachedStatements,
    sources: &[&str],
) -> Result<HashMap<String, i64>, StoreError> {
    if sources.is_empty() {
        return Ok(HashMap::new());
    }
    let lock =
        "SELECT source FROM backlog_counts WHERE source = ANY($1) ORDER BY source FOR UPDATE";
    let read = "SELECT c.source, (c.n + COALESCE(
             (SELECT SUM(d.n) FROM backlog_decrements d WHERE d.source = c.source), 0))::BIGINT
         FROM backlog_counts c WHERE c.source = ANY($1)";
    // Pipelined: PostgreSQL runs the read after the lock, in a snapshot of its own.
    let (locked, found) = futures_util::future::join(
        tx.cached_query(lock, &[&sources]),
        tx.cached_query(read, &[&sources]),
    )
    .await;
    let (mut locked, mut found) = (locked.map_err(pg_err)?, found.map_err(pg_err)?);
    if locked.len() < sources.len() {
        // A source's first delivery makes its counter row (every later one only locks it).
        tx.cached_execute(
            "INSERT INTO backlog_counts (source, n)
             SELECT s, 0 FROM UNNEST($1::text[]) AS s ORDER BY s ON CONFLICT DO NOTHING",
            &[&sources],
        )
        .await
        .map_err(pg_err)?;
        locked = tx.cached_query(lock, &[&sources]).await.map_err(pg_err)?;
        found = tx.cached_query(read, &[&sources]).await.map_err(pg_err)?;
    }
    debug_assert_eq!(locked.len(), sources.len());
    found.iter().map(|r| Ok((col(r, 0)?, col(r, 1)?))).collect()
}

/// A batch insert's error, a deadlock made an internal one: the batch is then logged again
/// one delivery at a time (`commit_batch`) rather than answered 503 as a whole.
fn deadlock_fails_the_batch(err: tokio_postgres::Error) -> StoreError {
    if err.code() == Some(&tokio_postgres::error::SqlState::T_R_DEADLOCK_DETECTED) {
        return StoreError::Internal(Failure::caused(err.to_string(), err));
    }
    pg_err(err)
}

/// Takes the advisory locks of several aggregates in key order, as every transaction that
/// holds more than one takes them (before any counter row), so that two never deadlock.
async fn lock_aggregates<'a>(
    tx: &dyn CachedStatements,
    aggregates: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(), StoreError> {
    let mut keys: Vec<i64> = aggregates
        .map(|(source, aggregate)| lock_key(source, aggregate))
        .collect();
    keys.sort_unstable();
    keys.dedup();
    tx.cached_execute(
        "SELECT pg_advisory_xact_lock(k) FROM UNNEST($1::int8[]) WITH ORDINALITY AS t(k, i) ORDER BY i",
        &[&keys],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Puts the dead or retrying events matching `condition` back in the queue, recording the replay.
async fn add_history(
    tx: &dyn CachedStatements,
    row: i64,
    at_ms: i64,
    kind: &str,
    error: Option<&str>,
) -> Result<(), StoreError> {
    tx.cached_execute(sql::ADD_HISTORY, &[&row, &at_ms, &kind, &error])
        .await
        .map_err(pg_err)?;
    Ok(())
}

/// The flows' statements over a PostgreSQL transaction, or, for reads, over a bare
/// connection (each statement its own snapshot, and no round trips to begin and commit).
pub struct PgIo<'a> {
    tx: &'a dyn CachedStatements,
    vault: &'a Vault,
}

impl<'a> PgIo<'a> {
    fn of(tx: &'a dyn CachedStatements, vault: &'a Vault) -> Self {
        Self { tx, vault }
    }
}

impl Tx for PgIo<'_> {
    const LOCK_ROWS: &'static str = " FOR UPDATE";
    // Kept by triggers (migration 7): the folded counts plus the deltas since.
    const STATUS_COUNTS: &'static str = "SELECT source, status, SUM(n)::BIGINT FROM (
             SELECT source, status, n FROM event_counts
             UNION ALL
             SELECT source, status, n FROM event_count_deltas) c
         GROUP BY source, status HAVING SUM(n) > 0";
    // The partial index's own condition: proportional to the backlog, not the log.
    const UNDECIDED_COUNTS: &'static str = "SELECT source, status, COUNT(*) FROM events
         WHERE status IN ('received', 'held', 'retrying') GROUP BY source, status";
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    const SETTLE_READS_BY_STEP: bool = true;
    const COUNTS_BLOCKED_AGGREGATES: bool = false;
    const LOCK_KEY: &'static str =
        "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 0))) l";
    // Made and locked until commit, for the read below to run in a snapshot taken once
    // it is held (`lock_backlogs`).
    const LOCK_BACKLOG: Option<&'static str> = Some(
        "INSERT INTO backlog_counts (source, n) VALUES ($1, 0)
         ON CONFLICT (source) DO UPDATE SET n = backlog_counts.n",
    );
    // The counter row (migration 9) and the shards (migration 23), this transaction's
    // insert among them.
    const BACKLOG: &'static str = "SELECT (COALESCE(
             (SELECT n FROM backlog_counts WHERE source = $1), 0) + COALESCE(
             (SELECT SUM(d.n) FROM backlog_decrements d WHERE d.source = $1), 0))::BIGINT";

    fn in_ids(column: &str, n: usize) -> String {
        format!("{column} = ANY(${n})")
    }

    fn try_lock(key: &str) -> String {
        format!("pg_try_advisory_xact_lock(hashtextextended({key}, 0))")
    }

    fn source_aggregate_pairs(n: usize, alias: &str) -> String {
        format!(
            "unnest(${n}::text[], ${}::text[]) AS {alias}(source, aggregate)",
            n + 1
        )
    }

    async fn execute(&self, statement: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        self.tx
            .cached_execute(statement, &refs(params))
            .await
            .map_err(pg_err)
    }

    async fn query(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Vec<Cell>>, StoreError> {
        let rows = self
            .tx
            .cached_query(statement, &refs(params))
            .await
            .map_err(pg_err)?;
        rows.iter().map(cells).collect()
    }

    async fn insert_row(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> Result<Option<i64>, StoreError> {
        let inserted = self
            .tx
            .cached_query(&format!("{statement} RETURNING id"), &refs(params))
            .await
            .map_err(pg_err)?;
        inserted.first().map(|row| col(row, 0)).transpose()
    }

    async fn lock_aggregates(&self, aggregates: &[(&str, &str)]) -> Result<(), StoreError> {
        lock_aggregates(self.tx, aggregates.iter().copied()).await
    }

    async fn fold_event_counts(&self) -> Result<(), StoreError> {
        fold_counts(self.tx).await
    }

    async fn fold_delivery_counts(&self) -> Result<(), StoreError> {
        fold_delivery_counts(self.tx).await
    }

    async fn record_decisions(
        &self,
        decisions: &[(i64, Outcome)],
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> Result<(), StoreError> {
        record_decisions(self.tx, decisions, now_ms, hold_timeout_ms).await
    }

    async fn save_states(&self, states: &[StateRow]) -> Result<(), StoreError> {
        save_states(self.tx, states).await
    }

    async fn add_changes(&self, changes: &[ChangeRow]) -> Result<(), StoreError> {
        add_changes(self.tx, changes).await
    }

    async fn wake_workers(&self) -> Result<(), StoreError> {
        notify(self.tx, CHANNEL).await
    }

    async fn wake_senders(&self) -> Result<(), StoreError> {
        // Several in one transaction fold into one notification at the commit.
        notify(self.tx, DELIVERIES_CHANNEL).await
    }

    fn vault(&self) -> &Vault {
        self.vault
    }
}

/// Notifies `channel` when the transaction of `client` commits.
async fn notify(client: &dyn CachedStatements, channel: &str) -> Result<(), StoreError> {
    client
        .cached_execute("SELECT pg_notify($1, '')", &[&channel])
        .await
        .map_err(pg_err)?;
    Ok(())
}

/// A row's values as [`Cell`]s (integers, texts and bodies).
fn cells(row: &Row) -> Result<Vec<Cell>, StoreError> {
    use tokio_postgres::types::Type;
    (0..row.len())
        .map(|at| {
            let ty = row.columns()[at].type_();
            let cell = if *ty == Type::INT8 {
                col::<Option<i64>>(row, at)?.map(Cell::Int)
            } else if *ty == Type::INT4 {
                col::<Option<i32>>(row, at)?.map(|n| Cell::Int(n.into()))
            } else if *ty == Type::TEXT || *ty == Type::VARCHAR {
                col::<Option<String>>(row, at)?.map(Cell::Text)
            } else if *ty == Type::BOOL {
                col::<Option<bool>>(row, at)?.map(|b| Cell::Int(b.into()))
            } else if *ty == Type::BYTEA {
                col::<Option<Vec<u8>>>(row, at)?.map(Cell::Bytes)
            } else {
                return Err(StoreError::Internal(
                    (format!("column {at}: unexpected type {ty}")).into(),
                ));
            };
            Ok(cell.unwrap_or(Cell::Null))
        })
        .collect()
}

/// Saves aggregates' states in one statement, however many (each aggregate once: an
/// upsert may not touch one row twice).
async fn save_states(tx: &dyn CachedStatements, states: &[StateRow]) -> Result<(), StoreError> {
    if let [one] = states {
        tx.cached_execute(sql::SAVE_AGGREGATE, &refs(&one.params()))
            .await
            .map_err(pg_err)?;
        return Ok(());
    }
    let column = |f: fn(&StateRow) -> &str| states.iter().map(f).collect::<Vec<_>>();
    let opt_column = |f: fn(&StateRow) -> Option<&str>| states.iter().map(f).collect::<Vec<_>>();
    let int_column = |f: fn(&StateRow) -> Option<i64>| states.iter().map(f).collect::<Vec<_>>();
    tx.cached_execute(
        "INSERT INTO aggregate_state
             (source, aggregate, sequence, event_id, event_type, state, tag, watermark,
              updated_at, skipped_gaps)
         SELECT * FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::text[], $5::text[],
                              $6::text[], $7::text[], $8::int8[], $9::int8[], $10::text[])
         ON CONFLICT (source, aggregate) DO UPDATE SET
             sequence = EXCLUDED.sequence, event_id = EXCLUDED.event_id,
             event_type = EXCLUDED.event_type, state = EXCLUDED.state, tag = EXCLUDED.tag,
             watermark = EXCLUDED.watermark, updated_at = EXCLUDED.updated_at,
             skipped_gaps = EXCLUDED.skipped_gaps",
        &[
            &column(|s| &s.source),
            &column(|s| &s.aggregate),
            &int_column(|s| s.sequence),
            &opt_column(|s| s.event_id.as_deref()),
            &opt_column(|s| s.event_type.as_deref()),
            &column(|s| &s.state),
            &opt_column(|s| s.tag.as_deref()),
            &int_column(|s| s.watermark),
            &int_column(|s| Some(s.updated_at_ms)),
            &opt_column(|s| s.skipped_gaps.as_deref()),
        ],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Appends changes for the stream in one statement, their ids in the order given.
async fn add_changes(tx: &dyn CachedStatements, changes: &[ChangeRow]) -> Result<(), StoreError> {
    if let [one] = changes {
        tx.cached_execute(sql::ADD_CHANGE, &refs(&one.params()))
            .await
            .map_err(pg_err)?;
        return Ok(());
    }
    let column = |f: fn(&ChangeRow) -> &str| changes.iter().map(f).collect::<Vec<_>>();
    let at: Vec<i64> = changes.iter().map(|c| c.at_ms).collect();
    tx.cached_execute(
        "INSERT INTO state_changes (source, aggregate, kind, at, state)
         SELECT source, aggregate, kind, at, state
         FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int8[], $5::text[])
              WITH ORDINALITY AS c(source, aggregate, kind, at, state, ord)
         ORDER BY ord",
        &[
            &column(|c| &c.source),
            &column(|c| &c.aggregate),
            &column(|c| c.kind),
            &at,
            &column(|c| &c.state),
        ],
    )
    .await
    .map_err(pg_err)?;
    Ok(())
}

/// Writes a settle's decisions: one statement for the held events and one for the
/// decided ones, whatever their number (plus a history entry per dead event).
async fn record_decisions(
    tx: &dyn CachedStatements,
    decisions: &[(i64, Outcome)],
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Result<(), StoreError> {
    let held: Vec<i64> = decisions
        .iter()
        .filter(|(_, outcome)| *outcome == Outcome::Held)
        .map(|(row, _)| *row)
        .collect();
    if !held.is_empty() {
        tx.cached_execute(
            "UPDATE events SET status = 'held', next_attempt_at = received_at + $2
             WHERE id = ANY($1) AND status <> 'held'",
            &[&held, &hold_timeout_ms],
        )
        .await
        .map_err(pg_err)?;
    }
    let mut rows = Vec::new();
    let mut statuses = Vec::new();
    let mut reasons = Vec::new();
    let mut details = Vec::new();
    for (row, outcome) in decisions {
        if *outcome == Outcome::Held {
            continue;
        }
        let (status, reason) = status_of(outcome);
        let detail = match outcome {
            Outcome::Dead { detail, .. } => Some(detail.as_str()),
            _ => None,
        };
        if let (Some(reason), Some(detail)) = (reason, detail) {
            add_history(tx, *row, now_ms, reason.as_str(), Some(detail)).await?;
        }
        rows.push(*row);
        statuses.push(status.as_str());
        reasons.push(reason.map(DeadReason::as_str));
        details.push(detail);
    }
    if !rows.is_empty() {
        tx.cached_execute(
            "UPDATE events SET status = d.status, dead_reason = d.reason, last_error = d.detail,
                 decided_at = $5, attempts = attempts + 1, next_attempt_at = NULL
             FROM UNNEST($1::int8[], $2::text[], $3::text[], $4::text[]) AS d(id, status, reason, detail)
             WHERE events.id = d.id",
            &[&rows, &statuses, &reasons, &details, &now_ms],
        )
        .await
        .map_err(pg_err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use tokio_postgres::types::Type;

    use super::*;
    use crate::store::backend::text;

    /// Bound by reference, each variant is checked as the owned value it used to be bound
    /// as: an integer binds to any integer column (in range), a NULL keeps its type.
    #[test]
    fn a_param_accepts_the_types_its_value_binds_as() {
        let mut out = bytes::BytesMut::new();
        let mut binds = |param: Param<'_>, ty: Type| param.to_sql_checked(&ty, &mut out).is_ok();
        for ty in [Type::INT2, Type::INT4, Type::INT8] {
            assert!(binds(Param::Int(7), ty.clone()), "{ty}");
            assert!(binds(Param::OptInt(None), ty.clone()), "{ty}");
            assert!(!binds(text("7"), ty.clone()), "{ty}");
            assert!(!binds(Param::OptText(None), ty), "a NULL text");
        }
        assert!(!binds(Param::Int(1 << 20), Type::INT2), "out of range");
        assert!(!binds(Param::Int(7), Type::TEXT));
        assert!(binds(text("a"), Type::TEXT));
        assert!(binds(Param::opt_text(Some("a")), Type::VARCHAR));
        assert!(binds(Param::Bytes(Cow::Borrowed(b"x")), Type::BYTEA));
        assert!(!binds(Param::Bytes(Cow::Borrowed(b"x")), Type::TEXT));
        assert!(binds(Param::Ids(vec![1, 2]), Type::INT8_ARRAY));
        assert!(!binds(Param::Ids(vec![1, 2]), Type::TEXT_ARRAY));
        assert!(binds(Param::Texts(vec!["a".into()]), Type::TEXT_ARRAY));
    }
}
