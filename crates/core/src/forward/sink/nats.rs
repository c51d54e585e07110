//! The NATS sink (docs/forwarding.md, sinks): each message is published to JetStream on the
//! destination's rendered `subject`, its metadata as NATS headers and `Nats-Msg-Id` set to
//! its `webhook-id`, so that a resend inside the stream's duplicate window is dropped by the
//! server. The attempt is delivered on the stream's PubAck (a duplicate's too), the broker
//! having stored the message.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use async_nats::jetstream::{self, ErrorCode};
use async_nats::{ConnectErrorKind, ConnectOptions, HeaderMap};
use tokio::sync::Mutex;

use super::{Outgoing, Sink, Unready, Unsendable};
use crate::config::target::NatsTarget;
use crate::config::template::{Piece, Template};
use crate::config::DestinationConfig;
use crate::forward::answer::{AttemptResult, DeclineKind};

/// The port of a `nats://` or `tls://` URL that names none.
const DEFAULT_PORT: u16 = 4222;

/// Why a NATS destination's sink could not be built; never shows the URL.
#[derive(Debug, thiserror::Error)]
pub enum NatsSinkError {
    /// The URL is not a `nats://` or `tls://` URL naming a host.
    #[error("{0}")]
    Url(String),
    /// The outbound TLS setup failed (`tls_ca_file`, named in the error).
    #[error(transparent)]
    Tls(#[from] crate::forward::outbound::ClientSetupError),
}

/// A destination of `type = "nats"`. Connects on first use and again after a failure; the
/// one connection is shared by every concurrent send (NATS multiplexes them).
pub struct NatsSink {
    /// The URL as configured: it may hold credentials, so it is never shown.
    url: String,
    /// The URL as logs and errors may show it.
    shown: String,
    /// Where to connect, and as whom.
    endpoint: Endpoint,
    /// inhook's outbound TLS (the system's roots plus `tls_ca_file`).
    tls: rustls::ClientConfig,
    target: NatsTarget,
    timeout_s: u64,
    connection: Mutex<Option<Connection>>,
    /// Numbers connections, so that a failed send drops only the connection it used, not
    /// a newer one another send already made.
    made: AtomicU64,
}

/// One live connection and its JetStream context.
#[derive(Clone)]
struct Connection {
    number: u64,
    client: async_nats::Client,
    jetstream: jetstream::Context,
}

impl std::fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSink")
            .field("url", &self.shown)
            .field("target", &self.target)
            .field("timeout_s", &self.timeout_s)
            .finish_non_exhaustive()
    }
}

/// Where to connect and as whom, the credentials taken out of the URL (async-nats does
/// not read them from it, and the address it logs must not hold them).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    /// `nats://host:port` or `tls://host:port`.
    server: String,
    tls: bool,
    auth: Auth,
}

/// The credentials of a NATS URL.
#[derive(Clone, PartialEq, Eq)]
enum Auth {
    None,
    /// `nats://TOKEN@host`.
    Token(String),
    /// `nats://user:password@host`.
    UserPassword(String, String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "None",
            Auth::Token(_) => "Token(***)",
            Auth::UserPassword(..) => "UserPassword(***)",
        })
    }
}

impl NatsSink {
    /// The sink of `destination`, whose target is `target`: reads `tls_ca_file`, as the
    /// HTTP client does, so that a bad one stops the start; connects at first use.
    pub fn new(
        destination: &DestinationConfig,
        target: &NatsTarget,
    ) -> Result<Self, NatsSinkError> {
        let endpoint = endpoint(&destination.url).map_err(NatsSinkError::Url)?;
        let tls = crate::forward::outbound::tls_client_config(
            destination.tls_ca_file.as_deref(),
            "tls_ca_file",
        )?;
        Ok(NatsSink {
            url: destination.url.clone(),
            shown: destination.url_for_display(),
            endpoint,
            tls,
            target: target.clone(),
            timeout_s: destination.timeout_s,
            connection: Mutex::new(None),
            made: AtomicU64::new(0),
        })
    }

