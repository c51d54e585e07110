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
use crate::domain::{AggregateKey, Ident};
use crate::projection::PresenceState;
use crate::store::StoreError;

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
    json!({
        "user_id": user_id,
        "status": state.presence,
        "sequence": state.sequence,
        "updated_at": clock::rfc3339(state.updated_at_ms),
        "stale": state.is_stale(clock::now_ms(), stale_after_ms),
    })
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
    Ok(Json(json!({
        "player_id": player_id,
        "save_slot": save_slot,
        "last_sequence": save.last_sequence,
        "progress": save.progress,
        "inventory": save.inventory,
        "achievements": save.achievements,
        "updated_at": (save.updated_at_ms > 0).then(|| clock::rfc3339(save.updated_at_ms)),
    }))
    .into_response())
}
