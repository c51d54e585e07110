//! Admission: dedup keys, the out-of-order flag and the hard ingest limits.

use inhook::domain::{EventId, EventStatus};
use inhook::store::{Admission, BodyKey, DedupKey, EventFilter, IngestLimits, Refusal, Store};
use serde_json::json;

use super::{
    all_events, delta, ingest, ingest_save, logged, save_keyed, save_rules, slot, SAVES, T0,
};

fn id(raw: &str) -> EventId {
    EventId::parse(raw).expect("event id")
}

/// A resent `event_id` is a duplicate; with another body it is flagged and
/// the original keeps a `conflicting_duplicate` line in its history.
pub async fn a_resent_event_id_is_a_duplicate_and_a_changed_body_is_flagged(store: &dyn Store) {
    let first = delta("evt_1", "slot_a", 1, 2);
    let admission = ingest_save(store, &first, T0).await;
    assert_eq!(
        admission,
        Admission::Logged {
            row: logged(&admission),
            decided: None,
            out_of_order: false
        }
    );
    assert_eq!(
        ingest_save(store, &first, T0 + 1).await,
        Admission::Duplicate {
            key: DedupKey::EventId,
            original: id("evt_1"),
            body_differs: false
        }
    );
    let before = store.event(SAVES, "evt_1").await.unwrap().unwrap();
    assert!(before.history.is_empty(), "{:?}", before.history);

    let changed = delta("evt_1", "slot_a", 1, 5);
    assert_eq!(
        ingest_save(store, &changed, T0 + 2).await,
        Admission::Duplicate {
            key: DedupKey::EventId,
            original: id("evt_1"),
            body_differs: true
        }
    );
    let original = store.event(SAVES, "evt_1").await.unwrap().unwrap();
    assert_eq!(original.body, serde_json::to_vec(&first).unwrap());
    assert_eq!(original.status, EventStatus::Received);
    let kinds: Vec<&str> = original.history.iter().map(|h| h.kind.as_str()).collect();
    assert_eq!(kinds, ["conflicting_duplicate"]);
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 1);
}

/// Another `event_id` with a known `idempotency_key` is a duplicate of the
/// first event, whatever its body; nothing new is logged.
pub async fn a_known_idempotency_key_is_a_duplicate_of_the_first_event(store: &dyn Store) {
    let key = "player_1024:slot_a:grant";
    let grant = |event_id: &str, qty: i64| {
        save_keyed(
            event_id,
            "slot_a",
            "inventory.updated",
            1,
            key,
            json!({"added_items": [{"item_id": "stamp", "qty": qty}]}),
        )
    };
    logged(&ingest_save(store, &grant("evt_a1", 2), T0).await);
    for (event_id, qty) in [("evt_a1_retry", 2), ("evt_a1_other", 7)] {
        assert_eq!(
            ingest_save(store, &grant(event_id, qty), T0 + 1).await,
            Admission::Duplicate {
                key: DedupKey::IdempotencyKey,
                original: id("evt_a1"),
                body_differs: false
            }
        );
        assert!(store.event(SAVES, event_id).await.unwrap().is_none());
    }
    // The same key in another source is another operation.
    let mut other = save_rules();
    other.name = "saves_eu".into();
    let admission = ingest(
        store,
        &other,
        &grant("evt_a1", 2),
        T0,
        IngestLimits::NONE,
        false,
    )
    .await;
    logged(&admission);
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 2);
}

/// Logging says whether a higher sequence of the aggregate came first; a
/// duplicate does not count as received.
pub async fn the_out_of_order_flag_compares_with_the_highest_sequence_received(store: &dyn Store) {
    let flag = |admission: Admission| match admission {
        Admission::Logged { out_of_order, .. } => out_of_order,
        other => panic!("expected logged, got {other:?}"),
    };
    assert!(!flag(
        ingest_save(store, &delta("e3", "slot_a", 3, 1), T0).await
    ));
    assert!(flag(
        ingest_save(store, &delta("e1", "slot_a", 1, 1), T0 + 1).await
    ));
    // Another aggregate has its own highest sequence.
    assert!(!flag(
        ingest_save(store, &delta("b1", "slot_b", 1, 1), T0 + 2).await
    ));
    assert!(matches!(
        ingest_save(store, &delta("e9", "slot_a", 9, 1), T0 + 3).await,
        Admission::Logged {
            out_of_order: false,
            ..
        }
    ));
    assert!(flag(
        ingest_save(store, &delta("e4", "slot_a", 4, 1), T0 + 4).await
    ));
    assert!(matches!(
        ingest_save(store, &delta("e4", "slot_a", 4, 1), T0 + 5).await,
        Admission::Duplicate { .. }
    ));
    assert!(!flag(
        ingest_save(store, &delta("e10", "slot_a", 10, 1), T0 + 6).await
    ));
}

