//! The `json` kind's contract (docs/contract.md, json sources): configuration says where each field
//! of any publisher's JSON is, as an RFC 6901 JSON Pointer into the body or a
//! `header:Name`, or as alternatives of those (`/a|/b`, the first present wins). The
//! document read is the JSON body, or a form body's fields (`body_format = "form"`),
//! optionally the JSON held by one of its strings (`unwrap`). [`JsonContract::compile`] checks a source's keys once, at
//! start; [`JsonContract::parse`] turns one delivery into a typed
//! [`JsonEvent`], or the named problems of a 400 answer. No I/O.

use axum::http::{HeaderMap, HeaderName};
use serde::Deserialize;
use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::domain::contract::body::parse_body;
use crate::domain::contract::fields::{kind_of, non_negative_integer};
use crate::domain::contract::{ContractError, FieldProblem};
use crate::domain::{EventId, IdProblem, IdempotencyKey, Ident, Sequence};

/// The keys of a `kind = "json"` source, as written in the configuration file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct JsonSourceSpec {
    /// Where the event id is; `None` takes the signature scheme's delivery id, and
    /// [`BODY_EVENT_ID`] the hex SHA-256 of the raw body.
    pub event_id: Option<String>,
    /// Where the publisher's key for the logical operation is, if anywhere.
    pub idempotency_key: Option<String>,
    /// Where the aggregate's key parts are: one location or a list.
    pub aggregate: Option<AggregateLocations>,
    /// Where the sequence is (an integer or an RFC 3339 timestamp).
    pub sequence: Option<String>,
    /// Where the event type is, if anywhere.
    pub event_type: Option<String>,
    /// The accepted event types, as `*` globs; `None` accepts every type.
    pub event_types: Option<Vec<String>>,
    /// `latest-wins`, `in-order` or `unordered`; checked by [`JsonContract::compile`].
    pub ordering: Option<String>,
    /// The part of the body kept as the aggregate's state; `None` keeps the whole body.
    pub state: Option<String>,
    /// How the raw body is read: `json` (`None`) or `form`.
    pub body_format: Option<BodyFormat>,
    /// A JSON Pointer to a string holding JSON, which becomes the document the locations read.
    pub unwrap: Option<String>,
    /// What a verified delivery whose body lacks a location becomes: refused (`None`, a
    /// hand-written source's default) or logged unordered (every preset).
    pub missing_locations: Option<MissingLocations>,
    /// Locations per event type (`[[types]]`): the first entry whose pattern matches the
    /// delivery's type gives its aggregate, sequence and state.
    pub types: Option<Vec<TypeSpec>>,
}

/// `missing_locations`: what a verified delivery whose body lacks a location (or holds
/// one that does not read) becomes (docs/contract.md, missing locations).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MissingLocations {
    /// `"refuse"`: 400 naming the field, the strict contract of a hand-written source.
    #[default]
    Refuse,
    /// `"unordered"`: logged, deduplicated and applied unordered under the entity the body
    /// names, the event log saying why; every preset's rule.
    Unordered,
}

impl<'de> Deserialize<'de> for MissingLocations {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match String::deserialize(deserializer)?.as_str() {
            "refuse" => Ok(MissingLocations::Refuse),
            "unordered" => Ok(MissingLocations::Unordered),
            other => Err(serde::de::Error::custom(format!(
                "missing_locations must be \"refuse\" or \"unordered\", got {other:?}"
            ))),
        }
    }
}

/// One `[[types]]` entry as written: the event types it covers and their locations. An
/// entry says all of its types' locations: a key it omits is not taken from the source
/// (no `sequence`: the types carry no version and are applied unordered; no `state`: the
/// whole body; no `aggregate`: each event its own).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeSpec {
    /// The event types, as `*` globs (`"check_*"`, `"customers/*"`): one or a list.
    #[serde(rename = "match")]
    pub matches: AggregateLocations,
    /// Where these types' aggregate key parts are.
    pub aggregate: Option<AggregateLocations>,
    /// Where these types' version is; `None`: they carry none.
    pub sequence: Option<String>,
    /// The part of these types' bodies kept as state.
    pub state: Option<String>,
}

/// `event_id = "body"`: the event id is the hex SHA-256 of the raw body, for publishers that
/// send no id and sign the same body again on a retry (Zoom, Calendly). Never a location:
/// a location starts with `/` or `header:`.
pub const BODY_EVENT_ID: &str = "body";

/// The event id of a raw body under `event_id = "body"`: its SHA-256, in lower-case hex.
/// The plain hash, never a keyed one, so that it is the same on every node, across restarts
/// and key rotations, and anyone holding the body can compute it (docs/configuration.md).
pub fn body_event_id(body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(body))
}

pub use crate::domain::contract::body::BodyFormat;
pub use crate::domain::contract::glob::Glob;

/// The `aggregate` key: publishers key aggregates by one field or by several.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum AggregateLocations {
    /// `aggregate = "/id"`.
    One(String),
    /// `aggregate = ["/object", "/id"]`.
    Many(Vec<String>),
}

impl AggregateLocations {
    /// The locations, one or several.
    pub fn as_slice(&self) -> &[String] {
        match self {
            AggregateLocations::One(one) => std::slice::from_ref(one),
            AggregateLocations::Many(many) => many,
        }
    }
}

/// A `json` source whose keys do not fit together; the source does not start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key}: {problem}")]
pub struct ContractConfigError {
    /// The configuration key at fault, e.g. `sequence` or `aggregate`.
    pub key: String,
    /// What is wrong with it.
    pub problem: String,
}

impl ContractConfigError {
    fn new(key: &str, problem: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            problem: problem.into(),
        }
    }
}

/// How a `json` source's events are ordered within their aggregate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonOrdering {
    /// As presence: the highest sequence wins, ties go to the later receipt.
    LatestWins,
    /// As save-game deltas: each sequence in turn, gaps held.
    InOrder,
    /// Every new event is processed; only duplicates are dropped.
    Unordered,
}

impl JsonOrdering {
    /// Every ordering, for parsing and messages.
    pub const ALL: [JsonOrdering; 3] = [
        JsonOrdering::LatestWins,
        JsonOrdering::InOrder,
        JsonOrdering::Unordered,
    ];

    /// The ordering as written in the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            JsonOrdering::LatestWins => "latest-wins",
            JsonOrdering::InOrder => "in-order",
            JsonOrdering::Unordered => "unordered",
        }
    }
}

/// Where one field of a delivery is: a JSON Pointer into the body, or a header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// An RFC 6901 pointer, kept as its unescaped reference tokens.
    Pointer {
        /// The pointer as written, which names the field in problems.
        text: String,
        /// The reference tokens, with `~1` and `~0` already unescaped.
        tokens: Vec<String>,
    },
    /// `header:Name`.
    Header {
        /// The location as written, which names the field in problems.
        text: String,
        /// The header.
        name: HeaderName,
    },
    /// `=text`: the text itself, which tells apart aggregates of different entities whose
    /// ids may coincide (a check run's and a release's: docs/configuration.md).
    Literal {
        /// The location as written.
        text: String,
        /// The text it stands for.
        value: String,
    },
}

impl Location {
    /// Parses a location as written in the configuration, or says why it is not one.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if let Some(value) = raw.strip_prefix('=') {
            if value.is_empty() {
                return Err(format!("{raw:?} names no text"));
            }
            return Ok(Location::Literal {
                text: raw.to_owned(),
                value: value.to_owned(),
            });
        }
        if let Some(name) = raw.strip_prefix("header:") {
            if name.is_empty() {
                return Err(format!("{raw:?} names no header"));
            }
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| format!("{raw:?} is not a valid header name"))?;
            if crate::ingress::signature::carries_credential(name.as_str()) {
                return Err(format!(
                    "{raw:?} names a header that carries a signature or a credential: \
                     it is never read as a field"
                ));
            }
            return Ok(Location::Header {
                text: raw.to_owned(),
                name,
            });
        }
        if raw.is_empty() {
            return Ok(Location::Pointer {
                text: String::new(),
                tokens: Vec::new(),
            });
        }
        let Some(rest) = raw.strip_prefix('/') else {
            return Err(format!(
                "{raw:?} is neither a JSON Pointer (it must start with `/`) nor `header:Name`"
            ));
        };
        let tokens = rest
            .split('/')
            .map(unescape_token)
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                format!("{raw:?} is not a valid JSON Pointer: `~` must be followed by 0 or 1")
            })?;
        Ok(Location::Pointer {
            text: raw.to_owned(),
            tokens,
        })
    }

    /// The location as written, which names the field in problems.
    pub fn as_str(&self) -> &str {
        match self {
            Location::Pointer { text, .. }
            | Location::Header { text, .. }
            | Location::Literal { text, .. } => text,
        }
    }

    /// The value at this location: `Ok(None)` when absent (or JSON null).
    fn resolve<'a>(
        &'a self,
        body: &'a Value,
        headers: &'a HeaderMap,
    ) -> Result<Option<Found<'a>>, String> {
        match self {
            Location::Pointer { tokens, .. } => Ok(resolve_pointer(body, tokens).map(Found::Json)),
            Location::Literal { value, .. } => Ok(Some(Found::Text(value))),
            Location::Header { name, .. } => {
                let mut values = headers.get_all(name).iter();
                let Some(value) = values.next() else {
                    return Ok(None);
                };
                // Two values of one header could each be "the" id; guessing would
                // let a proxy and inhook read different events from one delivery.
                if values.next().is_some() {
                    return Err("must appear once, got the header more than once".into());
                }
                std::str::from_utf8(value.as_bytes())
                    .map(|text| Some(Found::Text(text)))
                    .map_err(|_| "must be UTF-8 text".into())
            }
        }
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A location with its alternatives, as written: `"/pull_request/number|/issue/number"`.
/// They are tried in order and the first present wins (docs/configuration.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alternatives {
    /// The whole text, which names the field when none is present.
    text: String,
    /// At least one location.
    locations: Vec<Location>,
}

impl Alternatives {
    /// Parses `a|b|…`, each a [`Location`]; an empty alternative is refused.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if !raw.contains('|') {
            return Ok(Self {
                text: raw.to_owned(),
                locations: vec![Location::parse(raw)?],
            });
        }
        let locations = raw
            .split('|')
            .map(|one| {
                if one.is_empty() {
                    Err(format!(
                        "{raw:?} holds an empty alternative (alternatives are separated by `|`)"
                    ))
                } else {
                    Location::parse(one)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self {
            text: raw.to_owned(),
            locations,
        })
    }

    /// The text as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The alternatives, in the order they are tried.
    pub fn locations(&self) -> &[Location] {
        &self.locations
    }

    /// The first alternative present, with its value; an alternative that cannot be read
    /// (a header sent twice) is a problem, not skipped, so that no later one is guessed.
    fn resolve<'a>(
        &'a self,
        body: &'a Value,
        headers: &'a HeaderMap,
    ) -> Result<Option<(&'a Location, Found<'a>)>, (&'a Location, String)> {
        for at in &self.locations {
            match at.resolve(body, headers) {
                Ok(Some(found)) => return Ok(Some((at, found))),
                Ok(None) => {}
                Err(problem) => return Err((at, problem)),
            }
        }
        Ok(None)
    }
}

