//! Administration over HTTP: config reload and the OpenAPI document.

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::answer::{Answer, ErrorBody};
use super::AppState;

/// What a reload did.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Reloaded {
    /// Always `reloaded`.
    status: &'static str,
    /// Sources whose secrets are now those of the config read.
    sources: usize,
}

/// Reads the config (file and environment) again and takes its sources' secrets, as SIGHUP
/// does: rotation needs no restart. A config that does not load changes nothing.
#[utoipa::path(post, path = "/v1/admin/reload", tag = "admin", security(("admin_token" = [])),
    responses(
        (status = 200, description = "Secrets replaced", body = Reloaded),
        (status = 400, description = "The URL holds a NUL character", body = ErrorBody),
        (status = 401, description = "Admin token missing or wrong", body = ErrorBody),
        (status = 422, description = "`invalid_config`: the config does not load; the secrets in force stay",
            body = ErrorBody),
    ))]
pub(super) async fn reload(State(state): State<AppState>) -> Response {
    match state.secrets.reload(state.config.loaded_from.as_deref()) {
        Ok(sources) => {
            tracing::info!(sources, "admin call: secrets reloaded");
            Json(Reloaded {
                status: "reloaded",
                sources,
            })
            .into_response()
        }
        Err(err) => {
            tracing::warn!(error = %err, "admin call: config not reloaded");
            Answer::InvalidConfig(err.to_string()).into_response()
        }
    }
}

/// The OpenAPI document, rendered once when the router is built.
#[derive(Debug, Clone)]
pub(super) struct OpenApiJson(pub(super) std::sync::Arc<str>);

/// This document: the whole HTTP interface, generated from the handlers.
#[utoipa::path(get, path = "/openapi.json", tag = "admin", security(()),
    responses((status = 200, description = "OpenAPI 3.1 document", body = Object)))]
pub(super) async fn openapi_json(Extension(document): Extension<OpenApiJson>) -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        document.0.to_string(),
    )
        .into_response()
}
