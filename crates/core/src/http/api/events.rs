//! `/v1/events`: the event log, a page or one event at a time.

use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Path, Query};
use super::replay::rfc3339_ms;
use super::search;
use super::search::ScanView;
use super::{aggregate_filter, page_size, status_filter};
use crate::domain::clock;
use crate::domain::mask::mask;
use crate::domain::search::TypePattern;
use crate::domain::{AggregateKey, EventStatus};
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::store::{EventFilter, EventRecord};

/// `?source=&status=&aggregate=&limit=&cursor=` of the event log listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct EventsQuery {
    /// Only this source's events.
    source: Option<String>,
    /// Only events in this status (docs/contract.md, processing).
    #[param(value_type = Option<EventStatus>)]
    status: Option<String>,
    /// Only this aggregate's events, in text form (docs/contract.md, json sources): a user id, or
    /// `player/slot`, with `%` and `/` inside an id written `%25` and `%2F`.
    aggregate: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<i64>,
    /// Only the event of this id.
    event_id: Option<String>,
    /// Only events of this type, or of every type a `prefix*` pattern starts (`invoice.*`).
    #[serde(rename = "type")]
    #[param(rename = "type", example = "invoice.*")]
    event_type: Option<String>,
    /// Only events received at or after this time (RFC 3339).
    #[param(format = DateTime)]
    from: Option<String>,
    /// Only events received before this time (RFC 3339).
    #[param(format = DateTime)]
    to: Option<String>,
}

/// An event as the event log shows it.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventView {
    /// The source that received it.
    source: String,
    /// Its id (from the body, or the scheme's delivery id).
    event_id: String,
    /// Its type.
    event_type: String,
    /// The aggregate, in text form (docs/contract.md, json sources): a user id, or
    /// `player/slot`, with `%` and `/` inside an id written `%25` and `%2F`.
    aggregate: String,
    /// The publisher's per-aggregate sequence (0 for an unordered event).
    sequence: i64,
    /// Why the event was applied unordered though its source orders events: its type
    /// carries no version, or its body lacks a location (docs/contract.md, missing
    /// locations); null when it was ordered as its source says.
    unordered: Option<String>,
    /// The publisher's idempotency key, if any.
    idempotency_key: Option<String>,
    /// Where it is in its life.
    status: EventStatus,
    /// Why it is dead, if it is.
    dead_reason: Option<crate::domain::DeadReason>,
    /// Attempts so far, the one that decided it included (a replay does not reset it).
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
pub(crate) struct EventDetail {
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
    /// Failed attempts, dead reasons, replays and conflicting duplicates, oldest first.
    history: Vec<HistoryEntry>,
}

/// One entry of an event's history.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct HistoryEntry {
    /// When (RFC 3339).
    at: String,
    /// `failed` (an attempt that failed), a dead reason such as `insufficient_quantity` (an event
    /// dead as `exhausted` shows its `failed` attempts instead), `replayed` or `conflicting_duplicate`.
    kind: String,
    /// The error of a failed attempt, or the detail of a dead reason or conflicting duplicate.
    error: Option<String>,
}

/// A page of the event log, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EventPage {
    /// The events.
    items: Vec<EventView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<i64>,
    /// Present when a `where` named a field no source declares in `search_fields` and the
    /// bodies were scanned (a store without encryption at rest; docs/api.md, search).
    #[serde(skip_serializing_if = "Option::is_none")]
    scan: Option<ScanView>,
}

