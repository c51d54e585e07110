//! The command line (SPEC §5). `main.rs` only parses and calls [`run`].

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

use crate::app::{open_store, shutdown_signal, Application};
use crate::clock;
use crate::config::{secret_env_var, Config};
use crate::signature::{self, Scheme, Secret};

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
    /// Chaos publisher: duplicates, reordering, retries; then checks the state.
    Simulate(crate::simulate::SimulateArgs),
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
    /// The secret to sign with; defaults to INHOOK_<SOURCE>_SECRET.
    #[arg(long)]
    pub secret: Option<String>,
    /// The signature scheme; defaults to the source's in --config, else the seed source's.
    #[arg(long, value_parser = parse_scheme)]
    pub scheme: Option<Scheme>,
    /// The JSON body to send, or `-` for standard input.
    pub file: PathBuf,
}

fn parse_scheme(raw: &str) -> Result<Scheme, String> {
    match raw {
        "hmac-hex" => Ok(Scheme::HmacHex),
        "hmac-timestamped" => Ok(Scheme::HmacTimestamped),
        other => Err(format!(
            "unknown scheme {other:?}: expected hmac-hex or hmac-timestamped"
        )),
    }
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve => serve(Config::load(cli.config.as_deref())?).await,
        Command::Migrate => {
            let config = Config::load(cli.config.as_deref())?;
            open_store(&config).await?;
            println!("schema is up to date");
            Ok(())
        }
        Command::Send(args) => send(cli.config, args).await,
        Command::Simulate(args) => crate::simulate::run(cli.config, args).await,
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    init_tracing(config.log_json);
    if config.admin_token.is_none() {
        tracing::warn!("no admin_token configured: /v1/* answers loopback clients only");
    }
    let sources: Vec<_> = config.sources.iter().map(|s| s.name.clone()).collect();
    let app = Application::build(config).await?;
    let addr = app.local_addr()?;
    tracing::info!(%addr, ?sources, "inhook started");
    // Tests and scripts read this line to learn the bound port.
    println!("inhook listening on http://{addr}");
    app.run_until_stopped(shutdown_signal()).await
}

fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("INHOOK_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
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
    let configured = match &config_path {
        Some(_) => Config::load(config_path.as_deref()).ok().and_then(|c| {
            c.source(&args.source)
                .map(|s| (s.scheme, s.secrets.first().cloned()))
        }),
        None => None,
    };
    let scheme = args
        .scheme
        .or(configured.as_ref().map(|(scheme, _)| *scheme))
        .unwrap_or(if args.source == "presence" {
            Scheme::HmacHex
        } else {
            Scheme::HmacTimestamped
        });
    let var = secret_env_var(&args.source);
    let secret = match args.secret.or_else(|| std::env::var(&var).ok()) {
        Some(s) => Secret::new(s.split(',').next().unwrap_or_default().trim()),
        None => match configured.and_then(|(_, s)| s) {
            Some(secret) => secret,
            None => bail!("no secret: pass --secret or set {var}"),
        },
    };
    let url = format!(
        "{}/webhooks/{}",
        args.url.trim_end_matches('/'),
        args.source
    );
    let mut request = reqwest::Client::new()
        .post(&url)
        .header("content-type", "application/json");
    for (name, value) in signature::sign(scheme, &body, &secret, clock::now_ms() / 1000) {
        request = request.header(name, value);
    }
    let response = request
        .body(body)
        .send()
        .await
        .with_context(|| format!("posting to {url}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    println!("{} {text}", status.as_u16());
    if !status.is_success() {
        bail!("server answered {status}");
    }
    Ok(())
}
