//! Reading the event log: listings with filters and cursors, the overview
//! counts, and retention (purge) with its kept dedup keys.

use inhook::domain::retry::RetryPolicy;
use inhook::domain::search::TypePattern;
use inhook::domain::EventStatus;
use inhook::store::{Admission, DedupKey, EventFilter, PurgeReport, Store};
use serde_json::json;

use super::{
    all_events, delta, ingest_save, logged, presence, presence_rules, save, save_keyed, save_rules,
    slot, PRESENCE, SAVES, T0,
};

const ONE_ATTEMPT: RetryPolicy = RetryPolicy {
    base_ms: 1_000,
    max_delay_ms: 1_000,
    max_attempts: 1,
};

/// Logs one event of every status, in this row order:
/// p1 p2 (presence) s1 s2 b1 u1 k1 r1 t1 (saves).
async fn one_of_each_status(store: &dyn Store) {
    let presence_rules = presence_rules();
    let sync = |body: serde_json::Value, at| super::ingest_sync(store, &presence_rules, body, at);
    sync(presence("p1", "usr_A", "ONLINE", 1), T0).await;
    sync(presence("p2", "usr_A", "AWAY", 1), T0 + 1).await;
    let rules = save_rules();
    logged(&ingest_save(store, &delta("s1", "slot_a", 1, 1), T0 + 2).await);
    logged(&ingest_save(store, &delta("s2", "slot_a", 3, 1), T0 + 3).await);
    logged(&ingest_save(store, &delta("b1", "slot_b", 1, 1), T0 + 4).await);
    let unknown = save("u1", "slot_c", "quest.started", 1, json!({}));
    logged(&ingest_save(store, &unknown, T0 + 5).await);
    logged(&ingest_save(store, &delta("k1", "slot_d", 1, 1), T0 + 6).await);
    logged(&ingest_save(store, &delta("r1", "slot_e", 1, 1), T0 + 7).await);
    logged(&ingest_save(store, &delta("t1", "slot_f", 1, 1), T0 + 8).await);
    for slot_name in ["slot_a", "slot_b", "slot_c"] {
        store
            .settle(&rules, &slot(slot_name), T0 + 10)
            .await
            .unwrap();
    }
    let fail = |slot_name: &'static str, policy| {
        let rules = rules.clone();
        async move {
            store
                .record_failure(&rules, &slot(slot_name), "down", T0 + 10, policy, 0.0)
                .await
                .unwrap()
        }
    };
    fail("slot_d", ONE_ATTEMPT).await;
    fail("slot_f", RetryPolicy::default()).await;
}

fn ids(events: &[inhook::store::EventRecord]) -> Vec<&str> {
    events.iter().map(|e| e.event_id.as_str()).collect()
}

