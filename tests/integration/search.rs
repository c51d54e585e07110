//! Searching the event log by what events say (docs/api.md, search), on the store the suite
//! runs on: declared `search_fields` indexed at ingest and looked up, with the other
//! filters (event id, type pattern, time range); an undeclared field scanned (bounded) on a
//! plain store and refused on an encrypted one, whose index holds keyed hashes only and
//! still finds old events after a key rotation; bulk replay and the command line by the
//! same query; an old store migrated.

use inhook::domain::search::Where;
use inhook::http::api::search::scan_page;
use inhook::ingress::signature::Scheme;
use inhook::store::EventFilter;
use serde_json::{json, Value};

use crate::encryption::{encrypted, holders_of, K1};
use crate::support::{now_s, signed, Reply, TestServer};

const SECRET: &str = "search-test-secret";
const K2: &str = "k2:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

/// Two json sources declaring the customer field; `shop` also the amount. `shop` is
/// settled at ingest, `shop2` by the workers (on PostgreSQL, logged by the batch insert).
fn sources() -> String {
    let source = |name: &str, mode: &str, fields: &str| {
        format!(
            r#"
[[sources]]
name = "{name}"
kind = "json"
mode = "{mode}"
signature = "hmac-hex"
secrets = ["{SECRET}"]
event_id = "/id"
aggregate = ["/data/object/object", "/data/object/id"]
sequence = "/created"
event_type = "/type"
ordering = "latest-wins"
state = "/data/object"
search_fields = [{fields}]
"#
        )
    };
    format!(
        "{}{}",
        source("shop", "sync", r#""/data/object/customer", "/amount""#),
        source("shop2", "async", r#""/data/object/customer""#)
    )
}

fn body(id: &str, event_type: &str, created: i64, customer: &str, amount: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "type": event_type, "created": created, "amount": amount,
        "data": {"object": {"object": "invoice", "id": format!("in_{id}"),
                            "customer": customer, "note": format!("note-{id}")}},
    }))
    .unwrap()
}

async fn post(server: &TestServer, source: &str, body: &[u8]) -> Reply {
    let headers = signed(Scheme::HmacHex, SECRET, body, now_s());
    let reply = server.post_raw(source, body, &headers).await;
    assert!(reply.code < 300, "{}: {:?}", reply.code, reply.body);
    reply
}

fn ids(reply: &Reply) -> Vec<String> {
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    reply.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap().to_owned())
        .collect()
}

/// Six events over two sources: customers cus_1 and cus_2, invoice and charge types.
async fn post_six(server: &TestServer) {
    post(
        server,
        "shop",
        &body("e1", "invoice.created", 1, "cus_1", 10),
    )
    .await;
    post(server, "shop", &body("e2", "invoice.paid", 2, "cus_1", 42)).await;
    post(
        server,
        "shop",
        &body("e3", "charge.succeeded", 3, "cus_1", 42),
    )
    .await;
    post(server, "shop", &body("e4", "invoice.paid", 4, "cus_2", 42)).await;
    post(server, "shop2", &body("f1", "invoice.paid", 1, "cus_1", 42)).await;
    post(server, "shop2", &body("f2", "invoice.paid", 2, "cus_3", 7)).await;
}

