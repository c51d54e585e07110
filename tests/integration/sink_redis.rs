//! Issue #27, the Redis Streams sink (docs/contract.md, sinks): the real server binary
//! forwards chaotic streams of both seed sources to the machine's Redis (127.0.0.1:6379)
//! with `XADD`, and the tests read the streams back as a consumer would: each entry's
//! fields are the message's headers, its `body` field the raw body. Redis may hold an entry
//! twice after a crash or an outage (a resend of an `XADD` whose reply was lost), so the
//! audit dedupes by `webhook-id`, keeping the first, then asks that nothing is lost and
//! that per aggregate the entries follow the applied order. Every test uses keys (and an
//! ACL user) of its own random suffix and removes them at the end.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine;
use hmac::{Hmac, Mac};
use inhook::domain::AggregateKey;
use inhook::forward::queue::DeliveryStatus;
use inhook::store::{DeliveryFilter, DeliveryRecord};
use inhook::tools::simulate::{expected_states, Endpoint, Plan, Publisher, Stream};
use serde_json::Value;

use crate::application::DEST_SECRET;
use crate::crash::{chaos_publisher, chaos_stream_of};
use crate::support::tcp_proxy::TcpProxy;
use crate::support::{Backend, TestServer};

/// The machine's Redis.
const REDIS: &str = "127.0.0.1:6379";

/// The metadata fields every entry has, in this order, before `body`.
const FIELDS: [&str; 8] = [
    "webhook-id",
    "inhook-source",
    "inhook-event-id",
    "inhook-event-type",
    "inhook-aggregate",
    "inhook-sequence",
    "inhook-attempt",
    "content-type",
];

/// A test's own Redis keys (`inhook-test-<suffix>:<source>`), deleted when dropped.
struct Keys {
    prefix: String,
    users: Vec<String>,
}

impl Keys {
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

impl Drop for Keys {
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

fn sync_connection() -> redis::RedisResult<redis::Connection> {
    redis::Client::open(format!("redis://{REDIS}/0"))?.get_connection()
}

/// One stream entry as a consumer reads it.
#[derive(Debug, Clone)]
struct Entry {
    /// The metadata fields in their order, then `body`.
    fields: Vec<(String, Vec<u8>)>,
}

impl Entry {
    fn field(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_slice())
    }

    fn text(&self, name: &str) -> String {
        String::from_utf8(self.field(name).unwrap_or_default().to_vec()).expect("UTF-8 field")
    }

