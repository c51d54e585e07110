//! Every HTTP answer inhook gives, in one place (docs/contract.md, answers).

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::domain::contract::FieldProblem;
use crate::domain::{DeadReason, EventId};
use crate::ingress::signature::SignatureError;
use crate::store::{DedupKey, StoreError};

/// Seconds a publisher is asked to wait before retrying after a 503.
const RETRY_AFTER_UNAVAILABLE_S: u32 = 5;
/// Seconds to wait after a refusal that only lasts while other requests finish.
const RETRY_AFTER_BUSY_S: u64 = 1;

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
    /// Sync mode: logged, but an unsupported event type; or a `json` source's type
    /// outside its `event_types` (logged, decided at once, when its id could be read).
    Unsupported {
        /// The event's id.
        event_id: Option<EventId>,
    },
    /// Sync mode: logged, but the projection refused it.
    Dead {
        /// The event's id.
        event_id: EventId,
        /// Why.
        reason: DeadReason,
    },
    /// A batch (`batch = true`) logged whole: each element's answer, in order.
    Batch {
        /// Each element's answer, as a single delivery's body.
        events: Vec<DeliveryBody>,
    },
    /// 400: an element of a batch breaks the contract; nothing of the batch was stored.
    InvalidBatchElement {
        /// The element's index in the array, from 0.
        index: usize,
        /// Its bad fields.
        problems: Vec<FieldProblem>,
    },
    /// 200: a verified handshake answered at once; never stored nor forwarded
    /// (docs/contract.md, handshakes).
    SnsConfirmed {
        /// The handshake, as counted in `inhook_handshakes_total{kind}`.
        kind: &'static str,
    },
    /// 200: a verified delivery that is no event (an SNS `UnsubscribeConfirmation`): never stored.
    NotStored {
        /// Why, a stable code.
        reason: &'static str,
    },
    /// 502: a request inhook makes for the delivery failed (an SNS certificate, a
    /// subscription confirmation); nothing was stored, the publisher retries.
    UpstreamFailed {
        /// `certificate_unavailable` or `subscription_confirmation_failed`.
        error: &'static str,
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
    /// 408: the body did not arrive within `body_read_timeout_s`.
    RequestTimeout,
    /// 415: not `application/json`.
    UnsupportedMediaType {
        /// The media type the source takes, shown as `expected`.
        expected: &'static str,
    },
    /// 503: the store cannot be reached; nothing was stored.
    StoreUnavailable,
    /// 503: the request bodies being read at once already fill `max_buffered_body_bytes`; nothing was stored.
    BodyBudgetFull,
    /// 503: every core is busy with costly signature checks (ed25519, lists); nothing was stored.
    VerificationBusy,
    /// 429: the source's backlog is over `max_backlog`; nothing was stored.
    BacklogFull,
    /// 429: the aggregate has `max_held_per_aggregate` events waiting ahead of a gap; nothing was stored.
    AggregateBacklogFull,
    /// 429: the source sends faster than its `rate_limit_per_s`; nothing was stored.
    RateLimited {
        /// Whole seconds until a delivery would be accepted (at least 1).
        retry_after_s: u64,
    },
    /// 503: this node already serves `max_streams` change streams.
    TooManyStreams,
    /// 500: a bug; details are in the log, not in the answer.
    Internal,
    /// 500: a stored value that does not decrypt (docs/encryption.md); that row alone.
    Undecryptable,
    /// 401 on the admin API, saying why (never echoing the token).
    Unauthorized(&'static str),
    /// 429 on the admin API: this peer sent too many wrong tokens in a row and must wait.
    TooManyWrongTokens {
        /// Whole seconds until a token of this peer is compared again (at least 1).
        retry_after_s: u64,
    },
    /// 403 on the admin API: a foreign `Host` (DNS rebinding) or a cross-site `Origin` (CSRF);
    /// on ingress, a client outside the source's `allow_ips`, or an SNS topic outside its
    /// `sns_topic_arns`.
    Forbidden {
        /// `forbidden_host`, `forbidden_origin`, `forbidden_peer` or `forbidden_topic`.
        error: &'static str,
        /// What was refused and why.
        detail: &'static str,
    },
    /// 404 on the read API.
    NotFound(&'static str),
    /// 400 on the read API.
    BadRequest(String),
    /// 422 on a reload: the config does not load.
    InvalidConfig(String),
    /// 200: a publisher's endpoint handshake answered (docs/contract.md, handshakes); nothing
    /// stored nor forwarded.
    Handshake(crate::ingress::handshake::Reply),
    /// 400: a handshake whose value cannot be echoed, or a `GET` that is no handshake.
    InvalidHandshake(String),
    /// 405: a `GET` on a source whose handshake is not answered to a `GET` (or that has none).
    MethodNotAllowed,
    /// 409 on the admin API: the resource's state forbids the change.
    Conflict {
        /// A stable code, e.g. `not_replayable`.
        error: &'static str,
        /// Why, naming the state that forbids it.
        detail: String,
    },
}

impl Answer {
    /// 403 on ingress: the client address is not in the source's `allow_ips`.
    pub const FORBIDDEN_PEER: Answer = Answer::Forbidden {
        error: "forbidden_peer",
        detail: "this source accepts deliveries only from the addresses in its allow_ips",
    };

    /// 403 on ingress: the SNS message's `TopicArn` is not in the source's `sns_topic_arns`
    /// (refused before any certificate is fetched; never confirmed nor stored).
    pub const FORBIDDEN_TOPIC: Answer = Answer::Forbidden {
        error: "forbidden_topic",
        detail: "this source takes SNS messages only from the topics in its sns_topic_arns",
    };

    /// The decision name for logs and metrics.
    pub fn decision(&self) -> &'static str {
        match self {
            Answer::Applied { .. } => "applied",
            Answer::Accepted { .. } => "accepted",
            Answer::Duplicate { .. } => "duplicate",
            Answer::Stale { .. } => "stale",
            Answer::Unsupported { .. } => "ignored_unsupported",
            Answer::Dead { .. } => "dead",
            Answer::Batch { .. } => "batch",
            Answer::InvalidBatchElement { .. } => "invalid_payload",
            Answer::SnsConfirmed { .. } => "handshake",
            Answer::NotStored { .. } => "not_stored",
            Answer::UpstreamFailed { error } => error,
            Answer::SignatureRejected(_) => "signature_rejected",
            Answer::InvalidPayload(_) => "invalid_payload",
            Answer::UnknownSource => "unknown_source",
            Answer::PayloadTooLarge { .. } => "payload_too_large",
            Answer::RequestTimeout => "request_timeout",
            Answer::UnsupportedMediaType { .. } => "unsupported_media_type",
            Answer::StoreUnavailable => "store_unavailable",
            Answer::BodyBudgetFull => "server_busy",
            Answer::VerificationBusy => "verification_busy",
            Answer::BacklogFull => "backlog_full",
            Answer::AggregateBacklogFull => "aggregate_backlog_full",
            Answer::RateLimited { .. } => "rate_limited",
            Answer::TooManyStreams => "too_many_streams",
            Answer::Internal => "internal_error",
            Answer::Undecryptable => "undecryptable",
            Answer::Unauthorized(_) => "unauthorized",
            Answer::TooManyWrongTokens { .. } => "too_many_wrong_tokens",
            Answer::Forbidden { error, .. } => error,
            Answer::NotFound(_) => "not_found",
            Answer::BadRequest(_) => "bad_request",
            Answer::InvalidConfig(_) => "invalid_config",
            Answer::Conflict { .. } => "conflict",
            Answer::Handshake(_) => "handshake",
            Answer::InvalidHandshake(_) => "invalid_handshake",
            Answer::MethodNotAllowed => "method_not_allowed",
        }
    }

    /// Whether the delivery is logged (or was already): the 2xx answers a source's own
    /// `response` replaces (docs/configuration.md, `response`).
    pub fn is_logged_delivery(&self) -> bool {
        matches!(
            self,
            Answer::Applied { .. }
                | Answer::Accepted { .. }
                | Answer::Duplicate { .. }
                | Answer::Stale { .. }
                | Answer::Unsupported { .. }
                | Answer::Dead { .. }
                | Answer::Batch { .. }
        )
    }

    /// A single delivery's answer as its status code and body; `None` for any other answer.
    pub fn delivery_body(self) -> Option<(StatusCode, DeliveryBody)> {
        Some(match self {
            Answer::Applied { sequence } => (StatusCode::OK, DeliveryBody::Applied { sequence }),
            Answer::Accepted { event_id } => (
                StatusCode::ACCEPTED,
                DeliveryBody::Accepted {
                    event_id: event_id.to_string(),
                },
            ),
            Answer::Duplicate { event_id, key } => (
                StatusCode::OK,
                DeliveryBody::Duplicate {
                    event_id: event_id.to_string(),
                    key: key.as_str().to_owned(),
                },
            ),
            Answer::Stale {
                sequence,
                current_sequence,
            } => (
                StatusCode::OK,
                DeliveryBody::Stale {
                    sequence,
                    current_sequence,
                },
            ),
            Answer::Unsupported { event_id } => (
                StatusCode::OK,
                DeliveryBody::IgnoredUnsupported {
                    event_id: event_id.map(|id| id.to_string()),
                },
            ),
            Answer::Dead { event_id, reason } => (
                StatusCode::OK,
                DeliveryBody::Dead {
                    event_id: event_id.to_string(),
                    reason,
                },
            ),
            _ => return None,
        })
    }

    /// How the figures over time count this answer to a delivery (docs/api.md, stats): a
    /// refusal by its `error` code.
    pub fn counted(&self) -> crate::operations::stats::Answered<'static> {
        use crate::operations::stats::Answered;
        match self {
            Answer::Duplicate { .. } => Answered::Logged {
                accepted: 0,
                duplicate: 1,
            },
            Answer::Batch { events } => {
                let duplicate = events
                    .iter()
                    .filter(|e| matches!(e, DeliveryBody::Duplicate { .. }))
                    .count() as u64;
                Answered::Logged {
                    accepted: events.len() as u64 - duplicate,
                    duplicate,
                }
            }
            answer if answer.is_logged_delivery() => Answered::Logged {
                accepted: 1,
                duplicate: 0,
            },
            Answer::SnsConfirmed { .. } | Answer::NotStored { .. } | Answer::Handshake(_) => {
                Answered::Other
            }
            Answer::SignatureRejected(err) => Answered::Rejected(err.code()),
            answer => Answered::Rejected(answer.decision()),
        }
    }

    /// Whether the delivery was refused before it reached the event log.
    pub fn is_rejection(&self) -> bool {
        matches!(
            self,
            Answer::PayloadTooLarge { .. }
                | Answer::RequestTimeout
                | Answer::UnsupportedMediaType { .. }
                | Answer::StoreUnavailable
                | Answer::BodyBudgetFull
                | Answer::VerificationBusy
                | Answer::UpstreamFailed { .. }
                | Answer::Internal
                | Answer::InvalidHandshake(_)
        )
    }
}

