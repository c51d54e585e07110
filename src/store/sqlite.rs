//! The embedded SQLite store: WAL journal, `synchronous = FULL` so that a
//! commit is on disk before inhook answers (G2).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rusqlite::types::{Value as SqlValue, ValueRef};
use rusqlite::{params, params_from_iter, Connection, ErrorCode, OptionalExtension};

use futures_util::FutureExt;

use super::batch::BatchQueue;
use super::filter::{
    self, json_err, parse_event_id, parse_status, where_of, Param, CONFLICTING_DUPLICATE,
    CONFLICT_DETAIL, EVENT_COLUMNS,
};
use super::forwarding::{
    self, DeliveryFilter, DeliveryPage, DeliveryRecord, DeliveryReplay, DeliveryReplayJob,
    DeliverySkip, DestinationStats, PendingVerdict,
};
use super::migrations::SQLITE as MIGRATIONS;
use super::settle::{self, SettleIo, Settled};
use super::sql;
use super::upkeep::{self, Cell, UpkeepIo};
use super::{
    status_of, Admission, AggregatePage, AggregateState, AttemptRecord, DedupKey, EventFilter,
    EventPage, EventRecord, EventRow, FailureReport, NewEvent, PurgeReport, Refusal, ReplayJob,
    ReplayOutcome, SettleAt, SettleReport, SourceRules, StateChange, Store, StoreError,
};
use crate::domain::{DeadReason, EventStatus};
use crate::forward::answer::{AttemptRecord as DeliveryAttempt, Verdict};
use crate::kind::PendingRow;
use crate::ordering::{HeldRef, Outcome};
use crate::retry::RetryPolicy;

/// The SQLite store. One connection behind a mutex: SQLite has one writer at a
/// time anyway, and every call runs on the blocking pool, never on a runtime thread.
/// Deliveries are group-committed: concurrent ingests share one transaction and
/// one fsync, each answered only after the commit ([`commit_batch`]).
#[derive(Clone)]
pub struct SqliteStore {
    /// The one connection, taken in turn (FIFO): with an unfair lock, a flat-out ingest's
    /// stream of committers starved every other user (forwarding ran at 8 deliveries/s).
    conn: Arc<tokio::sync::Mutex<Connection>>,
    /// A read-only connection for what operators poll (counts, `/readyz`): in WAL mode it
    /// reads the last commit without waiting for the writer, and the writer never waits
    /// for it, however many scrapers poll.
    reader: Arc<tokio::sync::Mutex<Connection>>,
    queue: Arc<BatchQueue<IngestJob>>,
    group_commit: bool,
    /// Where each destination's claims stand among its queues.
    claim_cursors: Arc<forwarding::ClaimCursors>,
}

/// Most deliveries committed in one transaction.
const MAX_BATCH: usize = 512;

/// A delivery waiting for the writer.
struct IngestJob {
    row: EventRow,
    /// The rules of a settle at ingest, and whether only when ready ([`SettleAt::IfReady`]).
    rules: Option<(SourceRules, bool)>,
    reply: tokio::sync::oneshot::Sender<Result<Admission, StoreError>>,
}

/// Logs a batch of deliveries in one transaction and answers each after the commit.
///
/// A savepoint per delivery, so that one refused or failing delivery leaves the others,
/// copied every page each delivery touched into the statement journal (spilled to a
/// temporary file: a tenth of the server's `perf` samples at full ingest). So the batch
/// runs first without them, and only if one delivery is refused or fails does it roll
/// back and run again, each delivery in its own savepoint: the answers are the same as if
/// it had run that way from the start.
fn commit_batch(conn: &mut Connection, batch: Vec<IngestJob>) {
    if batch.is_empty() {
        return;
    }
    let answers = match log_batch_whole(conn, &batch) {
        Ok(Some(admissions)) => Ok(admissions.into_iter().map(Ok).collect()),
        Ok(None) => log_batch_each(conn, &batch),
        Err(err) => Err(err),
    };
    match answers {
        Ok(answers) => {
            for (job, answer) in batch.into_iter().zip(answers) {
                let _ = job.reply.send(answer);
            }
        }
        Err(err) => {
            for job in batch {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
    }
}

/// Logs and commits every delivery of `batch` in one transaction with no savepoints;
/// `None` (and nothing written) when one of them is refused or fails.
fn log_batch_whole(
    conn: &mut Connection,
    batch: &[IngestJob],
) -> Result<Option<Vec<Admission>>, StoreError> {
    let tx = conn.transaction().map_err(map_err)?;
    let mut admissions = Vec::with_capacity(batch.len());
    for job in batch {
        match ingest_one(&tx, job, Guard::Batch) {
            Ok(Admission::Refused(_)) | Err(_) => return Ok(None), // rolls back when dropped
            Ok(admission) => admissions.push(admission),
        }
    }
    tx.commit().map_err(map_err)?;
    Ok(Some(admissions))
}

/// Logs every delivery of `batch` in a savepoint of its own, so that a refused or failing
/// one leaves nothing and fails none of the others, and commits them together.
fn log_batch_each(
    conn: &mut Connection,
    batch: &[IngestJob],
) -> Result<Vec<Result<Admission, StoreError>>, StoreError> {
    let mut tx = conn.transaction().map_err(map_err)?;
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        answers.push(tx.savepoint().map_err(map_err).and_then(|sp| {
            let admission = ingest_one(&sp, job, Guard::Savepoints)?;
            // A refused delivery leaves nothing: its savepoint rolls back when dropped.
            if !matches!(admission, Admission::Refused(_)) {
                sp.commit().map_err(map_err)?;
            }
            Ok(admission)
        }));
    }
    tx.commit().map_err(map_err)?;
    Ok(answers)
}

/// Logs a delivery as a row of the event log.
const LOG_EVENT: &str = "INSERT INTO events (source, event_id, event_type, aggregate, sequence,
         idempotency_key, body, signature_valid, signed_at, received_at, status,
         headers, decided_at, attempts, body_sha256)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, 1, ?8, ?9, ?10, ?11, ?12, ?13, ?14)
     ON CONFLICT DO NOTHING";

/// A source's undecided events, from the counts by status. `+status`: the source's few
/// rows are filtered, not looked up through a temporary b-tree of the three statuses
/// built at every delivery.
const BACKLOG: &str = "SELECT COALESCE(SUM(n), 0) FROM event_counts
     WHERE source = ?1 AND (+status = 'received' OR +status = 'held' OR +status = 'retrying')";

/// Records a decided event's outcome.
const RECORD_DECISION: &str =
    "UPDATE events SET status = ?2, dead_reason = ?3, last_error = ?4, decided_at = ?5,
         attempts = attempts + 1, next_attempt_at = NULL
     WHERE id = ?1";

