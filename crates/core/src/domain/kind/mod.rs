//! The kind seam (docs/contract.md, json sources): a kind is one module behind the [`Kind`] trait.
//! It parses a verified delivery into the fields every layer needs, settles an
//! aggregate's pending events against its stored state (pure: the store loads
//! and writes, [`crate::domain::ordering`] holds the shared rules), says how each event is
//! ordered when forwarded, and shows and masks a stored state.
//!
//! Presence (`presence/`), save-game (`save/`) and `json` (`json/`) are its three
//! implementations, each holding its contract, rules, projection and defaults; the store,
//! the worker, forwarding, ingress and the read API only ever talk to the trait.
//! A fourth kind is a module here and a variant of [`SourceKind`], the configured name.

mod delivery_order;
mod held_reach;
pub mod json;
pub mod presence;
pub mod save;

pub use delivery_order::{DeliveryOrder, Lane};
pub use held_reach::HeldReach;

/// Every kind's lanes, the named parts of an aggregate forwarding orders apart (only a save
/// slot has any).
const LANES: &[&str] = save::LANES;

use std::any::Any;
use std::collections::BTreeSet;
use std::fmt;
use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::{json, Value};

use crate::domain::contract::ContractError;
use crate::domain::ordering::Outcome;
use crate::domain::{AggregateKey, DeadReason, EventId, IdempotencyKey, Mode};
use crate::ingress::signature::Scheme;
use json::contract::JsonSourceSpec;

/// What kind of projection a source feeds, and so which contract its bodies follow: the
/// `kind` a source is configured with.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize, utoipa::ToSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// Remote-worker presence (first seed).
    Presence,
    /// Game saves (second seed).
    SaveGame,
    /// Any publisher's JSON, its fields located by configuration (docs/contract.md, json sources).
    Json,
}

impl SourceKind {
    /// Its label in the change stream (the SSE `event`): `presence`, `save` or `json`.
    pub fn label(self) -> &'static str {
        match self {
            SourceKind::Presence => "presence",
            SourceKind::SaveGame => "save",
            SourceKind::Json => "json",
        }
    }

    /// Its name in a config file's `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Presence => "presence",
            SourceKind::SaveGame => "save-game",
            SourceKind::Json => "json",
        }
    }

    /// The kind of a source configured as this: a `json` source compiled from `spec`'s
    /// locations, or a built-in kind, which reads none, with its settings.
    pub fn configure(
        self,
        spec: &JsonSourceSpec,
        stale_after_ms: i64,
    ) -> Result<Arc<dyn Kind>, json::contract::ContractConfigError> {
        Ok(match self {
            SourceKind::Presence => Arc::new(presence::PresenceKind { stale_after_ms }),
            SourceKind::SaveGame => Arc::new(save::SaveKind),
            SourceKind::Json => Arc::new(json::JsonKind::new(spec)?),
        })
    }

    /// How a source of this kind answers when its `mode` is not set.
    pub fn default_mode(self) -> Mode {
        match self {
            SourceKind::Presence => presence::DEFAULT_MODE,
            SourceKind::SaveGame => save::DEFAULT_MODE,
            SourceKind::Json => json::DEFAULT_MODE,
        }
    }

    /// How a source of this kind is signed when its `signature` is not set; `None`: the
    /// source must name its scheme.
    pub fn default_scheme(self) -> Option<Scheme> {
        match self {
            SourceKind::Presence => Some(presence::DEFAULT_SCHEME),
            SourceKind::SaveGame => Some(save::DEFAULT_SCHEME),
            SourceKind::Json => None,
        }
    }
}

