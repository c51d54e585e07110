//! Event ids taken from the body (`event_id = "body"`), batches (`batch = true`) and a
//! source's own answer (`response`), end to end over HTTP (docs/configuration.md, json
//! sources): Zoom-like bodies re-signed on a retry, SendGrid-like arrays of events, Slack
//! command and Discord-like answers.

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::support::{now_s, signed, Reply, TestServer};

const SOURCES: &str = r#"
[[sources]]
name = "zoom"
kind = "json"
mode = "sync"
signature = "hmac-timestamped"
secrets = ["zoom-secret"]
event_id = "body"
aggregate = "/payload/object/id"
event_type = "/event"
state = "/payload/object"
ordering = "unordered"

[[sources]]
name = "sendgrid"
kind = "json"
signature = "hmac-timestamped"
secrets = ["sg-secret"]
batch = true
batch_max_events = 5
event_id = "/sg_event_id"
aggregate = "/email"
sequence = "/timestamp"
event_type = "/event"
ordering = "latest-wins"

[[sources]]
name = "sendgrid-sync"
kind = "json"
mode = "sync"
signature = "hmac-timestamped"
secrets = ["sg-secret"]
batch = true
event_id = "/sg_event_id"
aggregate = "/email"
sequence = "/timestamp"
event_type = "/event"
ordering = "latest-wins"

[[sources]]
name = "sendgrid-limited"
kind = "json"
mode = "sync"
signature = "hmac-timestamped"
secrets = ["sg-secret"]
batch = true
rate_limit_per_s = 2
event_id = "/sg_event_id"
aggregate = "/email"
sequence = "/timestamp"
event_type = "/event"
ordering = "latest-wins"

[[sources]]
name = "commands"
kind = "json"
mode = "sync"
signature = "slack"
secrets = ["slack-secret"]
body_format = "form"
event_id = "/trigger_id"
aggregate = "/team_id"
ordering = "unordered"
response = { status = 200, content_type = "text/plain; charset=utf-8", body = "Deploying web…" }

[[sources]]
name = "interactions"
kind = "json"
signature = "hmac-timestamped"
secrets = ["discord-secret"]
event_id = "/id"
ordering = "unordered"
response = { status = 200, content_type = "application/json", body = '{"type":5}' }
"#;

/// Posts `body` to `source` signed with `scheme` at `at`, as `content_type`.
async fn post_at(
    server: &TestServer,
    source: &str,
    scheme: Scheme,
    secret: &str,
    body: &[u8],
    content_type: &str,
    at: i64,
) -> Reply {
    let mut headers: Vec<(&str, String)> = signed(scheme, secret, body, at)
        .into_iter()
        .filter(|(name, _)| *name != "content-type")
        .collect();
    headers.push(("content-type", content_type.to_owned()));
    server.post_raw(source, body, &headers).await
}

/// Posts a JSON body to an `hmac-timestamped` source, signed now.
async fn post_json(server: &TestServer, source: &str, secret: &str, body: &[u8]) -> Reply {
    post_at(
        server,
        source,
        Scheme::HmacTimestamped,
        secret,
        body,
        "application/json",
        now_s(),
    )
    .await
}

/// A SendGrid Event Webhook event, shaped as SendGrid documents it.
fn sendgrid_event(id: &str, email: &str, event: &str, timestamp: i64) -> Value {
    json!({
        "email": email,
        "timestamp": timestamp,
        "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
        "event": event,
        "category": ["cat facts"],
        "sg_event_id": id,
        "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
    })
}

/// A batch as SendGrid sends it: a JSON array, pretty-printed, so that the elements'
/// slices are not what re-serialising them would give.
fn batch(events: &[Value]) -> Vec<u8> {
    serde_json::to_vec_pretty(&Value::Array(events.to_vec())).unwrap()
}

fn zoom_event(meeting: &str, topic: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "event": "meeting.started",
        "event_ts": 1_626_230_691_572_i64,
        "payload": {"account_id": "AAAAAABBBB", "object": {"id": meeting, "topic": topic}},
    }))
    .unwrap()
}

