//! `inhook bench`: a load generator. It pre-generates unique, correctly
//! signed events over many aggregates with contiguous sequences (save-game
//! deltas, or Stripe-shaped events for a latest-wins `json` source),
//! drives them over keep-alive HTTP/1.1 connections either flat out (closed
//! loop) or at a fixed offered rate (open loop: latency counts from the
//! scheduled send time, so a slow server cannot hide behind coordinated
//! omission), and reports throughput, latency percentiles, answer codes, the
//! time until every event is applied, and the server's peak RSS. With
//! `--sample-ms` it also reads `/v1/overview` as it sends and reports the run
//! end to end: accepted and decided per second, the backlog over time and the
//! drain time.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::json;

use crate::bench_api::{ms_of, percentile, walk_pages, Api};
use inhook::config::{client_admin_token, signing_secret, Config};
use inhook::domain::clock;
use inhook::ingress::signature::{self, Scheme, Secret};

/// Arguments of `inhook bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Base URL of the server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The source to post to.
    #[arg(long, default_value = "save-game")]
    pub source: String,
    /// The events' shape: save-game deltas, or Stripe events for a `json` source keyed by
    /// `["/data/object/object", "/data/object/id"]` with `sequence = "/created"`.
    #[arg(long, value_enum, default_value_t = Shape::SaveGame)]
    pub shape: Shape,
    /// Path to post to instead of `/webhooks/{source}` (e.g. the ceiling endpoint).
    #[arg(long)]
    pub path: Option<String>,
    /// The source's secret; defaults to INHOOK_<SOURCE>_SECRET, then the source's in --config.
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
    /// PID of the server, to report its peak RSS (VmHWM) and the CPU time it spent per event.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Prefix of player ids, so runs against one database do not collide.
    #[arg(long, default_value = "bench")]
    pub run_id: String,
    /// Run this many seconds, overriding `--events`: with `--rate`, rate × seconds events;
    /// without, flat out until the time is up.
    #[arg(long)]
    pub duration_s: Option<u64>,
    /// Read `/v1/overview` this often (milliseconds) while sending and until the backlog
    /// drains: prints accepted, decided and backlog at each reading, then the run end to end.
    #[arg(long)]
    pub sample_ms: Option<u64>,
    /// Admin token for the read API (`--wait-applied`, `--apply-lag`, `--sample-ms`);
    /// defaults to the one in --config. Not needed on loopback when none is configured.
    #[arg(long, env = "INHOOK_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// After `--wait-applied`, read the event log and report how long each event took from
    /// receipt to its final status (the store's own timestamps).
    #[arg(long)]
    pub apply_lag: bool,
    /// A PEM file of CA certificates to trust besides the system's, for an `https://` --url.
    #[arg(long, env = "INHOOK_TLS_CA_FILE")]
    pub tls_ca_file: Option<std::path::PathBuf>,
    /// Also follow forwarding to this destination: its backlog every second, the drain
    /// after the run, deliveries per second and applied → delivered times.
    #[arg(long, value_name = "DESTINATION")]
    pub forward: Option<String>,
}

/// Above this many events, requests are signed as they are sent rather than all up front
/// (memory, and signatures that would age past the source's tolerance in a long run).
const PREGENERATE_MAX: usize = 200_000;

