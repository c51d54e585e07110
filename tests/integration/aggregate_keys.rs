//! Aggregate keys in text form (docs/contract.md, json sources): an id holding `/` or `%` never
//! splits. Answers show the text form, and every filter (events, stream, bulk replay, CLI)
//! takes it.

use serde_json::{json, Value};

use crate::stream::read_frames;
use crate::support::TestServer;

fn presence(event_id: &str, user: &str, seq: i64) -> Value {
    json!({"event_id": event_id, "user_id": user, "presence": "ONLINE", "sequence_number": seq})
}

/// An inventory delta on slot `a` of `player`: `add` gems in, `remove` out.
fn delta(id: &str, player: &str, seq: i64, add: i64, remove: i64) -> Value {
    let items = |qty: i64| {
        if qty == 0 {
            json!([])
        } else {
            json!([{"item_id": "gem", "qty": qty}])
        }
    };
    json!({"event_id": id, "event_type": "inventory.updated", "player_id": player,
           "save_slot": "a", "sequence": seq, "idempotency_key": id,
           "data": {"added_items": items(add), "removed_items": items(remove)}})
}

/// The `event_id`s of a page of the event log.
fn ids(page: &Value) -> Vec<&str> {
    page["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_user_id_holding_a_slash_is_one_aggregate_everywhere() {
    let server = TestServer::in_process().spawn().await;
    // Filtered by the query-encoded text form before anything arrives.
    let mut stream = reqwest::Client::new()
        .get(format!("{}/v1/stream?aggregate=team%252Falice", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(stream.status(), 200);

    // `team` and `team/alice` are two users; `team/alice` is no save slot.
    for (id, user) in [("decoy", "team"), ("alice_1", "team/alice")] {
        let applied = server.post_presence(&presence(id, user, 1)).await;
        assert_eq!(applied.body["status"], "applied", "{user}");
    }
    let frames = read_frames(&mut stream, 1).await;
    assert_eq!(frames[0].data["aggregate"], "team%2Falice");
    assert_eq!(frames[0].data["state"]["user_id"], "team/alice");

    let page = server.get("/v1/events?aggregate=team%252Falice").await;
    assert_eq!((page.code, ids(&page.body)), (200, vec!["alice_1"]));
    assert_eq!(page.body["items"][0]["aggregate"], "team%2Falice");
    // Unescaped, the slash splits: player `team`'s slot `alice`, which holds nothing.
    let split = server.get("/v1/events?aggregate=team/alice").await;
    assert_eq!((split.code, ids(&split.body)), (200, vec![]));
    let detail = server.get("/v1/events/presence/alice_1").await;
    assert_eq!(detail.body["aggregate"], "team%2Falice");
    let state = server.get("/v1/presence/team%2Falice").await;
    assert_eq!(state.body["user_id"], "team/alice");

    // A `%` that is not `%25` or `%2F` is a malformed text form: a clear 400.
    let bad = server.get("/v1/events?aggregate=50%25").await;
    assert_eq!(bad.code, 400);
    assert_eq!(bad.body["error"], "bad_request");
    assert!(
        bad.body["detail"].as_str().unwrap().contains("%25"),
        "{}",
        bad.body
    );
    let bad_stream = server.get("/v1/stream?aggregate=a%25zz").await;
    assert_eq!(bad_stream.code, 400);

    let (ok, out) = server.cli(&["events", "--aggregate", "team%2Falice"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("alice_1") && out.contains("team%2Falice"),
        "{out}"
    );
    assert!(!out.contains("decoy"), "{out}");
    let (ok, out) = server.cli(&["events", "--aggregate", "team%zz"]);
    assert!(!ok && out.contains("%25"), "{out}");
}

#[tokio::test]
async fn a_save_slot_whose_player_holds_slash_and_percent_is_found_and_replayed() {
    let server = TestServer::in_process().spawn().await;
    const TEXT: &str = "p%2F1%25/a";
    const QUERY: &str = "p%252F1%2525/a";
    // The slot of player `p/1%`, and a decoy: slot `a` of player `p`. Each loses a
    // delta taking gems it does not have, then is granted 5.
    for (player, prefix) in [("p/1%", "odd"), ("p", "decoy")] {
        let take = server
            .post_save(&delta(&format!("{prefix}_take"), player, 1, 0, 2))
            .await;
        assert!(take.code < 300, "{take:?}");
        server
            .wait_detail("save-game", &format!("{prefix}_take"), "dead")
            .await;
        server
            .post_save(&delta(&format!("{prefix}_grant"), player, 2, 5, 0))
            .await;
        server
            .wait_detail("save-game", &format!("{prefix}_grant"), "processed")
            .await;
    }

    let page = server.get(&format!("/v1/events?aggregate={QUERY}")).await;
    assert_eq!(ids(&page.body), vec!["odd_grant", "odd_take"]);
    assert_eq!(page.body["items"][0]["aggregate"], TEXT);
    let save = server.get("/v1/saves/p%2F1%25/a").await;
    assert_eq!(
        (&save.body["player_id"], &save.body["inventory"]),
        (&json!("p/1%"), &json!({"gem": 5}))
    );

    // The listing shows the player as it is and pages with a text-form cursor.
    let first = server.get("/v1/saves?limit=1").await;
    let cursor = first.body["next_cursor"].as_str().unwrap().to_owned();
    let encoded: String = url_encoded(&cursor);
    let second = server
        .get(&format!("/v1/saves?limit=1&cursor={encoded}"))
        .await;
    let mut players: Vec<_> = [&first, &second]
        .iter()
        .map(|p| p.body["items"][0]["player_id"].as_str().unwrap().to_owned())
        .collect();
    players.sort();
    assert_eq!(players, vec!["p", "p/1%"]);

    // CLI: the flag takes the text form, and only that slot's dead event is replayed.
    let (ok, out) = server.cli(&["events", "--aggregate", TEXT]);
    assert!(
        ok && out.contains("odd_take") && out.contains(TEXT),
        "{out}"
    );
    assert!(!out.contains("decoy"), "{out}");
    let (ok, out) = server.cli(&["replay", "--status", "dead", "--aggregate", TEXT]);
    assert!(ok && out.contains("for 1 events"), "{out}");
    server
        .wait_detail("save-game", "odd_take", "processed")
        .await;
    let save = server.get("/v1/saves/p%2F1%25/a").await;
    assert_eq!(save.body["inventory"], json!({"gem": 3}));
    assert_eq!(
        server.status("save-game", "decoy_take").await.unwrap().0,
        "dead"
    );

    // HTTP bulk replay: the filter takes the text form and the job shows it back.
    server.post_save(&delta("odd_big", "p/1%", 3, 0, 10)).await;
    server.wait_detail("save-game", "odd_big", "dead").await;
    let job = reqwest::Client::new()
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({"status": "dead", "aggregate": TEXT}))
        .send()
        .await
        .unwrap();
    assert_eq!(job.status(), 202);
    let job: Value = job.json().await.unwrap();
    assert_eq!(
        (&job["total"], &job["filter"]["aggregate"]),
        (&json!(1), &json!(TEXT))
    );
    let replayed = server
        .wait_for("/v1/events/save-game/odd_big", |r| r.body["replays"] == 1)
        .await;
    assert_eq!(replayed.body["aggregate"], TEXT);
    let decoy = server.get("/v1/events/save-game/decoy_take").await;
    assert_eq!(
        (&decoy.body["status"], &decoy.body["replays"]),
        (&json!("dead"), &json!(0))
    );

    let bad = reqwest::Client::new()
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({"status": "dead", "aggregate": "a%zz/b"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

/// `text` percent-encoded for a query string.
fn url_encoded(text: &str) -> String {
    text.replace('%', "%25").replace('/', "%2F")
}