/// `max_backlog` bounds the source's undecided events: the delivery that
/// would exceed it is refused and leaves nothing; deciding frees room.
pub async fn max_backlog_refuses_and_stores_nothing(store: &dyn Store) {
    let limits = IngestLimits {
        max_backlog: 2,
        ..IngestLimits::NONE
    };
    let rules = save_rules();
    for (i, slot_name) in ["slot_a", "slot_b"].iter().enumerate() {
        let body = delta(&format!("e{i}"), slot_name, 1, 1);
        logged(&ingest(store, &rules, &body, T0, limits, false).await);
    }
    let third = delta("e2", "slot_c", 1, 1);
    assert_eq!(
        ingest(store, &rules, &third, T0, limits, false).await,
        Admission::Refused(Refusal::BacklogFull)
    );
    assert!(store.event(SAVES, "e2").await.unwrap().is_none());
    // A refused event leaves no dedup key: once there is room it is logged.
    store.settle(&rules, &slot("slot_a"), T0 + 1).await.unwrap();
    logged(&ingest(store, &rules, &third, T0 + 2, limits, false).await);
    // Another source has its own backlog.
    let mut other = save_rules();
    other.name = "saves_eu".into();
    logged(
        &ingest(
            store,
            &other,
            &delta("x", "slot_a", 1, 1),
            T0,
            limits,
            false,
        )
        .await,
    );
}

/// `max_held_per_aggregate` bounds the in-order events waiting ahead of a
/// gap in one aggregate; events that are not ahead of the gap are admitted.
pub async fn max_held_per_aggregate_refuses_only_events_ahead_of_the_gap(store: &dyn Store) {
    let limits = IngestLimits {
        max_held_per_aggregate: 1,
        ..IngestLimits::NONE
    };
    let rules = save_rules();
    logged(
        &ingest(
            store,
            &rules,
            &delta("a3", "slot_a", 3, 1),
            T0,
            limits,
            false,
        )
        .await,
    );
    assert_eq!(
        ingest(
            store,
            &rules,
            &delta("a4", "slot_a", 4, 1),
            T0,
            limits,
            false
        )
        .await,
        Admission::Refused(Refusal::AggregateBacklogFull)
    );
    assert!(store.event(SAVES, "a4").await.unwrap().is_none());
    // The next expected sequence never waits, and another aggregate has its own room.
    logged(
        &ingest(
            store,
            &rules,
            &delta("a1", "slot_a", 1, 1),
            T0,
            limits,
            false,
        )
        .await,
    );
    logged(
        &ingest(
            store,
            &rules,
            &delta("b5", "slot_b", 5, 1),
            T0,
            limits,
            false,
        )
        .await,
    );
    // A latest-wins event cannot be held, so the limit does not apply to it.
    let progress = super::save("p6", "slot_a", "progress.saved", 6, json!({"level": 3}));
    logged(&ingest(store, &rules, &progress, T0, limits, false).await);
    let held = all_events(store, &EventFilter::default()).await;
    assert_eq!(held.len(), 4);
}

/// A body without `event_id` is logged under its delivery's id (a header's,
/// for schemes that send one), deduplicated and settled under that id.
pub async fn a_body_without_event_id_is_kept_under_its_delivery_id(store: &dyn Store) {
    let rules = save_rules();
    let mut body = delta("unused", "slot_a", 1, 3);
    body.as_object_mut().unwrap().remove("event_id");
    let raw = serde_json::to_vec(&body).unwrap();
    let event = super::fields(&rules, &raw, Some("msg_1"));
    let post = |at_ms| super::ingest_raw(store, SAVES, (&event, &raw), at_ms, BodyKey::None);
    logged(&post(T0).await.unwrap());
    assert_eq!(
        post(T0 + 1).await.unwrap(),
        Admission::Duplicate {
            key: DedupKey::EventId,
            original: id("msg_1"),
            body_differs: false
        }
    );
    let report = store.settle(&rules, &slot("slot_a"), T0 + 2).await.unwrap();
    assert_eq!(report.applied, 1);
    assert_eq!(report.decided[0].event_id, "msg_1");
    let record = store.event(SAVES, "msg_1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.body, record.headers),
        (EventStatus::Processed, raw.clone(), None)
    );
}

