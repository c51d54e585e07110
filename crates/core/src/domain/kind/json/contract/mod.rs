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
mod tests;
