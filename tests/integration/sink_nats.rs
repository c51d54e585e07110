//! Issue #27, NATS destinations (docs/forwarding.md, sinks): the real server binary publishes
//! the seed sources' chaotic streams to the machine's NATS JetStream, through outages, kills
//! and several nodes, and the test reads the stream back: every applied event once (the
//! `Nats-Msg-Id` dropping a resend), per aggregate in applied order, body byte for byte,
//! the metadata as headers. Each test has its own stream and subject prefix.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use inhook::store::DeliveryRecord;
use inhook_tools::simulate::Endpoint;

use crate::forward_crash::deliveries_to;
use crate::sinks::{
    closed_port, destination_table, drain, sent, wait_logged, Audit, Broker, Chaos, Crashes,
    Duplicates, Message,
};
use crate::support::tcp_proxy::TcpProxy;
use crate::support::tls::TestCa;
use crate::support::TestServer;

/// The machine's NATS server.
const NATS: &str = "127.0.0.1:4222";

/// How long a run may take to reach the read API and the stream.
const WITHIN: Duration = Duration::from_secs(40);

/// One test's stream on the machine's NATS: its own name and subject prefix.
struct TestStream {
    jetstream: jetstream::Context,
    name: String,
    prefix: String,
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

    /// A fresh stream, made on every subject of its prefix.
    async fn created() -> Self {
        let test = Self::fresh().await;
        test.create(&[format!("{}.>", test.prefix)]).await;
        test
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
        let specific = format!(
            "subject = \"{}.{{source}}.{{aggregate}}\"\nstream = \"{}\"",
            self.prefix, self.name
        );
        destination_table(name, "nats", url, &specific, (1, 100), extra)
    }

    /// Deletes the stream.
    async fn delete(&self) {
        let _ = self.jetstream.delete_stream(&self.name).await;
    }
}

impl Broker for TestStream {
    /// Every message of the stream (none before it exists), in stream order; `Nats-Msg-Id`
    /// and the subject as properties (NATS's, not the contract's headers).
    async fn messages(&self) -> Vec<Message> {
        // Before inhook created it (`create_stream = true`), no message yet.
        let Ok(mut stream) = self.jetstream.get_stream(&self.name).await else {
            return Vec::new();
        };
        let state = stream.info().await.expect("stream info").state.clone();
        let mut out = Vec::new();
        if state.messages == 0 {
            return out;
        }
        for sequence in state.first_sequence..=state.last_sequence {
            let message = stream.get_raw_message(sequence).await.expect("message");
            let mut received = Message {
                body: message.payload.to_vec(),
                properties: vec![("subject".to_owned(), message.subject.to_string())],
                ..Message::default()
            };
            for (name, values) in message.headers.iter() {
                let value = values
                    .first()
                    .map(|v| v.as_str().to_owned())
                    .unwrap_or_default();
                let pair = (name.to_string(), value);
                if pair.0 == "Nats-Msg-Id" {
                    received.properties.push(pair);
                } else {
                    received.headers.push(pair);
                }
            }
            out.push(received);
        }
        out
    }

