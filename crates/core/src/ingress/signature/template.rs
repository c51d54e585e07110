//! The `signed_content` template of the configurable HMAC scheme
//! (docs/configuration.md, `signature = "hmac"`): literal text with
//! placeholders for the parts of a delivery its publisher signs. Parsing and
//! rendering are pure, so both can be fuzzed alone.

use axum::http::{HeaderMap, HeaderName};

/// A template longer than any publisher's: refused rather than parsed.
pub const MAX_TEMPLATE_CHARS: usize = 1024;

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text signed as written.
    Literal(String),
    /// `{body}`: the raw body.
    Body,
    /// `{timestamp}`: the timestamp's text as sent.
    Timestamp,
    /// `{header:Name}`: a request header's value.
    Header(HeaderName),
    /// `{method}`: the request's method.
    Method,
    /// `{url}`: `public_url` plus the request's path and query.
    Url,
    /// `{pointer:/a/b}`: a string or integer in the JSON body.
    Pointer(String),
}

/// A parsed `signed_content`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

/// Why a template does not parse. Names the offending text, never a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// A `{` without its `}`.
    #[error("a '{{' at byte {0} has no closing '}}'")]
    Unclosed(usize),
    /// A `}` outside a placeholder.
    #[error("a stray '}}' at byte {0} (placeholders are {{body}}, {{timestamp}}, {{header:Name}}, {{method}}, {{url}}, {{pointer:/a/b}})")]
    Stray(usize),
    /// A placeholder that is none of the known ones.
    #[error("unknown placeholder {{{0}}} (expected {{body}}, {{timestamp}}, {{header:Name}}, {{method}}, {{url}} or {{pointer:/a/b}})")]
    Unknown(String),
    /// `{header:…}` with something that is not a header name.
    #[error("{{header:{0}}} does not name a header")]
    BadHeader(String),
    /// `{pointer:…}` that is not a JSON pointer.
    #[error("{{pointer:{0}}} is not a JSON pointer (it starts with '/')")]
    BadPointer(String),
    /// Longer than [`MAX_TEMPLATE_CHARS`].
    #[error("is longer than {MAX_TEMPLATE_CHARS} characters")]
    TooLong,
    /// Nothing to sign.
    #[error("is empty")]
    Empty,
}

impl Template {
    /// Parses a template as written in the configuration.
    pub fn parse(raw: &str) -> Result<Self, TemplateError> {
        if raw.len() > MAX_TEMPLATE_CHARS {
            return Err(TemplateError::TooLong);
        }
        if raw.is_empty() {
            return Err(TemplateError::Empty);
        }
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = raw;
        let mut offset = 0;
        while let Some(i) = rest.find(['{', '}']) {
            if rest.as_bytes()[i] == b'}' {
                return Err(TemplateError::Stray(offset + i));
            }
            literal.push_str(&rest[..i]);
            let after = &rest[i + 1..];
            let end = after
                .find(['{', '}'])
                .filter(|&j| after.as_bytes()[j] == b'}')
                .ok_or(TemplateError::Unclosed(offset + i))?;
            let part = placeholder(&after[..end])?;
            if !literal.is_empty() {
                parts.push(Part::Literal(std::mem::take(&mut literal)));
            }
            parts.push(part);
            let consumed = i + 1 + end + 1;
            offset += consumed;
            rest = &rest[consumed..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Self { parts })
    }

    /// The parts, in order.
    pub fn parts(&self) -> &[Part] {
        &self.parts
    }

    /// Whether any part is `part`.
    pub fn uses(&self, part: &Part) -> bool {
        self.parts.contains(part)
    }

    /// Whether rendering reads the JSON body.
    pub fn reads_json(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Pointer(_)))
    }

    /// The bytes the publisher signs, from the delivery's parts; the first part
    /// the delivery lacks otherwise.
    pub fn render<'t>(&'t self, input: &Input<'_>) -> Result<Vec<u8>, Lacking<'t>> {
        let mut out = Vec::with_capacity(input.body.len() + 64);
        for part in &self.parts {
            match part {
                Part::Literal(text) => out.extend_from_slice(text.as_bytes()),
                Part::Body => out.extend_from_slice(input.body),
                Part::Timestamp => {
                    out.extend_from_slice(input.timestamp.ok_or(Lacking::Timestamp)?.as_bytes())
                }
                Part::Header(name) => {
                    let value = input.headers.get(name).ok_or(Lacking::Header(name))?;
                    out.extend_from_slice(value.as_bytes());
                }
                Part::Method => out.extend_from_slice(input.method.as_bytes()),
                Part::Url => out.extend_from_slice(input.url.ok_or(Lacking::Url)?.as_bytes()),
                Part::Pointer(pointer) => {
                    let value = input
                        .json
                        .and_then(|json| json.pointer(pointer))
                        .ok_or(Lacking::Pointer(pointer))?;
                    match value {
                        serde_json::Value::String(s) => out.extend_from_slice(s.as_bytes()),
                        serde_json::Value::Number(n) if n.is_i64() || n.is_u64() => {
                            out.extend_from_slice(n.to_string().as_bytes())
                        }
                        _ => return Err(Lacking::Pointer(pointer)),
                    }
                }
            }
        }
        Ok(out)
    }
}

