//! `type = "in_process"` (docs/library.md): the destination whose "send" is a consumer in
//! the service that embeds inhook — an async callback, or a stream the service acks from.
//! The sender's queue (claims under a lease, one delivery per aggregate at a time in
//! applied order, retries with backoff, dead state) applies unchanged: the consumer only
//! says whether it took the event.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::{Outgoing, Sink, Unsendable};
use crate::forward::answer::{AttemptResult, DeclineKind};

/// One applied event as the service's consumer receives it: what the forwarding headers
/// say of it, and its body byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The destination it was forwarded to.
    pub destination: Arc<str>,
    /// Its stable id (`msg_…`, the same on every attempt and replay): the key a consumer
    /// that must not act twice dedups by (docs/forwarding.md, `webhook-id`).
    pub webhook_id: String,
    /// The source it came from.
    pub source: String,
    /// The publisher's event id.
    pub event_id: String,
    /// Its type; empty when its source has none.
    pub event_type: String,
    /// Its aggregate, in text form (docs/contract.md, json sources): events of one
    /// aggregate arrive one at a time, in `sequence` order.
    pub aggregate: String,
    /// Its sequence within the aggregate.
    pub sequence: i64,
    /// This attempt, from 1: above 1, an earlier attempt failed or timed out.
    pub attempt: u32,
    /// The body's media type (`application/json` unless its source reads forms).
    pub content_type: String,
    /// The body as received.
    pub body: bytes::Bytes,
}

impl Applied {
    /// The body parsed as JSON.
    pub fn json(&self) -> serde_json::Result<serde_json::Value> {
        serde_json::from_slice(&self.body)
    }

    /// Builds it from a forwarded message, for `destination`.
    fn of(destination: &Arc<str>, message: Outgoing<'_>) -> Self {
        let header = |name: &str| {
            message
                .headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        Applied {
            destination: Arc::clone(destination),
            webhook_id: header("webhook-id"),
            source: message.placed.source.to_owned(),
            event_id: message.event_id.to_owned(),
            event_type: message.placed.event_type.to_owned(),
            aggregate: message.placed.aggregate.to_owned(),
            sequence: message.sequence,
            attempt: header("inhook-attempt").parse().unwrap_or(1),
            content_type: header("content-type"),
            body: message.body.into(),
        }
    }
}

/// What a consumer's future resolves to: `Ok` takes the event; an error is retried with the
/// destination's backoff, and after `max_attempts` the delivery is dead with its message.
pub type ConsumerResult = anyhow::Result<()>;

/// A consumer as the sink holds it.
pub type Consumer =
    Arc<dyn Fn(Applied) -> Pin<Box<dyn Future<Output = ConsumerResult> + Send>> + Send + Sync>;

/// Most bytes of a consumer's error kept as the attempt's result.
const ERROR_CHARS: usize = 300;

/// The sink of one in-process destination.
pub struct InProcessSink {
    destination: Arc<str>,
    consumer: Consumer,
}

impl std::fmt::Debug for InProcessSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InProcessSink")
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

impl InProcessSink {
    /// The sink of `destination`, calling `consumer`.
    pub fn new(destination: &str, consumer: Consumer) -> Self {
        Self {
            destination: destination.into(),
            consumer,
        }
    }
}

#[async_trait::async_trait]
impl Sink for InProcessSink {
    async fn send(
        &self,
        message: Outgoing<'_>,
        limit: Duration,
    ) -> Result<AttemptResult, Unsendable> {
        let applied = Applied::of(&self.destination, message);
        // A task of its own: a panic is one failed attempt, not a dead sender, and a
        // consumer past the limit is stopped before the lease runs out.
        let task = tokio::spawn((self.consumer)(applied));
        let stop = task.abort_handle();
        Ok(match tokio::time::timeout(limit, task).await {
            Ok(Ok(Ok(()))) => AttemptResult::Delivered { status: None },
            Ok(Ok(Err(err))) => {
                let mut reason: String = format!("{err:#}").chars().take(ERROR_CHARS).collect();
                reason.insert_str(0, "the consumer failed: ");
                // The consumer is up and refused this event: it retries on its own backoff,
                // the circuit stays closed for the other aggregates.
                AttemptResult::declined(DeclineKind::Refused, reason)
            }
            Ok(Err(join)) if join.is_panic() => {
                AttemptResult::declined(DeclineKind::Refused, "the consumer panicked")
            }
            Ok(Err(_)) => AttemptResult::ConnectionFailed("the consumer was cancelled".into()),
            Err(_) => {
                stop.abort();
                AttemptResult::TimedOut {
                    after_s: limit.as_secs().max(1),
                }
            }
        })
    }
}

/// An applied event waiting for the service's answer, from [`AppliedEvents`]: [`Pending::ack`]
/// takes it; [`Pending::nack`], or dropping it, has it sent again after the backoff.
#[derive(Debug)]
pub struct Pending {
    /// The event.
    pub event: Applied,
    /// Dropped unanswered, the consumer's future sees it closed and fails the attempt.
    answer: oneshot::Sender<Result<(), String>>,
}

impl Pending {
    /// Takes the event: it is delivered and never sent to this destination again.
    pub fn ack(self) {
        let _ = self.answer.send(Ok(()));
    }

    /// Refuses it for `reason`: it is sent again after the destination's backoff.
    pub fn nack(self, reason: impl std::fmt::Display) {
        let _ = self.answer.send(Err(reason.to_string()));
    }
}

impl std::ops::Deref for Pending {
    type Target = Applied;

    fn deref(&self) -> &Applied {
        &self.event
    }
}

/// The applied events of an in-process destination, read as a stream (also
/// [`futures_util::Stream`]). Each comes once it is the next of its aggregate; the next of
/// that aggregate waits for its ack (or its `timeout_s`, after which it is sent again).
#[derive(Debug)]
pub struct AppliedEvents {
    events: mpsc::Receiver<Pending>,
}

impl AppliedEvents {
    /// The stream, and the consumer that feeds it.
    pub fn channel() -> (Self, Consumer) {
        // The sender already bounds what is outstanding (its `concurrency`): one slot
        // only makes each send wait until the stream has room.
        let (tx, events) = mpsc::channel::<Pending>(1);
        let consumer: Consumer = Arc::new(move |event| {
            let tx = tx.clone();
            Box::pin(async move {
                let (answer, answered) = oneshot::channel();
                let pending = Pending { event, answer };
                if tx.send(pending).await.is_err() {
                    anyhow::bail!("no one reads the stream of applied events");
                }
                match answered.await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(reason)) => Err(anyhow::anyhow!(reason)),
                    Err(_) => anyhow::bail!("the event was dropped without an ack"),
                }
            })
        });
        (Self { events }, consumer)
    }

    /// The next applied event; `None` once the instance has stopped.
    pub async fn recv(&mut self) -> Option<Pending> {
        self.events.recv().await
    }
}

impl futures_util::Stream for AppliedEvents {
    type Item = Pending;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Pending>> {
        self.events.poll_recv(cx)
    }
}
