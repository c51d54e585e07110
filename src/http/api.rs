//! The read API of SPEC §4 and the health probes.

use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;

use super::answer::Answer;
use super::AppState;
use crate::clock;
use crate::config::SourceConfig;
use crate::contract::{Presence, SourceKind};
use crate::domain::EventStatus;
use crate::domain::{AggregateKey, Ident};
use crate::mask::mask;
use crate::projection::{presence_view, save_view, PresenceState};
use crate::store::{EventFilter, EventRecord, ReplayJob, ReplayOutcome, StoreError};
use axum::http::StatusCode;

/// Most items one page may hold.
const MAX_PAGE: usize = 500;

/// `GET /healthz`: the process is up.
pub(super) async fn healthz() -> Response {
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /readyz`: the store answers.
pub(super) async fn readyz(State(state): State<AppState>) -> Response {
    match state.store.ping().await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(_) => Answer::StoreUnavailable.into_response(),
    }
}

/// `GET /metrics`: Prometheus text; the backlog gauges are read from the store at each scrape.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    match state.store.status_counts().await {
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
#[derive(Debug, Deserialize)]
pub(super) struct SourceQuery {
    source: Option<String>,
}

/// `?status=&limit=&cursor=&source=` of the presence listing.
#[derive(Debug, Deserialize)]
pub(super) struct PresenceListQuery {
    source: Option<String>,
    status: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
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

fn presence_json(source: &SourceConfig, user_id: &str, state: &PresenceState) -> serde_json::Value {
    let stale_after_ms = (source.stale_after_s as i64).saturating_mul(1000);
    presence_view(user_id, state, clock::now_ms(), stale_after_ms)
}

/// `GET /v1/presence/{user_id}`.
pub(super) async fn presence_one(
    State(state): State<AppState>,
    Path(user_id): Path<String>,
    Query(query): Query<SourceQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::Presence, query.source.as_deref())?;
    let found = state
        .store
        .presence(&source.name, &user_id)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_user"))?;
    Ok(Json(presence_json(source, &user_id, &found)).into_response())
}

/// `GET /v1/presence?status=BUSY&limit=&cursor=`.
pub(super) async fn presence_list(
    State(state): State<AppState>,
    Query(query): Query<PresenceListQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::Presence, query.source.as_deref())?;
    let status = match query.status.as_deref() {
        None | Some("") => None,
        Some(raw) => Some(Presence::parse(raw).ok_or_else(|| {
            Answer::BadRequest("status must be one of ONLINE, BUSY, AWAY, OFFLINE".into())
        })?),
    };
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(Answer::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        )));
    }
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
    Ok(Json(json!({"items": items, "next_cursor": page.next_cursor})).into_response())
}

/// `GET /v1/saves/{player_id}/{save_slot}`.
pub(super) async fn save_one(
    State(state): State<AppState>,
    Path((player_id, save_slot)): Path<(String, String)>,
    Query(query): Query<SourceQuery>,
) -> Result<Response, Answer> {
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
    Ok(Json(save_view(&player_id, &save_slot, &save)).into_response())
}

/// `?source=&status=&aggregate=&limit=&cursor=` of the event log listing.
#[derive(Debug, Deserialize)]
pub(super) struct EventsQuery {
    source: Option<String>,
    status: Option<String>,
    aggregate: Option<String>,
    limit: Option<usize>,
    cursor: Option<i64>,
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

fn event_json(record: &EventRecord, detail: bool, mask_fields: &[String]) -> serde_json::Value {
    let time = |ms: Option<i64>| ms.map(clock::rfc3339);
    let mut out = json!({
        "source": record.source,
        "event_id": record.event_id,
        "event_type": record.event_type,
        "aggregate": record.aggregate.replace('\u{1f}', "/"),
        "sequence": record.sequence,
        "idempotency_key": record.idempotency_key,
        "status": record.status,
        "dead_reason": record.dead_reason,
        "attempts": record.attempts,
        "replays": record.replays,
        "last_error": record.last_error,
        "received_at": clock::rfc3339(record.received_at_ms),
        "decided_at": time(record.decided_at_ms),
        "next_attempt_at": time(record.next_attempt_at_ms),
        "signature_valid": record.signature_valid,
    });
    if detail {
        out["headers"] = record
            .headers
            .as_deref()
            .and_then(|h| serde_json::from_str(h).ok())
            .unwrap_or_else(|| json!({}));
        let mut body = serde_json::from_slice(&record.body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&record.body).into())
        });
        mask(&mut body, mask_fields);
        out["body"] = body;
        out["signed_at"] = json!(record.signed_at);
        out["history"] = record
            .history
            .iter()
            .map(|h| json!({"at": clock::rfc3339(h.at_ms), "kind": h.kind, "error": h.error}))
            .collect();
    }
    out
}

/// `GET /v1/events`: the event log, newest first.
pub(super) async fn events_list(
    State(state): State<AppState>,
    Query(query): Query<EventsQuery>,
) -> Result<Response, Answer> {
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(Answer::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        )));
    }
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
    let items: Vec<_> = page
        .items
        .iter()
        .map(|e| event_json(e, false, &state.config.mask_fields))
        .collect();
    Ok(Json(json!({"items": items, "next_cursor": page.next_cursor})).into_response())
}

/// `GET /v1/events/{source}/{event_id}`: one event with its masked body and history.
pub(super) async fn event_one(
    State(state): State<AppState>,
    Path((source, event_id)): Path<(String, String)>,
) -> Result<Response, Answer> {
    let record = state
        .store
        .event(&source, &event_id)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_event"))?;
    Ok(Json(event_json(&record, true, &state.config.mask_fields)).into_response())
}

/// `POST /v1/events/{source}/{event_id}/replay`.
pub(super) async fn event_replay(
    State(state): State<AppState>,
    Path((source, event_id)): Path<(String, String)>,
) -> Result<Response, Answer> {
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
                Json(json!({"status": "requeued", "source": source, "event_id": event_id})),
            )
                .into_response())
        }
        ReplayOutcome::Unchanged(status) => Ok(Json(json!({
            "status": "unchanged", "source": source, "event_id": event_id, "event_status": status,
        }))
        .into_response()),
    }
}

/// Body of `POST /v1/replay`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ReplayRequest {
    source: Option<String>,
    status: Option<String>,
    aggregate: Option<String>,
    received_after: Option<String>,
    received_before: Option<String>,
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

/// `POST /v1/replay`: starts a persisted bulk replay.
pub(super) async fn replay_bulk(
    State(state): State<AppState>,
    body: Result<Json<ReplayRequest>, axum::extract::rejection::JsonRejection>,
) -> Result<Response, Answer> {
    let Json(request) = body.map_err(|e| Answer::BadRequest(e.body_text()))?;
    let status = parse_status(request.status.as_deref())?;
    if status.is_some_and(|s| !matches!(s, EventStatus::Dead | EventStatus::Retrying)) {
        return Err(Answer::BadRequest(
            "only dead or retrying events can be replayed".into(),
        ));
    }
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

/// `GET /v1/replay/{job_id}`: a bulk replay's progress.
pub(super) async fn replay_job(
    State(state): State<AppState>,
    Path(id): Path<i64>,
) -> Result<Response, Answer> {
    let job = state
        .store
        .replay_job(id)
        .await
        .map_err(store_answer)?
        .ok_or(Answer::NotFound("unknown_job"))?;
    Ok(Json(job_json(&job)).into_response())
}

fn job_json(job: &ReplayJob) -> serde_json::Value {
    json!({
        "job_id": job.id,
        "state": job.state,
        "filter": job.filter,
        "total": job.total,
        "requeued": job.requeued,
        "created_at": clock::rfc3339(job.created_at_ms),
        "updated_at": clock::rfc3339(job.updated_at_ms),
    })
}

/// `?source=&limit=&cursor=` of the save slot listing.
#[derive(Debug, Deserialize)]
pub(super) struct SavesQuery {
    source: Option<String>,
    limit: Option<usize>,
    cursor: Option<String>,
}

/// `GET /v1/saves`: save slots with their state, ordered by player and slot.
pub(super) async fn saves_list(
    State(state): State<AppState>,
    Query(query): Query<SavesQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::SaveGame, query.source.as_deref())?;
    let limit = query.limit.unwrap_or(100);
    if limit == 0 || limit > MAX_PAGE {
        return Err(Answer::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        )));
    }
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
            save_view(player, slot, save)
        })
        .collect();
    let next_cursor = page.next_cursor.map(|c| c.replace('\u{1f}', "/"));
    Ok(Json(json!({"items": items, "next_cursor": next_cursor})).into_response())
}

/// `GET /v1/overview`: per source, events by status and duplicates seen by this node.
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
            json!({
                "source": source.name,
                "kind": source.kind,
                "mode": if source.mode == crate::config::Mode::Sync { "sync" } else { "async" },
                "received": count(&EventStatus::ALL),
                "processed": count(&[EventStatus::Processed]),
                "duplicates": duplicates.get(&source.name).copied().unwrap_or(0),
                "conflicting_duplicates": conflicts.get(&source.name).copied().unwrap_or(0),
                "stale": count(&[EventStatus::IgnoredStale]),
                "unsupported": count(&[EventStatus::IgnoredUnsupported]),
                "held": count(&[EventStatus::Held]),
                "retrying": count(&[EventStatus::Retrying]),
                "dead": count(&[EventStatus::Dead]),
                "backlog": count(&[EventStatus::Received, EventStatus::Held, EventStatus::Retrying]),
            })
        })
        .collect();
    Ok(
        Json(json!({"sources": sources, "generated_at": clock::rfc3339(clock::now_ms())}))
            .into_response(),
    )
}

/// `?source=&aggregate=` of the change stream.
#[derive(Debug, Deserialize)]
pub(super) struct StreamQuery {
    source: Option<String>,
    aggregate: Option<String>,
}

/// How often the change stream looks for new changes (they may come from other nodes).
const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// `GET /v1/stream`: server-sent events of every applied state change, resumable with
/// `Last-Event-ID`; without it the stream starts at the current end.
pub(super) async fn stream(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Result<Response, Answer> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<i64>())
        .transpose()
        .map_err(|_| {
            Answer::BadRequest("Last-Event-ID must be an event id from this stream".into())
        })?;
    let after = match resume {
        Some(id) => id,
        None => state.store.last_change_id().await.map_err(store_answer)?,
    };
    let filter = (
        query.source.filter(|s| !s.is_empty()),
        query
            .aggregate
            .filter(|a| !a.is_empty())
            .map(|a| aggregate_storage_key(&a)),
    );
    let store = state.store.clone();
    let changes = futures_util::stream::unfold(
        (after, std::collections::VecDeque::new()),
        move |(mut after, mut queue)| {
            let (store, filter) = (store.clone(), filter.clone());
            async move {
                loop {
                    if let Some(change) = queue.pop_front() {
                        let change: crate::store::StateChange = change;
                        after = change.id;
                        let data = json!({
                            "source": change.source,
                            "aggregate": change.aggregate.replace('\u{1f}', "/"),
                            "state": serde_json::from_str::<serde_json::Value>(&change.state)
                                .unwrap_or(serde_json::Value::Null),
                        });
                        let event = Event::default()
                            .id(change.id.to_string())
                            .event(change.kind)
                            .data(data.to_string());
                        return Some((Ok::<_, std::convert::Infallible>(event), (after, queue)));
                    }
                    match store
                        .changes_after(after, filter.0.as_deref(), filter.1.as_deref(), 256)
                        .await
                    {
                        Ok(batch) if !batch.is_empty() => queue.extend(batch),
                        Ok(_) => tokio::time::sleep(STREAM_POLL).await,
                        Err(err) => {
                            tracing::warn!(error = %err, "change stream cannot read; retrying");
                            tokio::time::sleep(STREAM_POLL * 5).await;
                        }
                    }
                }
            }
        },
    );
    Ok(Sse::new(changes)
        .keep_alive(KeepAlive::default())
        .into_response())
}