#[tokio::test]
async fn declared_fields_are_found_by_value_with_every_other_filter() {
    let server = TestServer::in_process()
        .spawn_with_sources(&sources())
        .await;
    post_six(&server).await;

    let by = |query: &str| {
        let path = format!("/v1/events?{query}");
        let server = &server;
        async move { server.get(&path).await }
    };
    let cus_1 = by("where=/data/object/customer=cus_1").await;
    assert_eq!(
        ids(&cus_1),
        ["f1", "e3", "e2", "e1"],
        "every source declaring it"
    );
    assert!(
        cus_1.body.get("scan").is_none(),
        "an index lookup: {:?}",
        cus_1.body
    );
    assert_eq!(
        ids(&by("source=shop&where=/data/object/customer=cus_1").await),
        ["e3", "e2", "e1"]
    );
    // Encoded as a form encodes it, and repeated: both conditions hold.
    assert_eq!(
        ids(&by("where=%2Fdata%2Fobject%2Fcustomer%3Dcus_1&where=/amount=42").await),
        ["e3", "e2"],
        "shop2 does not declare /amount: its f1 is not in that index"
    );
    // A number is its JSON text.
    assert_eq!(
        ids(&by("source=shop&where=/amount=42").await),
        ["e4", "e3", "e2"]
    );
    assert!(ids(&by("where=/data/object/customer=cus_9").await).is_empty());

    // Type patterns, event ids, and both with a where.
    assert_eq!(
        ids(&by("source=shop&type=invoice.*").await),
        ["e4", "e2", "e1"]
    );
    assert_eq!(
        ids(&by("type=invoice.paid").await),
        ["f2", "f1", "e4", "e2"]
    );
    assert_eq!(
        ids(&by("type=invoice.*&where=/data/object/customer=cus_1").await),
        ["f1", "e2", "e1"]
    );
    assert_eq!(ids(&by("event_id=e3").await), ["e3"]);
    assert_eq!(
        ids(&by("source=shop2&event_id=e3").await),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&by("event_id=e2&where=/data/object/customer=cus_2").await),
        Vec::<String>::new()
    );

    // A time range: from is inclusive, to exclusive.
    let e3 = server.get("/v1/events/shop/e3").await;
    let at = e3.body["received_at"].as_str().unwrap().replace('+', "%2B");
    let from = ids(&by(&format!("source=shop&from={at}")).await);
    assert!(
        from.contains(&"e3".to_owned()) && from.contains(&"e4".to_owned()),
        "{from:?}"
    );
    let to = ids(&by(&format!("source=shop&to={at}")).await);
    assert!(
        !to.contains(&"e3".to_owned()) && to.contains(&"e1".to_owned()),
        "{to:?}"
    );
    assert_eq!(from.len() + to.len(), 4);
    assert!(ids(&by("from=2999-01-01T00:00:00Z").await).is_empty());

    // Pages of a search.
    let first = by("where=/data/object/customer=cus_1&limit=3").await;
    assert_eq!(ids(&first), ["f1", "e3", "e2"]);
    let cursor = first.body["next_cursor"].as_i64().unwrap();
    let rest = by(&format!(
        "where=/data/object/customer=cus_1&limit=3&cursor={cursor}"
    ))
    .await;
    assert_eq!(ids(&rest), ["e1"]);
    assert_eq!(rest.body["next_cursor"], Value::Null);

    // Bad input is a 400 that says what is wrong.
    for (query, says) in [
        ("where=data/object/customer=cus_1", "start with /"),
        ("where=/data/object/customer", "/pointer=value"),
        ("type=in*voice", "may only end"),
        ("from=yesterday", "from must be an RFC 3339"),
    ] {
        let reply = by(query).await;
        assert_eq!(reply.code, 400, "{query}");
        assert!(
            reply.body["detail"].as_str().unwrap().contains(says),
            "{query}: {:?}",
            reply.body
        );
    }

    // The index holds one row per declared field present: shop 4 × 2, shop2 2 × 1.
    assert_eq!(
        server.query_i64("SELECT COUNT(*) FROM event_search").await,
        10
    );
    assert_eq!(
        server
            .query_i64("SELECT COUNT(*) FROM event_search WHERE value = 'cus_1'")
            .await,
        4,
        "a plain store indexes the value in clear"
    );

    // The command line, by the same query.
    let (ok, out) = server.cli(&["events", "--where", "/data/object/customer=cus_2"]);
    assert!(ok, "{out}");
    assert!(out.contains("e4") && !out.contains("e1"), "{out}");
    let (ok, out) = server.cli(&["events", "--type", "charge.*"]);
    assert!(ok && out.contains("e3") && !out.contains("e4"), "{out}");
    let (ok, out) = server.cli(&["events", "--where", "customer"]);
    assert!(!ok && out.contains("/pointer=value"), "{out}");
}

