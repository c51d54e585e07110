//! The options of `inhook simulate`, and their check before anything is sent.

use anyhow::bail;

/// Arguments of `inhook simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Base URL of the inhook server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Events to generate, over all aggregates.
    #[arg(long, default_value_t = 10_000)]
    pub events: usize,
    /// Aggregates (presence users plus save slots, or a --source's) the events are spread
    /// over; an unordered --source gets one per event.
    #[arg(long, default_value_t = 200)]
    pub aggregates: usize,
    /// Share of the aggregates that are presence users; the rest are save slots.
    #[arg(long, default_value_t = 0.5)]
    pub presence_share: f64,
    /// Seed of the stream and the chaos plan; random (and printed) when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// How far (in events of one aggregate) a delivery may move from its place in sequence order.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Concurrent senders.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Probability that an event is delivered a second time (same `event_id`, or a new one with the same `idempotency_key`).
    #[arg(long, default_value_t = 0.2)]
    pub duplicate_rate: f64,
    /// Probability that a request is sent again while the first is in flight, as after a client timeout.
    #[arg(long, default_value_t = 0.05)]
    pub resend_rate: f64,
    /// Deliveries started per second; 0 sends as fast as the senders can.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Secret of the presence source; defaults to INHOOK_PRESENCE_SECRET, then --config.
    #[arg(long)]
    pub presence_secret: Option<String>,
    /// Secret of the save-game source; defaults to INHOOK_SAVE_GAME_SECRET, then --config.
    #[arg(long)]
    pub save_secret: Option<String>,
    /// A `json` source to simulate instead of the built-in ones: its bodies are built
    /// from its locations in --config, and its aggregates read back through
    /// `/v1/sources/{source}/aggregates/{key}`.
    #[arg(long)]
    pub source: Option<String>,
    /// Secret of the --source; defaults to INHOOK_<SOURCE>_SECRET, then --config.
    #[arg(long, requires = "source")]
    pub secret: Option<String>,
    /// How a latest-wins --source's sequences are written: integers, or RFC 3339
    /// timestamps with one-second ties.
    #[arg(long, value_enum, default_value = "integer")]
    pub sequence_format: super::json_body::SequenceFormat,
    /// Share of a --source's events given a type outside its `event_types` (each must be
    /// answered `200 ignored_unsupported`); none when it has no such list.
    #[arg(long, default_value_t = 0.1)]
    pub unsupported_share: f64,
    /// Name of the presence source to post to.
    #[arg(long, default_value = "presence")]
    pub presence_source: String,
    /// Name of the save-game source to post to.
    #[arg(long, default_value = "save-game")]
    pub save_source: String,
    /// Bearer token for the read API.
    #[arg(long, env = "INHOOK_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// How long to wait for the state read back to equal the expected state.
    #[arg(long, default_value_t = 60)]
    pub settle_timeout_s: u64,
    /// How long one delivery may keep being retried before it counts as failed.
    #[arg(long, default_value_t = 120)]
    pub give_up_after_s: u64,
    /// Longest `Retry-After` honoured; longer ones are cut to this.
    #[arg(long, default_value_t = 2)]
    pub max_retry_after_s: u64,
    /// Time after which a request with no answer is abandoned and retried.
    #[arg(long, default_value_t = 10_000)]
    pub request_timeout_ms: u64,
    /// A PEM file of CA certificates to trust besides the system's, for an `https://` --url.
    #[arg(long, env = "INHOOK_TLS_CA_FILE")]
    pub tls_ca_file: Option<std::path::PathBuf>,
}

impl SimulateArgs {
    /// Refuses options no run could honour, before any event is generated.
    pub(super) fn check(&self) -> anyhow::Result<()> {
        for (name, p) in [
            ("--duplicate-rate", self.duplicate_rate),
            ("--resend-rate", self.resend_rate),
            ("--presence-share", self.presence_share),
            ("--unsupported-share", self.unsupported_share),
        ] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{name} must be between 0 and 1, not {p}");
            }
        }
        if self.window == 0 || self.concurrency == 0 {
            bail!("--window and --concurrency must be at least 1");
        }
        if self.events > 0 && self.aggregates == 0 {
            bail!("--aggregates must be at least 1");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    /// `inhook simulate` alone, to parse its options as the command line does.
    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: SimulateArgs,
    }

    fn check(flags: &[&str]) -> anyhow::Result<()> {
        let argv = std::iter::once("simulate").chain(flags.iter().copied());
        Command::try_parse_from(argv)
            .expect("the flags parse")
            .args
            .check()
    }

    #[test]
    fn the_defaults_pass_and_impossible_options_are_refused_by_name() {
        check(&[]).expect("the defaults are a valid run");
        check(&["--events", "0", "--aggregates", "0"]).expect("nothing to send needs no aggregate");
        for (flags, says) in [
            (&["--duplicate-rate", "1.5"][..], "--duplicate-rate"),
            (&["--resend-rate=-0.1"][..], "--resend-rate"),
            (&["--presence-share", "2"][..], "--presence-share"),
            (&["--window", "0"][..], "--window"),
            (&["--concurrency", "0"][..], "--concurrency"),
            (&["--aggregates", "0"][..], "--aggregates"),
        ] {
            let err = check(flags).expect_err("refused").to_string();
            assert!(err.contains(says), "{flags:?}: {err}");
        }
    }
}
