//! Resetting an aggregate on request (docs/contract.md, a publisher's bad version),
//! written once over [`Tx`]: one event whose sequence no later one can pass (near
//! `i64::MAX`, or a timestamp in the year 9999) makes every later event of a latest-wins
//! aggregate stale for good. The reset deletes its state, whose sequence is that
//! watermark, and its highest received sequence; its events stay in the log as they are.

use serde::Serialize;

use super::backend::{int, opt_int, text, Param, Tx};
use super::StoreError;

/// What resetting one aggregate did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ResetReport {
    /// Whether the aggregate had a state, now deleted.
    pub state_deleted: bool,
    /// The deleted state's sequence: the version every later event had to pass (null
    /// when it had no state, or an unordered source's state).
    pub sequence: Option<i64>,
    /// The highest sequence received for the aggregate, now forgotten (null when none
    /// was recorded); out-of-order counts start again from its next event.
    pub highest_received: Option<i64>,
}

impl ResetReport {
    /// Whether anything was stored for the aggregate to reset.
    pub fn found(&self) -> bool {
        self.state_deleted || self.highest_received.is_some()
    }
}

/// Resets the aggregate, in the caller's transaction, under the aggregate's lock: its
/// state and its highest received sequence are deleted, and the workers woken, so that
/// its next event (or one waiting) is decided as a new aggregate's first would be.
pub(crate) async fn reset<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
) -> Result<ResetReport, StoreError> {
    io.lock_aggregates(&[(source, aggregate)]).await?;
    let at = [text(source), text(aggregate)];
    let state = io
        .query(
            "SELECT sequence FROM aggregate_state WHERE source = $1 AND aggregate = $2",
            &at,
        )
        .await?;
    let seen = io
        .query(
            "SELECT max_sequence FROM aggregate_seen WHERE source = $1 AND aggregate = $2",
            &at,
        )
        .await?;
    let state_deleted = delete_state(io, &at).await?;
    io.execute(
        "DELETE FROM aggregate_seen WHERE source = $1 AND aggregate = $2",
        &at,
    )
    .await?;
    io.wake_workers().await?;
    Ok(ResetReport {
        state_deleted,
        sequence: state
            .first()
            .map(|row| opt_int(row, 0))
            .transpose()?
            .flatten(),
        highest_received: seen.first().map(|row| int(row, 0)).transpose()?,
    })
}

/// Deletes the aggregate's state (`at`: its source and key), as a reset and an erasure both
/// do; answers whether it had one.
pub(super) async fn delete_state<I: Tx>(io: &I, at: &[Param<'_>]) -> Result<bool, StoreError> {
    Ok(io
        .execute(
            "DELETE FROM aggregate_state WHERE source = $1 AND aggregate = $2",
            at,
        )
        .await?
        > 0)
}