/// Logs one delivery (and settles it in sync mode) inside the caller's transaction.
fn ingest_one(conn: &Connection, job: &IngestJob, guard: Guard) -> Result<Admission, StoreError> {
    let logged = &job.row;
    if let Some(admission) = purged_duplicate(conn, logged)? {
        return Ok(admission);
    }
    // Sync mode too: an aggregate ready at ingest is written once, already decided; the
    // rest is logged and settled below, where the rules may hold it.
    if let Some((rules, _)) = &job.rules {
        if !logged.ignored {
            if let Some(admission) = log_decided(conn, rules, logged, guard)? {
                return Ok(admission);
            }
        }
    }
    let inserted = log_row(
        conn,
        logged,
        logged.logged_status(),
        logged.logged_decided_at(),
        0,
    )?;
    if inserted == 0 {
        return find_duplicate(conn, logged);
    }
    let row = conn.last_insert_rowid();
    if logged.ignored {
        return Ok(Admission::Logged {
            row,
            decided: None,
            out_of_order: false,
        });
    }
    let out_of_order = record_received(conn, logged)?;
    let decided = match &job.rules {
        Some((rules, false)) => {
            let settled = settle_tx(conn, rules, &logged.aggregate, logged.received_at)?;
            Some(settled.decided(row)?)
        }
        // Not ready at ingest (`log_decided` looked): the worker settles it.
        Some((_, true)) | None => None,
    };
    if let Some(refusal) = over_limits(conn, logged)? {
        return Ok(Admission::Refused(refusal));
    }
    Ok(Admission::Logged {
        row,
        decided,
        out_of_order,
    })
}

/// Writes `logged` as a new row of the log; 0 when a unique key makes it a duplicate.
fn log_row(
    conn: &Connection,
    logged: &EventRow,
    status: &str,
    decided_at: Option<i64>,
    attempts: i64,
) -> Result<usize, StoreError> {
    conn.prepare_cached(LOG_EVENT)
        .map_err(map_err)?
        .execute(params![
            logged.source,
            logged.event_id,
            logged.event_type,
            logged.aggregate,
            logged.sequence,
            logged.idempotency_key,
            logged.body,
            logged.signed_at,
            logged.received_at,
            status,
            logged.headers,
            decided_at,
            attempts,
            logged.body_sha256
        ])
        .map_err(map_err)
}

/// How a batch's delivery is kept from failing the others.
#[derive(Clone, Copy, PartialEq)]
enum Guard {
    /// By the batch as a whole: any refusal or failure rolls the batch back, to run
    /// again with savepoints.
    Batch,
    /// Each delivery, and each settle at ingest, in a savepoint of its own.
    Savepoints,
}

/// Logs `logged` already decided when its aggregate is ready at ingest: settled before
/// its row is written, so that the row is written once, with its outcome, and the
/// worker never sees it. `None`: not ready (or, under [`Guard::Savepoints`], settling
/// failed and left nothing), to be logged undecided for the worker, its retries and
/// backoff. A decided event is no backlog item: no limit refuses it.
fn log_decided(
    conn: &Connection,
    rules: &SourceRules,
    logged: &EventRow,
    guard: Guard,
) -> Result<Option<Admission>, StoreError> {
    let io = SqliteIo(conn);
    let plan = match ready(settle::plan_unlogged(
        &io,
        rules,
        &logged.aggregate,
        &[logged],
    )) {
        Ok(Some(plan)) => plan,
        Ok(None) => return Ok(None),
        Err(err) if guard == Guard::Batch => return Err(err),
        Err(_) => return Ok(None),
    };
    let write = || {
        let status = status_of(plan.outcome(0)?).0;
        let decided_at = Some(logged.received_at);
        if log_row(conn, logged, status.as_str(), decided_at, 1)? == 0 {
            return find_duplicate(conn, logged);
        }
        let row = conn.last_insert_rowid();
        let out_of_order = record_received(conn, logged)?;
        let decided = ready(plan.write_logged(&io, rules, &[row]))?.pop();
        Ok(Admission::Logged {
            row,
            decided,
            out_of_order,
        })
    };
    if guard == Guard::Batch {
        return write().map(Some);
    }
    let step = |statement: &str| {
        conn.prepare_cached(statement)
            .and_then(|mut s| s.execute([]))
            .map_err(map_err)
    };
    step("SAVEPOINT decide")?;
    match write() {
        Ok(admission) => {
            step("RELEASE decide")?;
            Ok(Some(admission))
        }
        Err(_) => {
            step("ROLLBACK TO decide")?;
            step("RELEASE decide")?;
            Ok(None)
        }
    }
}

/// Raises the aggregate's highest received sequence; says whether `row` came in below it.
fn record_received(conn: &Connection, row: &EventRow) -> Result<bool, StoreError> {
    let highest: Option<i64> = conn
        .prepare_cached(
            "SELECT max_sequence FROM aggregate_seen WHERE source = ?1 AND aggregate = ?2",
        )
        .map_err(map_err)?
        .query_row(params![row.source, row.aggregate], |r| r.get(0))
        .optional()
        .map_err(map_err)?;
    if highest.is_none_or(|h| row.sequence > h) {
        conn.prepare_cached(
            "INSERT INTO aggregate_seen (source, aggregate, max_sequence) VALUES (?1, ?2, ?3)
             ON CONFLICT (source, aggregate) DO UPDATE SET max_sequence = excluded.max_sequence",
        )
        .map_err(map_err)?
        .execute(params![row.source, row.aggregate, row.sequence])
        .map_err(map_err)?;
    }
    Ok(highest.is_some_and(|h| row.sequence < h))
}

/// Which limit, if any, the just-logged `row` takes its source or aggregate over. Read in
/// the writing transaction: SQLite has one writer, so no concurrent delivery can overshoot.
fn over_limits(conn: &Connection, row: &EventRow) -> Result<Option<Refusal>, StoreError> {
    if row.may_hold && row.limits.max_held_per_aggregate < u64::MAX {
        let waiting: i64 = conn
            .prepare_cached(
                "SELECT COUNT(*) FROM events e
                 WHERE e.source = ?1 AND e.aggregate = ?2 AND e.status IN ('received', 'held')
                   AND e.sequence > 1 + COALESCE(
                       (SELECT watermark FROM aggregate_state s
                        WHERE s.source = ?1 AND s.aggregate = ?2), ?3 - 1)
                   AND ?4 > 1 + COALESCE(
                       (SELECT watermark FROM aggregate_state s
                        WHERE s.source = ?1 AND s.aggregate = ?2), ?3 - 1)",
            )
            .map_err(map_err)?
            .query_row(
                params![
                    row.source,
                    row.aggregate,
                    row.limits.first_sequence,
                    row.sequence
                ],
                |r| r.get(0),
            )
            .map_err(map_err)?;
        if waiting as u64 > row.limits.max_held_per_aggregate {
            return Ok(Some(Refusal::AggregateBacklogFull));
        }
    }
    if row.limits.max_backlog < u64::MAX {
        let backlog: i64 = conn
            .prepare_cached(BACKLOG)
            .map_err(map_err)?
            .query_row(params![row.source], |r| r.get(0))
            .map_err(map_err)?;
        if backlog as u64 > row.limits.max_backlog {
            return Ok(Some(Refusal::BacklogFull));
        }
    }
    Ok(None)
}

