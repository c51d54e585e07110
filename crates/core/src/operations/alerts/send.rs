//! Where notices go (docs/configuration.md, alerts): one task per channel takes its notices
//! from the store's outbox in the order they were kept and sends each until it is taken or
//! its attempts run out, backing off as forwarded events do, before the next. Each attempt
//! holds the row's lease, so that of several nodes one sends a channel's head at a time;
//! the attempts and their outcome are kept, so that a restart (of this node or another)
//! goes on where it stopped. A notice the store could not keep (it was down) is queued in
//! memory and sent first.
//!
//! To a `[[destinations]]` entry a notice goes through that destination's sink (HTTP, NATS,
//! RabbitMQ, Redis), signed with Standard Webhooks under its secret as events are, with a
//! `webhook-id` derived from the alert, so a retried notice carries the same id.

use std::sync::Arc;
use std::time::Duration;

use sha2::Digest;
use tokio::sync::{mpsc, watch, Notify};
use tracing::{info, warn};

use super::notice::{email_text, headline, slack_message, NoticeBody};
use crate::config::alerts::Channel;
use crate::config::template::Placed;
use crate::config::{Config, DestinationConfig, LiveSecrets};
use crate::domain::clock::Clock;
use crate::domain::retry::{NextStep, RetryPolicy};
use crate::forward::answer::AttemptResult;
use crate::forward::message::WebhookId;
use crate::forward::sink::{Outgoing, Sink, Sinks};
use crate::ingress::signature::{try_sign, Scheme, Secret};
use crate::store::alerts::{AlertRecord, Attempted, Claim, Claimed};
use crate::store::Store;

/// The event type a notice is placed under (a subject or stream template's `{event_type}`).
pub const NOTICE_EVENT_TYPE: &str = "inhook.alert";
/// How long one Slack or SMTP attempt may take.
const ATTEMPT_LIMIT: Duration = Duration::from_secs(10);
/// How much longer than its attempt a lease on an outbox row lasts (the store's writes
/// around it): a node that dies mid-attempt leaves the row to another after this.
const LEASE_MARGIN_MS: i64 = 5_000;
/// How often at most a channel looks at its outbox for rows another node kept.
const MAX_POLL: Duration = Duration::from_secs(1);

/// The outbox's name of `channel`, shown in `GET /v1/alerts`: never a credential (Slack's
/// URL and the SMTP URL are named by a short hash of what they hold).
pub fn channel_key(channel: &Channel) -> String {
    let short = |parts: &[&[u8]]| {
        let mut hash = sha2::Sha256::new();
        for part in parts {
            hash.update(part);
            hash.update([0]);
        }
        hex::encode(&hash.finalize()[..4])
    };
    match channel {
        Channel::Destination(name) => format!("destination:{name}"),
        Channel::Slack(url) => format!("slack#{}", short(&[url.expose()])),
        Channel::Email {
            smtp_url, to, from, ..
        } => format!(
            "email:{}#{}",
            to.join(","),
            short(&[smtp_url.expose(), from.as_bytes()])
        ),
    }
}

/// One channel as the watcher sees it: where the notices the store could not keep go, and
/// the bell that tells it a notice was kept.
#[derive(Debug, Clone)]
pub struct LaneHandle {
    /// The channel's outbox name ([`channel_key`]).
    pub key: String,
    /// Notices not kept in the store, sent from memory.
    pub queue: mpsc::UnboundedSender<Arc<AlertRecord>>,
    /// Rung when a notice for the channel was kept.
    pub wake: Arc<Notify>,
}

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
                        Failed::Retry(crate::forward::outbound::describe_error(&err.without_url()))
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
    // One id per notice, the same on every attempt (and from any node): the receiver drops
    // a repeat it took. Two nodes' own notices decided in the same millisecond differ by node.
    let node = alert
        .node
        .as_deref()
        .map(|node| format!("/{node}"))
        .unwrap_or_default();
    let webhook_id = WebhookId::of(
        "inhook.alerts",
        &format!(
            "{}/{subject}/{}/{}{node}",
            alert.alert, alert.state, alert.at_ms
        ),
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
                crate::domain::clock::now_ms() / 1000,
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
    key: String,
    transport: Transport,
    retry: RetryPolicy,
    queue: mpsc::UnboundedReceiver<Arc<AlertRecord>>,
    wake: Arc<Notify>,
    /// How long one attempt's lease lasts.
    lease_ms: i64,
}

/// What a lane waits for between its outbox's rows.
enum Woken {
    Unkept(Arc<AlertRecord>),
    Look,
    Stop,
}

/// What a lane's runs share: the store, this node's name, the clock and the poll.
#[derive(Clone)]
struct Runner {
    store: Arc<dyn Store>,
    node: Arc<str>,
    clock: Clock,
    poll: Duration,
}

