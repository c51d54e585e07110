//! Searching the event log by what events say (docs/api.md, search): a source's
//! `search_fields` are JSON pointers whose values are indexed at ingest, and a search
//! names a pointer and a value. Pointers, values and patterns are pure code; the store
//! writes and reads the index keys, and [`resolve`] and [`scan_page`] drive a search.

use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::config::Config;
use crate::store::{EventFilter, EventRecord, SearchMatch, Store, StoreError};

/// Values longer than this many bytes are not indexed: an index row stays small, and a
/// search is for ids and names, not documents (docs/api.md, search).
pub const MAX_INDEXED_VALUE_BYTES: usize = 512;

/// A JSON pointer (RFC 6901) into an event's body, as `search_fields` and `where` name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SearchField {
    /// The pointer as written.
    raw: String,
    /// Its reference tokens, unescaped (`~1` is `/`, `~0` is `~`).
    tokens: Vec<String>,
}

impl SearchField {
    /// The pointer `raw`: empty (the whole body) or `/`-led tokens, `~` only as `~0` or `~1`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.is_empty() {
            return Err(
                "a search field is a JSON pointer such as /data/object/customer, not empty".into(),
            );
        }
        if !raw.starts_with('/') {
            return Err(format!(
                "search field {raw:?} is not a JSON pointer: it must start with /"
            ));
        }
        let mut rest = raw;
        while let Some(at) = rest.find('~') {
            if !matches!(rest.as_bytes().get(at + 1), Some(b'0' | b'1')) {
                return Err(format!(
                    "search field {raw:?}: ~ is written ~0 and / inside a name ~1"
                ));
            }
            rest = &rest[at + 2..];
        }
        if raw.contains('\0') {
            return Err(format!("search field {raw:?} cannot hold a NUL character"));
        }
        let tokens = raw
            .split('/')
            .skip(1)
            .map(|t| t.replace("~1", "/").replace("~0", "~"))
            .collect();
        Ok(Self {
            raw: raw.to_owned(),
            tokens,
        })
    }

    /// The pointer as written.
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The value the pointer finds in `body`, normalised ([`normalise`]); none when the
    /// body lacks it, or it is an object, an array or too long to index.
    pub fn value_in(&self, body: &Value) -> Option<String> {
        body.pointer(&self.raw).and_then(normalise)
    }
}

