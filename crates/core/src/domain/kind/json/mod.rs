//! The `json` kind (docs/contract.md, json sources): any publisher's JSON, its fields found by the
//! source's compiled locations ([`crate::domain::kind::json::contract`]). Latest-wins as
//! presence (ties applied and counted), in-order with the save-game deltas'
//! machinery, or unordered; the state is the value at `state` of the last
//! applied event.

pub mod batch;
pub mod contract;
pub mod form;

use axum::http::HeaderMap;
use serde_json::{json, Value};

use super::{
    aggregate_view, invalid_for_projection, Delivery, DeliveryOrder, EventFields, Kind, KindPlan,
    Lane, ParsedBody, PendingRow, SettleInput,
};
use super::{AggregateState, SourceKind};
use crate::domain::contract::ContractError;
use crate::domain::mask::mask_at;
use crate::domain::ordering::{
    in_order_rule, settle_in_order, InOrderState, Outcome, PendingEvent, Sequenced, SkippedGaps,
};
use crate::domain::{AggregateKey, Ident, Mode};
use contract::{ContractConfigError, JsonContract, JsonOrdering, JsonParsed, JsonSourceSpec};

/// A `json` source answers once logged (202) and applies in the workers; it has no default
/// signature scheme: each publisher signs its own way, so the source must name it.
pub const DEFAULT_MODE: Mode = Mode::Async;

/// A configured `json` source's kind: its compiled contract.
#[derive(Debug, Clone)]
pub struct JsonKind {
    contract: JsonContract,
    spec: JsonSourceSpec,
}

impl JsonKind {
    /// The settings it was compiled from, when `kind` is a json kind (for the tools that
    /// write bodies a json source reads).
    pub fn spec_of(kind: &dyn Kind) -> Option<&JsonSourceSpec> {
        kind.as_any().downcast_ref::<Self>().map(|json| &json.spec)
    }

    /// Compiles a source's keys, or names the key at fault.
    pub fn new(spec: &JsonSourceSpec) -> Result<Self, ContractConfigError> {
        Ok(Self {
            contract: JsonContract::compile(spec)?,
            spec: spec.clone(),
        })
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
    /// Whether it carried a version: an unordered event's state is stored without a sequence.
    versioned: bool,
    event_id: String,
    event_type: String,
    state: Value,
    at_ms: i64,
}

impl Applied {
    fn of(row: &PendingRow, state: Value, at_ms: i64) -> Self {
        Self {
            sequence: row.sequence,
            versioned: !row.unordered,
            event_id: row.event_id.clone(),
            event_type: row.event_type.clone(),
            state,
            at_ms,
        }
    }

