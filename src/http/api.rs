//! The read API of SPEC §4 and the health probes.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::answer::{AdminFailures, Answer, ErrorBody};
use super::AppState;
use crate::clock;
use crate::config::SourceConfig;
use crate::contract::{Presence, SourceKind};
use crate::domain::EventStatus;
use crate::domain::{AggregateKey, Ident};
use crate::mask::{mask, mask_at, MASK};
use crate::projection::{presence_view, save_view, PresenceState, PresenceView, SaveView};
use crate::store::{EventFilter, EventRecord, ReplayJob, ReplayOutcome, StoreError};
use axum::http::StatusCode;

/// Most items one page may hold.
const MAX_PAGE: usize = 500;

/// The body of the health probes.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Health {
    /// `ok` (process up) or `ready` (store answers).
    status: &'static str,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Up", body = Health)))]
pub(super) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store answers.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready", body = Health),
    (status = 503, description = "The store cannot be reached", body = ErrorBody,
        headers(("Retry-After" = u32, description = "Seconds to wait"))),
))]
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    match state.store.ping().await {
        Ok(()) => Json(Health { status: "ready" }).into_response(),
        Err(_) => Answer::StoreUnavailable.into_response(),
    }
}

/// Prometheus text; the backlog gauges are read from the store at each scrape.
#[utoipa::path(get, path = "/metrics", tag = "observability", security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition", body = String,
            content_type = "text/plain"),
        (status = 401, description = "Admin token missing or wrong (unless `metrics_public`)", body = ErrorBody),
    ))]
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    match state.store.undecided_counts().await {
        Ok(counts) => {
            for source in &state.config.sources {
                let count = |wanted: &[EventStatus]| count_of(&counts, &source.name, wanted);
                let held = count(&[EventStatus::Held]);
                let backlog = count(&[
                    EventStatus::Received,
                    EventStatus::Held,
                    EventStatus::Retrying,
                ]);
                crate::metrics::backlog(&source.name, held, backlog);
            }
        }
        Err(err) => tracing::warn!(error = %err, "backlog gauges not refreshed"),
    }
    let text = crate::metrics::render().unwrap_or_default();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

/// Events of `source` in any of the `wanted` statuses, from [`crate::store::Store::status_counts`].
fn count_of(counts: &[(String, EventStatus, u64)], source: &str, wanted: &[EventStatus]) -> u64 {
    counts
        .iter()
        .filter(|(name, status, _)| name == source && wanted.contains(status))
        .map(|(_, _, n)| n)
        .sum()
}

/// Optional `?source=` choosing among several sources of one kind.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SourceQuery {
    /// The source to read (default: the first configured source of this kind).
    source: Option<String>,
}

/// `?status=&limit=&cursor=&source=` of the presence listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct PresenceListQuery {
    /// The presence source to read (default: the first configured one).
    source: Option<String>,
    /// Only users with this presence.
    #[param(value_type = Option<Presence>)]
    status: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// The query string of a request, or a 400 naming what is wrong with it.
fn query<T>(parsed: Result<Query<T>, QueryRejection>) -> Result<T, Answer> {
    parsed
        .map(|Query(query)| query)
        .map_err(|rejection| Answer::BadRequest(rejection.body_text()))
}

/// The path parameters of a request, or a 400 naming what is wrong with them.
fn path<T>(parsed: Result<Path<T>, PathRejection>) -> Result<T, Answer> {
    parsed
        .map(|Path(path)| path)
        .map_err(|rejection| Answer::BadRequest(rejection.body_text()))
}

/// A page size from `?limit=`, checked against [`MAX_PAGE`].
fn page_size(limit: Option<u64>) -> Result<usize, Answer> {
    match limit {
        None => Ok(100),
        Some(n @ 1..) if n <= MAX_PAGE as u64 => Ok(n as usize),
        Some(_) => Err(Answer::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        ))),
    }
}

/// A page of presences.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct PresencePage {
    /// The presences, by user id.
    items: Vec<PresenceView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
}

/// A page of save slots.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SavePage {
    /// The slots, by player and slot (each built by [`masked_state`]).
    #[schema(value_type = Vec<SaveView>)]
    items: Vec<serde_json::Value>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
}

