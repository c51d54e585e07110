//! Forwarding (docs/forwarding.md): what the application receives verifies with the
//! official Standard Webhooks library, as docs/contract.md (forwarding) promises ("so the
//! publishers' official libraries verify it").

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};

use inhook::forward::message::{request_headers, ForwardedEvent, WebhookId};
use inhook::forward::queue::DeliveryStatus;
use inhook::ingress::signature::Secret;
use serde_json::{json, Value};

use crate::application::{
    serve_application, serve_recording, Behaviour, Seen, DEST_SECRET, POISON,
};
use crate::support::now_s;

/// Verifies each (headers, body) with `standardwebhooks.Webhook.verify`; `None` when the
/// library is missing outside CI (CI sets `INHOOK_TEST_VECTORS=required`).
fn official_verdicts(
    secret: &str,
    requests: &[(Vec<(&'static str, String)>, &str)],
) -> Option<Vec<bool>> {
    const SCRIPT: &str = r#"
import json, sys
from standardwebhooks import Webhook
req = json.load(sys.stdin)
hook = Webhook(req["secret"])
out = []
for r in req["requests"]:
    try:
        hook.verify(r["body"].encode(), r["headers"])
        out.append(True)
    except Exception:
        out.append(False)
print(json.dumps(out))
"#;
    let input = json!({
        "secret": secret,
        "requests": requests.iter().map(|(headers, body)| json!({
            "headers": headers.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "body": body,
        })).collect::<Vec<_>>(),
    });
    let child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(err) => return unavailable(&format!("cannot run python3: {err}")),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&input).unwrap())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    if !output.status.success() {
        return unavailable(&String::from_utf8_lossy(&output.stderr));
    }
    let verdicts: Value = serde_json::from_slice(&output.stdout).expect("the verdicts");
    Some(
        verdicts
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_bool().unwrap())
            .collect(),
    )
}

fn unavailable(problem: &str) -> Option<Vec<bool>> {
    let hint = "pip install -r tests/vectors/requirements.txt";
    if std::env::var("INHOOK_TEST_VECTORS").as_deref() == Ok("required") {
        panic!("the official standardwebhooks library is unavailable ({hint}):\n{problem}");
    }
    eprintln!("SKIPPED: the official standardwebhooks library is unavailable ({hint}):\n{problem}");
    None
}

#[test]
fn forwarded_requests_verify_with_the_official_standard_webhooks_library() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let bodies = [
        r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#,
        "{ \"spaced\" : [1, 2.50, \"é\\u00e9\"],\n  \"kept\": true }",
    ];
    let now = now_s();
    let mut requests = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let event_id = format!("evt_{i}");
        let id = WebhookId::of("stripe", &event_id);
        let event = ForwardedEvent {
            webhook_id: &id,
            source: "stripe",
            event_id: &event_id,
            event_type: "invoice.paid",
            aggregate: "invoice/in_1",
            sequence: 1_700_000_000 + i as i64,
            body: body.as_bytes(),
            content_type: "application/json",
        };
        let attempt = i as u32 + 1;
        requests.push((
            request_headers(&event, Some(&Secret::new(secret)), attempt, now).unwrap(),
            *body,
        ));
    }
    // The same headers over a body changed by one byte must not verify.
    requests.push((
        requests[0].0.clone(),
        r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_2"}}}"#,
    ));
    let Some(verdicts) = official_verdicts(secret, &requests) else {
        return;
    };
    assert_eq!(verdicts, [true, true, false]);
}

/// The served path end to end: `inhook serve` with a destination forwards an applied
/// event, signed, to a real HTTP application (retrying its 503), and shows the
/// destination, its deliveries and the forwarding metrics; the secret shows nowhere.
#[tokio::test]
async fn a_configured_destination_is_served_and_forwarded_to() {
    use crate::conformance::delta;

    type Received = Arc<Mutex<Vec<(axum::http::HeaderMap, Vec<u8>)>>>;
    let received: Received = Arc::default();
    let port = serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(received): axum::extract::State<Received>,
                     headers: axum::http::HeaderMap,
                     body: axum::body::Bytes| async move {
                        let mut received = received.lock().unwrap();
                        received.push((headers, body.to_vec()));
                        if received.len() == 1 {
                            axum::http::StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            axum::http::StatusCode::NO_CONTENT
                        }
                    },
                ),
            )
            .with_state(Arc::clone(&received)),
    )
    .await;

    let server = crate::support::TestServer::spawn_with_sources(&format!(
        r#"
[[destinations]]
name = "app"
url = "http://user:pw@127.0.0.1:{port}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"
retry_base_s = 1
"#
    ))
    .await;
    let body = delta("fwd-1", "slot_a", 1, 2);
    let raw = serde_json::to_vec(&body).unwrap();
    assert_eq!(server.post_save(&body).await.code, 202);

    let page = server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
        })
        .await;
    let delivery = &page.body["items"][0];
    assert_eq!(delivery["event_id"], "fwd-1");
    assert_eq!(delivery["aggregate"], "player_1024/slot_a");
    assert_eq!(delivery["attempts"], 2);
    assert_eq!(
        delivery["webhook_id"],
        WebhookId::of("save-game", "fwd-1").as_str()
    );
    {
        let received = received.lock().unwrap();
        assert_eq!(received.len(), 2, "one 503, then the delivery");
        for (attempt, (headers, body)) in received.iter().enumerate() {
            assert_eq!(body, &raw, "byte for byte");
            assert_eq!(
                headers["inhook-attempt"],
                (attempt + 1).to_string().as_str()
            );
            assert_eq!(headers["webhook-id"], received[0].0["webhook-id"]);
            assert!(inhook::ingress::signature::verify(
                inhook::ingress::signature::Scheme::StandardWebhooks,
                headers,
                body,
                &[Secret::new(DEST_SECRET)],
                now_s(),
                300,
            )
            .is_ok());
        }
    }
    let empty = server
        .get("/v1/destinations/app/deliveries?status=dead&aggregate=player_1024/slot_a")
        .await;
    assert_eq!(empty.code, 200);
    assert_eq!(empty.body["items"], json!([]));
    assert_eq!(
        server.get("/v1/destinations/nope/deliveries").await.code,
        404
    );
    assert_eq!(
        server
            .get("/v1/destinations/app/deliveries?status=lost")
            .await
            .code,
        400
    );

    let listed = server.get("/v1/destinations").await;
    assert_eq!(listed.code, 200);
    let app = &listed.body["items"][0];
    assert_eq!(app["name"], "app");
    assert_eq!(app["circuit"], "closed");
    assert_eq!(
        (
            &app["backlog"],
            &app["in_flight"],
            &app["dead"],
            &app["blocked_aggregates"]
        ),
        (&json!(0), &json!(0), &json!(0), &json!(0))
    );
    assert_eq!(app["last_error"], "HTTP 503");
    let shown = listed.body.to_string();
    assert!(
        !shown.contains("pw@") && !shown.contains("whsec_"),
        "{shown}"
    );
    assert!(app["url"].as_str().unwrap().contains("***@"), "{shown}");

    server
        .wait_for_metric(
            "inhook_forward_attempts_total",
            &[("destination", "app"), ("outcome", "delivered")],
            1.0,
        )
        .await;
    server
        .wait_for_metric(
            "inhook_forward_attempts_total",
            &[("destination", "app"), ("outcome", "server_error")],
            1.0,
        )
        .await;
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(!log.contains("whsec_") && !log.contains("pw@"), "{log}");
}

