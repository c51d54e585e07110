//! The presence kind (docs/contract.md): latest-wins by `sequence_number`; its state is
//! the presence, tagged for `?status=` filters; `stale` is judged when read.

use axum::http::HeaderMap;
use serde_json::{json, Value};

pub mod contract;
pub mod projection;
pub mod rules;

pub use contract::{Presence, PresenceEvent, EVENT_TYPE};
pub use projection::{presence_view, PresenceState, PresenceView};
pub use rules::decide_presence;

use super::{
    invalid_for_projection, last_applied, Delivery, DeliveryOrder, EventFields, Kind, KindPlan,
    Lane, ParsedBody, SettleInput,
};
use super::{AggregateState, CorruptState, SourceKind};
use crate::domain::contract::ContractError;
use crate::domain::ordering::Outcome;
use crate::domain::{AggregateKey, Mode, Sequence};
use crate::ingress::signature::Scheme;

/// A presence source answers with the outcome: the publisher learns at once whether its
/// change applied.
pub const DEFAULT_MODE: Mode = Mode::Sync;
/// The first seed's signature: HMAC-SHA256 of the body, in hex.
pub const DEFAULT_SCHEME: Scheme = Scheme::HmacHex;

/// Remote-worker presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PresenceKind {
    /// After how long without an update a presence is shown stale.
    pub stale_after_ms: i64,
}

impl PresenceEvent {
    /// The fields every layer needs of a presence event.
    pub fn fields(&self) -> EventFields {
        EventFields {
            event_id: self.event_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            aggregate: self.aggregate(),
            sequence: self.sequence.get(),
            event_type: EVENT_TYPE.to_owned(),
            may_hold: false,
            unordered: None,
            parsed: None,
        }
    }

    /// The aggregate it belongs to: its user.
    pub fn aggregate(&self) -> AggregateKey {
        AggregateKey::one(self.user_id.clone())
    }

    /// The delivery this event makes, carrying the event itself as its parsed body.
    pub fn into_delivery(self) -> Delivery {
        let fields = self.fields();
        Delivery::Event(EventFields {
            parsed: Some(super::Parsed::into_parsed(self)),
            ..fields
        })
    }
}

/// A stored presence in its typed form.
pub fn presence_state(stored: &AggregateState) -> Result<PresenceState, CorruptState> {
    let raw = stored.state.get("presence").and_then(Value::as_str);
    let presence = raw
        .and_then(Presence::parse)
        .ok_or_else(|| CorruptState(format!("unknown presence {raw:?} in store")))?;
    let sequence = stored
        .sequence
        .and_then(Sequence::new)
        .ok_or_else(|| CorruptState("presence without a sequence in store".into()))?;
    Ok(PresenceState {
        presence,
        sequence,
        updated_at_ms: stored.updated_at_ms,
    })
}

/// The stored form of a presence.
fn stored_of(aggregate: &str, state: &PresenceState, event_id: Option<String>) -> AggregateState {
    AggregateState {
        aggregate: aggregate.to_owned(),
        sequence: Some(state.sequence.get()),
        event_id,
        event_type: Some(EVENT_TYPE.to_owned()),
        state: json!({"presence": state.presence.as_str()}),
        tag: Some(state.presence.as_str().to_owned()),
        watermark: None,
        skipped_gaps: None,
        updated_at_ms: state.updated_at_ms,
    }
}

impl Kind for PresenceKind {
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }

    fn source_kind(&self) -> SourceKind {
        SourceKind::Presence
    }

    fn parse(
        &self,
        body: &[u8],
        _headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<Delivery, ContractError> {
        PresenceEvent::parse_with_fallback(body, delivery_id).map(PresenceEvent::into_delivery)
    }

    fn in_order(&self) -> bool {
        false
    }

    fn delivery_order(&self, _event_type: &str) -> DeliveryOrder {
        DeliveryOrder::LatestWins(Lane::Aggregate)
    }

    fn settle(&self, input: &SettleInput<'_>) -> KindPlan {
        let mut decisions = Vec::with_capacity(input.rows.len());
        let mut parsed = Vec::with_capacity(input.rows.len());
        for row in input.rows {
            let event =
                row.parsed_or(|body, id| PresenceEvent::parse_with_fallback(body, Some(id)));
            match event {
                Ok(event) => parsed.push((row.row, event)),
                Err(err) => decisions.push((row.row, invalid_for_projection(err))),
            }
        }
        parsed.sort_by_key(|(row, e)| (e.sequence, *row));
        let before = input.before.and_then(|b| presence_state(b).ok());
        let mut state = before.clone();
        for (row, event) in parsed {
            let outcome = decide_presence(state.as_ref(), &event);
            if outcome == Outcome::Applied {
                state = Some(PresenceState::from_event(&event, input.now_ms));
            }
            decisions.push((row, outcome));
        }
        let current_sequence = state.as_ref().map(|s| s.sequence.get());
        let stored = match (&state, last_applied(input.rows, &decisions)) {
            (Some(state), Some(applied)) => Some(stored_of(
                input.aggregate,
                state,
                Some(applied.event_id.clone()),
            )),
            _ => input.before.cloned(),
        };
        KindPlan {
            state: stored,
            decisions,
            gaps_skipped: 0,
            ties: 0,
            current_sequence,
            reach: None,
        }
    }

    fn view(&self, stored: &AggregateState, now_ms: i64) -> Value {
        let user = crate::domain::AggregateKey::from_storage_key(&stored.aggregate)
            .map_or_else(|| stored.aggregate.clone(), |k| k.parts()[0].to_string());
        match presence_state(stored) {
            Ok(state) => json!(presence_view(&user, &state, now_ms, self.stale_after_ms)),
            Err(_) => Value::Null,
        }
    }

    fn mask(&self, _view: &mut Value, _fields: &[String]) {}

    fn stream_state(&self, _source: &str, stored: &AggregateState, now_ms: i64) -> Value {
        // A change is fresh when it happens: never stale on the stream.
        PresenceKind {
            stale_after_ms: i64::MAX,
        }
        .view(stored, now_ms)
    }
}

impl super::Parsed for PresenceEvent {
    fn into_parsed(self) -> ParsedBody {
        ParsedBody::Presence(std::sync::Arc::new(self))
    }

    fn from_parsed(parsed: &ParsedBody) -> Option<&Self> {
        match parsed {
            ParsedBody::Presence(event) => Some(event),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_presence_round_trips_and_is_tagged_by_status() {
        let state = PresenceState {
            presence: Presence::Away,
            sequence: Sequence::new(7).unwrap(),
            updated_at_ms: 1_000,
        };
        let stored = stored_of("team/alice", &state, Some("e1".into()));
        assert_eq!(stored.tag.as_deref(), Some("AWAY"));
        assert_eq!(presence_state(&stored).unwrap(), state);
        let kind = PresenceKind { stale_after_ms: 10 };
        let view = kind.view(&stored, 1_011);
        assert_eq!(
            (view["user_id"].as_str(), view["stale"].as_bool()),
            (Some("team/alice"), Some(true))
        );
        assert_eq!(kind.stream_state("p", &stored, 1_011)["stale"], false);
    }
}