/// The template as it would be written in the configuration (a header name in lower
/// case): what the warning about a body left unsigned names.
impl std::fmt::Display for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for part in &self.parts {
            match part {
                Part::Literal(text) => f.write_str(text)?,
                Part::Body => f.write_str("{body}")?,
                Part::Timestamp => f.write_str("{timestamp}")?,
                Part::Header(name) => write!(f, "{{header:{name}}}")?,
                Part::Method => f.write_str("{method}")?,
                Part::Url => f.write_str("{url}")?,
                Part::Pointer(pointer) => write!(f, "{{pointer:{pointer}}}")?,
            }
        }
        Ok(())
    }
}

/// What a delivery offers a template.
#[derive(Debug, Clone, Copy)]
pub struct Input<'a> {
    /// The raw body.
    pub body: &'a [u8],
    /// The timestamp's text as sent, if the scheme reads one.
    pub timestamp: Option<&'a str>,
    /// The request's headers.
    pub headers: &'a HeaderMap,
    /// The request's method.
    pub method: &'a str,
    /// `public_url` plus the request's path and query, when `public_url` is set.
    pub url: Option<&'a str>,
    /// The body parsed as JSON, when the template reads fields and it parses.
    pub json: Option<&'a serde_json::Value>,
}

/// A part of the template the delivery lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lacking<'t> {
    /// No timestamp.
    Timestamp,
    /// No such header.
    Header(&'t HeaderName),
    /// No `public_url`.
    Url,
    /// No string or integer at the pointer (or a body that is not JSON).
    Pointer(&'t str),
}

fn placeholder(inner: &str) -> Result<Part, TemplateError> {
    match inner {
        "body" => return Ok(Part::Body),
        "timestamp" => return Ok(Part::Timestamp),
        "method" => return Ok(Part::Method),
        "url" => return Ok(Part::Url),
        _ => {}
    }
    if let Some(name) = inner.strip_prefix("header:") {
        return HeaderName::from_bytes(name.trim().as_bytes())
            .map(Part::Header)
            .map_err(|_| TemplateError::BadHeader(name.to_owned()));
    }
    if let Some(pointer) = inner.strip_prefix("pointer:") {
        if !pointer.starts_with('/') {
            return Err(TemplateError::BadPointer(pointer.to_owned()));
        }
        return Ok(Part::Pointer(pointer.to_owned()));
    }
    Err(TemplateError::Unknown(inner.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use proptest::prelude::*;

    fn input<'a>(
        body: &'a [u8],
        headers: &'a HeaderMap,
        json: Option<&'a serde_json::Value>,
    ) -> Input<'a> {
        Input {
            body,
            timestamp: Some("1700000000"),
            headers,
            method: "POST",
            url: Some("https://hooks.example.com/webhooks/a?x=1"),
            json,
        }
    }

    #[test]
    fn placeholders_parse_and_render() {
        let t = Template::parse(
            "v0:{timestamp}:{body}|{method}{url}{header:X-Id}{pointer:/a/b}{pointer:/n}",
        )
        .unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-id", HeaderValue::from_static("m-1"));
        let json = serde_json::json!({"a": {"b": "tok"}, "n": 42});
        let out = t.render(&input(b"{}", &headers, Some(&json))).unwrap();
        assert_eq!(
            out,
            b"v0:1700000000:{}|POSThttps://hooks.example.com/webhooks/a?x=1m-1tok42".to_vec()
        );
        assert!(t.reads_json());
        assert!(!Template::parse("{body}").unwrap().reads_json());
    }

    #[test]
    fn bad_templates_say_why() {
        for (raw, err) in [
            ("{body", TemplateError::Unclosed(0)),
            ("a}b", TemplateError::Stray(1)),
            ("{body}}", TemplateError::Stray(6)),
            ("{{body}}", TemplateError::Unclosed(0)),
            ("{nonce}", TemplateError::Unknown("nonce".into())),
            ("{header:}", TemplateError::BadHeader("".into())),
            ("{header:a b}", TemplateError::BadHeader("a b".into())),
            ("{pointer:a}", TemplateError::BadPointer("a".into())),
            ("", TemplateError::Empty),
        ] {
            assert_eq!(Template::parse(raw), Err(err), "{raw}");
        }
        assert_eq!(
            Template::parse(&"x".repeat(MAX_TEMPLATE_CHARS + 1)),
            Err(TemplateError::TooLong)
        );
    }

    #[test]
    fn what_the_delivery_lacks_is_named() {
        let headers = HeaderMap::new();
        let t = Template::parse("{header:X-Id}").unwrap();
        let name = HeaderName::from_static("x-id");
        assert_eq!(
            t.render(&input(b"", &headers, None)),
            Err(Lacking::Header(&name))
        );
        let t = Template::parse("{pointer:/a}").unwrap();
        let json = serde_json::json!({"a": 1.5});
        assert_eq!(
            t.render(&input(b"", &headers, Some(&json))),
            Err(Lacking::Pointer("/a"))
        );
        assert_eq!(
            t.render(&input(b"", &headers, None)),
            Err(Lacking::Pointer("/a"))
        );
    }

    #[test]
    fn a_template_is_written_back_as_parsed() {
        for raw in [
            "{timestamp}{pointer:/signature/token}",
            "v0:{timestamp}:{body}",
            "{method}{url}{body}{timestamp}",
            "{header:twitch-eventsub-message-id}{timestamp}{body}",
            "literal only",
        ] {
            let template = Template::parse(raw).unwrap();
            assert_eq!(template.to_string(), raw);
            assert_eq!(Template::parse(&template.to_string()).unwrap(), template);
        }
    }

    /// A piece of a template and the bytes it stands for.
    fn piece() -> impl Strategy<Value = (String, Vec<u8>)> {
        prop_oneof![
            "[^{}]{1,8}".prop_map(|s| (s.clone(), s.into_bytes())),
            Just(("{body}".to_owned(), b"BODY\x00\xff".to_vec())),
            Just(("{timestamp}".to_owned(), b"1700000000".to_vec())),
            Just(("{method}".to_owned(), b"POST".to_vec())),
            Just((
                "{url}".to_owned(),
                b"https://hooks.example.com/webhooks/a?x=1".to_vec()
            )),
            Just(("{header:X-Id}".to_owned(), b"m-1".to_vec())),
            Just(("{pointer:/a/b}".to_owned(), b"tok".to_vec())),
            Just(("{pointer:/n}".to_owned(), b"42".to_vec())),
        ]
    }

    proptest! {
        /// The renderer produces exactly the bytes concatenated by hand.
        #[test]
        fn rendering_concatenates_the_parts(pieces in proptest::collection::vec(piece(), 1..12)) {
            let raw: String = pieces.iter().map(|(t, _)| t.as_str()).collect();
            let expected: Vec<u8> = pieces.iter().flat_map(|(_, b)| b.clone()).collect();
            let template = Template::parse(&raw).unwrap();
            prop_assert_eq!(Template::parse(&template.to_string()).unwrap(), template.clone());
            let mut headers = HeaderMap::new();
            headers.insert("x-id", HeaderValue::from_static("m-1"));
            let json = serde_json::json!({"a": {"b": "tok"}, "n": 42});
            let out = template
                .render(&input(b"BODY\x00\xff", &headers, Some(&json)))
                .unwrap();
            prop_assert_eq!(out, expected);
        }

        /// Any text parses or is refused, never panics.
        #[test]
        fn arbitrary_templates_never_panic(raw in "\\PC{0,64}") {
            let _ = Template::parse(&raw);
        }
    }
}
