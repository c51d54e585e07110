//! A sink's name template (docs/forwarding.md, sinks): a NATS subject, an AMQP routing key or
//! a Redis stream written with `{source}`, `{aggregate}` and `{event_type}`. Checked when the
//! config is read, so that no event can render a name its broker refuses; rendered per message.

use std::borrow::Cow;
use std::fmt;

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};

/// What a template names, which decides what its literal text may hold and how the
/// values are written into it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameSyntax {
    /// A NATS subject: `.`-separated tokens, none empty, no whitespace, no `*` or `>`.
    NatsSubject,
    /// An AMQP routing key: at most 255 bytes; `.` separates a topic exchange's words.
    AmqpRoutingKey,
    /// A Redis key: any bytes, not empty.
    RedisKey,
}

impl NameSyntax {
    /// What the name is called in refusals.
    fn noun(self) -> &'static str {
        match self {
            NameSyntax::NatsSubject => "NATS subject",
            NameSyntax::AmqpRoutingKey => "routing key",
            NameSyntax::RedisKey => "Redis stream name",
        }
    }
}

/// The longest routing key AMQP 0-9-1 carries (a short string).
pub const MAX_ROUTING_KEY: usize = 255;

/// Bytes a value may not bring into a subject or routing key as they are: `.` would add
/// a token, `*`, `>` and `#` are wildcards, space and controls end the name, `%` so that
/// the value decodes back, and non-ASCII is written as its UTF-8 bytes
/// (docs/forwarding.md, sinks).
const VALUE_ESCAPED: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'%')
    .add(b'.')
    .add(b'*')
    .add(b'>')
    .add(b'#');

/// What an empty value (an event without a type) is written as, so that no token is empty.
pub const EMPTY_VALUE: &str = "_";

/// One piece of a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Piece {
    /// Text written as it is.
    Literal(String),
    /// The source's name.
    Source,
    /// The aggregate's text form.
    Aggregate,
    /// The event's type.
    EventType,
}

/// The values one message fills a template with.
#[derive(Debug, Clone, Copy)]
pub struct Placed<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The aggregate's text form (docs/contract.md, json sources).
    pub aggregate: &'a str,
    /// The event's type; empty when it has none.
    pub event_type: &'a str,
}

/// A checked template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    text: String,
    pieces: Vec<Piece>,
    syntax: NameSyntax,
}

