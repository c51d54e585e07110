//! The processing section (docs/configuration.md, top-level keys): the workers and how they
//! retry, retention of the log and its figures, shutdown, and forwarding's idle poll.

use super::section::{file_section, section};
use crate::domain::retry::RetryPolicy;

const MINUTE_S: u64 = 60;
const HOUR_S: u64 = 60 * MINUTE_S;
const DAY_S: u64 = 24 * HOUR_S;

/// `forward_poll_ms`: a second; a safety net only, as commits and due retries wake a sender.
pub const FORWARD_POLL_MS: u64 = 1_000;

file_section! {
    /// The processing section's keys as the file gives them.
    pub(super) struct FileProcessing {
        workers: usize,
        retry_base_s: u64,
        retry_max_delay_s: u64,
        max_attempts: u32,
        retention_s: u64,
        dedup_window_s: u64,
        purge_interval_s: u64,
        stats_retention_days: u64,
        shutdown_timeout_s: u64,
        forward_poll_ms: u64,
    }
}

section! {
    /// How events are processed, retried and kept, and how long shutdown waits.
    #[derive(Debug, Clone)]
    pub struct Processing {
        /// Aggregates processed in parallel.
        pub workers: usize => restart,
        /// How failed processing is retried; also every destination's unless it sets its own.
        pub retry: RetryPolicy => restart(
            max_attempts: "max_attempts",
            base_ms: "retry_base_s",
            max_delay_ms: "retry_max_delay_s",
        ),
        /// Decided events older than this are purged from the log.
        pub retention_s: u64 => restart,
        /// Dedup keys are kept this long after their event's receipt.
        pub dedup_window_s: u64 => restart,
        /// How often the retention task runs.
        pub purge_interval_s: u64 => restart,
        /// Figures over time older than this many days are pruned (docs/api.md, stats).
        pub stats_retention_days: u64 => restart,
        /// How long shutdown waits for in-flight requests and steps.
        pub shutdown_timeout_s: u64 => restart,
        /// How long an idle sender waits before looking for due deliveries unasked: a safety
        /// net, since commits that write deliveries and retries falling due wake it.
        pub forward_poll_ms: u64 => restart,
    }
}

/// Seconds as the milliseconds a [`RetryPolicy`] holds.
fn ms(s: u64) -> i64 {
    (s as i64).saturating_mul(1000)
}

impl Default for Processing {
    /// The built-in defaults.
    fn default() -> Self {
        Self {
            // Four aggregates processed in parallel, a small machine's cores.
            workers: 4,
            retry: RetryPolicy {
                // The first retry after a second, quick enough for a passing fault.
                base_ms: ms(1),
                // At most five minutes between attempts, so a recovery is seen soon.
                max_delay_ms: ms(5 * MINUTE_S),
                // Eight attempts, the first included, span about two minutes of backoff.
                max_attempts: 8,
            },
            // Thirty days of decided events, time to notice and replay a problem.
            retention_s: 30 * DAY_S,
            // Thirty days, longer than publishers keep retrying a delivery.
            dedup_window_s: 30 * DAY_S,
            // Hourly, so the log never grows far past `retention_s`.
            purge_interval_s: HOUR_S,
            // Two weeks of figures per minute, enough to compare a week with the last.
            stats_retention_days: 14,
            // Within the grace a supervisor usually gives before killing.
            shutdown_timeout_s: 10,
            forward_poll_ms: FORWARD_POLL_MS,
        }
    }
}

impl Processing {
    /// Reads the section; nothing in it can be refused (0 workers, 0 attempts and a 0 ms
    /// poll are taken as 1).
    pub(super) fn resolve(file: FileProcessing) -> Self {
        let default = Self::default();
        Self {
            workers: file.workers.unwrap_or(default.workers).max(1),
            retry: RetryPolicy {
                base_ms: file.retry_base_s.map_or(default.retry.base_ms, ms),
                max_delay_ms: file
                    .retry_max_delay_s
                    .map_or(default.retry.max_delay_ms, ms),
                max_attempts: file
                    .max_attempts
                    .unwrap_or(default.retry.max_attempts)
                    .max(1),
            },
            retention_s: file.retention_s.unwrap_or(default.retention_s),
            dedup_window_s: file.dedup_window_s.unwrap_or(default.dedup_window_s),
            purge_interval_s: file.purge_interval_s.unwrap_or(default.purge_interval_s),
            stats_retention_days: file
                .stats_retention_days
                .unwrap_or(default.stats_retention_days),
            shutdown_timeout_s: file
                .shutdown_timeout_s
                .unwrap_or(default.shutdown_timeout_s),
            forward_poll_ms: file
                .forward_poll_ms
                .unwrap_or(default.forward_poll_ms)
                .max(1),
        }
    }
}
