//! G2 and G5 under crashes: a publisher keeps sending while the server is
//! SIGKILLed and restarted again and again. Right after each kill, every
//! delivery answered 2xx so far is in the database file; at the end nothing
//! is logged twice, every event is decided, and the state is the in-order one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inhook::domain::kind::SourceKind;
use inhook::ingress::signature::{Scheme, Secret};
use inhook::store::EventRecord;
use inhook_tools::simulate::{
    expected_states, generate, plan, ChaosSpec, DeliveryReport, Endpoint, EventCopy, Plan,
    Publisher, Receipt, SendOptions, SourceSigner, Stream, StreamSpec,
};

use crate::support::{TestServer, PRESENCE_SECRET, SAVE_SECRETS};

const KILLS: usize = 4;

pub(crate) fn source_name(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::Presence => "presence",
        SourceKind::SaveGame => "save-game",
        SourceKind::Json => "json",
    }
}

/// The log's status of a row, with the dead reason: `dead/insufficient_quantity`.
pub(crate) fn status_label(row: &EventRecord) -> String {
    match row.dead_reason {
        Some(reason) => format!("{}/{}", row.status.as_str(), reason.as_str()),
        None => row.status.as_str().to_owned(),
    }
}

/// G2: the answered deliveries missing from the log. A delivery is logged
/// under its own event_id or, when it was answered as a duplicate by
/// idempotency key, under that key.
pub(crate) fn lost(
    rows: &[EventRecord],
    plan: &Plan,
    answered: &[(usize, Receipt)],
) -> Vec<String> {
    let ids: HashSet<(&str, &str)> = rows
        .iter()
        .map(|r| (r.source.as_str(), r.event_id.as_str()))
        .collect();
    let keys: HashSet<(&str, &str)> = rows
        .iter()
        .filter_map(|r| Some((r.source.as_str(), r.idempotency_key.as_deref()?)))
        .collect();
    answered
        .iter()
        .filter_map(|(i, receipt)| {
            let delivery = &plan.deliveries[*i];
            let source = source_name(delivery.kind);
            let by_key = receipt.key.as_deref() == Some("idempotency_key")
                && delivery
                    .idempotency_key
                    .as_deref()
                    .is_some_and(|k| keys.contains(&(source, k)));
            let found = ids.contains(&(source, delivery.event_id.as_str())) || by_key;
            (!found).then(|| {
                format!(
                    "{source} {} (seq {}, {:?}) answered {} {}",
                    delivery.event_id,
                    delivery.sequence,
                    delivery.copy,
                    receipt.code,
                    receipt.status
                )
            })
        })
        .collect()
}

/// A 3,000-event stream over 60 aggregates of both sources, and its chaotic delivery plan.
pub(crate) fn chaos_stream(seed: u64) -> (Stream, Arc<Plan>) {
    chaos_stream_of(seed, 3_000, 60)
}

/// A stream of `events` over `aggregates` aggregates, half of them each source's, and
/// its chaotic delivery plan.
pub(crate) fn chaos_stream_of(seed: u64, events: usize, aggregates: usize) -> (Stream, Arc<Plan>) {
    let stream = generate(&StreamSpec {
        seed,
        events,
        aggregates,
        presence_share: 0.5,
    });
    let plan = Arc::new(plan(
        &stream,
        &ChaosSpec {
            seed,
            window: 8,
            duplicate_rate: 0.2,
            resend_rate: 0.05,
        },
    ));
    (stream, plan)
}

/// A publisher signing for the test servers' two seed sources, retrying until 2xx.
pub(crate) fn chaos_publisher(endpoint: Endpoint, concurrency: usize, rate: u64) -> Publisher {
    Publisher::new(
        endpoint,
        SourceSigner {
            name: "presence".into(),
            scheme: Scheme::HmacHex,
            secret: Secret::new(PRESENCE_SECRET),
        },
        SourceSigner {
            name: "save-game".into(),
            scheme: Scheme::HmacTimestamped,
            secret: Secret::new(SAVE_SECRETS[0]),
        },
        None,
        SendOptions {
            concurrency,
            rate,
            give_up_after: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
            tls_ca_file: None,
        },
    )
    .expect("publisher")
}

/// What a stream sent across SIGKILLs came to.
struct Killed {
    report: DeliveryReport,
    kills: usize,
    lost_at_kills: Vec<String>,
    delivered_in: Duration,
}

