//! Retries with backoff and dead letters, driven in-process with Tokio's
//! paused clock: a store whose settling fails on purpose stands in for a
//! projection that fails transiently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use inhook::clock::Clock;
use inhook::config::Config;
use inhook::contract::{Event, Presence, SourceKind};
use inhook::domain::{AggregateKey, DeadReason, EventStatus};
use inhook::projection::{PresenceState, SaveState};
use inhook::retry::RetryPolicy;
use inhook::store::*;
use inhook::worker::Worker;
use serde_json::json;
use tokio::sync::{watch, Notify};

/// Fails `settle` for aggregates whose key starts with `failing_prefix`, `failures` times.
struct FlakyStore {
    inner: SqliteStore,
    failing_prefix: &'static str,
    failures: u32,
    calls: AtomicU32,
}

#[async_trait]
impl Store for FlakyStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        self.inner.migrate().await
    }
    async fn ping(&self) -> Result<(), StoreError> {
        self.inner.ping().await
    }
    async fn ingest(
        &self,
        e: NewEvent<'_>,
        s: Option<&SourceRules>,
    ) -> Result<Admission, StoreError> {
        self.inner.ingest(e, s).await
    }
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
    async fn presence(&self, s: &str, u: &str) -> Result<Option<PresenceState>, StoreError> {
        self.inner.presence(s, u).await
    }
    async fn presence_page(
        &self,
        s: &str,
        p: Option<Presence>,
        l: usize,
        c: Option<&str>,
    ) -> Result<PresencePage, StoreError> {
        self.inner.presence_page(s, p, l, c).await
    }
    async fn save(&self, s: &str, a: &AggregateKey) -> Result<Option<SaveState>, StoreError> {
        self.inner.save(s, a).await
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
    async fn event(&self, s: &str, e: &str) -> Result<Option<EventRecord>, StoreError> {
        self.inner.event(s, e).await
    }
    async fn events(
        &self,
        f: &EventFilter,
        l: usize,
        c: Option<i64>,
    ) -> Result<EventPage, StoreError> {
        self.inner.events(f, l, c).await
    }
    async fn replay_event(&self, s: &str, e: &str, now: i64) -> Result<ReplayOutcome, StoreError> {
        self.inner.replay_event(s, e, now).await
    }
    async fn create_replay_job(&self, f: &EventFilter, now: i64) -> Result<ReplayJob, StoreError> {
        self.inner.create_replay_job(f, now).await
    }
    async fn status_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
        self.inner.status_counts().await
    }
    async fn undecided_counts(&self) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
        self.inner.undecided_counts().await
    }
    async fn saves_page(&self, s: &str, l: usize, c: Option<&str>) -> Result<SavePage, StoreError> {
        self.inner.saves_page(s, l, c).await
    }
    async fn last_change_id(&self) -> Result<i64, StoreError> {
        self.inner.last_change_id().await
    }
    async fn changes_after(
        &self,
        a: i64,
        s: Option<&str>,
        g: Option<&str>,
        l: usize,
    ) -> Result<Vec<StateChange>, StoreError> {
        self.inner.changes_after(a, s, g, l).await
    }
    async fn replay_job(&self, id: i64) -> Result<Option<ReplayJob>, StoreError> {
        self.inner.replay_job(id).await
    }
    async fn advance_replay_jobs(&self, now: i64, n: usize) -> Result<u64, StoreError> {
        self.inner.advance_replay_jobs(now, n).await
    }
    async fn purge(&self, b: i64, d: i64, now: i64, n: usize) -> Result<PurgeReport, StoreError> {
        self.inner.purge(b, d, now, n).await
    }
}

struct Harness {
    store: Arc<FlakyStore>,
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
    let store = Arc::new(FlakyStore {
        inner,
        failing_prefix,
        failures,
        calls: AtomicU32::new(0),
    });
    let clock = Clock::tokio(1_800_000_000_000);
    let (stop, stop_rx) = watch::channel(false);
    let worker = Worker {
        config,
        store: store.clone(),
        wake: Arc::new(Notify::new()),
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
    let event = Event::parse(SourceKind::SaveGame, &body).unwrap();
    let new = NewEvent {
        source: "save-game",
        event: &event,
        body: &body,
        received_at_ms: h.clock.now_ms(),
        signed_at: None,
        headers: &[],
        limits: IngestLimits::NONE,
    };
    h.store.ingest(new, None).await.unwrap();
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
    let state = h
        .store
        .save("save-game", &key("flaky"))
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
    assert!(h
        .store
        .save("save-game", &key("doomed"))
        .await
        .unwrap()
        .is_none());
    h.stop.send(true).unwrap();
}

fn key(player: &str) -> AggregateKey {
    AggregateKey::from_storage_key(&format!("{player}\u{1f}a")).unwrap()
}
