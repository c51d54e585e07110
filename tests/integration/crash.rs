//! G2 and G5 under crashes: a publisher keeps sending while the server is
//! SIGKILLed and restarted again and again; afterwards nothing answered 2xx is
//! missing from the log, nothing is logged twice, and the state is the in-order one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inhook::contract::SourceKind;
use inhook::signature::{Scheme, Secret};
use inhook::simulate::{
    expected_states, generate, plan, ChaosSpec, Copy, Endpoint, Publisher, SendOptions,
    SourceSigner, StreamSpec,
};

use crate::support::{TestServer, PRESENCE_SECRET, SAVE_SECRETS};

const KILLS: usize = 4;

fn source_name(kind: SourceKind) -> &'static str {
    match kind {
        SourceKind::Presence => "presence",
        SourceKind::SaveGame => "save-game",
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_a_steady_stream_loses_nothing_and_converges() {
    let mut server = TestServer::spawn().await;
    let seed = 0x5eed;
    let stream = generate(&StreamSpec {
        seed,
        events: 3_000,
        aggregates: 60,
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
    let endpoint = Endpoint::new(&server.url);
    let publisher = Publisher::new(
        endpoint.clone(),
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
            concurrency: 8,
            // Paced so the stream spans every kill: about 7 s for the whole plan.
            rate: 500,
            give_up_after: Duration::from_secs(60),
            max_retry_after: Duration::from_secs(1),
            request_timeout: Duration::from_secs(5),
        },
    )
    .unwrap();
    let started = Instant::now();
    let sending = tokio::spawn({
        let (publisher, plan) = (publisher.clone(), plan.clone());
        async move { publisher.deliver(plan).await }
    });

    let mut kills = 0;
    while kills < KILLS && !sending.is_finished() {
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        // The server's start blocks on its ready line; keep the publisher's thread free meanwhile.
        tokio::task::block_in_place(|| server.kill9());
        kills += 1;
        // Let the senders meet a dead port before the new one is up.
        tokio::time::sleep(Duration::from_millis(200)).await;
        tokio::task::block_in_place(|| server.restart());
        endpoint.set(&server.url);
    }
    let report = sending.await.expect("publisher task");
    let delivered_in = started.elapsed();
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

    let db = server.db();
    let mut rows = db
        .prepare("SELECT source, event_id, idempotency_key, status, dead_reason FROM events")
        .unwrap();
    let rows: Vec<(String, String, Option<String>, String, Option<String>)> = rows
        .query_map([], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let twice: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM (SELECT 1 FROM events GROUP BY source, event_id HAVING COUNT(*) > 1)",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let ids: HashSet<(&str, &str)> = rows
        .iter()
        .map(|(s, e, ..)| (s.as_str(), e.as_str()))
        .collect();
    let keys: HashSet<(&str, &str)> = rows
        .iter()
        .filter_map(|(s, _, k, ..)| Some((s.as_str(), k.as_deref()?)))
        .collect();
    let mut statuses: HashMap<String, usize> = HashMap::new();
    for (_, _, _, status, reason) in &rows {
        let label = match reason {
            Some(reason) => format!("{status}/{reason}"),
            None => status.clone(),
        };
        *statuses.entry(label).or_default() += 1;
    }
    let not_terminal: usize = statuses
        .iter()
        .filter(|(s, _)| {
            !matches!(
                s.as_str(),
                "processed" | "ignored_stale" | "ignored_unsupported"
            )
        })
        .map(|(_, n)| n)
        .sum();

    // G2: a delivery answered 2xx is in the log, under its own event_id or,
    // for a resend under a new event_id, under its idempotency key.
    let mut answered = 0;
    let mut lost = Vec::new();
    for (delivery, receipt) in plan.deliveries.iter().zip(&report.receipts) {
        let Some(receipt) = receipt else { continue };
        answered += 1;
        let source = source_name(delivery.kind);
        let by_key = receipt.key.as_deref() == Some("idempotency_key")
            && delivery
                .idempotency_key
                .as_deref()
                .is_some_and(|k| keys.contains(&(source, k)));
        if !ids.contains(&(source, delivery.event_id.as_str())) && !by_key {
            lost.push((delivery.event_id.clone(), receipt.clone()));
        }
    }
    // Every logical event of the stream is logged exactly once.
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

    println!(
        "crash test: {} events, {} deliveries ({} same-id duplicates, {} new-id duplicates, {} resends, {} reordered), \
         {} requests, {} retries, answers {:?}",
        stream.event_count(),
        plan.deliveries.len(),
        plan.count(Copy::SameEventId),
        plan.count(Copy::NewEventId),
        plan.resends(),
        plan.reordered,
        report.tally.requests,
        report.tally.retries,
        report.tally.codes,
    );
    println!(
        "crash test: {kills} kills in {:.1}s of sending; {answered} deliveries answered 2xx; {} lost; \
         {} logged rows ({} missing events, {twice} event_ids twice); statuses {statuses:?}; {} mismatches",
        delivered_in.as_secs_f64(),
        lost.len(),
        rows.len(),
        missing_events,
        mismatches.len(),
    );
    for m in mismatches.iter().take(5) {
        println!("  {}: expected {}, got {}", m.aggregate, m.expected, m.got);
    }

    assert!(lost.is_empty(), "answered 2xx but not logged: {lost:?}");
    assert_eq!(twice, 0, "an event_id logged twice");
    assert_eq!(missing_events, 0);
    assert_eq!(rows.len(), stream.event_count(), "one row per event");
    assert_eq!(
        not_terminal, 0,
        "events not in a terminal status: {statuses:?}"
    );
    assert!(
        mismatches.is_empty(),
        "{} aggregates differ",
        mismatches.len()
    );
}
