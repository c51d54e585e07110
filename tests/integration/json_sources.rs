//! `kind = "json"` sources (docs/contract.md, json sources) end to end: located fields, the three
//! orderings, sync answers, `event_types`, bad bodies and configs, and the
//! generic aggregates API of every kind.

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};

use crate::metrics::sample;
use crate::support::{now_s, signed, Reply, TestServer};

const SECRET: &str = "json-test-secret";
const WHSEC: &str = "whsec_c2VjcmV0LWZvci1qc29u";

/// The json sources of these tests, after the two seed sources.
const SOURCES: &str = r#"
[[sources]]
name = "latest"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["json-test-secret"]
event_id = "/id"
aggregate = ["/data/object/object", "/data/object/id"]
sequence = "/created"
event_type = "/type"
event_types = ["customer.*", "invoice.*"]
ordering = "latest-wins"
state = "/data/object"

[[sources]]
name = "latest-async"
kind = "json"
signature = "hmac-hex"
secrets = ["json-test-secret"]
event_id = "/id"
aggregate = ["/data/object/object", "/data/object/id"]
sequence = "/created"
event_type = "/type"
ordering = "latest-wins"
state = "/data/object"

[[sources]]
name = "ordered"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["json-test-secret"]
event_id = "/id"
aggregate = "/account"
sequence = "/seq"
ordering = "in-order"
hold_timeout_s = 1

[[sources]]
name = "ordered-capped"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["json-test-secret"]
event_id = "/id"
aggregate = "/account"
sequence = "/seq"
ordering = "in-order"
first_sequence = 10
hold_timeout_s = 600
max_held_per_aggregate = 1

[[sources]]
name = "ordered-typed"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["json-test-secret"]
event_id = "/id"
aggregate = "/account"
sequence = "/seq"
event_type = "/type"
event_types = ["entry.*"]
ordering = "in-order"
hold_timeout_s = 600

[[sources]]
name = "unordered"
kind = "json"
mode = "sync"
signature = "standard-webhooks"
secrets = ["whsec_c2VjcmV0LWZvci1qc29u"]
event_id = "header:X-Event-Id"
idempotency_key = "header:Idempotency-Key"
ordering = "unordered"

[[sources]]
name = "deliveries"
kind = "json"
mode = "sync"
signature = "standard-webhooks"
secrets = ["whsec_c2VjcmV0LWZvci1qc29u"]
ordering = "unordered"
"#;

async fn server() -> TestServer {
    TestServer::spawn_top_and_sources("mask_fields = [\"email\"]", SOURCES).await
}

/// Posts `body` to an hmac-hex json source.
async fn post(server: &TestServer, source: &str, body: &Value) -> Reply {
    let raw = serde_json::to_vec(body).unwrap();
    let headers = signed(Scheme::HmacHex, SECRET, &raw, now_s());
    server.post_raw(source, &raw, &headers).await
}

