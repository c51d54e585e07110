//! Figures over time (docs/api.md, stats): per minute and per source or destination,
//! counted in memory where the metrics are counted, and flushed to the store once a
//! minute (and at shutdown) by [`run_flush`]. Counting adds no store write to an
//! event's path: a lock held for a few additions, and a map lookup by name.
//!
//! Like the metrics recorder, the figures are the process's: one server per process.

pub mod lag;
pub mod series;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::Config;
use crate::domain::clock;
use crate::store::stats::{Combine, StatRow, StatScope};
use crate::store::Store;
use lag::LagHistogram;

/// A minute, in milliseconds.
pub const MINUTE_MS: i64 = 60_000;

/// The start of the minute `ms` falls in.
pub fn minute_of(ms: i64) -> i64 {
    ms.div_euclid(MINUTE_MS) * MINUTE_MS
}

/// One minute's figures of one source or destination.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// Deliveries posted (a source), whatever their answer.
    pub received: u64,
    /// Events logged (a batch counts each element).
    pub accepted: u64,
    /// Deliveries answered as duplicates.
    pub duplicate: u64,
    /// Deliveries refused, by the answer's `error` code.
    pub rejected: BTreeMap<String, u64>,
    /// Events applied.
    pub applied: u64,
    /// Events ignored as stale.
    pub stale: u64,
    /// Events (a source) or deliveries (a destination) that went dead.
    pub dead: u64,
    /// Deliveries a destination acknowledged.
    pub forwarded: u64,
    /// Delivery attempts that failed.
    pub failed: u64,
    /// The undecided events (or undelivered deliveries) sampled at the minute's flush.
    pub backlog: Option<u64>,
    /// Receipt → applied (a source) or applied → acknowledged (a destination).
    pub lag: LagHistogram,
    /// When the last delivery arrived, unix ms.
    pub last_at: Option<i64>,
}

/// Stored prefix of a rejection reason's count.
const REJECTED: &str = "rejected:";
/// Stored prefix of a lag bucket's count ([`lag`]).
const LAG: &str = "lag:";
/// The stored names of the sampled figures.
const BACKLOG: &str = "backlog";
const LAST_AT: &str = "last_at";

