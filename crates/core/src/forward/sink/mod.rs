//! Where forwarded events go (docs/forwarding.md, sinks): one module per destination type,
//! each behind [`Sink`]. The sender's loop (claims under a lease, the circuit, verdicts)
//! and the store do not know the type; a sink only sends one message and says how the
//! attempt ended.

pub mod http;
pub mod in_process;
pub mod nats;
pub mod rabbitmq;
pub mod redis;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::template::{Placed, RenderError};
use crate::config::{DestinationConfig, Target};
use crate::forward::answer::AttemptResult;

/// One forwarded event as a sink sends it: its headers (Standard Webhooks and `inhook-*`),
/// its body byte for byte, and the values its name templates are filled with.
#[derive(Debug, Clone)]
pub struct Outgoing<'a> {
    /// The headers, names lower case, values already encoded for the wire.
    pub headers: Vec<(&'static str, String)>,
    /// The event's raw body.
    pub body: Vec<u8>,
    /// The source, aggregate and event type a subject, routing key or stream is named by.
    pub placed: Placed<'a>,
    /// The logged event_id (an alert notice: its `webhook-id`), for an in-process consumer.
    pub event_id: &'a str,
    /// The logged sequence (an alert notice: 0), for an in-process consumer.
    pub sequence: i64,
}

/// A message that cannot be sent at all: a bug, or a name its broker cannot take,
/// reported (and the delivery given up, not retried) rather than sent unsigned, altered
/// or elsewhere. Never holds a header's value.
#[derive(Debug, thiserror::Error)]
pub enum Unsendable {
    /// A header value the transport cannot carry (a bug: values are encoded).
    #[error("cannot build the request: header {0} is invalid")]
    Header(&'static str),
    /// A value made the subject, routing key or stream name one the broker refuses.
    #[error("invalid_destination_name: {0}")]
    InvalidName(#[from] RenderError),
}

impl Unsendable {
    /// The dead delivery's `last_error` (docs/forwarding.md, sinks): the reason alone, the
    /// details going to the log.
    pub fn reason(&self) -> &'static str {
        match self {
            Unsendable::Header(_) => "cannot build the request: a header is invalid",
            Unsendable::InvalidName(_) => "invalid_destination_name",
        }
    }
}

/// Why a sink is not ready to send, found when the node starts. Neither stops the start
/// (docs/forwarding.md, sinks): deliveries retry until the broker can take them, and the log
/// says why they cannot yet.
#[derive(Debug, thiserror::Error)]
pub enum Unready {
    /// The broker lacks what a key names (a stream or exchange that does not exist and
    /// may not be created): each attempt fails until someone creates it.
    #[error("{key} {why}")]
    Missing {
        /// The destination's key at fault.
        key: &'static str,
        /// The words after the key.
        why: String,
    },
    /// The broker could not be reached (never the URL or its credentials).
    #[error("{0}")]
    Unreachable(String),
}

/// One destination's transport.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Sends `message`, ending within `limit`; how the attempt ended, or why the message
    /// cannot be sent at all.
    async fn send(
        &self,
        message: Outgoing<'_>,
        limit: Duration,
    ) -> Result<AttemptResult, Unsendable>;

    /// Connects and checks what the destination's keys name (a stream, an exchange),
    /// creating it where the configuration allows (`create_stream`, `declare`), within `limit`.
    async fn prepare(&self, _limit: Duration) -> Result<(), Unready> {
        Ok(())
    }
}

/// Why a destination's sink could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The HTTP client (its TLS setup) could not be built.
    #[error(transparent)]
    Http(#[from] http::HttpClientError),
    /// A NATS destination's URL or TLS setup cannot be used.
    #[error(transparent)]
    Nats(#[from] nats::NatsSinkError),
    /// A Redis destination's URL or TLS setup cannot be used.
    #[error(transparent)]
    Redis(#[from] redis::RedisSinkError),
    /// An in-process destination with no consumer bound to it in this process.
    #[error(
        "type = \"in_process\" needs a consumer bound in code by the service that embeds \
         inhook (docs/library.md); none is bound to it here"
    )]
    NoConsumer,
}

/// Builds the sinks of destinations, sharing what they can (one HTTP client per `tls_ca_file`).
#[derive(Default)]
pub struct Sinks {
    http_clients: Vec<(Option<PathBuf>, reqwest::Client)>,
    /// The consumers of in-process destinations, by destination name.
    consumers: std::collections::HashMap<String, in_process::Consumer>,
}

impl std::fmt::Debug for Sinks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sinks")
            .field("http_clients", &self.http_clients.len())
            .field("consumers", &self.consumers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Sinks {
    /// Sinks whose in-process destinations call `consumers` (by destination name).
    pub fn with_consumers(
        consumers: std::collections::HashMap<String, in_process::Consumer>,
    ) -> Self {
        Self {
            consumers,
            ..Self::default()
        }
    }

    /// The sink of `destination`, by its type.
    pub fn for_destination(
        &mut self,
        destination: &DestinationConfig,
    ) -> Result<Arc<dyn Sink>, SinkError> {
        Ok(match &destination.target {
            Target::Http => Arc::new(http::HttpSink {
                client: self.http_client(destination.tls_ca_file.as_ref())?,
                url: destination.url.clone(),
                timeout_s: destination.timeout_s,
            }),
            Target::Nats(target) => Arc::new(nats::NatsSink::new(destination, target)?),
            Target::Rabbitmq(target) => Arc::new(rabbitmq::RabbitmqSink::new(destination, target)),
            Target::Redis(target) => Arc::new(redis::RedisSink::new(destination, target)?),
            Target::InProcess => {
                let consumer = self.consumers.get(&destination.name).cloned();
                let consumer = consumer.ok_or(SinkError::NoConsumer)?;
                Arc::new(in_process::InProcessSink::new(&destination.name, consumer))
            }
        })
    }

    /// The HTTP client of `tls_ca_file`, built at its first use.
    fn http_client(
        &mut self,
        tls_ca_file: Option<&PathBuf>,
    ) -> Result<reqwest::Client, http::HttpClientError> {
        if let Some((_, client)) = self
            .http_clients
            .iter()
            .find(|(ca, _)| ca.as_ref() == tls_ca_file)
        {
            return Ok(client.clone());
        }
        let client = http::http_client(tls_ca_file.map(PathBuf::as_path))?;
        self.http_clients
            .push((tls_ca_file.cloned(), client.clone()));
        Ok(client)
    }
}