#[tokio::test]
async fn an_undeclared_field_is_scanned_within_a_bound_on_a_plain_store() {
    let server = TestServer::in_process()
        .spawn_with_sources(&sources())
        .await;
    post_six(&server).await;
    let reply = server
        .get("/v1/events?where=/data/object/note=note-e2")
        .await;
    assert_eq!(ids(&reply), ["e2"]);
    assert_eq!(reply.body["scan"], json!({"scanned": 6, "stopped": false}));
    // With a declared field beside it: the index narrows what is scanned.
    let reply = server
        .get("/v1/events?source=shop&where=/data/object/customer=cus_1&where=/created=1")
        .await;
    assert_eq!(ids(&reply), ["e1"]);
    assert_eq!(reply.body["scan"]["scanned"], 3);

    // A scan that reaches its bound says so, and its cursor goes on from the last event read.
    let store = server.store().await;
    let wanted = [Where::parse("/data/object/note=note-e1").unwrap()];
    let filter = EventFilter::default();
    let (found, next, scan) = scan_page(store.as_ref(), &filter, &wanted, 10, None, 4)
        .await
        .unwrap();
    assert!(found.is_empty());
    assert!(scan.stopped && scan.scanned == 4, "{scan:?}");
    let (found, next, scan) = scan_page(store.as_ref(), &filter, &wanted, 10, next, 4)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].event_id, "e1");
    assert_eq!((scan.scanned, scan.stopped, next), (2, false, None));

    let (ok, out) = server.cli(&["events", "--where", "/data/object/note=note-f2"]);
    assert!(ok && out.contains("f2") && !out.contains("f1"), "{out}");
}

#[tokio::test]
async fn an_encrypted_store_indexes_keyed_hashes_and_finds_old_events_after_a_rotation() {
    const CUSTOMER: &str = "cus_zq7-search-marker";
    let mut server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), &sources()).await;
    post(
        &server,
        "shop",
        &body("e1", "invoice.paid", 1, CUSTOMER, 42),
    )
    .await;
    post(&server, "shop", &body("e2", "invoice.paid", 2, "cus_2", 42)).await;
    let query = format!("/v1/events?where=/data/object/customer={CUSTOMER}");
    assert_eq!(ids(&server.get(&query).await), ["e1"]);
    assert_eq!(
        ids(&server.get("/v1/events?source=shop&where=/amount=42").await),
        ["e2", "e1"]
    );
    assert_eq!(
        server
            .query_i64(&format!(
                "SELECT COUNT(*) FROM event_search WHERE value = '{CUSTOMER}'"
            ))
            .await,
        0
    );
    assert_eq!(
        server
            .query_i64("SELECT COUNT(*) FROM event_search WHERE LENGTH(value) = 64")
            .await,
        4,
        "every value keyed: a customer and an amount for each event"
    );
    assert_eq!(
        server.query_i64("SELECT COUNT(*) FROM event_search").await,
        4
    );
    // The writes of the sync source are committed before its answer.
    let holders = holders_of(&server, CUSTOMER.as_bytes()).await;
    assert!(holders.is_empty(), "the value in clear in {holders:?}");

    // An undeclared field cannot be scanned in sealed bodies.
    let refused = server
        .get("/v1/events?where=/data/object/note=note-e1")
        .await;
    assert_eq!(refused.code, 400);
    let detail = refused.body["detail"].as_str().unwrap();
    assert!(
        detail.contains("search_fields") && detail.contains("encryption"),
        "{detail}"
    );
    let (ok, out) = server.cli(&["events", "--where", "/data/object/note=note-e1"]);
    assert!(!ok && out.contains("search_fields"), "{out}");

    // A new first key, a rekey, the old key dropped: the old event is still found.
    assert!(server.terminate());
    server.replace_in_config(&encrypted(&[K1]), &encrypted(&[K2, K1]));
    let (ok, out) = server.cli(&["rekey"]);
    assert!(ok, "{out}");
    server.replace_in_config(&encrypted(&[K2, K1]), &encrypted(&[K2]));
    server.start();
    post(&server, "shop", &body("e3", "invoice.paid", 3, CUSTOMER, 1)).await;
    assert_eq!(ids(&server.get(&query).await), ["e3", "e1"]);

    // Forgetting the aggregate takes its index rows with its bodies.
    let before = server.query_i64("SELECT COUNT(*) FROM event_search").await;
    let forgot = server
        .delete("/v1/sources/shop/aggregates/invoice%2Fin_e1")
        .await;
    assert_eq!(forgot.code, 200, "{:?}", forgot.body);
    assert_eq!(
        server.query_i64("SELECT COUNT(*) FROM event_search").await,
        before - 2
    );
    assert_eq!(ids(&server.get(&query).await), ["e3"]);
}

