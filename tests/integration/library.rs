//! The library facade (docs/library.md): inhook embedded in a service of the test's own,
//! mounted under `/hooks` beside a route of the service, on a listener the test binds (port
//! 0), over SQLite or the PostgreSQL of `INHOOK_TEST_DATABASE`. Deliveries go over HTTP,
//! signed; the service's consumer must see each applied event once after it took it, in
//! sequence order per aggregate, across a failed attempt, a duplicate and a restart.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::routing::get;
use axum::Router;
use inhook::ingress::signature::Scheme;
use inhook::{Applied, Inhook, Settings};
use serde_json::{json, Value};

use crate::support::{now_s, signed, Backend};

const SECRET: &str = "ledger-library-secret";

/// An in-order ledger (a gap is held until it fills) forwarded to the in-process
/// destination `app`, retried one second after a failure.
const CONFIG: &str = r#"
busy_timeout_ms = 1000
forward_poll_ms = 200

[[sources]]
name = "ledger"
kind = "json"
signature = "hmac-hex"
mode = "sync"
event_id = "/event_id"
aggregate = "/account"
sequence = "/seq"
ordering = "in-order"
first_sequence = 1
hold_timeout_s = 600
event_type = "/type"

[[destinations]]
name = "app"
type = "in_process"
sources = ["ledger"]
retry_base_s = 1
retry_max_delay_s = 1
max_attempts = 10
"#;

/// What the consumer saw: (event_id, aggregate, sequence, attempt, taken).
type Seen = Arc<Mutex<Vec<(String, String, i64, u32, bool)>>>;

/// An embedded instance served on a port of its own, and how to stop it.
struct Service {
    url: String,
    inhook: Inhook,
    stop: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

impl Service {
    /// Starts inhook over `database`, its applied events going to `consumer`, and serves
    /// it under `/hooks` beside the service's `/hello`.
    async fn start<F, Fut>(database: &str, consumer: F) -> Self
    where
        F: Fn(Applied) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let config = Settings::toml(CONFIG)
            .database(database)
            .secret("ledger", SECRET)
            .load()
            .expect("the config loads");
        let inhook = Inhook::builder(config)
            .on_applied("app", consumer)
            .start()
            .await
            .expect("inhook starts");
        let app = Router::new()
            .route("/hello", get(|| async { "hello" }))
            .nest("/hooks", inhook.router());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
        });
        Self {
            url,
            inhook,
            stop,
            served,
        }
    }

    /// Posts one signed ledger entry; answers the status code and body.
    async fn post(&self, event_id: &str, account: &str, seq: i64) -> (u16, Value) {
        post(&self.url, event_id, account, seq).await
    }

    /// Stops serving, then stops inhook's background work.
    async fn stop(self) {
        let _ = self.stop.send(());
        self.served.await.unwrap();
        self.inhook.shutdown().await;
    }
}

/// A consumer recording into `seen`, refusing an event's first attempt when `refuse` says so.
fn recorder(
    seen: &Seen,
    refuse: impl Fn(&Applied) -> bool + Send + Sync + 'static,
) -> impl Fn(Applied) -> std::future::Ready<anyhow::Result<()>> + Send + Sync + 'static {
    let seen = Arc::clone(seen);
    move |event: Applied| {
        let take = !refuse(&event);
        assert_eq!(event.json().unwrap()["event_id"], event.event_id.as_str());
        seen.lock().unwrap().push((
            event.event_id.clone(),
            event.aggregate.clone(),
            event.sequence,
            event.attempt,
            take,
        ));
        std::future::ready(if take {
            Ok(())
        } else {
            Err(anyhow::anyhow!("not yet"))
        })
    }
}

/// The events `seen` took, in the order they were taken.
fn taken(seen: &Seen) -> Vec<(String, String, i64)> {
    seen.lock()
        .unwrap()
        .iter()
        .filter(|s| s.4)
        .map(|(id, aggregate, seq, _, _)| (id.clone(), aggregate.clone(), *seq))
        .collect()
}