/// Issue #14: events decided in the transaction that logs them (`decide_at_ingest`) are
/// forwarded as the worker's are: each row written once, already decided, with one
/// delivery that names it, and the application gets an aggregate's events in order.
#[tokio::test]
async fn events_decided_at_ingest_are_forwarded_in_order() {
    use crate::conformance::delta;

    let seen = Seen::behaving(Behaviour {
        fail_rate: 0.0,
        accept_delay_ms: 0,
    });
    let port = serve_recording(&seen).await;
    let mut server = crate::support::TestServer::in_process()
        .unstarted(
            "",
            "decide_at_ingest = true",
            &format!(
                r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"
"#
            ),
        )
        .await;
    server.start_in_process().await;
    let store = server.store().await;
    let bodies: Vec<Value> = (1..=3)
        .map(|seq| delta(&format!("fwd-at-ingest-{seq}"), "slot_a", seq, 1))
        .collect();
    for body in &bodies {
        assert_eq!(server.post_save(body).await.code, 202);
        let id = body["event_id"].as_str().unwrap();
        let row = store.event("save-game", id).await.unwrap().expect("logged");
        assert_eq!(
            (row.status.as_str(), row.decided_at_ms, row.attempts),
            ("processed", Some(row.received_at_ms), 1),
            "{id} decided at ingest as the worker records a decision"
        );
    }
    let page = server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| items.len() == 3)
        })
        .await;
    let mut forwarded: Vec<&str> = page.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|item| item["event_id"].as_str().unwrap())
        .collect();
    forwarded.sort_unstable();
    assert_eq!(
        forwarded,
        ["fwd-at-ingest-1", "fwd-at-ingest-2", "fwd-at-ingest-3"]
    );
    let sent: Vec<(String, Vec<u8>)> = bodies
        .iter()
        .map(|b| {
            let id = b["event_id"].as_str().unwrap().to_owned();
            (id, serde_json::to_vec(b).unwrap())
        })
        .collect();
    let seen = seen.lock().unwrap();
    assert_eq!(seen.requests, 3, "each once");
    assert_eq!(seen.bad_signatures, 0);
    assert_eq!(
        seen.accepted.values().collect::<Vec<_>>(),
        [&sent],
        "one aggregate, in order"
    );
}

