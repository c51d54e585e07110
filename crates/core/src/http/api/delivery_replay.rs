//! Replaying and skipping a destination's deliveries (docs/forwarding.md): one at a time,
//! or a persisted bulk job by filter. What may be replayed is decided by
//! [`crate::forward::queue::replay`]; these routes only answer what it said.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::aggregate_filter;
use super::destinations::destination;
use super::extract::{Json, Path};
use crate::domain::clock;
use crate::domain::AggregateKey;
use crate::forward::queue::DeliveryStatus;
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::store::{DeliveryFilter, DeliveryReplay, DeliveryReplayJob, DeliverySkip};

/// What replaying or skipping one delivery did.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(crate) enum DeliveryChange {
    /// Back to `pending` with a fresh attempt budget; sent in its applied place.
    Requeued {
        /// The delivery.
        delivery_id: i64,
    },
    /// Not sent: a newer latest-wins delivery of its aggregate was already delivered.
    Superseded {
        /// The delivery.
        delivery_id: i64,
        /// The newer delivered one.
        superseded_by: i64,
    },
    /// Now `skipped`: never sent, and no longer blocking its aggregate.
    Skipped {
        /// The delivery.
        delivery_id: i64,
    },
}

/// Replays a dead or skipped delivery: requeued, or `superseded` when its aggregate
/// has since delivered a newer latest-wins event.
#[utoipa::path(post, path = "/v1/destinations/{name}/deliveries/{id}/replay", tag = "forwarding",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The destination", example = "app"),
        ("id" = i64, Path, description = "The delivery's id", example = 1)),
    responses(
        (status = 200, description = "`superseded`: not sent", body = DeliveryChange),
        (status = 202, description = "`requeued`", body = DeliveryChange),
        (status = 404, description = "`unknown_destination` or `unknown_delivery`", body = ErrorBody),
        (status = 409, description = "`not_replayable` (neither dead nor skipped) or `would_reorder` \
            (a later delivery of its in-order aggregate was already delivered)", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: a body that is not `application/json`",
            body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn delivery_replay(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, i64)>,
) -> Result<Response, Answer> {
    let destination = destination(&state, &name)?;
    match state.store.replay_delivery(&destination.name, id).await? {
        DeliveryReplay::NotFound => Err(Answer::NotFound("unknown_delivery")),
        DeliveryReplay::Requeued => {
            state.forward_wake.notify_one();
            Ok((
                StatusCode::ACCEPTED,
                axum::Json(DeliveryChange::Requeued { delivery_id: id }),
            )
                .into_response())
        }
        DeliveryReplay::Superseded { by } => Ok(axum::Json(DeliveryChange::Superseded {
            delivery_id: id,
            superseded_by: by,
        })
        .into_response()),
        DeliveryReplay::NotReplayable(status) => Err(Answer::Conflict {
            error: "not_replayable",
            detail: format!(
                "delivery {id} is {}; only dead or skipped deliveries are replayed",
                status.as_str()
            ),
        }),
        DeliveryReplay::WouldReorder { after } => Err(Answer::Conflict {
            error: "would_reorder",
            detail: format!(
                "delivery {after}, later in the same in-order aggregate, was already delivered or is on its way; \
                 sending {id} now would break the order"
            ),
        }),
    }
}

/// Skips a dead or retrying delivery: it is never sent, and a dead in-order one no
/// longer blocks its aggregate.
#[utoipa::path(post, path = "/v1/destinations/{name}/deliveries/{id}/skip", tag = "forwarding",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The destination", example = "app"),
        ("id" = i64, Path, description = "The delivery's id", example = 1)),
    responses(
        (status = 200, description = "`skipped`", body = DeliveryChange),
        (status = 404, description = "`unknown_destination` or `unknown_delivery`", body = ErrorBody),
        (status = 409, description = "`not_skippable`: neither dead nor retrying", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: a body that is not `application/json`",
            body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn delivery_skip(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, i64)>,
) -> Result<Response, Answer> {
    let destination = destination(&state, &name)?;
    match state.store.skip_delivery(&destination.name, id).await? {
        DeliverySkip::NotFound => Err(Answer::NotFound("unknown_delivery")),
        DeliverySkip::Skipped => {
            state.forward_wake.notify_one();
            Ok(axum::Json(DeliveryChange::Skipped { delivery_id: id }).into_response())
        }
        DeliverySkip::NotSkippable(status) => Err(Answer::Conflict {
            error: "not_skippable",
            detail: format!(
                "delivery {id} is {}; only dead or retrying deliveries are skipped",
                status.as_str()
            ),
        }),
    }
}

/// The statuses a bulk replay of deliveries takes them from.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ReplayableDelivery {
    /// Dead deliveries.
    Dead,
    /// Skipped deliveries.
    Skipped,
}

