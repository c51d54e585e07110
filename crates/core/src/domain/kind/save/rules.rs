//! The save-game rules (docs/contract.md, processing): `progress.saved` and
//! `inventory.snapshot` latest-wins per part of the slot, `inventory.updated` in order
//! (held for a gap), `achievement.unlocked` order-free; all on [`crate::domain::ordering`]'s rules.

use std::collections::BTreeSet;

use super::contract::{SaveChange, SaveEvent};
use super::projection::SaveState;
use crate::domain::ordering::{
    in_order_rule, latest_wins, settle_in_order, InOrderState, Outcome, PendingEvent, Sequenced,
    Settlement, SkippedGaps,
};
use crate::domain::{DeadReason, Sequence};

impl Sequenced for SaveEvent {
    fn sequence(&self) -> i64 {
        self.sequence.get()
    }
}

/// A save-game event waiting to be decided.
pub type PendingSave = PendingEvent<SaveEvent>;

impl InOrderState for SaveState {
    type Event = SaveEvent;

    fn watermark(&self) -> i64 {
        self.last_sequence
    }

    fn set_watermark(&mut self, watermark: i64) {
        self.last_sequence = watermark;
    }

    fn skipped_gaps_mut(&mut self) -> &mut SkippedGaps {
        &mut self.skipped_gaps
    }

    fn floor(&self) -> Option<i64> {
        self.snapshot_sequence.map(Sequence::get)
    }

    fn decide(&self, pending: &PendingSave) -> Outcome {
        decide_save(self, pending)
    }

    fn apply(&mut self, pending: &PendingSave, now_ms: i64) -> Result<(), (DeadReason, String)> {
        SaveState::apply(self, &pending.event, now_ms)
    }
}

