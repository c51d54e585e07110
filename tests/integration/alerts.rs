//! Alerts (docs/configuration.md, alerts): each rule fires once when its condition starts,
//! resolves once when it ends, and the receiver gets the notice in its format (a
//! destination's signed JSON, Slack's message, an email); `GET /v1/alerts` keeps them all.

use std::time::{Duration, Instant};

use inhook::ingress::signature::{Scheme, Secret};
use serde_json::{json, Value};

use crate::application::{recording_application, Received, DEST_SECRET};
use crate::support::{now_s, TestServer};

/// Alerts are evaluated every 100 ms in these tests.
pub(crate) const TICK: &str = "alert_tick_ms = 100";

pub(crate) fn save_event(event_id: &str, seq: i64, slot: &str) -> Value {
    json!({"event_id": event_id, "event_type": "inventory.updated", "payload_version": 1,
           "occurred_at": "2026-06-28T10:15:21Z", "player_id": "player_1024",
           "save_slot": slot, "sequence": seq, "idempotency_key": event_id,
           "data": {"added_items": [{"item_id": "gem", "qty": 1}]}})
}

/// The JSON bodies the receiver got, once it got at least `n`, oldest first.
pub(crate) async fn received_at_least(
    received: &Received,
    n: usize,
) -> Vec<(axum::http::HeaderMap, Value)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got: Vec<_> = received
            .lock()
            .unwrap()
            .iter()
            .map(|(headers, body)| {
                (
                    headers.clone(),
                    serde_json::from_slice(body).expect("a JSON body"),
                )
            })
            .collect();
        if got.len() >= n {
            return got;
        }
        assert!(
            Instant::now() < deadline,
            "the receiver got {} notices, not {n}: {got:?}",
            got.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The newest notice's first channel, once it has been tried `attempts` times.
async fn newest_channel_tried(server: &TestServer, attempts: i64) -> Value {
    let listed = server
        .wait_for("/v1/alerts", |r| {
            r.body["items"][0]["channels"][0]["attempts"]
                .as_i64()
                .is_some_and(|n| n >= attempts)
        })
        .await;
    listed.body["items"][0]["channels"][0].clone()
}

/// The notices `GET /v1/alerts` lists, once it lists at least `n` (newest first).
async fn listed_at_least(server: &TestServer, n: usize) -> Vec<Value> {
    let reply = server
        .wait_for("/v1/alerts", |r| {
            r.body["items"].as_array().is_some_and(|a| a.len() >= n)
        })
        .await;
    reply.body["items"].as_array().unwrap().clone()
}

/// A destination named `ops` at `port` for the notices (its own `sources` are never posted).
pub(crate) fn ops_destination(port: u16) -> String {
    format!(
        r#"
[[destinations]]
name = "ops"
url = "http://127.0.0.1:{port}/hooks"
sources = ["presence"]
secret = "{DEST_SECRET}"
"#
    )
}

/// Asserts that the `at`th request `received` got verifies with the destination's secret.
fn assert_signed(received: &Received, at: usize) {
    let (headers, raw) = received.lock().unwrap()[at].clone();
    assert!(inhook::ingress::signature::verify(
        Scheme::StandardWebhooks,
        &headers,
        &raw,
        &[Secret::new(DEST_SECRET)],
        now_s(),
        300,
    )
    .is_ok());
}

#[tokio::test]
async fn a_gap_held_and_a_backlog_fire_signed_notices_to_a_destination_and_resolve_when_it_fills() {
    let received = Received::default();
    let port = recording_application(&received).await;
    let server = TestServer::spawn_full_with(
        &format!("{TICK}\nretry_base_s = 1"),
        "hold_timeout_s = 600",
        &format!(
            r#"{}
[[alerts]]
name = "gap"
on = "gap_held"
source = "save-game"
after_s = 1
destination = "ops"

[[alerts]]
name = "backlog"
on = "backlog"
over = 0
destination = "ops"
"#,
            ops_destination(port)
        ),
    )
    .await;
    // 3 arrives first: held for 1 and 2, so the backlog stays above 0 until both came.
    server.post_save(&save_event("g3", 3, "slot_a")).await;
    server.wait_status("save-game", "g3", "held").await;
    let fired = received_at_least(&received, 2).await;
    let first: Vec<_> = fired
        .iter()
        .map(|(_, b)| (b["alert"].clone(), b["state"].clone()))
        .collect();
    // The backlog fires at once; the gap once it was held longer than a second.
    assert_eq!(first[0], (json!("backlog"), json!("firing")));
    assert_eq!(first[1], (json!("gap"), json!("firing")));
    let (headers, gap) = &fired[1];
    assert_signed(&received, 1);
    assert_eq!(headers["inhook-alert"], "gap");
    assert!(headers["webhook-id"].to_str().unwrap().starts_with("msg_"));
    assert_eq!(gap["on"], "gap_held");
    assert_eq!(gap["source"], "save-game");
    assert!(gap["figures"]["held_for_s"].as_i64().unwrap() > 1, "{gap}");
    assert!(gap["summary"].as_str().unwrap().contains("held for a gap"));
    assert_eq!(fired[0].1["figures"]["backlog"], 1);

    // The gap fills: both resolve, once each, naming when they started.
    server.post_save(&save_event("g1", 1, "slot_a")).await;
    server.post_save(&save_event("g2", 2, "slot_a")).await;
    let all = received_at_least(&received, 4).await;
    let mut resolved: Vec<_> = all[2..]
        .iter()
        .map(|(_, b)| {
            format!(
                "{} {}",
                b["alert"].as_str().unwrap(),
                b["state"].as_str().unwrap()
            )
        })
        .collect();
    resolved.sort();
    assert_eq!(resolved, ["backlog resolved", "gap resolved"]);
    for (at, (_, body)) in all.iter().enumerate().skip(2) {
        assert_signed(&received, at);
        let started = all[..2]
            .iter()
            .find(|(_, b)| b["alert"] == body["alert"])
            .unwrap();
        assert_eq!(body["since"], started.1["since"]);
    }
    // The history holds the four, newest first.
    let listed = listed_at_least(&server, 4).await;
    let states: Vec<_> = listed
        .iter()
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["resolved", "resolved", "firing", "firing"]);
    assert!(listed[0]["id"].as_i64() > listed[3]["id"].as_i64());
}

