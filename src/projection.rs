//! Projections (docs/contract.md, processing): the current state of each aggregate, and the pure
//! effect of one event on it. The ordering rules in [`crate::ordering`]
//! decide *whether* an event applies; this module says *what* applying does.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{Map, Value};

use crate::contract::{ItemQty, Presence, PresenceEvent, SaveChange, SaveEvent};
use crate::domain::{DeadReason, Sequence};

/// A user's current presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceState {
    /// The latest presence by sequence.
    pub presence: Presence,
    /// The sequence of the event that set it.
    pub sequence: Sequence,
    /// When it was applied, unix milliseconds.
    pub updated_at_ms: i64,
}

impl PresenceState {
    /// The state after applying `event` at `now_ms` (the caller has checked it is newer).
    pub fn from_event(event: &PresenceEvent, now_ms: i64) -> Self {
        Self {
            presence: event.presence,
            sequence: event.sequence,
            updated_at_ms: now_ms,
        }
    }

    /// Whether the presence has not been updated for longer than `stale_after_ms`.
    pub fn is_stale(&self, now_ms: i64, stale_after_ms: i64) -> bool {
        now_ms.saturating_sub(self.updated_at_ms) > stale_after_ms
    }
}

/// The API shape of a presence (docs/api.md, read API).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PresenceView {
    /// The user.
    pub user_id: String,
    /// The latest presence by sequence.
    pub status: Presence,
    /// The sequence of the event that set it.
    pub sequence: i64,
    /// When it was applied (RFC 3339).
    pub updated_at: String,
    /// Whether it has not been updated for longer than the source's `stale_after_s`.
    pub stale: bool,
}

/// The API shape of a presence; `stale` is judged at `now_ms`.
pub fn presence_view(
    user_id: &str,
    state: &PresenceState,
    now_ms: i64,
    stale_after_ms: i64,
) -> PresenceView {
    PresenceView {
        user_id: user_id.to_owned(),
        status: state.presence,
        sequence: state.sequence.get(),
        updated_at: crate::clock::rfc3339(state.updated_at_ms),
        stale: state.is_stale(now_ms, stale_after_ms),
    }
}

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
        updated_at: (state.updated_at_ms > 0).then(|| crate::clock::rfc3339(state.updated_at_ms)),
    }
}

/// Most skipped gaps an aggregate remembers; past it the oldest is forgotten (and with it
/// what is known of the sequences up to it).
pub(crate) const MOST_SKIPPED_GAPS: usize = 32;

/// The gaps a hold timeout skipped in one in-order aggregate. At or below the watermark,
/// they tell a late event (its sequence was skipped: dead, `late_after_gap_skip`) from one
/// decided before, whose dedup key was purged (a resend, or a captured delivery sent
/// again: stale, never applied twice).
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct SkippedGaps {
    /// Sequences below this are not known: skipped before the gaps were recorded (a store
    /// of an older release), or forgotten past [`MOST_SKIPPED_GAPS`].
    known_from: i64,
    /// The skipped ranges, `(first, last)` inclusive, oldest first.
    gaps: Vec<(i64, i64)>,
}

impl SkippedGaps {
    /// The gaps of an aggregate as stored (`None`: none recorded yet, so nothing at or below
    /// `watermark` is known); an unreadable text counts as none recorded.
    pub fn from_stored(text: Option<&str>, watermark: i64) -> Self {
        text.and_then(|t| serde_json::from_str(t).ok())
            .unwrap_or(Self {
                known_from: watermark.saturating_add(1),
                gaps: Vec::new(),
            })
    }

    /// The stored form.
    pub fn to_stored(&self) -> String {
        serde_json::to_string(self).expect("skipped gaps serialize")
    }

    /// Records that `first..=last` was skipped.
    pub(crate) fn record(&mut self, first: i64, last: i64) {
        if first > last {
            return;
        }
        self.gaps.push((first, last));
        if self.gaps.len() > MOST_SKIPPED_GAPS {
            let (_, forgotten) = self.gaps.remove(0);
            self.known_from = self.known_from.max(forgotten.saturating_add(1));
        }
    }

    /// Whether `sequence` (at or below the watermark) was skipped; `None` when not known.
    pub fn skipped(&self, sequence: i64) -> Option<bool> {
        (sequence >= self.known_from).then(|| {
            self.gaps
                .iter()
                .any(|&(first, last)| (first..=last).contains(&sequence))
        })
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

    #[test]
    fn presence_goes_stale_after_the_window() {
        let state = PresenceState {
            presence: Presence::Busy,
            sequence: Sequence::new(1).unwrap(),
            updated_at_ms: 1_000,
        };
        assert!(!state.is_stale(1_000 + 900_000, 900_000));
        assert!(state.is_stale(1_001 + 900_000, 900_000));
    }
}