/// docs/contract.md (forwarding) "the delivery rows are written in the same transaction as the
/// decision": a settle that fails after writing one destination's row leaves none, and the event
/// undecided; settled again, it writes every row once.
#[tokio::test]
async fn a_failed_settle_writes_no_delivery() {
    use crate::conformance::{delta, ingest, logged, slot, T0};
    use inhook::config::Config;
    use inhook::store::{DeliveryFilter, IngestLimits};

    let mut server = crate::support::TestServer::spawn().await;
    let store = server.store().await;
    server.terminate();
    let config = Config::from_parts(
        Some(
            r#"
            [[sources]]
            name = "saves"
            kind = "save-game"
            secrets = ["s"]
            [[destinations]]
            name = "app"
            url = "http://127.0.0.1:9/"
            sources = ["saves"]
            secret = "whsec_c2VjcmV0"
            [[destinations]]
            name = "broken"
            url = "http://127.0.0.1:9/"
            sources = ["saves"]
            secret = "whsec_c2VjcmV0"
            "#,
        ),
        &std::collections::HashMap::new(),
    )
    .expect("config");
    let rules = inhook::store::SourceRules::for_source(
        config.source("saves").expect("source"),
        &config.destinations,
    );
    server
        .run_sql(
            "CREATE TRIGGER deliveries_refuse BEFORE INSERT ON deliveries
                 WHEN NEW.destination = 'broken' BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            "CREATE FUNCTION deliveries_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'refused'; END $$;
             CREATE TRIGGER deliveries_refuse BEFORE INSERT ON deliveries FOR EACH ROW
                 WHEN (NEW.destination = 'broken') EXECUTE FUNCTION deliveries_refuse();",
        )
        .await;
    let body = delta("d1", "slot_a", 1, 2);
    logged(&ingest(&*store, &rules, &body, T0, IngestLimits::NONE, false).await);
    let aggregate = slot("slot_a");
    assert!(store.settle(&rules, &aggregate, T0 + 1).await.is_err());
    let none = DeliveryFilter::default();
    let app = store.deliveries("app", &none, 10, None).await.unwrap();
    assert!(
        app.items.is_empty(),
        "app's row went with the failed decision"
    );
    let event = store.event("saves", "d1").await.unwrap().expect("logged");
    assert_eq!(event.status, inhook::domain::EventStatus::Received);
    assert_eq!(store.aggregate("saves", &aggregate).await.unwrap(), None);

    server
        .run_sql(
            "DROP TRIGGER deliveries_refuse;",
            "DROP TRIGGER deliveries_refuse ON deliveries;",
        )
        .await;
    let report = store
        .settle(&rules, &aggregate, T0 + 2)
        .await
        .expect("settle");
    assert_eq!(report.applied, 1);
    for destination in ["app", "broken"] {
        let page = store
            .deliveries(destination, &none, 10, None)
            .await
            .unwrap();
        let events: Vec<&str> = page.items.iter().map(|d| d.event_id.as_str()).collect();
        assert_eq!(events, ["d1"], "{destination}");
    }
}