impl Lane {
    async fn run(mut self, runner: Runner, mut stop: watch::Receiver<bool>) {
        let poll_ms = runner.poll.as_millis() as i64;
        loop {
            while let Ok(alert) = self.queue.try_recv() {
                self.deliver(&alert, &mut stop).await;
            }
            if *stop.borrow() {
                return;
            }
            let now = runner.clock.now_ms();
            let claim = runner
                .store
                .claim_alert_notice(&self.key, &runner.node, now, self.lease_ms)
                .await;
            let wait_ms = match claim {
                Ok(Claim::Taken(claimed)) => {
                    self.attempt(&runner, *claimed).await;
                    continue;
                }
                Ok(Claim::Waiting(until)) => until.saturating_sub(now).clamp(1, poll_ms),
                Ok(Claim::Idle) => poll_ms,
                Err(err) => {
                    warn!(channel = %self.transport.name(), error = %err, "the alert outbox was not read");
                    poll_ms
                }
            };
            let woken = tokio::select! {
                next = self.queue.recv() => match next {
                    Some(alert) => Woken::Unkept(alert),
                    None => Woken::Stop,
                },
                _ = self.wake.notified() => Woken::Look,
                _ = tokio::time::sleep(Duration::from_millis(wait_ms.max(1) as u64)) => Woken::Look,
                _ = stop.changed() => Woken::Stop,
            };
            match woken {
                Woken::Unkept(alert) => self.deliver(&alert, &mut stop).await,
                Woken::Look => {}
                Woken::Stop => return,
            }
        }
    }

    /// One attempt at the outbox row this node holds, and its outcome kept.
    async fn attempt(&self, runner: &Runner, claimed: Claimed) {
        let channel = self.transport.name();
        let alert = &claimed.alert;
        let attempt = claimed.attempts.saturating_add(1);
        let tried = u32::try_from(attempt).unwrap_or(u32::MAX);
        let outcome = match self.transport.send(alert, tried).await {
            Ok(()) => {
                info!(alert = %alert.alert, state = %alert.state, %channel, attempt, "alert notice sent");
                Attempted::Sent
            }
            Err(Failed::Final(why)) => {
                warn!(alert = %alert.alert, state = %alert.state, %channel, attempt, error = %why,
                      "alert notice refused; not sent again");
                Attempted::GaveUp { error: why }
            }
            Err(Failed::Retry(why)) => match self.retry.after_failure(tried, rand::random()) {
                NextStep::RetryIn(delay_ms) => {
                    warn!(alert = %alert.alert, %channel, attempt, error = %why, delay_ms,
                          "alert notice not sent; retrying");
                    Attempted::Retry {
                        error: why,
                        next_attempt_ms: runner.clock.now_ms().saturating_add(delay_ms.max(0)),
                    }
                }
                NextStep::GiveUp => {
                    warn!(alert = %alert.alert, state = %alert.state, %channel, attempt, error = %why,
                          "alert notice not sent: no attempts left");
                    Attempted::GaveUp {
                        error: format!("no attempts left: {why}"),
                    }
                }
            },
        };
        match runner
            .store
            .alert_notice_attempted(
                claimed.outbox_id,
                &runner.node,
                attempt,
                outcome,
                runner.clock.now_ms(),
            )
            .await
        {
            Ok(true) => {}
            Ok(false) => {
                warn!(alert = %alert.alert, %channel, "the notice's lease had passed to another node")
            }
            // The lease runs out and the row is tried again (a sent notice may go twice).
            Err(err) => {
                warn!(alert = %alert.alert, %channel, error = %err, "the notice's attempt was not kept")
            }
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
        source: Box<crate::forward::sink::SinkError>,
    },
    /// The HTTP client of Slack notices could not be built.
    #[error("alert {0:?}: the HTTP client: {1}")]
    Http(String, Box<crate::forward::sink::http::HttpClientError>),
    /// An SMTP URL lettre cannot use (the URL is not shown: it may hold a password).
    #[error("alert {0:?}: smtp_url cannot be used: {1}")]
    Smtp(String, String),
}

/// The channels of every rule, each with its queue: what the watcher hands notices to.
pub struct Outbox {
    /// Per rule, its channels.
    by_rule: Vec<Vec<LaneHandle>>,
    lanes: Vec<Lane>,
}

impl Outbox {
    /// The channels of `config`'s rules; rules naming the same channel share its queue, so
    /// that its notices go in the order they were decided.
    pub fn of(config: &Config, secrets: &LiveSecrets) -> Result<Self, OutboxError> {
        let mut sinks = Sinks::default();
        let mut keys: Vec<(Channel, LaneHandle)> = Vec::new();
        let mut lanes = Vec::new();
        let mut by_rule = Vec::with_capacity(config.observability.alerts.len());
        for rule in config.observability.alerts.iter() {
            let mut queues = Vec::new();
            for channel in &rule.channels {
                if let Some((_, handle)) = keys.iter().find(|(c, _)| c == channel) {
                    queues.push(handle.clone());
                    continue;
                }
                let (transport, retry) =
                    transport(config, secrets, &mut sinks, &rule.name, channel)?;
                let attempt_ms = match channel {
                    Channel::Destination(name) => config
                        .destination(name)
                        .map_or(ATTEMPT_LIMIT.as_millis() as i64, |d| {
                            (d.timeout_s.max(1) as i64).saturating_mul(1000)
                        }),
                    _ => ATTEMPT_LIMIT.as_millis() as i64,
                };
                let (queue, receiver) = mpsc::unbounded_channel();
                let handle = LaneHandle {
                    key: channel_key(channel),
                    queue,
                    wake: Arc::new(Notify::new()),
                };
                lanes.push(Lane {
                    key: handle.key.clone(),
                    transport,
                    retry,
                    queue: receiver,
                    wake: Arc::clone(&handle.wake),
                    lease_ms: attempt_ms.saturating_add(LEASE_MARGIN_MS),
                });
                keys.push((channel.clone(), handle.clone()));
                queues.push(handle);
            }
            by_rule.push(queues);
        }
        Ok(Self { by_rule, lanes })
    }

