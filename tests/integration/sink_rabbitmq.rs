//! Issue #27, the RabbitMQ sink (docs/contract.md, sinks): the real server binary forwards the
//! seed sources' chaotic streams to a `type = "rabbitmq"` destination on the machine's broker
//! (127.0.0.1:5672, guest/guest), and a consumer of the test's own reads the messages back:
//! each applied event arrives (once when nothing fails), per aggregate in applied order, its
//! body byte for byte and its metadata in the message's properties and headers; through an
//! outage, SIGKILLs and three nodes on PostgreSQL nothing is lost or reordered (a resend after
//! a cut carries the same `webhook-id`, which a consumer dedupes by). Every test uses its own
//! exchange and queue, named with a random suffix, and deletes them at its end.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use inhook::forward::queue::DeliveryStatus;
use inhook::store::{DeliveryFilter, DeliveryRecord};
use inhook::tools::simulate::{expected_states, Endpoint, Plan, Publisher, Stream};
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::{json, Value};

use crate::application::DEST_SECRET;
use crate::crash::{chaos_publisher, chaos_stream_of};
use crate::support::tcp_proxy::TcpProxy;
use crate::support::{Backend, TestServer};

/// The machine's RabbitMQ.
const BROKER: &str = "127.0.0.1:5672";

/// The headers every message carries (the destinations here have a secret, so the two
/// signature headers too).
const HEADERS: [&str; 10] = [
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "inhook-source",
    "inhook-event-id",
    "inhook-event-type",
    "inhook-aggregate",
    "inhook-sequence",
    "inhook-attempt",
    "content-type",
];

/// One message as the consumer read it.
#[derive(Debug, Clone)]
struct Received {
    routing_key: String,
    message_id: Option<String>,
    content_type: Option<String>,
    delivery_mode: Option<u8>,
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

impl Received {
    fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(String::as_str).unwrap_or("")
    }
}

