//! Every HTTP answer inhook gives, in one place (SPEC §2 "Answers").

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::contract::FieldProblem;
use crate::domain::{DeadReason, EventId};
use crate::signature::SignatureError;
use crate::store::DedupKey;

/// Seconds a publisher is asked to wait before retrying after a 503.
const RETRY_AFTER_UNAVAILABLE_S: u32 = 5;

/// An answer, before it becomes a response.
#[derive(Debug)]
pub enum Answer {
    /// Sync mode: applied.
    Applied {
        /// The event's sequence.
        sequence: i64,
    },
    /// Async mode, or a sync event held for a gap: logged, to be applied later.
    Accepted {
        /// The event's id.
        event_id: EventId,
    },
    /// Already logged under this `event_id` or `idempotency_key`.
    Duplicate {
        /// The id of this delivery.
        event_id: EventId,
        /// Which key matched.
        key: DedupKey,
    },
    /// Sync mode: older than the current state.
    Stale {
        /// The event's sequence.
        sequence: i64,
        /// The aggregate's current sequence.
        current_sequence: Option<i64>,
    },
    /// Sync mode: logged, but an unsupported event type.
    Unsupported {
        /// The event's id.
        event_id: EventId,
    },
    /// Sync mode: logged, but the projection refused it.
    Dead {
        /// The event's id.
        event_id: EventId,
        /// Why.
        reason: DeadReason,
    },
    /// 401: signature or timestamp rejected.
    SignatureRejected(SignatureError),
    /// 400: body is not JSON or breaks the contract.
    InvalidPayload(Vec<FieldProblem>),
    /// 404: no such source.
    UnknownSource,
    /// 413: body over the limit.
    PayloadTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// 415: not `application/json`.
    UnsupportedMediaType,
    /// 503: the store cannot be reached; nothing was stored.
    StoreUnavailable,
    /// 429: the source's backlog is over `max_backlog`; nothing was stored.
    BacklogFull,
    /// 429: the source sends faster than its `rate_limit_per_s`; nothing was stored.
    RateLimited {
        /// Whole seconds until a delivery would be accepted (at least 1).
        retry_after_s: u64,
    },
    /// 500: a bug; details are in the log, not in the answer.
    Internal,
    /// 401 on the admin API.
    Unauthorized,
    /// 404 on the read API.
    NotFound(&'static str),
    /// 400 on the read API.
    BadRequest(String),
}

impl Answer {
    /// The decision name for logs and metrics.
    pub fn decision(&self) -> &'static str {
        match self {
            Answer::Applied { .. } => "applied",
            Answer::Accepted { .. } => "accepted",
            Answer::Duplicate { .. } => "duplicate",
            Answer::Stale { .. } => "stale",
            Answer::Unsupported { .. } => "ignored_unsupported",
            Answer::Dead { .. } => "dead",
            Answer::SignatureRejected(_) => "signature_rejected",
            Answer::InvalidPayload(_) => "invalid_payload",
            Answer::UnknownSource => "unknown_source",
            Answer::PayloadTooLarge { .. } => "payload_too_large",
            Answer::UnsupportedMediaType => "unsupported_media_type",
            Answer::StoreUnavailable => "store_unavailable",
            Answer::BacklogFull => "backlog_full",
            Answer::RateLimited { .. } => "rate_limited",
            Answer::Internal => "internal_error",
            Answer::Unauthorized => "unauthorized",
            Answer::NotFound(_) => "not_found",
            Answer::BadRequest(_) => "bad_request",
        }
    }

    /// Whether the delivery was refused before it reached the event log.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            Answer::PayloadTooLarge { .. }
                | Answer::UnsupportedMediaType
                | Answer::StoreUnavailable
                | Answer::Internal
        )
    }
}

/// An answer asking the publisher to come back after `seconds`.
fn retry_after(code: StatusCode, body: Value, seconds: u64) -> Response {
    let mut response = (code, Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

fn rejected(code: StatusCode, error: &str) -> (StatusCode, Value) {
    (code, json!({"status": "rejected", "error": error}))
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let (code, body) = match self {
            Answer::Applied { sequence } => (
                StatusCode::OK,
                json!({"status": "applied", "sequence": sequence}),
            ),
            Answer::Accepted { event_id } => (
                StatusCode::ACCEPTED,
                json!({"status": "accepted", "event_id": event_id}),
            ),
            Answer::Duplicate { event_id, key } => (
                StatusCode::OK,
                json!({"status": "duplicate", "event_id": event_id, "key": key.as_str()}),
            ),
            Answer::Stale {
                sequence,
                current_sequence,
            } => (
                StatusCode::OK,
                json!({"status": "stale", "sequence": sequence, "current_sequence": current_sequence}),
            ),
            Answer::Unsupported { event_id } => (
                StatusCode::OK,
                json!({"status": "ignored_unsupported", "event_id": event_id}),
            ),
            Answer::Dead { event_id, reason } => (
                StatusCode::OK,
                json!({"status": "dead", "event_id": event_id, "reason": reason.as_str()}),
            ),
            Answer::SignatureRejected(err) => rejected(StatusCode::UNAUTHORIZED, err.code()),
            Answer::InvalidPayload(details) => (
                StatusCode::BAD_REQUEST,
                json!({"status": "rejected", "error": "invalid_payload", "details": details}),
            ),
            Answer::UnknownSource => rejected(StatusCode::NOT_FOUND, "unknown_source"),
            Answer::PayloadTooLarge { limit } => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"status": "rejected", "error": "payload_too_large", "limit_bytes": limit}),
            ),
            Answer::UnsupportedMediaType => (
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                json!({"status": "rejected", "error": "unsupported_media_type",
                       "expected": "application/json"}),
            ),
            Answer::StoreUnavailable => {
                let body = json!({"status": "error", "error": "store_unavailable"});
                return retry_after(
                    StatusCode::SERVICE_UNAVAILABLE,
                    body,
                    RETRY_AFTER_UNAVAILABLE_S.into(),
                );
            }
            Answer::BacklogFull => {
                let body = json!({"status": "rejected", "error": "backlog_full"});
                return retry_after(
                    StatusCode::TOO_MANY_REQUESTS,
                    body,
                    RETRY_AFTER_UNAVAILABLE_S.into(),
                );
            }
            Answer::RateLimited { retry_after_s } => {
                let body = json!({"status": "rejected", "error": "rate_limited"});
                return retry_after(StatusCode::TOO_MANY_REQUESTS, body, retry_after_s);
            }
            Answer::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                json!({"status": "error", "error": "internal"}),
            ),
            Answer::Unauthorized => rejected(StatusCode::UNAUTHORIZED, "unauthorized"),
            Answer::NotFound(what) => rejected(StatusCode::NOT_FOUND, what),
            Answer::BadRequest(detail) => (
                StatusCode::BAD_REQUEST,
                json!({"status": "rejected", "error": "bad_request", "detail": detail}),
            ),
        };
        (code, Json(body)).into_response()
    }
}
