//! Issue #27, NATS destinations (docs/contract.md, sinks): the real server binary publishes
//! the seed sources' chaotic streams to the machine's NATS JetStream, through outages, kills
//! and several nodes, and the test reads the stream back: every applied event once (the
//! `Nats-Msg-Id` dropping a resend), per aggregate in applied order, body byte for byte,
//! the metadata as headers. Each test has its own stream and subject prefix.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use inhook::forward::queue::DeliveryStatus;
use inhook::store::{DeliveryFilter, DeliveryRecord};
use inhook::tools::simulate::{expected_states, Endpoint, Plan, Publisher, Stream};

use crate::crash::{chaos_publisher, chaos_stream_of};
use crate::support::tcp_proxy::TcpProxy;
use crate::support::{Backend, TestServer};

/// The machine's NATS server.
const NATS: &str = "127.0.0.1:4222";

/// The headers every message carries (docs/contract.md, sinks).
const HEADERS: [&str; 8] = [
    "webhook-id",
    "inhook-source",
    "inhook-event-id",
    "inhook-event-type",
    "inhook-aggregate",
    "inhook-sequence",
    "inhook-attempt",
    "content-type",
];

/// One test's stream on the machine's NATS: its own name and subject prefix.
struct TestStream {
    jetstream: jetstream::Context,
    name: String,
    prefix: String,
}

/// A message read back from the stream.
#[derive(Debug)]
struct Received {
    subject: String,
    body: Vec<u8>,
    headers: HashMap<String, String>,
}

impl TestStream {
    /// A fresh name and prefix (the stream itself not made).
    async fn fresh() -> Self {
        let client = async_nats::connect(NATS).await.expect("the machine's NATS");
        let suffix = format!("{:016x}", rand::random::<u64>());
        TestStream {
            jetstream: jetstream::new(client),
            name: format!("INHOOK_TEST_{suffix}"),
            prefix: format!("inhooktest{suffix}"),
        }
    }

    /// Creates the stream on `subjects`.
    async fn create(&self, subjects: &[String]) {
        self.jetstream
            .create_stream(stream::Config {
                name: self.name.clone(),
                subjects: subjects.to_vec(),
                ..Default::default()
            })
            .await
            .expect("create stream");
    }

    /// The `[[destinations]]` table of the seed sources to this stream at `url`.
    fn destination(&self, name: &str, url: &str, extra: &str) -> String {
        format!(
            r#"
[[destinations]]
name = "{name}"
type = "nats"
url = "{url}"
subject = "{prefix}.{{source}}.{{aggregate}}"
stream = "{stream}"
sources = ["presence", "save-game"]
timeout_s = 1
lease_margin_s = 1
max_attempts = 100
retry_base_s = 1
retry_max_delay_s = 1
{extra}
"#,
            prefix = self.prefix,
            stream = self.name,
        )
    }

    /// Every message of the stream, in stream order.
    async fn messages(&self) -> Vec<Received> {
        let mut stream = self.jetstream.get_stream(&self.name).await.expect("stream");
        let state = stream.info().await.expect("stream info").state.clone();
        let mut out = Vec::new();
        if state.messages == 0 {
            return out;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let message = stream.get_raw_message(sequence).await.expect("message");
            let headers = message
                .headers
                .iter()
                .map(|(name, values)| {
                    (
                        name.to_string(),
                        values
                            .first()
                            .map(|v| v.as_str().to_owned())
                            .unwrap_or_default(),
                    )
                })
                .collect();
            out.push(Received {
                subject: message.subject.to_string(),
                body: message.payload.to_vec(),
                headers,
            });
        }
        out
    }

    /// Deletes the stream.
    async fn delete(&self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
    }
}

impl Drop for TestStream {
    /// Deletes the stream of a test that failed before it could (on its own thread: the
    /// test's runtime may be gone or blocked).
    fn drop(&mut self) {
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(NATS).await {
                    let _ = jetstream::new(client).delete_stream(&name).await;
                }
            });
        })
        .join();
    }
}

/// Every delivery to `destination`, oldest (first applied) first.
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

