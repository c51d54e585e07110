//! Payload contracts (docs/contract.md, ingress): the raw body of a verified delivery becomes a
//! typed event, or a list of problems that name each bad field. No I/O.

pub mod body;
mod fields;
pub mod json;
pub mod presence;
pub mod save;

use serde::Serialize;

use crate::domain::{AggregateKey, EventId, IdempotencyKey, Sequence};

pub use presence::{Presence, PresenceEvent};
pub use save::{ItemQty, SaveChange, SaveEvent};

/// What kind of projection a source feeds, and so which contract its bodies follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum SourceKind {
    /// Remote-worker presence (first seed).
    Presence,
    /// Game saves (second seed).
    SaveGame,
    /// Any publisher's JSON, its fields located by configuration (docs/contract.md, json sources).
    Json,
}

/// One bad field of a body, as reported in a 400 answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct FieldProblem {
    /// Path of the field, e.g. `sequence` or `data.added_items[0].qty`; `$` is the whole body.
    pub field: String,
    /// What is wrong with it.
    pub problem: String,
}

/// A body that does not follow its source's contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContractError {
    /// Every problem found, in field order.
    pub problems: Vec<FieldProblem>,
}

impl std::fmt::Display for ContractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, p) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", p.field, p.problem)?;
        }
        Ok(())
    }
}

/// A verified delivery, parsed by its source's contract.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A presence change.
    Presence(PresenceEvent),
    /// A save-game event.
    Save(SaveEvent),
}

impl Event {
    /// Parses a raw body with the contract of `kind`.
    pub fn parse(kind: SourceKind, body: &[u8]) -> Result<Self, ContractError> {
        Self::parse_with_fallback(kind, body, None)
    }

    /// Parses a raw body with the contract of `kind`; a body without an
    /// `event_id` takes `fallback_event_id`, the delivery id a signature
    /// scheme carries (`webhook-id`, `X-GitHub-Delivery`, …), so publishers
    /// that name deliveries only in headers still deduplicate.
    pub fn parse_with_fallback(
        kind: SourceKind,
        body: &[u8],
        fallback_event_id: Option<&str>,
    ) -> Result<Self, ContractError> {
        match kind {
            SourceKind::Presence => {
                PresenceEvent::parse_with_fallback(body, fallback_event_id).map(Event::Presence)
            }
            SourceKind::SaveGame => {
                SaveEvent::parse_with_fallback(body, fallback_event_id).map(Event::Save)
            }
            SourceKind::Json => Err(ContractError {
                problems: vec![FieldProblem {
                    field: "$".into(),
                    problem: "a json source's bodies are read by its configured locations".into(),
                }],
            }),
        }
    }

    /// The publisher's id for this delivery.
    pub fn event_id(&self) -> &EventId {
        match self {
            Event::Presence(e) => &e.event_id,
            Event::Save(e) => &e.event_id,
        }
    }

    /// The publisher's key for the logical operation, if any.
    pub fn idempotency_key(&self) -> Option<&IdempotencyKey> {
        match self {
            Event::Presence(e) => e.idempotency_key.as_ref(),
            Event::Save(e) => Some(&e.idempotency_key),
        }
    }

    /// The aggregate the event belongs to.
    pub fn aggregate(&self) -> AggregateKey {
        match self {
            Event::Presence(e) => AggregateKey::User(e.user_id.clone()),
            Event::Save(e) => AggregateKey::SaveSlot {
                player_id: e.player_id.clone(),
                save_slot: e.save_slot.clone(),
            },
        }
    }

    /// The event's sequence in its aggregate.
    pub fn sequence(&self) -> Sequence {
        match self {
            Event::Presence(e) => e.sequence,
            Event::Save(e) => e.sequence,
        }
    }

    /// The event type as logged: `presence.changed` for presence events.
    pub fn event_type(&self) -> &str {
        match self {
            Event::Presence(_) => presence::EVENT_TYPE,
            Event::Save(e) => e.event_type.as_str(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENCE: &[u8] = br#"{"user_id":"u","presence":"AWAY","sequence_number":3}"#;

    #[test]
    fn a_missing_event_id_takes_the_delivery_id() {
        let event =
            Event::parse_with_fallback(SourceKind::Presence, PRESENCE, Some("msg_1")).unwrap();
        assert_eq!(event.event_id().as_str(), "msg_1");
        let save = br#"{"event_type":"progress.saved","player_id":"p","save_slot":"s",
            "sequence":1,"idempotency_key":"k","data":{}}"#;
        let event = Event::parse_with_fallback(SourceKind::SaveGame, save, Some("msg_2")).unwrap();
        assert_eq!(event.event_id().as_str(), "msg_2");
    }

    #[test]
    fn the_bodys_event_id_wins_over_the_delivery_id() {
        let body =
            br#"{"event_id":"evt_body","user_id":"u","presence":"AWAY","sequence_number":3}"#;
        let event = Event::parse_with_fallback(SourceKind::Presence, body, Some("msg_1")).unwrap();
        assert_eq!(event.event_id().as_str(), "evt_body");
        // A body's bad event_id is still its own problem, not replaced by the header.
        let bad = br#"{"event_id":7,"user_id":"u","presence":"AWAY","sequence_number":3}"#;
        let err = Event::parse_with_fallback(SourceKind::Presence, bad, Some("msg_1")).unwrap_err();
        assert_eq!(err.problems[0].field, "event_id");
    }

    #[test]
    fn without_a_fallback_a_missing_event_id_is_still_a_400() {
        for fallback in [None, Some(""), Some("\u{7}bell")] {
            let err =
                Event::parse_with_fallback(SourceKind::Presence, PRESENCE, fallback).unwrap_err();
            assert_eq!(err.problems.len(), 1, "{err}");
            assert_eq!(err.problems[0].field, "event_id");
        }
        let err = Event::parse(SourceKind::Presence, PRESENCE).unwrap_err();
        assert_eq!(err.problems[0].problem, "is required");
        let long = "x".repeat(129);
        let err =
            Event::parse_with_fallback(SourceKind::Presence, PRESENCE, Some(&long)).unwrap_err();
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
                let plain = Event::parse(kind, &body);
                if let Err(err) = &plain {
                    proptest::prop_assert!(!err.problems.is_empty());
                }
                let with = Event::parse_with_fallback(kind, &body, Some("msg_prop"));
                match (&plain, &with) {
                    (Ok(a), b) => proptest::prop_assert_eq!(Some(a), b.as_ref().ok()),
                    (Err(_), Ok(b)) => proptest::prop_assert_eq!(b.event_id().as_str(), "msg_prop"),
                    (Err(_), Err(_)) => {}
                }
            }
        }
    }
}
