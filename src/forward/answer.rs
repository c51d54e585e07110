//! What an attempt's result means (docs/contract.md, forwarding): a 2xx is delivered; anything
//! else, a timeout or a connection error is retried with the destination's backoff and jitter
//! ([`RetryPolicy`], shared with event processing), a `Retry-After` on 429 or 503
//! honoured up to `retry_max_delay_s`; after `max_attempts` requests in all the
//! delivery is dead with its last status or error.

use time::format_description::well_known::Rfc2822;
use time::OffsetDateTime;

use crate::retry::{NextStep, RetryPolicy};

use super::queue::DeliveryStatus;

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The application answered.
    Answered {
        /// The HTTP status.
        status: u16,
        /// The `Retry-After` header, as sent.
        retry_after: Option<String>,
    },
    /// No answer within `timeout_s`.
    TimedOut {
        /// The timeout, in seconds.
        after_s: u64,
    },
    /// No connection, or it broke (the sender's description, without the URL).
    ConnectionFailed(String),
}

impl AttemptResult {
    /// The outcome label of `inhook_forward_attempts_total{outcome}`.
    pub fn outcome_label(&self) -> &'static str {
        match self {
            AttemptResult::Answered { status, .. } if (200..300).contains(status) => "delivered",
            AttemptResult::Answered { status: 429, .. } => "throttled",
            AttemptResult::Answered { status, .. } if *status >= 500 => "server_error",
            AttemptResult::Answered { .. } => "refused",
            AttemptResult::TimedOut { .. } => "timeout",
            AttemptResult::ConnectionFailed(_) => "connection_error",
        }
    }

    /// Whether the failure says the destination is down or overloaded (a connection
    /// error, a timeout, a 5xx or a 429): only those open the circuit.
    pub fn counts_against_circuit(&self) -> bool {
        match self {
            AttemptResult::Answered { status, .. } => *status == 429 || *status >= 500,
            AttemptResult::TimedOut { .. } | AttemptResult::ConnectionFailed(_) => true,
        }
    }

    /// The attempt as a person reads it in the attempt history and `last_error`.
    pub fn describe(&self) -> String {
        match self {
            AttemptResult::Answered { status, .. } => format!("HTTP {status}"),
            AttemptResult::TimedOut { after_s } => format!("no answer within {after_s} s"),
            AttemptResult::ConnectionFailed(problem) => format!("connection failed: {problem}"),
        }
    }
}

/// What follows an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Answered 2xx: delivered.
    Delivered,
    /// Try again at this time (unix milliseconds); `error` describes the failure.
    RetryAt {
        /// When the next attempt is due.
        at_ms: i64,
        /// The failed attempt, as [`AttemptResult::describe`] says it.
        error: String,
    },
    /// `max_attempts` requests failed: dead with the last failure.
    Dead {
        /// The last attempt, as [`AttemptResult::describe`] says it.
        error: String,
    },
}

impl Verdict {
    /// The delivery's status afterwards.
    pub fn status(&self) -> DeliveryStatus {
        match self {
            Verdict::Delivered => DeliveryStatus::Delivered,
            Verdict::RetryAt { .. } => DeliveryStatus::Retrying,
            Verdict::Dead { .. } => DeliveryStatus::Dead,
        }
    }
}

/// One attempt of a delivery's history, as stored and shown (`GET …/deliveries`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AttemptRecord {
    /// The attempt's number since the delivery was written or last replayed (the first is 1).
    pub attempt: u32,
    /// When the request went, unix milliseconds.
    pub at_ms: i64,
    /// How long until the answer or the failure, in milliseconds.
    pub duration_ms: i64,
    /// The HTTP status, when the application answered.
    pub status: Option<u16>,
    /// The attempt as [`AttemptResult::describe`] says it.
    pub result: String,
}

impl AttemptRecord {
    /// The record of attempt `attempt`, sent at `at_ms`, that ended with `result` after `duration_ms`.
    pub fn new(attempt: u32, at_ms: i64, duration_ms: i64, result: &AttemptResult) -> Self {
        Self {
            attempt,
            at_ms,
            duration_ms,
            status: match result {
                AttemptResult::Answered { status, .. } => Some(*status),
                _ => None,
            },
            result: result.describe(),
        }
    }
}

/// The delay a `Retry-After` value asks for, in milliseconds from `now_ms`: whole
/// seconds, or an HTTP date (RFC 9110); a date in the past asks for none.
pub fn retry_after_ms(raw: &str, now_ms: i64) -> Option<i64> {
    let raw = raw.trim();
    if !raw.is_empty() && raw.bytes().all(|b| b.is_ascii_digit()) {
        return Some(
            raw.parse::<i64>()
                .unwrap_or(i64::MAX / 1000)
                .saturating_mul(1000),
        );
    }
    let at = OffsetDateTime::parse(raw, &Rfc2822).ok()?;
    let at_ms = (at.unix_timestamp_nanos() / 1_000_000) as i64;
    Some(at_ms.saturating_sub(now_ms).max(0))
}

