//! `GET /v1/stream`: a client connected before the deliveries receives every
//! change in order; one that reconnects with `Last-Event-ID` misses nothing;
//! every open stream gets every change; `max_streams` caps them; shutdown ends them.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::TestServer;

/// One server-sent event.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Its `id:` (the change's id).
    pub id: i64,
    /// Its `event:` (`presence` or `save`).
    pub event: String,
    /// Its `data:`, parsed.
    pub data: Value,
    /// The frame as sent.
    pub raw: String,
}

/// Reads frames from an SSE response until `count` arrived (or 10 s passed).
pub async fn read_frames(response: &mut reqwest::Response, count: usize) -> Vec<Frame> {
    let mut frames = Vec::new();
    let mut buffer = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while frames.len() < count {
        let chunk = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .unwrap_or_else(|_| panic!("only {} of {count} frames: {frames:?}", frames.len()))
            .expect("stream")
            .expect("stream ended");
        buffer.push_str(&String::from_utf8_lossy(&chunk));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            let (mut id, mut event, mut data) = (None, String::new(), String::new());
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("id:") {
                    id = v.trim().parse().ok();
                } else if let Some(v) = line.strip_prefix("event:") {
                    event = v.trim().to_owned();
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push_str(v.trim());
                }
            }
            if let Some(id) = id {
                frames.push(Frame {
                    id,
                    event,
                    data: serde_json::from_str(&data).expect("JSON data"),
                    raw: block,
                });
            }
        }
    }
    frames
}

pub async fn connect(server: &TestServer, last_event_id: Option<i64>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("{}/v1/stream", server.url));
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id.to_string());
    }
    let response = request.send().await.expect("connect");
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    response
}

/// The ids of the state changes in the store, oldest first (at most 100).
async fn stored_change_ids(server: &TestServer) -> Vec<i64> {
    server
        .store()
        .await
        .changes_after(0, None, None, 100)
        .await
        .expect("changes")
        .iter()
        .map(|c| c.id)
        .collect()
}

#[tokio::test]
async fn every_change_streams_in_order_and_a_reconnect_resumes_without_gaps() {
    let server = TestServer::in_process().spawn().await;
    let mut live = connect(&server, None).await;
    server
        .post_presence(&presence("p1", "ana", "ONLINE", 1))
        .await;
    server
        .post_presence(&presence("p2", "ana", "BUSY", 2))
        .await;
    server
        .post_presence(&presence("p3", "ana", "AWAY", 1))
        .await; // stale: no change
    server
        .post_presence(&presence("p4", "ben", "OFFLINE", 7))
        .await;
    server
        .post_save(
            &json!({"event_id": "s1", "event_type": "inventory.updated", "player_id": "cy",
            "save_slot": "a", "sequence": 1, "idempotency_key": "s1",
            "data": {"added_items": [{"item_id": "gem", "qty": 2}]}}),
        )
        .await;

    let frames = read_frames(&mut live, 4).await;
    let summary: Vec<(String, Value, Value)> = frames
        .iter()
        .map(|f| {
            (
                f.event.clone(),
                f.data["aggregate"].clone(),
                f.data["state"]["sequence"].clone(),
            )
        })
        .collect();
    assert_eq!(
        summary,
        [
            ("presence".into(), json!("ana"), json!(1)),
            ("presence".into(), json!("ana"), json!(2)),
            ("presence".into(), json!("ben"), json!(7)),
            ("save".into(), json!("cy/a"), json!(null)),
        ]
    );
    assert_eq!(frames[1].data["state"]["status"], "BUSY");
    assert_eq!(frames[3].data["state"]["inventory"], json!({"gem": 2}));
    assert!(frames.windows(2).all(|w| w[0].id < w[1].id), "ids increase");

    // A client that saw only the first two reconnects and gets exactly the rest.
    drop(live);
    let mut resumed = connect(&server, Some(frames[1].id)).await;
    server
        .post_presence(&presence("p5", "ana", "OFFLINE", 3))
        .await;
    let rest = read_frames(&mut resumed, 3).await;
    let ids: Vec<i64> = rest.iter().map(|f| f.id).collect();
    assert_eq!(ids[..2], [frames[2].id, frames[3].id]);
    assert_eq!(rest[2].data["state"]["status"], "OFFLINE");

    // Filtered by aggregate, from the start of the log.
    let mut only_ben = reqwest::Client::new()
        .get(format!("{}/v1/stream?aggregate=ben", server.url))
        .header("Last-Event-ID", "0")
        .send()
        .await
        .unwrap();
    let ben = read_frames(&mut only_ben, 1).await;
    assert_eq!(ben[0].data["aggregate"], "ben");
}

