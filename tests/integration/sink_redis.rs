//! Issue #27, the Redis Streams sink (docs/forwarding.md, sinks): the real server binary
//! forwards chaotic streams of both seed sources to the machine's Redis (127.0.0.1:6379)
//! with `XADD`, and the tests read the streams back as a consumer would: each entry's
//! fields are the message's headers, its `body` field the raw body. Redis may hold an entry
//! twice after a crash or an outage (a resend of an `XADD` whose reply was lost), so the
//! audit dedupes by `webhook-id`, keeping the first, then asks that nothing is lost and
//! that per aggregate the entries follow the applied order. Every test uses keys (and an
//! ACL user) of its own random suffix and removes them at the end.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use inhook::forward::queue::DeliveryStatus;
use inhook::store::DeliveryRecord;
use inhook_tools::simulate::Endpoint;

use crate::application::DEST_SECRET;
use crate::forward_crash::deliveries_to;
use crate::sinks::{
    closed_port, destination_table, drain, listed, sent, Audit, Broker, Chaos, Crashes, Duplicates,
    Message,
};
use crate::support::tcp_proxy::TcpProxy;
use crate::support::tls::TestCa;
use crate::support::TestServer;

/// The machine's Redis.
const REDIS: &str = "127.0.0.1:6379";

/// How long a run may take to reach the read API and the streams.
const WITHIN: Duration = Duration::from_secs(40);

/// A test's own Redis keys (`inhook-test-<suffix>:<source>`), deleted when dropped.
struct Keys {
    prefix: String,
    users: Vec<String>,
}

impl Keys {
    /// Keys of a fresh random suffix.
    fn new() -> Self {
        Keys {
            prefix: format!("inhook-test-{:016x}", rand::random::<u64>()),
            users: Vec::new(),
        }
    }

    /// The destination's `stream` template: one stream per source.
    fn template(&self) -> String {
        format!("{}:{{source}}", self.prefix)
    }

    /// The stream of `source`.
    fn stream(&self, source: &str) -> String {
        format!("{}:{source}", self.prefix)
    }
}

impl Broker for Keys {
    /// The entries of both seed sources' streams, each stream oldest first.
    async fn messages(&self) -> Vec<Message> {
        let mut all = entries(&self.stream("presence"));
        all.extend(entries(&self.stream("save-game")));
        all
    }

    /// Its `body` field comes after the metadata fields.
    fn fits(&self, message: &Message, _: &DeliveryRecord) -> bool {
        message.property("last-field") == "body"
    }
}

impl Drop for Keys {
    /// Deletes the test's keys and ACL users.
    fn drop(&mut self) {
        let Ok(mut connection) = sync_connection() else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}*", self.prefix))
            .query(&mut connection)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<i64> = redis::cmd("DEL").arg(&keys).query(&mut connection);
        }
        for user in &self.users {
            let _: redis::RedisResult<i64> = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(user)
                .query(&mut connection);
        }
    }
}

/// A blocking connection to the machine's Redis.
fn sync_connection() -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://{REDIS}/0"))?.get_connection()
}

/// Every entry of `stream`, oldest first, as a consumer reads it: its fields but `body` as
/// headers, `body` as the body, and the name of its last field as `last-field`.
fn entries(stream: &str) -> Vec<Message> {
    let mut connection = sync_connection().expect("redis");
    let raw: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(&mut connection)
        .expect("XRANGE");
    raw.into_iter()
        .map(|(_, flat)| {
            let mut entry = Message::default();
            for pair in flat.chunks(2) {
                let name = String::from_utf8(pair[0].clone()).expect("field name");
                if name == "body" {
                    entry.body = pair[1].clone();
                } else {
                    let value = String::from_utf8(pair[1].clone()).expect("UTF-8 field");
                    entry.headers.push((name.clone(), value));
                }
                entry.properties = vec![("last-field".to_owned(), name)];
            }
            entry
        })
        .collect()
}

/// A Redis destination named `name` with the test's streams; `extra` adds keys.
fn destination(name: &str, url: &str, keys: &Keys, extra: &str) -> String {
    let specific = format!("stream = \"{}\"\nconcurrency = 16", keys.template());
    destination_table(name, "redis", url, &specific, (1, 100), extra)
}

