//! The save-game kind (docs/contract.md, processing): snapshots latest-wins, deltas in order with
//! holds and gap skips, achievements order-free; its state is the save slot.

pub mod contract;
pub mod projection;
pub mod rules;

pub use contract::{ItemQty, SaveChange, SaveEvent};
pub use projection::{save_view, SaveState, SaveView};
pub use rules::{settle_save, PendingSave};

use std::collections::{BTreeMap, BTreeSet};

use axum::http::HeaderMap;
use serde_json::{json, Value};

use super::{
    invalid_for_projection, last_applied, Delivery, DeliveryOrder, EventFields, Kind, KindPlan,
    Lane, ParsedBody, PendingRow, SettleInput,
};
use super::{AggregateState, CorruptState, SourceKind};
use crate::domain::contract::ContractError;
use crate::domain::mask::{mask_at, masks_whole, MASK};
use crate::domain::ordering::SkippedGaps;
use crate::domain::{AggregateKey, Mode, Sequence};
use crate::ingress::signature::Scheme;

impl SaveEvent {
    /// The fields every layer needs of a save-game event.
    pub fn fields(&self) -> EventFields {
        EventFields {
            event_id: self.event_id.clone(),
            idempotency_key: Some(self.idempotency_key.clone()),
            aggregate: self.aggregate(),
            sequence: self.sequence.get(),
            event_type: self.event_type.as_str().to_owned(),
            may_hold: matches!(self.change, SaveChange::InventoryUpdated { .. }),
            unordered: None,
            parsed: None,
        }
    }

    /// The aggregate it belongs to: the player's save slot.
    pub fn aggregate(&self) -> AggregateKey {
        AggregateKey::of_parts(vec![self.player_id.clone(), self.save_slot.clone()])
    }

    /// The delivery this event makes, carrying the event itself as its parsed body.
    pub fn into_delivery(self) -> Delivery {
        let fields = self.fields();
        Delivery::Event(EventFields {
            parsed: Some(super::Parsed::into_parsed(self)),
            ..fields
        })
    }
}

/// A save-game source answers once logged (202) and applies in the workers: a delta may wait
/// for a gap.
pub const DEFAULT_MODE: Mode = Mode::Async;
/// The second seed's signature: HMAC-SHA256 over the timestamp and the body.
pub const DEFAULT_SCHEME: Scheme = Scheme::HmacTimestamped;

/// The lane of a slot's progress (`progress.saved`).
pub const PROGRESS_LANE: &str = "progress";
/// The lane of a slot's inventory (`inventory.snapshot` and `inventory.updated`).
pub const INVENTORY_LANE: &str = "inventory";
/// The parts of a slot that forwarding orders apart.
pub const LANES: &[&str] = &[PROGRESS_LANE, INVENTORY_LANE];

/// Game saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveKind;

/// A stored save slot in its typed form.
pub fn save_state(stored: &AggregateState) -> Result<SaveState, CorruptState> {
    let bad = |what: &str| CorruptState(format!("save slot with a bad {what} in store"));
    let s = &stored.state;
    let sequence = |key: &str| -> Result<Option<Sequence>, CorruptState> {
        match s.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_i64()
                .and_then(Sequence::new)
                .map(Some)
                .ok_or_else(|| bad(key)),
        }
    };
    let progress = match s.get("progress") {
        None | Some(Value::Null) => None,
        Some(Value::Object(map)) => Some(map.clone()),
        Some(_) => return Err(bad("progress")),
    };
    let inventory: BTreeMap<String, i64> =
        serde_json::from_value(s.get("inventory").cloned().unwrap_or(json!({})))
            .map_err(|_| bad("inventory"))?;
    let achievements: BTreeSet<String> =
        serde_json::from_value(s.get("achievements").cloned().unwrap_or(json!([])))
            .map_err(|_| bad("achievements"))?;
    let last_sequence = stored.watermark.ok_or_else(|| bad("last_sequence"))?;
    Ok(SaveState {
        last_sequence,
        skipped_gaps: SkippedGaps::from_stored(stored.skipped_gaps.as_deref(), last_sequence),
        progress,
        progress_sequence: sequence("progress_sequence")?,
        inventory,
        inventory_sequence: sequence("inventory_sequence")?,
        snapshot_sequence: sequence("snapshot_sequence")?,
        achievements,
        updated_at_ms: stored.updated_at_ms,
    })
}

