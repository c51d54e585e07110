//! Where the chaos publisher writes a generated value in a request: the body at a JSON
//! Pointer, a header, or the scheme's delivery id.

use serde_json::{Map, Value};

use inhook::domain::kind::json::contract::Location;

/// Where a generated value goes in the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// At a JSON Pointer into the body, given as its reference tokens.
    Body(Vec<String>),
    /// In a request header.
    Header(String),
    /// The scheme's delivery id (an event id the source does not locate).
    DeliveryId,
    /// Nowhere: a literal location (`=text`) reads no request.
    Nowhere,
}

impl Place {
    /// Where a configured location puts its value.
    pub(super) fn of(location: &Location) -> Self {
        match location {
            Location::Pointer { tokens, .. } => Place::Body(tokens.clone()),
            Location::Header { name, .. } => Place::Header(name.as_str().to_owned()),
            // A literal is the configuration's own text: nothing in the request carries it.
            Location::Literal { .. } => Place::Nowhere,
        }
    }

    /// Writes `value` here: into the body, creating (or replacing with) objects on the
    /// way, or as a header's text. A delivery id is the signer's to send.
    pub(super) fn write(
        &self,
        body: &mut Map<String, Value>,
        headers: &mut Vec<(String, String)>,
        value: Value,
    ) {
        match self {
            Place::Body(tokens) => write_pointer(body, tokens, value),
            Place::Header(name) => {
                let text = match value {
                    Value::String(text) => text,
                    other => other.to_string(),
                };
                headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
                headers.push((name.clone(), text));
            }
            Place::DeliveryId | Place::Nowhere => {}
        }
    }
}

/// The place of a configured location (already checked when the config loaded); of
/// alternatives (`/a|/b`), the first is where the value is written.
pub(super) fn place_of(raw: &str) -> anyhow::Result<Place> {
    Location::parse(raw.split('|').next().unwrap_or(raw))
        .map(|location| Place::of(&location))
        .map_err(anyhow::Error::msg)
}

/// Sets the value at `tokens`, making every step an object. The empty pointer (the
/// whole body) keeps an object body by merging an object value into it.
fn write_pointer(body: &mut Map<String, Value>, tokens: &[String], value: Value) {
    let Some((last, path)) = tokens.split_last() else {
        if let Value::Object(fields) = value {
            body.extend(fields);
        }
        return;
    };
    let mut at = body;
    for token in path {
        let step = at
            .entry(token.clone())
            .or_insert_with(|| Value::Object(Map::new()));
        if !step.is_object() {
            *step = Value::Object(Map::new());
        }
        at = match step {
            Value::Object(map) => map,
            _ => unreachable!("made an object above"),
        };
    }
    at.insert(last.clone(), value);
}