fn source_of_kind<'a>(
    state: &'a AppState,
    kind: SourceKind,
    name: Option<&str>,
) -> Result<&'a SourceConfig, Answer> {
    let mut sources = state.config.sources.iter().filter(|s| s.kind == kind);
    match name {
        Some(name) => sources
            .find(|s| s.name == name)
            .ok_or(Answer::NotFound("unknown_source")),
        None => sources.next().ok_or(Answer::NotFound("unknown_source")),
    }
}

fn store_answer(err: StoreError) -> Answer {
    match err {
        StoreError::Unavailable(_) => Answer::StoreUnavailable,
        StoreError::Internal(detail) => {
            tracing::error!(%detail, "store failed on a read");
            Answer::Internal
        }
    }
}

/// A state view as shown (API and stream): a save slot's `progress`, which is the
/// body's `data`, masked like the payload it came from. Every state view passes here.
pub(super) fn masked_state(
    mut state: serde_json::Value,
    mask_fields: &[String],
) -> serde_json::Value {
    if let Some(progress) = state.get_mut("progress").filter(|p| p.is_object()) {
        let keys: Vec<String> = progress
            .as_object()
            .map(|o| o.keys().cloned().collect())
            .unwrap_or_default();
        mask_at(progress, mask_fields, &["data"]);
        if !progress.is_object() {
            // Masked whole: still an object (the documented shape), every value hidden.
            *progress = keys.into_iter().map(|k| (k, json!(MASK))).collect();
        }
    }
    state
}

fn presence_json(source: &SourceConfig, user_id: &str, state: &PresenceState) -> PresenceView {
    let stale_after_ms = (source.stale_after_s as i64).saturating_mul(1000);
    presence_view(user_id, state, clock::now_ms(), stale_after_ms)
}

