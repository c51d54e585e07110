//! `GET /v1/stream`: a client connected before the deliveries receives every
//! change in order; one that reconnects with `Last-Event-ID` misses nothing.

use std::time::Duration;

use serde_json::{json, Value};

use crate::support::TestServer;

/// One server-sent event.
#[derive(Debug, Clone)]
struct Frame {
    id: i64,
    event: String,
    data: Value,
}

/// Reads frames from an SSE response until `count` arrived (or 10 s passed).
async fn read_frames(response: &mut reqwest::Response, count: usize) -> Vec<Frame> {
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
                });
            }
        }
    }
    frames
}

async fn connect(server: &TestServer, last_event_id: Option<i64>) -> reqwest::Response {
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

#[tokio::test]
async fn every_change_streams_in_order_and_a_reconnect_resumes_without_gaps() {
    let server = TestServer::spawn().await;
    let mut live = connect(&server, None).await;
    let presence = |id: &str, user: &str, status: &str, seq: i64| json!({"event_id": id, "user_id": user, "presence": status, "sequence_number": seq});
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
