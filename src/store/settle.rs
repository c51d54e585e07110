//! The store-independent half of settling an aggregate: parse the pending
//! rows, run the ordering rules, and say what to write. Each store only
//! loads the inputs and writes the plan, inside its own transaction.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde_json::json;

use super::{Decided, DecisionLine, SettleReport, StoreError};
use crate::contract::{Event, SourceKind};
use crate::domain::AggregateKey;
use crate::domain::DeadReason;
use crate::ordering::{
    decide_presence, held_in_reach, held_left_out, settle_save, HeldRef, Outcome, PendingSave,
};
use crate::projection::{presence_view, save_view, PresenceState, SaveState};

/// A pending event row as loaded from the log.
#[derive(Debug, Clone)]
pub(crate) struct PendingRow {
    /// The log row id.
    pub row: i64,
    /// The logged event_id: a body without one got it from its delivery's header.
    pub event_id: String,
    /// The raw body.
    pub body: Vec<u8>,
    /// Time of receipt, unix milliseconds.
    pub received_at_ms: i64,
    /// Whether a person replayed it.
    pub replayed: bool,
    /// Whether it was already held before this step.
    pub was_held: bool,
}

/// The pending events of one aggregate, parsed.
pub(crate) struct Pending {
    parsed: Vec<(PendingRow, Event)>,
    invalid: Vec<(i64, Outcome)>,
    /// What the report needs of every row.
    rows: Vec<RowInfo>,
}

/// What the report says of one row.
struct RowInfo {
    row: i64,
    received_at_ms: i64,
    was_held: bool,
    event_id: String,
    idempotency_key: Option<String>,
    sequence: Option<i64>,
}

/// What settling decided, for the store to write.
pub(crate) struct Plan<S> {
    /// The aggregate's state afterwards.
    pub state: S,
    /// Whether the state differs from the one loaded.
    pub changed: bool,
    /// Every pending row's outcome.
    pub decisions: Vec<(i64, Outcome)>,
    /// Counts for logs and metrics.
    pub report: SettleReport,
    /// The aggregate's current sequence afterwards.
    pub current_sequence: Option<i64>,
    /// The new state for the change stream, when it changed: `(kind, API-shaped state)`.
    pub change: Option<(&'static str, serde_json::Value)>,
}

impl Pending {
    /// Parses each row's body with the source's contract; a body that no longer
    /// parses is dead with `invalid_for_projection`.
    pub fn parse(kind: SourceKind, rows: Vec<PendingRow>) -> Self {
        let mut parsed = Vec::with_capacity(rows.len());
        let mut invalid = Vec::new();
        let mut seen = Vec::with_capacity(rows.len());
        for row in rows {
            let parsed_event = Event::parse_with_fallback(kind, &row.body, Some(&row.event_id));
            seen.push(RowInfo {
                row: row.row,
                received_at_ms: row.received_at_ms,
                was_held: row.was_held,
                event_id: row.event_id.clone(),
                idempotency_key: parsed_event
                    .as_ref()
                    .ok()
                    .and_then(|e| e.idempotency_key().map(|k| k.as_str().to_owned())),
                sequence: parsed_event.as_ref().ok().map(|e| e.sequence().get()),
            });
            match parsed_event {
                Ok(event) => parsed.push((row, event)),
                Err(err) => invalid.push((
                    row.row,
                    Outcome::Dead {
                        reason: DeadReason::InvalidForProjection,
                        detail: format!("stored body no longer follows the contract: {err}"),
                    },
                )),
            }
        }
        Self {
            parsed,
            invalid,
            rows: seen,
        }
    }

    /// `(row, sequence)` of every row whose body parsed.
    pub fn sequences(&self) -> HashMap<i64, i64> {
        self.parsed
            .iter()
            .map(|(row, e)| (row.row, e.sequence().get()))
            .collect()
    }

