//! Reading an in-order aggregate's held events only as far as settling needs them: the
//! store loads the rows [`HeldReach`] names and settles again until nothing is missing.

use std::collections::{BTreeSet, HashMap, HashSet};

use super::{Kind, KindPlan, SettleInput};
use crate::domain::ordering::{held_in_reach, held_left_out_at, HeldRef, Outcome};
use crate::domain::DeadReason;

/// The held events of an in-order aggregate, read only as far as settling needs them:
/// an aggregate may hold many, and reading and parsing every held body on each arrival
/// made the cost of an arrival grow with the number held.
pub struct HeldReach<'a> {
    held: &'a [HeldRef],
    loaded: HashSet<i64>,
}

impl<'a> HeldReach<'a> {
    /// The lowest sequence whose decided state settling needs: that of the arriving and
    /// held events, or the next one expected if lower.
    pub fn occupied_from(arriving: &[i64], held: &[HeldRef], watermark: i64) -> i64 {
        arriving
            .iter()
            .chain(held.iter().map(|h| &h.sequence))
            .copied()
            .min()
            .unwrap_or(i64::MAX)
            .min(watermark.saturating_add(1))
    }

    /// Starts with the held events whose turn may come; returns them, to be read.
    pub fn start(
        held: &'a [HeldRef],
        watermark: i64,
        occupied: &BTreeSet<i64>,
        arriving: &[i64],
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> (Self, &'a [HeldRef]) {
        let reach = held_in_reach(watermark, occupied, arriving, held, now_ms, hold_timeout_ms);
        let first = &held[..reach];
        let loaded = first.iter().map(|h| h.row).collect();
        (Self { held, loaded }, first)
    }

    /// Settles with the rows read so far: the plan, or the held events it turns out
    /// would be decided too, to be read and added to the rows before settling again.
    pub fn settle(
        &mut self,
        kind: &dyn Kind,
        input: &SettleInput<'_>,
    ) -> Result<KindPlan, Vec<HeldRef>> {
        let plan = kind.settle(input);
        let sequences: HashMap<i64, i64> = input.rows.iter().map(|r| (r.row, r.sequence)).collect();
        let (taken, lowest_held) = taken(&plan, input.occupied, &sequences);
        let left_out: Vec<HeldRef> = self
            .held
            .iter()
            .filter(|h| !self.loaded.contains(&h.row))
            .copied()
            .collect();
        let reach = plan.reach.unwrap_or((i64::MAX, None));
        let missing = held_left_out_at(
            reach,
            &taken,
            lowest_held,
            &left_out,
            input.now_ms,
            input.hold_timeout_ms,
        );
        if missing.is_empty() {
            return Ok(plan);
        }
        self.loaded.extend(missing.iter().map(|h| h.row));
        Err(missing)
    }
}

/// The sequences taken once `plan` is written (`occupied` plus every decision but a
/// conflict), and the lowest `(sequence, row)` it leaves held: what
/// [`held_left_out`](crate::domain::ordering::held_left_out) needs.
fn taken(
    plan: &KindPlan,
    occupied: &BTreeSet<i64>,
    sequences: &HashMap<i64, i64>,
) -> (BTreeSet<i64>, Option<(i64, i64)>) {
    let mut taken = occupied.clone();
    let mut lowest_held: Option<(i64, i64)> = None;
    for (row, outcome) in &plan.decisions {
        let Some(sequence) = sequences.get(row).copied() else {
            continue;
        };
        match outcome {
            Outcome::Held => {
                let key = (sequence, *row);
                lowest_held = Some(lowest_held.map_or(key, |low| low.min(key)));
            }
            Outcome::Dead {
                reason: DeadReason::SequenceConflict,
                ..
            } => {}
            _ => {
                taken.insert(sequence);
            }
        }
    }
    (taken, lowest_held)
}
