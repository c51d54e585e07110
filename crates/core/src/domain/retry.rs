//! The retry schedule (docs/contract.md, processing; G6): exponential backoff with jitter, and
//! when to give up. Pure: the caller supplies the random draw.

/// How failed attempts are retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay after the first failed attempt, in milliseconds.
    pub base_ms: i64,
    /// Longest delay between attempts, in milliseconds.
    pub max_delay_ms: i64,
    /// Attempts before an event is dead with reason `exhausted`.
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    /// Base 1 s, cap 5 min, 8 attempts.
    fn default() -> Self {
        Self {
            base_ms: 1_000,
            max_delay_ms: 300_000,
            max_attempts: 8,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    /// Try again after this many milliseconds.
    RetryIn(i64),
    /// No attempts left.
    GiveUp,
}

impl RetryPolicy {
    /// The delay before the next attempt, without jitter, after `failed` attempts (1-based):
    /// `min(max_delay, base · 2^(failed-1))`.
    pub fn backoff_ms(&self, failed: u32) -> i64 {
        let doublings = failed.saturating_sub(1).min(62);
        self.base_ms
            .saturating_mul(1i64 << doublings)
            .min(self.max_delay_ms)
    }

    /// What follows `failed` attempts; `jitter` in `[0, 1)` adds up to a quarter of the delay,
    /// so that many events failing together do not retry in lockstep.
    pub fn after_failure(&self, failed: u32, jitter: f64) -> NextStep {
        if failed >= self.max_attempts {
            return NextStep::GiveUp;
        }
        let delay = self.backoff_ms(failed);
        let jitter = (delay as f64 / 4.0 * jitter.clamp(0.0, 1.0)) as i64;
        NextStep::RetryIn(delay + jitter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_then_give_up() {
        let policy = RetryPolicy::default();
        let delays: Vec<i64> = (1..=9).map(|n| policy.backoff_ms(n)).collect();
        assert_eq!(
            delays,
            [1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000]
        );
        assert_eq!(policy.backoff_ms(40), 300_000);
        assert_eq!(policy.after_failure(7, 0.0), NextStep::RetryIn(64_000));
        assert_eq!(policy.after_failure(8, 0.0), NextStep::GiveUp);
    }

    #[test]
    fn jitter_adds_at_most_a_quarter() {
        let policy = RetryPolicy::default();
        assert_eq!(policy.after_failure(3, 0.999_999), NextStep::RetryIn(4_999));
        assert_eq!(policy.after_failure(3, 7.0), NextStep::RetryIn(5_000));
    }
}