/// Issue #27's first case: reordered, duplicated in-order (save-game inventory deltas)
/// and latest-wins (progress, presence) events across many aggregates each become one
/// entry, per aggregate in applied order, byte for byte, with every header as a field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_chaotic_streams_arrive_once_in_applied_order() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let url = format!("redis://{REDIS}/0");
    let extra = format!("secret = \"{DEST_SECRET}\"\nmax_len = 100000");
    // "Once each": an ample timeout, so that a slow machine's late reply is no resend.
    let table =
        destination("stream", &url, &keys, &extra).replace("timeout_s = 1", "timeout_s = 5");
    let server = TestServer::in_process().spawn_with_sources(&table).await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_4ed1, 600, 40), 8, 400);
    chaos.send_all().await;
    drain(&chaos, &server, "stream", &keys, WITHIN).await;
    let audit = Audit::read(&server, "stream", &keys, true).await;
    println!(
        "redis sink, chaotic streams: {} events sent; {}; all in the streams after {:.1}s",
        chaos.stream.event_count(),
        audit.line(),
        chaos.elapsed_s()
    );
    audit.assert_clean(Duplicates::None, 300);
    let item = listed(&server, "stream").await;
    assert_eq!(item["type"], "redis", "{item}");
    assert_eq!(item["circuit"], "closed", "{item}");
}

/// Issue #27's outage: Redis taken away behind a proxy and brought back. Deliveries fail
/// as connection failures, the circuit opens, then closes once Redis is back, and nothing
/// is lost or out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_outage_opens_the_circuit_and_loses_nothing() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let upstream: SocketAddr = REDIS.parse().unwrap();
    let proxy = TcpProxy::start(upstream).await;
    let url = format!("redis://{}/0", proxy.addr());
    let server = TestServer::in_process()
        .spawn_with_sources(&destination("cache", &url, &keys, ""))
        .await;
    let chaos = Chaos::new(Endpoint::new(&server.url), (0x0027_0a7e, 500, 30), 6, 100);
    let sending = chaos.send();
    // Some entries first, so the outage starts mid-run.
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys.messages().await.len() < 20 {
        assert!(Instant::now() < deadline, "nothing reached Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.cut();
    let cut_at = Instant::now();
    let item = crate::sinks::wait_listed(&server, "cache", Duration::from_secs(10), |d| {
        d["circuit"] == "open"
    })
    .await;
    assert_eq!(item["type"], "redis", "{item}");
    let opened_after = cut_at.elapsed();
    let failed = deliveries_to(&server, "cache").await;
    assert!(
        failed.iter().any(|d| d.status != DeliveryStatus::Delivered),
        "the outage held nothing back"
    );
    // The outage's length, not a wait for a condition: deliveries keep failing meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();
    sent(sending).await;
    drain(&chaos, &server, "cache", &keys, WITHIN).await;
    crate::sinks::wait_listed(&server, "cache", Duration::from_secs(10), |d| {
        d["circuit"] == "closed"
    })
    .await;
    let audit = Audit::read(&server, "cache", &keys, false).await;
    println!(
        "redis sink outage: {} events sent, circuit open {:.1}s after the cut; {}; all in the \
         streams after {:.1}s",
        chaos.stream.event_count(),
        opened_after.as_secs_f64(),
        audit.line(),
        chaos.elapsed_s()
    );
    // An XADD whose reply the cut lost is added again: a consumer dedupes it.
    audit.assert_clean(Duplicates::Allowed, 250);
}

/// The crash scenarios on `keys` through the destination `stream` of `config`: unsigned,
/// resends allowed (an `XADD` resent after a kill adds the entry again), at least 400.
fn crashes<'a>(keys: &'a Keys, config: &'a str) -> Crashes<'a, Keys> {
    Crashes {
        label: "redis",
        broker: keys,
        config,
        destination: "stream",
        signed: false,
        within: WITHIN,
        duplicates: Duplicates::Allowed,
        at_least: 400,
    }
}

/// Issue #27's SIGKILL mid-run: the node is killed and restarted on its store several
/// times; an `XADD` whose reply died with the node is added again (a duplicate the
/// consumer drops by `webhook-id`), and after that dedupe nothing is lost and each
/// aggregate's entries follow the applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_sigkills_lose_nothing_and_keep_order() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let config = destination("stream", &format!("redis://{REDIS}/0"), &keys, "");
    crashes(&keys, &config)
        .through_sigkills((0x0027_c4a5, 900, 40))
        .await;
}

/// Issue #27's three nodes on one PostgreSQL database, one SIGKILLed mid-run: the others
/// take over its leased deliveries; nothing lost, each aggregate in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_three_nodes_one_killed_lose_nothing_and_keep_order() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let config = destination("stream", &format!("redis://{REDIS}/0"), &keys, "");
    crashes(&keys, &config)
        .three_nodes_one_killed((0x0027_30de, 900, 40), 300, 800)
        .await;
}