/// For a source whose scheme signs neither a delivery id nor a timestamp, a raw body equal
/// to a logged one is a duplicate (`key = body`) whatever its delivery id, also once the
/// original is purged (its body key is kept for the dedup window); other sources log it.
pub async fn a_resent_body_under_a_new_delivery_id_is_a_duplicate_by_body(store: &dyn Store) {
    let rules = super::presence_rules();
    let raw = br#"{"user_id":"usr_body","presence":"BUSY","sequence_number":7}"#.to_vec();
    let post = |delivery_id: &'static str, at_ms: i64, dedup_by_body: bool| {
        let event = super::fields(&rules, &raw, Some(delivery_id));
        let raw = raw.clone();
        async move {
            let key = if dedup_by_body {
                BodyKey::RawBody
            } else {
                BodyKey::None
            };
            super::ingest_raw(store, super::PRESENCE, (&event, &raw), at_ms, key)
                .await
                .unwrap()
        }
    };
    logged(&post("d1", T0, true).await);
    let by_body = Admission::Duplicate {
        key: DedupKey::Body,
        original: id("d1"),
        body_differs: false,
    };
    assert_eq!(post("d2", T0 + 1, true).await, by_body);
    // The same delivery id again is a duplicate by id first.
    assert_eq!(
        post("d1", T0 + 2, true).await,
        Admission::Duplicate {
            key: DedupKey::EventId,
            original: id("d1"),
            body_differs: false
        }
    );
    // A source whose scheme signs a time or an id logs a body twice under two ids.
    logged(&post("d3", T0 + 3, false).await);
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 2);
    // Decided and purged, the body stays known until the dedup window ends.
    store.settle(&rules, "usr_body", T0 + 4).await.unwrap();
    store
        .purge(T0 + 10, T0 + 60_000, T0 + 10, 100)
        .await
        .unwrap();
    assert!(all_events(store, &EventFilter::default()).await.is_empty());
    assert_eq!(post("d4", T0 + 20, true).await, by_body);
    assert!(all_events(store, &EventFilter::default()).await.is_empty());
}

/// For a source that dedups by what its signature covers (Mailgun's timestamp and token,
/// Twilio's sorted fields), a delivery whose signed content is a logged one's is a
/// duplicate (`key = body`) whatever its raw body and delivery id, also once the original
/// is purged; a raw body's key never matches a signed content's, and the elements of one
/// signed batch have keys of their own.
pub async fn a_delivery_carrying_a_logged_signed_content_is_a_duplicate_whatever_its_body(
    store: &dyn Store,
) {
    let rules = super::presence_rules();
    let body = |presence: &str| {
        format!(r#"{{"user_id":"usr_signed","presence":"{presence}","sequence_number":7}}"#)
            .into_bytes()
    };
    let post = |delivery_id: &'static str, raw: Vec<u8>, at_ms: i64, key: BodyKey| {
        let event = super::fields(&rules, &raw, Some(delivery_id));
        async move {
            super::ingest_raw(store, super::PRESENCE, (&event, &raw), at_ms, key)
                .await
                .unwrap()
        }
    };
    let signed = BodyKey::SignedContent([7; 32]);
    logged(&post("s1", body("BUSY"), T0, signed).await);
    let by_signature = Admission::Duplicate {
        key: DedupKey::Body,
        original: id("s1"),
        body_differs: false,
    };
    // Other bytes under another delivery id, the same signature: the same delivery.
    assert_eq!(post("s2", body("AWAY"), T0 + 1, signed).await, by_signature);
    // The raw body of s1 keyed as a raw body, and another signed content: new events.
    logged(&post("s3", body("BUSY"), T0 + 2, BodyKey::RawBody).await);
    logged(&post("s4", body("AWAY"), T0 + 3, BodyKey::SignedContent([8; 32])).await);
    // One signed batch: each element is told apart by its place.
    assert_ne!(signed.for_element(0), signed.for_element(1));
    assert_ne!(signed.for_element(0), signed);
    assert_eq!(BodyKey::RawBody.for_element(3), BodyKey::RawBody);
    logged(&post("s5", body("ONLINE"), T0 + 4, signed.for_element(0)).await);
    logged(&post("s6", body("ONLINE"), T0 + 5, signed.for_element(1)).await);
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), 5);
    // Decided and purged, the signed content stays known until the dedup window ends.
    store.settle(&rules, "usr_signed", T0 + 6).await.unwrap();
    store
        .purge(T0 + 10, T0 + 60_000, T0 + 10, 100)
        .await
        .unwrap();
    let left = all_events(store, &EventFilter::default()).await.len();
    assert_eq!(
        post("s7", body("OFFLINE"), T0 + 20, signed).await,
        by_signature
    );
    assert_eq!(all_events(store, &EventFilter::default()).await.len(), left);
}