    /// Settles a presence aggregate (latest-wins).
    pub fn settle_presence(
        self,
        user_id: &str,
        before: Option<PresenceState>,
        now_ms: i64,
    ) -> Result<Plan<Option<PresenceState>>, StoreError> {
        let rows = self.rows;
        let mut parsed = self.parsed;
        parsed.sort_by_key(|(row, e)| (e.sequence(), row.row));
        let mut state = before.clone();
        let mut decisions = self.invalid;
        for (row, event) in parsed {
            let Event::Presence(event) = event else {
                return Err(StoreError::Internal(
                    "save event in a presence source".into(),
                ));
            };
            let outcome = decide_presence(state.as_ref(), &event);
            if outcome == Outcome::Applied {
                state = Some(PresenceState::from_event(&event, now_ms));
            }
            decisions.push((row.row, outcome));
        }
        let current_sequence = state.as_ref().map(|s| s.sequence.get());
        let changed = state != before;
        let change = state.as_ref().filter(|_| changed).map(|s| {
            (
                "presence",
                json!(presence_view(user_id, s, now_ms, i64::MAX)),
            )
        });
        let mut plan = plan(
            &rows,
            state,
            changed,
            decisions,
            0,
            now_ms,
            current_sequence,
        );
        plan.change = change;
        Ok(plan)
    }

    /// Settles a save slot: `occupied` must hold the decided sequences from [`HeldReach::occupied_from`] on.
    pub fn settle_save(
        self,
        aggregate: &str,
        before: SaveState,
        occupied: BTreeSet<i64>,
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> Plan<SaveState> {
        let rows = self.rows;
        let pending = self
            .parsed
            .into_iter()
            .filter_map(|(row, event)| match event {
                Event::Save(event) => Some(PendingSave {
                    row: row.row,
                    received_at_ms: row.received_at_ms,
                    event,
                    replayed: row.replayed,
                }),
                Event::Presence(_) => None,
            })
            .collect();
        let settlement = settle_save(before.clone(), occupied, pending, now_ms, hold_timeout_ms);
        let mut decisions = self.invalid;
        decisions.extend(settlement.decisions);
        let current = Some(settlement.state.last_sequence);
        let changed = settlement.state != before;
        let change = match AggregateKey::from_storage_key(aggregate) {
            Some(AggregateKey::SaveSlot {
                player_id,
                save_slot,
            }) if changed => Some((
                "save",
                json!(save_view(
                    player_id.as_str(),
                    save_slot.as_str(),
                    &settlement.state
                )),
            )),
            _ => None,
        };
        let mut plan = plan(
            &rows,
            settlement.state,
            changed,
            decisions,
            settlement.gaps_skipped,
            now_ms,
            current,
        );
        plan.change = change;
        plan
    }
}

fn plan<S>(
    rows: &[RowInfo],
    state: S,
    changed: bool,
    decisions: Vec<(i64, Outcome)>,
    gaps_skipped: u64,
    now_ms: i64,
    current_sequence: Option<i64>,
) -> Plan<S> {
    let mut report = SettleReport {
        gaps_skipped,
        ..SettleReport::default()
    };
    for (row, outcome) in &decisions {
        let info = rows.iter().find(|r| r.row == *row);
        let (received_at_ms, was_held) =
            info.map_or((now_ms, false), |r| (r.received_at_ms, r.was_held));
        if let Some(info) = info.filter(|_| !(was_held && *outcome == Outcome::Held)) {
            report.decided.push(DecisionLine {
                event_id: info.event_id.clone(),
                idempotency_key: info.idempotency_key.clone(),
                sequence: info.sequence,
                decision: super::status_of(outcome).0,
            });
        }
        match outcome {
            Outcome::Held => {
                report.held += 1;
                report.newly_held += u64::from(!was_held);
                continue;
            }
            Outcome::Applied => report.applied += 1,
            Outcome::Stale => report.stale += 1,
            Outcome::Unsupported => report.unsupported += 1,
            Outcome::Dead { reason, .. } => report.dead.push(*reason),
        }
        report.lags_ms.push(now_ms.saturating_sub(received_at_ms));
    }
    Plan {
        state,
        changed,
        decisions,
        report,
        current_sequence,
        change: None,
    }
}

impl Plan<SaveState> {
    /// The sequences taken once this plan is written (`occupied` plus every decision but
    /// a conflict), and the lowest `(sequence, row)` it leaves held: what
    /// [`crate::ordering::held_left_out`] needs. `sequences` maps rows to their sequences.
    pub fn taken(
        &self,
        occupied: &BTreeSet<i64>,
        sequences: &HashMap<i64, i64>,
    ) -> (BTreeSet<i64>, Option<(i64, i64)>) {
        let mut taken = occupied.clone();
        let mut lowest_held: Option<(i64, i64)> = None;
        for (row, outcome) in &self.decisions {
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
}

/// The held events of a save slot, read only as far as settling needs them: a slot may
/// hold many, and reading and parsing every held body on each arrival made the cost of an
/// arrival grow with the number held.
pub(crate) struct HeldReach<'a> {
    held: &'a [HeldRef],
    loaded: HashSet<i64>,
}

impl<'a> HeldReach<'a> {
    /// The lowest sequence whose decided state settling needs: that of the arriving and
    /// held events, or the next one expected if lower.
    pub fn occupied_from(arriving: &[i64], held: &[HeldRef], last_sequence: i64) -> i64 {
        arriving
            .iter()
            .chain(held.iter().map(|h| &h.sequence))
            .copied()
            .min()
            .unwrap_or(i64::MAX)
            .min(last_sequence.saturating_add(1))
    }