    /// Its `Nats-Msg-Id` is its webhook id (the server drops a resend by it), its subject
    /// under the prefix and its source.
    fn fits(&self, message: &Message, delivery: &DeliveryRecord) -> bool {
        message.property("Nats-Msg-Id") == delivery.webhook_id
            && message
                .property("subject")
                .starts_with(&format!("{}.{}.", self.prefix, delivery.source))
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

/// Reordered, duplicated in-order (inventory deltas) and latest-wins (progress, presence)
/// events over many aggregates: each once in the stream, in applied order, with its
/// headers; the stream created by inhook; a delivery sent again (a crash after its PubAck)
/// stored once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_publishes_each_event_once_in_order() {
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::fresh().await;
    let url = format!("nats://{NATS}");
    let mut server = TestServer::spawn_with_sources(&test.destination(
        "bus",
        &url,
        "create_stream = true\nconcurrency = 16",
    ))
    .await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0001, 600, 40), 8, 2_000);
    chaos.send_all().await;
    drain(&chaos, &server, "bus", &test, WITHIN).await;
    let audit = Audit::read(&server, "bus", &test, false).await;
    println!("nats sink: {}, in {:.1}s", audit.line(), chaos.elapsed_s());
    audit.assert_clean(Duplicates::None, 200);
    // Every publish confirmed: a healthy broker destination has no last error (a confirmed
    // publish, which has no HTTP status, once showed as `last_error: "delivered"`).
    let listed = server.get("/v1/destinations").await.body;
    assert_eq!(listed["items"][0]["name"], "bus", "{listed}");
    assert_eq!(
        listed["items"][0]["last_error"],
        serde_json::Value::Null,
        "{listed}"
    );
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
    let last = deliveries_to(&server, "bus")
        .await
        .pop()
        .expect("a delivery");
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
        .filter(|m| m.header("webhook-id") == last.webhook_id)
        .count();
    assert_eq!(copies, 1, "the replay was stored again");
    assert_eq!(messages.len(), audit.messages);
    test.delete().await;
}

/// NATS unreachable for a while (a proxy cut, then restored): the circuit opens, nothing is
/// lost or reordered, and it closes again once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_outage_opens_the_circuit_and_loses_nothing() {
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::created().await;
    let proxy = TcpProxy::start(NATS.parse::<SocketAddr>().unwrap()).await;
    let url = format!("nats://{}", proxy.addr());
    let server = TestServer::in_process()
        .spawn_with_sources(&test.destination("bus", &url, ""))
        .await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0002, 400, 20), 4, 100);
    let sending = chaos.send();
    // Some deliveries first, so the outage starts mid-run.
    server
        .wait_for("/v1/destinations/bus/deliveries?status=delivered", |r| {
            r.body["items"].as_array().map_or(0, Vec::len) >= 20
        })
        .await;
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
    // The outage's length, not a wait for a condition: deliveries keep failing meanwhile.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    proxy.restore();
    sent(sending).await;
    drain(&chaos, &server, "bus", &test, WITHIN).await;
    let closed = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["circuit"] == "closed"
        })
        .await;
    assert_eq!(closed.body["items"][0]["backlog"], 0);
    let audit = Audit::read(&server, "bus", &test, false).await;
    println!(
        "nats outage: {}, in {:.1}s",
        audit.line(),
        chaos.elapsed_s()
    );
    // A resend after the cut carries its Nats-Msg-Id: the server drops it.
    audit.assert_clean(Duplicates::None, 100);
    test.delete().await;
}

/// The crash scenarios on `test`'s stream through the destination `bus` of `config`:
/// unsigned, no message twice, at least 300.
fn crashes<'a>(test: &'a TestStream, config: &'a str) -> Crashes<'a, TestStream> {
    Crashes {
        label: "nats",
        broker: test,
        config,
        destination: "bus",
        signed: false,
        within: WITHIN,
        duplicates: Duplicates::None,
        at_least: 300,
    }
}

/// SIGKILLed mid-run and restarted, three times: nothing lost, order kept, and no message
/// twice (a resend after the kill carries the same `Nats-Msg-Id`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_through_sigkills_loses_nothing_and_keeps_order() {
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::created().await;
    let config = test.destination("bus", &format!("nats://{NATS}"), "");
    // A resend after a kill carries its Nats-Msg-Id: the server drops it.
    crashes(&test, &config)
        .through_sigkills((0x0027_0003, 800, 30))
        .await;
    test.delete().await;
}

/// Three nodes on one PostgreSQL database publishing to one stream, one of them killed:
/// nothing lost, order kept per aggregate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_from_three_nodes_one_killed_keeps_order() {
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::created().await;
    let config = test.destination("bus", &format!("nats://{NATS}"), "");
    crashes(&test, &config)
        .three_nodes_one_killed((0x0027_0004, 800, 30), 300, 1_000)
        .await;
    test.delete().await;
}

