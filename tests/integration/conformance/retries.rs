//! Failed attempts, retries and the dead letter; single and bulk replays.

use inhook::domain::retry::RetryPolicy;
use inhook::domain::{DeadReason, EventStatus};
use inhook::store::{EventFilter, FailureReport, ReplayOutcome, Store};

use super::{delta, ingest_save, logged, save_rules, slot, SAVES, T0};

const POLICY: RetryPolicy = RetryPolicy {
    base_ms: 1_000,
    max_delay_ms: 10_000,
    max_attempts: 3,
};

/// Kills every due event of `slot_name` at `at_ms` with one exhausted attempt.
async fn kill(store: &dyn Store, slot_name: &str, at_ms: i64) -> FailureReport {
    let once = RetryPolicy {
        max_attempts: 1,
        ..POLICY
    };
    store
        .record_failure(&save_rules(), &slot(slot_name), "down", at_ms, once, 0.0)
        .await
        .unwrap()
}

/// A failed attempt schedules the next after the backoff; only due events
/// are attempted; the last attempt makes the event dead (`exhausted`), and
/// each failure is in its history.
pub async fn failures_back_off_then_the_event_is_dead_with_its_history(store: &dyn Store) {
    let rules = save_rules();
    let aggregate = slot("slot_a");
    logged(&ingest_save(store, &delta("r1", "slot_a", 1, 1), T0).await);
    let fail =
        |at: i64| store.record_failure(&rules, &aggregate, "target returned 500", at, POLICY, 0.0);
    assert_eq!(
        fail(T0).await.unwrap(),
        FailureReport {
            retrying: 1,
            dead: 0
        }
    );
    let event = store.event(SAVES, "r1").await.unwrap().unwrap();
    assert_eq!(
        (
            event.status,
            event.attempts,
            event.next_attempt_at_ms,
            event.last_error.as_deref()
        ),
        (
            EventStatus::Retrying,
            1,
            Some(T0 + 1_000),
            Some("target returned 500")
        )
    );
    assert!(store.due_aggregates(T0 + 999, 10).await.unwrap().is_empty());
    assert_eq!(fail(T0 + 999).await.unwrap(), FailureReport::default());
    assert_eq!(
        store.due_aggregates(T0 + 1_000, 10).await.unwrap(),
        [(SAVES.to_owned(), aggregate.clone())]
    );
    assert_eq!(
        fail(T0 + 1_000).await.unwrap(),
        FailureReport {
            retrying: 1,
            dead: 0
        }
    );
    let event = store.event(SAVES, "r1").await.unwrap().unwrap();
    assert_eq!(
        (event.attempts, event.next_attempt_at_ms),
        (2, Some(T0 + 3_000))
    );
    assert_eq!(
        fail(T0 + 3_000).await.unwrap(),
        FailureReport {
            retrying: 0,
            dead: 1
        }
    );
    let dead = store.event(SAVES, "r1").await.unwrap().unwrap();
    assert_eq!(
        (
            dead.status,
            dead.dead_reason,
            dead.attempts,
            dead.next_attempt_at_ms,
            dead.decided_at_ms
        ),
        (
            EventStatus::Dead,
            Some(DeadReason::Exhausted),
            3,
            None,
            Some(T0 + 3_000)
        )
    );
    let history: Vec<_> = dead
        .history
        .iter()
        .map(|h| (h.at_ms, h.kind.as_str(), h.error.as_deref()))
        .collect();
    let failed = Some("target returned 500");
    assert_eq!(
        history,
        [
            (T0, "failed", failed),
            (T0 + 1_000, "failed", failed),
            (T0 + 3_000, "failed", failed)
        ]
    );
    assert!(store
        .due_aggregates(T0 + 1_000_000, 10)
        .await
        .unwrap()
        .is_empty());
    // Jitter adds up to a quarter of the delay.
    logged(&ingest_save(store, &delta("j1", "slot_b", 1, 1), T0).await);
    store
        .record_failure(&rules, &slot("slot_b"), "x", T0, POLICY, 0.5)
        .await
        .unwrap();
    let jittered = store.event(SAVES, "j1").await.unwrap().unwrap();
    assert_eq!(jittered.next_attempt_at_ms, Some(T0 + 1_125));
}

