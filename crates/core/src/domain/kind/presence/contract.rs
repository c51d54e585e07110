//! The presence contract of the first seed.

use std::fmt;

use serde::Serialize;

use crate::domain::contract::body::parse_object;
use crate::domain::contract::fields::Reader;
use crate::domain::contract::ContractError;
use crate::domain::{EventId, IdempotencyKey, Ident, Sequence};

/// Event type recorded in the log for presence deliveries, which carry none.
pub const EVENT_TYPE: &str = "presence.changed";

/// A remote worker's presence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum Presence {
    /// Working and reachable.
    Online,
    /// Working, not to be disturbed.
    Busy,
    /// Away from the keyboard.
    Away,
    /// Not working.
    Offline,
}

impl Presence {
    /// Every presence value.
    pub const ALL: [Presence; 4] = [
        Presence::Online,
        Presence::Busy,
        Presence::Away,
        Presence::Offline,
    ];

    /// The value as written in payloads.
    pub fn as_str(self) -> &'static str {
        match self {
            Presence::Online => "ONLINE",
            Presence::Busy => "BUSY",
            Presence::Away => "AWAY",
            Presence::Offline => "OFFLINE",
        }
    }

    /// Parses a payload value (exact, upper case).
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == raw)
    }
}

impl fmt::Display for Presence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A verified presence delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceEvent {
    /// The delivery's id.
    pub event_id: EventId,
    /// The worker whose presence changed.
    pub user_id: Ident,
    /// The new presence.
    pub presence: Presence,
    /// The publisher's logical clock for this user.
    pub sequence: Sequence,
    /// When the publisher saw the change, unix seconds.
    pub timestamp: Option<i64>,
    /// The publisher's key for the logical change, if it sends one.
    pub idempotency_key: Option<IdempotencyKey>,
}

impl PresenceEvent {
    /// Parses a raw body.
    pub fn parse(body: &[u8]) -> Result<Self, ContractError> {
        Self::parse_with_fallback(body, None)
    }

    /// Parses a raw body whose `event_id`, when absent, is `fallback_event_id`.
    pub fn parse_with_fallback(
        body: &[u8],
        fallback_event_id: Option<&str>,
    ) -> Result<Self, ContractError> {
        let map = parse_object(body)?;
        let mut problems = Vec::new();
        let mut r = Reader::new(&map, &mut problems);
        let event_id = r.id_or("event_id", fallback_event_id, EventId::parse);
        let user_id = r.id("user_id", true, Ident::parse);
        let presence = r.string("presence", true).and_then(|raw| {
            let parsed = Presence::parse(raw);
            if parsed.is_none() {
                r.problem("presence", "must be one of ONLINE, BUSY, AWAY, OFFLINE");
            }
            parsed
        });
        let sequence = r.sequence("sequence_number");
        let timestamp = r.non_negative("timestamp", false);
        let idempotency_key = r.id("idempotency_key", false, IdempotencyKey::parse);
        match (event_id, user_id, presence, sequence) {
            (Some(event_id), Some(user_id), Some(presence), Some(sequence))
                if problems.is_empty() =>
            {
                Ok(Self {
                    event_id,
                    user_id,
                    presence,
                    sequence,
                    timestamp,
                    idempotency_key,
                })
            }
            _ => Err(ContractError { problems }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(body: &str) -> Vec<String> {
        PresenceEvent::parse(body.as_bytes())
            .unwrap_err()
            .problems
            .into_iter()
            .map(|p| p.field)
            .collect()
    }

    #[test]
    fn the_seed_payload_parses() {
        let e = PresenceEvent::parse(
            br#"{"event_id":"evt_01HTZ89PXYZQ8A2B3C4D5E6F7G","user_id":"usr_987654321",
                 "presence":"AWAY","sequence_number":1042,"timestamp":1711928400,"extra":[1]}"#,
        )
        .unwrap();
        assert_eq!(e.presence, Presence::Away);
        assert_eq!(e.sequence.get(), 1042);
        assert_eq!(e.timestamp, Some(1711928400));
        assert_eq!(e.idempotency_key, None);
    }

    #[test]
    fn a_key_given_twice_is_refused_at_any_depth() {
        assert_eq!(
            fields_of(
                r#"{"event_id":"e","user_id":"u","presence":"AWAY","presence":"BUSY","sequence_number":1}"#
            ),
            ["$"]
        );
        assert_eq!(
            fields_of(
                r#"{"event_id":"e","user_id":"u","presence":"AWAY","sequence_number":1,"x":[{"a":1,"a":2}]}"#
            ),
            ["$"]
        );
        let deep = format!("{{\"x\":{}1{}}}", "[".repeat(200), "]".repeat(200));
        assert_eq!(
            fields_of(&deep),
            ["$"],
            "nesting past the parser's limit is refused"
        );
        let not_utf8 = PresenceEvent::parse(b"{\"event_id\":\"\xff\"}").unwrap_err();
        assert_eq!(not_utf8.problems[0].field, "$");
    }

    #[test]
    fn each_bad_field_is_named() {
        assert_eq!(fields_of("nope"), ["$"]);
        assert_eq!(fields_of("[1]"), ["$"]);
        assert_eq!(
            fields_of(r#"{"event_id":"e","user_id":"u","presence":"AWAY"}"#),
            ["sequence_number"]
        );
        assert_eq!(
            fields_of(r#"{"event_id":"e","user_id":"u","presence":"SLEEPY","sequence_number":1}"#),
            ["presence"]
        );
        assert_eq!(
            fields_of(r#"{"event_id":"e","user_id":"u","presence":"AWAY","sequence_number":-1}"#),
            ["sequence_number"]
        );
        assert_eq!(
            fields_of(
                r#"{"event_id":"e","user_id":"u","presence":"AWAY","sequence_number":9223372036854775808}"#
            ),
            ["sequence_number"]
        );
        assert_eq!(
            fields_of(r#"{"event_id":"e","user_id":"u","presence":"AWAY","sequence_number":1e30}"#),
            ["sequence_number"]
        );
        assert_eq!(
            fields_of(r#"{"event_id":5,"user_id":"","presence":"AWAY","sequence_number":"1"}"#),
            ["event_id", "user_id", "sequence_number"]
        );
    }
}
