//! `inhook bench --forward NAME`: follows forwarding to one destination during and after
//! a bench run (docs/forwarding.md): its backlog every second, how long it takes to drain
//! once ingest ends, and from the delivery rows' own timestamps the deliveries per second and
//! each delivery's applied → delivered time.

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::bench_api::{ms_of, percentile, walk_pages, Api};

/// How often the backlog is sampled while the run lasts.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Longest wait for the backlog to drain after the run.
const DRAIN_LIMIT: Duration = Duration::from_secs(900);

/// How often the drain is looked at: a tenth of a second's resolution on drains of seconds.
const DRAIN_POLL: Duration = Duration::from_millis(100);

/// One destination's backlog and requests in flight, from `GET /v1/destinations`.
async fn backlog(api: &Api, name: &str) -> anyhow::Result<(u64, u64)> {
    let list = api.get("/v1/destinations").await?;
    let destination = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == name)
        .with_context(|| format!("no destination {name:?} in GET /v1/destinations"))?;
    Ok((
        destination["backlog"].as_u64().unwrap_or(0),
        destination["in_flight"].as_u64().unwrap_or(0),
    ))
}

/// Samples the destination's backlog once a second until aborted; answers the samples.
pub(crate) async fn sample(
    api: Api,
    name: String,
    samples: std::sync::Arc<std::sync::Mutex<Vec<u64>>>,
) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tick.tick().await;
        if let Ok((waiting, in_flight)) = backlog(&api, &name).await {
            samples.lock().expect("samples").push(waiting + in_flight);
        }
    }
}

/// Waits until nothing is waiting or in flight for `name`; answers how long it took.
pub(crate) async fn drain(
    api: &Api,
    name: &str,
    samples: &std::sync::Mutex<Vec<u64>>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut sampled = Instant::now();
    loop {
        let (waiting, in_flight) = backlog(api, name).await?;
        if sampled.elapsed() >= SAMPLE_EVERY {
            samples.lock().expect("samples").push(waiting + in_flight);
            sampled = Instant::now();
        }
        if waiting + in_flight == 0 {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < DRAIN_LIMIT,
            "the forward backlog never drained"
        );
        // Each look counts the destination's backlog on the server's store: looking
        // every 20 ms took the single SQLite connection from the senders being measured.
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// Every delivered delivery of `name` as (applied, delivered), unix milliseconds.
async fn delivered(api: &Api, name: &str) -> anyhow::Result<Vec<(i64, i64)>> {
    let mut times = Vec::new();
    let path = format!("/v1/destinations/{name}/deliveries?status=delivered&limit=500");
    walk_pages(api, &path, |delivery| {
        if let (Some(applied), Some(done)) = (
            ms_of(&delivery["created_at"]),
            ms_of(&delivery["delivered_at"]),
        ) {
            times.push((applied, done));
        }
    })
    .await?;
    Ok(times)
}

/// When the run's requests went out, unix milliseconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunSpan {
    /// The first request.
    pub started_ms: i64,
    /// The last answer.
    pub ended_ms: i64,
}

/// Prints what forwarding to `name` did during and after the run.
pub(crate) async fn report(
    api: &Api,
    name: &str,
    run: RunSpan,
    samples: &[u64],
    drained: Duration,
) -> anyhow::Result<()> {
    let times = delivered(api, name).await?;
    let during = times.iter().filter(|(_, d)| *d <= run.ended_ms).count();
    let last_ms = times.iter().map(|(_, d)| *d).max().unwrap_or(run.ended_ms);
    let first_ms = times
        .iter()
        .map(|(_, d)| *d)
        .min()
        .unwrap_or(run.started_ms);
    let per_s = |n: usize, from: i64, to: i64| n as f64 * 1000.0 / (to - from).max(1) as f64;
    let shown: Vec<String> = samples.iter().map(u64::to_string).collect();
    println!(
        "bench: forward to {name}: backlog each second {}; max {}; drained {:.2}s after the last answer",
        shown.join(" "),
        samples.iter().max().copied().unwrap_or(0),
        drained.as_secs_f64()
    );
    println!(
        "bench: forward: {} delivered; {:.0}/s during ingest ({during} in {:.2}s), {:.0}/s overall \
         (first request to last delivery, {:.2}s), {:.0}/s first to last delivery",
        times.len(),
        per_s(during, run.started_ms, run.ended_ms),
        (run.ended_ms - run.started_ms) as f64 / 1000.0,
        per_s(times.len(), run.started_ms, last_ms),
        (last_ms - run.started_ms) as f64 / 1000.0,
        per_s(times.len().saturating_sub(1), first_ms, last_ms),
    );
    let mut lags: Vec<i64> = times.iter().map(|(a, d)| d - a).collect();
    lags.sort_unstable();
    println!(
        "bench: applied to delivered, {} deliveries: ms p50 {} p90 {} p99 {} max {}",
        lags.len(),
        percentile(&lags, 0.50),
        percentile(&lags, 0.90),
        percentile(&lags, 0.99),
        percentile(&lags, 1.0)
    );
    Ok(())
}