    /// Starts one task per channel until `stop`, sending the notices `store` keeps as
    /// `node`, looking for those other nodes kept every `tick` (at most a second); per
    /// rule, its channels.
    pub fn start(
        self,
        tasks: &mut tokio::task::JoinSet<()>,
        stop: &watch::Receiver<bool>,
        store: Arc<dyn Store>,
        node: Arc<str>,
        clock: Clock,
        tick: Duration,
    ) -> Vec<Vec<LaneHandle>> {
        let runner = Runner {
            store,
            node,
            clock,
            poll: tick.clamp(Duration::from_millis(10), MAX_POLL),
        };
        for lane in self.lanes {
            tasks.spawn(lane.run(runner.clone(), stop.clone()));
        }
        self.by_rule
    }
}

/// The TLS of the SMTP URL `url` (as lettre reads it: `smtps://` TLS from the start,
/// `?tls=required` or `?tls=opportunistic` STARTTLS) trusting the PEM certificates of
/// `ca_file` beside the system's; none for plain SMTP. The reasons never quote the URL.
fn smtp_tls_with_ca(
    url: &str,
    ca_file: &std::path::Path,
) -> Result<Option<lettre::transport::smtp::client::Tls>, String> {
    use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
    let parsed = reqwest::Url::parse(url).map_err(|_| "not a URL".to_owned())?;
    let host = parsed.host_str().ok_or("no host")?.to_owned();
    let pem = std::fs::read(ca_file)
        .map_err(|err| format!("smtp_tls_ca_file {}: {err}", ca_file.display()))?;
    let parameters = || -> Result<TlsParameters, String> {
        let certificate = Certificate::from_pem(&pem)
            .map_err(|err| format!("smtp_tls_ca_file {}: {err}", ca_file.display()))?;
        TlsParameters::builder(host.clone())
            .add_root_certificate(certificate)
            .build_rustls()
            .map_err(|err| err.to_string())
    };
    let mode = parsed
        .query_pairs()
        .find(|(key, _)| key == "tls")
        .map(|(_, value)| value.into_owned());
    Ok(match (parsed.scheme(), mode.as_deref()) {
        ("smtps", _) => Some(Tls::Wrapper(parameters()?)),
        ("smtp", Some("required")) => Some(Tls::Required(parameters()?)),
        ("smtp", Some("opportunistic")) => Some(Tls::Opportunistic(parameters()?)),
        _ => None,
    })
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
                client: crate::forward::sink::http::http_client(None)
                    .map_err(|err| OutboxError::Http(rule.to_owned(), Box::new(err)))?,
                url: url.clone(),
            },
            config.processing.retry,
        ),
        Channel::Email {
            smtp_url,
            to,
            from,
            tls_ca_file,
        } => {
            let url = std::str::from_utf8(smtp_url.expose())
                .map_err(|_| OutboxError::Smtp(rule.to_owned(), "not text".into()))?;
            let mut builder = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::from_url(url)
                .map_err(|err| OutboxError::Smtp(rule.to_owned(), err.to_string()))?
                .timeout(Some(ATTEMPT_LIMIT));
            if let Some(path) = tls_ca_file {
                let tls = smtp_tls_with_ca(url, path)
                    .map_err(|why| OutboxError::Smtp(rule.to_owned(), why))?;
                if let Some(tls) = tls {
                    builder = builder.tls(tls);
                }
            }
            let transport = builder.build();
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
                config.processing.retry,
            )
        }
    })
}