/// Body of `POST /v1/destinations/{name}/replay`: which deliveries to replay.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryReplayRequest {
    /// `dead` or `skipped` (default: `dead`).
    status: Option<ReplayableDelivery>,
    /// Only this aggregate's deliveries, in text form (docs/contract.md, json sources).
    aggregate: Option<String>,
}

/// A bulk replay of a destination's deliveries.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryReplayJobView {
    /// Its id, for `GET /v1/destinations/{name}/replay/{job_id}`.
    job_id: i64,
    /// The destination.
    destination: String,
    /// `running` or `done`.
    state: String,
    /// The status it replays.
    filter_status: &'static str,
    /// The aggregate it is limited to, in text form.
    filter_aggregate: Option<String>,
    /// Deliveries it covers.
    total: i64,
    /// Deliveries requeued so far (superseded and would-reorder ones are not).
    requeued: i64,
    /// When it was started (RFC 3339).
    created_at: String,
    /// When it last advanced (RFC 3339).
    updated_at: String,
}

fn job_view(job: &DeliveryReplayJob) -> DeliveryReplayJobView {
    DeliveryReplayJobView {
        job_id: job.id,
        destination: job.destination.clone(),
        state: job.state.clone(),
        filter_status: job.filter.status.unwrap_or(DeliveryStatus::Dead).as_str(),
        filter_aggregate: job
            .filter
            .aggregate
            .as_deref()
            .map(AggregateKey::text_of_stored),
        total: job.total,
        requeued: job.requeued,
        created_at: clock::rfc3339(job.created_at_ms),
        updated_at: clock::rfc3339(job.updated_at_ms),
    }
}

/// Starts a persisted bulk replay of a destination's dead (or skipped) deliveries,
/// carried out by the running senders in applied order.
#[utoipa::path(post, path = "/v1/destinations/{name}/replay", tag = "forwarding",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The destination", example = "app")),
    request_body = DeliveryReplayRequest,
    responses(
        (status = 202, description = "Started", body = DeliveryReplayJobView),
        (status = 404, description = "`unknown_destination`", body = ErrorBody),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB; nothing stored", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: a body that is not `application/json`",
            body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn destination_replay_bulk(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Json(request): Json<DeliveryReplayRequest>,
) -> Result<Response, Answer> {
    let destination = destination(&state, &name)?;
    let filter = DeliveryFilter {
        status: Some(match request.status {
            None | Some(ReplayableDelivery::Dead) => DeliveryStatus::Dead,
            Some(ReplayableDelivery::Skipped) => DeliveryStatus::Skipped,
        }),
        aggregate: aggregate_filter(request.aggregate.as_deref())?,
    };
    let job = state
        .store
        .create_delivery_replay_job(&destination.name, &filter, state.clock.now_ms())
        .await?;
    state.forward_wake.notify_one();
    Ok((StatusCode::ACCEPTED, axum::Json(job_view(&job))).into_response())
}

/// A bulk replay of deliveries' progress.
#[utoipa::path(get, path = "/v1/destinations/{name}/replay/{job_id}", tag = "forwarding",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The destination", example = "app"),
        ("job_id" = i64, Path, description = "The job's id", example = 1)),
    responses(
        (status = 200, description = "The job", body = DeliveryReplayJobView),
        (status = 404, description = "`unknown_destination` or `unknown_job`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn destination_replay_job(
    State(state): State<AppState>,
    Path((name, job_id)): Path<(String, i64)>,
) -> Result<Response, Answer> {
    let destination = destination(&state, &name)?;
    let job = state
        .store
        .delivery_replay_job(job_id)
        .await?
        .filter(|job| job.destination == destination.name)
        .ok_or(Answer::NotFound("unknown_job"))?;
    Ok(axum::Json(job_view(&job)).into_response())
}