impl Figures {
    /// Each counted figure by its stored name.
    fn counts(&self) -> [(&'static str, u64); 8] {
        [
            ("received", self.received),
            ("accepted", self.accepted),
            ("duplicate", self.duplicate),
            ("applied", self.applied),
            ("stale", self.stale),
            ("dead", self.dead),
            ("forwarded", self.forwarded),
            ("failed", self.failed),
        ]
    }

    /// The counted figure stored as `figure`, if it is one.
    fn count_of(&mut self, figure: &str) -> Option<&mut u64> {
        Some(match figure {
            "received" => &mut self.received,
            "accepted" => &mut self.accepted,
            "duplicate" => &mut self.duplicate,
            "applied" => &mut self.applied,
            "stale" => &mut self.stale,
            "dead" => &mut self.dead,
            "forwarded" => &mut self.forwarded,
            "failed" => &mut self.failed,
            _ => return None,
        })
    }

    /// Adds everything `other` counted; samples keep the greatest.
    pub fn merge(&mut self, other: &Figures) {
        for (figure, n) in other.counts() {
            if let Some(count) = self.count_of(figure) {
                *count += n;
            }
        }
        for (reason, n) in &other.rejected {
            *self.rejected.entry(reason.clone()).or_insert(0) += n;
        }
        self.lag.merge(&other.lag);
        self.backlog = self.backlog.max(other.backlog);
        self.last_at = self.last_at.max(other.last_at);
    }

    /// The stored rows of these figures (zero counts left out).
    fn rows(&self, scope: StatScope, name: &str, minute_ms: i64) -> Vec<StatRow> {
        let row = |figure: String, value: u64, combine| StatRow {
            scope,
            name: name.to_owned(),
            minute_ms,
            figure,
            value: i64::try_from(value).unwrap_or(i64::MAX),
            combine,
        };
        let mut rows: Vec<StatRow> = self
            .counts()
            .into_iter()
            .filter(|(_, n)| *n > 0)
            .map(|(figure, n)| row(figure.to_owned(), n, Combine::Add))
            .collect();
        rows.extend(
            self.rejected
                .iter()
                .map(|(reason, n)| row(format!("{REJECTED}{reason}"), *n, Combine::Add)),
        );
        rows.extend(
            self.lag
                .buckets()
                .map(|(i, n)| row(format!("{LAG}{i}"), n, Combine::Add)),
        );
        rows.extend(
            self.backlog
                .map(|n| row(BACKLOG.to_owned(), n, Combine::Max)),
        );
        rows.extend(
            self.last_at
                .map(|at| row(LAST_AT.to_owned(), at.max(0) as u64, Combine::Max)),
        );
        rows
    }

    /// Adds one stored figure read back (its sum over minutes, or its greatest for samples);
    /// a figure this release does not know is left out.
    pub fn add_stored(&mut self, figure: &str, sum: i64, max: i64) {
        let sum = sum.max(0) as u64;
        if let Some(count) = self.count_of(figure) {
            *count += sum;
        } else if let Some(reason) = figure.strip_prefix(REJECTED) {
            *self.rejected.entry(reason.to_owned()).or_insert(0) += sum;
        } else if let Some(bucket) = figure.strip_prefix(LAG).and_then(|i| i.parse().ok()) {
            self.lag.add_bucket(bucket, sum);
        } else if figure == BACKLOG {
            self.backlog = self.backlog.max(Some(max.max(0) as u64));
        } else if figure == LAST_AT {
            self.last_at = self.last_at.max(Some(max));
        }
    }
}

/// One source's or destination's figures by minute.
pub type Minutes = BTreeMap<i64, Figures>;

/// Figures not yet in the store: counted, or being flushed.
#[derive(Debug, Default)]
struct Pending {
    sources: HashMap<String, Minutes>,
    destinations: HashMap<String, Minutes>,
}

impl Pending {
    fn scope(&mut self, scope: StatScope) -> &mut HashMap<String, Minutes> {
        match scope {
            StatScope::Source => &mut self.sources,
            StatScope::Destination => &mut self.destinations,
        }
    }

    /// The figures of `name`'s `minute`, made when missing (the name copied only then).
    fn at(&mut self, scope: StatScope, name: &str, minute: i64) -> &mut Figures {
        let names = self.scope(scope);
        if !names.contains_key(name) {
            names.insert(name.to_owned(), Minutes::new());
        }
        names
            .get_mut(name)
            .expect("inserted above")
            .entry(minute)
            .or_default()
    }

    /// Takes the minutes before `before` (all of them when `None`).
    fn take(&mut self, before: Option<i64>) -> Vec<(StatScope, String, i64, Figures)> {
        let mut taken = Vec::new();
        for scope in [StatScope::Source, StatScope::Destination] {
            for (name, minutes) in self.scope(scope).iter_mut() {
                let kept = match before {
                    Some(before) => minutes.split_off(&before),
                    None => Minutes::new(),
                };
                for (minute, figures) in std::mem::replace(minutes, kept) {
                    taken.push((scope, name.clone(), minute, figures));
                }
            }
            self.scope(scope).retain(|_, minutes| !minutes.is_empty());
        }
        taken
    }

