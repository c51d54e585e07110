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
use crate::domain::AggregateKey;
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
                } => Delivery::Ignored {
                    event_id,
                    event_type: event_type.map(|t| t.as_str().to_owned()),
                },
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
