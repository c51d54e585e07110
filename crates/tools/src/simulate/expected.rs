//! The expected state: the library's own ordering and projection rules,
//! applied once, in order, to each aggregate's stream. Whatever the chaos,
//! the server must end in this state.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{json, Map, Value};

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use super::stream::{new_event_id, Aggregate, AggregateRef, Stream, StreamEvent};
use inhook::domain::kind::json::contract::{JsonContract, JsonEvent, JsonOrdering, JsonParsed};
use inhook::domain::kind::presence::decide_presence;
use inhook::domain::kind::presence::PresenceState;
use inhook::domain::kind::presence::{Presence, PresenceEvent};
use inhook::domain::kind::save::SaveEvent;
use inhook::domain::kind::save::SaveState;
use inhook::domain::kind::SourceKind;
use inhook::domain::ordering::Outcome;

/// The state an aggregate must reach: what applying its stream once, in order, gives.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// A presence user.
    Presence {
        /// The presence of the newest event.
        status: Presence,
        /// Its sequence.
        sequence: i64,
    },
    /// A save slot.
    Save {
        /// The highest contiguous sequence.
        last_sequence: i64,
        /// The latest progress, if any.
        progress: Option<Map<String, Value>>,
        /// Item id to quantity, zero quantities absent.
        inventory: BTreeMap<String, i64>,
        /// Unlocked achievements.
        achievements: BTreeSet<String>,
    },
    /// An aggregate of a `json` source.
    Json {
        /// The sequence of the event whose state it holds (null when the source locates none).
        sequence: Option<i64>,
        /// That event's value at `state` (null when absent).
        state: Value,
        /// The same event's state had its new-id redelivery arrived first (the
        /// original is then its duplicate): it differs where the state holds the id.
        redelivered_state: Option<Value>,
    },
}

/// The in-order state of one aggregate, or `None` when it has no events (the API then answers 404).
fn expected_state(aggregate: &Aggregate) -> Option<Expected> {
    let last = aggregate.events.last()?;
    let bodies = aggregate
        .events
        .iter()
        .map(|e| serde_json::to_vec(&e.body).unwrap_or_default());
    match aggregate.key.kind() {
        SourceKind::Presence => {
            let mut state: Option<PresenceState> = None;
            for body in bodies {
                let event = PresenceEvent::parse(&body).expect("generated presence bodies parse");
                if decide_presence(state.as_ref(), &event) == Outcome::Applied {
                    state = Some(PresenceState::from_event(&event, 0));
                }
            }
            state.map(|s| Expected::Presence {
                status: s.presence,
                sequence: s.sequence.get(),
            })
        }
        SourceKind::SaveGame => {
            let mut state = SaveState::empty(1);
            for body in bodies {
                let event = SaveEvent::parse(&body).expect("generated save-game bodies parse");
                // An event the rules refuse leaves the state as it was, as on the server.
                let _ = state.apply(&event, 0);
            }
            Some(Expected::Save {
                last_sequence: last.sequence,
                progress: state.progress,
                inventory: state.inventory,
                achievements: state.achievements,
            })
        }
        // A json aggregate's rules are its source's: see `expected_json_state`.
        SourceKind::Json => None,
    }
}

/// The state of one aggregate of a `json` source: the `state` value of the event
/// its ordering keeps (latest-wins: the highest sequence; in-order: the last in
/// order; unordered: its one event), as the source's own contract reads it.
/// Events of types outside `event_types` change nothing; none left answers 404.
fn expected_json_state(aggregate: &Aggregate, contract: &JsonContract) -> Option<Expected> {
    let read = |event: &StreamEvent| -> JsonEvent {
        let body = serde_json::to_vec(&event.body).unwrap_or_default();
        let mut headers = HeaderMap::new();
        for (name, value) in &event.headers {
            if let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                headers.append(name, value);
            }
        }
        match contract.parse_bytes(&body, &headers, event.delivery_id()) {
            Ok(JsonParsed::Event(parsed)) => parsed,
            other => panic!("a generated json body is an event of its source: {other:?}"),
        }
    };
    let mut applied = aggregate.events.iter().filter(|e| !e.unsupported);
    let kept = match contract.ordering() {
        // The generator never ties an aggregate's highest sequence.
        JsonOrdering::LatestWins => applied.max_by_key(|e| e.sequence)?,
        JsonOrdering::InOrder | JsonOrdering::Unordered => applied.next_back()?,
    };
    let event = read(kept);
    let redelivered_state = kept.idempotency_key.as_ref().map(|_| {
        read(&kept.redelivered_as(&new_event_id(&kept.event_id)))
            .state
            .unwrap_or(Value::Null)
    });
    Some(Expected::Json {
        sequence: event.sequence.map(|s| s.value.get()),
        state: event.state.unwrap_or(Value::Null),
        redelivered_state,
    })
}