/// docs/contract.md (forwarding) against a real HTTP application that fails at random: per
/// aggregate one request at a time, first acceptances complete and in applied order, bodies byte
/// for byte, one `webhook-id` per event across retries, every request verifying; an aggregate whose
/// every request fails goes dead and blocks only itself (save-game inventory is in order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sender_forwards_in_order_per_aggregate_through_failures() {
    use crate::conformance::{delta, ingest_sync, slot};
    use inhook::config::Config;
    use inhook::forward::sender::Sender;
    use inhook::store::DeliveryFilter;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let port = serve_recording(&seen).await;

    let mut server = crate::support::TestServer::spawn().await;
    let store = server.store().await;
    server.terminate();
    let config = Config::from_parts(
        Some(&format!(
            r#"
            [[sources]]
            name = "saves"
            kind = "save-game"
            secrets = ["s"]
            [[destinations]]
            name = "app"
            url = "http://127.0.0.1:{port}/hooks"
            sources = ["saves"]
            secret = "{DEST_SECRET}"
            timeout_s = 1
            max_attempts = 4
            retry_max_delay_s = 1
            concurrency = 4
            "#
        )),
        &HashMap::new(),
    )
    .expect("config");
    // Retries in tens of milliseconds (the file counts whole seconds), Retry-After's 1 s kept.
    let mut destinations = config.destinations.to_vec();
    destinations[0].retry.base_ms = 20;
    let destinations: Arc<[_]> = destinations.into();
    let rules = inhook::store::SourceRules::for_source(
        config.source("saves").expect("source"),
        &destinations,
    );
    let senders = senders_of(&destinations, &store, &config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(Sender::run_all(
        senders,
        Arc::new(tokio::sync::Notify::new()),
        stop_rx,
    ));

    let slots: Vec<String> = (0..6).map(|i| format!("slot_{i}")).collect();
    const EVENTS: i64 = 8;
    let mut bodies: HashMap<String, Vec<u8>> = HashMap::new();
    for seq in 1..=EVENTS {
        for (i, name) in slots.iter().chain([&POISON.to_owned()]).enumerate() {
            if name == POISON && seq > 3 {
                continue;
            }
            let event_id = format!("{name}-{seq}");
            let body = delta(&event_id, name, seq, i as i64 + seq);
            bodies.insert(event_id, serde_json::to_vec(&body).unwrap());
            ingest_sync(&*store, &rules, body, inhook::domain::clock::now_ms()).await;
        }
        tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    }

    let poison = slot(POISON);
    let poisoned = DeliveryFilter {
        status: None,
        aggregate: Some(poison.clone()),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let done = {
            let seen = seen.lock().unwrap();
            slots.iter().all(|name| {
                seen.accepted
                    .iter()
                    .filter(|(aggregate, _)| aggregate.ends_with(name.as_str()))
                    .map(|(_, accepted)| accepted.len())
                    .sum::<usize>()
                    >= EVENTS as usize
            })
        };
        let poison_dead = store
            .deliveries("app", &poisoned, 10, None)
            .await
            .unwrap()
            .items
            .iter()
            .any(|d| d.status == DeliveryStatus::Dead);
        if done && poison_dead {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not forwarded in time"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let _ = stop_tx.send(true);
    running.await.unwrap();

    let shared = Arc::clone(&seen);
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    eprintln!(
        "requests {}, 500s {}, 429s {}, slow {}, overlaps {}, retried before Retry-After {}",
        seen.requests,
        seen.failures[0],
        seen.failures[1],
        seen.failures[2],
        seen.overlaps,
        seen.too_soon
    );
    assert_eq!(seen.overlaps, 0, "two requests of one aggregate in flight");
    assert_eq!(seen.too_soon, 0, "a Retry-After not honoured");
    assert_eq!(seen.bad_signatures, 0);
    assert!(
        seen.failures[0] > 0 && seen.failures[1] > 0,
        "the application failed too rarely to test retries"
    );
    for name in &slots {
        let (aggregate, accepted) = seen
            .accepted
            .iter()
            .find(|(aggregate, _)| aggregate.ends_with(name.as_str()))
            .expect("accepted");
        assert_eq!(*aggregate, format!("player_1024/{name}"));
        let mut first = Vec::new();
        for (event_id, body) in accepted {
            if !first.contains(event_id) {
                assert_eq!(body, &bodies[event_id], "{event_id}: body byte for byte");
                first.push(event_id.clone());
            }
        }
        let expected: Vec<String> = (1..=EVENTS).map(|seq| format!("{name}-{seq}")).collect();
        assert_eq!(first, expected, "first acceptances in applied order");
    }
    for (event_id, ids) in &seen.webhook_ids {
        let expected = WebhookId::of("saves", event_id).to_string();
        assert_eq!(
            ids.iter().collect::<Vec<_>>(),
            [&expected],
            "{event_id}: one webhook-id"
        );
    }
    // The poisoned aggregate: its first event dead after max_attempts requests, the
    // later ones never sent (blocked), everyone else delivered.
    assert!(!seen.accepted.keys().any(|a| a.ends_with(POISON)));
    let sent_poison: Vec<&String> = seen
        .webhook_ids
        .keys()
        .filter(|id| id.starts_with(POISON))
        .collect();
    assert_eq!(sent_poison, [&format!("{POISON}-1")]);
    let mut poisoned = store
        .deliveries("app", &poisoned, 10, None)
        .await
        .unwrap()
        .items;
    poisoned.reverse();
    let statuses: Vec<(DeliveryStatus, i64)> =
        poisoned.iter().map(|d| (d.status, d.attempts)).collect();
    assert_eq!(
        statuses,
        [
            (DeliveryStatus::Dead, 4),
            (DeliveryStatus::Pending, 0),
            (DeliveryStatus::Pending, 0)
        ]
    );
    let dead = store
        .delivery("app", poisoned[0].id)
        .await
        .unwrap()
        .expect("dead one");
    assert_eq!(dead.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!(dead.history.len(), 4);
    for name in &slots {
        let filter = DeliveryFilter {
            status: None,
            aggregate: Some(slot(name)),
        };
        let page = store.deliveries("app", &filter, 50, None).await.unwrap();
        assert_eq!(page.items.len(), EVENTS as usize);
        assert!(page
            .items
            .iter()
            .all(|d| d.status == DeliveryStatus::Delivered));
    }

    // The application fixed, a bulk replay of the dead one (stepped by the node's replay
    // task, which wakes the senders) sends it, and the aggregate it blocked follows in order.
    shared.lock().unwrap().cured = true;
    let senders = senders_of(&destinations, &store, &config);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let forward_wake = Arc::new(tokio::sync::Notify::new());
    let replays = tokio::spawn(
        inhook::runtime::replays::BulkReplays {
            store: store.clone(),
            worker_wake: Arc::new(tokio::sync::Notify::new()),
            forward_wake: Arc::clone(&forward_wake),
            forwarding: true,
            clock: inhook::domain::clock::Clock::System,
        }
        .run(stop_rx.clone()),
    );
    let running = tokio::spawn(Sender::run_all(senders, forward_wake, stop_rx));
    let dead_only = DeliveryFilter {
        status: Some(DeliveryStatus::Dead),
        aggregate: Some(poison.clone()),
    };
    let job = store
        .create_delivery_replay_job("app", &dead_only, inhook::domain::clock::now_ms())
        .await
        .expect("bulk replay");
    assert_eq!(job.total, 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let accepted = loop {
        let accepted = shared
            .lock()
            .unwrap()
            .accepted
            .get(&format!("player_1024/{POISON}"))
            .map_or(0, Vec::len);
        if accepted >= 3 {
            break shared.lock().unwrap().accepted[&format!("player_1024/{POISON}")].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the replay never arrived"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let _ = stop_tx.send(true);
    running.await.unwrap();
    replays.await.unwrap();
    let order: Vec<&str> = accepted.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(
        order,
        (1..=3)
            .map(|seq| format!("{POISON}-{seq}"))
            .collect::<Vec<_>>()
    );
    assert_eq!(shared.lock().unwrap().overlaps, 0);
    let job = store
        .delivery_replay_job(job.id)
        .await
        .unwrap()
        .expect("job");
    assert_eq!((job.state.as_str(), job.requeued), ("done", 1));
}

/// docs/contract.md's (forwarding) circuit: a destination that refuses every connection, across
/// several aggregates, is paused (`open` in `GET /v1/destinations`), nothing is lost or given up
/// meanwhile, and once it is back the probe closes the circuit and everything arrives.
#[tokio::test]
async fn a_down_destination_opens_the_circuit_and_loses_nothing() {
    use crate::conformance::delta;

    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let server = crate::support::TestServer::in_process()
        .spawn_with_sources(&format!(
            r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"
retry_base_s = 1
retry_max_delay_s = 2
max_attempts = 100
"#
        ))
        .await;
    for i in 0..5 {
        let body = delta(&format!("down-{i}"), &format!("slot_{i}"), 1, 1);
        assert_eq!(server.post_save(&body).await.code, 202);
    }
    let open = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["circuit"] == "open"
        })
        .await;
    let app = &open.body["items"][0];
    assert_eq!(app["dead"], 0);
    assert!(app["circuit_open_until"].is_string(), "{app}");
    assert!(
        app["last_error"]
            .as_str()
            .is_some_and(|e| e.starts_with("connection failed")),
        "{app}"
    );

    let received: Arc<Mutex<Vec<String>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .expect("the destination's port again");
    let app = axum::Router::new()
        .route(
            "/hooks",
            axum::routing::post(
                |axum::extract::State(received): axum::extract::State<Arc<Mutex<Vec<String>>>>,
                 headers: axum::http::HeaderMap| async move {
                    let event_id = headers["inhook-event-id"].to_str().unwrap().to_owned();
                    received.lock().unwrap().push(event_id);
                    axum::http::StatusCode::OK
                },
            ),
        )
        .with_state(Arc::clone(&received));
    tokio::spawn(async move { axum::serve(listener, app).await });

    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| items.len() == 5)
        })
        .await;
    let closed = server.get("/v1/destinations").await;
    assert_eq!(closed.body["items"][0]["circuit"], "closed");
    assert_eq!(closed.body["items"][0]["backlog"], 0);
    let mut received = received.lock().unwrap().clone();
    received.sort();
    received.dedup();
    assert_eq!(
        received,
        (0..5).map(|i| format!("down-{i}")).collect::<Vec<_>>()
    );
}

/// docs/contract.md "Circuit": an application refusing one publisher's events (400)
/// answered, so it is up: the circuit stays closed however many it refuses, across
/// aggregates, and another source's events keep flowing to the same destination.
#[tokio::test]
async fn refused_events_do_not_open_the_circuit() {
    use crate::conformance::{delta, presence};

    let received: Arc<Mutex<Vec<String>>> = Arc::default();
    let port = serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(received): axum::extract::State<
                        Arc<Mutex<Vec<String>>>,
                    >,
                     headers: axum::http::HeaderMap| async move {
                        if headers["inhook-source"] == "save-game" {
                            return axum::http::StatusCode::BAD_REQUEST;
                        }
                        let id = headers["inhook-event-id"].to_str().unwrap().to_owned();
                        received.lock().unwrap().push(id);
                        axum::http::StatusCode::OK
                    },
                ),
            )
            .with_state(Arc::clone(&received)),
    )
    .await;
    let server = crate::support::TestServer::in_process()
        .spawn_with_sources(&one_try_destination(port))
        .await;
    for i in 0..15 {
        let body = delta(&format!("refused-{i}"), &format!("slot_{i}"), 1, 1);
        assert_eq!(server.post_save(&body).await.code, 202);
    }
    server
        .wait_for("/v1/destinations", |r| r.body["items"][0]["dead"] == 15)
        .await;
    let listed = server.get("/v1/destinations").await;
    assert_eq!(
        listed.body["items"][0]["circuit"], "closed",
        "{}",
        listed.body
    );
    for i in 0..3 {
        let body = presence(&format!("flows-{i}"), &format!("u{i}"), "ONLINE", 1);
        assert_eq!(server.post_presence(&body).await.code / 100, 2);
    }
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| items.len() == 3)
        })
        .await;
    assert_eq!(
        server.get("/v1/destinations").await.body["items"][0]["circuit"],
        "closed"
    );
    assert_eq!(received.lock().unwrap().len(), 3);
}

