//! The event log API, replay (single and bulk, surviving a restart),
//! retention and graceful shutdown.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::TestServer;

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
           "data": {"added_items": items(add), "removed_items": items(remove), "email": "p@example.com"}})
}

#[tokio::test]
async fn the_log_lists_filters_pages_and_masks() {
    let server = TestServer::in_process()
        .spawn_configured(r#"mask_fields = ["email"]"#, "")
        .await;
    for seq in 1..=5 {
        server
            .post_save(&delta(&format!("e{seq}"), "lister", seq, 1, 0))
            .await;
    }
    server.post_save(&delta("x1", "other", 1, 0, 1)).await; // dead: nothing to remove
    server.wait_detail("save-game", "e5", "processed").await;
    server.wait_detail("save-game", "x1", "dead").await;

    let dead = server.get("/v1/events?status=dead").await;
    let ids: Vec<_> = dead.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].clone())
        .collect();
    assert_eq!(ids, [json!("x1")]);
    assert_eq!(
        dead.body["items"][0]["dead_reason"],
        "insufficient_quantity"
    );

    let first = server.get("/v1/events?aggregate=lister/a&limit=2").await;
    let ids: Vec<_> = first.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event_id"].clone())
        .collect();
    assert_eq!(ids, [json!("e5"), json!("e4")], "newest first");
    let cursor = first.body["next_cursor"].as_i64().unwrap();
    let rest = server
        .get(&format!(
            "/v1/events?aggregate=lister/a&limit=10&cursor={cursor}"
        ))
        .await;
    assert_eq!(rest.body["items"].as_array().unwrap().len(), 3);
    assert_eq!(rest.body["next_cursor"], json!(null));

    let detail = server.get("/v1/events/save-game/e1").await;
    assert_eq!(detail.body["aggregate"], "lister/a");
    assert_eq!(
        detail.body["body"]["data"]["email"], "***",
        "mask_fields applies"
    );
    assert_eq!(detail.body["body"]["data"]["added_items"][0]["qty"], 1);
    assert_eq!(detail.body["headers"]["content-type"], "application/json");
    assert!(detail.body["headers"]["x-timestamp"].is_string());
    assert!(
        detail.body["headers"].get("x-signature").is_none(),
        "signatures are never kept"
    );
    assert_eq!(server.get("/v1/events/save-game/nope").await.code, 404);
    assert_eq!(server.get("/v1/events?status=bogus").await.code, 400);

    let (ok, out) = server.cli(&["events", "--status", "dead"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("x1") && out.contains("insufficient_quantity") && !out.contains("e5"),
        "{out}"
    );
}

