//! The `json` kind (SPEC §8): any publisher's JSON, its fields found by the
//! source's compiled locations ([`crate::contract::json`]). Latest-wins as
//! presence (ties applied and counted), in-order with the save-game deltas'
//! machinery, or unordered; the state is the value at `state` of the last
//! applied event.

use axum::http::HeaderMap;
use serde_json::{json, Value};

use super::{
    aggregate_view, invalid_for_projection, Delivery, EventFields, Kind, KindPlan, PendingRow,
    SettleInput,
};
use crate::contract::json::{
    ContractConfigError, JsonContract, JsonOrdering, JsonParsed, JsonSourceSpec,
};
use crate::contract::ContractError;
use crate::domain::{AggregateKey, Ident};
use crate::mask::mask_at;
use crate::ordering::{
    in_order_rule, settle_in_order, InOrderState, Outcome, PendingEvent, Sequenced,
};
use crate::store::AggregateState;

/// A configured `json` source's kind: its compiled contract.
#[derive(Debug, Clone)]
pub struct JsonKind {
    contract: JsonContract,
    spec: JsonSourceSpec,
}

impl JsonKind {
    /// Compiles a source's keys, or names the key at fault.
    pub fn new(spec: &JsonSourceSpec) -> Result<Self, ContractConfigError> {
        Ok(Self {
            contract: JsonContract::compile(spec)?,
            spec: spec.clone(),
        })
    }

    /// The keys it was compiled from (a reload may not change them).
    pub fn spec(&self) -> &JsonSourceSpec {
        &self.spec
    }

    /// The source's ordering.
    pub fn ordering(&self) -> JsonOrdering {
        self.contract.ordering()
    }
}

/// The event applied last, as kept in the aggregate's state.
#[derive(Debug, Clone, PartialEq)]
struct Applied {
    sequence: i64,
    event_id: String,
    event_type: String,
    state: Value,
    at_ms: i64,
}

impl Applied {
    fn of(row: &PendingRow, state: Value, at_ms: i64) -> Self {
        Self {
            sequence: row.sequence,
            event_id: row.event_id.clone(),
            event_type: row.event_type.clone(),
            state,
            at_ms,
        }
    }

    fn from_stored(stored: &AggregateState) -> Option<Self> {
        Some(Self {
            sequence: stored.sequence?,
            event_id: stored.event_id.clone()?,
            event_type: stored.event_type.clone().unwrap_or_default(),
            state: stored.state.clone(),
            at_ms: stored.updated_at_ms,
        })
    }
}

/// An in-order aggregate: the watermark and the event applied last.
#[derive(Debug, Clone, PartialEq)]
struct InOrder {
    watermark: i64,
    applied: Option<Applied>,
}

/// A pending row of an in-order source with its state value read.
#[derive(Debug, Clone)]
struct Located {
    row: PendingRow,
    state: Value,
}

impl Sequenced for Located {
    fn sequence(&self) -> i64 {
        self.row.sequence
    }
}

impl InOrderState for InOrder {
    type Event = Located;

    fn watermark(&self) -> i64 {
        self.watermark
    }

    fn set_watermark(&mut self, watermark: i64) {
        self.watermark = watermark;
    }

    fn decide(&self, pending: &PendingEvent<Located>) -> Outcome {
        in_order_rule(self.watermark, pending.event.row.sequence, pending.replayed)
    }

    fn apply(
        &mut self,
        pending: &PendingEvent<Located>,
        now_ms: i64,
    ) -> Result<(), (crate::domain::DeadReason, String)> {
        self.applied = Some(Applied::of(
            &pending.event.row,
            pending.event.state.clone(),
            now_ms,
        ));
        Ok(())
    }
}

