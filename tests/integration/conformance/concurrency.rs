//! Deliveries racing each other: the group-commit paths must keep the dedup
//! keys and the hard limits exact, whatever the batch they land in.

use futures_util::future::join_all;
use inhook::domain::EventStatus;
use inhook::domain::{AggregateKey, Ident};
use inhook::store::{Admission, DedupKey, EventFilter, IngestLimits, Refusal, SettleAt, Store};
use serde_json::json;

use super::{
    all_events, delta, ingest, ingest_at, save_keyed, save_of, save_rules, slot, SAVES, T0,
};

/// Resends racing the first delivery (new event ids with one idempotency
/// key, and the same event id again) log exactly one event; every other
/// answer is a duplicate of it.
pub async fn racing_resends_log_exactly_one_event(store: &dyn Store) {
    let rules = save_rules();
    let key = "player_1024:slot_a:race";
    let body = |event_id: String| {
        save_keyed(
            &event_id,
            "slot_a",
            "inventory.updated",
            1,
            key,
            json!({"added_items": [{"item_id": "stamp", "qty": 1}]}),
        )
    };
    let bodies: Vec<_> = (0..16).map(|i| body(format!("race_{}", i % 12))).collect();
    let admissions = join_all(
        bodies
            .iter()
            .map(|b| ingest(store, &rules, b, T0, IngestLimits::NONE, false)),
    )
    .await;
    let logged: Vec<_> = admissions
        .iter()
        .zip(&bodies)
        .filter(|(a, _)| matches!(a, Admission::Logged { .. }))
        .map(|(_, b)| b["event_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(logged.len(), 1, "{admissions:?}");
    for admission in &admissions {
        match admission {
            Admission::Logged { .. } => {}
            Admission::Duplicate {
                key,
                original,
                body_differs,
            } => {
                // By either key, the duplicate is of the one event logged.
                assert!(matches!(key, DedupKey::IdempotencyKey | DedupKey::EventId));
                assert_eq!(
                    (original.as_str(), *body_differs),
                    (logged[0].as_str(), false)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    let events = all_events(store, &EventFilter::default()).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].event_id, logged[0]);
}

/// Issue #14: deliveries decided in the transaction that logs them, racing others with
/// their idempotency key (so both may share a batch, each ready in its own save slot),
/// apply only the event logged: the other's slot keeps no state, though a plan made
/// before the insert had applied it there.
pub async fn racing_keys_decided_at_ingest_apply_only_the_logged_event(store: &dyn Store) {
    let rules = save_rules();
    let pair = |n: usize| {
        let body = |side: &str| {
            save_keyed(
                &format!("{side}_{n}"),
                &format!("{side}_{n}"),
                "inventory.updated",
                1,
                &format!("player_1024:shared_{n}"),
                json!({"added_items": [{"item_id": "sword", "qty": 1}]}),
            )
        };
        [body("a"), body("b")]
    };
    let bodies: Vec<_> = (1..=8).flat_map(pair).collect();
    let admissions = join_all(bodies.iter().map(|b| {
        ingest_at(
            store,
            &rules,
            b,
            T0,
            IngestLimits::NONE,
            SettleAt::IfReady(&rules),
        )
    }))
    .await;
    for (body, admission) in bodies.iter().zip(&admissions) {
        let slot_name = body["event_id"].as_str().unwrap();
        // What ingest left undecided, the worker settles.
        store
            .settle(&rules, &slot(slot_name), T0 + 10)
            .await
            .expect("settle");
        let key = AggregateKey::of_parts(vec![
            Ident::parse("player_1024").unwrap(),
            Ident::parse(slot_name).unwrap(),
        ]);
        let state = save_of(store, SAVES, &key).await.unwrap();
        let granted = state.and_then(|s| s.inventory.get("sword").copied());
        match admission {
            Admission::Logged { .. } => assert_eq!(granted, Some(1), "{slot_name}"),
            Admission::Duplicate { .. } => assert_eq!(granted, None, "{slot_name} applied"),
            other => panic!("unexpected {other:?}"),
        }
    }
    let events = all_events(store, &EventFilter::default()).await;
    assert_eq!(events.len(), 8, "one of each pair");
    for event in &events {
        assert_eq!(event.status, EventStatus::Processed, "{}", event.event_id);
        assert_eq!(event.attempts, 1, "{}", event.event_id);
    }
}

/// Many deliveries at once never take the source over `max_backlog`: exactly
/// as many are logged as it allows, the rest are refused and leave nothing.
pub async fn racing_deliveries_never_overshoot_max_backlog(store: &dyn Store) {
    let rules = save_rules();
    let limits = IngestLimits {
        max_backlog: 5,
        ..IngestLimits::NONE
    };
    let bodies: Vec<_> = (0..24)
        .map(|i| delta(&format!("b{i}"), &format!("slot_{i}"), 1, 1))
        .collect();
    let admissions = join_all(
        bodies
            .iter()
            .map(|b| ingest(store, &rules, b, T0, limits, false)),
    )
    .await;
    let refused = admissions
        .iter()
        .filter(|a| **a == Admission::Refused(Refusal::BacklogFull))
        .count();
    let logged = admissions
        .iter()
        .filter(|a| matches!(a, Admission::Logged { .. }))
        .count();
    assert_eq!((logged, refused), (5, 19), "{admissions:?}");
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 5);
    assert_eq!(
        store.undecided_counts().await.unwrap(),
        [(SAVES.to_owned(), EventStatus::Received, 5)]
    );
}

/// Settling several aggregates in one step frees exactly their events' share of
/// `max_backlog`, also while deliveries race the step: the limit is the number of
/// undecided events, whichever way a store counts decisions.
pub async fn decisions_free_exactly_their_share_of_max_backlog(store: &dyn Store) {
    let rules = save_rules();
    let limits = IngestLimits {
        max_backlog: 6,
        ..IngestLimits::NONE
    };
    let body = |i: usize| delta(&format!("f{i}"), &format!("slot_{i}"), 1, 1);
    for i in 0..6 {
        let admission = ingest(store, &rules, &body(i), T0, limits, false).await;
        assert!(
            matches!(admission, Admission::Logged { .. }),
            "{admission:?}"
        );
    }
    let full = ingest(store, &rules, &body(6), T0, limits, false).await;
    assert_eq!(full, Admission::Refused(Refusal::BacklogFull));
    // Four aggregates settled in one step while twenty deliveries race it: however the
    // race falls, never more than six undecided, and once it settles exactly four more fit.
    let work: Vec<_> = (0..4)
        .map(|i| (rules.clone(), slot(&format!("slot_{i}"))))
        .collect();
    let racing: Vec<_> = (7..27).map(body).collect();
    let (reports, admissions) = tokio::join!(
        store.settle_many(&work, T0 + 10),
        join_all(
            racing
                .iter()
                .map(|b| ingest(store, &rules, b, T0 + 10, limits, false))
        )
    );
    let applied: u64 = reports.unwrap().iter().map(|r| r.applied).sum();
    assert_eq!(applied, 4);
    let raced = admissions
        .iter()
        .filter(|a| matches!(a, Admission::Logged { .. }))
        .count();
    assert!(raced <= 4, "{raced} logged over the limit: {admissions:?}");
    let undecided =
        |counts: Vec<(String, EventStatus, u64)>| -> u64 { counts.iter().map(|(_, _, n)| n).sum() };
    assert_eq!(
        undecided(store.undecided_counts().await.unwrap()),
        2 + raced as u64
    );
    let mut more = 0;
    for i in 27..40 {
        if matches!(
            ingest(store, &rules, &body(i), T0 + 20, limits, false).await,
            Admission::Logged { .. }
        ) {
            more += 1;
        }
    }
    assert_eq!(raced + more, 4, "the four decided events' share, exactly");
    assert_eq!(undecided(store.undecided_counts().await.unwrap()), 6);
}

/// Many deltas ahead of one gap at once never exceed `max_held_per_aggregate`.
pub async fn racing_deltas_never_overshoot_max_held_per_aggregate(store: &dyn Store) {
    let rules = save_rules();
    let limits = IngestLimits {
        max_held_per_aggregate: 4,
        ..IngestLimits::NONE
    };
    let bodies: Vec<_> = (3..=14)
        .map(|seq| delta(&format!("h{seq}"), "slot_a", seq, 1))
        .collect();
    let admissions = join_all(
        bodies
            .iter()
            .map(|b| ingest(store, &rules, b, T0, limits, false)),
    )
    .await;
    let refused = admissions
        .iter()
        .filter(|a| **a == Admission::Refused(Refusal::AggregateBacklogFull))
        .count();
    assert_eq!(refused, 8, "{admissions:?}");
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 4);
}

/// Sync deliveries of one aggregate racing each other each get an answer
/// that agrees with the log and the change feed, and the state ends at the
/// highest sequence.
pub async fn racing_sync_deliveries_end_at_the_highest_sequence(store: &dyn Store) {
    let rules = super::presence_rules();
    let order = [7, 3, 12, 1, 9, 5, 11, 2, 10, 4, 8, 6];
    let bodies: Vec<_> = order
        .iter()
        .map(|seq| super::presence(&format!("p{seq}"), "usr_A", "ONLINE", *seq))
        .collect();
    let admissions = join_all(
        bodies
            .iter()
            .map(|b| ingest(store, &rules, b, T0, IngestLimits::NONE, true)),
    )
    .await;
    let mut applied = 0;
    for (seq, admission) in order.iter().zip(&admissions) {
        let Admission::Logged {
            decided: Some(decided),
            ..
        } = admission
        else {
            panic!("expected a sync decision, got {admission:?}");
        };
        let expected = match decided.outcome {
            inhook::domain::ordering::Outcome::Applied => {
                applied += 1;
                EventStatus::Processed
            }
            inhook::domain::ordering::Outcome::Stale => EventStatus::IgnoredStale,
            ref other => panic!("unexpected {other:?}"),
        };
        let record = store
            .event(super::PRESENCE, &format!("p{seq}"))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.status, expected, "p{seq}");
        assert!(decided.current_sequence.unwrap() >= *seq);
    }
    let state = super::presence_of(store, super::PRESENCE, "usr_A")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(state.sequence.get(), 12);
    let changes = store.changes_after(0, None, None, 100).await.unwrap();
    assert_eq!(changes.len(), applied, "one change per applied event");
}

/// The overview's counts stay exact while reads race ingest, settling and purge (on
/// PostgreSQL each read folds the deltas concurrent writers append): every read during a
/// burst lies between the counts before and after it, and every read after one is exact.
pub async fn counts_stay_exact_while_reads_race_writes(store: &dyn Store) {
    use inhook::store::{SettleReport, StoreError};
    type Counts = Vec<(String, EventStatus, u64)>;
    async fn total(store: &dyn Store) -> u64 {
        store
            .status_counts()
            .await
            .unwrap()
            .iter()
            .map(|c| c.2)
            .sum()
    }
    /// Runs `writes` with a read of the counts between every two of them.
    async fn racing<T>(
        store: &dyn Store,
        writes: Vec<impl std::future::Future<Output = T>>,
    ) -> (Vec<T>, Vec<u64>) {
        let reads = (0..writes.len()).map(|_| total(store));
        futures_util::join!(join_all(writes), join_all(reads))
    }
    let rules = save_rules();
    let only = |counts: Counts| -> Vec<(EventStatus, u64)> {
        counts
            .into_iter()
            .map(|(s, status, n)| {
                assert_eq!(s, SAVES);
                (status, n)
            })
            .collect()
    };
    let mut logged = 0;
    for round in 0..3 {
        let bodies: Vec<_> = (0..32)
            .map(|i| delta(&format!("r{round}_{i}"), &format!("slot_{i}"), round + 1, 1))
            .collect();
        let writes = bodies
            .iter()
            .map(|b| ingest(store, &rules, b, T0, IngestLimits::NONE, false))
            .collect();
        let (admissions, reads) = racing(store, writes).await;
        assert!(admissions
            .iter()
            .all(|a| matches!(a, Admission::Logged { .. })));
        for read in reads {
            assert!(
                (logged..=logged + 32).contains(&read),
                "{read} read in round {round}"
            );
        }
        logged += 32;
        assert_eq!(total(store).await, logged, "after round {round}");
    }
    let slots: Vec<_> = (0..32).map(|i| super::slot(&format!("slot_{i}"))).collect();
    let writes = slots
        .iter()
        .map(|s| store.settle(&rules, s, T0 + 1))
        .collect();
    let (settled, reads): (Vec<Result<SettleReport, StoreError>>, _) = racing(store, writes).await;
    let failed: Vec<String> = settled
        .iter()
        .filter_map(|s| s.as_ref().err().map(ToString::to_string))
        .collect();
    assert!(failed.is_empty(), "settles failed: {failed:?}");
    assert!(reads.iter().all(|n| *n == logged), "{reads:?}");
    assert_eq!(
        only(store.status_counts().await.unwrap()),
        [(EventStatus::Processed, logged)]
    );
    let writes = (0..4)
        .map(|_| store.purge(T0 + 1, T0, T0 + 2, 10))
        .collect();
    let (purged, reads) = racing(store, writes).await;
    let purged: u64 = purged.into_iter().map(|p| p.unwrap().events).sum();
    assert!((10..=40).contains(&purged), "{purged} purged");
    let left = logged - purged;
    assert!(
        reads.iter().all(|n| (left..=logged).contains(n)),
        "{reads:?}"
    );
    assert_eq!(
        only(store.status_counts().await.unwrap()),
        [(EventStatus::Processed, left)]
    );
    assert_eq!(
        all_events(store, &EventFilter::default()).await.len() as u64,
        left
    );
}

/// Two nodes group-committing one burst of deliveries, one node in order and the other in
/// reverse (so their batches meet the same keys in opposite orders), never deadlock: every
/// delivery is answered, logged once or a duplicate of the one logged.
pub async fn nodes_ingesting_one_burst_in_opposite_orders_never_deadlock(
    open: super::forwarding::Opener,
) {
    let (first, second) = (open(), open());
    let rules = save_rules();
    for round in 0..4 {
        let bodies: Vec<_> = (0..64)
            .map(|i| {
                delta(
                    &format!("o{round}_{i}"),
                    &format!("slot_{}", i % 16),
                    round * 4 + i / 16 + 1,
                    1,
                )
            })
            .collect();
        let forward = bodies
            .iter()
            .map(|b| ingest(&*first, &rules, b, T0, IngestLimits::NONE, false));
        let backward = bodies
            .iter()
            .rev()
            .map(|b| ingest(&*second, &rules, b, T0, IngestLimits::NONE, false));
        let (forward, backward) = futures_util::join!(join_all(forward), join_all(backward));
        let logged = forward
            .iter()
            .chain(&backward)
            .filter(|a| matches!(a, Admission::Logged { .. }))
            .count();
        assert_eq!(logged, 64, "round {round}");
        assert!(forward.iter().chain(&backward).all(|a| matches!(
            a,
            Admission::Logged { .. }
                | Admission::Duplicate {
                    body_differs: false,
                    ..
                }
        )));
    }
    assert_eq!(
        all_events(&*first, &EventFilter::default()).await.len(),
        256
    );
}