/// A stream that does not exist (and may not be created), or whose subjects do not take
/// the destination's: the node starts all the same and logs it, naming the key; the
/// deliveries fail and retry like a 5xx until the stream exists, then all land in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_missing_stream_is_logged_and_retried_until_it_exists() {
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::fresh().await;
    let url = format!("nats://{NATS}");
    let server = TestServer::spawn_with_sources(&test.destination("bus", &url, "")).await;
    let stream_word = format!("stream \"{}\" does not exist", test.name);
    wait_logged(&server, &["bus", &stream_word, "create_stream"]).await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0005, 80, 8), 4, 2_000);
    chaos.send_all().await;
    let failing = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["last_error"]
                .as_str()
                .is_some_and(|e| e.contains("no JetStream stream takes subject"))
        })
        .await;
    assert_eq!(failing.body["items"][0]["dead"], 0, "{}", failing.body);
    test.create(&[format!("{}.>", test.prefix)]).await;
    drain(&chaos, &server, "bus", &test, WITHIN).await;
    Audit::read(&server, "bus", &test, false)
        .await
        .assert_clean(Duplicates::None, 20);
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
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::created().await;
    let mut sources = test.destination("bus", &format!("nats://natsuser-x7:pw-9f2kq@{NATS}"), "");
    sources.push_str(&test.destination(
        "down",
        &format!("nats://tok-3vq8z@127.0.0.1:{}", closed_port()),
        "",
    ));
    let mut server = TestServer::unstarted("", "", &sources).await;
    server.start();
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0006, 60, 6), 4, 2_000);
    chaos.send_all().await;
    drain(&chaos, &server, "bus", &test, WITHIN).await;
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
    Audit::read(&server, "bus", &test, false)
        .await
        .assert_clean(Duplicates::None, 20);
    test.delete().await;
}

/// A NATS server behind TLS as a `tls://` URL sees it, fronted with `ca`'s `localhost`
/// certificate: the server's `INFO` line in plain text (saying TLS is required), then a TLS
/// handshake, then the NATS protocol inside TLS. Answers the port.
fn nats_tls_front(ca: &TestCa) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    ca.front(|mut client, acceptor| async move {
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
    })
}

/// `tls://` with `tls_ca_file`: published over TLS verified against the private CA; the
/// same server without the CA file fails the handshake, and says so without the URL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_nats_over_tls_verifies_against_tls_ca_file() {
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::created().await;
    let ca = TestCa::new();
    let port = nats_tls_front(&ca);
    let url = format!("tls://localhost:{port}");
    let mut sources = test.destination(
        "bus",
        &url,
        &format!("tls_ca_file = {:?}", ca.file().display().to_string()),
    );
    sources.push_str(&test.destination("untrusted", &url, ""));
    let server = TestServer::in_process().spawn_with_sources(&sources).await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0007, 80, 8), 4, 2_000);
    chaos.send_all().await;
    drain(&chaos, &server, "bus", &test, WITHIN).await;
    Audit::read(&server, "bus", &test, false)
        .await
        .assert_clean(Duplicates::None, 20);
    let untrusted = crate::sinks::wait_listed(&server, "untrusted", Duration::from_secs(10), |d| {
        d["last_error"].is_string()
    })
    .await;
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
    if !crate::support::broker_available("NATS", NATS) {
        return;
    }
    let test = TestStream::fresh().await;
    let proxy = TcpProxy::start(NATS.parse::<SocketAddr>().unwrap()).await;
    proxy.cut();
    let url = format!("nats://{}", proxy.addr());
    let server = TestServer::in_process()
        .spawn_with_sources(&test.destination("bus", &url, "create_stream = true"))
        .await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0008, 80, 8), 4, 2_000);
    chaos.send_all().await;
    server
        .wait_for("/v1/destinations", |r| {
            r.body["items"][0]["last_error"]
                .as_str()
                .is_some_and(|e| e.starts_with("connection failed"))
        })
        .await;
    proxy.restore();
    drain(&chaos, &server, "bus", &test, WITHIN).await;
    Audit::read(&server, "bus", &test, false)
        .await
        .assert_clean(Duplicates::None, 20);
    test.delete().await;
}
