//! Deciding events: sync settling at ingest, the worker's due aggregates,
//! holds and gap skips, and the change feed the decisions write.

use std::collections::BTreeMap;

use inhook::domain::kind::presence::Presence;
use inhook::domain::ordering::Outcome;
use inhook::domain::{AggregateKey, DeadReason, EventStatus, Ident};
use inhook::store::{Admission, IngestLimits, Store};
use serde_json::json;

use super::{
    delta, ingest_save, logged, presence, presence_rules, save, save_rules, slot, PRESENCE, SAVES,
    T0,
};

fn decided(admission: Admission) -> (Outcome, Option<i64>, bool, inhook::store::SettleReport) {
    match admission {
        Admission::Logged {
            decided: Some(d),
            out_of_order,
            ..
        } => (d.outcome, d.current_sequence, out_of_order, d.report),
        other => panic!("expected a sync decision, got {other:?}"),
    }
}

fn sword(qty: i64) -> BTreeMap<String, i64> {
    BTreeMap::from([("sword".to_owned(), qty)])
}

async fn save_state(store: &dyn Store, slot_name: &str) -> inhook::domain::kind::save::SaveState {
    let key = AggregateKey::of_parts(vec![
        Ident::parse("player_1024").unwrap(),
        Ident::parse(slot_name).unwrap(),
    ]);
    super::save_of(store, SAVES, &key)
        .await
        .unwrap()
        .expect("save slot")
}

/// In sync mode ingest answers the outcome: applied, stale (latest-wins),
/// held ahead of a gap, dead; a decision frees what was held behind it.
pub async fn sync_ingest_answers_applied_stale_held_and_dead(store: &dyn Store) {
    let rules = presence_rules();
    let post = |body: serde_json::Value, at| super::ingest_sync(store, &rules, body, at);
    let (outcome, current, ooo, _) =
        decided(post(presence("p1", "usr_A", "ONLINE", 101), T0).await);
    assert_eq!(
        (outcome, current, ooo),
        (Outcome::Applied, Some(101), false)
    );
    let (outcome, current, _, _) =
        decided(post(presence("p3", "usr_A", "OFFLINE", 103), T0 + 1).await);
    assert_eq!((outcome, current), (Outcome::Applied, Some(103)));
    let (outcome, current, ooo, report) =
        decided(post(presence("p2", "usr_A", "BUSY", 102), T0 + 2).await);
    assert_eq!((outcome, current, ooo), (Outcome::Stale, Some(103), true));
    assert_eq!((report.stale, report.applied), (1, 0));
    let state = super::presence_of(store, PRESENCE, "usr_A")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (state.presence, state.sequence.get(), state.updated_at_ms),
        (Presence::Offline, 103, T0 + 1)
    );
    assert_eq!(
        super::presence_of(store, PRESENCE, "usr_B").await.unwrap(),
        None
    );

    let rules = save_rules();
    let post = |body: serde_json::Value, at| super::ingest_sync(store, &rules, body, at);
    let (outcome, current, _, _) = decided(post(delta("s1", "slot_a", 1, 2), T0).await);
    assert_eq!((outcome, current), (Outcome::Applied, Some(1)));
    let (outcome, current, _, report) = decided(post(delta("s3", "slot_a", 3, 1), T0 + 1).await);
    assert_eq!((outcome, current), (Outcome::Held, Some(1)));
    assert_eq!((report.held, report.newly_held), (1, 1));
    // Removing more than the slot has is dead, and takes its sequence: the held event follows.
    let (outcome, current, _, report) = decided(post(delta("s2", "slot_a", 2, -5), T0 + 2).await);
    assert!(
        matches!(
            outcome,
            Outcome::Dead {
                reason: DeadReason::InsufficientQuantity,
                ..
            }
        ),
        "{outcome:?}"
    );
    assert_eq!(current, Some(3));
    assert_eq!((report.applied, report.held, report.dead.len()), (1, 0, 1));
    let state = save_state(store, "slot_a").await;
    assert_eq!((state.last_sequence, state.inventory), (3, sword(3)));
    let dead = store.event(SAVES, "s2").await.unwrap().unwrap();
    assert_eq!(
        (dead.status, dead.dead_reason, dead.decided_at_ms),
        (
            EventStatus::Dead,
            Some(DeadReason::InsufficientQuantity),
            Some(T0 + 2)
        )
    );
    let held_then_applied = store.event(SAVES, "s3").await.unwrap().unwrap();
    assert_eq!(
        (
            held_then_applied.status,
            held_then_applied.next_attempt_at_ms
        ),
        (EventStatus::Processed, None)
    );
}

