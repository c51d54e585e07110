//! Where notices go (docs/configuration.md, alerts): one task per channel takes its notices
//! in the order they were decided and sends each until it is taken or its attempts run out,
//! backing off as forwarded events do, before the next. A notice is not queued in the store
//! (a restart forgets those not yet sent; the history keeps them all).
//!
//! To a `[[destinations]]` entry a notice goes through that destination's sink (HTTP, NATS,
//! RabbitMQ, Redis), signed with Standard Webhooks under its secret as events are, with a
//! `webhook-id` derived from the alert, so a retried notice carries the same id.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tracing::{info, warn};

use super::notice::{email_text, headline, slack_message, NoticeBody};
use crate::config::alerts::Channel;
use crate::config::template::Placed;
use crate::config::{Config, DestinationConfig, LiveSecrets};
use crate::forward::answer::AttemptResult;
use crate::forward::message::WebhookId;
use crate::retry::{NextStep, RetryPolicy};
use crate::signature::{try_sign, Scheme, Secret};
use crate::sink::{Outgoing, Sink, Sinks};
use crate::store::alerts::AlertRecord;

/// The event type a notice is placed under (a subject or stream template's `{event_type}`).
pub const NOTICE_EVENT_TYPE: &str = "inhook.alert";
/// How long one Slack or SMTP attempt may take.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);

/// Why one attempt did not deliver a notice.
#[derive(Debug)]
enum Failed {
    /// Worth another attempt.
    Retry(String),
    /// No attempt will do better.
    Final(String),
}

/// One channel's transport.
enum Transport {
    Destination {
        destination: Arc<DestinationConfig>,
        sink: Arc<dyn Sink>,
        secrets: LiveSecrets,
    },
    Slack {
        client: reqwest::Client,
        url: Secret,
    },
    Email {
        transport: Box<lettre::AsyncSmtpTransport<lettre::Tokio1Executor>>,
        to: Vec<lettre::message::Mailbox>,
        from: lettre::message::Mailbox,
    },
}

impl Transport {
    /// What the log names the channel by (never a URL: Slack's and SMTP's hold credentials).
    fn name(&self) -> String {
        match self {
            Transport::Destination { destination, .. } => {
                format!("destination {}", destination.name)
            }
            Transport::Slack { .. } => "slack".into(),
            Transport::Email { .. } => "email".into(),
        }
    }

    async fn send(&self, alert: &AlertRecord, attempt: u32) -> Result<(), Failed> {
        match self {
            Transport::Destination {
                destination,
                sink,
                secrets,
            } => send_to_destination(destination, sink.as_ref(), secrets, alert, attempt).await,
            Transport::Slack { client, url } => {
                let url = std::str::from_utf8(url.expose())
                    .map_err(|_| Failed::Final("the webhook URL is not text".into()))?;
                let answer = client
                    .post(url)
                    .json(&slack_message(alert))
                    .timeout(ATTEMPT_LIMIT)
                    .send()
                    .await
                    // Without the URL: it is the webhook's credential.
                    .map_err(|err| {
                        Failed::Retry(crate::outbound::describe_error(&err.without_url()))
                    })?;
                judge_status(answer.status().as_u16())
            }
            Transport::Email {
                transport,
                to,
                from,
            } => {
                use lettre::AsyncTransport;
                let mut message = lettre::Message::builder()
                    .from(from.clone())
                    .subject(headline(alert));
                for mailbox in to {
                    message = message.to(mailbox.clone());
                }
                let message = message
                    .header(lettre::message::header::ContentType::TEXT_PLAIN)
                    .body(email_text(alert))
                    .map_err(|err| Failed::Final(format!("cannot build the email: {err}")))?;
                match tokio::time::timeout(ATTEMPT_LIMIT, transport.send(message)).await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(err)) if err.is_permanent() => {
                        Err(Failed::Final(format!("SMTP refused it: {err}")))
                    }
                    Ok(Err(err)) => Err(Failed::Retry(format!("SMTP: {err}"))),
                    Err(_) => Err(Failed::Retry("SMTP: no answer in time".into())),
                }
            }
        }
    }
}

/// A 2xx delivered, a 429 or 5xx is worth retrying, another answer is final.
fn judge_status(status: u16) -> Result<(), Failed> {
    match status {
        200..=299 => Ok(()),
        408 | 429 | 500..=599 => Err(Failed::Retry(format!("HTTP {status}"))),
        _ => Err(Failed::Final(format!("HTTP {status}"))),
    }
}