/// A location that must be a JSON Pointer into the body (`state`, `unwrap`), as its tokens.
fn pointer_tokens(key: &str, at: &Location) -> Result<Vec<String>, ContractConfigError> {
    match at {
        Location::Pointer { tokens, .. } => Ok(tokens.clone()),
        Location::Header { text, .. } => Err(ContractConfigError::new(
            key,
            format!("{text:?} must be a JSON Pointer into the body, not a header"),
        )),
        Location::Literal { text, .. } => Err(ContractConfigError::new(
            key,
            format!("{text:?} must be a JSON Pointer into the body, not a literal"),
        )),
    }
}

/// Unescapes one reference token (RFC 6901 §4: `~1` is `/`, then `~0` is `~`).
fn unescape_token(token: &str) -> Option<String> {
    if !token.contains('~') {
        return Some(token.to_owned());
    }
    let mut out = String::with_capacity(token.len());
    let mut chars = token.chars();
    while let Some(c) = chars.next() {
        if c == '~' {
            match chars.next() {
                Some('0') => out.push('~'),
                Some('1') => out.push('/'),
                _ => return None,
            }
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Walks compiled tokens; a step through a scalar, or past the end, finds nothing.
fn resolve_pointer<'a>(body: &'a Value, tokens: &[String]) -> Option<&'a Value> {
    let mut at = body;
    for token in tokens {
        at = match at {
            Value::Object(map) => map.get(token)?,
            Value::Array(items) => items.get(array_index(token)?)?,
            _ => return None,
        };
    }
    (!at.is_null()).then_some(at)
}

/// Like [`resolve_pointer`], for taking the state out of the body.
fn pointer_mut<'a>(body: &'a mut Value, tokens: &[String]) -> Option<&'a mut Value> {
    let mut at = body;
    for token in tokens {
        at = match at {
            Value::Object(map) => map.get_mut(token)?,
            Value::Array(items) => items.get_mut(array_index(token)?)?,
            _ => return None,
        };
    }
    Some(at)
}

/// An array index as RFC 6901 writes one: `0`, or digits without a leading zero.
fn array_index(token: &str) -> Option<usize> {
    let canonical = token == "0"
        || (!token.is_empty()
            && !token.starts_with('0')
            && token.bytes().all(|b| b.is_ascii_digit()));
    canonical.then(|| token.parse().ok()).flatten()
}

/// A value found at a location, before its field's rule is applied.
#[derive(Debug, Clone, Copy)]
enum Found<'a> {
    Json(&'a Value),
    Text(&'a str),
}

/// Where a sequence came from, so the API can say what the integer means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceSource {
    /// The publisher's integer (a JSON number or a string of digits).
    Integer,
    /// An RFC 3339 timestamp, as microseconds since the epoch.
    Timestamp,
}

/// A json event's sequence, with what it was read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonSequence {
    /// The value ordered by, shown by the API and sent in `inhook-sequence`.
    pub value: Sequence,
    /// Whether it was an integer or a timestamp.
    pub source: SequenceSource,
}

/// A verified delivery of a `json` source, every located field typed.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonEvent {
    /// The delivery's id, from its location or the scheme's delivery id.
    pub event_id: EventId,
    /// The publisher's key for the logical operation, when located and present.
    pub idempotency_key: Option<IdempotencyKey>,
    /// The aggregate's key parts, in configured order; the event id alone when
    /// an unordered source names no aggregate.
    pub aggregate: Vec<Ident>,
    /// The sequence, when the source locates one.
    pub sequence: Option<JsonSequence>,
    /// The event type, when located and present.
    pub event_type: Option<Ident>,
    /// The value kept as the aggregate's state; `None` when its location is absent.
    pub state: Option<Value>,
    /// Why a source that orders its events applies this one unordered: its type carries no
    /// version, or its body lacks a location (`missing_locations = "unordered"`).
    pub unordered: Option<String>,
}

/// What a `json` source's contract makes of one delivery.
#[derive(Debug, Clone, PartialEq)]
pub enum JsonParsed {
    /// An event to log and order.
    Event(JsonEvent),
    /// A type outside `event_types`: `200 ignored_unsupported`. Nothing read is a
    /// problem of this delivery: the event id and its place are read only to log it.
    Ignored {
        /// The event id, if it could be read.
        event_id: Option<EventId>,
        /// The type that was not accepted; `None` when the delivery has none.
        event_type: Option<Ident>,
        /// Its aggregate and sequence, when the source locates an aggregate and
        /// every location of the two reads cleanly.
        place: Option<IgnoredPlace>,
    },
}

/// Where an ignored delivery belongs in its source's aggregates.
#[derive(Debug, Clone, PartialEq)]
pub struct IgnoredPlace {
    /// The aggregate's key parts, in configured order.
    pub aggregate: Vec<Ident>,
    /// Its sequence (0 when the source locates none, as for an unordered event).
    pub sequence: i64,
}

/// Where an event's aggregate, sequence and state are: the source's own keys, or a
/// `[[types]]` entry's.
#[derive(Debug, Clone)]
struct Locations {
    aggregate: Vec<Alternatives>,
    sequence: Option<Alternatives>,
    /// The state's pointer tokens, one list per alternative; compile refuses a header here.
    state: Option<Vec<Vec<String>>>,
}

