//! PostgreSQL's planner statistics follow the event log as it grows, so that the cached
//! statements are planned again against the table as it is (docs/benchmarks.md, issue #45):
//! planned once against a few rows, a settle's update scanned the whole log for good.
//! The test server's PostgreSQL runs with autovacuum off, as this machine's does, so only
//! inhook's own analyze can refresh them.

use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{Backend, TestServer};

/// Save-game deltas for `players` slots, `per_player` each, in order.
fn deltas(players: usize, per_player: i64) -> Vec<serde_json::Value> {
    (1..=per_player)
        .flat_map(|seq| {
            (0..players).map(move |p| {
                json!({"event_id": format!("evt_{p}_{seq}"), "event_type": "inventory.updated",
                       "payload_version": 1, "occurred_at": "2026-06-28T10:15:21Z",
                       "player_id": format!("player_{p}"), "save_slot": "slot_a",
                       "sequence": seq, "idempotency_key": format!("delta:{p}:{seq}"),
                       "data": {"added_items": [{"item_id": "gem", "qty": 1}]}})
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grown_event_log_is_analyzed_and_every_event_still_decided() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("the planner's statistics are PostgreSQL's: set INHOOK_TEST_DATABASE");
        return;
    }
    let server = TestServer::in_process().spawn().await;
    let analyzed = "SELECT COUNT(*) FROM pg_stat_user_tables
                    WHERE relname = 'events' AND last_analyze IS NOT NULL";
    assert_eq!(server.query_i64(analyzed).await, 0, "a fresh log");
    let events = deltas(60, 25);
    for chunk in events.chunks(32) {
        let replies =
            futures_util::future::join_all(chunk.iter().map(|e| server.post_save(e))).await;
        assert!(
            replies.iter().all(|r| r.code == 202),
            "every delta accepted"
        );
    }
    // 1,500 rows written is more than the 1,000 below which no table is analyzed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.query_i64(analyzed).await == 0 {
        assert!(
            Instant::now() < deadline,
            "the event log was not analyzed after 1,500 rows"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Plans made again after the analyze still decide every event, in order.
    for player in [0, 59] {
        let path = format!("/v1/saves/player_{player}/slot_a");
        let state = server
            .wait_for(&path, |r| r.code == 200 && r.body["last_sequence"] == 25)
            .await;
        assert_eq!(state.body["inventory"]["gem"], 25, "{}", state.body);
    }
    let undecided = "SELECT COUNT(*) FROM events WHERE status <> 'processed'";
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.query_i64(undecided).await > 0 {
        assert!(Instant::now() < deadline, "events left undecided");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
