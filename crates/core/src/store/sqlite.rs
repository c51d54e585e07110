//! The embedded SQLite store: WAL journal, `synchronous = FULL` so that a
//! commit is on disk before inhook answers (G2).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{params, params_from_iter, Connection, ErrorCode};
use send_wrapper::SendWrapper;

use super::backend::Param;
use super::backend::{Backend, Cell, Commit, FlowFuture, Scrub, Tx};
use super::backend::{ChangeRow, StateRow};
use super::batch::BatchQueue;
use super::engine::SqlStore;
use super::ingest::{self, Guard};
use super::migrations::{self, SQLITE as MIGRATIONS};
use super::sql;
use super::vault::Vault;
use super::Failure;
use super::{status_of, Admission, EventRow, SettleAt, SourceRules, StoreError};
use crate::domain::ordering::Outcome;
use crate::domain::DeadReason;

/// The SQLite store: the one store over [`Sqlite`].
pub type SqliteStore = SqlStore<Sqlite>;

/// The SQLite database. One connection behind a mutex: SQLite has one writer at a
/// time anyway, and every call runs on the blocking pool, never on a runtime thread.
/// Deliveries are group-committed: concurrent ingests share one transaction and
/// one fsync, each answered only after the commit ([`commit_batch`]).
#[derive(Clone)]
pub struct Sqlite {
    /// The one connection, taken in turn (FIFO): with an unfair lock, a flat-out ingest's
    /// stream of committers starved every other user (forwarding ran at 8 deliveries/s).
    conn: Arc<tokio::sync::Mutex<Connection>>,
    /// A read-only connection for what operators poll (counts, `/readyz`): in WAL mode it
    /// reads the last commit without waiting for the writer, and the writer never waits
    /// for it, however many scrapers poll.
    reader: Arc<tokio::sync::Mutex<Connection>>,
    queue: Arc<BatchQueue<IngestJob>>,
    group_commit: bool,
    /// The store's keys (docs/encryption.md).
    vault: Arc<Vault>,
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
fn commit_batch(conn: &mut Connection, vault: &Vault, batch: Vec<IngestJob>) {
    if batch.is_empty() {
        return;
    }
    let answers = match log_batch_whole(conn, vault, &batch) {
        Ok(Some(admissions)) => Ok(admissions.into_iter().map(Ok).collect()),
        Ok(None) => log_batch_each(conn, vault, &batch),
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

/// A write transaction that takes the file's write lock at once (`BEGIN IMMEDIATE`):
/// with another process writing the same file (a command beside the server), a deferred
/// one that read first could not take the lock later and would fail at once with
/// `database is locked`, instead of waiting `busy_timeout` for it.
fn begin_write(conn: &mut Connection) -> Result<rusqlite::Transaction<'_>, StoreError> {
    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
        .map_err(map_err)
}

/// Logs and commits every delivery of `batch` in one transaction with no savepoints;
/// `None` (and nothing written) when one of them is refused or fails.
fn log_batch_whole(
    conn: &mut Connection,
    vault: &Vault,
    batch: &[IngestJob],
) -> Result<Option<Vec<Admission>>, StoreError> {
    let tx = begin_write(conn)?;
    let mut admissions = Vec::with_capacity(batch.len());
    for job in batch {
        match ingest_one(&tx, vault, job, Guard::Batch) {
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
    vault: &Vault,
    batch: &[IngestJob],
) -> Result<Vec<Result<Admission, StoreError>>, StoreError> {
    let mut tx = begin_write(conn)?;
    let mut answers = Vec::with_capacity(batch.len());
    for job in batch {
        answers.push(tx.savepoint().map_err(map_err).and_then(|sp| {
            let admission = ingest_one(&sp, vault, job, Guard::Savepoints)?;
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

/// Records a decided event's outcome.
const RECORD_DECISION: &str =
    "UPDATE events SET status = ?2, dead_reason = ?3, last_error = ?4, decided_at = ?5,
         attempts = attempts + 1, next_attempt_at = NULL
     WHERE id = ?1";

/// Logs one delivery (and settles it in sync mode) inside the caller's transaction.
fn ingest_one(
    conn: &Connection,
    vault: &Vault,
    job: &IngestJob,
    guard: Guard,
) -> Result<Admission, StoreError> {
    let settle = match &job.rules {
        Some((rules, true)) => SettleAt::IfReady(rules),
        Some((rules, false)) => SettleAt::Ingest(rules),
        None => SettleAt::Worker,
    };
    ready(ingest::log_one(
        &SqliteIo::of(conn, vault),
        &job.row,
        settle,
        guard,
    ))
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
        Err(e) => Err(StoreError::Unavailable(
            (format!("cannot create the database file {}: {e}", path.display())).into(),
        )),
    }
}

/// Zeroes whatever the connection deletes, overwrites or moves, from now on: a cell
/// freed in a page, a page freed whole, an overflow page (docs/encryption.md, erasure).
/// Without it, every row an update rewrote (an event decided, a state replaced, a key
/// row moved by a page split) left its old copy in the file until the space was reused,
/// and an erasure could not reach them. Its cost on ingest is in docs/benchmarks.md.
fn secure_delete(conn: &Connection) -> Result<(), StoreError> {
    conn.pragma_update(None, "secure_delete", "ON")
        .map_err(map_err)?;
    let on: i64 = conn
        .query_row("PRAGMA secure_delete", [], |r| r.get(0))
        .map_err(map_err)?;
    if on != 1 {
        return Err(StoreError::Internal(
            "SQLite refused PRAGMA secure_delete = ON".into(),
        ));
    }
    Ok(())
}

/// Times a truncating checkpoint is tried before an erasure reports the WAL untouched:
/// a reader in the middle of a snapshot (a scrape, another process) holds it back, each
/// try waiting for it up to the busy timeout.
const CHECKPOINT_TRIES: usize = 3;

/// Copies the write-ahead log into the database and truncates it to nothing, so that no
/// older page image (what an erasure or a rekey just overwrote) is left in it; waits
/// out the readers that hold it back (the busy timeout each try, then a short pause).
fn checkpoint_truncate(conn: &Connection) -> Result<(), StoreError> {
    for _ in 0..CHECKPOINT_TRIES {
        // (busy, frames in the log, frames checkpointed); busy = 1: a reader or writer
        // kept it from finishing, and the log was left as it was.
        let busy: i64 = conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .map_err(map_err)?;
        if busy == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(StoreError::Unavailable(
        "the write-ahead log could not be checkpointed: a reader held it throughout".into(),
    ))
}

/// Rewrites the whole file (`VACUUM`, under `secure_delete`): nothing deleted before is
/// left in it, whichever release deleted it. The one-time scrub of a store written by a
/// release without `secure_delete` is done by it.
fn vacuum(conn: &Connection) -> Result<(), StoreError> {
    conn.execute_batch("VACUUM").map_err(map_err)?;
    conn.prepare_cached(&sqlite(sql::FINISH_UPGRADE_STEP))
        .map_err(map_err)?
        .execute(params![super::SCRUB_STEP])
        .map_err(map_err)?;
    Ok(())
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
        secure_delete(&conn)?;
        let reader = Connection::open_with_flags(
            path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(map_err)?;
        reader.busy_timeout(busy_timeout).map_err(map_err)?;
        secure_delete(&reader)?;
        Ok(SqlStore::over(Sqlite {
            conn: Arc::new(tokio::sync::Mutex::new(conn)),
            reader: Arc::new(tokio::sync::Mutex::new(reader)),
            queue: Arc::default(),
            group_commit: true,
            vault: Arc::default(),
        }))
    }

    /// Commits each delivery in a transaction of its own (one fsync per request), as a
    /// naive receiver would: the baseline that benchmarks compare group commit against.
    pub fn without_group_commit(mut self) -> Self {
        self.backend.group_commit = false;
        self
    }
}

impl Sqlite {
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
                commit_batch(&mut conn, &this.vault, batch);
            } else {
                for job in batch {
                    commit_batch(&mut conn, &this.vault, vec![job]);
                }
            }
        });
    }

    /// Runs `f` on the read-only connection, in one read transaction (one snapshot).
    async fn read_snapshot<T, F>(&self, f: F) -> Result<T, StoreError>
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
        .map_err(|e| StoreError::Internal(Failure::caused(format!("store task failed: {e}"), e)))?
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
        .map_err(|e| StoreError::Internal(Failure::caused(format!("store task failed: {e}"), e)))?
    }
}

/// Runs `step` in a transaction of its own on `conn`.
fn in_transaction<T>(
    conn: &mut Connection,
    vault: &Vault,
    step: impl FnOnce(&SqliteIo<'_>) -> Result<T, StoreError>,
) -> Result<T, StoreError> {
    let tx = begin_write(conn)?;
    let done = step(&SqliteIo::of(&tx, vault))?;
    tx.commit().map_err(map_err)?;
    Ok(done)
}

impl Backend for Sqlite {
    type Tx<'t> = SqliteIo<'t>;

    fn vault(&self) -> &Arc<Vault> {
        &self.vault
    }

    fn with_vault(mut self, vault: Arc<Vault>) -> Self {
        self.vault = vault;
        self
    }

    fn write<T, F>(
        &self,
        commit: Commit,
        flow: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t SqliteIo<'t>) -> FlowFuture<'t, T> + Send + 'static,
    {
        let vault = Arc::clone(&self.vault);
        self.run(move |conn| {
            if commit == Commit::Durable {
                return in_transaction(conn, &vault, |io| ready(flow(io)));
            }
            // Forwarding's bookkeeping does not wait for the disk ([`Commit::Relaxed`]):
            // two fsyncs per delivery were what held forwarding's throughput down, and
            // the next durable commit syncs it too.
            conn.pragma_update(None, "synchronous", "NORMAL")
                .map_err(map_err)?;
            let done = in_transaction(conn, &vault, |io| ready(flow(io)));
            conn.pragma_update(None, "synchronous", "FULL")
                .map_err(map_err)?;
            done
        })
    }

    fn read<T, F>(&self, flow: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t SqliteIo<'t>) -> FlowFuture<'t, T> + Send + 'static,
    {
        let vault = Arc::clone(&self.vault);
        self.run(move |conn| ready(flow(&SqliteIo::of(conn, &vault))))
    }

    fn read_aside<T, F>(&self, flow: F) -> impl Future<Output = Result<T, StoreError>> + Send
    where
        T: Send + 'static,
        F: for<'t> FnOnce(&'t SqliteIo<'t>) -> FlowFuture<'t, T> + Send + 'static,
    {
        let vault = Arc::clone(&self.vault);
        self.read_snapshot(move |conn| ready(flow(&SqliteIo::of(conn, &vault))))
    }

    fn compact(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.run(|conn| {
            vacuum(conn)?;
            checkpoint_truncate(conn)
        })
    }

    fn scrub(&self, _after: Scrub) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.run(|conn| {
            // A store written by a release without `secure_delete` still holds, in freed
            // cells and pages, what that release deleted or moved (migration 18 queued
            // this): the first erasure or rekey since rewrites the file, once.
            let pending = conn
                .prepare_cached(&sqlite(sql::UPGRADE_STEP_PENDING))
                .map_err(map_err)?
                .exists(params![super::SCRUB_STEP])
                .map_err(map_err)?;
            if pending {
                let started = std::time::Instant::now();
                vacuum(conn)?;
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "the database file was rewritten once, to scrub what releases without \
                     secure_delete left in it"
                );
            }
            checkpoint_truncate(conn)
        })
    }

    fn migrate(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.run(|conn| {
            let tx = begin_write(conn)?;
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
            if current > migrations::latest(MIGRATIONS) {
                let release = tx
                    .query_row(&sqlite(sql::WRITTEN_BY), params![current], |r| {
                        r.get::<_, Option<String>>(0)
                    })
                    .ok()
                    .flatten();
                return Err(migrations::newer_schema(current, release, MIGRATIONS));
            }
            for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
                tx.execute_batch(sql).map_err(map_err)?;
                tx.prepare_cached(&sqlite(sql::RECORD_MIGRATION))
                    .map_err(map_err)?
                    .execute(params![version, crate::domain::clock::now_ms()])
                    .map_err(map_err)?;
            }
            if current < migrations::latest(MIGRATIONS) {
                tx.prepare_cached(&sqlite(sql::RECORD_RELEASE))
                    .map_err(map_err)?
                    .execute(params![migrations::RELEASE, current])
                    .map_err(map_err)?;
            }
            if current == 0 {
                // A new store: every connection has had `secure_delete` on from the start,
                // so there is nothing for the scrub of older stores to do.
                tx.prepare_cached(&sqlite(sql::FINISH_UPGRADE_STEP))
                    .map_err(map_err)?
                    .execute(params![super::SCRUB_STEP])
                    .map_err(map_err)?;
            }
            tx.commit().map_err(map_err)
        })
    }

    async fn ingest<'a>(
        &'a self,
        row: EventRow,
        settle: SettleAt<'a>,
    ) -> Result<Admission, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = IngestJob {
            row,
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
    let transient = matches!(
        err.sqlite_error_code(),
        Some(
            ErrorCode::DatabaseBusy
                | ErrorCode::DatabaseLocked
                | ErrorCode::CannotOpen
                | ErrorCode::DiskFull
                | ErrorCode::SystemIoFailure
                | ErrorCode::ReadOnly
                | ErrorCode::OutOfMemory,
        )
    );
    let failure = Failure::caused(err.to_string(), err);
    if transient {
        StoreError::Unavailable(failure)
    } else {
        StoreError::Internal(failure)
    }
}

/// A bound value in SQLite's terms, borrowed where SQLite can read it in place (a list
/// of ids or texts as the JSON array `in_ids` and `source_aggregate_pairs` read).
impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        fn text(t: &str) -> ToSqlOutput<'_> {
            ToSqlOutput::Borrowed(ValueRef::Text(t.as_bytes()))
        }
        Ok(match self {
            Param::Text(t) => text(t),
            Param::Int(i) => ToSqlOutput::Owned(SqlValue::Integer(*i)),
            Param::OptText(t) => t
                .as_deref()
                .map_or(ToSqlOutput::Owned(SqlValue::Null), text),
            Param::OptInt(i) => ToSqlOutput::Owned(i.map_or(SqlValue::Null, SqlValue::Integer)),
            Param::Bytes(b) => ToSqlOutput::Borrowed(ValueRef::Blob(b)),
            Param::Ids(ids) => ToSqlOutput::Owned(SqlValue::Text(
                serde_json::Value::from(&ids[..]).to_string(),
            )),
            Param::Texts(texts) => ToSqlOutput::Owned(SqlValue::Text(
                serde_json::Value::from(&texts[..]).to_string(),
            )),
        })
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

/// The flows' statements over one SQLite transaction. SQLite's statements never wait,
/// so each future is ready at once and the flow completes on the thread that began it
/// ([`ready`]); the wrapper makes that checked, since a connection is not `Sync`.
pub struct SqliteIo<'a> {
    conn: SendWrapper<&'a Connection>,
    vault: &'a Vault,
}

impl<'a> SqliteIo<'a> {
    fn of(conn: &'a Connection, vault: &'a Vault) -> Self {
        Self {
            conn: SendWrapper::new(conn),
            vault,
        }
    }

    fn conn(&self) -> &'a Connection {
        *self.conn
    }

    fn execute_now(&self, statement: &str, params: &[Param<'_>]) -> Result<u64, StoreError> {
        self.conn()
            .prepare_cached(&sqlite(statement))
            .map_err(map_err)?
            .execute(params_from_iter(params))
            .map(|changed| changed as u64)
            .map_err(map_err)
    }

    fn query_now(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> Result<Vec<Vec<Cell>>, StoreError> {
        let mut stmt = self
            .conn()
            .prepare_cached(&sqlite(statement))
            .map_err(map_err)?;
        let width = stmt.column_count();
        let rows = stmt
            .query_map(params_from_iter(params), |r| {
                (0..width)
                    .map(|at| {
                        Ok(match r.get_ref(at)? {
                            ValueRef::Integer(n) => Cell::Int(n),
                            // `from_utf8` checks a word at a time; the lossy walk,
                            // byte by byte, showed in the instruction counts.
                            ValueRef::Text(t) => Cell::Text(match std::str::from_utf8(t) {
                                Ok(text) => text.to_owned(),
                                Err(_) => String::from_utf8_lossy(t).into_owned(),
                            }),
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
}

impl Tx for SqliteIo<'_> {
    const LOCK_ROWS: &'static str = "";
    const SKIP_LOCKED: &'static str = "";
    const LOCK_KEY: &'static str = "SELECT 1 WHERE $1 IS NOT NULL";
    const COUNTS_BLOCKED_AGGREGATES: bool = true;
    // Kept by triggers (migration 2): no scan of the log.
    const STATUS_COUNTS: &'static str = "SELECT source, status, n FROM event_counts WHERE n > 0";
    const UNDECIDED_COUNTS: &'static str = "SELECT source, status, n FROM event_counts
         WHERE n > 0 AND status IN ('received', 'held', 'retrying')";
    // `+status`: the source's few rows are filtered, not looked up through a temporary
    // b-tree of the three statuses built at every delivery.
    const BACKLOG: &'static str = "SELECT COALESCE(SUM(n), 0) FROM event_counts
         WHERE source = $1 AND (+status = 'received' OR +status = 'held' OR +status = 'retrying')";

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

    fn execute(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send {
        std::future::ready(self.execute_now(statement, params))
    }

    fn query(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Vec<Vec<Cell>>, StoreError>> + Send {
        std::future::ready(self.query_now(statement, params))
    }

    fn insert_row(
        &self,
        statement: &str,
        params: &[Param<'_>],
    ) -> impl Future<Output = Result<Option<i64>, StoreError>> + Send {
        // Not `RETURNING`: SQLite buffers its rows in a temporary b-tree at every insert.
        let inserted = self.execute_now(statement, params);
        std::future::ready(inserted.map(|n| (n > 0).then(|| self.conn().last_insert_rowid())))
    }

    fn lock_aggregates(
        &self,
        _aggregates: &[(&str, &str)],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        // The one writer holds every aggregate already.
        std::future::ready(Ok(()))
    }

    fn fold_event_counts(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        // The triggers keep the counts themselves: no deltas to fold.
        std::future::ready(Ok(()))
    }

    fn fold_delivery_counts(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn record_decisions(
        &self,
        decisions: &[(i64, Outcome)],
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let conn = self.conn();
        let recorded = decisions.iter().try_for_each(|(row, outcome)| {
            record_decision(conn, *row, outcome, now_ms, hold_timeout_ms)
        });
        std::future::ready(recorded)
    }

    fn save_states(
        &self,
        states: &[StateRow],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        // Row by row: SQLite's cost is the b-tree writes, which a multi-row statement keeps.
        let saved = states.iter().try_for_each(|state| {
            self.execute_now(sql::SAVE_AGGREGATE, &state.params())
                .map(drop)
        });
        std::future::ready(saved)
    }

    fn add_changes(
        &self,
        changes: &[ChangeRow],
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        let added = changes.iter().try_for_each(|change| {
            self.execute_now(sql::ADD_CHANGE, &change.params())
                .map(drop)
        });
        std::future::ready(added)
    }

    fn wake_workers(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn wake_senders(&self) -> impl Future<Output = Result<(), StoreError>> + Send {
        std::future::ready(Ok(()))
    }

    fn vault(&self) -> &Vault {
        self.vault
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
    use crate::store::{IngestLimits, Refusal, Upkeep};

    #[test]
    fn a_database_error_keeps_its_cause() {
        use std::error::Error;
        let err = map_err(rusqlite::Error::QueryReturnedNoRows);
        assert!(matches!(err, StoreError::Internal(_)));
        let cause = err.source().expect("the rusqlite error as its source");
        assert!(cause.downcast_ref::<rusqlite::Error>().is_some());
        assert_eq!(err.to_string(), format!("store error: {cause}"));
    }

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

    /// Every connection zeroes what it frees, from the start; a new store has nothing
    /// for the scrub of older stores to do, and records the release that wrote it.
    #[tokio::test]
    async fn a_new_store_deletes_securely_and_needs_no_scrub() {
        let (_dir, store) = migrated_store().await;
        for conn in [&store.backend.conn, &store.backend.reader] {
            let conn = conn.lock().await;
            let on: i64 = conn
                .query_row("PRAGMA secure_delete", [], |r| r.get(0))
                .unwrap();
            assert_eq!(on, 1);
        }
        let conn = store.backend.conn.lock().await;
        let pending: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM pending_upgrade_steps WHERE step = ?1",
                [crate::store::SCRUB_STEP],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(pending, 0);
        let release: String = conn
            .query_row(
                "SELECT release FROM schema_migrations WHERE version = 18",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(release, env!("CARGO_PKG_VERSION"));
    }

    /// A store written by a release without `secure_delete` (schema 15 and older) gets
    /// the one-time scrub queued; the first scrub rewrites the file and drops it.
    #[tokio::test]
    async fn an_older_store_is_scrubbed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inhook.db");
        {
            // Schema 15 as the previous release left it.
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE schema_migrations (
                     version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)",
            )
            .unwrap();
            for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v <= 15) {
                conn.execute_batch(sql).unwrap();
                conn.execute(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, 0)",
                    [version],
                )
                .unwrap();
            }
        }
        let store = SqliteStore::open(&path, Duration::from_secs(1)).unwrap();
        store.migrate().await.unwrap();
        let pending = || async {
            let conn = store.backend.conn.lock().await;
            conn.query_row(
                "SELECT COUNT(*) FROM pending_upgrade_steps WHERE step = ?1",
                [crate::store::SCRUB_STEP],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
        };
        assert_eq!(pending().await, 1);
        store
            .backend
            .scrub(Scrub::Erasure {
                data_key_destroyed: false,
            })
            .await
            .unwrap();
        assert_eq!(pending().await, 0);
        let conn = store.backend.conn.lock().await;
        let releases: Vec<(i64, Option<String>)> = conn
            .prepare("SELECT version, release FROM schema_migrations WHERE version >= 15")
            .unwrap()
            .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        // Every version from 16 on, up to the last, was applied by this release.
        let expected: Vec<(i64, Option<String>)> = std::iter::once((15, None))
            .chain(
                (16..=crate::store::SCHEMA_VERSION)
                    .map(|v| (v, Some(env!("CARGO_PKG_VERSION").to_owned()))),
            )
            .collect();
        assert_eq!(
            releases, expected,
            "only the versions this release applied name it"
        );
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
        let conn = store.backend.conn.lock().await;
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
            unordered: None,
            parsed: None,
            sealed: None,
            search: Vec::new(),
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
        let mut conn = store.backend.conn.lock().await;
        let (jobs, mut answers): (Vec<_>, Vec<_>) = [("a", u64::MAX), ("b", 1), ("c", u64::MAX)]
            .into_iter()
            .map(|(aggregate, max_backlog)| job(aggregate, max_backlog))
            .unzip();
        commit_batch(&mut conn, &Vault::default(), jobs);
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
        commit_batch(&mut conn, &Vault::default(), jobs);
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
        let conn = store.backend.conn.lock().await;
        let backlog = <SqliteIo as Tx>::BACKLOG;
        for statement in [ingest::LOG_EVENT, backlog, RECORD_DECISION] {
            let mut stmt = conn
                .prepare(&format!("EXPLAIN {}", sqlite(statement)))
                .unwrap();
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
