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

/// Milliseconds since the epoch as RFC 3339 in UTC with exactly three digits of fraction
/// (`2026-12-07T14:13:25.100Z`), so that a column of times keeps its width.
pub fn rfc3339_fixed(ms: i64) -> String {
    let Ok(t) = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000) else {
        return String::new();
    };
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    )
}

/// Milliseconds since the epoch as RFC 3339 in UTC, with only the digits of the fraction
/// that are not zero.
pub fn rfc3339(ms: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// Sleeps for `period`, or less when woken or told to stop.
pub(crate) async fn pause(
    shutdown: &mut tokio::sync::watch::Receiver<bool>,
    period: std::time::Duration,
    wake: Option<&tokio::sync::Notify>,
) {
    let woken = async {
        match wake {
            Some(wake) => wake.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::time::sleep(period) => {}
        _ = woken => {}
        _ = shutdown.changed() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_times_keep_their_width() {
        assert_eq!(rfc3339_fixed(1_796_649_298_100), "2026-12-07T13:14:58.100Z");
        assert_eq!(rfc3339_fixed(0), "1970-01-01T00:00:00.000Z");
        let widths: std::collections::HashSet<usize> = [0, 1, 10, 100, 999, 1_796_649_298_000]
            .into_iter()
            .map(|ms| rfc3339_fixed(ms).len())
            .collect();
        assert_eq!(widths.len(), 1, "{widths:?}");
    }
}
