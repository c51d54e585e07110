//! The publisher's side of the wire: signs each planned delivery and sends it
//! the way real publishers do (concurrent senders, resends while in flight,
//! retries until 2xx), keeping a tally of what came back. Reading the state
//! back is in `convergence`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::Rng;
use serde_json::Value;

use super::chaos::{Delivery, Plan};
use super::retry_policy::{backoff, is_retryable, retry_after};
use inhook::domain::clock;
use inhook::domain::kind::SourceKind;
use inhook::ingress::signature::{self, Scheme, Secret};

/// The servers' base URLs, shared so a test can point running senders at a
/// restarted server. With several (nodes behind a load balancer), requests
/// take them in turn, so a retry after a dead node goes to the next one.
#[derive(Debug, Clone)]
pub struct Endpoint {
    urls: Arc<Mutex<Vec<String>>>,
    turn: Arc<AtomicUsize>,
}

impl Endpoint {
    /// An endpoint at `url` (no trailing slash needed).
    pub fn new(url: &str) -> Self {
        Self::many(&[url])
    }

    /// An endpoint taking `urls` in turn.
    pub fn many(urls: &[&str]) -> Self {
        Self {
            urls: Arc::new(Mutex::new(
                urls.iter()
                    .map(|u| u.trim_end_matches('/').to_owned())
                    .collect(),
            )),
            turn: Arc::default(),
        }
    }

    /// The base URL for the next request.
    pub(super) fn next_url(&self) -> String {
        let turn = self.turn.fetch_add(1, Ordering::Relaxed);
        self.urls
            .lock()
            .ok()
            .and_then(|urls| urls.get(turn % urls.len().max(1)).cloned())
            .unwrap_or_default()
    }

    /// Points every later request at `url` alone.
    pub fn set(&self, url: &str) {
        if let Ok(mut urls) = self.urls.lock() {
            *urls = vec![url.trim_end_matches('/').to_owned()];
        }
    }

    /// Stops sending to `url` (a node taken out of the balancer).
    pub fn remove(&self, url: &str) {
        if let Ok(mut urls) = self.urls.lock() {
            if urls.len() > 1 {
                urls.retain(|u| u != url.trim_end_matches('/'));
            }
        }
    }
}

/// How one source is addressed and signed.
#[derive(Debug, Clone)]
pub struct SourceSigner {
    /// The source name in `/webhooks/{name}`.
    pub name: String,
    /// Its signature scheme.
    pub scheme: Scheme,
    /// The secret to sign with.
    pub secret: Secret,
}

/// How deliveries are sent and retried.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Concurrent senders.
    pub concurrency: usize,
    /// Deliveries started per second; 0 for no limit.
    pub rate: u64,
    /// Total time one delivery may be retried.
    pub give_up_after: Duration,
    /// Cap on an honoured `Retry-After`.
    pub max_retry_after: Duration,
    /// Per-request timeout.
    pub request_timeout: Duration,
    /// A PEM file of CA certificates trusted besides the system's roots, for `https://` URLs.
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            concurrency: 16,
            rate: 0,
            give_up_after: Duration::from_secs(120),
            max_retry_after: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
            tls_ca_file: None,
        }
    }
}

/// The 2xx answer that ended a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The status code.
    pub code: u16,
    /// The answer's `status` (`applied`, `accepted`, `duplicate`, …).
    pub status: String,
    /// For a duplicate, which key matched.
    pub key: Option<String>,
}

/// Counters of requests and answers.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// HTTP requests sent, retries and resends included.
    pub requests: u64,
    /// Requests sent because an earlier attempt failed.
    pub retries: u64,
    /// Answers by code; `connection_error` when there was none.
    pub codes: BTreeMap<String, u64>,
    /// 2xx answers by `status` (duplicates by key).
    pub statuses: BTreeMap<String, u64>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.retries += other.retries;
        for (k, v) in other.codes {
            *self.codes.entry(k).or_default() += v;
        }
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
    }
}

