//! Issue #12, forwarding through crashes (docs/forwarding.md): the real server binary
//! forwards a chaotic stream of both seed sources to the recording application while it is
//! SIGKILLed and restarted, or while one of three nodes on one PostgreSQL database is
//! killed. Every applied event is accepted at least once, per aggregate the first
//! acceptances follow the applied order, never two requests of one aggregate are on the
//! wire at once, a request cut by a kill goes again with its `webhook-id`, and every body
//! arrives byte for byte.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inhook::domain::{AggregateKey, EventStatus};
use inhook::forward::queue::DeliveryStatus;
use inhook::store::{DeliveryFilter, DeliveryRecord};
use inhook_tools::simulate::{expected_states, Endpoint, Plan, Publisher, Stream};

use crate::application::{serve_recording, Behaviour, Seen, DEST_SECRET};
use crate::crash::{chaos_publisher, chaos_stream_of};
use crate::support::{Backend, TestServer};

/// Failures rare enough that the stream drains in seconds (each costs a 1 s backoff),
/// acceptances slow enough that a kill finds requests on the wire.
const BEHAVIOUR: Behaviour = Behaviour {
    fail_rate: 0.08,
    accept_delay_ms: 40,
};

/// Restarts of the single node.
const KILLS: usize = 4;

/// The destination: every event of both seed sources to the application, the URL naming
/// the sending `node`. A 1 s timeout and a 1 s lease margin: a killed node's in-flight
/// deliveries go again 2 s after their claim (the default margin would make that 40 s).
fn destination(port: u16, node: &str) -> String {
    format!(
        r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks?node={node}"
sources = ["presence", "save-game"]
secret = "{DEST_SECRET}"
timeout_s = 1
lease_margin_s = 1
max_attempts = 50
retry_base_s = 1
retry_max_delay_s = 1
"#
    )
}

/// Every delivery to the application, oldest (first applied) first.
async fn deliveries(server: &TestServer) -> Vec<DeliveryRecord> {
    deliveries_to(server, "app").await
}

/// Every delivery to `destination`, oldest (first applied) first.
pub(crate) async fn deliveries_to(server: &TestServer, destination: &str) -> Vec<DeliveryRecord> {
    let mut items = server
        .store()
        .await
        .deliveries(destination, &DeliveryFilter::default(), 1_000_000, None)
        .await
        .expect("deliveries")
        .items;
    items.reverse();
    items
}

/// A request on the wire when its node was killed, not delivered by then: it must go again.
struct Cut {
    event_id: String,
    /// Requests of its event the application had received when the node died.
    requests_before: usize,
}

