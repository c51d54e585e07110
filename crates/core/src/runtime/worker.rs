//! The workers: a dispatcher hands due aggregates to up to `workers` tasks,
//! never the same aggregate to two at once, so one aggregate is processed one
//! step at a time while different aggregates proceed in parallel. Each step
//! settles an aggregate in one store transaction: a process killed mid-way
//! leaves its events pending and the restarted process finishes them, so
//! nothing is applied twice. A failing aggregate is retried with backoff and
//! never blocks the others.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, info, warn, Instrument};

use crate::config::Config;
use crate::domain::clock::{pause, Clock};
use crate::domain::AggregateKey;
use crate::operations::metrics;
use crate::store::{Settling, SourceRules, Upkeep};

/// How often the dispatcher looks for due work without being woken (holds and retries fall due by time).
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Aggregates settled in one store transaction, so that applying keeps up with a
/// group-committed ingest instead of paying one fsync per aggregate.
const AGGREGATES_PER_STEP: usize = 32;
/// Aggregates fetched per round.
const BATCH: usize = 256;
/// Pause after a store failure before trying again.
const STORE_BACKOFF: Duration = Duration::from_secs(1);
/// A day, in milliseconds (`stats_retention_days`).
const DAY_MS: i64 = 86_400_000;

/// Events deleted per retention transaction, so that ingress never waits long.
const PURGE_BATCH: usize = 1_000;

/// The asynchronous side of inhook.
#[derive(Clone)]
pub struct Worker {
    /// The configuration (sources, retry policy, retention).
    pub config: Arc<Config>,
    /// The store, as workers see it.
    pub store: Arc<dyn Settling>,
    /// Woken by ingress when an async event is logged.
    pub wake: Arc<Notify>,
    /// Rung after a settle that wrote delivery rows, so the senders forward at once.
    pub forward_wake: Arc<Notify>,
    /// Where "now" comes from.
    pub clock: Clock,
}

impl Worker {
    /// Dispatches due aggregates until `shutdown` turns true, then waits for the steps in hand.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let rules: Arc<Vec<SourceRules>> = Arc::new(
            self.config
                .sources
                .iter()
                .map(|s| SourceRules::for_source(s, &self.config.destinations))
                .collect(),
        );
        let permits = Arc::new(Semaphore::new(self.config.processing.workers.max(1)));
        let in_flight: Arc<Mutex<HashSet<(String, String)>>> = Arc::default();
        let mut tasks = JoinSet::new();
        let mut store_ok = true;
        while !*shutdown.borrow() {
            while tasks.try_join_next().is_some() {}
            let now_ms = self.clock.now_ms();
            let due = match self.store.due_aggregates(now_ms, BATCH).await {
                Ok(due) => {
                    if !store_ok {
                        info!("store reachable again; worker resumes");
                        store_ok = true;
                    }
                    due
                }
                Err(err) => {
                    if store_ok {
                        warn!(error = %err, "worker cannot read due work; backing off");
                        store_ok = false;
                    }
                    pause(&mut shutdown, STORE_BACKOFF, None).await;
                    continue;
                }
            };
            let mut claimed = Vec::new();
            for key in due {
                let Some(source_rules) = rules.iter().find(|r| r.name == key.0).cloned() else {
                    debug!(source = %key.0, "event of an unconfigured source left pending");
                    continue;
                };
                if in_flight.lock().expect("in-flight set").insert(key.clone()) {
                    claimed.push((source_rules, key.1));
                }
            }
            let mut dispatched = 0;
            let mut chunks = claimed.chunks(AGGREGATES_PER_STEP).map(<[_]>::to_vec);
            for chunk in chunks.by_ref() {
                let permit = tokio::select! {
                    permit = Arc::clone(&permits).acquire_owned() => permit.expect("semaphore open"),
                    _ = shutdown.changed() => {
                        release(&in_flight, &chunk);
                        break;
                    }
                };
                dispatched += 1;
                let worker = self.clone();
                let in_flight = Arc::clone(&in_flight);
                tasks.spawn(async move {
                    worker.steps(&chunk).await;
                    release(&in_flight, &chunk);
                    drop(permit);
                    worker.wake.notify_one();
                });
            }
            for chunk in chunks {
                release(&in_flight, &chunk);
            }
            if dispatched == 0 {
                pause(&mut shutdown, POLL_INTERVAL, Some(&self.wake)).await;
            }
        }
        // Steps in hand finish their transaction; nothing new starts.
        while tasks.join_next().await.is_some() {}
    }

    /// Settles several aggregates in one store transaction; if that fails, settles them
    /// one by one so that a failing aggregate is retried alone and blocks no other.
    async fn steps(&self, chunk: &[(SourceRules, String)]) {
        if let [(rules, aggregate)] = chunk {
            return self.step(rules, aggregate).await;
        }
        let span = tracing::info_span!("settle_batch", aggregates = chunk.len());
        match self
            .store
            .settle_many(chunk, self.clock.now_ms())
            .instrument(span)
            .await
        {
            Ok(reports) => {
                for ((rules, aggregate), report) in chunk.iter().zip(reports) {
                    self.report(rules, aggregate, &report);
                }
            }
            Err(err) => {
                debug!(error = %err, "batch settle failed; settling aggregates one by one");
                for (rules, aggregate) in chunk {
                    self.step(rules, aggregate).await;
                }
            }
        }
    }

    /// Metrics and decision lines of one settled aggregate.
    fn report(&self, rules: &SourceRules, aggregate: &str, report: &crate::store::SettleReport) {
        if report.deliveries > 0 {
            self.forward_wake.notify_one();
        }
        crate::operations::stats::report_settled(&rules.name, aggregate, report);
    }

    /// Settles one aggregate; on failure records the attempt for a later retry.
    async fn step(&self, rules: &SourceRules, aggregate: &str) {
        let span = tracing::info_span!(
            "settle",
            source = %rules.name,
            aggregate = %AggregateKey::text_of_stored(aggregate),
        );
        self.step_inner(rules, aggregate).instrument(span).await
    }

    async fn step_inner(&self, rules: &SourceRules, aggregate: &str) {
        match self
            .store
            .settle(rules, aggregate, self.clock.now_ms())
            .await
        {
            Ok(report) => self.report(rules, aggregate, &report),
            Err(err) => {
                let error = err.to_string();
                let shown = AggregateKey::text_of_stored(aggregate);
                let recorded = self
                    .store
                    .record_failure(
                        rules,
                        aggregate,
                        &error,
                        self.clock.now_ms(),
                        self.config.processing.retry,
                        rand::random::<f64>(),
                    )
                    .await;
                match recorded {
                    Ok(report) => {
                        metrics::failed_attempt(&rules.name, report.retrying, report.dead);
                        warn!(source = %rules.name, aggregate = %shown, %error,
                                        retrying = report.retrying, dead = report.dead,
                                        "attempt failed");
                    }
                    Err(again) => warn!(source = %rules.name, aggregate = %shown, %error,
                                        record_error = %again,
                                        "attempt failed and could not be recorded; will retry"),
                }
            }
        }
    }
}

