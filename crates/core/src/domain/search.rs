//! Searching the event log by what events say (docs/api.md, search): a source's
//! `search_fields` are JSON pointers whose values are indexed at ingest, and a search
//! names a pointer and a value. Pointers, values and patterns are pure code; the store
//! writes and reads the index keys, and the API's search (`http::api::search`) drives a
//! search over them.

use std::fmt;

use serde_json::Value;

/// Values longer than this many bytes are not indexed: an index row stays small, and a
/// search is for ids and names, not documents (docs/api.md, search).
pub const MAX_INDEXED_VALUE_BYTES: usize = 512;

/// Why a search field, a `where` condition or a type pattern is refused; each message
/// says how to write it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SearchSyntaxError {
    /// An empty pointer.
    #[error("a search field is a JSON pointer such as /data/object/customer, not empty")]
    EmptyField,
    /// A pointer not led by `/`.
    #[error("search field {0:?} is not a JSON pointer: it must start with /")]
    NotAPointer(String),
    /// A `~` not followed by `0` or `1`.
    #[error("search field {0:?}: ~ is written ~0 and / inside a name ~1")]
    BadEscape(String),
    /// A pointer holding NUL.
    #[error("search field {0:?} cannot hold a NUL character")]
    NulInField(String),
    /// A condition without `=`.
    #[error("where {0:?} must be /pointer=value, such as /data/object/customer=cus_123")]
    NotACondition(String),
    /// A condition's value holding NUL.
    #[error("a where value cannot hold a NUL character")]
    NulInValue,
    /// A type pattern holding NUL.
    #[error("type cannot hold a NUL character")]
    NulInType,
    /// A `*` anywhere but at the end of a type pattern.
    #[error("type {0:?}: a * may only end the pattern, as in invoice.*")]
    MisplacedStar(String),
}

/// A JSON pointer (RFC 6901) into an event's body, as `search_fields` and `where` name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SearchField(String);

impl SearchField {
    /// The pointer `raw`: empty (the whole body) or `/`-led tokens, `~` only as `~0` or `~1`.
    pub fn parse(raw: &str) -> Result<Self, SearchSyntaxError> {
        if raw.is_empty() {
            return Err(SearchSyntaxError::EmptyField);
        }
        if !raw.starts_with('/') {
            return Err(SearchSyntaxError::NotAPointer(raw.to_owned()));
        }
        let mut rest = raw;
        while let Some(at) = rest.find('~') {
            if !matches!(rest.as_bytes().get(at + 1), Some(b'0' | b'1')) {
                return Err(SearchSyntaxError::BadEscape(raw.to_owned()));
            }
            rest = &rest[at + 2..];
        }
        if raw.contains('\0') {
            return Err(SearchSyntaxError::NulInField(raw.to_owned()));
        }
        Ok(Self(raw.to_owned()))
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value the pointer finds in `body`, normalised ([`normalise`]); none when the
    /// body lacks it, or it is an object, an array or too long to index.
    pub fn value_in(&self, body: &Value) -> Option<String> {
        body.pointer(&self.0).and_then(normalise)
    }
}

impl fmt::Display for SearchField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The text a JSON value is indexed and compared as: a string as its text (no quotes, no
/// escapes), a number, `true`, `false` or `null` as its JSON text (so `42` and `"42"` are
/// one value). Objects, arrays and values over [`MAX_INDEXED_VALUE_BYTES`] have none.
pub fn normalise(value: &Value) -> Option<String> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "null".to_owned(),
        Value::Array(_) | Value::Object(_) => return None,
    };
    (text.len() <= MAX_INDEXED_VALUE_BYTES).then_some(text)
}

/// One `where` condition: the value at a pointer, in its normalised text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Where {
    /// The pointer.
    pub field: SearchField,
    /// The value, compared as [`normalise`] writes a body's.
    pub value: String,
}

impl Where {
    /// `/pointer=value`, split at the first `=` (a pointer holding `=` cannot be searched).
    pub fn parse(raw: &str) -> Result<Self, SearchSyntaxError> {
        let Some((field, value)) = raw.split_once('=') else {
            return Err(SearchSyntaxError::NotACondition(raw.to_owned()));
        };
        let field = SearchField::parse(field)?;
        if value.contains('\0') {
            return Err(SearchSyntaxError::NulInValue);
        }
        Ok(Self {
            field,
            value: value.to_owned(),
        })
    }