async fn send_to_destination(
    destination: &DestinationConfig,
    sink: &dyn Sink,
    secrets: &LiveSecrets,
    alert: &AlertRecord,
    attempt: u32,
) -> Result<(), Failed> {
    let body = serde_json::to_vec(&NoticeBody::of(alert))
        .map_err(|err| Failed::Final(format!("cannot encode the notice: {err}")))?;
    let subject = alert
        .source
        .as_deref()
        .or(alert.destination.as_deref())
        .unwrap_or("");
    // One id per notice, the same on every attempt: the receiver drops a repeat it took.
    let webhook_id = WebhookId::of(
        "inhook.alerts",
        &format!("{}/{subject}/{}/{}", alert.alert, alert.state, alert.at_ms),
    );
    let secret = secrets
        .destination(&destination.name)
        .filter(|secret| !secret.expose().is_empty());
    let mut headers = vec![("content-type", "application/json".to_owned())];
    match &secret {
        Some(secret) => headers.extend(
            try_sign(
                Scheme::StandardWebhooks,
                &body,
                secret,
                crate::clock::now_ms() / 1000,
                Some(webhook_id.as_str()),
            )
            .map_err(|err| Failed::Final(format!("cannot sign the notice: {err}")))?,
        ),
        None if destination.target.requires_secret() => {
            return Err(Failed::Final(
                "the destination has no secret in force".into(),
            ))
        }
        None => headers.push(("webhook-id", webhook_id.as_str().to_owned())),
    }
    headers.push(("inhook-alert", alert.alert.clone()));
    headers.push(("inhook-alert-state", alert.state.clone()));
    headers.push(("inhook-attempt", attempt.to_string()));
    let message = Outgoing {
        headers,
        body,
        placed: Placed {
            source: alert.source.as_deref().unwrap_or("inhook"),
            aggregate: &alert.alert,
            event_type: NOTICE_EVENT_TYPE,
        },
        event_id: webhook_id.as_str(),
        sequence: 0,
    };
    let limit = Duration::from_secs(destination.timeout_s.max(1));
    match sink.send(message, limit).await {
        Ok(AttemptResult::Delivered { .. }) => Ok(()),
        Ok(other) => Err(Failed::Retry(other.describe())),
        Err(unsendable) => Err(Failed::Final(unsendable.reason().to_owned())),
    }
}

/// One channel's queue and what it sends with.
struct Lane {
    transport: Transport,
    retry: RetryPolicy,
    queue: mpsc::UnboundedReceiver<Arc<AlertRecord>>,
}

impl Lane {
    async fn run(mut self, mut stop: watch::Receiver<bool>) {
        loop {
            let alert = tokio::select! {
                next = self.queue.recv() => match next {
                    Some(alert) => alert,
                    None => return,
                },
                _ = stop.changed() => return,
            };
            self.deliver(&alert, &mut stop).await;
        }
    }

    /// Sends `alert` until it is taken, refused for good, or out of attempts.
    async fn deliver(&self, alert: &AlertRecord, stop: &mut watch::Receiver<bool>) {
        let channel = self.transport.name();
        let mut attempt = 1;
        loop {
            let failure = match self.transport.send(alert, attempt).await {
                Ok(()) => {
                    info!(alert = %alert.alert, state = %alert.state, %channel, attempt, "alert notice sent");
                    return;
                }
                Err(Failed::Final(why)) => {
                    warn!(alert = %alert.alert, state = %alert.state, %channel, attempt, error = %why,
                          "alert notice refused; not sent again");
                    return;
                }
                Err(Failed::Retry(why)) => why,
            };
            let NextStep::RetryIn(delay_ms) = self.retry.after_failure(attempt, rand::random())
            else {
                warn!(alert = %alert.alert, state = %alert.state, %channel, attempt, error = %failure,
                      "alert notice not sent: no attempts left");
                return;
            };
            warn!(alert = %alert.alert, %channel, attempt, error = %failure, delay_ms,
                  "alert notice not sent; retrying");
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(delay_ms.max(0) as u64)) => {}
                _ = stop.changed() => return,
            }
            attempt += 1;
        }
    }
}

