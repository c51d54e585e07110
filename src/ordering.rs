//! Ordering rules (SPEC §3) as pure functions: given an aggregate's state and
//! the events waiting for it, decide each event (apply, stale, hold, dead) and
//! return the new state. The stores load and save; these functions decide.
//!
//! - latest-wins (presence, `progress.saved`, `inventory.snapshot`): applies
//!   when newer than the component's last applied sequence, else stale.
//! - in-order (`inventory.updated`): applies only when every lower sequence
//!   of the aggregate is decided; held otherwise, until `hold_timeout` skips
//!   the gap.
//! - order-free (`achievement.unlocked`): applies once, whenever it arrives.

use std::collections::BTreeSet;

use crate::contract::{PresenceEvent, SaveChange, SaveEvent};
use crate::domain::{DeadReason, Sequence};
use crate::projection::{PresenceState, SaveState};

/// What became of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Applied to the projection.
    Applied,
    /// Older than the state; nothing changed.
    Stale,
    /// Unknown event type; nothing changed.
    Unsupported,
    /// Waiting for a gap before it to fill.
    Held,
    /// Will not be applied; a person must look at it.
    Dead {
        /// The reason code.
        reason: DeadReason,
        /// A sentence for the person triaging it.
        detail: String,
    },
}

impl Outcome {
    fn dead(reason: DeadReason, detail: impl Into<String>) -> Self {
        Outcome::Dead {
            reason,
            detail: detail.into(),
        }
    }
}

/// Decides a presence event against the user's current state (latest-wins).
pub fn decide_presence(current: Option<&PresenceState>, event: &PresenceEvent) -> Outcome {
    match current {
        Some(state) if event.sequence <= state.sequence => Outcome::Stale,
        _ => Outcome::Applied,
    }
}

/// A save-game event waiting to be decided.
#[derive(Debug, Clone)]
pub struct PendingSave {
    /// The event log row it came from.
    pub row: i64,
    /// When it was received, unix milliseconds (hold timeouts count from here).
    pub received_at_ms: i64,
    /// The parsed event.
    pub event: SaveEvent,
    /// Whether a person replayed it: a replayed delta whose slot is free applies
    /// even below the watermark, since a person asked for exactly that.
    pub replayed: bool,
}

/// The result of settling one aggregate.
#[derive(Debug, Clone)]
pub struct Settlement {
    /// The aggregate's new state.
    pub state: SaveState,
    /// Every pending event's outcome, in the order decided; held events last.
    pub decisions: Vec<(i64, Outcome)>,
    /// How many missing sequences a hold timeout skipped.
    pub gaps_skipped: u64,
}

