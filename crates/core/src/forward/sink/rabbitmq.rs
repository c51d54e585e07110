//! The RabbitMQ sink (docs/forwarding.md, sinks): each message is published to the destination's
//! `exchange` with its rendered `routing_key`, persistent (delivery mode 2), `mandatory` and
//! with `message_id` = `webhook-id`, on a channel in publisher-confirm mode. It is delivered
//! when the broker confirms it; a message no queue is bound for comes back and is a refusal,
//! never a silent drop.
//!
//! One connection and one confirm channel per destination, opened on first use and shared by
//! the destination's concurrent sends (lapin multiplexes them and matches each confirm to its
//! publish); after any failure they are dropped, and the next attempt connects anew.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::tcp::{AsyncTcpStream, RustlsConnector};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::Mutex;

use super::{Outgoing, Sink, Unready, Unsendable};
use crate::config::target::RabbitmqTarget;
use crate::config::template::Template;
use crate::config::DestinationConfig;
use crate::forward::answer::{AttemptResult, DeclineKind};
use crate::forward::outbound::describe_error;

/// The AMQP persistent delivery mode: the broker writes the message to disk (in a durable
/// queue) before it confirms it.
const PERSISTENT: u8 = 2;

/// A destination of `type = "rabbitmq"`.
pub struct RabbitmqSink {
    /// The broker's URL; it may hold credentials, so it is never shown (not even by `Debug`).
    url: String,
    /// The PEM CA file trusted on top of the system's roots, for `amqps://`.
    tls_ca_file: Option<PathBuf>,
    /// The exchange messages are published to.
    exchange: String,
    /// The routing key, per message.
    routing_key: Template,
    /// Whether `prepare` declares the exchange (durable, topic).
    declare: bool,
    /// The destination's `timeout_s`, named when an attempt times out.
    timeout_s: u64,
    /// The open connection and confirm channel, if any.
    link: Mutex<Option<Arc<Link>>>,
}

impl std::fmt::Debug for RabbitmqSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitmqSink")
            .field("exchange", &self.exchange)
            .field("routing_key", &self.routing_key.as_str())
            .field("declare", &self.declare)
            .finish_non_exhaustive()
    }
}

/// One connection and its confirm channel; the connection is closed when the last is dropped.
struct Link {
    connection: Connection,
    channel: Channel,
}

impl Link {
    fn is_open(&self) -> bool {
        self.connection.status().connected() && self.channel.status().connected()
    }
}

/// Why a connection could not be opened: the CA file is a configuration error, the rest is
/// the broker being unreachable (or refusing the login), which a later attempt may get past.
#[derive(Debug)]
enum ConnectError {
    CaFile(String),
    Failed(String),
}

impl ConnectError {
    fn into_description(self) -> String {
        match self {
            ConnectError::CaFile(why) => format!("tls_ca_file {why}"),
            ConnectError::Failed(why) => why,
        }
    }
}

impl RabbitmqSink {
    /// The sink of `destination`, whose target is `target`; connects on first use.
    pub fn new(destination: &DestinationConfig, target: &RabbitmqTarget) -> Self {
        RabbitmqSink {
            url: destination.url.clone(),
            tls_ca_file: destination.tls_ca_file.clone(),
            exchange: target.exchange.clone(),
            routing_key: target.routing_key.clone(),
            declare: target.declare,
            timeout_s: destination.timeout_s,
            link: Mutex::new(None),
        }
    }