    /// `name`'s figures of the minutes in `[from, to)`, added into `into` by minute.
    fn read(&self, scope: StatScope, name: &str, (from, to): (i64, i64), into: &mut Minutes) {
        let names = match scope {
            StatScope::Source => &self.sources,
            StatScope::Destination => &self.destinations,
        };
        if let Some(minutes) = names.get(name) {
            for (minute, figures) in minutes.range(from..to) {
                into.entry(*minute).or_default().merge(figures);
            }
        }
    }
}

/// The process's figures not yet flushed.
#[derive(Debug, Default)]
pub struct Recorder {
    counting: Mutex<Pending>,
    /// Taken by a flush that has not committed yet: still read, put back if it fails.
    flushing: Mutex<Pending>,
}

static RECORDER: OnceLock<Recorder> = OnceLock::new();

/// The process's recorder.
pub fn recorder() -> &'static Recorder {
    RECORDER.get_or_init(Recorder::default)
}

impl Recorder {
    /// Runs `count` on the figures of `name` for the current minute.
    fn count(&self, scope: StatScope, name: &str, count: impl FnOnce(&mut Figures)) {
        let minute = minute_of(clock::now_ms());
        if let Ok(mut pending) = self.counting.lock() {
            count(pending.at(scope, name, minute));
        }
    }

    /// Every figure of `name` not yet stored, of minutes in `[from, to)`, by minute.
    pub fn unflushed(&self, scope: StatScope, name: &str, window: (i64, i64)) -> Minutes {
        let mut minutes = Minutes::new();
        for pending in [&self.flushing, &self.counting] {
            if let Ok(pending) = pending.lock() {
                pending.read(scope, name, window, &mut minutes);
            }
        }
        minutes
    }

    /// Writes the minutes before `before` (every minute when `None`) to `store`, with the
    /// backlogs sampled now set on the last of them; kept for the next flush if the store fails.
    async fn flush(
        &self,
        store: &dyn Store,
        before: Option<i64>,
        backlogs: Vec<(StatScope, String, u64)>,
        now_ms: i64,
    ) {
        let sample_minute = match before {
            Some(before) => before - MINUTE_MS,
            None => minute_of(now_ms),
        };
        let taken = {
            let Ok(mut counting) = self.counting.lock() else {
                return;
            };
            for (scope, name, backlog) in &backlogs {
                counting.at(*scope, name, sample_minute).backlog = Some(*backlog);
            }
            counting.take(before)
        };
        if taken.is_empty() {
            return;
        }
        if let Ok(mut flushing) = self.flushing.lock() {
            for (scope, name, minute, figures) in &taken {
                flushing.at(*scope, name, *minute).merge(figures);
            }
        }
        let mut rows: Vec<StatRow> = taken
            .iter()
            .flat_map(|(scope, name, minute, figures)| figures.rows(*scope, name, *minute))
            .collect();
        rows.sort_by(|a, b| {
            (a.scope, &a.name, a.minute_ms, &a.figure).cmp(&(
                b.scope,
                &b.name,
                b.minute_ms,
                &b.figure,
            ))
        });
        let written = store.add_stats(rows).await;
        let failed = written.is_err();
        if let Err(err) = written {
            tracing::warn!(error = %err, "figures over time not flushed; kept for the next minute");
        }
        let (Ok(mut counting), Ok(mut flushing)) = (self.counting.lock(), self.flushing.lock())
        else {
            return;
        };
        *flushing = Pending::default();
        if failed {
            for (scope, name, minute, figures) in &taken {
                counting.at(*scope, name, *minute).merge(figures);
            }
        }
    }
}

/// A delivery posted to `source` and how it was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answered<'a> {
    /// Logged: `accepted` new events, `duplicate` already logged (a batch counts each element).
    Logged {
        /// Events logged.
        accepted: u64,
        /// Elements found already logged.
        duplicate: u64,
    },
    /// Refused before the log, with the answer's `error` code.
    Rejected(&'a str),
    /// Answered without logging anything (a handshake).
    Other,
}