#[tokio::test]
async fn a_body_id_is_its_sha256_and_a_resigned_retry_is_a_body_duplicate() {
    let server = TestServer::spawn_with_sources(SOURCES).await;
    let body = zoom_event("85746065", "Standup");
    let id = hex::encode(Sha256::digest(&body));
    let r = post_json(&server, "zoom", "zoom-secret", &body).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    let detail = server.get(&format!("/v1/events/zoom/{id}")).await;
    assert_eq!(detail.code, 200, "{:?}", detail.body);
    assert_eq!(detail.body["event_type"], "meeting.started");

    // Zoom retries the same body signed again, at another time: a duplicate by body.
    let r = post_at(
        &server,
        "zoom",
        Scheme::HmacTimestamped,
        "zoom-secret",
        &body,
        "application/json",
        now_s() - 30,
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({"status": "duplicate", "event_id": id, "key": "body"})
    );
    server
        .wait_for_metric(
            "inhook_duplicates_total",
            &[("source", "zoom"), ("key", "body")],
            1.0,
        )
        .await;

    // A changed body is a new event, and the state reads back.
    let changed = zoom_event("85746065", "Standup (moved)");
    let r = post_json(&server, "zoom", "zoom-secret", &changed).await;
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    let shown = server.get("/v1/sources/zoom/aggregates/85746065").await;
    assert_eq!(shown.code, 200, "{:?}", shown.body);
    assert_eq!(
        shown.body["state"],
        json!({"id": "85746065", "topic": "Standup (moved)"})
    );
    assert_eq!(
        shown.body["event_id"],
        hex::encode(Sha256::digest(&changed))
    );
    assert_eq!(server.count().await, 2);
}

#[tokio::test]
async fn a_batch_logs_each_element_as_its_own_event_with_its_own_bytes() {
    let server = TestServer::spawn_with_sources(SOURCES).await;
    // Two events of one address, the later one first in the array; one of another.
    let events = [
        sendgrid_event("sg-2", "ann@example.com", "delivered", 1_513_299_600),
        sendgrid_event("sg-1", "ann@example.com", "processed", 1_513_299_569),
        sendgrid_event("sg-3", "bob@example.com", "open", 1_513_299_570),
    ];
    let body = batch(&events);
    let r = post_json(&server, "sendgrid", "sg-secret", &body).await;
    assert_eq!(r.code, 202, "{:?}", r.body);
    assert_eq!(r.body["status"], "batch", "{:?}", r.body);
    assert_eq!(r.body["logged"], 3);
    assert_eq!(r.body["duplicates"], 0);
    assert_eq!(
        r.body["events"],
        json!([
            {"status": "accepted", "event_id": "sg-2"},
            {"status": "accepted", "event_id": "sg-1"},
            {"status": "accepted", "event_id": "sg-3"},
        ])
    );

    // Each element is logged with the exact bytes it was sent as.
    let text = String::from_utf8(body.clone()).unwrap();
    let logged = server.logged().await;
    assert_eq!(logged.len(), 3);
    for (id, event) in ["sg-2", "sg-1", "sg-3"].iter().zip(&events) {
        let record = logged.iter().find(|e| e.event_id == *id).unwrap();
        let slice = String::from_utf8(record.body.clone()).unwrap();
        assert!(text.contains(&slice), "{slice} is a slice of the batch");
        assert_eq!(serde_json::from_str::<Value>(&slice).unwrap(), *event);
        assert_eq!(record.aggregate, event["email"].as_str().unwrap());
    }
    // Ordered by timestamp within the address: the later event wins whatever the array's order.
    let shown = server
        .wait_for("/v1/sources/sendgrid/aggregates/ann@example.com", |r| {
            r.code == 200 && r.body["event_id"] == "sg-2"
        })
        .await;
    assert_eq!(shown.body["state"]["event"], "delivered");
    assert_eq!(shown.body["sequence"], 1_513_299_600);
    // The earlier event is decided too: applied before sg-2 when both settle together, else stale.
    let (status, _) = server.status("sendgrid", "sg-1").await.unwrap();
    assert!(
        status == "processed" || status == "ignored_stale",
        "{status}"
    );
    let detail = server.get("/v1/events/sendgrid/sg-3").await;
    assert_eq!(detail.body["event_type"], "open", "{:?}", detail.body);

    // SendGrid retries the whole batch: every element is a duplicate, nothing is added.
    let r = post_json(&server, "sendgrid", "sg-secret", &body).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["logged"], 0);
    assert_eq!(r.body["duplicates"], 3);
    for entry in r.body["events"].as_array().unwrap() {
        assert_eq!(entry["status"], "duplicate", "{entry}");
        assert_eq!(entry["key"], "event_id", "{entry}");
    }
    server
        .wait_for_metric(
            "inhook_duplicates_total",
            &[("source", "sendgrid"), ("key", "event_id")],
            3.0,
        )
        .await;
    assert_eq!(server.count().await, 3);

    // A batch mixing a logged element and a new one: only the new one is logged.
    let mixed = batch(&[
        events[0].clone(),
        sendgrid_event("sg-4", "bob@example.com", "click", 1_513_299_580),
    ]);
    let r = post_json(&server, "sendgrid", "sg-secret", &mixed).await;
    assert_eq!(r.code, 202, "{:?}", r.body);
    assert_eq!(
        (r.body["logged"].clone(), r.body["duplicates"].clone()),
        (json!(1), json!(1))
    );
    assert_eq!(server.count().await, 4);
}