    /// The shared connection, made now if there is none (the lock held meanwhile, so that
    /// concurrent sends make one, not one each).
    async fn connection(&self, limit: Duration) -> Result<Connection, String> {
        let mut slot = self.connection.lock().await;
        if let Some(connection) = slot.as_ref() {
            if connection.client.connection_state() != async_nats::connection::State::Disconnected {
                return Ok(connection.clone());
            }
            // The client would reconnect by itself and hold our messages meanwhile; a fresh
            // connection instead says at once whether the server can be reached.
            *slot = None;
        }
        let options = match self.endpoint.auth.clone() {
            Auth::None => ConnectOptions::new(),
            Auth::Token(token) => ConnectOptions::with_token(token),
            Auth::UserPassword(user, password) => {
                ConnectOptions::with_user_and_password(user, password)
            }
        }
        .name("inhook")
        .connection_timeout(limit)
        .tls_client_config(self.tls.clone())
        .require_tls(self.endpoint.tls)
        // A dropped client's task tries once more, then stops; the next send connects
        // afresh. A message that task still held and sends late carries its Nats-Msg-Id:
        // the server drops it as a duplicate of its resend, which the sender makes before
        // any later event of the aggregate, so it cannot land out of order.
        .max_reconnects(Some(1));
        let client = options
            .connect(self.endpoint.server.as_str())
            .await
            .map_err(|err| {
                let cause =
                    std::error::Error::source(&err).map(crate::forward::outbound::describe_error);
                describe_connect(err.kind(), cause, &self.url)
            })?;
        let mut jetstream = jetstream::new(client.clone());
        jetstream.set_timeout(limit);
        let connection = Connection {
            number: self.made.fetch_add(1, Ordering::Relaxed) + 1,
            client,
            jetstream,
        };
        *slot = Some(connection.clone());
        Ok(connection)
    }

    /// Drops connection `number` if it is still the shared one: it failed, and the next
    /// attempt should find out afresh whether the server is there.
    async fn forget(&self, number: u64) {
        let mut slot = self.connection.lock().await;
        if slot.as_ref().is_some_and(|c| c.number == number) {
            *slot = None;
        }
    }