/// Async events wait for the worker: received aggregates are due at once,
/// settling decides them in sequence order and leaves nothing due.
pub async fn async_events_are_due_until_settled(store: &dyn Store) {
    assert!(store.due_aggregates(T0, 10).await.unwrap().is_empty());
    for (event_id, slot_name, seq, qty) in [
        ("a2", "slot_a", 2, -1),
        ("a1", "slot_a", 1, 3),
        ("b1", "slot_b", 1, 4),
    ] {
        logged(&ingest_save(store, &delta(event_id, slot_name, seq, qty), T0).await);
    }
    let mut due = store.due_aggregates(T0, 10).await.unwrap();
    due.sort();
    assert_eq!(
        due,
        [
            (SAVES.to_owned(), slot("slot_a")),
            (SAVES.to_owned(), slot("slot_b"))
        ]
    );
    assert_eq!(store.due_aggregates(T0, 1).await.unwrap().len(), 1);
    let key = AggregateKey::of_parts(vec![
        Ident::parse("player_1024").unwrap(),
        Ident::parse("slot_a").unwrap(),
    ]);
    assert_eq!(super::save_of(store, SAVES, &key).await.unwrap(), None);

    let report = store
        .settle(&save_rules(), &slot("slot_a"), T0 + 50)
        .await
        .unwrap();
    assert_eq!((report.applied, report.held, report.stale), (2, 0, 0));
    assert_eq!(report.lags_ms, [50, 50]);
    let order: Vec<_> = report.decided.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(order, ["a1", "a2"]);
    let state = save_state(store, "slot_a").await;
    assert_eq!(
        (state.last_sequence, state.inventory, state.updated_at_ms),
        (2, sword(2), T0 + 50)
    );
    assert_eq!(
        store.due_aggregates(T0 + 50, 10).await.unwrap(),
        [(SAVES.to_owned(), slot("slot_b"))]
    );

    let reports = store
        .settle_many(&[(save_rules(), slot("slot_b"))], T0 + 60)
        .await
        .unwrap();
    assert_eq!(reports.len(), 1);
    assert_eq!(reports[0].applied, 1);
    assert!(store.due_aggregates(T0 + 60, 10).await.unwrap().is_empty());
    // Settling again decides nothing more.
    let again = store
        .settle(&save_rules(), &slot("slot_a"), T0 + 70)
        .await
        .unwrap();
    assert_eq!(again, inhook::store::SettleReport::default());
    let mut saves = store.aggregates_page(SAVES, None, 1, None).await.unwrap();
    assert_eq!(saves.items.len(), 1);
    let next = saves.next_cursor.clone().expect("a second page");
    let second = store
        .aggregates_page(SAVES, None, 1, Some(&next))
        .await
        .unwrap();
    saves.items.extend(second.items);
    let keys: Vec<_> = saves.items.iter().map(|a| a.aggregate.clone()).collect();
    assert_eq!(keys, [slot("slot_a"), slot("slot_b")]);
    assert_eq!(second.next_cursor, None);
}

