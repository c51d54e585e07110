//! AWS SNS at ingress (docs/configuration.md, `signature = "aws-sns"`; docs/contract.md,
//! handshakes): the signing certificate fetched and cached, the subscription confirmed.
//! The pure parts (the message, its string to sign, the signature check, which topics and
//! URLs are taken) are [`crate::ingress::signature::aws_sns`]'s.
//!
//! Anyone can post a message naming any URL, and AWS signs for every topic's owner. So,
//! before anything is fetched: the topic must be one of `sns_topic_arns` (403
//! `forbidden_topic` otherwise), and the certificate URL must be AWS's form on a host of
//! `sns_cert_hosts`. A fetch then follows no redirect, is bounded in time and size, runs
//! with at most [`MAX_CONCURRENT_FETCHES`] at once and [`MAX_FETCHES_PER_CLIENT`] for one
//! client, and deliveries naming one URL share it. A certificate that has verified a
//! signature is kept apart from the others, where a flood of unverified URLs cannot evict
//! it; a fetch that found no free slot is not remembered as a failure.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::answer::Answer;
use crate::config::SourceConfig;
use crate::ingress::signature::aws_sns::{CertKey, Message, MessageType, SnsConfig};
use crate::ingress::signature::{SignatureError, Verified};

/// The handshake's name in `inhook_handshakes_total{kind}`.
pub(super) const HANDSHAKE: &str = "aws-sns";
/// Longest one certificate fetch or subscription confirmation may take, connection included;
/// also the longest a fetch waits for a free slot.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest certificate file read (AWS's are under 2 KiB); a confirmation's answer is read
/// up to this and dropped.
const MAX_FETCH_BYTES: usize = 64 * 1024;
/// Outbound SNS requests in flight at once, over all sources.
const MAX_CONCURRENT_FETCHES: usize = 4;
/// Certificate fetches one client (an IPv4 address, an IPv6 /64) may have started and not
/// finished, waiting for a slot included: one client cannot take every slot nor queue
/// ahead of everyone else. Deliveries that wait for a fetch another started cost nothing.
const MAX_FETCHES_PER_CLIENT: usize = 2;
/// Certificates not (yet) known to verify, failures included; past it expired entries go
/// first, then the oldest.
const MAX_CACHED: usize = 64;
/// Certificates that have verified a signature, kept apart from [`MAX_CACHED`]: AWS signs
/// with a few certificates per region.
const MAX_VERIFIED: usize = 16;
/// How long a fetched certificate is trusted before it is fetched again.
const CERT_TTL: Duration = Duration::from_secs(3600);
/// How long a failed fetch is remembered: a URL that fails is not fetched again for each
/// delivery naming it.
const FAILURE_TTL: Duration = Duration::from_secs(30);

/// Why an SNS delivery was not verified.
pub(super) enum Refused {
    /// 401, counted and logged as every signature failure.
    Signature(SignatureError),
    /// 403 `forbidden_topic`: a topic outside `sns_topic_arns`, refused before anything is
    /// fetched.
    Topic,
    /// 502: nothing was stored; SNS retries.
    Upstream(Answer),
}