    /// Whether `body` holds the value at the pointer (a scan of an undeclared field).
    pub fn matches(&self, body: &Value) -> bool {
        self.field.value_in(body).as_deref() == Some(self.value.as_str())
    }
}

/// The values of `fields` an event's `body` holds, field by field; none when the body is
/// not JSON (a form body's fields are not indexed: docs/api.md, search).
pub fn values<'f>(fields: &'f [SearchField], body: &[u8]) -> Vec<(&'f SearchField, String)> {
    if fields.is_empty() {
        return Vec::new();
    }
    let Ok(parsed) = serde_json::from_slice::<Value>(body) else {
        return Vec::new();
    };
    fields
        .iter()
        .filter_map(|f| f.value_in(&parsed).map(|v| (f, v)))
        .collect()
}

/// The event-type pattern of a search: a type as it is, or `prefix.*` for every type that
/// starts with `prefix.`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypePattern {
    /// This type exactly.
    Exact(String),
    /// Every type starting with this text (the pattern without its `*`).
    Prefix(String),
}

impl TypePattern {
    /// `invoice.paid`, or `invoice.*` (a `*` only at the end).
    pub fn parse(raw: &str) -> Result<Self, SearchSyntaxError> {
        if raw.contains('\0') {
            return Err(SearchSyntaxError::NulInType);
        }
        match raw.strip_suffix('*') {
            Some(prefix) if !prefix.contains('*') => Ok(Self::Prefix(prefix.to_owned())),
            None if !raw.contains('*') => Ok(Self::Exact(raw.to_owned())),
            _ => Err(SearchSyntaxError::MisplacedStar(raw.to_owned())),
        }
    }

    /// Whether `event_type` fits.
    pub fn matches(&self, event_type: &str) -> bool {
        match self {
            Self::Exact(t) => event_type == t,
            Self::Prefix(p) => event_type.starts_with(p.as_str()),
        }
    }
}

impl fmt::Display for TypePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Exact(t) => f.write_str(t),
            Self::Prefix(p) => write!(f, "{p}*"),
        }
    }
}

impl serde::Serialize for TypePattern {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TypePattern {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn field(raw: &str) -> SearchField {
        SearchField::parse(raw).unwrap()
    }

    #[test]
    fn pointers_follow_rfc_6901() {
        let body = json!({"data": {"object": {"customer": "cus_123", "a/b": 1, "m~n": true,
                          "items": [{"id": "it_1"}, {"id": "it_2"}]}}});
        assert_eq!(
            field("/data/object/customer").value_in(&body).as_deref(),
            Some("cus_123")
        );
        assert_eq!(
            field("/data/object/a~1b").value_in(&body).as_deref(),
            Some("1")
        );
        assert_eq!(
            field("/data/object/m~0n").value_in(&body).as_deref(),
            Some("true")
        );
        assert_eq!(
            field("/data/object/items/1/id").value_in(&body).as_deref(),
            Some("it_2")
        );
        assert_eq!(field("/data/object/missing").value_in(&body), None);
        // An object or an array is not a value to search by.
        assert_eq!(field("/data/object").value_in(&body), None);
        assert_eq!(field("/data/object/items").value_in(&body), None);
    }

    #[test]
    fn bad_pointers_are_refused_saying_why() {
        for (raw, says) in [
            ("", "not empty"),
            ("data/object", "must start with /"),
            ("/a~2", "~0"),
            ("/a~", "~0"),
            ("/a\0", "NUL"),
        ] {
            let err = SearchField::parse(raw).unwrap_err();
            assert!(err.to_string().contains(says), "{raw:?}: {err}");
        }
    }

    #[test]
    fn values_are_normalised_to_their_text() {
        assert_eq!(normalise(&json!("cus_123")).as_deref(), Some("cus_123"));
        assert_eq!(normalise(&json!("a\"b")).as_deref(), Some("a\"b"));
        assert_eq!(normalise(&json!(42)).as_deref(), Some("42"));
        assert_eq!(normalise(&json!(-1.5)).as_deref(), Some("-1.5"));
        assert_eq!(normalise(&json!(false)).as_deref(), Some("false"));
        assert_eq!(normalise(&json!(null)).as_deref(), Some("null"));
        assert_eq!(normalise(&json!({"a": 1})), None);
        assert_eq!(normalise(&json!([1])), None);
        let long = "x".repeat(MAX_INDEXED_VALUE_BYTES + 1);
        assert_eq!(normalise(&json!(long)), None);
        let longest = "x".repeat(MAX_INDEXED_VALUE_BYTES);
        assert_eq!(normalise(&json!(longest)), Some(longest));
    }

