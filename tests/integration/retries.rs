//! Retries with backoff and dead letters, driven in-process with Tokio's
//! paused clock: a store whose settling fails on purpose stands in for a
//! projection that fails transiently. The replay test runs the real server on
//! either store, its projection broken by a trigger.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use inhook::config::Config;
use inhook::domain::clock::Clock;
use inhook::domain::kind::save::SaveEvent;
use inhook::domain::retry::RetryPolicy;
use inhook::domain::{AggregateKey, DeadReason, EventStatus};
use inhook::runtime::worker::Worker;
use inhook::store::*;
use serde_json::{json, Value};
use tokio::sync::{watch, Notify};

use crate::support::TestServer;

/// The worker's view of a store whose `settle` fails for aggregates whose key starts with
/// `failing_prefix`, `failures` times: one role, the rest of the store untouched.
struct FlakyStore {
    inner: Arc<SqliteStore>,
    failing_prefix: &'static str,
    failures: u32,
    calls: AtomicU32,
}

#[async_trait]
impl Settling for FlakyStore {
    async fn due_aggregates(
        &self,
        now: i64,
        limit: usize,
    ) -> Result<Vec<(String, String)>, StoreError> {
        self.inner.due_aggregates(now, limit).await
    }
    async fn settle(&self, r: &SourceRules, a: &str, now: i64) -> Result<SettleReport, StoreError> {
        if a.starts_with(self.failing_prefix)
            && self.calls.fetch_add(1, Ordering::SeqCst) < self.failures
        {
            return Err(StoreError::Unavailable(
                "projection failed on purpose".into(),
            ));
        }
        self.inner.settle(r, a, now).await
    }
    async fn record_failure(
        &self,
        r: &SourceRules,
        a: &str,
        e: &str,
        now: i64,
        p: RetryPolicy,
        j: f64,
    ) -> Result<FailureReport, StoreError> {
        self.inner.record_failure(r, a, e, now, p, j).await
    }
}

struct Harness {
    /// The whole store, as the test reads and logs through it.
    store: Arc<SqliteStore>,
    clock: Clock,
    stop: watch::Sender<bool>,
    _dir: tempfile::TempDir,
}

async fn harness(failing_prefix: &'static str, failures: u32, max_attempts: u32) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
        max_attempts = {max_attempts}
        retry_base_s = 1
        retry_max_delay_s = 60
        [[sources]]
        name = "save-game"
        kind = "save-game"
        secrets = ["s"]
        "#
    );
    let config = Arc::new(Config::from_parts(Some(&text), &HashMap::new()).unwrap());
    let inner = SqliteStore::open(&dir.path().join("r.db"), Duration::from_secs(5)).unwrap();
    inner.migrate().await.unwrap();
    let store = Arc::new(inner);
    let flaky = Arc::new(FlakyStore {
        inner: Arc::clone(&store),
        failing_prefix,
        failures,
        calls: AtomicU32::new(0),
    });
    let clock = Clock::tokio(1_800_000_000_000);
    let (stop, stop_rx) = watch::channel(false);
    let worker = Worker {
        config,
        store: flaky,
        wake: Arc::new(Notify::new()),
        forward_wake: Arc::new(Notify::new()),
        clock,
    };
    tokio::spawn(worker.run(stop_rx));
    Harness {
        store,
        clock,
        stop,
        _dir: dir,
    }
}

async fn log(h: &Harness, player: &str, event_id: &str) {
    let body = serde_json::to_vec(
        &json!({"event_id": event_id, "event_type": "inventory.updated",
        "player_id": player, "save_slot": "a", "sequence": 1, "idempotency_key": event_id,
        "data": {"added_items": [{"item_id": "gem", "qty": 1}]}}),
    )
    .unwrap();
    let event = SaveEvent::parse(&body).unwrap();
    let new = NewEvent {
        source: "save-game",
        event: &event.fields(),
        body: &body,
        received_at_ms: h.clock.now_ms(),
        signed_at: None,
        headers: &[],
        limits: IngestLimits::NONE,
        ignored: false,
        body_key: inhook::store::BodyKey::None,
        search_fields: &[],
    };
    h.store.ingest(new, SettleAt::Worker).await.unwrap();
}

