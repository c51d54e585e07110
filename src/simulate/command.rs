//! The command: resolves secrets and the admin token from flags, environment
//! and config, then generates, delivers with chaos, checks and reports.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::args::SimulateArgs;
use super::chaos::{plan, ChaosSpec};
use super::expected::expected_states;
use super::publisher::{Endpoint, Publisher, SendOptions, SourceSigner};
use super::report;
use super::stream::{generate, StreamSpec};
use crate::config::{secret_env_var, Config};
use crate::contract::SourceKind;
use crate::signature::{Scheme, Secret};

/// Runs `inhook simulate`: generate, deliver with chaos, check, report.
pub(crate) async fn run(config_path: Option<PathBuf>, args: SimulateArgs) -> anyhow::Result<()> {
    args.check()?;
    // The config file, when given, supplies secrets, schemes and the admin token the flags leave out.
    let config = match &config_path {
        Some(path) => Some(Config::load(Some(path)).context("loading --config")?),
        None => None,
    };
    let signer = |name: &str, flag: &Option<String>, seed_scheme: Scheme| {
        let from_config = config.as_ref().and_then(|c| c.source(name));
        let var = secret_env_var(name);
        let secret = match flag.clone().or_else(|| std::env::var(&var).ok()) {
            Some(raw) => Secret::new(raw.split(',').next().unwrap_or_default().trim()),
            None => match from_config.and_then(|s| s.secrets.first().cloned()) {
                Some(secret) => secret,
                None => bail!("no secret for source {name}: pass its --*-secret flag or set {var}"),
            },
        };
        Ok(SourceSigner {
            name: name.to_owned(),
            scheme: from_config.map_or(seed_scheme, |s| s.scheme),
            secret,
        })
    };
    let presence = signer(
        &args.presence_source,
        &args.presence_secret,
        Scheme::HmacHex,
    )?;
    let save = signer(
        &args.save_source,
        &args.save_secret,
        Scheme::HmacTimestamped,
    )?;
    let admin_token = args.admin_token.clone().or_else(|| {
        config
            .as_ref()
            .and_then(|c| c.admin_token.as_ref())
            .map(|t| String::from_utf8_lossy(t.expose()).into_owned())
    });
    let seed = args.seed.unwrap_or_else(rand::random);
    let started = Instant::now();
    let stream = generate(&StreamSpec {
        seed,
        events: args.events,
        aggregates: args.aggregates,
        presence_share: args.presence_share,
    });
    let plan = plan(
        &stream,
        &ChaosSpec {
            seed,
            window: args.window,
            duplicate_rate: args.duplicate_rate,
            resend_rate: args.resend_rate,
        },
    );
    let expected = Arc::new(expected_states(&stream));
    let publisher = Publisher::new(
        Endpoint::new(&args.url),
        presence,
        save,
        admin_token,
        SendOptions {
            concurrency: args.concurrency,
            rate: args.rate,
            give_up_after: Duration::from_secs(args.give_up_after_s),
            max_retry_after: Duration::from_secs(args.max_retry_after_s),
            request_timeout: Duration::from_millis(args.request_timeout_ms),
        },
    )?;
    println!(
        "inhook simulate: seed {seed}, {} events over {} aggregates ({} presence users, {} save slots) to {}",
        stream.event_count(),
        stream.aggregates.len(),
        stream.aggregates_of(SourceKind::Presence),
        stream.aggregates_of(SourceKind::SaveGame),
        args.url
    );
    let plan = Arc::new(plan);
    let delivery = publisher.deliver(plan.clone()).await;
    // A failed delivery makes the expected state unreachable: waiting for it would only burn the timeout.
    let checked = if delivery.failures.is_empty() {
        publisher
            .converge(expected, Duration::from_secs(args.settle_timeout_s))
            .await
    } else {
        Err(anyhow::anyhow!("deliveries failed"))
    };
    let mismatches = match &checked {
        Ok(m) => Ok(m.as_slice()),
        Err(err) => Err(format!("{err:#}")),
    };
    println!(
        "{}",
        report::render(&plan, &delivery, mismatches, started.elapsed())
    );
    if !delivery.failures.is_empty() {
        bail!("{} deliveries failed", delivery.failures.len());
    }
    match checked? {
        m if !m.is_empty() => bail!(
            "{} aggregates differ from the in-order state after {}s",
            m.len(),
            args.settle_timeout_s
        ),
        _ => Ok(()),
    }
}