/// The stored state of one aggregate, whatever its kind: the columns every kind
/// shares, and the kind's own state as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct AggregateState {
    /// The aggregate, in stored form.
    pub aggregate: String,
    /// The sequence of its current state (presence: the applied one; save: `last_sequence`).
    pub sequence: Option<i64>,
    /// The event applied last.
    pub event_id: Option<String>,
    /// That event's type.
    pub event_type: Option<String>,
    /// The kind's state.
    pub state: serde_json::Value,
    /// A short value typed filters select on (presence: the status).
    pub tag: Option<String>,
    /// In-order kinds: the sequence up to which every event was decided or skipped.
    pub watermark: Option<i64>,
    /// In-order kinds: the gaps skipped, in the kind's stored form (none from older releases).
    pub skipped_gaps: Option<String>,
    /// When an event was last applied, unix milliseconds (0: never).
    pub updated_at_ms: i64,
}

/// A stored state its kind cannot read: a bug or a corrupt database.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct CorruptState(pub String);

/// What every layer needs of a verified delivery, whatever its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct EventFields {
    /// The publisher's id for this delivery.
    pub event_id: EventId,
    /// The publisher's key for the logical operation, if any.
    pub idempotency_key: Option<IdempotencyKey>,
    /// The aggregate it belongs to.
    pub aggregate: AggregateKey,
    /// Its sequence in the aggregate (0 for an unordered `json` event without one).
    pub sequence: i64,
    /// Its type as logged (empty when the kind locates none).
    pub event_type: String,
    /// Whether the rules may hold it for a gap (an in-order event).
    pub may_hold: bool,
    /// Why a source that orders its events applies this one unordered (docs/contract.md,
    /// missing locations); `None`: ordered as its source says.
    pub unordered: Option<String>,
    /// The kind's own parse of the body, for settling at ingest without parsing it again.
    pub parsed: Option<ParsedBody>,
}

/// A kind's own parse of a delivery's body, carried from ingress to the settle that
/// decides the event at ingest, so that the body is parsed once (a second parse showed in
/// the instruction counts: docs/benchmarks.md). One variant per kind; only the kind that
/// made it reads it ([`Parsed`]), every other layer passes it on. Rows read back from the
/// store have none: their kind parses the stored body.
#[derive(Clone)]
pub enum ParsedBody {
    /// A presence event.
    Presence(Arc<presence::PresenceEvent>),
    /// A save-game event.
    Save(Arc<save::SaveEvent>),
    /// The state a json event's body holds at its source's `state` location.
    Json(Arc<json::LocatedState>),
}

/// A kind's parsed form: what it puts in a [`ParsedBody`] and finds there again.
pub trait Parsed: Sized {
    /// Wraps the parsed form.
    fn into_parsed(self) -> ParsedBody;

    /// The parsed form, if `parsed` holds this kind's.
    fn from_parsed(parsed: &ParsedBody) -> Option<&Self>;
}

impl fmt::Debug for ParsedBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ParsedBody(..)")
    }
}

/// Two parses of the same delivery are equal: the parsed form is a function of the
/// body, kept only to save the work, so it never tells two deliveries apart.
impl PartialEq for ParsedBody {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

/// What a kind makes of one verified delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// An event to log and order.
    Event(EventFields),
    /// A type the source does not accept: `200 ignored_unsupported`, logged as such
    /// (decided at once, never settled) when its event id can be read.
    Ignored {
        /// The fields it is logged under; `None` when its event id cannot be read.
        event: Option<EventFields>,
        /// The type that was not accepted.
        event_type: Option<String>,
    },
}

/// A pending event row as the store loads it: the logged columns and the raw body.
/// Kinds settle from these, never from request headers (a `json` source's
/// `header:` locations are in the columns, not in the body).
#[derive(Debug, Clone)]
pub struct PendingRow {
    /// The log row id.
    pub row: i64,
    /// The logged event_id.
    pub event_id: String,
    /// The logged event type.
    pub event_type: String,
    /// The logged sequence.
    pub sequence: i64,
    /// The logged idempotency key.
    pub idempotency_key: Option<String>,
    /// The raw body.
    pub body: Vec<u8>,
    /// Time of receipt, unix milliseconds.
    pub received_at_ms: i64,
    /// Whether a person replayed it.
    pub replayed: bool,
    /// Whether it was already held before this step.
    pub was_held: bool,
    /// Whether it is applied unordered though its source orders events: it carries no version.
    pub unordered: bool,
    /// The kind's parse of the body when the row arrives in this request, not read back.
    pub parsed: Option<ParsedBody>,
}

