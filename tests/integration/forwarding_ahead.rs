//! The sender's buffer (docs/forwarding.md): a sender claims up to `concurrency`
//! deliveries ahead of its free request slots, so that a slot whose request ends sends the next at
//! once. What it claimed but never sent is given back at shutdown, so that the next node sends it
//! at once rather than when its lease runs out; and claiming ahead never breaks the order
//! of an aggregate's requests nor sends two of them at once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inhook::forward::queue::DeliveryStatus;
use inhook::store::{DeliveryFilter, DeliveryRecord};

use crate::application::{serve_application, serve_recording, Behaviour, Seen, DEST_SECRET};
use crate::conformance::delta;
use crate::support::TestServer;

/// An application that answers 204 after a delay the test sets, recording each request's event.
#[derive(Default)]
struct SlowApp {
    delay_ms: AtomicU64,
    received: Mutex<Vec<String>>,
}

/// Serves a [`SlowApp`] at `/hooks`; answers the port.
async fn serve_slow(app: &Arc<SlowApp>) -> u16 {
    serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(app): axum::extract::State<Arc<SlowApp>>,
                     headers: axum::http::HeaderMap| async move {
                        let event_id = headers["inhook-event-id"].to_str().unwrap().to_owned();
                        app.received.lock().unwrap().push(event_id);
                        let delay = app.delay_ms.load(Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        axum::http::StatusCode::NO_CONTENT
                    },
                ),
            )
            .with_state(Arc::clone(app)),
    )
    .await
}

/// Every delivery to the destination `app`, oldest first.
async fn deliveries(server: &TestServer) -> Vec<DeliveryRecord> {
    let mut items = server
        .store()
        .await
        .deliveries("app", &DeliveryFilter::default(), 10_000, None)
        .await
        .expect("deliveries")
        .items;
    items.reverse();
    items
}

/// A graceful shutdown gives back the deliveries claimed ahead and not sent (their claims
/// undone: pending, no attempt counted, no lease), and the next server on the store sends
/// them at once, each once, instead of after their 40 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_gives_back_deliveries_claimed_ahead_at_shutdown() {
    let app = Arc::new(SlowApp::default());
    app.delay_ms.store(2_000, Ordering::SeqCst);
    let port = serve_slow(&app).await;
    let mut server = TestServer::spawn_with_sources(&format!(
        r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"
timeout_s = 10
concurrency = 2
"#
    ))
    .await;
    let events: Vec<String> = (0..6).map(|i| format!("ahead-{i}")).collect();
    for (i, event_id) in events.iter().enumerate() {
        let body = delta(event_id, &format!("slot_{i}"), 1, 1);
        assert_eq!(server.post_save(&body).await.code, 202);
    }
    // Two requests on the wire, two more claimed for the slots to take next.
    server
        .wait_for("/v1/destinations", |r| r.body["items"][0]["in_flight"] == 4)
        .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while app.received.lock().unwrap().len() < 2 {
        assert!(Instant::now() < deadline, "no request arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(tokio::task::block_in_place(|| server.terminate()));

    let stopped = deliveries(&server).await;
    let sent = app.received.lock().unwrap().clone();
    assert_eq!(
        sent.len(),
        2,
        "only the requests on the wire went: {sent:?}"
    );
    for d in &stopped {
        if sent.contains(&d.event_id) {
            assert_eq!((d.status, d.attempts), (DeliveryStatus::Delivered, 1));
        } else {
            assert_eq!(
                (d.status, d.attempts, d.lease_owner.as_deref()),
                (DeliveryStatus::Pending, 0, None),
                "{}: given back, its claim undone",
                d.event_id
            );
        }
    }

    app.delay_ms.store(0, Ordering::SeqCst);
    let restarted = Instant::now();
    tokio::task::block_in_place(|| server.start());
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| items.len() == 6)
        })
        .await;
    let took = restarted.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "sent after {took:?}: waited for the leases"
    );
    let mut received = app.received.lock().unwrap().clone();
    received.sort();
    assert_eq!(received, events, "each event sent once");
    assert!(deliveries(&server)
        .await
        .iter()
        .all(|d| d.status == DeliveryStatus::Delivered && d.attempts == 1));
}