/// Listings are newest first, page by row cursor, and every filter narrows
/// them; a record carries what was logged.
pub async fn listings_filter_and_page_newest_first(store: &dyn Store) {
    one_of_each_status(store).await;
    let all = EventFilter::default();
    let first = store.events(&all, 3, None).await.unwrap();
    assert_eq!(ids(&first.items), ["t1", "r1", "k1"]);
    assert_eq!(first.next_cursor, Some(first.items[2].row));
    let second = store.events(&all, 3, first.next_cursor).await.unwrap();
    assert_eq!(ids(&second.items), ["u1", "b1", "s2"]);
    let third = store.events(&all, 3, second.next_cursor).await.unwrap();
    assert_eq!(ids(&third.items), ["s1", "p2", "p1"]);
    assert_eq!(third.next_cursor, None);

    let cases = [
        (
            EventFilter {
                source: Some(PRESENCE.into()),
                ..all.clone()
            },
            vec!["p2", "p1"],
        ),
        (
            EventFilter {
                status: Some(EventStatus::Processed),
                ..all.clone()
            },
            vec!["b1", "s1", "p1"],
        ),
        (
            EventFilter {
                aggregate: Some(slot("slot_a")),
                ..all.clone()
            },
            vec!["s2", "s1"],
        ),
        (
            EventFilter {
                received_from_ms: Some(T0 + 2),
                received_to_ms: Some(T0 + 4),
                ..all.clone()
            },
            vec!["s2", "s1"],
        ),
        (
            EventFilter {
                source: Some(SAVES.into()),
                status: Some(EventStatus::Dead),
                ..all.clone()
            },
            vec!["k1"],
        ),
        (
            EventFilter {
                source: Some("nope".into()),
                ..all.clone()
            },
            vec![],
        ),
        (
            EventFilter {
                event_id: Some("s2".into()),
                ..all.clone()
            },
            vec!["s2"],
        ),
        (
            EventFilter {
                source: Some(PRESENCE.into()),
                event_id: Some("s2".into()),
                ..all.clone()
            },
            vec![],
        ),
        (
            EventFilter {
                event_type: Some(TypePattern::parse("quest.*").unwrap()),
                ..all.clone()
            },
            vec!["u1"],
        ),
        (
            EventFilter {
                event_type: Some(TypePattern::parse("presence.changed").unwrap()),
                ..all.clone()
            },
            vec!["p2", "p1"],
        ),
        (
            EventFilter {
                event_type: Some(TypePattern::parse("*").unwrap()),
                source: Some(PRESENCE.into()),
                ..all.clone()
            },
            vec!["p2", "p1"],
        ),
    ];
    for (filter, expected) in cases {
        assert_eq!(
            ids(&all_events(store, &filter).await),
            expected,
            "{filter:?}"
        );
    }

    let record = store.event(SAVES, "s1").await.unwrap().unwrap();
    assert_eq!(
        (
            record.source.as_str(),
            record.event_type.as_str(),
            record.aggregate.clone(),
            record.sequence,
            record.idempotency_key.as_deref(),
            record.signature_valid,
            record.signed_at,
            record.received_at_ms,
            record.status,
            record.decided_at_ms,
            record.attempts,
        ),
        (
            SAVES,
            "inventory.updated",
            slot("slot_a"),
            1,
            Some("slot_a:1"),
            true,
            None,
            T0 + 2,
            EventStatus::Processed,
            Some(T0 + 10),
            1,
        )
    );
    assert_eq!(
        record.body,
        serde_json::to_vec(&delta("s1", "slot_a", 1, 1)).unwrap()
    );
    let headers: serde_json::Value =
        serde_json::from_str(record.headers.as_deref().expect("headers")).unwrap();
    assert_eq!(headers, json!({"user-agent": "conformance"}));
    let listed = all_events(
        store,
        &EventFilter {
            aggregate: Some(slot("slot_a")),
            ..all
        },
    )
    .await
    .pop()
    .unwrap();
    assert_eq!(
        listed, record,
        "a listing carries the same record, history aside"
    );
    assert_eq!(store.event(PRESENCE, "s1").await.unwrap(), None);
}

/// The overview counts every event per source and status; the undecided
/// counts only received, held and retrying events.
pub async fn overview_counts_every_status_per_source(store: &dyn Store) {
    assert!(store.status_counts().await.unwrap().is_empty());
    one_of_each_status(store).await;
    let sorted = |mut counts: Vec<(String, EventStatus, u64)>| {
        counts.sort_by_key(|(source, status, _)| (source.clone(), status.as_str()));
        counts
    };
    let count = |source: &str, status, n| (source.to_owned(), status, n);
    assert_eq!(
        sorted(store.status_counts().await.unwrap()),
        [
            count(PRESENCE, EventStatus::IgnoredStale, 1),
            count(PRESENCE, EventStatus::Processed, 1),
            count(SAVES, EventStatus::Dead, 1),
            count(SAVES, EventStatus::Held, 1),
            count(SAVES, EventStatus::IgnoredUnsupported, 1),
            count(SAVES, EventStatus::Processed, 2),
            count(SAVES, EventStatus::Received, 1),
            count(SAVES, EventStatus::Retrying, 1),
        ]
    );
    assert_eq!(
        sorted(store.undecided_counts().await.unwrap()),
        [
            count(SAVES, EventStatus::Held, 1),
            count(SAVES, EventStatus::Received, 1),
            count(SAVES, EventStatus::Retrying, 1),
        ]
    );
    // Deciding moves the counts along.
    store
        .settle(&save_rules(), &slot("slot_e"), T0 + 20)
        .await
        .unwrap();
    let undecided = sorted(store.undecided_counts().await.unwrap());
    assert_eq!(
        undecided,
        [
            count(SAVES, EventStatus::Held, 1),
            count(SAVES, EventStatus::Retrying, 1)
        ]
    );
    assert!(
        sorted(store.status_counts().await.unwrap()).contains(&count(
            SAVES,
            EventStatus::Processed,
            3
        ))
    );
}