/// One user's presence.
#[utoipa::path(get, path = "/v1/presence/{user_id}", tag = "state", security(("admin_token" = [])),
    params(("user_id" = String, Path, description = "The user", example = "usr_A"), SourceQuery),
    responses(
        (status = 200, description = "The user's presence", body = PresenceView),
        (status = 404, description = "`unknown_user` or `unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn presence_one(
    State(state): State<AppState>,
    user_id: Result<Path<String>, PathRejection>,
    params: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, Answer> {
    let (user_id, query) = (path(user_id)?, query(params)?);
    let source = source_of_kind(&state, SourceKind::Presence, query.source.as_deref())?;
    let found = state
        .store
        .presence(&source.name, &user_id)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_user"))?;
    Ok(Json(presence_json(source, &user_id, &found)).into_response())
}

/// Presences, optionally of one status, a page at a time.
#[utoipa::path(get, path = "/v1/presence", tag = "state", security(("admin_token" = [])),
    params(PresenceListQuery),
    responses(
        (status = 200, description = "A page of presences", body = PresencePage),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn presence_list(
    State(state): State<AppState>,
    params: Result<Query<PresenceListQuery>, QueryRejection>,
) -> Result<Response, Answer> {
    let query = query(params)?;
    let source = source_of_kind(&state, SourceKind::Presence, query.source.as_deref())?;
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(raw) => Some(Presence::parse(raw).ok_or_else(|| {
            Answer::BadRequest("status must be one of ONLINE, BUSY, AWAY, OFFLINE".into())
        })?),
    };
    let limit = page_size(query.limit)?;
    let page = state
        .store
        .presence_page(&source.name, status, limit, query.cursor.as_deref())
        .await
        .map_err(store_answer)?;
    let items: Vec<_> = page
        .items
        .iter()
        .map(|(user, s)| presence_json(source, user, s))
        .collect();
    Ok(Json(PresencePage {
        items,
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// One save slot.
#[utoipa::path(get, path = "/v1/saves/{player_id}/{save_slot}", tag = "state",
    security(("admin_token" = [])),
    params(("player_id" = String, Path, description = "The player", example = "player_1024"),
        ("save_slot" = String, Path, description = "The slot", example = "slot_a"), SourceQuery),
    responses(
        (status = 200, description = "The slot's state", body = SaveView),
        (status = 404, description = "`unknown_save` or `unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn save_one(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
    params: Result<Query<SourceQuery>, QueryRejection>,
) -> Result<Response, Answer> {
    let ((player_id, save_slot), query) = (path(ids)?, query(params)?);
    let source = source_of_kind(&state, SourceKind::SaveGame, query.source.as_deref())?;
    let (Ok(player), Ok(slot)) = (Ident::parse(&player_id), Ident::parse(&save_slot)) else {
        return Err(Answer::NotFound("unknown_save"));
    };
    let key = AggregateKey::SaveSlot {
        player_id: player,
        save_slot: slot,
    };
    let save = state
        .store
        .save(&source.name, &key)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_save"))?;
    let view = json!(save_view(&player_id, &save_slot, &save));
    Ok(Json(masked_state(view, &state.config.mask_fields)).into_response())
}

/// `?source=&status=&aggregate=&limit=&cursor=` of the event log listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct EventsQuery {
    /// Only this source's events.
    source: Option<String>,
    /// Only events in this status (SPEC §3).
    #[param(value_type = Option<EventStatus>)]
    status: Option<String>,
    /// Only this aggregate's events: a user id, or `player/slot`.
    aggregate: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<i64>,
}

/// An event as the event log shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EventView {
    /// The source that received it.
    source: String,
    /// Its id (from the body, or the scheme's delivery id).
    event_id: String,
    /// Its type.
    event_type: String,
    /// The aggregate: a user id, or `player/slot`.
    aggregate: String,
    /// The publisher's per-aggregate sequence.
    sequence: i64,
    /// The publisher's idempotency key, if any.
    idempotency_key: Option<String>,
    /// Where it is in its life.
    status: EventStatus,
    /// Why it is dead, if it is.
    dead_reason: Option<crate::domain::DeadReason>,
    /// Failed attempts so far.
    attempts: i64,
    /// Times it was replayed.
    replays: i64,
    /// The last attempt's error.
    last_error: Option<String>,
    /// When it was received (RFC 3339).
    received_at: String,
    /// When it reached a final status (RFC 3339).
    decided_at: Option<String>,
    /// When the next attempt is due (RFC 3339).
    next_attempt_at: Option<String>,
    /// Whether its signature verified (always true for logged events).
    signature_valid: bool,
}

/// One event with its masked body, headers and history.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EventDetail {
    /// The event log's fields.
    #[serde(flatten)]
    event: EventView,
    /// The delivery's allowlisted headers (never signatures or credentials), masked fields replaced.
    #[schema(value_type = Object)]
    headers: serde_json::Value,
    /// The body, masked fields replaced.
    #[schema(value_type = Object)]
    body: serde_json::Value,
    /// The signed timestamp, unix seconds, where the scheme carries one.
    signed_at: Option<i64>,
    /// Failed attempts, exhaustion and replays, oldest first.
    history: Vec<HistoryEntry>,
}

/// One entry of an event's history.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct HistoryEntry {
    /// When (RFC 3339).
    at: String,
    /// `failed` (an attempt that failed), a dead reason such as `insufficient_quantity` (an event
    /// dead as `exhausted` shows its `failed` attempts instead), `replayed` or `conflicting_duplicate`.
    kind: String,
    /// The error of a failed attempt.
    error: Option<String>,
}

/// A page of the event log, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct EventPage {
    /// The events.
    items: Vec<EventView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<i64>,
}

/// The stored form of an aggregate given as shown (`user` or `player/slot`).
pub fn aggregate_storage_key(shown: &str) -> String {
    match shown.split_once('/') {
        Some((player, slot)) => format!("{player}\u{1f}{slot}"),
        None => shown.to_owned(),
    }
}

fn parse_status(raw: Option<&str>) -> Result<Option<EventStatus>, Answer> {
    match raw {
        None | Some("") => Ok(None),
        Some(raw) => EventStatus::parse(raw).map(Some).ok_or_else(|| {
            Answer::BadRequest(format!(
                "status must be one of {}",
                EventStatus::ALL.map(EventStatus::as_str).join(", ")
            ))
        }),
    }
}

fn event_view(record: &EventRecord) -> EventView {
    let time = |ms: Option<i64>| ms.map(clock::rfc3339);
    EventView {
        source: record.source.clone(),
        event_id: record.event_id.clone(),
        event_type: record.event_type.clone(),
        aggregate: record.aggregate.replace('\u{1f}', "/"),
        sequence: record.sequence,
        idempotency_key: record.idempotency_key.clone(),
        status: record.status,
        dead_reason: record.dead_reason,
        attempts: record.attempts,
        replays: record.replays,
        last_error: record.last_error.clone(),
        received_at: clock::rfc3339(record.received_at_ms),
        decided_at: time(record.decided_at_ms),
        next_attempt_at: time(record.next_attempt_at_ms),
        signature_valid: record.signature_valid,
    }
}

fn event_detail(
    record: &EventRecord,
    mask_fields: &[String],
    keep_headers: &[String],
) -> EventDetail {
    let mut headers = super::kept_headers::shown(record.headers.as_deref(), keep_headers);
    mask(&mut headers, mask_fields);
    let mut body = serde_json::from_slice(&record.body).unwrap_or_else(|_| {
        serde_json::Value::String(String::from_utf8_lossy(&record.body).into())
    });
    mask(&mut body, mask_fields);
    EventDetail {
        event: event_view(record),
        headers,
        body,
        signed_at: record.signed_at,
        history: record
            .history
            .iter()
            .map(|h| HistoryEntry {
                at: clock::rfc3339(h.at_ms),
                kind: h.kind.clone(),
                error: h.error.clone(),
            })
            .collect(),
    }
}

/// The event log, newest first.
#[utoipa::path(get, path = "/v1/events", tag = "events", security(("admin_token" = [])),
    params(EventsQuery),
    responses(
        (status = 200, description = "A page of the event log", body = EventPage),
        AdminFailures,
    ))]
