//! The one runner of bulk replays, of events (docs/api.md, replay) and of a
//! destination's deliveries (docs/forwarding.md): a job walks the
//! aggregates its filter matches in `(source, aggregate)` order, a few per step,
//! keeping its cursor in its row, so that a step is one short transaction, a node
//! that dies mid-job leaves it resumable, and two nodes never advance one job at once.

use std::future::Future;

use super::backend::{int, opt_string, string, text, Param, Tx};
use super::filter::where_of;
use super::StoreError;

/// One kind of bulk replay: where its jobs are kept, which rows it walks and how it
/// replays one aggregate of them.
pub(crate) trait BulkJob: Sized + Send + Sync {
    /// The table of the jobs: `id`, `state`, `requeued`, `updated_at` and the cursor
    /// columns `cursor_source`, `cursor_aggregate`.
    const JOBS: &'static str;
    /// The table whose `(source, aggregate)` pairs the job walks.
    const ROWS: &'static str;
    /// Whether a step that requeued rows wakes the workers (events are theirs to apply).
    const WAKES_WORKERS: bool;

    /// The running job `id` as its step needs it.
    fn load<I: Tx>(
        io: &I,
        id: i64,
    ) -> impl Future<Output = Result<Option<Self>, StoreError>> + Send;

    /// The conditions on [`BulkJob::ROWS`] the job's filter makes, with `$n` placeholders
    /// numbered from 1, and their values.
    fn conditions(&self) -> (Vec<String>, Vec<Param<'_>>);

    /// Replays the matching rows of one aggregate; returns how many were requeued.
    fn requeue<I: Tx>(
        &self,
        io: &I,
        source: &str,
        aggregate: &str,
        now_ms: i64,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;
}

/// Moves the oldest running job of kind `J` on by up to `aggregates` aggregates.
/// Returns the rows requeued.
pub(crate) async fn advance<J: BulkJob, I: Tx>(
    io: &I,
    now_ms: i64,
    aggregates: usize,
) -> Result<u64, StoreError> {
    // One node advances a job at a time; the others skip it.
    let jobs = io
        .query(
            &format!(
                "SELECT id, cursor_source, cursor_aggregate FROM {}
                 WHERE state = 'running' ORDER BY id LIMIT 1{}",
                J::JOBS,
                I::SKIP_LOCKED
            ),
            &[],
        )
        .await?;
    let Some(found) = jobs.first() else {
        return Ok(0);
    };
    let id = int(found, 0)?;
    let cursor = (opt_string(found, 1)?, opt_string(found, 2)?);
    let Some(job) = J::load(io, id).await? else {
        return Ok(0);
    };
    let (mut clauses, mut params) = job.conditions();
    if let (Some(source), Some(aggregate)) = cursor {
        params.extend([Param::owned(source), Param::owned(aggregate)]);
        let n = params.len();
        clauses.push(format!("(source, aggregate) > (${}, ${n})", n - 1));
    }
    params.push(Param::Int(i64::try_from(aggregates).unwrap_or(i64::MAX)));
    let next = io
        .query(
            &format!(
                "SELECT DISTINCT source, aggregate FROM {} WHERE {}
                 ORDER BY source, aggregate LIMIT ${}",
                J::ROWS,
                where_of(&clauses),
                params.len()
            ),
            &params,
        )
        .await?;
    let mut requeued = 0;
    let mut walked = None;
    for row in &next {
        let (source, aggregate) = (string(row, 0)?, string(row, 1)?);
        requeued += job.requeue(io, &source, &aggregate, now_ms).await?;
        walked = Some((source, aggregate));
    }
    let state = if next.len() < aggregates {
        "done"
    } else {
        "running"
    };
    let (cursor_source, cursor_aggregate) = walked.unzip();
    io.execute(
        &format!(
            "UPDATE {} SET requeued = requeued + $2, state = $3, updated_at = $4,
                 cursor_source = COALESCE($5, cursor_source),
                 cursor_aggregate = COALESCE($6, cursor_aggregate)
             WHERE id = $1",
            J::JOBS
        ),
        &[
            Param::Int(id),
            Param::Int(i64::try_from(requeued).unwrap_or(i64::MAX)),
            text(state),
            Param::Int(now_ms),
            Param::opt_owned(cursor_source),
            Param::opt_owned(cursor_aggregate),
        ],
    )
    .await?;
    if J::WAKES_WORKERS && requeued > 0 {
        io.wake_workers().await?;
    }
    Ok(requeued)
}