/// Decides every pending event of one save slot, applying what may apply.
pub fn settle_save(
    state: SaveState,
    occupied: BTreeSet<i64>,
    pending: Vec<PendingSave>,
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Settlement<SaveState> {
    settle_in_order(state, occupied, pending, now_ms, hold_timeout_ms)
}

/// Decides one save-game event without applying it (its sequence is free).
fn decide_save(state: &SaveState, pending: &PendingSave) -> Outcome {
    let event = &pending.event;
    let seq = event.sequence;
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
            } else {
                in_order_rule(
                    state.last_sequence,
                    seq.get(),
                    pending.replayed,
                    &state.skipped_gaps,
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::kind::save::ItemQty;
    use crate::domain::ordering::{
        final_at_ingest, held_in_reach, held_left_out, ready_at_ingest, HeldRef,
    };
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

    #[test]
    fn skipped_gaps_tell_late_from_resent_and_forget_the_oldest() {
        let mut gaps = SkippedGaps::from_stored(None, 4);
        assert_eq!(
            gaps.skipped(4),
            None,
            "below the first record nothing is known"
        );
        gaps.record(5, 7);
        assert_eq!(
            (gaps.skipped(6), gaps.skipped(8)),
            (Some(true), Some(false))
        );
        let stored = SkippedGaps::from_stored(Some(&gaps.to_stored()), 99);
        assert_eq!(stored, gaps);
        assert_eq!(
            SkippedGaps::from_stored(Some("not json"), 9).skipped(9),
            None
        );
        for n in 0..crate::domain::ordering::MOST_SKIPPED_GAPS as i64 {
            gaps.record(10 + 2 * n, 10 + 2 * n);
        }
        assert_eq!(gaps.skipped(6), None, "the oldest gap was forgotten");
        assert_eq!(gaps.skipped(11), Some(false));
        assert_eq!(gaps.skipped(10 + 2 * 31), Some(true));
        let watermark = 100;
        assert_eq!(in_order_rule(watermark, 11, false, &gaps), Outcome::Stale);
        assert_eq!(
            in_order_rule(watermark, 11, true, &gaps),
            Outcome::Applied,
            "a person replayed it"
        );
        assert!(matches!(
            in_order_rule(watermark, 12, false, &gaps),
            Outcome::Dead {
                reason: DeadReason::LateAfterGapSkip,
                ..
            }
        ));
        assert_eq!(in_order_rule(watermark, 12, true, &gaps), Outcome::Applied);
        assert!(matches!(
            in_order_rule(watermark, 6, false, &gaps),
            Outcome::Dead { .. }
        ));
    }

    proptest! {
        /// Deltas resent after their log rows (and so their occupied sequences) are gone
        /// never change the inventory: each is stale, or dead when its gap was skipped.
        #[test]
        fn deltas_resent_after_their_purge_are_never_applied_twice(
            present in proptest::collection::vec(any::<bool>(), 1..16),
            resent in proptest::collection::vec(any::<proptest::sample::Index>(), 1..16),
        ) {
            let deltas: Vec<SaveEvent> = present
                .iter()
                .enumerate()
                .filter(|(_, here)| **here)
                .map(|(i, _)| delta(i as i64 + 1, "gem", 1, 0))
                .collect();
            prop_assume!(!deltas.is_empty());
            // Every gap is skipped at once (they have all waited past the hold timeout).
            let first = settle_save(SaveState::empty(1), BTreeSet::new(), pending(deltas.clone(), 0), HOLD, HOLD);
            let before = first.state.clone();
            prop_assert_eq!(before.inventory.get("gem").copied(), Some(deltas.len() as i64));
            // Each once: the event log answers a second copy as a duplicate itself.
            let picked: BTreeSet<usize> = resent.iter().map(|i| i.index(deltas.len())).collect();
            let again: Vec<SaveEvent> = picked.into_iter().map(|i| deltas[i].clone()).collect();
            let later = settle_save(first.state, BTreeSet::new(), pending(again, 2 * HOLD), 2 * HOLD, HOLD);
            prop_assert_eq!(&later.state.inventory, &before.inventory);
            prop_assert!(later.decisions.iter().all(|(_, o)| *o == Outcome::Stale));
            // A skipped sequence arriving late is still dead.
            if let Some(missing) = present.iter().position(|here| !here) {
                let late = settle_save(later.state, BTreeSet::new(), pending(vec![delta(missing as i64 + 1, "gem", 1, 0)], 0), 0, HOLD);
                let late_dead = matches!(late.decisions[0].1, Outcome::Dead { reason: DeadReason::LateAfterGapSkip, .. });
                let beyond = missing as i64 + 1 > before.last_sequence;
                prop_assert!(late_dead || beyond, "{:?}", late.decisions);
            }
        }
    }

    /// Settles as the stores do: only the held events in reach, then whatever the
    /// result says was left out, until nothing is. Unread held events stay held.
    fn settle_in_reach(
        state: SaveState,
        occupied: &BTreeSet<i64>,
        arriving: Vec<PendingSave>,
        held: Vec<PendingSave>,
        now_ms: i64,
    ) -> (Settlement<SaveState>, usize) {
        let mut refs: Vec<HeldRef> = held
            .iter()
            .map(|p| HeldRef {
                sequence: p.event.sequence.get(),
                row: p.row,
                received_at_ms: p.received_at_ms,
            })
            .collect();
        refs.sort();
        let arriving_seqs: Vec<i64> = arriving.iter().map(|p| p.event.sequence.get()).collect();
        let take = held_in_reach(
            state.last_sequence,
            occupied,
            &arriving_seqs,
            &refs,
            now_ms,
            HOLD,
        );
        let mut loaded: Vec<HeldRef> = refs[..take].to_vec();
        loop {
            let mut pending = arriving.clone();
            pending.extend(
                held.iter()
                    .filter(|p| loaded.iter().any(|h| h.row == p.row))
                    .cloned(),
            );
            let seq_of = |row: i64| {
                pending
                    .iter()
                    .find(|p| p.row == row)
                    .map(|p| p.event.sequence.get())
                    .unwrap()
            };
            let settled = settle_save(
                state.clone(),
                occupied.clone(),
                pending.clone(),
                now_ms,
                HOLD,
            );
            let mut decided = occupied.clone();
            let mut lowest_held = None;
            for (row, outcome) in &settled.decisions {
                match outcome {
                    Outcome::Held => {
                        let key = (seq_of(*row), *row);
                        lowest_held = Some(lowest_held.map_or(key, |low: (i64, i64)| low.min(key)));
                    }
                    Outcome::Dead {
                        reason: DeadReason::SequenceConflict,
                        ..
                    } => {}
                    _ => {
                        decided.insert(seq_of(*row));
                    }
                }
            }
            let left_out: Vec<HeldRef> = refs
                .iter()
                .filter(|h| !loaded.contains(h))
                .copied()
                .collect();
            let missing = held_left_out(
                &settled.state,
                &decided,
                lowest_held,
                &left_out,
                now_ms,
                HOLD,
            );
            if missing.is_empty() {
                return (settled, loaded.len());
            }
            loaded.extend(missing);
        }
    }

    proptest! {
        /// Reading only the held events in reach decides exactly what reading them all does.
        #[test]
        fn settling_the_held_events_in_reach_equals_settling_them_all(
            stream in arb_stream(),
            split in proptest::collection::vec((0u8..3, any::<bool>(), 0u8..4), 12),
            start in 0i64..3,
        ) {
            let now = 100_000;
            let mut arriving = Vec::new();
            let mut held = Vec::new();
            for (i, event) in stream.into_iter().enumerate() {
                // Some sequences never arrive, so that gaps wait and time out.
                let (place, old, missing) = split[i];
                if missing == 0 {
                    continue;
                }
                let is_held = place > 0;
                let p = PendingSave {
                    row: i as i64,
                    received_at_ms: if old { 0 } else { now },
                    replayed: false,
                    event,
                };
                let delta = matches!(p.event.change, SaveChange::InventoryUpdated { .. });
                if is_held && delta { held.push(p) } else { arriving.push(p) }
            }
            let state = SaveState::empty(1 + start);
            let occupied = BTreeSet::new();
            let mut all = arriving.clone();
            all.extend(held.clone());
            let full = settle_save(state.clone(), occupied.clone(), all, now, HOLD);
            let (partial, _) = settle_in_reach(state, &occupied, arriving, held.clone(), now);
            let mut expected = full.decisions.clone();
            expected.sort_by_key(|(row, _)| *row);
            let mut got = partial.decisions.clone();
            got.extend(
                held.iter()
                    .filter(|p| !partial.decisions.iter().any(|(r, _)| *r == p.row))
                    .map(|p| (p.row, Outcome::Held)),
            );
            got.sort_by_key(|(row, _)| *row);
            prop_assert_eq!(got, expected);
            prop_assert_eq!(partial.state, full.state);
            prop_assert_eq!(partial.gaps_skipped, full.gaps_skipped);
        }
    }

    /// An aggregate as the store keeps it: its state, the sequences decided, and the
    /// rows still undecided (`true`: held).
    struct Slot {
        state: SaveState,
        occupied: BTreeSet<i64>,
        undecided: Vec<(PendingSave, bool)>,
        at_ingest: usize,
    }

    impl Slot {
        fn empty() -> Self {
            Self {
                state: SaveState::empty(1),
                occupied: BTreeSet::new(),
                undecided: Vec::new(),
                at_ingest: 0,
            }
        }

        /// Writes a settlement of `pending`: decided rows leave, held ones stay held.
        fn write(&mut self, settled: Settlement<SaveState>, pending: Vec<PendingSave>) {
            self.state = settled.state;
            self.undecided
                .retain(|(p, _)| !pending.iter().any(|q| q.row == p.row));
            for (row, outcome) in settled.decisions {
                let p = pending.iter().find(|p| p.row == row).unwrap().clone();
                match outcome {
                    Outcome::Held => self.undecided.push((p, true)),
                    Outcome::Dead {
                        reason: DeadReason::SequenceConflict,
                        ..
                    } => {}
                    _ => {
                        self.occupied.insert(p.event.sequence.get());
                    }
                }
            }
        }

        /// The worker's step: settles every undecided row.
        fn worker(&mut self) {
            let pending: Vec<PendingSave> = self.undecided.iter().map(|(p, _)| p.clone()).collect();
            let settled = settle_save(
                self.state.clone(),
                self.occupied.clone(),
                pending.clone(),
                0,
                HOLD,
            );
            self.write(settled, pending);
        }

        /// Ingest: logs `new`, and settles it there when the aggregate is ready, as the
        /// store's flow does ([`ready_at_ingest`], [`final_at_ingest`]); else leaves it received.
        fn ingest(&mut self, new: PendingSave) {
            let mut arriving: Vec<PendingSave> = self
                .undecided
                .iter()
                .filter(|(_, held)| !held)
                .map(|(p, _)| p.clone())
                .collect();
            arriving.push(new.clone());
            let mut held: Vec<HeldRef> = self
                .undecided
                .iter()
                .filter(|(_, held)| *held)
                .map(|(p, _)| HeldRef {
                    sequence: p.event.sequence.get(),
                    row: p.row,
                    received_at_ms: p.received_at_ms,
                })
                .collect();
            held.sort();
            let seqs: Vec<i64> = arriving.iter().map(|p| p.event.sequence.get()).collect();
            let rows: Vec<i64> = arriving.iter().map(|p| p.row).collect();
            let reach = held_in_reach(
                self.state.last_sequence,
                &self.occupied,
                &seqs,
                &held,
                0,
                HOLD,
            );
            if ready_at_ingest(&rows, reach, &[new.row]) {
                // The store settles the aggregate's arriving rows: here only `new`.
                let settled = settle_save(
                    self.state.clone(),
                    self.occupied.clone(),
                    arriving.clone(),
                    0,
                    HOLD,
                );
                if final_at_ingest(&settled.decisions, settled.gaps_skipped, &[new.row]) {
                    self.write(settled, arriving);
                    self.at_ingest += 1;
                    return;
                }
            }
            self.undecided.push((new, false));
        }
    }

    proptest! {
        /// Deciding the ready events at ingest and the rest in the worker, in any
        /// interleaving of arrivals and worker steps, ends on the state the worker alone
        /// reaches: the in-order one.
        #[test]
        fn deciding_ready_events_at_ingest_converges_like_the_worker_alone(
            (stream, order) in arb_stream().prop_flat_map(|s| {
                let n = s.len();
                (Just(s), proptest::collection::vec(0..n, n..n * 2).prop_shuffle())
            }),
            steps in proptest::collection::vec((any::<bool>(), any::<bool>()), 24),
        ) {
            let (expected, _) = feed(SaveState::empty(1), stream.clone(), 0);
            let mut seen = BTreeSet::new();
            let arrivals: Vec<usize> = order
                .iter()
                .copied()
                .chain(0..stream.len())
                .filter(|i| seen.insert(*i))
                .collect();
            let mut slot = Slot::empty();
            for (row, i) in arrivals.iter().enumerate() {
                let (ingest_decides, worker_runs) = steps[row % steps.len()];
                let new = PendingSave {
                    row: row as i64,
                    received_at_ms: 0,
                    event: stream[*i].clone(),
                    replayed: false,
                };
                if ingest_decides {
                    slot.ingest(new);
                } else {
                    slot.undecided.push((new, false));
                }
                if worker_runs {
                    slot.worker();
                }
            }
            slot.worker();
            prop_assert!(slot.undecided.is_empty(), "left undecided: {}", slot.undecided.len());
            prop_assert_eq!(slot.state.inventory, expected.inventory);
            prop_assert_eq!(slot.state.progress, expected.progress);
            prop_assert_eq!(slot.state.achievements, expected.achievements);
            prop_assert_eq!(slot.state.last_sequence, expected.last_sequence);
        }
    }

    #[test]
    fn an_in_order_stream_is_decided_at_ingest_and_a_gap_is_left_to_the_worker() {
        let mut slot = Slot::empty();
        for (row, seq) in [1, 2, 4, 3].into_iter().enumerate() {
            slot.ingest(PendingSave {
                row: row as i64,
                received_at_ms: 0,
                event: delta(seq, "gem", 1, 0),
                replayed: false,
            });
        }
        // 1 and 2 at ingest; 4 waits for its gap, received; 3 finds 4 pending: the worker's.
        assert_eq!(slot.at_ingest, 2);
        assert_eq!(slot.undecided.len(), 2);
        assert_eq!(slot.state.last_sequence, 2);
        slot.worker();
        assert_eq!(slot.state.last_sequence, 4);
        assert!(slot.undecided.is_empty());
    }

    #[test]
    fn a_far_arrival_reads_one_held_event_and_a_filled_gap_reads_the_run() {
        let now = 1_000;
        let held: Vec<PendingSave> = (3..=600)
            .map(|seq| PendingSave {
                row: seq,
                received_at_ms: now,
                event: delta(seq, "gem", 1, 0),
                replayed: false,
            })
            .collect();
        let far = pending(vec![delta(700, "gem", 1, 0)], now)
            .into_iter()
            .map(|p| PendingSave { row: 700, ..p })
            .collect();
        let (settled, read) = settle_in_reach(
            SaveState::empty(1),
            &BTreeSet::new(),
            far,
            held.clone(),
            now,
        );
        assert_eq!(read, 1, "only the lowest held event decides anything");
        assert_eq!(settled.state.last_sequence, 0);
        let fill = pending(vec![delta(1, "gem", 1, 0), delta(2, "gem", 1, 0)], now)
            .into_iter()
            .enumerate()
            .map(|(i, p)| PendingSave {
                row: 1000 + i as i64,
                ..p
            })
            .collect();
        let (settled, read) =
            settle_in_reach(SaveState::empty(1), &BTreeSet::new(), fill, held, now);
        assert_eq!(read, 598, "the whole run becomes applicable");
        assert_eq!(settled.state.last_sequence, 600);
    }
}