#[tokio::test]
async fn a_dead_event_replayed_after_the_cause_is_fixed_applies_once() {
    let server = TestServer::in_process().spawn().await;
    server.post_save(&delta("d1", "fix", 1, 1, 0)).await;
    server.post_save(&delta("d2", "fix", 2, 0, 3)).await; // needs 3 gems, has 1
    let dead = server.wait_detail("save-game", "d2", "dead").await;
    assert_eq!(dead["dead_reason"], "insufficient_quantity");
    server.post_save(&delta("d3", "fix", 3, 5, 0)).await;
    server.wait_detail("save-game", "d3", "processed").await;
    assert_eq!(
        server.get("/v1/saves/fix/a").await.body["inventory"],
        json!({"gem": 6})
    );

    let replay = reqwest::Client::new()
        .post(format!("{}/v1/events/save-game/d2/replay", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 202);
    let replayed = server.wait_detail("save-game", "d2", "processed").await;
    assert_eq!(replayed["replays"], 1);
    let kinds: Vec<_> = replayed["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].clone())
        .collect();
    assert_eq!(
        kinds,
        [json!("insufficient_quantity"), json!("replayed")],
        "the first attempt, then the replay"
    );
    assert_eq!(
        server.get("/v1/saves/fix/a").await.body["inventory"],
        json!({"gem": 3})
    );

    // Replaying a processed event changes nothing.
    let again = reqwest::Client::new()
        .post(format!("{}/v1/events/save-game/d2/replay", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().await.unwrap()["status"], "unchanged");
    // A later event of the same aggregate, moving nothing, applied: the worker has passed
    // the aggregate since the replay was refused, so a re-queued d2 would show by now.
    server.post_save(&delta("d4", "fix", 4, 0, 0)).await;
    server.wait_detail("save-game", "d4", "processed").await;
    assert_eq!(
        server.get("/v1/saves/fix/a").await.body["inventory"],
        json!({"gem": 3})
    );
}

#[tokio::test]
async fn a_bulk_replay_is_a_job_that_survives_a_restart() {
    let mut server = TestServer::spawn().await;
    // Three slots, each with a delta that dies, then a grant that fixes the cause.
    for player in ["b1", "b2", "b3"] {
        server
            .post_save(&delta(&format!("{player}_take"), player, 1, 0, 2))
            .await;
        server
            .wait_detail("save-game", &format!("{player}_take"), "dead")
            .await;
        server
            .post_save(&delta(&format!("{player}_grant"), player, 2, 5, 0))
            .await;
        server
            .wait_detail("save-game", &format!("{player}_grant"), "processed")
            .await;
    }
    // Created while the server is down: only the database holds the job.
    server.kill9();
    let (ok, out) = server.cli(&["replay", "--status", "dead", "--source", "save-game"]);
    assert!(ok && out.contains("for 3 events"), "{out}");
    server.restart();
    for player in ["b1", "b2", "b3"] {
        server
            .wait_detail("save-game", &format!("{player}_take"), "processed")
            .await;
        let save = server.get(&format!("/v1/saves/{player}/a")).await;
        assert_eq!(save.body["inventory"], json!({"gem": 3}), "{player}");
    }
    let job = server.get("/v1/replay/1").await;
    assert_eq!(
        (job.body["state"].as_str(), job.body["total"].as_i64()),
        (Some("done"), Some(3))
    );
    assert_eq!(job.body["requeued"], 3);

    // Over HTTP: nothing left to replay, and a bad filter is refused.
    let client = reqwest::Client::new();
    let empty = client
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({"status": "dead"}))
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 202);
    assert_eq!(empty.json::<Value>().await.unwrap()["total"], 0);
    let bad = client
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({"status": "processed"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
}

#[tokio::test]
async fn retention_purges_decided_events_and_keeps_their_dedup_keys() {
    let server = TestServer::in_process()
        .spawn_configured("retention_s = 1\npurge_interval_s = 1", "")
        .await;
    let body =
        json!({"event_id": "old_1", "user_id": "u", "presence": "BUSY", "sequence_number": 1});
    assert_eq!(server.post_presence(&body).await.body["status"], "applied");
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.count().await > 0 {
        assert!(Instant::now() < deadline, "event never purged");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resent = server.post_presence(&body).await;
    assert_eq!(
        resent.body["status"], "duplicate",
        "dedup key outlives the purged event"
    );
    assert_eq!(
        server.get("/v1/presence/u").await.body["status"],
        "BUSY",
        "state is kept"
    );
    assert_eq!(
        source_overview(&server, "presence").await["received"],
        0,
        "the counts follow the purge"
    );
}

/// One source's counts from `/v1/overview`.
async fn source_overview(server: &TestServer, source: &str) -> Value {
    let overview = server.get("/v1/overview").await;
    overview.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == source)
        .unwrap()
        .clone()
}

#[tokio::test]
async fn the_overview_counts_agree_with_the_log_through_every_decision() {
    let server = TestServer::spawn().await;
    let presence = |id: &str, seq: i64| json!({"event_id": id, "user_id": "cnt", "presence": "AWAY", "sequence_number": seq});
    for (id, seq) in [("p1", 1), ("p3", 3), ("p2", 2), ("p1", 1)] {
        server.post_presence(&presence(id, seq)).await;
    }
    // Saves: applied, then a delta removing more than there is (dead), then one after it.
    server.post_save(&delta("s1", "cnt", 1, 2, 0)).await;
    server.post_save(&delta("s2", "cnt", 2, 0, 5)).await;
    server.post_save(&delta("s3", "cnt", 3, 1, 0)).await;
    server.wait_detail("save-game", "s3", "processed").await;

    let logged = server.logged().await;
    for source in ["presence", "save-game"] {
        let counts = source_overview(&server, source).await;
        let count = |status: &str| {
            logged
                .iter()
                .filter(|e| e.source == source && e.status.as_str() == status)
                .count() as u64
        };
        let received = logged.iter().filter(|e| e.source == source).count() as u64;
        assert_eq!(counts["received"], received, "{source}: {counts}");
        for (field, status) in [
            ("processed", "processed"),
            ("stale", "ignored_stale"),
            ("dead", "dead"),
            ("held", "held"),
            ("retrying", "retrying"),
        ] {
            assert_eq!(counts[field], count(status), "{source} {field}: {counts}");
        }
    }
    let presence_counts = source_overview(&server, "presence").await;
    assert_eq!(
        (
            presence_counts["received"].as_u64(),
            presence_counts["stale"].as_u64()
        ),
        (Some(3), Some(1))
    );
    assert_eq!(source_overview(&server, "save-game").await["dead"], 1);
}

#[tokio::test]
async fn sigterm_stops_the_server_gracefully() {
    let mut server = TestServer::spawn().await;
    server.post_save(&delta("g1", "grace", 1, 1, 0)).await;
    let started = Instant::now();
    assert!(server.terminate(), "exit status 0 after SIGTERM");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "bounded by shutdown_timeout_s"
    );
}

#[tokio::test]
async fn an_event_id_resent_with_another_body_is_a_duplicate_shown_as_a_publisher_error() {
    let server = TestServer::in_process().spawn().await;
    let first =
        json!({"event_id": "c1", "user_id": "cu", "presence": "BUSY", "sequence_number": 1});
    let changed =
        json!({"event_id": "c1", "user_id": "cu", "presence": "AWAY", "sequence_number": 2});
    assert_eq!(server.post_presence(&first).await.body["status"], "applied");
    let reply = server.post_presence(&changed).await;
    assert_eq!(
        (reply.code, &reply.body["status"]),
        (200, &json!("duplicate"))
    );
    let detail = server.get("/v1/events/presence/c1").await;
    assert_eq!(detail.body["history"][0]["kind"], "conflicting_duplicate");
    let overview = server.get("/v1/overview").await;
    let presence = overview.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "presence")
        .unwrap()
        .clone();
    assert_eq!(presence["conflicting_duplicates"], 1);
    assert_eq!(presence["duplicates"], 1);
    assert_eq!(
        server.get("/v1/presence/cu").await.body["status"],
        "BUSY",
        "state unchanged"
    );
}