#[tokio::test]
async fn a_dead_event_fires_a_slack_message_and_resolves_when_its_aggregate_is_forgotten() {
    let slack = Received::default();
    let port = recording_application(&slack).await;
    let server = TestServer::spawn_full_with(
        TICK,
        "hold_timeout_s = 1",
        &format!(
            r#"
[[alerts]]
name = "dead-saves"
on = "dead"
source = "save-game"
slack_webhook_url = "http://127.0.0.1:{port}/hooks"
repeat_s = 1
"#
        ),
    )
    .await;
    // 3 waits for 2, the gap is skipped after a second, and 2 arrives too late: dead.
    server.post_save(&save_event("d1", 1, "slot_d")).await;
    server.post_save(&save_event("d3", 3, "slot_d")).await;
    server.wait_status("save-game", "d3", "processed").await;
    server.post_save(&save_event("d2", 2, "slot_d")).await;
    server.wait_status("save-game", "d2", "dead").await;
    // The firing message, then (repeat_s = 1) a repeat a second or more later.
    let messages = received_at_least(&slack, 2).await;
    let text = messages[0].1["text"].as_str().unwrap();
    assert!(
        text.starts_with("[inhook] dead-saves firing (save-game): 1 dead events"),
        "{text}"
    );
    assert_eq!(messages[0].1["blocks"][0]["type"], "section");
    assert!(messages[1].1["text"]
        .as_str()
        .unwrap()
        .contains("still firing"));
    let forgotten = server
        .delete("/v1/sources/save-game/aggregates/player_1024/slot_d")
        .await;
    assert_eq!(forgotten.code, 200, "{forgotten:?}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = received_at_least(&slack, 2).await;
        let last = &got.last().unwrap().1;
        if last["text"]
            .as_str()
            .unwrap()
            .contains("dead-saves resolved")
        {
            assert!(last["text"].as_str().unwrap().contains("0 dead events"));
            break;
        }
        assert!(Instant::now() < deadline, "no resolved message: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let listed = listed_at_least(&server, 3).await;
    assert_eq!(listed[0]["state"], "resolved");
    assert_eq!(listed[0]["on"], "dead");
    assert_eq!(listed[0]["figures"]["dead"], 0);
    assert!(listed.iter().any(|a| a["repeat"] == true));
}

#[tokio::test]
async fn bad_signatures_over_a_rate_fire_and_resolve_once_the_window_passes() {
    let received = Received::default();
    let port = recording_application(&received).await;
    let server = TestServer::spawn_full_with(
        TICK,
        "",
        &format!(
            r#"{}
[[alerts]]
name = "forged"
on = "rejections"
rejected = "signature"
source = "save-game"
over = 1
per_s = 2
destination = "ops"
"#,
            ops_destination(port)
        ),
    )
    .await;
    for _ in 0..3 {
        post_forged(&server).await;
    }
    let got = received_at_least(&received, 2).await;
    assert_eq!(got[0].1["state"], "firing");
    assert_eq!(got[0].1["on"], "rejections");
    assert!(got[0].1["figures"]["rejected"].as_i64().unwrap() >= 2);
    // Two seconds later the window holds none of them.
    assert_eq!(got[1].1["state"], "resolved");
    assert_eq!(got[1].1["figures"]["rejected"], 0);
}

/// A server with `top` and one rule, `quiet`: save-game silent for a second, told to the
/// `ops` destination on `port`.
async fn serve_quiet_save_game(top: &str, port: u16) -> TestServer {
    TestServer::spawn_full_with(
        top,
        "",
        &format!(
            r#"{}
[[alerts]]
name = "quiet"
on = "source_silent"
source = "save-game"
after_s = 1
destination = "ops"
"#,
            ops_destination(port)
        ),
    )
    .await
}

#[tokio::test]
async fn a_silent_source_fires_and_its_next_delivery_resolves_it() {
    let received = Received::default();
    let port = recording_application(&received).await;
    let server = serve_quiet_save_game(TICK, port).await;
    let fired = received_at_least(&received, 1).await;
    assert_eq!(fired[0].1["state"], "firing");
    assert_eq!(fired[0].1["on"], "source_silent");
    assert!(fired[0].1["figures"]["silent_for_s"].as_i64().unwrap() > 1);
    server.post_save(&save_event("s1", 1, "slot_s")).await;
    let got = received_at_least(&received, 2).await;
    assert_eq!(got[1].1["state"], "resolved");
    assert_eq!(got[1].1["since"], got[0].1["since"]);
}

#[tokio::test]
async fn a_failing_destination_fires_its_circuit_opens_and_both_resolve_when_it_recovers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // The application answers 500 until it is fixed.
    let broken = Arc::new(AtomicBool::new(true));
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post({
            let broken = Arc::clone(&broken);
            move || async move {
                if broken.load(Ordering::SeqCst) {
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR
                } else {
                    axum::http::StatusCode::NO_CONTENT
                }
            }
        }),
    );
    let app_port = crate::application::serve_application(app).await;
    let slack = Received::default();
    let slack_port = recording_application(&slack).await;
    let server = TestServer::spawn_full_with(
        &format!("{TICK}\nretry_base_s = 1\nretry_max_delay_s = 1\nmax_attempts = 100"),
        "",
        &format!(
            r#"
[[destinations]]
name = "app"
url = "http://127.0.0.1:{app_port}/hooks"
sources = ["save-game"]
secret = "{DEST_SECRET}"

[[alerts]]
name = "failing"
on = "destination_failing"
over = 2
slack_webhook_url = "http://127.0.0.1:{slack_port}/hooks"

[[alerts]]
name = "circuit"
on = "circuit_open"
slack_webhook_url = "http://127.0.0.1:{slack_port}/hooks"
"#
        ),
    )
    .await;
    // Ten failures over three aggregates open the circuit.
    for slot in 0..12 {
        server
            .post_save(&save_event(&format!("c{slot}"), 1, &format!("slot_{slot}")))
            .await;
    }
    let fired = received_at_least(&slack, 2).await;
    let texts: Vec<String> = fired
        .iter()
        .map(|(_, m)| m["text"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        texts[0].starts_with("[inhook] failing firing (app)"),
        "{texts:?}"
    );
    assert!(texts[0].contains("HTTP 500"), "{texts:?}");
    assert!(
        texts[1].starts_with("[inhook] circuit firing (app)"),
        "{texts:?}"
    );
    broken.store(false, Ordering::SeqCst);
    let got = received_at_least(&slack, 4).await;
    let mut resolved: Vec<String> = got[2..]
        .iter()
        .map(|(_, m)| m["text"].as_str().unwrap().to_owned())
        .collect();
    resolved.sort();
    assert!(
        resolved[0].starts_with("[inhook] circuit resolved (app)"),
        "{resolved:?}"
    );
    assert!(
        resolved[1].starts_with("[inhook] failing resolved (app)"),
        "{resolved:?}"
    );
    let listed = listed_at_least(&server, 4).await;
    assert!(listed
        .iter()
        .all(|a| a["destination"] == "app" && a["source"].is_null()));
}

#[tokio::test]
async fn an_unreachable_store_fires_and_resolves_when_it_answers_again() {
    if std::env::var_os("INHOOK_TEST_DATABASE").is_none() {
        // SQLite is a file the node holds open: it does not become unreachable.
        eprintln!("store_unavailable runs on PostgreSQL (INHOOK_TEST_DATABASE)");
        return;
    }
    let slack = Received::default();
    let port = recording_application(&slack).await;
    let server = TestServer::spawn_full_with(
        TICK,
        "",
        &format!(
            r#"
[[alerts]]
name = "store"
on = "store_unavailable"
slack_webhook_url = "http://127.0.0.1:{port}/hooks"
"#
        ),
    )
    .await;
    let database = server.database_name().expect("a PostgreSQL test database");
    // No new connection to the test's own database, and its open ones cut.
    let cut = format!(
        "ALTER DATABASE \"{database}\" ALLOW_CONNECTIONS false;
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}';"
    );
    server.run_admin_sql(&cut).await;
    let fired = received_at_least(&slack, 1).await;
    assert!(fired[0].1["text"]
        .as_str()
        .unwrap()
        .starts_with("[inhook] store firing: the store is unreachable"));
    server
        .run_admin_sql(&format!(
            "ALTER DATABASE \"{database}\" ALLOW_CONNECTIONS true;"
        ))
        .await;
    let got = received_at_least(&slack, 2).await;
    assert!(got[1].1["text"]
        .as_str()
        .unwrap()
        .starts_with("[inhook] store resolved"));
    // The firing notice could not be kept while the store was down; the resolved one is.
    let listed = listed_at_least(&server, 1).await;
    assert_eq!(listed[0]["on"], "store_unavailable");
}

