//! The save-game contract of the second seed.

use serde_json::{Map, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::domain::contract::body::parse_object;
use crate::domain::contract::fields::{non_negative_integer, Reader};
use crate::domain::contract::{ContractError, FieldProblem};
use crate::domain::{EventId, IdempotencyKey, Ident, Sequence};

/// An item and a quantity, as in `added_items`, `removed_items` and `items`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemQty {
    /// The item.
    pub item_id: Ident,
    /// How many.
    pub qty: i64,
}

/// `progress.saved`: the slot's progress, latest-wins.
pub const PROGRESS_SAVED: &str = "progress.saved";
/// `inventory.updated`: an inventory delta, in order.
pub const INVENTORY_UPDATED: &str = "inventory.updated";
/// `inventory.snapshot`: the whole inventory, latest-wins.
pub const INVENTORY_SNAPSHOT: &str = "inventory.snapshot";
/// `achievement.unlocked`: an achievement, order-free.
pub const ACHIEVEMENT_UNLOCKED: &str = "achievement.unlocked";

/// What a save-game event does, by `event_type`.
#[derive(Debug, Clone, PartialEq)]
pub enum SaveChange {
    /// `progress.saved`: replaces the progress with `data` (latest-wins).
    ProgressSaved(Map<String, Value>),
    /// `inventory.updated`: adds and removes items as one step (in-order).
    InventoryUpdated {
        /// `data.added_items`.
        added: Vec<ItemQty>,
        /// `data.removed_items`.
        removed: Vec<ItemQty>,
    },
    /// `inventory.snapshot`: replaces the inventory with `data.items` (latest-wins).
    InventorySnapshot(Vec<ItemQty>),
    /// `achievement.unlocked`: adds `data.achievement_id` to a set (order-free).
    AchievementUnlocked(Ident),
    /// Any other type: logged and ignored.
    Unsupported,
}

/// A verified save-game delivery.
#[derive(Debug, Clone, PartialEq)]
pub struct SaveEvent {
    /// The delivery's id.
    pub event_id: EventId,
    /// The event type as sent.
    pub event_type: Ident,
    /// The typed effect of the event.
    pub change: SaveChange,
    /// Contract version, 1 unless sent.
    pub payload_version: i64,
    /// When the publisher produced the event.
    pub occurred_at: Option<OffsetDateTime>,
    /// The player.
    pub player_id: Ident,
    /// The player's save slot.
    pub save_slot: Ident,
    /// The publisher's sequence for (player, slot).
    pub sequence: Sequence,
    /// The publisher's key for the logical operation.
    pub idempotency_key: IdempotencyKey,
}

impl SaveEvent {
    /// Parses a raw body.
    pub fn parse(body: &[u8]) -> Result<Self, ContractError> {
        Self::parse_with_fallback(body, None)
    }

    /// Parses a raw body whose `event_id`, when absent, is `fallback_event_id`.
    pub fn parse_with_fallback(
        body: &[u8],
        fallback_event_id: Option<&str>,
    ) -> Result<Self, ContractError> {
        let map = parse_object(body)?;
        let mut problems = Vec::new();
        let mut r = Reader::new(&map, &mut problems);
        let event_id = r.id_or("event_id", fallback_event_id, EventId::parse);
        let event_type = r.id("event_type", true, Ident::parse);
        let payload_version = match r.non_negative("payload_version", false) {
            Some(0) => {
                r.problem("payload_version", "must be at least 1");
                None
            }
            other => other,
        };
        let occurred_at = r.string("occurred_at", false).and_then(|raw| {
            let parsed = OffsetDateTime::parse(raw, &Rfc3339).ok();
            if parsed.is_none() {
                r.problem("occurred_at", "must be an RFC 3339 date-time");
            }
            parsed
        });
        let player_id = r.id("player_id", true, Ident::parse);
        let save_slot = r.id("save_slot", true, Ident::parse);
        let sequence = r.sequence("sequence");
        let idempotency_key = r.id("idempotency_key", true, IdempotencyKey::parse);
        let data = r.object("data", true);
        let change = match (&event_type, data) {
            (Some(event_type), Some(data)) => {
                change_of(event_type.as_str(), data, r.path("data"), r.problems())
            }
            _ => None,
        };
        match (
            event_id,
            event_type,
            change,
            player_id,
            save_slot,
            sequence,
            idempotency_key,
        ) {
            (
                Some(event_id),
                Some(event_type),
                Some(change),
                Some(player_id),
                Some(save_slot),
                Some(sequence),
                Some(idempotency_key),
            ) if problems.is_empty() => Ok(Self {
                event_id,
                event_type,
                change,
                payload_version: payload_version.unwrap_or(1),
                occurred_at,
                player_id,
                save_slot,
                sequence,
                idempotency_key,
            }),
            _ => Err(ContractError { problems }),
        }
    }
}

