//! Ordering rules (docs/contract.md, processing) as pure functions: given an aggregate's state and
//! the events waiting for it, decide each event (apply, stale, hold, dead) and
//! return the new state. The stores load and save; these functions decide.
//!
//! - latest-wins: applies
//!   when newer than the component's last applied sequence, else stale.
//! - in-order: applies only when every lower sequence
//!   of the aggregate is decided; held otherwise, until `hold_timeout` skips
//!   the gap.
//! - order-free: applies once, whenever it arrives.

//!
//! Each kind maps its events onto these rules.

use std::collections::BTreeSet;

use crate::domain::DeadReason;

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
    /// A dead outcome with its reason and detail.
    pub fn dead(reason: DeadReason, detail: impl Into<String>) -> Self {
        Outcome::Dead {
            reason,
            detail: detail.into(),
        }
    }
}

/// What the in-order rules need of an event: its sequence in the aggregate.
pub trait Sequenced {
    /// The event's sequence.
    fn sequence(&self) -> i64;
}

/// An event of an in-order aggregate waiting to be decided.
#[derive(Debug, Clone)]
pub struct PendingEvent<E> {
    /// The event log row it came from.
    pub row: i64,
    /// When it was received, unix milliseconds (hold timeouts count from here).
    pub received_at_ms: i64,
    /// The parsed event.
    pub event: E,
    /// Whether a person replayed it: a replayed delta whose slot is free applies
    /// even below the watermark, since a person asked for exactly that.
    pub replayed: bool,
}

/// The state of an aggregate whose events may wait for lower sequences (save slots,
/// `json` in-order sources): what [`settle_in_order`] reads and changes.
pub trait InOrderState: Clone {
    /// The kind's parsed event.
    type Event: Sequenced;
    /// Highest sequence up to which every event was received and decided (or skipped).
    fn watermark(&self) -> i64;
    /// Moves the watermark.
    fn set_watermark(&mut self, watermark: i64);
    /// The gaps skipped so far, which the watermark moved over.
    fn skipped_gaps_mut(&mut self) -> &mut SkippedGaps;
    /// A sequence at or below which a held event is decided without waiting (a save
    /// slot's snapshot makes older deltas stale).
    fn floor(&self) -> Option<i64> {
        None
    }
    /// Decides one event whose sequence no other event holds, without applying it.
    fn decide(&self, pending: &PendingEvent<Self::Event>) -> Outcome;
    /// Applies an event [`InOrderState::decide`] let through, or says why it cannot
    /// apply; on error the state is unchanged.
    fn apply(
        &mut self,
        pending: &PendingEvent<Self::Event>,
        now_ms: i64,
    ) -> Result<(), (DeadReason, String)>;
}

/// The rule of an in-order event against the watermark (docs/contract.md, in-order): the
/// next sequence applies, a later one waits. An earlier one applies when a person replayed
/// it (a dead event of a sequence no other event holds); otherwise it was decided before
/// (stale: a resend whose dedup key was purged) or came after its gap was skipped (dead);
/// where `gaps` cannot tell, it counts as late.
pub fn in_order_rule(watermark: i64, sequence: i64, replayed: bool, gaps: &SkippedGaps) -> Outcome {
    if sequence <= watermark && replayed {
        Outcome::Applied
    } else if sequence <= watermark && gaps.skipped(sequence) == Some(false) {
        Outcome::Stale
    } else if sequence <= watermark {
        Outcome::dead(
            DeadReason::LateAfterGapSkip,
            format!(
                "sequence {sequence} arrived after the gap it belonged to was skipped (watermark {watermark})"
            ),
        )
    } else if sequence == watermark + 1 {
        Outcome::Applied
    } else {
        Outcome::Held
    }
}

/// The result of settling one aggregate.
#[derive(Debug, Clone)]
pub struct Settlement<S> {
    /// The aggregate's new state.
    pub state: S,
    /// Every pending event's outcome, in the order decided; held events last.
    pub decisions: Vec<(i64, Outcome)>,
    /// How many missing sequences a hold timeout skipped.
    pub gaps_skipped: u64,
}

