//! What the broker-sink tests (sink_nats.rs, sink_rabbitmq.rs, sink_redis.rs) share, apart
//! from the broker: a message as read back from any broker, one audit of those messages
//! against the store's deliveries and event log (docs/forwarding.md, sinks), and the steps
//! of the chaotic scenarios. Each sink_<type>.rs keeps only its broker's side (creating,
//! reading back and removing its stream, exchange or keys) and its tests.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inhook::domain::AggregateKey;
use inhook::forward::queue::DeliveryStatus;
use inhook::store::DeliveryRecord;
use inhook_tools::simulate::{DeliveryReport, Endpoint, Plan, Publisher, Stream};
use serde_json::Value;
use tokio::task::JoinHandle;

use crate::application::DEST_SECRET;
use crate::crash::{chaos_publisher, chaos_stream_of};
use crate::forward_crash::{converged, deliveries_to, publish};
use crate::support::TestServer;

/// The headers every message carries (docs/forwarding.md, sinks); `inhook-event-type` only
/// for an event with a type, as over HTTP.
pub(crate) const HEADERS: [&str; 8] = [
    "webhook-id",
    "inhook-source",
    "inhook-event-id",
    "inhook-event-type",
    "inhook-aggregate",
    "inhook-sequence",
    "inhook-attempt",
    "content-type",
];

/// The headers a destination with a secret adds (Standard Webhooks).
pub(crate) const SIGNATURE_HEADERS: [&str; 2] = ["webhook-timestamp", "webhook-signature"];

/// One message as read back from a broker.
#[derive(Debug, Clone, Default)]
pub(crate) struct Message {
    /// The message's headers (a Redis entry's fields but `body`), in the broker's order.
    pub headers: Vec<(String, String)>,
    /// The body, byte for byte.
    pub body: Vec<u8>,
    /// What the broker keeps beside the headers (a subject, AMQP properties, …), by name.
    pub properties: Vec<(String, String)>,
}

impl Message {
    /// The header `name`'s value, or `""` when it has none.
    pub fn header(&self, name: &str) -> &str {
        value_of(&self.headers, name).unwrap_or("")
    }

    /// Whether the message has the header `name`.
    pub fn has(&self, name: &str) -> bool {
        value_of(&self.headers, name).is_some()
    }

    /// The broker property `name`'s value, or `""` when it has none.
    pub fn property(&self, name: &str) -> &str {
        value_of(&self.properties, name).unwrap_or("")
    }
}

/// The first value named `name` among `pairs`.
fn value_of<'a>(pairs: &'a [(String, String)], name: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// A test's side of a broker, as the shared steps need it.
pub(crate) trait Broker {
    /// Every message the test's stream, queue or keys hold so far, in the broker's order.
    async fn messages(&self) -> Vec<Message>;

    /// Whether what the broker keeps beside the headers is `delivery`'s (checked by the
    /// audit on every message).
    fn fits(&self, message: &Message, delivery: &DeliveryRecord) -> bool;
}

/// Whether the audit may find a message twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Duplicates {
    /// Nothing failed, or the broker drops a resend itself: every event exactly once.
    None,
    /// A resend whose acknowledgement a cut or kill lost may be stored again, with the same
    /// `webhook-id` (which a consumer dedupes by).
    Allowed,
}

/// What a broker holds, against the store's deliveries and event log.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    /// Deliveries to the destination (applied events).
    pub applied: usize,
    /// Messages read back.
    pub messages: usize,
    /// Messages beyond the first of their `webhook-id`.
    pub duplicates: usize,
    /// Deliveries not delivered, or with no message.
    pub lost: usize,
    /// Messages of no delivery.
    pub unexpected: usize,
    /// First messages of an event after that of an event of its aggregate applied later.
    pub order_violations: usize,
    /// Messages whose body is not the logged event's, byte for byte.
    pub body_mismatches: usize,
    /// Messages whose headers or broker properties are not their delivery's.
    pub header_mismatches: usize,
    /// Messages of a signed destination whose signature does not verify.
    pub bad_signatures: usize,
    /// The first few problems, for the failure message.
    pub problems: Vec<String>,
}