/// The body of an ingress answer that logged (or had logged) the delivery: `status` says which.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum DeliveryBody {
    /// Sync mode: applied to the state.
    Applied {
        /// The event's sequence.
        sequence: i64,
    },
    /// Logged; applied later (async mode, or a sync event held for a gap).
    Accepted {
        /// The event's id.
        event_id: String,
    },
    /// Already logged under this `event_id` or `idempotency_key`: nothing changed.
    Duplicate {
        /// The id of this delivery.
        event_id: String,
        /// Which key matched: `event_id` or `idempotency_key`.
        key: String,
    },
    /// Sync mode: older than the current state; logged, not applied.
    Stale {
        /// The event's sequence.
        sequence: i64,
        /// The aggregate's current sequence.
        current_sequence: Option<i64>,
    },
    /// Sync mode: logged, but of an event type this source does not apply; or a type
    /// outside a `json` source's `event_types`, not logged.
    IgnoredUnsupported {
        /// The event's id (absent when a type outside `event_types` had no readable id).
        #[serde(skip_serializing_if = "Option::is_none")]
        event_id: Option<String>,
    },
    /// Sync mode: logged, but the projection refused it; retrying will not help.
    Dead {
        /// The event's id.
        event_id: String,
        /// Why (docs/contract.md, processing).
        reason: DeadReason,
    },
    /// A handshake answered at once: not stored, not forwarded.
    Handshake {
        /// Which handshake, e.g. `aws-sns`.
        handshake: String,
    },
    /// A verified delivery that is no event (an SNS `UnsubscribeConfirmation`): not stored.
    NotStored {
        /// Why, e.g. `unsubscribe_confirmation`.
        reason: String,
    },
}