impl fmt::Display for SearchField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
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
    pub fn parse(raw: &str) -> Result<Self, String> {
        let Some((field, value)) = raw.split_once('=') else {
            return Err(format!(
                "where {raw:?} must be /pointer=value, such as /data/object/customer=cus_123"
            ));
        };
        let field = SearchField::parse(field)?;
        if value.contains('\0') {
            return Err("a where value cannot hold a NUL character".into());
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
///
/// Each field is sought in one pass over the raw body that builds nothing it skips: at
/// ingest this is paid per event, where parsing the whole body into a tree cost more than
/// writing the index row (docs/benchmarks.md, search).
pub fn values<'f>(fields: &'f [SearchField], body: &[u8]) -> Vec<(&'f SearchField, String)> {
    let mut found = Vec::with_capacity(fields.len());
    for field in fields {
        match seek::value_at(&field.tokens, body) {
            Ok(Some(value)) => found.push((field, value)),
            Ok(None) => {}
            Err(seek::NotJson) => return Vec::new(),
        }
    }
    found
}

/// Finding the value at one JSON pointer in a raw body without building the document.
mod seek {
    use std::fmt;

    use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

    use super::MAX_INDEXED_VALUE_BYTES;

    /// The body is not one JSON value.
    #[derive(Debug, PartialEq, Eq)]
    pub struct NotJson;

    /// The normalised value ([`super::normalise`]) at the pointer's `tokens` in `body`; none when the
    /// body lacks it or it is not a scalar that can be indexed. As `serde_json::Value`
    /// reads a duplicated key, the last one counts.
    pub fn value_at(tokens: &[String], body: &[u8]) -> Result<Option<String>, NotJson> {
        let mut de = serde_json::Deserializer::from_slice(body);
        let found = Seek(tokens).deserialize(&mut de).map_err(|_| NotJson)?;
        de.end().map_err(|_| NotJson)?;
        Ok(found)
    }

    /// The rest of a pointer, sought in the value being read.
    struct Seek<'p>(&'p [String]);

    impl<'de> DeserializeSeed<'de> for Seek<'_> {
        type Value = Option<String>;

        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Seek<'_> {
        type Value = Option<String>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let Some((token, rest)) = self.0.split_first() else {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                return Ok(None);
            };
            let mut found = None;
            while let Some(is_token) = map.next_key_seed(KeyIs(token))? {
                if is_token {
                    found = map.next_value_seed(Seek(rest))?;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let wanted = self
                .0
                .split_first()
                .and_then(|(token, rest)| array_index(token).map(|index| (index, rest)));
            let mut found = None;
            let mut index = 0;
            loop {
                let element = match wanted {
                    Some((at, rest)) if at == index => {
                        seq.next_element_seed(Seek(rest))?.map(|v| {
                            found = v;
                        })
                    }
                    _ => seq.next_element::<IgnoredAny>()?.map(drop),
                };
                if element.is_none() {
                    return Ok(found);
                }
                index += 1;
            }
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            Ok(self.leaf(|| v.to_owned()))
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok(self.leaf(|| v.to_string()))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(self.leaf(|| v.to_string()))
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(self.leaf(|| v.to_string()))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            // As `serde_json::Value` writes the number it read.
            Ok(self.leaf(|| serde_json::Value::from(v).to_string()))
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(self.leaf(|| "null".to_owned()))
        }
    }

    impl Seek<'_> {
        /// A scalar's text when the pointer ends here and it is short enough to index.
        fn leaf(&self, text: impl FnOnce() -> String) -> Option<String> {
            if !self.0.is_empty() {
                return None;
            }
            Some(text()).filter(|t| t.len() <= MAX_INDEXED_VALUE_BYTES)
        }
    }

    /// An array index as RFC 6901 and `serde_json::Value::pointer` read one: digits, no
    /// sign, no leading zero.
    fn array_index(token: &str) -> Option<usize> {
        if token.starts_with('+') || (token.starts_with('0') && token.len() != 1) {
            return None;
        }
        token.parse().ok()
    }

    /// Whether an object's key is the token sought, read without copying it.
    struct KeyIs<'t>(&'t str);

    impl<'de> DeserializeSeed<'de> for KeyIs<'_> {
        type Value = bool;

        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
            d.deserialize_str(self)
        }
    }

    impl<'de> Visitor<'de> for KeyIs<'_> {
        type Value = bool;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an object key")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<bool, E> {
            Ok(v == self.0)
        }
    }
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
    pub fn parse(raw: &str) -> Result<Self, String> {
        if raw.contains('\0') {
            return Err("type cannot hold a NUL character".into());
        }
        match raw.strip_suffix('*') {
            Some(prefix) if !prefix.contains('*') => Ok(Self::Prefix(prefix.to_owned())),
            None if !raw.contains('*') => Ok(Self::Exact(raw.to_owned())),
            _ => Err(format!(
                "type {raw:?}: a * may only end the pattern, as in invoice.*"
            )),
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

// Searching a store: conditions resolved against the sources' declarations into index
// lookups, or a bounded scan of the bodies on a store that does not encrypt them.

/// Events a scan of an undeclared field reads per request at most (docs/api.md, search).
pub const SCAN_LIMIT: u64 = 10_000;
/// Events read per store query of a scan.
const SCAN_PAGE: usize = 500;

/// Whether `field` is indexed for `source`'s events (without a source: for some source's).
fn declared(config: &Config, source: Option<&str>, field: &SearchField) -> bool {
    let mut sources = config
        .sources
        .iter()
        .filter(|s| source.is_none_or(|name| s.name == name));
    sources.any(|s| s.search_fields.contains(field))
}

/// `wheres` split into index lookups (declared fields, their values keyed as the store
/// keys them) and conditions to scan for. An undeclared field is a 400 on a store that
/// encrypts bodies, and wherever `scan` is false (a bulk replay is no bounded page).
pub fn resolve(
    config: &Config,
    store: &dyn Store,
    source: Option<&str>,
    wheres: Vec<Where>,
    scan: bool,
) -> Result<(Vec<SearchMatch>, Vec<Where>), String> {
    let mut matches = Vec::new();
    let mut scans = Vec::new();
    let keys = store.keys();
    for w in wheres {
        if declared(config, source, &w.field) {
            matches.push(SearchMatch {
                key: keys.map_or_else(
                    || w.value.clone(),
                    |k| k.search_key(w.field.as_str(), &w.value),
                ),
                field: w.field.as_str().to_owned(),
            });
            continue;
        }
        let whose = match source {
            Some(source) => format!("source {source:?}'s"),
            None => "any source's".into(),
        };
        if keys.is_some_and(|k| k.encrypting()) {
            return Err(format!(
                "{} is not in {whose} search_fields: with encryption at rest on, only declared \
                 fields can be searched (docs/configuration.md, search_fields)",
                w.field
            ));
        }
        if !scan {
            return Err(format!(
                "{} is not in {whose} search_fields: a bulk replay selects by declared fields only \
                 (docs/configuration.md, search_fields)",
                w.field
            ));
        }
        scans.push(w);
    }
    Ok((matches, scans))
}

/// What a scan of undeclared fields did, in a page's answer.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct ScanView {
    /// Events whose bodies were read.
    pub scanned: u64,
    /// True when the scan stopped at its bound (10,000 events) before filling the page or
    /// reaching the oldest event: `next_cursor` goes on from the last event read.
    pub stopped: bool,
}

/// A page of the events `filter` matches whose bodies also hold every `scans` value,
/// newest first, reading at most `bound` events ([`SCAN_LIMIT`] for the API and the
/// command line): the items, the cursor to go on from, and what the scan read.
pub async fn scan_page(
    store: &dyn Store,
    filter: &EventFilter,
    scans: &[Where],
    limit: usize,
    mut cursor: Option<i64>,
    bound: u64,
) -> Result<(Vec<EventRecord>, Option<i64>, ScanView), StoreError> {
    let mut items = Vec::new();
    let mut scanned = 0u64;
    loop {
        let room = usize::try_from(bound - scanned).unwrap_or(usize::MAX);
        let page = store.events(filter, SCAN_PAGE.min(room), cursor).await?;
        for record in page.items {
            scanned += 1;
            cursor = Some(record.row);
            let body = serde_json::from_slice::<serde_json::Value>(&record.body);
            if body.is_ok_and(|body| scans.iter().all(|w| w.matches(&body))) {
                items.push(record);
                if items.len() == limit {
                    let view = ScanView {
                        scanned,
                        stopped: false,
                    };
                    return Ok((items, cursor, view));
                }
            }
        }
        if page.next_cursor.is_none() {
            let view = ScanView {
                scanned,
                stopped: false,
            };
            return Ok((items, None, view));
        }
        if scanned >= bound {
            let view = ScanView {
                scanned,
                stopped: true,
            };
            return Ok((items, cursor, view));
        }
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
            assert!(err.contains(says), "{raw:?}: {err}");
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
        assert!(Where::parse("/a").unwrap_err().contains("/pointer=value"));
        assert!(Where::parse("a=1").unwrap_err().contains("start with /"));
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

    /// JSON documents over a few names, so pointers often hit.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (-1e12f64..1e12).prop_map(Value::from),
            "[a-z~/\\\"é ]{0,6}".prop_map(Value::from),
            Just(Value::from("x".repeat(MAX_INDEXED_VALUE_BYTES + 1))),
        ];
        leaf.prop_recursive(4, 32, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                proptest::collection::btree_map("[ab~/]{0,2}|0|1", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Pointers over the same names, indices included (`01` and `+1` are no index).
    fn pointer() -> impl Strategy<Value = String> {
        proptest::collection::vec("[ab]|~0|~1|a~1b|0|1|2|01|\\+1|", 1..4)
            .prop_map(|tokens| tokens.iter().map(|t| format!("/{t}")).collect())
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
        fn the_streaming_lookup_finds_what_the_parsed_tree_holds(
            body in json_value(), pointer in pointer()
        ) {
            let field = SearchField::parse(&pointer).unwrap();
            let raw = serde_json::to_vec(&body).unwrap();
            let fields = [field.clone()];
            let streamed = values(&fields, &raw).pop().map(|(_, v)| v);
            // The tree read from the same text: serde_json reads a float's text to the
            // nearest double or one next to it, the same way on either path.
            let tree: Value = serde_json::from_slice(&raw).unwrap();
            prop_assert_eq!(streamed, field.value_in(&tree));
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