impl Audit {
    /// Reads `broker` back and audits it against `destination`'s deliveries on `server`;
    /// `signed` says whether the destination has [`DEST_SECRET`].
    pub async fn read(
        server: &TestServer,
        destination: &str,
        broker: &impl Broker,
        signed: bool,
    ) -> Self {
        let messages = broker.messages().await;
        Self::of(server, destination, &messages, signed, |m, d| {
            broker.fits(m, d)
        })
        .await
    }

    /// Audits `messages` against `destination`'s deliveries on `server`: every copy is
    /// checked (body, headers, `fits`, signature), and the first of each `webhook-id` for
    /// the applied order of its aggregate.
    pub async fn of(
        server: &TestServer,
        destination: &str,
        messages: &[Message],
        signed: bool,
        fits: impl Fn(&Message, &DeliveryRecord) -> bool,
    ) -> Self {
        let deliveries = deliveries_to(server, destination).await;
        let logged = server.logged().await;
        let bodies: HashMap<(&str, &str), &[u8]> = logged
            .iter()
            .map(|e| ((e.source.as_str(), e.event_id.as_str()), e.body.as_slice()))
            .collect();
        // Per webhook-id: the delivery and its place in the applied order.
        let by_webhook_id: HashMap<&str, (usize, &DeliveryRecord)> = deliveries
            .iter()
            .enumerate()
            .map(|(at, d)| (d.webhook_id.as_str(), (at, d)))
            .collect();
        let mut audit = Audit {
            applied: deliveries.len(),
            messages: messages.len(),
            ..Audit::default()
        };
        let mut seen: HashSet<&str> = HashSet::new();
        let mut latest: HashMap<&str, usize> = HashMap::new();
        for message in messages {
            let Some(&(at, delivery)) = by_webhook_id.get(message.header("webhook-id")) else {
                audit.unexpected += 1;
                continue;
            };
            let key = (delivery.source.as_str(), delivery.event_id.as_str());
            if bodies.get(&key) != Some(&message.body.as_slice()) {
                audit.body_mismatches += 1;
                audit.note(format!("body of {}", delivery.event_id));
            }
            if let Err(problem) = headers_fit(message, delivery, signed) {
                audit.header_mismatches += 1;
                audit.note(problem);
            }
            if !fits(message, delivery) {
                audit.header_mismatches += 1;
                audit.note(format!("{:?} of {}", message.properties, delivery.event_id));
            }
            if signed && !signature_verifies(message) {
                audit.bad_signatures += 1;
                audit.note(format!("signature of {}", delivery.event_id));
            }
            // The consumer's dedupe: only the first copy counts for the order.
            if !seen.insert(delivery.webhook_id.as_str()) {
                audit.duplicates += 1;
                continue;
            }
            let before = latest.entry(delivery.aggregate.as_str()).or_insert(at);
            if at < *before {
                audit.order_violations += 1;
            }
            *before = (*before).max(at);
        }
        audit.lost = deliveries
            .iter()
            .filter(|d| {
                d.status != DeliveryStatus::Delivered || !seen.contains(d.webhook_id.as_str())
            })
            .count();
        audit
    }

    /// The counts in one line, for the tests' timing lines.
    pub fn line(&self) -> String {
        format!(
            "{} deliveries applied, {} messages, {} duplicates (same webhook-id), {} lost, \
             {} order violations",
            self.applied, self.messages, self.duplicates, self.lost, self.order_violations
        )
    }

    /// Keeps `problem` if fewer than five are kept.
    fn note(&mut self, problem: String) {
        if self.problems.len() < 5 {
            self.problems.push(problem);
        }
    }

