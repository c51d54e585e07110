//! The command: resolves secrets and the admin token from flags, environment
//! and config, then generates (the built-in sources' stream, or a `json`
//! source's), delivers with chaos, checks and reports.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use super::args::SimulateArgs;
use super::chaos::{plan, ChaosSpec};
use super::expected::{expected_json_states, expected_states, Expected};
use super::json_body::{generate_json, JsonTarget};
use super::publisher::{Endpoint, Publisher, SendOptions, SourceSigner};
use super::report;
use super::stream::{generate, AggregateRef, Stream, StreamSpec};
use inhook::config::{client_admin_token, signing_secret, Config};
use inhook::domain::kind::SourceKind;
use inhook::ingress::signature::Scheme;

/// Runs `inhook simulate`: generate, deliver with chaos, check, report.
pub async fn run(config_path: Option<PathBuf>, args: SimulateArgs) -> anyhow::Result<()> {
    args.check()?;
    // The config file, when given, supplies secrets, schemes, locations and the admin token the flags leave out.
    let config = Config::load_given(config_path.as_deref()).context("loading --config")?;
    let admin_token = client_admin_token(args.admin_token.as_deref(), config.as_ref());
    let seed = args.seed.unwrap_or_else(rand::random);
    let started = Instant::now();
    let spec = StreamSpec {
        seed,
        events: args.events,
        aggregates: args.aggregates,
        presence_share: args.presence_share,
    };
    let run = match &args.source {
        Some(name) => json_run(name, &args, config.as_ref(), &spec)?,
        None => built_in_run(&args, config.as_ref(), &spec)?,
    };
    println!(
        "inhook simulate: seed {seed}, {} events over {} to {}",
        run.stream.event_count(),
        run.over,
        args.url
    );
    let publisher = Publisher::with_signers(
        Endpoint::new(&args.url),
        run.signers,
        admin_token,
        SendOptions {
            concurrency: args.concurrency,
            rate: args.rate,
            give_up_after: Duration::from_secs(args.give_up_after_s),
            max_retry_after: Duration::from_secs(args.max_retry_after_s),
            request_timeout: Duration::from_millis(args.request_timeout_ms),
            tls_ca_file: args.tls_ca_file.clone(),
        },
    )?;
    let plan = Arc::new(plan(
        &run.stream,
        &ChaosSpec {
            seed,
            window: args.window,
            duplicate_rate: args.duplicate_rate,
            resend_rate: args.resend_rate,
        },
    ));
    let mut delivery = publisher.deliver(plan.clone()).await;
    // A failed delivery makes the expected state unreachable: waiting for it would only burn the timeout.
    let checked = if delivery.failures.is_empty() {
        publisher
            .converge(
                Arc::new(run.expected),
                Duration::from_secs(args.settle_timeout_s),
            )
            .await
    } else {
        Err(anyhow::anyhow!("deliveries failed"))
    };
    // An answer other than the one the event's type calls for fails the run, converged or not.
    delivery
        .failures
        .extend(report::unexpected_answers(&plan, &delivery));
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

/// What one run sends, what it expects, and to which sources.
struct Run {
    stream: Stream,
    expected: Vec<(AggregateRef, Option<Expected>)>,
    signers: Vec<(SourceKind, SourceSigner)>,
    /// What the events are spread over, for the report's first line.
    over: String,
}

/// A `json` source's run: bodies from its locations in the config, its contract's expectations.
fn json_run(
    name: &str,
    args: &SimulateArgs,
    config: Option<&Config>,
    spec: &StreamSpec,
) -> anyhow::Result<Run> {
    let source = config.and_then(|c| c.source(name)).with_context(|| {
        format!("--source {name}: no such source in --config (its locations are read from there)")
    })?;
    if source.verifier.scheme().is_configurable() {
        anyhow::bail!(
            "--source {name}: simulate signs with the built-in schemes only; signature = \"{}\" \
             deliveries are sent one by one with inhook send",
            source.verifier
        );
    }
    let target = JsonTarget::new(source, args.sequence_format, args.unsupported_share)?;
    let signer = signer(
        name,
        source.verifier.scheme(),
        args.secret.as_deref(),
        "--secret",
        config,
    )?;
    let stream = generate_json(spec, &target);
    let sequences = if target.contract.locates_sequence() {
        format!("{} sequences", args.sequence_format.as_str())
    } else {
        "no sequence".to_owned()
    };
    Ok(Run {
        expected: expected_json_states(&stream, &target.contract),
        over: format!(
            "{} aggregates of json source {name} ({}, {sequences})",
            stream.aggregates.len(),
            target.ordering().as_str()
        ),
        stream,
        signers: vec![(SourceKind::Json, signer)],
    })
}

/// The built-in sources' run: presence users and save slots.
fn built_in_run(
    args: &SimulateArgs,
    config: Option<&Config>,
    spec: &StreamSpec,
) -> anyhow::Result<Run> {
    let scheme_of = |name: &str, seed_scheme| {
        config
            .and_then(|c| c.source(name))
            .map_or(seed_scheme, |s| s.verifier.scheme())
    };
    let presence = signer(
        &args.presence_source,
        scheme_of(&args.presence_source, Scheme::HmacHex),
        args.presence_secret.as_deref(),
        "--presence-secret",
        config,
    )?;
    let save = signer(
        &args.save_source,
        scheme_of(&args.save_source, Scheme::HmacTimestamped),
        args.save_secret.as_deref(),
        "--save-secret",
        config,
    )?;
    let stream = generate(spec);
    Ok(Run {
        expected: expected_states(&stream),
        over: format!(
            "{} aggregates ({} presence users, {} save slots)",
            stream.aggregates.len(),
            stream.aggregates_of(SourceKind::Presence),
            stream.aggregates_of(SourceKind::SaveGame)
        ),
        stream,
        signers: vec![
            (SourceKind::Presence, presence),
            (SourceKind::SaveGame, save),
        ],
    })
}

/// How one source is addressed and signed, its secret found as every publisher-side command finds it.
fn signer(
    name: &str,
    scheme: Scheme,
    flag: Option<&str>,
    flag_name: &str,
    config: Option<&Config>,
) -> anyhow::Result<SourceSigner> {
    Ok(SourceSigner {
        name: name.to_owned(),
        scheme,
        secret: signing_secret(name, flag, flag_name, config)?,
    })
}
