//! AWS SNS at ingress (docs/configuration.md, `signature = "aws-sns"`; docs/contract.md,
//! handshakes): the signing certificate fetched and cached, the subscription confirmed.
//! The pure parts (the message, its string to sign, the signature check, which URLs may
//! be fetched) are [`crate::signature::aws_sns`]'s.
//!
//! Anyone can post a message naming any URL: inhook fetches only `https://` URLs on hosts
//! of `sns_cert_hosts`, never follows a redirect, bounds each fetch in time and size,
//! runs at most [`MAX_CONCURRENT_FETCHES`] at once, and keeps certificates in a bounded
//! cache by URL where concurrent deliveries naming one URL share one fetch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::answer::Answer;
use crate::config::SourceConfig;
use crate::signature::aws_sns::{CertKey, Message, MessageType, SnsConfig};
use crate::signature::{SignatureError, Verified};

/// The handshake's name in `inhook_handshakes_total{kind}`.
pub(super) const HANDSHAKE: &str = "aws-sns";
/// Longest one certificate fetch or subscription confirmation may take, connection included.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest certificate file read (AWS's are under 2 KiB); a confirmation's answer is read
/// up to this and dropped.
const MAX_FETCH_BYTES: usize = 64 * 1024;
/// Outbound SNS requests in flight at once, over all sources.
const MAX_CONCURRENT_FETCHES: usize = 4;
/// Certificates kept; past it expired entries go first, then the oldest.
const MAX_CACHED: usize = 64;
/// How long a fetched certificate is trusted before it is fetched again.
const CERT_TTL: Duration = Duration::from_secs(3600);
/// How long a failed fetch is remembered: a URL that fails is not fetched again for each
/// delivery naming it.
const FAILURE_TTL: Duration = Duration::from_secs(30);

/// Why an SNS delivery was not verified: its signature, or a fetch that failed (502).
pub(super) enum Refused {
    /// 401, counted and logged as every signature failure.
    Signature(SignatureError),
    /// 502: nothing was stored; SNS retries.
    Upstream(Answer),
}

/// Verifies an SNS message: its topic, the URLs it names, then its signature with the
/// certificate's key (fetched or cached) and its time against the tolerance window.
pub(super) async fn verify(
    source: &SourceConfig,
    config: &SnsConfig,
    body: &[u8],
    received_at: i64,
) -> Result<Verified, Refused> {
    let message = Message::parse(body).map_err(Refused::Signature)?;
    config.check_topic(&message).map_err(Refused::Signature)?;
    let cert_url = config
        .allowed_url("SigningCertURL", &message.signing_cert_url)
        .map_err(Refused::Signature)?;
    if let Some(subscribe) = &message.subscribe_url {
        // Checked before anything is fetched: a confirmation that could not be confirmed
        // is refused at once.
        if message.kind == MessageType::SubscriptionConfirmation {
            config
                .allowed_url("SubscribeURL", subscribe)
                .map_err(Refused::Signature)?;
        }
    }
    let key = match fetcher().certificate(&cert_url).await {
        Ok(key) => key,
        Err(why) => {
            if let Some(suppressed) = FETCH_LOG.admit() {
                warn!(source = %source.name, host = cert_url.host_str().unwrap_or_default(),
                      why, suppressed, "SNS signing certificate unavailable: delivery refused");
            }
            return Err(Refused::Upstream(Answer::UpstreamFailed {
                error: "certificate_unavailable",
            }));
        }
    };
    let verified = message
        .verify(&key, received_at)
        .map_err(Refused::Signature)?;
    crate::signature::judge_time(verified, received_at, source.tolerance_s)
        .map_err(Refused::Signature)
}

/// The answer to a verified SNS message that is no event: a `SubscriptionConfirmation`
/// is confirmed by a GET of its `SubscribeURL` (200, or 502 when that fails), an
/// `UnsubscribeConfirmation` answered 200; neither is stored. `None` for a notification,
/// and for every other source.
pub(super) async fn handshake(source: &SourceConfig, body: &[u8]) -> Option<Answer> {
    let crate::signature::Verifier::AwsSns(config) = &source.verifier else {
        return None;
    };
    // Verified already: parsing again cannot fail, and costs less than carrying it.
    let message = Message::parse(body).ok()?;
    match message.kind {
        MessageType::Notification => None,
        MessageType::UnsubscribeConfirmation => {
            info!(source = %source.name, topic = %message.topic_arn,
                  "SNS UnsubscribeConfirmation: answered, not stored");
            Some(Answer::NotStored {
                reason: "unsubscribe_confirmation",
            })
        }
        MessageType::SubscriptionConfirmation => {
            // Checked by `verify` already; a confirmation is never taken for an event.
            let url = message
                .subscribe_url
                .as_deref()
                .and_then(|raw| config.allowed_url("SubscribeURL", raw).ok());
            let confirmed = match url {
                Some(url) => fetcher().confirm(url).await,
                None => Err("SubscribeURL is not allowed"),
            };
            Some(match confirmed {
                Ok(()) => {
                    crate::metrics::handshake(&source.name, HANDSHAKE);
                    info!(source = %source.name, topic = %message.topic_arn,
                          "SNS subscription confirmed");
                    Answer::SnsConfirmed { kind: HANDSHAKE }
                }
                Err(why) => {
                    // The URL carries the subscription's token: never logged.
                    warn!(source = %source.name, topic = %message.topic_arn, why,
                          "SNS subscription confirmation failed: SNS will resend it");
                    Answer::UpstreamFailed {
                        error: "subscription_confirmation_failed",
                    }
                }
            })
        }
    }
}

