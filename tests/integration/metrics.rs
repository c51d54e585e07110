//! `/metrics` after a scripted sequence of deliveries has exactly the
//! expected counters.

use inhook::ingress::signature::Scheme;
use serde_json::json;

use crate::support::{now_s, signed, TestServer};

/// The value of the sample of `name` whose labels include every `labels` pair.
pub(crate) fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, "}"));
            if metric != name {
                return None;
            }
            let wanted = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
            wanted.then(|| value.parse().ok()).flatten()
        })
}

#[tokio::test]
async fn counters_match_a_scripted_sequence_of_deliveries() {
    let server = TestServer::spawn().await;
    let presence = |id: &str, seq: i64| json!({"event_id": id, "user_id": "m", "presence": "BUSY", "sequence_number": seq});
    assert_eq!(
        server.post_presence(&presence("m1", 5)).await.body["status"],
        "applied"
    );
    assert_eq!(
        server.post_presence(&presence("m1", 5)).await.body["status"],
        "duplicate"
    );
    assert_eq!(
        server.post_presence(&presence("m2", 4)).await.body["status"],
        "stale"
    );
    let body = serde_json::to_vec(&presence("m3", 6)).unwrap();
    let forged = signed(Scheme::HmacHex, "wrong-secret", &body, now_s());
    assert_eq!(server.post_raw("presence", &body, &forged).await.code, 401);
    let bad = serde_json::to_vec(&json!({"event_id": "m4", "user_id": "m"})).unwrap();
    let headers = signed(
        Scheme::HmacHex,
        crate::support::PRESENCE_SECRET,
        &bad,
        now_s(),
    );
    assert_eq!(server.post_raw("presence", &bad, &headers).await.code, 400);
    assert_eq!(server.post_raw("nowhere", b"{}", &[]).await.code, 404);
    let dead = json!({"event_id": "s1", "event_type": "inventory.updated", "player_id": "m",
        "save_slot": "a", "sequence": 1, "idempotency_key": "s1",
        "data": {"removed_items": [{"item_id": "gem", "qty": 1}]}});
    assert_eq!(server.post_save(&dead).await.code, 202);
    server.wait_status("save-game", "s1", "dead").await;

    let text = server.get_text("/metrics").await;
    let p = [("source", "presence")];
    let s = [("source", "save-game")];
    let expect = |name: &str, labels: &[(&str, &str)], value: f64| {
        assert_eq!(
            sample(&text, name, labels),
            Some(value),
            "{name} {labels:?}\n{text}"
        );
    };
    expect("inhook_requests_total", &[p[0], ("code", "200")], 3.0);
    expect("inhook_requests_total", &[p[0], ("code", "401")], 1.0);
    expect("inhook_requests_total", &[p[0], ("code", "400")], 1.0);
    expect(
        "inhook_requests_total",
        &[("source", "_unknown"), ("code", "404")],
        1.0,
    );
    expect("inhook_requests_total", &[s[0], ("code", "202")], 1.0);
    expect(
        "inhook_signature_failures_total",
        &[p[0], ("reason", "invalid_signature")],
        1.0,
    );
    expect("inhook_invalid_payloads_total", &p, 1.0);
    expect("inhook_duplicates_total", &[p[0], ("key", "event_id")], 1.0);
    expect("inhook_stale_events_total", &p, 1.0);
    expect("inhook_out_of_order_total", &p, 1.0);
    expect(
        "inhook_attempts_total",
        &[p[0], ("outcome", "applied")],
        1.0,
    );
    expect("inhook_attempts_total", &[s[0], ("outcome", "dead")], 1.0);
    expect(
        "inhook_dead_events_total",
        &[s[0], ("reason", "insufficient_quantity")],
        1.0,
    );
    expect("inhook_backlog", &s, 0.0);
    expect("inhook_held_events", &s, 0.0);
    expect("inhook_ingest_duration_seconds_count", &p, 5.0);
    expect("inhook_processing_lag_seconds_count", &s, 1.0);
    assert!(
        text.contains("inhook_ingest_duration_seconds_bucket{source=\"presence\",le=\"0.005\"}"),
        "{text}"
    );
}