/// Why a template is refused: the words after the key's name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// Nothing to render.
    #[error("is empty")]
    Empty,
    /// A `{` without its `}`, or a `}` alone.
    #[error("has an unmatched brace at byte {0}")]
    Brace(usize),
    /// A placeholder other than the three.
    #[error("has {{{0}}}: only {{source}}, {{aggregate}} and {{event_type}} are filled in")]
    Unknown(String),
    /// Literal text the name may not hold.
    #[error("holds {0:?}, which a {1} cannot")]
    Character(char, &'static str),
    /// A token that is or can be empty (`a..b`, a leading or trailing `.`).
    #[error("has an empty token: a {0} cannot")]
    EmptyToken(&'static str),
    /// The literal text alone is longer than the name may be.
    #[error("is longer than the {0} bytes a {1} may hold")]
    TooLong(usize, &'static str),
}

/// Why one message's name cannot be rendered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {noun} would be {len} bytes long, over {max}")]
pub struct RenderError {
    noun: &'static str,
    len: usize,
    max: usize,
}

impl Template {
    /// Reads `text` as a template of `syntax`, refusing any that some event could render
    /// into a name its broker refuses.
    pub fn parse(text: &str, syntax: NameSyntax) -> Result<Self, TemplateError> {
        if text.is_empty() {
            return Err(TemplateError::Empty);
        }
        let pieces = pieces(text)?;
        let template = Template {
            text: text.to_owned(),
            pieces,
            syntax,
        };
        template.check()?;
        Ok(template)
    }

    /// The template as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Its pieces, in order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// Whether it has no placeholder (every message gets the same name).
    pub fn is_fixed(&self) -> bool {
        self.pieces.iter().all(|p| matches!(p, Piece::Literal(_)))
    }

    /// The name of one message.
    pub fn render(&self, values: &Placed<'_>) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.text.len() + values.aggregate.len());
        for piece in &self.pieces {
            let value = match piece {
                Piece::Literal(text) => {
                    out.push_str(text);
                    continue;
                }
                Piece::Source => values.source,
                Piece::Aggregate => values.aggregate,
                Piece::EventType => values.event_type,
            };
            out.push_str(&self.written(value));
        }
        if self.syntax == NameSyntax::AmqpRoutingKey && out.len() > MAX_ROUTING_KEY {
            return Err(RenderError {
                noun: self.syntax.noun(),
                len: out.len(),
                max: MAX_ROUTING_KEY,
            });
        }
        Ok(out)
    }

    /// A value as the name carries it: escaped for subjects and routing keys, and never empty.
    fn written<'v>(&self, value: &'v str) -> Cow<'v, str> {
        if value.is_empty() {
            return Cow::Borrowed(EMPTY_VALUE);
        }
        match self.syntax {
            NameSyntax::RedisKey => Cow::Borrowed(value),
            NameSyntax::NatsSubject | NameSyntax::AmqpRoutingKey => {
                Cow::from(utf8_percent_encode(value, VALUE_ESCAPED))
            }
        }
    }

    /// Refuses literal text the name may not hold; values are escaped and never empty,
    /// so the literal text decides whether every rendering is valid.
    fn check(&self) -> Result<(), TemplateError> {
        let noun = self.syntax.noun();
        let literal: String = self
            .pieces
            .iter()
            .map(|p| match p {
                Piece::Literal(text) => text.as_str(),
                // Stands for any value: one non-empty token-safe character.
                _ => EMPTY_VALUE,
            })
            .collect();
        match self.syntax {
            NameSyntax::RedisKey => Ok(()),
            NameSyntax::AmqpRoutingKey => {
                if let Some(c) = literal.chars().find(|c| c.is_control()) {
                    return Err(TemplateError::Character(c, noun));
                }
                if literal.len() > MAX_ROUTING_KEY {
                    return Err(TemplateError::TooLong(MAX_ROUTING_KEY, noun));
                }
                Ok(())
            }
            NameSyntax::NatsSubject => {
                if let Some(c) = literal
                    .chars()
                    .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '*' | '>'))
                {
                    return Err(TemplateError::Character(c, noun));
                }
                if literal.split('.').any(str::is_empty) {
                    return Err(TemplateError::EmptyToken(noun));
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Splits `text` into literal text and placeholders.
fn pieces(text: &str) -> Result<Vec<Piece>, TemplateError> {
    let mut pieces = Vec::new();
    let mut literal = String::new();
    let mut rest = text;
    let mut at = 0;
    while let Some(i) = rest.find(['{', '}']) {
        if rest.as_bytes()[i] == b'}' {
            return Err(TemplateError::Brace(at + i));
        }
        literal.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let close = after
            .find(['{', '}'])
            .filter(|&j| after.as_bytes()[j] == b'}')
            .ok_or(TemplateError::Brace(at + i))?;
        let piece = match &after[..close] {
            "source" => Piece::Source,
            "aggregate" => Piece::Aggregate,
            "event_type" => Piece::EventType,
            other => return Err(TemplateError::Unknown(other.to_owned())),
        };
        if !literal.is_empty() {
            pieces.push(Piece::Literal(std::mem::take(&mut literal)));
        }
        pieces.push(piece);
        let consumed = i + 1 + close + 1;
        at += consumed;
        rest = &rest[consumed..];
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        pieces.push(Piece::Literal(literal));
    }
    Ok(pieces)
}

#[cfg(test)]
mod tests {
    use super::*;

    const VALUES: Placed<'static> = Placed {
        source: "stripe",
        aggregate: "cus 1.a*b>c/é#%",
        event_type: "order.created",
    };

    #[test]
    fn values_are_escaped_for_subjects_and_routing_keys_and_raw_for_redis() {
        let subject =
            Template::parse("webhooks.{source}.{aggregate}", NameSyntax::NatsSubject).unwrap();
        assert_eq!(
            subject.render(&VALUES).unwrap(),
            "webhooks.stripe.cus%201%2Ea%2Ab%3Ec/%C3%A9%23%25"
        );
        let key = Template::parse("{source}.{event_type}", NameSyntax::AmqpRoutingKey).unwrap();
        assert_eq!(key.render(&VALUES).unwrap(), "stripe.order%2Ecreated");
        let stream =
            Template::parse("webhooks:{source}:{aggregate}", NameSyntax::RedisKey).unwrap();
        assert_eq!(
            stream.render(&VALUES).unwrap(),
            "webhooks:stripe:cus 1.a*b>c/é#%"
        );
        assert!(!stream.is_fixed());
        assert!(Template::parse("webhooks", NameSyntax::RedisKey)
            .unwrap()
            .is_fixed());
    }

    #[test]
    fn an_event_without_a_type_never_leaves_an_empty_token() {
        let subject = Template::parse("w.{event_type}.x", NameSyntax::NatsSubject).unwrap();
        let untyped = Placed {
            event_type: "",
            ..VALUES
        };
        assert_eq!(subject.render(&untyped).unwrap(), "w._.x");
    }

    #[test]
    fn templates_that_could_render_an_invalid_name_are_refused() {
        let nats = |t| Template::parse(t, NameSyntax::NatsSubject).unwrap_err();
        assert_eq!(nats(""), TemplateError::Empty);
        assert_eq!(nats("a.{aggregate"), TemplateError::Brace(2));
        assert_eq!(nats("a}"), TemplateError::Brace(1));
        assert_eq!(nats("a.{entity}"), TemplateError::Unknown("entity".into()));
        assert_eq!(
            nats("a.*.{source}"),
            TemplateError::Character('*', "NATS subject")
        );
        assert_eq!(
            nats("a b.{source}"),
            TemplateError::Character(' ', "NATS subject")
        );
        assert_eq!(
            nats("a..{source}"),
            TemplateError::EmptyToken("NATS subject")
        );
        assert_eq!(nats(".{source}"), TemplateError::EmptyToken("NATS subject"));
        assert_eq!(nats("{source}."), TemplateError::EmptyToken("NATS subject"));
        let long = "k".repeat(256);
        assert_eq!(
            Template::parse(&long, NameSyntax::AmqpRoutingKey).unwrap_err(),
            TemplateError::TooLong(255, "routing key")
        );
        assert!(Template::parse("{source}{aggregate}", NameSyntax::NatsSubject).is_ok());
    }

    #[test]
    fn a_routing_key_a_long_aggregate_makes_too_long_is_refused_per_message() {
        let key = Template::parse("{aggregate}", NameSyntax::AmqpRoutingKey).unwrap();
        let long = "a".repeat(300);
        let err = key
            .render(&Placed {
                aggregate: &long,
                ..VALUES
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "the routing key would be 300 bytes long, over 255"
        );
    }
}
