//! Issue #13 item 7: held events cost, the per-aggregate hold cap, a hard `max_backlog`,
//! and out-of-order counting by order of receipt.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use inhook::domain::kind::save::SaveEvent;
use inhook::domain::kind::SourceKind;
use inhook::domain::{AggregateKey, EventStatus};
use inhook::store::{Admission, EventFilter, IngestLimits, NewEvent, SettleAt, SourceRules};
use serde_json::{json, Value};

use crate::support::{Reply, TestServer};

fn delta(player: &str, seq: i64) -> Value {
    json!({"event_id": format!("{player}_{seq}"), "event_type": "inventory.updated",
           "player_id": player, "save_slot": "a", "sequence": seq,
           "idempotency_key": format!("{player}_{seq}"),
           "data": {"added_items": [{"item_id": "gem", "qty": 1}]}})
}

async fn send(server: &TestServer, body: Value) -> Reply {
    server.post_save(&body).await
}

/// Events with `status`, read from the store.
async fn with_status(server: &TestServer, status: EventStatus) -> usize {
    let filter = EventFilter {
        status: Some(status),
        ..EventFilter::default()
    };
    server
        .store()
        .await
        .events(&filter, 1_000_000, None)
        .await
        .expect("list events")
        .items
        .len()
}

async fn wait_count(server: &TestServer, status: EventStatus, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = with_status(server, status).await;
        if now == n {
            return;
        }
        assert!(Instant::now() < deadline, "{now} {status:?}, wanted {n}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The value of the sample of `name` for `source` (0 when absent).
async fn counter(server: &TestServer, name: &str, source: &str) -> f64 {
    let text = server.get_text("/metrics").await;
    let label = format!("source=\"{source}\"");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&label))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse().ok())
        .next()
        .unwrap_or(0.0)
}

#[tokio::test]
async fn three_hundred_held_events_apply_in_order_once_the_gap_fills() {
    let server = TestServer::in_process()
        .spawn_with("hold_timeout_s = 600")
        .await;
    for chunk in (2..=301).collect::<Vec<i64>>().chunks(50) {
        let replies = join_all(chunk.iter().map(|seq| send(&server, delta("many", *seq)))).await;
        assert!(replies.iter().all(|r| r.code == 202), "{replies:?}");
    }
    wait_count(&server, EventStatus::Held, 300).await;
    // A far arrival leaves every held event waiting.
    assert_eq!(server.post_save(&delta("many", 400)).await.code, 202);
    wait_count(&server, EventStatus::Held, 301).await;
    assert_eq!(server.post_save(&delta("many", 1)).await.code, 202);
    let save = server
        .wait_for("/v1/saves/many/a", |r| {
            r.code == 200 && r.body["last_sequence"] == 301
        })
        .await;
    assert_eq!(save.body["inventory"]["gem"], 301, "{}", save.body);
    assert_eq!(with_status(&server, EventStatus::Processed).await, 301);
    assert_eq!(
        with_status(&server, EventStatus::Held).await,
        1,
        "400 still waits"
    );
}

