//! Issue #27, the RabbitMQ sink (docs/forwarding.md, sinks): the real server binary forwards the
//! seed sources' chaotic streams to a `type = "rabbitmq"` destination on the machine's broker
//! (127.0.0.1:5672, guest/guest), and a consumer of the test's own reads the messages back:
//! each applied event arrives (once when nothing fails), per aggregate in applied order, its
//! body byte for byte and its metadata in the message's properties and headers; through an
//! outage, SIGKILLs and three nodes on PostgreSQL nothing is lost or reordered (a resend after
//! a cut carries the same `webhook-id`, which a consumer dedupes by). Every test uses its own
//! exchange and queue, named with a random suffix, and deletes them at its end.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use inhook::forward::queue::DeliveryStatus;
use inhook::store::DeliveryRecord;
use inhook_tools::simulate::Endpoint;
use lapin::options::{
    BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Channel, Connection, ConnectionProperties, ExchangeKind};
use serde_json::json;

use crate::application::DEST_SECRET;
use crate::forward_crash::deliveries_to;
use crate::forwarding::admin_post;
use crate::sinks::{
    destination_table, drain, listed, sent, wait_listed, wait_logged, Audit, Chaos, Crashes,
    Duplicates, Message,
};
use crate::support::tcp_proxy::TcpProxy;
use crate::support::tls::TestCa;
use crate::support::TestServer;

/// The machine's RabbitMQ.
const BROKER: &str = "127.0.0.1:5672";

/// The test's own side of the broker: an exchange and a consumer of a queue bound to it for
/// every routing key, recording what arrives in arrival order.
struct Broker {
    exchange: String,
    queue: String,
    connection: Connection,
    channel: Channel,
    received: Arc<Mutex<Vec<Message>>>,
}

impl Broker {
    /// A connection of the test's own to the broker.
    async fn connect() -> Connection {
        Connection::connect(&amqp_url(BROKER), ConnectionProperties::default())
            .await
            .expect("RabbitMQ on 127.0.0.1:5672 (guest/guest)")
    }

    /// A fresh exchange name (declared as a durable topic exchange when `declare`), no queue
    /// bound yet.
    async fn new(declare: bool) -> Self {
        let suffix = format!("{:016x}", rand::random::<u64>());
        let connection = Self::connect().await;
        let channel = connection.create_channel().await.expect("channel");
        let broker = Broker {
            queue: format!("inhook-test-{suffix}"),
            exchange: format!("inhook-test-{suffix}"),
            connection,
            channel,
            received: Arc::default(),
        };
        if declare {
            broker.declare().await;
        }
        broker
    }

    /// Declares the exchange, a durable topic exchange.
    async fn declare(&self) {
        self.channel
            .exchange_declare(
                self.exchange.as_str().into(),
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
                let text = |value: Option<String>| value.unwrap_or_else(|| "(none)".to_owned());
                let properties = vec![
                    ("routing-key".to_owned(), delivery.routing_key.to_string()),
                    (
                        "message-id".to_owned(),
                        text(properties.message_id().as_ref().map(|s| s.to_string())),
                    ),
                    (
                        "content-type".to_owned(),
                        text(properties.content_type().as_ref().map(|s| s.to_string())),
                    ),
                    (
                        "delivery-mode".to_owned(),
                        text((*properties.delivery_mode()).map(|m| m.to_string())),
                    ),
                ];
                received.lock().unwrap().push(Message {
                    headers,
                    body: delivery.data.clone(),
                    properties,
                });
            }
        });
    }

    /// What arrived so far, in arrival order.
    fn received(&self) -> Vec<Message> {
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

    /// Audits what the consumer read against `destination`'s deliveries on `server` (every
    /// destination here is signed).
    async fn audit(&self, server: &TestServer, destination: &str) -> Audit {
        Audit::read(server, destination, self, true).await
    }
}

impl crate::sinks::Broker for Broker {
    /// What the consumer read so far, in arrival order.
    async fn messages(&self) -> Vec<Message> {
        self.received()
    }

    /// Its `message_id` is its webhook id, its content type the header's, persistent, the
    /// routing key rendered from its source and aggregate.
    fn fits(&self, message: &Message, delivery: &DeliveryRecord) -> bool {
        message.property("message-id") == delivery.webhook_id
            && message.property("content-type") == message.header("content-type")
            && message.property("delivery-mode") == "2"
            && message
                .property("routing-key")
                .starts_with(&format!("{}.", delivery.source))
    }
}

/// A `type = "rabbitmq"` destination named `name` to `exchange` at `url`, for both seed
/// sources, signed, with the short timeouts and backoff of forward_crash.rs.
fn destination(name: &str, url: &str, exchange: &str, extra: &str) -> String {
    let specific = format!(
        "exchange = \"{exchange}\"\nrouting_key = \"{{source}}.{{aggregate}}\"\n\
         secret = \"{DEST_SECRET}\""
    );
    destination_table(name, "rabbitmq", url, &specific, (2, 50), extra)
}

/// The guest login's URL of the broker at `address`.
fn amqp_url(address: &str) -> String {
    format!("amqp://guest:guest@{address}/%2f")
}