/// docs/contract.md (forwarding) "TLS": an `https://` destination is verified; a private CA is
/// trusted only through `tls_ca_file` (the system's roots do not know it).
#[tokio::test]
async fn an_https_destination_is_verified_against_tls_ca_file() {
    let ca = crate::support::tls::TestCa::new();
    let ca_file = ca.file();
    let app = serve_application(axum::Router::new().route(
        "/hooks",
        axum::routing::post(|| async { axum::http::StatusCode::NO_CONTENT }),
    ))
    .await;
    let port = ca.https_front(([127, 0, 0, 1], app).into());

    let url = format!("https://localhost:{port}/hooks");
    let trusted = inhook::forward::sink::http::http_client(Some(&ca_file)).unwrap();
    let answer = trusted
        .post(&url)
        .body("{}")
        .send()
        .await
        .expect("verified");
    assert_eq!(answer.status().as_u16(), 204);
    let system = inhook::forward::sink::http::http_client(None).unwrap();
    let refused = system.post(&url).body("{}").send().await.unwrap_err();
    assert!(refused.is_connect(), "{refused:?}");
    let problem =
        inhook::forward::outbound::certificate_problem(&refused).expect("a certificate refusal");
    assert!(problem.contains("UnknownIssuer"), "{problem}");

    // The served forwarder: the destination with the CA is delivered to; the one without
    // keeps retrying and shows which certificate check refused it.
    let server = crate::support::TestServer::in_process()
        .spawn_with_sources(&format!(
            r#"
[[destinations]]
name = "trusted"
url = "{url}"
sources = ["save-game"]
secret = "{DEST_SECRET}"
tls_ca_file = "{}"

[[destinations]]
name = "untrusted"
url = "{url}"
sources = ["save-game"]
secret = "{DEST_SECRET}"
"#,
            ca_file.display()
        ))
        .await;
    let body = crate::conformance::delta("tls-1", "slot_a", 1, 2);
    assert_eq!(server.post_save(&body).await.code, 202);
    server
        .wait_for(
            "/v1/destinations/trusted/deliveries?status=delivered",
            |r| r.body["items"][0]["event_id"] == "tls-1",
        )
        .await;
    let listed = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|d| d["name"] == "untrusted" && d["last_error"].is_string())
        })
        .await;
    let untrusted = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "untrusted")
        .unwrap();
    let error = untrusted["last_error"].as_str().unwrap();
    assert!(error.contains("UnknownIssuer"), "{error}");
}

/// What the application of [`replay_and_skip_unblock_a_dead_delivery_over_http`] saw.
#[derive(Default)]
struct Ledger {
    /// Event ids answered 500 (the application's bug) until removed (fixed).
    failing: std::collections::HashSet<String>,
    /// Every request's event id, in arrival order, answered or not.
    requests: Vec<String>,
    /// Event ids accepted (2xx), in arrival order.
    accepted: Vec<String>,
}