/// The expected state of every aggregate of the stream, in the stream's order.
pub fn expected_states(stream: &Stream) -> Vec<(AggregateRef, Option<Expected>)> {
    stream
        .aggregates
        .iter()
        .map(|a| (a.key.clone(), expected_state(a)))
        .collect()
}

/// The expected state of every aggregate of a `json` source's stream, read with its contract.
pub fn expected_json_states(
    stream: &Stream,
    contract: &JsonContract,
) -> Vec<(AggregateRef, Option<Expected>)> {
    stream
        .aggregates
        .iter()
        .map(|a| (a.key.clone(), expected_json_state(a, contract)))
        .collect()
}

impl Expected {
    /// Whether a read API answer body shows this state (only the fields the stream decides).
    pub(super) fn matches(&self, got: &Value) -> bool {
        match self {
            Expected::Presence { status, sequence } => {
                got["status"] == status.as_str() && got["sequence"] == *sequence
            }
            Expected::Save {
                last_sequence,
                progress,
                inventory,
                achievements,
            } => {
                let progress_ok = match progress {
                    Some(p) => got["progress"].as_object() == Some(p),
                    None => got["progress"].is_null(),
                };
                let inventory_got: Option<BTreeMap<String, i64>> =
                    serde_json::from_value(got["inventory"].clone()).ok();
                let achievements_got: Option<BTreeSet<String>> =
                    serde_json::from_value(got["achievements"].clone()).ok();
                got["last_sequence"] == *last_sequence
                    && progress_ok
                    && inventory_got.as_ref() == Some(inventory)
                    && achievements_got.as_ref() == Some(achievements)
            }
            Expected::Json {
                sequence,
                state,
                redelivered_state,
            } => {
                got["sequence"] == json!(sequence)
                    && (got["state"] == *state || redelivered_state.as_ref() == Some(&got["state"]))
            }
        }
    }

