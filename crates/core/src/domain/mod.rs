//! The domain: what an event is and how it is decided, pure code with no I/O (the clock
//! aside) — one module
//! per kind ([`kind`]) and what their contracts share ([`contract`]), the ordering rules
//! ([`ordering`]), the retry policy ([`retry`]), search pointers ([`search`]), masking
//! ([`mask`]), sealing at rest ([`encryption`]), the clock everything reads ([`clock`]) —
//! and, here, the value types shared by every layer: ids, sequences,
//! aggregate keys and event statuses. Each type can only be built through `parse`, so once a value
//! exists it is valid.

pub mod clock;
pub mod contract;
pub mod encryption;
pub mod kind;
pub mod mask;
pub mod ordering;
pub mod retry;
pub mod search;

use std::fmt;

use serde::Serialize;

/// Longest id the contracts accept, in bytes.
pub const MAX_ID_BYTES: usize = 128;

/// Longest id a `json` source's location may hold, in bytes (docs/contract.md, json sources).
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
    /// Holds an invisible format character or a line/paragraph separator, which would
    /// make two different ids look identical (docs/contract.md, "Ids").
    FormatCharacter,
}

impl fmt::Display for IdProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IdProblem::Empty => "must not be empty",
            IdProblem::TooLong => "must be at most 128 bytes",
            IdProblem::NotPrintableAscii => "must be printable ASCII",
            IdProblem::TooLongLocated => "must be at most 200 bytes",
            IdProblem::ControlCharacter => "must not hold control characters",
            IdProblem::FormatCharacter => {
                "must not hold format characters (Unicode Cf) or line/paragraph separators"
            }
        })
    }
}

/// Checks the id rule of docs/contract.md (ingress): 1–128 bytes of printable ASCII.
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

/// Checks the `json` kind's id rule of docs/contract.md (json sources): 1–200 bytes, no control
/// characters.
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
    // Every format character and separator lies outside ASCII, which most ids are.
    if !raw.is_ascii() && raw.chars().any(is_invisible_format) {
        return Err(IdProblem::FormatCharacter);
    }
    Ok(())
}

/// The Unicode general category Cf (format characters, Unicode 15.1), as ranges.
const FORMAT_CHARACTERS: &[(u32, u32)] = &[
    (0x00AD, 0x00AD),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x180E, 0x180E),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x2064),
    (0x2066, 0x206F),
    (0xFEFF, 0xFEFF),
    (0xFFF9, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0001, 0xE0001),
    (0xE0020, 0xE007F),
];

/// True for a character that renders as nothing or reorders text (Cf), or for
/// U+2028/U+2029, which break a log line without being control characters.
pub fn is_invisible_format(c: char) -> bool {
    let code = u32::from(c);
    code == 0x2028
        || code == 0x2029
        || FORMAT_CHARACTERS
            .iter()
            .any(|&(low, high)| (low..=high).contains(&code))
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

/// The unit of ordering: the ids a kind keys its aggregates by, in order (a user; a player
/// and a save slot; a `json` source's located values). Every kind's keys store and show the
/// same way.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AggregateKey(Vec<Ident>);

/// Most parts an aggregate key may have (a `json` source's `aggregate` list).
pub const MAX_KEY_PARTS: usize = 16;

/// Separates the parts of a stored aggregate key; ids hold no control character
/// (printable ASCII, or the `json` rule), so this one can never appear inside one.
const KEY_SEPARATOR: char = '\u{1f}';

/// Separates the parts of an aggregate key's text form (docs/contract.md, json sources).
const TEXT_SEPARATOR: char = '/';

/// Why a text form is not an aggregate key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggregateKeyProblem {
    /// A `%` not followed by `25` or `2F`.
    BadEscape,
    /// More parts than any kind's key has.
    TooManyParts,
    /// A part, once decoded, breaks the id rule.
    Part(IdProblem),
}

impl fmt::Display for AggregateKeyProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregateKeyProblem::BadEscape => f.write_str(
                "has a % that is not %25 or %2F (write % as %25 and a / inside an id as %2F)",
            ),
            AggregateKeyProblem::TooManyParts => write!(
                f,
                "must have at most {MAX_KEY_PARTS} parts joined by / (a / inside an id is %2F)"
            ),
            AggregateKeyProblem::Part(problem) => write!(f, "part {problem}"),
        }
    }
}

/// One part in text form: `%` and `/` percent-encoded, so parts never split.
fn encode_part(part: &str) -> String {
    part.replace('%', "%25").replace('/', "%2F")
}

/// Undoes [`encode_part`], refusing every other escape so a text form has one reading.
fn decode_part(text: &str) -> Result<String, AggregateKeyProblem> {
    let mut decoded = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('%') {
        decoded.push_str(&rest[..at]);
        let escape = rest.get(at..at + 3).ok_or(AggregateKeyProblem::BadEscape)?;
        decoded.push(match escape {
            "%25" => '%',
            "%2F" | "%2f" => '/',
            _ => return Err(AggregateKeyProblem::BadEscape),
        });
        rest = &rest[at + 3..];
    }
    decoded.push_str(rest);
    Ok(decoded)
}