/// Waits until `seen` took every id of `ids`.
async fn wait_taken(seen: &Seen, ids: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let took = taken(seen);
        if ids.iter().all(|id| took.iter().any(|t| t.0 == *id)) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not all of {ids:?} taken: {:?}",
            seen.lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_receiver_hands_each_applied_event_once_in_order_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::fresh().await;
    let database = backend.url(dir.path());
    let seen: Seen = Arc::default();
    // The first attempt at a-2 fails; b-2 fails for as long as the first instance runs.
    let first = Service::start(
        &database,
        recorder(&seen, |e| {
            (e.event_id == "a-2" && e.attempt == 1) || e.event_id == "b-2"
        }),
    )
    .await;
    let hello = reqwest::get(format!("{}/hello", first.url)).await.unwrap();
    assert_eq!(
        hello.text().await.unwrap(),
        "hello",
        "the service's own route"
    );

    // a-2 before a-1: held until a-1 fills the gap, then both applied in order.
    let (code, _) = first.post("a-2", "acct-a", 2).await;
    assert_eq!(code, 202, "a-2 waits for a-1");
    let (code, body) = first.post("a-1", "acct-a", 1).await;
    assert_eq!((code, body["status"].as_str()), (200, Some("applied")));
    let (code, body) = first.post("a-1", "acct-a", 1).await;
    assert_eq!((code, body["status"].as_str()), (200, Some("duplicate")));
    first.post("a-3", "acct-a", 3).await;
    first.post("b-1", "acct-b", 1).await;
    first.post("b-2", "acct-b", 2).await;
    wait_taken(&seen, &["a-1", "a-2", "a-3", "b-1"]).await;
    {
        let seen = seen.lock().unwrap();
        let a2: Vec<_> = seen.iter().filter(|s| s.0 == "a-2").collect();
        assert_eq!(
            a2.iter().map(|s| (s.3, s.4)).collect::<Vec<_>>(),
            [(1, false), (2, true)],
            "a-2 failed once, then was taken on its second attempt"
        );
        let a3_first = seen.iter().position(|s| s.0 == "a-3").unwrap();
        let a2_taken = seen.iter().position(|s| s.0 == "a-2" && s.4).unwrap();
        assert!(a2_taken < a3_first, "a-3 waited for a-2: {seen:?}");
    }
    // A gap held across the restart: a-5 waits for a-4, which comes to the next instance.
    let (code, _) = first.post("a-5", "acct-a", 5).await;
    assert_eq!(code, 202);
    first.stop().await;
    assert!(
        !taken(&seen).iter().any(|t| t.0 == "b-2"),
        "b-2 was refused by the first instance"
    );

    // The same database, a consumer that takes everything.
    let second = Service::start(&database, recorder(&seen, |_| false)).await;
    let (code, body) = second.post("a-1", "acct-a", 1).await;
    assert_eq!(
        (code, body["status"].as_str()),
        (200, Some("duplicate")),
        "the log outlives the instance"
    );
    let (code, body) = second.post("a-4", "acct-a", 4).await;
    assert_eq!((code, body["status"].as_str()), (200, Some("applied")));
    wait_taken(&seen, &["a-4", "a-5", "b-2"]).await;
    second.stop().await;

    let took = taken(&seen);
    let mut ids: Vec<&str> = took.iter().map(|t| t.0.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(
        ids,
        ["a-1", "a-2", "a-3", "a-4", "a-5", "b-1", "b-2"],
        "each event taken once: {took:?}"
    );
    for account in ["acct-a", "acct-b"] {
        let order: Vec<i64> = took
            .iter()
            .filter(|t| t.1 == account)
            .map(|t| t.2)
            .collect();
        let mut sorted = order.clone();
        sorted.sort_unstable();
        assert_eq!(order, sorted, "{account} in sequence order");
    }
    backend.drop_database().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_of_applied_events_sends_the_next_of_an_aggregate_after_the_ack() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::fresh().await;
    let config = Settings::toml(CONFIG)
        .database(backend.url(dir.path()))
        .secret("ledger", SECRET)
        .load()
        .unwrap();
    let mut builder = Inhook::builder(config);
    let mut events = builder.applied_events("app");
    let inhook = builder.start().await.unwrap();
    let app = Router::new().nest("/hooks", inhook.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    // Served without ConnectInfo: the receiver still answers (no allow_ips here).
    let served = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    for (id, seq) in [("a-1", 1), ("a-2", 2)] {
        let (code, body) = post(&url, id, "acct-a", seq).await;
        assert_eq!(
            (code, body["status"].as_str()),
            (200, Some("applied")),
            "{id}"
        );
    }
    let first = next(&mut events).await;
    assert_eq!((first.event_id.as_str(), first.attempt), ("a-1", 1));
    first.nack("not now");
    // a-2 is applied already, yet a-1 comes again first: its aggregate waits for its ack.
    let again = next(&mut events).await;
    assert_eq!((again.event_id.as_str(), again.attempt), ("a-1", 2));
    assert_eq!(again.json().unwrap()["amount_cents"], 100);
    again.ack();
    let second = next(&mut events).await;
    assert_eq!((second.event_id.as_str(), second.sequence), ("a-2", 2));
    second.ack();
    served.abort();
    inhook.shutdown().await;
    backend.drop_database().await;
}

/// The next event of `events`, within 30 s.
async fn next(events: &mut inhook::AppliedEvents) -> inhook::Pending {
    tokio::time::timeout(Duration::from_secs(30), events.recv())
        .await
        .expect("an event within 30 s")
        .expect("the stream is open")
}

/// Posts one signed ledger entry to the service at `base`, inhook under `/hooks`;
/// answers the status code and body.
async fn post(base: &str, event_id: &str, account: &str, seq: i64) -> (u16, Value) {
    post_signed(base, SECRET, event_id, account, seq).await
}

/// [`post`], signed with `secret`.
async fn post_signed(
    base: &str,
    secret: &str,
    event_id: &str,
    account: &str,
    seq: i64,
) -> (u16, Value) {
    let body = json!({"event_id": event_id, "type": "entry.posted", "account": account,
                      "seq": seq, "amount_cents": seq * 100})
    .to_string();
    let mut request = reqwest::Client::new()
        .post(format!("{base}/hooks/webhooks/ledger"))
        .body(body.clone());
    for (name, value) in signed(Scheme::HmacHex, secret, body.as_bytes(), now_s()) {
        request = request.header(name, value);
    }
    let response = request.send().await.expect("inhook answers");
    let code = response.status().as_u16();
    (code, response.json().await.unwrap_or(Value::Null))
}

/// The text between the `docs-snippet` lines of `crates/core/examples/embed.rs`, which CI compiles.
fn example_snippet() -> String {
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/core/examples/embed.rs"
    ))
    .unwrap();
    let start = example
        .find("// docs-snippet: start")
        .expect("the start line");
    let end = example.find("// docs-snippet: end").expect("the end line");
    let (_, snippet) = example[start..end].split_once('\n').unwrap();
    snippet.trim_end().to_owned()
}