/// Waits (up to 15 s) until the destination `name` records a failed attempt; its item.
async fn first_failure(server: &TestServer, name: &str) -> serde_json::Value {
    wait_listed(server, name, Duration::from_secs(15), |item| {
        item["last_error"].is_string()
    })
    .await
}

/// The first line of `log` holding `needle`, printed as `what`.
fn line_with<'a>(log: &'a str, needle: &str, what: &str) -> &'a str {
    let line = log.lines().find(|l| l.contains(needle)).unwrap();
    println!("{what}: {line}");
    line
}

/// Reordered, duplicated, in-order (inventory deltas) and latest-wins (progress, presence)
/// events over many aggregates arrive once each, per aggregate in applied order, byte for
/// byte, with their metadata as the message's properties and headers; the exchange is
/// declared by inhook (`declare = true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_forwards_a_chaotic_stream_once_each_in_order() {
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::new(false).await;
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &broker.exchange,
        "declare = true",
    ))
    .await;
    assert!(broker.exchange_exists().await, "declare = true made it");
    broker.bind().await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_a001, 600, 30), 8, 400);
    chaos.send_all().await;
    drain(&chaos, &server, "amqp", &broker, Duration::from_secs(20)).await;
    let received = broker.received();
    let audit = broker.audit(&server, "amqp").await;
    println!(
        "rabbitmq sink: {} events sent, {} applied, {} messages read in {:.1}s",
        chaos.stream.event_count(),
        audit.applied,
        audit.messages,
        chaos.elapsed_s()
    );
    audit.assert_clean(Duplicates::None, 201);
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
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::bound().await;
    let proxy = TcpProxy::start(BROKER.parse().unwrap()).await;
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(&proxy.addr().to_string()),
        &broker.exchange,
        "",
    ))
    .await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_a002, 600, 30), 8, 150);
    let sending = chaos.send();
    // Some deliveries first, so the outage starts mid-run.
    server
        .wait_for("/v1/destinations/amqp/deliveries?status=delivered", |r| {
            r.body["items"].as_array().map_or(0, Vec::len) >= 20
        })
        .await;
    proxy.cut();
    let open = wait_listed(&server, "amqp", Duration::from_secs(10), |item| {
        item["circuit"] == "open"
    })
    .await;
    assert_eq!(open["type"], "rabbitmq", "{open}");
    // The outage's length, not a wait for a condition: deliveries keep failing meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();
    sent(sending).await;
    wait_listed(&server, "amqp", Duration::from_secs(15), |item| {
        item["circuit"] == "closed"
    })
    .await;
    drain(&chaos, &server, "amqp", &broker, Duration::from_secs(20)).await;
    let audit = broker.audit(&server, "amqp").await;
    println!(
        "rabbitmq outage: {}, in {:.1}s",
        audit.line(),
        chaos.elapsed_s()
    );
    audit.assert_clean(Duplicates::Allowed, 0);
    drop(server);
    broker.clean_up().await;
}

/// The crash scenarios on `broker` through the destination `amqp` of `config`: signed,
/// resends allowed (RabbitMQ keeps a second copy; consumers dedupe by `webhook-id`).
fn crashes<'a>(broker: &'a Broker, config: &'a str, within: Duration) -> Crashes<'a, Broker> {
    Crashes {
        label: "rabbitmq",
        broker,
        config,
        destination: "amqp",
        signed: true,
        within,
        duplicates: Duplicates::Allowed,
        at_least: 0,
    }
}

/// SIGKILLs of the single node mid-run: after each restart the deliveries it had on the wire
/// go again with their `webhook-id`; nothing is lost and, deduped by `webhook-id` as a
/// consumer would, every aggregate's messages come in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_sigkills_lose_nothing_and_keep_order() {
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::bound().await;
    let config = destination("amqp", &amqp_url(BROKER), &broker.exchange, "");
    crashes(&broker, &config, Duration::from_secs(20))
        .through_sigkills((0x0027_a003, 900, 40))
        .await;
    broker.clean_up().await;
}

/// Three nodes on one PostgreSQL database, one SIGKILLed mid-run: the others take over its
/// leased deliveries; nothing lost, per aggregate in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_three_nodes_one_killed_lose_nothing_and_keep_order() {
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::bound().await;
    let config = destination("amqp", &amqp_url(BROKER), &broker.exchange, "");
    crashes(&broker, &config, Duration::from_secs(25))
        .three_nodes_one_killed((0x0027_a004, 900, 40), 250, 1_000)
        .await;
    broker.clean_up().await;
}