/// Gaps between consecutive failed attempts, in milliseconds.
fn gaps(record: &EventRecord) -> Vec<i64> {
    let failed: Vec<i64> = record
        .history
        .iter()
        .filter(|h| h.kind == "failed")
        .map(|h| h.at_ms)
        .collect();
    failed.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(start_paused = true)]
async fn a_transient_failure_is_retried_on_the_backoff_schedule_then_processed() {
    let h = harness("flaky", 3, 8).await;
    log(&h, "flaky", "evt_t").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let record = h.store.event("save-game", "evt_t").await.unwrap().unwrap();
    assert_eq!(record.status, EventStatus::Processed, "{record:?}");
    assert_eq!(
        record.history.iter().filter(|h| h.kind == "failed").count(),
        3
    );
    // Attempt n waits base·2^(n-1) plus up to a quarter of jitter, plus one poll interval.
    let gaps = gaps(&record);
    assert_eq!(gaps.len(), 2);
    for (gap, backoff) in gaps.iter().zip([1_000, 2_000]) {
        assert!(
            *gap >= backoff && *gap <= backoff * 5 / 4 + 500,
            "gap {gap} for backoff {backoff}"
        );
    }
    let state = crate::conformance::save_of(&*h.store, "save-game", &key("flaky"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.inventory.get("gem"), Some(&1), "applied exactly once");
    h.stop.send(true).unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_never_ends_is_dead_after_max_attempts_and_blocks_nothing_else() {
    let h = harness("doomed", u32::MAX, 4).await;
    log(&h, "doomed", "evt_d").await;
    log(&h, "healthy", "evt_h").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let healthy = h.store.event("save-game", "evt_h").await.unwrap().unwrap();
    assert_eq!(
        healthy.status,
        EventStatus::Processed,
        "a failing aggregate blocks no other"
    );

    tokio::time::sleep(Duration::from_secs(60)).await;
    let record = h.store.event("save-game", "evt_d").await.unwrap().unwrap();
    assert_eq!(record.status, EventStatus::Dead);
    assert_eq!(record.dead_reason, Some(DeadReason::Exhausted));
    assert_eq!(record.attempts, 4);
    assert_eq!(
        record.last_error.as_deref(),
        Some("store unavailable: projection failed on purpose")
    );
    assert_eq!(record.history.len(), 4, "{:?}", record.history);
    for (gap, backoff) in gaps(&record).iter().zip([1_000, 2_000, 4_000]) {
        assert!(
            *gap >= backoff && *gap <= backoff * 5 / 4 + 500,
            "gap {gap} for backoff {backoff}"
        );
    }
    assert!(
        crate::conformance::save_of(&*h.store, "save-game", &key("doomed"))
            .await
            .unwrap()
            .is_none()
    );
    h.stop.send(true).unwrap();
}

fn key(player: &str) -> AggregateKey {
    AggregateKey::from_storage_key(&format!("{player}\u{1f}a")).unwrap()
}

/// Makes every write of a save slot's state fail in the real server, on either store,
/// until [`heal_projection`]: a projection failing for as long as a person has not fixed it.
async fn break_projection(server: &TestServer) {
    server
        .run_sql(
            "CREATE TRIGGER broken_insert BEFORE INSERT ON aggregate_state
             WHEN NEW.source = 'save-game'
             BEGIN SELECT RAISE(ABORT, 'projection failed on purpose'); END;
             CREATE TRIGGER broken_update BEFORE UPDATE ON aggregate_state
             WHEN NEW.source = 'save-game'
             BEGIN SELECT RAISE(ABORT, 'projection failed on purpose'); END;",
            "CREATE FUNCTION broken() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RAISE EXCEPTION 'projection failed on purpose'; END $$;
             CREATE TRIGGER broken BEFORE INSERT OR UPDATE ON aggregate_state
               FOR EACH ROW WHEN (NEW.source = 'save-game') EXECUTE FUNCTION broken();",
        )
        .await;
}

/// Undoes [`break_projection`].
async fn heal_projection(server: &TestServer) {
    server
        .run_sql(
            "DROP TRIGGER broken_insert; DROP TRIGGER broken_update;",
            "DROP TRIGGER broken ON aggregate_state; DROP FUNCTION broken();",
        )
        .await;
}

/// Kinds of an event's history, oldest first, over the API.
async fn history_kinds(server: &TestServer, event_id: &str) -> Vec<String> {
    let event = server
        .get(&format!("/v1/events/save-game/{event_id}"))
        .await;
    event.body["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_replayed_exhausted_event_gets_a_fresh_attempt_budget_and_keeps_its_history() {
    let server = TestServer::in_process()
        .spawn_configured(
            "max_attempts = 3\nretry_base_s = 1\nretry_max_delay_s = 60",
            "",
        )
        .await;
    break_projection(&server).await;
    let body = |id: &str, player: &str| {
        json!({"event_id": id, "event_type": "inventory.updated", "player_id": player,
               "save_slot": "a", "sequence": 1, "idempotency_key": id,
               "data": {"added_items": [{"item_id": "gem", "qty": 1}]}})
    };
    assert_eq!(server.post_save(&body("rf1", "replayer")).await.code, 202);
    let path = "/v1/events/save-game/rf1";
    let dead = server.wait_for(path, |r| r.body["status"] == "dead").await;
    assert_eq!(dead.body["dead_reason"], "exhausted");
    assert_eq!(dead.body["attempts"], 3);
    assert_eq!(history_kinds(&server, "rf1").await, ["failed"; 3]);

    // Replayed while still broken: max_attempts more attempts, backoff from the start.
    let replay = reqwest::Client::new()
        .post(format!("{}{path}/replay", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(replay.status(), 202);
    let dead_again = server
        .wait_for(path, |r| {
            r.body["status"] == "dead" && r.body["replays"] == 1
        })
        .await;
    assert_eq!(dead_again.body["dead_reason"], "exhausted");
    assert_eq!(dead_again.body["attempts"], 6, "attempts counts both runs");
    assert_eq!(
        history_kinds(&server, "rf1").await,
        ["failed", "failed", "failed", "replayed", "failed", "failed", "failed"]
    );
    let record = server
        .store()
        .await
        .event("save-game", "rf1")
        .await
        .unwrap()
        .unwrap();
    let second_run: Vec<i64> = record
        .history
        .iter()
        .skip_while(|h| h.kind != "replayed")
        .filter(|h| h.kind == "failed")
        .map(|h| h.at_ms)
        .collect();
    let gaps: Vec<i64> = second_run.windows(2).map(|w| w[1] - w[0]).collect();
    assert_eq!(gaps.len(), 2);
    assert!(
        gaps[0] >= 1_000 && gaps[0] < 4_000 && gaps[1] >= 2_000,
        "the second run's backoff starts again at retry_base_s: {gaps:?}"
    );

    // A retrying event is left alone by a bulk replay without a status.
    assert_eq!(server.post_save(&body("rf2", "waiter")).await.code, 202);
    server
        .wait_for("/v1/events/save-game/rf2", |r| {
            r.body["status"] == "retrying"
        })
        .await;
    server
        .run_sql(
            "UPDATE events SET next_attempt_at = 9000000000000 WHERE event_id = 'rf2'",
            "UPDATE events SET next_attempt_at = 9000000000000 WHERE event_id = 'rf2'",
        )
        .await;

    // Fixed, then replayed in bulk (dead events by default): applied once.
    heal_projection(&server).await;
    let job = reqwest::Client::new()
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(job.status(), 202);
    assert_eq!(job.json::<Value>().await.unwrap()["total"], 1, "only rf1");
    let processed = server
        .wait_for(path, |r| r.body["status"] == "processed")
        .await;
    assert_eq!(processed.body["replays"], 2);
    assert_eq!(processed.body["attempts"], 7);
    assert_eq!(history_kinds(&server, "rf1").await.len(), 8);
    let save = server.get("/v1/saves/replayer/a").await;
    assert_eq!(save.body["inventory"], json!({"gem": 1}));
    let waiter = server.get("/v1/events/save-game/rf2").await;
    assert_eq!(
        (
            waiter.body["status"].as_str(),
            waiter.body["replays"].as_i64()
        ),
        (Some("retrying"), Some(0))
    );
}