impl AggregateKey {
    /// The key of one id.
    pub fn one(part: Ident) -> Self {
        Self(vec![part])
    }

    /// The key of `parts`, in order (a kind reads at most [`MAX_KEY_PARTS`]).
    pub fn of_parts(parts: Vec<Ident>) -> Self {
        Self(parts)
    }

    /// The ids that make up the key, in order.
    pub fn parts(&self) -> &[Ident] {
        &self.0
    }

    /// Parses the text form of docs/contract.md (json sources) (API filters, cursors, routes, CLI
    /// flags): up to [`MAX_KEY_PARTS`] parts joined by `/`, each under the `json` kind's id rule
    /// (the built-in kinds' ids are a subset of it).
    pub fn parse_text(text: &str) -> Result<Self, AggregateKeyProblem> {
        let mut parts = Vec::new();
        for part in text.split(TEXT_SEPARATOR) {
            if parts.len() == MAX_KEY_PARTS {
                return Err(AggregateKeyProblem::TooManyParts);
            }
            let decoded = decode_part(part)?;
            parts.push(Ident::parse_located(&decoded).map_err(AggregateKeyProblem::Part)?);
        }
        Ok(Self::of_parts(parts))
    }

    /// The key as stored in the event log's `aggregate` column.
    pub fn storage_key(&self) -> String {
        // Built once per delivery: one allocation, none wasted on the common one-part key.
        match self.0.as_slice() {
            [one] => one.as_str().to_owned(),
            parts => {
                let mut stored = String::new();
                for (at, part) in parts.iter().enumerate() {
                    if at > 0 {
                        stored.push(KEY_SEPARATOR);
                    }
                    stored.push_str(part.as_str());
                }
                stored
            }
        }
    }

    /// Rebuilds a key from its stored form.
    pub fn from_storage_key(stored: &str) -> Option<Self> {
        let parts = stored
            .split(KEY_SEPARATOR)
            .map(|part| Ident::parse_located(part).ok())
            .collect::<Option<Vec<_>>>()?;
        (parts.len() <= MAX_KEY_PARTS).then(|| Self::of_parts(parts))
    }

    /// The text form of a stored key, for answers and logs; a stored key that no
    /// longer parses is still shown part by part rather than hidden.
    pub fn text_of_stored(stored: &str) -> String {
        match Self::from_storage_key(stored) {
            Some(key) => key.to_string(),
            None => stored
                .split(KEY_SEPARATOR)
                .map(encode_part)
                .collect::<Vec<_>>()
                .join("/"),
        }
    }
}

/// The text form of docs/contract.md (json sources): the parts, percent-encoded, joined by `/`.
impl fmt::Display for AggregateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (at, part) in self.0.iter().enumerate() {
            if at > 0 {
                write!(f, "{TEXT_SEPARATOR}")?;
            }
            f.write_str(&encode_part(part.as_str()))?;
        }
        Ok(())
    }
}

/// Whether a source answers after applying (sync) or after logging (async).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Log and apply in one transaction; answer with the outcome.
    Sync,
    /// Log, answer 202; workers apply.
    Async,
}

/// Which unique key made a delivery a duplicate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupKey {
    /// The same `event_id` was already logged.
    EventId,
    /// Another event with the same `idempotency_key` was already logged.
    IdempotencyKey,
    /// Another event with the same raw body was logged by a source whose scheme signs
    /// neither a delivery id nor a timestamp.
    Body,
}

impl DedupKey {
    /// The key of a kept dedup row's `kind` column (`event_id`, `idempotency_key`, `body`).
    pub fn of_kept(kind: &str) -> Self {
        match kind {
            "event_id" => DedupKey::EventId,
            "body" => DedupKey::Body,
            _ => DedupKey::IdempotencyKey,
        }
    }

    /// The label used in answers and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            DedupKey::EventId => "event_id",
            DedupKey::IdempotencyKey => "idempotency_key",
            DedupKey::Body => "body",
        }
    }
}

/// Where an event is in its life (docs/contract.md, processing).
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
    /// Its aggregate was forgotten on request: no body, headers or state are left, its
    /// dedup keys stay (docs/encryption.md, erasure). Terminal.
    Erased,
}

impl EventStatus {
    /// Every status, for parsing and listings.
    pub const ALL: [EventStatus; 8] = [
        EventStatus::Received,
        EventStatus::Processed,
        EventStatus::IgnoredStale,
        EventStatus::IgnoredUnsupported,
        EventStatus::Held,
        EventStatus::Retrying,
        EventStatus::Dead,
        EventStatus::Erased,
    ];

    /// The statuses of an event that still waits for a decision (its backlog).
    pub const UNDECIDED: [EventStatus; 3] = [
        EventStatus::Received,
        EventStatus::Held,
        EventStatus::Retrying,
    ];