    fn body(&self) -> &[u8] {
        self.field("body").expect("body field")
    }
}

/// Every entry of `stream`, oldest first.
fn entries(stream: &str) -> Vec<Entry> {
    let mut connection = sync_connection().expect("redis");
    let raw: Vec<(String, Vec<Vec<u8>>)> = redis::cmd("XRANGE")
        .arg(stream)
        .arg("-")
        .arg("+")
        .query(&mut connection)
        .expect("XRANGE");
    raw.into_iter()
        .map(|(_, flat)| Entry {
            fields: flat
                .chunks(2)
                .map(|pair| {
                    (
                        String::from_utf8(pair[0].clone()).expect("field name"),
                        pair[1].clone(),
                    )
                })
                .collect(),
        })
        .collect()
}

/// The entries of both seed sources' streams.
fn all_entries(keys: &Keys) -> Vec<Entry> {
    let mut all = entries(&keys.stream("presence"));
    all.extend(entries(&keys.stream("save-game")));
    all
}

/// A Redis destination named `name` with the test's streams; `extra` adds keys.
fn destination(name: &str, url: &str, keys: &Keys, extra: &str) -> String {
    format!(
        r#"
[[destinations]]
name = "{name}"
type = "redis"
url = "{url}"
stream = "{stream}"
sources = ["presence", "save-game"]
timeout_s = 1
lease_margin_s = 1
max_attempts = 100
retry_base_s = 1
retry_max_delay_s = 1
concurrency = 16
{extra}
"#,
        stream = keys.template(),
    )
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

/// What a consumer found in the streams, against the store's deliveries.
#[derive(Debug, Default)]
struct Audit {
    applied: usize,
    entries: usize,
    /// Entries beyond the first of their `webhook-id`.
    duplicates: usize,
    /// Deliveries with no entry, or not `delivered`.
    lost: usize,
    /// Entries of no delivery.
    unexpected: usize,
    /// Events whose first entry came after that of an event of their aggregate applied later.
    order_violations: usize,
    body_mismatches: usize,
    /// Entries whose fields are not exactly the metadata (as the store has it) and `body`.
    field_mismatches: usize,
    bad_signatures: usize,
}

impl Audit {
    /// Audits `entries` against `destination`'s deliveries on `server`; `signed` says
    /// whether the destination has [`DEST_SECRET`].
    async fn of(server: &TestServer, destination: &str, entries: &[Entry], signed: bool) -> Self {
        let deliveries = deliveries(server, destination).await;
        let logged = server.logged().await;
        let bodies: HashMap<&str, &[u8]> = logged
            .iter()
            .map(|e| (e.event_id.as_str(), e.body.as_slice()))
            .collect();
        let by_webhook_id: HashMap<&str, &DeliveryRecord> = deliveries
            .iter()
            .map(|d| (d.webhook_id.as_str(), d))
            .collect();
        let mut applied: HashMap<String, Vec<&str>> = HashMap::new();
        for d in &deliveries {
            applied
                .entry(AggregateKey::text_of_stored(&d.aggregate))
                .or_default()
                .push(&d.webhook_id);
        }
        let mut audit = Audit {
            applied: deliveries.len(),
            entries: entries.len(),
            ..Audit::default()
        };
        // The consumer's dedupe: the first entry of each webhook-id, in stream order.
        let mut seen: HashSet<String> = HashSet::new();
        let mut first_by_aggregate: HashMap<String, Vec<String>> = HashMap::new();
        for entry in entries {
            let webhook_id = entry.text("webhook-id");
            let Some(delivery) = by_webhook_id.get(webhook_id.as_str()) else {
                audit.unexpected += 1;
                continue;
            };
            if !audit_fields(entry, delivery, signed) {
                audit.field_mismatches += 1;
            }
            if !signed || !signature_verifies(entry) {
                audit.bad_signatures += usize::from(signed);
            }
            if bodies.get(delivery.event_id.as_str()) != Some(&entry.body()) {
                audit.body_mismatches += 1;
            }
            if !seen.insert(webhook_id.clone()) {
                audit.duplicates += 1;
                continue;
            }
            first_by_aggregate
                .entry(entry.text("inhook-aggregate"))
                .or_default()
                .push(webhook_id);
        }
        audit.lost = deliveries
            .iter()
            .filter(|d| d.status != DeliveryStatus::Delivered || !seen.contains(&d.webhook_id))
            .count();
        for (aggregate, firsts) in &first_by_aggregate {
            let order = applied
                .get(aggregate)
                .map(Vec::as_slice)
                .unwrap_or_default();
            let mut latest = None;
            for webhook_id in firsts {
                let at = order.iter().position(|w| *w == webhook_id.as_str());
                if at.is_none() || at < latest {
                    audit.order_violations += 1;
                }
                latest = latest.max(at);
            }
        }
        audit
    }

    fn line(&self) -> String {
        format!(
            "{} deliveries applied, {} entries, {} duplicates (same webhook-id), {} lost, \
             {} order violations",
            self.applied, self.entries, self.duplicates, self.lost, self.order_violations
        )
    }

    /// Nothing lost or unexpected, in applied order per aggregate, byte for byte, every
    /// field as the contract lists it; duplicates only where `duplicates_allowed`.
    fn assert_clean(&self, duplicates_allowed: bool, at_least: usize) {
        assert_eq!(self.lost, 0, "deliveries with no entry: {}", self.line());
        assert_eq!(self.unexpected, 0, "entries of no delivery");
        assert_eq!(
            self.order_violations,
            0,
            "out of applied order: {}",
            self.line()
        );
        assert_eq!(self.body_mismatches, 0, "a body not byte for byte");
        assert_eq!(self.field_mismatches, 0, "an entry's fields differ");
        assert_eq!(self.bad_signatures, 0, "a signature that does not verify");
        if !duplicates_allowed {
            assert_eq!(self.duplicates, 0, "an entry added twice: {}", self.line());
        }
        assert!(self.applied >= at_least, "too few events: {}", self.line());
    }
}

/// Whether `entry`'s fields are exactly the contract's, in order, valued as `delivery`.
fn audit_fields(entry: &Entry, delivery: &DeliveryRecord, signed: bool) -> bool {
    let mut expected: Vec<&str> = FIELDS.to_vec();
    if signed {
        expected.extend(["webhook-timestamp", "webhook-signature"]);
    }
    let mut names: Vec<&str> = entry.fields.iter().map(|(n, _)| n.as_str()).collect();
    let Some("body") = names.pop() else {
        return false;
    };
    names.sort_unstable();
    expected.sort_unstable();
    names == expected
        && entry.text("webhook-id") == delivery.webhook_id
        && entry.text("inhook-event-id") == delivery.event_id
        && entry.text("inhook-source") == delivery.source
        && entry.text("inhook-sequence") == delivery.sequence.to_string()
        && entry.text("inhook-aggregate") == AggregateKey::text_of_stored(&delivery.aggregate)
        && entry
            .text("inhook-attempt")
            .parse::<u32>()
            .is_ok_and(|n| n >= 1)
        && entry.text("content-type") == "application/json"
}

/// Whether `entry`'s `webhook-signature` verifies with [`DEST_SECRET`] (Standard Webhooks v1).
fn signature_verifies(entry: &Entry) -> bool {
    let key = base64::engine::general_purpose::STANDARD
        .decode(DEST_SECRET.trim_start_matches("whsec_"))
        .expect("secret");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(&key).expect("key");
    mac.update(entry.text("webhook-id").as_bytes());
    mac.update(b".");
    mac.update(entry.text("webhook-timestamp").as_bytes());
    mac.update(b".");
    mac.update(entry.body());
    let expected = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    entry
        .text("webhook-signature")
        .split(' ')
        .any(|s| s == format!("v1,{expected}"))
}

/// Sends `plan` through `publisher` in the background.
fn publish(
    publisher: &Publisher,
    plan: &Arc<Plan>,
) -> tokio::task::JoinHandle<inhook::tools::simulate::DeliveryReport> {
    let (publisher, plan) = (publisher.clone(), Arc::clone(plan));
    tokio::spawn(async move { publisher.deliver(plan).await })
}

/// Waits until the stream converged, every delivery is delivered and each has an entry.
async fn drain(
    publisher: &Publisher,
    stream: &Stream,
    server: &TestServer,
    name: &str,
    keys: &Keys,
) {
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
        let deliveries = deliveries(server, name).await;
        let delivered = deliveries
            .iter()
            .filter(|d| d.status == DeliveryStatus::Delivered)
            .count();
        let ids: HashSet<String> = all_entries(keys)
            .iter()
            .map(|e| e.text("webhook-id"))
            .collect();
        if delivered == deliveries.len() && deliveries.iter().all(|d| ids.contains(&d.webhook_id)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not forwarded in time: {delivered} of {} delivered, {} in the streams",
            deliveries.len(),
            ids.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The destination `name` as `GET /v1/destinations` lists it.
async fn listed(server: &TestServer, name: &str) -> Value {
    let reply = server.get("/v1/destinations").await;
    reply.body["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|d| d["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not listed: {}", reply.body))
}

/// Issue #27's first case: reordered, duplicated in-order (save-game inventory deltas)
/// and latest-wins (progress, presence) events across many aggregates each become one
/// entry, per aggregate in applied order, byte for byte, with every header as a field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_chaotic_streams_arrive_once_in_applied_order() {
    let keys = Keys::new();
    let url = format!("redis://{REDIS}/0");
    let extra = format!("secret = \"{DEST_SECRET}\"\nmax_len = 100000");
    // "Once each": an ample timeout, so that a slow machine's late reply is no resend.
    let table =
        destination("stream", &url, &keys, &extra).replace("timeout_s = 1", "timeout_s = 5");
    let server = TestServer::spawn_with_sources(&table).await;
    let (stream, plan) = chaos_stream_of(0x0027_4ed1, 600, 40);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 8, 400);
    let started = Instant::now();
    let report = publish(&publisher, &plan).await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "stream", &keys).await;
    let audit = Audit::of(&server, "stream", &all_entries(&keys), true).await;
    println!(
        "redis sink, chaotic streams: {} events sent; {}; all in the streams after {:.1}s",
        stream.event_count(),
        audit.line(),
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(false, 300);
    let item = listed(&server, "stream").await;
    assert_eq!(item["type"], "redis", "{item}");
    assert_eq!(item["circuit"], "closed", "{item}");
}

/// Issue #27's outage: Redis taken away behind a proxy and brought back. Deliveries fail
/// as connection failures, the circuit opens, then closes once Redis is back, and nothing
/// is lost or out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_outage_opens_the_circuit_and_loses_nothing() {
    let keys = Keys::new();
    let upstream: SocketAddr = REDIS.parse().unwrap();
    let proxy = TcpProxy::start(upstream).await;
    let url = format!("redis://{}/0", proxy.addr());
    let server = TestServer::spawn_with_sources(&destination("cache", &url, &keys, "")).await;
    let (stream, plan) = chaos_stream_of(0x0027_0a7e, 500, 30);
    let publisher = chaos_publisher(Endpoint::new(&server.url), 6, 100);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    // Some entries first, so the outage starts mid-run.
    let deadline = Instant::now() + Duration::from_secs(10);
    while all_entries(&keys).len() < 20 {
        assert!(Instant::now() < deadline, "nothing reached Redis");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    proxy.cut();
    let cut_at = Instant::now();
    let open = server
        .wait_for("/v1/destinations", |r| {
            r.body["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|d| d["name"] == "cache" && d["circuit"] == "open")
            })
        })
        .await;
    let item = open.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "cache")
        .unwrap()
        .clone();
    assert_eq!(item["type"], "redis", "{item}");
    let opened_after = cut_at.elapsed();
    let failed = deliveries(&server, "cache").await;
    assert!(
        failed.iter().any(|d| d.status != DeliveryStatus::Delivered),
        "the outage held nothing back"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.restore();
    let report = sending.await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "cache", &keys).await;
    server
        .wait_for("/v1/destinations", |r| {
            r.body["items"].as_array().is_some_and(|items| {
                items
                    .iter()
                    .any(|d| d["name"] == "cache" && d["circuit"] == "closed")
            })
        })
        .await;
    let audit = Audit::of(&server, "cache", &all_entries(&keys), false).await;
    println!(
        "redis sink outage: {} events sent, circuit open {:.1}s after the cut; {}; all in the \
         streams after {:.1}s",
        stream.event_count(),
        opened_after.as_secs_f64(),
        audit.line(),
        started.elapsed().as_secs_f64()
    );
    // An XADD whose reply the cut lost is added again: a consumer dedupes it.
    audit.assert_clean(true, 250);
}

/// Issue #27's SIGKILL mid-run: the node is killed and restarted on its store several
/// times; an `XADD` whose reply died with the node is added again (a duplicate the
/// consumer drops by `webhook-id`), and after that dedupe nothing is lost and each
/// aggregate's entries follow the applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_sigkills_lose_nothing_and_keep_order() {
    let keys = Keys::new();
    let url = format!("redis://{REDIS}/0");
    let mut server = TestServer::spawn_with_sources(&destination("stream", &url, &keys, "")).await;
    let (stream, plan) = chaos_stream_of(0x0027_c4a5, 900, 40);
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
    let report = sending.await.expect("publisher task");
    assert!(
        kills >= 2,
        "the stream ended after {kills} kills: send slower"
    );
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &server, "stream", &keys).await;
    let audit = Audit::of(&server, "stream", &all_entries(&keys), false).await;
    println!(
        "redis sink through {kills} SIGKILLs ({}): {} events sent; {}; all in the streams \
         after {:.1}s",
        Backend::fresh_kind(),
        stream.event_count(),
        audit.line(),
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(true, 400);
}