/// A held event is due again when its hold window ends (received + hold
/// timeout); settling then skips the gap, and the late event is dead.
pub async fn a_gap_is_skipped_after_the_hold_timeout(store: &dyn Store) {
    let rules = save_rules();
    logged(&ingest_save(store, &delta("g1", "slot_a", 1, 1), T0).await);
    logged(&ingest_save(store, &delta("g3", "slot_a", 3, 1), T0 + 1_000).await);
    let report = store
        .settle(&rules, &slot("slot_a"), T0 + 2_000)
        .await
        .unwrap();
    assert_eq!((report.applied, report.held, report.newly_held), (1, 1, 1));
    let held = store.event(SAVES, "g3").await.unwrap().unwrap();
    assert_eq!(
        (held.status, held.next_attempt_at_ms),
        (EventStatus::Held, Some(T0 + 1_000 + rules.hold_timeout_ms))
    );
    let window_end = T0 + 1_000 + rules.hold_timeout_ms;
    assert!(store
        .due_aggregates(window_end - 1, 10)
        .await
        .unwrap()
        .is_empty());
    // Settling before the window ends leaves it held and reports it as not newly held.
    let early = store
        .settle(&rules, &slot("slot_a"), window_end - 1)
        .await
        .unwrap();
    assert_eq!(
        (early.held, early.newly_held, early.gaps_skipped),
        (1, 0, 0)
    );
    assert!(early.decided.is_empty(), "{:?}", early.decided);
    assert_eq!(
        store.due_aggregates(window_end, 10).await.unwrap(),
        [(SAVES.to_owned(), slot("slot_a"))]
    );
    let report = store
        .settle(&rules, &slot("slot_a"), window_end)
        .await
        .unwrap();
    assert_eq!(
        (report.applied, report.held, report.gaps_skipped),
        (1, 0, 1)
    );
    let state = save_state(store, "slot_a").await;
    assert_eq!((state.last_sequence, state.inventory), (3, sword(2)));

    logged(&ingest_save(store, &delta("g2", "slot_a", 2, 1), window_end + 1).await);
    let report = store
        .settle(&rules, &slot("slot_a"), window_end + 2)
        .await
        .unwrap();
    assert_eq!(report.dead, [DeadReason::LateAfterGapSkip]);
    let late = store.event(SAVES, "g2").await.unwrap().unwrap();
    assert_eq!(
        (late.status, late.dead_reason),
        (EventStatus::Dead, Some(DeadReason::LateAfterGapSkip))
    );
    assert_eq!(save_state(store, "slot_a").await.inventory, sword(2));
}

/// Every applied change is in the change feed, in the order applied, with
/// increasing ids; stale events write none; filters and limits narrow it.
pub async fn the_change_feed_lists_applied_changes_in_order(store: &dyn Store) {
    assert_eq!(store.last_change_id().await.unwrap(), 0);
    assert!(store
        .changes_after(0, None, None, 10)
        .await
        .unwrap()
        .is_empty());
    let rules = presence_rules();
    let post = |body: serde_json::Value, at| super::ingest_sync(store, &rules, body, at);
    post(presence("p1", "usr_A", "ONLINE", 1), T0).await;
    post(presence("q1", "usr_B", "BUSY", 1), T0 + 1).await;
    post(presence("p0", "usr_A", "AWAY", 0), T0 + 2).await; // stale: no change
    post(presence("p2", "usr_A", "OFFLINE", 2), T0 + 3).await;
    let progress = save("s1", "slot_a", "progress.saved", 1, json!({"level": 7}));
    logged(&ingest_save(store, &progress, T0 + 4).await);
    store
        .settle(&save_rules(), &slot("slot_a"), T0 + 5)
        .await
        .unwrap();

    let all = store.changes_after(0, None, None, 100).await.unwrap();
    let seen: Vec<_> = all
        .iter()
        .map(|c| {
            (
                c.source.as_str(),
                c.aggregate.clone(),
                c.kind.as_str(),
                c.at_ms,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (PRESENCE, "usr_A".to_owned(), "presence", T0),
            (PRESENCE, "usr_B".to_owned(), "presence", T0 + 1),
            (PRESENCE, "usr_A".to_owned(), "presence", T0 + 3),
            (SAVES, slot("slot_a"), "save", T0 + 5),
        ]
    );
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "{all:?}");
    let last: serde_json::Value = serde_json::from_str(&all[2].state).unwrap();
    assert_eq!(last["status"], "OFFLINE");
    let saved: serde_json::Value = serde_json::from_str(&all[3].state).unwrap();
    assert_eq!(saved["progress"], json!({"level": 7}));
    assert_eq!(store.last_change_id().await.unwrap(), all[3].id);

    let after_first = store.changes_after(all[0].id, None, None, 2).await.unwrap();
    assert_eq!(after_first, all[1..3]);
    let of_a = store
        .changes_after(0, Some(PRESENCE), Some("usr_A"), 10)
        .await
        .unwrap();
    assert_eq!(of_a, [all[0].clone(), all[2].clone()]);
    let of_saves = store.changes_after(0, Some(SAVES), None, 10).await.unwrap();
    assert_eq!(of_saves, all[3..]);
    assert!(store
        .changes_after(all[3].id, None, None, 10)
        .await
        .unwrap()
        .is_empty());
}