/// Holds the next request of `node` the application would accept on the wire (up to 3 s
/// for one to come) and SIGKILLs `victim` meanwhile; answers the events on the wire, each
/// with the requests the application had received of it when the node died.
async fn kill_on_the_wire(
    victim: &mut TestServer,
    seen: &Arc<Mutex<Seen>>,
    node: &str,
) -> Vec<(String, usize)> {
    {
        let mut seen = seen.lock().unwrap();
        seen.stalled = None;
        seen.stall_node = Some(node.to_owned());
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while seen.lock().unwrap().stalled.is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let wire: Vec<String> = {
        let mut seen = seen.lock().unwrap();
        seen.stall_node = None;
        seen.on_the_wire
            .iter()
            .filter(|(_, n)| n == node)
            .map(|(event_id, _)| event_id.clone())
            .collect()
    };
    // kill9 blocks on the child process; keep the runtime's other tasks going meanwhile.
    tokio::task::block_in_place(|| victim.kill9());
    let seen = seen.lock().unwrap();
    wire.into_iter()
        .map(|event_id| {
            let before = seen.requested.get(&event_id).copied().unwrap_or(0);
            (event_id, before)
        })
        .collect()
}

/// The events of `wire` (as [`kill_on_the_wire`] answers them) whose delivery the store
/// does not show delivered now that their node is dead: the requests the kill cut.
async fn cut(store_of: &TestServer, wire: Vec<(String, usize)>) -> Vec<Cut> {
    let undelivered: HashSet<String> = deliveries(store_of)
        .await
        .into_iter()
        .filter(|d| d.status != DeliveryStatus::Delivered)
        .map(|d| d.event_id)
        .collect();
    wire.into_iter()
        .filter(|(event_id, _)| undelivered.contains(event_id))
        .map(|(event_id, requests_before)| Cut {
            event_id,
            requests_before,
        })
        .collect()
}

/// What the application saw, against the store's deliveries (the applied order).
#[derive(Debug, Default)]
struct Figures {
    /// Applied events of the forwarded sources (each one delivery).
    applied: usize,
    /// Processed events in the log without a delivery, or deliveries of no processed event.
    unmatched: usize,
    requests: usize,
    /// Requests beyond the first of their event.
    retries: usize,
    /// Acceptances beyond the first of their event (same `webhook-id` accepted again).
    duplicates: usize,
    /// Events first accepted after an event of their aggregate applied later.
    order_violations: usize,
    overlaps: usize,
    /// Deliveries not `delivered`, or never accepted.
    lost: usize,
    /// Accepted events with no delivery.
    unexpected: usize,
    /// Events that came with another `webhook-id` than their delivery's (or with several).
    webhook_id_mismatches: usize,
    /// Accepted bodies differing from the logged one.
    body_mismatches: usize,
    bad_signatures: usize,
    /// Requests cut by a kill, and how many of them went again.
    cut: usize,
    resent: usize,
}

impl Figures {
    /// Audits the application's record against the deliveries and the event log.
    async fn of(seen: &Seen, server: &TestServer, cuts: &[Cut]) -> Self {
        let deliveries = deliveries(server).await;
        let logged = server.logged().await;
        let bodies: HashMap<&str, &[u8]> = logged
            .iter()
            .map(|e| (e.event_id.as_str(), e.body.as_slice()))
            .collect();
        let processed: HashSet<&str> = logged
            .iter()
            .filter(|e| e.status == EventStatus::Processed)
            .map(|e| e.event_id.as_str())
            .collect();
        let delivered: HashSet<&str> = deliveries.iter().map(|d| d.event_id.as_str()).collect();
        let mut applied: HashMap<String, Vec<&str>> = HashMap::new();
        for d in &deliveries {
            applied
                .entry(AggregateKey::text_of_stored(&d.aggregate))
                .or_default()
                .push(&d.event_id);
        }
        let acceptances = seen.acceptances();
        let mut figures = Figures {
            applied: deliveries.len(),
            unmatched: processed.symmetric_difference(&delivered).count(),
            requests: seen.requests,
            retries: seen.requests - seen.requested.len(),
            duplicates: acceptances.values().map(|n| n - 1).sum(),
            overlaps: seen.overlaps,
            bad_signatures: seen.bad_signatures,
            cut: cuts.len(),
            resent: cuts
                .iter()
                .filter(|c| {
                    seen.requested.get(&c.event_id).copied().unwrap_or(0) > c.requests_before
                })
                .count(),
            ..Figures::default()
        };
        figures.lost = deliveries
            .iter()
            .filter(|d| {
                d.status != DeliveryStatus::Delivered
                    || !acceptances.contains_key(d.event_id.as_str())
            })
            .count();
        figures.unexpected = acceptances
            .keys()
            .filter(|e| !delivered.contains(*e))
            .count();
        figures.webhook_id_mismatches = deliveries
            .iter()
            .filter(|d| {
                seen.webhook_ids
                    .get(&d.event_id)
                    .is_some_and(|ids| ids.len() != 1 || !ids.contains(&d.webhook_id))
            })
            .count();
        for (aggregate, accepted) in &seen.accepted {
            let order = applied
                .get(aggregate)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut first: Vec<&str> = Vec::new();
            for (event_id, body) in accepted {
                if bodies.get(event_id.as_str()) != Some(&body.as_slice()) {
                    figures.body_mismatches += 1;
                }
                if !first.contains(&event_id.as_str()) {
                    first.push(event_id);
                }
            }
            let mut latest = None;
            for event_id in first {
                let at = order.iter().position(|e| *e == event_id);
                if at < latest {
                    figures.order_violations += 1;
                }
                latest = latest.max(at);
            }
        }
        figures
    }

    /// The summary line's figures.
    fn line(&self) -> String {
        format!(
            "{} events applied and forwarded, {} requests received, {} retries, {} duplicates \
             (same webhook-id accepted twice), {} order violations, {} in-flight overlaps, \
             {} lost; {} requests cut by a kill, {} of them resent",
            self.applied,
            self.requests,
            self.retries,
            self.duplicates,
            self.order_violations,
            self.overlaps,
            self.lost,
            self.cut,
            self.resent,
        )
    }

    /// Nothing lost, in order, one at a time, the same `webhook-id`, byte for byte.
    fn assert_clean(&self) {
        assert_eq!(
            self.overlaps, 0,
            "two requests of one aggregate on the wire"
        );
        assert_eq!(
            self.order_violations, 0,
            "first acceptances out of applied order"
        );
        assert_eq!(self.lost, 0, "applied events never accepted");
        assert_eq!(self.unmatched, 0, "processed events and deliveries differ");
        assert_eq!(self.unexpected, 0, "accepted events nothing applied");
        assert_eq!(
            self.webhook_id_mismatches, 0,
            "an event with another webhook-id"
        );
        assert_eq!(self.body_mismatches, 0, "a body not byte for byte");
        assert_eq!(self.bad_signatures, 0);
        assert!(self.applied > 500, "too few events forwarded to test much");
        assert!(self.cut > 0, "no kill cut a request on the wire");
        assert_eq!(
            self.resent, self.cut,
            "a request cut by a kill was not sent again"
        );
    }
}

/// Waits until the publisher's stream converged and every delivery was accepted.
async fn drain(
    publisher: &Publisher,
    stream: &Stream,
    server: &TestServer,
    seen: &Arc<Mutex<Seen>>,
) {
    converged(publisher, stream, Duration::from_secs(40)).await;
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let deliveries = deliveries(server).await;
        let accepted = seen.lock().unwrap().acceptances().len();
        let done = deliveries
            .iter()
            .all(|d| d.status == DeliveryStatus::Delivered);
        if done && accepted >= deliveries.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not forwarded in time: {} of {} delivered, {accepted} accepted",
            deliveries
                .iter()
                .filter(|d| d.status == DeliveryStatus::Delivered)
                .count(),
            deliveries.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every aggregate of `stream` reads back through the API as the publisher
/// expects it, up to `within`.
pub(crate) async fn converged(publisher: &Publisher, stream: &Stream, within: Duration) {
    let mismatches = publisher
        .converge(Arc::new(expected_states(stream)), within)
        .await
        .expect("read API");
    assert!(
        mismatches.is_empty(),
        "{} aggregates differ",
        mismatches.len()
    );
}

/// Sends `plan` through `publisher` in the background.
pub(crate) fn publish(
    publisher: &Publisher,
    plan: &Arc<Plan>,
) -> tokio::task::JoinHandle<inhook_tools::simulate::DeliveryReport> {
    let (publisher, plan) = (publisher.clone(), Arc::clone(plan));
    tokio::spawn(async move { publisher.deliver(plan).await })
}

/// Issue #12's "the same with a SIGKILL mid-run": the single node is killed at random
/// moments, each time with a request held on the wire, and restarted on its store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_through_sigkills_loses_nothing_and_keeps_order() {
    let seen = Seen::behaving(BEHAVIOUR);
    let port = serve_recording(&seen).await;
    let mut server = TestServer::spawn_with_sources(&destination(port, "a")).await;
    let (stream, plan) = chaos_stream_of(0x0012_c4a5, 1_200, 40);
    let endpoint = Endpoint::new(&server.url);
    // Paced so the stream spans every kill: about 7 s for the whole plan.
    let publisher = chaos_publisher(endpoint.clone(), 8, 200);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    let mut cuts = Vec::new();
    let mut kills = 0;
    while kills < KILLS && !sending.is_finished() {
        let pause = 600 + rand::random::<u64>() % 900;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let wire = kill_on_the_wire(&mut server, &seen, "a").await;
        cuts.extend(cut(&server, wire).await);
        kills += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
        tokio::task::block_in_place(|| server.restart());
        endpoint.set(&server.url);
    }
    let report = sending.await.expect("publisher task");
    assert!(
        kills >= 3,
        "the stream ended after {kills} kills: send slower"
    );
    assert!(
        report.failures.is_empty(),
        "deliveries failed: {:?}",
        &report.failures[..report.failures.len().min(5)]
    );
    let sent_s = started.elapsed().as_secs_f64();
    drain(&publisher, &stream, &server, &seen).await;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let figures = Figures::of(&seen, &server, &cuts).await;
    println!(
        "forwarding crash test ({}): {} events sent, {kills} kills; {}; sent in {sent_s:.1}s, \
         all forwarded after {:.1}s",
        Backend::fresh_kind(),
        stream.event_count(),
        figures.line(),
        started.elapsed().as_secs_f64()
    );
    figures.assert_clean();
}

/// Issue #12's "three nodes on PostgreSQL and one killed": the others take over the dead
/// node's leased deliveries, and no aggregate ever has two requests on the wire across nodes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_from_three_nodes_one_killed_keeps_one_request_per_aggregate() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let seen = Seen::behaving(BEHAVIOUR);
    let port = serve_recording(&seen).await;
    let first = TestServer::spawn_with_sources(&destination(port, "a")).await;
    let mut second = TestServer::join_with_sources(&first, &destination(port, "b")).await;
    let third = TestServer::join_with_sources(&first, &destination(port, "c")).await;
    let (stream, plan) = chaos_stream_of(0x0012_30de, 1_200, 40);
    let endpoint = Endpoint::many(&[&first.url, &second.url, &third.url]);
    let publisher = chaos_publisher(endpoint.clone(), 12, 300);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    let pause = 1_000 + rand::random::<u64>() % 1_500;
    tokio::time::sleep(Duration::from_millis(pause)).await;
    assert!(
        !sending.is_finished(),
        "the stream ended before the kill: send slower"
    );
    let wire = kill_on_the_wire(&mut second, &seen, "b").await;
    // The balancer notices; requests already sent to the dead node are retried on the others.
    endpoint.remove(&second.url);
    let cuts = cut(&first, wire).await;
    let report = sending.await.expect("publisher task");
    assert!(
        report.failures.is_empty(),
        "deliveries failed: {:?}",
        &report.failures[..report.failures.len().min(5)]
    );
    let sent_s = started.elapsed().as_secs_f64();
    drain(&publisher, &stream, &first, &seen).await;
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let figures = Figures::of(&seen, &first, &cuts).await;
    let mut by_node: Vec<(&String, &usize)> = seen.by_node.iter().collect();
    by_node.sort();
    println!(
        "forwarding multi-node test (postgres): 3 nodes, 1 killed after {pause} ms; {} events \
         sent; {}; requests by node {:?}; sent in {sent_s:.1}s, all forwarded after {:.1}s",
        stream.event_count(),
        figures.line(),
        by_node,
        started.elapsed().as_secs_f64()
    );
    figures.assert_clean();
    assert_eq!(by_node.len(), 3, "every node forwarded: {by_node:?}");
    drop(third);
}
