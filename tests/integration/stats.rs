//! Figures over time (docs/api.md, stats): counted per minute in memory, flushed to the
//! store, served by `GET /v1/stats` and summed up on the overview.

use std::time::Duration;

use inhook::ingress::signature::Scheme;
use inhook::store::stats::{Combine, StatRow, StatScope};
use serde_json::{json, Value};

use crate::support::{now_s, signed, Backend, TestServer};

fn presence(event_id: &str, user: &str, seq: i64) -> Value {
    json!({"event_id": event_id, "user_id": user, "presence": "ONLINE", "sequence_number": seq})
}

/// A presence delivery signed with a secret the source does not hold.
async fn post_wrongly_signed(server: &TestServer) -> u16 {
    let body = serde_json::to_vec(&presence("bad", "u", 1)).unwrap();
    let headers = signed(Scheme::HmacHex, "not-the-secret", &body, now_s());
    server.post_raw("presence", &body, &headers).await.code
}

/// The sum of `field` over every point of an answer of `/v1/stats`.
fn total(stats: &Value, field: &str) -> u64 {
    points(stats)
        .iter()
        .map(|p| p[field].as_u64().unwrap())
        .sum()
}

fn points(stats: &Value) -> &Vec<Value> {
    stats["points"].as_array().expect("points")
}

/// The rejections by reason summed over every point.
fn rejected(stats: &Value, reason: &str) -> u64 {
    points(stats)
        .iter()
        .filter_map(|p| p["rejected"][reason].as_u64())
        .sum()
}

/// Posts 3 presence events (one of them twice) and 2 wrongly signed ones.
async fn post_some(server: &TestServer, prefix: &str) {
    for seq in 1..=3 {
        let reply = server
            .post_presence(&presence(&format!("{prefix}{seq}"), prefix, seq))
            .await;
        assert_eq!(reply.code, 200, "{reply:?}");
    }
    let again = server
        .post_presence(&presence(&format!("{prefix}1"), prefix, 1))
        .await;
    assert_eq!(again.body["status"], "duplicate", "{again:?}");
    for _ in 0..2 {
        assert_eq!(post_wrongly_signed(server).await, 401);
    }
}

#[tokio::test]
async fn deliveries_rejections_and_applied_events_are_counted_per_minute() {
    let server = TestServer::spawn().await;
    post_some(&server, "a").await;
    let stats = server.get("/v1/stats?source=presence").await;
    assert_eq!(stats.code, 200, "{stats:?}");
    let stats = stats.body;
    assert_eq!(stats["source"], "presence");
    assert_eq!(stats["step"], 60);
    // The last hour by the minute, the current one included.
    assert_eq!(points(&stats).len(), 61);
    assert_eq!(total(&stats, "received"), 6);
    assert_eq!(total(&stats, "accepted"), 3);
    assert_eq!(total(&stats, "duplicate"), 1);
    assert_eq!(total(&stats, "applied"), 3);
    assert_eq!(rejected(&stats, "invalid_signature"), 2);
    let busy: Vec<_> = points(&stats)
        .iter()
        .filter(|p| p["received"].as_u64() > Some(0))
        .collect();
    assert!(!busy.is_empty() && busy.len() <= 2, "{busy:?}");
    assert!(busy
        .iter()
        .any(|p| p["lag_p50_ms"].is_u64() && p["lag_p99_ms"].is_u64()));
    // Another source's figures are its own.
    let other = server.get("/v1/stats?source=save-game").await.body;
    assert_eq!(total(&other, "received"), 0);
    // Steps of an hour add the minutes up.
    let hourly = server.get("/v1/stats?source=presence&step=3600").await.body;
    assert_eq!(points(&hourly).len(), 2);
    assert_eq!(total(&hourly, "received"), 6);
}