/// Replaying a dead or retrying event puts it back in the queue (with a
/// `replayed` line in its history); other events are left as they are.
pub async fn replaying_one_event_requeues_only_dead_or_retrying_events(store: &dyn Store) {
    logged(&ingest_save(store, &delta("d1", "slot_a", 1, 1), T0).await);
    assert_eq!(kill(store, "slot_a", T0).await.dead, 1);
    assert_eq!(
        store.replay_event(SAVES, "nope", T0).await.unwrap(),
        ReplayOutcome::NotFound
    );
    assert_eq!(
        store.replay_event("other", "d1", T0).await.unwrap(),
        ReplayOutcome::NotFound
    );
    assert_eq!(
        store.replay_event(SAVES, "d1", T0 + 10).await.unwrap(),
        ReplayOutcome::Requeued
    );
    let requeued = store.event(SAVES, "d1").await.unwrap().unwrap();
    assert_eq!(
        (
            requeued.status,
            requeued.dead_reason,
            requeued.replays,
            requeued.decided_at_ms
        ),
        (EventStatus::Received, None, 1, None)
    );
    let last = requeued.history.last().expect("history");
    assert_eq!((last.at_ms, last.kind.as_str()), (T0 + 10, "replayed"));
    assert_eq!(
        store.replay_event(SAVES, "d1", T0 + 11).await.unwrap(),
        ReplayOutcome::Unchanged(EventStatus::Received)
    );
    let report = store
        .settle(&save_rules(), &slot("slot_a"), T0 + 20)
        .await
        .unwrap();
    assert_eq!(report.applied, 1);
    assert_eq!(
        store.replay_event(SAVES, "d1", T0 + 30).await.unwrap(),
        ReplayOutcome::Unchanged(EventStatus::Processed)
    );
    // A retrying event can be replayed before its next attempt is due.
    logged(&ingest_save(store, &delta("t1", "slot_b", 1, 1), T0).await);
    store
        .record_failure(&save_rules(), &slot("slot_b"), "x", T0, POLICY, 0.0)
        .await
        .unwrap();
    assert_eq!(
        store.replay_event(SAVES, "t1", T0 + 1).await.unwrap(),
        ReplayOutcome::Requeued
    );
    assert_eq!(
        store
            .event(SAVES, "t1")
            .await
            .unwrap()
            .unwrap()
            .next_attempt_at_ms,
        None
    );
    assert!(store
        .due_aggregates(T0 + 1, 10)
        .await
        .unwrap()
        .contains(&(SAVES.to_owned(), slot("slot_b"))));
}

/// A bulk replay is persisted with its total (dead events by default) and
/// advances aggregate by aggregate from a stored cursor: what it passed is
/// not replayed again, and its progress reads back until it is done.
pub async fn a_bulk_replay_advances_by_aggregate_from_a_stored_cursor(store: &dyn Store) {
    for (event_id, slot_name, seq) in [
        ("a1", "slot_a", 1),
        ("a2", "slot_a", 2),
        ("b1", "slot_b", 1),
        ("c1", "slot_c", 1),
    ] {
        logged(&ingest_save(store, &delta(event_id, slot_name, seq, 1), T0).await);
    }
    for slot_name in ["slot_a", "slot_b", "slot_c"] {
        kill(store, slot_name, T0).await;
    }
    // Not dead: a bulk replay of dead events leaves it alone.
    logged(&ingest_save(store, &delta("d1", "slot_d", 1, 1), T0).await);
    assert_eq!(store.advance_replay_jobs(T0, 10).await.unwrap(), 0);

    let filter = EventFilter {
        source: Some(SAVES.into()),
        ..EventFilter::default()
    };
    let job = store.create_replay_job(&filter, T0 + 1).await.unwrap();
    assert_eq!(
        (
            job.filter.status,
            job.state.as_str(),
            job.total,
            job.requeued,
            job.created_at_ms
        ),
        (Some(EventStatus::Dead), "running", 4, 0, T0 + 1)
    );
    assert_eq!(store.replay_job(job.id).await.unwrap(), Some(job.clone()));
    assert_eq!(store.replay_job(job.id + 1000).await.unwrap(), None);

    // The first aggregate in (source, aggregate) order is requeued whole.
    assert_eq!(store.advance_replay_jobs(T0 + 2, 1).await.unwrap(), 2);
    let progress = store.replay_job(job.id).await.unwrap().unwrap();
    assert_eq!(
        (
            progress.state.as_str(),
            progress.requeued,
            progress.updated_at_ms
        ),
        ("running", 2, T0 + 2)
    );
    assert_eq!(
        store.event(SAVES, "a1").await.unwrap().unwrap().status,
        EventStatus::Received
    );
    assert_eq!(
        store.event(SAVES, "b1").await.unwrap().unwrap().status,
        EventStatus::Dead
    );
    // Dead again behind the cursor: the job does not go back for it.
    kill(store, "slot_a", T0 + 3).await;
    let mut steps = 0;
    let mut requeued = 0;
    while store.replay_job(job.id).await.unwrap().unwrap().state == "running" {
        steps += 1;
        assert!(steps <= 5, "the job never finishes");
        requeued += store.advance_replay_jobs(T0 + 4, 1).await.unwrap();
    }
    assert_eq!(requeued, 2);
    let done = store.replay_job(job.id).await.unwrap().unwrap();
    assert_eq!(
        (done.state.as_str(), done.requeued, done.total),
        ("done", 4, 4)
    );
    for (event_id, status) in [
        ("a1", EventStatus::Dead),
        ("a2", EventStatus::Dead),
        ("b1", EventStatus::Received),
        ("c1", EventStatus::Received),
        ("d1", EventStatus::Received),
    ] {
        let event = store.event(SAVES, event_id).await.unwrap().unwrap();
        assert_eq!(event.status, status, "{event_id}");
    }
    assert_eq!(store.advance_replay_jobs(T0 + 5, 10).await.unwrap(), 0);
}

