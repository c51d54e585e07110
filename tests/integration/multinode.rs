//! Three inhook nodes on one PostgreSQL database, each on its own port,
//! behind a round-robin "balancer": a chaotic stream sent across all three,
//! one node SIGKILLed mid-stream. Nothing answered 2xx is lost, nothing is
//! applied twice, and the state is the in-order result.

use std::sync::Arc;
use std::time::{Duration, Instant};

use inhook::tools::simulate::{expected_states, Endpoint};

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