/// Counts one delivery posted to `source` (docs/api.md, stats).
pub fn delivery(source: &str, answered: Answered<'_>, at_ms: i64) {
    recorder().count(StatScope::Source, source, |f| {
        f.received += 1;
        f.last_at = f.last_at.max(Some(at_ms));
        match answered {
            Answered::Logged {
                accepted,
                duplicate,
            } => {
                f.accepted += accepted;
                f.duplicate += duplicate;
            }
            Answered::Rejected(reason) => match f.rejected.get_mut(reason) {
                Some(n) => *n += 1,
                None => {
                    f.rejected.insert(reason.to_owned(), 1);
                }
            },
            Answered::Other => {}
        }
    });
}

/// Counts a settle step's outcomes in the metrics and the figures of `source`, with the
/// receipt → decision lag of each.
pub fn count_settled(source: &str, report: &crate::store::SettleReport) {
    crate::operations::metrics::attempts(source, "applied", report.applied);
    crate::operations::metrics::attempts(source, "stale", report.stale);
    crate::operations::metrics::attempts(source, "unsupported", report.unsupported);
    crate::operations::metrics::attempts(source, "dead", report.dead.len() as u64);
    for reason in &report.dead {
        crate::operations::metrics::dead_event(source, *reason);
    }
    crate::operations::metrics::stale_events(source, report.stale);
    crate::operations::metrics::sequence_ties(source, report.ties);
    crate::operations::metrics::gaps_skipped(source, report.gaps_skipped);
    for lag_ms in &report.lags_ms {
        crate::operations::metrics::processing_lag(source, *lag_ms);
    }
    let dead = report.dead.len() as u64;
    if report.applied + report.stale + dead == 0 && report.lags_ms.is_empty() {
        return;
    }
    recorder().count(StatScope::Source, source, |f| {
        f.applied += report.applied;
        f.stale += report.stale;
        f.dead += dead;
        for lag in &report.lags_ms {
            f.lag.record(*lag);
        }
    });
}

/// What became of one recorded delivery attempt to a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forwarded {
    /// Acknowledged, `lag_ms` after its event was applied.
    Delivered {
        /// Applied → acknowledged.
        lag_ms: i64,
    },
    /// Failed, to be retried.
    Failed,
    /// Failed and given up.
    Dead,
}

/// Counts one recorded delivery attempt to `destination`.
pub fn forwarded(destination: &str, outcome: Forwarded) {
    recorder().count(StatScope::Destination, destination, |f| match outcome {
        Forwarded::Delivered { lag_ms } => {
            f.forwarded += 1;
            f.lag.record(lag_ms);
        }
        Forwarded::Failed => f.failed += 1,
        Forwarded::Dead => {
            f.failed += 1;
            f.dead += 1;
        }
    });
}

/// How long after a minute ends its figures are flushed: what was counted in its last
/// instant has reached the recorder by then.
const FLUSH_DELAY_MS: i64 = 2_000;

/// Flushes the figures of each minute shortly after it ends, until shutdown; then
/// [`flush_all`] writes the rest, once the work in hand is done.
pub async fn run_flush(
    store: Arc<dyn Store>,
    config: Arc<Config>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let now_ms = clock::now_ms();
        let next = minute_of(now_ms) + MINUTE_MS + FLUSH_DELAY_MS;
        let wait = Duration::from_millis((next - now_ms).max(0) as u64);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => {}
        }
        if *stop.borrow() {
            return;
        }
        let now_ms = clock::now_ms();
        let backlogs = backlogs(store.as_ref(), &config).await;
        recorder()
            .flush(store.as_ref(), Some(minute_of(now_ms)), backlogs, now_ms)
            .await;
    }
}

/// Flushes every figure counted, the current minute's too (at shutdown).
pub async fn flush_all(store: &dyn Store, config: &Config) {
    let backlogs = backlogs(store, config).await;
    recorder()
        .flush(store, None, backlogs, clock::now_ms())
        .await;
}