/// Posts `body` to a standard-webhooks source with a delivery id and extra headers.
async fn post_webhook(
    server: &TestServer,
    source: &str,
    body: &Value,
    delivery: &str,
    extra: &[(&'static str, &str)],
) -> Reply {
    let raw = serde_json::to_vec(body).unwrap();
    let mut headers = inhook::ingress::signature::try_sign(
        Scheme::StandardWebhooks,
        &raw,
        &inhook::ingress::signature::Secret::new(WHSEC),
        now_s(),
        Some(delivery),
    )
    .unwrap();
    headers.push(("content-type", "application/json".into()));
    headers.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    server.post_raw(source, &raw, &headers).await
}

/// A Stripe-shaped event of customer `id` at `created` (an integer or a timestamp).
fn customer(event_id: &str, id: &str, created: Value, email: &str) -> Value {
    json!({"id": event_id, "type": "customer.updated", "created": created,
           "data": {"object": {"object": "customer", "id": id, "email": email,
                               "name": format!("name of {event_id}")}}})
}

pub(crate) async fn metric(server: &TestServer, name: &str, source: &str) -> f64 {
    let text = server.get_text("/metrics").await;
    sample(&text, name, &[("source", source)]).unwrap_or(0.0)
}

#[tokio::test]
async fn latest_wins_ends_at_the_highest_sequence_in_any_order_and_applies_ties() {
    let server = server().await;
    let arrivals = [("e1", 10), ("e3", 30), ("e2", 20), ("e3", 30), ("e4", 30)];
    for (id, created) in arrivals {
        let reply = post(
            &server,
            "latest-async",
            &customer(id, "cus_1", json!(created), "a@x"),
        )
        .await;
        assert!(matches!(reply.code, 200 | 202), "{reply:?}");
        // Each decided before the next arrives, so the tie comes after its rival.
        server
            .wait_for(&format!("/v1/events/latest-async/{id}"), |r| {
                r.body["status"] != "received"
            })
            .await;
    }
    let mut seen = Vec::new();
    for id in ["e1", "e2", "e3", "e4"] {
        let detail = server.get(&format!("/v1/events/latest-async/{id}")).await;
        seen.push(detail.body["status"].clone());
    }
    assert_eq!(
        seen,
        ["processed", "ignored_stale", "processed", "processed"],
        "e2 (20) arrived after 30; e4 ties 30 and is applied"
    );
    let state = server
        .get("/v1/sources/latest-async/aggregates/customer/cus_1")
        .await;
    assert_eq!(state.code, 200, "{state:?}");
    assert_eq!(state.body["sequence"], 30);
    assert_eq!(state.body["event_id"], "e4");
    assert_eq!(state.body["event_type"], "customer.updated");
    assert_eq!(state.body["aggregate"], "customer/cus_1");
    assert_eq!(state.body["state"]["name"], "name of e4");
    assert_eq!(state.body["state"]["email"], "***", "state is masked");
    server
        .wait_for_metric(
            "inhook_sequence_ties_total",
            &[("source", "latest-async")],
            1.0,
        )
        .await;
    assert_eq!(
        metric(&server, "inhook_duplicates_total", "latest-async").await,
        1.0
    );
}

#[tokio::test]
async fn sync_answers_name_bad_locations_and_ignore_types_outside_event_types() {
    let server = server().await;
    let applied = post(&server, "latest", &customer("s1", "cus_2", json!(5), "b@x")).await;
    assert_eq!(
        (applied.code, &applied.body),
        (200, &json!({"status": "applied", "sequence": 5}))
    );
    let stale = post(&server, "latest", &customer("s2", "cus_2", json!(4), "b@x")).await;
    assert_eq!(
        (stale.code, &stale.body),
        (
            200,
            &json!({"status": "stale", "sequence": 4, "current_sequence": 5})
        )
    );
    let duplicate = post(&server, "latest", &customer("s1", "cus_2", json!(5), "b@x")).await;
    assert_eq!(
        (duplicate.code, &duplicate.body["status"]),
        (200, &json!("duplicate"))
    );

    // An RFC 3339 sequence orders as microseconds since the epoch, shown as such.
    let at = "2026-06-28T10:15:21.5Z";
    let micros = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .unwrap()
        .unix_timestamp_nanos()
        / 1000;
    let timed = post(
        &server,
        "latest",
        &customer("t1", "cus_t", json!(at), "c@x"),
    )
    .await;
    assert_eq!(
        timed.body,
        json!({"status": "applied", "sequence": micros as i64})
    );
    let shown = server
        .get("/v1/sources/latest/aggregates/customer/cus_t")
        .await;
    assert_eq!(shown.body["sequence"], micros as i64);

    // A type outside event_types: 200 ignored_unsupported, logged as such at once,
    // under its aggregate and sequence, changing no state and waiting for no worker.
    let backlog_before = metric(&server, "inhook_backlog", "latest").await;
    let mut charge = customer("c1", "cus_2", json!(9), "b@x");
    charge["type"] = json!("charge.succeeded");
    let ignored = post(&server, "latest", &charge).await;
    assert_eq!(
        (ignored.code, &ignored.body),
        (
            200,
            &json!({"status": "ignored_unsupported", "event_id": "c1"})
        )
    );
    let logged = server.get("/v1/events/latest/c1").await;
    assert_eq!(logged.code, 200, "{logged:?}");
    assert_eq!(logged.body["status"], "ignored_unsupported");
    assert_eq!(logged.body["event_type"], "charge.succeeded");
    assert_eq!(logged.body["aggregate"], "customer/cus_2");
    assert_eq!(logged.body["sequence"], 9);
    let listed = server
        .get("/v1/events?source=latest&status=ignored_unsupported")
        .await;
    let listed: Vec<_> = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["event_id"].clone(), e["event_type"].clone()))
        .collect();
    assert_eq!(listed, [(json!("c1"), json!("charge.succeeded"))]);
    let again = post(&server, "latest", &charge).await;
    assert_eq!(
        (again.code, &again.body["status"]),
        (200, &json!("duplicate")),
        "a redelivery of a logged ignored type"
    );
    let kept = server
        .get("/v1/sources/latest/aggregates/customer/cus_2")
        .await;
    assert_eq!(
        (&kept.body["sequence"], &kept.body["event_id"]),
        (&json!(5), &json!("s1")),
        "the aggregate's state is untouched"
    );
    // One of an aggregate with no state yet creates none.
    let mut fresh = customer("c2", "cus_new", json!(1), "n@x");
    fresh["type"] = json!("charge.refunded");
    assert_eq!(
        post(&server, "latest", &fresh).await.body["status"],
        "ignored_unsupported"
    );
    assert_eq!(
        server.status("latest", "c2").await.unwrap().0,
        "ignored_unsupported"
    );
    assert_eq!(
        server
            .get("/v1/sources/latest/aggregates/customer/cus_new")
            .await
            .code,
        404
    );
    assert_eq!(
        metric(&server, "inhook_backlog", "latest").await,
        backlog_before,
        "an ignored type is no backlog item"
    );
    // ... whatever else the body holds; with no readable id, nothing is logged.
    let broken = json!({"id": 1.5, "type": "charge.failed"});
    let ignored = post(&server, "latest", &broken).await;
    assert_eq!(
        (ignored.code, &ignored.body["status"]),
        (200, &json!("ignored_unsupported"))
    );
    // A readable id without a readable place is logged as its own aggregate.
    let placeless = json!({"id": "c3", "type": "charge.failed", "created": true});
    assert_eq!(
        post(&server, "latest", &placeless).await.body["status"],
        "ignored_unsupported"
    );
    let own = server.get("/v1/events/latest/c3").await;
    assert_eq!(
        (&own.body["aggregate"], &own.body["sequence"]),
        (&json!("c3"), &json!(0))
    );

    // A missing required location and a mistyped one: 400s naming each.
    let mut missing = customer("m1", "cus_2", json!(6), "b@x");
    missing["data"]["object"]
        .as_object_mut()
        .unwrap()
        .remove("id");
    let reply = post(&server, "latest", &missing).await;
    assert_eq!(reply.code, 400, "{reply:?}");
    assert_eq!(reply.body["error"], "invalid_payload");
    assert_eq!(reply.body["details"][0]["field"], "/data/object/id");
    assert_eq!(reply.body["details"][0]["problem"], "is required");
    let reply = post(
        &server,
        "latest",
        &customer("m2", "cus_2", json!(true), "b@x"),
    )
    .await;
    assert_eq!(reply.code, 400, "{reply:?}");
    assert_eq!(reply.body["details"][0]["field"], "/created");
    assert_eq!(
        server.count().await,
        6,
        "s1, s2, t1 and the ignored c1, c2, c3 are logged, nothing else"
    );
}