/// A destination `app` at `port` taking both default sources, each delivery tried once.
/// Senders for `destinations`, signing with the secrets of `config`.
fn senders_of(
    destinations: &[inhook::config::DestinationConfig],
    store: &Arc<dyn inhook::store::Store>,
    config: &inhook::config::Config,
) -> Vec<inhook::forward::sender::Sender> {
    inhook::forward::sender::Sender::for_destinations(
        destinations,
        store,
        inhook::domain::clock::Clock::System,
        &inhook::config::LiveSecrets::of(config),
    )
    .expect("senders")
}

fn one_try_destination(port: u16) -> String {
    format!(
        r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["save-game", "presence"]
secret = "{DEST_SECRET}"
max_attempts = 1
"#
    )
}

/// Posts `body` as JSON to the admin route `path`; its status and JSON answer.
pub(crate) async fn admin_post(
    server: &crate::support::TestServer,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .post(format!("{}{path}", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = answer.status().as_u16();
    (code, answer.json().await.unwrap_or(Value::Null))
}

/// The id of `event_id`'s delivery to `app`, once it is `status`.
async fn delivery_id(server: &crate::support::TestServer, event_id: &str, status: &str) -> i64 {
    let page = server
        .wait_for(
            &format!("/v1/destinations/app/deliveries?status={status}&limit=500"),
            |r| {
                r.body["items"]
                    .as_array()
                    .is_some_and(|items| items.iter().any(|d| d["event_id"] == event_id))
            },
        )
        .await;
    page.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["event_id"] == event_id)
        .and_then(|d| d["id"].as_i64())
        .expect("delivery id")
}

/// Waits until the application accepted every one of `events`.
async fn wait_accepted(ledger: &Arc<Mutex<Ledger>>, events: &[&str]) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if events
            .iter()
            .all(|e| ledger.lock().unwrap().accepted.iter().any(|a| a == e))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{events:?} not delivered: {:?}",
            ledger.lock().unwrap().accepted
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// docs/contract.md's (forwarding) way out of a dead delivery, over the admin API against a real
/// application: a dead in-order delivery blocks its aggregate; skipped, the later events follow in
/// order; replayed once the application is fixed, it goes first, then the rest; a bulk
/// replay does the same for a whole aggregate; a latest-wins replay after a newer one was
/// delivered is `superseded` and not sent. Wrong states are 409s with their code.
#[tokio::test]
async fn replay_and_skip_unblock_a_dead_delivery_over_http() {
    use crate::conformance::{delta, presence};

    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    ledger.lock().unwrap().failing = ["a-1", "b-1", "c-1", "p-1"]
        .into_iter()
        .map(String::from)
        .collect();
    let port = serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(ledger): axum::extract::State<Arc<Mutex<Ledger>>>,
                     headers: axum::http::HeaderMap| async move {
                        let event_id = headers["inhook-event-id"].to_str().unwrap().to_owned();
                        let mut ledger = ledger.lock().unwrap();
                        ledger.requests.push(event_id.clone());
                        if ledger.failing.contains(&event_id) {
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            ledger.accepted.push(event_id);
                            axum::http::StatusCode::NO_CONTENT
                        }
                    },
                ),
            )
            .with_state(Arc::clone(&ledger)),
    )
    .await;
    let server = crate::support::TestServer::spawn_with_sources(&one_try_destination(port)).await;
    let sent = |event: &str| {
        ledger
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|e| *e == event)
            .count()
    };
    let order_of = |events: &[&str]| -> Vec<String> {
        ledger
            .lock()
            .unwrap()
            .accepted
            .iter()
            .filter(|e| events.contains(&e.as_str()))
            .cloned()
            .collect()
    };

    for (slot, prefix) in [("slot_a", "a"), ("slot_b", "b"), ("slot_c", "c")] {
        for seq in 1..=3 {
            let body = delta(&format!("{prefix}-{seq}"), slot, seq, 1);
            assert_eq!(server.post_save(&body).await.code, 202);
        }
    }
    let a1 = delivery_id(&server, "a-1", "dead").await;
    let b1 = delivery_id(&server, "b-1", "dead").await;
    delivery_id(&server, "c-1", "dead").await;
    let a2 = delivery_id(&server, "a-2", "pending").await;

    // `inhook deliveries` reads the same from the store.
    let (ok, out) = server.cli(&["deliveries", "--destination", "app", "--status", "dead"]);
    assert!(ok, "{out}");
    let dead: Vec<&str> = out
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().nth(3))
        .collect();
    assert_eq!(dead, ["c-1", "b-1", "a-1"], "{out}");
    assert!(out.contains("HTTP 500"), "{out}");
    let (ok, out) = server.cli(&[
        "deliveries",
        "--destination",
        "app",
        "--aggregate",
        "player_1024/slot_a",
        "--limit",
        "2",
    ]);
    assert!(ok, "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "header, two, more: {out}");
    assert!(
        lines[1].contains(" a-3 ") && lines[2].contains(" a-2 "),
        "{out}"
    );
    let (ok, out) = server.cli(&["deliveries", "--destination", "app", "--status", "lost"]);
    assert!(!ok && out.contains("expected one of"), "{out}");

    // Dead and blocking: nothing later of those aggregates was sent. A short bounded wait:
    // a marker delivery of another aggregate would prove the sender's pass, but it would
    // change the delivery counts and lag samples this test asserts below.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    for later in ["a-2", "a-3", "b-2", "b-3", "c-2", "c-3"] {
        assert_eq!(sent(later), 0, "{later} passed its dead predecessor");
    }
    let listed = server.get("/v1/destinations").await;
    assert_eq!(listed.body["items"][0]["blocked_aggregates"], 3);
    // The gauges, read at scrape: six deliveries wait behind three blocked aggregates.
    let app = [("destination", "app")];
    server
        .wait_for_metric("inhook_forward_blocked_aggregates", &app, 3.0)
        .await;
    server
        .wait_for_metric("inhook_forward_backlog", &app, 6.0)
        .await;
    let open = listed.body["items"][0]["circuit"] != "closed";
    server
        .wait_for_metric(
            "inhook_forward_circuit_open",
            &app,
            f64::from(u8::from(open)),
        )
        .await;
    let one = server
        .get(&format!("/v1/destinations/app/deliveries/{a1}"))
        .await;
    assert_eq!(one.code, 200);
    assert_eq!(one.body["status"], "dead");
    assert_eq!(one.body["history"].as_array().unwrap().len(), 1);
    assert_eq!(one.body["history"][0]["status"], 500);

    // Unknown ones, and states that allow neither.
    let (code, body) = admin_post(
        &server,
        "/v1/destinations/nope/deliveries/1/skip",
        json!({}),
    )
    .await;
    assert_eq!(
        (code, body["error"].as_str()),
        (404, Some("unknown_destination"))
    );
    let (code, body) = admin_post(
        &server,
        "/v1/destinations/app/deliveries/999999/replay",
        json!({}),
    )
    .await;
    assert_eq!(
        (code, body["error"].as_str()),
        (404, Some("unknown_delivery"))
    );
    assert_eq!(
        server
            .get("/v1/destinations/app/deliveries/999999")
            .await
            .code,
        404
    );
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{a2}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(
        (code, body["error"].as_str()),
        (409, Some("not_replayable"))
    );
    assert!(
        body["detail"].as_str().unwrap().contains("pending"),
        "{body}"
    );
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{a2}/skip"),
        json!({}),
    )
    .await;
    assert_eq!((code, body["error"].as_str()), (409, Some("not_skippable")));

    // Skipped: the aggregate's later events follow, in order; a-1 is never sent again.
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{a1}/skip"),
        json!({}),
    )
    .await;
    assert_eq!(
        (code, &body),
        (200, &json!({"status": "skipped", "delivery_id": a1}))
    );
    wait_accepted(&ledger, &["a-2", "a-3"]).await;
    assert_eq!(order_of(&["a-1", "a-2", "a-3"]), ["a-2", "a-3"]);
    assert_eq!(sent("a-1"), 1);
    // Replaying the skipped one now would put it after a-2: refused.
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{a1}/replay"),
        json!({}),
    )
    .await;
    assert_eq!((code, body["error"].as_str()), (409, Some("would_reorder")));

    // Fixed, replayed: b-1 first, then the rest, in order.
    ledger.lock().unwrap().failing.remove("b-1");
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{b1}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(
        (code, &body),
        (202, &json!({"status": "requeued", "delivery_id": b1}))
    );
    wait_accepted(&ledger, &["b-1", "b-2", "b-3"]).await;
    assert_eq!(order_of(&["b-1", "b-2", "b-3"]), ["b-1", "b-2", "b-3"]);

    // Fixed, bulk-replayed by aggregate: a persisted job, then c in order.
    ledger.lock().unwrap().failing.remove("c-1");
    let (code, job) = admin_post(
        &server,
        "/v1/destinations/app/replay",
        json!({"status": "dead", "aggregate": "player_1024/slot_c"}),
    )
    .await;
    assert_eq!(code, 202, "{job}");
    assert_eq!(job["total"], 1);
    assert_eq!(job["filter_aggregate"], "player_1024/slot_c");
    wait_accepted(&ledger, &["c-1", "c-2", "c-3"]).await;
    assert_eq!(order_of(&["c-1", "c-2", "c-3"]), ["c-1", "c-2", "c-3"]);
    let job_path = format!("/v1/destinations/app/replay/{}", job["job_id"]);
    let done = server
        .wait_for(&job_path, |r| r.body["state"] == "done")
        .await;
    assert_eq!(done.body["requeued"], 1);
    assert_eq!(
        server.get("/v1/destinations/app/replay/999999").await.code,
        404
    );
    let (code, _) = admin_post(
        &server,
        "/v1/destinations/app/replay",
        json!({"status": "delivered"}),
    )
    .await;
    assert_eq!(code, 400);

    // Latest-wins: p-1 died, p-2 was delivered since; replaying p-1 is superseded, unsent.
    assert_eq!(
        server
            .post_presence(&presence("p-1", "u1", "ONLINE", 1))
            .await
            .code
            / 100,
        2
    );
    let p1 = delivery_id(&server, "p-1", "dead").await;
    assert_eq!(
        server
            .post_presence(&presence("p-2", "u1", "OFFLINE", 2))
            .await
            .code
            / 100,
        2
    );
    let p2 = delivery_id(&server, "p-2", "delivered").await;
    ledger.lock().unwrap().failing.remove("p-1");
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{p1}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(
        (code, &body),
        (
            200,
            &json!({"status": "superseded", "delivery_id": p1, "superseded_by": p2})
        )
    );
    // A short bounded wait: a marker delivery would change the lag samples counted below.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(sent("p-1"), 1, "a superseded delivery was sent again");
    let listed = server.get("/v1/destinations").await;
    assert_eq!(listed.body["items"][0]["blocked_aggregates"], 0);
    server
        .wait_for_metric("inhook_forward_blocked_aggregates", &app, 0.0)
        .await;
    server
        .wait_for_metric("inhook_forward_backlog", &app, 0.0)
        .await;
    // One lag sample per delivered delivery: a-2, a-3, b-1..3, c-1..3, p-2.
    server
        .wait_for_metric("inhook_forward_lag_seconds_count", &app, 9.0)
        .await;
}