    /// Publishes and waits for the PubAck; the connection used, and how the attempt ended.
    async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        body: Vec<u8>,
        limit: Duration,
        used: &AtomicU64,
    ) -> AttemptResult {
        let connection = match self.connection(limit).await {
            Ok(connection) => connection,
            Err(failure) => return AttemptResult::ConnectionFailed(failure),
        };
        used.store(connection.number, Ordering::Relaxed);
        let message = jetstream::message::PublishMessage::build()
            .payload(body.into())
            .headers(headers);
        let acked = match connection
            .jetstream
            .send_publish(subject.clone(), message)
            .await
        {
            Ok(ack) => ack.await,
            Err(err) => Err(err),
        };
        match acked {
            Ok(_ack) => AttemptResult::Delivered { status: None },
            Err(err) => {
                if err.kind() == PublishErrorKind::StreamNotFound && self.target.create_stream {
                    // The server was down when the node started, or the stream was deleted
                    // since: created now, this attempt still fails and the retry lands.
                    let pattern = subject_pattern(&self.target.subject);
                    if let Err(unready) = self.create_stream(&connection, &pattern).await {
                        tracing::warn!(stream = %self.target.stream, problem = %unready,
                                       "the NATS stream could not be created");
                    }
                }
                publish_failure(err.kind(), &err.to_string(), &subject, self.timeout_s)
            }
        }
    }

    /// Checks (or creates) the stream and that its subjects take the destination's.
    async fn check_stream(&self, limit: Duration) -> Result<(), Unready> {
        let connection = self.connection(limit).await.map_err(Unready::Unreachable)?;
        let name = &self.target.stream;
        let pattern = subject_pattern(&self.target.subject);
        match connection.jetstream.get_stream(name).await {
            Ok(stream) => {
                let subjects = &stream.cached_info().config.subjects;
                if subjects.iter().any(|filter| covers(filter, &pattern)) {
                    Ok(())
                } else {
                    Err(Unready::Missing {
                        key: "subject",
                        why: format!(
                            "{:?} is not within the subjects {subjects:?} of stream {name:?}: \
                             messages published there would not be stored by it",
                            self.target.subject.as_str()
                        ),
                    })
                }
            }
            Err(err) => match err.kind() {
                GetStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NOT_FOUND =>
                {
                    if self.target.create_stream {
                        self.create_stream(&connection, &pattern).await
                    } else {
                        Err(Unready::Missing {
                            key: "stream",
                            why: format!(
                                "{name:?} does not exist on the NATS server: create it, or set \
                                 create_stream = true"
                            ),
                        })
                    }
                }
                GetStreamErrorKind::JetStream(js) => Err(Unready::Unreachable(format!(
                    "NATS server at {}: stream {name:?}: {js}",
                    self.shown
                ))),
                other => {
                    self.forget(connection.number).await;
                    Err(Unready::Unreachable(format!(
                        "NATS server at {}: looking up stream {name:?}: {other}",
                        self.shown
                    )))
                }
            },
        }
    }

    /// Creates the stream, file-backed, on the subjects the template can render.
    async fn create_stream(
        &self,
        connection: &Connection,
        pattern: &[Option<String>],
    ) -> Result<(), Unready> {
        let name = &self.target.stream;
        let config = StreamConfig {
            name: name.clone(),
            subjects: vec![stream_subject(pattern)],
            storage: StorageType::File,
            duplicate_window: Duration::from_secs(self.target.duplicate_window_s),
            ..Default::default()
        };
        match connection.jetstream.create_stream(config).await {
            Ok(_) => Ok(()),
            Err(err) => match err.kind() {
                // Another node of the cluster made it first, with the same config.
                CreateStreamErrorKind::JetStream(js)
                    if js.error_code() == ErrorCode::STREAM_NAME_EXIST =>
                {
                    Ok(())
                }
                CreateStreamErrorKind::JetStream(js) => Err(Unready::Missing {
                    key: "stream",
                    why: format!("{name:?} could not be created: {js}"),
                }),
                other => Err(Unready::Unreachable(format!(
                    "NATS server at {}: creating stream {name:?}: {other}",
                    self.shown
                ))),
            },
        }
    }
}

#[async_trait::async_trait]
impl Sink for NatsSink {
    async fn send(
        &self,
        message: Outgoing<'_>,
        limit: Duration,
    ) -> Result<AttemptResult, Unsendable> {
        let subject = self
            .target
            .subject
            .render(&message.placed)
            .map_err(Unsendable::InvalidName)?;
        let headers = header_map(&message.headers)?;
        let used = AtomicU64::new(0);
        let result = tokio::time::timeout(
            limit,
            self.publish(subject, headers, message.body, limit, &used),
        )
        .await
        .unwrap_or(AttemptResult::TimedOut {
            after_s: self.timeout_s,
        });
        if drops_connection(&result) {
            self.forget(used.load(Ordering::Relaxed)).await;
        }
        Ok(result)
    }

    async fn prepare(&self, limit: Duration) -> Result<(), Unready> {
        tokio::time::timeout(limit, self.check_stream(limit))
            .await
            .unwrap_or_else(|_| {
                Err(Unready::Unreachable(format!(
                    "NATS server at {}: no answer within {} s",
                    self.shown, self.timeout_s
                )))
            })
    }
}

/// Whether the attempt's failure says the connection may be broken: only then is it
/// dropped, a nack from a live server being no reason to reconnect.
fn drops_connection(result: &AttemptResult) -> bool {
    matches!(
        result,
        AttemptResult::TimedOut { .. } | AttemptResult::ConnectionFailed(_)
    )
}