/// Waits until the stream converged in the read API and every delivery to `destination`
/// is delivered.
async fn drain(publisher: &Publisher, stream: &Stream, server: &TestServer, destination: &str) {
    let mismatches = publisher
        .converge(Arc::new(expected_states(stream)), Duration::from_secs(40))
        .await
        .expect("read API");
    assert!(
        mismatches.is_empty(),
        "{} aggregates differ",
        mismatches.len()
    );
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let deliveries = deliveries(server, destination).await;
        let delivered = deliveries
            .iter()
            .filter(|d| d.status == DeliveryStatus::Delivered)
            .count();
        if delivered == deliveries.len() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not forwarded in time: {delivered} of {} delivered",
            deliveries.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What the stream holds, against the store's deliveries and event log.
#[derive(Debug, Default)]
struct Audit {
    applied: usize,
    messages: usize,
    /// Messages beyond the first of their `webhook-id`.
    duplicates: usize,
    /// Deliveries not delivered, or with no message.
    lost: usize,
    /// Messages of no delivery.
    unexpected: usize,
    /// First messages of an aggregate after a message of it applied later.
    order_violations: usize,
    body_mismatches: usize,
    header_problems: Vec<String>,
}

impl Audit {
    async fn of(server: &TestServer, destination: &str, test: &TestStream) -> Self {
        let deliveries = deliveries(server, destination).await;
        let logged = server.logged().await;
        let bodies: HashMap<(&str, &str), &[u8]> = logged
            .iter()
            .map(|e| ((e.source.as_str(), e.event_id.as_str()), e.body.as_slice()))
            .collect();
        let by_webhook_id: HashMap<&str, (usize, &DeliveryRecord)> = deliveries
            .iter()
            .enumerate()
            .map(|(at, d)| (d.webhook_id.as_str(), (at, d)))
            .collect();
        let messages = test.messages().await;
        let mut audit = Audit {
            applied: deliveries.len(),
            messages: messages.len(),
            ..Audit::default()
        };
        let mut seen: HashSet<&str> = HashSet::new();
        let mut latest: HashMap<&str, usize> = HashMap::new();
        for message in &messages {
            let id = message.headers.get("webhook-id").map(String::as_str);
            let Some((at, delivery)) = id.and_then(|id| by_webhook_id.get(id)) else {
                audit.unexpected += 1;
                continue;
            };
            if !seen.insert(delivery.webhook_id.as_str()) {
                audit.duplicates += 1;
                continue;
            }
            let key = (delivery.source.as_str(), delivery.event_id.as_str());
            if bodies.get(&key) != Some(&message.body.as_slice()) {
                audit.body_mismatches += 1;
            }
            let before = latest.entry(delivery.aggregate.as_str()).or_insert(*at);
            if *at < *before {
                audit.order_violations += 1;
            }
            *before = (*before).max(*at);
            for name in HEADERS {
                if message.headers.get(name).is_none_or(String::is_empty) {
                    audit.header_problems.push(format!("{name} missing"));
                }
            }
            let expect = [
                ("inhook-event-id", delivery.event_id.as_str()),
                ("inhook-source", delivery.source.as_str()),
                ("Nats-Msg-Id", delivery.webhook_id.as_str()),
            ];
            for (name, value) in expect {
                if message.headers.get(name).map(String::as_str) != Some(value) {
                    audit
                        .header_problems
                        .push(format!("{name} of {}", delivery.event_id));
                }
            }
            let subject = format!("{}.{}.", test.prefix, delivery.source);
            if !message.subject.starts_with(&subject) {
                audit.header_problems.push(format!(
                    "subject {} of {}",
                    message.subject, delivery.event_id
                ));
            }
        }
        audit.lost = deliveries
            .iter()
            .filter(|d| {
                d.status != DeliveryStatus::Delivered || !seen.contains(d.webhook_id.as_str())
            })
            .count();
        audit
    }

    /// Every applied event once, in order, byte for byte, with its headers.
    fn assert_clean(&self, min_applied: usize) {
        assert_eq!(self.lost, 0, "applied events not in the stream: {self:?}");
        assert_eq!(self.unexpected, 0, "messages of no delivery");
        assert_eq!(self.duplicates, 0, "a webhook-id stored twice");
        assert_eq!(self.order_violations, 0, "out of applied order");
        assert_eq!(self.body_mismatches, 0, "a body not byte for byte");
        assert!(
            self.header_problems.is_empty(),
            "{:?}",
            &self.header_problems[..self.header_problems.len().min(5)]
        );
        assert!(self.applied >= min_applied, "too few events: {self:?}");
    }
}

/// Reordered, duplicated in-order (inventory deltas) and latest-wins (progress, presence)
/// events over many aggregates: each once in the stream, in applied order, with its
/// headers; the stream created by inhook; a delivery sent again (a crash after its PubAck)
/// stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_publishes_each_event_once_in_order() {
    let test = TestStream::fresh().await;
    let url = format!("nats://{NATS}");
    let mut server = TestServer::spawn_with_sources(&test.destination(
        "bus",
        &url,
        "create_stream = true\nconcurrency = 16",
    ))
    .await;
    let started = Instant::now();
    let (stream, plan) = chaos_stream_of(0x0027_0001, 600, 40);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 8, 2_000);
    let report = publish(&publisher, &plan).await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "bus").await;
    let audit = Audit::of(&server, "bus", &test).await;
    println!(
        "nats sink: {} events applied, {} messages, in {:.1}s",
        audit.applied,
        audit.messages,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(200);
    let created = test
        .jetstream
        .get_stream(&test.name)
        .await
        .expect("the stream inhook created")
        .cached_info()
        .config
        .clone();
    assert_eq!(created.subjects, [format!("{}.>", test.prefix)]);
    assert_eq!(created.duplicate_window, Duration::from_secs(600));
    assert_eq!(created.storage, stream::StorageType::File);

    // The node dies after the PubAck of the last delivery, before it recorded it (its row
    // set back to pending while the node is down): sent again with its Nats-Msg-Id, the
    // server drops it as a duplicate, and it is delivered all the same.
    let last = deliveries(&server, "bus").await.pop().expect("a delivery");
    tokio::task::block_in_place(|| server.kill9());
    let undo = format!(
        "UPDATE deliveries SET status = 'pending', next_attempt_at = 0, delivered_at = NULL \
         WHERE id = {};",
        last.id
    );
    server.run_sql(&undo, &undo).await;
    tokio::task::block_in_place(|| server.start());
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = server
            .get(&format!("/v1/destinations/bus/deliveries/{}", last.id))
            .await;
        if now.body["status"] == "delivered" && now.body["attempts"].as_i64() > Some(last.attempts)
        {
            break;
        }
        assert!(Instant::now() < deadline, "never sent again: {}", now.body);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let messages = test.messages().await;
    let copies = messages
        .iter()
        .filter(|m| m.headers.get("webhook-id") == Some(&last.webhook_id))
        .count();
    assert_eq!(copies, 1, "the replay was stored again");
    assert_eq!(messages.len(), audit.messages);
    test.delete().await;
}