/// Whether a content type is SNS's own (`text/plain; charset=UTF-8`).
pub(super) fn is_sns_media_type(content_type: Option<&str>) -> bool {
    content_type
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("text/plain"))
}

/// The process's SNS client and certificate cache.
fn fetcher() -> &'static Fetcher {
    static FETCHER: OnceLock<Fetcher> = OnceLock::new();
    FETCHER.get_or_init(Fetcher::new)
}

/// A fetch's outcome, shared by the deliveries that wait for it.
type Fetched = Result<Arc<CertKey>, &'static str>;

/// One URL's certificate: fetched once, by whichever delivery came first.
struct Slot {
    created: Instant,
    cell: tokio::sync::OnceCell<Fetched>,
}

impl Slot {
    /// Whether the slot is past its time: a certificate after [`CERT_TTL`], a failure after
    /// [`FAILURE_TTL`]; a fetch in flight is never expired.
    fn expired(&self, now: Instant) -> bool {
        let ttl = match self.cell.get() {
            Some(Ok(_)) => CERT_TTL,
            Some(Err(_)) => FAILURE_TTL,
            None => return false,
        };
        now.duration_since(self.created) > ttl
    }
}

/// The HTTPS client SNS requests use, the certificates by URL, and the bound on fetches.
struct Fetcher {
    client: Result<reqwest::Client, String>,
    slots: Mutex<HashMap<String, Arc<Slot>>>,
    in_flight: tokio::sync::Semaphore,
}

impl Fetcher {
    fn new() -> Self {
        // The system's roots (`SSL_CERT_FILE` moves them), no redirects, no proxy.
        let client = crate::outbound::client_builder(None, "aws-sns")
            .map_err(|e| e.to_string())
            .and_then(|b| {
                b.timeout(FETCH_TIMEOUT)
                    .connect_timeout(FETCH_TIMEOUT)
                    .build()
                    .map_err(|e| e.to_string())
            });
        Self {
            client,
            slots: Mutex::new(HashMap::new()),
            in_flight: tokio::sync::Semaphore::new(MAX_CONCURRENT_FETCHES),
        }
    }

    /// The certificate at `url`, from the cache or fetched (once for concurrent callers).
    async fn certificate(&self, url: &reqwest::Url) -> Fetched {
        let slot = self.slot(url.as_str());
        slot.cell.get_or_init(|| self.fetch_cert(url)).await.clone()
    }

    /// The live slot of `url`, made when there is none; the map never holds more than
    /// [`MAX_CACHED`].
    fn slot(&self, url: &str) -> Arc<Slot> {
        let now = Instant::now();
        let mut slots = self
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(slot) = slots.get(url).filter(|s| !s.expired(now)) {
            return Arc::clone(slot);
        }
        if slots.len() >= MAX_CACHED {
            slots.retain(|_, s| !s.expired(now));
        }
        if slots.len() >= MAX_CACHED {
            if let Some(oldest) = slots
                .iter()
                .min_by_key(|(_, s)| s.created)
                .map(|(k, _)| k.clone())
            {
                slots.remove(&oldest);
            }
        }
        let slot = Arc::new(Slot {
            created: now,
            cell: tokio::sync::OnceCell::new(),
        });
        slots.insert(url.to_owned(), Arc::clone(&slot));
        slot
    }

    /// GETs `url` within the bounds: 200 and a body under [`MAX_FETCH_BYTES`].
    async fn get(&self, url: reqwest::Url) -> Result<Vec<u8>, &'static str> {
        let client = self
            .client
            .as_ref()
            .map_err(|_| "the HTTPS client could not be set up")?;
        let _permit = tokio::time::timeout(FETCH_TIMEOUT, self.in_flight.acquire())
            .await
            .map_err(|_| "too many SNS fetches in flight")?
            .map_err(|_| "closed")?;
        let response = client
            .get(url)
            .send()
            .await
            .map_err(|_| "the request failed (connection, TLS or timeout)")?;
        if !response.status().is_success() {
            return Err("the answer was not 2xx");
        }
        let read = tokio::time::timeout(
            FETCH_TIMEOUT,
            crate::outbound::read_capped(response, MAX_FETCH_BYTES),
        )
        .await;
        match read {
            Ok(Ok((body, false))) => Ok(body),
            Ok(Ok((_, true))) => Err("the answer is too large"),
            Ok(Err(_)) | Err(_) => Err("the answer broke off or was too slow"),
        }
    }

    async fn fetch_cert(&self, url: &reqwest::Url) -> Fetched {
        let pem = self.get(url.clone()).await?;
        CertKey::from_pem(&pem)
            .map(Arc::new)
            .map_err(|_| "the answer is not a PEM RSA certificate")
    }

    /// Confirms a subscription: a GET of its `SubscribeURL` answered 2xx.
    async fn confirm(&self, url: reqwest::Url) -> Result<(), &'static str> {
        self.get(url).await.map(drop)
    }
}

/// Certificate fetch failures come in floods when anyone names a failing URL.
static FETCH_LOG: crate::log_throttle::LogThrottle =
    crate::log_throttle::LogThrottle::new(crate::log_throttle::NOISY_LOG_INTERVAL);