#[tokio::test]
async fn in_order_holds_skips_gaps_and_kills_late_and_conflicting_events() {
    let server = server().await;
    let event =
        |id: &str, seq: Value| json!({"id": id, "account": "acct/1", "seq": seq, "balance": id});
    let first = post(&server, "ordered", &event("o1", json!(1))).await;
    assert_eq!(first.body, json!({"status": "applied", "sequence": 1}));
    // Ahead of a gap: held (202), then a fill applies both.
    let held = post(&server, "ordered", &event("o3", json!(3))).await;
    assert_eq!((held.code, &held.body["status"]), (202, &json!("accepted")));
    assert_eq!(server.status("ordered", "o3").await.unwrap().0, "held");
    let fill = post(&server, "ordered", &event("o2", json!(2))).await;
    assert_eq!(fill.body, json!({"status": "applied", "sequence": 2}));
    assert_eq!(server.status("ordered", "o3").await.unwrap().0, "processed");
    // A gap that never fills is skipped after hold_timeout_s; its late event is dead.
    let ahead = post(&server, "ordered", &event("o5", json!(5))).await;
    assert_eq!(ahead.code, 202);
    server.wait_status("ordered", "o5", "processed").await;
    let late = post(&server, "ordered", &event("o4", json!(4))).await;
    assert_eq!(
        (late.code, &late.body),
        (
            200,
            &json!({"status": "dead", "event_id": "o4", "reason": "late_after_gap_skip"})
        )
    );
    // Two events on one sequence: the second is dead.
    let sixth = post(&server, "ordered", &event("o6", json!(6))).await;
    assert_eq!(sixth.body["status"], "applied");
    let rival = post(&server, "ordered", &event("o6b", json!(6))).await;
    assert_eq!(rival.body["reason"], "sequence_conflict");
    // In-order needs integers: a timestamp is a 400 naming the location.
    let timed = post(
        &server,
        "ordered",
        &event("ot", json!("2026-06-28T10:15:21Z")),
    )
    .await;
    assert_eq!(timed.code, 400);
    assert_eq!(timed.body["details"][0]["field"], "/seq");

    let state = server
        .get("/v1/sources/ordered/aggregates/acct%252F1")
        .await;
    assert_eq!(state.code, 200, "{state:?}");
    assert_eq!(state.body["aggregate"], "acct%2F1");
    assert_eq!(state.body["sequence"], 6);
    assert_eq!(state.body["event_id"], "o6");
    assert_eq!(state.body["state"]["balance"], "o6");
    assert_eq!(
        metric(&server, "inhook_gaps_skipped_total", "ordered").await,
        1.0
    );
}