/// Verifies an SNS message sent by `client`: its topic, the URLs it names, then its
/// signature with the certificate's key (fetched or cached) and its time against the
/// tolerance window.
pub(super) async fn verify(
    source: &SourceConfig,
    config: &SnsConfig,
    body: &[u8],
    received_at: i64,
    client: IpAddr,
) -> Result<Verified, Refused> {
    let message = Message::parse(body).map_err(Refused::Signature)?;
    if !config.takes_topic(&message) {
        // Anyone can name any topic: one line per interval. The ARN is what the sender
        // wrote, so it is logged escaped and cut short.
        if let Some(suppressed) = TOPIC_LOG.admit() {
            let topic: String = message.topic_arn.chars().take(256).collect();
            warn!(source = %source.name, ?topic, suppressed,
                  "SNS message from a topic outside sns_topic_arns: refused, nothing fetched");
        }
        return Err(Refused::Topic);
    }
    let cert_url = config
        .cert_url(&message.signing_cert_url)
        .map_err(Refused::Signature)?;
    if let Some(subscribe) = &message.subscribe_url {
        // Checked before anything is fetched: a confirmation that could not be confirmed
        // is refused at once.
        if message.kind == MessageType::SubscriptionConfirmation {
            config
                .subscribe_url(subscribe)
                .map_err(Refused::Signature)?;
        }
    }
    let key = match fetcher().certificate(&cert_url, client).await {
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
    // AWS's key signed this message: the certificate is kept where unverified URLs cannot
    // evict it (the time is judged below, but the signature alone proves the key AWS's).
    fetcher().keep_verified(&cert_url, &key);
    crate::ingress::signature::judge_time(verified, received_at, source.tolerance_s)
        .map_err(Refused::Signature)
}

/// The answer to a verified SNS message that is no event: a `SubscriptionConfirmation`
/// is confirmed by a GET of its `SubscribeURL` (200, or 502 when that fails), an
/// `UnsubscribeConfirmation` answered 200; neither is stored. `None` for a notification,
/// and for every other source.
pub(super) async fn handshake(source: &SourceConfig, body: &[u8]) -> Option<Answer> {
    let crate::ingress::signature::Verifier::AwsSns(config) = &source.verifier else {
        return None;
    };
    // Verified already: parsing again cannot fail, and costs less than carrying it.
    let message = Message::parse(body).ok()?;
    if !config.takes_topic(&message) {
        // Refused by `verify` already; never confirmed, whatever calls this.
        return Some(Answer::FORBIDDEN_TOPIC);
    }
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
                .and_then(|raw| config.subscribe_url(raw).ok());
            let confirmed = match url {
                Some(url) => fetcher().confirm(url).await,
                None => Err("SubscribeURL is not allowed"),
            };
            Some(match confirmed {
                Ok(()) => {
                    crate::operations::metrics::handshake(&source.name, HANDSHAKE);
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

/// A fetch's outcome, shared by the deliveries that wait for it and remembered.
type Fetched = Result<Arc<CertKey>, &'static str>;

/// One URL's certificate: fetched once, by whichever delivery came first.
struct Slot {
    created: Instant,
    /// Set once a fetch has an outcome; a fetch that found no slot leaves it empty, so the
    /// next delivery naming the URL tries again.
    cell: tokio::sync::OnceCell<Fetched>,
}

impl Slot {
    /// Whether the slot is past its time: a certificate after [`CERT_TTL`], a failure after
    /// [`FAILURE_TTL`]; a slot without an outcome is never expired (its age evicts it).
    fn expired(&self, now: Instant) -> bool {
        let ttl = match self.cell.get() {
            Some(Ok(_)) => CERT_TTL,
            Some(Err(_)) => FAILURE_TTL,
            None => return false,
        };
        now.duration_since(self.created) > ttl
    }
}

/// A certificate that has verified a signature, and when it was fetched.
struct Kept {
    key: Arc<CertKey>,
    fetched: Instant,
}

impl Kept {
    fn fresh(&self, now: Instant) -> bool {
        now.duration_since(self.fetched) <= CERT_TTL
    }
}

/// The certificates by URL: those that verified a signature apart from the rest.
#[derive(Default)]
struct Cache {
    /// Certificates that verified a signature: only AWS-signed messages put one here, so
    /// a flood of unsigned ones naming fresh URLs never evicts them.
    verified: HashMap<String, Kept>,
    /// Every other URL named: fetches in flight, certificates not yet seen to verify, and
    /// failures.
    slots: HashMap<String, Arc<Slot>>,
}

/// What the cache holds for a URL.
enum Lookup {
    /// A certificate that verified a signature within [`CERT_TTL`].
    Verified(Arc<CertKey>),
    /// The URL's slot, and a certificate that verified longer ago.
    Slot {
        stale: Option<Arc<CertKey>>,
        slot: Arc<Slot>,
    },
}

/// The HTTPS client SNS requests use, the certificates by URL, and the bounds on fetches.
struct Fetcher {
    client: Result<reqwest::Client, String>,
    cache: Mutex<Cache>,
    in_flight: tokio::sync::Semaphore,
    /// Certificate fetches started and not finished, per client key.
    per_client: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

/// A client's share of [`MAX_FETCHES_PER_CLIENT`], given back when dropped.
struct ClientFetch {
    key: IpAddr,
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for ClientFetch {
    fn drop(&mut self) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = counts.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// Why a fetch was not made (not remembered: the next delivery naming the URL tries again).
type NotFetched = &'static str;

impl Fetcher {
    fn new() -> Self {
        // The system's roots (`SSL_CERT_FILE` moves them), no redirects, no proxy.
        let client = crate::forward::outbound::client_builder(None, "aws-sns")
            .map_err(|e| e.to_string())
            .and_then(|b| {
                b.timeout(FETCH_TIMEOUT)
                    .connect_timeout(FETCH_TIMEOUT)
                    .build()
                    .map_err(|e| e.to_string())
            });
        Self {
            client,
            cache: Mutex::new(Cache::default()),
            in_flight: tokio::sync::Semaphore::new(MAX_CONCURRENT_FETCHES),
            per_client: Arc::default(),
        }
    }

    /// The certificate at `url`: one that verified before, else from the cache or fetched
    /// (once for concurrent callers; a fetch `client` starts counts against its bound).
    async fn certificate(&self, url: &reqwest::Url, client: IpAddr) -> Fetched {
        let (stale, slot) = match self.lookup(url.as_str()) {
            Lookup::Verified(key) => return Ok(key),
            Lookup::Slot { stale, slot } => (stale, slot),
        };
        let fetched = slot
            .cell
            .get_or_try_init(|| async {
                let _share = self.client_share(client)?;
                self.fetch_cert(url).await
            })
            .await;
        match fetched {
            Ok(fetched) => fetched.clone(),
            // No fetch was made: a certificate that verified before, past its hour, still
            // serves (its validity period is checked at each use) rather than none.
            Err(why) => stale.ok_or(why),
        }
    }

    /// A certificate of `url` that verified within the hour; else its slot (made when
    /// there is none, or it expired; the slots never hold more than [`MAX_CACHED`]), with
    /// the certificate that verified longer ago, if any.
    fn lookup(&self, url: &str) -> Lookup {
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let stale = match cache.verified.get(url) {
            Some(kept) if kept.fresh(now) => return Lookup::Verified(Arc::clone(&kept.key)),
            Some(kept) => Some(Arc::clone(&kept.key)),
            None => None,
        };
        let slots = &mut cache.slots;
        if let Some(slot) = slots.get(url).filter(|s| !s.expired(now)) {
            return Lookup::Slot {
                stale,
                slot: Arc::clone(slot),
            };
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
        Lookup::Slot { stale, slot }
    }

    /// Keeps `key`, which has just verified a signature, as `url`'s certificate where
    /// unverified URLs cannot evict it; at most [`MAX_VERIFIED`], the stalest going first.
    fn keep_verified(&self, url: &reqwest::Url, key: &Arc<CertKey>) {
        let now = Instant::now();
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let url = url.as_str();
        // Fetched when its slot was made (or, kept already, when it was kept).
        let fetched = match cache.verified.get(url) {
            Some(kept) if Arc::ptr_eq(&kept.key, key) => return,
            _ => cache.slots.get(url).map_or(now, |s| s.created),
        };
        let verified = &mut cache.verified;
        if !verified.contains_key(url) && verified.len() >= MAX_VERIFIED {
            if let Some(stalest) = verified
                .iter()
                .min_by_key(|(_, k)| k.fetched)
                .map(|(u, _)| u.clone())
            {
                verified.remove(&stalest);
            }
        }
        verified.insert(
            url.to_owned(),
            Kept {
                key: Arc::clone(key),
                fetched,
            },
        );
        cache.slots.remove(url);
    }

    /// A share of `client`'s fetches, or why there is none.
    fn client_share(&self, client: IpAddr) -> Result<ClientFetch, NotFetched> {
        let key = super::server::peer_key(client);
        let mut counts = self.per_client.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(key).or_default();
        if *count >= MAX_FETCHES_PER_CLIENT {
            return Err("this client already has its share of SNS fetches in flight");
        }
        *count += 1;
        Ok(ClientFetch {
            key,
            counts: Arc::clone(&self.per_client),
        })
    }

    /// GETs `url` within the bounds: 200 and a body under [`MAX_FETCH_BYTES`]. The outer
    /// error is a fetch never made (no free slot in time), the inner one a failed fetch.
    async fn get(&self, url: reqwest::Url) -> Result<Result<Vec<u8>, &'static str>, NotFetched> {
        let client = self
            .client
            .as_ref()
            .map_err(|_| "the HTTPS client could not be set up")?;
        let _permit = tokio::time::timeout(FETCH_TIMEOUT, self.in_flight.acquire())
            .await
            .map_err(|_| "too many SNS fetches in flight")?
            .map_err(|_| "closed")?;
        let Ok(response) = client.get(url).send().await else {
            return Ok(Err("the request failed (connection, TLS or timeout)"));
        };
        if !response.status().is_success() {
            return Ok(Err("the answer was not 2xx"));
        }
        let read = tokio::time::timeout(
            FETCH_TIMEOUT,
            crate::forward::outbound::read_capped(response, MAX_FETCH_BYTES),
        )
        .await;
        Ok(match read {
            Ok(Ok((body, false))) => Ok(body),
            Ok(Ok((_, true))) => Err("the answer is too large"),
            Ok(Err(_)) | Err(_) => Err("the answer broke off or was too slow"),
        })
    }

    /// Fetches a certificate: the inner result is remembered, the outer error is not.
    async fn fetch_cert(&self, url: &reqwest::Url) -> Result<Fetched, NotFetched> {
        Ok(self.get(url.clone()).await?.and_then(|pem| {
            CertKey::from_pem(&pem)
                .map(Arc::new)
                .map_err(|_| "the answer is not a PEM RSA certificate")
        }))
    }

    /// Confirms a subscription: a GET of its `SubscribeURL` answered 2xx.
    async fn confirm(&self, url: reqwest::Url) -> Result<(), &'static str> {
        self.get(url).await?.map(drop)
    }
}

/// Messages from unlisted topics come in floods when anyone subscribes the endpoint.
static TOPIC_LOG: crate::operations::log_throttle::LogThrottle =
    crate::operations::log_throttle::LogThrottle::new(
        crate::operations::log_throttle::NOISY_LOG_INTERVAL,
    );

/// Certificate fetch failures come in floods when anyone names a failing URL.
static FETCH_LOG: crate::operations::log_throttle::LogThrottle =
    crate::operations::log_throttle::LogThrottle::new(
        crate::operations::log_throttle::NOISY_LOG_INTERVAL,
    );

#[cfg(test)]
mod tests {
    use super::*;

    const URL: &str =
        "https://127.0.0.1:9/SimpleNotificationService-0123456789abcdef0123456789abcdef.pem";

    fn slot_of(fetcher: &Fetcher, url: &str) -> Option<Arc<Slot>> {
        let cache = fetcher.cache.lock().unwrap();
        cache.slots.get(url).cloned()
    }

    #[tokio::test(start_paused = true)]
    async fn a_fetch_that_found_no_free_slot_is_not_remembered_as_a_failure() {
        let fetcher = Fetcher::new();
        let url = reqwest::Url::parse(URL).unwrap();
        let client = IpAddr::from([192, 0, 2, 1]);
        let busy = fetcher
            .in_flight
            .acquire_many(MAX_CONCURRENT_FETCHES as u32)
            .await
            .unwrap();
        assert_eq!(
            fetcher.certificate(&url, client).await.unwrap_err(),
            "too many SNS fetches in flight"
        );
        let slot = slot_of(&fetcher, URL).unwrap();
        assert!(slot.cell.get().is_none(), "nothing remembered");
        assert!(
            fetcher.per_client.lock().unwrap().is_empty(),
            "share given back"
        );
        drop(busy);
        // The next delivery fetches (nothing listens on port 9): that failure is remembered.
        let failed = fetcher.certificate(&url, client).await.unwrap_err();
        assert!(failed.starts_with("the request failed"), "{failed}");
        assert!(matches!(slot.cell.get(), Some(Err(_))));
    }

    #[test]
    fn one_client_holds_at_most_its_share_of_fetches_an_ipv6_64_being_one_client() {
        let fetcher = Fetcher::new();
        let v4 = IpAddr::from([192, 0, 2, 1]);
        let shares: Vec<_> = (0..MAX_FETCHES_PER_CLIENT)
            .map(|_| fetcher.client_share(v4).unwrap())
            .collect();
        assert!(fetcher.client_share(v4).is_err());
        assert!(fetcher.client_share(IpAddr::from([192, 0, 2, 2])).is_ok());
        drop(shares);
        assert!(fetcher.client_share(v4).is_ok());
        let a: IpAddr = "2001:db8::1".parse().unwrap();
        let b: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        let _held: Vec<_> = (0..MAX_FETCHES_PER_CLIENT)
            .map(|_| fetcher.client_share(a).unwrap())
            .collect();
        assert!(fetcher.client_share(b).is_err(), "one /64");
        assert!(fetcher
            .client_share("2001:db8:0:1::1".parse().unwrap())
            .is_ok());
    }

    #[test]
    fn certificates_that_verified_outlive_a_flood_of_unverified_urls() {
        let fetcher = Fetcher::new();
        let key = Arc::new(
            CertKey::from_pem(include_bytes!(
                "../../../../tests/fixtures/aws_sns/cert.pem"
            ))
            .unwrap(),
        );
        let genuine = reqwest::Url::parse(URL).unwrap();
        let Lookup::Slot { slot, .. } = fetcher.lookup(genuine.as_str()) else {
            panic!("nothing kept yet");
        };
        assert!(slot.cell.set(Ok(Arc::clone(&key))).is_ok());
        fetcher.keep_verified(&genuine, &key);
        for i in 0..(4 * MAX_CACHED) {
            let fresh = format!("https://127.0.0.1:9/SimpleNotificationService-{i:032x}.pem");
            let Lookup::Slot { .. } = fetcher.lookup(&fresh) else {
                panic!("an unverified URL is never kept");
            };
        }
        assert!(fetcher.cache.lock().unwrap().slots.len() <= MAX_CACHED);
        let Lookup::Verified(kept) = fetcher.lookup(genuine.as_str()) else {
            panic!("the verified certificate was evicted");
        };
        assert!(Arc::ptr_eq(&kept, &key));
        // The kept ones are bounded too: the stalest goes first.
        for i in 0..(2 * MAX_VERIFIED) {
            let other = reqwest::Url::parse(&format!(
                "https://127.0.0.1:9/SimpleNotificationService-{i:032x}.pem"
            ))
            .unwrap();
            fetcher.keep_verified(&other, &key);
        }
        assert_eq!(fetcher.cache.lock().unwrap().verified.len(), MAX_VERIFIED);
    }
}
