//! `/v1/sources/{source}/aggregates`: every kind's aggregates in one shape (docs/contract.md, json
//! sources), the kind's own state under `state`.

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Path, Query};
use super::page_size;
use crate::config::SourceConfig;
use crate::domain::kind::aggregate_view;
use crate::domain::AggregateKey;
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::store::erasure::ForgetReport;
use crate::store::reset::ResetReport;

/// One aggregate's state, whatever its source's kind.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"source": "stripe", "aggregate": "customer/cus_1",
    "sequence": 1_764_460_800_000_000_i64, "event_id": "evt_1", "event_type": "customer.updated",
    "state": {"id": "cus_1", "email": "***"}, "updated_at": "2025-11-30T00:00:00.000Z"}))]
pub(crate) struct AggregateItem {
    /// The source.
    source: String,
    /// The aggregate's key in text form (parts joined by `/`, `%` and `/` in a part percent-encoded).
    aggregate: String,
    /// The sequence of its current state (a save slot's `last_sequence`); null for an
    /// unordered `json` source without `sequence`.
    sequence: Option<i64>,
    /// The event applied last (null for a state carried over from an older release).
    event_id: Option<String>,
    /// That event's type.
    event_type: Option<String>,
    /// The kind's state: a presence's or save slot's typed view, a `json` source's value at `state`.
    #[schema(value_type = Object)]
    state: serde_json::Value,
    /// When an event was last applied (RFC 3339), null if never.
    updated_at: Option<String>,
}

/// A page of aggregates.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AggregatePage {
    /// The aggregates, ordered by key.
    #[schema(value_type = Vec<AggregateItem>)]
    items: Vec<serde_json::Value>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
}

/// `?limit=&cursor=` of the aggregate listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AggregatesQuery {
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page (the last aggregate's key in text form).
    cursor: Option<String>,
}

fn source_named<'a>(state: &'a AppState, name: &str) -> Result<&'a SourceConfig, Answer> {
    state
        .config
        .source(name)
        .ok_or(Answer::NotFound("unknown_source"))
}

/// The configured source `source` and the aggregate key whose text form is `key`.
fn source_and_key<'a>(
    state: &'a AppState,
    source: &str,
    key: &str,
) -> Result<(&'a SourceConfig, AggregateKey), Answer> {
    let source = source_named(state, source)?;
    let key = AggregateKey::parse_text(key)
        .map_err(|problem| Answer::BadRequest(format!("aggregate key {problem}")))?;
    Ok((source, key))
}

/// One aggregate of a source, of any kind.
#[utoipa::path(get, path = "/v1/sources/{source}/aggregates/{key}", tag = "state",
    security(("admin_token" = [])),
    params(("source" = String, Path, description = "The configured source", example = "presence"),
        ("key" = String, Path, description = "The aggregate's key in text form (parts joined by `/`; \
            `%` and `/` inside a part as `%25` and `%2F`), URL-encoded like any path: \
            `octo%252Frepo/7`", example = "usr_A")),
    responses(
        (status = 200, description = "The aggregate's state", body = AggregateItem),
        (status = 400, description = "`bad_request`: the key is no aggregate key's text form", body = ErrorBody),
        (status = 404, description = "`unknown_aggregate` or `unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn aggregate_one(
    State(state): State<AppState>,
    Path((source, key)): Path<(String, String)>,
) -> Result<Response, Answer> {
    let (source, key) = source_and_key(&state, &source, &key)?;
    let stored = state
        .store
        .aggregate(&source.name, &key.storage_key())
        .await?
        .ok_or(Answer::NotFound("unknown_aggregate"))?;
    let view = aggregate_view(
        &source.name,
        source.kind.as_ref(),
        &stored,
        crate::domain::clock::now_ms(),
        &state.config.admin.mask_fields,
    );
    Ok(Json(view).into_response())
}

/// A source's aggregates, of any kind, a page at a time.
#[utoipa::path(get, path = "/v1/sources/{source}/aggregates", tag = "state",
    security(("admin_token" = [])),
    params(("source" = String, Path, description = "The configured source", example = "presence"),
        AggregatesQuery),
    responses(
        (status = 200, description = "A page of aggregates", body = AggregatePage),
        (status = 400, description = "`bad_request`: a bad `limit` or `cursor`", body = ErrorBody),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn aggregates_list(
    State(state): State<AppState>,
    Path(source): Path<String>,
    Query(query): Query<AggregatesQuery>,
) -> Result<Response, Answer> {
    let source = source_named(&state, &source)?;
    let limit = page_size(query.limit)?;
    let cursor = super::aggregate_cursor(query.cursor.as_deref())?;
    let page = state
        .store
        .aggregates_page(&source.name, None, limit, cursor.as_deref())
        .await?;
    let now_ms = crate::domain::clock::now_ms();
    let items = page
        .items
        .iter()
        .map(|stored| {
            aggregate_view(
                &source.name,
                source.kind.as_ref(),
                stored,
                now_ms,
                &state.config.admin.mask_fields,
            )
        })
        .collect();
    let next_cursor = page.next_cursor.map(|c| AggregateKey::text_of_stored(&c));
    Ok(Json(AggregatePage { items, next_cursor }).into_response())
}

/// What `DELETE /v1/sources/{source}/aggregates/{key}` did (docs/encryption.md, erasure).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"status": "erased", "source": "stripe", "aggregate": "customer/cus_1",
    "events_erased": 3, "state_deleted": true, "deliveries_skipped": 0,
    "data_key_destroyed": true, "encrypted": true,
    "backups": "a backup taken before still holds the wrapped data key: see docs/encryption.md"}))]
