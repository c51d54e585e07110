//! Alerts, built in (docs/configuration.md, alerts): `[[alerts]]` rules on what an operator
//! must hear about. [`rules`] decides, purely, which alerts start firing, repeat or resolve
//! from the figures of one tick; the [`AlertWatch`] task gathers those figures (store counts
//! and marks, circuits, rejection counters, the store's ping) every `alert_tick_ms`, keeps
//! each notice in the store (`GET /v1/alerts`) and hands it to [`send`]'s channels.

pub mod counters;
pub mod notice;
pub mod rules;
pub mod send;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use crate::clock::Clock;
use crate::config::Config;
use crate::domain::EventStatus;
use crate::forward::circuit::CircuitState;
use crate::sender::Circuits;
use crate::store::alerts::AlertRecord;
use crate::store::Store;
use rules::{evaluate, AlertBook, Condition, DestinationFigures, Figures, Notice, SourceFigures};

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
    /// Per rule, the queues of its channels.
    pub outbox: Vec<Vec<mpsc::UnboundedSender<Arc<AlertRecord>>>>,
}

impl AlertWatch {
    /// Evaluates the rules every `alert_tick_ms` until `stop`.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let conditions: Vec<Condition> = self
            .config
            .alerts
            .iter()
            .map(|rule| rule.condition.clone())
            .collect();
        let started_ms = self.clock.now_ms();
        let mut book = AlertBook::default();
        let tick = Duration::from_millis(self.config.alert_tick_ms);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => return,
            }
            let figures = self.figures(started_ms).await;
            for notice in evaluate(&conditions, &figures, &mut book) {
                self.deliver(notice).await;
            }
        }
    }

    /// Keeps `notice` (a store that is down only loses its history line) and queues it on
    /// its rule's channels.
    async fn deliver(&self, notice: Notice) {
        let rule = &self.config.alerts[notice.rule];
        let mut record = AlertRecord {
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
        };
        tracing::warn!(alert = %record.alert, state = %record.state, summary = %record.summary, "alert");
        match self.store.record_alert(&record).await {
            Ok(id) => record.id = id,
            Err(err) => {
                tracing::warn!(alert = %record.alert, error = %err, "alert not kept in the store")
            }
        }
        let record = Arc::new(record);
        for queue in &self.outbox[notice.rule] {
            // A closed queue: the node is stopping.
            let _ = queue.send(Arc::clone(&record));
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
