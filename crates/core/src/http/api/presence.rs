//! `/v1/presence`: the typed view of presence aggregates.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Path, Query};
use super::{page_size, source_of_kind, status_filter, SourceQuery};
use crate::config::SourceConfig;
use crate::domain::clock;
use crate::domain::kind::presence::presence_state;
use crate::domain::kind::presence::Presence;
use crate::domain::kind::presence::{presence_view, PresenceState, PresenceView};
use crate::domain::kind::SourceKind;
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;

/// `?status=&limit=&cursor=&source=` of the presence listing.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct PresenceListQuery {
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

/// A page of presences.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct PresencePage {
    /// The presences, by user id.
    items: Vec<PresenceView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<String>,
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
pub(crate) async fn presence_one(
    State(state): State<AppState>,
    Path(user_id): Path<String>,
    Query(query): Query<SourceQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::Presence, query.source.as_deref())?;
    // A user's stored key is the user id itself.
    let found = state
        .store
        .aggregate(&source.name, &user_id)
        .await?
        .ok_or(Answer::NotFound("unknown_user"))?;
    Ok(Json(presence_json(source, &user_id, &presence_state(&found)?)).into_response())
}

/// Presences, optionally of one status, a page at a time.
#[utoipa::path(get, path = "/v1/presence", tag = "state", security(("admin_token" = [])),
    params(PresenceListQuery),
    responses(
        (status = 200, description = "A page of presences", body = PresencePage),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn presence_list(
    State(state): State<AppState>,
    Query(query): Query<PresenceListQuery>,
) -> Result<Response, Answer> {
    let source = source_of_kind(&state, SourceKind::Presence, query.source.as_deref())?;
    let status = status_filter(query.status.as_deref(), &Presence::ALL, Presence::as_str)?;
    let limit = page_size(query.limit)?;
    let page = state
        .store
        .aggregates_page(
            &source.name,
            status.map(Presence::as_str),
            limit,
            query.cursor.as_deref(),
        )
        .await?;
    let items = page
        .items
        .iter()
        .map(|stored| {
            Ok(presence_json(
                source,
                &stored.aggregate,
                &presence_state(stored)?,
            ))
        })
        .collect::<Result<Vec<_>, crate::store::StoreError>>()?;
    Ok(Json(PresencePage {
        items,
        next_cursor: page.next_cursor,
    })
    .into_response())
}
