//! `kind = "json"` over HTTP under shuffled streams with redeliveries and ties
//! (docs/contract.md, json sources; G5): a fixed set of seeded permutations, each posted to
//! latest-wins sources (sync and async) and an in-order one; the aggregates API, the event
//! log, every sync answer and the tie counter are checked against the stream.
//! A failure names its seed.

use std::collections::BTreeSet;

use inhook::ingress::signature::Scheme;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::json_sources::metric as counter;
use crate::support::{now_s, signed, TestServer};

const SECRET: &str = "json-permutation-secret";

const SOURCES: &str = r#"
[[sources]]
name = "lw-sync"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["json-permutation-secret"]
event_id = "/id"
aggregate = ["/data/object/object", "/data/object/id"]
sequence = "/created"
event_type = "/type"
ordering = "latest-wins"
state = "/data/object"

[[sources]]
name = "lw-async"
kind = "json"
mode = "async"
signature = "hmac-hex"
secrets = ["json-permutation-secret"]
event_id = "/id"
aggregate = ["/data/object/object", "/data/object/id"]
sequence = "/created"
event_type = "/type"
ordering = "latest-wins"
state = "/data/object"

[[sources]]
name = "io-sync"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["json-permutation-secret"]
event_id = "/id"
aggregate = "/account"
sequence = "/seq"
ordering = "in-order"
hold_timeout_s = 300
"#;

/// How many seeded permutations each test posts.
const SEEDS: std::ops::Range<u64> = 1..7;

/// A shuffled stream: each distinct event's sequence, and the order its deliveries
/// arrive in (every event once, some of them again).
struct Shuffled {
    sequences: Vec<i64>,
    arrivals: Vec<usize>,
}

impl Shuffled {
    fn new(seed: u64, sequences: Vec<i64>, redeliveries: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let n = sequences.len();
        let mut arrivals: Vec<usize> = (0..n).collect();
        arrivals.extend((0..redeliveries).map(|_| rng.gen_range(0..n)));
        arrivals.shuffle(&mut rng);
        Self {
            sequences,
            arrivals,
        }
    }

    /// Latest-wins sequences from a small range, so that ties are common.
    fn with_ties(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
        let sequences = (0..8).map(|_| rng.gen_range(1..=4)).collect();
        Self::new(seed, sequences, 4)
    }

    /// Each delivery with whether it is the event's first.
    fn deliveries(&self) -> Vec<(usize, bool)> {
        let mut seen = BTreeSet::new();
        self.arrivals
            .iter()
            .map(|e| (*e, seen.insert(*e)))
            .collect()
    }
}

async fn post(server: &TestServer, source: &str, body: &Value) -> Value {
    let raw = serde_json::to_vec(body).unwrap();
    let headers = signed(Scheme::HmacHex, SECRET, &raw, now_s());
    let reply = server.post_raw(source, &raw, &headers).await;
    assert!(matches!(reply.code, 200 | 202), "{source}: {reply:?}");
    reply.body
}

/// The logged statuses of the events whose ids start with `prefix` in `source`, by
/// event id, each event listed as often as it is logged.
async fn logged(server: &TestServer, source: &str, prefix: &str) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = server
        .logged()
        .await
        .into_iter()
        .filter(|e| e.source == source && e.event_id.starts_with(prefix))
        .map(|e| (e.event_id, e.status.as_str().to_owned()))
        .collect();
    rows.sort();
    rows
}

/// A Stripe-shaped customer event of permutation `seed`.
fn customer(seed: u64, event: usize, created: i64) -> Value {
    json!({"id": format!("p{seed}_e{event}"), "type": "customer.updated", "created": created,
           "data": {"object": {"object": "customer", "id": format!("cus_p{seed}"),
                               "name": format!("name of e{event}")}}})
}