fn presence(id: &str, user: &str, status: &str, seq: i64) -> Value {
    json!({"event_id": id, "user_id": user, "presence": status, "sequence_number": seq})
}

#[tokio::test]
async fn every_open_stream_receives_every_change() {
    let server = TestServer::in_process().spawn().await;
    let mut streams = Vec::new();
    for _ in 0..6 {
        streams.push(connect(&server, None).await);
    }
    for (seq, status) in [(1, "ONLINE"), (2, "BUSY"), (3, "AWAY")] {
        let reply = server
            .post_presence(&presence(&format!("f{seq}"), "fan", status, seq))
            .await;
        assert_eq!(reply.code, 200, "{reply:?}");
    }
    let stored = stored_change_ids(&server).await;
    assert_eq!(stored.len(), 3);
    for stream in &mut streams {
        let frames = read_frames(stream, 3).await;
        let seen: Vec<(i64, Value)> = frames
            .iter()
            .map(|f| (f.id, f.data["state"]["status"].clone()))
            .collect();
        assert_eq!(
            seen,
            [
                (stored[0], json!("ONLINE")),
                (stored[1], json!("BUSY")),
                (stored[2], json!("AWAY"))
            ]
        );
    }
}

#[tokio::test]
async fn a_stream_that_falls_behind_the_feed_catches_up_from_the_store() {
    // A two-change buffer: a burst of concurrent deliveries overruns it.
    let server = TestServer::spawn_configured("stream_buffer = 2", "").await;
    let mut streams = [connect(&server, None).await, connect(&server, None).await];
    let posts = (1..=40).map(|n| {
        let body = presence(&format!("b{n}"), &format!("burst_{n}"), "ONLINE", 1);
        let server = &server;
        async move {
            // Concurrent signature checks are capped: a busy answer is retried, as a publisher would.
            for _ in 0..50 {
                let reply = server.post_presence(&body).await;
                if reply.code != 503 {
                    return reply.code;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            503
        }
    });
    let codes = futures_util::future::join_all(posts).await;
    assert!(codes.iter().all(|c| *c == 200), "{codes:?}");
    let stored = stored_change_ids(&server).await;
    assert_eq!(stored.len(), 40);
    for stream in &mut streams {
        let ids: Vec<i64> = read_frames(stream, 40).await.iter().map(|f| f.id).collect();
        assert_eq!(ids, stored, "every change, once, in order");
    }
    if std::env::var_os("TEST_LOG").is_none() {
        let log = std::fs::read_to_string(server.dir().join("server.log")).expect("log");
        assert!(
            log.contains("a slow stream catches up from the store"),
            "the burst never overran the buffer, so the catch-up was not exercised: {log}"
        );
    }
}

#[tokio::test]
async fn streams_beyond_max_streams_get_503_and_a_freed_slot_is_reused() {
    let mut server =
        TestServer::spawn_configured("max_streams = 2\nshutdown_timeout_s = 30", "").await;
    let first = connect(&server, None).await;
    let mut second = connect(&server, None).await;

    let refused = reqwest::Client::new()
        .get(format!("{}/v1/stream", server.url))
        .send()
        .await
        .expect("request");
    assert_eq!(refused.status(), 503);
    assert!(
        refused.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u32>()
            .unwrap()
            > 0
    );
    let body: Value = refused.json().await.expect("JSON body");
    assert_eq!(
        body,
        json!({"status": "error", "error": "too_many_streams"})
    );
    // Other routes are not limited.
    assert_eq!(server.get("/v1/events").await.code, 200);

    // A closed stream frees its slot.
    drop(first);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut third = loop {
        let response = reqwest::Client::new()
            .get(format!("{}/v1/stream", server.url))
            .send()
            .await
            .expect("request");
        if response.status() == 200 {
            break response;
        }
        assert_eq!(response.status(), 503);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the slot was never freed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    server
        .post_presence(&presence("c1", "cap", "ONLINE", 1))
        .await;
    assert_eq!(
        read_frames(&mut second, 1).await[0].data["aggregate"],
        "cap"
    );
    assert_eq!(read_frames(&mut third, 1).await[0].data["aggregate"], "cap");

    // Shutdown ends the open streams: it does not wait them out until its timeout.
    assert!(server.terminate(), "clean exit");
    for stream in [&mut second, &mut third] {
        while let Ok(Some(_)) = stream.chunk().await {}
    }
    if std::env::var_os("TEST_LOG").is_none() {
        let log = std::fs::read_to_string(server.dir().join("server.log")).expect("log");
        assert!(log.contains("shutting down"), "{log}");
        assert!(
            !log.contains("shutdown timeout"),
            "streams held the shutdown: {log}"
        );
    }
}