/// A missing exchange without `declare = true` does not stop the start: it is logged naming
/// the key, and the deliveries fail (the broker's reason in `last_error`) and retry until
/// someone declares it; then they arrive. An exchange of another type with `declare = true`
/// is logged the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_a_missing_exchange_is_logged_at_start_and_retried_until_it_exists() {
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::new(false).await;
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &broker.exchange,
        "",
    ))
    .await;
    let log = wait_logged(&server, &["declare = true creates it"]).await;
    let line = line_with(&log, "declare = true creates it", "missing exchange");
    assert!(line.contains("exchange"), "{line}");
    assert!(line.contains(&broker.exchange), "{line}");
    assert!(!log.contains("guest:guest"), "{log}");
    assert!(!broker.exchange_exists().await, "nothing was declared");

    let save = json!({"event_id": "evt_missing_1", "event_type": "progress.saved",
        "player_id": "missing", "save_slot": "s", "sequence": 1,
        "idempotency_key": "evt_missing_1", "data": {}});
    assert_eq!(server.post_save(&save).await.code, 202);
    let failed = first_failure(&server, "amqp").await;
    println!("publishing to a missing exchange: {failed}");
    let error = failed["last_error"].as_str().unwrap();
    assert!(error.contains("NOT_FOUND"), "{error}");
    assert!(error.contains(&broker.exchange), "{error}");

    // Declared and bound: the retry delivers it.
    broker.declare().await;
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
    let log = wait_logged(&mismatched, &["was refused by the broker"]).await;
    let line = line_with(&log, "was refused by the broker", "mismatched exchange");
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
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
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
    let item = first_failure(&server, "orders-amqp").await;
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
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::new(true).await;
    let config = destination("amqp", &amqp_url(BROKER), &broker.exchange, "")
        .replace("max_attempts = 50", "max_attempts = 2");
    let server = TestServer::spawn_with_sources(&config).await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_a005, 60, 4), 4, 200);
    chaos.send_all().await;
    crate::forward_crash::converged(&chaos.publisher, &chaos.stream, Duration::from_secs(15)).await;
    // Every delivery dead or waiting behind a dead in-order one, none delivered.
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let all = deliveries_to(&server, "amqp").await;
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
        let all = deliveries_to(&server, "amqp").await;
        if all.iter().all(|d| d.status == DeliveryStatus::Delivered) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not all delivered after the replay"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let audit = broker.audit(&server, "amqp").await;
    println!(
        "rabbitmq unroutable: {dead} dead, then replayed: {} applied, {} messages read",
        audit.applied, audit.messages
    );
    audit.assert_clean(Duplicates::None, 0);
    drop(server);
    broker.clean_up().await;
}

/// `amqps://` through a TLS front signed by a CA of the test's own: with `tls_ca_file` naming
/// it the messages arrive; without, the certificate is refused and the attempts fail as
/// connection failures (retried), naming the certificate problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_amqps_trusts_the_tls_ca_file() {
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::bound().await;
    let ca = TestCa::new();
    let port = ca.https_front(BROKER.parse().unwrap());
    let url = format!("amqps://guest:guest@localhost:{port}/%2f");
    let trusted = destination(
        "amqps",
        &url,
        &broker.exchange,
        &format!("tls_ca_file = {:?}", ca.file().display().to_string()),
    );
    let untrusted = destination("untrusted", &url, &broker.exchange, "");
    let server = TestServer::in_process()
        .spawn_with_sources(&format!("{trusted}\n{untrusted}"))
        .await;
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

/// A routing key that one event's aggregate makes longer than AMQP's 255 bytes cannot be
/// sent: that delivery is dead at once with `invalid_destination_name` (not retried, the
/// log naming the key's length), and the other aggregates' messages go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_rabbitmq_a_routing_key_one_event_makes_too_long_is_a_dead_delivery() {
    if !crate::support::broker_available("RabbitMQ", BROKER) {
        return;
    }
    let broker = Broker::bound().await;
    let server = TestServer::spawn_with_sources(&destination(
        "amqp",
        &amqp_url(BROKER),
        &broker.exchange,
        "",
    ))
    .await;
    // 128 bytes, the longest id; each `.` and `*` written %2E or %2A in a routing key:
    // 384 bytes.
    let long_user = "*.".repeat(64);
    for (event_id, user) in [("evt_long", long_user.as_str()), ("evt_ok", "usr_ok")] {
        let body = json!({"event_id": event_id, "user_id": user, "presence": "ONLINE",
                          "sequence_number": 1});
        let reply = server.post_presence(&body).await;
        assert_eq!(reply.code, 200, "{:?}", reply.body);
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let (long, ok) = loop {
        let all = deliveries_to(&server, "amqp").await;
        let of = |id: &str| all.iter().find(|d| d.event_id == id).cloned();
        if let (Some(long), Some(ok)) = (of("evt_long"), of("evt_ok")) {
            if long.status == DeliveryStatus::Dead && ok.status == DeliveryStatus::Delivered {
                break (long, ok);
            }
        }
        assert!(Instant::now() < deadline, "not settled: {all:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(long.last_error.as_deref(), Some("invalid_destination_name"));
    assert_eq!(long.attempts, 1, "not retried");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !broker
        .received()
        .iter()
        .any(|m| m.header("inhook-event-id") == ok.event_id)
    {
        assert!(
            Instant::now() < deadline,
            "the other aggregate's message never came"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(broker
        .received()
        .iter()
        .all(|m| m.header("inhook-event-id") != "evt_long"));
    wait_logged(
        &server,
        &["invalid_destination_name", "bytes long, over 255"],
    )
    .await;
    drop(server);
    broker.clean_up().await;
}
