//! The command line (docs/api.md, command line). `main.rs` only parses and calls [`run`].

use std::io::Read;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::app::{open_store, shutdown_signal, Application};
use crate::clock;
use crate::config::{signing_secret, Config};
use crate::domain::{AggregateKey, EventStatus};
use crate::signature::{self, Scheme};
use crate::store::{EventFilter, ReplayOutcome};

/// inhook: a webhook receiver that is correct under retries, duplicates and reordering.
#[derive(Debug, Parser)]
#[command(name = "inhook", version, about)]
pub struct Cli {
    /// TOML config file; `INHOOK_*` environment variables override it.
    #[arg(long, global = true, env = "INHOOK_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the receiver and its workers.
    Serve,
    /// Create or upgrade the schema, then exit.
    Migrate,
    /// Sign a JSON file with a source's scheme and POST it.
    Send(SendArgs),
    /// List the event log.
    Events(EventsArgs),
    /// Replay dead or retrying events: one by id, or in bulk by filter (a persisted job).
    Replay(ReplayArgs),
    /// Chaos publisher: duplicates, reordering, retries; then checks the state.
    Simulate(crate::simulate::SimulateArgs),
    /// Load generator: signed events flat out or at a fixed rate; throughput and latency.
    Bench(crate::bench::BenchArgs),
    /// Check a saved delivery offline against a source's secrets; exit 0 if it verifies.
    Verify(crate::verify_cli::VerifyArgs),
    /// Print a new random secret in a scheme's format.
    Keygen(crate::verify_cli::KeygenArgs),
    /// List a destination's deliveries.
    Deliveries(crate::forward_cli::DeliveriesArgs),
    /// A local endpoint for development: verifies forwarded requests and prints them.
    Listen(crate::forward_cli::ListenArgs),
}

/// Arguments of `inhook events`.
#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Only this status (received, processed, ignored_stale, ignored_unsupported, held, retrying, dead).
    #[arg(long, value_parser = parse_status)]
    pub status: Option<EventStatus>,
    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this aggregate, in text form: a user id, or `player/slot`, with `%`
    /// and `/` inside an id written `%25` and `%2F`.
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: Option<AggregateKey>,
    /// How many events, newest first.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
}

/// Arguments of `inhook replay`.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// Replay this one event (needs --source).
    #[arg(long, requires = "source")]
    pub event_id: Option<String>,
    /// Which events to replay in bulk: dead (default) or retrying.
    #[arg(long, value_parser = parse_status, default_value = "dead")]
    pub status: EventStatus,
    /// Only this source.
    #[arg(long)]
    pub source: Option<String>,
    /// Only this aggregate, in text form: a user id, or `player/slot`, with `%`
    /// and `/` inside an id written `%25` and `%2F`.
    #[arg(long, value_parser = parse_aggregate)]
    pub aggregate: Option<AggregateKey>,
}

fn parse_status(raw: &str) -> Result<EventStatus, String> {
    EventStatus::parse(raw).ok_or_else(|| {
        format!(
            "unknown status {raw:?}: expected one of {}",
            EventStatus::ALL.map(EventStatus::as_str).join(", ")
        )
    })
}

/// An `--aggregate` in text form (docs/contract.md, json sources), refused with the reason when
/// malformed.
pub(crate) fn parse_aggregate(raw: &str) -> Result<AggregateKey, String> {
    AggregateKey::parse_text(raw).map_err(|problem| format!("aggregate {problem}"))
}

async fn events(config_path: Option<PathBuf>, args: EventsArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let store = open_store(&config).await?;
    let filter = EventFilter {
        source: args.source,
        status: args.status,
        aggregate: args.aggregate.as_ref().map(AggregateKey::storage_key),
        ..EventFilter::default()
    };
    let page = store
        .events(&filter, args.limit.clamp(1, 10_000), None)
        .await?;
    println!(
        "{:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<20} {:>3} reason",
        "received_at", "source", "event_id", "event_type", "aggregate", "sequence", "status", "try"
    );
    for e in &page.items {
        println!(
            "{:<24} {:<12} {:<28} {:<20} {:<24} {:>8} {:<20} {:>3} {}",
            clock::rfc3339(e.received_at_ms),
            e.source,
            e.event_id,
            e.event_type,
            AggregateKey::text_of_stored(&e.aggregate),
            e.sequence,
            e.status.as_str(),
            e.attempts,
            e.dead_reason.map(|r| r.as_str()).unwrap_or("")
        );
    }
    if page.next_cursor.is_some() {
        println!("(more: raise --limit or narrow the filter)");
    }
    Ok(())
}

