//! The command line (docs/api.md, command line), one module per command. `main.rs` only parses
//! and calls [`run`].

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use inhook::config::Config;
use inhook::domain::{AggregateKey, AggregateKeyProblem, EventStatus};

mod deliveries;
mod events;
mod keygen;
mod keys;
mod listen;
mod presets;
mod replay;
mod reset;
mod send;
mod serve;
mod verify;

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
    #[command(after_help = SERVE_HELP)]
    Serve,
    /// Create or upgrade the schema, then exit.
    Migrate,
    /// Sign a JSON file with a source's scheme and POST it.
    Send(send::SendArgs),
    /// List the event log.
    Events(events::EventsArgs),
    /// Replay dead or retrying events: one by id, or in bulk by filter (a persisted job).
    Replay(replay::ReplayArgs),
    /// Chaos publisher: duplicates, reordering, retries; then checks the state.
    Simulate(inhook_tools::simulate::SimulateArgs),
    /// Load generator: signed events flat out or at a fixed rate; throughput and latency.
    Bench(inhook_tools::bench::BenchArgs),
    /// Check a saved delivery offline against a source's secrets; exit 0 if it verifies.
    Verify(verify::VerifyArgs),
    /// Print a new random secret in a scheme's format.
    Keygen(keygen::KeygenArgs),
    /// Rewrap every data key under the first encryption key (`--encrypt-existing`: also
    /// seal the rows written before encryption was on); resumable, safe while serving.
    Rekey(keys::RekeyArgs),
    /// Erase one aggregate on request: its bodies, headers and state, for good.
    Forget(keys::ForgetArgs),
    /// Reset one aggregate's state and version on request, so that its next event applies
    /// (a publisher sent a version far ahead); its events stay in the log.
    Reset(reset::ResetArgs),
    /// List a destination's deliveries.
    Deliveries(deliveries::DeliveriesArgs),
    /// A local endpoint for development: verifies forwarded requests and prints them.
    Listen(listen::ListenArgs),
    /// List the publishers' presets, or print one as a [[sources]] table to paste.
    Presets(presets::PresetsArgs),
}

/// What `inhook serve --help` adds after its options: what a first run needs to know
/// (docs/configuration.md, environment variables; docs/api.md, authentication).
const SERVE_HELP: &str = "\
Defaults (no config file): listen on 127.0.0.1:8080, store in ./inhook.db (embedded SQLite,
created and migrated on start), and two sources: `presence` (secret from
INHOOK_PRESENCE_SECRET) and `save-game` (INHOOK_SAVE_GAME_SECRET). A missing secret is a
startup error naming its variable.

Environment variables (each overrides the config file's key):
  INHOOK_CONFIG                  the config file, as --config
  INHOOK_LISTEN                  listen (default 127.0.0.1:8080)
  INHOOK_DATABASE                database: sqlite://FILE (default sqlite://inhook.db) or
                                 postgres://USER[:PASSWORD]@HOST[:PORT]/DB
  INHOOK_ADMIN_TOKEN             admin_token: the bearer token of /v1/*, /metrics and the dashboard
  INHOOK_ADMIN_OPEN_TO_LOOPBACK  admin_open_to_loopback (true|false)
  INHOOK_<NAME>_SECRET           the secrets of source <NAME> (upper-cased, - as _), comma-separated
  INHOOK_<NAME>_PUBLIC_KEYS      the public keys of an ed25519 or ecdsa-p256 source
  INHOOK_DEST_<NAME>_SECRET      the signing secret of destination <NAME>
  INHOOK_DEST_<NAME>_URL         the url of destination <NAME> (a broker's credentials go here)
  INHOOK_ENCRYPTION_KEYS         [encryption] keys: id:BASE64,… (the first wraps new data keys)
  INHOOK_PUBLIC_URL              public_url: the base URL publishers call (for {url} schemes)
  INHOOK_LOG                     log filter (default info), e.g. inhook=debug
  INHOOK_LOG_FORMAT              log_format (text|json)
  INHOOK_OTLP_ENDPOINT           otlp_endpoint: export traces over OTLP/HTTP

Admin token: with admin_token set (at least 16 bytes; `openssl rand -hex 24`), /v1/* and the
dashboard take it as `Authorization: Bearer TOKEN`. Unset, serve makes a random token for
this run and prints it once on standard output (never in the log), with a dashboard link
that logs in with it; set it to keep one across restarts.

The start-up lines name the store in use and the address bound. Everything else:
docs/configuration.md and docs/api.md in the repository.";

/// A command-line value that is none of those its option takes. clap prints only the
/// words, after the value given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}: expected one of {expected}")]
pub(crate) struct UnknownValue {
    /// What the option names (`status`).
    what: &'static str,
    /// The value given.
    given: String,
    /// The values it may take, comma-separated.
    expected: String,
}

impl UnknownValue {
    /// `given` is no `what`: one of `expected` was.
    pub(crate) fn new<'a>(
        what: &'static str,
        given: &str,
        expected: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        Self {
            what,
            given: given.to_owned(),
            expected: expected.into_iter().collect::<Vec<_>>().join(", "),
        }
    }
}

/// An `--aggregate` that is not an aggregate key in text form; the problem is the reason
/// itself, not an error under it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("aggregate {0}")]
pub(crate) struct BadAggregate(AggregateKeyProblem);

/// A `--status` value, refused with the statuses it may be.
fn parse_status(raw: &str) -> Result<EventStatus, UnknownValue> {
    EventStatus::parse(raw)
        .ok_or_else(|| UnknownValue::new("status", raw, EventStatus::ALL.map(EventStatus::as_str)))
}

/// An `--aggregate` in text form (docs/contract.md, json sources), refused with the reason when
/// malformed.
pub(crate) fn parse_aggregate(raw: &str) -> Result<AggregateKey, BadAggregate> {
    AggregateKey::parse_text(raw).map_err(BadAggregate)
}

/// Runs a parsed command line.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve => serve::serve(Config::load(cli.config.as_deref())?).await,
        Command::Events(args) => events::events(cli.config, args).await,
        Command::Replay(args) => replay::replay(cli.config, args).await,
        Command::Rekey(args) => keys::rekey(cli.config, args).await,
        Command::Forget(args) => keys::forget(cli.config, args).await,
        Command::Reset(args) => reset::reset(cli.config, args).await,
        Command::Migrate => serve::migrate(cli.config.as_deref()).await,
        Command::Send(args) => send::send(cli.config, args).await,
        Command::Simulate(args) => inhook_tools::simulate::run(cli.config, args).await,
        Command::Bench(args) => inhook_tools::bench::run(cli.config, args).await,
        Command::Verify(args) => verify::verify(cli.config.as_deref(), args),
        Command::Keygen(args) => keygen::keygen(args),
        Command::Deliveries(args) => deliveries::deliveries(cli.config.as_deref(), args).await,
        Command::Listen(args) => listen::listen(args).await,
        Command::Presets(args) => presets::presets(args),
    }
}
