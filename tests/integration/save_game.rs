//! The second seed: async save-game events applied by the worker.

use serde_json::{json, Value};

use crate::support::{Reply, TestServer};

fn save_event(event_id: &str, event_type: &str, seq: i64, key: &str, data: Value) -> Value {
    json!({"event_id": event_id, "event_type": event_type, "payload_version": 1,
           "occurred_at": "2026-06-28T10:15:21Z", "player_id": "player_1024",
           "save_slot": "slot_a", "sequence": seq, "idempotency_key": key, "data": data})
}

fn items(list: &[(&str, i64)]) -> Value {
    list.iter()
        .map(|(id, qty)| json!({"item_id": id, "qty": qty}))
        .collect()
}

const SAVE: &str = "/v1/saves/player_1024/slot_a";

async fn wait_for_sequence(server: &TestServer, path: &str, seq: i64) -> Reply {
    server
        .wait_for(path, |r| r.code == 200 && r.body["last_sequence"] == seq)
        .await
}

#[tokio::test]
async fn a_resend_with_a_new_event_id_and_the_same_idempotency_key_grants_once() {
    let server = TestServer::in_process().spawn().await;
    let key = "player_1024:slot_a:inventory:chapter3_reward";
    let grant = |event_id: &str| {
        save_event(
            event_id,
            "inventory.updated",
            1,
            key,
            json!({"added_items": items(&[("old_stamp", 2)])}),
        )
    };
    let first = server.post_save(&grant("evt_a1")).await;
    assert_eq!(
        (first.code, &first.body),
        (202, &json!({"status": "accepted", "event_id": "evt_a1"}))
    );
    let resend = server.post_save(&grant("evt_a1_retry")).await;
    assert_eq!(resend.code, 200);
    assert_eq!(resend.body["status"], "duplicate");
    assert_eq!(resend.body["key"], "idempotency_key");
    let state = wait_for_sequence(&server, SAVE, 1).await;
    assert_eq!(state.body["inventory"], json!({"old_stamp": 2}));
    // Settle once more after the worker is done: still exactly 2.
    let same = server.post_save(&grant("evt_a1_third")).await;
    assert_eq!(same.body["status"], "duplicate");
    assert_eq!(
        server.get(SAVE).await.body["inventory"],
        json!({"old_stamp": 2})
    );
    assert_eq!(server.count().await, 1);
}

#[tokio::test]
async fn a_resend_racing_the_first_delivery_still_grants_once() {
    let server = TestServer::in_process().spawn().await;
    for slot in 0..20 {
        let body = |event_id: String| {
            json!({"event_id": event_id, "event_type": "inventory.updated",
                   "player_id": "racer", "save_slot": format!("slot_{slot}"), "sequence": 1,
                   "idempotency_key": format!("racer:{slot}:reward"),
                   "data": {"added_items": [{"item_id": "old_stamp", "qty": 2}]}})
        };
        let (first, second) = (body(format!("evt_{slot}_a")), body(format!("evt_{slot}_b")));
        let (a, b) = tokio::join!(server.post_save(&first), server.post_save(&second));
        let mut statuses = [a.body["status"].clone(), b.body["status"].clone()];
        statuses.sort_by_key(|s| s.to_string());
        assert_eq!(
            statuses,
            [json!("accepted"), json!("duplicate")],
            "slot {slot}"
        );
    }
    for slot in 0..20 {
        let state = wait_for_sequence(&server, &format!("/v1/saves/racer/slot_{slot}"), 1).await;
        assert_eq!(
            state.body["inventory"],
            json!({"old_stamp": 2}),
            "slot {slot}"
        );
    }
    assert_eq!(server.count().await, 20);
}