/// Every configured source's undecided events and destination's undelivered deliveries,
/// now; what the store cannot answer is left out.
async fn backlogs(store: &dyn Store, config: &Config) -> Vec<(StatScope, String, u64)> {
    let mut found = Vec::new();
    match store.undecided_counts().await {
        Ok(counts) => {
            for source in &config.sources {
                let n = counts
                    .iter()
                    .filter(|(name, _, _)| *name == source.name)
                    .map(|(_, _, n)| n)
                    .sum();
                found.push((StatScope::Source, source.name.clone(), n));
            }
        }
        Err(err) => tracing::warn!(error = %err, "backlog not sampled for the figures over time"),
    }
    for destination in config.destinations.iter() {
        match store.destination_stats(&destination.name).await {
            Ok(stats) => found.push((
                StatScope::Destination,
                destination.name.clone(),
                stats.backlog,
            )),
            Err(err) => tracing::warn!(error = %err, "destination backlog not sampled"),
        }
    }
    found
}

/// Metrics and decision lines of one settled aggregate (`aggregate` in stored form),
/// whether a worker or the ingest transaction settled it.
pub fn report_settled(source: &str, aggregate: &str, report: &crate::store::SettleReport) {
    count_settled(source, report);
    let lines = !report.decided.is_empty() && tracing::enabled!(tracing::Level::INFO);
    if !lines && report.gaps_skipped == 0 {
        // The key's text form is built only for a line that is written.
        return;
    }
    let shown = crate::domain::AggregateKey::text_of_stored(aggregate);
    let written = if lines { &report.decided[..] } else { &[] };
    for line in written {
        tracing::info!(source = %source, event_id = %line.event_id,
              idempotency_key = line.idempotency_key.as_deref(),
              aggregate = %shown, sequence = line.sequence,
              decision = line.decision.as_str(), "decision");
    }
    if report.gaps_skipped > 0 {
        tracing::warn!(source = %source, aggregate = %shown, gaps = report.gaps_skipped,
              "hold timeout: gap skipped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Figures {
        let mut f = Figures {
            received: 3,
            accepted: 2,
            applied: 2,
            backlog: Some(4),
            last_at: Some(1_000),
            ..Figures::default()
        };
        f.rejected.insert("invalid_signature".into(), 1);
        f.lag.record(12);
        f
    }

    #[test]
    fn figures_read_back_from_their_rows_are_the_figures() {
        let written = figures();
        let mut read = Figures::default();
        for row in written.rows(StatScope::Source, "github", 60_000) {
            read.add_stored(&row.figure, row.value, row.value);
        }
        assert_eq!(read, written);
    }

    #[test]
    fn merging_adds_counts_and_keeps_the_greatest_sample() {
        let mut a = figures();
        let mut b = figures();
        b.backlog = Some(9);
        b.last_at = Some(500);
        a.merge(&b);
        assert_eq!((a.received, a.applied), (6, 4));
        assert_eq!(a.rejected["invalid_signature"], 2);
        assert_eq!((a.backlog, a.last_at), (Some(9), Some(1_000)));
        assert_eq!(a.lag.quantile_ms(1.0), Some(16));
    }

    #[test]
    fn a_flush_takes_the_minutes_before_the_current_one_only() {
        let mut pending = Pending::default();
        pending.at(StatScope::Source, "a", 0).received = 1;
        pending.at(StatScope::Source, "a", MINUTE_MS).received = 2;
        pending.at(StatScope::Destination, "d", 0).forwarded = 1;
        let taken = pending.take(Some(MINUTE_MS));
        assert_eq!(taken.len(), 2);
        assert!(taken.iter().all(|(_, _, minute, _)| *minute == 0));
        let mut left = Minutes::new();
        pending.read(StatScope::Source, "a", (0, i64::MAX), &mut left);
        assert_eq!(left.keys().copied().collect::<Vec<_>>(), vec![MINUTE_MS]);
        assert!(pending.destinations.is_empty());
        assert_eq!(pending.take(None).len(), 1);
    }

    #[test]
    fn minutes_start_on_the_minute() {
        assert_eq!(minute_of(119_999), 60_000);
        assert_eq!(minute_of(-1), -60_000);
    }
}
