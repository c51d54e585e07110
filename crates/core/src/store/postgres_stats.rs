//! The planner's statistics of PostgreSQL's tables, kept fresh as they grow.
//!
//! Every statement goes through the connection's statement cache, and PostgreSQL plans a
//! cached statement once for good (a generic plan, after five custom ones) until the table's
//! statistics change. Planned against a table of a few rows, that plan scans: a settle's
//! `UPDATE … FROM UNNEST(…)` read the whole event log by a sequential scan and the
//! occupied-sequence query walked every event of the source, for as long as the connection
//! lived, so that each event cost more than the one before (docs/benchmarks.md, issue #45).
//! Autovacuum's analyze replans them as tables grow, but it may be off (or behind), so each
//! node analyzes, one node at a time, every table that has grown past its last statistics
//! by as many rows again ([`GROWN`]); that invalidates the cached plans, which are made
//! again against the table as it is.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use deadpool_postgres::{Pool, Timeouts};

/// Advisory lock key of the node analyzing: one at a time, the others skip their turn.
const ANALYZE_LOCK: i64 = 0x696e_686f_6f61;

/// How often a node looks at the tables' growth.
const EVERY: Duration = Duration::from_secs(1);

/// The tables written or read on every event's path (their statistics pick its plans), that
/// have been modified since their last analyze by more rows than they hold now plus
/// [`AT_LEAST`]: a table is analyzed each time it doubles, so the count stays logarithmic
/// while plans never lag a table by more than a factor of two.
const GROWN: &str = "SELECT format('ANALYZE %I.%I', schemaname, relname)
     FROM pg_stat_user_tables
     WHERE schemaname = current_schema()
       AND n_mod_since_analyze > $1 + GREATEST(n_live_tup, 0)
     ORDER BY relname";

/// Modified rows below which no table is analyzed: plans over a few hundred rows cost
/// little whichever they are.
const AT_LEAST: i64 = 1000;

/// When the node last looked, in milliseconds of its clock (0: never).
#[derive(Debug, Default)]
pub(crate) struct StatsTender {
    last_ms: AtomicI64,
}

impl StatsTender {
    /// Starts a look at the tables' growth if none was started in the last [`EVERY`]: at
    /// most one task a second, whatever the number of callers. Called on the way to a
    /// connection; the look itself runs on a connection of its own, in the background.
    pub(crate) fn tend(&self, pool: &Pool) {
        let now = crate::domain::clock::now_ms();
        let last = self.last_ms.load(Ordering::Relaxed);
        if now - last < EVERY.as_millis() as i64 {
            return;
        }
        if self
            .last_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let pool = pool.clone();
        tokio::spawn(async move {
            if let Err(err) = analyze_grown(&pool).await {
                // A lock held by autovacuum or another node's analyze: the next look retries.
                tracing::debug!(error = %err, "analyzing grown tables");
            }
        });
    }
}

/// Analyzes every grown table, unless another node is doing so now. Only with a connection
/// to spare, taken without waiting: a request never waits for the look.
async fn analyze_grown(pool: &Pool) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    if pool.status().available < 2 {
        return Ok(());
    }
    let spare = Timeouts {
        wait: Some(Duration::ZERO),
        create: Some(Duration::from_secs(1)),
        recycle: Some(Duration::from_secs(1)),
    };
    let mut client = pool.timeout_get(&spare).await?;
    let tx = client.transaction().await?;
    let mine: bool = tx
        .query_one("SELECT pg_try_advisory_xact_lock($1)", &[&ANALYZE_LOCK])
        .await?
        .get(0);
    if !mine {
        return Ok(());
    }
    let grown = tx.query(GROWN, &[&AT_LEAST]).await?;
    for row in grown {
        let analyze: String = row.get(0);
        tx.batch_execute(&analyze).await?;
    }
    tx.commit().await?;
    Ok(())
}
