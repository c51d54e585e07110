//! Replays: one event again, or a persisted bulk job by filter.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::ToSchema;

use super::aggregate_filter;
use super::extract::{Json, Path};
use crate::domain::clock;
use crate::domain::{AggregateKey, EventStatus};
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::store::{EventFilter, ReplayJob, ReplayOutcome};

/// What replaying one event did.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(crate) enum ReplayAnswer {
    /// Queued again: a worker applies it anew.
    Requeued {
        /// The source.
        source: String,
        /// The event.
        event_id: String,
    },
    /// Not dead or retrying, so left as it is.
    Unchanged {
        /// The source.
        source: String,
        /// The event.
        event_id: String,
        /// Its status, which replay does not change.
        event_status: EventStatus,
    },
}

/// Queues one dead or retrying event again (its signature is not checked again).
#[utoipa::path(post, path = "/v1/events/{source}/{event_id}/replay", tag = "events",
    security(("admin_token" = [])),
    params(("source" = String, Path, description = "The source", example = "presence"),
        ("event_id" = String, Path, description = "The event's id", example = "evt_1")),
    responses(
        (status = 200, description = "Not dead or retrying: unchanged", body = ReplayAnswer),
        (status = 202, description = "Requeued", body = ReplayAnswer),
        (status = 404, description = "`unknown_event`", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: a body that is not `application/json`",
            body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn event_replay(
    State(state): State<AppState>,
    Path((source, event_id)): Path<(String, String)>,
) -> Result<Response, Answer> {
    let outcome = state
        .store
        .replay_event(&source, &event_id, state.clock.now_ms())
        .await?;
    match outcome {
        ReplayOutcome::NotFound => Err(Answer::NotFound("unknown_event")),
        ReplayOutcome::Requeued => {
            state.wake.notify_one();
            Ok((
                StatusCode::ACCEPTED,
                axum::Json(ReplayAnswer::Requeued { source, event_id }),
            )
                .into_response())
        }
        ReplayOutcome::Unchanged(event_status) => Ok(axum::Json(ReplayAnswer::Unchanged {
            source,
            event_id,
            event_status,
        })
        .into_response()),
    }
}

/// Body of `POST /v1/replay`: which dead or retrying events to queue again.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayRequest {
    /// Only this source's events.
    source: Option<String>,
    /// `dead` or `retrying` (default: `dead`; retrying events are retried anyway).
    status: Option<Replayable>,
    /// Only this aggregate's events, in text form (docs/contract.md, json sources): a user id, or
    /// `player/slot`, with `%` and `/` inside an id written `%25` and `%2F`.
    aggregate: Option<String>,
    /// Only events received at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    received_after: Option<String>,
    /// Only events received before this time (RFC 3339).
    #[schema(format = DateTime)]
    received_before: Option<String>,
    /// Only the event of this id.
    event_id: Option<String>,
    /// Only events of this type, or of every type a `prefix*` pattern starts (`invoice.*`).
    #[serde(rename = "type")]
    #[schema(rename = "type", example = "invoice.*")]
    event_type: Option<String>,
    /// `/pointer=value` conditions, as `GET /v1/events` takes them (docs/api.md, search); each
    /// pointer must be in the source's `search_fields` (400 otherwise).
    #[serde(rename = "where", default)]
    #[schema(rename = "where", example = json!(["/data/object/customer=cus_123"]))]
    wheres: Vec<String>,
}

/// The statuses a bulk replay can take events from.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Replayable {
    /// Dead events.
    Dead,
    /// Events waiting for a retry.
    Retrying,
}

/// A bulk replay job.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ReplayJobView {
    /// Its id, for `GET /v1/replay/{job_id}`.
    job_id: i64,
    /// `running` or `done`.
    state: String,
    /// The filter it was started with.
    #[schema(value_type = Object)]
    filter: serde_json::Value,
    /// Events it covers.
    total: i64,
    /// Events queued again so far.
    requeued: i64,
    /// When it was started (RFC 3339).
    created_at: String,
    /// When it last advanced (RFC 3339).
    updated_at: String,
}