    #[test]
    fn a_number_and_its_text_are_one_value() {
        let w = Where::parse("/n=42").unwrap();
        assert!(w.matches(&json!({"n": 42})));
        assert!(w.matches(&json!({"n": "42"})));
        assert!(!w.matches(&json!({"n": 43})));
        assert!(!w.matches(&json!({"m": 42})));
    }

    #[test]
    fn where_splits_at_the_first_equals_sign() {
        let w = Where::parse("/data/object/customer=cus=1").unwrap();
        assert_eq!(w.field.as_str(), "/data/object/customer");
        assert_eq!(w.value, "cus=1");
        assert_eq!(Where::parse("/a=").unwrap().value, "");
        assert!(Where::parse("/a")
            .unwrap_err()
            .to_string()
            .contains("/pointer=value"));
        assert!(Where::parse("a=1")
            .unwrap_err()
            .to_string()
            .contains("start with /"));
    }

    #[test]
    fn values_reads_only_json_bodies_and_declared_fields() {
        let fields = [field("/a"), field("/b/c"), field("/z")];
        let found = values(&fields, br#"{"a": "x", "b": {"c": 7}}"#);
        let found: Vec<_> = found
            .iter()
            .map(|(f, v)| (f.as_str(), v.as_str()))
            .collect();
        assert_eq!(found, [("/a", "x"), ("/b/c", "7")]);
        assert!(values(&fields, b"a=x&b=y").is_empty());
        assert!(values(&[], br#"{"a": "x"}"#).is_empty());
    }

    #[test]
    fn type_patterns() {
        let prefix = TypePattern::parse("invoice.*").unwrap();
        assert!(prefix.matches("invoice.paid"));
        assert!(!prefix.matches("invoices"));
        assert!(!prefix.matches("charge.invoice.paid"));
        let exact = TypePattern::parse("invoice.paid").unwrap();
        assert!(exact.matches("invoice.paid"));
        assert!(!exact.matches("invoice.paid.late"));
        assert!(TypePattern::parse("*").unwrap().matches("anything"));
        assert!(TypePattern::parse("in*voice").is_err());
        assert!(TypePattern::parse("**").is_err());
        assert_eq!(prefix.to_string(), "invoice.*");
        let back: TypePattern = serde_json::from_str("\"invoice.*\"").unwrap();
        assert_eq!(back, prefix);
    }

    /// An RFC 6901 token for a name: `~` as `~0`, `/` as `~1`.
    fn escape(name: &str) -> String {
        name.replace('~', "~0").replace('/', "~1")
    }

    #[test]
    fn a_body_that_is_not_json_has_no_values() {
        let fields = [field("/a")];
        assert!(values(&fields, b"a=1&b=2").is_empty());
        assert!(values(&fields, br#"{"a": 1} trailing"#).is_empty());
        assert!(values(&fields, br#"{"a": 1, "b": }"#).is_empty());
        // The last of a duplicated key counts, as when the body is read into a tree.
        assert_eq!(
            values(&fields, br#"{"a": 1, "a": "two"}"#)
                .pop()
                .map(|(_, v)| v),
            Some("two".to_owned())
        );
    }

    proptest! {
        #[test]
        fn any_string_value_under_any_name_is_found_as_itself(
            name in "[a-z/~. ]{1,8}", value in "\\PC{0,40}"
        ) {
            let body = json!({ "outer": { name.clone(): value.clone() } });
            let pointer = format!("/outer/{}", escape(&name));
            let field = SearchField::parse(&pointer).unwrap();
            prop_assert_eq!(field.value_in(&body), Some(value.clone()));
            let w = Where::parse(&format!("{pointer}={value}")).unwrap();
            prop_assert!(w.matches(&body));
        }

        #[test]
        fn integers_match_their_decimal_text(n in any::<i64>()) {
            let w = Where::parse(&format!("/n={n}")).unwrap();
            let (number, text) = (json!({ "n": n }), json!({ "n": n.to_string() }));
            prop_assert!(w.matches(&number));
            prop_assert!(w.matches(&text));
        }

        #[test]
        fn a_prefix_pattern_matches_exactly_the_types_it_starts(
            prefix in "[a-z.]{0,6}", t in "[a-z.]{0,10}"
        ) {
            let pattern = TypePattern::parse(&format!("{prefix}*")).unwrap();
            prop_assert_eq!(pattern.matches(&t), t.starts_with(&prefix));
        }
    }
}