/// The verdict on attempt number `attempt` (the first is 1) that ended with `result` at
/// `now_ms`; `jitter` in `[0, 1)` is the caller's random draw.
pub fn judge(
    result: &AttemptResult,
    attempt: u32,
    policy: &RetryPolicy,
    now_ms: i64,
    jitter: f64,
) -> Verdict {
    if let AttemptResult::Answered { status, .. } = result {
        if (200..300).contains(status) {
            return Verdict::Delivered;
        }
    }
    let error = result.describe();
    let backoff = match policy.after_failure(attempt, jitter) {
        NextStep::GiveUp => return Verdict::Dead { error },
        NextStep::RetryIn(ms) => ms,
    };
    let asked = match result {
        AttemptResult::Answered {
            status: 429 | 503,
            retry_after: Some(raw),
        } => retry_after_ms(raw, now_ms),
        _ => None,
    };
    // The application's own pause replaces the backoff (shorter or longer), capped so that
    // a Retry-After of a day never parks the aggregate beyond retry_max_delay_s.
    let delay = asked.map_or(backoff, |ms| ms.min(policy.max_delay_ms));
    Verdict::RetryAt {
        at_ms: now_ms.saturating_add(delay),
        error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        base_ms: 1_000,
        max_delay_ms: 60_000,
        max_attempts: 3,
    };

    fn answered(status: u16, retry_after: Option<&str>) -> AttemptResult {
        AttemptResult::Answered {
            status,
            retry_after: retry_after.map(str::to_owned),
        }
    }

    #[test]
    fn two_hundreds_deliver_and_failures_back_off_then_die_with_the_last_error() {
        assert_eq!(
            judge(&answered(204, None), 3, &POLICY, 0, 0.0),
            Verdict::Delivered
        );
        assert_eq!(
            judge(&answered(500, None), 1, &POLICY, 10_000, 0.0),
            Verdict::RetryAt {
                at_ms: 11_000,
                error: "HTTP 500".into()
            }
        );
        assert_eq!(
            judge(&AttemptResult::TimedOut { after_s: 10 }, 2, &POLICY, 0, 0.0),
            Verdict::RetryAt {
                at_ms: 2_000,
                error: "no answer within 10 s".into()
            }
        );
        let refused = AttemptResult::ConnectionFailed("connection refused".into());
        assert_eq!(
            judge(&refused, 3, &POLICY, 0, 0.0),
            Verdict::Dead {
                error: "connection failed: connection refused".into()
            }
        );
        assert_eq!(
            judge(&answered(301, None), 3, &POLICY, 0, 0.0),
            Verdict::Dead {
                error: "HTTP 301".into()
            },
            "a redirect is not a delivery"
        );
        let Verdict::RetryAt { at_ms, .. } = judge(&answered(502, None), 2, &POLICY, 0, 0.99)
        else {
            panic!("a retry");
        };
        assert!((2_000..2_500).contains(&at_ms), "{at_ms}");
    }

    #[test]
    fn retry_after_on_429_or_503_is_honoured_up_to_the_cap() {
        let at = |result: &AttemptResult| match judge(result, 1, &POLICY, 1_000, 0.0) {
            Verdict::RetryAt { at_ms, .. } => at_ms,
            other => panic!("{other:?}"),
        };
        assert_eq!(at(&answered(429, Some("30"))), 31_000);
        assert_eq!(at(&answered(503, Some("0"))), 1_000);
        assert_eq!(
            at(&answered(429, Some("86400"))),
            61_000,
            "capped at retry_max_delay_s"
        );
        assert_eq!(
            at(&answered(500, Some("30"))),
            2_000,
            "only 429 and 503 ask"
        );
        assert_eq!(
            at(&answered(429, Some("soon"))),
            2_000,
            "unreadable: the backoff"
        );
        assert_eq!(
            judge(&answered(429, Some("5")), 3, &POLICY, 0, 0.0),
            Verdict::Dead {
                error: "HTTP 429".into()
            },
            "max_attempts counts every request"
        );
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now_ms = 784_111_777_000; // Sun, 06 Nov 1994 08:49:37 GMT
        assert_eq!(retry_after_ms("120", now_ms), Some(120_000));
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:50:37 GMT", now_ms),
            Some(60_000)
        );
        assert_eq!(
            retry_after_ms("Sun, 06 Nov 1994 08:00:00 GMT", now_ms),
            Some(0)
        );
        assert_eq!(retry_after_ms("-5", now_ms), None);
        assert_eq!(retry_after_ms("", now_ms), None);
        assert_eq!(
            retry_after_ms("99999999999999999999", now_ms).map(|ms| ms > 0),
            Some(true)
        );
    }

    #[test]
    fn a_verdict_sets_the_status_and_an_attempt_is_recorded_as_said() {
        assert_eq!(Verdict::Delivered.status(), DeliveryStatus::Delivered);
        let retry = judge(&answered(500, None), 1, &POLICY, 0, 0.0);
        assert_eq!(retry.status(), DeliveryStatus::Retrying);
        let dead = judge(&answered(500, None), 3, &POLICY, 0, 0.0);
        assert_eq!(dead.status(), DeliveryStatus::Dead);
        let record = AttemptRecord::new(2, 5_000, 120, &answered(503, Some("1")));
        assert_eq!(
            (record.status, record.result.as_str()),
            (Some(503), "HTTP 503")
        );
        let timeout =
            AttemptRecord::new(3, 9_000, 10_000, &AttemptResult::TimedOut { after_s: 10 });
        assert_eq!(
            (timeout.status, timeout.result.as_str()),
            (None, "no answer within 10 s")
        );
    }

    #[test]
    fn outcomes_are_labelled_for_the_metric() {
        assert_eq!(answered(200, None).outcome_label(), "delivered");
        assert_eq!(answered(429, None).outcome_label(), "throttled");
        assert_eq!(answered(503, None).outcome_label(), "server_error");
        assert_eq!(answered(404, None).outcome_label(), "refused");
        assert_eq!(
            AttemptResult::TimedOut { after_s: 1 }.outcome_label(),
            "timeout"
        );
    }
}