/// Two events with one sequence: the first by row applies, the other is dead
/// with `sequence_conflict`, also when it arrives after the first was settled.
pub async fn a_taken_sequence_is_a_conflict(store: &dyn Store) {
    let rules = save_rules();
    let with_key = |event_id: &str, key: &str, seq: i64, qty: i64| {
        super::save_keyed(
            event_id,
            "slot_a",
            "inventory.updated",
            seq,
            key,
            json!({"added_items": [{"item_id": "sword", "qty": qty}]}),
        )
    };
    logged(&ingest_save(store, &with_key("c2a", "k2a", 2, 1), T0).await);
    logged(&ingest_save(store, &with_key("c2b", "k2b", 2, 10), T0 + 1).await);
    logged(&ingest_save(store, &with_key("c1", "k1", 1, 1), T0 + 2).await);
    let report = store.settle(&rules, &slot("slot_a"), T0 + 3).await.unwrap();
    assert_eq!(
        (report.applied, report.dead.clone()),
        (2, vec![DeadReason::SequenceConflict])
    );
    logged(&ingest_save(store, &with_key("c2c", "k2c", 2, 100), T0 + 4).await);
    let report = store.settle(&rules, &slot("slot_a"), T0 + 5).await.unwrap();
    assert_eq!(report.dead, [DeadReason::SequenceConflict]);
    for (event_id, status) in [
        ("c1", EventStatus::Processed),
        ("c2a", EventStatus::Processed),
        ("c2b", EventStatus::Dead),
        ("c2c", EventStatus::Dead),
    ] {
        assert_eq!(
            store.event(SAVES, event_id).await.unwrap().unwrap().status,
            status,
            "{event_id}"
        );
    }
    let state = save_state(store, "slot_a").await;
    assert_eq!((state.last_sequence, state.inventory), (2, sword(2)));
}

/// Presence pages are ordered by user id, narrowed by status, and page by
/// the last user id.
pub async fn presence_pages_order_by_user_and_filter_by_status(store: &dyn Store) {
    let rules = presence_rules();
    for (i, (user, status)) in [
        ("usr_D", "ONLINE"),
        ("usr_B", "OFFLINE"),
        ("usr_A", "ONLINE"),
        ("usr_C", "ONLINE"),
    ]
    .into_iter()
    .enumerate()
    {
        let body = presence(&format!("e{i}"), user, status, 1);
        super::ingest_sync(store, &rules, body, T0 + i as i64).await;
    }
    let users = |page: &inhook::store::AggregatePage| -> Vec<String> {
        page.items.iter().map(|a| a.aggregate.clone()).collect()
    };
    let online_tag = Some(Presence::Online.as_str());
    let online = store
        .aggregates_page(PRESENCE, online_tag, 2, None)
        .await
        .unwrap();
    assert_eq!(users(&online), ["usr_A", "usr_C"]);
    assert_eq!(online.next_cursor.as_deref(), Some("usr_C"));
    let rest = store
        .aggregates_page(PRESENCE, online_tag, 2, online.next_cursor.as_deref())
        .await
        .unwrap();
    assert_eq!(
        (users(&rest), rest.next_cursor),
        (vec!["usr_D".to_owned()], None)
    );
    let all = store
        .aggregates_page(PRESENCE, None, 10, None)
        .await
        .unwrap();
    assert_eq!(users(&all), ["usr_A", "usr_B", "usr_C", "usr_D"]);
    let b = &inhook::domain::kind::presence::presence_state(&all.items[1]).unwrap();
    assert_eq!(
        (b.presence, b.sequence.get(), b.updated_at_ms),
        (Presence::Offline, 1, T0 + 1)
    );
    assert!(store
        .aggregates_page("other", None, 10, None)
        .await
        .unwrap()
        .items
        .is_empty());
}