/// Unix milliseconds of an optional RFC 3339 `field`, or a 400 naming it.
pub(super) fn rfc3339_ms(field: &str, raw: Option<&str>) -> Result<Option<i64>, Answer> {
    use time::format_description::well_known::Rfc3339;
    raw.map(|raw| {
        time::OffsetDateTime::parse(raw, &Rfc3339)
            .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
            .map_err(|_| Answer::BadRequest(format!("{field} must be an RFC 3339 date-time")))
    })
    .transpose()
}

/// Starts a persisted bulk replay, carried out by the running nodes.
#[utoipa::path(post, path = "/v1/replay", tag = "events", security(("admin_token" = [])),
    request_body = ReplayRequest,
    responses(
        (status = 202, description = "Started", body = ReplayJobView),
        (status = 413, description = "`payload_too_large`: the body is over 64 KiB; nothing stored", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`: a body that is not `application/json`",
            body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn replay_bulk(
    State(state): State<AppState>,
    Json(request): Json<ReplayRequest>,
) -> Result<Response, Answer> {
    let texts = [&request.source, &request.aggregate, &request.event_id];
    if texts
        .iter()
        .any(|t| t.as_deref().is_some_and(|t| t.contains('\0')))
    {
        return Err(Answer::BadRequest(
            "source, aggregate and event_id cannot hold a NUL character".into(),
        ));
    }
    let status = request.status.map(|s| match s {
        Replayable::Dead => EventStatus::Dead,
        Replayable::Retrying => EventStatus::Retrying,
    });
    let wheres = request
        .wheres
        .iter()
        .map(|w| crate::domain::search::Where::parse(w))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Answer::BadRequest(e.to_string()))?;
    let (search, _) = super::search::resolve(
        &state.config,
        state.store.as_ref(),
        request.source.as_deref(),
        wheres,
        false,
    )
    .map_err(Answer::BadRequest)?;
    let filter = EventFilter {
        source: request.source,
        status,
        aggregate: aggregate_filter(request.aggregate.as_deref())?,
        received_from_ms: rfc3339_ms("received_after", request.received_after.as_deref())?,
        received_to_ms: rfc3339_ms("received_before", request.received_before.as_deref())?,
        event_id: request.event_id,
        event_type: request
            .event_type
            .as_deref()
            .map(crate::domain::search::TypePattern::parse)
            .transpose()
            .map_err(|e| Answer::BadRequest(e.to_string()))?,
        search,
    };
    let job = state
        .store
        .create_replay_job(&filter, state.clock.now_ms())
        .await?;
    state.wake.notify_one();
    Ok((StatusCode::ACCEPTED, axum::Json(job_json(&job))).into_response())
}

/// A bulk replay's progress.
#[utoipa::path(get, path = "/v1/replay/{job_id}", tag = "events", security(("admin_token" = [])),
    params(("job_id" = i64, Path, description = "The job's id", example = 1)),
    responses(
        (status = 200, description = "The job", body = ReplayJobView),
        (status = 404, description = "`unknown_job`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn replay_job(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Response, Answer> {
    let job = state
        .store
        .replay_job(id)
        .await?
        .ok_or(Answer::NotFound("unknown_job"))?;
    Ok(axum::Json(job_json(&job)).into_response())
}

/// A job as shown: its filter's aggregate in text form, as it was given.
fn job_json(job: &ReplayJob) -> ReplayJobView {
    let mut filter = json!(job.filter);
    if let Some(stored) = job.filter.aggregate.as_deref() {
        filter["aggregate"] = json!(AggregateKey::text_of_stored(stored));
    }
    ReplayJobView {
        job_id: job.id,
        state: job.state.clone(),
        filter,
        total: job.total,
        requeued: job.requeued,
        created_at: clock::rfc3339(job.created_at_ms),
        updated_at: clock::rfc3339(job.updated_at_ms),
    }
}
