//! The behaviour every [`Store`] must show, as plain async functions over
//! `&dyn Store` (object_store's `integration.rs` shape). Each function checks
//! one behaviour through the trait only, with its own times (no sleeps);
//! `store_conformance` runs every one on a fresh SQLite and a fresh
//! PostgreSQL store, so a new store is proven by passing them.

pub mod concurrency;
pub mod forwarding;
pub mod ingest;
pub mod log;
pub mod retries;
pub mod settle;

use inhook::domain::kind::presence::PresenceState;
use inhook::domain::kind::save::SaveState;
use inhook::domain::kind::SourceKind;
use inhook::domain::kind::{Delivery, EventFields};
use inhook::domain::{AggregateKey, Ident};
use inhook::store::{
    Admission, BodyKey, IngestLimits, NewEvent, SettleAt, SourceRules, Store, StoreError,
};
use serde_json::{json, Value};

/// A fixed base time, unix milliseconds: every check passes times explicitly.
pub const T0: i64 = 1_780_000_000_000;

/// The presence source of the checks.
pub const PRESENCE: &str = "presence";
/// The save-game source of the checks.
pub const SAVES: &str = "saves";

/// The presence source's rules.
pub fn presence_rules() -> SourceRules {
    SourceRules {
        name: PRESENCE.into(),
        kind: inhook::domain::kind::built_in(SourceKind::Presence, 900_000),
        first_sequence: 1,
        hold_timeout_ms: 30_000,
        destinations: std::sync::Arc::from([]),
    }
}

/// The save-game source's rules, with a 30 s hold timeout.
pub fn save_rules() -> SourceRules {
    SourceRules {
        name: SAVES.into(),
        kind: inhook::domain::kind::built_in(SourceKind::SaveGame, 900_000),
        first_sequence: 1,
        hold_timeout_ms: 30_000,
        destinations: std::sync::Arc::from([]),
    }
}

/// A presence body of user `user`.
pub fn presence(event_id: &str, user: &str, presence: &str, seq: i64) -> Value {
    json!({"event_id": event_id, "user_id": user, "presence": presence,
           "sequence_number": seq, "timestamp": 1000 + seq})
}

/// A save-game body of `player_1024`'s slot `slot`.
pub fn save(event_id: &str, slot: &str, event_type: &str, seq: i64, data: Value) -> Value {
    save_keyed(
        event_id,
        slot,
        event_type,
        seq,
        &format!("{slot}:{seq}"),
        data,
    )
}

/// A save-game body with an explicit idempotency key.
pub fn save_keyed(
    event_id: &str,
    slot: &str,
    event_type: &str,
    seq: i64,
    key: &str,
    data: Value,
) -> Value {
    json!({"event_id": event_id, "event_type": event_type, "payload_version": 1,
           "player_id": "player_1024", "save_slot": slot, "sequence": seq,
           "idempotency_key": key, "data": data})
}

/// An `inventory.updated` adding `qty` swords (negative: removing them).
pub fn delta(event_id: &str, slot: &str, seq: i64, qty: i64) -> Value {
    let items = json!([{"item_id": "sword", "qty": qty.abs()}]);
    let data = if qty >= 0 {
        json!({"added_items": items})
    } else {
        json!({"removed_items": items})
    };
    save(event_id, slot, "inventory.updated", seq, data)
}

/// The stored aggregate key of `player_1024`'s slot `slot`.
pub fn slot(slot: &str) -> String {
    AggregateKey::of_parts(vec![
        Ident::parse("player_1024").expect("player id"),
        Ident::parse(slot).expect("slot id"),
    ])
    .storage_key()
}

/// Logs `body` in `rules`' source at `at_ms`, settling it at once when `sync`.
pub async fn ingest(
    store: &dyn Store,
    rules: &SourceRules,
    body: &Value,
    at_ms: i64,
    limits: IngestLimits,
    sync: bool,
) -> Admission {
    let settle = if sync {
        SettleAt::Ingest(rules)
    } else {
        SettleAt::Worker
    };
    ingest_at(store, rules, body, at_ms, limits, settle).await
}