/// The answer to a batch (`batch = true`) logged whole (docs/contract.md, batches).
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchBody {
    /// Always `batch`.
    #[schema(example = "batch")]
    pub status: &'static str,
    /// Elements newly logged by this delivery.
    pub logged: usize,
    /// Elements already logged (`duplicate`).
    pub duplicates: usize,
    /// Each element's answer, in the array's order, as a single delivery's.
    pub events: Vec<DeliveryBody>,
}

impl BatchBody {
    /// The body of a batch whose elements were answered `events`.
    pub fn of(events: Vec<DeliveryBody>) -> Self {
        let duplicates = events
            .iter()
            .filter(|e| matches!(e, DeliveryBody::Duplicate { .. }))
            .count();
        let unlogged = events
            .iter()
            .filter(|e| matches!(e, DeliveryBody::IgnoredUnsupported { event_id: None }))
            .count();
        Self {
            status: "batch",
            logged: events.len() - duplicates - unlogged,
            duplicates,
            events,
        }
    }
}

/// What ingress answers a delivery it logged, for the OpenAPI document: one delivery's
/// body, a batch source's, or a handshake's JSON answer.
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Only its OpenAPI description is used; answers are built from [`Answer`].
pub(super) enum IngressBody {
    /// A single delivery.
    One(DeliveryBody),
    /// A batch source's delivery.
    Batch(BatchBody),
    /// A handshake's answer.
    Handshake(HandshakeBody),
}

