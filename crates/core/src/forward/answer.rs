//! What an attempt's result means (docs/forwarding.md): a 2xx (or a broker's
//! confirm) is delivered; anything else, a timeout or a connection error is retried with the destination's backoff and jitter
//! ([`RetryPolicy`], shared with event processing), a `Retry-After` on 429 or 503
//! honoured up to `retry_max_delay_s`; after `max_attempts` requests in all the
//! delivery is dead with its last status or error.

use time::format_description::well_known::Rfc2822;
use time::OffsetDateTime;

use crate::domain::retry::{NextStep, RetryPolicy};

use super::queue::DeliveryStatus;

/// How one attempt ended, whatever the destination's type: each sink (docs/contract.md,
/// sinks) says it in these words, and the rules below judge it without knowing the type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptResult {
    /// The destination took the message durably: an HTTP 2xx, a JetStream PubAck, a
    /// publisher confirm, an `XADD` reply.
    Delivered {
        /// The HTTP status, for an HTTP destination.
        status: Option<u16>,
    },
    /// The destination answered without taking the message.
    Declined(Decline),
    /// No answer within `timeout_s`.
    TimedOut {
        /// The timeout, in seconds.
        after_s: u64,
    },
    /// No connection, or it broke (the sink's description, without the URL).
    ConnectionFailed(String),
}

/// An answer that did not take the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decline {
    /// What the answer says of the destination.
    pub kind: DeclineKind,
    /// The answer as a person reads it: `HTTP 500`, `no queue bound for the routing key`.
    pub reason: String,
    /// The HTTP status, for an HTTP destination.
    pub status: Option<u16>,
    /// The pause the destination asked for (an HTTP `Retry-After` on 429 or 503, as sent).
    pub retry_after: Option<String>,
}

/// What a declining answer says of the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclineKind {
    /// Up, but asking to slow down (HTTP 429): opens the circuit.
    Throttled,
    /// Down or failing (HTTP 5xx, a broker's negative acknowledgement): opens the circuit.
    ServerError,
    /// Up, and refusing this message (HTTP 4xx, a RabbitMQ message no queue is bound for):
    /// the message retries or dies on its own, the circuit stays closed.
    Refused,
}

impl AttemptResult {
    /// How an HTTP request ended that was answered with `status` and `retry_after`.
    pub fn http(status: u16, retry_after: Option<&str>) -> Self {
        if (200..300).contains(&status) {
            return AttemptResult::Delivered {
                status: Some(status),
            };
        }
        let kind = match status {
            429 => DeclineKind::Throttled,
            500.. => DeclineKind::ServerError,
            _ => DeclineKind::Refused,
        };
        AttemptResult::Declined(Decline {
            kind,
            reason: format!("HTTP {status}"),
            status: Some(status),
            retry_after: matches!(status, 429 | 503)
                .then_some(retry_after)
                .flatten()
                .map(str::to_owned),
        })
    }

    /// A broker's answer that it did not take the message, for `reason`.
    pub fn declined(kind: DeclineKind, reason: impl Into<String>) -> Self {
        AttemptResult::Declined(Decline {
            kind,
            reason: reason.into(),
            status: None,
            retry_after: None,
        })
    }

    /// The outcome label of `inhook_forward_attempts_total{outcome}`.
    pub fn outcome_label(&self) -> &'static str {
        match self {
            AttemptResult::Delivered { .. } => "delivered",
            AttemptResult::Declined(decline) => match decline.kind {
                DeclineKind::Throttled => "throttled",
                DeclineKind::ServerError => "server_error",
                DeclineKind::Refused => "refused",
            },
            AttemptResult::TimedOut { .. } => "timeout",
            AttemptResult::ConnectionFailed(_) => "connection_error",
        }
    }

    /// Whether the failure says the destination is down or overloaded (a connection
    /// error, a timeout, a 5xx or a 429, a broker's nack): only those open the circuit.
    pub fn counts_against_circuit(&self) -> bool {
        match self {
            AttemptResult::Delivered { .. } => false,
            AttemptResult::Declined(decline) => decline.kind != DeclineKind::Refused,
            AttemptResult::TimedOut { .. } | AttemptResult::ConnectionFailed(_) => true,
        }
    }

    /// The HTTP status of the answer, for an HTTP destination.
    pub fn status(&self) -> Option<u16> {
        match self {
            AttemptResult::Delivered { status } => *status,
            AttemptResult::Declined(decline) => decline.status,
            AttemptResult::TimedOut { .. } | AttemptResult::ConnectionFailed(_) => None,
        }
    }

    /// The attempt as a person reads it in the attempt history and `last_error`.
    pub fn describe(&self) -> String {
        match self {
            AttemptResult::Delivered {
                status: Some(status),
            } => format!("HTTP {status}"),
            AttemptResult::Delivered { status: None } => CONFIRMED.to_owned(),
            AttemptResult::Declined(decline) => decline.reason.clone(),
            AttemptResult::TimedOut { after_s } => format!("no answer within {after_s} s"),
            AttemptResult::ConnectionFailed(problem) => format!("connection failed: {problem}"),
        }
    }
}

/// How a confirmed publish into a broker (no HTTP status) is recorded: the store tells it
/// from a failure by this text, since such an attempt has no status to read.
pub const CONFIRMED: &str = "delivered";

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
            status: result.status(),
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
    if let AttemptResult::Delivered { .. } = result {
        return Verdict::Delivered;
    }
    let error = result.describe();
    let backoff = match policy.after_failure(attempt, jitter) {
        NextStep::GiveUp => return Verdict::Dead { error },
        NextStep::RetryIn(ms) => ms,
    };
    let asked = match result {
        AttemptResult::Declined(Decline {
            retry_after: Some(raw),
            ..
        }) => retry_after_ms(raw, now_ms),
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
        AttemptResult::http(status, retry_after)
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

    #[test]
    fn a_brokers_answer_is_judged_like_an_http_one_of_its_kind() {
        let confirmed = AttemptResult::Delivered { status: None };
        assert_eq!(judge(&confirmed, 1, &POLICY, 0, 0.0), Verdict::Delivered);
        assert_eq!(confirmed.describe(), "delivered");
        // The partial index of failed attempts (store/migrations.rs, version 16) names it.
        assert_eq!(CONFIRMED, "delivered");
        let nack = AttemptResult::declined(DeclineKind::ServerError, "the broker nacked it");
        assert!(nack.counts_against_circuit());
        assert_eq!(nack.outcome_label(), "server_error");
        assert_eq!(
            judge(&nack, 1, &POLICY, 0, 0.0),
            Verdict::RetryAt {
                at_ms: 1_000,
                error: "the broker nacked it".into()
            }
        );
        let unroutable = AttemptResult::declined(DeclineKind::Refused, "no queue is bound");
        assert!(!unroutable.counts_against_circuit(), "the broker is up");
        assert_eq!(unroutable.outcome_label(), "refused");
        let record = AttemptRecord::new(3, 0, 4, &unroutable);
        assert_eq!(
            (record.status, record.result.as_str()),
            (None, "no queue is bound")
        );
        assert_eq!(
            judge(&unroutable, 3, &POLICY, 0, 0.0),
            Verdict::Dead {
                error: "no queue is bound".into()
            }
        );
    }
}
