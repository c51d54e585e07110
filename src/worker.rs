//! The worker: a loop over the store's due aggregates. Each aggregate is
//! settled in one store transaction, so a crash mid-way leaves its events
//! pending and the restarted process finishes them; nothing is applied twice.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tracing::{debug, info, warn};

use crate::clock;
use crate::config::Config;
use crate::store::Store;

/// How often the worker looks for due work without being woken (holds and retries fall due by time).
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Aggregates fetched per round.
const BATCH: usize = 256;
/// Pause after a store failure before trying again.
const STORE_BACKOFF: Duration = Duration::from_secs(1);

/// Runs until `shutdown` turns true, then returns after finishing the aggregate in hand.
pub async fn run(
    config: Arc<Config>,
    store: Arc<dyn Store>,
    wake: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    let rules: Vec<_> = config.sources.iter().map(|s| s.rules()).collect();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let now_ms = clock::now_ms();
        let due = match store.due_aggregates(now_ms, BATCH).await {
            Ok(due) => due,
            Err(err) => {
                warn!(error = %err, "worker cannot read due work; backing off");
                pause(&mut shutdown, STORE_BACKOFF, None).await;
                continue;
            }
        };
        let mut settled = 0;
        for (source, aggregate) in &due {
            let Some(rules) = rules.iter().find(|r| &r.name == source) else {
                debug!(%source, "event of an unconfigured source left pending");
                continue;
            };
            match store.settle(rules, aggregate, clock::now_ms()).await {
                Ok(report) => {
                    settled += 1;
                    if report.gaps_skipped > 0 {
                        warn!(%source, aggregate = %aggregate.replace('\u{1f}', "/"),
                              gaps = report.gaps_skipped, "hold timeout: gap skipped");
                    }
                    for reason in &report.dead {
                        info!(%source, aggregate = %aggregate.replace('\u{1f}', "/"),
                              reason = reason.as_str(), "event dead");
                    }
                }
                Err(err) => {
                    warn!(%source, error = %err, "settling failed; will retry");
                    pause(&mut shutdown, STORE_BACKOFF, None).await;
                }
            }
            if *shutdown.borrow() {
                return;
            }
        }
        if settled == 0 {
            pause(&mut shutdown, POLL_INTERVAL, Some(&wake)).await;
        }
    }
}

/// Sleeps for `period`, or less when woken or told to stop.
async fn pause(shutdown: &mut watch::Receiver<bool>, period: Duration, wake: Option<&Notify>) {
    let woken = async {
        match wake {
            Some(wake) => wake.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(period) => {}
        _ = woken => {}
        _ = shutdown.changed() => {}
    }
}