#[tokio::test]
async fn in_order_starts_at_first_sequence_and_caps_the_events_held() {
    let server = server().await;
    let event = |id: &str, seq: i64| json!({"id": id, "account": "a", "seq": seq});
    let first = post(&server, "ordered-capped", &event("c10", 10)).await;
    assert_eq!(first.body, json!({"status": "applied", "sequence": 10}));
    let held = post(&server, "ordered-capped", &event("c12", 12)).await;
    assert_eq!(held.code, 202);
    let refused = post(&server, "ordered-capped", &event("c13", 13)).await;
    assert_eq!(refused.code, 429, "{refused:?}");
    assert_eq!(refused.body["error"], "aggregate_backlog_full");
    assert_eq!(server.get("/v1/events/ordered-capped/c13").await.code, 404);
    // Filling the gap frees the aggregate.
    let fill = post(&server, "ordered-capped", &event("c11", 11)).await;
    assert_eq!(fill.body["status"], "applied");
    let next = post(&server, "ordered-capped", &event("c13", 13)).await;
    assert_eq!(next.body, json!({"status": "applied", "sequence": 13}));
}

/// An ignored type logged under its aggregate counts toward contiguity, as every
/// event of an aggregate does whatever its type (docs/contract.md, processing): nothing waits for
/// it.
#[tokio::test]
async fn in_order_counts_an_ignored_type_logged_under_its_aggregate() {
    let server = server().await;
    let event = |id: &str, event_type: &str, seq: i64| json!({"id": id, "type": event_type, "account": "a", "seq": seq});
    let first = post(&server, "ordered-typed", &event("t1", "entry.added", 1)).await;
    assert_eq!(first.body, json!({"status": "applied", "sequence": 1}));
    let ignored = post(&server, "ordered-typed", &event("t2", "audit.viewed", 2)).await;
    assert_eq!(
        ignored.body,
        json!({"status": "ignored_unsupported", "event_id": "t2"})
    );
    let logged = server.get("/v1/events/ordered-typed/t2").await;
    assert_eq!(
        (&logged.body["aggregate"], &logged.body["sequence"]),
        (&json!("a"), &json!(2))
    );
    let next = post(&server, "ordered-typed", &event("t3", "entry.added", 3)).await;
    assert_eq!(
        next.body,
        json!({"status": "applied", "sequence": 3}),
        "sequence 2 is taken by the ignored type: no gap to wait for"
    );
}