    /// Starts with the held events whose turn may come; returns them, to be read.
    pub fn start(
        held: &'a [HeldRef],
        before: &SaveState,
        occupied: &BTreeSet<i64>,
        arriving: &[i64],
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> (Self, &'a [HeldRef]) {
        let reach = held_in_reach(
            before.last_sequence,
            occupied,
            arriving,
            held,
            now_ms,
            hold_timeout_ms,
        );
        let first = &held[..reach];
        let loaded = first.iter().map(|h| h.row).collect();
        (Self { held, loaded }, first)
    }

    /// Settles with the `rows` read so far: the plan, or the held events it turns out
    /// would be decided too, to be read and added to `rows` before settling again.
    #[allow(clippy::too_many_arguments)]
    pub fn settle(
        &mut self,
        kind: SourceKind,
        rows: &[PendingRow],
        aggregate: &str,
        before: &SaveState,
        occupied: &BTreeSet<i64>,
        now_ms: i64,
        hold_timeout_ms: i64,
    ) -> Result<Plan<SaveState>, Vec<HeldRef>> {
        let pending = Pending::parse(kind, rows.to_vec());
        let sequences = pending.sequences();
        let plan = pending.settle_save(
            aggregate,
            before.clone(),
            occupied.clone(),
            now_ms,
            hold_timeout_ms,
        );
        let (taken, lowest_held) = plan.taken(occupied, &sequences);
        let left_out: Vec<HeldRef> = self
            .held
            .iter()
            .filter(|h| !self.loaded.contains(&h.row))
            .copied()
            .collect();
        let missing = held_left_out(
            &plan.state,
            &taken,
            lowest_held,
            &left_out,
            now_ms,
            hold_timeout_ms,
        );
        if missing.is_empty() {
            return Ok(plan);
        }
        self.loaded.extend(missing.iter().map(|h| h.row));
        Err(missing)
    }
}

/// What one store transaction did to one aggregate.
pub(crate) struct Settled {
    /// Counts and decision lines.
    pub report: SettleReport,
    /// Every decided or held row with its outcome.
    pub decisions: Vec<(i64, Outcome)>,
    /// The aggregate's current sequence afterwards.
    pub current_sequence: Option<i64>,
}

impl Settled {
    /// The sync-mode answer for `row`, one of the rows just settled.
    pub fn decided(self, row: i64) -> Result<Decided, StoreError> {
        let outcome = self
            .decisions
            .into_iter()
            .find(|(r, _)| *r == row)
            .map(|(_, o)| o)
            .ok_or_else(|| StoreError::Internal("settled event has no outcome".into()))?;
        Ok(Decided {
            outcome,
            report: self.report,
            current_sequence: self.current_sequence,
        })
    }
}
