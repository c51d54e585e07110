//! A destination's `type` and the keys of that type (docs/forwarding.md, sinks): where its
//! messages go, checked when the config is read. A new type is one variant here and its sink.

use super::defaults;
use super::template::{NameSyntax, Template, TemplateError};

/// Where a destination's messages go, by type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `type = "http"` (the default): a `POST` to `url`.
    Http,
    /// `type = "nats"`: a JetStream publish.
    Nats(NatsTarget),
    /// `type = "rabbitmq"`: a confirmed, persistent, mandatory AMQP publish.
    Rabbitmq(RabbitmqTarget),
    /// `type = "redis"`: an `XADD` to a stream.
    Redis(RedisTarget),
    /// `type = "in_process"`: the consumer a service embedding inhook binds in code
    /// (docs/library.md): no URL, no network.
    InProcess,
}

/// The keys of a `type = "nats"` destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatsTarget {
    /// The subject each message is published on.
    pub subject: Template,
    /// The JetStream stream that must hold the subjects.
    pub stream: String,
    /// Whether inhook creates the stream when it does not exist (else each attempt fails
    /// and retries until someone creates it).
    pub create_stream: bool,
    /// The duplicate window of a stream inhook creates, in seconds.
    pub duplicate_window_s: u64,
}

/// The keys of a `type = "rabbitmq"` destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RabbitmqTarget {
    /// The exchange messages are published to.
    pub exchange: String,
    /// Each message's routing key.
    pub routing_key: Template,
    /// Whether inhook declares the exchange (a durable topic exchange) when it does not
    /// exist (else each attempt fails and retries until someone declares it).
    pub declare: bool,
}

/// The keys of a `type = "redis"` destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisTarget {
    /// The stream each message is added to.
    pub stream: Template,
    /// The stream's approximate `MAXLEN`, when set.
    pub max_len: Option<u64>,
}

impl Target {
    /// The `type` as written in the config and shown by the API.
    pub fn type_name(&self) -> &'static str {
        match self {
            Target::Http => "http",
            Target::Nats(_) => "nats",
            Target::Rabbitmq(_) => "rabbitmq",
            Target::Redis(_) => "redis",
            Target::InProcess => "in_process",
        }
    }

    /// Whether every message must be signed: an HTTP endpoint is on the open internet and
    /// verifies what it receives; a broker's consumers read from a queue of their own.
    pub fn requires_secret(&self) -> bool {
        matches!(self, Target::Http)
    }

    /// The URL schemes of this type: plain, then TLS.
    pub fn schemes(&self) -> [&'static str; 2] {
        match self {
            Target::Http => ["http", "https"],
            Target::Nats(_) => ["nats", "tls"],
            Target::Rabbitmq(_) => ["amqp", "amqps"],
            Target::Redis(_) => ["redis", "rediss"],
            // Never read: an in-process destination takes no URL.
            Target::InProcess => ["in-process", "in-process"],
        }
    }

    /// The target's keys that differ from `other`'s, by name.
    pub fn changed_keys(&self, other: &Target) -> Vec<&'static str> {
        match (self, other) {
            (Target::Http, Target::Http) | (Target::InProcess, Target::InProcess) => vec![],
            (Target::Nats(a), Target::Nats(b)) => changed_keys!(a, b, [
                "subject" => subject,
                "stream" => stream,
                "create_stream" => create_stream,
                "duplicate_window_s" => duplicate_window_s,
            ]),
            (Target::Rabbitmq(a), Target::Rabbitmq(b)) => changed_keys!(a, b, [
                "exchange" => exchange,
                "routing_key" => routing_key,
                "declare" => declare,
            ]),
            (Target::Redis(a), Target::Redis(b)) => changed_keys!(a, b, [
                "stream" => stream,
                "max_len" => max_len,
            ]),
            _ => vec!["type"],
        }
    }
}

/// The type keys of a `[[destinations]]` table as written.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTarget {
    #[serde(rename = "type")]
    pub(super) type_name: Option<String>,
    pub(super) subject: Option<String>,
    pub(super) stream: Option<String>,
    pub(super) create_stream: Option<bool>,
    pub(super) duplicate_window_s: Option<u64>,
    pub(super) exchange: Option<String>,
    pub(super) routing_key: Option<String>,
    pub(super) declare: Option<bool>,
    pub(super) max_len: Option<u64>,
}