#[tokio::test]
async fn a_bulk_replay_takes_the_events_a_search_finds() {
    // Dead events: a save-game source's removals of items the player does not have.
    let server = TestServer::in_process()
        .spawn_with(r#"search_fields = ["/player_id"]"#)
        .await;
    let delta = |id: &str, player: &str| {
        json!({"event_id": id, "event_type": "inventory.updated", "player_id": player,
               "save_slot": "a", "sequence": 1, "idempotency_key": id,
               "data": {"added_items": [], "removed_items": [{"item_id": "gem", "qty": 1}]}})
    };
    server.post_save(&delta("x1", "alice")).await;
    server.post_save(&delta("x2", "bob")).await;
    server.wait_detail("save-game", "x1", "dead").await;
    server.wait_detail("save-game", "x2", "dead").await;

    let refused = server
        .post_admin("/v1/replay", &json!({"where": ["/save_slot=a"]}))
        .await;
    assert_eq!(refused.code, 400, "{:?}", refused.body);
    assert!(refused.body["detail"]
        .as_str()
        .unwrap()
        .contains("search_fields"));

    let job = server
        .post_admin(
            "/v1/replay",
            &json!({"source": "save-game", "where": ["/player_id=alice"], "type": "inventory.*"}),
        )
        .await;
    assert_eq!(job.code, 202, "{:?}", job.body);
    assert_eq!(job.body["total"], 1);
    let id = job.body["job_id"].as_i64().unwrap();
    server
        .wait_for(&format!("/v1/replay/{id}"), |r| r.body["state"] == "done")
        .await;
    let replays = |id: &'static str| {
        let server = &server;
        async move { server.get(&format!("/v1/events/save-game/{id}")).await.body["replays"].clone() }
    };
    assert_eq!(replays("x1").await, 1);
    assert_eq!(replays("x2").await, 0);

    let (ok, out) = server.cli(&["replay", "--where", "/player_id=bob"]);
    assert!(ok && out.contains("for 1 events"), "{out}");
}

/// Back to version 20: the search index (21) and the alert state and outbox (22) dropped.
const UNDO_MIGRATIONS_21_22: &str = "DROP TABLE alert_outbox; DROP TABLE alerts_firing;
    ALTER TABLE alerts DROP COLUMN node;
    DROP TABLE event_search; DELETE FROM schema_migrations WHERE version >= 21;";

#[tokio::test]
async fn a_store_of_the_previous_release_gets_the_index_and_indexes_new_events() {
    let mut server = TestServer::spawn_with_sources(&sources()).await;
    post(&server, "shop", &body("old", "invoice.paid", 1, "cus_1", 1)).await;
    assert!(server.terminate());
    server
        .run_sql(UNDO_MIGRATIONS_21_22, UNDO_MIGRATIONS_21_22)
        .await;
    server.start();
    post(&server, "shop", &body("new", "invoice.paid", 2, "cus_1", 1)).await;
    // Events logged before the index existed are not in it (docs/api.md, search).
    assert_eq!(
        ids(&server
            .get("/v1/events?where=/data/object/customer=cus_1")
            .await),
        ["new"]
    );
    assert_eq!(ids(&server.get("/v1/events?event_id=old").await), ["old"]);
}

#[tokio::test]
async fn turning_encryption_on_keys_the_index_of_events_logged_before() {
    const CUSTOMER: &str = "cus_zq7-plain-then-sealed";
    let mut server = TestServer::spawn_with_sources(&sources()).await;
    post(
        &server,
        "shop",
        &body("e1", "invoice.paid", 1, CUSTOMER, 42),
    )
    .await;
    let in_clear = format!("SELECT COUNT(*) FROM event_search WHERE value = '{CUSTOMER}'");
    assert_eq!(server.query_i64(&in_clear).await, 1);
    assert!(server.terminate());
    let config = std::fs::read_to_string(server.config_path()).unwrap();
    std::fs::write(
        server.config_path(),
        format!("{}{config}", encrypted(&[K1])),
    )
    .unwrap();
    let (ok, out) = server.cli(&["rekey", "--encrypt-existing"]);
    assert!(ok, "{out}");
    assert_eq!(server.query_i64(&in_clear).await, 0);
    server.start();
    let query = format!("/v1/events?where=/data/object/customer={CUSTOMER}");
    assert_eq!(ids(&server.get(&query).await), ["e1"]);
    assert_eq!(
        ids(&server.get("/v1/events?where=/amount=42").await),
        ["e1"]
    );
}