#[tokio::test]
async fn unordered_applies_every_new_event_with_ids_from_headers() {
    let server = server().await;
    let body = |n: i64| json!({"n": n, "email": "d@x"});
    let first = post_webhook(
        &server,
        "unordered",
        &body(1),
        "msg_1",
        &[("X-Event-Id", "evt-h1"), ("Idempotency-Key", "op-1")],
    )
    .await;
    assert_eq!(first.body, json!({"status": "applied", "sequence": 0}));
    // Same operation under another id: a duplicate by idempotency key.
    let again = post_webhook(
        &server,
        "unordered",
        &body(2),
        "msg_2",
        &[("X-Event-Id", "evt-h2"), ("Idempotency-Key", "op-1")],
    )
    .await;
    assert_eq!(
        again.body,
        json!({"status": "duplicate", "event_id": "evt-h2", "key": "idempotency_key"})
    );
    let other = post_webhook(
        &server,
        "unordered",
        &body(3),
        "msg_3",
        &[("X-Event-Id", "evt-h3")],
    )
    .await;
    assert_eq!(other.body["status"], "applied");
    let missing = post_webhook(&server, "unordered", &body(4), "msg_4", &[]).await;
    assert_eq!(missing.code, 400);
    assert_eq!(missing.body["details"][0]["field"], "header:X-Event-Id");

    let logged = server.get("/v1/events/unordered/evt-h1").await.body;
    assert_eq!(logged["idempotency_key"], "op-1");
    let page = server.get("/v1/sources/unordered/aggregates").await.body;
    let keys: Vec<_> = page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["aggregate"].clone())
        .collect();
    assert_eq!(
        keys,
        [json!("evt-h1"), json!("evt-h3")],
        "each event its own aggregate"
    );
    assert_eq!(page["items"][0]["state"], json!({"n": 1, "email": "***"}));
    assert_eq!(page["items"][0]["sequence"], Value::Null);

    // Without an event_id location, the scheme's delivery id is the event id.
    let delivered = post_webhook(&server, "deliveries", &body(5), "msg_5", &[]).await;
    assert_eq!(delivered.body["status"], "applied");
    let item = server.get("/v1/sources/deliveries/aggregates/msg_5").await;
    assert_eq!((item.code, &item.body["event_id"]), (200, &json!("msg_5")));
}