/// Why a destination's type keys are refused: the key, and the words after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TargetRefusal {
    /// The key refused.
    pub(super) key: &'static str,
    /// Why, as the words after the key.
    pub(super) why: String,
}

fn refusal(key: &'static str, why: impl ToString) -> TargetRefusal {
    TargetRefusal {
        key,
        why: why.to_string(),
    }
}

impl FileTarget {
    /// Checks the type and its keys; a key of another type is refused, naming the type it is for.
    pub(super) fn check(self) -> Result<Target, TargetRefusal> {
        let type_name = self.type_name.as_deref().unwrap_or("http");
        let given: [(&'static str, bool, &'static str); 8] = [
            ("subject", self.subject.is_some(), "nats"),
            ("stream", self.stream.is_some(), "nats or redis"),
            ("create_stream", self.create_stream.is_some(), "nats"),
            (
                "duplicate_window_s",
                self.duplicate_window_s.is_some(),
                "nats",
            ),
            ("exchange", self.exchange.is_some(), "rabbitmq"),
            ("routing_key", self.routing_key.is_some(), "rabbitmq"),
            ("declare", self.declare.is_some(), "rabbitmq"),
            ("max_len", self.max_len.is_some(), "redis"),
        ];
        let foreign = given
            .iter()
            .find(|(_, set, types)| *set && !types.split(" or ").any(|t| t == type_name));
        if let Some((key, _, types)) = foreign {
            if ["http", "nats", "rabbitmq", "redis", "in_process"].contains(&type_name) {
                let why = format!("is only for type = {types:?}, not {type_name:?}");
                return Err(refusal(key, why));
            }
        }
        match type_name {
            "http" => Ok(Target::Http),
            "nats" => self.nats(),
            "rabbitmq" => self.rabbitmq(),
            "redis" => self.redis(),
            "in_process" => Ok(Target::InProcess),
            other => Err(refusal(
                "type",
                format!(
                    "is {other:?}: expected \"http\", \"nats\", \"rabbitmq\", \"redis\" or \"in_process\""
                ),
            )),
        }
    }

    fn nats(self) -> Result<Target, TargetRefusal> {
        let subject = required(
            "subject",
            self.subject,
            "e.g. \"webhooks.{source}.{aggregate}\"",
        )?;
        let subject = template("subject", &subject, NameSyntax::NatsSubject)?;
        let stream = required(
            "stream",
            self.stream,
            "the JetStream stream, e.g. \"WEBHOOKS\"",
        )?;
        check_stream_name(&stream).map_err(|why| refusal("stream", why))?;
        let duplicate_window_s = self
            .duplicate_window_s
            .unwrap_or(defaults::NATS_DUPLICATE_WINDOW_S);
        if duplicate_window_s == 0 {
            let why = "must be at least 1: the window in which a resend is dropped";
            return Err(refusal("duplicate_window_s", why));
        }
        Ok(Target::Nats(NatsTarget {
            subject,
            stream,
            create_stream: self.create_stream.unwrap_or(false),
            duplicate_window_s,
        }))
    }

    fn rabbitmq(self) -> Result<Target, TargetRefusal> {
        let exchange = required("exchange", self.exchange, "e.g. \"webhooks\"")?;
        check_exchange_name(&exchange).map_err(|why| refusal("exchange", why))?;
        let routing_key = self
            .routing_key
            .unwrap_or_else(|| "{source}.{aggregate}".to_owned());
        let routing_key = template("routing_key", &routing_key, NameSyntax::AmqpRoutingKey)?;
        Ok(Target::Rabbitmq(RabbitmqTarget {
            exchange,
            routing_key,
            declare: self.declare.unwrap_or(false),
        }))
    }

    fn redis(self) -> Result<Target, TargetRefusal> {
        let stream = required("stream", self.stream, "e.g. \"webhooks:{source}\"")?;
        let stream = template("stream", &stream, NameSyntax::RedisKey)?;
        if self.max_len == Some(0) {
            return Err(refusal(
                "max_len",
                "must be at least 1; remove it to keep every message",
            ));
        }
        Ok(Target::Redis(RedisTarget {
            stream,
            max_len: self.max_len,
        }))
    }
}