/// A tiny SMTP server: takes every message and records its DATA; answers its port.
async fn smtp_listener(mails: std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((socket, _)) = listener.accept().await else {
                return;
            };
            let mails = std::sync::Arc::clone(&mails);
            tokio::spawn(async move {
                let (read, mut write) = socket.into_split();
                let mut lines = BufReader::new(read).lines();
                write.write_all(b"220 test ESMTP\r\n").await.unwrap();
                let mut data: Option<String> = None;
                while let Ok(Some(line)) = lines.next_line().await {
                    if let Some(text) = data.as_mut() {
                        if line == "." {
                            mails.lock().unwrap().push(data.take().unwrap());
                            write.write_all(b"250 queued\r\n").await.unwrap();
                        } else {
                            text.push_str(&line);
                            text.push('\n');
                        }
                        continue;
                    }
                    let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
                    let answer: &[u8] = match verb.as_str() {
                        "EHLO" | "HELO" => b"250 test\r\n",
                        "DATA" => {
                            data = Some(String::new());
                            b"354 go ahead\r\n"
                        }
                        "QUIT" => {
                            let _ = write.write_all(b"221 bye\r\n").await;
                            return;
                        }
                        _ => b"250 ok\r\n",
                    };
                    write.write_all(answer).await.unwrap();
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn an_email_goes_over_smtp_when_a_source_falls_silent_and_when_it_speaks_again() {
    let mails = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let port = smtp_listener(std::sync::Arc::clone(&mails)).await;
    let server = TestServer::spawn_full_with(
        TICK,
        "",
        &format!(
            r#"
[[alerts]]
name = "quiet"
on = "source_silent"
source = "save-game"
after_s = 1
smtp_url = "smtp://127.0.0.1:{port}"
email_to = ["ops@example.com"]
email_from = "inhook@example.com"
"#
        ),
    )
    .await;
    let got = |n: usize| {
        let mails = std::sync::Arc::clone(&mails);
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                let now: Vec<String> = mails.lock().unwrap().clone();
                if now.len() >= n {
                    return now;
                }
                assert!(Instant::now() < deadline, "{} emails, not {n}", now.len());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let firing = got(1).await;
    assert!(firing[0].contains("To: ops@example.com"), "{}", firing[0]);
    assert!(firing[0].contains("quiet firing"), "{}", firing[0]);
    assert!(firing[0].contains("on: source_silent"), "{}", firing[0]);
    server.post_save(&save_event("m1", 1, "slot_m")).await;
    let both = got(2).await;
    assert!(both[1].contains("quiet resolved"), "{}", both[1]);
    assert!(both[1].contains("state: resolved"), "{}", both[1]);
}

/// A server holding `rules` (whole `[[alerts]]` tables) beside the `ops` destination on
/// `port`; gaps are held for ten minutes, so an event that arrives early stays undecided.
async fn serve_holding(port: u16, top: &str, rules: &str) -> TestServer {
    TestServer::spawn_full_with(
        &format!("{TICK}\n{top}"),
        "hold_timeout_s = 600",
        &format!("{}\n{rules}", ops_destination(port)),
    )
    .await
}

/// A backlog rule and a rule on forged deliveries to save-game, both told to `ops`.
const BACKLOG_AND_FORGED: &str = r#"
[[alerts]]
name = "backlog"
on = "backlog"
over = 0
destination = "ops"

[[alerts]]
name = "forged"
on = "rejections"
rejected = "signature"
source = "save-game"
destination = "ops"
"#;

/// Posts one save-game delivery signed with the wrong secret to `server`: a 401.
pub(crate) async fn post_forged(server: &TestServer) {
    let body = serde_json::to_vec(&save_event("forged", 1, "slot_x")).unwrap();
    let mut forged = inhook::ingress::signature::sign(
        Scheme::HmacTimestamped,
        &body,
        &Secret::new("not-the-secret"),
        now_s(),
    );
    forged.push(("content-type", "application/json".to_owned()));
    let reply = server.post_raw("save-game", &body, &forged).await;
    assert_eq!(reply.code, 401, "{reply:?}");
}

/// `(alert, state)` of each notice `received` got, oldest first.
pub(crate) fn told(got: &[(axum::http::HeaderMap, Value)]) -> Vec<(String, String)> {
    got.iter()
        .map(|(_, b)| {
            (
                b["alert"].as_str().unwrap().to_owned(),
                b["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_restarted_node_does_not_fire_again_an_alert_still_firing_and_resolves_it_once() {
    let received = Received::default();
    let port = recording_application(&received).await;
    let mut server = serve_holding(port, "", BACKLOG_AND_FORGED).await;
    server.post_save(&save_event("r3", 3, "slot_r")).await;
    server.wait_status("save-game", "r3", "held").await;
    let fired = received_at_least(&received, 1).await;
    assert_eq!(told(&fired), [("backlog".into(), "firing".into())]);
    assert!(
        fired[0].1.get("node").is_none(),
        "decided across nodes: no node named"
    );
    // Told, and known to be: a node killed between the receiver's answer and its record
    // sends the notice again (at least once), which is not what this test is about.
    server
        .wait_for("/v1/alerts", |r| {
            r.body["items"][0]["channels"][0]["state"] == "sent"
        })
        .await;
    server.restart();
    // The restarted node's first rejection: its notice is kept after any of the backlog's
    // that node decided in the same tick or before, and the channel sends in that order.
    post_forged(&server).await;
    let got = received_at_least(&received, 2).await;
    assert_eq!(
        told(&got)[1],
        ("forged".into(), "firing".into()),
        "the backlog fired again after the restart: {:?}",
        told(&got)
    );
    let node = got[1].1["node"]
        .as_str()
        .expect("a node's own notice names it");
    assert!(node.starts_with("node-"), "{node}");
    // The gap fills: the backlog resolves once, naming the since of the firing before the restart.
    server.post_save(&save_event("r1", 1, "slot_r")).await;
    server.post_save(&save_event("r2", 2, "slot_r")).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let all = loop {
        let all = received_at_least(&received, 3).await;
        if told(&all).contains(&("backlog".into(), "resolved".into())) {
            break all;
        }
        assert!(Instant::now() < deadline, "no resolve: {:?}", told(&all));
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let backlog: Vec<_> = all
        .iter()
        .filter(|(_, b)| b["alert"] == "backlog")
        .collect();
    assert_eq!(backlog.len(), 2, "{:?}", told(&all));
    assert_eq!(backlog[1].1["state"], "resolved");
    assert_eq!(backlog[1].1["since"], backlog[0].1["since"]);
    // The history lists each notice's channel, sent.
    let listed = server
        .wait_for("/v1/alerts", |r| {
            r.body["items"].as_array().is_some_and(|items| {
                items.len() >= 3 && items.iter().all(|a| a["channels"][0]["state"] == "sent")
            })
        })
        .await;
    for item in listed.body["items"].as_array().unwrap() {
        let channel = &item["channels"][0];
        assert_eq!(channel["channel"], "destination:ops", "{item}");
        assert_eq!(channel["attempts"], 1, "{item}");
        assert!(channel["sent_at"].is_string(), "{item}");
        assert_eq!(
            item["node"].is_string(),
            item["alert"] == "forged",
            "{item}"
        );
    }
    assert_eq!(
        server
            .query_i64("SELECT COUNT(*) FROM alerts_firing WHERE alert = 'backlog'")
            .await,
        0,
        "a resolved alert leaves no firing row"
    );
}

#[tokio::test]
async fn a_notice_pending_when_its_node_is_killed_is_sent_once_the_restarted_node_reaches_its_receiver(
) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    // The receiver answers 503 until it is up; it records what it took.
    let down = Arc::new(AtomicBool::new(true));
    let taken = Received::default();
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post({
            let (down, taken) = (Arc::clone(&down), Arc::clone(&taken));
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                if down.load(Ordering::SeqCst) {
                    return axum::http::StatusCode::SERVICE_UNAVAILABLE;
                }
                taken.lock().unwrap().push((headers, body.to_vec()));
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    let port = crate::application::serve_application(app).await;
    let mut server = serve_holding(
        port,
        "retry_base_s = 1\nretry_max_delay_s = 1\nmax_attempts = 100",
        r#"
[[alerts]]
name = "backlog"
on = "backlog"
over = 0
destination = "ops"
"#,
    )
    .await;
    server.post_save(&save_event("k3", 3, "slot_k")).await;
    // Kept, tried and refused: pending, with the receiver's answer as its error.
    let channel = &newest_channel_tried(&server, 1).await;
    assert_eq!(channel["state"], "pending", "{channel}");
    assert!(
        channel["error"].as_str().unwrap().contains("503"),
        "{channel}"
    );
    assert!(channel["sent_at"].is_null(), "{channel}");
    server.kill9();
    down.store(false, Ordering::SeqCst);
    server.start();
    let got = received_at_least(&taken, 1).await;
    assert_eq!(told(&got), [("backlog".into(), "firing".into())]);
    assert_signed(&taken, 0);
    let sent = server
        .wait_for("/v1/alerts", |r| {
            r.body["items"][0]["channels"][0]["state"] == "sent"
        })
        .await;
    let items = sent.body["items"].as_array().unwrap();
    assert_eq!(
        items.len(),
        1,
        "the restarted node fired nothing again: {items:?}"
    );
    assert!(items[0]["channels"][0]["attempts"].as_i64().unwrap() >= 2);
    assert_eq!(taken.lock().unwrap().len(), 1, "sent once");
}

/// A small SMTP server's session on `stream` (its greeting already written): records the
/// envelope, the login and the DATA of each message in `mails`; offers STARTTLS when
/// `starttls`, and then answers the stream the client upgrades.
async fn smtp_session<S>(stream: S, mails: Mails, starttls: bool) -> Option<S>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut stream = tokio::io::BufReader::new(stream);
    let mut mail = String::new();
    let mut in_data = false;
    loop {
        let mut line = String::new();
        if stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let line = line.trim_end_matches(['\r', '\n']).to_owned();
        if in_data {
            if line == "." {
                in_data = false;
                mails.lock().unwrap().push(std::mem::take(&mut mail));
                stream.write_all(b"250 queued\r\n").await.ok()?;
            } else {
                mail.push_str(&line);
                mail.push('\n');
            }
            continue;
        }
        let verb = line.get(..4).unwrap_or("").to_ascii_uppercase();
        let answer: &[u8] = match verb.as_str() {
            "EHLO" if starttls => b"250-test\r\n250 STARTTLS\r\n",
            "EHLO" | "HELO" => b"250-test\r\n250 AUTH PLAIN LOGIN\r\n",
            "STAR" => {
                stream.write_all(b"220 go ahead\r\n").await.ok()?;
                return Some(stream.into_inner());
            }
            "AUTH" | "MAIL" | "RCPT" => {
                mail.push_str(&line);
                mail.push('\n');
                if verb == "AUTH" {
                    b"235 accepted\r\n"
                } else {
                    b"250 ok\r\n"
                }
            }
            "DATA" => {
                in_data = true;
                b"354 go ahead\r\n"
            }
            "QUIT" => {
                let _ = stream.write_all(b"221 bye\r\n").await;
                return None;
            }
            _ => b"250 ok\r\n",
        };
        stream.write_all(answer).await.ok()?;
    }
}

/// What an SMTP server took: per message, its envelope and login lines then its DATA.
type Mails = std::sync::Arc<std::sync::Mutex<Vec<String>>>;

/// An SMTP server of `ca`'s `localhost` certificate: TLS from the start (`smtps://`), or
/// STARTTLS after a plain greeting; counts the TLS handshakes that failed in `refused`.
fn smtp_over_tls(
    ca: &crate::support::tls::TestCa,
    mails: &Mails,
    starttls: bool,
    refused: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> u16 {
    use std::sync::atomic::Ordering;
    use tokio::io::AsyncWriteExt;
    let (mails, refused) = (std::sync::Arc::clone(mails), std::sync::Arc::clone(refused));
    ca.front(move |mut tcp, acceptor| {
        let (mails, refused) = (
            std::sync::Arc::clone(&mails),
            std::sync::Arc::clone(&refused),
        );
        async move {
            if starttls {
                if tcp.write_all(b"220 test ESMTP\r\n").await.is_err() {
                    return;
                }
                let Some(tcp) = smtp_session(tcp, std::sync::Arc::clone(&mails), true).await else {
                    return;
                };
                match acceptor.accept(tcp).await {
                    // After STARTTLS the client speaks first (EHLO again).
                    Ok(tls) => {
                        smtp_session(tls, mails, false).await;
                    }
                    Err(_) => {
                        refused.fetch_add(1, Ordering::SeqCst);
                    }
                }
                return;
            }
            match acceptor.accept(tcp).await {
                Ok(mut tls) => {
                    if tls.write_all(b"220 test ESMTP\r\n").await.is_ok() {
                        smtp_session(tls, mails, false).await;
                    }
                }
                Err(_) => {
                    refused.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    })
}

/// A server telling `quiet` (save-game silent for a second) by email over `smtp_url`,
/// trusting `ca_file` when given.
async fn serve_quiet_by_email(smtp_url: &str, ca_file: Option<&std::path::Path>) -> TestServer {
    let ca = ca_file
        .map(|path| format!("smtp_tls_ca_file = {:?}", path.to_str().unwrap()))
        .unwrap_or_default();
    TestServer::spawn_full_with(
        &format!("{TICK}\nretry_base_s = 1\nretry_max_delay_s = 1\nmax_attempts = 100"),
        "",
        &format!(
            r#"
[[alerts]]
name = "quiet"
on = "source_silent"
source = "save-game"
after_s = 1
smtp_url = "{smtp_url}"
email_to = ["ops@example.com", "oncall@example.com"]
email_from = "inhook@example.com"
{ca}
"#
        ),
    )
    .await
}

/// The mails `mails` holds once it holds at least `n`.
async fn mails_at_least(mails: &Mails, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now: Vec<String> = mails.lock().unwrap().clone();
        if now.len() >= n {
            return now;
        }
        assert!(Instant::now() < deadline, "{} emails, not {n}", now.len());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Asserts what the firing email of `quiet` says and to whom it went, and that it logged in.
fn assert_quiet_email(mail: &str) {
    assert!(mail.contains("RCPT TO:<ops@example.com>"), "{mail}");
    assert!(mail.contains("RCPT TO:<oncall@example.com>"), "{mail}");
    assert!(mail.contains("MAIL FROM:<inhook@example.com>"), "{mail}");
    assert!(mail.contains("AUTH "), "it logged in: {mail}");
    assert!(
        mail.contains("Subject: [inhook] quiet firing (save-game)"),
        "{mail}"
    );
    assert!(mail.contains("on: source_silent"), "{mail}");
    assert!(mail.contains("source: save-game"), "{mail}");
}

/// The quiet rule's email, sent to an SMTP server on the test CA's certificate: over
/// implicit TLS (`smtps://`) or, with `starttls`, upgraded on a plain connection.
async fn quiet_email_over_tls(starttls: bool) {
    let ca = crate::support::tls::TestCa::new();
    let mails = Mails::default();
    let refused = std::sync::Arc::default();
    let port = smtp_over_tls(&ca, &mails, starttls, &refused);
    let url = if starttls {
        format!("smtp://alerts:s3cret-pw@localhost:{port}?tls=required")
    } else {
        format!("smtps://alerts:s3cret-pw@localhost:{port}")
    };
    let _server = serve_quiet_by_email(&url, Some(&ca.file())).await;
    let got = mails_at_least(&mails, 1).await;
    assert_quiet_email(&got[0]);
}

#[tokio::test]
async fn an_email_goes_over_smtps_to_a_server_of_a_trusted_ca() {
    quiet_email_over_tls(false).await;
}

#[tokio::test]
async fn an_email_goes_over_starttls_to_a_server_of_a_trusted_ca() {
    quiet_email_over_tls(true).await;
}

#[tokio::test]
async fn an_smtps_server_whose_certificate_is_not_trusted_gets_no_mail_and_the_notice_stays_pending(
) {
    use std::sync::atomic::Ordering;
    let ca = crate::support::tls::TestCa::new();
    let mails = Mails::default();
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let port = smtp_over_tls(&ca, &mails, false, &refused);
    // Without smtp_tls_ca_file: the test's CA is no system's.
    let server =
        serve_quiet_by_email(&format!("smtps://alerts:s3cret-pw@localhost:{port}"), None).await;
    let channel = &newest_channel_tried(&server, 2).await;
    assert_eq!(channel["state"], "pending", "{channel}");
    assert!(
        channel["channel"]
            .as_str()
            .unwrap()
            .starts_with("email:ops@example.com,oncall@example.com#"),
        "{channel}"
    );
    let error = channel["error"].as_str().unwrap();
    assert!(
        error.to_ascii_lowercase().contains("certificate"),
        "{error}"
    );
    let listed = server.get("/v1/alerts").await;
    assert!(
        !listed.body.to_string().contains("s3cret-pw"),
        "{}",
        listed.body
    );
    assert!(refused.load(Ordering::SeqCst) >= 2);
    assert!(mails.lock().unwrap().is_empty(), "no mail went");
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(!log.contains("s3cret-pw"), "the password is not logged");
}

/// The metric names `text` uses: every `inhook_…` word, a histogram's series suffixes cut.
fn metric_names(text: &str) -> std::collections::BTreeSet<String> {
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("inhook_") {
        let word: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + word.len()..];
        let base = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| word.strip_suffix(suffix))
            .unwrap_or(&word);
        names.insert(base.to_owned());
    }
    names
}

#[test]
fn the_prometheus_rules_and_the_grafana_dashboard_name_only_metrics_inhook_exports() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let exported = metric_names(
        &std::fs::read_to_string(root.join("crates/core/src/operations/metrics.rs")).unwrap(),
    );
    let documented = metric_names(&std::fs::read_to_string(root.join("docs/api.md")).unwrap());
    assert!(exported.contains("inhook_requests_total") && exported.len() > 15);
    let rules = std::fs::read_to_string(root.join("docs/prometheus/alerts.yml")).unwrap();
    let dashboard = std::fs::read_to_string(root.join("docs/grafana/inhook.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut queries = String::new();
    for panel in panels {
        assert!(panel["title"].is_string(), "{panel}");
        for target in panel["targets"].as_array().expect("targets") {
            queries.push_str(target["expr"].as_str().expect("an expr"));
            queries.push('\n');
        }
    }
    queries.push_str(&dashboard["templating"].to_string());
    for (file, text) in [
        ("alerts.yml", rules.as_str()),
        ("inhook.json", queries.as_str()),
    ] {
        let used = metric_names(text);
        assert!(used.len() >= 8, "{file} uses {used:?}");
        for name in &used {
            assert!(
                exported.contains(name),
                "{file}: {name} is not a metric of crates/core/src/operations/metrics.rs"
            );
            assert!(
                documented.contains(name),
                "{file}: {name} is not in docs/api.md"
            );
        }
    }
    // Each rule has a name, an expression and a summary (promtool checks the rest in CI).
    let alerts = rules.matches("- alert: ").count();
    assert!(alerts >= 8);
    assert_eq!(rules.matches("expr:").count(), alerts);
    assert_eq!(rules.matches("summary:").count(), alerts);
}

#[tokio::test]
async fn notices_older_than_retention_s_are_purged_with_the_events() {
    let received = Received::default();
    let port = recording_application(&received).await;
    let server = serve_quiet_save_game(
        &format!("{TICK}\nretention_s = 1\npurge_interval_s = 1"),
        port,
    )
    .await;
    let kept = listed_at_least(&server, 1).await;
    assert_eq!(kept[0]["alert"], "quiet");
    // Past retention_s, the next purge deletes it: the history empties.
    server
        .wait_for("/v1/alerts", |r| r.body["items"] == json!([]))
        .await;
    assert!(
        !received.lock().unwrap().is_empty(),
        "the notice was sent before"
    );
}