fn event_view(record: &EventRecord) -> EventView {
    let time = |ms: Option<i64>| ms.map(clock::rfc3339);
    EventView {
        source: record.source.clone(),
        event_id: record.event_id.clone(),
        event_type: record.event_type.clone(),
        aggregate: AggregateKey::text_of_stored(&record.aggregate),
        sequence: record.sequence,
        unordered: record.unordered.clone(),
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
    let mut headers = crate::ingress::kept_headers::shown(record.headers.as_deref(), keep_headers);
    mask(&mut headers, mask_fields);
    // An erased event has no body left: null, not an empty string.
    let mut body = if record.status == EventStatus::Erased {
        serde_json::Value::Null
    } else {
        serde_json::from_slice(&record.body).unwrap_or_else(|_| {
            serde_json::Value::String(String::from_utf8_lossy(&record.body).into())
        })
    };
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

/// The event log, newest first; `where=/pointer=value` (repeatable) searches it by what
/// events say (docs/api.md, search).
#[utoipa::path(get, path = "/v1/events", tag = "events", security(("admin_token" = [])),
    params(EventsQuery,
        ("where" = Option<Vec<String>>, Query, explode = true,
            description = "`/pointer=value`, repeatable: only events whose body holds the value \
                at the JSON pointer (a string as its text, a number or boolean as its JSON text). \
                A pointer in the source's `search_fields` is looked up in the index; another is \
                400 on a store with encryption at rest, and a bounded scan (`scan`) on one without.",
            example = "/data/object/customer=cus_123")),
    responses(
        (status = 200, description = "A page of the event log", body = EventPage),
        AdminFailures,
    ))]
pub(crate) async fn events_list(
    State(state): State<AppState>,
    RawQuery(raw): RawQuery,
    Query(query): Query<EventsQuery>,
) -> Result<Response, Answer> {
    let limit = page_size(query.limit)?;
    let source = query.source.filter(|s| !s.is_empty());
    let wheres = search::wheres_of_query(raw.as_deref())?;
    if query.event_id.as_deref().is_some_and(|t| t.contains('\0')) {
        return Err(Answer::BadRequest(
            "event_id cannot hold a NUL character".into(),
        ));
    }
    let (matches, scans) = search::resolve(
        &state.config,
        state.store.as_ref(),
        source.as_deref(),
        wheres,
        true,
    )
    .map_err(Answer::BadRequest)?;
    let filter = EventFilter {
        source,
        status: status_filter(
            query.status.as_deref(),
            &EventStatus::ALL,
            EventStatus::as_str,
        )?,
        aggregate: aggregate_filter(query.aggregate.as_deref())?,
        received_from_ms: rfc3339_ms("from", query.from.as_deref())?,
        received_to_ms: rfc3339_ms("to", query.to.as_deref())?,
        event_id: query.event_id.filter(|s| !s.is_empty()),
        event_type: query
            .event_type
            .as_deref()
            .filter(|t| !t.is_empty())
            .map(TypePattern::parse)
            .transpose()
            .map_err(|e| Answer::BadRequest(e.to_string()))?,
        search: matches,
    };
    if !scans.is_empty() {
        let (found, next_cursor, scan) = search::scan_page(
            state.store.as_ref(),
            &filter,
            &scans,
            limit,
            query.cursor,
            search::SCAN_LIMIT,
        )
        .await?;
        return Ok(Json(EventPage {
            items: found.iter().map(event_view).collect(),
            next_cursor,
            scan: Some(scan),
        })
        .into_response());
    }
    let page = state.store.events(&filter, limit, query.cursor).await?;
    let items: Vec<_> = page.items.iter().map(event_view).collect();
    Ok(Json(EventPage {
        items,
        next_cursor: page.next_cursor,
        scan: None,
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
pub(crate) async fn event_one(
    State(state): State<AppState>,
    Path((source, event_id)): Path<(String, String)>,
) -> Result<Response, Answer> {
    let record = state
        .store
        .event(&source, &event_id)
        .await?
        .ok_or(Answer::NotFound("unknown_event"))?;
    if record.undecryptable {
        tracing::error!(
            source = %record.source,
            event_id = %record.event_id,
            "an event's stored body, headers or error do not decrypt"
        );
        return Err(Answer::Undecryptable);
    }
    // A source removed from the config keeps only the allowlist every source shares.
    let keep_headers = state
        .config
        .source(&record.source)
        .map_or(&state.config.http.keep_headers, |s| &s.keep_headers);
    Ok(Json(event_detail(
        &record,
        &state.config.admin.mask_fields,
        keep_headers,
    ))
    .into_response())
}