/// NATS unreachable for a while (a proxy cut, then restored): the circuit opens, nothing is
/// lost or reordered, and it closes again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_outage_opens_the_circuit_and_loses_nothing() {
    let test = TestStream::fresh().await;
    test.create(&[format!("{}.>", test.prefix)]).await;
    let proxy = TcpProxy::start(NATS.parse::<SocketAddr>().unwrap()).await;
    let url = format!("nats://{}", proxy.addr());
    let server = TestServer::spawn_with_sources(&test.destination("bus", &url, "")).await;
    let (stream, plan) = chaos_stream_of(0x0027_0002, 400, 20);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 4, 100);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.cut();
    let open = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["circuit"] == "open"
        })
        .await;
    let bus = &open.body["items"][0];
    assert_eq!(bus["type"], "nats", "{bus}");
    assert_eq!(bus["dead"], 0, "{bus}");
    let error = bus["last_error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("connection failed: NATS") || error.starts_with("no answer within"),
        "{bus}"
    );
    assert!(!error.contains(&proxy.addr().port().to_string()), "{bus}");
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.restore();
    let report = sending.await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "bus").await;
    let closed = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["circuit"] == "closed"
        })
        .await;
    assert_eq!(closed.body["items"][0]["backlog"], 0);
    let audit = Audit::of(&server, "bus", &test).await;
    println!(
        "nats outage: {} events applied, {} messages, in {:.1}s",
        audit.applied,
        audit.messages,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(100);
    test.delete().await;
}

/// SIGKILLed mid-run and restarted, three times: nothing lost, order kept, and no message
/// twice (a resend after the kill carries the same `Nats-Msg-Id`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_through_sigkills_loses_nothing_and_keeps_order() {
    let test = TestStream::fresh().await;
    test.create(&[format!("{}.>", test.prefix)]).await;
    let url = format!("nats://{NATS}");
    let mut server = TestServer::spawn_with_sources(&test.destination("bus", &url, "")).await;
    let (stream, plan) = chaos_stream_of(0x0027_0003, 800, 30);
    let endpoint = Endpoint::new(&server.url);
    let publisher = chaos_publisher(endpoint.clone(), 8, 200);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    let mut kills = 0;
    while kills < 3 && !sending.is_finished() {
        let pause = 500 + rand::random::<u64>() % 700;
        tokio::time::sleep(Duration::from_millis(pause)).await;
        tokio::task::block_in_place(|| server.restart());
        endpoint.set(&server.url);
        kills += 1;
    }
    assert!(kills >= 2, "the stream ended after {kills} kills");
    let report = sending.await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "bus").await;
    let audit = Audit::of(&server, "bus", &test).await;
    println!(
        "nats sigkill ({}): {kills} kills, {} events applied, {} messages, in {:.1}s",
        Backend::fresh_kind(),
        audit.applied,
        audit.messages,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(300);
    test.delete().await;
}