/// The server address and credentials of `url` (`nats://` or `tls://`).
fn endpoint(url: &str) -> Result<Endpoint, String> {
    let parsed = reqwest::Url::parse(url).map_err(|_| "url is not a URL".to_owned())?;
    let tls = match parsed.scheme() {
        "nats" => false,
        "tls" => true,
        other => {
            return Err(format!(
                "url has scheme {other:?}: expected nats:// or tls://"
            ))
        }
    };
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| "url names no host".to_owned())?;
    let port = parsed.port().unwrap_or(DEFAULT_PORT);
    let decode = |text: &str| {
        percent_encoding::percent_decode_str(text)
            .decode_utf8_lossy()
            .into_owned()
    };
    let auth = match (parsed.username(), parsed.password()) {
        ("", None) => Auth::None,
        (user, Some(password)) => Auth::UserPassword(decode(user), decode(password)),
        (token, None) => Auth::Token(decode(token)),
    };
    Ok(Endpoint {
        server: format!("{}://{host}:{port}", parsed.scheme()),
        tls,
        auth,
    })
}

/// A connection failure as a person reads it: its kind, and its cause (an I/O or TLS
/// error) unless that holds any part of the URL's credentials; never the URL.
fn describe_connect(kind: ConnectErrorKind, cause: Option<String>, url: &str) -> String {
    let what = match kind {
        ConnectErrorKind::ServerParse => "the URL could not be read",
        ConnectErrorKind::Dns => "the host name could not be resolved",
        ConnectErrorKind::Authentication => "authentication failed",
        ConnectErrorKind::AuthorizationViolation => "the server refused the credentials",
        ConnectErrorKind::TimedOut => "connecting timed out",
        ConnectErrorKind::Tls => "the TLS setup failed",
        ConnectErrorKind::Io => "the server could not be reached",
        ConnectErrorKind::MaxReconnects => "the server could not be reached again",
    };
    let secrets: Vec<String> = match endpoint(url).map(|e| e.auth) {
        Ok(Auth::Token(token)) => vec![token],
        Ok(Auth::UserPassword(user, password)) => vec![user, password],
        _ => vec![],
    };
    match cause {
        Some(cause)
            if !cause.contains(url)
                && !secrets
                    .iter()
                    .any(|s| !s.is_empty() && cause.contains(s.as_str())) =>
        {
            format!("NATS: {what}: {cause}")
        }
        _ => format!("NATS: {what}"),
    }
}

/// How a failed publish ends the attempt. `detail` is the client's error (it holds no URL).
fn publish_failure(
    kind: PublishErrorKind,
    detail: &str,
    subject: &str,
    timeout_s: u64,
) -> AttemptResult {
    match kind {
        PublishErrorKind::TimedOut => AttemptResult::TimedOut { after_s: timeout_s },
        PublishErrorKind::BrokenPipe => {
            AttemptResult::ConnectionFailed("NATS: the connection broke".to_owned())
        }
        // Nothing stores the subject: the stream is gone or was changed; down as for a 5xx.
        PublishErrorKind::StreamNotFound => AttemptResult::declined(
            DeclineKind::ServerError,
            format!("NATS: no JetStream stream takes subject {subject}"),
        ),
        // This message alone is too large for the server: retried, then dead, the
        // circuit left closed for the others.
        PublishErrorKind::MaxPayloadExceeded => AttemptResult::declined(
            DeclineKind::Refused,
            format!("NATS: the message is over the server's max_payload ({detail})"),
        ),
        _ => AttemptResult::declined(
            DeclineKind::ServerError,
            format!("NATS: JetStream did not store the message: {detail}"),
        ),
    }
}