#[tokio::test]
async fn an_aggregate_over_max_held_per_aggregate_gets_429_and_others_do_not() {
    let server = TestServer::in_process()
        .spawn_with("hold_timeout_s = 600\nmax_held_per_aggregate = 5")
        .await;
    // Concurrent deliveries ahead of a gap: the store decides each in its transaction.
    let replies: Vec<Reply> =
        join_all((2..=41).map(|seq| send(&server, delta("capped", seq)))).await;
    let accepted = replies.iter().filter(|r| r.code == 202).count();
    assert_eq!(accepted, 5, "{replies:?}");
    for refused in replies.iter().filter(|r| r.code != 202) {
        assert_eq!(refused.code, 429);
        assert_eq!(refused.body["status"], "rejected");
        assert_eq!(refused.body["error"], "aggregate_backlog_full");
        assert!(refused.retry_after.is_some());
    }
    assert_eq!(server.count().await, 5, "nothing stored for a refusal");
    // Another aggregate is not limited by this one.
    assert_eq!(server.post_save(&delta("other", 2)).await.code, 202);
    // The gap-filler is never held, so it is always let in, and drains the aggregate.
    assert_eq!(server.post_save(&delta("capped", 1)).await.code, 202);
    let refused_seq = (2..=41)
        .zip(&replies)
        .find(|(_, r)| r.code == 429)
        .map(|(seq, _)| seq)
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let reply = server.post_save(&delta("capped", refused_seq)).await;
        if reply.code == 202 {
            break;
        }
        assert_eq!(reply.body["error"], "aggregate_backlog_full");
        assert!(
            Instant::now() < deadline,
            "never accepted after the gap filled"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn max_backlog_holds_under_400_concurrent_sends() {
    // 400 connections from one client: above the default per-peer connection cap.
    let server = TestServer::in_process()
        .spawn_configured(
            "max_connections_per_peer = 1024",
            "hold_timeout_s = 600\nmax_backlog = 50",
        )
        .await;
    // Each on its own aggregate, each ahead of a gap: no worker can decide any of them.
    let replies: Vec<Reply> =
        join_all((0..400).map(|i| send(&server, delta(&format!("p{i}"), 2)))).await;
    let accepted = replies.iter().filter(|r| r.code == 202).count();
    // A loaded machine may answer a few 503s (nothing stored); every other refusal is 429.
    let transient = replies.iter().filter(|r| r.code == 503).count();
    assert!(accepted <= 50, "{accepted} accepted over max_backlog = 50");
    assert!(accepted + transient >= 50, "only {accepted} accepted");
    for refused in replies.iter().filter(|r| r.code != 202 && r.code != 503) {
        assert_eq!(refused.code, 429, "{refused:?}");
        assert_eq!(refused.body["error"], "backlog_full");
    }
    assert_eq!(server.count().await, accepted);
    for i in accepted..50 {
        let reply = send(&server, delta(&format!("q{i}"), 2)).await;
        assert_eq!(reply.code, 202, "{reply:?}");
    }
    assert_eq!(server.count().await, 50);
    wait_count(&server, EventStatus::Held, 50).await;
    assert_eq!(server.post_save(&delta("late", 2)).await.code, 429);
}

#[tokio::test]
async fn out_of_order_counts_by_order_of_receipt() {
    let server = TestServer::spawn().await;
    for round in 1..=5 {
        let player = format!("ooo{round}");
        assert_eq!(server.post_save(&delta(&player, 2)).await.code, 202);
        assert_eq!(server.post_save(&delta(&player, 1)).await.code, 202);
        let counted = counter(&server, "inhook_out_of_order_total", "save-game").await;
        assert_eq!(counted, f64::from(round), "round {round}");
        server
            .wait_for(&format!("/v1/saves/{player}/a"), |r| {
                r.code == 200 && r.body["last_sequence"] == 2
            })
            .await;
        // Settling both at once or one by one counts nothing more.
        let counted = counter(&server, "inhook_out_of_order_total", "save-game").await;
        assert_eq!(counted, f64::from(round), "round {round} after settling");
    }
    // In order: nothing counted; a resent duplicate neither.
    assert_eq!(server.post_save(&delta("inorder", 1)).await.code, 202);
    assert_eq!(server.post_save(&delta("inorder", 2)).await.code, 202);
    assert_eq!(server.post_save(&delta("ooo1", 1)).await.code, 200);
    let counted = counter(&server, "inhook_out_of_order_total", "save-game").await;
    assert_eq!(counted, 5.0);
}

#[tokio::test]
async fn migration_3_upgrades_a_store_in_place() {
    let mut server = TestServer::spawn_with("hold_timeout_s = 600\nmax_backlog = 3").await;
    for seq in [5, 6] {
        assert_eq!(server.post_save(&delta("up", seq)).await.code, 202);
    }
    wait_count(&server, EventStatus::Held, 2).await;
    assert!(server.terminate());
    // Back to the schema of version 2, with the events logged under it (later versions
    // rerun after it).
    let (undo_sqlite, undo_postgres) = crate::support::UNDO_MIGRATION_5;
    server
        .run_sql(
            &format!(
                "{undo_sqlite}
                 DROP TABLE aggregate_seen; DROP INDEX events_held; DROP INDEX events_aggregate;
                 CREATE INDEX events_aggregate ON events (source, aggregate, sequence);
                 DELETE FROM schema_migrations WHERE version >= 3;"
            ),
            &format!(
                "{undo_postgres}
                 DROP TABLE aggregate_seen; DROP INDEX events_held;
                 DROP TRIGGER backlog_counts_insert ON events;
                 DROP TRIGGER backlog_counts_update ON events;
                 DROP TRIGGER backlog_counts_delete ON events;
                 DROP FUNCTION backlog_counts_apply(); DROP TABLE backlog_counts;
                 DELETE FROM schema_migrations WHERE version >= 3;"
            ),
        )
        .await;
    server.restart();
    // The highest received sequence (6) and the backlog (2) were carried over.
    assert_eq!(server.post_save(&delta("up", 4)).await.code, 202);
    let counted = counter(&server, "inhook_out_of_order_total", "save-game").await;
    assert_eq!(counted, 1.0);
    let refused = server.post_save(&delta("more", 2)).await;
    assert_eq!(refused.code, 429, "{refused:?}");
    assert_eq!(refused.body["error"], "backlog_full");
    wait_count(&server, EventStatus::Held, 3).await;
}

/// Version 23 moves PostgreSQL's count of a delivery's insert from the source's counter
/// row to the connection's shard: a store upgraded with events waiting, counted on the row
/// as version 22 counted them, keeps its backlog exact, and `max_backlog` refuses at it.
#[tokio::test]
async fn migration_23_keeps_the_backlog_of_a_store_upgraded_with_events_waiting() {
    let mut server = TestServer::spawn_with("hold_timeout_s = 600\nmax_backlog = 3").await;
    for seq in [5, 6] {
        assert_eq!(server.post_save(&delta("up", seq)).await.code, 202);
    }
    wait_count(&server, EventStatus::Held, 2).await;
    assert!(server.terminate());
    // Back to version 22: its inserts counted on the counter row, not in the shards.
    server
        .run_sql(
            "DELETE FROM schema_migrations WHERE version >= 23;",
            "UPDATE backlog_counts c SET n = c.n + COALESCE(
                 (SELECT SUM(d.n) FROM backlog_decrements d WHERE d.source = c.source), 0);
             DELETE FROM backlog_decrements;
             DELETE FROM schema_migrations WHERE version >= 23;",
        )
        .await;
    server.restart();
    assert_eq!(
        server.post_save(&delta("up", 7)).await.code,
        202,
        "the third fits"
    );
    let refused = server.post_save(&delta("more", 2)).await;
    assert_eq!(refused.code, 429, "{refused:?}");
    assert_eq!(refused.body["error"], "backlog_full");
    wait_count(&server, EventStatus::Held, 3).await;
}

/// CPU seconds this process has used (user + system), from /proc.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let after_name = &stat[stat.rfind(')').expect("stat format") + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// Prints the CPU and wall time of 100 arrivals (each logged and settled, as a worker
/// would) on an aggregate with 100 and with 600 held events of 20 KB each. A report,
/// not an assertion: run with `--ignored --nocapture`.
#[tokio::test]
#[ignore]
async fn report_the_cost_of_arrivals_with_many_held_events() {
    let mut server = TestServer::spawn().await;
    let store = server.store().await;
    server.terminate();
    let rules = SourceRules {
        name: "save-game".into(),
        kind: inhook::domain::kind::built_in(SourceKind::SaveGame, 900_000),
        first_sequence: 1,
        hold_timeout_ms: 3_600_000,
        destinations: std::sync::Arc::from([]),
    };
    let pad = "x".repeat(20_000);
    let arrive = |player: String, seq: i64| {
        let store = store.clone();
        let rules = rules.clone();
        let mut body = delta(&player, seq);
        body["note"] = json!(pad);
        async move {
            let body = serde_json::to_vec(&body).unwrap();
            let event = SaveEvent::parse(&body).unwrap();
            let now = inhook::domain::clock::now_ms();
            let new = NewEvent {
                source: "save-game",
                event: &event.fields(),
                body: &body,
                received_at_ms: now,
                signed_at: None,
                headers: &[],
                limits: IngestLimits::NONE,
                ignored: false,
                body_key: inhook::store::BodyKey::None,
                search_fields: &[],
            };
            let logged = store.ingest(new, SettleAt::Worker).await.unwrap();
            assert!(matches!(logged, Admission::Logged { .. }));
            let key = event.aggregate().storage_key();
            store.settle(&rules, &key, now).await.unwrap()
        }
    };
    for held in [100, 600] {
        let player = format!("cost{held}");
        for seq in 2..=held + 1 {
            arrive(player.clone(), seq).await;
        }
        let (cpu, wall) = (cpu_seconds(), Instant::now());
        for seq in held + 2..held + 102 {
            let report = arrive(player.clone(), seq).await;
            assert_eq!(report.newly_held, 1);
        }
        println!(
            "{held} held: 100 arrivals took {:.2} s CPU, {:.2} s wall",
            cpu_seconds() - cpu,
            wall.elapsed().as_secs_f64()
        );
        let key = AggregateKey::of_parts(vec![
            inhook::domain::Ident::parse(&player).unwrap(),
            inhook::domain::Ident::parse("a").unwrap(),
        ]);
        let stored = crate::conformance::save_of(&*store, "save-game", &key).await;
        assert!(stored.unwrap().is_none());
    }
}