fn required(
    key: &'static str,
    value: Option<String>,
    example: &str,
) -> Result<String, TargetRefusal> {
    value.ok_or_else(|| refusal(key, format!("is required ({example})")))
}

fn template(key: &'static str, text: &str, syntax: NameSyntax) -> Result<Template, TargetRefusal> {
    Template::parse(text, syntax).map_err(|why: TemplateError| refusal(key, why))
}

/// NATS refuses stream names with whitespace, `.`, `*`, `>` or a path separator.
fn check_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is empty".into());
    }
    match name
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        Some(c) => Err(format!("holds {c:?}, which a JetStream stream name cannot")),
        None => Ok(()),
    }
}

/// AMQP exchange names: letters, digits, `-`, `_`, `.` and `:`, at most 127 bytes (RabbitMQ's
/// rule); the default exchange (empty) routes by queue name and is not a topic exchange.
fn check_exchange_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(
            "is empty: name a topic exchange (the default exchange routes by queue name)".into(),
        );
    }
    if name.len() > 127 {
        return Err("is longer than 127 bytes".into());
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        Some(c) => Err(format!(
            "holds {c:?}: letters, digits, '-', '_', '.' and ':' only"
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(type_name: &str) -> FileTarget {
        FileTarget {
            type_name: Some(type_name.to_owned()),
            ..FileTarget::default()
        }
    }

    #[test]
    fn each_type_reads_its_keys_with_their_defaults() {
        assert_eq!(FileTarget::default().check().unwrap(), Target::Http);
        let nats = FileTarget {
            subject: Some("webhooks.{source}.{aggregate}".into()),
            stream: Some("WEBHOOKS".into()),
            ..file("nats")
        };
        let Target::Nats(nats) = nats.check().unwrap() else {
            panic!("nats");
        };
        assert_eq!(
            (nats.stream.as_str(), nats.create_stream),
            ("WEBHOOKS", false)
        );
        let amqp = FileTarget {
            exchange: Some("webhooks".into()),
            ..file("rabbitmq")
        };
        let Target::Rabbitmq(amqp) = amqp.check().unwrap() else {
            panic!("rabbitmq");
        };
        assert_eq!(amqp.routing_key.as_str(), "{source}.{aggregate}");
        let redis = FileTarget {
            stream: Some("webhooks:{source}".into()),
            max_len: Some(1000),
            ..file("redis")
        };
        assert_eq!(redis.check().unwrap().type_name(), "redis");
    }

    #[test]
    fn refusals_name_the_key() {
        let key = |t: FileTarget| t.check().unwrap_err().key;
        assert_eq!(key(file("kafka")), "type");
        assert_eq!(key(file("nats")), "subject");
        let bad_subject = FileTarget {
            subject: Some("webhooks.*".into()),
            stream: Some("W".into()),
            ..file("nats")
        };
        assert_eq!(key(bad_subject), "subject");
        let bad_stream = FileTarget {
            subject: Some("w.{source}".into()),
            stream: Some("WEB.HOOKS".into()),
            ..file("nats")
        };
        assert_eq!(key(bad_stream), "stream");
        let foreign = FileTarget {
            exchange: Some("x".into()),
            ..file("redis")
        };
        let refused = foreign.check().unwrap_err();
        assert_eq!(refused.key, "exchange");
        assert_eq!(
            refused.why,
            "is only for type = \"rabbitmq\", not \"redis\""
        );
        let http_with_subject = FileTarget {
            subject: Some("a".into()),
            ..FileTarget::default()
        };
        assert_eq!(key(http_with_subject), "subject");
        let bad_exchange = FileTarget {
            exchange: Some("web hooks".into()),
            ..file("rabbitmq")
        };
        assert_eq!(key(bad_exchange), "exchange");
        let zero = FileTarget {
            stream: Some("s".into()),
            max_len: Some(0),
            ..file("redis")
        };
        assert_eq!(key(zero), "max_len");
    }
}
