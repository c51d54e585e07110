//! The splitter of `batch = true` bodies (docs/configuration.md, batches): a top-level JSON
//! array whose elements are events (SendGrid's Event Webhook). Each element is kept as the
//! exact slice of the raw bytes it was sent as, so that what is logged, replayed and
//! forwarded for it is the publisher's own text, never a re-serialisation. Only the array's
//! frame is checked here; each element is then read by the source's contract like a body of
//! its own, which refuses an element that is not valid JSON. No I/O.

use crate::domain::contract::{ContractError, FieldProblem};

/// The most elements a batch may hold unless the source says otherwise (`batch_max_events`).
pub const DEFAULT_MAX_EVENTS: usize = 10_000;

/// The elements of a batch body, each the exact slice of `body` it was sent as (surrounding
/// whitespace left out), in order; or the problem with the array's frame (`$`).
pub fn split_batch(body: &[u8], max_events: usize) -> Result<Vec<&[u8]>, ContractError> {
    let frame = |problem: &str| ContractError {
        problems: vec![FieldProblem {
            field: "$".into(),
            problem: problem.to_owned(),
        }],
    };
    let start = skip_ws(body, 0);
    if body.get(start) != Some(&b'[') {
        return Err(frame(
            "must be a JSON array of events (the source has batch = true)",
        ));
    }
    let mut elements = Vec::new();
    let mut at = skip_ws(body, start + 1);
    if body.get(at) == Some(&b']') {
        return match skip_ws(body, at + 1) == body.len() {
            true => Ok(elements),
            false => Err(frame("holds something after the array")),
        };
    }
    loop {
        let (end, closer) = element_end(body, at)
            .ok_or_else(|| frame("is not valid JSON: the array is not closed"))?;
        let text = trim_end(&body[at..end]);
        if text.is_empty() {
            return Err(frame(&format!(
                "is not valid JSON: element {} is empty",
                elements.len()
            )));
        }
        if elements.len() == max_events {
            return Err(frame(&format!(
                "holds more than {max_events} events, the most a batch may hold (batch_max_events)"
            )));
        }
        elements.push(text);
        if closer == b']' {
            if skip_ws(body, end + 1) != body.len() {
                return Err(frame("holds something after the array"));
            }
            return Ok(elements);
        }
        at = skip_ws(body, end + 1);
    }
}

/// Where the element starting at `from` ends: the index of the `,` or `]` after it at the
/// array's own depth (outside strings), with that byte; `None` when the array never closes.
fn element_end(body: &[u8], from: usize) -> Option<(usize, u8)> {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, &b) in body.iter().enumerate().skip(from) {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => depth += 1,
            // A closer with nothing open is the array's own (a mismatched pair inside an
            // element is left for the element's parse to refuse).
            b']' | b'}' if depth > 0 => depth -= 1,
            b']' | b',' if depth == 0 => return Some((i, b)),
            _ => {}
        }
    }
    None
}

/// The first index at or after `from` that is not JSON whitespace.
fn skip_ws(body: &[u8], from: usize) -> usize {
    let mut at = from;
    while body.get(at).is_some_and(|b| is_ws(*b)) {
        at += 1;
    }
    at
}

fn trim_end(text: &[u8]) -> &[u8] {
    let end = text.iter().rposition(|b| !is_ws(*b)).map_or(0, |i| i + 1);
    &text[..end]
}

fn is_ws(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    fn texts(body: &str) -> Result<Vec<String>, String> {
        split_batch(body.as_bytes(), 5)
            .map(|parts| {
                parts
                    .into_iter()
                    .map(|p| String::from_utf8(p.to_vec()).unwrap())
                    .collect()
            })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn elements_are_the_exact_slices_sent() {
        let body = " [ {\"a\": [1, {\"b\": \"],\\\"\"}]} ,\n{\"sg_event_id\":\"x\"} , 3 ]\r\n";
        assert_eq!(
            texts(body).unwrap(),
            vec![
                "{\"a\": [1, {\"b\": \"],\\\"\"}]}",
                "{\"sg_event_id\":\"x\"}",
                "3"
            ]
        );
        assert_eq!(texts("[]").unwrap(), Vec::<String>::new());
        assert_eq!(texts(" [ ] ").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_broken_frame_names_the_whole_body() {
        for (body, expected) in [
            ("{\"a\":1}", "must be a JSON array"),
            ("", "must be a JSON array"),
            ("[1,2", "not closed"),
            ("[1,]", "element 1 is empty"),
            ("[,1]", "element 0 is empty"),
            ("[1] x", "after the array"),
            ("[] []", "after the array"),
            ("[1,2,3,4,5,6]", "more than 5 events"),
        ] {
            let err = texts(body).unwrap_err();
            assert!(err.starts_with("$: "), "{body}: {err}");
            assert!(err.contains(expected), "{body}: {err}");
        }
        // An element that is not JSON is split all the same: its own parse refuses it.
        assert_eq!(texts("[{\"a\":1],2]").unwrap(), vec!["{\"a\":1]", "2"]);
    }

    /// Any JSON value, a few levels deep, with strings that hold the frame's own bytes.
    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            "[\\[\\]{},\"\\\\ a-z]{0,8}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                proptest::collection::btree_map("[a-z,\\]]{1,4}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Whatever the elements and however the array is spaced, the slices are each
        /// element's text as written, and parse back to the elements.
        #[test]
        fn slices_round_trip_to_the_elements(
            elements in proptest::collection::vec(json_value(), 0..6),
            pretty in any::<bool>(),
        ) {
            let array = Value::Array(elements.clone());
            let body = if pretty {
                serde_json::to_string_pretty(&array).unwrap()
            } else {
                serde_json::to_string(&array).unwrap()
            };
            let parts = split_batch(body.as_bytes(), 10).unwrap();
            prop_assert_eq!(parts.len(), elements.len());
            for (part, element) in parts.iter().zip(&elements) {
                let parsed: Value = serde_json::from_slice(part).unwrap();
                prop_assert_eq!(&parsed, element);
                // The slice is the text as sent, byte for byte.
                let text = if pretty {
                    None
                } else {
                    Some(serde_json::to_string(element).unwrap())
                };
                if let Some(text) = text {
                    prop_assert_eq!(*part, text.as_bytes());
                }
            }
        }

        /// Any bytes split or name a frame problem; never a panic, and every slice lies
        /// inside the body.
        #[test]
        fn any_bytes_split_or_name_a_problem(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            match split_batch(&body, 8) {
                Ok(parts) => prop_assert!(parts.len() <= 8 && parts.iter().all(|p| !p.is_empty())),
                Err(err) => prop_assert_eq!(err.problems[0].field.as_str(), "$"),
            }
        }
    }
}