    /// Whether the event still waits for a decision (received, held or retrying).
    pub fn is_undecided(self) -> bool {
        Self::UNDECIDED.contains(&self)
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
            EventStatus::Erased => "erased",
        }
    }

    /// Parses a stored status.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// Why an event is dead (docs/contract.md, processing).
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
        for format in [
            "a\u{202e}b",
            "\u{200b}",
            "a\u{2028}",
            "a\u{2029}",
            "\u{feff}x",
            "\u{e0041}",
        ] {
            assert_eq!(
                EventId::parse_located(format),
                Err(IdProblem::FormatCharacter),
                "{format:?}"
            );
        }
        for control in ["a\nb", "\u{7f}", "a\u{9f}"] {
            assert_eq!(
                EventId::parse_located(control),
                Err(IdProblem::ControlCharacter)
            );
        }
    }

    #[test]
    fn aggregate_keys_round_trip_through_storage() {
        let slot = AggregateKey::of_parts(vec![
            Ident::parse("p/1").unwrap(),
            Ident::parse("slot:a").unwrap(),
        ]);
        let user = AggregateKey::one(Ident::parse("usr_1").unwrap());
        for key in [slot, user] {
            assert_eq!(
                AggregateKey::from_storage_key(&key.storage_key()),
                Some(key)
            );
        }
    }

    fn key(text: &str) -> Result<AggregateKey, AggregateKeyProblem> {
        AggregateKey::parse_text(text)
    }

    #[test]
    fn an_id_holding_a_slash_never_splits() {
        let user = AggregateKey::one(Ident::parse("team/alice").unwrap());
        assert_eq!(user.to_string(), "team%2Falice");
        assert_eq!(key("team%2Falice"), Ok(user.clone()));
        assert_eq!(key("team%2falice"), Ok(user));
        let slot = AggregateKey::of_parts(vec![
            Ident::parse("p/1%").unwrap(),
            Ident::parse("slot_a").unwrap(),
        ]);
        assert_eq!(slot.to_string(), "p%2F1%25/slot_a");
        assert_eq!(key("p%2F1%25/slot_a"), Ok(slot));
        assert_eq!(
            key("player_1/slot_a").unwrap().storage_key(),
            "player_1\u{1f}slot_a"
        );
        assert_eq!(
            AggregateKey::text_of_stored("p/1\u{1f}slot_a"),
            "p%2F1/slot_a"
        );
    }

    #[test]
    fn json_keys_have_any_number_of_parts_and_store_as_the_built_in_ones() {
        let key = AggregateKey::parse_text("octo%2Frepo/7/é").unwrap();
        assert_eq!(key.parts().len(), 3);
        assert_eq!(key.to_string(), "octo%2Frepo/7/é");
        assert_eq!(key.storage_key(), "octo/repo\u{1f}7\u{1f}é");
        assert_eq!(
            AggregateKey::from_storage_key(&key.storage_key()),
            Some(key)
        );
        // A located part under the built-in rule is the built-in kinds' key, byte for byte.
        let user = AggregateKey::of_parts(vec![Ident::parse_located("u").unwrap()]);
        assert_eq!(user, AggregateKey::one(Ident::parse("u").unwrap()));
    }

    #[test]
    fn malformed_text_forms_are_refused() {
        for bad in ["50%", "a%2", "a%41", "a%%25", "%zz/b"] {
            assert_eq!(key(bad), Err(AggregateKeyProblem::BadEscape), "{bad}");
        }
        let many = vec!["a"; MAX_KEY_PARTS + 1].join("/");
        assert_eq!(key(&many), Err(AggregateKeyProblem::TooManyParts));
        assert_eq!(key(""), Err(AggregateKeyProblem::Part(IdProblem::Empty)));
        assert_eq!(key("a/"), Err(AggregateKeyProblem::Part(IdProblem::Empty)));
        assert_eq!(
            key("a\u{1f}b"),
            Err(AggregateKeyProblem::Part(IdProblem::ControlCharacter))
        );
    }

    fn arb_key() -> impl proptest::strategy::Strategy<Value = AggregateKey> {
        use proptest::prelude::*;
        // The narrow alphabet makes ids that look like each other's escapes common.
        let id = prop_oneof!["[ -~]{1,40}", "[/%25Ffa]{1,6}"]
            .prop_map(|raw| Ident::parse(&raw).unwrap());
        prop_oneof![
            id.clone().prop_map(AggregateKey::one),
            (id.clone(), id).prop_map(|(player, slot)| AggregateKey::of_parts(vec![player, slot])),
        ]
    }

    proptest::proptest! {
        #[test]
        fn text_forms_round_trip(key in arb_key()) {
            proptest::prop_assert_eq!(AggregateKey::parse_text(&key.to_string()), Ok(key.clone()));
            proptest::prop_assert_eq!(AggregateKey::text_of_stored(&key.storage_key()), key.to_string());
        }

        #[test]
        fn no_two_keys_share_a_text_form(a in arb_key(), b in arb_key()) {
            proptest::prop_assert_eq!(a.to_string() == b.to_string(), a == b);
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