fn change_of(
    event_type: &str,
    data: &Map<String, Value>,
    path: String,
    problems: &mut Vec<FieldProblem>,
) -> Option<SaveChange> {
    let mut d = Reader::nested(data, path, problems);
    match event_type {
        PROGRESS_SAVED => Some(SaveChange::ProgressSaved(data.clone())),
        INVENTORY_UPDATED => {
            let added = items(&mut d, "added_items", false);
            let removed = items(&mut d, "removed_items", false);
            Some(SaveChange::InventoryUpdated {
                added: added?,
                removed: removed?,
            })
        }
        INVENTORY_SNAPSHOT => items(&mut d, "items", true).map(SaveChange::InventorySnapshot),
        ACHIEVEMENT_UNLOCKED => d
            .id("achievement_id", true, Ident::parse)
            .map(SaveChange::AchievementUnlocked),
        _ => Some(SaveChange::Unsupported),
    }
}

/// Reads an array of `{"item_id","qty"}`; an absent optional array is empty.
fn items(r: &mut Reader<'_>, name: &str, required: bool) -> Option<Vec<ItemQty>> {
    let Some(array) = r.array(name, required) else {
        return (!required && r.value(name, false).is_none()).then(Vec::new);
    };
    let mut out = Vec::with_capacity(array.len());
    let mut ok = true;
    for (i, entry) in array.iter().enumerate() {
        let path = r.path(&format!("{name}[{i}]"));
        let Value::Object(item) = entry else {
            r.problem(
                &format!("{name}[{i}]"),
                "must be an object with item_id and qty",
            );
            ok = false;
            continue;
        };
        let mut ir = Reader::nested(item, path, r.problems());
        let item_id = ir.id("item_id", true, Ident::parse);
        let qty = ir
            .value("qty", true)
            .and_then(|v| match non_negative_integer(v) {
                Ok(q) => Some(q),
                Err(problem) => {
                    ir.problem("qty", problem);
                    None
                }
            });
        match (item_id, qty) {
            (Some(item_id), Some(qty)) => out.push(ItemQty { item_id, qty }),
            _ => ok = false,
        }
    }
    ok.then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEED: &str = r#"{"event_id": "evt_01JX9M8Y6G4N3T2P1K7R", "event_type": "inventory.updated",
 "payload_version": 1, "occurred_at": "2026-06-28T10:15:21Z",
 "player_id": "player_1024", "save_slot": "slot_a", "sequence": 184,
 "idempotency_key": "player_1024:slot_a:inventory:chapter3_reward",
 "data": {"reason": "chapter_reward", "chapter": 3,
          "added_items": [{"item_id": "pressed_flower", "qty": 1}],
          "inventory_revision": 57}}"#;

    fn with(field: &str, value: Value) -> Vec<u8> {
        let mut map: Map<String, Value> = serde_json::from_str(SEED).unwrap();
        map.insert(field.into(), value);
        serde_json::to_vec(&map).unwrap()
    }

    fn fields_of(body: &[u8]) -> Vec<String> {
        SaveEvent::parse(body)
            .unwrap_err()
            .problems
            .into_iter()
            .map(|p| p.field)
            .collect()
    }

    #[test]
    fn the_seed_payload_parses() {
        let e = SaveEvent::parse(SEED.as_bytes()).unwrap();
        assert_eq!(e.sequence.get(), 184);
        assert_eq!(
            e.change,
            SaveChange::InventoryUpdated {
                added: vec![ItemQty {
                    item_id: Ident::parse("pressed_flower").unwrap(),
                    qty: 1
                }],
                removed: vec![],
            }
        );
    }

    #[test]
    fn each_bad_field_is_named() {
        use serde_json::json;
        assert_eq!(fields_of(&with("sequence", json!(-3))), ["sequence"]);
        assert_eq!(fields_of(&with("data", json!("x"))), ["data"]);
        assert_eq!(
            fields_of(&with("occurred_at", json!("yesterday"))),
            ["occurred_at"]
        );
        assert_eq!(
            fields_of(&with(
                "data",
                json!({"added_items": [{"item_id": "a", "qty": -1}]})
            )),
            ["data.added_items[0].qty"]
        );
        assert_eq!(
            fields_of(&with("data", json!({"removed_items": [7]}))),
            ["data.removed_items[0]"]
        );
        let mut map: Map<String, Value> = serde_json::from_str(SEED).unwrap();
        map.remove("idempotency_key");
        assert_eq!(
            fields_of(&serde_json::to_vec(&map).unwrap()),
            ["idempotency_key"]
        );
    }

    #[test]
    fn unknown_types_parse_as_unsupported() {
        let e = SaveEvent::parse(&with("event_type", "quest.started".into())).unwrap();
        assert_eq!(e.change, SaveChange::Unsupported);
    }

    #[test]
    fn snapshots_need_items_and_achievements_need_an_id() {
        use serde_json::json;
        let snapshot = with("event_type", "inventory.snapshot".into());
        assert_eq!(fields_of(&snapshot), ["data.items"]);
        let ach = with("event_type", "achievement.unlocked".into());
        assert_eq!(fields_of(&ach), ["data.achievement_id"]);
        let mut map: Map<String, Value> = serde_json::from_slice(&ach).unwrap();
        map.insert("data".into(), json!({"achievement_id": "first_letter"}));
        let e = SaveEvent::parse(&serde_json::to_vec(&map).unwrap()).unwrap();
        assert!(matches!(e.change, SaveChange::AchievementUnlocked(_)));
    }
}
