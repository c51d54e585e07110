//! A save slot as stored and shown (docs/api.md, read API): the pure effect of one applied
//! save-game event. The rules in [`super::rules`] decide *whether* an event applies; this
//! module says *what* applying does.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Map, Value};

use super::contract::{ItemQty, SaveChange, SaveEvent};
use crate::domain::ordering::SkippedGaps;
use crate::domain::{DeadReason, Sequence};

/// The API shape of a save slot (docs/api.md, read API).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct SaveView {
    /// The player.
    pub player_id: String,
    /// The slot.
    pub save_slot: String,
    /// Highest sequence up to which every event was decided (or skipped).
    pub last_sequence: i64,
    /// The latest `progress.saved` data, null until one is applied.
    #[schema(value_type = Option<Object>)]
    pub progress: Option<Map<String, Value>>,
    /// Item id to quantity.
    pub inventory: BTreeMap<String, i64>,
    /// Unlocked achievements.
    pub achievements: BTreeSet<String>,
    /// When anything was last applied (RFC 3339), null if never.
    pub updated_at: Option<String>,
}

/// The API shape of a save slot.
pub fn save_view(player_id: &str, save_slot: &str, state: &SaveState) -> SaveView {
    SaveView {
        player_id: player_id.to_owned(),
        save_slot: save_slot.to_owned(),
        last_sequence: state.last_sequence,
        progress: state.progress.clone(),
        inventory: state.inventory.clone(),
        achievements: state.achievements.clone(),
        updated_at: (state.updated_at_ms > 0)
            .then(|| crate::domain::clock::rfc3339(state.updated_at_ms)),
    }
}

/// A player's save slot: the projection plus the ordering bookkeeping it needs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SaveState {
    /// Highest sequence up to which every event was received and decided (or skipped).
    pub last_sequence: i64,
    /// The latest `progress.saved` data, null until one is applied.
    pub progress: Option<Map<String, Value>>,
    /// Sequence of the applied progress.
    pub progress_sequence: Option<Sequence>,
    /// Item id to quantity; items at zero are removed.
    pub inventory: BTreeMap<String, i64>,
    /// Sequence of the last snapshot or delta applied to the inventory.
    pub inventory_sequence: Option<Sequence>,
    /// Sequence of the last snapshot applied: every delta below it is already in it.
    pub snapshot_sequence: Option<Sequence>,
    /// Unlocked achievements.
    pub achievements: BTreeSet<String>,
    /// When anything was last applied, unix milliseconds.
    pub updated_at_ms: i64,
    /// The gaps a hold timeout skipped: a resent delta below `last_sequence` outside
    /// them was applied before.
    pub skipped_gaps: SkippedGaps,
}

impl SaveState {
    /// The state of a slot no event has touched, for a source whose sequences start at `first_sequence`.
    pub fn empty(first_sequence: i64) -> Self {
        let last_sequence = first_sequence.saturating_sub(1);
        Self {
            last_sequence,
            skipped_gaps: SkippedGaps::from_stored(None, last_sequence),
            ..Self::default()
        }
    }

    /// Applies an event the ordering rules let through, or says why it cannot apply.
    /// On error the state is unchanged.
    pub fn apply(&mut self, event: &SaveEvent, now_ms: i64) -> Result<(), (DeadReason, String)> {
        match &event.change {
            SaveChange::ProgressSaved(data) => {
                self.progress = Some(data.clone());
                self.progress_sequence = Some(event.sequence);
            }
            SaveChange::InventoryUpdated { added, removed } => {
                self.inventory = apply_delta(&self.inventory, added, removed)?;
                self.inventory_sequence = Some(event.sequence);
            }
            SaveChange::InventorySnapshot(items) => {
                self.inventory = apply_delta(&BTreeMap::new(), items, &[])?;
                self.inventory_sequence = Some(event.sequence);
                self.snapshot_sequence = Some(event.sequence);
            }
            SaveChange::AchievementUnlocked(id) => {
                self.achievements.insert(id.as_str().to_owned());
            }
            SaveChange::Unsupported => return Ok(()),
        }
        self.updated_at_ms = now_ms;
        Ok(())
    }
}

/// Adds then subtracts, as one step: any quantity below zero rejects the whole delta.
fn apply_delta(
    inventory: &BTreeMap<String, i64>,
    added: &[ItemQty],
    removed: &[ItemQty],
) -> Result<BTreeMap<String, i64>, (DeadReason, String)> {
    let mut next = inventory.clone();
    for item in added {
        let qty = next.entry(item.item_id.as_str().to_owned()).or_insert(0);
        *qty = qty.checked_add(item.qty).ok_or_else(|| {
            (
                DeadReason::InvalidForProjection,
                format!("quantity of {} would overflow", item.item_id),
            )
        })?;
    }
    for item in removed {
        let qty = next.entry(item.item_id.as_str().to_owned()).or_insert(0);
        *qty -= item.qty;
        if *qty < 0 {
            return Err((
                DeadReason::InsufficientQuantity,
                format!("removing {} of {} leaves {}", item.qty, item.item_id, *qty),
            ));
        }
    }
    next.retain(|_, qty| *qty != 0);
    Ok(next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::Ident;

    fn item(id: &str, qty: i64) -> ItemQty {
        ItemQty {
            item_id: Ident::parse(id).unwrap(),
            qty,
        }
    }

    #[test]
    fn deltas_add_and_remove_as_one_step() {
        let start = BTreeMap::from([("old_stamp".to_string(), 2)]);
        let next = apply_delta(&start, &[item("flower", 1)], &[item("old_stamp", 2)]).unwrap();
        assert_eq!(next, BTreeMap::from([("flower".to_string(), 1)]));
        let err = apply_delta(&start, &[item("flower", 1)], &[item("old_stamp", 3)]).unwrap_err();
        assert_eq!(err.0, DeadReason::InsufficientQuantity);
    }
}