    /// The open link, or a new one. Held under the mutex while connecting, so that concurrent
    /// sends wait for one connection rather than each opening their own.
    async fn link(&self) -> Result<Arc<Link>, ConnectError> {
        let mut slot = self.link.lock().await;
        if let Some(link) = slot.as_ref().filter(|link| link.is_open()) {
            return Ok(Arc::clone(link));
        }
        *slot = None;
        let connection = self.connect().await?;
        let channel = connection
            .create_channel()
            .await
            .map_err(|err| ConnectError::Failed(self.describe(&err)))?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|err| ConnectError::Failed(self.describe(&err)))?;
        let link = Arc::new(Link {
            connection,
            channel,
        });
        *slot = Some(Arc::clone(&link));
        Ok(link)
    }

    /// Forgets `link` after a failure (unless another send already replaced it), so that the
    /// next attempt reconnects.
    async fn drop_link(&self, link: &Arc<Link>) {
        let mut slot = self.link.lock().await;
        if slot.as_ref().is_some_and(|open| Arc::ptr_eq(open, link)) {
            *slot = None;
        }
    }

    /// Opens a connection: TCP, then TLS through inhook's rustls config for `amqps://`.
    async fn connect(&self) -> Result<Connection, ConnectError> {
        let uri: AMQPUri = self
            .url
            .parse()
            .map_err(|_| ConnectError::Failed("the url is not an AMQP URL".to_owned()))?;
        let tls = match uri.scheme {
            AMQPScheme::AMQP => None,
            AMQPScheme::AMQPS => {
                let config = crate::forward::outbound::tls_client_config(
                    self.tls_ca_file.as_deref(),
                    "tls_ca_file",
                )
                .map_err(|err| {
                    let text = describe_error(&err);
                    ConnectError::CaFile(
                        text.strip_prefix("tls_ca_file ")
                            .unwrap_or(&text)
                            .to_owned(),
                    )
                })?;
                Some(Arc::new(RustlsConnector::from(config)))
            }
        };
        let runtime = lapin::runtime::default_runtime()
            .map_err(|err| ConnectError::Failed(self.describe(&err)))?;
        Connection::connector(
            uri,
            runtime,
            async move |uri: AMQPUri, runtime| {
                let host = uri.authority.host.as_str();
                let addresses: Vec<std::net::SocketAddr> =
                    tokio::net::lookup_host((host, uri.authority.port))
                        .await?
                        .collect();
                let stream = AsyncTcpStream::connect(&runtime, addresses).await?;
                Ok(match &tls {
                    None => stream,
                    Some(connector) => stream.into_rustls(connector, &uri.authority.host).await?,
                })
            },
            ConnectionProperties::default()
                .with_connection_name(concat!("inhook/", env!("CARGO_PKG_VERSION")).into()),
        )
        .await
        .map_err(|err| ConnectError::Failed(self.describe(&err)))
    }

    /// An error as words, with the URL's password (should a library ever put it there)
    /// masked.
    fn describe(&self, err: &lapin::Error) -> String {
        scrub(broker_words(err), &self.url)
    }

    /// Publishes one message and waits for its confirm.
    async fn publish(
        &self,
        routing_key: &str,
        message: &Outgoing<'_>,
    ) -> Result<AttemptResult, Unsendable> {
        let link = match self.link().await {
            Ok(link) => link,
            Err(err) => return Ok(AttemptResult::ConnectionFailed(err.into_description())),
        };
        let published = link
            .channel
            .basic_publish(
                ShortString::from(self.exchange.as_str()),
                ShortString::from(routing_key),
                BasicPublishOptions {
                    mandatory: true,
                    ..BasicPublishOptions::default()
                },
                &message.body,
                properties(&message.headers),
            )
            .await;
        let confirmed = match published {
            Ok(confirm) => confirm.await,
            Err(err) => Err(err),
        };
        let result = match confirmed {
            Ok(confirmation) => self.judge(confirmation, routing_key),
            Err(err) => failure(&err, self.describe(&err)),
        };
        if !matches!(
            result,
            AttemptResult::Delivered { .. }
                | AttemptResult::Declined(crate::forward::answer::Decline {
                    kind: DeclineKind::Refused,
                    ..
                })
        ) {
            self.drop_link(&link).await;
        }
        Ok(result)
    }

    /// What the broker's confirm says of the message.
    fn judge(&self, confirmation: Confirmation, routing_key: &str) -> AttemptResult {
        match confirmation {
            Confirmation::Ack(None) => AttemptResult::Delivered { status: None },
            Confirmation::Ack(Some(_returned)) => AttemptResult::declined(
                DeclineKind::Refused,
                unroutable(&self.exchange, routing_key),
            ),
            Confirmation::Nack(_) => AttemptResult::declined(
                DeclineKind::ServerError,
                format!(
                    "the broker did not take the message (a negative acknowledgement) on exchange {:?}",
                    self.exchange
                ),
            ),
            // Confirms are selected on every channel this sink opens; without one, nothing
            // says the broker has the message.
            Confirmation::NotRequested => AttemptResult::declined(
                DeclineKind::ServerError,
                "the channel is not in confirm mode".to_owned(),
            ),
        }
    }

    /// Checks the exchange: declares it (durable, topic) when `declare` is set, else checks
    /// that it exists with a passive declare on a channel of its own (a missing exchange
    /// closes the channel it is asked on).
    async fn check_exchange(&self) -> Result<(), Unready> {
        let link = self.link().await.map_err(|err| match err {
            ConnectError::CaFile(why) => Unready::Missing {
                key: "tls_ca_file",
                why,
            },
            ConnectError::Failed(why) => Unready::Unreachable(why),
        })?;
        let channel = match link.connection.create_channel().await {
            Ok(channel) => channel,
            Err(err) => {
                self.drop_link(&link).await;
                return Err(Unready::Unreachable(self.describe(&err)));
            }
        };
        let options = ExchangeDeclareOptions {
            passive: !self.declare,
            durable: true,
            ..ExchangeDeclareOptions::default()
        };
        let declared = channel
            .exchange_declare(
                ShortString::from(self.exchange.as_str()),
                lapin::ExchangeKind::Topic,
                options,
                FieldTable::default(),
            )
            .await;
        match declared {
            Ok(()) => {
                let _ = channel.close(200, "OK".into()).await;
                Ok(())
            }
            Err(err) => match err.kind() {
                ErrorKind::ProtocolError(amqp) if !self.declare && is_not_found(amqp) => {
                    Err(Unready::Missing {
                        key: "exchange",
                        why: format!(
                            "{:?} does not exist on the broker (declare = true creates it)",
                            self.exchange
                        ),
                    })
                }
                ErrorKind::ProtocolError(amqp) if !is_connection_error(amqp) => {
                    Err(Unready::Missing {
                        key: "exchange",
                        why: format!(
                            "{:?} was refused by the broker: {}",
                            self.exchange,
                            scrub(amqp.get_message().to_string(), &self.url)
                        ),
                    })
                }
                _ => {
                    self.drop_link(&link).await;
                    Err(Unready::Unreachable(self.describe(&err)))
                }
            },
        }
    }
}