    /// Every applied event there (at least `at_least` of them), nothing else, per aggregate
    /// in applied order, byte for byte, with its headers and a verifying signature; twice
    /// only where `duplicates` allows.
    pub fn assert_clean(&self, duplicates: Duplicates, at_least: usize) {
        assert_eq!(self.lost, 0, "applied events not read back: {self:?}");
        assert_eq!(self.unexpected, 0, "messages of no delivery: {self:?}");
        assert_eq!(self.order_violations, 0, "out of applied order: {self:?}");
        assert_eq!(
            self.body_mismatches, 0,
            "a body not byte for byte: {self:?}"
        );
        assert_eq!(
            self.header_mismatches, 0,
            "metadata not the delivery's: {self:?}"
        );
        assert_eq!(
            self.bad_signatures, 0,
            "a signature that does not verify: {self:?}"
        );
        if duplicates == Duplicates::None {
            assert_eq!(self.duplicates, 0, "a webhook-id stored twice: {self:?}");
        }
        assert!(self.applied >= at_least, "too few events: {self:?}");
    }
}

/// Whether `message`'s headers are exactly the contract's (the signature's too when
/// `signed`), valued as `delivery`; else what differs.
fn headers_fit(message: &Message, delivery: &DeliveryRecord, signed: bool) -> Result<(), String> {
    let mut expected: Vec<&str> = HEADERS
        .into_iter()
        .filter(|h| *h != "inhook-event-type" || !delivery.event_type.is_empty())
        .collect();
    if signed {
        expected.extend(SIGNATURE_HEADERS);
    }
    expected.sort_unstable();
    let mut names: Vec<&str> = message.headers.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    if names != expected {
        return Err(format!("headers {names:?} of {}", delivery.event_id));
    }
    let values = [
        ("webhook-id", delivery.webhook_id.clone()),
        ("inhook-source", delivery.source.clone()),
        ("inhook-event-id", delivery.event_id.clone()),
        ("inhook-event-type", delivery.event_type.clone()),
        ("inhook-sequence", delivery.sequence.to_string()),
        (
            "inhook-aggregate",
            AggregateKey::text_of_stored(&delivery.aggregate),
        ),
        ("content-type", "application/json".to_owned()),
    ];
    for (name, value) in values {
        if message.header(name) != value {
            return Err(format!("{name} of {}", delivery.event_id));
        }
    }
    if !message
        .header("inhook-attempt")
        .parse::<u32>()
        .is_ok_and(|n| n >= 1)
    {
        return Err(format!("inhook-attempt of {}", delivery.event_id));
    }
    Ok(())
}

/// Whether the message's Standard Webhooks signature verifies with [`DEST_SECRET`].
fn signature_verifies(message: &Message) -> bool {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &message.headers {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.as_bytes()),
            reqwest::header::HeaderValue::from_str(value),
        ) {
            headers.insert(name, value);
        }
    }
    inhook::ingress::signature::verify(
        inhook::ingress::signature::Scheme::StandardWebhooks,
        &headers,
        &message.body,
        &[inhook::ingress::signature::Secret::new(DEST_SECRET)],
        crate::support::now_s(),
        300,
    )
    .is_ok()
}

/// A chaotic stream of both seed sources and the publisher that sends it.
pub(crate) struct Chaos {
    /// What is sent, and what the read API should show after.
    pub stream: Stream,
    /// The requests that send it.
    pub plan: Arc<Plan>,
    /// Sends the plan, and checks the read API.
    pub publisher: Publisher,
    /// Where the publisher sends (a restarted node is set on it).
    pub endpoint: Endpoint,
    /// When it was made, for the tests' timing lines.
    pub started: Instant,
}

impl Chaos {
    /// `events` events over `aggregates` aggregates from `seed`, to be sent to `endpoint`
    /// `concurrency` at a time at `rate` requests a second.
    pub fn new(
        endpoint: Endpoint,
        (seed, events, aggregates): (u64, usize, usize),
        concurrency: usize,
        rate: u64,
    ) -> Self {
        let (stream, plan) = chaos_stream_of(seed, events, aggregates);
        Chaos {
            stream,
            plan,
            publisher: chaos_publisher(endpoint.clone(), concurrency, rate),
            endpoint,
            started: Instant::now(),
        }
    }

    /// Starts sending in the background.
    pub fn send(&self) -> JoinHandle<DeliveryReport> {
        publish(&self.publisher, &self.plan)
    }

    /// Sends it all, every request accepted.
    pub async fn send_all(&self) {
        sent(self.send()).await;
    }