/// Whether an error answer refused the request or failed on inhook's side.
#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorStatus {
    /// The request was refused; nothing was stored.
    Rejected,
    /// inhook could not serve it; nothing was stored.
    Error,
}

/// The body of every 4xx and 5xx answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// `rejected` for the caller's errors, `error` for inhook's.
    pub status: ErrorStatus,
    /// A stable code, e.g. `invalid_signature`, `invalid_payload`, `unknown_source`.
    pub error: String,
    /// Each bad field of an `invalid_payload` body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Vec<FieldProblem>>,
    /// What was wrong with a read API request.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The body limit a `payload_too_large` body broke.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_bytes: Option<usize>,
    /// The media type expected by an `unsupported_media_type` answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<String>,
    /// The index (from 0) of the batch element an `invalid_payload` answer is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

impl ErrorBody {
    fn new(status: ErrorStatus, error: &str) -> Self {
        Self {
            status,
            error: error.to_owned(),
            details: None,
            detail: None,
            limit_bytes: None,
            expected: None,
            index: None,
        }
    }

    /// A refusal with only its code.
    pub fn rejected(error: &str) -> Self {
        Self::new(ErrorStatus::Rejected, error)
    }
}

/// The failures every admin API call can answer, for the OpenAPI document.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)] // Only its OpenAPI description is used; answers are built from [`Answer`].
pub(super) enum AdminFailures {
    /// Bad query string, path or URL (`bad_request`)
    #[response(status = 400)]
    BadRequest(ErrorBody),
    /// `unauthorized`: admin token missing or wrong; or, with no `admin_token`, not a direct
    /// loopback client (a `Forwarded`, `X-Forwarded-For` or `X-Real-IP` header means a proxy)
    #[response(status = 401)]
    Unauthorized(ErrorBody),
    /// `forbidden_host`: with no `admin_token`, a `Host` other than localhost, 127.0.0.1 or [::1]
    /// (DNS rebinding); `forbidden_origin`: a state-changing call whose `Origin` is not this server
    #[response(status = 403)]
    Forbidden(ErrorBody),
    /// `too_many_wrong_tokens`: this address sent too many wrong admin tokens in a row; no
    /// token of it is compared until `Retry-After` has passed
    #[response(status = 429, headers(("Retry-After" = u32, description = "Seconds to wait")))]
    TooManyWrongTokens(ErrorBody),
    /// The store cannot be reached (`store_unavailable`)
    #[response(status = 503, headers(("Retry-After" = u32, description = "Seconds to wait")))]
    StoreUnavailable(ErrorBody),
}

