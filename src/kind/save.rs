//! The save-game kind (SPEC §3): snapshots latest-wins, deltas in order with holds
//! and gap skips, achievements order-free; its state is the save slot.

use std::collections::{BTreeMap, BTreeSet};

use axum::http::HeaderMap;
use serde_json::{json, Value};

use super::{
    invalid_for_projection, last_applied, Delivery, Kind, KindPlan, PendingRow, SettleInput,
};
use crate::contract::{ContractError, Event, SaveEvent};
use crate::domain::{AggregateKey, Sequence};
use crate::mask::{mask_at, masks_whole, MASK};
use crate::ordering::{settle_save, PendingSave};
use crate::projection::{save_view, SaveState};
use crate::store::{AggregateState, StoreError};

/// Game saves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaveKind;

/// A stored save slot in its typed form.
pub fn save_state(stored: &AggregateState) -> Result<SaveState, StoreError> {
    let bad = |what: &str| StoreError::Internal(format!("save slot with a bad {what} in store"));
    let s = &stored.state;
    let sequence = |key: &str| -> Result<Option<Sequence>, StoreError> {
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
    Ok(SaveState {
        last_sequence: stored.watermark.ok_or_else(|| bad("last_sequence"))?,
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
    fn label(&self) -> &'static str {
        "save"
    }

    fn parse(
        &self,
        body: &[u8],
        _headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<Delivery, ContractError> {
        SaveEvent::parse_with_fallback(body, delivery_id)
            .map(|event| Delivery::Event(Event::Save(event).fields()))
    }

    fn in_order(&self) -> bool {
        true
    }

    fn settle(&self, input: &SettleInput<'_>) -> KindPlan {
        let before = match input.before.map(save_state) {
            Some(Ok(state)) => state,
            _ => SaveState::empty(input.first_sequence),
        };
        let mut decisions = Vec::new();
        let mut pending = Vec::with_capacity(input.rows.len());
        for row in input.rows {
            match SaveEvent::parse_with_fallback(&row.body, Some(&row.event_id)) {
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
        let (player, slot) = match AggregateKey::from_storage_key(&stored.aggregate) {
            Some(AggregateKey::SaveSlot {
                player_id,
                save_slot,
            }) => (player_id.to_string(), save_slot.to_string()),
            _ => (stored.aggregate.clone(), String::new()),
        };
        match save_state(stored) {
            Ok(state) => json!(save_view(&player, &slot, &state)),
            Err(_) => Value::Null,
        }
    }

    fn mask(&self, view: &mut Value, fields: &[String]) {
        mask_view(view, fields);
    }
}

/// The id and type of the event last applied: this step's, else the stored ones.
fn last_event(
    input: &SettleInput<'_>,
    decisions: &[(i64, crate::ordering::Outcome)],
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