    /// The stored event applied last, when a versioned event wrote it: a state an
    /// unordered event wrote has no sequence, and any versioned event replaces it.
    fn from_stored(stored: &AggregateState) -> Option<Self> {
        Some(Self {
            sequence: stored.sequence?,
            versioned: true,
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
    skipped_gaps: SkippedGaps,
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

    fn skipped_gaps_mut(&mut self) -> &mut SkippedGaps {
        &mut self.skipped_gaps
    }

    fn decide(&self, pending: &PendingEvent<Located>) -> Outcome {
        in_order_rule(
            self.watermark,
            pending.event.row.sequence,
            pending.replayed,
            &self.skipped_gaps,
        )
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

/// The state a delivery's body holds at the source's `state` location, read at ingress.
pub struct LocatedState(Option<Value>);

impl super::Parsed for LocatedState {
    fn into_parsed(self) -> ParsedBody {
        ParsedBody::Json(std::sync::Arc::new(self))
    }

    fn from_parsed(parsed: &ParsedBody) -> Option<&Self> {
        match parsed {
            ParsedBody::Json(state) => Some(state),
            _ => None,
        }
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
            let state = match row.parsed_as::<LocatedState>() {
                Some(LocatedState(state)) => Ok(state.clone()),
                None => self.contract.state_of(&row.body, &row.event_type),
            };
            match state {
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
        skipped_gaps: Option<&SkippedGaps>,
    ) -> AggregateState {
        AggregateState {
            aggregate: aggregate.to_owned(),
            sequence: applied
                .filter(|a| a.versioned && self.contract.locates_sequence())
                .map(|a| a.sequence),
            event_id: applied.map(|a| a.event_id.clone()),
            event_type: applied
                .map(|a| a.event_type.clone())
                .filter(|t| !t.is_empty()),
            state: applied.map_or(Value::Null, |a| a.state.clone()),
            tag: None,
            watermark,
            skipped_gaps: skipped_gaps.map(SkippedGaps::to_stored),
            updated_at_ms: applied.map_or(0, |a| a.at_ms),
        }
    }

    /// The unordered rows of a source that orders events (docs/contract.md, missing
    /// locations): each applied, in arrival order; the last is the state to write where no
    /// versioned event has written one, never over one that has.
    fn settle_unversioned(
        loose: Vec<(&PendingRow, Value)>,
        now_ms: i64,
        decisions: &mut Vec<(i64, Outcome)>,
    ) -> Option<Applied> {
        let mut last = None;
        for (row, state) in loose {
            decisions.push((row.row, Outcome::Applied));
            last = Some(Applied::of(row, state, now_ms));
        }
        last
    }

    fn settle_in_order(&self, input: &SettleInput<'_>) -> KindPlan {
        let mut decisions = Vec::new();
        let (loose, ordered): (Vec<_>, Vec<_>) = self
            .located(input.rows, &mut decisions)
            .into_iter()
            .partition(|(row, _)| row.unordered);
        let pending = ordered
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
        let watermark = input.watermark();
        let before = InOrder {
            watermark,
            skipped_gaps: SkippedGaps::from_stored(
                input.before.and_then(|b| b.skipped_gaps.as_deref()),
                watermark,
            ),
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
        let loose = Self::settle_unversioned(loose, input.now_ms, &mut decisions);
        let state = settlement.state;
        let applied = state.applied.as_ref().or(loose.as_ref());
        let stored = (input.before.is_some() || state != before || loose.is_some()).then(|| {
            match (applied, input.before) {
                // The state an unordered event wrote, kept until a versioned event replaces it.
                (None, Some(kept)) => AggregateState {
                    watermark: Some(state.watermark),
                    skipped_gaps: Some(state.skipped_gaps.to_stored()),
                    ..kept.clone()
                },
                _ => self.stored_of(
                    input.aggregate,
                    applied,
                    Some(state.watermark),
                    Some(&state.skipped_gaps),
                ),
            }
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
        let (loose, mut located): (Vec<_>, Vec<_>) = self
            .located(input.rows, &mut decisions)
            .into_iter()
            .partition(|(row, _)| row.unordered && !unordered);
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
        let current_sequence = applied.as_ref().map(|a| a.sequence);
        if let Some(last) = Self::settle_unversioned(loose, input.now_ms, &mut decisions) {
            // A state a versioned event wrote stays: an unordered event cannot roll it back.
            if applied.is_none() {
                applied = Some(last);
                changed = true;
            }
        }
        let stored = if changed {
            Some(self.stored_of(input.aggregate, applied.as_ref(), None, None))
        } else {
            input.before.cloned()
        };
        KindPlan {
            current_sequence,
            state: stored,
            decisions,
            gaps_skipped: 0,
            ties,
            reach: None,
        }
    }
}

impl Kind for JsonKind {
    fn source_kind(&self) -> SourceKind {
        SourceKind::Json
    }

    fn body_format(&self) -> crate::domain::contract::body::BodyFormat {
        self.spec.body_format.unwrap_or_default()
    }

    fn ids_events_by_body(&self) -> bool {
        self.spec.event_id.as_deref() == Some(contract::BODY_EVENT_ID)
    }

    fn contract_settings(&self) -> String {
        // Every key of the spec counts: the Debug form lists them all, in declaration order.
        format!("{:?}", self.spec)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
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
                    may_hold: self.ordering() == JsonOrdering::InOrder && event.unordered.is_none(),
                    unordered: event.unordered,
                    parsed: Some(super::Parsed::into_parsed(LocatedState(event.state))),
                }),
                JsonParsed::Ignored {
                    event_id,
                    event_type,
                    place,
                } => {
                    let event_type = event_type.map(|t| t.as_str().to_owned());
                    // Logged under its own aggregate and sequence when both read cleanly, so
                    // that it is listed beside its aggregate's events (an in-order source
                    // counts its sequence, as docs/contract.md (processing) counts save-game's
                    // unknown types); else as its own aggregate, keyed by its event id, at sequence
                    // 0, like an unordered event: it never waits and touches no one's order.
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
                            unordered: None,
                            parsed: None,
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

    fn delivery_order(&self, _event_type: &str) -> DeliveryOrder {
        match self.ordering() {
            JsonOrdering::LatestWins => DeliveryOrder::LatestWins(Lane::Aggregate),
            JsonOrdering::InOrder => DeliveryOrder::InOrder(Lane::Aggregate),
            JsonOrdering::Unordered => DeliveryOrder::Unordered,
        }
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
        // The stored state does not say which alternative of `state` it came from: each
        // one's paths are masked, erring towards hiding more, never less.
        for location in self.contract.state_locations() {
            let location: Vec<&str> = location.iter().map(String::as_str).collect();
            mask_at(view, fields, &location);
        }
    }

    fn mask_stream_state(&self, item: &mut Value, fields: &[String]) {
        // The stream carries the generic item: the kind's view sits at its `state`.
        if let Some(state) = item.get_mut("state") {
            self.mask(state, fields);
        }
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
    use crate::domain::kind::HeldReach;
    use crate::domain::ordering::HeldRef;
    use crate::domain::DeadReason;

    const HOLD: i64 = 30_000;

    fn kind(ordering: &str) -> JsonKind {
        let spec: JsonSourceSpec = toml::from_str(&format!(
            "event_id = \"/id\"\naggregate = \"/a\"\nsequence = \"/seq\"\nordering = \"{ordering}\"\nstate = \"/s\""
        ))
        .unwrap();
        JsonKind::new(&spec).unwrap()
    }

    #[test]
    fn masking_covers_every_alternative_of_state() {
        let spec: JsonSourceSpec = toml::from_str(
            "event_id = \"/id\"\nordering = \"unordered\"\nstate = \"/pull_request|/issue\"",
        )
        .unwrap();
        let kind = JsonKind::new(&spec).unwrap();
        let fields = vec![
            "issue.user.email".to_owned(),
            "pull_request.token".to_owned(),
        ];
        let mut issue = json!({"user": {"email": "a@x", "name": "a"}, "token": "t"});
        kind.mask(&mut issue, &fields);
        assert_eq!(issue["user"]["email"], crate::domain::mask::MASK);
        assert_eq!(issue["user"]["name"], "a");
        let mut pull = json!({"token": "t", "title": "x"});
        kind.mask(&mut pull, &fields);
        assert_eq!(pull["token"], crate::domain::mask::MASK);
        assert_eq!(pull["title"], "x");
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
            unordered: false,
            parsed: None,
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

    /// One generated stream: each distinct event's sequence, the order its deliveries
    /// arrive in (every event at least once, some redelivered), and after which arrivals
    /// a worker settles (the last always).
    #[derive(Debug, Clone)]
    struct Stream {
        sequences: Vec<i64>,
        arrivals: Vec<usize>,
        settle_after: Vec<bool>,
    }

    fn stream(sequences: impl Strategy<Value = Vec<i64>>) -> impl Strategy<Value = Stream> {
        sequences
            .prop_flat_map(|sequences| {
                let n = sequences.len();
                let deliveries = proptest::collection::vec(0..n, 0..=n)
                    .prop_map(move |again| (0..n).chain(again).collect::<Vec<_>>())
                    .prop_shuffle();
                (Just(sequences), deliveries)
            })
            .prop_flat_map(|(sequences, arrivals)| {
                let splits = proptest::collection::vec(any::<bool>(), arrivals.len());
                (Just(sequences), Just(arrivals), splits)
            })
            .prop_map(|(sequences, arrivals, settle_after)| Stream {
                sequences,
                arrivals,
                settle_after,
            })
    }

    /// The event log and a worker as a store runs them, without I/O: a redelivery of a
    /// logged event_id is dropped; each settle step decides the rows logged since the
    /// last one plus, for in-order, the held events in reach ([`HeldReach`]).
    struct Worker {
        kind: JsonKind,
        logged: BTreeSet<usize>,
        waiting: Vec<PendingRow>,
        state: Option<AggregateState>,
        occupied: BTreeSet<i64>,
        /// Every decision, in the order made: (row, event, sequence, outcome).
        decided: Vec<(i64, usize, i64, Outcome)>,
        ties: u64,
        gaps_skipped: u64,
    }

    impl Worker {
        fn new(ordering: &str) -> Self {
            Self {
                kind: kind(ordering),
                logged: BTreeSet::new(),
                waiting: Vec::new(),
                state: None,
                occupied: BTreeSet::new(),
                decided: Vec::new(),
                ties: 0,
                gaps_skipped: 0,
            }
        }

        /// Logs a delivery of event `event` (dropped if logged before) at `now_ms`.
        fn receive(&mut self, event: usize, sequence: i64, now_ms: i64) {
            if !self.logged.insert(event) {
                return;
            }
            let mut pending = row(self.logged.len() as i64, sequence);
            pending.event_id = format!("e{event}");
            pending.body = serde_json::to_vec(
                &json!({"id": pending.event_id, "a": "x", "seq": sequence, "s": {"event": event}}),
            )
            .unwrap();
            pending.received_at_ms = now_ms;
            self.waiting.push(pending);
        }

        fn settle(&mut self, now_ms: i64) {
            let nothing = BTreeSet::new();
            let base = SettleInput {
                aggregate: "x",
                before: self.state.as_ref(),
                rows: &[],
                occupied: &nothing,
                first_sequence: 1,
                now_ms,
                hold_timeout_ms: HOLD,
            };
            let plan = if self.kind.in_order() {
                let (held_rows, mut rows): (Vec<PendingRow>, Vec<PendingRow>) =
                    self.waiting.iter().cloned().partition(|r| r.was_held);
                let mut held: Vec<HeldRef> = held_rows
                    .iter()
                    .map(|r| HeldRef {
                        sequence: r.sequence,
                        row: r.row,
                        received_at_ms: r.received_at_ms,
                    })
                    .collect();
                held.sort();
                let arriving: Vec<i64> = rows.iter().map(|r| r.sequence).collect();
                let read = |refs: &[HeldRef]| {
                    held_rows
                        .iter()
                        .filter(|r| refs.iter().any(|h| h.row == r.row))
                        .cloned()
                        .collect::<Vec<_>>()
                };
                let (mut reach, first) = HeldReach::start(
                    &held,
                    base.watermark(),
                    &self.occupied,
                    &arriving,
                    now_ms,
                    HOLD,
                );
                rows.extend(read(first));
                loop {
                    let input = SettleInput {
                        rows: &rows,
                        occupied: &self.occupied,
                        ..base
                    };
                    match reach.settle(&self.kind, &input) {
                        Ok(plan) => break plan,
                        Err(missing) => rows.extend(read(&missing)),
                    }
                }
            } else {
                self.kind.settle(&SettleInput {
                    rows: &self.waiting,
                    ..base
                })
            };
            for (decided_row, outcome) in &plan.decisions {
                let at = self.waiting.iter().position(|r| r.row == *decided_row);
                let pending = &mut self.waiting[at.expect("a decision is about a waiting row")];
                if *outcome == Outcome::Held {
                    pending.was_held = true;
                    continue;
                }
                let pending = self.waiting.remove(at.unwrap());
                let event = pending.event_id[1..].parse().unwrap();
                if !matches!(
                    outcome,
                    Outcome::Dead {
                        reason: DeadReason::SequenceConflict,
                        ..
                    }
                ) {
                    self.occupied.insert(pending.sequence);
                }
                self.decided
                    .push((pending.row, event, pending.sequence, outcome.clone()));
            }
            if plan.state.is_some() {
                self.state = plan.state;
            }
            self.ties += plan.ties;
            self.gaps_skipped += plan.gaps_skipped;
        }

        /// Feeds a stream, 10 ms per arrival (well within the hold timeout).
        fn run(mut self, stream: &Stream) -> Self {
            for (i, event) in stream.arrivals.iter().copied().enumerate() {
                let now_ms = i as i64 * 10;
                self.receive(event, stream.sequences[event], now_ms);
                if stream.settle_after[i] || i + 1 == stream.arrivals.len() {
                    self.settle(now_ms);
                }
            }
            self
        }

        /// The events applied, in the order applied.
        fn applied(&self) -> Vec<usize> {
            self.decided
                .iter()
                .filter(|d| d.3 == Outcome::Applied)
                .map(|d| d.1)
                .collect()
        }
    }

    /// The events in the order the log first received them (redeliveries dropped).
    fn first_receipts(stream: &Stream) -> Vec<usize> {
        let mut seen = BTreeSet::new();
        stream
            .arrivals
            .iter()
            .copied()
            .filter(|e| seen.insert(*e))
            .collect()
    }

    /// Rows of a latest-wins aggregate, each versioned (`Some(sequence)`) or not, settled
    /// in the batches `splits` cuts: what ends in the state.
    fn settle_mixed(
        ordering: &str,
        events: &[Option<i64>],
        splits: &[bool],
    ) -> (Vec<Outcome>, AggregateState) {
        let k = kind(ordering);
        let mut state: Option<AggregateState> = None;
        let mut outcomes = vec![None; events.len()];
        let mut batch = Vec::new();
        let mut occupied = BTreeSet::new();
        for (i, version) in events.iter().enumerate() {
            let mut r = row(i as i64 + 1, version.unwrap_or(0));
            r.unordered = version.is_none();
            batch.push(r);
            if splits[i] || i + 1 == events.len() {
                let plan = settle(&k, state.as_ref(), &batch, &occupied, 0);
                for (decided, outcome) in plan.decisions {
                    outcomes[decided as usize - 1] = Some(outcome);
                    occupied.insert(events[decided as usize - 1].unwrap_or(0));
                }
                batch.retain(|r| outcomes[r.row as usize - 1] == Some(Outcome::Held));
                if plan.state.is_some() {
                    state = plan.state;
                }
            }
        }
        (
            outcomes.into_iter().map(Option::unwrap).collect(),
            state.unwrap(),
        )
    }

    #[test]
    fn a_late_unversioned_event_is_applied_but_never_rolls_back_a_versioned_state() {
        let (outcomes, state) = settle_mixed("latest-wins", &[Some(5), None], &[true, true]);
        assert_eq!(outcomes, [Outcome::Applied, Outcome::Applied]);
        assert_eq!((state.sequence, state.state), (Some(5), json!({"row": 1})));
        // Before any versioned event, it is the state; the first versioned one replaces it.
        let (_, state) = settle_mixed("latest-wins", &[None], &[true]);
        assert_eq!(
            (state.sequence, state.state.clone()),
            (None, json!({"row": 1}))
        );
        let (_, state) = settle_mixed("latest-wins", &[None, Some(1)], &[true, true]);
        assert_eq!((state.sequence, state.state), (Some(1), json!({"row": 2})));
        // In-order: applied, never held, and the watermark is the versioned events'.
        let (outcomes, state) =
            settle_mixed("in-order", &[Some(1), None, Some(2)], &[true, true, true]);
        assert_eq!(outcomes, vec![Outcome::Applied; 3]);
        assert_eq!((state.watermark, state.state), (Some(2), json!({"row": 3})));
        let (_, state) = settle_mixed("in-order", &[None], &[true]);
        assert_eq!((state.watermark, state.state), (Some(0), json!({"row": 1})));
    }

    proptest! {
        /// Versioned and unversioned events of one aggregate, in any order and batches: every
        /// unversioned event is applied; the state is the highest versioned event's (the
        /// last received of its ties) whenever there is one, else the last unversioned one.
        #[test]
        fn unversioned_events_never_roll_back_what_a_versioned_one_wrote(
            events in proptest::collection::vec(proptest::option::of(1i64..5), 1..14),
            splits in proptest::collection::vec(any::<bool>(), 14),
        ) {
            let (outcomes, state) = settle_mixed("latest-wins", &events, &splits);
            for (version, outcome) in events.iter().zip(&outcomes) {
                if version.is_none() {
                    prop_assert_eq!(outcome, &Outcome::Applied);
                }
            }
            let highest = events.iter().flatten().max().copied();
            let winner = match highest {
                Some(h) => events.iter().rposition(|v| *v == Some(h)).unwrap(),
                None => events.len() - 1,
            };
            prop_assert_eq!(state.sequence, highest);
            prop_assert_eq!(state.state, json!({"row": winner + 1}));
        }
    }

    proptest! {
        /// Latest-wins, with redeliveries, ties and any batch splits: every event is decided
        /// once, applied sequences never go down, each applied equal sequence is a counted
        /// tie, and the state ends at the highest sequence, the last received of its ties.
        #[test]
        fn latest_wins_ends_at_the_last_received_of_the_highest_sequence(
            stream in stream(proptest::collection::vec(1i64..5, 1..14)),
        ) {
            let worker = Worker::new("latest-wins").run(&stream);
            let firsts = first_receipts(&stream);
            prop_assert!(worker.waiting.is_empty());
            let mut decided: Vec<usize> = worker.decided.iter().map(|d| d.1).collect();
            decided.sort_unstable();
            prop_assert_eq!(decided, (0..stream.sequences.len()).collect::<Vec<_>>());
            prop_assert!(worker
                .decided
                .iter()
                .all(|d| matches!(d.3, Outcome::Applied | Outcome::Stale)));
            let applied: Vec<i64> = worker
                .applied()
                .iter()
                .map(|e| stream.sequences[*e])
                .collect();
            prop_assert!(applied.windows(2).all(|w| w[0] <= w[1]), "{:?}", applied);
            let equal_steps = applied.windows(2).filter(|w| w[0] == w[1]).count() as u64;
            prop_assert_eq!(worker.ties, equal_steps);
            let highest = *stream.sequences.iter().max().unwrap();
            let winner = *firsts
                .iter()
                .rev()
                .find(|e| stream.sequences[**e] == highest)
                .unwrap();
            let ties_of_highest = stream.sequences.iter().filter(|s| **s == highest).count() as u64;
            prop_assert!(worker.ties >= ties_of_highest - 1);
            let state = worker.state.unwrap();
            prop_assert_eq!(state.sequence, Some(highest));
            let winner_id = format!("e{winner}");
            prop_assert_eq!(state.event_id.as_deref(), Some(winner_id.as_str()));
            prop_assert_eq!(state.state, json!({"event": winner}));
        }

        /// In-order, with redeliveries and any batch splits, gaps filling within the hold
        /// timeout: every event is applied exactly once, in sequence order, none skipped.
        #[test]
        fn in_order_applies_every_event_once_in_sequence_order(
            stream in stream((1i64..14).prop_map(|n| (1..=n).collect())),
        ) {
            let worker = Worker::new("in-order").run(&stream);
            let n = stream.sequences.len();
            prop_assert!(worker.waiting.is_empty());
            prop_assert_eq!(worker.decided.len(), n);
            let applied: Vec<i64> = worker
                .applied()
                .iter()
                .map(|e| stream.sequences[*e])
                .collect();
            prop_assert_eq!(applied, (1..=n as i64).collect::<Vec<_>>());
            prop_assert_eq!(worker.gaps_skipped, 0);
            let state = worker.state.unwrap();
            prop_assert_eq!((state.sequence, state.watermark), (Some(n as i64), Some(n as i64)));
            prop_assert_eq!(state.state, json!({"event": n - 1}));
        }

        /// Unordered: every distinct event is applied once, in the order first received.
        #[test]
        fn unordered_applies_every_distinct_event_once_as_received(
            stream in stream(proptest::collection::vec(1i64..5, 1..14)),
        ) {
            let worker = Worker::new("unordered").run(&stream);
            let firsts = first_receipts(&stream);
            prop_assert_eq!(worker.applied(), firsts.clone());
            prop_assert_eq!(worker.state.unwrap().state, json!({"event": firsts.last().unwrap()}));
        }
    }
}