#[tokio::test]
async fn a_late_progress_never_overwrites_and_deltas_apply_in_order() {
    // The publisher's numbering of this slot starts at 184.
    let server = TestServer::in_process()
        .spawn_with("first_sequence = 184")
        .await;
    let progress = |id: &str, seq: i64, chapter: i64| {
        save_event(
            id,
            "progress.saved",
            seq,
            &format!("progress:{seq}"),
            json!({"chapter": chapter}),
        )
    };
    assert_eq!(
        server.post_save(&progress("evt_185", 185, 4)).await.code,
        202
    );
    // 185 is applied before 184 arrives: 184 is late, not merely reordered in a batch.
    server
        .wait_for(SAVE, |r| r.body["progress"] == json!({"chapter": 4}))
        .await;
    assert_eq!(
        server.post_save(&progress("evt_184", 184, 3)).await.code,
        202
    );
    let state = wait_for_sequence(&server, SAVE, 185).await;
    assert_eq!(state.body["progress"], json!({"chapter": 4}));

    // 188 removes what 186 and 187 add: applied out of order it would be refused.
    let delta = |id: &str, seq: i64, data: Value| {
        save_event(id, "inventory.updated", seq, &format!("delta:{seq}"), data)
    };
    let d186 = delta(
        "evt_186",
        186,
        json!({"added_items": items(&[("gem", 1), ("pressed_flower", 1)])}),
    );
    let d188 = delta(
        "evt_188",
        188,
        json!({"removed_items": items(&[("gem", 3)])}),
    );
    let d187 = delta("evt_187", 187, json!({"added_items": items(&[("gem", 2)])}));
    for body in [&d186, &d188, &d187] {
        assert_eq!(server.post_save(body).await.code, 202);
    }
    let state = wait_for_sequence(&server, SAVE, 188).await;
    assert_eq!(state.body["progress"], json!({"chapter": 4}));
    assert_eq!(state.body["inventory"], json!({"pressed_flower": 1}));
    assert_eq!(
        server.status("save-game", "evt_184").await.unwrap().0,
        "ignored_stale"
    );
    for id in ["evt_185", "evt_186", "evt_187", "evt_188"] {
        assert_eq!(
            server.status("save-game", id).await.unwrap().0,
            "processed",
            "{id}"
        );
    }
}

#[tokio::test]
async fn snapshots_achievements_and_unknown_types() {
    let server = TestServer::in_process().spawn().await;
    let events = [
        save_event(
            "e1",
            "inventory.updated",
            1,
            "k1",
            json!({"added_items": items(&[("gem", 5)])}),
        ),
        save_event(
            "e2",
            "achievement.unlocked",
            2,
            "k2",
            json!({"achievement_id": "first_letter"}),
        ),
        save_event("e3", "quest.started", 3, "k3", json!({"quest": "q1"})),
        // Arrives before the snapshot at 5 and is applied on top of it.
        save_event(
            "e6",
            "inventory.updated",
            6,
            "k6",
            json!({"added_items": items(&[("gem", 1)])}),
        ),
        save_event(
            "e5",
            "inventory.snapshot",
            5,
            "k5",
            json!({"items": items(&[("gem", 10), ("key", 1)])}),
        ),
        // Older than the snapshot: already contained in it.
        save_event(
            "e4",
            "inventory.updated",
            4,
            "k4",
            json!({"added_items": items(&[("gem", 100)])}),
        ),
        save_event(
            "e7",
            "achievement.unlocked",
            7,
            "k7",
            json!({"achievement_id": "first_letter"}),
        ),
    ];
    for event in &events {
        assert_eq!(server.post_save(event).await.code, 202);
        if event["event_id"] == "e5" {
            // The snapshot is applied before e4 arrives, so e4 is known to be late.
            server
                .wait_for(SAVE, |r| r.body["inventory"]["key"] == 1)
                .await;
        }
    }
    let state = wait_for_sequence(&server, SAVE, 7).await;
    assert_eq!(state.body["inventory"], json!({"gem": 11, "key": 1}));
    assert_eq!(state.body["achievements"], json!(["first_letter"]));
    assert_eq!(state.body["progress"], json!(null));
    assert_eq!(
        server.status("save-game", "e3").await.unwrap().0,
        "ignored_unsupported"
    );
    assert_eq!(
        server.status("save-game", "e4").await.unwrap().0,
        "ignored_stale"
    );
    assert_eq!(
        server.status("save-game", "e6").await.unwrap().0,
        "processed"
    );
}

