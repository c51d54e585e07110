//! Three inhook nodes on one PostgreSQL database, each on its own port,
//! behind a round-robin "balancer": a chaotic stream sent across all three,
//! one node SIGKILLed mid-stream. Nothing answered 2xx is lost, nothing is
//! applied twice, and the state is the in-order result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inhook_tools::simulate::{expected_states, Endpoint};

use crate::alerts::{ops_destination, post_forged, received_at_least, save_event, told, TICK};
use crate::application::{recording_application, Received};
use crate::crash::{chaos_publisher, chaos_stream, Audit};
use crate::support::{Backend, TestServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_one_database_one_killed_converge() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let first = TestServer::spawn().await;
    let mut second = TestServer::join(&first).await;
    let third = TestServer::join(&first).await;
    let (stream, plan) = chaos_stream(0x3_0de);
    let endpoint = Endpoint::many(&[&first.url, &second.url, &third.url]);
    let publisher = chaos_publisher(endpoint.clone(), 12, 600);
    let started = Instant::now();
    let sending = tokio::spawn({
        let (publisher, plan) = (publisher.clone(), plan.clone());
        async move { publisher.deliver(plan).await }
    });
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !sending.is_finished(),
        "the stream ended before the kill: send slower"
    );
    let killed_after = publisher.answered().len();
    tokio::task::block_in_place(|| second.kill9());
    // The balancer notices; requests already sent to the dead node are retried on the others.
    endpoint.remove(&second.url);
    let report = sending.await.expect("publisher task");
    assert!(
        report.failures.is_empty(),
        "deliveries failed: {:?}",
        &report.failures[..report.failures.len().min(5)]
    );
    let mismatches = publisher
        .converge(Arc::new(expected_states(&stream)), Duration::from_secs(60))
        .await
        .expect("read API");
    let rows = first.logged().await;
    let audit = Audit::of(&rows, &stream, &plan, &report);
    println!(
        "multi-node: 3 nodes, 1 killed after {killed_after} answers; {} events, {} deliveries, \
         {} requests, answers {:?}; {} answered 2xx, {} lost, {} logged twice, {} rows, \
         statuses {:?}, {} mismatches, {:.1}s",
        stream.event_count(),
        plan.deliveries.len(),
        report.tally.requests,
        report.tally.codes,
        audit.answered,
        audit.lost.len(),
        audit.twice,
        rows.len(),
        audit.statuses,
        mismatches.len(),
        started.elapsed().as_secs_f64(),
    );
    for m in mismatches.iter().take(5) {
        println!("  {}: expected {}, got {}", m.aggregate, m.expected, m.got);
    }
    audit.assert_clean(rows.len(), stream.event_count(), mismatches.len());
    drop(third);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_tell_a_dead_event_once_and_its_resolve_once() {
    if Backend::fresh_kind() != "postgres" {
        eprintln!("several nodes share one database only on PostgreSQL: set INHOOK_TEST_DATABASE");
        return;
    }
    let received = Received::default();
    let port = recording_application(&received).await;
    let first = TestServer::spawn_full_with(
        TICK,
        "hold_timeout_s = 1",
        &format!(
            r#"{}
[[alerts]]
name = "dead-saves"
on = "dead"
source = "save-game"
destination = "ops"

[[alerts]]
name = "forged"
on = "rejections"
rejected = "signature"
source = "save-game"
destination = "ops"
"#,
            ops_destination(port)
        ),
    )
    .await;
    let second = TestServer::join(&first).await;
    let third = TestServer::join(&first).await;
    // 3 waits for 2, the gap is skipped after a second, and 2 arrives too late: dead.
    first.post_save(&save_event("d1", 1, "slot_d")).await;
    first.post_save(&save_event("d3", 3, "slot_d")).await;
    first.wait_status("save-game", "d3", "processed").await;
    first.post_save(&save_event("d2", 2, "slot_d")).await;
    first.wait_status("save-game", "d2", "dead").await;
    let fired = received_at_least(&received, 1).await;
    assert_eq!(told(&fired)[0], ("dead-saves".into(), "firing".into()));
    let forgotten = second
        .delete("/v1/sources/save-game/aggregates/player_1024/slot_d")
        .await;
    assert_eq!(forgotten.code, 200, "{forgotten:?}");
    let got = received_at_least(&received, 2).await;
    assert_eq!(told(&got)[1], ("dead-saves".into(), "resolved".into()));
    // Each node's own rejection: once all three are kept, every node has evaluated the
    // dead rule (before its rejections, in the same tick) after the resolve.
    for node in [&first, &second, &third] {
        post_forged(node).await;
    }
    let all = received_at_least(&received, 5).await;
    let listed = first
        .wait_for("/v1/alerts", |r| {
            r.body["items"].as_array().is_some_and(|items| {
                items.len() >= 5 && items.iter().all(|a| a["channels"][0]["state"] == "sent")
            })
        })
        .await;
    let items = listed.body["items"].as_array().unwrap();
    let dead: Vec<_> = items
        .iter()
        .filter(|a| a["alert"] == "dead-saves")
        .map(|a| a["state"].as_str().unwrap())
        .collect();
    assert_eq!(dead, ["resolved", "firing"], "{items:?}");
    let nodes: std::collections::BTreeSet<_> = items
        .iter()
        .filter(|a| a["alert"] == "forged")
        .map(|a| a["node"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        nodes.len(),
        3,
        "each node tells its own rejections: {items:?}"
    );
    let all = received_at_least(&received, all.len()).await;
    let told = told(&all);
    assert_eq!(
        told.iter().filter(|(a, _)| a == "dead-saves").count(),
        2,
        "one firing and one resolved notice at the receiver: {told:?}"
    );
    assert_eq!(told.len(), 5, "{told:?}");
    let ids: std::collections::BTreeSet<_> = all
        .iter()
        .map(|(h, _)| h["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 5, "no notice sent twice");
    assert_eq!(all[1].1["since"], all[0].1["since"]);
}
