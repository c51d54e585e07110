//! `inhook bench`: a load generator. It pre-generates unique, correctly
//! signed save-game deltas over many aggregates with contiguous sequences,
//! drives them over keep-alive HTTP/1.1 connections either flat out (closed
//! loop) or at a fixed offered rate (open loop: latency counts from the
//! scheduled send time, so a slow server cannot hide behind coordinated
//! omission), and reports throughput, latency percentiles, answer codes, the
//! time until every event is applied, and the server's peak RSS.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::clock;
use crate::signature::{self, Scheme, Secret};

/// Arguments of `inhook bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The save-game source to post to.
    #[arg(long, default_value = "save-game")]
    pub source: String,
    /// Path to post to instead of `/webhooks/{source}` (e.g. the ceiling endpoint).
    #[arg(long)]
    pub path: Option<String>,
    /// The source's secret; defaults to INHOOK_<SOURCE>_SECRET.
    #[arg(long)]
    pub secret: Option<String>,
    /// Events to send.
    #[arg(long, default_value_t = 20_000)]
    pub events: usize,
    /// Aggregates (player save slots) the events are spread over.
    #[arg(long, default_value_t = 1_000)]
    pub aggregates: usize,
    /// Keep-alive connections (and concurrent requests in closed loop).
    #[arg(long, default_value_t = 32)]
    pub connections: usize,
    /// Offered rate in requests per second (open loop); 0 sends flat out.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Wait until the server reports no backlog and print the time it took.
    #[arg(long)]
    pub wait_applied: bool,
    /// PID of the server, to report its peak RSS (VmHWM).
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Prefix of player ids, so runs against one database do not collide.
    #[arg(long, default_value = "bench")]
    pub run_id: String,
}

/// Runs the benchmark and prints its report.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    let secret = match args.secret.clone() {
        Some(s) => s,
        None => std::env::var(crate::config::secret_env_var(&args.source))
            .context("no secret: pass --secret or set INHOOK_<SOURCE>_SECRET")?,
    };
    let secret = Secret::new(secret.split(',').next().unwrap_or_default().trim());
    let path = args
        .path
        .clone()
        .unwrap_or_else(|| format!("/webhooks/{}", args.source));
    let url = format!("{}{path}", args.url.trim_end_matches('/'));
    let requests = Arc::new(prepare(&args, &secret));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.connections)
        .http1_only()
        .timeout(Duration::from_secs(30))
        .build()?;
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(args.events)));
    let codes = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    let started = Instant::now();
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.connections.max(1) {
        let (client, url, requests, next) =
            (client.clone(), url.clone(), requests.clone(), next.clone());
        let (latencies, codes) = (latencies.clone(), codes.clone());
        let rate = args.rate;
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((headers, body)) = requests.get(i) else {
                    break;
                };
                // Open loop: each request has a scheduled time; latency counts from it.
                let scheduled = if rate > 0 {
                    let at = started + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(at.into()).await;
                    at
                } else {
                    Instant::now()
                };
                let mut request = client.post(&url).body(body.clone());
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                let code = match request.send().await {
                    Ok(response) => {
                        let code = response.status().as_u16().to_string();
                        let _ = response.bytes().await;
                        code
                    }
                    Err(_) => "connection_error".to_owned(),
                };
                let micros = scheduled.elapsed().as_micros() as u64;
                latencies.lock().expect("latencies").push(micros);
                *codes.lock().expect("codes").entry(code).or_default() += 1;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    let mut latencies = std::mem::take(&mut *latencies.lock().expect("latencies"));
    latencies.sort_unstable();
    let percentile = |p: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i] as f64 / 1000.0
    };
    println!(
        "bench: {} requests in {:.2}s = {:.0} req/s over {} connections ({})",
        latencies.len(),
        elapsed.as_secs_f64(),
        latencies.len() as f64 / elapsed.as_secs_f64(),
        args.connections,
        if args.rate > 0 {
            format!("open loop at {} req/s", args.rate)
        } else {
            "flat out".into()
        }
    );
    println!(
        "bench: latency ms p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2} max {:.2}",
        percentile(0.50),
        percentile(0.90),
        percentile(0.99),
        percentile(0.999),
        percentile(1.0)
    );
    println!("bench: answers {:?}", codes.lock().expect("codes"));
    if args.wait_applied {
        let applied_after = wait_applied(&client, &args.url).await?;
        println!(
            "bench: every event applied {:.2}s after the first request ({:.2}s after the last answer)",
            (elapsed + applied_after).as_secs_f64(),
            applied_after.as_secs_f64()
        );
    }
    if let Some(pid) = args.server_pid {
        if let Some(kib) = peak_rss_kib(pid) {
            println!("bench: server peak RSS {:.1} MiB", kib as f64 / 1024.0);
        }
    }
    Ok(())
}

/// Headers and body of one pre-signed request.
type SignedRequest = (Vec<(&'static str, String)>, Vec<u8>);

/// Signed requests, one per event: deltas spread round-robin over the aggregates,
/// each aggregate's sequences contiguous from 1.
fn prepare(args: &BenchArgs, secret: &Secret) -> Vec<SignedRequest> {
    let now = clock::now_ms() / 1000;
    (0..args.events)
        .map(|i| {
            let aggregate = i % args.aggregates.max(1);
            let sequence = i / args.aggregates.max(1) + 1;
            let body = json!({
                "event_id": format!("{}_{i}", args.run_id),
                "event_type": "inventory.updated",
                "player_id": format!("{}_{aggregate}", args.run_id),
                "save_slot": "slot_a",
                "sequence": sequence,
                "idempotency_key": format!("{}_{i}", args.run_id),
                "data": {"added_items": [{"item_id": "gem", "qty": 1}]},
            })
            .to_string()
            .into_bytes();
            let mut headers = signature::sign(Scheme::HmacTimestamped, &body, secret, now);
            headers.push(("content-type", "application/json".into()));
            (headers, body)
        })
        .collect()
}

/// Polls `/v1/overview` until no source has a backlog; returns how long that took.
async fn wait_applied(client: &reqwest::Client, base: &str) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let url = format!("{}/v1/overview", base.trim_end_matches('/'));
    loop {
        let overview: serde_json::Value = client.get(&url).send().await?.json().await?;
        let backlog: u64 = overview["sources"]
            .as_array()
            .map(|s| s.iter().filter_map(|s| s["backlog"].as_u64()).sum())
            .unwrap_or(0);
        if backlog == 0 {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "backlog never drained"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The peak resident set of a process, from `/proc/{pid}/status`.
fn peak_rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