    /// The state in the read API's shape, for mismatch reports.
    pub(super) fn to_json(&self) -> Value {
        match self {
            Expected::Presence { status, sequence } => {
                json!({"status": status.as_str(), "sequence": sequence})
            }
            Expected::Save {
                last_sequence,
                progress,
                inventory,
                achievements,
            } => json!({"last_sequence": last_sequence, "progress": progress,
                        "inventory": inventory, "achievements": achievements}),
            Expected::Json {
                sequence, state, ..
            } => json!({"sequence": sequence, "state": state}),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simulate::stream::object;

    #[test]
    fn expected_state_is_the_in_order_result() {
        let user = Aggregate {
            key: AggregateRef::User("u".into()),
            events: [("ONLINE", 1), ("BUSY", 2), ("OFFLINE", 3)]
                .iter()
                .map(|(p, s)| {
                    StreamEvent::built_in(
                        format!("e{s}"),
                        None,
                        *s,
                        object(
                            json!({"event_id": format!("e{s}"), "user_id": "u", "presence": p, "sequence_number": s}),
                        ),
                    )
                })
                .collect(),
        };
        assert_eq!(
            expected_state(&user),
            Some(Expected::Presence {
                status: Presence::Offline,
                sequence: 3
            })
        );
        let save = |seq: i64, event_type: &str, data: Value| {
            StreamEvent::built_in(
                format!("s{seq}"),
                Some(format!("k{seq}")),
                seq,
                object(
                    json!({"event_id": format!("s{seq}"), "event_type": event_type,
                "player_id": "p", "save_slot": "a", "sequence": seq,
                "idempotency_key": format!("k{seq}"), "data": data}),
                ),
            )
        };
        let slot = Aggregate {
            key: AggregateRef::Slot {
                player_id: "p".into(),
                save_slot: "a".into(),
            },
            events: vec![
                save(
                    1,
                    "inventory.updated",
                    json!({"added_items": [{"item_id": "gem", "qty": 3}]}),
                ),
                save(
                    2,
                    "inventory.snapshot",
                    json!({"items": [{"item_id": "gem", "qty": 1}]}),
                ),
                save(
                    3,
                    "inventory.updated",
                    json!({"removed_items": [{"item_id": "gem", "qty": 1}],
                                                    "added_items": [{"item_id": "key", "qty": 2}]}),
                ),
                save(
                    4,
                    "achievement.unlocked",
                    json!({"achievement_id": "first"}),
                ),
                save(5, "progress.saved", json!({"chapter": 2})),
                save(6, "quest.started", json!({})),
            ],
        };
        let want = Expected::Save {
            last_sequence: 6,
            progress: Some(object(json!({"chapter": 2}))),
            inventory: BTreeMap::from([("key".to_owned(), 2)]),
            achievements: BTreeSet::from(["first".to_owned()]),
        };
        assert_eq!(expected_state(&slot), Some(want.clone()));
        let api = json!({"player_id": "p", "save_slot": "a", "last_sequence": 6,
            "progress": {"chapter": 2}, "inventory": {"key": 2}, "achievements": ["first"],
            "updated_at": "2026-01-01T00:00:00Z"});
        assert!(want.matches(&api));
        let mut behind = api.clone();
        behind["last_sequence"] = json!(5);
        assert!(!want.matches(&behind));
        let mut extra = api;
        extra["inventory"]["gem"] = json!(1);
        assert!(!want.matches(&extra));
        assert_eq!(
            expected_state(&Aggregate {
                key: AggregateRef::User("none".into()),
                events: vec![]
            }),
            None
        );
    }

    #[test]
    fn the_expected_state_in_the_api_shape_is_what_it_matches() {
        let presence = Expected::Presence {
            status: Presence::Busy,
            sequence: 4,
        };
        let shown = presence.to_json();
        assert_eq!(shown["sequence"], 4);
        assert_eq!(shown["status"], Presence::Busy.as_str());
        assert!(presence.matches(&shown));
        let mut older = shown.clone();
        older["sequence"] = json!(3);
        assert!(!presence.matches(&older));
        let mut other = shown;
        other["status"] = json!(Presence::Online.as_str());
        assert!(!presence.matches(&other));

        let save = Expected::Save {
            last_sequence: 2,
            progress: None,
            inventory: BTreeMap::from([("gem".to_owned(), 1)]),
            achievements: BTreeSet::new(),
        };
        let shown = save.to_json();
        assert!(shown["progress"].is_null());
        assert!(save.matches(&shown));
        let mut with_progress = shown;
        with_progress["progress"] = json!({"chapter": 1});
        assert!(
            !save.matches(&with_progress),
            "progress where none is expected"
        );
    }

    #[test]
    fn a_json_aggregate_expects_the_state_of_the_event_its_ordering_keeps() {
        use crate::simulate::json_body::tests::{target, LATEST};
        use crate::simulate::json_body::{generate_json, SequenceFormat};
        use crate::simulate::stream::StreamSpec;

        let target = target(LATEST, SequenceFormat::Integer);
        let stream = generate_json(
            &StreamSpec {
                seed: 9,
                events: 200,
                aggregates: 5,
                presence_share: 0.0,
            },
            &target,
        );
        let expected = expected_json_states(&stream, &target.contract);
        assert_eq!(expected.len(), 5);
        for (aggregate, (key, want)) in stream.aggregates.iter().zip(&expected) {
            assert_eq!(&aggregate.key, key);
            let top = aggregate
                .events
                .iter()
                .filter(|e| !e.unsupported)
                .max_by_key(|e| e.sequence)
                .unwrap();
            let Some(Expected::Json {
                sequence,
                state,
                redelivered_state,
            }) = want
            else {
                panic!("a json expectation: {want:?}");
            };
            assert_eq!(*sequence, Some(top.sequence));
            assert_eq!(state, &top.body["data"]["object"]);
            // The state holds no id here, so a new-id redelivery keeps the same state.
            assert_eq!(redelivered_state.as_ref(), Some(state));
            let api = json!({"source": "src", "sequence": top.sequence, "state": state});
            assert!(want.as_ref().unwrap().matches(&api));
            let mut older = api.clone();
            older["sequence"] = json!(top.sequence - 1);
            assert!(!want.as_ref().unwrap().matches(&older));
            let mut other = api;
            other["state"]["note"] = json!("another event's");
            assert!(!want.as_ref().unwrap().matches(&other));
        }
        // An aggregate whose every event is of an unsupported type has no state: 404.
        let mut only_unsupported = stream.aggregates[0].clone();
        only_unsupported.events.retain(|e| e.unsupported);
        assert!(!only_unsupported.events.is_empty());
        assert_eq!(
            expected_json_state(&only_unsupported, &target.contract),
            None
        );
    }

    #[test]
    fn a_json_state_holding_the_event_id_may_be_the_new_id_redelivery_s() {
        let want = Expected::Json {
            sequence: None,
            state: json!({"id": "evt_1"}),
            redelivered_state: Some(json!({"id": "evt_1_dup"})),
        };
        assert!(want.matches(&json!({"sequence": null, "state": {"id": "evt_1"}})));
        assert!(want.matches(&json!({"sequence": null, "state": {"id": "evt_1_dup"}})));
        assert!(!want.matches(&json!({"sequence": null, "state": {"id": "evt_2"}})));
        assert!(!want.matches(&json!({"sequence": 1, "state": {"id": "evt_1"}})));
        assert_eq!(
            want.to_json(),
            json!({"sequence": null, "state": {"id": "evt_1"}})
        );
    }
}