pub(crate) struct Forgotten {
    /// Always `erased`.
    status: &'static str,
    /// The source.
    source: String,
    /// The aggregate's key in text form.
    aggregate: String,
    /// What was erased.
    #[serde(flatten)]
    report: ForgetReport,
    /// Whether the store encrypts (the erased bodies were sealed under the destroyed key).
    encrypted: bool,
    /// What backups taken before still hold.
    backups: &'static str,
}

/// Forgets one aggregate on request: its events `erased` (their dedup keys stay), its
/// state gone, its undelivered forwards skipped, its data key destroyed.
#[utoipa::path(delete, path = "/v1/sources/{source}/aggregates/{key}", tag = "state",
    security(("admin_token" = [])),
    params(("source" = String, Path, description = "The configured source", example = "stripe"),
        ("key" = String, Path, description = "The aggregate's key in text form, URL-encoded \
            like any path", example = "customer%2Fcus_1")),
    responses(
        (status = 200, description = "The aggregate is forgotten", body = Forgotten),
        (status = 400, description = "`bad_request`: the key is no aggregate key's text form", body = ErrorBody),
        (status = 404, description = "`unknown_aggregate` (nothing stored for it) or `unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn aggregate_forget(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((source, key)): Path<(String, String)>,
) -> Result<Response, Answer> {
    let (source, key) = source_and_key(&state, &source, &key)?;
    let report = state
        .store
        .forget(
            &source.name,
            &key.storage_key(),
            crate::domain::clock::now_ms(),
        )
        .await?;
    if !report.found() {
        return Err(Answer::NotFound("unknown_aggregate"));
    }
    let encrypted = state.store.encrypting();
    tracing::warn!(
        target: "inhook::audit",
        source = %source.name,
        aggregate = %key,
        by = "admin API",
        peer = %peer.ip(),
        events_erased = report.events_erased,
        data_key_destroyed = report.data_key_destroyed,
        "aggregate erased on request"
    );
    Ok(Json(Forgotten {
        status: "erased",
        source: source.name.clone(),
        aggregate: key.to_string(),
        report,
        encrypted,
        backups: crate::store::erasure::backups_note(encrypted),
    })
    .into_response())
}

/// What `POST /v1/sources/{source}/aggregates/{key}/reset` did (docs/contract.md, a
/// publisher's bad version).
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"status": "reset", "source": "stripe", "aggregate": "customer/cus_1",
    "state_deleted": true, "sequence": 9_223_372_036_854_775_807_i64,
    "highest_received": 9_223_372_036_854_775_807_i64}))]
pub(crate) struct ResetDone {
    /// Always `reset`.
    status: &'static str,
    /// The source.
    source: String,
    /// The aggregate's key in text form.
    aggregate: String,
    /// What was reset.
    #[serde(flatten)]
    report: ResetReport,
}

/// Resets one aggregate on request: its state and highest received sequence are deleted,
/// so that its next event applies whatever its sequence (a publisher sent a version no
/// later event could pass); its events stay in the log as they are. Routed on the
/// aggregate's wildcard path: a POST whose path does not end in `/reset` is 405.
#[utoipa::path(post, path = "/v1/sources/{source}/aggregates/{key}/reset", tag = "state",
    security(("admin_token" = [])),
    params(("source" = String, Path, description = "The configured source", example = "stripe"),
        ("key" = String, Path, description = "The aggregate's key in text form, URL-encoded \
            like any path", example = "customer%2Fcus_1")),
    responses(
        (status = 200, description = "The aggregate is reset", body = ResetDone),
        (status = 400, description = "`bad_request`: the key is no aggregate key's text form", body = ErrorBody),
        (status = 404, description = "`unknown_aggregate` (nothing stored for it) or `unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn aggregate_reset(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    Path((source, path)): Path<(String, String)>,
) -> Result<Response, Answer> {
    let Some(key) = path.strip_suffix("/reset") else {
        return Ok((
            axum::http::StatusCode::METHOD_NOT_ALLOWED,
            [(axum::http::header::ALLOW, "GET,HEAD,DELETE")],
        )
            .into_response());
    };
    let (source, key) = source_and_key(&state, &source, key)?;
    let report = state
        .store
        .reset_aggregate(&source.name, &key.storage_key())
        .await?;
    if !report.found() {
        return Err(Answer::NotFound("unknown_aggregate"));
    }
    let shown = |n: Option<i64>| n.map_or_else(|| "none".to_owned(), |n| n.to_string());
    tracing::warn!(
        target: "inhook::audit",
        source = %source.name,
        aggregate = %key,
        by = "admin API",
        peer = %peer.ip(),
        sequence = %shown(report.sequence),
        highest_received = %shown(report.highest_received),
        "aggregate reset on request"
    );
    Ok(Json(ResetDone {
        status: "reset",
        source: source.name.clone(),
        aggregate: key.to_string(),
        report,
    })
    .into_response())
}