/// Turns off SQLite's memory statistics, before the first connection initialises the
/// library: they take a process-wide mutex on every allocation and free, which inhook
/// never reads (they showed in profiles at full ingest: docs/benchmarks.md).
fn without_memory_statistics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: in the server this runs before any other SQLite call (the one place
        // that opens a connection calls it first, once). Where something else in the
        // process initialised SQLite before (a test's own connection), it answers
        // SQLITE_MISUSE and changes nothing; the flag it sets is read once per allocation
        // and per free, so none in flight sees it change halfway.
        unsafe {
            rusqlite::ffi::sqlite3_config(rusqlite::ffi::SQLITE_CONFIG_MEMSTATUS, 0);
        }
    });
}

/// Creates a missing database file readable by its owner only: it holds raw bodies, and
/// SQLite gives the `-wal` and `-shm` files it makes beside it the same mode
/// (docs/configuration.md, `database`). An existing file keeps the mode its owner gave it.
fn create_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::OpenOptionsExt;
    if path.as_os_str() == ":memory:" || path.exists() {
        return Ok(());
    }
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::Unavailable(format!(
            "cannot create the database file {}: {e}",
            path.display()
        ))),
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database file at `path`.
    pub fn open(path: &Path, busy_timeout: Duration) -> Result<Self, StoreError> {
        without_memory_statistics();
        create_private(path)?;
        let conn = Connection::open(path).map_err(map_err)?;
        conn.busy_timeout(busy_timeout).map_err(map_err)?;
        // Every hot statement stays prepared: parsing SQL per delivery showed in profiles.
        conn.set_prepared_statement_cache_capacity(64);
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(map_err)?;
        // FULL fsyncs the WAL at every commit: an answered delivery survives power loss.
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(map_err)?;
        let reader = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(map_err)?;
        reader.busy_timeout(busy_timeout).map_err(map_err)?;
        Ok(Self {
            conn: Arc::new(tokio::sync::Mutex::new(conn)),
            reader: Arc::new(tokio::sync::Mutex::new(reader)),
            queue: Arc::default(),
            group_commit: true,
            claim_cursors: Arc::default(),
        })
    }

    /// Commits each delivery in a transaction of its own (one fsync per request), as a
    /// naive receiver would: the baseline that benchmarks compare group commit against.
    pub fn without_group_commit(mut self) -> Self {
        self.group_commit = false;
        self
    }

    /// Starts the task that takes the connection in its turn and commits what is queued
    /// then (flat combining: batches form only under load, so a lone request waits for
    /// nothing), one at a time waiting for the connection, the next queued as it takes its
    /// batch: the next batch waits in line while one commits.
    fn start_committer(&self) {
        let this = self.clone();
        tokio::task::spawn_blocking(move || {
            let mut conn = this.conn.blocking_lock();
            let (batch, more) = this.queue.take(MAX_BATCH);
            if more {
                this.start_committer();
            }
            if this.group_commit {
                commit_batch(&mut conn, batch);
            } else {
                for job in batch {
                    commit_batch(&mut conn, vec![job]);
                }
            }
        });
    }

    /// Runs `f` on the read-only connection, in one read transaction (one snapshot).
    async fn read<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let reader = Arc::clone(&self.reader);
        tokio::task::spawn_blocking(move || {
            let guard = reader.blocking_lock();
            let snapshot = guard.unchecked_transaction().map_err(map_err)?;
            let read = f(&snapshot);
            // Nothing was written: ending the read transaction cannot lose anything.
            let _ = snapshot.rollback();
            read
        })
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }

    async fn run<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, StoreError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            // A panic while holding the lock leaves SQLite consistent (the transaction rolls back).
            let mut guard = conn.blocking_lock();
            f(&mut guard)
        })
        .await
        .map_err(|e| StoreError::Internal(format!("store task failed: {e}")))?
    }
}

impl SqliteStore {
    /// Runs an upkeep step (a flow driven by [`ready`]) in a transaction of its own.
    async fn upkeep<T, F>(&self, step: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&SqliteIo<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(move |conn| in_transaction(conn, step)).await
    }

