//! Alerts, built in (docs/configuration.md, alerts): `[[alerts]]` rules on what an operator
//! must hear about. [`rules`] decides, purely, which alerts start firing, repeat or resolve
//! from the figures of one tick; the [`AlertWatch`] task gathers those figures (store counts
//! and marks, circuits, rejection counters, the store's ping) every `alert_tick_ms`, keeps
//! each notice in the store (`GET /v1/alerts`) with a pending row per channel, which
//! [`send`]'s channels send. An alert over the shared store's figures (`dead`, `gap_held`,
//! `backlog`, `source_silent`) is decided once across nodes: the watcher takes the store's
//! word on what fires before each tick, and a transition is kept only by the node whose
//! conditional write made it ([`crate::store::alerts::Transition`]).

pub mod counters;
pub mod notice;
pub mod rules;
pub mod send;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::domain::clock::Clock;
use crate::domain::EventStatus;
use crate::forward::circuit::CircuitState;
use crate::forward::sender::Circuits;
use crate::store::alerts::{AlertRecord, Transition};
use crate::store::Store;
use rules::{evaluate, AlertBook, Condition, DestinationFigures, Figures, Notice, SourceFigures};
use send::LaneHandle;

/// The task that evaluates the rules each tick.
pub struct AlertWatch {
    /// The running configuration: its rules, sources and destinations.
    pub config: Arc<Config>,
    /// Where figures are read and notices kept.
    pub store: Arc<dyn Store>,
    /// This node's circuit breakers.
    pub circuits: Circuits,
    /// Where "now" comes from.
    pub clock: Clock,
    /// Per rule, its channels.
    pub outbox: Vec<Vec<LaneHandle>>,
    /// This node's name, on the notices about its own view.
    pub node: Arc<str>,
}