/// A fixed stream name whose key holds another type, and a Redis that cannot be reached:
/// the server starts either way (docs/forwarding.md, sinks), the log names the key, and the
/// WRONGTYPE delivery retries with the reason and counts toward the circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_a_stream_key_of_another_type_is_logged_and_retried() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let taken = keys.stream("taken");
    let _: () = redis::cmd("SET")
        .arg(&taken)
        .arg("not a stream")
        .query(&mut sync_connection().expect("redis"))
        .expect("SET");
    let table = format!(
        r#"
[[destinations]]
name = "fixed"
type = "redis"
url = "redis://{REDIS}/0"
stream = "{taken}"
sources = ["presence"]
timeout_s = 2
retry_base_s = 1
retry_max_delay_s = 1
"#
    );
    let mut server = TestServer::spawn_with_sources(&table).await;
    let reply = server
        .post_presence(&serde_json::json!({
            "event_id": "evt_taken_1", "user_id": "usr_1", "presence": "ONLINE",
            "sequence_number": 1
        }))
        .await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let delivery = deliveries_to(&server, "fixed").await.pop();
        let last_error = delivery.as_ref().and_then(|d| d.last_error.clone());
        if let (Some(d), Some(error)) = (&delivery, &last_error) {
            assert_eq!(d.status, DeliveryStatus::Retrying, "{d:?}");
            assert!(
                error.contains("(WRONGTYPE)") && error.contains(&taken),
                "{error}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "no failed attempt: {delivery:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::task::block_in_place(|| server.kill9());
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(
        log.contains("cannot take messages") && log.contains("holds a string, not a stream"),
        "{log}"
    );

    // Unreachable (a closed port): the start goes on with a warning.
    let port = closed_port();
    let table = destination("away", &format!("redis://127.0.0.1:{port}/0"), &keys, "");
    let mut server = TestServer::spawn_with_sources(&table).await;
    assert_eq!(listed(&server, "away").await["type"], "redis");
    tokio::task::block_in_place(|| server.kill9());
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(log.contains("cannot be reached yet"), "{log}");
}

/// Issue #27's credentials: a Redis URL with a user and password (from
/// `INHOOK_DEST_<NAME>_URL`, and one wrong password in the file) is used, yet neither
/// password shows in `GET /v1/destinations`, the server's log, or `inhook deliveries`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_url_credentials_never_show() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let mut keys = Keys::new();
    let suffix = &keys.prefix["inhook-test-".len()..];
    let user = format!("inhook-test-{suffix}");
    let password = format!("pw-{suffix}-s3cret");
    let wrong = format!("wrong-{suffix}-s3cret");
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&user)
        .arg("on")
        .arg(format!(">{password}"))
        .arg(format!("~{}*", keys.prefix))
        .arg("+@all")
        .query(&mut sync_connection().expect("redis"))
        .expect("ACL SETUSER");
    keys.users.push(user.clone());
    let good_url = format!("redis://{user}:{password}@{REDIS}/0");
    let wrong_url = format!("redis://{user}:{wrong}@{REDIS}/0");
    let tables = destination("with-login", "redis://127.0.0.1:6379/0", &keys, "")
        + &destination("wrong-login", &wrong_url, &keys, "").replace(
            &keys.template(),
            &format!("{}:wrong:{{source}}", keys.prefix),
        );
    let env_var = inhook::config::destination_url_env_var("with-login");
    let server =
        TestServer::spawn_with_sources_env(&tables, &[(env_var.as_str(), good_url.as_str())]).await;
    for n in 0..5 {
        let body = serde_json::json!({"event_id": format!("e{n}"), "user_id": format!("u{n}"),
            "presence": "ONLINE", "sequence_number": 1});
        let reply = server.post_presence(&body).await;
        assert!(reply.code < 300, "{reply:?}");
    }
    // Delivered with the login; failing with the wrong one.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = deliveries_to(&server, "with-login").await;
        let failing = deliveries_to(&server, "wrong-login").await;
        let delivered = ok.len() == 5 && ok.iter().all(|d| d.status == DeliveryStatus::Delivered);
        if delivered && failing.len() == 5 && failing.iter().all(|d| d.attempts >= 1) {
            break;
        }
        assert!(Instant::now() < deadline, "not forwarded: {ok:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(entries(&keys.stream("presence")).len(), 5);
    let listed = server.get_text("/v1/destinations").await;
    let (_, ok_out) = server.cli(&["deliveries", "--destination", "with-login"]);
    let (_, wrong_out) = server.cli(&["deliveries", "--destination", "wrong-login"]);
    let detail = server
        .get_text("/v1/destinations/wrong-login/deliveries")
        .await;
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    for (what, text) in [
        ("GET /v1/destinations", &listed),
        ("inhook deliveries", &ok_out),
        ("inhook deliveries (wrong login)", &wrong_out),
        ("GET /v1/destinations/wrong-login/deliveries", &detail),
        ("the server's log", &log),
    ] {
        assert!(
            !text.contains(&password) && !text.contains(&wrong),
            "{what} shows a password: {text}"
        );
    }
    assert!(listed.contains("\"type\":\"redis\""), "{listed}");
    println!("inhook deliveries (wrong login):\n{wrong_out}\n{detail}");
    for text in [&wrong_out, &detail] {
        assert!(
            text.contains("connection failed: Password authentication failed"),
            "{text}"
        );
    }
}

/// TLS (`rediss://`): Redis behind a TLS front whose certificate a private CA issued is
/// reached with the destination's `tls_ca_file`, on inhook's own TLS stack; without the
/// CA file the certificate is refused, and the attempt says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_tls_with_a_private_ca() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let ca = TestCa::new();
    let port = ca.https_front(REDIS.parse().unwrap());
    let url = format!("rediss://localhost:{port}/0");
    let trusted = destination(
        "trusted",
        &url,
        &keys,
        &format!("tls_ca_file = \"{}\"", ca.file().display()),
    );
    let untrusted = destination("untrusted", &url, &keys, "").replace(
        &keys.template(),
        &format!("{}:untrusted:{{source}}", keys.prefix),
    );
    let server = TestServer::in_process()
        .spawn_with_sources(&(trusted + &untrusted))
        .await;
    for n in 0..3 {
        let body = serde_json::json!({"event_id": format!("t{n}"), "user_id": format!("u{n}"),
            "presence": "ONLINE", "sequence_number": 1});
        let reply = server.post_presence(&body).await;
        assert!(reply.code < 300, "{reply:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = deliveries_to(&server, "trusted").await;
        let refused = deliveries_to(&server, "untrusted").await;
        let delivered = ok.len() == 3 && ok.iter().all(|d| d.status == DeliveryStatus::Delivered);
        if delivered && refused.len() == 3 && refused.iter().all(|d| d.attempts >= 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not forwarded: {ok:?} {refused:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let stored = entries(&keys.stream("presence"));
    assert_eq!(stored.len(), 3);
    assert!(stored.iter().all(|e| !e.has("webhook-signature")));
    let (_, out) = server.cli(&["deliveries", "--destination", "untrusted"]);
    assert!(
        out.contains("connection failed: invalid peer certificate"),
        "{out}"
    );
}

#[tokio::test]
async fn an_alert_notice_is_an_entry_of_the_stream_its_destination_names_signed_as_events_are() {
    if !crate::support::broker_available("Redis", REDIS) {
        return;
    }
    let keys = Keys::new();
    let table = format!(
        r#"
[[destinations]]
name = "ops"
type = "redis"
url = "redis://{REDIS}/0"
stream = "{}"
sources = ["presence"]
secret = "{DEST_SECRET}"

[[alerts]]
name = "quiet"
on = "source_silent"
source = "save-game"
after_s = 1
destination = "ops"
"#,
        keys.template()
    );
    let server = TestServer::spawn_full_with("alert_tick_ms = 100", "", &table).await;
    // Placed under the rule's source: `{source}` is save-game.
    let deadline = Instant::now() + WITHIN;
    let entry = loop {
        if let Some(entry) = entries(&keys.stream("save-game")).into_iter().next() {
            break entry;
        }
        assert!(Instant::now() < deadline, "no notice in the stream");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let body: serde_json::Value = serde_json::from_slice(&entry.body).unwrap();
    assert_eq!(body["alert"], "quiet");
    assert_eq!(body["state"], "firing");
    assert_eq!(body["on"], "source_silent");
    let mut headers = axum::http::HeaderMap::new();
    for (name, value) in &entry.headers {
        if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            axum::http::HeaderValue::from_str(value),
        ) {
            headers.insert(name, value);
        }
    }
    assert_eq!(headers["inhook-alert"], "quiet");
    assert!(inhook::ingress::signature::verify(
        inhook::ingress::signature::Scheme::StandardWebhooks,
        &headers,
        &entry.body,
        &[inhook::ingress::signature::Secret::new(DEST_SECRET)],
        crate::support::now_s(),
        300,
    )
    .is_ok());
    drop(server);
}