#[async_trait::async_trait]
impl Sink for RabbitmqSink {
    async fn send(
        &self,
        message: Outgoing<'_>,
        limit: Duration,
    ) -> Result<AttemptResult, Unsendable> {
        let routing_key = self
            .routing_key
            .render(&message.placed)
            .map_err(Unsendable::InvalidName)?;
        match tokio::time::timeout(limit, self.publish(&routing_key, &message)).await {
            Ok(result) => result,
            Err(_) => {
                // The confirm may still come; a later attempt must not wait behind this one's
                // connection, which may be the reason it is slow. Another send holding the
                // lock is connecting anew already, and this one must end now.
                if let Ok(mut slot) = self.link.try_lock() {
                    slot.take();
                }
                Ok(AttemptResult::TimedOut {
                    after_s: self.timeout_s,
                })
            }
        }
    }

    async fn prepare(&self, limit: Duration) -> Result<(), Unready> {
        match tokio::time::timeout(limit, self.check_exchange()).await {
            Ok(checked) => checked,
            Err(_) => Err(Unready::Unreachable(format!(
                "no answer from the broker within {} s",
                self.timeout_s
            ))),
        }
    }
}

/// The message's AMQP properties: persistent, `message_id` = `webhook-id`, `content_type`
/// from `content-type`, and every header (those two included) in the headers table, so a
/// consumer reads all of them in one place, as the HTTP destination would.
fn properties(headers: &[(&'static str, String)]) -> BasicProperties {
    let mut table = FieldTable::default();
    let mut properties = BasicProperties::default().with_delivery_mode(PERSISTENT);
    for (name, value) in headers {
        match *name {
            "webhook-id" => properties = properties.with_message_id(value.as_str().into()),
            "content-type" => properties = properties.with_content_type(value.as_str().into()),
            _ => {}
        }
        table.insert(
            ShortString::from(*name),
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    properties.with_headers(table)
}

/// A failed publish or confirm: the broker closing the channel or connection for a reason of
/// its own (a deleted exchange, a resource alarm) is a server error; anything else is the
/// connection failing.
fn failure(err: &lapin::Error, description: String) -> AttemptResult {
    match err.kind() {
        ErrorKind::ProtocolError(_) => {
            AttemptResult::declined(DeclineKind::ServerError, description)
        }
        _ => AttemptResult::ConnectionFailed(description),
    }
}

/// An error as words: the broker's own reply text for an AMQP error (`NOT_FOUND - no
/// exchange ...`, `ACCESS_REFUSED - Login was refused ...`), else the error and its causes.
fn broker_words(err: &lapin::Error) -> String {
    match err.kind() {
        ErrorKind::ProtocolError(amqp) => format!("the broker answered {}", amqp.get_message()),
        _ => describe_error(err),
    }
}

/// The refusal of a message no queue is bound for.
fn unroutable(exchange: &str, routing_key: &str) -> String {
    format!("no queue is bound to exchange {exchange:?} for routing key {routing_key:?} (the message was returned unroutable)")
}

fn is_not_found(err: &lapin::protocol::AMQPError) -> bool {
    matches!(
        err.kind(),
        lapin::protocol::AMQPErrorKind::Soft(lapin::protocol::AMQPSoftError::NOTFOUND)
    )
}

fn is_connection_error(err: &lapin::protocol::AMQPError) -> bool {
    matches!(err.kind(), lapin::protocol::AMQPErrorKind::Hard(_))
}

/// `text` with the password of `url`, if it holds one and `text` shows it, masked.
fn scrub(text: String, url: &str) -> String {
    let password = url
        .parse::<AMQPUri>()
        .ok()
        .map(|uri| uri.authority.userinfo.password)
        .filter(|password| password.len() >= 3);
    match password {
        Some(password) if text.contains(&password) => text.replace(&password, "***"),
        _ => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(props: &BasicProperties, name: &str) -> Option<String> {
        match props.headers().as_ref()?.inner().get(name)? {
            AMQPValue::LongString(value) => Some(value.to_string()),
            _ => None,
        }
    }

    #[test]
    fn every_header_goes_in_the_table_and_the_id_and_type_in_properties_too() {
        let headers = vec![
            ("webhook-id", "msg_1".to_owned()),
            ("inhook-sequence", "7".to_owned()),
            ("content-type", "application/json".to_owned()),
            ("webhook-signature", "v1,abc".to_owned()),
        ];
        let props = properties(&headers);
        assert_eq!(*props.delivery_mode(), Some(2));
        assert_eq!(props.message_id().as_ref().unwrap().as_str(), "msg_1");
        assert_eq!(
            props.content_type().as_ref().unwrap().as_str(),
            "application/json"
        );
        for (name, value) in &headers {
            assert_eq!(
                header(&props, name).as_deref(),
                Some(value.as_str()),
                "{name}"
            );
        }
        assert_eq!(props.headers().as_ref().unwrap().inner().len(), 4);
    }

    #[test]
    fn broker_errors_are_server_errors_and_the_rest_connection_failures() {
        let io: lapin::Error = std::io::Error::other("reset").into();
        assert!(matches!(
            failure(&io, "IO error: reset".into()),
            AttemptResult::ConnectionFailed(text) if text == "IO error: reset"
        ));
        let amqp: lapin::Error = ErrorKind::ProtocolError(lapin::protocol::AMQPError::new(
            lapin::protocol::AMQPErrorKind::Soft(lapin::protocol::AMQPSoftError::NOTFOUND),
            "NOT_FOUND - no exchange 'x'".into(),
        ))
        .into();
        assert_eq!(
            broker_words(&amqp),
            "the broker answered NOT_FOUND - no exchange 'x'"
        );
        match failure(&amqp, "protocol error".into()) {
            AttemptResult::Declined(decline) => assert_eq!(decline.kind, DeclineKind::ServerError),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unroutable_message_names_the_exchange_and_routing_key() {
        let text = unroutable("webhooks", "stripe.cus_1");
        assert!(text.contains("\"webhooks\""), "{text}");
        assert!(text.contains("\"stripe.cus_1\""), "{text}");
    }

    #[test]
    fn a_password_never_shows_in_a_description() {
        let url = "amqp://inhook:s3cr3t-pw@broker:5672/%2f";
        assert_eq!(
            scrub("login s3cr3t-pw refused".into(), url),
            "login *** refused"
        );
        assert_eq!(scrub("refused".into(), url), "refused");
        assert_eq!(
            scrub("x".into(), "not a url"),
            "x",
            "an unparsable URL leaves the text as it is"
        );
    }

    #[test]
    fn the_debug_form_does_not_show_the_url() {
        let sink = RabbitmqSink {
            url: "amqp://u:hunter22@h/%2f".into(),
            tls_ca_file: None,
            exchange: "webhooks".into(),
            routing_key: Template::parse(
                "{source}",
                crate::config::template::NameSyntax::AmqpRoutingKey,
            )
            .unwrap(),
            declare: false,
            timeout_s: 1,
            link: Mutex::new(None),
        };
        let shown = format!("{sink:?}");
        assert!(!shown.contains("hunter22"), "{shown}");
        assert!(shown.contains("webhooks"), "{shown}");
    }
}