impl AlertWatch {
    /// Evaluates the rules every `alert_tick_ms` until `stop`.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let conditions: Vec<Condition> = self
            .config
            .observability
            .alerts
            .iter()
            .map(|rule| rule.condition.clone())
            .collect();
        let started_ms = self.clock.now_ms();
        let mut book = AlertBook::default();
        let tick = Duration::from_millis(self.config.observability.alert_tick_ms);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => return,
            }
            let mut figures = self.figures(started_ms).await;
            if !self.adopt_firing(&figures, &mut book).await {
                // Without the store's word the shared rules keep their state this tick.
                figures.sources = None;
            }
            for notice in evaluate(&conditions, &figures, &mut book) {
                self.deliver(notice).await;
            }
        }
    }

    /// Sets the book's shared alerts (those over the sources this tick read) as the store
    /// holds them; false when it could not be read.
    async fn adopt_firing(&self, figures: &Figures, book: &mut AlertBook) -> bool {
        let Some(sources) = &figures.sources else {
            return true;
        };
        let firing = match self.store.alerts_firing().await {
            Ok(firing) => firing,
            Err(err) => {
                tracing::warn!(error = %err, "the alerts firing were not read");
                return false;
            }
        };
        for (index, rule) in self.config.observability.alerts.iter().enumerate() {
            if !rule.condition.on.shared() {
                continue;
            }
            for source in sources {
                let row = firing
                    .iter()
                    .find(|f| f.alert == rule.name && f.subject == source.name);
                book.adopt(
                    index,
                    &source.name,
                    row.map(|f| (f.since_ms, f.last_sent_ms)),
                );
            }
        }
        true
    }

    /// Keeps `notice` with a pending row per channel of its rule, when this node decides it
    /// (a shared alert's transition is kept by the one node whose write made it). A notice
    /// about the node's own view the store could not keep (it is down) is queued in memory
    /// on its channels instead: sent, not listed.
    async fn deliver(&self, notice: Notice) {
        let rule = &self.config.observability.alerts[notice.rule];
        let shared = notice.on.shared();
        let subject = notice
            .source
            .clone()
            .or_else(|| notice.destination.clone())
            .unwrap_or_default();
        let transition = match (shared, notice.state, notice.repeat) {
            (false, _, _) => Transition::Own,
            (true, rules::AlertState::Resolved, _) => Transition::Resolve { subject },
            (true, rules::AlertState::Firing, false) => Transition::Fire { subject },
            (true, rules::AlertState::Firing, true) => Transition::Repeat {
                subject,
                sent_before_ms: notice.at_ms.saturating_sub(
                    (rule.condition.repeat_s.unwrap_or(0) as i64).saturating_mul(1000),
                ),
            },
        };
        let record = AlertRecord {
            id: 0,
            alert: rule.name.clone(),
            state: notice.state.as_str().to_owned(),
            on: notice.on.as_str().to_owned(),
            source: notice.source,
            destination: notice.destination,
            since_ms: notice.since_ms,
            at_ms: notice.at_ms,
            repeat: notice.repeat,
            summary: notice.summary,
            figures: notice.figures,
            node: (!shared).then(|| self.node.to_string()),
            channels: Vec::new(),
        };
        let lanes = &self.outbox[notice.rule];
        let keys = lanes.iter().map(|lane| lane.key.clone()).collect();
        match self
            .store
            .keep_alert(record.clone(), transition.clone(), keys)
            .await
        {
            Ok(Some(kept)) => {
                tracing::warn!(alert = %kept.alert, state = %kept.state, summary = %kept.summary, "alert");
                for lane in lanes {
                    lane.wake.notify_one();
                }
            }
            Ok(None) => {
                tracing::debug!(alert = %record.alert, state = %record.state, "alert decided by another node")
            }
            Err(err) if transition == Transition::Own => {
                tracing::warn!(alert = %record.alert, state = %record.state, summary = %record.summary,
                               error = %err, "alert not kept in the store; sent from memory");
                let record = Arc::new(record);
                for lane in lanes {
                    // A closed queue: the node is stopping.
                    let _ = lane.queue.send(Arc::clone(&record));
                }
            }
            Err(err) => {
                // The next tick takes the store's word again and decides anew.
                tracing::warn!(alert = %record.alert, state = %record.state, error = %err,
                               "alert not decided: the store did not answer");
            }
        }
    }

    /// The figures of this tick.
    async fn figures(&self, started_ms: i64) -> Figures {
        let store_error = self.store.ping().await.err().map(|err| err.to_string());
        let sources = if store_error.is_none() {
            self.source_figures().await
        } else {
            None
        };
        let mut destinations = Vec::with_capacity(self.config.destinations.len());
        for destination in self.config.destinations.iter() {
            let (state, failures) = self
                .circuits
                .watch(&destination.name)
                .unwrap_or((CircuitState::Closed, 0));
            let last_error = if failures > 0 && store_error.is_none() {
                self.store
                    .destination_stats(&destination.name)
                    .await
                    .ok()
                    .and_then(|stats| stats.last_error)
            } else {
                None
            };
            destinations.push(DestinationFigures {
                name: destination.name.clone(),
                failures: u64::from(failures),
                circuit_open: state != CircuitState::Closed,
                last_error,
            });
        }
        Figures {
            now_ms: self.clock.now_ms(),
            started_ms,
            sources,
            destinations,
            store_error,
        }
    }

    /// Every source's figures; none when the store could not be read.
    async fn source_figures(&self) -> Option<Vec<SourceFigures>> {
        let counts = match self.store.status_counts().await {
            Ok(counts) => counts,
            Err(err) => {
                tracing::warn!(error = %err, "alert figures not read");
                return None;
            }
        };
        let mut by_source: HashMap<&str, (u64, u64)> = HashMap::new();
        for (source, status, n) in &counts {
            let entry = by_source.entry(source.as_str()).or_default();
            if *status == EventStatus::Dead {
                entry.0 += n;
            } else if status.is_undecided() {
                entry.1 += n;
            }
        }
        let mut sources = Vec::with_capacity(self.config.sources.len());
        for source in &self.config.sources {
            let marks = match self.store.source_marks(&source.name).await {
                Ok(marks) => marks,
                Err(err) => {
                    tracing::warn!(error = %err, "alert figures not read");
                    return None;
                }
            };
            let (dead, backlog) = by_source
                .get(source.name.as_str())
                .copied()
                .unwrap_or_default();
            let (rejected, bad_signatures) = counters::of(&source.name);
            sources.push(SourceFigures {
                name: source.name.clone(),
                dead,
                backlog,
                oldest_held_ms: marks.oldest_held_ms,
                last_received_ms: marks.last_received_ms,
                rejected,
                bad_signatures,
            });
        }
        Some(sources)
    }
}