/// Purge deletes decided events received before the cutoff, in batches,
/// never undecided ones; their dedup keys still catch resends until they
/// expire, and expired keys are deleted.
pub async fn purge_deletes_decided_events_and_keeps_their_dedup_keys(store: &dyn Store) {
    let rules = save_rules();
    let first = delta("e1", "slot_a", 1, 1);
    logged(&ingest_save(store, &first, T0).await);
    logged(&ingest_save(store, &delta("e2", "slot_b", 3, 1), T0).await);
    logged(&ingest_save(store, &delta("e4", "slot_d", 1, 1), T0 + 1).await);
    logged(&ingest_save(store, &delta("e3", "slot_c", 1, 1), T0 + 50_000).await);
    for slot_name in ["slot_a", "slot_b", "slot_d"] {
        store
            .settle(&rules, &slot(slot_name), T0 + 5_000)
            .await
            .unwrap();
    }
    store
        .settle(&rules, &slot("slot_c"), T0 + 60_000)
        .await
        .unwrap();
    let (before, keep_until) = (T0 + 10_000, T0 + 100_000);
    let report = store
        .purge(before, keep_until, T0 + 70_000, 1)
        .await
        .unwrap();
    assert_eq!(
        report,
        PurgeReport {
            events: 1,
            dedup_keys: 0
        }
    );
    let report = store
        .purge(before, keep_until, T0 + 70_000, 100)
        .await
        .unwrap();
    assert_eq!(
        report,
        PurgeReport {
            events: 1,
            dedup_keys: 0
        }
    );
    let left = all_events(store, &EventFilter::default()).await;
    assert_eq!(ids(&left), ["e3", "e2"], "held and recent events stay");
    assert_eq!(store.event(SAVES, "e1").await.unwrap(), None);

    assert_eq!(
        ingest_save(store, &first, T0 + 80_000).await,
        Admission::Duplicate {
            key: DedupKey::EventId,
            original: id("e1"),
            body_differs: false
        }
    );
    let same_key = delta("e1_again", "slot_a", 1, 1); // idempotency key "slot_a:1"
    assert_eq!(
        ingest_save(store, &same_key, T0 + 80_000).await,
        Admission::Duplicate {
            key: DedupKey::IdempotencyKey,
            original: id("e1"),
            body_differs: false
        }
    );
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 2);

    let report = store
        .purge(before, keep_until, keep_until, 100)
        .await
        .unwrap();
    assert_eq!(
        report,
        PurgeReport {
            events: 0,
            dedup_keys: 4
        }
    );
    logged(&ingest_save(store, &first, keep_until + 1).await);
    // Changes applied before the cutoff go with the events.
    let changes = store.changes_after(0, None, None, 100).await.unwrap();
    let kept: Vec<_> = changes
        .iter()
        .map(|c| (c.aggregate.clone(), c.at_ms))
        .collect();
    assert_eq!(kept, [(slot("slot_c"), T0 + 60_000)]);
}

/// A dedup key kept past its expiry (not yet deleted) is taken over by a newer
/// event logged under it once it expired: purging that event keeps the key again,
/// naming the newer event, until the new expiry.
pub async fn a_purged_key_kept_again_names_the_newer_event(store: &dyn Store) {
    let rules = save_rules();
    let (first_expiry, second_expiry) = (T0 + 20_000, T0 + 100_000);
    logged(&ingest_save(store, &delta("k1", "slot_a", 1, 1), T0).await);
    store.settle(&rules, &slot("slot_a"), T0 + 1).await.unwrap();
    let report = store
        .purge(T0 + 10_000, first_expiry, T0 + 10_000, 100)
        .await
        .unwrap();
    assert_eq!(report.events, 1);
    // Past the expiry the key no longer catches a resend: the same idempotency key is logged.
    let added = json!({"added_items": [{"item_id": "sword", "qty": 1}]});
    let newer = save_keyed("k2", "slot_b", "inventory.updated", 1, "slot_a:1", added);
    logged(&ingest_save(store, &newer, first_expiry + 1).await);
    store
        .settle(&rules, &slot("slot_b"), first_expiry + 2)
        .await
        .unwrap();
    let report = store
        .purge(T0 + 40_000, second_expiry, T0 + 40_000, 100)
        .await
        .unwrap();
    assert_eq!(
        report,
        PurgeReport {
            events: 1,
            // k1's event_id key; its idempotency key was taken over by k2.
            dedup_keys: 1
        }
    );
    assert_eq!(
        ingest_save(store, &delta("k3", "slot_a", 1, 1), T0 + 50_000).await,
        Admission::Duplicate {
            key: DedupKey::IdempotencyKey,
            original: id("k2"),
            body_differs: false
        }
    );
}