#[test]
fn the_snippet_of_docs_library_md_is_the_compiled_example() {
    let page =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/library.md")).unwrap();
    let (_, after) = page.split_once("```rust\n").expect("a rust block");
    let (block, _) = after.split_once("\n```").unwrap();
    assert_eq!(
        block,
        example_snippet(),
        "docs/library.md shows crates/core/examples/embed.rs between its docs-snippet lines"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_full_router_serves_the_read_api_behind_the_token_and_reloads_in_code() {
    const TOKEN: &str = "library-admin-token-0123456789";
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::fresh().await;
    let settings = Settings::toml(CONFIG)
        .database(backend.url(dir.path()))
        .secret("ledger", SECRET)
        .admin_token(TOKEN);

    // A `type = "in_process"` table no consumer binds: nothing would ever take its events.
    let unbound = Inhook::builder(settings.load().unwrap()).start().await;
    let refused = format!("{:#}", unbound.err().expect("refused"));
    assert!(
        refused.contains("\"app\"") && refused.contains("in_process"),
        "{refused}"
    );

    let twice = Inhook::builder(settings.load().unwrap())
        .on_applied("app", |_| async { Ok(()) })
        .on_applied("app", |_| async { Ok(()) })
        .start()
        .await;
    let refused = twice.err().expect("refused").to_string();
    assert!(refused.contains("bound to it twice"), "{refused}");

    let inhook = Inhook::builder(settings.load().unwrap())
        .on_applied("app", |_| async { Ok(()) })
        // Bound in code alone: an in-process destination with the defaults.
        .on_applied("audit", |_| async { Ok(()) })
        .start()
        .await
        .unwrap();
    let app = Router::new().nest("/hooks", inhook.full_router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let url = format!("{base}/hooks");
    let served = tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap()
    });
    let client = reqwest::Client::new();
    let anonymous = client
        .get(format!("{url}/v1/destinations"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let listed: Value = client
        .get(format!("{url}/v1/destinations"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let shown: Vec<(&str, &str, &str)> = listed["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap(),
                d["type"].as_str().unwrap(),
                d["url"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        shown,
        [
            ("app", "in_process", "in-process:app"),
            ("audit", "in_process", "in-process:audit")
        ]
    );
    let reload = client
        .post(format!("{url}/v1/admin/reload"))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(reload.status().as_u16(), 422, "no file to read again");

    // Rotation in code: the new secret verifies, the old one no longer does.
    const NEW_SECRET: &str = "ledger-library-secret-2";
    let rotated = Settings::toml(CONFIG)
        .database(backend.url(dir.path()))
        .secret("ledger", NEW_SECRET)
        .admin_token(TOKEN);
    let plan = inhook.reload_secrets(rotated.load().unwrap()).unwrap();
    assert_eq!(plan.sources, 1);
    let (code, _) = post_signed(&base, NEW_SECRET, "r-1", "acct-r", 1).await;
    assert_eq!(code, 200, "the new secret verifies");
    let (code, body) = post_signed(&base, SECRET, "r-2", "acct-r", 2).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (401, Some("invalid_signature"))
    );
    let changed = Settings::toml(CONFIG.replace("max_attempts = 10", "max_attempts = 9"))
        .database(backend.url(dir.path()))
        .secret("ledger", SECRET)
        .admin_token(TOKEN);
    let refused = inhook.reload_secrets(changed.load().unwrap()).unwrap_err();
    assert!(refused.to_string().contains("max_attempts"), "{refused}");

    served.abort();
    inhook.shutdown().await;
    backend.drop_database().await;
}
