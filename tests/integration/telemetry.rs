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
