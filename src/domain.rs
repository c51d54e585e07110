//! Value types shared by every layer: ids, sequences, aggregate keys and
//! event statuses. Each type can only be built through `parse`, so once a value
//! exists it is valid.

use std::fmt;

use serde::Serialize;

/// Longest id the contracts accept, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Longest id a `json` source's location may hold, in bytes (SPEC §8).
pub const MAX_LOCATED_ID_BYTES: usize = 200;

/// Why a string is not a valid id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdProblem {
    /// Zero bytes long.
    Empty,
    /// Longer than [`MAX_ID_BYTES`].
    TooLong,
    /// Holds a byte outside printable ASCII (space through tilde).
    NotPrintableAscii,
    /// Longer than [`MAX_LOCATED_ID_BYTES`] (the `json` kind's rule).
    TooLongLocated,
    /// Holds a control character (the `json` kind's rule).
    ControlCharacter,
}

impl fmt::Display for IdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdProblem::Empty => "must not be empty",
            IdProblem::TooLong => "must be at most 128 bytes",
            IdProblem::NotPrintableAscii => "must be printable ASCII",
            IdProblem::TooLongLocated => "must be at most 200 bytes",
            IdProblem::ControlCharacter => "must not hold control characters",
        })
    }
}

/// Checks the id rule of SPEC §2: 1–128 bytes of printable ASCII.
fn check_id(raw: &str) -> Result<(), IdProblem> {
    if raw.is_empty() {
        return Err(IdProblem::Empty);
    }
    if raw.len() > MAX_ID_BYTES {
        return Err(IdProblem::TooLong);
    }
    if !raw.bytes().all(|b| (0x20..=0x7e).contains(&b)) {
        return Err(IdProblem::NotPrintableAscii);
    }
    Ok(())
}

/// Checks the `json` kind's id rule of SPEC §8: 1–200 bytes, no control characters.
fn check_located_id(raw: &str) -> Result<(), IdProblem> {
    if raw.is_empty() {
        return Err(IdProblem::Empty);
    }
    if raw.len() > MAX_LOCATED_ID_BYTES {
        return Err(IdProblem::TooLongLocated);
    }
    if raw.chars().any(char::is_control) {
        return Err(IdProblem::ControlCharacter);
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Parses a raw string, enforcing the id rule.
            pub fn parse(raw: &str) -> Result<Self, IdProblem> {
                check_id(raw).map(|()| Self(raw.to_owned()))
            }

            /// Parses a value read from a `json` source's location, enforcing
            /// that kind's wider rule (UTF-8 allowed, up to 200 bytes).
            pub fn parse_located(raw: &str) -> Result<Self, IdProblem> {
                check_located_id(raw).map(|()| Self(raw.to_owned()))
            }

            /// The id as text.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A publisher's unique id for one delivery of an event.
    EventId
);
id_type!(
    /// A publisher's key for one logical operation; resends share it.
    IdempotencyKey
);
id_type!(
    /// Any other id of a contract: user, player, save slot, item, achievement.
    Ident
);

/// A publisher's per-aggregate sequence number, in `0..=2^63-1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Sequence(i64);

impl Sequence {
    /// Builds a sequence from a non-negative integer.
    pub fn new(value: i64) -> Option<Self> {
        (value >= 0).then_some(Self(value))
    }

    /// The sequence as an integer.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Sequence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The unit of ordering: one user's presence, or one player's save slot.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AggregateKey {
    /// A presence aggregate, keyed by user.
    User(Ident),
    /// A save-game aggregate, keyed by player and slot.
    SaveSlot {
        /// The player.
        player_id: Ident,
        /// The player's save slot.
        save_slot: Ident,
    },
}

/// Separates the parts of a stored aggregate key; ids are printable ASCII, so
/// this control character can never appear inside one.
const KEY_SEPARATOR: char = '\u{1f}';

impl AggregateKey {
    /// The key as stored in the event log's `aggregate` column.
    pub fn storage_key(&self) -> String {
        match self {
            AggregateKey::User(user) => user.as_str().to_owned(),
            AggregateKey::SaveSlot {
                player_id,
                save_slot,
            } => format!("{player_id}{KEY_SEPARATOR}{save_slot}"),
        }
    }

    /// Rebuilds a key from its stored form.
    pub fn from_storage_key(stored: &str) -> Option<Self> {
        match stored.split_once(KEY_SEPARATOR) {
            Some((player, slot)) => Some(AggregateKey::SaveSlot {
                player_id: Ident::parse(player).ok()?,
                save_slot: Ident::parse(slot).ok()?,
            }),
            None => Ident::parse(stored).ok().map(AggregateKey::User),
        }
    }
}

impl fmt::Display for AggregateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregateKey::User(user) => write!(f, "{user}"),
            AggregateKey::SaveSlot {
                player_id,
                save_slot,
            } => write!(f, "{player_id}/{save_slot}"),
        }
    }
}