async fn replay(config_path: Option<PathBuf>, args: ReplayArgs) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path.as_deref())?;
    let store = open_store(&config).await?;
    let now_ms = clock::now_ms();
    if let (Some(event_id), Some(source)) = (&args.event_id, &args.source) {
        match store.replay_event(source, event_id, now_ms).await? {
            ReplayOutcome::NotFound => bail!("no event {event_id} in source {source}"),
            ReplayOutcome::Requeued => println!("requeued {source}/{event_id}"),
            ReplayOutcome::Unchanged(status) => {
                println!("unchanged: {source}/{event_id} is {}", status.as_str())
            }
        }
        return Ok(());
    }
    if !matches!(args.status, EventStatus::Dead | EventStatus::Retrying) {
        bail!("only dead or retrying events can be replayed");
    }
    let filter = EventFilter {
        source: args.source,
        status: Some(args.status),
        aggregate: args.aggregate.as_ref().map(AggregateKey::storage_key),
        ..EventFilter::default()
    };
    let job = store.create_replay_job(&filter, now_ms).await?;
    println!(
        "replay job {} created for {} events; a running `inhook serve` on this database carries it out",
        job.id, job.total
    );
    Ok(())
}

/// Arguments of `inhook send`.
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// Base URL of the inhook server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The source to post to.
    #[arg(long)]
    pub source: String,
    /// The secret to sign with; defaults to INHOOK_<SOURCE>_SECRET, then the source's in --config.
    #[arg(long)]
    pub secret: Option<String>,
    /// The signature scheme; defaults to the source's in --config (without --config,
    /// only the default sources `presence` and `save-game` are known).
    #[arg(long, value_parser = parse_scheme)]
    pub scheme: Option<Scheme>,
    /// The delivery id, for schemes that send one (standard-webhooks `webhook-id`, GitHub's
    /// `X-GitHub-Delivery`, Shopify's `X-Shopify-Event-Id`); default: derived from the body,
    /// so sending the same file again is a redelivery.
    #[arg(long)]
    pub delivery_id: Option<String>,
    /// An extra request header, `Name: value` (repeatable): an event type or id a
    /// source reads from a header. The scheme's own headers are refused, except its
    /// delivery id (`X-GitHub-Delivery`, `webhook-id`, …), which is then signed as given.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<ExtraHeader>,
    /// A PEM file of CA certificates to trust besides the system's, for an `https://` --url.
    #[arg(long, env = "INHOOK_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// The JSON body to send, or `-` for standard input.
    pub file: PathBuf,
}

fn parse_scheme(raw: &str) -> Result<Scheme, String> {
    raw.parse()
}

/// A request header `inhook send` adds.
#[derive(Debug, Clone)]
pub struct ExtraHeader {
    /// Its name (lower case).
    pub name: reqwest::header::HeaderName,
    /// Its value.
    pub value: reqwest::header::HeaderValue,
}

fn parse_header(raw: &str) -> Result<ExtraHeader, String> {
    let (name, value) = raw
        .split_once(':')
        .ok_or_else(|| format!("{raw:?} is not `Name: value`"))?;
    let name = reqwest::header::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{:?} is not a header name", name.trim()))?;
    let value = reqwest::header::HeaderValue::from_str(value.trim())
        .map_err(|_| format!("the value of {name} is not a valid header value"))?;
    Ok(ExtraHeader { name, value })
}

/// The scheme `send` signs with: `--scheme`, else the source's in the config
/// (the default sources' without `--config`). An unknown source is an error, not a guess.
fn send_scheme(
    args: &SendArgs,
    config_path: Option<&std::path::Path>,
    source: Option<&crate::config::SourceConfig>,
) -> anyhow::Result<Scheme> {
    if let Some(scheme) = args.scheme.or(source.map(|s| s.scheme)) {
        return Ok(scheme);
    }
    match config_path {
        Some(path) => bail!(
            "source {:?} is not in {}: name a configured source, or pass --scheme",
            args.source,
            path.display()
        ),
        None => bail!(
            "source {:?} is not a default source (presence, save-game): pass --config \
             with the file that configures it, or --scheme",
            args.source
        ),
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve => serve(Config::load(cli.config.as_deref())?).await,
        Command::Events(args) => events(cli.config, args).await,
        Command::Replay(args) => replay(cli.config, args).await,
        Command::Migrate => {
            let config = Config::load_for_store(cli.config.as_deref())?;
            let store = open_store(&config).await?;
            crate::app::prune_stored_headers(store.as_ref(), &config)
                .await
                .context("applying the kept-headers allowlist to stored events")?;
            println!("schema is up to date");
            Ok(())
        }
        Command::Send(args) => send(cli.config, args).await,
        Command::Simulate(args) => crate::simulate::run(cli.config, args).await,
        Command::Bench(args) => crate::bench::run(cli.config, args).await,
        Command::Verify(args) => crate::verify_cli::verify(cli.config.as_deref(), args),
        Command::Keygen(args) => crate::verify_cli::keygen(args),
        Command::Deliveries(args) => {
            crate::forward_cli::deliveries(cli.config.as_deref(), args).await
        }
        Command::Listen(args) => crate::forward_cli::listen(args).await,
    }
}