impl PendingRow {
    /// The kind's parse of the body carried from ingress, if it is a `T`.
    pub fn parsed_as<T: Parsed>(&self) -> Option<&T> {
        self.parsed.as_ref().and_then(T::from_parsed)
    }

    /// The kind's parse carried from ingress, else `parse` of the stored body and event id
    /// (a row read back from the store, after a restart or a replay).
    pub fn parsed_or<T: Parsed + Clone, E>(
        &self,
        parse: impl FnOnce(&[u8], &str) -> Result<T, E>,
    ) -> Result<T, E> {
        match self.parsed_as::<T>() {
            Some(parsed) => Ok(parsed.clone()),
            None => parse(&self.body, &self.event_id),
        }
    }
}

/// Everything a kind decides one aggregate from.
#[derive(Debug, Clone, Copy)]
pub struct SettleInput<'a> {
    /// The aggregate, in stored form.
    pub aggregate: &'a str,
    /// Its stored state, if it has one.
    pub before: Option<&'a AggregateState>,
    /// The pending rows read (arrivals, and the held events in reach).
    pub rows: &'a [PendingRow],
    /// In-order kinds: the decided sequences from the lowest one settling needs on.
    pub occupied: &'a BTreeSet<i64>,
    /// The source's first sequence.
    pub first_sequence: i64,
    /// Now, unix milliseconds.
    pub now_ms: i64,
    /// How long an in-order event waits for a gap, in milliseconds.
    pub hold_timeout_ms: i64,
}

impl SettleInput<'_> {
    /// The watermark settling starts from: the stored one, or the one before the first sequence.
    pub fn watermark(&self) -> i64 {
        self.before
            .and_then(|b| b.watermark)
            .unwrap_or(self.first_sequence.saturating_sub(1))
    }
}

/// What a kind decided about one aggregate.
#[derive(Debug, Clone, PartialEq)]
pub struct KindPlan {
    /// The aggregate's state afterwards (`None`: it still has none).
    pub state: Option<AggregateState>,
    /// Every pending row's outcome.
    pub decisions: Vec<(i64, Outcome)>,
    /// Missing sequences skipped by a hold timeout.
    pub gaps_skipped: u64,
    /// Events applied on a sequence equal to the current one (latest-wins `json`).
    pub ties: u64,
    /// The aggregate's current sequence afterwards, for a stale answer.
    pub current_sequence: Option<i64>,
    /// In-order kinds: the new watermark and floor, to check which held events were left out.
    pub reach: Option<(i64, Option<i64>)>,
}