    /// Runs a step of forwarding's bookkeeping (a claim, a verdict) in a transaction whose
    /// commit does not wait for the disk: a power cut may lose it only as a crash during
    /// the request would (the delivery is sent again, same `webhook-id`, docs/contract.md
    /// (forwarding)), a process crash loses nothing (WAL), and the next durable commit syncs it
    /// too. Two fsyncs per delivery were what held forwarding's throughput down.
    async fn upkeep_unsynced<T, F>(&self, step: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(&SqliteIo<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        self.run(move |conn| {
            conn.pragma_update(None, "synchronous", "NORMAL")
                .map_err(map_err)?;
            let done = in_transaction(conn, step);
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(map_err)?;
            done
        })
        .await
    }
}

/// Runs `step` in a transaction of its own on `conn`.
fn in_transaction<T>(
    conn: &mut Connection,
    step: impl FnOnce(&SqliteIo<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = conn.transaction().map_err(map_err)?;
    let done = step(&SqliteIo(&tx))?;
    tx.commit().map_err(map_err)?;
    Ok(done)
}

/// The outcome of a flow written once for both stores: SQLite's reads and writes
/// never wait, so its future is ready at once.
fn ready<T>(
    flow: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    flow.now_or_never()
        .ok_or_else(|| StoreError::Internal("a SQLite store step waited".into()))?
}

/// A statement of [`sql`] in SQLite's dialect: `$n` placeholders written `?n`. Each text
/// is rewritten once and kept: rewriting it at every call (about 11 per event) showed in
/// the instruction counts. Found by where the text lies (the statements are constants),
/// then compared whole, so a built statement that reuses an address is never mistaken for
/// another; bounded, since a caller may build its statements.
fn sqlite(statement: &str) -> std::sync::Arc<str> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    type Kept = HashMap<(usize, usize), (Box<str>, Arc<str>)>;
    const MOST_KEPT: usize = 512;
    static REWRITTEN: LazyLock<Mutex<Kept>> = LazyLock::new(Mutex::default);
    let rewrite = || Arc::<str>::from(statement.replace('$', "?"));
    let Ok(mut kept) = REWRITTEN.lock() else {
        return rewrite();
    };
    let at = (statement.as_ptr() as usize, statement.len());
    match kept.get(&at) {
        Some((text, done)) if **text == *statement => Arc::clone(done),
        _ => {
            let done = rewrite();
            if kept.len() < MOST_KEPT || kept.contains_key(&at) {
                kept.insert(at, (statement.into(), Arc::clone(&done)));
            }
            done
        }
    }
}

fn map_err(err: rusqlite::Error) -> StoreError {
    match err.sqlite_error_code() {
        Some(
            ErrorCode::DatabaseBusy
            | ErrorCode::DatabaseLocked
            | ErrorCode::CannotOpen
            | ErrorCode::DiskFull
            | ErrorCode::SystemIoFailure
            | ErrorCode::ReadOnly
            | ErrorCode::OutOfMemory,
        ) => StoreError::Unavailable(err.to_string()),
        _ => StoreError::Internal(err.to_string()),
    }
}

#[async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.run(|conn| {
            let tx = conn.transaction().map_err(map_err)?;
            tx.execute_batch(
                "CREATE TABLE IF NOT EXISTS schema_migrations (
                     version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
            )
            .map_err(map_err)?;
            let current: i64 = tx
                .prepare_cached(&sqlite(sql::CURRENT_VERSION))
                .map_err(map_err)?
                .query_row([], |r| r.get(0))
                .map_err(map_err)?;
            for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
                tx.execute_batch(sql).map_err(map_err)?;
                tx.prepare_cached(&sqlite(sql::RECORD_MIGRATION))
                    .map_err(map_err)?
                    .execute(params![version, crate::clock::now_ms()])
                    .map_err(map_err)?;
            }
            tx.commit().map_err(map_err)
        })
        .await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.read(|conn| {
            conn.prepare_cached(&sqlite(sql::PING))
                .map_err(map_err)?
                .query_row([], |_| Ok(()))
                .map_err(map_err)
        })
        .await
    }

    async fn ingest(
        &self,
        event: NewEvent<'_>,
        settle: SettleAt<'_>,
    ) -> Result<Admission, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = IngestJob {
            row: EventRow::of(&event),
            rules: settle
                .rules()
                .map(|rules| (rules.clone(), matches!(settle, SettleAt::IfReady(_)))),
            reply,
        };
        if self.queue.push(job) {
            self.start_committer();
        }
        answer
            .await
            .map_err(|_| StoreError::Internal("the writer dropped a delivery".into()))?
    }

    async fn due_aggregates(
        &self,
        now_ms: i64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.run(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    // The partial index's own condition, so that only undecided events are read.
                    &sqlite(sql::DUE_AGGREGATES),
                )
                .map_err(map_err)?;
            let rows = stmt
                .query_map(params![now_ms, limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .map_err(map_err)?;
            rows.collect::<Result<_, _>>().map_err(map_err)
        })
        .await
    }

    async fn settle(
        &self,
        rules: &SourceRules,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<SettleReport, StoreError> {
        let rules = rules.clone();
        let aggregate = aggregate.to_owned();
        self.run(move |conn| {
            let tx = conn.transaction().map_err(map_err)?;
            let settled = settle_tx(&tx, &rules, &aggregate, now_ms)?;
            tx.commit().map_err(map_err)?;
            Ok(settled.report)
        })
        .await
    }

    async fn settle_many(
        &self,
        work: &[(SourceRules, String)],
        now_ms: i64,
    ) -> Result<Vec<SettleReport>, StoreError> {
        let work = work.to_vec();
        self.run(move |conn| {
            let tx = conn.transaction().map_err(map_err)?;
            let mut reports = Vec::with_capacity(work.len());
            for (rules, aggregate) in &work {
                reports.push(settle_tx(&tx, rules, aggregate, now_ms)?.report);
            }
            tx.commit().map_err(map_err)?;
            Ok(reports)
        })
        .await
    }

    async fn aggregate(
        &self,
        source: &str,
        aggregate: &str,
    ) -> Result<Option<AggregateState>, StoreError> {
        let (source, aggregate) = (source.to_owned(), aggregate.to_owned());
        self.run(move |conn| SqliteIo(conn).load(&source, &aggregate))
            .await
    }

    async fn aggregates_page(
        &self,
        source: &str,
        tag: Option<&str>,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<AggregatePage, StoreError> {
        let (source, tag, cursor) = (
            source.to_owned(),
            tag.map(str::to_owned),
            cursor.map(str::to_owned),
        );
        self.run(move |conn| {
            let mut stmt = conn
                .prepare_cached(&sqlite(sql::AGGREGATES_PAGE))
                .map_err(map_err)?;
            let rows = stmt
                .query_map(
                    params![source, tag, cursor, limit as i64 + 1],
                    aggregate_row,
                )
                .map_err(map_err)?;
            let mut items = Vec::new();
            for row in rows {
                items.push(aggregate_state(row.map_err(map_err)?)?);
            }
            Ok(AggregatePage::of(items, limit))
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
        let (source, aggregate, error) =
            (rules.name.clone(), aggregate.to_owned(), error.to_owned());
        self.upkeep(move |io| {
            ready(upkeep::record_failure(
                io,
                &source,
                &aggregate,
                &error,
                now_ms,
                (policy, jitter),
            ))
        })
        .await
    }

    async fn event(&self, source: &str, event_id: &str) -> Result<Option<EventRecord>, StoreError> {
        let (source, event_id) = (source.to_owned(), event_id.to_owned());
        self.run(move |conn| {
            let record = conn
                .query_row(
                    &sqlite(&sql::EVENT_BY_ID),
                    params![source, event_id],
                    event_record,
                )
                .optional()
                .map_err(map_err)?;
            let Some(mut record) = record else {
                return Ok(None);
            };
            let mut stmt = conn
                .prepare_cached(&sqlite(sql::ATTEMPT_HISTORY))
                .map_err(map_err)?;
            let history = stmt
                .query_map([record.row], |r| {
                    Ok(AttemptRecord {
                        at_ms: r.get(0)?,
                        kind: r.get(1)?,
                        error: r.get(2)?,
                    })
                })
                .map_err(map_err)?;
            record.history = history.collect::<Result<_, _>>().map_err(map_err)?;
            Ok(Some(record))
        })
        .await
    }

    async fn events(
        &self,
        filter: &EventFilter,
        limit: usize,
        cursor: Option<i64>,
    ) -> Result<EventPage, StoreError> {
        let filter = filter.clone();
        self.run(move |conn| {
            let (mut clauses, mut values) = filter_sql(&filter);
            if let Some(cursor) = cursor {
                values.push(SqlValue::Integer(cursor));
                clauses.push(format!("id < ?{}", values.len()));
            }
            values.push(SqlValue::Integer(limit as i64 + 1));
            let sql = format!(
                "SELECT {EVENT_COLUMNS} FROM events WHERE {} ORDER BY id DESC LIMIT ?{}",
                where_of(&clauses),
                values.len()
            );
            let mut stmt = conn.prepare(&sql).map_err(map_err)?;
            let rows = stmt
                .query_map(params_from_iter(values), event_record)
                .map_err(map_err)?;
            let items: Vec<EventRecord> = rows.collect::<Result<_, _>>().map_err(map_err)?;
            Ok(EventPage::of(items, limit))
        })
        .await
    }

    async fn replay_event(
        &self,
        source: &str,
        event_id: &str,
        now_ms: i64,
    ) -> Result<ReplayOutcome, StoreError> {
        let (source, event_id) = (source.to_owned(), event_id.to_owned());
        self.upkeep(move |io| ready(upkeep::replay_event(io, &source, &event_id, now_ms)))
            .await
    }

    async fn create_replay_job(
        &self,
        filter: &EventFilter,
        now_ms: i64,
    ) -> Result<ReplayJob, StoreError> {
        let filter = filter.clone();
        self.upkeep(move |io| ready(upkeep::create_replay_job(io, &filter, now_ms)))
            .await
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
        self.upkeep_unsynced(move |io| {
            ready(forwarding::claim(
                io,
                &destination,
                &owner,
                (now_ms, lease_until_ms),
                limit,
                &cursors,
            ))
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
        self.upkeep_unsynced(move |io| ready(forwarding::release(io, &owner, &ids, now_ms)))
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
        self.upkeep_unsynced(move |io| {
            ready(forwarding::record_verdict(
                io, id, &owner, &verdict, &attempt, now_ms,
            ))
        })
        .await
    }

    async fn record_delivery_attempts(
        &self,
        owner: &str,
        verdicts: &[PendingVerdict],
    ) -> Result<Vec<bool>, StoreError> {
        let (owner, verdicts) = (owner.to_owned(), verdicts.to_vec());
        self.upkeep_unsynced(move |io| ready(forwarding::record_verdicts(io, &owner, &verdicts)))
            .await
    }

    async fn delivery(
        &self,
        destination: &str,
        id: i64,
    ) -> Result<Option<DeliveryRecord>, StoreError> {
        let destination = destination.to_owned();
        self.upkeep(move |io| ready(forwarding::delivery(io, &destination, id)))
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
        self.upkeep(move |io| {
            ready(forwarding::deliveries(
                io,
                &destination,
                &filter,
                limit,
                cursor,
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
        self.upkeep(move |io| ready(forwarding::replay(io, &destination, id)))
            .await
    }

    async fn skip_delivery(&self, destination: &str, id: i64) -> Result<DeliverySkip, StoreError> {
        let destination = destination.to_owned();
        self.upkeep(move |io| ready(forwarding::skip(io, &destination, id)))
            .await
    }

    async fn create_delivery_replay_job(
        &self,
        destination: &str,
        filter: &DeliveryFilter,
        now_ms: i64,
    ) -> Result<DeliveryReplayJob, StoreError> {
        let (destination, filter) = (destination.to_owned(), filter.clone());
        self.upkeep(move |io| {
            ready(forwarding::create_replay_job(
                io,
                &destination,
                &filter,
                now_ms,
            ))
        })
        .await
    }

    async fn delivery_replay_job(&self, id: i64) -> Result<Option<DeliveryReplayJob>, StoreError> {
        self.upkeep(move |io| ready(forwarding::replay_job(io, id)))
            .await
    }

    async fn advance_delivery_replay_jobs(
        &self,
        now_ms: i64,
        queues: usize,
    ) -> Result<u64, StoreError> {
        self.upkeep(move |io| ready(forwarding::advance_replay_jobs(io, now_ms, queues)))
            .await
    }

    async fn next_delivery_due(
        &self,
        destination: &str,
        now_ms: i64,
    ) -> Result<Option<i64>, StoreError> {
        let destination = destination.to_owned();
        self.upkeep(move |io| ready(forwarding::next_due(io, &destination, now_ms)))
            .await
    }

    async fn destination_stats(&self, destination: &str) -> Result<DestinationStats, StoreError> {
        let destination = destination.to_owned();
        self.read(move |conn| ready(forwarding::stats(&SqliteIo(conn), &destination)))
            .await
    }

    async fn status_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
        self.read(|conn| {
            let mut stmt = conn
                .prepare_cached(
                    // Kept by triggers (migration 2): no scan of the log.
                    "SELECT source, status, n FROM event_counts WHERE n > 0",
                )
                .map_err(map_err)?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                    ))
                })
                .map_err(map_err)?;
            let mut counts = Vec::new();
            for row in rows {
                let (source, status, n) = row.map_err(map_err)?;
                counts.push((source, parse_status(&status)?, n as u64));
            }
            Ok(counts)
        })
        .await
    }

    async fn undecided_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
        let mut counts = self.status_counts().await?;
        counts.retain(|(_, status, _)| status.is_undecided());
        Ok(counts)
    }

    async fn last_change_id(&self) -> Result<i64, StoreError> {
        self.run(|conn| {
            conn.prepare_cached("SELECT COALESCE(MAX(id), 0) FROM state_changes")
                .map_err(map_err)?
                .query_row([], |r| r.get(0))
                .map_err(map_err)
        })
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
        self.run(move |conn| {
            let mut stmt = conn
                .prepare_cached(
                    "SELECT id, source, aggregate, kind, at, state FROM state_changes
                     WHERE id > ?1 AND (?2 IS NULL OR source = ?2)
                       AND (?3 IS NULL OR aggregate = ?3)
                     ORDER BY id LIMIT ?4",
                )
                .map_err(map_err)?;
            let rows = stmt
                .query_map(params![after, source, aggregate, limit as i64], |r| {
                    Ok(StateChange {
                        id: r.get(0)?,
                        source: r.get(1)?,
                        aggregate: r.get(2)?,
                        kind: r.get(3)?,
                        at_ms: r.get(4)?,
                        state: r.get(5)?,
                    })
                })
                .map_err(map_err)?;
            rows.collect::<Result<_, _>>().map_err(map_err)
        })
        .await
    }

    async fn replay_job(&self, id: i64) -> Result<Option<ReplayJob>, StoreError> {
        self.run(move |conn| {
            let row: Option<(String, String, i64, i64, i64, i64)> = conn
                .prepare_cached(&sqlite(sql::REPLAY_JOB))
                .map_err(map_err)?
                .query_row([id], |r| {
                    Ok((
                        r.get(0)?,
                        r.get(1)?,
                        r.get(2)?,
                        r.get(3)?,
                        r.get(4)?,
                        r.get(5)?,
                    ))
                })
                .optional()
                .map_err(map_err)?;
            row.map(
                |(filter, state, total, requeued, created_at_ms, updated_at_ms)| {
                    Ok(ReplayJob {
                        id,
                        filter: serde_json::from_str(&filter).map_err(json_err)?,
                        state,
                        total,
                        requeued,
                        created_at_ms,
                        updated_at_ms,
                    })
                },
            )
            .transpose()
        })
        .await
    }

    async fn advance_replay_jobs(&self, now_ms: i64, aggregates: usize) -> Result<u64, StoreError> {
        self.upkeep(move |io| ready(upkeep::advance_replay_jobs(io, now_ms, aggregates)))
            .await
    }

    async fn purge(
        &self,
        before_ms: i64,
        dedup_until_ms: i64,
        now_ms: i64,
        batch: usize,
    ) -> Result<PurgeReport, StoreError> {
        self.upkeep(move |io| ready(upkeep::purge(io, before_ms, dedup_until_ms, now_ms, batch)))
            .await
    }

    async fn upgrade_step_pending(&self, step: &str) -> Result<bool, StoreError> {
        let step = step.to_owned();
        self.upkeep(move |io| ready(upkeep::upgrade_step_pending(io, &step)))
            .await
    }

    async fn finish_upgrade_step(&self, step: &str) -> Result<(), StoreError> {
        let step = step.to_owned();
        self.upkeep(move |io| ready(upkeep::finish_upgrade_step(io, &step)))
            .await
    }

    async fn prune_headers(
        &self,
        after: i64,
        batch: usize,
        keep: Arc<super::HeaderFilter>,
    ) -> Result<(Option<i64>, u64), StoreError> {
        self.upkeep(move |io| ready(upkeep::prune_headers(io, after, batch, &*keep)))
            .await
    }
}

fn event_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<EventRecord> {
    let status: String = r.get(11)?;
    let dead_reason: Option<String> = r.get(15)?;
    let bad = |what: &str, raw: &str| {
        rusqlite::Error::FromSqlConversionFailure(
            11,
            rusqlite::types::Type::Text,
            format!("unknown {what} {raw:?} in store").into(),
        )
    };
    Ok(EventRecord {
        row: r.get(0)?,
        source: r.get(1)?,
        event_id: r.get(2)?,
        event_type: r.get(3)?,
        aggregate: r.get(4)?,
        sequence: r.get(5)?,
        idempotency_key: r.get(6)?,
        body: r.get(7)?,
        signature_valid: r.get(8)?,
        signed_at: r.get(9)?,
        received_at_ms: r.get(10)?,
        status: EventStatus::parse(&status).ok_or_else(|| bad("status", &status))?,
        attempts: r.get(12)?,
        next_attempt_at_ms: r.get(13)?,
        last_error: r.get(14)?,
        dead_reason: match dead_reason {
            Some(raw) => Some(DeadReason::parse(&raw).ok_or_else(|| bad("dead reason", &raw))?),
            None => None,
        },
        decided_at_ms: r.get(16)?,
        replays: r.get(17)?,
        headers: r.get(18)?,
        history: Vec::new(),
    })
}

/// A filter's conditions with SQLite placeholders and values.
fn filter_sql(filter: &EventFilter) -> (Vec<String>, Vec<SqlValue>) {
    let (clauses, params) = filter::filter_sql(filter, |n| format!("?{n}"));
    (clauses, params.into_iter().map(sql_value).collect())
}

/// A bound value in SQLite's terms (a list of ids as the JSON array `in_ids` reads).
fn sql_value(param: Param) -> SqlValue {
    match param {
        Param::Text(t) => SqlValue::Text(t),
        Param::Int(i) => SqlValue::Integer(i),
        Param::OptText(t) => t.map_or(SqlValue::Null, SqlValue::Text),
        Param::OptInt(i) => i.map_or(SqlValue::Null, SqlValue::Integer),
        Param::Ids(ids) => SqlValue::Text(serde_json::Value::from(ids).to_string()),
        Param::Texts(texts) => SqlValue::Text(serde_json::Value::from(texts).to_string()),
    }
}

fn add_history(
    tx: &Connection,
    row: i64,
    at_ms: i64,
    kind: &str,
    error: Option<&str>,
) -> Result<(), StoreError> {
    tx.prepare_cached(&sqlite(sql::ADD_HISTORY))
        .map_err(map_err)?
        .execute(params![row, at_ms, kind, error])
        .map_err(map_err)?;
    Ok(())
}

/// A duplicate of an event already purged from the log, caught by its kept dedup key.
fn purged_duplicate(tx: &Connection, logged: &EventRow) -> Result<Option<Admission>, StoreError> {
    let found: Option<(String, String)> = tx
        .prepare_cached(&sqlite(sql::PURGED_DUPLICATE))
        .map_err(map_err)?
        .query_row(
            params![
                logged.source,
                logged.event_id,
                logged.idempotency_key,
                logged.received_at,
                logged.body_sha256
            ],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(map_err)?;
    found
        .map(|(kind, original)| {
            Ok(Admission::Duplicate {
                key: DedupKey::of_kept(&kind),
                original: parse_event_id(&original)?,
                body_differs: false,
            })
        })
        .transpose()
}

/// What `logged`, which a unique key kept out of the log, is a duplicate of.
fn find_duplicate(tx: &Connection, logged: &EventRow) -> Result<Admission, StoreError> {
    let source = &logged.source;
    let by_id: Option<(i64, Vec<u8>)> = tx
        .prepare_cached(&sqlite(sql::BODY_BY_EVENT_ID))
        .map_err(map_err)?
        .query_row(params![source, logged.event_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(map_err)?;
    if let Some((row, stored)) = by_id {
        let body_differs = stored != logged.body;
        if body_differs {
            // A publisher error worth a person's look: kept in the original's history, once.
            tx.prepare_cached(&sqlite(sql::ADD_CONFLICT_ONCE))
                .map_err(map_err)?
                .execute(params![
                    row,
                    crate::clock::now_ms(),
                    CONFLICTING_DUPLICATE,
                    CONFLICT_DETAIL
                ])
                .map_err(map_err)?;
        }
        return Ok(Admission::Duplicate {
            key: DedupKey::EventId,
            original: parse_event_id(&logged.event_id)?,
            body_differs,
        });
    }
    let by_key: Option<String> = tx
        .prepare_cached(&sqlite(sql::EVENT_ID_BY_IDEMPOTENCY_KEY))
        .map_err(map_err)?
        .query_row(params![source, logged.idempotency_key], |r| r.get(0))
        .optional()
        .map_err(map_err)?;
    let (key, original) = match by_key {
        Some(original) => (DedupKey::IdempotencyKey, original),
        None => {
            let original: String = tx
                .prepare_cached(&sqlite(sql::EVENT_ID_BY_BODY))
                .map_err(map_err)?
                .query_row(params![source, logged.body_sha256], |r| r.get(0))
                .map_err(map_err)?;
            (DedupKey::Body, original)
        }
    };
    Ok(Admission::Duplicate {
        key,
        original: parse_event_id(&original)?,
        body_differs: false,
    })
}

/// Settles one aggregate inside `tx`, with the one settle flow.
fn settle_tx(
    tx: &Connection,
    rules: &SourceRules,
    aggregate: &str,
    now_ms: i64,
) -> Result<Settled, StoreError> {
    ready(settle::settle(&SqliteIo(tx), rules, aggregate, now_ms))
}

/// An aggregate-state row as read, its state still text.
type AggregateRow = (
    String,
    Option<i64>,
    Option<String>,
    Option<String>,
    String,
    Option<String>,
    Option<i64>,
    i64,
    Option<String>,
);

fn aggregate_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<AggregateRow> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
    ))
}

fn aggregate_state(row: AggregateRow) -> Result<AggregateState, StoreError> {
    let (aggregate, sequence, event_id, event_type, state, tag, watermark, updated_at_ms, gaps) =
        row;
    Ok(AggregateState {
        aggregate,
        sequence,
        event_id,
        event_type,
        state: serde_json::from_str(&state).map_err(json_err)?,
        tag,
        watermark,
        skipped_gaps: gaps,
        updated_at_ms,
    })
}

fn pending_row(r: &rusqlite::Row<'_>, was_held: bool) -> rusqlite::Result<PendingRow> {
    Ok(PendingRow {
        row: r.get(0)?,
        body: r.get(1)?,
        received_at_ms: r.get(2)?,
        replayed: r.get(3)?,
        event_id: r.get(4)?,
        sequence: r.get(5)?,
        event_type: r.get(6)?,
        idempotency_key: r.get(7)?,
        was_held,
        parsed: None,
    })
}

/// Settling's and upkeep's reads and writes over one SQLite transaction.
struct SqliteIo<'a>(&'a Connection);

impl UpkeepIo for SqliteIo<'_> {
    const LOCK_ROWS: &'static str = "";
    const SKIP_LOCKED: &'static str = "";
    const LOCK_KEY: &'static str = "SELECT 1 WHERE $1 IS NOT NULL";
    const COUNTS_BLOCKED_AGGREGATES: bool = true;

    fn in_ids(column: &str, n: usize) -> String {
        format!("{column} IN (SELECT value FROM json_each(${n}))")
    }

    fn try_lock(key: &str) -> String {
        format!("({key}) IS NOT NULL")
    }

    fn source_aggregate_pairs(n: usize, alias: &str) -> String {
        format!(
            "(SELECT s.value AS source, a.value AS aggregate
              FROM json_each(${n}) AS s JOIN json_each(${}) AS a ON a.key = s.key) AS {alias}",
            n + 1
        )
    }

    async fn execute(&self, statement: &str, params: &[Param]) -> Result<u64, StoreError> {
        let values = params.iter().cloned().map(sql_value);
        self.0
            .prepare_cached(&sqlite(statement))
            .map_err(map_err)?
            .execute(params_from_iter(values))
            .map(|changed| changed as u64)
            .map_err(map_err)
    }

    async fn query(&self, statement: &str, params: &[Param]) -> Result<Vec<Vec<Cell>>, StoreError> {
        let values = params.iter().cloned().map(sql_value);
        let mut stmt = self.0.prepare_cached(&sqlite(statement)).map_err(map_err)?;
        let width = stmt.column_count();
        let rows = stmt
            .query_map(params_from_iter(values), |r| {
                (0..width)
                    .map(|at| {
                        Ok(match r.get_ref(at)? {
                            ValueRef::Integer(n) => Cell::Int(n),
                            ValueRef::Text(t) => {
                                Cell::Text(String::from_utf8_lossy(t).into_owned())
                            }
                            ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
                            ValueRef::Null => Cell::Null,
                            other => {
                                return Err(rusqlite::Error::InvalidColumnType(
                                    at,
                                    format!("column {at}"),
                                    other.data_type(),
                                ))
                            }
                        })
                    })
                    .collect::<rusqlite::Result<Vec<Cell>>>()
            })
            .map_err(map_err)?;
        rows.collect::<Result<_, _>>().map_err(map_err)
    }

    async fn wake_workers(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn wake_senders(&self) -> Result<(), StoreError> {
        Ok(())
    }
}

impl SqliteIo<'_> {
    /// Every row a shared statement (`$n` placeholders) returns, mapped by `map`.
    fn all<T, C: FromIterator<T>>(
        &self,
        statement: &str,
        params: impl rusqlite::Params,
        map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    ) -> Result<C, StoreError> {
        let mut stmt = self.0.prepare_cached(&sqlite(statement)).map_err(map_err)?;
        let rows = stmt.query_map(params, map).map_err(map_err)?;
        rows.collect::<rusqlite::Result<C>>().map_err(map_err)
    }

    fn load(&self, source: &str, aggregate: &str) -> Result<Option<AggregateState>, StoreError> {
        let row = self
            .0
            .prepare_cached(&sqlite(sql::LOAD_AGGREGATE))
            .map_err(map_err)?
            .query_row(params![source, aggregate], aggregate_row)
            .optional()
            .map_err(map_err)?;
        row.map(aggregate_state).transpose()
    }
}

