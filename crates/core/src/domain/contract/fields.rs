//! Field extraction shared by the contracts: each getter records a named
//! problem instead of failing fast, so one 400 answer lists every bad field.

use serde_json::{Map, Value};

use super::FieldProblem;
use crate::domain::{IdProblem, Sequence};

/// A JSON object being read, with the problems found so far.
pub(crate) struct Reader<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
    problems: &'a mut Vec<FieldProblem>,
}

impl<'a> Reader<'a> {
    /// Starts reading a top-level object.
    pub(crate) fn new(map: &'a Map<String, Value>, problems: &'a mut Vec<FieldProblem>) -> Self {
        Self {
            map,
            prefix: String::new(),
            problems,
        }
    }

    /// The full path of a field of this object.
    pub(crate) fn path(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// Records a problem with a field of this object.
    pub(crate) fn problem(&mut self, name: &str, problem: impl Into<String>) {
        let field = self.path(name);
        self.problems.push(FieldProblem {
            field,
            problem: problem.into(),
        });
    }

    /// Reads a nested object at `path`, sharing this reader's problem list.
    pub(crate) fn nested<'b>(
        map: &'b Map<String, Value>,
        path: String,
        problems: &'b mut Vec<FieldProblem>,
    ) -> Reader<'b> {
        Reader {
            map,
            prefix: format!("{path}."),
            problems,
        }
    }

    /// The raw value of a field, recording a problem if it is required and absent or null.
    pub(crate) fn value(&mut self, name: &str, required: bool) -> Option<&'a Value> {
        match self.map.get(name) {
            None | Some(Value::Null) => {
                if required {
                    self.problem(name, "is required");
                }
                None
            }
            Some(v) => Some(v),
        }
    }

    /// A string field.
    pub(crate) fn string(&mut self, name: &str, required: bool) -> Option<&'a str> {
        match self.value(name, required)? {
            Value::String(s) => Some(s),
            other => {
                self.problem(name, format!("must be a string, got {}", kind_of(other)));
                None
            }
        }
    }

    /// A string field parsed as an id.
    pub(crate) fn id<T>(
        &mut self,
        name: &str,
        required: bool,
        parse: fn(&str) -> Result<T, IdProblem>,
    ) -> Option<T> {
        let raw = self.string(name, required)?;
        match parse(raw) {
            Ok(id) => Some(id),
            Err(problem) => {
                self.problem(name, problem.to_string());
                None
            }
        }
    }

    /// A required id field that may instead come from outside the body (a
    /// signed delivery-id header): the body's value wins when it has one.
    pub(crate) fn id_or<T>(
        &mut self,
        name: &str,
        fallback: Option<&str>,
        parse: fn(&str) -> Result<T, IdProblem>,
    ) -> Option<T> {
        let Some(fallback) = fallback.filter(|_| self.value(name, false).is_none()) else {
            return self.id(name, true, parse);
        };
        match parse(fallback) {
            Ok(id) => Some(id),
            Err(problem) => {
                self.problem(
                    name,
                    format!(
                        "is absent, and the delivery id header that stands in for it {problem}"
                    ),
                );
                None
            }
        }
    }

    /// An integer field in `0..=i64::MAX`.
    pub(crate) fn non_negative(&mut self, name: &str, required: bool) -> Option<i64> {
        let value = self.value(name, required)?;
        match non_negative_integer(value) {
            Ok(n) => Some(n),
            Err(problem) => {
                self.problem(name, problem);
                None
            }
        }
    }

    /// A sequence field.
    pub(crate) fn sequence(&mut self, name: &str) -> Option<Sequence> {
        self.non_negative(name, true).and_then(Sequence::new)
    }

    /// An object field.
    pub(crate) fn object(&mut self, name: &str, required: bool) -> Option<&'a Map<String, Value>> {
        match self.value(name, required)? {
            Value::Object(map) => Some(map),
            other => {
                self.problem(name, format!("must be an object, got {}", kind_of(other)));
                None
            }
        }
    }

    /// An array field.
    pub(crate) fn array(&mut self, name: &str, required: bool) -> Option<&'a Vec<Value>> {
        match self.value(name, required)? {
            Value::Array(items) => Some(items),
            other => {
                self.problem(name, format!("must be an array, got {}", kind_of(other)));
                None
            }
        }
    }

    /// Hands back the problem list's borrow for a nested reader.
    pub(crate) fn problems(&mut self) -> &mut Vec<FieldProblem> {
        self.problems
    }
}

/// Checks an integer in `0..=2^63-1`, explaining why anything else is not one.
pub(crate) fn non_negative_integer(value: &Value) -> Result<i64, String> {
    match value {
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                if i < 0 {
                    Err("must not be negative".into())
                } else {
                    Ok(i)
                }
            } else if n.is_u64() {
                Err("must be at most 9223372036854775807".into())
            } else {
                let f = n.as_f64().unwrap_or(f64::NAN);
                if f.fract() == 0.0 && f.abs() >= 9.2e18 {
                    Err("must be at most 9223372036854775807".into())
                } else {
                    Err("must be an integer".into())
                }
            }
        }
        other => Err(format!("must be an integer, got {}", kind_of(other))),
    }
}

/// How a JSON value is named in problems.
pub(crate) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