/// One kind of source: its contract, its rules and its views.
pub trait Kind: Send + Sync + fmt::Debug + 'static {
    /// The `kind` a source of it is configured with.
    fn source_kind(&self) -> SourceKind;

    /// The format its deliveries' bodies come in: what ingress accepts, `inhook send` sends
    /// and the forwarder labels them as.
    fn body_format(&self) -> crate::domain::contract::body::BodyFormat {
        crate::domain::contract::body::BodyFormat::Json
    }

    /// Whether an event's id is the SHA-256 of its body, so that a duplicate found by its
    /// id was found by its body (docs/configuration.md, `event_id = "body"`).
    fn ids_events_by_body(&self) -> bool {
        false
    }

    /// What decides how its deliveries are read (a configured kind's settings, in a form
    /// that compares equal exactly when they are the same); empty for a built-in kind,
    /// whose contract is fixed. A reload may not change it: it would split the aggregates
    /// already logged from new ones.
    fn contract_settings(&self) -> String {
        String::new()
    }

    /// The kind itself, for code of that kind's own (its tools) to read its settings.
    fn as_any(&self) -> &dyn Any;

    /// Parses a verified delivery, reading the body once: `delivery_id` is the
    /// signature scheme's, if it carries one.
    fn parse(
        &self,
        body: &[u8],
        headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<Delivery, ContractError>;

    /// Whether events may wait for lower sequences: the store then loads held events
    /// and decided sequences for it to settle from.
    fn in_order(&self) -> bool;

    /// How an event of `event_type` is ordered when forwarded.
    fn delivery_order(&self, event_type: &str) -> DeliveryOrder;

    /// Decides the pending rows and produces the new state. Pure.
    fn settle(&self, input: &SettleInput<'_>) -> KindPlan;

    /// The kind's state in its API shape, judged at `now_ms`.
    fn view(&self, stored: &AggregateState, now_ms: i64) -> Value;

    /// Masks, in a [`Kind::view`], what came from the body.
    fn mask(&self, view: &mut Value, fields: &[String]);

    /// Masks, in a [`Kind::stream_state`], what came from the body.
    fn mask_stream_state(&self, state: &mut Value, fields: &[String]) {
        self.mask(state, fields);
    }

    /// The state a change carries on `/v1/stream`: the kind's view.
    fn stream_state(&self, source: &str, stored: &AggregateState, now_ms: i64) -> Value {
        let _ = source;
        self.view(stored, now_ms)
    }

    /// [`Kind::stream_state`] as the text a change row keeps (read back as a JSON value).
    fn stream_text(&self, source: &str, stored: &AggregateState, now_ms: i64) -> String {
        self.stream_state(source, stored, now_ms).to_string()
    }
}

/// The kind of a source of `kind` with default settings (a `json` source's is
/// unordered, keyed by event id; configured ones come from [`json::JsonKind::new`]).
pub fn built_in(kind: SourceKind, stale_after_ms: i64) -> Arc<dyn Kind> {
    let unordered = JsonSourceSpec {
        ordering: Some("unordered".into()),
        ..Default::default()
    };
    kind.configure(&unordered, stale_after_ms)
        .expect("an unordered source needs no other key")
}

/// The generic API item of a stored aggregate (docs/contract.md, json sources), the kind's view
/// under `state`.
pub fn aggregate_view(
    source: &str,
    kind: &dyn Kind,
    stored: &AggregateState,
    now_ms: i64,
    mask_fields: &[String],
) -> Value {
    let mut state = kind.view(stored, now_ms);
    kind.mask(&mut state, mask_fields);
    json!({
        "source": source,
        "aggregate": AggregateKey::text_of_stored(&stored.aggregate),
        "sequence": stored.sequence,
        "event_id": stored.event_id,
        "event_type": stored.event_type.as_deref().filter(|t| !t.is_empty()),
        "state": state,
        "updated_at": (stored.updated_at_ms > 0).then(|| crate::domain::clock::rfc3339(stored.updated_at_ms)),
    })
}

/// The outcome of a stored row whose body no longer follows its kind's contract.
pub(crate) fn invalid_for_projection(problem: impl fmt::Display) -> Outcome {
    Outcome::dead(
        DeadReason::InvalidForProjection,
        format!("stored body no longer follows the contract: {problem}"),
    )
}

/// The last applied row of `decisions`, in the order decided.
pub(crate) fn last_applied<'a>(
    rows: &'a [PendingRow],
    decisions: &[(i64, Outcome)],
) -> Option<&'a PendingRow> {
    decisions
        .iter()
        .rev()
        .find(|(_, o)| *o == Outcome::Applied)
        .and_then(|(row, _)| rows.iter().find(|r| r.row == *row))
}
#[cfg(test)]
mod tests {
    use super::*;

    /// Parses `body` as a source of `kind` would, the delivery id a scheme carried as `fallback`.
    fn parse(
        kind: SourceKind,
        body: &[u8],
        fallback: Option<&str>,
    ) -> Result<EventFields, ContractError> {
        match built_in(kind, 0).parse(body, &HeaderMap::new(), fallback)? {
            Delivery::Event(fields) => Ok(fields),
            Delivery::Ignored { .. } => panic!("the built-in kinds accept every type they parse"),
        }
    }