/// A `json` in-order source settles through the same store flow: held, gap filled,
/// its state and watermark in the generic aggregate row, its header-located fields
/// taken from the logged columns (not the body) when settled later.
pub async fn a_json_source_settles_through_the_generic_aggregate_state(store: &dyn Store) {
    let spec: inhook::domain::kind::json::contract::JsonSourceSpec = toml::from_str(
        "event_id = \"header:X-Id\"\nidempotency_key = \"header:X-Key\"\naggregate = [\"/k/a\", \"/k/b\"]\n\
         sequence = \"/n\"\nordering = \"in-order\"\nstate = \"/v\"",
    )
    .unwrap();
    let rules = inhook::store::SourceRules {
        name: "j".into(),
        kind: std::sync::Arc::new(inhook::domain::kind::json::JsonKind::new(&spec).unwrap()),
        first_sequence: 1,
        hold_timeout_ms: 30_000,
        destinations: std::sync::Arc::from([]),
    };
    let log = |n: i64, at: i64| {
        let rules = rules.clone();
        async move {
            let raw = serde_json::to_vec(
                &json!({"k": {"a": "octo/repo", "b": 7}, "n": n, "v": {"n": n}}),
            )
            .unwrap();
            let mut headers = axum::http::HeaderMap::new();
            headers.insert("x-id", format!("id{n}").parse().unwrap());
            headers.insert("x-key", format!("key{n}").parse().unwrap());
            let fields = match rules.kind.parse(&raw, &headers, None).unwrap() {
                inhook::domain::kind::Delivery::Event(fields) => fields,
                other => panic!("{other:?}"),
            };
            assert!(fields.may_hold);
            let admission = store
                .ingest(
                    inhook::store::NewEvent {
                        source: "j",
                        event: &fields,
                        body: &raw,
                        headers: &[],
                        received_at_ms: at,
                        signed_at: None,
                        limits: IngestLimits::NONE,
                        ignored: false,
                        body_key: inhook::store::BodyKey::None,
                        search_fields: &[],
                    },
                    inhook::store::SettleAt::Worker,
                )
                .await
                .unwrap();
            assert!(
                matches!(admission, Admission::Logged { .. }),
                "{admission:?}"
            );
            fields.aggregate.storage_key()
        }
    };
    let key = log(2, T0).await;
    assert_eq!(key, "octo/repo\u{1f}7");
    let held = store.settle(&rules, &key, T0 + 1).await.unwrap();
    assert_eq!((held.held, held.newly_held), (1, 1));
    assert_eq!(store.aggregate("j", &key).await.unwrap(), None);
    log(1, T0 + 2).await;
    let report = store.settle(&rules, &key, T0 + 3).await.unwrap();
    assert_eq!(report.applied, 2);
    let ids: Vec<_> = report.decided.iter().map(|d| d.event_id.as_str()).collect();
    assert_eq!(ids, ["id1", "id2"]);
    assert_eq!(report.decided[1].idempotency_key.as_deref(), Some("key2"));
    let state = store.aggregate("j", &key).await.unwrap().expect("state");
    assert_eq!(
        (state.sequence, state.watermark, state.event_id.as_deref()),
        (Some(2), Some(2), Some("id2"))
    );
    assert_eq!(state.state, json!({"n": 2}));
    assert_eq!(state.updated_at_ms, T0 + 3);
    let page = store.aggregates_page("j", None, 10, None).await.unwrap();
    assert_eq!(page.items, [state]);
    let change = store.changes_after(0, Some("j"), None, 10).await.unwrap();
    assert_eq!(change.len(), 1);
    assert_eq!(change[0].kind, "json");
}