pub(super) async fn events_list(
    State(state): State<AppState>,
    params: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, Answer> {
    let query = query(params)?;
    let limit = page_size(query.limit)?;
    let filter = EventFilter {
        source: query.source.filter(|s| !s.is_empty()),
        status: parse_status(query.status.as_deref())?,
        aggregate: query
            .aggregate
            .filter(|a| !a.is_empty())
            .map(|a| aggregate_storage_key(&a)),
        ..EventFilter::default()
    };
    let page = state
        .store
        .events(&filter, limit, query.cursor)
        .await
        .map_err(store_answer)?;
    let items: Vec<_> = page.items.iter().map(event_view).collect();
    Ok(Json(EventPage {
        items,
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// One event with its masked body and history.
#[utoipa::path(get, path = "/v1/events/{source}/{event_id}", tag = "events",
    security(("admin_token" = [])),
    params(("source" = String, Path, description = "The source", example = "presence"),
        ("event_id" = String, Path, description = "The event's id", example = "evt_1")),
    responses(
        (status = 200, description = "The event", body = EventDetail),
        (status = 404, description = "`unknown_event`", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn event_one(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, Answer> {
    let (source, event_id) = path(ids)?;
    let record = state
        .store
        .event(&source, &event_id)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_event"))?;
    // A source removed from the config keeps only the allowlist every source shares.
    let keep_headers = state
        .config
        .source(&record.source)
        .map_or(&state.config.keep_headers, |s| &s.keep_headers);
    Ok(Json(event_detail(
        &record,
        &state.config.mask_fields,
        keep_headers,
    ))
    .into_response())
}

/// What replaying one event did.
#[derive(Debug, Serialize, ToSchema)]
#[serde(tag = "status", rename_all = "snake_case")]
pub(super) enum ReplayAnswer {
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
pub(super) async fn event_replay(
    State(state): State<AppState>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Response, Answer> {
    let (source, event_id) = path(ids)?;
    let outcome = state
        .store
        .replay_event(&source, &event_id, state.clock.now_ms())
        .await
        .map_err(store_answer)?;
    match outcome {
        ReplayOutcome::NotFound => Err(Answer::NotFound("unknown_event")),
        ReplayOutcome::Requeued => {
            state.wake.notify_one();
            Ok((
                StatusCode::ACCEPTED,
                Json(ReplayAnswer::Requeued { source, event_id }),
            )
                .into_response())
        }
        ReplayOutcome::Unchanged(event_status) => Ok(Json(ReplayAnswer::Unchanged {
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
pub(super) struct ReplayRequest {
    /// Only this source's events.
    source: Option<String>,
    /// `dead` or `retrying` (default: `dead`; retrying events are retried anyway).
    status: Option<Replayable>,
    /// Only this aggregate's events: a user id, or `player/slot`.
    aggregate: Option<String>,
    /// Only events received at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    received_after: Option<String>,
    /// Only events received before this time (RFC 3339).
    #[schema(format = DateTime)]
    received_before: Option<String>,
}

/// The statuses a bulk replay can take events from.
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(super) enum Replayable {
    /// Dead events.
    Dead,
    /// Events waiting for a retry.
    Retrying,
}

/// A bulk replay job.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct ReplayJobView {
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

fn rfc3339_ms(field: &str, raw: Option<&str>) -> Result<Option<i64>, Answer> {
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
pub(super) async fn replay_bulk(
    State(state): State<AppState>,
    body: Result<Json<ReplayRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, Answer> {
    let Json(request) = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Answer::PayloadTooLarge {
                limit: super::ADMIN_MAX_BODY_BYTES,
            }
        } else {
            Answer::BadRequest(e.body_text())
        }
    })?;
    let texts = [&request.source, &request.aggregate];
    if texts
        .iter()
        .any(|t| t.as_deref().is_some_and(|t| t.contains('\0')))
    {
        return Err(Answer::BadRequest(
            "source and aggregate cannot hold a NUL character".into(),
        ));
    }
    let status = request.status.map(|s| match s {
        Replayable::Dead => EventStatus::Dead,
        Replayable::Retrying => EventStatus::Retrying,
    });
    let filter = EventFilter {
        source: request.source,
        status,
        aggregate: request.aggregate.map(|a| aggregate_storage_key(&a)),
        received_from_ms: rfc3339_ms("received_after", request.received_after.as_deref())?,
        received_to_ms: rfc3339_ms("received_before", request.received_before.as_deref())?,
    };
    let job = state
        .store
        .create_replay_job(&filter, state.clock.now_ms())
        .await
        .map_err(store_answer)?;
    state.wake.notify_one();
    Ok((StatusCode::ACCEPTED, Json(job_json(&job))).into_response())
}

/// A bulk replay's progress.
#[utoipa::path(get, path = "/v1/replay/{job_id}", tag = "events", security(("admin_token" = [])),
    params(("job_id" = i64, Path, description = "The job's id", example = 1)),
    responses(
        (status = 200, description = "The job", body = ReplayJobView),
        (status = 404, description = "`unknown_job`", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn replay_job(
    State(state): State<AppState>,
    id: Result<Path<i64>, PathRejection>,
) -> Result<Response, Answer> {
    let id = path(id)?;
    let job = state
        .store
        .replay_job(id)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_job"))?;
    Ok(Json(job_json(&job)).into_response())
}

fn job_json(job: &ReplayJob) -> ReplayJobView {
    ReplayJobView {
        job_id: job.id,
        state: job.state.clone(),
        filter: json!(job.filter),
        total: job.total,
        requeued: job.requeued,
        created_at: clock::rfc3339(job.created_at_ms),
        updated_at: clock::rfc3339(job.updated_at_ms),
    }
}

/// `?source=&limit=&cursor=` of the save slot listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SavesQuery {
    /// The save-game source to read (default: the first configured one).
    source: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<String>,
}

/// Save slots with their state, ordered by player and slot.
#[utoipa::path(get, path = "/v1/saves", tag = "state", security(("admin_token" = [])),
    params(SavesQuery),
    responses(
        (status = 200, description = "A page of save slots", body = SavePage),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn saves_list(
    State(state): State<AppState>,
    params: Result<Query<SavesQuery>, QueryRejection>,
) -> Result<Response, Answer> {
    let query = query(params)?;
    let source = source_of_kind(&state, SourceKind::SaveGame, query.source.as_deref())?;
    let limit = page_size(query.limit)?;
    let cursor = query.cursor.as_deref().map(aggregate_storage_key);
    let page = state
        .store
        .saves_page(&source.name, limit, cursor.as_deref())
        .await
        .map_err(store_answer)?;
    let items: Vec<_> = page
        .items
        .iter()
        .map(|(key, save)| {
            let (player, slot) = key.split_once('\u{1f}').unwrap_or((key, ""));
            masked_state(
                json!(save_view(player, slot, save)),
                &state.config.mask_fields,
            )
        })
        .collect();
    let next_cursor = page.next_cursor.map(|c| c.replace('\u{1f}', "/"));
    Ok(Json(SavePage { items, next_cursor }).into_response())
}

/// One source's counts in the overview.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct SourceOverview {
    /// The source.
    source: String,
    /// What it feeds.
    kind: SourceKind,
    /// `sync` or `async`.
    mode: &'static str,
    /// Events logged.
    received: u64,
    /// Events applied.
    processed: u64,
    /// Duplicates answered by this node since it started.
    duplicates: u64,
    /// Duplicate `event_id`s with a different body seen by this node since it started.
    conflicting_duplicates: u64,
    /// Events ignored as stale.
    stale: u64,
    /// Events of unsupported types.
    unsupported: u64,
    /// Events held for a gap.
    held: u64,
    /// Events waiting for a retry.
    retrying: u64,
    /// Dead events.
    dead: u64,
    /// Events not yet decided.
    backlog: u64,
}

/// Per source, events by status.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Overview {
    /// Every configured source.
    sources: Vec<SourceOverview>,
    /// When these counts were read (RFC 3339).
    generated_at: String,
}

/// Per source, events by status and duplicates seen by this node.
#[utoipa::path(get, path = "/v1/overview", tag = "observability", security(("admin_token" = [])),
    responses(
        (status = 200, description = "The counts", body = Overview),
        AdminFailures,
    ))]
pub(super) async fn overview(State(state): State<AppState>) -> Result<Response, Answer> {
    let counts = state.store.status_counts().await.map_err(store_answer)?;
    let duplicates = state
        .duplicates
        .lock()
        .map(|d| d.clone())
        .unwrap_or_default();
    let conflicts = state
        .conflicting_duplicates
        .lock()
        .map(|d| d.clone())
        .unwrap_or_default();
    let sources: Vec<_> = state
        .config
        .sources
        .iter()
        .map(|source| {
            let count = |wanted: &[EventStatus]| count_of(&counts, &source.name, wanted);
            SourceOverview {
                source: source.name.clone(),
                kind: source.kind,
                mode: if source.mode == crate::config::Mode::Sync {
                    "sync"
                } else {
                    "async"
                },
                received: count(&EventStatus::ALL),
                processed: count(&[EventStatus::Processed]),
                duplicates: duplicates.get(&source.name).copied().unwrap_or(0),
                conflicting_duplicates: conflicts.get(&source.name).copied().unwrap_or(0),
                stale: count(&[EventStatus::IgnoredStale]),
                unsupported: count(&[EventStatus::IgnoredUnsupported]),
                held: count(&[EventStatus::Held]),
                retrying: count(&[EventStatus::Retrying]),
                dead: count(&[EventStatus::Dead]),
                backlog: count(&[
                    EventStatus::Received,
                    EventStatus::Held,
                    EventStatus::Retrying,
                ]),
            }
        })
        .collect();
    Ok(Json(Overview {
        sources,
        generated_at: clock::rfc3339(clock::now_ms()),
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_state_view_masks_progress_as_the_body_s_data() {
        let save = json!({"player_id": "p", "save_slot": "s", "email": "view field, not payload",
                          "progress": {"Email": "a", "card": {"number": "1"}, "level": 2}});
        let masked = masked_state(save.clone(), &fields(&["email", "data.card.number"]));
        assert_eq!(
            masked["progress"],
            json!({"Email": "***", "card": {"number": "***"}, "level": 2})
        );
        assert_eq!(masked["email"], save["email"], "only the payload is masked");

        // `data` itself masked: progress stays an object, every value hidden.
        let masked = masked_state(save, &fields(&["DATA"]));
        assert_eq!(
            masked["progress"],
            json!({"Email": "***", "card": "***", "level": "***"})
        );

        let presence = json!({"user_id": "u", "status": "ONLINE", "progress": null});
        assert_eq!(masked_state(presence.clone(), &fields(&["data"])), presence);
    }
}