    const PRESENCE: &[u8] = br#"{"user_id":"u","presence":"AWAY","sequence_number":3}"#;

    #[test]
    fn a_missing_event_id_takes_the_delivery_id() {
        let event = parse(SourceKind::Presence, PRESENCE, Some("msg_1")).unwrap();
        assert_eq!(event.event_id.as_str(), "msg_1");
        let save = br#"{"event_type":"progress.saved","player_id":"p","save_slot":"s",
            "sequence":1,"idempotency_key":"k","data":{}}"#;
        let event = parse(SourceKind::SaveGame, save, Some("msg_2")).unwrap();
        assert_eq!(event.event_id.as_str(), "msg_2");
    }

    #[test]
    fn the_bodys_event_id_wins_over_the_delivery_id() {
        let body =
            br#"{"event_id":"evt_body","user_id":"u","presence":"AWAY","sequence_number":3}"#;
        let event = parse(SourceKind::Presence, body, Some("msg_1")).unwrap();
        assert_eq!(event.event_id.as_str(), "evt_body");
        // A body's bad event_id is still its own problem, not replaced by the header.
        let bad = br#"{"event_id":7,"user_id":"u","presence":"AWAY","sequence_number":3}"#;
        let err = parse(SourceKind::Presence, bad, Some("msg_1")).unwrap_err();
        assert_eq!(err.problems[0].field, "event_id");
    }

    #[test]
    fn without_a_fallback_a_missing_event_id_is_still_a_400() {
        for fallback in [None, Some(""), Some("\u{7}bell")] {
            let err = parse(SourceKind::Presence, PRESENCE, fallback).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{err}");
            assert_eq!(err.problems[0].field, "event_id");
        }
        let err = parse(SourceKind::Presence, PRESENCE, None).unwrap_err();
        assert_eq!(err.problems[0].problem, "is required");
        let long = "x".repeat(129);
        let err = parse(SourceKind::Presence, PRESENCE, Some(&long)).unwrap_err();
        assert!(
            err.problems[0].problem.contains("delivery id header"),
            "{err}"
        );
    }

    /// Any JSON value, a few levels deep.
    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[ -~]{0,12}".prop_map(Value::from),
            "\\PC{0,4}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z_]{1,12}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// The contracts' own field names, so generated bodies come near a valid one.
    const FIELDS: [&str; 17] = [
        "event_id",
        "user_id",
        "presence",
        "sequence_number",
        "timestamp",
        "idempotency_key",
        "event_type",
        "payload_version",
        "occurred_at",
        "player_id",
        "save_slot",
        "sequence",
        "data",
        "added_items",
        "removed_items",
        "items",
        "qty",
    ];

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]

        /// The fuzz target `contract` in miniature, so CI checks it without nightly:
        /// hostile bodies never panic, problems are always named, and a fallback
        /// event id changes nothing but a missing `event_id`.
        #[test]
        fn hostile_bodies_are_named_problems_never_panics(
            fields in proptest::collection::vec((0..FIELDS.len(), json_value()), 0..10),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
            as_raw in proptest::prelude::any::<bool>(),
        ) {
            let body = if as_raw {
                raw
            } else {
                let map: serde_json::Map<String, serde_json::Value> =
                    fields.into_iter().map(|(i, v)| (FIELDS[i].to_owned(), v)).collect();
                serde_json::to_vec(&map).unwrap()
            };
            for kind in [SourceKind::Presence, SourceKind::SaveGame] {
                let plain = parse(kind, &body, None);
                if let Err(err) = &plain {
                    proptest::prop_assert!(!err.problems.is_empty());
                }
                let with = parse(kind, &body, Some("msg_prop"));
                match (&plain, &with) {
                    (Ok(a), b) => proptest::prop_assert_eq!(Some(a), b.as_ref().ok()),
                    (Err(_), Ok(b)) => proptest::prop_assert_eq!(b.event_id.as_str(), "msg_prop"),
                    (Err(_), Err(_)) => {}
                }
            }
        }
    }
}