/// Logs `body` in `rules`' source at `at_ms`, settled where `settle` says.
pub async fn ingest_at(
    store: &dyn Store,
    rules: &SourceRules,
    body: &Value,
    at_ms: i64,
    limits: IngestLimits,
    settle: SettleAt<'_>,
) -> Admission {
    let raw = serde_json::to_vec(body).expect("body");
    let event = fields(rules, &raw, None);
    let headers = [("user-agent".to_owned(), "conformance".to_owned())];
    store
        .ingest(
            NewEvent {
                source: &rules.name,
                event: &event,
                body: &raw,
                headers: &headers,
                received_at_ms: at_ms,
                signed_at: None,
                limits,
                ignored: false,
                body_key: BodyKey::None,
                search_fields: &[],
            },
            settle,
        )
        .await
        .expect("ingest")
}

/// Logs `raw`, parsed as `event`, in `source` for the worker, without limits; a delivery
/// with the body key of a logged one (`body_key`: its raw body, its signed content) is a
/// duplicate.
pub async fn ingest_raw(
    store: &dyn Store,
    source: &str,
    (event, raw): (&EventFields, &[u8]),
    at_ms: i64,
    body_key: BodyKey,
) -> Result<Admission, StoreError> {
    store
        .ingest(
            NewEvent {
                source,
                event,
                body: raw,
                headers: &[],
                received_at_ms: at_ms,
                signed_at: None,
                limits: IngestLimits::NONE,
                ignored: false,
                body_key,
                search_fields: &[],
            },
            SettleAt::Worker,
        )
        .await
}

/// Logs a save-game body for the worker (async mode), without limits.
pub async fn ingest_save(store: &dyn Store, body: &Value, at_ms: i64) -> Admission {
    ingest(store, &save_rules(), body, at_ms, IngestLimits::NONE, false).await
}

/// The log row of a newly logged delivery; panics on any other admission.
pub fn logged(admission: &Admission) -> i64 {
    match admission {
        Admission::Logged { row, .. } => *row,
        other => panic!("expected the delivery to be logged, got {other:?}"),
    }
}

/// Every event of the log matching `filter`, newest first, read page by page.
pub async fn all_events(
    store: &dyn Store,
    filter: &inhook::store::EventFilter,
) -> Vec<inhook::store::EventRecord> {
    let mut items = Vec::new();
    let mut cursor = None;
    loop {
        let page = store.events(filter, 100, cursor).await.expect("events");
        items.extend(page.items);
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return items,
        }
    }
}

/// Logs `body` in `rules`' source at `at_ms` and settles it at once (sync mode).
pub async fn ingest_sync(
    store: &dyn Store,
    rules: &SourceRules,
    body: Value,
    at_ms: i64,
) -> Admission {
    ingest(store, rules, &body, at_ms, IngestLimits::NONE, true).await
}

/// The fields `rules`' kind reads from `raw` (`delivery_id` standing in for a missing event id).
pub fn fields(rules: &SourceRules, raw: &[u8], delivery_id: Option<&str>) -> EventFields {
    match rules
        .kind
        .parse(raw, &Default::default(), delivery_id)
        .expect("a body the contract accepts")
    {
        Delivery::Event(fields) => fields,
        ignored => panic!("not an event: {ignored:?}"),
    }
}

/// A user's presence, read through the generic aggregate method.
pub async fn presence_of(
    store: &dyn Store,
    source: &str,
    user: &str,
) -> Result<Option<PresenceState>, StoreError> {
    let stored = store.aggregate(source, user).await?;
    stored
        .map(|s| inhook::domain::kind::presence::presence_state(&s))
        .transpose()
        .map_err(StoreError::from)
}

/// A save slot's state, read through the generic aggregate method.
pub async fn save_of(
    store: &dyn Store,
    source: &str,
    key: &AggregateKey,
) -> Result<Option<SaveState>, StoreError> {
    let stored = store.aggregate(source, &key.storage_key()).await?;
    stored
        .map(|s| inhook::domain::kind::save::save_state(&s))
        .transpose()
        .map_err(StoreError::from)
}