fn id(raw: &str) -> inhook::domain::EventId {
    inhook::domain::EventId::parse(raw).unwrap()
}

/// Pages and bulk replays order ids byte by byte (`Z` before `a`, `-` before
/// `_`), as SQLite compares text: the order must not depend on the database's
/// collation.
pub async fn text_orders_are_byte_orders(store: &dyn Store) {
    let users = ["b_1", "a_1", "Z_1", "a-1", "A1"];
    let mut bytewise = users.map(str::to_owned).to_vec();
    bytewise.sort();
    let presence_rules = presence_rules();
    for (i, user) in users.iter().enumerate() {
        let body = presence(&format!("p{i}"), user, "ONLINE", 1);
        super::ingest_sync(store, &presence_rules, body, T0).await;
    }
    let page = store
        .aggregates_page(PRESENCE, None, 10, None)
        .await
        .unwrap();
    let presence_listed: Vec<_> = page.items.into_iter().map(|a| a.aggregate).collect();
    let presence_bytewise = bytewise;

    let slots = ["s_b", "s_a", "S_z", "s-a", "S1"];
    for (i, slot_name) in slots.iter().enumerate() {
        logged(&ingest_save(store, &delta(&format!("s{i}"), slot_name, 1, 1), T0).await);
        store
            .settle(&save_rules(), &slot(slot_name), T0)
            .await
            .unwrap();
    }
    let mut bytewise: Vec<_> = slots.iter().map(|s| slot(s)).collect();
    bytewise.sort();
    let page = store.aggregates_page(SAVES, None, 10, None).await.unwrap();
    let listed: Vec<_> = page.items.into_iter().map(|a| a.aggregate).collect();

    // A bulk replay requeues one aggregate per step, from its stored cursor.
    let dead_slots = ["d_b", "d_a", "D_z", "d-a", "D1"];
    for (i, slot_name) in dead_slots.iter().enumerate() {
        logged(&ingest_save(store, &delta(&format!("d{i}"), slot_name, 1, 1), T0).await);
        store
            .record_failure(
                &save_rules(),
                &slot(slot_name),
                "down",
                T0,
                ONE_ATTEMPT,
                0.0,
            )
            .await
            .unwrap();
    }
    let filter = EventFilter {
        source: Some(SAVES.into()),
        status: Some(EventStatus::Dead),
        ..EventFilter::default()
    };
    let job = store.create_replay_job(&filter, T0 + 1).await.unwrap();
    let requeued_filter = EventFilter {
        status: Some(EventStatus::Received),
        ..filter
    };
    let mut replayed: Vec<String> = Vec::new();
    for step in 1..=dead_slots.len() {
        assert_eq!(store.advance_replay_jobs(T0 + 2, 1).await.unwrap(), 1);
        let requeued = all_events(store, &requeued_filter).await;
        assert_eq!(requeued.len(), step, "one aggregate per step");
        let new = requeued
            .into_iter()
            .find(|e| !replayed.contains(&e.aggregate))
            .expect("a newly requeued aggregate");
        replayed.push(new.aggregate);
    }
    assert_eq!(store.replay_job(job.id).await.unwrap().unwrap().requeued, 5);
    let mut replay_bytewise: Vec<_> = dead_slots.iter().map(|s| slot(s)).collect();
    replay_bytewise.sort();
    assert_eq!(
        (presence_listed, listed, replayed),
        (presence_bytewise, bytewise, replay_bytewise),
        "(presence pages, save pages, bulk replay)"
    );
}

/// Row and change ids only grow: after a purge removes every event and
/// change, new ones get ids above the purged ones (listing and stream
/// cursors stay valid), while `last_change_id` reads 0 until the next change.
pub async fn ids_are_never_reused_after_a_purge(store: &dyn Store) {
    let rules = save_rules();
    let row = logged(&ingest_save(store, &delta("e1", "slot_a", 1, 1), T0).await);
    store.settle(&rules, &slot("slot_a"), T0).await.unwrap();
    let change = store.last_change_id().await.unwrap();
    assert!(change > 0);
    let report = store.purge(T0 + 1, T0, T0 + 1, 100).await.unwrap();
    assert_eq!(
        report,
        PurgeReport {
            events: 1,
            dedup_keys: 0
        }
    );
    assert!(all_events(store, &EventFilter::default()).await.is_empty());
    assert_eq!(store.last_change_id().await.unwrap(), 0);
    // Without kept dedup keys the same event is new again.
    let again = logged(&ingest_save(store, &delta("e1", "slot_a", 2, 1), T0 + 2).await);
    assert!(again > row, "row {again} reuses a purged id (<= {row})");
    store.settle(&rules, &slot("slot_a"), T0 + 3).await.unwrap();
    let next = store.changes_after(0, None, None, 10).await.unwrap();
    assert_eq!(next.len(), 1);
    assert!(
        next[0].id > change,
        "change {} reuses a purged id",
        next[0].id
    );
    assert_eq!(store.last_change_id().await.unwrap(), next[0].id);
}