/// A slow application, many aggregates, a few slots: the sender keeps deliveries claimed
/// ahead (leased, so counted in flight: more than the slots), and through failures and
/// retries every aggregate's events are still first accepted in applied order, one
/// request of an aggregate on the wire at a time. (In flight may exceed twice the slots
/// by the finished requests whose verdicts are being written, as it exceeded the slots
/// before.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_claimed_ahead_keeps_order_per_aggregate() {
    const AGGREGATES: usize = 40;
    const EVENTS: i64 = 5;
    let seen = Seen::behaving(Behaviour {
        fail_rate: 0.1,
        accept_delay_ms: 50,
    });
    let port = serve_recording(&seen).await;
    let server = TestServer::spawn_with_sources(&format!(
        r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"
timeout_s = 1
concurrency = 4
max_attempts = 50
retry_base_s = 1
retry_max_delay_s = 1
"#
    ))
    .await;
    let slot = |a: usize| format!("slot_{a}");
    let event = |a: usize, seq: i64| format!("order-{a}-{seq}");
    let total = AGGREGATES * EVENTS as usize;
    let drained = AtomicBool::new(false);
    // Sampled from the first event on: most requests go while the events are still posted.
    let most_in_flight = async {
        let mut most = 0;
        while !drained.load(Ordering::SeqCst) {
            let stats = server.get("/v1/destinations").await;
            most = most.max(stats.body["items"][0]["in_flight"].as_u64().unwrap());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        most
    };
    let forwarded = async {
        // Each round's aggregates at once, so that the deliveries pile up ahead of the
        // slots even when the store decides slowly (a loaded PostgreSQL under the suite).
        for seq in 1..=EVENTS {
            let server = &server;
            let round = (0..AGGREGATES).map(|a| {
                let body = delta(&event(a, seq), &slot(a), seq, 1);
                async move { server.post_save(&body).await.code }
            });
            let codes = futures_util::future::join_all(round).await;
            assert!(codes.iter().all(|&code| code == 202), "{codes:?}");
        }
        let delivered = DeliveryFilter {
            status: Some(DeliveryStatus::Delivered),
            aggregate: None,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let store = server.store().await;
            let page = store.deliveries("app", &delivered, 10_000, None).await;
            let delivered = page.unwrap().items.len();
            if delivered == total {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{delivered} of {total} delivered in time"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drained.store(true, Ordering::SeqCst);
    };
    let (most_in_flight, ()) = tokio::join!(most_in_flight, forwarded);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!(
        "requests {}, failures {:?}, overlaps {}, most in flight {most_in_flight}",
        seen.requests, seen.failures, seen.overlaps
    );
    assert!(
        most_in_flight > 4,
        "never claimed ahead of the 4 slots: {most_in_flight}"
    );
    assert_eq!(
        seen.overlaps, 0,
        "two requests of one aggregate on the wire"
    );
    assert_eq!(seen.too_soon, 0, "a Retry-After not honoured");
    assert_eq!(seen.bad_signatures, 0);
    assert!(seen.failures.iter().sum::<usize>() > 0, "nothing failed");
    for a in 0..AGGREGATES {
        let accepted = seen
            .accepted
            .iter()
            .find(|(aggregate, _)| aggregate.ends_with(&format!("/{}", slot(a))))
            .map(|(_, accepted)| accepted.as_slice())
            .unwrap_or_default();
        let mut first: Vec<&str> = Vec::new();
        for (event_id, _) in accepted {
            if !first.contains(&event_id.as_str()) {
                first.push(event_id);
            }
        }
        let expected: Vec<String> = (1..=EVENTS).map(|seq| event(a, seq)).collect();
        assert_eq!(
            first,
            expected,
            "{}: first acceptances in applied order",
            slot(a)
        );
    }
    assert!(deliveries(&server)
        .await
        .iter()
        .all(|d| d.status == DeliveryStatus::Delivered));
}
