//! Rate-limited log lines: a noisy condition (accept errors, refused peers) that a
//! flood can trigger thousands of times a second writes at most one line per
//! interval, saying how many it left out, so the log cannot become the next bottleneck.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often a repeated warning (connection-level or per-delivery refusals) is logged at most.
pub const NOISY_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Lets one log line through per `interval` and counts the ones it holds back.
#[derive(Debug)]
pub struct LogThrottle {
    interval: Duration,
    state: Mutex<Window>,
}

#[derive(Debug, Default)]
struct Window {
    last_written: Option<Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// A throttle writing at most one line per `interval`.
    pub const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new(Window {
                last_written: None,
                suppressed: 0,
            }),
        }
    }

    /// `Some(lines held back since the last one written)` when a line may be written now.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    /// [`Self::admit`] at a given instant.
    pub fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut window = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let due = window
            .last_written
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if due {
            window.last_written = Some(now);
            Some(std::mem::take(&mut window.suppressed))
        } else {
            window.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let throttle = LogThrottle::new(Duration::from_secs(10));
        let start = Instant::now();
        assert_eq!(throttle.admit_at(start), Some(0));
        for i in 1..=5 {
            assert_eq!(throttle.admit_at(start + Duration::from_secs(i)), None);
        }
        assert_eq!(
            throttle.admit_at(start + Duration::from_secs(10)),
            Some(5),
            "the next line says how many were left out"
        );
        assert_eq!(throttle.admit_at(start + Duration::from_secs(11)), None);
        assert_eq!(throttle.admit_at(start + Duration::from_secs(25)), Some(1));
    }
}
