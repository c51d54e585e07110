//! Every metric of docs/api.md (metrics), named once here. Handlers and workers call these
//! functions; `/metrics` renders the Prometheus text. Labels only ever carry
//! configured source names and fixed vocabularies, so a hostile client cannot
//! grow the label space.

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::domain::{DeadReason, DedupKey};

/// Label used for deliveries to a source that is not configured.
pub const UNKNOWN_SOURCE: &str = "_unknown";

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The recorder's settings: the buckets of each histogram.
fn recorder() -> metrics_exporter_prometheus::PrometheusRecorder {
    PrometheusBuilder::new()
        // Ingest is milliseconds; processing lag spans holds and retries, up to minutes.
        .set_buckets_for_metric(
            Matcher::Full("inhook_ingest_duration_seconds".into()),
            &[
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ],
        )
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full("inhook_processing_lag_seconds".into()),
                &[
                    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0,
                ],
            )
        })
        .and_then(|b| {
            // Forwarding lag spans retries and replays, like processing's.
            b.set_buckets_for_metric(
                Matcher::Full("inhook_forward_lag_seconds".into()),
                &[
                    0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 60.0, 300.0, 1800.0,
                ],
            )
        })
        .expect("bucket lists are non-empty")
        .build_recorder()
}

/// Installs the process-wide Prometheus recorder (once); later calls reuse it.
pub fn install() -> &'static PrometheusHandle {
    try_install().expect("no other metrics recorder is installed")
}

/// Installs the process-wide Prometheus recorder unless one is installed: inhook's, reused
/// (two embedded instances share it), or none when the process holds another (a service
/// embedding inhook with its own recorder: inhook's metrics go to that one, and `/metrics`
/// renders nothing).
pub fn try_install() -> Option<&'static PrometheusHandle> {
    static INSTALLING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = INSTALLING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(handle) = HANDLE.get() {
        return Some(handle);
    }
    let recorder = recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder).ok()?;
    Some(HANDLE.get_or_init(|| handle))
}

/// How often histogram samples are folded into their buckets.
pub const UPKEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds the samples recorded since the last call into the histograms' buckets. Without
/// it every sample is kept until the next scrape: memory grows on a server nobody scrapes.
pub fn run_upkeep() {
    if let Some(handle) = HANDLE.get() {
        handle.run_upkeep();
    }
}

/// The rendered metrics, if a recorder is installed.
pub fn render() -> Option<String> {
    HANDLE.get().map(PrometheusHandle::render)
}

/// One answered delivery.
pub fn request(source: &str, code: u16, seconds: f64) {
    crate::operations::alerts::counters::answered(source, code);
    counter!("inhook_requests_total", "source" => source.to_owned(), "code" => code.to_string())
        .increment(1);
    histogram!("inhook_ingest_duration_seconds", "source" => source.to_owned()).record(seconds);
}

/// A handshake answered at once, never stored (docs/contract.md, handshakes).
pub fn handshake(source: &str, kind: &'static str) {
    counter!("inhook_handshakes_total", "source" => source.to_owned(), "kind" => kind).increment(1);
}

/// A delivery whose signature or timestamp was rejected.
pub fn signature_failure(source: &str, reason: &'static str) {
    crate::operations::alerts::counters::bad_signature(source);
    counter!("inhook_signature_failures_total", "source" => source.to_owned(), "reason" => reason)
        .increment(1);
}

/// A verified delivery whose body broke the contract.
pub fn invalid_payload(source: &str) {
    counter!("inhook_invalid_payloads_total", "source" => source.to_owned()).increment(1);
}

/// A duplicate delivery.
pub fn duplicate(source: &str, key: DedupKey) {
    counter!("inhook_duplicates_total", "source" => source.to_owned(), "key" => key.as_str())
        .increment(1);
}

/// A duplicate `event_id` whose body differs from the logged one: a publisher error.
pub fn conflicting_duplicate(source: &str) {
    counter!("inhook_conflicting_duplicates_total", "source" => source.to_owned()).increment(1);
}