/// Retention: decided events past `retention_s` and figures past `stats_retention_days`
/// deleted, a small transaction at a time.
pub struct Retention {
    /// The configuration (retention, dedup window, purge interval).
    pub config: Arc<Config>,
    /// The store, as retention sees it.
    pub store: Arc<dyn Upkeep>,
    /// Where "now" comes from.
    pub clock: Clock,
}

impl Retention {
    /// Deletes decided events past `retention`, keeping their dedup keys for `dedup_window`.
    /// Works in small transactions so ingress never waits on it.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let interval = Duration::from_secs(self.config.processing.purge_interval_s.max(1));
        while !*shutdown.borrow() {
            let now_ms = self.clock.now_ms();
            let before_ms = now_ms.saturating_sub(self.config.processing.retention_s as i64 * 1000);
            let dedup_until_ms = now_ms
                .saturating_add(self.config.processing.dedup_window_s as i64 * 1000)
                .saturating_sub(self.config.processing.retention_s as i64 * 1000);
            let mut purged = 0;
            loop {
                match self
                    .store
                    .purge(before_ms, dedup_until_ms, now_ms, PURGE_BATCH)
                    .await
                {
                    Ok(report) => {
                        purged += report.events;
                        if report.events < PURGE_BATCH as u64 || *shutdown.borrow() {
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                    Err(err) => {
                        warn!(error = %err, "retention pass failed; will retry");
                        break;
                    }
                }
            }
            if purged > 0 {
                info!(events = purged, "retention: purged decided events");
            }
            let stats_before_ms = now_ms.saturating_sub(
                (self.config.processing.stats_retention_days as i64).saturating_mul(DAY_MS),
            );
            if let Err(err) = self.store.purge_stats(stats_before_ms).await {
                warn!(error = %err, "figures over time not pruned; will retry");
            }
            pause(&mut shutdown, interval, None).await;
        }
    }
}

/// Frees claimed aggregates for the next round.
fn release(in_flight: &Mutex<HashSet<(String, String)>>, chunk: &[(SourceRules, String)]) {
    let mut set = in_flight.lock().expect("in-flight set");
    for (rules, aggregate) in chunk {
        set.remove(&(rules.name.clone(), aggregate.clone()));
    }
}
