//! The one reader of a raw body, shared by every kind's contract: a single pass
//! into a [`Value`] that refuses an object with the same key twice, at any depth.

use serde::Deserialize;
use serde_json::map::Entry;
use serde_json::{Map, Value};

use super::{ContractError, FieldProblem};

/// Parses a raw body in one pass, refusing an object with the same key twice at
/// any depth: a publisher and a receiver reading different values from one
/// signed body is a hole. Any JSON value is a body; each contract says what counts.
pub fn parse_body(body: &[u8]) -> Result<Value, ContractError> {
    serde_json::from_slice::<UniqueKeys>(body)
        .map(|UniqueKeys(value)| value)
        .map_err(|err| {
            // Only the visitor's own refusal is a data error; the rest is broken syntax.
            whole_body(if err.classify() == serde_json::error::Category::Data {
                format!("is not acceptable JSON: {err}")
            } else {
                format!("is not valid JSON: {err}")
            })
        })
}

/// Parses a raw body that must be a JSON object, as the built-in kinds' bodies are.
pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ContractError> {
    match parse_body(body)? {
        Value::Object(map) => Ok(map),
        _ => Err(whole_body("must be a JSON object".into())),
    }
}

/// The problem that names the whole body (`$`).
fn whole_body(problem: String) -> ContractError {
    ContractError {
        problems: vec![FieldProblem {
            field: "$".into(),
            problem,
        }],
    }
}

/// A JSON value built while checking that no object repeats a key.
struct UniqueKeys(Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer
            .deserialize_any(UniqueKeysVisitor)
            .map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut map = Map::new();
        while let Some(key) = access.next_key::<String>()? {
            // One lookup per key: the slot found free is the one filled.
            match map.entry(key) {
                Entry::Vacant(slot) => {
                    let UniqueKeys(value) = access.next_value()?;
                    slot.insert(value);
                }
                Entry::Occupied(taken) => {
                    return Err(serde::de::Error::custom(format!(
                        "key {:?} appears twice",
                        taken.key()
                    )));
                }
            }
        }
        Ok(Value::Object(map))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut access: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(access.size_hint().unwrap_or(0).min(64));
        while let Some(UniqueKeys(value)) = access.next_element()? {
            items.push(value);
        }
        Ok(Value::Array(items))
    }

    fn visit_bool<E>(self, b: bool) -> Result<Value, E> {
        Ok(Value::Bool(b))
    }
    fn visit_i64<E>(self, n: i64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_u64<E>(self, n: u64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_f64<E>(self, n: f64) -> Result<Value, E> {
        Ok(Value::from(n))
    }
    fn visit_str<E>(self, s: &str) -> Result<Value, E> {
        Ok(Value::String(s.to_owned()))
    }
    fn visit_string<E>(self, s: String) -> Result<Value, E> {
        Ok(Value::String(s))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
}

/// How a source's raw body becomes the document its contract reads (docs/configuration.md,
/// `body_format`); every built-in kind reads JSON.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json`: the body is the document.
    #[default]
    Json,
    /// `application/x-www-form-urlencoded`: the fields, as an object of strings.
    Form,
}

impl<'de> Deserialize<'de> for BodyFormat {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // The message names the key: serde's own names only the line.
        match String::deserialize(deserializer)?.as_str() {
            "json" => Ok(BodyFormat::Json),
            "form" => Ok(BodyFormat::Form),
            other => Err(serde::de::Error::custom(format!(
                "body_format must be \"json\" or \"form\", got {other:?}"
            ))),
        }
    }
}