/// What delivering a plan did.
#[derive(Debug, Clone, Default)]
pub struct DeliveryReport {
    /// Request and answer counters.
    pub tally: Tally,
    /// Per planned delivery, the 2xx answer that ended it, or `None` if it failed.
    pub receipts: Vec<Option<Receipt>>,
    /// Why deliveries failed, one line each.
    pub failures: Vec<String>,
    /// Time from the first request to the last answer.
    pub elapsed: Duration,
}

/// What one request came back with.
enum Attempt {
    Answered {
        code: u16,
        retry_after: Option<String>,
        body: Value,
    },
    NoAnswer(String),
    /// The server's TLS certificate was refused: no retry can succeed.
    Refused(String),
}

impl Attempt {
    fn failed(err: &reqwest::Error) -> Self {
        match inhook::forward::outbound::certificate_problem(err) {
            Some(problem) => Attempt::Refused(problem),
            None => Attempt::NoAnswer(inhook::forward::outbound::describe_error(err)),
        }
    }
}

/// Sends planned deliveries and reads state back: the publisher's side of the wire.
#[derive(Debug, Clone)]
pub struct Publisher {
    pub(super) client: reqwest::Client,
    pub(super) endpoint: Endpoint,
    /// Which source each kind's deliveries go to.
    signers: Vec<(SourceKind, SourceSigner)>,
    // A `Secret`, so that printing the publisher never shows the token.
    pub(super) admin_token: Option<Secret>,
    pub(super) options: SendOptions,
    answered: Arc<Mutex<Vec<(usize, Receipt)>>>,
}

impl Publisher {
    /// A publisher for the two built-in sources, with one keep-alive connection pool for all senders.
    pub fn new(
        endpoint: Endpoint,
        presence: SourceSigner,
        save: SourceSigner,
        admin_token: Option<String>,
        options: SendOptions,
    ) -> anyhow::Result<Self> {
        Self::with_signers(
            endpoint,
            vec![
                (SourceKind::Presence, presence),
                (SourceKind::SaveGame, save),
            ],
            admin_token,
            options,
        )
    }

    /// A publisher for the sources each kind's deliveries go to.
    pub(super) fn with_signers(
        endpoint: Endpoint,
        signers: Vec<(SourceKind, SourceSigner)>,
        admin_token: Option<String>,
        options: SendOptions,
    ) -> anyhow::Result<Self> {
        let client = inhook::forward::outbound::client_builder(
            options.tls_ca_file.as_deref(),
            "--tls-ca-file",
        )?
        .pool_max_idle_per_host(options.concurrency.max(1) * 2)
        .timeout(options.request_timeout)
        .connect_timeout(Duration::from_secs(2))
        .build()
        .context("building the HTTP client")?;
        Ok(Self {
            client,
            endpoint,
            signers,
            admin_token: admin_token.map(Secret::new),
            options,
            answered: Arc::default(),
        })
    }

    /// Every 2xx answer received so far by this publisher and its clones, with
    /// its delivery's index in the plan, in the order received: a crash test
    /// compares it with the log right after a SIGKILL.
    pub fn answered(&self) -> Vec<(usize, Receipt)> {
        self.answered.lock().map(|a| a.clone()).unwrap_or_default()
    }