/// `inhook listen`: forwarded by a real server, each request verifies and is printed as
/// one line (aggregate, sequence, type, id); a bad signature is answered 401, not printed.
#[tokio::test]
async fn inhook_listen_verifies_and_prints_forwarded_requests() {
    use std::io::BufRead;

    let mut listen = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["listen", "--port", "0", "--secret", DEST_SECRET])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("inhook listen");
    let (lines_tx, lines) = std::sync::mpsc::channel::<String>();
    let stdout = listen.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let next = || {
        lines
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a line from inhook listen")
    };
    let first = next();
    let address = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("{first}"))
        .to_owned();

    // Not signed with the secret: 401, nothing printed.
    let bad = reqwest::Client::new()
        .post(format!("{address}/hooks"))
        .header("webhook-id", "msg_1")
        .header("webhook-timestamp", now_s().to_string())
        .header("webhook-signature", "v1,AAAA")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 401);

    let server = crate::support::TestServer::spawn_with_sources(&format!(
        r#"
[[destinations]]
name = "app"
url = "{address}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"
"#
    ))
    .await;
    for seq in 1..=2 {
        let body = crate::conformance::delta(&format!("l-{seq}"), "slot_l", seq, 1);
        assert_eq!(server.post_save(&body).await.code, 202);
    }
    let printed = [next(), next()];
    // Killed only once both were delivered: it prints a request before answering it.
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"].as_array().is_some_and(|i| i.len() == 2)
        })
        .await;
    let _ = listen.kill();
    let _ = listen.wait();
    assert_eq!(
        printed,
        [1, 2].map(|seq| format!(
            "aggregate=player_1024/slot_l sequence={seq} type=inventory.updated id=l-{seq}"
        ))
    );
}

