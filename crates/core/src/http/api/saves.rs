//! `/v1/saves`: the typed view of save-game aggregates.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::json;
use utoipa::{IntoParams, ToSchema};

use super::extract::{Path, Query};
use super::{page_size, source_of_kind, SourceQuery};
use crate::domain::kind::save::save_state;
use crate::domain::kind::save::{save_view, SaveView};
use crate::domain::kind::SourceKind;
use crate::domain::{AggregateKey, Ident};
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;

/// A page of save slots.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SavePage {
    /// The slots, by player and slot (each masked by its kind).
    #[schema(value_type = Vec<SaveView>)]
    items: Vec<serde_json::Value>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
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
pub(crate) async fn save_one(
    State(state): State<AppState>,
    Path((player_id, save_slot)): Path<(String, String)>,
    Query(query): Query<SourceQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::SaveGame, query.source.as_deref())?;
    let (Ok(player), Ok(slot)) = (Ident::parse(&player_id), Ident::parse(&save_slot)) else {
        return Err(Answer::NotFound("unknown_save"));
    };
    let key = AggregateKey::of_parts(vec![player, slot]);
    let save = state
        .store
        .aggregate(&source.name, &key.storage_key())
        .await?
        .ok_or(Answer::NotFound("unknown_save"))?;
    let mut view = json!(save_view(&player_id, &save_slot, &save_state(&save)?));
    source.kind.mask(&mut view, &state.config.admin.mask_fields);
    Ok(Json(view).into_response())
}

/// `?source=&limit=&cursor=` of the save slot listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct SavesQuery {
    /// The save-game source to read (default: the first configured one).
    source: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page (the last slot's key in text form).
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
pub(crate) async fn saves_list(
    State(state): State<AppState>,
    Query(query): Query<SavesQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::SaveGame, query.source.as_deref())?;
    let limit = page_size(query.limit)?;
    let cursor = super::aggregate_cursor(query.cursor.as_deref())?;
    let page = state
        .store
        .aggregates_page(&source.name, None, limit, cursor.as_deref())
        .await?;
    let now_ms = crate::domain::clock::now_ms();
    let items: Vec<_> = page
        .items
        .iter()
        .map(|save| {
            let mut view = source.kind.view(save, now_ms);
            source.kind.mask(&mut view, &state.config.admin.mask_fields);
            view
        })
        .collect();
    let next_cursor = page.next_cursor.map(|c| AggregateKey::text_of_stored(&c));
    Ok(Json(SavePage { items, next_cursor }).into_response())
}