#[tokio::test]
async fn a_bad_element_is_named_by_its_index_and_nothing_of_the_batch_is_kept() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    let mut bad = sendgrid_event("sg-12", "cy@example.com", "bounce", 1_513_299_700);
    bad.as_object_mut().unwrap().remove("sg_event_id");
    let body = batch(&[
        sendgrid_event("sg-10", "cy@example.com", "processed", 1_513_299_690),
        sendgrid_event("sg-11", "dee@example.com", "processed", 1_513_299_691),
        bad,
        sendgrid_event("sg-13", "dee@example.com", "delivered", 1_513_299_692),
    ]);
    let r = post_json(&server, "sendgrid", "sg-secret", &body).await;
    assert_eq!(r.code, 400, "{:?}", r.body);
    assert_eq!(r.body["error"], "invalid_payload", "{:?}", r.body);
    assert_eq!(r.body["index"], 2, "{:?}", r.body);
    assert_eq!(
        r.body["details"][0]["field"], "/sg_event_id",
        "{:?}",
        r.body
    );
    assert_eq!(server.count().await, 0, "none of the elements is logged");

    // A body that is no array, or holds more than batch_max_events: named as the whole body.
    let one = serde_json::to_vec(&sendgrid_event("sg-20", "e@example.com", "open", 1)).unwrap();
    let r = post_json(&server, "sendgrid", "sg-secret", &one).await;
    assert_eq!(r.code, 400, "{:?}", r.body);
    assert_eq!(r.body["details"][0]["field"], "$", "{:?}", r.body);
    assert!(r.body.get("index").is_none(), "{:?}", r.body);
    let many: Vec<Value> = (0..6)
        .map(|i| sendgrid_event(&format!("sg-3{i}"), "f@example.com", "open", i))
        .collect();
    let r = post_json(&server, "sendgrid", "sg-secret", &batch(&many)).await;
    assert_eq!(r.code, 400, "{:?}", r.body);
    assert!(
        r.body["details"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("more than 5"),
        "{:?}",
        r.body
    );
    // A bad signature is checked once, before any element is read.
    let good = batch(&many[..2]);
    let mut headers = signed(Scheme::HmacTimestamped, "wrong-secret", &good, now_s());
    headers.retain(|(name, _)| *name != "content-type");
    headers.push(("content-type", "application/json".into()));
    let r = server.post_raw("sendgrid", &good, &headers).await;
    assert_eq!(r.code, 401, "{:?}", r.body);
    // An empty batch holds nothing to log.
    let r = post_json(&server, "sendgrid", "sg-secret", b"[]").await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({"status": "batch", "logged": 0, "duplicates": 0, "events": []})
    );
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn a_sync_batch_answers_each_elements_decision() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    let body = batch(&[
        sendgrid_event("s-2", "gil@example.com", "delivered", 20),
        sendgrid_event("s-1", "gil@example.com", "processed", 10),
    ]);
    let r = post_json(&server, "sendgrid-sync", "sg-secret", &body).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(
        r.body["events"],
        json!([
            {"status": "applied", "sequence": 20},
            {"status": "stale", "sequence": 10, "current_sequence": 20},
        ])
    );
    let shown = server
        .get("/v1/sources/sendgrid-sync/aggregates/gil@example.com")
        .await;
    assert_eq!(shown.body["state"]["event"], "delivered");
}