/// The event whose first request the application of
/// [`senders_are_woken_by_commits_and_retries_not_by_the_poll`] fails.
const FAILS_ONCE: &str = "r-1";

/// docs/contract.md's (forwarding) forwarding without waiting for a poll: with the idle poll at ten
/// minutes, an event applied by the worker (save-game, async) or at ingress (presence, sync) is
/// sent at once, a failed request is retried when its backoff ends, and a dead delivery
/// replayed over the API goes out: each wakes the sender, or nothing would arrive
/// within the wait.
#[tokio::test]
async fn senders_are_woken_by_commits_and_retries_not_by_the_poll() {
    use crate::conformance::{delta, presence};

    let ledger: Arc<Mutex<Ledger>> = Arc::default();
    ledger.lock().unwrap().failing.insert("x-1".into());
    let port = serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(ledger): axum::extract::State<Arc<Mutex<Ledger>>>,
                     headers: axum::http::HeaderMap| async move {
                        let event_id = headers["inhook-event-id"].to_str().unwrap().to_owned();
                        let mut ledger = ledger.lock().unwrap();
                        let first = !ledger.requests.contains(&event_id);
                        ledger.requests.push(event_id.clone());
                        if ledger.failing.contains(&event_id) || (first && event_id == FAILS_ONCE) {
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR
                        } else {
                            ledger.accepted.push(event_id);
                            axum::http::StatusCode::NO_CONTENT
                        }
                    },
                ),
            )
            .with_state(Arc::clone(&ledger)),
    )
    .await;
    let server = crate::support::TestServer::in_process()
        .spawn_top_and_sources(
            "forward_poll_ms = 600000",
            &format!(
                r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["save-game", "presence"]
secret = "{DEST_SECRET}"
max_attempts = 2
retry_base_s = 1
retry_max_delay_s = 1
"#
            ),
        )
        .await;

    assert_eq!(
        server.post_save(&delta("w-1", "slot_w", 1, 1)).await.code,
        202
    );
    wait_accepted(&ledger, &["w-1"]).await;
    assert_eq!(
        server
            .post_presence(&presence("p-1", "u_wake", "ONLINE", 1))
            .await
            .code
            / 100,
        2
    );
    wait_accepted(&ledger, &["p-1"]).await;

    // Retried once its backoff (1 s) ends, though no commit wakes the sender then.
    assert_eq!(
        server
            .post_save(&delta(FAILS_ONCE, "slot_r", 1, 1))
            .await
            .code,
        202
    );
    wait_accepted(&ledger, &[FAILS_ONCE]).await;
    let retried = delivery_id(&server, FAILS_ONCE, "delivered").await;
    let detail = server
        .get(&format!("/v1/destinations/app/deliveries/{retried}"))
        .await;
    assert_eq!(detail.body["attempts"], 2, "{}", detail.body);

    // Dead after its two attempts; replayed once the application is fixed.
    assert_eq!(
        server.post_save(&delta("x-1", "slot_x", 1, 1)).await.code,
        202
    );
    let dead = delivery_id(&server, "x-1", "dead").await;
    ledger.lock().unwrap().failing.clear();
    let (code, body) = admin_post(
        &server,
        &format!("/v1/destinations/app/deliveries/{dead}/replay"),
        json!({}),
    )
    .await;
    assert_eq!(code, 202, "{body}");
    wait_accepted(&ledger, &["x-1"]).await;
    let requests = ledger.lock().unwrap().requests.clone();
    assert_eq!(requests, ["w-1", "p-1", "r-1", "r-1", "x-1", "x-1", "x-1"]);
}
