//! The first seed: presence sync, latest-wins by `sequence_number`.

use serde_json::json;

use crate::support::TestServer;

fn presence(event_id: &str, presence: &str, seq: i64) -> serde_json::Value {
    json!({"event_id": event_id, "user_id": "usr_A", "presence": presence,
           "sequence_number": seq, "timestamp": 1000 + seq})
}

#[tokio::test]
async fn the_first_seed_story_ends_offline() {
    let server = TestServer::in_process().spawn().await;

    let online = server
        .post_presence(&presence("evt_1", "ONLINE", 101))
        .await;
    assert_eq!(
        (online.code, &online.body),
        (200, &json!({"status": "applied", "sequence": 101}))
    );
    let state = server.get("/v1/presence/usr_A").await;
    assert_eq!(state.body["status"], "ONLINE");

    let offline = server
        .post_presence(&presence("evt_3", "OFFLINE", 103))
        .await;
    assert_eq!(
        (offline.code, &offline.body["status"]),
        (200, &json!("applied"))
    );

    let busy_late = server.post_presence(&presence("evt_2", "BUSY", 102)).await;
    assert_eq!(busy_late.code, 200);
    assert_eq!(
        busy_late.body,
        json!({"status": "stale", "sequence": 102, "current_sequence": 103})
    );

    let resent = server
        .post_presence(&presence("evt_1", "ONLINE", 101))
        .await;
    assert_eq!(resent.code, 200);
    assert_eq!(resent.body["status"], "duplicate");
    assert_eq!(resent.body["event_id"], "evt_1");

    let state = server.get("/v1/presence/usr_A").await;
    assert_eq!(state.code, 200);
    assert_eq!(state.body["user_id"], "usr_A");
    assert_eq!(state.body["status"], "OFFLINE");
    assert_eq!(state.body["sequence"], 103);
    assert_eq!(state.body["stale"], false);
    assert!(state.body["updated_at"].as_str().unwrap().ends_with('Z'));

    // Three events logged (the duplicate is not), each with its decision.
    assert_eq!(server.count().await, 3);
    assert_eq!(
        server.status("presence", "evt_2").await.unwrap().0,
        "ignored_stale"
    );
    assert_eq!(
        server.status("presence", "evt_3").await.unwrap().0,
        "processed"
    );
}

#[tokio::test]
async fn presence_lists_filter_by_status_and_page_with_a_cursor() {
    let server = TestServer::in_process().spawn().await;
    for (i, status) in ["BUSY", "AWAY", "BUSY", "BUSY"].iter().enumerate() {
        let body = json!({"event_id": format!("e{i}"), "user_id": format!("u{i}"),
                          "presence": status, "sequence_number": 1});
        assert_eq!(server.post_presence(&body).await.code, 200);
    }
    let first = server.get("/v1/presence?status=BUSY&limit=2").await;
    let users: Vec<_> = first.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["user_id"].clone())
        .collect();
    assert_eq!(users, [json!("u0"), json!("u2")]);
    let cursor = first.body["next_cursor"].as_str().unwrap();
    let second = server
        .get(&format!("/v1/presence?status=BUSY&limit=2&cursor={cursor}"))
        .await;
    assert_eq!(second.body["items"][0]["user_id"], "u3");
    assert_eq!(second.body["next_cursor"], json!(null));
    assert_eq!(server.get("/v1/presence?status=SLEEPY").await.code, 400);
    assert_eq!(server.get("/v1/presence/nobody").await.code, 404);
}

#[tokio::test]
async fn a_presence_idempotency_key_deduplicates_across_event_ids() {
    let server = TestServer::in_process().spawn().await;
    let mut first = presence("evt_a", "BUSY", 5);
    first["idempotency_key"] = json!("usr_A:busy:5");
    let mut again = presence("evt_b", "BUSY", 5);
    again["idempotency_key"] = json!("usr_A:busy:5");
    assert_eq!(server.post_presence(&first).await.body["status"], "applied");
    let dup = server.post_presence(&again).await;
    assert_eq!((dup.code, &dup.body["status"]), (200, &json!("duplicate")));
    assert_eq!(dup.body["key"], "idempotency_key");
    assert_eq!(server.count().await, 1);
}