/// Decides every pending event of one in-order aggregate, applying what may apply.
///
/// `occupied` holds the sequences already decided by earlier events (a
/// `sequence_conflict` never occupies one); it must contain every such
/// sequence above the watermark and at or above the lowest pending one.
pub fn settle_in_order<S: InOrderState>(
    mut state: S,
    mut occupied: BTreeSet<i64>,
    mut pending: Vec<PendingEvent<S::Event>>,
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Settlement<S> {
    pending.sort_by_key(|p| (p.event.sequence(), p.row));
    let mut decisions = Vec::with_capacity(pending.len());
    let mut gaps_skipped = 0;
    let raise = |state: &mut S, occupied: &BTreeSet<i64>| {
        let mut watermark = state.watermark();
        advance(&mut watermark, occupied);
        state.set_watermark(watermark);
    };
    raise(&mut state, &occupied);
    loop {
        let mut progressed = false;
        let mut held = Vec::new();
        for p in pending {
            let sequence = p.event.sequence();
            let outcome = if occupied.contains(&sequence) {
                Outcome::dead(
                    DeadReason::SequenceConflict,
                    format!("another event already holds sequence {sequence} of this aggregate"),
                )
            } else {
                state.decide(&p)
            };
            let outcome = match outcome {
                Outcome::Held => {
                    held.push(p);
                    continue;
                }
                Outcome::Applied => match state.apply(&p, now_ms) {
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
                occupied.insert(sequence);
                raise(&mut state, &occupied);
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
                let target = first.event.sequence() - 1;
                let watermark = state.watermark();
                let filled = occupied.range(watermark + 1..=target).count() as i64;
                gaps_skipped += (target - watermark - filled).max(0) as u64;
                state.skipped_gaps_mut().record(watermark + 1, target);
                state.set_watermark(target);
                raise(&mut state, &occupied);
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

/// A held event as the held-event selection sees it: no body, nothing parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldRef {
    /// Its sequence (first, so that refs sort as [`settle_in_order`] orders events).
    pub sequence: i64,
    /// The event log row.
    pub row: i64,
    /// When it was received, unix milliseconds.
    pub received_at_ms: i64,
}

/// How many of the `held` events (sorted) a settle step must see: the contiguous run the
/// watermark can reach, counting every `arriving` sequence as decided, plus each gap a hold
/// timeout skips, plus the lowest one still waiting (it decides whether a gap is skipped).
/// Held events past it wait whatever the step decides, so their bodies stay unread.
pub fn held_in_reach(
    last_sequence: i64,
    occupied: &BTreeSet<i64>,
    arriving: &[i64],
    held: &[HeldRef],
    now_ms: i64,
    hold_timeout_ms: i64,
) -> usize {
    let mut occupied = occupied.clone();
    occupied.extend(arriving.iter().copied());
    let mut watermark = last_sequence;
    advance(&mut watermark, &occupied);
    let mut taken = 0;
    loop {
        while let Some(next) = held.get(taken).filter(|h| h.sequence <= watermark + 1) {
            occupied.insert(next.sequence);
            advance(&mut watermark, &occupied);
            taken += 1;
        }
        let Some(next) = held.get(taken) else {
            return taken;
        };
        taken += 1;
        if now_ms.saturating_sub(next.received_at_ms) < hold_timeout_ms {
            return taken;
        }
        watermark = watermark.max(next.sequence - 1);
        occupied.insert(next.sequence);
        advance(&mut watermark, &occupied);
    }
}

/// The held events a settle step left out that its result would have decided: at or
/// below the new watermark or snapshot, on a sequence now taken, or the lowest one left
/// out when a gap before it may be skipped. Empty means the step is exactly what settling
/// with every held event would have done.
///
/// `decided` holds the sequences the step's non-held, non-conflicting decisions took (and
/// those taken before); `lowest_held` is the lowest `(sequence, row)` the step left held.
pub fn held_left_out<S: InOrderState>(
    state: &S,
    decided: &BTreeSet<i64>,
    lowest_held: Option<(i64, i64)>,
    left_out: &[HeldRef],
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Vec<HeldRef> {
    let reach = (state.watermark(), state.floor());
    held_left_out_at(
        reach,
        decided,
        lowest_held,
        left_out,
        now_ms,
        hold_timeout_ms,
    )
}

/// [`held_left_out`] for a state known by its `(watermark, floor)`.
pub fn held_left_out_at(
    (watermark, floor): (i64, Option<i64>),
    decided: &BTreeSet<i64>,
    lowest_held: Option<(i64, i64)>,
    left_out: &[HeldRef],
    now_ms: i64,
    hold_timeout_ms: i64,
) -> Vec<HeldRef> {
    let reach = watermark.saturating_add(1).max(floor.unwrap_or(i64::MIN));
    let mut missing: Vec<HeldRef> = left_out
        .iter()
        .filter(|h| h.sequence <= reach || decided.contains(&h.sequence))
        .copied()
        .collect();
    let lowest_left = left_out.iter().filter(|h| !missing.contains(h)).min();
    if let Some(first) = lowest_left {
        let behind_a_held = lowest_held.is_some_and(|low| low < (first.sequence, first.row));
        let due = now_ms.saturating_sub(first.received_at_ms) >= hold_timeout_ms;
        if due && !behind_a_held {
            missing.push(*first);
        }
    }
    missing
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

/// The latest-wins rule: an event newer than the part of the state it sets applies, any
/// other is stale.
pub fn latest_wins(newer: bool) -> Outcome {
    if newer {
        Outcome::Applied
    } else {
        Outcome::Stale
    }
}

/// Whether an aggregate may be settled inside the ingest transaction that logged
/// `fresh`: its pending rows are only those, and no held event is in
/// reach. A backlog, a retry or a hold is left to the worker.
pub fn ready_at_ingest(pending: &[i64], held_in_reach: usize, fresh: &[i64]) -> bool {
    held_in_reach == 0 && !pending.is_empty() && pending.iter().all(|row| fresh.contains(row))
}

/// Whether a plan made at ingest may be written there: it decides every `fresh` row,
/// each one applied, stale or unsupported, and skips no gap. A hold, a dead event
/// (a failing apply, a sequence conflict) or a skipped gap is left to the worker.
pub fn final_at_ingest(decisions: &[(i64, Outcome)], gaps_skipped: u64, fresh: &[i64]) -> bool {
    let simple = |outcome: &Outcome| {
        matches!(
            outcome,
            Outcome::Applied | Outcome::Stale | Outcome::Unsupported
        )
    };
    gaps_skipped == 0
        && decisions.iter().all(|(_, outcome)| simple(outcome))
        && fresh
            .iter()
            .all(|row| decisions.iter().any(|(decided, _)| decided == row))
}

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