async fn serve(mut config: Config) -> anyhow::Result<()> {
    let _telemetry = crate::telemetry::init(config.log_json, config.otlp_endpoint.as_deref())?;
    let generated_token = config.generate_admin_token();
    if generated_token.is_some() {
        // The token itself goes to standard output once, never to the log.
        tracing::warn!(
            "no admin_token configured: /v1/* takes a token generated for this run, printed on \
             standard output; set admin_token (or INHOOK_ADMIN_TOKEN) to choose one"
        );
    } else if config.admin_token.is_none() {
        tracing::warn!(
            "admin_open_to_loopback: /v1/* answers direct loopback clients without a token \
             (no proxy headers, loopback Host); a proxy on this host opens it to everyone it serves"
        );
    }
    for warning in config.start_warnings() {
        tracing::warn!("{warning}");
    }
    let sources: Vec<_> = config.sources.iter().map(|s| s.name.clone()).collect();
    let app = Application::build(config).await?;
    reload_secrets_on_sighup(app.secrets(), app.config());
    let addr = app.local_addr()?;
    tracing::info!(%addr, ?sources, "inhook started");
    // Tests and scripts read this line to learn the bound port.
    println!("inhook listening on http://{addr}");
    if let Some(token) = generated_token {
        use std::io::Write;
        // Whoever started the server may have stopped reading: a closed pipe is no reason to stop.
        let _ = writeln!(
            std::io::stdout(),
            "inhook admin token for this run: {token}\n\
             inhook dashboard: http://{addr}/#token={token}"
        );
    }
    app.run_until_stopped(shutdown_signal()).await
}

/// On SIGHUP, reloads the secrets exactly as `POST /v1/admin/reload` does: rotation needs no
/// restart, other settings need one. A config that fails the reload checks is reported and
/// the secrets in force stay.
fn reload_secrets_on_sighup(secrets: crate::config::LiveSecrets, running: Arc<Config>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // Registered before the server says it listens: an early SIGHUP must not kill it.
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: secrets reload needs a restart");
            return;
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                // The outcome is logged by `reload`; there is no one else to tell.
                let _ = secrets.reload(&running, "SIGHUP");
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (secrets, running);
}

async fn send(config_path: Option<PathBuf>, args: SendArgs) -> anyhow::Result<()> {
    let body = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading standard input")?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    // Secrets optional: a source whose secret is not set here is no reason to refuse another.
    let config = Config::load_for_store(config_path.as_deref())?;
    let source = config.source(&args.source);
    let scheme = send_scheme(&args, config_path.as_deref(), source)?;
    let secret = signing_secret(
        &args.source,
        args.secret.as_deref(),
        "--secret",
        Some(&config),
    )?;
    let url = format!(
        "{}/webhooks/{}",
        args.url.trim_end_matches('/'),
        args.source
    );
    let client = crate::outbound::client_builder(args.tls_ca_file.as_deref(), "--tls-ca-file")
        .map_err(anyhow::Error::msg)?
        .build()
        .context("building the HTTP client")?;
    let mut request = client.post(&url).header("content-type", "application/json");
    let id_header = scheme.delivery_id_header();
    let header_id = args
        .headers
        .iter()
        .find(|h| Some(h.name.as_str()) == id_header)
        .map(|h| {
            h.value
                .to_str()
                .context("the delivery id header is not text")
        })
        .transpose()?;
    let given_id = match (args.delivery_id.as_deref(), header_id) {
        (Some(flag), Some(header)) if flag != header => {
            bail!("--delivery-id and the {scheme} delivery id header disagree: give one")
        }
        (flag, header) => flag.or(header),
    };
    let signed = signature::try_sign(scheme, &body, &secret, clock::now_ms() / 1000, given_id)
        .with_context(|| format!("signing with the {scheme} scheme"))?;
    for extra in &args.headers {
        let name = extra.name.as_str();
        if name == "content-type" {
            bail!("--header {name}: send always posts application/json");
        }
        if signed.iter().any(|(own, _)| own.eq_ignore_ascii_case(name)) && Some(name) != id_header {
            bail!("--header {name}: the {scheme} scheme sets this header itself");
        }
    }
    for (name, value) in signed {
        request = request.header(name, value);
    }
    for extra in args
        .headers
        .iter()
        .filter(|h| Some(h.name.as_str()) != id_header)
    {
        request = request.header(extra.name.clone(), extra.value.clone());
    }
    let response = request.body(body).send().await.map_err(|e| {
        anyhow::anyhow!(
            "posting to {}",
            crate::outbound::cli_failure(&url, &e.without_url())
        )
    })?;
    let status = response.status();
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|l| crate::outbound::printable(l.as_bytes(), false));
    let text = crate::outbound::shown_body(response).await;
    println!("{} {text}", status.as_u16());
    if let Some(location) = location.filter(|_| status.is_redirection()) {
        bail!("server answered {status} to {location}; redirects are not followed");
    }
    if !status.is_success() {
        bail!("server answered {status}");
    }
    Ok(())
}