/// An answer asking the publisher to come back after `seconds`.
fn retry_after(code: StatusCode, body: ErrorBody, seconds: u64) -> Response {
    let mut response = (code, Json(body)).into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    response
}

/// A read or admin call the store failed: 503 when it cannot be reached, else a
/// 500 whose detail goes to the log, never to the caller.
impl From<StoreError> for Answer {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Unavailable(_) => Answer::StoreUnavailable,
            StoreError::Undecryptable(err) => {
                tracing::error!(detail = %err, "a stored value does not decrypt");
                Answer::Undecryptable
            }
            err => {
                tracing::error!(detail = %err, "store failed on a read");
                Answer::Internal
            }
        }
    }
}

impl From<crate::domain::kind::CorruptState> for Answer {
    fn from(err: crate::domain::kind::CorruptState) -> Self {
        tracing::error!(detail = %err, "a stored state its kind cannot read");
        Answer::Internal
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        let delivery = |code: StatusCode, body: DeliveryBody| (code, Json(body)).into_response();
        let error = |code: StatusCode, body: ErrorBody| (code, Json(body)).into_response();
        match self {
            answer @ (Answer::Applied { .. }
            | Answer::Accepted { .. }
            | Answer::Duplicate { .. }
            | Answer::Stale { .. }
            | Answer::Unsupported { .. }
            | Answer::Dead { .. }) => match answer.delivery_body() {
                Some((code, body)) => delivery(code, body),
                None => unreachable!("every variant matched has a delivery body"),
            },
            Answer::Batch { events } => {
                // 202 while any element waits to be applied; 200 when every one is decided
                // (sync mode) or was logged before.
                let later = events
                    .iter()
                    .any(|e| matches!(e, DeliveryBody::Accepted { .. }));
                let code = if later {
                    StatusCode::ACCEPTED
                } else {
                    StatusCode::OK
                };
                (code, Json(BatchBody::of(events))).into_response()
            }
            Answer::InvalidBatchElement { index, problems } => error(
                StatusCode::BAD_REQUEST,
                ErrorBody {
                    index: Some(index),
                    details: Some(problems),
                    ..ErrorBody::rejected("invalid_payload")
                },
            ),
            Answer::SnsConfirmed { kind } => delivery(
                StatusCode::OK,
                DeliveryBody::Handshake {
                    handshake: kind.to_owned(),
                },
            ),
            Answer::NotStored { reason } => delivery(
                StatusCode::OK,
                DeliveryBody::NotStored {
                    reason: reason.to_owned(),
                },
            ),
            Answer::UpstreamFailed { error: code } => error(
                StatusCode::BAD_GATEWAY,
                ErrorBody::new(ErrorStatus::Error, code),
            ),
            // A refusal of fixed text (an SNS URL outside `sns_cert_hosts`) says why; the
            // others name only their code, as they always have.
            Answer::SignatureRejected(err @ SignatureError::Rejected { .. }) => error(
                StatusCode::UNAUTHORIZED,
                ErrorBody {
                    detail: Some(err.to_string()),
                    ..ErrorBody::rejected(err.code())
                },
            ),
            Answer::SignatureRejected(err) => {
                error(StatusCode::UNAUTHORIZED, ErrorBody::rejected(err.code()))
            }
            Answer::InvalidPayload(details) => error(
                StatusCode::BAD_REQUEST,
                ErrorBody {
                    details: Some(details),
                    ..ErrorBody::rejected("invalid_payload")
                },
            ),
            Answer::UnknownSource => {
                error(StatusCode::NOT_FOUND, ErrorBody::rejected("unknown_source"))
            }
            Answer::PayloadTooLarge { limit } => error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorBody {
                    limit_bytes: Some(limit),
                    ..ErrorBody::rejected("payload_too_large")
                },
            ),
            Answer::RequestTimeout => {
                let mut response = error(
                    StatusCode::REQUEST_TIMEOUT,
                    ErrorBody::rejected("request_timeout"),
                );
                // The rest of a body that stalled may still come: do not read it as a next request.
                response
                    .headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                response
            }
            Answer::UnsupportedMediaType { expected } => error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorBody {
                    expected: Some(expected.into()),
                    ..ErrorBody::rejected("unsupported_media_type")
                },
            ),
            Answer::StoreUnavailable => retry_after(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorBody::new(ErrorStatus::Error, "store_unavailable"),
                RETRY_AFTER_UNAVAILABLE_S.into(),
            ),
            Answer::BodyBudgetFull => retry_after(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorBody::new(ErrorStatus::Error, "server_busy"),
                RETRY_AFTER_BUSY_S,
            ),
            Answer::VerificationBusy => retry_after(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorBody::new(ErrorStatus::Error, "verification_busy"),
                // The checks ahead of it take milliseconds: a core frees up soon.
                RETRY_AFTER_BUSY_S,
            ),
            Answer::BacklogFull => retry_after(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorBody::rejected("backlog_full"),
                RETRY_AFTER_UNAVAILABLE_S.into(),
            ),
            Answer::AggregateBacklogFull => retry_after(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorBody::rejected("aggregate_backlog_full"),
                RETRY_AFTER_UNAVAILABLE_S.into(),
            ),
            Answer::RateLimited { retry_after_s } => retry_after(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorBody::rejected("rate_limited"),
                retry_after_s,
            ),
            Answer::TooManyStreams => retry_after(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorBody::new(ErrorStatus::Error, "too_many_streams"),
                RETRY_AFTER_UNAVAILABLE_S.into(),
            ),
            Answer::Internal => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorBody::new(ErrorStatus::Error, "internal"),
            ),
            Answer::Undecryptable => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorBody::new(ErrorStatus::Error, "undecryptable"),
            ),
            Answer::TooManyWrongTokens { retry_after_s } => retry_after(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorBody {
                    detail: Some(
                        "too many wrong admin tokens from this address: wait, then try again"
                            .into(),
                    ),
                    ..ErrorBody::rejected("too_many_wrong_tokens")
                },
                retry_after_s,
            ),
            Answer::Unauthorized(detail) => error(
                StatusCode::UNAUTHORIZED,
                ErrorBody {
                    detail: Some(detail.into()),
                    ..ErrorBody::rejected("unauthorized")
                },
            ),
            Answer::Forbidden {
                error: code,
                detail,
            } => error(
                StatusCode::FORBIDDEN,
                ErrorBody {
                    detail: Some(detail.into()),
                    ..ErrorBody::rejected(code)
                },
            ),
            Answer::NotFound(what) => error(StatusCode::NOT_FOUND, ErrorBody::rejected(what)),
            Answer::BadRequest(detail) => error(
                StatusCode::BAD_REQUEST,
                ErrorBody {
                    detail: Some(detail),
                    ..ErrorBody::rejected("bad_request")
                },
            ),
            Answer::InvalidConfig(detail) => error(
                StatusCode::UNPROCESSABLE_ENTITY,
                ErrorBody {
                    detail: Some(detail),
                    ..ErrorBody::rejected("invalid_config")
                },
            ),
            Answer::Handshake(reply) => handshake(reply),
            Answer::InvalidHandshake(detail) => {
                let mut response = error(
                    StatusCode::BAD_REQUEST,
                    ErrorBody {
                        detail: Some(detail),
                        ..ErrorBody::rejected("invalid_handshake")
                    },
                );
                response.headers_mut().insert(
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                );
                response
            }
            // As the router answers a method it does not route: no body, `Allow` says what is.
            Answer::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                [(header::ALLOW, HeaderValue::from_static("POST"))],
            )
                .into_response(),
            Answer::Conflict {
                error: code,
                detail,
            } => error(
                StatusCode::CONFLICT,
                ErrorBody {
                    detail: Some(detail),
                    ..ErrorBody::rejected(code)
                },
            ),
        }
    }
}