impl JsonKind {
    /// Each row with its state value; a row whose body no longer parses is dead.
    fn located<'a>(
        &self,
        rows: &'a [PendingRow],
        decisions: &mut Vec<(i64, Outcome)>,
    ) -> Vec<(&'a PendingRow, Value)> {
        let mut located = Vec::with_capacity(rows.len());
        for row in rows {
            match self.contract.state_of(&row.body) {
                Ok(state) => located.push((row, state.unwrap_or(Value::Null))),
                Err(err) => decisions.push((row.row, invalid_for_projection(err))),
            }
        }
        located
    }

    fn stored_of(
        &self,
        aggregate: &str,
        applied: Option<&Applied>,
        watermark: Option<i64>,
    ) -> AggregateState {
        AggregateState {
            aggregate: aggregate.to_owned(),
            sequence: applied
                .filter(|_| self.contract.locates_sequence())
                .map(|a| a.sequence),
            event_id: applied.map(|a| a.event_id.clone()),
            event_type: applied
                .map(|a| a.event_type.clone())
                .filter(|t| !t.is_empty()),
            state: applied.map_or(Value::Null, |a| a.state.clone()),
            tag: None,
            watermark,
            updated_at_ms: applied.map_or(0, |a| a.at_ms),
        }
    }

    fn settle_in_order(&self, input: &SettleInput<'_>) -> KindPlan {
        let mut decisions = Vec::new();
        let pending = self
            .located(input.rows, &mut decisions)
            .into_iter()
            .map(|(row, state)| PendingEvent {
                row: row.row,
                received_at_ms: row.received_at_ms,
                replayed: row.replayed,
                event: Located {
                    row: row.clone(),
                    state,
                },
            })
            .collect();
        let before = InOrder {
            watermark: input.watermark(),
            applied: input.before.and_then(Applied::from_stored),
        };
        let settlement = settle_in_order(
            before.clone(),
            input.occupied.clone(),
            pending,
            input.now_ms,
            input.hold_timeout_ms,
        );
        decisions.extend(settlement.decisions);
        let state = settlement.state;
        let stored = (input.before.is_some() || state != before).then(|| {
            self.stored_of(
                input.aggregate,
                state.applied.as_ref(),
                Some(state.watermark),
            )
        });
        KindPlan {
            state: stored,
            decisions,
            gaps_skipped: settlement.gaps_skipped,
            ties: 0,
            current_sequence: Some(state.watermark),
            reach: Some((state.watermark, None)),
        }
    }

    fn settle_latest(&self, input: &SettleInput<'_>, unordered: bool) -> KindPlan {
        let mut decisions = Vec::new();
        let mut located = self.located(input.rows, &mut decisions);
        if !unordered {
            located.sort_by_key(|(row, _)| (row.sequence, row.row));
        }
        let mut applied = input.before.and_then(Applied::from_stored);
        let mut ties = 0;
        let mut changed = false;
        for (row, state) in located {
            let outcome = match &applied {
                _ if unordered => Outcome::Applied,
                None => Outcome::Applied,
                Some(current) if row.sequence > current.sequence => Outcome::Applied,
                Some(current)
                    if row.sequence == current.sequence && row.event_id != current.event_id =>
                {
                    // Publishers with one-second timestamps tie; the later receipt is usually the newer news.
                    ties += 1;
                    Outcome::Applied
                }
                Some(_) => Outcome::Stale,
            };
            if outcome == Outcome::Applied {
                applied = Some(Applied::of(row, state, input.now_ms));
                changed = true;
            }
            decisions.push((row.row, outcome));
        }
        let stored = if changed {
            Some(self.stored_of(input.aggregate, applied.as_ref(), None))
        } else {
            input.before.cloned()
        };
        KindPlan {
            current_sequence: applied.as_ref().map(|a| a.sequence),
            state: stored,
            decisions,
            gaps_skipped: 0,
            ties,
            reach: None,
        }
    }
}