impl SettleIo for SqliteIo<'_> {
    async fn load_state(
        &self,
        source: &str,
        aggregate: &str,
    ) -> Result<Option<AggregateState>, StoreError> {
        self.load(source, aggregate)
    }

    async fn arriving_rows(
        &self,
        source: &str,
        aggregate: &str,
        now_ms: i64,
    ) -> Result<Vec<PendingRow>, StoreError> {
        self.all(
            sql::ARRIVING_ROWS,
            params![source, aggregate, now_ms],
            |r| pending_row(r, false),
        )
    }

    async fn held_refs(&self, source: &str, aggregate: &str) -> Result<Vec<HeldRef>, StoreError> {
        self.all(sql::HELD_REFS, params![source, aggregate], |r| {
            Ok(HeldRef {
                sequence: r.get(0)?,
                row: r.get(1)?,
                received_at_ms: r.get(2)?,
            })
        })
    }

    async fn held_rows(&self, held: &[HeldRef]) -> Result<Vec<PendingRow>, StoreError> {
        let mut stmt = self
            .0
            .prepare_cached(&sqlite(sql::PENDING_BY_ID))
            .map_err(map_err)?;
        held.iter()
            .map(|h| {
                stmt.query_row(params![h.row], |r| pending_row(r, true))
                    .map_err(map_err)
            })
            .collect()
    }

    async fn occupied(
        &self,
        source: &str,
        aggregate: &str,
        from: i64,
    ) -> Result<BTreeSet<i64>, StoreError> {
        self.all(sql::OCCUPIED, params![source, aggregate, from], |r| {
            r.get(0)
        })
    }

    async fn save_state(&self, source: &str, state: &AggregateState) -> Result<(), StoreError> {
        self.0
            .prepare_cached(&sqlite(sql::SAVE_AGGREGATE))
            .map_err(map_err)?
            .execute(params![
                source,
                state.aggregate,
                state.sequence,
                state.event_id,
                state.event_type,
                state.state.to_string(),
                state.tag,
                state.watermark,
                state.updated_at_ms,
                state.skipped_gaps
            ])
            .map_err(map_err)?;
        Ok(())
    }

    async fn add_change(
        &self,
        source: &str,
        aggregate: &str,
        kind: &str,
        at_ms: i64,
        state: &str,
    ) -> Result<(), StoreError> {
        self.0
            .prepare_cached(&sqlite(sql::ADD_CHANGE))
            .map_err(map_err)?
            .execute(params![source, aggregate, kind, at_ms, state])
            .map_err(map_err)?;
        Ok(())
    }

    async fn record_decisions(
        &self,
        decisions: &[(i64, Outcome)],
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> Result<(), StoreError> {
        for (row, outcome) in decisions {
            record_decision(self.0, *row, outcome, now_ms, hold_timeout_ms)?;
        }
        Ok(())
    }
}