/// Issue #27's three nodes on one PostgreSQL database, one SIGKILLed mid-run: the others
/// take over its leased deliveries; nothing lost, each aggregate in applied order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_three_nodes_one_killed_lose_nothing_and_keep_order() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let keys = Keys::new();
    let url = format!("redis://{REDIS}/0");
    let config = destination("stream", &url, &keys, "");
    let first = TestServer::spawn_with_sources(&config).await;
    let mut second = TestServer::join_with_sources(&first, &config).await;
    let third = TestServer::join_with_sources(&first, &config).await;
    let (stream, plan) = chaos_stream_of(0x0027_30de, 900, 40);
    let endpoint = Endpoint::many(&[&first.url, &second.url, &third.url]);
    let publisher = chaos_publisher(endpoint.clone(), 12, 300);
    let started = Instant::now();
    let sending = publish(&publisher, &plan);
    let pause = 800 + rand::random::<u64>() % 1_000;
    tokio::time::sleep(Duration::from_millis(pause)).await;
    assert!(
        !sending.is_finished(),
        "the stream ended before the kill: send slower"
    );
    endpoint.remove(&second.url);
    tokio::task::block_in_place(|| second.kill9());
    let report = sending.await.expect("publisher task");
    assert!(report.failures.is_empty(), "{:?}", report.failures.first());
    drain(&publisher, &stream, &first, "stream", &keys).await;
    let audit = Audit::of(&first, "stream", &all_entries(&keys), false).await;
    println!(
        "redis sink, 3 nodes (postgres), 1 killed after {pause} ms: {} events sent; {}; all \
         in the streams after {:.1}s",
        stream.event_count(),
        audit.line(),
        started.elapsed().as_secs_f64()
    );
    audit.assert_clean(true, 400);
    drop(third);
}