/// The counts each store keeps beside the log (overview and undecided
/// counts) match a tally of the log itself after every kind of transition.
pub async fn counts_match_the_log_after_every_transition(store: &dyn Store) {
    async fn assert_counts_match(store: &dyn Store, step: &str) {
        let mut tally = std::collections::BTreeMap::<(String, &str), u64>::new();
        for event in all_events(store, &EventFilter::default()).await {
            *tally
                .entry((event.source, event.status.as_str()))
                .or_default() += 1;
        }
        let mut counts: Vec<_> = store
            .status_counts()
            .await
            .unwrap()
            .into_iter()
            .map(|(source, status, n)| ((source, status.as_str()), n))
            .collect();
        counts.sort();
        let expected: Vec<_> = tally.clone().into_iter().collect();
        assert_eq!(counts, expected, "status_counts after {step}");
        let mut undecided: Vec<_> = store
            .undecided_counts()
            .await
            .unwrap()
            .into_iter()
            .map(|(source, status, n)| ((source, status.as_str()), n))
            .collect();
        undecided.sort();
        let expected: Vec<_> = tally
            .into_iter()
            .filter(|((_, status), _)| EventStatus::parse(status).unwrap().is_undecided())
            .collect();
        assert_eq!(undecided, expected, "undecided_counts after {step}");
    }
    let rules = save_rules();
    let limits = inhook::store::IngestLimits {
        max_backlog: 4,
        ..inhook::store::IngestLimits::NONE
    };
    assert_counts_match(store, "nothing").await;
    for (event_id, slot_name, seq) in [
        ("a1", "slot_a", 1),
        ("a3", "slot_a", 3),
        ("b1", "slot_b", 1),
        ("c1", "slot_c", 1),
    ] {
        let body = delta(event_id, slot_name, seq, 1);
        logged(&super::ingest(store, &rules, &body, T0, limits, false).await);
    }
    let refused = delta("d1", "slot_d", 1, 1);
    assert!(matches!(
        super::ingest(store, &rules, &refused, T0, limits, false).await,
        Admission::Refused(_)
    ));
    ingest_save(store, &delta("a1", "slot_a", 1, 1), T0).await;
    assert_counts_match(store, "ingest, a refusal and a duplicate").await;
    store.settle(&rules, &slot("slot_a"), T0 + 1).await.unwrap();
    assert_counts_match(store, "settle with a hold").await;
    store
        .record_failure(
            &rules,
            &slot("slot_b"),
            "x",
            T0 + 1,
            RetryPolicy::default(),
            0.0,
        )
        .await
        .unwrap();
    store
        .record_failure(&rules, &slot("slot_c"), "x", T0 + 1, ONE_ATTEMPT, 0.0)
        .await
        .unwrap();
    assert_counts_match(store, "a retry and a death").await;
    store.replay_event(SAVES, "c1", T0 + 2).await.unwrap();
    assert_counts_match(store, "a replay").await;
    store
        .record_failure(&rules, &slot("slot_c"), "x", T0 + 3, ONE_ATTEMPT, 0.0)
        .await
        .unwrap();
    store
        .create_replay_job(&EventFilter::default(), T0 + 4)
        .await
        .unwrap();
    store.advance_replay_jobs(T0 + 4, 10).await.unwrap();
    assert_counts_match(store, "a bulk replay").await;
    for slot_name in ["slot_a", "slot_b", "slot_c"] {
        store
            .settle(&rules, &slot(slot_name), T0 + 100_000)
            .await
            .unwrap();
    }
    assert_counts_match(store, "settling everything").await;
    store.purge(T0 + 1, T0, T0 + 100_000, 2).await.unwrap();
    assert_counts_match(store, "a partial purge").await;
    store.purge(T0 + 1, T0, T0 + 100_000, 100).await.unwrap();
    assert_counts_match(store, "a full purge").await;
    assert!(store.status_counts().await.unwrap().is_empty());
}