/// A delivery received after one of a higher sequence of its aggregate: counted at
/// ingest, by order of receipt, whatever a worker later sees at once.
pub fn out_of_order(source: &str) {
    counter!("inhook_out_of_order_total", "source" => source.to_owned()).increment(1);
}

/// Events of one settle step (ingest in sync mode, or a worker step) that ended as
/// `outcome` (`applied`, `stale`, `unsupported`, `dead`).
pub fn attempts(source: &str, outcome: &'static str, n: u64) {
    if n > 0 {
        counter!("inhook_attempts_total", "source" => source.to_owned(), "outcome" => outcome)
            .increment(n);
    }
}

/// An event that went dead, by reason.
pub fn dead_event(source: &str, reason: DeadReason) {
    counter!("inhook_dead_events_total", "source" => source.to_owned(), "reason" => reason.as_str())
        .increment(1);
}

/// Events older than the state they would have changed.
pub fn stale_events(source: &str, n: u64) {
    if n > 0 {
        counter!("inhook_stale_events_total", "source" => source.to_owned()).increment(n);
    }
}

/// Events applied on a sequence equal to the current one (latest-wins `json`).
pub fn sequence_ties(source: &str, n: u64) {
    if n > 0 {
        counter!("inhook_sequence_ties_total", "source" => source.to_owned()).increment(n);
    }
}

/// Missing sequences a hold timeout skipped.
pub fn gaps_skipped(source: &str, n: u64) {
    if n > 0 {
        counter!("inhook_gaps_skipped_total", "source" => source.to_owned()).increment(n);
    }
}

/// Milliseconds from an event's receipt to its decision.
pub fn processing_lag(source: &str, lag_ms: i64) {
    histogram!("inhook_processing_lag_seconds", "source" => source.to_owned())
        .record(lag_ms as f64 / 1000.0);
}

/// A failed worker step and the events it retried or gave up on.
pub fn failed_attempt(source: &str, retrying: u64, dead: u64) {
    counter!("inhook_attempts_total", "source" => source.to_owned(), "outcome" => "failed")
        .increment(retrying + dead);
    if dead > 0 {
        counter!("inhook_dead_events_total", "source" => source.to_owned(), "reason" => "exhausted")
            .increment(dead);
    }
}

/// Current undecided events of a source, set at each scrape.
pub fn backlog(source: &str, held: u64, backlog: u64) {
    gauge!("inhook_held_events", "source" => source.to_owned()).set(held as f64);
    gauge!("inhook_backlog", "source" => source.to_owned()).set(backlog as f64);
}

/// One forwarded request's outcome (`failed`: the request could not be built or sent at all).
pub fn forward_attempt(destination: &str, outcome: &'static str) {
    counter!("inhook_forward_attempts_total", "destination" => destination.to_owned(),
             "outcome" => outcome)
    .increment(1);
}

/// A delivery given up after `max_attempts` (recorded dead by this node).
pub fn forward_dead(destination: &str) {
    counter!("inhook_forward_dead_total", "destination" => destination.to_owned()).increment(1);
}

/// A delivery's time from its event being applied to its 2xx.
pub fn forward_lag(destination: &str, lag_ms: i64) {
    histogram!("inhook_forward_lag_seconds", "destination" => destination.to_owned())
        .record(lag_ms.max(0) as f64 / 1000.0);
}

/// A destination's figures, set at each scrape: backlog, aggregates blocked by a dead
/// in-order delivery, and whether this node's circuit is open (probing counts as open).
pub fn forward_gauges(
    destination: &str,
    backlog: u64,
    blocked_aggregates: u64,
    circuit_open: bool,
) {
    let name = || destination.to_owned();
    gauge!("inhook_forward_backlog", "destination" => name()).set(backlog as f64);
    gauge!("inhook_forward_blocked_aggregates", "destination" => name())
        .set(blocked_aggregates as f64);
    gauge!("inhook_forward_circuit_open", "destination" => name()).set(if circuit_open {
        1.0
    } else {
        0.0
    });
}