/// A handshake's 200: its exact bytes, as text or JSON, never sniffed as anything else.
fn handshake(reply: crate::ingress::handshake::Reply) -> Response {
    (
        StatusCode::OK,
        [
            (
                header::CONTENT_TYPE,
                HeaderValue::from_static(reply.content_type.header_value()),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
        ],
        reply.body,
    )
        .into_response()
}

/// The body of a handshake's JSON answer (docs/contract.md, handshakes), for the OpenAPI
/// document; the answer itself is built by [`crate::ingress::handshake`].
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Only its OpenAPI description is used.
pub enum HandshakeBody {
    /// Slack's `url_verification`.
    Challenge {
        /// The body's challenge.
        challenge: String,
    },
    /// Zoom's `endpoint.url_validation`.
    Zoom {
        /// The body's `payload.plainToken`.
        #[serde(rename = "plainToken")]
        plain_token: String,
        /// Hex HMAC-SHA256 of the plain token with the secret that verified the request.
        #[serde(rename = "encryptedToken")]
        encrypted_token: String,
    },
    /// Discord's PING: `{"type":1}`.
    Ping {
        /// Always 1.
        #[serde(rename = "type")]
        kind: u8,
    },
    /// X's CRC.
    Crc {
        /// `sha256=` and the base64 HMAC-SHA256 of `crc_token` with the source's first secret.
        response_token: String,
    },
    /// Okta's verification.
    Okta {
        /// The `X-Okta-Verification-Challenge` header.
        verification: String,
    },
}

/// The answer written straight to a connection refused before HTTP is spoken on it
/// (its peer holds `max_connections_per_peer` already): 429 `too_many_connections`.
/// Built once: a flood of refused connections writes the same bytes every time.
pub fn too_many_connections() -> &'static [u8] {
    static ANSWER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    ANSWER.get_or_init(|| {
        let body =
            serde_json::to_vec(&ErrorBody::rejected("too_many_connections")).unwrap_or_default();
        let mut answer = format!(
            "HTTP/1.1 429 Too Many Requests\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nretry-after: {RETRY_AFTER_BUSY_S}\r\nconnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        answer.extend_from_slice(&body);
        answer
    })
}

/// hyper answers a request it cannot parse itself, with an empty body: 400, 414, or 431
/// (head over `max_header_bytes` or too many headers). Given the bytes hyper is about to
/// write, returns that answer with the JSON body every other answer carries instead
/// (`bad_request`, `uri_too_long`, `headers_too_large`); `None` for anything else.
pub fn with_json_body(hyper_answer: &[u8]) -> Option<Vec<u8>> {
    // Cheap first: this sees every write of every connection.
    if hyper_answer.len() > 512 || !hyper_answer.starts_with(b"HTTP/1.1 4") {
        return None;
    }
    let head = std::str::from_utf8(hyper_answer).ok()?;
    let code = match head.get(..13)? {
        "HTTP/1.1 400 " => "bad_request",
        "HTTP/1.1 414 " => "uri_too_long",
        "HTTP/1.1 431 " => "headers_too_large",
        _ => return None,
    };
    let lines = head.strip_suffix("\r\n\r\n")?;
    // Only hyper's own answer: a head with an empty body and nothing after it.
    if !lines
        .split("\r\n")
        .any(|line| line.eq_ignore_ascii_case("content-length: 0"))
        || lines.contains("\r\n\r\n")
    {
        return None;
    }
    let body = serde_json::to_vec(&ErrorBody::rejected(code)).ok()?;
    let mut answer = String::with_capacity(head.len() + 96);
    for line in lines.split("\r\n") {
        let name = line.split(':').next().unwrap_or_default();
        if !(name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("connection"))
        {
            answer.push_str(line);
            answer.push_str("\r\n");
        }
    }
    answer.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    ));
    let mut answer = answer.into_bytes();
    answer.extend_from_slice(&body);
    Some(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hyper_parse_error_answers_get_a_json_body() {
        let hyper_431 =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Mon, 30 Nov 2026 21:00:00 GMT\r\n\r\n";
        let answer = String::from_utf8(with_json_body(hyper_431).unwrap()).unwrap();
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 "), "{answer}");
        assert!(head.contains("\r\ndate: Mon"), "{answer}");
        assert!(
            head.contains(&format!("\r\ncontent-length: {}", body.len())),
            "{answer}"
        );
        assert!(!head.contains("content-length: 0"), "{answer}");
        let body: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["status"], "rejected");
        assert_eq!(body["error"], "headers_too_large");
    }

    #[test]
    fn answers_with_a_body_or_other_codes_pass_untouched() {
        for written in [
            &b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 2\r\n\r\n{}"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 405 Method Not Allowed\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 10\r\n\r\n",
            b"{\"status\":\"rejected\"}",
        ] {
            assert!(with_json_body(written).is_none(), "{written:?}");
        }
    }
}