impl Locations {
    /// Compiles one set of keys; `at` prefixes the key in errors (`types[2].`).
    fn compile(
        at: &str,
        aggregate: Option<&AggregateLocations>,
        sequence: Option<&str>,
        state: Option<&str>,
    ) -> Result<Self, ContractConfigError> {
        let key = |name: &str| format!("{at}{name}");
        let location = |name: &str, raw: Option<&str>| {
            raw.map(|raw| {
                Alternatives::parse(raw).map_err(|p| ContractConfigError::new(&key(name), p))
            })
            .transpose()
        };
        let aggregate = match aggregate {
            None => Vec::new(),
            Some(locations) => {
                if locations.as_slice().is_empty() {
                    return Err(ContractConfigError::new(
                        &key("aggregate"),
                        "must name at least one location",
                    ));
                }
                locations
                    .as_slice()
                    .iter()
                    .map(|raw| {
                        Alternatives::parse(raw)
                            .map_err(|p| ContractConfigError::new(&key("aggregate"), p))
                    })
                    .collect::<Result<_, _>>()?
            }
        };
        let sequence = location("sequence", sequence)?;
        let state = match location("state", state)? {
            None => None,
            Some(alternatives) => Some(
                alternatives
                    .locations()
                    .iter()
                    .map(|at| pointer_tokens(&key("state"), at))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(Self {
            aggregate,
            sequence,
            state,
        })
    }
}

/// A compiled `[[types]]` entry.
#[derive(Debug, Clone)]
struct TypeLocations {
    globs: Vec<Glob>,
    locations: Locations,
}

/// A `json` source's contract, compiled once from its [`JsonSourceSpec`].
#[derive(Debug, Clone)]
pub struct JsonContract {
    event_id: Option<Alternatives>,
    /// `event_id = "body"`: the id is the raw body's SHA-256 ([`body_event_id`]).
    event_id_from_body: bool,
    idempotency_key: Option<Alternatives>,
    /// The source's own aggregate, sequence and state.
    base: Locations,
    /// The `[[types]]` entries, tried in order before `base`.
    types: Vec<TypeLocations>,
    /// Every place the state may come from, for masking.
    state_places: Vec<Vec<String>>,
    missing: MissingLocations,
    event_type: Option<Alternatives>,
    event_types: Option<Vec<Glob>>,
    ordering: JsonOrdering,
    /// How the raw body is read.
    body_format: BodyFormat,
    /// The string holding the document, as written and as pointer tokens.
    unwrap: Option<(String, Vec<String>)>,
}

impl JsonContract {
    /// Checks a source's keys and compiles its locations and globs, or names the key at fault.
    pub fn compile(spec: &JsonSourceSpec) -> Result<Self, ContractConfigError> {
        let ordering = match spec.ordering.as_deref() {
            None => {
                return Err(ContractConfigError::new(
                    "ordering",
                    "is required: latest-wins, in-order or unordered",
                ))
            }
            Some(raw) => JsonOrdering::ALL
                .into_iter()
                .find(|o| o.as_str() == raw)
                .ok_or_else(|| {
                    ContractConfigError::new(
                        "ordering",
                        format!("must be latest-wins, in-order or unordered, got {raw:?}"),
                    )
                })?,
        };
        let location = |key: &str, raw: &Option<String>| {
            raw.as_deref()
                .map(|raw| Alternatives::parse(raw).map_err(|p| ContractConfigError::new(key, p)))
                .transpose()
        };
        let event_id_from_body = spec.event_id.as_deref() == Some(BODY_EVENT_ID);
        let event_id = match event_id_from_body {
            true => None,
            false => location("event_id", &spec.event_id)?,
        };
        let idempotency_key = location("idempotency_key", &spec.idempotency_key)?;
        let base = Locations::compile(
            "",
            spec.aggregate.as_ref(),
            spec.sequence.as_deref(),
            spec.state.as_deref(),
        )?;
        let event_type = location("event_type", &spec.event_type)?;
        let types = spec
            .types
            .iter()
            .flatten()
            .enumerate()
            .map(|(i, entry)| {
                let at = format!("types[{i}].");
                let patterns = entry.matches.as_slice();
                if patterns.is_empty() || patterns.iter().any(String::is_empty) {
                    return Err(ContractConfigError::new(
                        &format!("{at}match"),
                        "must hold at least one pattern, none empty",
                    ));
                }
                Ok(TypeLocations {
                    globs: patterns.iter().map(|p| Glob::new(p)).collect(),
                    locations: Locations::compile(
                        &at,
                        entry.aggregate.as_ref(),
                        entry.sequence.as_deref(),
                        entry.state.as_deref(),
                    )?,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !types.is_empty() && event_type.is_none() {
            return Err(ContractConfigError::new(
                "types",
                "needs `event_type`, the location the type is read from",
            ));
        }
        let mut state_places: Vec<Vec<String>> = Vec::new();
        for locations in std::iter::once(&base).chain(types.iter().map(|t| &t.locations)) {
            let places = locations.state.clone().unwrap_or_else(|| vec![Vec::new()]);
            for place in places {
                if !state_places.contains(&place) {
                    state_places.push(place);
                }
            }
        }
        let (aggregate, sequence) = (&base.aggregate, &base.sequence);
        let unwrap = match spec.unwrap.as_deref() {
            None => None,
            Some(raw) => {
                let at = Location::parse(raw).map_err(|p| ContractConfigError::new("unwrap", p))?;
                Some((raw.to_owned(), pointer_tokens("unwrap", &at)?))
            }
        };
        if ordering != JsonOrdering::Unordered {
            if sequence.is_none() {
                return Err(ContractConfigError::new(
                    "sequence",
                    format!("is required when ordering = {:?}", ordering.as_str()),
                ));
            }
            if aggregate.is_empty() {
                return Err(ContractConfigError::new(
                    "aggregate",
                    format!("is required when ordering = {:?}", ordering.as_str()),
                ));
            }
        }
        let event_types = match &spec.event_types {
            None => None,
            Some(_) if event_type.is_none() => {
                return Err(ContractConfigError::new(
                    "event_types",
                    "needs `event_type`, the location the type is read from",
                ))
            }
            Some(patterns) if patterns.is_empty() => {
                return Err(ContractConfigError::new(
                    "event_types",
                    "must hold at least one pattern (omit it to accept every type)",
                ))
            }
            Some(patterns) => {
                if patterns.iter().any(String::is_empty) {
                    return Err(ContractConfigError::new(
                        "event_types",
                        "must not hold an empty pattern",
                    ));
                }
                Some(patterns.iter().map(|p| Glob::new(p)).collect())
            }
        };
        Ok(Self {
            event_id,
            event_id_from_body,
            idempotency_key,
            base,
            types,
            state_places,
            missing: spec.missing_locations.unwrap_or_default(),
            event_type,
            event_types,
            ordering,
            body_format: spec.body_format.unwrap_or_default(),
            unwrap,
        })
    }

    /// How the source's raw bodies are read.
    pub fn body_format(&self) -> BodyFormat {
        self.body_format
    }

    /// The document the locations read from a raw body: the JSON, or the form's fields
    /// object; then, with `unwrap`, the JSON held by the string at that location.
    pub fn document(&self, body: &[u8]) -> Result<Value, ContractError> {
        let mut document = match self.body_format {
            BodyFormat::Json => parse_body(body)?,
            BodyFormat::Form => Value::Object(super::form::read_form(body)?),
        };
        let Some((text, tokens)) = &self.unwrap else {
            return Ok(document);
        };
        let named = |problem: String| ContractError {
            problems: vec![FieldProblem {
                field: text.clone(),
                problem,
            }],
        };
        match pointer_mut(&mut document, tokens).map(Value::take) {
            None | Some(Value::Null) => Err(named("is required".into())),
            Some(Value::String(inner)) => parse_body(inner.as_bytes()).map_err(|err| {
                let problem = err.problems.into_iter().next().map(|p| p.problem);
                named(format!(
                    "must be a string holding JSON: it {}",
                    problem.unwrap_or_default()
                ))
            }),
            Some(other) => Err(named(format!(
                "must be a string holding JSON, got {}",
                kind_of(&other)
            ))),
        }
    }

    /// The source's ordering.
    pub fn ordering(&self) -> JsonOrdering {
        self.ordering
    }

    /// Whether the source locates a sequence (an unordered source may not), for any type.
    pub fn locates_sequence(&self) -> bool {
        self.base.sequence.is_some() || self.types.iter().any(|t| t.locations.sequence.is_some())
    }

    /// The locations of events of type `event_type`: the first `[[types]]` entry that
    /// matches it, else the source's own.
    fn locations_for(&self, event_type: Option<&str>) -> &Locations {
        event_type
            .and_then(|t| {
                self.types
                    .iter()
                    .find(|entry| entry.globs.iter().any(|g| g.matches(t)))
            })
            .map_or(&self.base, |entry| &entry.locations)
    }

    /// Whether the event id is the raw body's SHA-256 (`event_id = "body"`).
    pub fn event_id_from_body(&self) -> bool {
        self.event_id_from_body
    }

    /// Parses a raw body, then the delivery; for callers that do not need the value themselves.
    /// With `event_id = "body"` the body's SHA-256 stands where the delivery id would.
    pub fn parse_bytes(
        &self,
        body: &[u8],
        headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<JsonParsed, ContractError> {
        let document = self.document(body)?;
        if self.event_id_from_body {
            let id = body_event_id(body);
            return self.parse(document, headers, Some(&id));
        }
        self.parse(document, headers, delivery_id)
    }

    /// Reads one delivery: `body` is the value [`JsonContract::document`] made of it (taken, so
    /// the state moves out instead of being copied), `delivery_id` the scheme's (with
    /// `event_id = "body"`, the raw body's [`body_event_id`], as [`JsonContract::parse_bytes`] passes).
    /// Every bad location is named, not only the first.
    pub fn parse(
        &self,
        mut body: Value,
        headers: &HeaderMap,
        delivery_id: Option<&str>,
    ) -> Result<JsonParsed, ContractError> {
        let lenient = self.missing == MissingLocations::Unordered;
        let mut problems = Vec::new();
        let mut read = Read {
            body: &body,
            headers,
            problems: &mut problems,
        };
        // The type first: a type the source does not accept is ignored whatever
        // else the body holds (GitHub sends every event type to one URL).
        let event_type = self
            .event_type
            .as_ref()
            .and_then(|at| read.id(at, false, Ident::parse_located));
        if lenient {
            // A type that does not read is no type: the delivery is still the publisher's.
            read.problems.clear();
        }
        if let Some(globs) = &self.event_types {
            // A body that is no object (a top-level array, a bare value) has no type to
            // read: it is malformed, not a type outside the list (docs/contract.md, `event_types`).
            if event_type.is_none() && !body.is_object() && read.problems.is_empty() {
                return Err(not_an_object());
            }
            let accepted = event_type
                .as_ref()
                .is_some_and(|t| globs.iter().any(|g| g.matches(t.as_str())));
            if !accepted && read.problems.is_empty() {
                // Read only for the log line: its problems are not this delivery's answer.
                let mut dropped = Vec::new();
                let mut quiet = Read {
                    body: &body,
                    headers,
                    problems: &mut dropped,
                };
                let event_id = self.event_id(&mut quiet, delivery_id);
                let mut misplaced = Vec::new();
                let (aggregate, sequence) = self.place(
                    &self.base,
                    &mut Read {
                        body: &body,
                        headers,
                        problems: &mut misplaced,
                    },
                );
                let place = (misplaced.is_empty() && !self.base.aggregate.is_empty()).then(|| {
                    IgnoredPlace {
                        aggregate,
                        sequence: sequence.map_or(0, |s| s.value.get()),
                    }
                });
                return Ok(JsonParsed::Ignored {
                    event_id,
                    event_type,
                    place,
                });
            }
        }
        let locations = self.locations_for(event_type.as_ref().map(Ident::as_str));
        let (event_id, idempotency_key, mut aggregate, sequence, unordered) = if lenient {
            let read =
                self.read_leniently(locations, &body, headers, delivery_id, event_type.as_ref());
            (Some(read.0), read.1, read.2, read.3, read.4)
        } else {
            let event_id = self.event_id(&mut read, delivery_id);
            let idempotency_key = self
                .idempotency_key
                .as_ref()
                .and_then(|at| read.id(at, false, IdempotencyKey::parse_located));
            let (aggregate, sequence) = self.place(locations, &mut read);
            let unordered = self.unversioned(locations, event_type.as_ref());
            (event_id, idempotency_key, aggregate, sequence, unordered)
        };
        let (Some(event_id), true) = (event_id, problems.is_empty()) else {
            // A top-level array or a bare value that none of the locations reaches into is
            // one problem on the whole body, not one per location it cannot hold
            // (docs/contract.md, json sources).
            if self.cannot_read(&body) {
                return Err(not_an_object());
            }
            return Err(ContractError { problems });
        };
        if locations.aggregate.is_empty() {
            // Each event its own aggregate; an event id always passes the part rule,
            // which is the same rule.
            match Ident::parse_located(event_id.as_str()) {
                Ok(part) => aggregate.push(part),
                Err(problem) => {
                    let field = self
                        .event_id
                        .as_ref()
                        .map_or("event_id", Alternatives::as_str);
                    return Err(ContractError {
                        problems: vec![FieldProblem {
                            field: field.to_owned(),
                            problem: problem.to_string(),
                        }],
                    });
                }
            }
        }
        let state = Self::take_state(locations, &mut body);
        Ok(JsonParsed::Event(JsonEvent {
            event_id,
            idempotency_key,
            aggregate,
            sequence: sequence.filter(|_| unordered.is_none()),
            event_type,
            state: state.filter(|v| !v.is_null()),
            unordered,
        }))
    }

    /// Why an event of a source that orders its events is unordered though every location
    /// read: its `[[types]]` entry names no sequence, so its payload carries no version.
    fn unversioned(&self, locations: &Locations, event_type: Option<&Ident>) -> Option<String> {
        (self.ordering != JsonOrdering::Unordered && locations.sequence.is_none()).then(|| {
            format!(
                "no version: a {:?} payload carries none",
                event_type.map_or("", Ident::as_str)
            )
        })
    }

    /// Reads a delivery under `missing_locations = "unordered"` (docs/contract.md, missing
    /// locations): nothing its body lacks is a problem. An event id that does not read is
    /// the scheme's delivery id, else the body's SHA-256; an aggregate part that does not
    /// read is the event type (else the event id); an idempotency key that does not read is
    /// none. An event whose sequence or any aggregate part did not read is unordered, and
    /// the reason says which.
    fn read_leniently(
        &self,
        locations: &Locations,
        body: &Value,
        headers: &HeaderMap,
        delivery_id: Option<&str>,
        event_type: Option<&Ident>,
    ) -> (
        EventId,
        Option<IdempotencyKey>,
        Vec<Ident>,
        Option<JsonSequence>,
        Option<String>,
    ) {
        let mut problems = Vec::new();
        let mut read = Read {
            body,
            headers,
            problems: &mut problems,
        };
        let event_id = self
            .event_id(&mut read, delivery_id)
            .or_else(|| delivery_id.and_then(|id| EventId::parse_located(id).ok()))
            .or_else(|| {
                // Serialized again, the same body gives the same text: a redelivery is a duplicate.
                let text = serde_json::to_vec(body).unwrap_or_default();
                EventId::parse_located(&body_event_id(&text)).ok()
            })
            .expect("a SHA-256 in hex is a valid event id");
        let idempotency_key = self
            .idempotency_key
            .as_ref()
            .and_then(|at| read.id(at, false, IdempotencyKey::parse_located));
        let mut reasons = Vec::new();
        let mut aggregate = Vec::with_capacity(locations.aggregate.len().max(1));
        for at in &locations.aggregate {
            read.problems.clear();
            match read.id(at, true, Ident::parse_located) {
                Some(part) => aggregate.push(part),
                None => {
                    let stand_in = event_type.cloned().unwrap_or_else(|| {
                        Ident::parse_located(event_id.as_str())
                            .expect("an event id is a valid aggregate part")
                    });
                    reasons.push(format!(
                        "aggregate part {} {}: {:?} stands in for it",
                        at.as_str(),
                        absent(read.problems),
                        stand_in.as_str()
                    ));
                    aggregate.push(stand_in);
                }
            }
        }
        let ordered = self.ordering != JsonOrdering::Unordered;
        let sequence = match &locations.sequence {
            Some(at) => {
                read.problems.clear();
                let sequence = read.sequence(at, self.ordering);
                if sequence.is_none() && ordered {
                    reasons.push(format!(
                        "no version: {} {}",
                        at.as_str(),
                        absent(read.problems)
                    ));
                }
                sequence
            }
            None => {
                reasons.extend(self.unversioned(locations, event_type));
                None
            }
        };
        let unordered = (ordered && !reasons.is_empty()).then(|| reasons.join("; "));
        (event_id, idempotency_key, aggregate, sequence, unordered)
    }

    /// The value a stored body keeps as its aggregate's state (`None` when absent or
    /// null): what settling reads again from the log, which holds no headers.
    /// `event_type` is the logged type, which picks the `[[types]]` entry.
    pub fn state_of(&self, body: &[u8], event_type: &str) -> Result<Option<Value>, ContractError> {
        let mut body = self.document(body)?;
        let locations = self.locations_for((!event_type.is_empty()).then_some(event_type));
        Ok(Self::take_state(locations, &mut body).filter(|v| !v.is_null()))
    }

    /// The state out of a document: the whole document without `state` (a form
    /// source's fields object), else the first alternative present.
    fn take_state(locations: &Locations, body: &mut Value) -> Option<Value> {
        match &locations.state {
            None => Some(body.take()),
            Some(alternatives) => {
                let tokens = alternatives
                    .iter()
                    .find(|tokens| resolve_pointer(body, tokens).is_some())?;
                pointer_mut(body, tokens).map(Value::take)
            }
        }
    }

    /// Where the state may sit in the document, as keys, one list per alternative (masking
    /// counts paths from the document's root); the whole document without `state`.
    pub fn state_locations(&self) -> &[Vec<String>] {
        &self.state_places
    }

    /// Whether `body` cannot be what the source reads: it is no object, and the source reads
    /// fields of the body by keys only (`/id`), none by an array index (`/0/sg_event_id`)
    /// nor the whole body. A source that reads nothing of the body takes any JSON.
    fn cannot_read(&self, body: &Value) -> bool {
        if body.is_object() {
            return false;
        }
        let located = self
            .event_id
            .iter()
            .chain(&self.idempotency_key)
            .chain(&self.event_type)
            .chain(
                std::iter::once(&self.base)
                    .chain(self.types.iter().map(|t| &t.locations))
                    .flat_map(|l| l.aggregate.iter().chain(&l.sequence)),
            )
            .flat_map(Alternatives::locations)
            .filter_map(|at| match at {
                Location::Pointer { tokens, .. } => Some(tokens.as_slice()),
                Location::Header { .. } | Location::Literal { .. } => None,
            });
        let state = std::iter::once(&self.base)
            .chain(self.types.iter().map(|t| &t.locations))
            .flat_map(|l| l.state.iter().flatten())
            .map(Vec::as_slice);
        let mut reads_the_body = false;
        for tokens in located.chain(state) {
            reads_the_body = true;
            let takes_it = match (tokens.first(), body) {
                (None, _) => true,
                (Some(first), Value::Array(_)) => array_index(first).is_some(),
                (Some(_), _) => false,
            };
            if takes_it {
                return false;
            }
        }
        reads_the_body
    }

    /// The aggregate parts and the sequence at `locations`, each problem recorded in `read`.
    fn place(
        &self,
        locations: &Locations,
        read: &mut Read<'_>,
    ) -> (Vec<Ident>, Option<JsonSequence>) {
        let mut aggregate = Vec::with_capacity(locations.aggregate.len().max(1));
        for at in &locations.aggregate {
            if let Some(part) = read.id(at, true, Ident::parse_located) {
                aggregate.push(part);
            }
        }
        let sequence = locations
            .sequence
            .as_ref()
            .and_then(|at| read.sequence(at, self.ordering));
        (aggregate, sequence)
    }

    /// The event id: its location's value, else the scheme's delivery id.
    fn event_id(&self, read: &mut Read<'_>, delivery_id: Option<&str>) -> Option<EventId> {
        if let Some(at) = &self.event_id {
            return read.id(at, true, EventId::parse_located);
        }
        let Some(delivery_id) = delivery_id else {
            read.problem(
                "event_id",
                "is required: the source sets no `event_id` location and the delivery \
                 carries no delivery id",
            );
            return None;
        };
        EventId::parse_located(delivery_id)
            .map_err(|problem| {
                read.problem(
                    "event_id",
                    format!("is the delivery id header, which {problem}"),
                )
            })
            .ok()
    }
}

/// The one problem of a body that is not a JSON object.
fn not_an_object() -> ContractError {
    ContractError {
        problems: vec![FieldProblem {
            field: "$".into(),
            problem: "must be a JSON object".into(),
        }],
    }
}

/// What a location that did not read is, for a reason in the event log: "is absent", or
/// its problem.
fn absent(problems: &[FieldProblem]) -> String {
    match problems.first().map(|p| p.problem.as_str()) {
        None | Some("is required") => "is absent".to_owned(),
        Some(problem) => problem.to_owned(),
    }
}

/// One delivery being read, with the problems found so far.
struct Read<'a> {
    body: &'a Value,
    headers: &'a HeaderMap,
    problems: &'a mut Vec<FieldProblem>,
}

impl<'a> Read<'a> {
    fn problem(&mut self, field: &str, problem: impl Into<String>) {
        self.problems.push(FieldProblem {
            field: field.to_owned(),
            problem: problem.into(),
        });
    }

    /// The value at the first of `at`'s alternatives present, with that alternative;
    /// recording a problem if it is required and none is.
    fn found<'l>(
        &mut self,
        at: &'l Alternatives,
        required: bool,
    ) -> Option<(Found<'l>, &'l Location)>
    where
        'a: 'l,
    {
        match at.resolve(self.body, self.headers) {
            Ok(Some((location, found))) => Some((found, location)),
            Ok(None) => {
                if required {
                    self.problem(at.as_str(), "is required");
                }
                None
            }
            Err((location, problem)) => {
                self.problem(location.as_str(), problem);
                None
            }
        }
    }

    /// An id-like value: a string, or an integer written in decimal.
    fn id<T>(
        &mut self,
        at: &Alternatives,
        required: bool,
        parse: fn(&str) -> Result<T, IdProblem>,
    ) -> Option<T> {
        let (found, at) = self.found(at, required)?;
        let parsed = match found {
            Found::Text(text) => parse(text),
            Found::Json(Value::String(text)) => parse(text),
            Found::Json(Value::Number(n)) if n.is_i64() || n.is_u64() => parse(&n.to_string()),
            Found::Json(Value::Number(_)) => {
                self.problem(
                    at.as_str(),
                    "must be a string or an integer, got a fractional or out-of-range number",
                );
                return None;
            }
            Found::Json(other) => {
                self.problem(
                    at.as_str(),
                    format!("must be a string or an integer, got {}", kind_of(other)),
                );
                return None;
            }
        };
        parsed
            .map_err(|problem| self.problem(at.as_str(), problem.to_string()))
            .ok()
    }

    /// A required sequence: an integer, or (unless in-order) an RFC 3339 timestamp.
    fn sequence(&mut self, at: &Alternatives, ordering: JsonOrdering) -> Option<JsonSequence> {
        let (found, at) = self.found(at, true)?;
        let text = match found {
            Found::Json(Value::String(text)) => text.as_str(),
            Found::Text(text) => text,
            Found::Json(value @ Value::Number(_)) => {
                return match non_negative_integer(value) {
                    Ok(n) => Sequence::new(n).map(|value| JsonSequence {
                        value,
                        source: SequenceSource::Integer,
                    }),
                    Err(problem) => {
                        self.problem(at.as_str(), problem);
                        None
                    }
                };
            }
            Found::Json(other) => {
                self.problem(
                    at.as_str(),
                    format!(
                        "must be an integer or an RFC 3339 timestamp, got {}",
                        kind_of(other)
                    ),
                );
                return None;
            }
        };
        let read = sequence_of_text(text).and_then(|sequence| {
            if sequence.source == SequenceSource::Timestamp && ordering == JsonOrdering::InOrder {
                Err(
                    "must be an integer when ordering = \"in-order\", got an RFC 3339 timestamp"
                        .into(),
                )
            } else {
                Ok(sequence)
            }
        });
        read.map_err(|problem| self.problem(at.as_str(), problem))
            .ok()
    }
}

/// A sequence written as text: a string of digits, or an RFC 3339 timestamp.
fn sequence_of_text(text: &str) -> Result<JsonSequence, String> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        let value = text
            .parse::<i64>()
            .ok()
            .and_then(Sequence::new)
            .ok_or_else(|| "must be at most 9223372036854775807".to_owned())?;
        return Ok(JsonSequence {
            value,
            source: SequenceSource::Integer,
        });
    }
    let at = OffsetDateTime::parse(text, &Rfc3339)
        .ok()
        .or_else(|| OffsetDateTime::parse(&ruby_time_as_rfc3339(text)?, &Rfc3339).ok())
        .ok_or_else(|| {
            "must be an integer, a string of digits or an RFC 3339 timestamp".to_owned()
        })?;
    let micros = at.unix_timestamp_nanos() / 1_000;
    i64::try_from(micros)
        .ok()
        .and_then(Sequence::new)
        .map(|value| JsonSequence {
            value,
            source: SequenceSource::Timestamp,
        })
        .ok_or_else(|| "must not be before 1970-01-01T00:00:00Z".to_owned())
}

/// Ruby's `Time#to_s` (`2015-05-17 18:08:09 UTC`, `2021-04-28 21:50:00 +0200`), the form
/// GitLab sends most of its times in, as RFC 3339: the same instant as its RFC 3339
/// spelling, so that a publisher mixing both still orders (docs/contract.md, sequence).
fn ruby_time_as_rfc3339(text: &str) -> Option<String> {
    let (date_time, zone) = text.split_at_checked(19)?;
    let (date, time) = date_time.split_once(' ')?;
    let offset = match zone.strip_prefix(' ')? {
        "UTC" => "Z".to_owned(),
        hhmm if hhmm.len() == 5 && hhmm.is_ascii() && matches!(&hhmm[..1], "+" | "-") => {
            format!("{}:{}", &hhmm[..3], &hhmm[3..])
        }
        _ => return None,
    };
    Some(format!("{date}T{time}{offset}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use serde_json::{json, Map};

    fn spec(toml_text: &str) -> JsonSourceSpec {
        toml::from_str(toml_text).unwrap()
    }

    fn contract(toml_text: &str) -> JsonContract {
        JsonContract::compile(&spec(toml_text)).unwrap()
    }

    fn config_error(toml_text: &str) -> ContractConfigError {
        JsonContract::compile(&spec(toml_text)).unwrap_err()
    }

    #[test]
    fn a_body_event_id_is_the_bodys_sha256_whatever_the_delivery_id() {
        let c = contract(
            "ordering = \"unordered\"\nevent_id = \"body\"\nevent_type = \"/t\"\nevent_types = [\"a.*\"]",
        );
        assert!(c.event_id_from_body());
        let body = br#"{"t":"a.b","x":1}"#;
        let hex_id = body_event_id(body);
        assert_eq!(hex_id.len(), 64);
        assert!(hex_id
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
        let JsonParsed::Event(e) = c.parse_bytes(body, &headers(&[]), Some("msg_1")).unwrap()
        else {
            panic!("an event");
        };
        assert_eq!(e.event_id.as_str(), hex_id);
        assert_eq!(e.aggregate[0].as_str(), hex_id);
        // One byte more is another event; an ignored type is logged under its body id too.
        assert_ne!(body_event_id(br#"{"t":"a.b","x":1} "#), hex_id);
        let ignored = br#"{"t":"z"}"#;
        let JsonParsed::Ignored { event_id, .. } =
            c.parse_bytes(ignored, &headers(&[]), None).unwrap()
        else {
            panic!("ignored");
        };
        assert_eq!(event_id.unwrap().as_str(), body_event_id(ignored));
        // The SHA-256 of the empty string, as every tool computes it.
        assert_eq!(
            body_event_id(b""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }

    #[test]
    fn a_body_that_is_no_object_is_one_problem_on_the_whole_body() {
        let whole = vec![FieldProblem {
            field: "$".into(),
            problem: "must be a JSON object".into(),
        }];
        // Without event_types, and with them for an accepted type read from a header.
        let plain = contract(
            "event_id = \"/id\"\naggregate = \"/a\"\nsequence = \"/seq\"\nordering = \"in-order\"",
        );
        let typed = contract(
            "event_id = \"/id\"\naggregate = \"/a\"\nordering = \"unordered\"\n\
             event_type = \"header:X-Type\"\nevent_types = [\"a.*\"]",
        );
        let accepted = headers(&[("x-type", "a.b")]);
        for body in [
            &br#"[{"id":"e1","a":"k","seq":1}]"#[..],
            b"7",
            b"\"text\"",
            b"null",
            b"[]",
        ] {
            for (c, h) in [(&plain, &headers(&[])), (&typed, &accepted)] {
                let err = c.parse_bytes(body, h, None).unwrap_err();
                assert_eq!(err.problems, whole, "{}", String::from_utf8_lossy(body));
            }
        }
        // A type outside the list is ignored, whatever the body holds.
        let outside = headers(&[("x-type", "z")]);
        assert!(matches!(
            typed.parse_bytes(b"[1]", &outside, None),
            Ok(JsonParsed::Ignored { .. })
        ));
        // A source whose locations reach into an array takes one, and names what it misses.
        let array = contract("event_id = \"/0/id\"\nordering = \"unordered\"");
        assert!(array
            .parse_bytes(br#"[{"id":"e1"}]"#, &headers(&[]), None)
            .is_ok());
        let err = array
            .parse_bytes(br#"[{"other":1}]"#, &headers(&[]), None)
            .unwrap_err();
        assert_eq!(err.problems[0].field, "/0/id", "{err}");
        // A source that reads nothing of the body takes any JSON, as before.
        let headers_only = contract("event_id = \"header:X-Id\"\nordering = \"unordered\"");
        assert!(headers_only
            .parse_bytes(b"[]", &headers(&[("x-id", "e1")]), None)
            .is_ok());
        // Without its header, it names the header, not the body.
        let err = headers_only
            .parse_bytes(b"[]", &headers(&[]), None)
            .unwrap_err();
        assert_eq!(err.problems[0].field, "header:X-Id", "{err}");
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn event(c: &JsonContract, body: Value, h: &HeaderMap, delivery: Option<&str>) -> JsonEvent {
        match c.parse(body, h, delivery) {
            Ok(JsonParsed::Event(e)) => e,
            other => panic!("expected an event, got {other:?}"),
        }
    }

    fn problems(c: &JsonContract, body: Value, h: &HeaderMap) -> Vec<(String, String)> {
        c.parse(body, h, None)
            .unwrap_err()
            .problems
            .into_iter()
            .map(|p| (p.field, p.problem))
            .collect()
    }

    const LATEST: &str = r#"
        event_id = "/id"
        aggregate = "/key"
        sequence = "/seq"
        ordering = "latest-wins"
    "#;

    /// A GitHub-like source: pull requests ordered, check runs by their own locations,
    /// stars with no version.
    const TYPED: &str = r#"
        event_id = "header:X-Delivery"
        event_type = "header:X-Event"
        aggregate = ["/repo", "/pull/number"]
        sequence = "/pull/updated_at"
        ordering = "latest-wins"
        [[types]]
        match = "check_*"
        aggregate = ["/repo", "=check_run", "/check_run/id"]
        sequence = "/check_run/completed_at|/check_run/started_at"
        state = "/check_run"
        [[types]]
        match = ["star", "fork"]
        aggregate = ["/repo", "/sender"]
    "#;

    fn typed_event(c: &JsonContract, kind: &str, body: Value) -> Result<JsonEvent, Vec<String>> {
        let h = headers(&[("X-Delivery", "d1"), ("X-Event", kind)]);
        match c.parse(body, &h, None) {
            Ok(JsonParsed::Event(e)) => Ok(e),
            Ok(other) => panic!("an event, got {other:?}"),
            Err(e) => Err(e.problems.into_iter().map(|p| p.field).collect()),
        }
    }

    #[test]
    fn a_types_entry_gives_its_types_locations_and_literals_tell_entities_apart() {
        let c = contract(TYPED);
        let run = typed_event(
            &c,
            "check_run",
            json!({"repo": "o/r", "check_run": {"id": 4, "started_at": "2024-01-01T00:00:00Z"}}),
        )
        .unwrap();
        let parts: Vec<&str> = run.aggregate.iter().map(Ident::as_str).collect();
        assert_eq!(parts, ["o/r", "check_run", "4"]);
        assert_eq!(run.sequence.unwrap().source, SequenceSource::Timestamp);
        assert_eq!(
            run.state,
            Some(json!({"id": 4, "started_at": "2024-01-01T00:00:00Z"}))
        );
        assert_eq!(run.unordered, None);
        // A pull request keeps the source's own locations.
        let pull = typed_event(
            &c,
            "pull_request",
            json!({"repo": "o/r", "pull": {"number": 4, "updated_at": 7}}),
        )
        .unwrap();
        assert_eq!(pull.aggregate.len(), 2);
        assert_eq!(pull.sequence.unwrap().value.get(), 7);
        // A type whose entry names no sequence is unordered, and says why.
        let star = typed_event(&c, "star", json!({"repo": "o/r", "sender": "u"})).unwrap();
        assert_eq!(star.sequence, None);
        assert!(star
            .unordered
            .unwrap()
            .contains("\"star\" payload carries none"));
        // The state of a logged row is read by its logged type.
        let body = br#"{"repo":"o/r","check_run":{"id":4}}"#;
        assert_eq!(
            c.state_of(body, "check_suite").unwrap(),
            Some(json!({"id": 4}))
        );
        assert!(c
            .state_of(body, "push")
            .unwrap()
            .unwrap()
            .get("repo")
            .is_some());
        assert!(c.state_locations().contains(&vec!["check_run".to_owned()]));
    }

    #[test]
    fn a_strict_source_refuses_a_missing_location_and_an_opted_in_one_applies_it_unordered() {
        let strict = contract(TYPED);
        let body = json!({"repo": "o/r", "check_run": {"id": 4}});
        assert_eq!(
            typed_event(&strict, "check_run", body.clone()).unwrap_err(),
            ["/check_run/completed_at|/check_run/started_at"]
        );
        let lenient = contract(&format!("missing_locations = \"unordered\"\n{TYPED}"));
        let run = typed_event(&lenient, "check_run", body).unwrap();
        assert_eq!(run.sequence, None);
        let why = run.unordered.unwrap();
        assert!(
            why.contains("no version: /check_run/completed_at|/check_run/started_at is absent"),
            "{why}"
        );
        // An aggregate part the body lacks: the type stands in, and the event is unordered
        // even though a sequence read (it versions another entity).
        let other = typed_event(
            &lenient,
            "deployment",
            json!({"repo": "o/r", "pull": {"updated_at": 3}}),
        )
        .unwrap();
        let parts: Vec<&str> = other.aggregate.iter().map(Ident::as_str).collect();
        assert_eq!(parts, ["o/r", "deployment"]);
        assert_eq!(other.sequence, None);
        assert!(other.unordered.unwrap().contains("/pull/number is absent"));
        // A malformed value is no refusal either.
        let odd = typed_event(
            &lenient,
            "pull_request",
            json!({"repo": {"x": 1}, "pull": {"number": 1, "updated_at": 1}}),
        )
        .unwrap();
        assert_eq!(odd.aggregate[0].as_str(), "pull_request");
        assert!(odd.unordered.is_some());
    }

    #[test]
    fn an_event_id_the_body_lacks_is_the_delivery_id_else_the_bodys_hash() {
        let c = contract(
            "missing_locations = \"unordered\"\nordering = \"unordered\"\nevent_id = \"/event_id\"\naggregate = \"/team_id\"",
        );
        let body = json!({"type": "app_rate_limited", "team_id": "T1"});
        let hashed = event(&c, body.clone(), &headers(&[]), None);
        assert_eq!(hashed.event_id.as_str().len(), 64);
        assert_eq!(
            event(&c, body.clone(), &headers(&[]), None).event_id,
            hashed.event_id
        );
        assert_eq!(hashed.unordered, None, "an unordered source says nothing");
        assert_eq!(
            event(&c, body, &headers(&[]), Some("d9")).event_id.as_str(),
            "d9"
        );
        // Strict, the same body is refused.
        let strict = contract(
            "ordering = \"unordered\"\nevent_id = \"/event_id\"\naggregate = \"/team_id\"",
        );
        assert!(strict
            .parse(json!({"team_id": "T1"}), &headers(&[]), None)
            .is_err());
    }

    #[test]
    fn types_and_missing_locations_are_checked_at_start() {
        for (text, key) in [
            ("ordering = \"unordered\"\n[[types]]\nmatch = \"a\"", "types"),
            ("ordering = \"unordered\"\nevent_type = \"/t\"\n[[types]]\nmatch = []", "types[0].match"),
            ("ordering = \"unordered\"\nevent_type = \"/t\"\n[[types]]\nmatch = \"a\"\nstate = \"header:X\"", "types[0].state"),
            ("ordering = \"unordered\"\nevent_type = \"/t\"\n[[types]]\nmatch = \"a\"\nsequence = \"x\"", "types[0].sequence"),
        ] {
            assert_eq!(config_error(text).key, key, "{text}");
        }
        assert!(toml::from_str::<JsonSourceSpec>("missing_locations = \"maybe\"").is_err());
        assert!(
            toml::from_str::<JsonSourceSpec>("[[types]]\nmatch = \"a\"\nordering = \"x\"").is_err()
        );
        assert!(Location::parse("=").is_err());
    }

    #[test]
    fn aggregate_is_one_location_or_a_list() {
        assert_eq!(
            spec("aggregate = \"/a\"").aggregate,
            Some(AggregateLocations::One("/a".into()))
        );
        assert_eq!(
            spec("aggregate = [\"/a\", \"header:X-B\"]").aggregate,
            Some(AggregateLocations::Many(vec![
                "/a".into(),
                "header:X-B".into()
            ]))
        );
    }

    #[test]
    fn inconsistent_keys_name_the_key() {
        let cases: [(&str, &str, &str); 19] = [
            (
                "aggregate = \"/a\"\nsequence = \"/s\"",
                "ordering",
                "is required",
            ),
            (
                "ordering = \"newest\"\naggregate = \"/a\"\nsequence = \"/s\"",
                "ordering",
                "\"newest\"",
            ),
            (
                "ordering = \"in-order\"\naggregate = \"/a\"",
                "sequence",
                "in-order",
            ),
            (
                "ordering = \"latest-wins\"\naggregate = \"/a\"",
                "sequence",
                "latest-wins",
            ),
            (
                "ordering = \"latest-wins\"\nsequence = \"/s\"",
                "aggregate",
                "is required",
            ),
            (
                "ordering = \"unordered\"\naggregate = []",
                "aggregate",
                "at least one",
            ),
            (
                "ordering = \"unordered\"\nevent_types = [\"a.*\"]",
                "event_types",
                "needs `event_type`",
            ),
            (
                "ordering = \"unordered\"\nevent_type = \"/t\"\nevent_types = []",
                "event_types",
                "at least one",
            ),
            (
                "ordering = \"unordered\"\nevent_type = \"/t\"\nevent_types = [\"a\", \"\"]",
                "event_types",
                "empty pattern",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"data.id\"",
                "event_id",
                "must start with `/`",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"/a~2b\"",
                "event_id",
                "`~`",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"/a~\"",
                "event_id",
                "`~`",
            ),
            (
                "ordering = \"unordered\"\naggregate = [\"/a\", \"b\"]",
                "aggregate",
                "\"b\"",
            ),
            (
                "ordering = \"unordered\"\nidempotency_key = \"header:\"",
                "idempotency_key",
                "names no header",
            ),
            (
                "ordering = \"unordered\"\nevent_type = \"header:Bad Name\"",
                "event_type",
                "not a valid header name",
            ),
            (
                "ordering = \"unordered\"\nstate = \"header:X-State\"",
                "state",
                "not a header",
            ),
            (
                "ordering = \"in-order\"\naggregate = \"/k\"\nsequence = \"header:Authorization\"",
                "sequence",
                "carries a signature or a credential",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"header:X-Hub-Signature-256\"",
                "event_id",
                "carries a signature or a credential",
            ),
            (
                "ordering = \"latest-wins\"\naggregate = [\"/k\", \"header:Cookie\"]\nsequence = \"/n\"",
                "aggregate",
                "carries a signature or a credential",
            ),
        ];
        for (text, key, fragment) in cases {
            let err = config_error(text);
            assert_eq!(err.key, key, "{text}: {err}");
            assert!(err.problem.contains(fragment), "{text}: {err}");
            assert!(err.to_string().starts_with(&format!("{key}: ")), "{err}");
        }
        // The consistent minimum of each ordering compiles.
        contract("ordering = \"unordered\"");
        contract(LATEST);
        contract("ordering = \"in-order\"\naggregate = \"/a\"\nsequence = \"/s\"");
        contract("ordering = \"unordered\"\nsequence = \"/s\"\nstate = \"\"");
    }

    #[test]
    fn ids_are_strings_or_decimal_integers_under_the_json_rule() {
        let c = contract(LATEST);
        let h = HeaderMap::new();
        let e = event(&c, json!({"id": 42, "key": -7, "seq": 1}), &h, None);
        assert_eq!(e.event_id.as_str(), "42");
        assert_eq!(e.aggregate[0].as_str(), "-7");
        let e = event(
            &c,
            json!({"id": "évt ü", "key": u64::MAX, "seq": 1}),
            &h,
            None,
        );
        assert_eq!(e.event_id.as_str(), "évt ü");
        assert_eq!(e.aggregate[0].as_str(), u64::MAX.to_string());
        let e = event(
            &c,
            json!({"id": "x".repeat(200), "key": "k", "seq": 1}),
            &h,
            None,
        );
        assert_eq!(e.event_id.as_str().len(), 200);

        let bad = [
            (json!(1.5), "fractional or out-of-range"),
            (json!(1e300), "fractional or out-of-range"),
            (json!(true), "got a boolean"),
            (json!({"a": 1}), "got an object"),
            (json!(["a"]), "got an array"),
            (json!(""), "must not be empty"),
            (json!("x".repeat(201)), "at most 200 bytes"),
            (json!("a\nb"), "control characters"),
            (json!("a\u{85}b"), "control characters"),
        ];
        for (id, fragment) in bad {
            let found = problems(&c, json!({"id": id, "key": "k", "seq": 1}), &h);
            assert_eq!(found.len(), 1, "{id}: {found:?}");
            assert_eq!(found[0].0, "/id");
            assert!(found[0].1.contains(fragment), "{id}: {found:?}");
        }
    }

    #[test]
    fn missing_required_locations_are_named_and_optional_ones_absent() {
        let c = contract(
            r#"
            event_id = "/data/object/id"
            idempotency_key = "header:Idempotency-Key"
            aggregate = ["/data/object/object", "/data/object/id"]
            sequence = "header:X-Seq"
            event_type = "/type"
            ordering = "latest-wins"
            state = "/data/object"
            "#,
        );
        let h = HeaderMap::new();
        let found = problems(&c, json!({"data": {"object": {"object": null}}}), &h);
        assert_eq!(
            found,
            [
                ("/data/object/id".to_owned(), "is required".to_owned()),
                ("/data/object/object".to_owned(), "is required".to_owned()),
                ("/data/object/id".to_owned(), "is required".to_owned()),
                ("header:X-Seq".to_owned(), "is required".to_owned()),
            ]
        );
        // A step through a scalar finds nothing, like an absent key.
        let found = problems(&c, json!({"data": "flat"}), &headers(&[("x-seq", "3")]));
        assert!(found.iter().all(|(_, p)| p == "is required"), "{found:?}");

        let body = json!({"data": {"object": {"object": "invoice", "id": "in_1"}}});
        let e = event(&c, body, &headers(&[("x-seq", "3")]), None);
        assert_eq!(e.idempotency_key, None);
        assert_eq!(e.event_type, None);
        assert_eq!(e.state, Some(json!({"object": "invoice", "id": "in_1"})));
        // The state's location absent: no state, the event still parses.
        let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"\nstate = \"/nope\"");
        assert_eq!(event(&c, json!({"id": "a"}), &h, None).state, None);
        // An optional location holding the wrong type is still a 400.
        let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"\nidempotency_key = \"/k\"\nevent_type = \"/t\"");
        let found = problems(&c, json!({"id": "a", "k": [], "t": false}), &h);
        assert_eq!(
            found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
            ["/t", "/k"]
        );
    }

    #[test]
    fn the_delivery_id_stands_in_for_an_unlocated_event_id() {
        let c = contract("ordering = \"unordered\"");
        let h = HeaderMap::new();
        let e = event(&c, json!({}), &h, Some("msg_1"));
        assert_eq!(e.event_id.as_str(), "msg_1");
        // Unordered without aggregate: each event is its own aggregate.
        assert_eq!(e.aggregate, [Ident::parse("msg_1").unwrap()]);
        assert_eq!(e.state, Some(json!({})));

        let err = c.parse(json!({}), &h, None).unwrap_err();
        assert_eq!(err.problems.len(), 1);
        assert_eq!(err.problems[0].field, "event_id");
        assert!(err.problems[0].problem.starts_with("is required"));
        let err = c.parse(json!({}), &h, Some("a\u{7}")).unwrap_err();
        assert_eq!(err.problems[0].field, "event_id");
        assert!(err.problems[0].problem.contains("delivery id header"));

        // A located event id ignores the delivery id, even when absent.
        let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"");
        let found = problems(&c, json!({}), &h);
        assert_eq!(found, [("/id".to_owned(), "is required".to_owned())]);
        let e = event(&c, json!({"id": "evt"}), &h, Some("msg_1"));
        assert_eq!(e.event_id.as_str(), "evt");
    }

    #[test]
    fn sequences_are_integers_or_rfc3339_timestamps() {
        let c = contract(LATEST);
        let h = HeaderMap::new();
        let seq = |v: Value| {
            event(&c, json!({"id": "e", "key": "k", "seq": v}), &h, None)
                .sequence
                .unwrap()
        };
        let int = |n| JsonSequence {
            value: Sequence::new(n).unwrap(),
            source: SequenceSource::Integer,
        };
        let stamp = |n| JsonSequence {
            value: Sequence::new(n).unwrap(),
            source: SequenceSource::Timestamp,
        };
        assert_eq!(seq(json!(0)), int(0));
        assert_eq!(seq(json!(i64::MAX)), int(i64::MAX));
        assert_eq!(seq(json!("0042")), int(42));
        assert_eq!(seq(json!("1970-01-01T00:00:01Z")), stamp(1_000_000));
        assert_eq!(
            seq(json!("2024-03-01T12:00:00.123456789+01:00")),
            stamp(1_709_290_800_123_456)
        );
        // GitLab's Ruby-written times: the instants their RFC 3339 spellings name.
        assert_eq!(
            seq(json!("2015-05-17 18:08:09 UTC")),
            seq(json!("2015-05-17T18:08:09Z"))
        );
        assert_eq!(
            seq(json!("2021-04-28 21:50:00 +0200")),
            seq(json!("2021-04-28T19:50:00Z"))
        );

        let bad = [
            (json!(-1), "must not be negative"),
            (json!(u64::MAX), "at most 9223372036854775807"),
            (json!(1.5), "must be an integer"),
            (json!("9223372036854775808"), "at most 9223372036854775807"),
            (json!("-1"), "RFC 3339"),
            (json!(""), "RFC 3339"),
            (json!("2024-03-01 12:00"), "RFC 3339"),
            (json!("2015-05-17 18:08:09 CEST"), "RFC 3339"),
            (json!("2015-05-17 18:08:09 +02"), "RFC 3339"),
            (json!("1969-12-31T23:59:59Z"), "before 1970"),
            (json!(true), "got a boolean"),
        ];
        for (v, fragment) in bad {
            let found = problems(&c, json!({"id": "e", "key": "k", "seq": v}), &h);
            assert_eq!(found.len(), 1, "{v}: {found:?}");
            assert_eq!(found[0].0, "/seq");
            assert!(found[0].1.contains(fragment), "{v}: {found:?}");
        }
    }

    #[test]
    fn in_order_needs_integer_sequences() {
        let c = contract("ordering = \"in-order\"\naggregate = \"/k\"\nsequence = \"header:X-Seq\"\nevent_id = \"/id\"");
        let body = || json!({"id": "e", "k": "a"});
        let e = event(&c, body(), &headers(&[("x-seq", "7")]), None);
        assert_eq!(e.sequence.unwrap().value.get(), 7);
        let found = problems(&c, body(), &headers(&[("x-seq", "2024-01-01T00:00:00Z")]));
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "header:X-Seq");
        assert!(found[0].1.contains("in-order"), "{found:?}");
    }

    #[test]
    fn header_locations_are_read_once_and_as_text() {
        let c = contract("ordering = \"unordered\"\nevent_id = \"header:X-Id\"");
        let found = problems(&c, json!({}), &headers(&[("x-id", "a"), ("x-id", "b")]));
        assert_eq!(found[0].0, "header:X-Id");
        assert!(found[0].1.contains("more than once"));
        let mut h = HeaderMap::new();
        h.insert("x-id", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
        let found = problems(&c, json!({}), &h);
        assert_eq!(
            found,
            [("header:X-Id".to_owned(), "must be UTF-8 text".to_owned())]
        );
        let mut h = HeaderMap::new();
        h.insert("x-id", HeaderValue::from_bytes("évt".as_bytes()).unwrap());
        assert_eq!(event(&c, json!({}), &h, None).event_id.as_str(), "évt");
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        let body = json!({"a/b": {"m~n": [10, {"": "deep"}]}, "": 1, "items": ["x", "y"]});
        let at = |p: &str| match Location::parse(p).unwrap() {
            Location::Pointer { tokens, .. } => resolve_pointer(&body, &tokens).cloned(),
            Location::Header { .. } | Location::Literal { .. } => unreachable!(),
        };
        assert_eq!(at(""), Some(body.clone()));
        assert_eq!(at("/"), Some(json!(1)));
        assert_eq!(at("/a~1b/m~0n/0"), Some(json!(10)));
        assert_eq!(at("/a~1b/m~0n/1/"), Some(json!("deep")));
        assert_eq!(at("/items/1"), Some(json!("y")));
        for absent in [
            "/items/01",
            "/items/-",
            "/items/2",
            "/items/+1",
            "/a~1b/m~0n/0/x",
            "/ab",
        ] {
            assert_eq!(at(absent), None, "{absent}");
        }
        // `~01` is `~1` unescaped once, never `/`.
        assert_eq!(
            Location::parse("/~01").unwrap(),
            Location::Pointer {
                text: "/~01".into(),
                tokens: vec!["~1".into()]
            }
        );
    }

    #[test]
    fn event_types_are_read_first() {
        let c = contract(
            r#"
            event_id = "header:X-GitHub-Delivery"
            event_type = "header:X-GitHub-Event"
            event_types = ["pull_request", "issue*"]
            aggregate = "/repository/full_name"
            sequence = "/updated_at"
            ordering = "latest-wins"
            "#,
        );
        // A type outside the list is ignored whatever the body holds.
        let h = headers(&[("x-github-event", "ping"), ("x-github-delivery", "d-1")]);
        assert_eq!(
            c.parse(json!([1, 2]), &h, None).unwrap(),
            JsonParsed::Ignored {
                event_id: Some(EventId::parse("d-1").unwrap()),
                event_type: Some(Ident::parse("ping").unwrap()),
                place: None,
            }
        );
        // Its place is read when every location of it reads cleanly, only to log it there.
        let placed = json!({"repository": {"full_name": "octo/repo"},
                            "updated_at": "2024-05-01T10:20:30Z"});
        assert_eq!(
            c.parse(placed.clone(), &h, None).unwrap(),
            JsonParsed::Ignored {
                event_id: Some(EventId::parse("d-1").unwrap()),
                event_type: Some(Ident::parse("ping").unwrap()),
                place: Some(IgnoredPlace {
                    aggregate: vec![Ident::parse("octo/repo").unwrap()],
                    sequence: 1_714_558_830_000_000,
                }),
            }
        );
        let mut unplaced = placed;
        unplaced["updated_at"] = json!(true);
        assert!(matches!(
            c.parse(unplaced, &h, None).unwrap(),
            JsonParsed::Ignored { place: None, .. }
        ));
        let h = headers(&[("x-github-event", "push"), ("x-github-delivery", "")]);
        assert_eq!(
            c.parse(json!({}), &h, None).unwrap(),
            JsonParsed::Ignored {
                event_id: None,
                event_type: Some(Ident::parse("push").unwrap()),
                place: None,
            }
        );
        // No type at all is outside the list too.
        assert!(matches!(
            c.parse(json!({}), &HeaderMap::new(), None).unwrap(),
            JsonParsed::Ignored {
                event_type: None,
                ..
            }
        ));
        // An accepted type goes on to the other fields.
        let h = headers(&[("x-github-event", "issues"), ("x-github-delivery", "d-2")]);
        let found = problems(&c, json!({}), &h);
        assert_eq!(
            found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
            ["/repository/full_name", "/updated_at"]
        );
        // A type of the wrong type is a 400, with the rest of the problems.
        let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"\nevent_type = \"/t\"\nevent_types = [\"*\"]");
        let found = problems(&c, json!({"t": {}}), &HeaderMap::new());
        assert_eq!(
            found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
            ["/t", "/id"]
        );
    }

    /// A plain recursive glob matcher, slow and obviously right, to check [`Glob`] against.
    fn reference_glob(pattern: &[u8], text: &[u8]) -> bool {
        match pattern.split_first() {
            None => text.is_empty(),
            Some((b'*', rest)) => (0..=text.len()).any(|i| reference_glob(rest, &text[i..])),
            Some((c, rest)) => text.first() == Some(c) && reference_glob(rest, &text[1..]),
        }
    }

    #[test]
    fn globs_match_stars_and_literals() {
        let yes = [
            ("invoice.*", "invoice.paid"),
            ("invoice.*", "invoice."),
            ("*", ""),
            ("*.created", "customer.created"),
            ("a*b*c", "abc"),
            ("a*b*c", "axxbyybc"),
            ("pull_request", "pull_request"),
            ("a**", "a"),
        ];
        let no = [
            ("invoice.*", "invoice"),
            ("invoice.*", "xinvoice.paid"),
            ("pull_request", "pull_request_review"),
            ("a*b*c", "acb"),
            ("ab*ba", "aba"),
            ("a.b", "axb"),
        ];
        for (p, t) in yes {
            assert!(Glob::new(p).matches(t), "{p} {t}");
        }
        for (p, t) in no {
            assert!(!Glob::new(p).matches(t), "{p} {t}");
        }
    }

    #[test]
    fn a_stripe_event() {
        let c = contract(
            r#"
            event_id = "/id"
            aggregate = ["/data/object/object", "/data/object/id"]
            sequence = "/created"
            event_type = "/type"
            event_types = ["invoice.*", "customer.*"]
            ordering = "latest-wins"
            state = "/data/object"
            "#,
        );
        let body =
            br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2023-10-16",
            "created":1686089970,"livemode":false,"pending_webhooks":0,
            "request":{"id":null,"idempotency_key":null},"type":"invoice.paid",
            "data":{"object":{"id":"in_1NG8Dt2eZvKYlo2C","object":"invoice","amount_paid":2000,
            "customer":"cus_9s6XKzkNRiz8i3","status":"paid"}}}"#;
        let JsonParsed::Event(e) = c
            .parse_bytes(body, &HeaderMap::new(), Some("ignored"))
            .unwrap()
        else {
            panic!("an invoice event is accepted");
        };
        assert_eq!(e.event_id.as_str(), "evt_1NG8Du2eZvKYlo2CUI79vXWy");
        assert_eq!(
            e.aggregate.iter().map(Ident::as_str).collect::<Vec<_>>(),
            ["invoice", "in_1NG8Dt2eZvKYlo2C"]
        );
        assert_eq!(
            e.sequence,
            Some(JsonSequence {
                value: Sequence::new(1_686_089_970).unwrap(),
                source: SequenceSource::Integer
            })
        );
        assert_eq!(e.event_type.unwrap().as_str(), "invoice.paid");
        assert_eq!(e.state.unwrap()["amount_paid"], json!(2000));
        let charge = String::from_utf8_lossy(body).replace("invoice.paid", "charge.succeeded");
        assert!(matches!(
            c.parse_bytes(charge.as_bytes(), &HeaderMap::new(), None),
            Ok(JsonParsed::Ignored { .. })
        ));
    }

    #[test]
    fn a_github_event() {
        let c = contract(
            r#"
            event_type = "header:X-GitHub-Event"
            event_types = ["pull_request"]
            aggregate = ["/repository/full_name", "/pull_request/number"]
            sequence = "/pull_request/updated_at"
            ordering = "latest-wins"
            state = "/pull_request"
            "#,
        );
        let body = br#"{"action":"synchronize","number":7,
            "pull_request":{"number":7,"state":"open","title":"Fix",
              "updated_at":"2024-05-01T10:20:30Z"},
            "repository":{"id":1296269,"full_name":"octo/repo"},
            "sender":{"login":"octocat"}}"#;
        let h = headers(&[
            ("x-github-event", "pull_request"),
            ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
        ]);
        // The scheme hands over X-GitHub-Delivery as the delivery id.
        let delivery = h["x-github-delivery"].to_str().unwrap();
        let JsonParsed::Event(e) = c.parse_bytes(body, &h, Some(delivery)).unwrap() else {
            panic!("a pull_request event is accepted");
        };
        assert_eq!(e.event_id.as_str(), delivery);
        // A part holding `/` stays one part.
        assert_eq!(
            e.aggregate.iter().map(Ident::as_str).collect::<Vec<_>>(),
            ["octo/repo", "7"]
        );
        let seq = e.sequence.unwrap();
        assert_eq!(seq.source, SequenceSource::Timestamp);
        assert_eq!(seq.value.get(), 1_714_558_830_000_000);
        assert_eq!(e.state.unwrap()["title"], json!("Fix"));
    }

    #[test]
    fn a_shopify_event() {
        let c = contract(
            r#"
            event_type = "header:X-Shopify-Topic"
            event_types = ["orders/*"]
            aggregate = "/id"
            sequence = "/updated_at"
            ordering = "latest-wins"
            "#,
        );
        let body = br#"{"id":820982911946154508,"email":"jon@example.com",
            "updated_at":"2024-05-01T06:20:30-04:00","total_price":"199.65"}"#;
        let h = headers(&[("x-shopify-topic", "orders/updated")]);
        let JsonParsed::Event(e) = c.parse_bytes(body, &h, Some("b54557e4-bdd9-4b37")).unwrap()
        else {
            panic!("an orders/updated event is accepted");
        };
        assert_eq!(e.event_id.as_str(), "b54557e4-bdd9-4b37");
        assert_eq!(e.aggregate[0].as_str(), "820982911946154508");
        assert_eq!(e.sequence.unwrap().value.get(), 1_714_558_830_000_000);
        assert_eq!(e.event_type.unwrap().as_str(), "orders/updated");
        assert_eq!(e.state.unwrap()["total_price"], json!("199.65"));
        let h = headers(&[("x-shopify-topic", "products/update")]);
        assert!(matches!(
            c.parse_bytes(body, &h, Some("d")),
            Ok(JsonParsed::Ignored { .. })
        ));
    }

    /// Any JSON value, a few levels deep, leaning to the shapes ids and sequences take.
    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            "[a-z0-9.*]{0,8}".prop_map(Value::from),
            "\\PC{0,4}".prop_map(Value::from),
            Just(Value::from("2024-05-01T10:20:30Z")),
        ];
        leaf.prop_recursive(2, 12, 3, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Escapes a key as an RFC 6901 reference token.
    fn escape(key: &str) -> String {
        key.replace('~', "~0").replace('/', "~1")
    }

    proptest::proptest! {
        #[test]
        fn pointers_round_trip_and_find_what_was_put_there(
            keys in proptest::collection::vec("[a-z/~01]{0,5}|\\PC{0,4}", 0..6),
            leaf in "[ -~]{1,20}",
        ) {
            let text: String = keys.iter().map(|k| format!("/{}", escape(k))).collect();
            let location = Location::parse(&text).unwrap();
            proptest::prop_assert_eq!(location.as_str(), text.as_str());
            let Location::Pointer { tokens, .. } = &location else {
                return Err(proptest::test_runner::TestCaseError::fail("a pointer"));
            };
            proptest::prop_assert_eq!(tokens, &keys);
            let mut body = json!(leaf.clone());
            for key in keys.iter().rev() {
                body = json!({ key.as_str(): body });
            }
            proptest::prop_assert_eq!(resolve_pointer(&body, tokens), Some(&json!(leaf)));
            // serde_json's own reading of the pointer agrees.
            proptest::prop_assert_eq!(body.pointer(&text), Some(&json!(leaf)));
        }

        #[test]
        fn text_and_integer_ids_behave(text in "\\PC{0,60}|[ -~]{190,210}|.{0,3}", n in proptest::prelude::any::<i64>()) {
            let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"");
            let h = HeaderMap::new();
            let valid = (1..=200).contains(&text.len())
                && !text.chars().any(|c| c.is_control() || crate::domain::is_invisible_format(c));
            match c.parse(json!({"id": text}), &h, None) {
                Ok(JsonParsed::Event(e)) => {
                    proptest::prop_assert!(valid);
                    proptest::prop_assert_eq!(e.event_id.as_str(), text.as_str());
                    proptest::prop_assert_eq!(e.aggregate[0].as_str(), text.as_str());
                }
                Ok(other) => proptest::prop_assert!(false, "{:?}", other),
                Err(err) => {
                    proptest::prop_assert!(!valid);
                    proptest::prop_assert_eq!(err.problems.len(), 1);
                    proptest::prop_assert_eq!(&err.problems[0].field, "/id");
                }
            }
            let e = event(&c, json!({"id": n}), &h, None);
            proptest::prop_assert_eq!(e.event_id.as_str(), n.to_string());
            // The same id as text is the same event id.
            let as_text = event(&c, json!({"id": n.to_string()}), &h, None);
            proptest::prop_assert_eq!(e.event_id, as_text.event_id);
        }

        #[test]
        fn globs_agree_with_a_reference_matcher(pattern in "[ab*]{1,8}", text in "[ab]{0,10}") {
            proptest::prop_assert_eq!(
                Glob::new(&pattern).matches(&text),
                reference_glob(pattern.as_bytes(), text.as_bytes())
            );
        }

        /// The fuzz target `json_contract` in miniature, so CI checks it without
        /// nightly: bodies near a valid one, or raw bytes, never panic, and the
        /// delivery id changes nothing when the body locates its own event id.
        #[test]
        fn hostile_bodies_are_named_problems_never_panics(
            id in proptest::option::of(json_value()),
            key in proptest::option::of(json_value()),
            seq in proptest::option::of(json_value()),
            kind in proptest::option::of(json_value()),
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
            as_raw in proptest::prelude::any::<bool>(),
        ) {
            let body = if as_raw {
                raw
            } else {
                let mut map = Map::new();
                for (name, value) in [("id", id), ("key", key), ("seq", seq), ("t", kind)] {
                    if let Some(value) = value {
                        map.insert(name.to_owned(), value);
                    }
                }
                serde_json::to_vec(&map).unwrap()
            };
            let c = contract(&format!("{LATEST}\nevent_type = \"/t\"\nevent_types = [\"a*\"]"));
            let h = HeaderMap::new();
            let plain = c.parse_bytes(&body, &h, None);
            if let Err(err) = &plain {
                proptest::prop_assert!(!err.problems.is_empty());
            }
            let with = c.parse_bytes(&body, &h, Some("msg_prop"));
            proptest::prop_assert_eq!(plain, with);
        }

        #[test]
        fn digit_strings_and_numbers_are_the_same_sequence(n in 0..=i64::MAX) {
            let c = contract(LATEST);
            let h = HeaderMap::new();
            let of = |v: Value| event(&c, json!({"id": "e", "key": "k", "seq": v}), &h, None).sequence;
            proptest::prop_assert_eq!(of(json!(n)), of(json!(n.to_string())));
            proptest::prop_assert_eq!(of(json!(n)).unwrap().value.get(), n);
        }
    }

    /// json ingest should cost about what save-game's does (docs/benchmarks.md); this prints the
    /// ratio on similar bodies (run with `--ignored --nocapture`, in release for
    /// numbers that mean anything). No assertion: timings vary by machine.
    #[test]
    #[ignore]
    fn parse_cost_against_save_game() {
        let save = br#"{"event_id":"evt_0001","event_type":"inventory.updated","payload_version":1,
            "occurred_at":"2024-05-01T10:20:30Z","player_id":"player_1","save_slot":"slot_a",
            "sequence":42,"idempotency_key":"idem_0001",
            "data":{"added_items":[{"item_id":"sword","qty":1},{"item_id":"potion","qty":3}],
            "removed_items":[{"item_id":"gold","qty":50}]}}"#;
        let json_body = br#"{"id":"evt_0001","type":"inventory.updated","api_version":1,
            "occurred_at":"2024-05-01T10:20:30Z","player":"player_1","slot":"slot_a",
            "created":42,"request":{"idempotency_key":"idem_0001"},
            "data":{"added_items":[{"item_id":"sword","qty":1},{"item_id":"potion","qty":3}],
            "removed_items":[{"item_id":"gold","qty":50}]}}"#;
        let c = contract(
            r#"
            event_id = "/id"
            idempotency_key = "/request/idempotency_key"
            aggregate = ["/player", "/slot"]
            sequence = "/created"
            event_type = "/type"
            event_types = ["inventory.*"]
            ordering = "in-order"
            state = "/data"
            "#,
        );
        let h = headers(&[("webhook-id", "msg_1")]);
        let rounds = 200_000;
        let time = |f: &dyn Fn()| {
            let start = std::time::Instant::now();
            for _ in 0..rounds {
                f();
            }
            start.elapsed()
        };
        let save_cost = time(&|| {
            std::hint::black_box(crate::domain::kind::save::SaveEvent::parse(
                std::hint::black_box(save),
            ))
            .unwrap();
        });
        let json_cost = time(&|| {
            std::hint::black_box(c.parse_bytes(std::hint::black_box(json_body), &h, None)).unwrap();
        });
        println!(
            "save-game {:?}/parse, json {:?}/parse, json/save-game = {:.2}",
            save_cost / rounds,
            json_cost / rounds,
            json_cost.as_secs_f64() / save_cost.as_secs_f64()
        );
    }

    #[test]
    fn alternatives_are_tried_in_order_and_the_first_present_wins() {
        let c = contract(
            r#"
            event_id = "header:X-Id|/id"
            aggregate = ["/repo", "/pull_request/number|/issue/number"]
            sequence = "/pull_request/n|/issue/n"
            state = "/pull_request|/issue"
            ordering = "latest-wins"
        "#,
        );
        let body = json!({"id": "b", "repo": "web",
                          "pull_request": {"number": 7, "n": 2},
                          "issue": {"number": 9, "n": 1}});
        // Both present: the first alternative wins, header or pointer alike.
        let e = event(&c, body.clone(), &headers(&[("x-id", "h")]), None);
        assert_eq!(e.event_id.as_str(), "h");
        assert_eq!(e.aggregate[1].as_str(), "7");
        assert_eq!(e.sequence.unwrap().value.get(), 2);
        assert_eq!(e.state, Some(json!({"number": 7, "n": 2})));
        // The first absent (or null): the next.
        let issue = json!({"id": "b", "repo": "web", "pull_request": null,
                           "issue": {"number": 9, "n": 1}});
        let e = event(&c, issue, &HeaderMap::new(), None);
        assert_eq!(e.event_id.as_str(), "b");
        assert_eq!(e.aggregate[1].as_str(), "9");
        assert_eq!(e.sequence.unwrap().value.get(), 1);
        assert_eq!(e.state, Some(json!({"number": 9, "n": 1})));
        // None present: the whole text is named; a bad value names its alternative.
        let p = problems(&c, json!({"id": "b", "repo": "web"}), &HeaderMap::new());
        assert!(p.contains(&(
            "/pull_request/number|/issue/number".into(),
            "is required".into()
        )));
        let p = problems(
            &c,
            json!({"id": "b", "repo": "web", "issue": {"number": [1], "n": 1}}),
            &HeaderMap::new(),
        );
        assert_eq!(p[0].0, "/issue/number", "{p:?}");
        // A header sent twice is a problem, not a reason to try the next alternative.
        let p = problems(&c, body, &headers(&[("x-id", "1"), ("x-id", "2")]));
        assert_eq!(p[0].0, "header:X-Id", "{p:?}");
    }

    #[test]
    fn an_empty_alternative_or_a_bad_unwrap_is_a_config_error() {
        let cases = [
            ("ordering = \"unordered\"\nevent_id = \"/a|\"", "event_id"),
            ("ordering = \"unordered\"\nevent_id = \"|/a\"", "event_id"),
            (
                "ordering = \"latest-wins\"\naggregate = [\"/a\", \"/b||/c\"]\nsequence = \"/s\"",
                "aggregate",
            ),
            (
                "ordering = \"unordered\"\nstate = \"/a|header:X-S\"",
                "state",
            ),
            (
                "ordering = \"unordered\"\nunwrap = \"header:X-P\"",
                "unwrap",
            ),
            ("ordering = \"unordered\"\nunwrap = \"payload\"", "unwrap"),
        ];
        for (text, key) in cases {
            let err = config_error(text);
            assert_eq!(err.key, key, "{text}: {err}");
        }
        assert!(config_error("ordering = \"unordered\"\nevent_id = \"/a|\"")
            .problem
            .contains("empty alternative"));
        assert!(toml::from_str::<JsonSourceSpec>("body_format = \"xml\"").is_err());
        assert_eq!(
            spec("body_format = \"form\"").body_format,
            Some(BodyFormat::Form)
        );
    }

    #[test]
    fn unwrap_problems_name_the_location() {
        let c = contract(
            r#"
            body_format = "form"
            unwrap = "/payload"
            event_id = "/id"
            ordering = "unordered"
        "#,
        );
        let h = HeaderMap::new();
        for (body, fragment) in [
            (&b"other=1"[..], "is required"),
            (b"payload=%7Bnot", "must be a string holding JSON"),
            (b"payload=1&payload=2", "got an array"),
            (
                b"payload=%7B%22id%22%3A1%2C%22id%22%3A2%7D",
                "must be a string holding JSON",
            ),
        ] {
            let err = c.parse_bytes(body, &h, None).unwrap_err();
            assert_eq!(err.problems[0].field, "/payload", "{err}");
            assert!(err.problems[0].problem.contains(fragment), "{err}");
        }
        let parsed = c
            .parse_bytes(b"payload=%7B%22id%22%3A%22e1%22%7D", &h, None)
            .unwrap();
        let JsonParsed::Event(e) = parsed else {
            panic!("{parsed:?}")
        };
        assert_eq!(e.event_id.as_str(), "e1");
        // Without `state`, the state is the unwrapped document.
        assert_eq!(e.state, Some(json!({"id": "e1"})));
        // A form source without `unwrap` keeps the fields object.
        let c = contract("body_format = \"form\"\nevent_id = \"/id\"\nordering = \"unordered\"");
        assert_eq!(
            c.state_of(b"id=e2&a=1&a=2", "").unwrap(),
            Some(json!({"id": "e2", "a": ["1", "2"]}))
        );
        // A JSON source does not read forms.
        let c = contract("event_id = \"/id\"\nordering = \"unordered\"");
        assert_eq!(
            c.parse_bytes(b"id=e3", &h, None).unwrap_err().problems[0].field,
            "$"
        );
    }
}