#[tokio::test]
async fn the_aggregates_api_answers_for_every_kind_and_pages() {
    let server = server().await;
    for (i, user) in ["team/alice", "bob", "carol"].iter().enumerate() {
        let presence = json!({"event_id": format!("p{i}"), "user_id": user,
                              "presence": "BUSY", "sequence_number": 1});
        assert_eq!(server.post_presence(&presence).await.code, 200);
    }
    let save = json!({"event_id": "s1", "event_type": "inventory.updated", "player_id": "player_1",
        "save_slot": "slot_a", "sequence": 1, "idempotency_key": "s1",
        "data": {"added_items": [{"item_id": "gem", "qty": 2}]}});
    assert_eq!(server.post_save(&save).await.code, 202);
    server
        .wait_for("/v1/saves/player_1/slot_a", |r| r.code == 200)
        .await;

    let alice = server
        .get("/v1/sources/presence/aggregates/team%252Falice")
        .await;
    assert_eq!(alice.code, 200, "{alice:?}");
    assert_eq!(alice.body["aggregate"], "team%2Falice");
    assert_eq!(alice.body["sequence"], 1);
    assert_eq!(alice.body["event_id"], "p0");
    assert_eq!(alice.body["state"]["user_id"], "team/alice");
    assert_eq!(alice.body["state"]["status"], "BUSY");
    assert_eq!(alice.body["state"]["stale"], false);
    let slot = server
        .get("/v1/sources/save-game/aggregates/player_1/slot_a")
        .await;
    assert_eq!(slot.code, 200, "{slot:?}");
    assert_eq!(slot.body["aggregate"], "player_1/slot_a");
    assert_eq!(slot.body["sequence"], 1);
    assert_eq!(slot.body["state"]["inventory"], json!({"gem": 2}));
    assert_eq!(
        slot.body["state"],
        server.get("/v1/saves/player_1/slot_a").await.body,
        "the typed view under state"
    );

    // Pages of two, by key.
    let first = server
        .get("/v1/sources/presence/aggregates?limit=2")
        .await
        .body;
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a second page")
        .to_owned();
    let second = server
        .get(&format!(
            "/v1/sources/presence/aggregates?limit=2&cursor={cursor}"
        ))
        .await
        .body;
    let keys: Vec<_> = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["items"].as_array().unwrap())
        .map(|i| i["aggregate"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["bob", "carol", "team%2Falice"]);
    assert_eq!(second["next_cursor"], Value::Null);

    let unknown = server.get("/v1/sources/nowhere/aggregates").await;
    assert_eq!(
        (unknown.code, &unknown.body["error"]),
        (404, &json!("unknown_source"))
    );
    let unknown = server.get("/v1/sources/nowhere/aggregates/bob").await;
    assert_eq!(
        (unknown.code, &unknown.body["error"]),
        (404, &json!("unknown_source"))
    );
    let absent = server.get("/v1/sources/presence/aggregates/dave").await;
    assert_eq!(
        (absent.code, &absent.body["error"]),
        (404, &json!("unknown_aggregate"))
    );
    let bad = server.get("/v1/sources/presence/aggregates/a%25zz").await;
    assert_eq!(bad.code, 400, "{bad:?}");
    assert!(
        bad.body["detail"]
            .as_str()
            .unwrap()
            .contains("aggregate key"),
        "{bad:?}"
    );
}

#[test]
fn an_inconsistent_json_source_does_not_start_and_names_the_key() {
    let cases = [
        (
            "ordering = \"in-order\"\naggregate = \"/a\"\nevent_id = \"/id\"",
            "sequence",
        ),
        (
            "ordering = \"latest-wins\"\nsequence = \"/s\"\naggregate = \"a\"\nevent_id = \"/id\"",
            "aggregate",
        ),
        ("ordering = \"unordered\"", "event_id"),
        ("ordering = \"sideways\"\nevent_id = \"/id\"", "ordering"),
    ];
    for (keys, named) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inhook.toml");
        let config = format!(
            "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\n\n[[sources]]\nname = \"j\"\nkind = \"json\"\nsignature = \"hmac-hex\"\nsecrets = [\"s\"]\n{keys}\n",
            dir.path().join("inhook.db").display()
        );
        std::fs::write(&path, config).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_inhook"))
            .args(["serve", "--config"])
            .arg(&path)
            .output()
            .unwrap();
        assert!(!output.status.success(), "{keys} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("{named}:"))
                || stderr.contains(&format!("{named} is required")),
            "{keys}: {stderr}"
        );
    }
}