/// Decides every pending event of one save slot, applying what may apply.
///
/// `occupied` holds the sequences already decided by earlier events (a
/// `sequence_conflict` never occupies one); it must contain every such
/// sequence above `state.last_sequence` and at or above the lowest pending one.
pub fn settle_save(
    mut state: SaveState,
    mut occupied: BTreeSet<i64>,
    mut pending: Vec<PendingSave>,
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Settlement {
    pending.sort_by_key(|p| (p.event.sequence, p.row));
    let mut decisions = Vec::with_capacity(pending.len());
    let mut gaps_skipped = 0;
    advance(&mut state.last_sequence, &occupied);
    loop {
        let mut progressed = false;
        let mut held = Vec::new();
        for p in pending {
            let outcome = decide_save(&state, &occupied, &p);
            let outcome = match outcome {
                Outcome::Held => {
                    held.push(p);
                    continue;
                }
                Outcome::Applied => match state.apply(&p.event, now_ms) {
                    Ok(()) => Outcome::Applied,
                    Err((reason, detail)) => Outcome::Dead { reason, detail },
                },
                other => other,
            };
            let conflict = matches!(
                outcome,
                Outcome::Dead {
                    reason: DeadReason::SequenceConflict,
                    ..
                }
            );
            if !conflict {
                occupied.insert(p.event.sequence.get());
                advance(&mut state.last_sequence, &occupied);
            }
            decisions.push((p.row, outcome));
            progressed = true;
        }
        pending = held;
        if progressed {
            continue;
        }
        // Nothing moved: skip the gap before the oldest-waiting lowest delta once it has waited long enough.
        match pending.first() {
            Some(first) if now_ms.saturating_sub(first.received_at_ms) >= hold_timeout_ms => {
                let target = first.event.sequence.get() - 1;
                let filled = occupied.range(state.last_sequence + 1..=target).count() as i64;
                gaps_skipped += (target - state.last_sequence - filled).max(0) as u64;
                state.last_sequence = target;
                advance(&mut state.last_sequence, &occupied);
            }
            _ => break,
        }
    }
    decisions.extend(pending.into_iter().map(|p| (p.row, Outcome::Held)));
    Settlement {
        state,
        decisions,
        gaps_skipped,
    }
}

/// Moves the watermark over every contiguous decided sequence.
fn advance(watermark: &mut i64, occupied: &BTreeSet<i64>) {
    while let Some(next) = watermark.checked_add(1) {
        if !occupied.contains(&next) {
            break;
        }
        *watermark = next;
    }
}

/// Decides one save-game event without applying it.
fn decide_save(state: &SaveState, occupied: &BTreeSet<i64>, pending: &PendingSave) -> Outcome {
    let event = &pending.event;
    let seq = event.sequence;
    if occupied.contains(&seq.get()) {
        return Outcome::dead(
            DeadReason::SequenceConflict,
            format!("another event already holds sequence {seq} of this aggregate"),
        );
    }
    let newer_than = |applied: Option<Sequence>| applied.is_none_or(|a| seq > a);
    match &event.change {
        SaveChange::ProgressSaved(_) => latest_wins(newer_than(state.progress_sequence)),
        SaveChange::InventorySnapshot(_) => latest_wins(newer_than(state.inventory_sequence)),
        SaveChange::AchievementUnlocked(_) => Outcome::Applied,
        SaveChange::Unsupported => Outcome::Unsupported,
        SaveChange::InventoryUpdated { .. } => {
            if !newer_than(state.snapshot_sequence) {
                // A newer snapshot already contains this delta.
                Outcome::Stale
            } else if seq.get() <= state.last_sequence && pending.replayed {
                Outcome::Applied
            } else if seq.get() <= state.last_sequence {
                Outcome::dead(
                    DeadReason::LateAfterGapSkip,
                    format!(
                        "sequence {seq} arrived after the gap it belonged to was skipped (watermark {})",
                        state.last_sequence
                    ),
                )
            } else if seq.get() == state.last_sequence + 1 {
                Outcome::Applied
            } else {
                Outcome::Held
            }
        }
    }
}

fn latest_wins(newer: bool) -> Outcome {
    if newer {
        Outcome::Applied
    } else {
        Outcome::Stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::ItemQty;
    use crate::domain::{EventId, IdempotencyKey, Ident};
    use proptest::prelude::*;
    use serde_json::{json, Map};

    const HOLD: i64 = 30_000;

    fn event(seq: i64, change: SaveChange) -> SaveEvent {
        SaveEvent {
            event_id: EventId::parse(&format!("evt_{seq}")).unwrap(),
            event_type: Ident::parse("t").unwrap(),
            change,
            payload_version: 1,
            occurred_at: None,
            player_id: Ident::parse("p").unwrap(),
            save_slot: Ident::parse("s").unwrap(),
            sequence: Sequence::new(seq).unwrap(),
            idempotency_key: IdempotencyKey::parse(&format!("k{seq}")).unwrap(),
        }
    }

    fn delta(seq: i64, item: &str, add: i64, remove: i64) -> SaveEvent {
        let items = |qty| {
            if qty == 0 {
                vec![]
            } else {
                vec![ItemQty {
                    item_id: Ident::parse(item).unwrap(),
                    qty,
                }]
            }
        };
        event(
            seq,
            SaveChange::InventoryUpdated {
                added: items(add),
                removed: items(remove),
            },
        )
    }

    fn progress(seq: i64) -> SaveEvent {
        let mut data = Map::new();
        data.insert("chapter".into(), json!(seq));
        event(seq, SaveChange::ProgressSaved(data))
    }

    fn pending(events: Vec<SaveEvent>, received_at_ms: i64) -> Vec<PendingSave> {
        events
            .into_iter()
            .enumerate()
            .map(|(i, event)| PendingSave {
                row: i as i64,
                received_at_ms,
                event,
                replayed: false,
            })
            .collect()
    }

    /// Feeds events one at a time, as a worker would see them arrive.
    fn feed(start: SaveState, arrivals: Vec<SaveEvent>, now_ms: i64) -> (SaveState, Vec<Outcome>) {
        let mut state = start;
        let mut occupied = BTreeSet::new();
        let mut waiting: Vec<PendingSave> = Vec::new();
        let mut outcomes = Vec::new();
        for (row, event) in arrivals.into_iter().enumerate() {
            waiting.push(PendingSave {
                row: row as i64,
                received_at_ms: 0,
                event,
                replayed: false,
            });
            let seqs: Vec<(i64, i64)> = waiting
                .iter()
                .map(|p| (p.row, p.event.sequence.get()))
                .collect();
            let s = settle_save(state, occupied.clone(), waiting.clone(), now_ms, HOLD);
            state = s.state;
            waiting.retain(|p| {
                s.decisions
                    .iter()
                    .any(|(r, o)| *r == p.row && *o == Outcome::Held)
            });
            for (row, outcome) in s.decisions {
                if outcome != Outcome::Held {
                    let seq = seqs.iter().find(|(r, _)| *r == row).unwrap().1;
                    if !matches!(
                        outcome,
                        Outcome::Dead {
                            reason: DeadReason::SequenceConflict,
                            ..
                        }
                    ) {
                        occupied.insert(seq);
                    }
                    outcomes.push(outcome);
                }
            }
        }
        (state, outcomes)
    }

    #[test]
    fn a_late_progress_never_overwrites_and_deltas_apply_in_order() {
        let arrivals = vec![
            progress(185),
            progress(184),
            delta(186, "a", 1, 0),
            delta(188, "a", 0, 3),
            delta(187, "a", 2, 0),
        ];
        let (state, outcomes) = feed(SaveState::empty(184), arrivals, 0);
        assert_eq!(state.progress_sequence.map(Sequence::get), Some(185));
        assert!(state.inventory.is_empty(), "1 + 2 - 3 leaves nothing");
        assert_eq!(state.last_sequence, 188);
        assert_eq!(outcomes[1], Outcome::Stale);
        assert!(outcomes.iter().filter(|o| **o == Outcome::Applied).count() == 4);
    }

    #[test]
    fn a_held_delta_skips_its_gap_after_the_timeout_and_a_late_one_is_dead() {
        let s = settle_save(
            SaveState::empty(1),
            BTreeSet::new(),
            pending(vec![delta(3, "a", 1, 0)], 0),
            HOLD,
            HOLD,
        );
        assert_eq!(s.decisions[0].1, Outcome::Applied);
        assert_eq!(s.gaps_skipped, 2);
        assert_eq!(s.state.last_sequence, 3);
        let late = settle_save(
            s.state.clone(),
            BTreeSet::from([3]),
            pending(vec![delta(2, "a", 1, 0)], 0),
            HOLD,
            HOLD,
        );
        assert!(matches!(
            late.decisions[0].1,
            Outcome::Dead {
                reason: DeadReason::LateAfterGapSkip,
                ..
            }
        ));
        // Replayed by a person, the same delta applies.
        let mut replayed = pending(vec![delta(2, "a", 1, 0)], 0);
        replayed[0].replayed = true;
        let again = settle_save(s.state, BTreeSet::from([3]), replayed, HOLD, HOLD);
        assert_eq!(again.decisions[0].1, Outcome::Applied);
        assert_eq!(again.state.inventory.get("a"), Some(&2));
        let early = settle_save(
            SaveState::empty(1),
            BTreeSet::new(),
            pending(vec![delta(3, "a", 1, 0)], 0),
            HOLD - 1,
            HOLD,
        );
        assert_eq!(early.decisions[0].1, Outcome::Held);
    }

    #[test]
    fn a_second_event_on_a_taken_sequence_is_a_conflict() {
        let s = settle_save(
            SaveState::empty(1),
            BTreeSet::new(),
            pending(vec![delta(1, "a", 1, 0), progress(1)], 0),
            0,
            HOLD,
        );
        assert_eq!(s.decisions[0].1, Outcome::Applied);
        assert!(matches!(
            s.decisions[1].1,
            Outcome::Dead {
                reason: DeadReason::SequenceConflict,
                ..
            }
        ));
    }

    #[test]
    fn a_snapshot_makes_older_deltas_stale() {
        let snapshot = event(
            2,
            SaveChange::InventorySnapshot(vec![ItemQty {
                item_id: Ident::parse("a").unwrap(),
                qty: 5,
            }]),
        );
        let (state, outcomes) = feed(
            SaveState::empty(1),
            vec![snapshot, delta(1, "a", 1, 0), delta(3, "a", 1, 0)],
            0,
        );
        assert_eq!(outcomes[1], Outcome::Stale);
        assert_eq!(state.inventory.get("a"), Some(&6));
    }

    /// One generated event: its kind chooses the rule it follows.
    fn arb_event(seq: i64) -> impl Strategy<Value = SaveEvent> {
        prop_oneof![
            (0i64..4, 0i64..3).prop_map(move |(add, remove)| delta(seq, "gem", add, remove)),
            Just(progress(seq)),
            (0i64..6).prop_map(move |qty| event(
                seq,
                SaveChange::InventorySnapshot(vec![ItemQty {
                    item_id: Ident::parse("gem").unwrap(),
                    qty
                }])
            )),
            (0u8..3).prop_map(move |a| event(
                seq,
                SaveChange::AchievementUnlocked(Ident::parse(&format!("ach{a}")).unwrap())
            )),
            Just(event(seq, SaveChange::Unsupported)),
        ]
    }

    fn arb_stream() -> impl Strategy<Value = Vec<SaveEvent>> {
        (1usize..12).prop_flat_map(|n| (1..=n as i64).map(arb_event).collect::<Vec<_>>())
    }

    proptest! {
        /// G5: any permutation with duplicates converges to the in-order state.
        #[test]
        fn any_arrival_order_converges_to_in_order(
            (stream, order) in arb_stream().prop_flat_map(|s| {
                let n = s.len();
                (Just(s), proptest::collection::vec(0..n, n..n * 2).prop_shuffle())
            })
        ) {
            let (expected, _) = feed(SaveState::empty(1), stream.clone(), 0);
            // Every event at least once, plus duplicates, in a random order; a
            // duplicate is caught by the event log before it reaches the rules.
            let mut seen = BTreeSet::new();
            let mut arrivals = Vec::new();
            for i in order.iter().copied().chain(0..stream.len()) {
                if seen.insert(i) {
                    arrivals.push(stream[i].clone());
                }
            }
            let (state, _) = feed(SaveState::empty(1), arrivals, 0);
            prop_assert_eq!(state.inventory, expected.inventory);
            prop_assert_eq!(state.progress, expected.progress);
            prop_assert_eq!(state.achievements, expected.achievements);
            prop_assert_eq!(state.last_sequence, expected.last_sequence);
        }
    }

    fn presence_event(seq: i64, presence: crate::contract::Presence) -> PresenceEvent {
        PresenceEvent {
            event_id: EventId::parse(&format!("p{seq}")).unwrap(),
            user_id: Ident::parse("u").unwrap(),
            presence,
            sequence: Sequence::new(seq).unwrap(),
            timestamp: None,
            idempotency_key: None,
        }
    }

    proptest! {
        /// G5 for presence: any arrival order, with duplicates, ends on the highest sequence's value.
        #[test]
        fn presence_converges_to_the_last_in_order(
            values in proptest::collection::vec(0usize..4, 1..20),
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 1..40),
        ) {
            use crate::contract::Presence;
            let stream: Vec<PresenceEvent> = values
                .iter()
                .enumerate()
                .map(|(i, v)| presence_event(i as i64 + 1, Presence::ALL[*v]))
                .collect();
            let arrivals = order
                .iter()
                .map(|i| i.index(stream.len()))
                .chain(0..stream.len());
            let mut state: Option<PresenceState> = None;
            for i in arrivals {
                let event = &stream[i];
                if decide_presence(state.as_ref(), event) == Outcome::Applied {
                    state = Some(PresenceState::from_event(event, 0));
                }
            }
            let last = stream.last().unwrap();
            prop_assert_eq!(state.map(|s| (s.presence, s.sequence)), Some((last.presence, last.sequence)));
        }
    }
}