    /// Seconds since it was made.
    pub fn elapsed_s(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

/// Waits for the background `sending`, and asserts every request was accepted.
pub(crate) async fn sent(sending: JoinHandle<DeliveryReport>) {
    let report = sending.await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
}

/// Waits until `chaos` converged in the read API and every delivery to `destination` is
/// delivered and read back from `broker`, each up to `within`.
pub(crate) async fn drain(
    chaos: &Chaos,
    server: &TestServer,
    destination: &str,
    broker: &impl Broker,
    within: Duration,
) {
    converged(&chaos.publisher, &chaos.stream, within).await;
    let deadline = Instant::now() + within;
    loop {
        let deliveries = deliveries_to(server, destination).await;
        let read: HashSet<String> = broker
            .messages()
            .await
            .iter()
            .map(|m| m.header("webhook-id").to_owned())
            .collect();
        let delivered = deliveries
            .iter()
            .filter(|d| d.status == DeliveryStatus::Delivered)
            .count();
        if delivered == deliveries.len() && deliveries.iter().all(|d| read.contains(&d.webhook_id))
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not forwarded in time: {delivered} of {} delivered, {} read back",
            deliveries.len(),
            read.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// SIGKILLs and restarts `server` up to three times while `chaos` is `sending`, at random
/// moments, pointing the publisher at each restart; the number of kills (at least two).
pub(crate) async fn kill_while_sending(
    server: &mut TestServer,
    chaos: &Chaos,
    sending: &JoinHandle<DeliveryReport>,
) -> usize {
    let mut kills = 0;
    while kills < 3 && !sending.is_finished() {
        let pause = 500 + rand::random::<u64>() % 700;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        tokio::task::block_in_place(|| server.restart());
        chaos.endpoint.set(&server.url);
        kills += 1;
    }
    assert!(
        kills >= 2,
        "the stream ended after {kills} kills: send slower"
    );
    kills
}

/// Three nodes on one PostgreSQL database; the second is SIGKILLed mid-run.
pub(crate) struct ThreeNodes {
    /// The node the test reads the store through.
    pub first: TestServer,
    /// The node killed (kept so its directory outlives the test).
    _second: TestServer,
    /// The other survivor, kept running to the end.
    _third: TestServer,
}

impl ThreeNodes {
    /// Starts three nodes with `sources`, sends `chaos` to them all (`concurrency` 12 at
    /// `rate`), kills the second after `pause_ms` plus up to a second at random, and waits
    /// until everything was sent.
    pub async fn one_killed(
        sources: &str,
        seed: (u64, usize, usize),
        rate: u64,
        pause_ms: u64,
    ) -> (Self, Chaos) {
        let first = TestServer::spawn_with_sources(sources).await;
        let mut second = TestServer::join_with_sources(&first, sources).await;
        let third = TestServer::join_with_sources(&first, sources).await;
        let endpoint = Endpoint::many(&[&first.url, &second.url, &third.url]);
        let chaos = Chaos::new(endpoint, seed, 12, rate);
        let sending = chaos.send();
        let pause = pause_ms + rand::random::<u64>() % 1_000;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        assert!(
            !sending.is_finished(),
            "the stream ended before the kill: send slower"
        );
        chaos.endpoint.remove(&second.url);
        tokio::task::block_in_place(|| second.kill9());
        sent(sending).await;
        let nodes = ThreeNodes {
            first,
            _second: second,
            _third: third,
        };
        (nodes, chaos)
    }
}

/// One broker's run of the crash scenarios: what is read back, the destination, and what
/// the audit allows. Each sink suite fills one in; the scenarios are written once here.
pub(crate) struct Crashes<'a, B> {
    /// The broker's name in the printed summary.
    pub label: &'a str,
    /// The test's stream, queue or keys, read back.
    pub broker: &'a B,
    /// The `[[destinations]]` table.
    pub config: &'a str,
    /// The destination's name.
    pub destination: &'a str,
    /// Whether the destination signs with [`DEST_SECRET`].
    pub signed: bool,
    /// How long the broker may take to hold every delivery after the publisher is done.
    pub within: Duration,
    /// Whether a resend may be stored twice.
    pub duplicates: Duplicates,
    /// The fewest messages the broker must hold.
    pub at_least: usize,
}

impl<B: Broker> Crashes<'_, B> {
    /// The single node SIGKILLed mid-run and restarted, three times, while `plan` (seed,
    /// events, aggregates) is sent: nothing lost, per aggregate in applied order.
    pub async fn through_sigkills(&self, plan: (u64, usize, usize)) {
        let mut server = TestServer::spawn_with_sources(self.config).await;
        let chaos = Chaos::new(Endpoint::new(&server.url), plan, 8, 200);
        let sending = chaos.send();
        let kills = kill_while_sending(&mut server, &chaos, &sending).await;
        sent(sending).await;
        drain(&chaos, &server, self.destination, self.broker, self.within).await;
        let audit = Audit::read(&server, self.destination, self.broker, self.signed).await;
        let (line, took) = (audit.line(), chaos.elapsed_s());
        let backend = crate::support::Backend::fresh_kind();
        println!(
            "{} sigkills ({backend}): {kills} kills, {line}, in {took:.1}s",
            self.label
        );
        audit.assert_clean(self.duplicates, self.at_least);
    }

    /// Three nodes on one PostgreSQL database, the second SIGKILLed mid-run (see
    /// [`ThreeNodes::one_killed`] for `rate` and `pause_ms`): the others take over its
    /// leased deliveries; nothing lost, per aggregate in applied order. Skipped, saying so,
    /// on SQLite.
    pub async fn three_nodes_one_killed(
        &self,
        plan: (u64, usize, usize),
        rate: u64,
        pause_ms: u64,
    ) {
        if crate::support::Backend::fresh_kind() != "postgres" {
            eprintln!(
                "several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE"
            );
            return;
        }
        let (nodes, chaos) = ThreeNodes::one_killed(self.config, plan, rate, pause_ms).await;
        drain(
            &chaos,
            &nodes.first,
            self.destination,
            self.broker,
            self.within,
        )
        .await;
        let audit = Audit::read(&nodes.first, self.destination, self.broker, self.signed).await;
        let (line, took) = (audit.line(), chaos.elapsed_s());
        println!(
            "{} three nodes (postgres), one killed: {line}, in {took:.1}s",
            self.label
        );
        audit.assert_clean(self.duplicates, self.at_least);
    }
}

/// A `[[destinations]]` table `name` of `kind` at `url` for both seed sources, with the
/// short lease and backoff the chaotic runs need (`timeout_s`, `max_attempts` as given);
/// `specific` holds the broker's own keys (subject, stream, exchange…), `extra` any more.
pub(crate) fn destination_table(
    name: &str,
    kind: &str,
    url: &str,
    specific: &str,
    (timeout_s, max_attempts): (u64, u32),
    extra: &str,
) -> String {
    format!(
        r#"
[[destinations]]
name = "{name}"
type = "{kind}"
url = "{url}"
{specific}
sources = ["presence", "save-game"]
timeout_s = {timeout_s}
lease_margin_s = 1
max_attempts = {max_attempts}
retry_base_s = 1
retry_max_delay_s = 1
{extra}
"#
    )
}

/// The destination `name` as `GET /v1/destinations` lists it.
pub(crate) async fn listed(server: &TestServer, name: &str) -> Value {
    let reply = server.get("/v1/destinations").await;
    reply.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {}", reply.body))
}

/// Polls `GET /v1/destinations` until `name`'s item satisfies `done`, up to `within`.
pub(crate) async fn wait_listed(
    server: &TestServer,
    name: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let item = listed(server, name).await;
        if done(&item) {
            return item;
        }
        assert!(Instant::now() < deadline, "never came to pass: {item}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to 10 s) until `server`'s log holds every one of `words`; the log.
pub(crate) async fn wait_logged(server: &TestServer, words: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
        if words.iter().all(|w| log.contains(w)) {
            return log;
        }
        assert!(Instant::now() < deadline, "never logged {words:?}: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A loopback port nothing listens on.
pub(crate) fn closed_port() -> u16 {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    probe.local_addr().unwrap().port()
}
