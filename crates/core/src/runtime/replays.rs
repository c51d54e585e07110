//! Bulk replays (docs/api.md, replay): one task per node advances every stored bulk-replay
//! job, the events' and the forwarded deliveries', a step at a time, and wakes the worker or
//! the senders when a step requeued work for them. Each step is one store transaction that
//! moves the job's stored cursor, so the task may run on every node at once and a job
//! survives a restart.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tracing::warn;

use crate::domain::clock::pause;
use crate::domain::clock::Clock;
use crate::store::Repairs;

/// Aggregates (events) or queues (deliveries) a bulk replay requeues per step.
const REPLAY_STEP: usize = 64;
/// How long, with no job running, the task waits before looking for one: on SQLite every
/// look is a turn on the one connection ingest shares.
const LOOK_EVERY: Duration = Duration::from_secs(1);
/// The pause between two steps of a running job, so that a large replay leaves the store
/// to ingest between its steps rather than holding it.
const BETWEEN_STEPS: Duration = Duration::from_millis(20);

/// How long to wait after a step that requeued `requeued` (`None`: the store failed):
/// briefly while a job has work, else until the next look.
fn wait_after(requeued: Option<u64>) -> Duration {
    match requeued {
        Some(n) if n > 0 => BETWEEN_STEPS,
        _ => LOOK_EVERY,
    }
}

/// The node's bulk-replay task.
pub struct BulkReplays {
    /// The store holding the jobs.
    pub store: Arc<dyn Repairs>,
    /// Rung when events were requeued: the worker settles them.
    pub worker_wake: Arc<Notify>,
    /// Rung when deliveries were requeued: every sender of the node looks for them.
    pub forward_wake: Arc<Notify>,
    /// Whether this node forwards (has destinations): otherwise no delivery job can exist.
    pub forwarding: bool,
    /// Where "now" comes from.
    pub clock: Clock,
}

impl BulkReplays {
    /// Advances the jobs until `shutdown` turns true.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        while !*shutdown.borrow() {
            let requeued = self.step().await;
            pause(&mut shutdown, wait_after(requeued), None).await;
        }
    }

    /// One step of every running job; answers how much it requeued (`None`: the store failed).
    async fn step(&self) -> Option<u64> {
        let now_ms = self.clock.now_ms();
        let events = match self.store.advance_replay_jobs(now_ms, REPLAY_STEP).await {
            Ok(n) => Some(n),
            Err(err) => {
                warn!(error = %err, "cannot advance replay jobs");
                None
            }
        };
        if events.is_some_and(|n| n > 0) {
            self.worker_wake.notify_one();
        }
        if !self.forwarding {
            return events;
        }
        let deliveries = match self
            .store
            .advance_delivery_replay_jobs(now_ms, REPLAY_STEP)
            .await
        {
            Ok(n) => Some(n),
            Err(err) => {
                warn!(error = %err, "cannot advance delivery replays");
                None
            }
        };
        if deliveries.is_some_and(|n| n > 0) {
            // The job may be any destination's: the wake fans out to every sender.
            self.forward_wake.notify_one();
        }
        Some(events? + deliveries?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_with_work_is_stepped_again_soon_and_none_is_looked_for_each_second() {
        assert_eq!(wait_after(Some(3)), BETWEEN_STEPS);
        assert_eq!(wait_after(Some(0)), LOOK_EVERY);
        assert_eq!(wait_after(None), LOOK_EVERY);
    }
}
