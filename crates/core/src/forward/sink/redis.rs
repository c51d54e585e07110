//! The Redis Streams sink (docs/forwarding.md, sinks): each message is one `XADD` to the
//! stream its template names, its metadata as the entry's fields and its raw body as the
//! `body` field; delivered on the server's reply (the entry id). A resend after a crash or a
//! lost reply can add an entry twice: consumers dedupe by `webhook-id`.

use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::MultiplexedConnection;
use ::redis::{ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisConnectionInfo, RedisError};
use rustls::pki_types::ServerName;
use tokio::sync::Mutex;

use super::{Outgoing, Sink, Unready, Unsendable};
use crate::config::target::RedisTarget;
use crate::config::template::Template;
use crate::config::DestinationConfig;
use crate::forward::answer::{AttemptResult, DeclineKind};
use crate::forward::outbound::describe_error;

/// The field an entry's raw body is stored in, after the metadata fields.
pub const BODY_FIELD: &str = "body";

/// Why a Redis destination's sink could not be built; never shows the URL.
#[derive(Debug, thiserror::Error)]
pub enum RedisSinkError {
    /// The URL is not one the Redis client can use (the client's words, without the URL).
    #[error("url {0}")]
    Url(String),
    /// The outbound TLS setup failed (`tls_ca_file`, named in the error).
    #[error(transparent)]
    Tls(#[from] crate::forward::outbound::ClientSetupError),
}

/// A destination of `type = "redis"`: one multiplexed connection shared by every send
/// (Redis pipelines the commands of concurrent sends on it), made at first use and again
/// after a failure.
pub struct RedisSink {
    stream: Template,
    max_len: Option<u64>,
    timeout_s: u64,
    host: String,
    port: u16,
    /// The TLS setup and the name the certificate is checked against, for `rediss://`.
    tls: Option<(tokio_rustls::TlsConnector, ServerName<'static>)>,
    /// The database, user and password the connection is set up with.
    login: RedisConnectionInfo,
    /// The live connection and its number; the number tells whether a failed send's
    /// connection is still the current one (so an old failure does not drop a new one).
    connection: Mutex<(u64, Option<MultiplexedConnection>)>,
}

impl std::fmt::Debug for RedisSink {
    /// Without the login: it holds the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSink")
            .field("stream", &self.stream.as_str())
            .field("max_len", &self.max_len)
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl RedisSink {
    /// The sink of `destination`, whose keys are `target`; reads the URL and the TLS setup,
    /// connects at first use.
    pub fn new(
        destination: &DestinationConfig,
        target: &RedisTarget,
    ) -> Result<Self, RedisSinkError> {
        let url = &destination.url;
        let tls_wanted = url
            .get(..9)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"));
        // The client's own TLS would bring its own roots; inhook's TLS stack is used
        // instead, so the client reads the URL as a plain one.
        let plain_url = if tls_wanted {
            format!("redis://{}", &url[9..])
        } else {
            url.clone()
        };
        let info = plain_url
            .as_str()
            .into_connection_info()
            .map_err(|err| RedisSinkError::Url(url_problem(&err)))?;
        let ConnectionAddr::Tcp(host, port) = info.addr else {
            return Err(RedisSinkError::Url(
                "must name a host and port (redis:// or rediss://)".to_owned(),
            ));
        };
        let tls = if tls_wanted {
            let config = crate::forward::outbound::tls_client_config(
                destination.tls_ca_file.as_deref(),
                "tls_ca_file",
            )?;
            let name = ServerName::try_from(host.clone())
                .map_err(|_| RedisSinkError::Url("has a host TLS cannot check".to_owned()))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        Ok(RedisSink {
            stream: target.stream.clone(),
            max_len: target.max_len,
            timeout_s: destination.timeout_s,
            host,
            port,
            tls,
            login: info.redis,
            connection: Mutex::new((0, None)),
        })
    }

    /// The current connection and its number, made now if there is none. Connections are
    /// made one at a time: concurrent sends wait for the one being made.
    async fn connection(&self) -> Result<(u64, MultiplexedConnection), RedisError> {
        let mut current = self.connection.lock().await;
        if let Some(connection) = &current.1 {
            return Ok((current.0, connection.clone()));
        }
        let connection = self.connect().await?;
        current.0 += 1;
        current.1 = Some(connection.clone());
        Ok((current.0, connection))
    }

    /// Drops connection number `number` if it is still the current one, so the next send
    /// reconnects; in-flight sends on it still end on their own.
    async fn forget(&self, number: u64) {
        let mut current = self.connection.lock().await;
        if current.0 == number {
            current.1 = None;
        }
    }

    /// A new connection: TCP, TLS for `rediss://`, then the client's setup (AUTH, SELECT).
    async fn connect(&self) -> Result<MultiplexedConnection, RedisError> {
        let tcp = tokio::net::TcpStream::connect((self.host.as_str(), self.port)).await?;
        // Commands are small and each waits for its reply: no batching delay.
        tcp.set_nodelay(true)?;
        // The driver reads and writes the socket; it ends when the connection breaks or
        // every handle to it is dropped.
        let connection = match &self.tls {
            Some((connector, name)) => {
                let tls = connector.connect(name.clone(), tcp).await?;
                let (connection, driver) = MultiplexedConnection::new(&self.login, tls).await?;
                tokio::spawn(driver);
                connection
            }
            None => {
                let (connection, driver) = MultiplexedConnection::new(&self.login, tcp).await?;
                tokio::spawn(driver);
                connection
            }
        };
        Ok(connection)
    }

    /// The `XADD` of `message` to `stream`.
    fn xadd(&self, stream: &str, message: &Outgoing<'_>) -> ::redis::Cmd {
        let mut cmd = ::redis::cmd("XADD");
        cmd.arg(stream);
        if let Some(max_len) = self.max_len {
            // Approximate trimming: Redis trims whole nodes, far cheaper than exact.
            cmd.arg("MAXLEN").arg("~").arg(max_len);
        }
        cmd.arg("*");
        for (name, value) in &message.headers {
            cmd.arg(*name).arg(value.as_str());
        }
        cmd.arg(BODY_FIELD).arg(message.body.as_slice());
        cmd
    }
}

#[async_trait::async_trait]
impl Sink for RedisSink {
    async fn send(
        &self,
        message: Outgoing<'_>,
        limit: Duration,
    ) -> Result<AttemptResult, Unsendable> {
        let stream = self
            .stream
            .render(&message.placed)
            .map_err(Unsendable::InvalidName)?;
        let cmd = self.xadd(&stream, &message);
        let mut number = None;
        let attempt = async {
            let (n, mut connection) = self.connection().await.map_err(Failure::Connect)?;
            number = Some(n);
            cmd.query_async::<String>(&mut connection)
                .await
                .map_err(Failure::Command)
        };
        let result = match tokio::time::timeout(limit, attempt).await {
            Ok(Ok(_entry_id)) => return Ok(AttemptResult::Delivered { status: None }),
            Ok(Err(failure)) => failure.judge(&stream),
            Err(_) => AttemptResult::TimedOut {
                after_s: self.timeout_s,
            },
        };
        // A failed or slow connection may be broken in ways the client cannot see: the
        // next attempt starts on a new one.
        if let Some(n) = number {
            self.forget(n).await;
        }
        Ok(result)
    }

    async fn prepare(&self, limit: Duration) -> Result<(), Unready> {
        let checked = async {
            let (_, mut connection) = self.connection().await.map_err(Failure::Connect)?;
            let _: String = ::redis::cmd("PING")
                .query_async(&mut connection)
                .await
                .map_err(Failure::Command)?;
            if !self.stream.is_fixed() {
                return Ok(None);
            }
            // A fixed name can be checked now: a key of another type would refuse every
            // XADD with WRONGTYPE, which the log says at once.
            let key = self.stream.as_str();
            let kind: String = ::redis::cmd("TYPE")
                .arg(key)
                .query_async(&mut connection)
                .await
                .map_err(Failure::Command)?;
            Ok::<_, Failure>(Some(kind))
        };
        match tokio::time::timeout(limit, checked).await {
            Ok(Ok(Some(kind))) if kind != "stream" && kind != "none" => Err(Unready::Missing {
                key: "stream",
                why: format!(
                    "{:?} names a Redis key that holds a {kind}, not a stream",
                    self.stream.as_str()
                ),
            }),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(failure)) => {
                self.connection.lock().await.1 = None;
                Err(Unready::Unreachable(
                    failure.judge(self.stream.as_str()).describe(),
                ))
            }
            Err(_) => {
                self.connection.lock().await.1 = None;
                Err(Unready::Unreachable(format!(
                    "no answer from Redis within {} s",
                    self.timeout_s
                )))
            }
        }
    }
}

/// How an attempt failed before the timeout.
#[derive(Debug)]
enum Failure {
    /// No connection could be made (TCP, TLS, or the setup's AUTH or SELECT).
    Connect(RedisError),
    /// The command failed on a connection.
    Command(RedisError),
}

impl Failure {
    /// The attempt's result: a server's error answer declines like a 5xx (docs/contract.md,
    /// sinks: Redis errors count toward the circuit), WRONGTYPE naming the key; a broken or
    /// missing connection is a connection failure. `stream` is the key the message was for.
    fn judge(&self, stream: &str) -> AttemptResult {
        match self {
            Failure::Connect(err) => AttemptResult::ConnectionFailed(describe(err)),
            Failure::Command(err) if err.code() == Some("WRONGTYPE") => AttemptResult::declined(
                DeclineKind::ServerError,
                format!("the Redis key {stream:?} holds another type than a stream (WRONGTYPE)"),
            ),
            Failure::Command(err) if from_the_server(err) => AttemptResult::declined(
                DeclineKind::ServerError,
                format!("Redis answered: {}", describe(err)),
            ),
            Failure::Command(err) => AttemptResult::ConnectionFailed(describe(err)),
        }
    }
}

/// Whether `err` is the server's answer (an error reply), not the connection's failure.
fn from_the_server(err: &RedisError) -> bool {
    !matches!(
        err.kind(),
        ErrorKind::IoError
            | ErrorKind::ClientError
            | ErrorKind::ParseError
            | ErrorKind::InvalidClientConfig
    )
}

/// An error as the attempt history shows it: the server's code and words, or the I/O
/// error (the client's own text, `desc- Kind`, is for its developers). The client's errors
/// never hold the URL (the sink connects by host and port itself), nor the password.
fn describe(err: &RedisError) -> String {
    if err.is_io_error() {
        return describe_error(err);
    }
    match (err.code(), err.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (None, Some(detail)) => format!("{}: {detail}", err.category()),
        (Some(code), None) => code.to_owned(),
        #[allow(deprecated)] // the only accessor of the client's description
        (None, None) => std::error::Error::description(err).to_owned(),
    }
}

/// What is wrong with a URL, without the URL (the client's error text does not hold it).
fn url_problem(err: &RedisError) -> String {
    match err.detail() {
        Some(detail) => format!("is not a Redis URL inhook can use: {detail}"),
        None => format!("is not a Redis URL inhook can use: {err}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::template::Placed;

    /// The error a server's error reply `line` (`-CODE detail`) becomes, as read off the wire.
    fn server_error(line: &str) -> RedisError {
        ::redis::parse_redis_value(format!("-{line}\r\n").as_bytes())
            .expect("an error reply")
            .extract_error()
            .expect_err("an error")
    }

    #[test]
    fn wrongtype_declines_like_a_server_error_and_names_the_key() {
        let err = server_error("WRONGTYPE Operation against a key holding the wrong kind of value");
        let result = Failure::Command(err).judge("webhooks:stripe");
        assert_eq!(
            result,
            AttemptResult::declined(
                DeclineKind::ServerError,
                "the Redis key \"webhooks:stripe\" holds another type than a stream (WRONGTYPE)"
            )
        );
        let err = server_error("ERR max_len out of range");
        assert_eq!(
            Failure::Command(err).judge("s"),
            AttemptResult::declined(
                DeclineKind::ServerError,
                "Redis answered: ERR max_len out of range"
            )
        );
        assert!(
            result.counts_against_circuit(),
            "Redis errors count toward the circuit"
        );
    }

    #[test]
    fn other_server_errors_are_server_errors_and_open_the_circuit() {
        for err in [
            server_error("OOM command not allowed when used memory > 'maxmemory'"),
            server_error("READONLY You can't write against a read only replica."),
            server_error("LOADING Redis is loading the dataset in memory"),
            server_error("ERR something else"),
        ] {
            let result = Failure::Command(err).judge("s");
            let AttemptResult::Declined(decline) = &result else {
                panic!("{result:?}")
            };
            assert_eq!(decline.kind, DeclineKind::ServerError);
            assert!(decline.reason.starts_with("Redis answered: "), "{result:?}");
            assert!(result.counts_against_circuit());
        }
    }

    #[test]
    fn a_broken_or_missing_connection_is_a_connection_failure() {
        let refused: RedisError =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused").into();
        assert_eq!(
            Failure::Connect(refused).judge("s"),
            AttemptResult::ConnectionFailed("refused".to_owned())
        );
        let broken: RedisError =
            std::io::Error::new(std::io::ErrorKind::BrokenPipe, "broken pipe").into();
        assert!(matches!(
            Failure::Command(broken).judge("s"),
            AttemptResult::ConnectionFailed(_)
        ));
        // An AUTH refused while connecting: no message can be sent until it is fixed.
        let auth = server_error("WRONGPASS invalid username-password pair");
        assert_eq!(
            Failure::Connect(auth).judge("s"),
            AttemptResult::ConnectionFailed("WRONGPASS invalid username-password pair".to_owned())
        );
        let setup: RedisError = (
            ErrorKind::AuthenticationFailed,
            "Password authentication failed",
        )
            .into();
        assert_eq!(
            Failure::Connect(setup).judge("s"),
            AttemptResult::ConnectionFailed("Password authentication failed".to_owned())
        );
    }

    fn destination(
        url: &str,
        stream: &str,
        max_len: Option<u64>,
    ) -> (DestinationConfig, RedisTarget) {
        let text = format!(
            "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\n\
             [[destinations]]\nname = \"r\"\ntype = \"redis\"\nurl = \"{url}\"\n\
             sources = [\"p\"]\nstream = \"{stream}\"\n{}",
            max_len
                .map(|n| format!("max_len = {n}\n"))
                .unwrap_or_default()
        );
        let config =
            crate::config::Config::from_parts(Some(&text), &Default::default()).expect("config");
        let destination = config.destinations[0].clone();
        let crate::config::Target::Redis(target) = destination.target.clone() else {
            panic!("not redis")
        };
        (destination, target)
    }

    #[test]
    fn every_header_is_a_field_then_the_body_byte_for_byte() {
        let (d, t) = destination("redis://127.0.0.1:6379/0", "webhooks:{source}", Some(1000));
        let sink = RedisSink::new(&d, &t).unwrap();
        let message = Outgoing {
            headers: vec![
                ("webhook-id", "msg_1".to_owned()),
                ("inhook-aggregate", "player-7".to_owned()),
                ("content-type", "application/json".to_owned()),
            ],
            body: b"{\"a\":1}\xff".to_vec(),
            placed: Placed {
                source: "stripe",
                aggregate: "player-7",
                event_type: "",
            },
            event_id: "evt_1",
            sequence: 1,
        };
        let packed = sink.xadd("webhooks:stripe", &message).get_packed_command();
        let expected = ::redis::cmd("XADD")
            .arg("webhooks:stripe")
            .arg("MAXLEN")
            .arg("~")
            .arg(1000)
            .arg("*")
            .arg("webhook-id")
            .arg("msg_1")
            .arg("inhook-aggregate")
            .arg("player-7")
            .arg("content-type")
            .arg("application/json")
            .arg("body")
            .arg(&b"{\"a\":1}\xff"[..])
            .get_packed_command();
        assert_eq!(packed, expected);
    }

    #[test]
    fn the_url_is_read_without_io_and_never_shown() {
        let (d, t) = destination("rediss://user:hunter2@cache.example:6380/3", "s", None);
        let sink = RedisSink::new(&d, &t).unwrap();
        assert_eq!((sink.host.as_str(), sink.port), ("cache.example", 6380));
        assert!(sink.tls.is_some());
        assert_eq!(sink.login.db, 3);
        assert_eq!(sink.login.password.as_deref(), Some("hunter2"));
        assert!(!format!("{sink:?}").contains("hunter2"));
        let (d, t) = destination("redis://user:hunter2@127.0.0.1/x", "s", None);
        let err = RedisSink::new(&d, &t).unwrap_err().to_string();
        assert!(err.starts_with("url "), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
}
