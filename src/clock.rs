//! Time in the units the event log stores. The server reads the system clock;
//! tests of retries and holds use a clock that follows Tokio's paused time.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in unix milliseconds, from the system clock.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Where "now" comes from.
#[derive(Debug, Clone, Copy)]
pub enum Clock {
    /// The system clock.
    System,
    /// A fixed start plus the time elapsed on Tokio's clock, which tests can pause and advance.
    Tokio {
        /// Unix milliseconds at `start`.
        base_ms: i64,
        /// The Tokio instant the clock started at.
        start: tokio::time::Instant,
    },
}

impl Clock {
    /// A clock that starts at `base_ms` and advances with Tokio's (possibly paused) time.
    pub fn tokio(base_ms: i64) -> Self {
        Clock::Tokio {
            base_ms,
            start: tokio::time::Instant::now(),
        }
    }

    /// Now, in unix milliseconds.
    pub fn now_ms(&self) -> i64 {
        match self {
            Clock::System => now_ms(),
            Clock::Tokio { base_ms, start } => base_ms + start.elapsed().as_millis() as i64,
        }
    }
}

/// Formats unix milliseconds as RFC 3339 (UTC).
pub fn rfc3339(ms: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}