/// A fixed stream name whose key holds another type, and a Redis that cannot be reached:
/// the server starts either way (docs/contract.md, sinks), the log names the key, and the
/// WRONGTYPE delivery retries with the reason and counts toward the circuit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_redis_a_stream_key_of_another_type_is_logged_and_retried() {
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
        let delivery = deliveries(&server, "fixed").await.pop();
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
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
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
        let ok = deliveries(&server, "with-login").await;
        let failing = deliveries(&server, "wrong-login").await;
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
    let keys = Keys::new();
    let ca = crate::support::tls::TestCa::new();
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
    let server = TestServer::spawn_with_sources(&(trusted + &untrusted)).await;
    for n in 0..3 {
        let body = serde_json::json!({"event_id": format!("t{n}"), "user_id": format!("u{n}"),
            "presence": "ONLINE", "sequence_number": 1});
        let reply = server.post_presence(&body).await;
        assert!(reply.code < 300, "{reply:?}");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ok = deliveries(&server, "trusted").await;
        let refused = deliveries(&server, "untrusted").await;
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
    assert!(stored
        .iter()
        .all(|e| e.field("webhook-signature").is_none()));
    let (_, out) = server.cli(&["deliveries", "--destination", "untrusted"]);
    assert!(
        out.contains("connection failed: invalid peer certificate"),
        "{out}"
    );
}