#[tokio::test]
async fn shuffled_latest_wins_streams_end_at_the_last_received_of_the_highest_sequence() {
    let server = TestServer::spawn_with_sources(SOURCES).await;
    let (mut ties, mut async_ties_at_least, mut redelivered) = (0.0, 0.0, 0.0);
    for seed in SEEDS {
        let stream = Shuffled::with_ties(seed);
        let prefix = format!("p{seed}_");
        // What a sync source answers, one delivery at a time.
        let mut current: Option<i64> = None;
        let mut expected_log = Vec::new();
        for (event, first) in stream.deliveries() {
            let sequence = stream.sequences[event];
            let body = customer(seed, event, sequence);
            let answer = post(&server, "lw-sync", &body).await;
            post(&server, "lw-async", &body).await;
            let expected = match current {
                _ if !first => "duplicate",
                Some(c) if sequence < c => "stale",
                Some(c) => {
                    ties += f64::from(u8::from(sequence == c));
                    "applied"
                }
                None => "applied",
            };
            assert_eq!(
                answer["status"], expected,
                "seed {seed}, e{event}: {answer}"
            );
            match expected {
                "applied" => current = Some(sequence),
                "duplicate" => redelivered += 1.0,
                _ => {}
            }
            if first {
                let status = if expected == "applied" {
                    "processed"
                } else {
                    "ignored_stale"
                };
                expected_log.push((format!("p{seed}_e{event}"), status.to_owned()));
            }
        }
        let highest = *stream.sequences.iter().max().unwrap();
        let winner = stream
            .deliveries()
            .into_iter()
            .rev()
            .find(|(e, first)| *first && stream.sequences[*e] == highest)
            .unwrap()
            .0;
        async_ties_at_least +=
            (stream.sequences.iter().filter(|s| **s == highest).count() - 1) as f64;
        expected_log.sort();
        assert_eq!(
            logged(&server, "lw-sync", &prefix).await,
            expected_log,
            "seed {seed}"
        );

        for source in ["lw-sync", "lw-async"] {
            let path = format!("/v1/sources/{source}/aggregates/customer/cus_p{seed}");
            let state = server
                .wait_for(&path, |r| {
                    r.body["event_id"] == format!("p{seed}_e{winner}")
                })
                .await;
            assert_eq!(state.body["sequence"], highest, "seed {seed}, {source}");
            assert_eq!(state.body["aggregate"], format!("customer/cus_p{seed}"));
            assert_eq!(state.body["state"]["name"], format!("name of e{winner}"));
        }
        // The async log: each event once, every one decided, the winner applied.
        let async_log = loop {
            let log = logged(&server, "lw-async", &prefix).await;
            if log.iter().all(|(_, status)| status != "received") {
                break log;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        };
        let ids: Vec<&String> = async_log.iter().map(|(id, _)| id).collect();
        let expected_ids: Vec<&String> = expected_log.iter().map(|(id, _)| id).collect();
        assert_eq!(ids, expected_ids, "seed {seed}: each event logged once");
        for (id, status) in &async_log {
            let applied_or_stale = status == "processed" || status == "ignored_stale";
            assert!(applied_or_stale, "seed {seed}: {id} {status}");
        }
        let winner_id = format!("p{seed}_e{winner}");
        assert!(
            async_log.contains(&(winner_id, "processed".into())),
            "seed {seed}"
        );
    }
    assert!(ties > 0.0, "the seeds produce ties");
    assert_eq!(
        counter(&server, "inhook_sequence_ties_total", "lw-sync").await,
        ties
    );
    // A worker records its metrics just after its commit: the last states may be a moment ahead.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let async_ties = counter(&server, "inhook_sequence_ties_total", "lw-async").await;
        if async_ties >= async_ties_at_least {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{async_ties} < {async_ties_at_least}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    for source in ["lw-sync", "lw-async"] {
        let duplicates = counter(&server, "inhook_duplicates_total", source).await;
        assert_eq!(duplicates, redelivered, "{source}");
    }
}

#[tokio::test]
async fn shuffled_in_order_streams_apply_every_event_once() {
    let server = TestServer::spawn_with_sources(SOURCES).await;
    for seed in SEEDS {
        let stream = Shuffled::new(seed, (1..=7).collect(), 3);
        let account = format!("acct_{seed}");
        // A sync in-order source applies what fills the next sequence (and the held
        // run behind it) and holds the rest.
        let (mut watermark, mut held) = (0, BTreeSet::new());
        for (event, first) in stream.deliveries() {
            let sequence = stream.sequences[event];
            let body = json!({"id": format!("p{seed}_e{event}"), "account": account,
                              "seq": sequence, "balance": sequence * 10});
            let answer = post(&server, "io-sync", &body).await;
            let expected = if !first {
                "duplicate"
            } else if sequence == watermark + 1 {
                watermark = sequence;
                while held.remove(&(watermark + 1)) {
                    watermark += 1;
                }
                "applied"
            } else {
                held.insert(sequence);
                "accepted"
            };
            assert_eq!(
                answer["status"], expected,
                "seed {seed}, seq {sequence}: {answer}"
            );
        }
        let state = server
            .get(&format!("/v1/sources/io-sync/aggregates/{account}"))
            .await;
        assert_eq!(state.body["sequence"], 7, "seed {seed}: {state:?}");
        assert_eq!(state.body["state"]["balance"], 70, "seed {seed}");
        let log = logged(&server, "io-sync", &format!("p{seed}_")).await;
        let expected: Vec<(String, String)> = (0..7)
            .map(|e| (format!("p{seed}_e{e}"), "processed".to_owned()))
            .collect();
        assert_eq!(log, expected, "seed {seed}");
    }
    assert_eq!(
        counter(&server, "inhook_gaps_skipped_total", "io-sync").await,
        0.0
    );
}