/// The stored form of a save slot.
fn stored_of(
    aggregate: &str,
    state: &SaveState,
    last: (Option<String>, Option<String>),
) -> AggregateState {
    let seq = |s: Option<Sequence>| s.map(Sequence::get);
    AggregateState {
        aggregate: aggregate.to_owned(),
        sequence: Some(state.last_sequence),
        event_id: last.0,
        event_type: last.1,
        state: json!({
            "progress": state.progress,
            "progress_sequence": seq(state.progress_sequence),
            "inventory": state.inventory,
            "inventory_sequence": seq(state.inventory_sequence),
            "snapshot_sequence": seq(state.snapshot_sequence),
            "achievements": state.achievements,
        }),
        tag: None,
        watermark: Some(state.last_sequence),
        skipped_gaps: Some(state.skipped_gaps.to_stored()),
        updated_at_ms: state.updated_at_ms,
    }
}

/// A save slot's view masked as shown: its `progress` is the body's `data`.
pub fn mask_view(view: &mut Value, mask_fields: &[String]) {
    let Some(progress) = view.get_mut("progress").filter(|p| p.is_object()) else {
        return;
    };
    if masks_whole(mask_fields, &["data"]) {
        // Masked whole: still an object (the documented shape), every value hidden.
        if let Some(object) = progress.as_object_mut() {
            object.values_mut().for_each(|v| *v = json!(MASK));
        }
    } else {
        mask_at(progress, mask_fields, &["data"]);
    }
}

impl Kind for SaveKind {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn source_kind(&self) -> SourceKind {
        SourceKind::SaveGame
    }

    fn parse(
        &self,
        body: &[u8],
        _headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<Delivery, ContractError> {
        SaveEvent::parse_with_fallback(body, delivery_id).map(SaveEvent::into_delivery)
    }

    fn in_order(&self) -> bool {
        true
    }

    fn delivery_order(&self, event_type: &str) -> DeliveryOrder {
        match event_type {
            contract::INVENTORY_UPDATED => DeliveryOrder::InOrder(Lane::Part(INVENTORY_LANE)),
            contract::PROGRESS_SAVED => DeliveryOrder::LatestWins(Lane::Part(PROGRESS_LANE)),
            contract::INVENTORY_SNAPSHOT => DeliveryOrder::LatestWins(Lane::Part(INVENTORY_LANE)),
            // achievement.unlocked is order-free.
            _ => DeliveryOrder::Unordered,
        }
    }

    fn settle(&self, input: &SettleInput<'_>) -> KindPlan {
        let before = match input.before.map(save_state) {
            Some(Ok(state)) => state,
            _ => SaveState::empty(input.first_sequence),
        };
        let mut decisions = Vec::new();
        let mut pending = Vec::with_capacity(input.rows.len());
        for row in input.rows {
            let parsed = row.parsed_or(|body, id| SaveEvent::parse_with_fallback(body, Some(id)));
            match parsed {
                Ok(event) => pending.push(PendingSave {
                    row: row.row,
                    received_at_ms: row.received_at_ms,
                    event,
                    replayed: row.replayed,
                }),
                Err(err) => decisions.push((row.row, invalid_for_projection(err))),
            }
        }
        let settlement = settle_save(
            before.clone(),
            input.occupied.clone(),
            pending,
            input.now_ms,
            input.hold_timeout_ms,
        );
        decisions.extend(settlement.decisions);
        let state = settlement.state;
        let reach = Some((
            state.last_sequence,
            state.snapshot_sequence.map(Sequence::get),
        ));
        let stored = if input.before.is_none() && state == before {
            None
        } else {
            Some(stored_of(
                input.aggregate,
                &state,
                last_event(input, &decisions),
            ))
        };
        KindPlan {
            state: stored,
            decisions,
            gaps_skipped: settlement.gaps_skipped,
            ties: 0,
            current_sequence: Some(state.last_sequence),
            reach,
        }
    }

    fn view(&self, stored: &AggregateState, _now_ms: i64) -> Value {
        typed_view(stored).map_or(Value::Null, |view| json!(view))
    }

    /// Serialized straight from the typed view: building a JSON value first, only to turn
    /// it into text at once, showed in the instruction counts (docs/benchmarks.md).
    fn stream_text(&self, _source: &str, stored: &AggregateState, _now_ms: i64) -> String {
        typed_view(stored).map_or_else(
            || Value::Null.to_string(),
            |view| serde_json::to_string(&view).expect("a save view serializes"),
        )
    }

    fn mask(&self, view: &mut Value, fields: &[String]) {
        mask_view(view, fields);
    }
}

/// A stored save slot in its API shape; `None` when the stored state is not a save slot's.
fn typed_view(stored: &AggregateState) -> Option<SaveView> {
    let key = AggregateKey::from_storage_key(&stored.aggregate);
    let (player, slot) = match key.as_ref().map(AggregateKey::parts) {
        Some([player_id, save_slot]) => (player_id.to_string(), save_slot.to_string()),
        _ => (stored.aggregate.clone(), String::new()),
    };
    save_state(stored)
        .ok()
        .map(|state| save_view(&player, &slot, &state))
}

/// The id and type of the event last applied: this step's, else the stored ones.
fn last_event(
    input: &SettleInput<'_>,
    decisions: &[(i64, crate::domain::ordering::Outcome)],
) -> (Option<String>, Option<String>) {
    match last_applied(input.rows, decisions) {
        Some(PendingRow {
            event_id,
            event_type,
            ..
        }) => (Some(event_id.clone()), Some(event_type.clone())),
        None => input
            .before
            .map_or((None, None), |b| (b.event_id.clone(), b.event_type.clone())),
    }
}

impl super::Parsed for SaveEvent {
    fn into_parsed(self) -> ParsedBody {
        ParsedBody::Save(std::sync::Arc::new(self))
    }