/// Three nodes on one PostgreSQL database publishing to one stream, one of them killed:
/// nothing lost, order kept per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_from_three_nodes_one_killed_keeps_order() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let test = TestStream::fresh().await;
    test.create(&[format!("{}.>", test.prefix)]).await;
    let url = format!("nats://{NATS}");
    let sources = test.destination("bus", &url, "");
    let first = TestServer::spawn_with_sources(&sources).await;
    let mut second = TestServer::join_with_sources(&first, &sources).await;
    let third = TestServer::join_with_sources(&first, &sources).await;
    let (stream, plan) = chaos_stream_of(0x0027_0004, 800, 30);
    let endpoint = Endpoint::many(&[&first.url, &second.url, &third.url]);
    let publisher = chaos_publisher(endpoint.clone(), 12, 300);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    tokio::time::sleep(Duration::from_millis(1_000 + rand::random::<u64>() % 1_000)).await;
    assert!(!sending.is_finished(), "the stream ended before the kill");
    tokio::task::block_in_place(|| second.kill9());
    endpoint.remove(&second.url);
    let report = sending.await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &first, "bus").await;
    let audit = Audit::of(&first, "bus", &test).await;
    println!(
        "nats three nodes: {} events applied, {} messages, in {:.1}s",
        audit.applied,
        audit.messages,
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(300);
    drop(third);
    test.delete().await;
}

/// Waits until `server`'s log holds every one of `words`; the log.
async fn wait_logged(server: &TestServer, words: &[&str]) -> String {
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

/// A stream that does not exist (and may not be created), or whose subjects do not take
/// the destination's: the node starts all the same and logs it, naming the key; the
/// deliveries fail and retry like a 5xx until the stream exists, then all land in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_missing_stream_is_logged_and_retried_until_it_exists() {
    let test = TestStream::fresh().await;
    let url = format!("nats://{NATS}");
    let server = TestServer::spawn_with_sources(&test.destination("bus", &url, "")).await;
    let stream_word = format!("stream \"{}\" does not exist", test.name);
    wait_logged(&server, &["bus", &stream_word, "create_stream"]).await;
    let (stream, plan) = chaos_stream_of(0x0027_0005, 80, 8);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 4, 2_000);
    let report = publish(&publisher, &plan).await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    let failing = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("no JetStream stream takes subject"))
        })
        .await;
    assert_eq!(failing.body["items"][0]["dead"], 0, "{}", failing.body);
    test.create(&[format!("{}.>", test.prefix)]).await;
    drain(&publisher, &stream, &server, "bus").await;
    Audit::of(&server, "bus", &test).await.assert_clean(20);
    test.delete().await;

    let narrow = TestStream::fresh().await;
    narrow
        .create(&[format!("{}.presence.>", narrow.prefix)])
        .await;
    let server = TestServer::spawn_with_sources(&narrow.destination("bus", &url, "")).await;
    wait_logged(
        &server,
        &["subject ", "is not within the subjects", &narrow.name],
    )
    .await;
    narrow.delete().await;
}

/// The URL's credentials (a user and password, or a token) appear nowhere: not in
/// `GET /v1/destinations`, the server's log, nor `inhook deliveries`; they are still used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_never_shows_the_urls_credentials() {
    let test = TestStream::fresh().await;
    test.create(&[format!("{}.>", test.prefix)]).await;
    let closed_port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        probe.local_addr().unwrap().port()
    };
    let mut sources = test.destination("bus", &format!("nats://natsuser-x7:pw-9f2kq@{NATS}"), "");
    sources.push_str(&test.destination(
        "down",
        &format!("nats://tok-3vq8z@127.0.0.1:{closed_port}"),
        "",
    ));
    let mut server = TestServer::unstarted("", "", &sources).await;
    server.start();
    let (stream, plan) = chaos_stream_of(0x0027_0006, 60, 6);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 4, 2_000);
    let report = publish(&publisher, &plan).await.expect("publisher");
    assert!(report.failures.is_empty());
    drain(&publisher, &stream, &server, "bus").await;
    server
        .wait_for("/v1/destinations", |r| {
            r.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["name"] == "down" && d["last_error"].is_string())
        })
        .await;
    let listed = server.get("/v1/destinations").await.body.to_string();
    let (ok, cli) = server.cli(&["deliveries", "--destination", "down"]);
    assert!(ok, "{cli}");
    let (ok, cli_bus) = server.cli(&["deliveries", "--destination", "bus"]);
    assert!(ok, "{cli_bus}");
    assert!(server.terminate());
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(listed.contains("nats://***@"), "{listed}");
    for secret in ["natsuser-x7", "pw-9f2kq", "tok-3vq8z"] {
        for (what, text) in [
            ("GET /v1/destinations", &listed),
            ("the log", &log),
            ("inhook deliveries", &cli),
            ("inhook deliveries", &cli_bus),
        ] {
            assert!(!text.contains(secret), "{what} shows {secret}: {text}");
        }
    }
    Audit::of(&server, "bus", &test).await.assert_clean(20);
    test.delete().await;
}

