//! The reader of `application/x-www-form-urlencoded` bodies (docs/configuration.md,
//! `body_format = "form"`): the fields become a JSON object of strings that a json
//! source's locations read; a name sent more than once keeps its values, in order, as
//! an array. `+` is a space and `%XX` a byte, as browsers and publishers encode them;
//! the decoded bytes must be UTF-8. No I/O.

use percent_encoding::percent_decode;
use serde_json::{Map, Value};

use crate::domain::contract::{ContractError, FieldProblem};

/// The fields of a form body as a JSON object, or the problem naming the field at fault.
pub fn read_form(body: &[u8]) -> Result<Map<String, Value>, ContractError> {
    let mut fields = Map::new();
    // Empty pieces (`a=1&&b=2`, a trailing `&`) hold no field, as in every form reader.
    for (index, piece) in body
        .split(|&b| b == b'&')
        .filter(|p| !p.is_empty())
        .enumerate()
    {
        let (name, value) = match piece.iter().position(|&b| b == b'=') {
            Some(at) => (&piece[..at], &piece[at + 1..]),
            None => (piece, &[][..]),
        };
        let name = decode(name).map_err(|_| {
            problem(
                "$",
                format!("field {index}'s name is not UTF-8 text once percent-decoded"),
            )
        })?;
        let value = decode(value).map_err(|_| {
            problem(
                &format!("/{}", escape_token(&name)),
                "is not UTF-8 text once percent-decoded".into(),
            )
        })?;
        match fields.get_mut(&name) {
            None => {
                fields.insert(name, Value::String(value));
            }
            Some(Value::Array(values)) => values.push(Value::String(value)),
            Some(first) => {
                let first = first.take();
                fields.insert(name, Value::Array(vec![first, Value::String(value)]));
            }
        }
    }
    Ok(fields)
}

/// One name or value: `+` as a space, then percent-decoded, then UTF-8.
fn decode(raw: &[u8]) -> Result<String, std::string::FromUtf8Error> {
    let spaced: Vec<u8> = raw
        .iter()
        .map(|&b| if b == b'+' { b' ' } else { b })
        .collect();
    String::from_utf8(percent_decode(&spaced).collect())
}

/// A field name as a JSON Pointer's reference token (RFC 6901: `~` as `~0`, `/` as `~1`).
fn escape_token(name: &str) -> String {
    name.replace('~', "~0").replace('/', "~1")
}

fn problem(field: &str, problem: String) -> ContractError {
    ContractError {
        problems: vec![FieldProblem {
            field: field.to_owned(),
            problem,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn fields_decode_plus_and_percent_and_repeat_as_arrays() {
        let fields = read_form(
            b"command=%2Fdeploy&text=web+now%21&team_id=T1&channel=a&channel=b&channel=c&flag&&x=",
        )
        .unwrap();
        assert_eq!(
            Value::Object(fields),
            json!({
                "command": "/deploy",
                "text": "web now!",
                "team_id": "T1",
                "channel": ["a", "b", "c"],
                "flag": "",
                "x": "",
            })
        );
        // A `+` sent as `%2B` is a plus; `=` after the first is part of the value.
        let fields = read_form(b"a=1%2B1%3D2&b=c=d&caf%C3%A9=%E2%9C%93").unwrap();
        assert_eq!(
            Value::Object(fields),
            json!({"a": "1+1=2", "b": "c=d", "café": "✓"})
        );
        assert!(read_form(b"").unwrap().is_empty());
    }

    #[test]
    fn bytes_that_are_not_utf8_name_the_field() {
        let err = read_form(b"ok=1&na/me=%FF").unwrap_err();
        assert_eq!(err.problems[0].field, "/na~1me");
        assert!(err.problems[0].problem.contains("UTF-8"), "{err}");
        let err = read_form(b"ok=1&%C3=1").unwrap_err();
        assert_eq!(err.problems[0].field, "$");
        assert!(err.problems[0].problem.contains("field 1"), "{err}");
    }

    proptest! {
        /// Whatever the fields, encoding them as a publisher does and reading them back
        /// gives the document the locations read: each name's values, in order.
        #[test]
        fn a_form_body_round_trips_to_its_fields(
            pairs in proptest::collection::vec(("[a-c~/ +&=%é]{0,4}", "\\PC{0,8}"), 0..8)
        ) {
            let mut encoder = form_urlencoded::Serializer::new(String::new());
            for (name, value) in &pairs {
                encoder.append_pair(name, value);
            }
            let body = encoder.finish();
            let mut expected = Map::new();
            for (name, value) in &pairs {
                // An empty name with an empty value encodes as `=`: still a field.
                match expected.get_mut(name) {
                    None => {
                        expected.insert(name.clone(), json!(value));
                    }
                    Some(Value::Array(values)) => values.push(json!(value)),
                    Some(first) => {
                        let first = first.take();
                        expected.insert(name.clone(), json!([first, value]));
                    }
                }
            }
            prop_assert_eq!(read_form(body.as_bytes()).unwrap(), expected);
        }

        /// Any bytes read to fields or name their problem; never a panic.
        #[test]
        fn any_bytes_read_or_name_a_problem(body in proptest::collection::vec(any::<u8>(), 0..64)) {
            match read_form(&body) {
                Ok(fields) => prop_assert!(fields.values().all(|v| v.is_string() || v.is_array())),
                Err(err) => prop_assert!(!err.problems.is_empty()),
            }
        }
    }
}