    fn signer(&self, kind: SourceKind) -> Result<&SourceSigner, String> {
        self.signers
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, signer)| signer)
            .ok_or_else(|| format!("this publisher has no source for {kind:?} events"))
    }

    /// The signature's headers, with the delivery's own id where it has one.
    fn sign(
        signer: &SourceSigner,
        delivery: &Delivery,
    ) -> Result<Vec<(&'static str, String)>, String> {
        signature::try_sign(
            signer.scheme,
            &delivery.body,
            &signer.secret,
            clock::now_ms() / 1000,
            delivery.delivery_id.as_deref(),
        )
        .map_err(|err| format!("cannot sign for {}: {err}", signer.name))
    }

    /// Sends every delivery of `plan` with the configured concurrency, each until 2xx or given up.
    pub async fn deliver(&self, plan: Arc<Plan>) -> DeliveryReport {
        let started = Instant::now();
        let next = Arc::new(AtomicUsize::new(0));
        let mut senders = tokio::task::JoinSet::new();
        for _ in 0..self.options.concurrency.max(1) {
            let (me, plan, next) = (self.clone(), plan.clone(), next.clone());
            senders.spawn(async move {
                let mut tally = Tally::default();
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(delivery) = plan.deliveries.get(i) else {
                        break;
                    };
                    if me.options.rate > 0 {
                        let due =
                            started + Duration::from_secs_f64(i as f64 / me.options.rate as f64);
                        tokio::time::sleep_until(due.into()).await;
                    }
                    done.push((i, me.deliver_one(i, delivery, &mut tally).await));
                }
                (tally, done)
            });
        }
        let mut report = DeliveryReport {
            receipts: vec![None; plan.deliveries.len()],
            ..DeliveryReport::default()
        };
        while let Some(joined) = senders.join_next().await {
            match joined {
                Ok((tally, done)) => {
                    report.tally.merge(tally);
                    for (i, result) in done {
                        match result {
                            Ok(receipt) => report.receipts[i] = Some(receipt),
                            Err(why) => report.failures.push(why),
                        }
                    }
                }
                Err(err) => report.failures.push(format!("a sender task failed: {err}")),
            }
        }
        report.elapsed = started.elapsed();
        report
    }

    /// One delivery; a resend fires the identical request again while the first is in flight.
    async fn deliver_one(
        &self,
        index: usize,
        delivery: &Delivery,
        tally: &mut Tally,
    ) -> Result<Receipt, String> {
        let signer = self.signer(delivery.kind)?;
        let headers = Self::sign(signer, delivery)?;
        if !delivery.resend {
            return self
                .until_done(index, signer, delivery, headers, tally)
                .await;
        }
        let mut second = Tally::default();
        let pause = Duration::from_millis(rand::thread_rng().gen_range(0..20));
        let (first, again) = tokio::join!(
            self.until_done(index, signer, delivery, headers.clone(), tally),
            async {
                tokio::time::sleep(pause).await;
                self.until_done(index, signer, delivery, headers.clone(), &mut second)
                    .await
            }
        );
        tally.merge(second);
        // Both copies must end in 2xx; the first copy's answer is the delivery's.
        match (first, again) {
            (Ok(receipt), Ok(_)) => Ok(receipt),
            (Err(why), _) | (_, Err(why)) => Err(why),
        }
    }

    /// Sends until a 2xx, a final 4xx, or the time budget is spent.
    async fn until_done(
        &self,
        index: usize,
        signer: &SourceSigner,
        delivery: &Delivery,
        mut headers: Vec<(&'static str, String)>,
        tally: &mut Tally,
    ) -> Result<Receipt, String> {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            tally.requests += 1;
            let (wait, last) = match self.attempt(signer, delivery, &headers).await {
                Attempt::Answered { code, body, .. } if (200..300).contains(&code) => {
                    *tally.codes.entry(code.to_string()).or_default() += 1;
                    let status = body["status"].as_str().unwrap_or("?").to_owned();
                    let key = body["key"].as_str().map(str::to_owned);
                    let label = match &key {
                        Some(key) => format!("{status}/{key}"),
                        None => status.clone(),
                    };
                    *tally.statuses.entry(label).or_default() += 1;
                    let receipt = Receipt { code, status, key };
                    if let Ok(mut answered) = self.answered.lock() {
                        answered.push((index, receipt.clone()));
                    }
                    return Ok(receipt);
                }
                Attempt::Answered {
                    code,
                    retry_after: after,
                    body,
                } => {
                    *tally.codes.entry(code.to_string()).or_default() += 1;
                    if !is_retryable(code) {
                        return Err(format!(
                            "{} (seq {}, {:?}) answered {code}: {body}",
                            delivery.event_id, delivery.sequence, delivery.copy
                        ));
                    }
                    let wait = retry_after(after.as_deref(), self.options.max_retry_after)
                        .unwrap_or_else(|| backoff(attempt, rand::thread_rng().gen()));
                    (wait, format!("{code} {body}"))
                }
                Attempt::NoAnswer(why) => {
                    *tally.codes.entry("connection_error".into()).or_default() += 1;
                    (backoff(attempt, rand::thread_rng().gen()), why)
                }
                Attempt::Refused(why) => {
                    *tally.codes.entry("tls_refused".into()).or_default() += 1;
                    return Err(format!(
                        "{} (seq {}): {why} (trusted: the system's root certificates, and \
                         those of --tls-ca-file when given)",
                        delivery.event_id, delivery.sequence
                    ));
                }
            };
            if started.elapsed() + wait > self.options.give_up_after {
                return Err(format!(
                    "{} (seq {}) gave up after {} attempts in {:.1}s; last: {last}",
                    delivery.event_id,
                    delivery.sequence,
                    attempt + 1,
                    started.elapsed().as_secs_f64()
                ));
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
            tally.retries += 1;
            // A publisher's next attempt is signed anew, so a long outage never ages it out of tolerance.
            headers = Self::sign(signer, delivery)?;
        }
    }

    async fn attempt(
        &self,
        signer: &SourceSigner,
        delivery: &Delivery,
        headers: &[(&'static str, String)],
    ) -> Attempt {
        let url = format!("{}/webhooks/{}", self.endpoint.next_url(), signer.name);
        let mut request = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(delivery.body.clone());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        for (name, value) in &delivery.headers {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => return Attempt::failed(&err),
        };
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // An answer cut off mid-body is no answer: the publisher cannot know what happened.
        match inhook::forward::outbound::read_capped(
            response,
            inhook::forward::outbound::SHOWN_BODY_BYTES,
        )
        .await
        {
            Ok((body, cut)) => Attempt::Answered {
                code,
                retry_after,
                body: serde_json::from_slice(&body).unwrap_or_else(|_| {
                    Value::String(inhook::forward::outbound::printable(&body, cut))
                }),
            },
            Err(err) => Attempt::failed(&err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_takes_its_urls_in_turn_and_keeps_at_least_one() {
        let endpoint = Endpoint::many(&["http://a/", "http://b", "http://c"]);
        let turns: Vec<String> = (0..4).map(|_| endpoint.next_url()).collect();
        assert_eq!(turns, ["http://a", "http://b", "http://c", "http://a"]);
        endpoint.remove("http://b/");
        let turns: Vec<String> = (0..4).map(|_| endpoint.clone().next_url()).collect();
        assert!(turns.iter().all(|u| u != "http://b"), "{turns:?}");
        endpoint.remove("http://a");
        endpoint.remove("http://c");
        assert_eq!(endpoint.next_url(), "http://c", "the last node stays");
        endpoint.set("http://restarted/");
        assert_eq!(endpoint.next_url(), "http://restarted");
    }

    #[test]
    fn tallies_of_several_senders_add_up() {
        let mut total = Tally {
            requests: 2,
            retries: 1,
            codes: BTreeMap::from([("200".into(), 1), ("503".into(), 1)]),
            statuses: BTreeMap::from([("applied".into(), 1)]),
        };
        total.merge(Tally {
            requests: 3,
            retries: 0,
            codes: BTreeMap::from([("200".into(), 3)]),
            statuses: BTreeMap::from([("applied".into(), 2), ("duplicate/event_id".into(), 1)]),
        });
        assert_eq!((total.requests, total.retries), (5, 1));
        assert_eq!(
            total.codes,
            BTreeMap::from([("200".into(), 4), ("503".into(), 1)])
        );
        assert_eq!(
            total.statuses,
            BTreeMap::from([("applied".into(), 3), ("duplicate/event_id".into(), 1)])
        );
    }
}