/// Why the channels could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// A destination's sink could not be built.
    #[error("alert {alert:?}: destination {destination:?}: {source}")]
    Sink {
        /// The rule.
        alert: String,
        /// The destination.
        destination: String,
        /// Why.
        source: Box<crate::sink::SinkError>,
    },
    /// The HTTP client of Slack notices could not be built.
    #[error("alert {0:?}: the HTTP client: {1}")]
    Http(String, Box<crate::sink::http::HttpClientError>),
    /// An SMTP URL lettre cannot use (the URL is not shown: it may hold a password).
    #[error("alert {0:?}: smtp_url cannot be used: {1}")]
    Smtp(String, String),
}

/// The channels of every rule, each with its queue: what the watcher hands notices to.
pub struct Outbox {
    /// Per rule, the queues of its channels.
    by_rule: Vec<Vec<mpsc::UnboundedSender<Arc<AlertRecord>>>>,
    lanes: Vec<Lane>,
}

impl Outbox {
    /// The channels of `config`'s rules; rules naming the same channel share its queue, so
    /// that its notices go in the order they were decided.
    pub fn of(config: &Config, secrets: &LiveSecrets) -> Result<Self, OutboxError> {
        let mut sinks = Sinks::default();
        let mut keys: Vec<(Channel, mpsc::UnboundedSender<Arc<AlertRecord>>)> = Vec::new();
        let mut lanes = Vec::new();
        let mut by_rule = Vec::with_capacity(config.alerts.len());
        for rule in config.alerts.iter() {
            let mut queues = Vec::new();
            for channel in &rule.channels {
                if let Some((_, queue)) = keys.iter().find(|(c, _)| c == channel) {
                    queues.push(queue.clone());
                    continue;
                }
                let (transport, retry) =
                    transport(config, secrets, &mut sinks, &rule.name, channel)?;
                let (queue, receiver) = mpsc::unbounded_channel();
                lanes.push(Lane {
                    transport,
                    retry,
                    queue: receiver,
                });
                keys.push((channel.clone(), queue.clone()));
                queues.push(queue);
            }
            by_rule.push(queues);
        }
        Ok(Self { by_rule, lanes })
    }

    /// Starts one task per channel until `stop`; the senders of their queues.
    pub fn start(
        self,
        tasks: &mut tokio::task::JoinSet<()>,
        stop: &watch::Receiver<bool>,
    ) -> Vec<Vec<mpsc::UnboundedSender<Arc<AlertRecord>>>> {
        for lane in self.lanes {
            tasks.spawn(lane.run(stop.clone()));
        }
        self.by_rule
    }
}

fn transport(
    config: &Config,
    secrets: &LiveSecrets,
    sinks: &mut Sinks,
    rule: &str,
    channel: &Channel,
) -> Result<(Transport, RetryPolicy), OutboxError> {
    Ok(match channel {
        Channel::Destination(name) => {
            let destination = config
                .destination(name)
                .expect("validated: the destination is configured");
            let sink = sinks
                .for_destination(destination)
                .map_err(|source| OutboxError::Sink {
                    alert: rule.to_owned(),
                    destination: name.clone(),
                    source: Box::new(source),
                })?;
            (
                Transport::Destination {
                    destination: Arc::new(destination.clone()),
                    sink,
                    secrets: secrets.clone(),
                },
                destination.retry,
            )
        }
        Channel::Slack(url) => (
            Transport::Slack {
                client: crate::sink::http::http_client(None)
                    .map_err(|err| OutboxError::Http(rule.to_owned(), Box::new(err)))?,
                url: url.clone(),
            },
            config.retry,
        ),
        Channel::Email { smtp_url, to, from } => {
            let url = std::str::from_utf8(smtp_url.expose())
                .map_err(|_| OutboxError::Smtp(rule.to_owned(), "not text".into()))?;
            let transport = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::from_url(url)
                .map_err(|err| OutboxError::Smtp(rule.to_owned(), err.to_string()))?
                .timeout(Some(ATTEMPT_LIMIT))
                .build();
            let mailbox = |address: &str| {
                address
                    .parse::<lettre::message::Mailbox>()
                    .map_err(|err| OutboxError::Smtp(rule.to_owned(), err.to_string()))
            };
            (
                Transport::Email {
                    transport: Box::new(transport),
                    to: to.iter().map(|a| mailbox(a)).collect::<Result<_, _>>()?,
                    from: mailbox(from)?,
                },
                config.retry,
            )
        }
    })
}