impl Kind for JsonKind {
    fn label(&self) -> &'static str {
        "json"
    }

    fn parse(
        &self,
        body: &[u8],
        headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<Delivery, ContractError> {
        Ok(
            match self.contract.parse_bytes(body, headers, delivery_id)? {
                JsonParsed::Event(event) => Delivery::Event(EventFields {
                    event_id: event.event_id,
                    idempotency_key: event.idempotency_key,
                    aggregate: AggregateKey::of_parts(event.aggregate),
                    sequence: event.sequence.map_or(0, |s| s.value.get()),
                    event_type: event
                        .event_type
                        .map(|t| t.as_str().to_owned())
                        .unwrap_or_default(),
                    may_hold: self.ordering() == JsonOrdering::InOrder,
                }),
                JsonParsed::Ignored {
                    event_id,
                    event_type,
                    place,
                } => {
                    let event_type = event_type.map(|t| t.as_str().to_owned());
                    // Logged under its own aggregate and sequence when both read cleanly, so
                    // that it is listed beside its aggregate's events (an in-order source
                    // counts its sequence, as SPEC §3 counts save-game's unknown types);
                    // else as its own aggregate, keyed by its event id, at sequence 0, like
                    // an unordered event: it never waits and touches no one's order.
                    let event = event_id.and_then(|event_id| {
                        let (aggregate, sequence) = match place {
                            Some(place) => (place.aggregate, place.sequence),
                            None => (vec![Ident::parse_located(event_id.as_str()).ok()?], 0),
                        };
                        Some(EventFields {
                            event_id,
                            idempotency_key: None,
                            aggregate: AggregateKey::of_parts(aggregate),
                            sequence,
                            event_type: event_type.clone().unwrap_or_default(),
                            may_hold: false,
                        })
                    });
                    Delivery::Ignored { event, event_type }
                }
            },
        )
    }

    fn in_order(&self) -> bool {
        self.ordering() == JsonOrdering::InOrder
    }

    fn settle(&self, input: &SettleInput<'_>) -> KindPlan {
        match self.ordering() {
            JsonOrdering::InOrder => self.settle_in_order(input),
            JsonOrdering::LatestWins => self.settle_latest(input, false),
            JsonOrdering::Unordered => self.settle_latest(input, true),
        }
    }

    fn view(&self, stored: &AggregateState, _now_ms: i64) -> Value {
        stored.state.clone()
    }

    fn mask(&self, view: &mut Value, fields: &[String]) {
        let location: Vec<&str> = self
            .contract
            .state_location()
            .iter()
            .map(String::as_str)
            .collect();
        mask_at(view, fields, &location);
    }

    fn stream_state(&self, source: &str, stored: &AggregateState, now_ms: i64) -> Value {
        // No typed view: the stream carries the generic item (masked when shown).
        let item = aggregate_view(source, self, stored, now_ms, &[]);
        json!(item)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;
    use crate::domain::DeadReason;

    const HOLD: i64 = 30_000;

    fn kind(ordering: &str) -> JsonKind {
        let spec: JsonSourceSpec = toml::from_str(&format!(
            "event_id = \"/id\"\naggregate = \"/a\"\nsequence = \"/seq\"\nordering = \"{ordering}\"\nstate = \"/s\""
        ))
        .unwrap();
        JsonKind::new(&spec).unwrap()
    }

    fn row(row: i64, seq: i64) -> PendingRow {
        PendingRow {
            row,
            event_id: format!("e{row}"),
            event_type: String::new(),
            sequence: seq,
            idempotency_key: None,
            body: serde_json::to_vec(
                &json!({"id": format!("e{row}"), "a": "x", "seq": seq, "s": {"row": row}}),
            )
            .unwrap(),
            received_at_ms: 0,
            replayed: false,
            was_held: false,
        }
    }

    fn settle(
        kind: &JsonKind,
        before: Option<&AggregateState>,
        rows: &[PendingRow],
        occupied: &BTreeSet<i64>,
        now_ms: i64,
    ) -> KindPlan {
        kind.settle(&SettleInput {
            aggregate: "x",
            before,
            rows,
            occupied,
            first_sequence: 1,
            now_ms,
            hold_timeout_ms: HOLD,
        })
    }

    #[test]
    fn latest_wins_applies_newer_and_ties_and_keeps_the_state_location() {
        let k = kind("latest-wins");
        let none = BTreeSet::new();
        let plan = settle(&k, None, &[row(1, 5), row(2, 4)], &none, 7);
        assert_eq!(
            plan.decisions,
            [(2, Outcome::Applied), (1, Outcome::Applied)]
        );
        let state = plan.state.unwrap();
        assert_eq!(
            (state.sequence, state.state.clone()),
            (Some(5), json!({"row": 1}))
        );
        assert_eq!(state.updated_at_ms, 7);
        let tie = settle(&k, Some(&state), &[row(3, 5), row(4, 3)], &none, 8);
        assert_eq!(tie.decisions, [(4, Outcome::Stale), (3, Outcome::Applied)]);
        assert_eq!(tie.ties, 1);
        assert_eq!(tie.current_sequence, Some(5));
        assert_eq!(tie.state.unwrap().event_id.as_deref(), Some("e3"));
    }

    #[test]
    fn in_order_uses_the_save_deltas_rules() {
        let k = kind("in-order");
        let mut occupied = BTreeSet::new();
        let plan = settle(&k, None, &[row(1, 1), row(3, 3)], &occupied, 0);
        assert_eq!(plan.decisions, [(1, Outcome::Applied), (3, Outcome::Held)]);
        let state = plan.state.unwrap();
        assert_eq!(state.watermark, Some(1));
        occupied.insert(1);
        // The gap is skipped once the held event has waited hold_timeout.
        let plan = settle(&k, Some(&state), &[row(3, 3)], &occupied, HOLD);
        assert_eq!(plan.decisions, [(3, Outcome::Applied)]);
        assert_eq!(plan.gaps_skipped, 1);
        let state = plan.state.unwrap();
        occupied.insert(3);
        let late = settle(&k, Some(&state), &[row(2, 2)], &occupied, HOLD);
        assert!(matches!(
            &late.decisions[0].1,
            Outcome::Dead {
                reason: DeadReason::LateAfterGapSkip,
                ..
            }
        ));
        let conflict = settle(&k, Some(&state), &[row(4, 3)], &occupied, HOLD);
        assert!(matches!(
            &conflict.decisions[0].1,
            Outcome::Dead {
                reason: DeadReason::SequenceConflict,
                ..
            }
        ));
    }

    #[test]
    fn unordered_applies_everything_in_arrival_order() {
        let k = kind("unordered");
        let plan = settle(&k, None, &[row(1, 9), row(2, 1)], &BTreeSet::new(), 0);
        assert_eq!(
            plan.decisions,
            [(1, Outcome::Applied), (2, Outcome::Applied)]
        );
        assert_eq!(plan.state.unwrap().state, json!({"row": 2}));
    }

    #[test]
    fn a_stored_body_that_no_longer_parses_is_dead() {
        let k = kind("latest-wins");
        let mut bad = row(1, 1);
        bad.body = b"{".to_vec();
        let plan = settle(&k, None, &[bad], &BTreeSet::new(), 0);
        assert!(matches!(
            &plan.decisions[0].1,
            Outcome::Dead {
                reason: DeadReason::InvalidForProjection,
                ..
            }
        ));
        assert_eq!(plan.state, None);
    }

    proptest! {
        /// Any arrival order with duplicates (dropped by the log): latest-wins ends at the
        /// highest sequence's state, in-order applies every event in sequence order.
        #[test]
        fn any_arrival_order_converges(
            order in (1usize..12).prop_flat_map(|n| proptest::collection::vec(0..n, n..n * 2).prop_shuffle()),
        ) {
            let n = order.iter().max().unwrap() + 1;
            let mut arrivals = Vec::new();
            for i in order.iter().copied().chain(0..n) {
                if !arrivals.contains(&i) {
                    arrivals.push(i);
                }
            }
            for ordering in ["latest-wins", "in-order"] {
                let k = kind(ordering);
                let (mut state, mut occupied, mut waiting) = (None, BTreeSet::new(), Vec::new());
                let mut applied = Vec::new();
                for i in &arrivals {
                    waiting.push(row(*i as i64 + 1, *i as i64 + 1));
                    let plan = settle(&k, state.as_ref(), &waiting, &occupied, 0);
                    for (r, outcome) in &plan.decisions {
                        if *outcome == Outcome::Applied {
                            applied.push(*r);
                        }
                        if *outcome != Outcome::Held {
                            occupied.insert(*r);
                        }
                    }
                    waiting.retain(|w| plan.decisions.iter().any(|(r, o)| *r == w.row && *o == Outcome::Held));
                    state = plan.state;
                }
                let state = state.unwrap();
                prop_assert_eq!(state.sequence, Some(n as i64));
                prop_assert_eq!(state.state, json!({"row": n}));
                if ordering == "in-order" {
                    prop_assert_eq!(applied, (1..=n as i64).collect::<Vec<_>>());
                    prop_assert!(waiting.is_empty());
                }
            }
        }
    }
}