/// Posts to `source` with reqwest directly, to read the answer's headers and raw text.
async fn post_for_text(
    server: &TestServer,
    source: &str,
    scheme: Scheme,
    secret: &str,
    body: &[u8],
    content_type: &str,
) -> (u16, Option<String>, Option<String>, String) {
    let mut request = reqwest::Client::new()
        .post(format!("{}/webhooks/{source}", server.url))
        .body(body.to_vec());
    for (name, value) in signed(scheme, secret, body, now_s()) {
        if name != "content-type" {
            request = request.header(name, value);
        }
    }
    let reply = request
        .header("content-type", content_type)
        .send()
        .await
        .unwrap();
    let header = |name: &str| {
        reply
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (code, kind, sniff) = (
        reply.status().as_u16(),
        header("content-type"),
        header("x-content-type-options"),
    );
    (code, kind, sniff, reply.text().await.unwrap())
}

#[tokio::test]
async fn a_source_response_replaces_accepted_answers_and_errors_keep_json() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    const FORM: &str = "application/x-www-form-urlencoded";
    let body = b"team_id=T1&command=%2Fdeploy&text=web&trigger_id=tr.1";
    for _ in 0..2 {
        // Applied, then a duplicate: the same text, shown to the person who typed the command.
        let (code, kind, sniff, text) = post_for_text(
            &server,
            "commands",
            Scheme::Slack,
            "slack-secret",
            body,
            FORM,
        )
        .await;
        assert_eq!(code, 200);
        assert_eq!(kind.as_deref(), Some("text/plain; charset=utf-8"));
        assert_eq!(sniff.as_deref(), Some("nosniff"));
        assert_eq!(text, "Deploying web…");
    }
    assert_eq!(server.count().await, 1);
    // Errors keep their JSON answers.
    let (code, kind, _, text) = post_for_text(
        &server,
        "commands",
        Scheme::Slack,
        "slack-secret",
        b"team_id=T1",
        FORM,
    )
    .await;
    assert_eq!(code, 400);
    assert_eq!(kind.as_deref(), Some("application/json"));
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["error"],
        "invalid_payload"
    );
    let (code, kind, _, text) = post_for_text(
        &server,
        "commands",
        Scheme::Slack,
        "other-secret",
        body,
        FORM,
    )
    .await;
    assert_eq!(code, 401);
    assert_eq!(kind.as_deref(), Some("application/json"));
    assert!(text.contains("invalid_signature"), "{text}");

    // An async source's 202 is replaced too: the publisher reads the body it asked for.
    let (code, kind, _, text) = post_for_text(
        &server,
        "interactions",
        Scheme::HmacTimestamped,
        "discord-secret",
        br#"{"id":"i-1","type":2,"data":{"name":"deploy"}}"#,
        "application/json",
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(kind.as_deref(), Some("application/json"));
    assert_eq!(text, r#"{"type":5}"#);
}

#[tokio::test]
async fn forwarded_events_carry_the_content_type_they_were_received_with() {
    use crate::application::{recording_application, Received, DEST_SECRET};

    let received: Received = Received::default();
    let port = recording_application(&received).await;
    let server = TestServer::in_process()
        .spawn_with_sources(&format!(
            r#"{SOURCES}
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["zoom", "sendgrid"]
secret = "{DEST_SECRET}"
"#
        ))
        .await;
    let body = zoom_event("111", "Retro");
    let r = post_at(
        &server,
        "zoom",
        Scheme::HmacTimestamped,
        "zoom-secret",
        &body,
        "application/json; charset=utf-8",
        now_s(),
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    let events = [
        sendgrid_event("f-1", "h@example.com", "open", 5),
        sendgrid_event("f-2", "i@example.com", "open", 6),
    ];
    let r = post_json(&server, "sendgrid", "sg-secret", &batch(&events)).await;
    assert_eq!(r.code, 202, "{:?}", r.body);
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| items.len() == 3)
        })
        .await;
    let received = received.lock().unwrap();
    let zoom = received.iter().find(|(_, b)| *b == body).unwrap();
    assert_eq!(zoom.0["content-type"], "application/json; charset=utf-8");
    // Each element of a batch is forwarded as an event of its own, its own bytes.
    for event in &events {
        let found = received
            .iter()
            .find(|(h, _)| h["inhook-event-id"] == event["sg_event_id"].as_str().unwrap())
            .unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&found.1).unwrap(), *event);
        assert_eq!(found.0["content-type"], "application/json");
    }
}

