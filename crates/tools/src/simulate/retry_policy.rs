//! The publisher's retry policy: which answers it retries and how long it
//! waits. Pure; the caller supplies the random draw.

use std::time::Duration;

/// Whether a publisher tries again after this answer code.
pub(super) fn is_retryable(code: u16) -> bool {
    matches!(code, 409 | 429) || (500..=599).contains(&code)
}

/// How long to wait before attempt `attempt + 1` when the server gave no `Retry-After`:
/// exponential from 50 ms, capped at 1 s, with full jitter.
pub(super) fn backoff(attempt: u32, jitter: f64) -> Duration {
    let ceiling_ms = (50u64 << attempt.min(5)).min(1_000);
    Duration::from_millis((ceiling_ms as f64 * jitter.clamp(0.0, 1.0)) as u64 + 10)
}

/// A `Retry-After` in whole seconds (the form inhook sends), capped at `cap`.
pub(super) fn retry_after(raw: Option<&str>, cap: Duration) -> Option<Duration> {
    let seconds: u64 = raw?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_follow_the_publisher_policy() {
        for code in [409, 429, 500, 503] {
            assert!(is_retryable(code), "{code}");
        }
        for code in [400, 401, 404, 413, 415] {
            assert!(!is_retryable(code), "{code}");
        }
        let cap = Duration::from_secs(2);
        assert_eq!(retry_after(Some("1"), cap), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(Some("30"), cap), Some(cap));
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), cap),
            None
        );
        assert!(backoff(20, 1.0) <= Duration::from_millis(1_010));
        assert!(backoff(0, 1.0) < backoff(3, 1.0));
    }

    #[test]
    fn backoff_grows_to_its_cap_and_keeps_a_floor() {
        assert_eq!(backoff(0, 0.0), Duration::from_millis(10));
        assert_eq!(backoff(0, 1.0), Duration::from_millis(60));
        assert_eq!(backoff(4, 1.0), Duration::from_millis(810));
        assert_eq!(backoff(5, 1.0), Duration::from_millis(1_010));
        assert_eq!(
            backoff(30, 1.0),
            backoff(5, 1.0),
            "no overflow past the cap"
        );
        assert_eq!(backoff(2, 7.0), backoff(2, 1.0), "the draw is clamped");
        assert_eq!(retry_after(None, Duration::from_secs(2)), None);
        assert_eq!(
            retry_after(Some(" 0 "), Duration::from_secs(2)),
            Some(Duration::ZERO)
        );
    }
}