    fn from_parsed(parsed: &ParsedBody) -> Option<&Self> {
        match parsed {
            ParsedBody::Save(event) => Some(event),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot of player `p` holding a gem, an achievement and some progress.
    fn sample(first_sequence: i64) -> SaveState {
        let mut state = SaveState::empty(first_sequence);
        state.inventory.insert("gem".into(), 2);
        state.achievements.insert("first".into());
        state.progress = Some(serde_json::from_value(json!({"level": 4})).unwrap());
        state
    }

    #[test]
    fn a_save_slot_round_trips_through_its_stored_form() {
        let mut state = sample(3);
        state.progress_sequence = Sequence::new(5);
        state.snapshot_sequence = Sequence::new(4);
        state.updated_at_ms = 9;
        let stored = stored_of("p\u{1f}s", &state, (Some("e".into()), None));
        assert_eq!((stored.sequence, stored.watermark), (Some(2), Some(2)));
        assert_eq!(save_state(&stored).unwrap(), state);
        assert_eq!(SaveKind.view(&stored, 0)["player_id"], "p");
    }

    #[test]
    fn the_stream_text_reads_back_as_the_view() {
        let mut state = sample(1);
        state.updated_at_ms = 1_700_000_000_000;
        let stored = stored_of("p\u{1f}s", &state, (Some("e".into()), None));
        let text = SaveKind.stream_text("save-game", &stored, 0);
        let read: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(read, SaveKind.view(&stored, 0));
        assert_eq!(read["inventory"]["gem"], 2);
        let broken = AggregateState {
            state: json!({"inventory": "not a map"}),
            ..stored
        };
        assert_eq!(SaveKind.stream_text("save-game", &broken, 0), "null");
    }

    fn fields(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_state_view_masks_progress_as_the_body_s_data() {
        let mask = |mut view: Value, fields: &[String]| {
            SaveKind.mask(&mut view, fields);
            view
        };
        let save = json!({"player_id": "p", "save_slot": "s", "email": "view field, not payload",
                          "progress": {"Email": "a", "card": {"number": "1"}, "level": 2}});
        let masked = mask(save.clone(), &fields(&["email", "data.card.number"]));
        assert_eq!(
            masked["progress"],
            json!({"Email": "***", "card": {"number": "***"}, "level": 2})
        );
        assert_eq!(masked["email"], save["email"], "only the payload is masked");

        // `data` itself masked: progress stays an object, every value hidden.
        let masked = mask(save, &fields(&["DATA"]));
        assert_eq!(
            masked["progress"],
            json!({"Email": "***", "card": "***", "level": "***"})
        );

        let presence = json!({"user_id": "u", "status": "ONLINE", "progress": null});
        assert_eq!(mask(presence.clone(), &fields(&["data"])), presence);
    }
}