/// Where an event is in its life (SPEC §3).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Logged, not yet decided.
    Received,
    /// Applied to its projection.
    Processed,
    /// Older than the state it would have changed; nothing applied.
    IgnoredStale,
    /// An event type no projection knows; kept in the log, nothing applied.
    IgnoredUnsupported,
    /// An in-order delta waiting for a gap before it to fill.
    Held,
    /// Failed transiently; will be tried again.
    Retrying,
    /// Will not be applied without a person's replay.
    Dead,
}

impl EventStatus {
    /// Every status, for parsing and listings.
    pub const ALL: [EventStatus; 7] = [
        EventStatus::Received,
        EventStatus::Processed,
        EventStatus::IgnoredStale,
        EventStatus::IgnoredUnsupported,
        EventStatus::Held,
        EventStatus::Retrying,
        EventStatus::Dead,
    ];

    /// Whether the event still waits for a decision (received, held or retrying).
    pub fn is_undecided(self) -> bool {
        matches!(
            self,
            EventStatus::Received | EventStatus::Held | EventStatus::Retrying
        )
    }

    /// The status as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            EventStatus::Received => "received",
            EventStatus::Processed => "processed",
            EventStatus::IgnoredStale => "ignored_stale",
            EventStatus::IgnoredUnsupported => "ignored_unsupported",
            EventStatus::Held => "held",
            EventStatus::Retrying => "retrying",
            EventStatus::Dead => "dead",
        }
    }

    /// Parses a stored status.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// Why an event is dead (SPEC §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeadReason {
    /// Every attempt failed.
    Exhausted,
    /// An inventory delta would take a quantity below zero.
    InsufficientQuantity,
    /// A delta arrived after the gap it belonged to was skipped.
    LateAfterGapSkip,
    /// Another event already holds this sequence in the aggregate.
    SequenceConflict,
    /// The stored body no longer parses with the projection's contract.
    InvalidForProjection,
}

impl DeadReason {
    /// Every reason, for parsing.
    pub const ALL: [DeadReason; 5] = [
        DeadReason::Exhausted,
        DeadReason::InsufficientQuantity,
        DeadReason::LateAfterGapSkip,
        DeadReason::SequenceConflict,
        DeadReason::InvalidForProjection,
    ];

    /// The reason code as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            DeadReason::Exhausted => "exhausted",
            DeadReason::InsufficientQuantity => "insufficient_quantity",
            DeadReason::LateAfterGapSkip => "late_after_gap_skip",
            DeadReason::SequenceConflict => "sequence_conflict",
            DeadReason::InvalidForProjection => "invalid_for_projection",
        }
    }

    /// Parses a stored reason code.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_contract_rule() {
        assert!(EventId::parse("evt_1").is_ok());
        assert_eq!(EventId::parse(""), Err(IdProblem::Empty));
        assert_eq!(EventId::parse(&"a".repeat(129)), Err(IdProblem::TooLong));
        assert!(EventId::parse(&"a".repeat(128)).is_ok());
        assert_eq!(EventId::parse("a\nb"), Err(IdProblem::NotPrintableAscii));
        assert_eq!(EventId::parse("é"), Err(IdProblem::NotPrintableAscii));
    }

    #[test]
    fn located_ids_follow_the_json_rule() {
        assert_eq!(EventId::parse_located("évt 1").unwrap().as_str(), "évt 1");
        assert!(EventId::parse_located(&"a".repeat(200)).is_ok());
        assert_eq!(
            EventId::parse_located(&"a".repeat(201)),
            Err(IdProblem::TooLongLocated)
        );
        assert_eq!(EventId::parse_located(""), Err(IdProblem::Empty));
        for control in ["a\nb", "\u{7f}", "a\u{9f}"] {
            assert_eq!(
                EventId::parse_located(control),
                Err(IdProblem::ControlCharacter)
            );
        }
    }

    #[test]
    fn aggregate_keys_round_trip_through_storage() {
        let slot = AggregateKey::SaveSlot {
            player_id: Ident::parse("p/1").unwrap(),
            save_slot: Ident::parse("slot:a").unwrap(),
        };
        let user = AggregateKey::User(Ident::parse("usr_1").unwrap());
        for key in [slot, user] {
            assert_eq!(
                AggregateKey::from_storage_key(&key.storage_key()),
                Some(key)
            );
        }
    }

    #[test]
    fn statuses_round_trip() {
        for status in EventStatus::ALL {
            assert_eq!(EventStatus::parse(status.as_str()), Some(status));
        }
        for reason in DeadReason::ALL {
            assert_eq!(DeadReason::parse(reason.as_str()), Some(reason));
        }
    }
}