impl BodyFormat {
    /// The media type a delivery of this format carries.
    pub fn media_type(self) -> &'static str {
        match self {
            BodyFormat::Json => "application/json",
            BodyFormat::Form => "application/x-www-form-urlencoded",
        }
    }

    /// Whether a request's `content-type` (parameters such as `charset` aside) is this format's.
    pub fn accepts(self, content_type: Option<&str>) -> bool {
        content_type
            .and_then(|v| v.split(';').next())
            .is_some_and(|mime| mime.trim().eq_ignore_ascii_case(self.media_type()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn problem(body: &[u8]) -> String {
        let err = parse_body(body).unwrap_err();
        assert_eq!(err.problems.len(), 1, "{err}");
        assert_eq!(err.problems[0].field, "$");
        err.problems[0].problem.clone()
    }

    #[test]
    fn broken_syntax_is_not_valid_json() {
        assert!(problem(b"{\"a\":1,").starts_with("is not valid JSON"));
        assert!(problem(b"").starts_with("is not valid JSON"));
        assert!(problem(b"{} {}").starts_with("is not valid JSON"));
        let deep = "[".repeat(100_000);
        assert!(problem(deep.as_bytes()).starts_with("is not valid JSON"));
    }

    #[test]
    fn a_repeated_key_is_refused_at_any_depth() {
        for body in [
            &br#"{"a":1,"a":2}"#[..],
            br#"{"a":{"b":1,"b":2}}"#,
            br#"{"x":[{"ok":1},{"b":1,"c":0,"b":1}]}"#,
            br#"[[{"k":null,"k":null}]]"#,
            // Escapes name the same key: serde_json compares keys unescaped.
            br#"{"a":1,"\u0061":2}"#,
            br#"{"data":{"qty\u005fx":1,"qty_x":1}}"#,
        ] {
            let text = problem(body);
            assert!(
                text.starts_with("is not acceptable JSON: key ") && text.contains("appears twice"),
                "{}: {text}",
                String::from_utf8_lossy(body)
            );
        }
        // The same key in two different objects is no repeat.
        assert_eq!(
            parse_body(br#"[{"a":1},{"a":2},{"b":{"a":3}}]"#).unwrap(),
            json!([{"a":1},{"a":2},{"b":{"a":3}}])
        );
    }

    #[test]
    fn values_are_kept_as_serde_json_reads_them() {
        let bodies: [&[u8]; 4] = [
            br#"[1, -2, 3.5, "s\n\u00e9", null, true, {"k": {}}, []]"#,
            // Past i64 a number stays u64, past u64 an f64: the contracts name
            // "must be at most 9223372036854775807" from these.
            br#"{"i":9223372036854775807,"u":9223372036854775808,"f":18446744073709551616}"#,
            br#"{"n":-9223372036854775808,"e":1e3,"z":-0.0}"#,
            br#"{"a":{"b":[{"c":"d"}]},"b":false}"#,
        ];
        for body in bodies {
            assert_eq!(
                parse_body(body).unwrap(),
                serde_json::from_slice::<Value>(body).unwrap(),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let big = parse_body(br#"{"u":9223372036854775808,"f":18446744073709551616}"#).unwrap();
        assert_eq!(big["u"].as_u64(), Some(9_223_372_036_854_775_808));
        assert!(big["f"].is_f64());
    }

    #[test]
    fn an_object_is_required_by_parse_object() {
        assert_eq!(
            parse_object(br#"{"a":[1]}"#).unwrap(),
            json!({"a":[1]}).as_object().unwrap().clone()
        );
        for body in [&b"[1, 2]"[..], b"\"s\"", b"7", b"null"] {
            let err = parse_object(body).unwrap_err();
            assert_eq!(err.problems[0].field, "$");
            assert_eq!(err.problems[0].problem, "must be a JSON object");
        }
        assert!(parse_object(br#"{"a":1,"a":1}"#).unwrap_err().problems[0]
            .problem
            .contains("appears twice"));
    }

    proptest::proptest! {
        /// On any bytes the one reader agrees with serde_json's own, except that
        /// it refuses what serde_json would read with a key silently dropped.
        #[test]
        fn agrees_with_serde_json_but_for_repeated_keys(
            raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            text in r#"[\[\]{}",:a-c0-9 ]{0,30}"#,
        ) {
            for body in [raw.as_slice(), text.as_bytes()] {
                match (parse_body(body), serde_json::from_slice::<Value>(body)) {
                    (Ok(ours), Ok(theirs)) => proptest::prop_assert_eq!(ours, theirs),
                    (Err(err), Ok(_)) => proptest::prop_assert!(
                        err.problems[0].problem.contains("appears twice"), "{}", err
                    ),
                    (Ok(_), Err(err)) => proptest::prop_assert!(false, "serde_json refused: {}", err),
                    (Err(_), Err(_)) => {}
                }
            }
        }
    }
}