/// Runs the benchmark and prints its report.
pub async fn run(config_path: Option<std::path::PathBuf>, args: BenchArgs) -> anyhow::Result<()> {
    let config = Config::load_given(config_path.as_deref()).context("loading --config")?;
    let secret = signing_secret(
        &args.source,
        args.secret.as_deref(),
        "--secret",
        config.as_ref(),
    )?;
    let path = args
        .path
        .clone()
        .unwrap_or_else(|| format!("/webhooks/{}", args.source));
    let url = format!("{}{path}", args.url.trim_end_matches('/'));
    let (events, send_for) = match (args.duration_s, args.rate) {
        (Some(seconds), rate) if rate > 0 => ((seconds * rate) as usize, None),
        (Some(seconds), _) => (usize::MAX, Some(Duration::from_secs(seconds))),
        _ => (args.events, None),
    };
    let client =
        inhook::forward::outbound::client_builder(args.tls_ca_file.as_deref(), "--tls-ca-file")?
            .pool_max_idle_per_host(args.connections)
            .http1_only()
            .timeout(Duration::from_secs(30))
            .build()?;
    let api = Api::new(
        client.clone(),
        &args.url,
        client_admin_token(args.admin_token.as_deref(), config.as_ref()),
    );
    let generator = Arc::new(Generator {
        shape: args.shape,
        run_id: args.run_id.clone(),
        aggregates: args.aggregates.max(1),
        secret,
    });
    let pregenerated: Arc<Vec<SignedRequest>> = Arc::new(if events <= PREGENERATE_MAX {
        let now = clock::now_ms() / 1000;
        (0..events).map(|i| generator.request(i, now)).collect()
    } else {
        match send_for {
            Some(time) => println!(
                "bench: flat out for {}s: each event signed as it is sent",
                time.as_secs()
            ),
            None => println!("bench: {events} events: each signed as it is sent"),
        }
        Vec::new()
    });
    let cpu_before = args.server_pid.and_then(process_cpu_s);
    let rss_samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = args.server_pid.map(|pid| {
        let samples = rss_samples.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            loop {
                if let Some(kib) = proc_status_kib(pid, "VmRSS:") {
                    samples
                        .lock()
                        .expect("samples")
                        .push((started.elapsed().as_secs(), kib));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    });
    let latencies = Arc::new(Mutex::new(Vec::with_capacity(events.min(PREGENERATE_MAX))));
    let codes = Arc::new(Mutex::new(BTreeMap::<String, u64>::new()));
    // The first request that got no answer, to say why when none got one.
    let first_failure = Arc::new(Mutex::new(None::<String>));
    let accepted = Arc::new(AtomicU64::new(0));
    let max_backlog = Arc::new(AtomicU64::new(0));
    let before = match args.sample_ms {
        Some(_) => progress(&api).await?,
        None => Progress::default(),
    };
    let forward_samples = Arc::new(Mutex::new(Vec::new()));
    let forward_sampler = args.forward.clone().map(|name| {
        tokio::spawn(crate::bench_forward::sample(
            api.clone(),
            name,
            Arc::clone(&forward_samples),
        ))
    });
    let started_ms = clock::now_ms();
    let started = Instant::now();
    let progress_sampler = args.sample_ms.map(|ms| {
        tokio::spawn(sample_progress(
            api.clone(),
            Duration::from_millis(ms.max(1)),
            started,
            before,
            accepted.clone(),
            max_backlog.clone(),
            args.server_pid,
        ))
    });
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.connections.max(1) {
        let (client, url, pregenerated, generator, next) = (
            client.clone(),
            url.clone(),
            pregenerated.clone(),
            generator.clone(),
            next.clone(),
        );
        let (latencies, codes, first_failure, accepted) = (
            latencies.clone(),
            codes.clone(),
            first_failure.clone(),
            accepted.clone(),
        );
        let rate = args.rate;
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= events || send_for.is_some_and(|time| started.elapsed() >= time) {
                    break;
                }
                // Open loop: each request has a scheduled time; latency counts from it.
                let scheduled = if rate > 0 {
                    let at = started + Duration::from_secs_f64(i as f64 / rate as f64);
                    tokio::time::sleep_until(at.into()).await;
                    at
                } else {
                    Instant::now()
                };
                let signed_now;
                let (headers, body) = match pregenerated.get(i) {
                    Some(request) => request,
                    None => {
                        signed_now = generator.request(i, clock::now_ms() / 1000);
                        &signed_now
                    }
                };
                let mut request = client.post(&url).body(body.clone());
                for (name, value) in headers {
                    request = request.header(*name, value);
                }
                let code = match request.send().await {
                    Ok(response) => {
                        if response.status().is_success() {
                            accepted.fetch_add(1, Ordering::Relaxed);
                        }
                        let code = response.status().as_u16().to_string();
                        // Drained (bounded) so the connection can carry the next request.
                        let _ = inhook::forward::outbound::read_capped(response, 64 << 10).await;
                        code
                    }
                    Err(err) => {
                        let refused =
                            inhook::forward::outbound::certificate_problem(&err).is_some();
                        first_failure
                            .lock()
                            .expect("first failure")
                            .get_or_insert_with(|| {
                                inhook::forward::outbound::cli_failure(&url, &err.without_url())
                            });
                        // No later request can pass a certificate check this one failed.
                        if refused {
                            break;
                        }
                        "connection_error".to_owned()
                    }
                };
                let micros = scheduled.elapsed().as_micros() as u64;
                latencies.lock().expect("latencies").push(micros);
                *codes.lock().expect("codes").entry(code).or_default() += 1;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    let elapsed = started.elapsed();
    let at_last_answer = match args.sample_ms {
        Some(_) => Some(progress(&api).await?),
        None => None,
    };
    let ended_ms = clock::now_ms();
    let mut latencies = std::mem::take(&mut *latencies.lock().expect("latencies"));
    latencies.sort_unstable();
    let sent = latencies.len();
    let at = |p: f64| percentile(&latencies, p) as f64 / 1000.0;
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
        at(0.50),
        at(0.90),
        at(0.99),
        at(0.999),
        at(1.0)
    );
    println!("bench: answers {:?}", codes.lock().expect("codes"));
    if events > 0
        && codes
            .lock()
            .expect("codes")
            .keys()
            .all(|c| c == "connection_error")
    {
        let why = first_failure.lock().expect("first failure").take();
        anyhow::bail!(
            "no request was answered: {}",
            why.unwrap_or_else(|| "none was sent".into())
        );
    }
    let applied_after = match args.wait_applied || args.sample_ms.is_some() {
        true => Some(wait_applied(&api).await?),
        false => None,
    };
    if let (true, Some(applied_after)) = (args.wait_applied, applied_after) {
        println!(
            "bench: every event applied {:.2}s after the first request ({:.2}s after the last answer)",
            (elapsed + applied_after).as_secs_f64(),
            applied_after.as_secs_f64()
        );
    }
    if let (Some(sampler), Some(at_end), Some(drained)) =
        (progress_sampler, at_last_answer, applied_after)
    {
        sampler.abort();
        end_to_end(
            accepted.load(Ordering::Relaxed),
            at_end.decided.saturating_sub(before.decided),
            elapsed,
            max_backlog.load(Ordering::Relaxed).max(at_end.backlog),
            drained,
        );
    }
    if args.apply_lag {
        apply_lag(&api).await?;
    }
    if let (Some(name), Some(sampler)) = (args.forward.as_deref(), forward_sampler) {
        let drained = crate::bench_forward::drain(&api, name, &forward_samples).await?;
        sampler.abort();
        let samples = std::mem::take(&mut *forward_samples.lock().expect("samples"));
        let run = crate::bench_forward::RunSpan {
            started_ms,
            ended_ms,
        };
        crate::bench_forward::report(&api, name, run, &samples, drained).await?;
    }
    if let (Some(before), Some(after)) = (cpu_before, args.server_pid.and_then(process_cpu_s)) {
        // CPU time, unlike throughput, hardly moves when other work shares the machine.
        println!(
            "bench: server CPU {:.2}s = {:.1} µs per event (user + system, until every answer{})",
            after - before,
            (after - before) * 1e6 / sent.max(1) as f64,
            if applied_after.is_some() {
                " and every decision"
            } else {
                ""
            }
        );
    }
    if let Some(pid) = args.server_pid {
        if let Some(sampler) = sampler {
            sampler.abort();
        }
        report_rss(
            pid,
            &rss_samples.lock().expect("samples"),
            args.sample_ms.is_some(),
        );
    }
    Ok(())
}

/// Prints the server's peak RSS and, for runs of two minutes or more (any run with
/// `per_minute`), its RSS over time: the highest of each minute, of the first and of the last.
fn report_rss(pid: u32, samples: &[(u64, u64)], per_minute: bool) {
    let mib = |kib: u64| kib as f64 / 1024.0;
    if let Some(kib) = proc_status_kib(pid, "VmHWM:") {
        println!("bench: server peak RSS {:.1} MiB", mib(kib));
    }
    let Some(&(last_s, _)) = samples.last() else {
        return;
    };
    if last_s < 120 && !per_minute {
        return;
    }
    let max_between = |from: u64, to: u64| {
        samples
            .iter()
            .filter(|(s, _)| (from..to).contains(s))
            .map(|(_, kib)| *kib)
            .max()
            .unwrap_or(0)
    };
    let per_minute: Vec<String> = (0..=last_s / 60)
        .map(|m| format!("{:.0}", mib(max_between(m * 60, m * 60 + 60))))
        .collect();
    println!(
        "bench: server RSS MiB, highest per minute: {} (first minute {:.1}, last minute {:.1})",
        per_minute.join(" "),
        mib(max_between(0, 60)),
        mib(max_between(last_s.saturating_sub(59), last_s + 1))
    );
}

/// Reads the event log through the API and prints, over every decided event, the time
/// from receipt to decision (percentiles, and the share within 2 s).
async fn apply_lag(api: &Api) -> anyhow::Result<()> {
    let mut lags = Vec::new();
    walk_pages(api, "/v1/events?limit=500", |event| {
        if let (Some(received), Some(decided)) =
            (ms_of(&event["received_at"]), ms_of(&event["decided_at"]))
        {
            lags.push(decided - received);
        }
    })
    .await?;
    lags.sort_unstable();
    let at = |p: f64| percentile(&lags, p);
    let within_2s = lags.iter().filter(|&&lag| lag <= 2_000).count();
    println!(
        "bench: receipt to applied, {} events: ms p50 {} p99 {} p99.9 {} max {}; {:.3}% within 2 s",
        lags.len(),
        at(0.50),
        at(0.99),
        at(0.999),
        at(1.0),
        100.0 * within_2s as f64 / lags.len().max(1) as f64
    );
    Ok(())
}

/// Headers and body of one pre-signed request.
type SignedRequest = (Vec<(&'static str, String)>, Vec<u8>);

/// What the generated events look like, and so which kind of source they are for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// Save-game `inventory.updated` deltas, signed hmac-timestamped.
    SaveGame,
    /// Stripe `customer.updated` events, signed as Stripe signs them.
    Stripe,
}

/// Stripe's `created` of the bench's sequence 0: the sequence is a plausible unix time.
const STRIPE_CREATED_BASE: usize = 1_700_000_000;

/// Makes the signed request of event `i`: events spread round-robin over the aggregates,
/// each aggregate's sequences contiguous from 1.
struct Generator {
    shape: Shape,
    run_id: String,
    aggregates: usize,
    secret: Secret,
}

impl Generator {
    fn request(&self, i: usize, now_s: i64) -> SignedRequest {
        let aggregate = i % self.aggregates;
        let sequence = i / self.aggregates + 1;
        let run = &self.run_id;
        let (scheme, body) = match self.shape {
            Shape::SaveGame => (
                Scheme::HmacTimestamped,
                json!({
                    "event_id": format!("{run}_{i}"),
                    "event_type": "inventory.updated",
                    "player_id": format!("{run}_{aggregate}"),
                    "save_slot": "slot_a",
                    "sequence": sequence,
                    "idempotency_key": format!("{run}_{i}"),
                    "data": {"added_items": [{"item_id": "gem", "qty": 1}]},
                }),
            ),
            // About the save-game body's size, so that the two measure the kinds, not the bytes.
            Shape::Stripe => (
                Scheme::Stripe,
                json!({
                    "id": format!("evt_{run}_{i}"),
                    "object": "event",
                    "created": STRIPE_CREATED_BASE + sequence,
                    "type": "customer.updated",
                    "livemode": false,
                    "data": {"object": {
                        "id": format!("cus_{run}_{aggregate}"),
                        "object": "customer",
                        "balance": sequence,
                        "currency": "usd",
                    }},
                }),
            ),
        };
        let body = body.to_string().into_bytes();
        let mut headers = signature::sign(scheme, &body, &self.secret, now_s);
        headers.push(("content-type", "application/json".into()));
        (headers, body)
    }
}

/// Events decided so far and the backlog, summed over every source of `/v1/overview`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Progress {
    decided: u64,
    backlog: u64,
}

impl Progress {
    /// Reads an overview: decided is every final status (applied, stale, unsupported, dead).
    fn of(overview: &serde_json::Value) -> Self {
        let sum = |field: &str| -> u64 {
            overview["sources"]
                .as_array()
                .map(|s| s.iter().filter_map(|s| s[field].as_u64()).sum())
                .unwrap_or(0)
        };
        Progress {
            decided: ["processed", "stale", "unsupported", "dead"]
                .iter()
                .map(|field| sum(field))
                .sum(),
            backlog: sum("backlog"),
        }
    }
}

/// The progress `/v1/overview` shows now.
async fn progress(api: &Api) -> anyhow::Result<Progress> {
    Ok(Progress::of(&api.get("/v1/overview").await?))
}

/// Polls `/v1/overview` until no source has a backlog; returns how long that took.
async fn wait_applied(api: &Api) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if progress(api).await?.backlog == 0 {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "backlog never drained"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Reads the overview every `every` until aborted, printing what the server accepted
/// (answered 2xx) and decided since `before`, its backlog and, with a PID, its RSS.
async fn sample_progress(
    api: Api,
    every: Duration,
    started: Instant,
    before: Progress,
    accepted: Arc<AtomicU64>,
    max_backlog: Arc<AtomicU64>,
    server_pid: Option<u32>,
) {
    let mut ticks = tokio::time::interval_at((started + every).into(), every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let accepted = accepted.load(Ordering::Relaxed);
        let Ok(now) = progress(&api).await else {
            continue;
        };
        max_backlog.fetch_max(now.backlog, Ordering::Relaxed);
        let rss = server_pid
            .and_then(|pid| proc_status_kib(pid, "VmRSS:"))
            .map(|kib| format!(" rss {:.1} MiB", kib as f64 / 1024.0))
            .unwrap_or_default();
        println!(
            "bench: at {:.1}s accepted {accepted} decided {} backlog {}{rss}",
            started.elapsed().as_secs_f64(),
            now.decided.saturating_sub(before.decided),
            now.backlog
        );
    }
}

/// Prints the run end to end: what was accepted and decided while sending, and how long
/// the backlog took to drain after the last answer.
fn end_to_end(accepted: u64, decided: u64, sending: Duration, max_backlog: u64, drained: Duration) {
    let seconds = sending.as_secs_f64().max(1e-9);
    println!(
        "bench: end to end: accepted {accepted} = {:.0}/s, decided during the run {decided} = {:.0}/s \
         (decided ÷ accepted {:.2}), max backlog {max_backlog}, drained {:.2}s after the last answer",
        accepted as f64 / seconds,
        decided as f64 / seconds,
        decided as f64 / accepted.max(1) as f64,
        drained.as_secs_f64()
    );
}

/// A process's CPU time so far (user + system), in seconds, from `/proc/{pid}/stat`.
fn process_cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf reads a configuration value and has no preconditions.
    let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (per_s > 0).then(|| ticks as f64 / per_s as f64)
}

/// A process's memory figure (`VmRSS:`, `VmHWM:`) in KiB, from `/proc/{pid}/status`.
fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;
    use inhook::domain::kind::json::contract::JsonSourceSpec;
    use inhook::domain::kind::json::JsonKind;
    use inhook::domain::kind::{Delivery, Kind};

    /// The json source `scripts/bench.sh` declares.
    const BENCH_STRIPE_SOURCE: &str = r#"
        event_id = "/id"
        aggregate = ["/data/object/object", "/data/object/id"]
        sequence = "/created"
        event_type = "/type"
        ordering = "latest-wins"
        state = "/data/object"
    "#;

    fn generator(shape: Shape) -> Generator {
        Generator {
            shape,
            run_id: "b123".into(),
            aggregates: 10,
            secret: Secret::new("whsec_bench"),
        }
    }

    #[test]
    fn stripe_events_verify_parse_on_the_bench_source_and_weigh_about_a_save_delta() {
        let kind =
            JsonKind::new(&toml::from_str::<JsonSourceSpec>(BENCH_STRIPE_SOURCE).unwrap()).unwrap();
        let now = 1_800_000_000;
        let (headers, body) = generator(Shape::Stripe).request(23, now);
        let map: HeaderMap = headers
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_static(k),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect();
        let secrets = [Secret::new("whsec_bench")];
        signature::verify(Scheme::Stripe, &map, &body, &secrets, now, 300).unwrap();
        let Delivery::Event(fields) = kind.parse(&body, &map, None).unwrap() else {
            panic!("a bench event is accepted");
        };
        assert_eq!(fields.event_id.as_str(), "evt_b123_23");
        assert_eq!(fields.aggregate.to_string(), "customer/cus_b123_3");
        assert_eq!(fields.sequence, (STRIPE_CREATED_BASE + 3) as i64);
        let (_, save) = generator(Shape::SaveGame).request(23, now);
        let ratio = body.len() as f64 / save.len() as f64;
        assert!(
            (0.8..1.25).contains(&ratio),
            "{} vs {} bytes",
            body.len(),
            save.len()
        );
    }

    #[test]
    fn progress_sums_the_final_statuses_and_the_backlog_over_every_source() {
        let overview = serde_json::json!({"sources": [
            {"received": 9, "processed": 4, "stale": 1, "unsupported": 1, "dead": 1,
             "held": 1, "retrying": 1, "backlog": 2},
            {"received": 5, "processed": 3, "stale": 0, "unsupported": 0, "dead": 0,
             "held": 0, "retrying": 0, "backlog": 2},
        ]});
        assert_eq!(
            Progress::of(&overview),
            Progress {
                decided: 10,
                backlog: 4
            }
        );
        assert_eq!(Progress::of(&serde_json::json!({})), Progress::default());
    }

    #[test]
    fn a_process_cpu_time_is_read_and_grows() {
        let before = process_cpu_s(std::process::id()).unwrap();
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        assert!(process_cpu_s(std::process::id()).unwrap() > before);
        assert_eq!(process_cpu_s(u32::MAX), None);
    }
}