/// Sends `plan` with `publisher` while SIGKILLing and restarting `server` up to
/// [`KILLS`] times; right after each kill, notes the answered deliveries not in the log.
async fn send_across_kills(
    server: &mut TestServer,
    publisher: &Publisher,
    endpoint: &Endpoint,
    plan: &Arc<Plan>,
) -> Killed {
    let started = Instant::now();
    let sending = tokio::spawn({
        let (publisher, plan) = (publisher.clone(), plan.clone());
        async move { publisher.deliver(plan).await }
    });
    let mut kills = 0;
    let mut lost_at_kills = Vec::new();
    while kills < KILLS && !sending.is_finished() {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        // kill9 and restart block on the child process; keep the publisher's thread free meanwhile.
        tokio::task::block_in_place(|| server.kill9());
        kills += 1;
        // Right after the kill, before anything can be resent: every answer so far is in the file.
        let answered = publisher.answered();
        let missing = lost(&server.logged().await, plan, &answered);
        println!(
            "crash test: kill {kills}: {} answers before it, {} of them not in the log",
            answered.len(),
            missing.len()
        );
        lost_at_kills.extend(missing);
        // Let the senders meet a dead port before the new one is up.
        tokio::time::sleep(Duration::from_millis(200)).await;
        tokio::task::block_in_place(|| server.restart());
        endpoint.set(&server.url);
    }
    let report = sending.await.expect("publisher task");
    Killed {
        report,
        kills,
        lost_at_kills,
        delivered_in: started.elapsed(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_a_steady_stream_loses_nothing_and_converges() {
    let mut server = TestServer::spawn().await;
    let (stream, plan) = chaos_stream(0x5eed);
    let endpoint = Endpoint::new(&server.url);
    // Paced so the stream spans every kill: about 7 s for the whole plan.
    let publisher = chaos_publisher(endpoint.clone(), 8, 500);
    let Killed {
        report,
        kills,
        lost_at_kills,
        delivered_in,
    } = send_across_kills(&mut server, &publisher, &endpoint, &plan).await;
    assert!(
        kills >= 3,
        "the stream ended after {kills} kills: send slower"
    );
    assert!(
        report.failures.is_empty(),
        "deliveries failed: {:?}",
        &report.failures[..report.failures.len().min(5)]
    );

    let mismatches = publisher
        .converge(Arc::new(expected_states(&stream)), Duration::from_secs(60))
        .await
        .expect("read API");

    let rows = server.logged().await;
    let audit = Audit::of(&rows, &stream, &plan, &report);
    println!(
        "crash test: {} events, {} deliveries ({} same-id duplicates, {} new-id duplicates, \
         {} resends, {} reordered), {} requests, {} retries, answers {:?}",
        stream.event_count(),
        plan.deliveries.len(),
        plan.count(EventCopy::SameEventId),
        plan.count(EventCopy::NewEventId),
        plan.resends(),
        plan.reordered,
        report.tally.requests,
        report.tally.retries,
        report.tally.codes,
    );
    println!(
        "crash test: {kills} kills in {:.1}s of sending; {} deliveries answered 2xx; \
         lost {} at the kills, {} at the end; {} logged rows ({} events missing, \
         {} event_ids twice); statuses {:?}; {} mismatches",
        delivered_in.as_secs_f64(),
        audit.answered,
        lost_at_kills.len(),
        audit.lost.len(),
        rows.len(),
        audit.missing_events,
        audit.twice,
        audit.statuses,
        mismatches.len(),
    );
    for m in mismatches.iter().take(5) {
        println!("  {}: expected {}, got {}", m.aggregate, m.expected, m.got);
    }

    assert!(
        lost_at_kills.is_empty(),
        "answered 2xx but not in the log after SIGKILL: {lost_at_kills:?}"
    );
    audit.assert_clean(rows.len(), stream.event_count(), mismatches.len());
}

/// What the log says after a chaotic stream: the checks shared by the crash
/// and multi-node tests.
pub(crate) struct Audit {
    /// Deliveries answered 2xx.
    pub answered: usize,
    /// Answered deliveries missing from the log.
    pub lost: Vec<String>,
    /// Events of the stream logged under neither their id nor their duplicate's.
    pub missing_events: usize,
    /// `(source, event_id)` pairs logged more than once.
    pub twice: usize,
    /// Rows by status.
    pub statuses: HashMap<String, usize>,
    /// Rows not in a terminal status.
    pub not_terminal: usize,
}

impl Audit {
    /// Audits `rows` against the stream, the plan and the publisher's report.
    pub fn of(rows: &[EventRecord], stream: &Stream, plan: &Plan, report: &DeliveryReport) -> Self {
        let mut per_id: HashMap<(&str, &str), usize> = HashMap::new();
        let mut statuses: HashMap<String, usize> = HashMap::new();
        for row in rows {
            *per_id
                .entry((row.source.as_str(), row.event_id.as_str()))
                .or_default() += 1;
            *statuses.entry(status_label(row)).or_default() += 1;
        }
        let not_terminal = statuses
            .iter()
            .filter(|(s, _)| {
                !matches!(
                    s.as_str(),
                    "processed" | "ignored_stale" | "ignored_unsupported"
                )
            })
            .map(|(_, n)| n)
            .sum();
        let answered: Vec<(usize, Receipt)> = report
            .receipts
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((i, r.clone()?)))
            .collect();
        let ids: HashSet<(&str, &str)> = per_id.keys().copied().collect();
        let missing_events = stream
            .aggregates
            .iter()
            .flat_map(|a| a.events.iter().map(move |e| (a.key.kind(), e)))
            .filter(|(kind, e)| {
                let source = source_name(*kind);
                !ids.contains(&(source, e.event_id.as_str()))
                    && !ids.contains(&(source, format!("{}_dup", e.event_id).as_str()))
            })
            .count();
        Self {
            answered: answered.len(),
            lost: lost(rows, plan, &answered),
            missing_events,
            twice: per_id.values().filter(|n| **n > 1).count(),
            statuses,
            not_terminal,
        }
    }

    /// Nothing lost, nothing twice, everything decided, and the state converged.
    pub fn assert_clean(&self, rows: usize, events: usize, mismatches: usize) {
        assert!(
            self.lost.is_empty(),
            "answered 2xx but not logged: {:?}",
            self.lost
        );
        assert_eq!(self.twice, 0, "an event_id logged twice");
        assert_eq!(self.missing_events, 0);
        assert_eq!(rows, events, "one row per event");
        assert_eq!(
            self.not_terminal, 0,
            "events not in a terminal status: {:?}",
            self.statuses
        );
        assert_eq!(mismatches, 0, "{mismatches} aggregates differ");
    }
}

/// Issue #14: SIGKILLs while a publisher streams save-game events, nearly in order, that
/// are decided in the transactions that log them: nothing answered is lost, nothing is
/// applied twice (no grant doubled), the states are the in-order ones, and most events
/// were indeed decided at ingest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_while_events_are_decided_at_ingest_loses_nothing_and_applies_once() {
    let mut server = TestServer::spawn_with("decide_at_ingest = true").await;
    let stream = generate(&StreamSpec {
        seed: 0x14,
        events: 2_400,
        aggregates: 40,
        presence_share: 0.0,
    });
    let plan = Arc::new(plan(
        &stream,
        &ChaosSpec {
            seed: 0x14,
            window: 1,
            duplicate_rate: 0.1,
            resend_rate: 0.05,
        },
    ));
    let endpoint = Endpoint::new(&server.url);
    let publisher = chaos_publisher(endpoint.clone(), 4, 400);
    let killed = send_across_kills(&mut server, &publisher, &endpoint, &plan).await;
    assert!(
        killed.kills >= 3,
        "the stream ended after {} kills",
        killed.kills
    );
    assert!(
        killed.report.failures.is_empty(),
        "deliveries failed: {:?}",
        &killed.report.failures[..killed.report.failures.len().min(5)]
    );
    let mismatches = publisher
        .converge(Arc::new(expected_states(&stream)), Duration::from_secs(60))
        .await
        .expect("read API");
    let rows = server.logged().await;
    let audit = Audit::of(&rows, &stream, &plan, &killed.report);
    let at_ingest = rows
        .iter()
        .filter(|r| r.decided_at_ms == Some(r.received_at_ms))
        .count();
    println!(
        "decide-at-ingest crash test: {} kills; {} answered; lost {} at the kills; {} rows, \
         {} decided at receipt; statuses {:?}; {} mismatches",
        killed.kills,
        audit.answered,
        killed.lost_at_kills.len(),
        rows.len(),
        at_ingest,
        audit.statuses,
        mismatches.len(),
    );
    assert!(
        killed.lost_at_kills.is_empty(),
        "answered 2xx but not in the log after SIGKILL: {:?}",
        killed.lost_at_kills
    );
    audit.assert_clean(rows.len(), stream.event_count(), mismatches.len());
    assert!(
        at_ingest * 2 > rows.len(),
        "only {at_ingest} of {} events decided at ingest",
        rows.len()
    );
}
