//! With `otlp_endpoint` set, spans reach an OTLP/HTTP collector; without it,
//! nothing is exported (the default).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::post;
use serde_json::json;

use crate::support::TestServer;

/// A collector that keeps every body posted to `/v1/traces`.
async fn collector() -> (String, Arc<Mutex<Vec<Vec<u8>>>>) {
    let received: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let kept = Arc::clone(&received);
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let kept = Arc::clone(&kept);
            async move {
                kept.lock().unwrap().push(body.to_vec());
                ""
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, received)
}

#[tokio::test]
async fn spans_are_exported_over_otlp_when_configured() {
    let (url, received) = collector().await;
    let server = TestServer::spawn_configured(&format!("otlp_endpoint = \"{url}\""), "").await;
    let body =
        json!({"event_id": "otel_1", "user_id": "o", "presence": "BUSY", "sequence_number": 1});
    assert_eq!(server.post_presence(&body).await.body["status"], "applied");
    // The batch exporter sends every few seconds.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all: Vec<u8> = received.lock().unwrap().concat();
        let has = |needle: &[u8]| all.windows(needle.len()).any(|w| w == needle);
        if has(b"delivery") && has(b"otel_1") && has(b"inhook") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no delivery span exported ({} bytes)",
            all.len()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The JSON log lines of `server` whose fields name `event_id`.
fn lines_of(server: &TestServer, event_id: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(server.dir().join("server.log"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["fields"]["event_id"] == event_id)
        .collect()
}

/// docs/api.md (metrics) "one line per decision" (issue #14): an async event's accept is not a
/// decision, so each event has one line at INFO, the decision's, with its own fields and no span's.
#[tokio::test]
async fn each_event_logs_one_decision_line_without_span_fields() {
    let server =
        TestServer::spawn_with_env("log_format = \"json\"", &[("INHOOK_LOG", "info")]).await;
    let save = json!({"event_id": "log_save", "event_type": "progress.saved",
        "player_id": "logger", "save_slot": "s", "sequence": 1,
        "idempotency_key": "log_key", "data": {}});
    assert_eq!(server.post_save(&save).await.code, 202);
    let presence = json!({"event_id": "log_presence", "user_id": "logger", "presence": "BUSY", "sequence_number": 1});
    assert_eq!(
        server.post_presence(&presence).await.body["status"],
        "applied"
    );
    server
        .wait_status("save-game", "log_save", "processed")
        .await;
    // The worker writes its line after the commit the status shows.
    let deadline = Instant::now() + Duration::from_secs(10);
    while lines_of(&server, "log_save").is_empty() {
        assert!(Instant::now() < deadline, "no line for log_save");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (event_id, decision, key, aggregate) in [
        ("log_save", "processed", Some("log_key"), "logger/s"),
        ("log_presence", "applied", None, "logger"),
    ] {
        let lines = lines_of(&server, event_id);
        assert_eq!(lines.len(), 1, "{event_id}: {lines:?}");
        let line = &lines[0];
        let fields = &line["fields"];
        assert_eq!(fields["message"], "decision", "{line}");
        assert_eq!(fields["decision"], decision, "{line}");
        assert_eq!(fields["sequence"], 1, "{line}");
        assert_eq!(fields["aggregate"], aggregate, "{line}");
        assert_eq!(fields["idempotency_key"].as_str(), key, "{line}");
        assert!(
            line.get("span").is_none() && line.get("spans").is_none(),
            "span fields repeated: {line}"
        );
    }
}