/// The message's headers as NATS headers, and `Nats-Msg-Id` from `webhook-id`. A value
/// NATS cannot carry (a line break) is refused without showing it, not altered.
fn header_map(headers: &[(&'static str, String)]) -> Result<HeaderMap, Unsendable> {
    let mut map = HeaderMap::new();
    let mut id = None;
    for (name, value) in headers {
        if value.contains(['\r', '\n']) {
            return Err(Unsendable::Header(name));
        }
        if *name == "webhook-id" {
            id = Some(value.as_str());
        }
        map.insert(*name, value.as_str());
    }
    let id = id.ok_or(Unsendable::Header("webhook-id"))?;
    map.insert(async_nats::header::NATS_MESSAGE_ID, id);
    Ok(map)
}

/// The template's subject as tokens: a literal token, or `None` for one that holds a
/// placeholder (any value; values never hold a `.`, so each stays within its token).
fn subject_pattern(template: &Template) -> Vec<Option<String>> {
    const HOLE: char = '\u{0}';
    let mut text = String::new();
    for piece in template.pieces() {
        match piece {
            Piece::Literal(literal) => text.push_str(literal),
            Piece::Source | Piece::Aggregate | Piece::EventType => text.push(HOLE),
        }
    }
    text.split('.')
        .map(|token| (!token.contains(HOLE)).then(|| token.to_owned()))
        .collect()
}

/// The subject a created stream takes: the literal tokens before the first placeholder,
/// then `>`; a fixed subject as it is; `*` for each placeholder's token when the subject
/// starts with one (a bare `>` would take every subject of the account).
fn stream_subject(pattern: &[Option<String>]) -> String {
    let literal: Vec<&str> = pattern.iter().map_while(|t| t.as_deref()).collect();
    if literal.len() == pattern.len() {
        return literal.join(".");
    }
    if literal.is_empty() {
        return pattern
            .iter()
            .map(|t| t.as_deref().unwrap_or("*"))
            .collect::<Vec<_>>()
            .join(".");
    }
    format!("{}.>", literal.join("."))
}

/// Whether the stream subject `filter` takes every subject `pattern` can render.
fn covers(filter: &str, pattern: &[Option<String>]) -> bool {
    let tokens: Vec<&str> = filter.split('.').collect();
    for (i, token) in tokens.iter().enumerate() {
        if *token == ">" {
            return pattern.len() > i;
        }
        match (*token, pattern.get(i)) {
            (_, None) => return false,
            ("*", Some(_)) => {}
            (literal, Some(Some(wanted))) if literal == wanted => {}
            _ => return false,
        }
    }
    tokens.len() == pattern.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::template::NameSyntax;

    fn pattern(text: &str) -> Vec<Option<String>> {
        subject_pattern(&Template::parse(text, NameSyntax::NatsSubject).unwrap())
    }

    #[test]
    fn headers_are_the_messages_and_the_msg_id_is_the_webhook_id() {
        let headers = vec![
            ("webhook-id", "msg_1".to_owned()),
            ("inhook-sequence", "7".to_owned()),
            ("content-type", "application/json".to_owned()),
        ];
        let map = header_map(&headers).unwrap();
        assert_eq!(map.get("webhook-id").unwrap().as_str(), "msg_1");
        assert_eq!(map.get("inhook-sequence").unwrap().as_str(), "7");
        assert_eq!(
            map.get("content-type").unwrap().as_str(),
            "application/json"
        );
        assert_eq!(map.get("Nats-Msg-Id").unwrap().as_str(), "msg_1");
    }

    #[test]
    fn a_header_nats_cannot_carry_is_refused_without_showing_it() {
        let headers = vec![
            ("webhook-id", "msg_1".to_owned()),
            ("webhook-signature", "v1,secret\r\nvalue".to_owned()),
        ];
        let err = header_map(&headers).unwrap_err().to_string();
        assert_eq!(
            err,
            "cannot build the request: header webhook-signature is invalid"
        );
        assert!(header_map(&[("content-type", "x".to_owned())]).is_err());
    }

    #[test]
    fn publish_failures_map_to_attempt_results() {
        let subject = "webhooks.stripe.a";
        assert_eq!(
            publish_failure(PublishErrorKind::TimedOut, "", subject, 3),
            AttemptResult::TimedOut { after_s: 3 }
        );
        assert!(matches!(
            publish_failure(PublishErrorKind::BrokenPipe, "", subject, 3),
            AttemptResult::ConnectionFailed(_)
        ));
        let none = publish_failure(PublishErrorKind::StreamNotFound, "", subject, 3);
        let AttemptResult::Declined(decline) = &none else {
            panic!("{none:?}")
        };
        assert_eq!(decline.kind, DeclineKind::ServerError);
        assert!(decline.reason.contains(subject), "{}", decline.reason);
        assert!(none.counts_against_circuit());
        let big = publish_failure(PublishErrorKind::MaxPayloadExceeded, "", subject, 3);
        assert!(!big.counts_against_circuit(), "{big:?}");
        let other = publish_failure(PublishErrorKind::Other, "storage full", subject, 3);
        assert!(other.counts_against_circuit());
        assert!(other.describe().contains("storage full"));
        assert!(drops_connection(&AttemptResult::TimedOut { after_s: 1 }));
        assert!(!drops_connection(&none));
    }

    #[test]
    fn credentials_come_out_of_the_url_and_stay_out_of_the_address() {
        let plain = endpoint("nats://127.0.0.1:4222").unwrap();
        assert_eq!(plain.server, "nats://127.0.0.1:4222");
        assert_eq!(plain.auth, Auth::None);
        assert!(!plain.tls);
        let user = endpoint("tls://al%40x:p%3Ass@nats.example").unwrap();
        assert_eq!(user.server, "tls://nats.example:4222");
        assert!(user.tls);
        assert_eq!(user.auth, Auth::UserPassword("al@x".into(), "p:ss".into()));
        assert_eq!(format!("{:?}", user.auth), "UserPassword(***)");
        let token = endpoint("nats://s3cret@[::1]:4333").unwrap();
        assert_eq!(token.server, "nats://[::1]:4333");
        assert_eq!(token.auth, Auth::Token("s3cret".into()));
        assert!(endpoint("http://host").unwrap_err().contains("scheme"));
        let url = "nats://natsuser:pw-x@h";
        let refused = Some("Connection refused (os error 111)".to_owned());
        assert_eq!(
            describe_connect(ConnectErrorKind::Io, refused, url),
            "NATS: the server could not be reached: Connection refused (os error 111)"
        );
        let telling = Some("no user natsuser with password pw-x".to_owned());
        assert_eq!(
            describe_connect(ConnectErrorKind::AuthorizationViolation, telling, url),
            "NATS: the server refused the credentials"
        );
    }

    #[test]
    fn a_created_streams_subject_takes_the_templates() {
        let p = pattern("webhooks.{source}.{aggregate}");
        assert_eq!(p, vec![Some("webhooks".into()), None, None]);
        assert_eq!(stream_subject(&p), "webhooks.>");
        assert_eq!(stream_subject(&pattern("a.b.c")), "a.b.c");
        assert_eq!(stream_subject(&pattern("{source}.x.{aggregate}")), "*.x.*");
        assert_eq!(stream_subject(&pattern("a.pre-{source}.z")), "a.>");
        for text in [
            "webhooks.{source}.{aggregate}",
            "a.b.c",
            "{source}.x",
            "a.x{source}.z",
        ] {
            let p = pattern(text);
            assert!(covers(&stream_subject(&p), &p), "{text}");
        }
    }

    #[test]
    fn a_streams_subjects_cover_the_template_or_not() {
        let p = pattern("webhooks.{source}.{aggregate}");
        assert!(covers("webhooks.>", &p));
        assert!(covers("webhooks.*.*", &p));
        assert!(covers(">", &p));
        assert!(!covers("webhooks.stripe.*", &p));
        assert!(!covers("webhooks.*", &p));
        assert!(!covers("webhooks.*.*.>", &p));
        assert!(!covers("other.>", &p));
        assert!(!covers("webhooks.*.*.*", &p));
        assert!(covers("a.b", &pattern("a.b")));
        assert!(!covers("a.b.>", &pattern("a.b")));
    }
}
