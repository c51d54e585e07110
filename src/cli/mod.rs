//! The command line (docs/api.md, command line), one module per command. `main.rs` only parses
//! and calls [`run`].

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::domain::{AggregateKey, AggregateKeyProblem, EventStatus};

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
    #[cfg(feature = "tools")]
    Simulate(crate::tools::simulate::SimulateArgs),
    /// Load generator: signed events flat out or at a fixed rate; throughput and latency.
    #[cfg(feature = "tools")]
    Bench(crate::tools::bench::BenchArgs),
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
        #[cfg(feature = "tools")]
        Command::Simulate(args) => crate::tools::simulate::run(cli.config, args).await,
        #[cfg(feature = "tools")]
        Command::Bench(args) => crate::tools::bench::run(cli.config, args).await,
        Command::Verify(args) => verify::verify(cli.config.as_deref(), args),
        Command::Keygen(args) => keygen::keygen(args),
        Command::Deliveries(args) => deliveries::deliveries(cli.config.as_deref(), args).await,
        Command::Listen(args) => listen::listen(args).await,
        Command::Presets(args) => presets::presets(args),
    }
}