/// A late delta, dead after its gap was skipped, applies when a person
/// replays it (its sequence is still free); a held event cannot be replayed;
/// a bulk replay can take retrying events instead of dead ones.
pub async fn replays_apply_late_deltas_and_bulk_replays_take_a_status(store: &dyn Store) {
    let rules = save_rules();
    logged(&ingest_save(store, &delta("g1", "slot_a", 1, 1), T0).await);
    logged(&ingest_save(store, &delta("g3", "slot_a", 3, 1), T0).await);
    logged(&ingest_save(store, &delta("g5", "slot_a", 5, 1), T0 + 40_000).await);
    let skip_at = T0 + rules.hold_timeout_ms;
    let report = store
        .settle(&rules, &slot("slot_a"), skip_at)
        .await
        .unwrap();
    assert_eq!(
        (report.applied, report.gaps_skipped, report.held),
        (2, 1, 1)
    );
    assert_eq!(
        store.replay_event(SAVES, "g5", skip_at).await.unwrap(),
        ReplayOutcome::Unchanged(EventStatus::Held)
    );
    logged(&ingest_save(store, &delta("g2", "slot_a", 2, 10), skip_at + 1).await);
    let report = store
        .settle(&rules, &slot("slot_a"), skip_at + 2)
        .await
        .unwrap();
    assert_eq!(report.dead, [DeadReason::LateAfterGapSkip]);
    assert_eq!(
        store.replay_event(SAVES, "g2", skip_at + 3).await.unwrap(),
        ReplayOutcome::Requeued
    );
    let report = store
        .settle(&rules, &slot("slot_a"), skip_at + 4)
        .await
        .unwrap();
    assert_eq!((report.applied, report.dead.len()), (1, 0));
    let replayed = store.event(SAVES, "g2").await.unwrap().unwrap();
    assert_eq!(
        (replayed.status, replayed.replays),
        (EventStatus::Processed, 1)
    );
    let key = inhook::domain::AggregateKey::from_storage_key(&slot("slot_a")).unwrap();
    let state = super::save_of(store, SAVES, &key).await.unwrap().unwrap();
    assert_eq!(state.inventory.get("sword"), Some(&12));
    assert_eq!(state.last_sequence, 3, "g5 still waits for 4");

    // Bulk replay of retrying events only.
    logged(&ingest_save(store, &delta("t1", "slot_b", 1, 1), T0).await);
    logged(&ingest_save(store, &delta("k1", "slot_c", 1, 1), T0).await);
    store
        .record_failure(&rules, &slot("slot_b"), "x", T0, POLICY, 0.0)
        .await
        .unwrap();
    kill(store, "slot_c", T0).await;
    let filter = EventFilter {
        status: Some(EventStatus::Retrying),
        ..EventFilter::default()
    };
    let job = store.create_replay_job(&filter, T0 + 1).await.unwrap();
    assert_eq!(
        (job.total, job.filter.status),
        (1, Some(EventStatus::Retrying))
    );
    assert_eq!(store.advance_replay_jobs(T0 + 2, 10).await.unwrap(), 1);
    assert_eq!(
        store.replay_job(job.id).await.unwrap().unwrap().state,
        "done"
    );
    assert_eq!(
        store.event(SAVES, "t1").await.unwrap().unwrap().status,
        EventStatus::Received
    );
    assert_eq!(
        store.event(SAVES, "k1").await.unwrap().unwrap().status,
        EventStatus::Dead
    );
}
