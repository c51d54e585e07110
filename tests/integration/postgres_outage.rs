//! PostgreSQL stopped in the middle of a stream: ingress answers 503 with
//! `Retry-After` and `/readyz` fails while it is down; when it is back the
//! publisher's retries succeed and the state is exactly the in-order result.
//!
//! It stops the machine's PostgreSQL server, so it runs only when
//! `INHOOK_TEST_PG_OUTAGE=1` (with `INHOOK_TEST_DATABASE` set), alone:
//! `.ci/run` runs it as a step of its own after the parallel suite.

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{Backend, TestServer};

const PLAYERS: usize = 8;
const EVENTS_PER_PLAYER: i64 = 40;

fn pg_ctl(action: &str) {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql")
        .next()
        .expect("a cluster")
        .expect("entry")
        .file_name();
    let status = Command::new("pg_ctlcluster")
        .args([
            "--skip-systemctl-redirect",
            version.to_str().unwrap(),
            "main",
            action,
            "-m",
            "fast",
        ])
        .status()
        .expect("pg_ctlcluster");
    assert!(status.success(), "pg_ctlcluster {action} failed");
}

/// Starts PostgreSQL again even if the test panics half-way.
struct RestartOnDrop;

impl Drop for RestartOnDrop {
    fn drop(&mut self) {
        let _ = Command::new("sh")
            .arg("-c")
            .arg("pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start >/dev/null 2>&1")
            .status();
    }
}

#[tokio::test]
async fn a_stream_through_a_postgres_outage_loses_nothing() {
    if std::env::var_os("INHOOK_TEST_PG_OUTAGE").is_none() {
        eprintln!("outage test runs only with INHOOK_TEST_PG_OUTAGE=1 (it stops PostgreSQL)");
        return;
    }
    let server = Arc::new(TestServer::spawn().await);
    assert!(
        matches!(Backend::fresh_kind(), "postgres"),
        "INHOOK_TEST_PG_OUTAGE needs INHOOK_TEST_DATABASE"
    );
    let unavailable = Arc::new(AtomicU32::new(0));
    let with_retry_after = Arc::new(AtomicU32::new(0));
    let mut publishers = Vec::new();
    for player in 0..PLAYERS {
        let (server, unavailable, with_retry_after) = (
            Arc::clone(&server),
            Arc::clone(&unavailable),
            Arc::clone(&with_retry_after),
        );
        publishers.push(tokio::spawn(async move {
            for seq in 1..=EVENTS_PER_PLAYER {
                let body = json!({"event_id": format!("o{player}_{seq}"), "event_type": "inventory.updated",
                    "player_id": format!("outage{player}"), "save_slot": "a", "sequence": seq,
                    "idempotency_key": format!("o{player}_{seq}"),
                    "data": {"added_items": [{"item_id": "gem", "qty": 1}]}});
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let reply = server.post_save(&body).await;
                    if (200..300).contains(&reply.code) {
                        break;
                    }
                    assert_eq!(reply.code, 503, "only 503 while the store is down: {reply:?}");
                    unavailable.fetch_add(1, Ordering::SeqCst);
                    if reply.retry_after.is_some() {
                        with_retry_after.fetch_add(1, Ordering::SeqCst);
                    }
                    assert!(Instant::now() < deadline, "never accepted after the outage");
                    // A real publisher waits Retry-After; the test caps it to stay quick.
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    // The stream is flowing (events logged) before the store goes away.
    crate::support::eventually("events logged before the outage", || async {
        server.count().await > 0
    })
    .await;
    let _restart = RestartOnDrop;
    pg_ctl("stop");
    server.wait_for("/readyz", |r| r.code == 503).await;
    // The outage's length, not a wait for a condition: publishers meet 503s meanwhile.
    tokio::time::sleep(Duration::from_secs(2)).await;
    pg_ctl("start");
    for publisher in publishers {
        publisher.await.expect("publisher");
    }
    server.wait_for("/readyz", |r| r.code == 200).await;
    for player in 0..PLAYERS {
        let save = server
            .wait_for(&format!("/v1/saves/outage{player}/a"), |r| {
                r.code == 200 && r.body["last_sequence"] == EVENTS_PER_PLAYER
            })
            .await;
        assert_eq!(
            save.body["inventory"],
            json!({"gem": EVENTS_PER_PLAYER}),
            "player {player}"
        );
    }
    let logged = server.logged().await;
    assert_eq!(
        logged.len(),
        PLAYERS * EVENTS_PER_PLAYER as usize,
        "every event once"
    );
    assert!(logged.iter().all(|e| e.status.as_str() == "processed"));
    let refused = unavailable.load(Ordering::SeqCst);
    assert!(refused > 0, "the outage was seen by the publishers");
    assert_eq!(
        with_retry_after.load(Ordering::SeqCst),
        refused,
        "every 503 carries Retry-After"
    );
    println!(
        "outage: {} events, {refused} answers 503 during the outage, 0 lost, state converged",
        logged.len()
    );
}