#[tokio::test]
async fn a_delta_below_zero_is_dead_and_changes_nothing() {
    let server = TestServer::in_process().spawn().await;
    let add = save_event(
        "e1",
        "inventory.updated",
        1,
        "k1",
        json!({"added_items": items(&[("gem", 1)])}),
    );
    let take = save_event(
        "e2",
        "inventory.updated",
        2,
        "k2",
        json!({"added_items": items(&[("key", 1)]), "removed_items": items(&[("gem", 2)])}),
    );
    server.post_save(&add).await;
    server.post_save(&take).await;
    let state = wait_for_sequence(&server, SAVE, 2).await;
    assert_eq!(state.body["inventory"], json!({"gem": 1}));
    assert_eq!(
        server.status("save-game", "e2").await.unwrap(),
        ("dead".into(), Some("insufficient_quantity".into()))
    );
}

#[tokio::test]
async fn a_gap_is_skipped_after_the_hold_timeout_and_a_late_delta_is_dead() {
    let server = TestServer::in_process()
        .spawn_with("hold_timeout_s = 1")
        .await;
    let delta = |id: &str, seq: i64| {
        save_event(
            id,
            "inventory.updated",
            seq,
            id,
            json!({"added_items": items(&[("gem", seq)])}),
        )
    };
    server.post_save(&delta("d1", 1)).await;
    wait_for_sequence(&server, SAVE, 1).await;
    server.post_save(&delta("d3", 3)).await;
    server.wait_status("save-game", "d3", "held").await;
    let state = wait_for_sequence(&server, SAVE, 3).await;
    assert_eq!(state.body["inventory"], json!({"gem": 4}));
    server.post_save(&delta("d2", 2)).await;
    server.wait_status("save-game", "d2", "dead").await;
    assert_eq!(
        server.status("save-game", "d2").await.unwrap().1.as_deref(),
        Some("late_after_gap_skip")
    );
    assert_eq!(server.get(SAVE).await.body["inventory"], json!({"gem": 4}));
}

#[tokio::test]
async fn unknown_saves_are_404() {
    let server = TestServer::in_process().spawn().await;
    assert_eq!(server.get("/v1/saves/nobody/slot_a").await.code, 404);
}