#[tokio::test]
async fn the_overview_shows_each_sources_last_delivery_and_rejections_by_reason() {
    let server = TestServer::spawn().await;
    let before = server.get("/v1/overview").await.body;
    let quiet = |overview: &Value, name: &str| {
        overview["sources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["source"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(quiet(&before, "presence")["last_delivery_at"], Value::Null);
    assert_eq!(quiet(&before, "presence")["rejected"], json!({}));
    let sent_at = time::OffsetDateTime::now_utc();
    post_some(&server, "b").await;
    let after = server.get("/v1/overview").await.body;
    let presence = quiet(&after, "presence");
    assert_eq!(presence["rejected"], json!({"invalid_signature": 2}));
    let last = time::OffsetDateTime::parse(
        presence["last_delivery_at"].as_str().expect("a time"),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap();
    assert!(last >= sent_at - Duration::from_millis(1) && last <= time::OffsetDateTime::now_utc());
    assert_eq!(quiet(&after, "save-game")["last_delivery_at"], Value::Null);
}

#[tokio::test]
async fn figures_are_flushed_at_shutdown_and_read_back_after_a_restart() {
    let mut server = TestServer::spawn().await;
    post_some(&server, "c").await;
    let live = server.get("/v1/stats?source=presence").await.body;
    let overview = server.get("/v1/overview").await.body;
    assert!(server.terminate());
    // In the store, as one flush wrote them.
    let now_ms = now_s() * 1000;
    let cells = server
        .store()
        .await
        .stats_series(StatScope::Source, "presence", (0, now_ms + 120_000, 60_000))
        .await
        .expect("read figures");
    let stored = |figure: &str| -> i64 {
        cells
            .iter()
            .filter(|c| c.figure == figure)
            .map(|c| c.sum)
            .sum()
    };
    assert_eq!(stored("received"), 6);
    assert_eq!(stored("rejected:invalid_signature"), 2);
    assert!(cells.iter().any(|c| c.figure.starts_with("lag:")));
    assert!(cells.iter().any(|c| c.figure == "backlog"));
    server.start();
    let read = server.get("/v1/stats?source=presence").await.body;
    for field in ["received", "accepted", "duplicate", "applied"] {
        assert_eq!(total(&read, field), total(&live, field), "{field}");
    }
    assert_eq!(rejected(&read, "invalid_signature"), 2);
    let again = server.get("/v1/overview").await.body;
    let presence = |o: &Value| o["sources"][0].clone();
    assert_eq!(presence(&again)["source"], "presence");
    assert_eq!(
        presence(&again)["last_delivery_at"],
        presence(&overview)["last_delivery_at"]
    );
    assert_eq!(
        presence(&again)["rejected"],
        presence(&overview)["rejected"]
    );
}

#[tokio::test]
async fn a_bad_window_or_an_unknown_name_is_refused_clearly() {
    let server = TestServer::spawn().await;
    for (query, code, error) in [
        ("", 400, "bad_request"),
        ("source=presence&destination=x", 400, "bad_request"),
        ("source=nope", 404, "unknown_source"),
        ("destination=nope", 404, "unknown_destination"),
        ("source=presence&step=90", 400, "bad_request"),
        ("source=presence&from=yesterday", 400, "bad_request"),
        (
            "source=presence&from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z",
            400,
            "bad_request",
        ),
        // Ten days by the minute: more points than one answer holds.
        (
            "source=presence&from=2026-01-01T00:00:00Z&to=2026-01-11T00:00:00Z",
            400,
            "bad_request",
        ),
    ] {
        let reply = server.get(&format!("/v1/stats?{query}")).await;
        assert_eq!(
            (reply.code, &reply.body["error"]),
            (code, &json!(error)),
            "{query}: {reply:?}"
        );
    }
    let ms = server
        .get("/v1/stats?source=presence&from=1767225600000&to=1767229200000&step=300")
        .await;
    assert_eq!(ms.code, 200, "{ms:?}");
    assert_eq!(ms.body["from"], "2026-01-01T00:00:00Z");
    assert_eq!(points(&ms.body).len(), 12);
}

#[tokio::test]
async fn figures_past_stats_retention_days_are_pruned_by_the_retention_pass() {
    let server =
        TestServer::spawn_configured("purge_interval_s = 1\nstats_retention_days = 2", "").await;
    let store = server.store().await;
    let now_ms = now_s() * 1000;
    let minute = |days_ago: i64| (now_ms - days_ago * 86_400_000) / 60_000 * 60_000;
    let row = |minute_ms: i64| StatRow {
        scope: StatScope::Source,
        name: "presence".into(),
        minute_ms,
        figure: "received".into(),
        value: 1,
        combine: Combine::Add,
    };
    store
        .add_stats(vec![row(minute(3)), row(minute(1))])
        .await
        .expect("write figures");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let cells = store
            .stats_series(StatScope::Source, "presence", (0, now_ms, 60_000))
            .await
            .expect("read figures");
        let slots: Vec<i64> = cells.iter().map(|c| c.slot * 60_000).collect();
        if slots == [minute(1)] {
            break;
        }
        assert!(
            slots.contains(&minute(1)),
            "a figure within the retention was pruned"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "never pruned: {slots:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn migration_20_adds_the_stats_table_to_an_old_store() {
    let mut server = TestServer::spawn().await;
    assert_eq!(
        server.post_presence(&presence("m1", "m", 1)).await.code,
        200
    );
    assert!(server.terminate());
    // A store of the release before: no figures, nor the search index and the alert state
    // that came after them.
    let back_to_19 = "DROP TABLE alert_outbox; DROP TABLE alerts_firing;
        ALTER TABLE alerts DROP COLUMN node;
        DROP TABLE event_search; DROP TABLE stats; DELETE FROM schema_migrations WHERE version >= 20;";
    server.run_sql(back_to_19, back_to_19).await;
    server.start();
    assert_eq!(
        server.post_presence(&presence("m2", "m", 2)).await.code,
        200
    );
    let stats = server.get("/v1/stats?source=presence").await.body;
    assert_eq!(total(&stats, "applied"), 1);
    assert!(server.terminate());
    let cells = server
        .store()
        .await
        .stats_series(StatScope::Source, "presence", (0, i64::MAX / 2, 60_000))
        .await
        .expect("the table is back");
    assert_eq!(
        cells
            .iter()
            .filter(|c| c.figure == "received")
            .map(|c| c.sum)
            .sum::<i64>(),
        1
    );
}

#[tokio::test]
async fn two_nodes_on_one_database_add_their_figures_up() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let mut first = TestServer::spawn().await;
    let mut second = TestServer::join(&first).await;
    post_some(&first, "n").await;
    post_some(&second, "m").await;
    assert!(second.terminate());
    assert!(first.terminate());
    first.start();
    let stats = first.get("/v1/stats?source=presence").await.body;
    assert_eq!(total(&stats, "received"), 12);
    assert_eq!(total(&stats, "applied"), 6);
    assert_eq!(rejected(&stats, "invalid_signature"), 4);
    let overview = first.get("/v1/overview").await.body;
    assert_eq!(
        overview["sources"][0]["rejected"],
        json!({"invalid_signature": 4})
    );
}

#[tokio::test]
async fn a_destination_counts_what_it_forwarded_and_what_failed() {
    use crate::application::{serve_application, DEST_SECRET};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let calls = Arc::new(AtomicUsize::new(0));
    let port = serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(calls): axum::extract::State<Arc<AtomicUsize>>| async move {
                        // The first attempt fails: one failed, then one forwarded.
                        if calls.fetch_add(1, Ordering::SeqCst) == 0 {
                            axum::http::StatusCode::SERVICE_UNAVAILABLE
                        } else {
                            axum::http::StatusCode::NO_CONTENT
                        }
                    },
                ),
            )
            .with_state(Arc::clone(&calls)),
    )
    .await;
    let server = TestServer::spawn_with_sources(&format!(
        r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["presence"]
secret = "{DEST_SECRET}"
retry_base_s = 1
"#
    ))
    .await;
    assert_eq!(
        server.post_presence(&presence("f1", "f", 1)).await.code,
        200
    );
    let stats = server
        .wait_for("/v1/stats?destination=app", |r| {
            total(&r.body, "forwarded") == 1
        })
        .await
        .body;
    assert_eq!(stats["destination"], "app");
    assert_eq!(total(&stats, "failed"), 1);
    assert_eq!(total(&stats, "dead"), 0);
    assert!(points(&stats).iter().any(|p| p["lag_p99_ms"].is_u64()));
    // The source's own figures are apart from the destination's.
    let source = server.get("/v1/stats?source=presence").await.body;
    assert_eq!(
        (total(&source, "applied"), total(&source, "forwarded")),
        (1, 0)
    );
}