#[tokio::test]
async fn the_stream_carries_json_changes_masked_at_their_state_location() {
    let server = TestServer::in_process()
        .spawn_top_and_sources("mask_fields = [\"data.object.name\", \"email\"]", SOURCES)
        .await;
    let mut stream = crate::stream::connect(&server, None).await;
    let body = customer("st1", "cus_s", json!(1), "e@secret.example");
    assert_eq!(post(&server, "latest", &body).await.code, 200);
    let frames = crate::stream::read_frames(&mut stream, 1).await;
    assert_eq!(frames[0].event, "json");
    assert_eq!(frames[0].data["aggregate"], "customer/cus_s");
    let item = &frames[0].data["state"];
    assert_eq!(
        (item["event_id"].as_str(), item["sequence"].as_i64()),
        (Some("st1"), Some(1))
    );
    // `data.object.name` is a path from the body's root: the state sits at /data/object.
    assert_eq!(item["state"]["name"], "***");
    assert_eq!(item["state"]["email"], "***");
    assert_eq!(item["state"]["id"], "cus_s");
    assert!(!frames[0].raw.contains("secret.example"));
    let api = server
        .get("/v1/sources/latest/aggregates/customer/cus_s")
        .await;
    assert_eq!(api.body["state"], item["state"]);
}

#[tokio::test]
async fn ids_and_aggregate_parts_holding_format_characters_are_refused() {
    let server = server().await;
    for invisible in ["\u{202e}", "\u{200b}", "\u{2028}"] {
        let id = format!("evt{invisible}1");
        let bad_id = post(&server, "latest", &customer(&id, "cus_f", json!(1), "f@x")).await;
        assert_eq!(bad_id.code, 400, "{invisible:?}: {bad_id:?}");
        assert_eq!(bad_id.body["error"], "invalid_payload", "{bad_id:?}");
        assert_eq!(bad_id.body["details"][0]["field"], "/id", "{bad_id:?}");

        let part = format!("cus{invisible}f");
        let bad_part = post(&server, "latest", &customer("fine", &part, json!(1), "f@x")).await;
        assert_eq!(bad_part.code, 400, "{invisible:?}: {bad_part:?}");
        assert_eq!(bad_part.body["error"], "invalid_payload", "{bad_part:?}");
        assert_eq!(
            bad_part.body["details"][0]["field"], "/data/object/id",
            "{bad_part:?}"
        );
    }
}

#[tokio::test]
async fn a_top_level_array_on_a_source_with_event_types_is_malformed() {
    let server = server().await;
    let array = post(
        &server,
        "latest",
        &json!([customer("a1", "cus_a", json!(1), "a@x")]),
    )
    .await;
    assert_eq!(array.code, 400, "{array:?}");
    assert_eq!(array.body["error"], "invalid_payload", "{array:?}");
    assert_eq!(array.body["details"][0]["field"], "$", "{array:?}");
}

#[tokio::test]
async fn a_body_that_is_no_object_is_one_problem_on_the_whole_body_without_event_types() {
    let server = server().await;
    // "ordered" locates /id, /account and /seq and lists no event_types: a top-level
    // array or a bare value is one problem on `$`, not one per location.
    for body in [
        json!([{"id": "o1", "account": "acc", "seq": 1}]),
        json!(7),
        json!("text"),
    ] {
        let reply = post(&server, "ordered", &body).await;
        assert_eq!(reply.code, 400, "{body}: {reply:?}");
        assert_eq!(reply.body["error"], "invalid_payload", "{reply:?}");
        assert_eq!(
            reply.body["details"],
            json!([{"field": "$", "problem": "must be a JSON object"}]),
            "{body}: {reply:?}"
        );
    }
    assert_eq!(server.count().await, 0, "nothing is logged");
}