#[tokio::test]
async fn an_encrypted_store_logs_a_batch_sealed_and_reads_each_element_back() {
    use crate::encryption::{encrypted, K1};

    let server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), SOURCES).await;
    // Two elements of one new aggregate: one data key, written with the first.
    let events = [
        sendgrid_event("e-1", "kim@example.com", "processed", 1),
        sendgrid_event("e-2", "kim@example.com", "delivered", 2),
        sendgrid_event("e-3", "lou@example.com", "open", 3),
    ];
    let body = batch(&events);
    let r = post_json(&server, "sendgrid", "sg-secret", &body).await;
    assert_eq!(r.code, 202, "{:?}", r.body);
    assert_eq!(r.body["logged"], 3, "{:?}", r.body);
    let shown = server
        .wait_for("/v1/sources/sendgrid/aggregates/kim@example.com", |r| {
            r.code == 200 && r.body["event_id"] == "e-2"
        })
        .await;
    assert_eq!(shown.body["state"]["event"], "delivered");
    let logged = server.logged().await;
    for event in &events {
        let id = event["sg_event_id"].as_str().unwrap();
        let record = logged.iter().find(|e| e.event_id == id).unwrap();
        assert!(!record.undecryptable, "{id}");
        assert_eq!(
            serde_json::from_slice::<Value>(&record.body).unwrap(),
            *event
        );
    }
    // Redelivered, and with a new element of a known aggregate: the keys are found again.
    let more = batch(&[
        events[1].clone(),
        sendgrid_event("e-4", "lou@example.com", "click", 4),
    ]);
    let r = post_json(&server, "sendgrid", "sg-secret", &more).await;
    assert_eq!(r.code, 202, "{:?}", r.body);
    assert_eq!(
        (r.body["logged"].clone(), r.body["duplicates"].clone()),
        (json!(1), json!(1))
    );
}

#[tokio::test]
async fn a_limit_refusing_one_element_keeps_nothing_of_the_batch() {
    let server = TestServer::in_process()
        .spawn_with_sources(&SOURCES.replace(
            "batch_max_events = 5",
            "batch_max_events = 5\nmax_backlog = 2",
        ))
        .await;
    let events: Vec<Value> = (0..3)
        .map(|i| sendgrid_event(&format!("b-{i}"), "max@example.com", "open", i))
        .collect();
    let r = post_json(&server, "sendgrid", "sg-secret", &batch(&events)).await;
    assert_eq!(r.code, 429, "{:?}", r.body);
    assert_eq!(r.body["error"], "backlog_full", "{:?}", r.body);
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn a_batch_spends_one_rate_token_per_event_and_one_over_the_tokens_keeps_nothing() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    let event = |i: i64| sendgrid_event(&format!("rl-{i}"), "rl@example.com", "open", i);
    // rate_limit_per_s = 2: a full bucket holds 2 tokens, and a batch of 2 spends both.
    let r = post_json(
        &server,
        "sendgrid-limited",
        "sg-secret",
        &batch(&[event(1), event(2)]),
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["logged"], 2, "{:?}", r.body);
    // The next batch of 2 finds less than 2 tokens: 429 as a whole, with Retry-After,
    // and nothing of it is kept.
    let r = post_json(
        &server,
        "sendgrid-limited",
        "sg-secret",
        &batch(&[event(3), event(4)]),
    )
    .await;
    assert_eq!(r.code, 429, "{:?}", r.body);
    assert_eq!(r.body["error"], "rate_limited", "{:?}", r.body);
    assert!(
        r.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok()) >= Some(1),
        "{r:?}"
    );
    assert_eq!(
        server.count().await,
        2,
        "nothing of the refused batch is logged"
    );
    for id in ["rl-3", "rl-4"] {
        assert_eq!(server.status("sendgrid-limited", id).await, None, "{id}");
    }
}

#[tokio::test]
async fn a_batch_larger_than_the_burst_takes_a_full_bucket_and_leaves_a_debt() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    let event = |i: i64| sendgrid_event(&format!("debt-{i}"), "debt@example.com", "open", i);
    // Five events on a bucket of 2: taken whole on a full bucket, never refused for ever...
    let five: Vec<Value> = (1..=5).map(event).collect();
    let r = post_json(&server, "sendgrid-limited", "sg-secret", &batch(&five)).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["logged"], 5, "{:?}", r.body);
    // ...but they are 5 events: the source owes 3 tokens, so the next delivery waits for
    // them (2 s at 2 per second) instead of finding one left.
    let r = post_json(
        &server,
        "sendgrid-limited",
        "sg-secret",
        &batch(&[event(6)]),
    )
    .await;
    assert_eq!(r.code, 429, "{:?}", r.body);
    assert!(
        r.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok()) >= Some(2),
        "{r:?}"
    );
    assert_eq!(server.count().await, 5);
}