/// A NATS server behind TLS as a `tls://` URL sees it: the server's `INFO` line in plain
/// text (saying TLS is required), then a TLS handshake with a certificate for `localhost`
/// issued by a private CA, then the NATS protocol inside TLS. Answers the port and the
/// CA's PEM file.
fn nats_tls_front(dir: &std::path::Path) -> (u16, std::path::PathBuf) {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let (ca_params, ca_key, ca_cert) = crate::support::tls::self_signed_ca("inhook nats CA");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    let ca_file = dir.join("nats-ca.pem");
    std::fs::write(&ca_file, ca_cert.pem()).unwrap();
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(upstream) = tokio::net::TcpStream::connect(NATS).await else {
                        return;
                    };
                    let mut upstream = BufReader::new(upstream);
                    let mut info = String::new();
                    if upstream.read_line(&mut info).await.is_err() {
                        return;
                    }
                    let Some(json) = info.trim_end().strip_prefix("INFO ") else {
                        return;
                    };
                    let mut json: serde_json::Value = serde_json::from_str(json).unwrap();
                    json["tls_required"] = serde_json::Value::Bool(true);
                    let line = format!("INFO {json}\r\n");
                    if client.write_all(line.as_bytes()).await.is_err() {
                        return;
                    }
                    // A client that refuses the certificate ends here.
                    let Ok(mut tls) = acceptor.accept(client).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut upstream).await;
                });
            }
        });
    });
    (port, ca_file)
}

/// `tls://` with `tls_ca_file`: published over TLS verified against the private CA; the
/// same server without the CA file fails the handshake, and says so without the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_over_tls_verifies_against_tls_ca_file() {
    let test = TestStream::fresh().await;
    test.create(&[format!("{}.>", test.prefix)]).await;
    let dir = tempfile::tempdir().unwrap();
    let (port, ca_file) = nats_tls_front(dir.path());
    let url = format!("tls://localhost:{port}");
    let mut sources = test.destination(
        "bus",
        &url,
        &format!("tls_ca_file = {:?}", ca_file.display().to_string()),
    );
    sources.push_str(&test.destination("untrusted", &url, ""));
    let server = TestServer::spawn_with_sources(&sources).await;
    let (stream, plan) = chaos_stream_of(0x0027_0007, 80, 8);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 4, 2_000);
    let report = publish(&publisher, &plan).await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "bus").await;
    Audit::of(&server, "bus", &test).await.assert_clean(20);
    let listed = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["name"] == "untrusted" && d["last_error"].is_string())
        })
        .await;
    let untrusted = listed.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "untrusted")
        .unwrap()
        .clone();
    let error = untrusted["last_error"].as_str().unwrap();
    assert!(
        error.starts_with("connection failed: NATS: ") && error.contains("certificate"),
        "{untrusted}"
    );
    assert!(!error.contains(&port.to_string()), "{untrusted}");
}

/// NATS unreachable when the node starts (`create_stream = true`): the node starts all the
/// same, and once the server is back the stream is created and every event lands in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_creates_its_stream_once_the_server_is_back() {
    let test = TestStream::fresh().await;
    let proxy = TcpProxy::start(NATS.parse::<SocketAddr>().unwrap()).await;
    proxy.cut();
    let url = format!("nats://{}", proxy.addr());
    let server =
        TestServer::spawn_with_sources(&test.destination("bus", &url, "create_stream = true"))
            .await;
    let (stream, plan) = chaos_stream_of(0x0027_0008, 80, 8);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 4, 2_000);
    let report = publish(&publisher, &plan).await.expect("publisher");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["last_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("connection failed"))
        })
        .await;
    proxy.restore();
    drain(&publisher, &stream, &server, "bus").await;
    Audit::of(&server, "bus", &test).await.assert_clean(20);
    test.delete().await;
}