#[tokio::test]
async fn a_backlog_over_max_backlog_is_answered_429_and_stores_nothing() {
    let server = TestServer::in_process().spawn_with("max_backlog = 2").await;
    // Deltas ahead of a gap stay held: the backlog grows and does not drain.
    for seq in [5, 6] {
        let body = save_event(
            &format!("b{seq}"),
            "inventory.updated",
            seq,
            &format!("b{seq}"),
            json!({"added_items": items(&[("gem", 1)])}),
        );
        assert_eq!(server.post_save(&body).await.code, 202);
    }
    server.wait_status("save-game", "b6", "held").await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut attempt = 0;
    let (refused_id, reply) = loop {
        // Until the backlog is re-read (every second) a delivery may still be accepted;
        // each try is a new event, itself held, so the backlog only grows.
        attempt += 1;
        let id = format!("b7_{attempt}");
        let body = save_event(&id, "inventory.updated", 6 + attempt, &id, json!({}));
        let reply = server.post_save(&body).await;
        if reply.code != 202 {
            break (id, reply);
        }
        assert!(std::time::Instant::now() < deadline, "never refused");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(reply.code, 429);
    assert_eq!(reply.body["error"], "backlog_full");
    assert!(reply.retry_after.is_some());
    assert!(
        server.status("save-game", &refused_id).await.is_none(),
        "nothing stored"
    );
}

/// Issue #14: an async event whose aggregate is ready is decided in the transaction
/// that logs it, so it is processed by the time its 202 arrives, decided at its
/// receipt time; an event ahead of a gap is left to the worker, which applies it
/// once the gap fills.
#[tokio::test]
async fn an_in_order_event_is_decided_in_its_ingest_transaction() {
    let server = TestServer::in_process()
        .spawn_with("decide_at_ingest = true")
        .await;
    let store = server.store().await;
    for seq in 1..=20 {
        let id = format!("evt_ready_{seq}");
        let grant = json!({"added_items": items(&[("gem", 1)])});
        let reply = server
            .post_save(&save_event(&id, "inventory.updated", seq, &id, grant))
            .await;
        assert_eq!(
            (reply.code, &reply.body),
            (202, &json!({"status": "accepted", "event_id": id}))
        );
        let row = store
            .event("save-game", &id)
            .await
            .unwrap()
            .expect("logged");
        assert_eq!(
            row.status.as_str(),
            "processed",
            "{id} not decided at ingest"
        );
        assert_eq!(row.decided_at_ms, Some(row.received_at_ms), "{id}");
    }
    assert_eq!(server.get(SAVE).await.body["inventory"], json!({"gem": 20}));
    // 22 arrives ahead of its gap: logged for the worker, which holds it.
    let ahead = save_event(
        "evt_22",
        "inventory.updated",
        22,
        "k22",
        json!({"added_items": items(&[("gem", 1)])}),
    );
    assert_eq!(server.post_save(&ahead).await.code, 202);
    server.wait_status("save-game", "evt_22", "held").await;
    // 21 fills it, but 22 is held in reach: the worker decides both, in order.
    let fill = save_event(
        "evt_21",
        "inventory.updated",
        21,
        "k21",
        json!({"removed_items": items(&[("gem", 20)])}),
    );
    assert_eq!(server.post_save(&fill).await.code, 202);
    let state = wait_for_sequence(&server, SAVE, 22).await;
    assert_eq!(state.body["inventory"], json!({"gem": 1}));
    server.wait_status("save-game", "evt_21", "processed").await;
    server.wait_status("save-game", "evt_22", "processed").await;
}

#[tokio::test]
async fn a_delta_resent_after_its_purge_is_stale_and_never_applied_twice() {
    use crate::support::{now_s, signed, SAVE_SECRETS};
    use inhook::ingress::signature::Scheme;

    let server = TestServer::in_process()
        .spawn_configured(
            "retention_s = 1\ndedup_window_s = 1\npurge_interval_s = 1",
            "hold_timeout_s = 1",
        )
        .await;
    let delta = |id: &str, seq: i64| {
        serde_json::to_vec(&save_event(
            id,
            "inventory.updated",
            seq,
            id,
            json!({"added_items": items(&[("gem", 50)])}),
        ))
        .unwrap()
    };
    let captured = delta("d2", 2);
    let captured_headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &captured, now_s());
    let server = &server;
    let post = |body: Vec<u8>| {
        let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());
        async move { server.post_raw("save-game", &body, &headers).await.code }
    };
    assert_eq!(post(delta("d1", 1)).await, 202);
    wait_for_sequence(server, SAVE, 1).await;
    assert_eq!(
        server
            .post_raw("save-game", &captured, &captured_headers)
            .await
            .code,
        202
    );
    wait_for_sequence(server, SAVE, 2).await;
    // Sequence 3 never comes in time: its gap is skipped.
    assert_eq!(post(delta("d4", 4)).await, 202);
    let state = wait_for_sequence(server, SAVE, 4).await;
    assert_eq!(state.body["inventory"], json!({"gem": 150}));

    // Past the dedup window and retention, the log forgets d2 and its keys.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    while server.count().await > 0 {
        assert!(std::time::Instant::now() < deadline, "never purged");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // The captured delivery, sent again: no gap held sequence 2, so it was applied before.
    assert_eq!(
        server
            .post_raw("save-game", &captured, &captured_headers)
            .await
            .code,
        202
    );
    server.wait_status("save-game", "d2", "ignored_stale").await;
    let replay = reqwest::Client::new()
        .post(format!("{}/v1/events/save-game/d2/replay", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 200, "a stale event is not replayed");
    // The skipped sequence is still late, and dead.
    assert_eq!(post(delta("d3", 3)).await, 202);
    server.wait_status("save-game", "d3", "dead").await;
    assert_eq!(
        server.status("save-game", "d3").await.unwrap().1.as_deref(),
        Some("late_after_gap_skip")
    );
    // A later delta of the same save, granting nothing, applied: the worker has passed the
    // aggregate since d3 was decided, so d3 applied after all would show by now.
    let marker = serde_json::to_vec(&save_event(
        "d5",
        "inventory.updated",
        5,
        "d5",
        json!({"added_items": []}),
    ))
    .unwrap();
    assert_eq!(post(marker).await, 202);
    wait_for_sequence(server, SAVE, 5).await;
    assert_eq!(
        server.get(SAVE).await.body["inventory"],
        json!({"gem": 150})
    );
}