/// The test's own side of the broker: an exchange and a consumer of a queue bound to it for
/// every routing key, recording what arrives in arrival order.
struct Broker {
    exchange: String,
    queue: String,
    connection: Connection,
    channel: Channel,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Broker {
    /// A connection of the test's own to the broker.
    async fn connect() -> Connection {
        Connection::connect(
            &format!("amqp://guest:guest@{BROKER}/%2f"),
            ConnectionProperties::default(),
        )
        .await
        .expect("RabbitMQ on 127.0.0.1:5672 (guest/guest)")
    }

    /// A fresh exchange name (declared as a durable topic exchange when `declare`), no queue
    /// bound yet.
    async fn new(declare: bool) -> Self {
        let suffix = format!("{:016x}", rand::random::<u64>());
        let connection = Self::connect().await;
        let channel = connection.create_channel().await.expect("channel");
        let exchange = format!("inhook-test-{suffix}");
        if declare {
            channel
                .exchange_declare(
                    exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .expect("declare the exchange");
        }
        Broker {
            queue: format!("inhook-test-{suffix}"),
            exchange,
            connection,
            channel,
            received: Arc::default(),
        }
    }

    /// A fresh exchange with the consumer's queue bound to it.
    async fn bound() -> Self {
        let broker = Self::new(true).await;
        broker.bind().await;
        broker
    }

    /// Declares the consumer's queue (exclusive: gone with the test's connection), binds it
    /// to the exchange for every routing key and consumes it.
    async fn bind(&self) {
        self.channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    exclusive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("declare the queue");
        self.channel
            .queue_bind(
                self.queue.as_str().into(),
                self.exchange.as_str().into(),
                "#".into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .expect("bind the queue");
        let mut consumer = self
            .channel
            .basic_consume(
                self.queue.as_str().into(),
                "inhook-test".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let received = Arc::clone(&self.received);
        tokio::spawn(async move {
            while let Some(Ok(delivery)) = consumer.next().await {
                let properties = &delivery.properties;
                let headers = properties
                    .headers()
                    .as_ref()
                    .map(|table| {
                        table
                            .inner()
                            .iter()
                            .map(|(name, value)| {
                                let value = match value {
                                    AMQPValue::LongString(text) => text.to_string(),
                                    other => format!("{other:?}"),
                                };
                                (name.to_string(), value)
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                received.lock().unwrap().push(Received {
                    routing_key: delivery.routing_key.to_string(),
                    message_id: properties.message_id().as_ref().map(|s| s.to_string()),
                    content_type: properties.content_type().as_ref().map(|s| s.to_string()),
                    delivery_mode: *properties.delivery_mode(),
                    headers,
                    body: delivery.data.clone(),
                });
            }
        });
    }

    /// What arrived so far, in arrival order.
    fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// Whether the exchange exists (a passive declare on a throwaway channel).
    async fn exchange_exists(&self) -> bool {
        let channel = self.connection.create_channel().await.expect("channel");
        channel
            .exchange_declare(
                self.exchange.as_str().into(),
                ExchangeKind::Topic,
                ExchangeDeclareOptions {
                    passive: true,
                    ..ExchangeDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .is_ok()
    }

    /// Deletes the exchange (the exclusive queue goes with the connection).
    async fn clean_up(self) {
        let channel = self.connection.create_channel().await.expect("channel");
        let _ = channel
            .exchange_delete(
                self.exchange.as_str().into(),
                ExchangeDeleteOptions::default(),
            )
            .await;
        let _ = self.connection.close(200, "OK".into()).await;
    }
}

/// A `type = "rabbitmq"` destination named `name` to `exchange` at `url`, for both seed
/// sources, signed, with the short timeouts and backoff of forward_crash.rs.
fn destination(name: &str, url: &str, exchange: &str, extra: &str) -> String {
    format!(
        r#"
[[destinations]]
name = "{name}"
type = "rabbitmq"
url = "{url}"
exchange = "{exchange}"
routing_key = "{{source}}.{{aggregate}}"
sources = ["presence", "save-game"]
secret = "{DEST_SECRET}"
timeout_s = 2
lease_margin_s = 1
max_attempts = 50
retry_base_s = 1
retry_max_delay_s = 1
{extra}
"#
    )
}

fn amqp_url(address: &str) -> String {
    format!("amqp://guest:guest@{address}/%2f")
}

/// Every delivery of `destination`, oldest (first applied) first.
async fn deliveries(server: &TestServer, destination: &str) -> Vec<DeliveryRecord> {
    let mut items = server
        .store()
        .await
        .deliveries(destination, &DeliveryFilter::default(), 1_000_000, None)
        .await
        .expect("deliveries")
        .items;
    items.reverse();
    items
}

/// Sends `plan` through `publisher` in the background.
fn publish(
    publisher: &Publisher,
    plan: &Arc<Plan>,
) -> tokio::task::JoinHandle<inhook::tools::simulate::DeliveryReport> {
    let (publisher, plan) = (publisher.clone(), Arc::clone(plan));
    tokio::spawn(async move { publisher.deliver(plan).await })
}

/// Waits until the stream converged and every delivery of `destination` is delivered and read
/// back by the consumer.
async fn drain(
    publisher: &Publisher,
    stream: &Stream,
    server: &TestServer,
    destination: &str,
    broker: &Broker,
    within: Duration,
) {
    let mismatches = publisher
        .converge(Arc::new(expected_states(stream)), within)
        .await
        .expect("read API");
    assert!(
        mismatches.is_empty(),
        "{} aggregates differ",
        mismatches.len()
    );
    let deadline = Instant::now() + within;
    loop {
        let deliveries = deliveries(server, destination).await;
        let read: HashSet<String> = broker
            .received()
            .into_iter()
            .filter_map(|r| r.message_id)
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
            "not forwarded in time: {delivered} of {} delivered, {} read",
            deliveries.len(),
            read.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the consumer read, against the store's deliveries and event log.
#[derive(Debug, Default)]
struct Audit {
    applied: usize,
    messages: usize,
    /// Messages beyond the first of their `webhook-id`.
    duplicates: usize,
    /// Messages first read after a later-applied one of their aggregate.
    order_violations: usize,
    /// Deliveries never read.
    lost: usize,
    /// Messages of no delivery.
    unexpected: usize,
    body_mismatches: usize,
    /// Messages whose properties or headers are not the delivery's.
    header_mismatches: usize,
    bad_signatures: usize,
}

impl Audit {
    async fn of(server: &TestServer, destination: &str, received: &[Received]) -> Self {
        let deliveries = deliveries(server, destination).await;
        let logged = server.logged().await;
        let bodies: HashMap<(&str, &str), &[u8]> = logged
            .iter()
            .map(|e| ((e.source.as_str(), e.event_id.as_str()), e.body.as_slice()))
            .collect();
        // Per webhook-id: the delivery and its place in its aggregate's applied order.
        let mut place: HashMap<&str, (&DeliveryRecord, usize)> = HashMap::new();
        let mut per_aggregate: HashMap<(&str, &str), usize> = HashMap::new();
        for d in &deliveries {
            let n = per_aggregate
                .entry((d.source.as_str(), d.aggregate.as_str()))
                .or_default();
            place.insert(d.webhook_id.as_str(), (d, *n));
            *n += 1;
        }
        let mut audit = Audit {
            applied: deliveries.len(),
            messages: received.len(),
            ..Audit::default()
        };
        let mut seen: HashSet<&str> = HashSet::new();
        let mut latest: HashMap<(&str, &str), usize> = HashMap::new();
        for message in received {
            let id = message.message_id.as_deref().unwrap_or_default();
            let Some((delivery, at)) = place.get(id) else {
                audit.unexpected += 1;
                continue;
            };
            if !seen.insert(id) {
                audit.duplicates += 1;
                continue;
            }
            let key = (delivery.source.as_str(), delivery.aggregate.as_str());
            if latest.get(&key).is_some_and(|latest| at < latest) {
                audit.order_violations += 1;
            }
            let latest = latest.entry(key).or_insert(*at);
            *latest = (*latest).max(*at);
            let body = bodies.get(&(delivery.source.as_str(), delivery.event_id.as_str()));
            if body != Some(&message.body.as_slice()) {
                audit.body_mismatches += 1;
            }
            if !headers_match(message, delivery) {
                audit.header_mismatches += 1;
            }
            if !signature_verifies(message) {
                audit.bad_signatures += 1;
            }
        }
        audit.lost = deliveries
            .iter()
            .filter(|d| !seen.contains(d.webhook_id.as_str()))
            .count();
        audit
    }

    /// Nothing lost, in order, byte for byte, the delivery's metadata.
    fn assert_clean(&self) {
        assert_eq!(self.lost, 0, "applied events never read: {self:?}");
        assert_eq!(self.order_violations, 0, "out of applied order: {self:?}");
        assert_eq!(self.unexpected, 0, "messages of no delivery: {self:?}");
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
    }
}

/// The message's properties and headers are its delivery's: `message_id` and `webhook-id`
/// its webhook id, persistent, the routing key rendered from its source and aggregate,
/// every header present.
fn headers_match(message: &Received, delivery: &DeliveryRecord) -> bool {
    let routing_key_prefix = format!("{}.", delivery.source);
    // An event without a type has no inhook-event-type header, as over HTTP.
    let expected: Vec<&str> = HEADERS
        .into_iter()
        .filter(|h| *h != "inhook-event-type" || !delivery.event_type.is_empty())
        .collect();
    expected.iter().all(|h| message.headers.contains_key(*h))
        && message.headers.len() == expected.len()
        && message.header("webhook-id") == delivery.webhook_id
        && message.message_id.as_deref() == Some(delivery.webhook_id.as_str())
        && message.header("inhook-source") == delivery.source
        && message.header("inhook-event-id") == delivery.event_id
        && message.header("inhook-event-type") == delivery.event_type
        && message.header("inhook-sequence") == delivery.sequence.to_string()
        && message
            .header("inhook-attempt")
            .parse::<u32>()
            .is_ok_and(|n| n >= 1)
        && message.content_type.as_deref() == Some(message.header("content-type"))
        && message.delivery_mode == Some(2)
        && message.routing_key.starts_with(&routing_key_prefix)
}

/// The Standard Webhooks signature of the message verifies with the destination's secret.
fn signature_verifies(message: &Received) -> bool {
    let mut headers = reqwest::header::HeaderMap::new();
    for (name, value) in &message.headers {
        if let (Ok(name), Ok(value)) = (
            reqwest::header::HeaderName::from_bytes(name.as_bytes()),
            reqwest::header::HeaderValue::from_str(value),
        ) {
            headers.insert(name, value);
        }
    }
    inhook::signature::verify(
        inhook::signature::Scheme::StandardWebhooks,
        &headers,
        &message.body,
        &[inhook::signature::Secret::new(DEST_SECRET)],
        crate::support::now_s(),
        300,
    )
    .is_ok()
}

/// The `GET /v1/destinations` item of `name`.
async fn listed(server: &TestServer, name: &str) -> Value {
    let reply = server.get("/v1/destinations").await;
    reply.body["items"]
        .as_array()
        .and_then(|items| items.iter().find(|d| d["name"] == name))
        .cloned()
        .unwrap_or(Value::Null)
}

/// Polls `GET /v1/destinations` until `name`'s circuit is `circuit`, up to `within`.
async fn wait_circuit(server: &TestServer, name: &str, circuit: &str, within: Duration) -> Value {
    let deadline = Instant::now() + within;
    loop {
        let item = listed(server, name).await;
        if item["circuit"] == circuit {
            return item;
        }
        assert!(
            Instant::now() < deadline,
            "the circuit never became {circuit}: {item}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A POST to the admin API.
async fn admin_post(server: &TestServer, path: &str, body: Value) -> (u16, Value) {
    let answer = reqwest::Client::new()
        .post(format!("{}{path}", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    let code = answer.status().as_u16();
    (code, answer.json().await.unwrap_or(Value::Null))
}

/// Reordered, duplicated, in-order (inventory deltas) and latest-wins (progress, presence)
/// events over many aggregates arrive once each, per aggregate in applied order, byte for
/// byte, with their metadata as the message's properties and headers; the exchange is
/// declared by inhook (`declare = true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_forwards_a_chaotic_stream_once_each_in_order() {
    let broker = Broker::new(false).await;
    let started = Instant::now();
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &broker.exchange,
        "declare = true",
    ))
    .await;
    assert!(broker.exchange_exists().await, "declare = true made it");
    broker.bind().await;
    let (stream, plan) = chaos_stream_of(0x0027_a001, 600, 30);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 8, 400);
    let report = publish(&publisher, &plan).await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(
        &publisher,
        &stream,
        &server,
        "amqp",
        &broker,
        Duration::from_secs(20),
    )
    .await;
    let received = broker.received();
    let audit = Audit::of(&server, "amqp", &received).await;
    println!(
        "rabbitmq sink: {} events sent, {} applied, {} messages read in {:.1}s",
        stream.event_count(),
        audit.applied,
        audit.messages,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean();
    assert!(
        audit.applied > 200,
        "too few events to test much: {audit:?}"
    );
    assert_eq!(audit.duplicates, 0, "a message read twice: {audit:?}");
    assert!(
        received.iter().all(|m| m.header("inhook-attempt") == "1"),
        "nothing failed, so every message went on its first attempt"
    );
    let item = listed(&server, "amqp").await;
    assert_eq!(item["type"], "rabbitmq", "{item}");
    assert_eq!(item["circuit"], "closed", "{item}");
    drop(server);
    broker.clean_up().await;
}

/// The broker taken away (through a proxy the test cuts) and brought back: the circuit opens,
/// closes again after its probe, and nothing is lost or reordered; a message whose confirm
/// the cut lost may come twice, with one `webhook-id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_outage_opens_the_circuit_and_loses_nothing() {
    let broker = Broker::bound().await;
    let proxy = TcpProxy::start(BROKER.parse().unwrap()).await;
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(&proxy.addr().to_string()),
        &broker.exchange,
        "",
    ))
    .await;
    let started = Instant::now();
    let (stream, plan) = chaos_stream_of(0x0027_a002, 600, 30);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 8, 150);
    let sending = publish(&publisher, &plan);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.cut();
    let open = wait_circuit(&server, "amqp", "open", Duration::from_secs(10)).await;
    assert_eq!(open["type"], "rabbitmq", "{open}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();
    let report = sending.await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    wait_circuit(&server, "amqp", "closed", Duration::from_secs(15)).await;
    drain(
        &publisher,
        &stream,
        &server,
        "amqp",
        &broker,
        Duration::from_secs(20),
    )
    .await;
    let audit = Audit::of(&server, "amqp", &broker.received()).await;
    println!(
        "rabbitmq outage: {} applied, {} messages read ({} duplicates) in {:.1}s",
        audit.applied,
        audit.messages,
        audit.duplicates,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean();
    drop(server);
    broker.clean_up().await;
}

/// SIGKILLs of the single node mid-run: after each restart the deliveries it had on the wire
/// go again with their `webhook-id`; nothing is lost and, deduped by `webhook-id` as a
/// consumer would, every aggregate's messages come in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_sigkills_lose_nothing_and_keep_order() {
    let broker = Broker::bound().await;
    let mut server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &broker.exchange,
        "",
    ))
    .await;
    let started = Instant::now();
    let (stream, plan) = chaos_stream_of(0x0027_a003, 900, 40);
    let endpoint = Endpoint::new(&server.url);
    let publisher = chaos_publisher(endpoint.clone(), 8, 200);
    let sending = publish(&publisher, &plan);
    let mut kills = 0;
    while kills < 3 && !sending.is_finished() {
        let pause = 500 + rand::random::<u64>() % 700;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        tokio::task::block_in_place(|| server.restart());
        endpoint.set(&server.url);
        kills += 1;
    }
    let report = sending.await.expect("publisher task");
    assert!(
        kills >= 2,
        "the stream ended after {kills} kills: send slower"
    );
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(
        &publisher,
        &stream,
        &server,
        "amqp",
        &broker,
        Duration::from_secs(20),
    )
    .await;
    let audit = Audit::of(&server, "amqp", &broker.received()).await;
    println!(
        "rabbitmq sigkills ({}): {kills} kills, {} applied, {} messages read ({} duplicates) \
         in {:.1}s",
        Backend::fresh_kind(),
        audit.applied,
        audit.messages,
        audit.duplicates,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean();
    drop(server);
    broker.clean_up().await;
}

/// Three nodes on one PostgreSQL database, one SIGKILLed mid-run: the others take over its
/// leased deliveries; nothing lost, per aggregate in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_three_nodes_one_killed_lose_nothing_and_keep_order() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let broker = Broker::bound().await;
    let config = destination("amqp", &amqp_url(BROKER), &broker.exchange, "");
    let first = TestServer::spawn_with_sources(&config).await;
    let mut second = TestServer::join_with_sources(&first, &config).await;
    let third = TestServer::join_with_sources(&first, &config).await;
    let started = Instant::now();
    let (stream, plan) = chaos_stream_of(0x0027_a004, 900, 40);
    let endpoint = Endpoint::many(&[&first.url, &second.url, &third.url]);
    let publisher = chaos_publisher(endpoint.clone(), 12, 250);
    let sending = publish(&publisher, &plan);
    tokio::time::sleep(Duration::from_millis(1_000 + rand::random::<u64>() % 1_000)).await;
    assert!(!sending.is_finished(), "the stream ended before the kill");
    tokio::task::block_in_place(|| second.kill9());
    endpoint.remove(&second.url);
    let report = sending.await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(
        &publisher,
        &stream,
        &first,
        "amqp",
        &broker,
        Duration::from_secs(25),
    )
    .await;
    let audit = Audit::of(&first, "amqp", &broker.received()).await;
    println!(
        "rabbitmq three nodes (postgres), one killed: {} applied, {} messages read \
         ({} duplicates) in {:.1}s",
        audit.applied,
        audit.messages,
        audit.duplicates,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean();
    drop(third);
    drop(second);
    drop(first);
    broker.clean_up().await;
}

/// The server's log once it holds `needle` (the log is written as the server goes), up to 10 s.
async fn log_with(server: &TestServer, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
        if log.contains(needle) {
            return log;
        }
        assert!(Instant::now() < deadline, "{needle:?} never logged: {log}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A missing exchange without `declare = true` does not stop the start: it is logged naming
/// the key, and the deliveries fail (the broker's reason in `last_error`) and retry until
/// someone declares it; then they arrive. An exchange of another type with `declare = true`
/// is logged the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_a_missing_exchange_is_logged_at_start_and_retried_until_it_exists() {
    let broker = Broker::new(false).await;
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &broker.exchange,
        "",
    ))
    .await;
    let log = log_with(&server, "declare = true creates it").await;
    let line = log
        .lines()
        .find(|l| l.contains("declare = true creates it"))
        .unwrap();
    println!("missing exchange: {line}");
    assert!(line.contains("exchange"), "{line}");
    assert!(line.contains(&broker.exchange), "{line}");
    assert!(!log.contains("guest:guest"), "{log}");
    assert!(!broker.exchange_exists().await, "nothing was declared");

    let save = json!({"event_id": "evt_missing_1", "event_type": "progress.saved",
        "player_id": "missing", "save_slot": "s", "sequence": 1,
        "idempotency_key": "evt_missing_1", "data": {}});
    assert_eq!(server.post_save(&save).await.code, 202);
    let deadline = Instant::now() + Duration::from_secs(15);
    let failed = loop {
        let item = listed(&server, "amqp").await;
        if item["last_error"].is_string() {
            break item;
        }
        assert!(Instant::now() < deadline, "no failed attempt: {item}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("publishing to a missing exchange: {failed}");
    let error = failed["last_error"].as_str().unwrap();
    assert!(error.contains("NOT_FOUND"), "{error}");
    assert!(error.contains(&broker.exchange), "{error}");

    // Declared and bound: the retry delivers it.
    broker
        .channel
        .exchange_declare(
            broker.exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare the exchange");
    broker.bind().await;
    let deadline = Instant::now() + Duration::from_secs(15);
    while broker.received().is_empty() {
        assert!(Instant::now() < deadline, "never delivered once declared");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        broker.received()[0].header("inhook-event-id"),
        "evt_missing_1"
    );
    drop(server);

    // An exchange of another type: `declare = true` is refused by the broker, and logged.
    let direct = Broker::new(false).await;
    direct
        .channel
        .exchange_declare(
            direct.exchange.as_str().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("declare a direct exchange");
    let mismatched = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &direct.exchange,
        "declare = true",
    ))
    .await;
    let log = log_with(&mismatched, "was refused by the broker").await;
    let line = log
        .lines()
        .find(|l| l.contains("was refused by the broker"))
        .unwrap();
    println!("mismatched exchange: {line}");
    assert!(line.contains("exchange"), "{line}");
    assert!(line.contains(&direct.exchange), "{line}");
    drop(mismatched);
    direct.clean_up().await;
    broker.clean_up().await;
}

/// The URL's credentials (here from `INHOOK_DEST_<NAME>_URL`, a password the broker refuses)
/// never show in `GET /v1/destinations`, the server's log, or `inhook deliveries`; the refusal
/// is retried like a connection failure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_credentials_never_show() {
    let broker = Broker::bound().await;
    let password = format!("pw-{:016x}", rand::random::<u64>());
    let url = format!("amqp://guest:{password}@{BROKER}/%2f");
    let config = destination(
        "orders-amqp",
        "amqp://127.0.0.1:5672/%2f",
        &broker.exchange,
        "",
    );
    let env_var = inhook::config::destination_url_env_var("orders-amqp");
    let server =
        TestServer::spawn_with_sources_env(&config, &[(env_var.as_str(), url.as_str())]).await;
    let save = json!({"event_id": "evt_cred_1", "event_type": "progress.saved",
        "player_id": "cred", "save_slot": "s", "sequence": 1,
        "idempotency_key": "evt_cred_1", "data": {}});
    assert_eq!(server.post_save(&save).await.code, 202);
    let deadline = Instant::now() + Duration::from_secs(15);
    let item = loop {
        let item = listed(&server, "orders-amqp").await;
        if item["last_error"].is_string() {
            break item;
        }
        assert!(Instant::now() < deadline, "no failed attempt: {item}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let shown = item.to_string();
    println!("a refused login: {shown}");
    assert!(!shown.contains(&password), "{shown}");
    assert_eq!(item["type"], "rabbitmq", "{shown}");
    assert!(item["url"].as_str().unwrap().contains("***@"), "{shown}");
    let (ok, listing) = server.cli(&["deliveries", "--destination", "orders-amqp"]);
    assert!(ok, "{listing}");
    assert!(listing.contains("evt_cred_1"), "{listing}");
    assert!(!listing.contains(&password), "{listing}");
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(!log.contains(&password), "the password in the log");
    let all = server
        .get_text("/v1/destinations/orders-amqp/deliveries")
        .await;
    assert!(!all.contains(&password), "{all}");
    assert!(broker.received().is_empty());
    drop(server);
    broker.clean_up().await;
}

/// Messages no queue is bound for come back (mandatory): each attempt is refused naming the
/// exchange and routing key, the circuit stays closed, and they go dead; once a queue is
/// bound, a bulk replay delivers them, per aggregate in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_unroutable_messages_die_and_a_replay_delivers_them_in_order() {
    let broker = Broker::new(true).await;
    let config = destination("amqp", &amqp_url(BROKER), &broker.exchange, "")
        .replace("max_attempts = 50", "max_attempts = 2");
    let server = TestServer::spawn_with_sources(&config).await;
    let (stream, plan) = chaos_stream_of(0x0027_a005, 60, 4);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 4, 200);
    let report = publish(&publisher, &plan).await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    let mismatches = publisher
        .converge(Arc::new(expected_states(&stream)), Duration::from_secs(15))
        .await
        .expect("read API");
    assert!(mismatches.is_empty());
    // Every delivery dead or waiting behind a dead in-order one, none delivered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let all = deliveries(&server, "amqp").await;
        let dead: Vec<&DeliveryRecord> = all
            .iter()
            .filter(|d| d.status == DeliveryStatus::Dead)
            .collect();
        let moving = all.iter().any(|d| {
            matches!(
                d.status,
                DeliveryStatus::InFlight | DeliveryStatus::Retrying
            )
        });
        if !dead.is_empty() && !moving {
            assert!(all.iter().all(|d| d.status != DeliveryStatus::Delivered));
            for d in &dead {
                let error = d.last_error.as_deref().unwrap_or_default();
                assert!(error.contains("no queue is bound"), "{error}");
                assert!(error.contains(&broker.exchange), "{error}");
                assert!(error.contains(&format!("\"{}.", d.source)), "{error}");
            }
            break dead.len();
        }
        assert!(Instant::now() < deadline, "never all dead: {all:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let item = listed(&server, "amqp").await;
    assert_eq!(
        item["circuit"], "closed",
        "a refusal opens no circuit: {item}"
    );

    broker.bind().await;
    let (code, job) = admin_post(&server, "/v1/destinations/amqp/replay", json!({})).await;
    assert_eq!(code, 202, "{job}");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let all = deliveries(&server, "amqp").await;
        if all.iter().all(|d| d.status == DeliveryStatus::Delivered) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all delivered after the replay"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let audit = Audit::of(&server, "amqp", &broker.received()).await;
    println!(
        "rabbitmq unroutable: {dead} dead, then replayed: {} applied, {} messages read",
        audit.applied, audit.messages
    );
    audit.assert_clean();
    assert_eq!(audit.duplicates, 0, "{audit:?}");
    drop(server);
    broker.clean_up().await;
}

/// `amqps://` through a TLS front signed by a CA of the test's own: with `tls_ca_file` naming
/// it the messages arrive; without, the certificate is refused and the attempts fail as
/// connection failures (retried), naming the certificate problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_amqps_trusts_the_tls_ca_file() {
    let broker = Broker::bound().await;
    let ca = crate::support::tls::TestCa::new();
    let port = ca.https_front(BROKER.parse().unwrap());
    let url = format!("amqps://guest:guest@localhost:{port}/%2f");
    let trusted = destination(
        "amqps",
        &url,
        &broker.exchange,
        &format!("tls_ca_file = {:?}", ca.file().display().to_string()),
    );
    let untrusted = destination("untrusted", &url, &broker.exchange, "");
    let server = TestServer::spawn_with_sources(&format!("{trusted}\n{untrusted}")).await;
    let save = json!({"event_id": "evt_tls_1", "event_type": "progress.saved",
        "player_id": "tls", "save_slot": "s", "sequence": 1,
        "idempotency_key": "evt_tls_1", "data": {}});
    assert_eq!(server.post_save(&save).await.code, 202);
    let deadline = Instant::now() + Duration::from_secs(15);
    let failed = loop {
        let read = broker.received();
        let failed = listed(&server, "untrusted").await;
        if !read.is_empty() && failed["last_error"].is_string() {
            break failed;
        }
        assert!(Instant::now() < deadline, "{read:?} {failed}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!("untrusted certificate: {failed}");
    let read = broker.received();
    assert_eq!(
        read.len(),
        1,
        "only the trusting destination delivered: {read:?}"
    );
    assert_eq!(read[0].header("inhook-event-id"), "evt_tls_1");
    let error = failed["last_error"].as_str().unwrap();
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    drop(server);
    broker.clean_up().await;
}