fn record_decision(
    tx: &Connection,
    row: i64,
    outcome: &Outcome,
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Result<(), StoreError> {
    let (status, reason) = status_of(outcome);
    if *outcome == Outcome::Held {
        // Due again when the hold window of this event ends.
        tx.prepare_cached(
            "UPDATE events SET status = 'held', next_attempt_at = received_at + ?2
             WHERE id = ?1 AND status <> 'held'",
        )
        .map_err(map_err)?
        .execute(params![row, hold_timeout_ms])
        .map_err(map_err)?;
        return Ok(());
    }
    let detail = match outcome {
        Outcome::Dead { detail, .. } => Some(detail.as_str()),
        _ => None,
    };
    if let (Some(reason), Some(detail)) = (reason, detail) {
        add_history(tx, row, now_ms, reason.as_str(), Some(detail))?;
    }
    tx.prepare_cached(RECORD_DECISION)
        .map_err(map_err)?
        .execute(params![
            row,
            status.as_str(),
            reason.map(DeadReason::as_str),
            detail,
            now_ms
        ])
        .map_err(map_err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::IngestLimits;

    #[test]
    fn a_statement_is_rewritten_by_its_text_wherever_it_lies() {
        assert_eq!(&*sqlite(sql::PING), sql::PING.replace('$', "?"));
        // Built statements of one length in one reused buffer: each is its own.
        let mut built = String::with_capacity(64);
        for n in 1..=3 {
            built.clear();
            built.push_str(&format!("SELECT ${n}"));
            assert_eq!(&*sqlite(&built), format!("SELECT ?{n}"));
        }
    }

    /// A store migrated to the latest schema, in a directory removed when it is dropped.
    async fn migrated_store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let store =
            SqliteStore::open(&dir.path().join("inhook.db"), Duration::from_secs(1)).unwrap();
        store.migrate().await.unwrap();
        (dir, store)
    }

    /// The plan SQLite picks for `statement` on a migrated store without statistics, as
    /// every SQLite store runs (nothing here runs `ANALYZE`).
    fn plan(conn: &Connection, statement: &str, params: impl rusqlite::Params) -> String {
        let mut stmt = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", sqlite(statement)))
            .unwrap();
        let rows = stmt.query_map(params, |r| r.get::<_, String>(3)).unwrap();
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .unwrap()
            .join("; ")
    }

    /// Settling an aggregate reads its undecided rows, never its decided history: each of
    /// the settle's reads seeks an index that holds only what it needs.
    #[tokio::test]
    async fn settle_reads_seek_indexes_of_undecided_rows() {
        let (_dir, store) = migrated_store().await;
        let conn = store.conn.lock().await;
        let (source, aggregate) = ("save-game", "p\u{1f}slot");
        let held = plan(&conn, sql::HELD_REFS, params![source, aggregate]);
        let arriving = plan(&conn, sql::ARRIVING_ROWS, params![source, aggregate, 7]);
        let occupied = plan(&conn, sql::OCCUPIED, params![source, aggregate, 7]);
        for (plan, seek) in [
            (held, "INDEX events_held (source=? AND aggregate=?)"),
            (arriving, "INDEX events_arriving (source=? AND aggregate=?)"),
            (
                occupied,
                "INDEX events_aggregate (source=? AND aggregate=? AND sequence>?)",
            ),
        ] {
            assert!(
                plan.starts_with("SEARCH events USING") && plan.contains(seek),
                "planned as: {plan}"
            );
        }
        let due = plan(&conn, sql::DUE_AGGREGATES, params![7, 32]);
        assert!(
            due.starts_with("SEARCH events USING")
                && due.contains("INDEX events_pending (status=?)"),
            "due aggregates planned as: {due}"
        );
    }

    /// A batch job for `aggregate` under `max_backlog`, and where its answer arrives.
    fn job(
        aggregate: &str,
        max_backlog: u64,
    ) -> (
        IngestJob,
        tokio::sync::oneshot::Receiver<Result<Admission, StoreError>>,
    ) {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let row = EventRow {
            source: "save-game".into(),
            event_id: format!("evt-{aggregate}"),
            event_type: "save.delta".into(),
            aggregate: aggregate.into(),
            sequence: 1,
            idempotency_key: None,
            body: b"{}".to_vec(),
            headers: None,
            body_sha256: None,
            received_at: 1_000,
            signed_at: None,
            limits: IngestLimits {
                max_backlog,
                ..IngestLimits::NONE
            },
            may_hold: false,
            ignored: false,
            parsed: None,
        };
        let job = IngestJob {
            row,
            rules: None,
            reply,
        };
        (job, answer)
    }

    fn logged(conn: &Connection) -> Vec<String> {
        let mut stmt = conn
            .prepare("SELECT aggregate FROM events ORDER BY id")
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    /// A batch with a refused delivery in the middle logs the others, in order, and
    /// leaves nothing of the refused one, as if each had its own savepoint from the start;
    /// the next batch, with no refusal, is logged whole.
    #[tokio::test]
    async fn a_refusal_in_a_batch_costs_the_others_nothing() {
        let (_dir, store) = migrated_store().await;
        let mut conn = store.conn.lock().await;
        let (jobs, mut answers): (Vec<_>, Vec<_>) = [("a", u64::MAX), ("b", 1), ("c", u64::MAX)]
            .into_iter()
            .map(|(aggregate, max_backlog)| job(aggregate, max_backlog))
            .unzip();
        commit_batch(&mut conn, jobs);
        let answers: Vec<Admission> = answers
            .iter_mut()
            .map(|a| a.try_recv().unwrap().unwrap())
            .collect();
        assert!(
            matches!(answers[0], Admission::Logged { .. }),
            "{answers:?}"
        );
        assert_eq!(answers[1], Admission::Refused(Refusal::BacklogFull));
        assert!(
            matches!(answers[2], Admission::Logged { .. }),
            "{answers:?}"
        );
        assert_eq!(logged(&conn), ["a", "c"]);
        let counted: i64 = conn
            .query_row(
                "SELECT n FROM event_counts WHERE source = 'save-game' AND status = 'received'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(counted, 2, "the counts saw no trace of the refusal");

        let (jobs, mut answers): (Vec<_>, Vec<_>) =
            ["d", "e"].into_iter().map(|a| job(a, u64::MAX)).unzip();
        commit_batch(&mut conn, jobs);
        for answer in &mut answers {
            assert!(matches!(
                answer.try_recv().unwrap().unwrap(),
                Admission::Logged { .. }
            ));
        }
        assert_eq!(logged(&conn), ["a", "c", "d", "e"]);
    }

    /// Logging an event, checking the backlog and recording a decision build no temporary
    /// b-tree: SQLite builds one for a constant IN list of three or more terms at every
    /// statement, partial index conditions included, and 13 of them per event were a
    /// quarter of the instructions of ingesting and deciding it (migration 10).
    #[tokio::test]
    async fn logging_and_deciding_an_event_build_no_temporary_btree() {
        let (_dir, store) = migrated_store().await;
        let conn = store.conn.lock().await;
        for statement in [LOG_EVENT, BACKLOG, RECORD_DECISION] {
            let mut stmt = conn.prepare(&format!("EXPLAIN {statement}")).unwrap();
            // Unbound parameters are NULL: EXPLAIN only lists the program.
            let mut rows = stmt.raw_query();
            let mut opcodes = Vec::new();
            while let Some(row) = rows.next().unwrap() {
                opcodes.push(row.get::<_, String>(1).unwrap());
            }
            assert!(opcodes.len() > 10, "{statement}: {opcodes:?}");
            assert!(
                !opcodes.iter().any(|op| op == "OpenEphemeral"),
                "a temporary b-tree in {statement}"
            );
        }
    }
}
