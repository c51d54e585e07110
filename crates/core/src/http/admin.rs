//! Administration over HTTP: config reload and the OpenAPI document.

use axum::extract::{Extension, State};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use super::answer::{AdminFailures, Answer, ErrorBody};
use super::AppState;

/// What a reload did.
#[derive(Debug, Serialize, ToSchema)]
pub(super) struct Reloaded {
    /// Always `reloaded`.
    status: &'static str,
    /// Running sources whose secrets are now those of the config read.
    sources: usize,
    /// Running sources whose secrets come from `INHOOK_<SOURCE>_SECRET`, which wins over the
    /// file: edits to their secrets in the file changed nothing.
    #[schema(example = json!(["save-game"]))]
    from_environment: Vec<String>,
    /// Sources new in the file: not served (their deliveries get 404) until a restart.
    not_served_until_restart: Vec<String>,
    /// Running destinations whose secret is now that of the config read: it signs from the
    /// next attempt on, and the old one never again.
    destinations: usize,
    /// Running destinations whose secret comes from `INHOOK_DEST_<NAME>_SECRET`, which wins
    /// over the file.
    #[schema(example = json!(["app"]))]
    destinations_from_environment: Vec<String>,
    /// Destinations new in the file: nothing is forwarded to them until a restart.
    destinations_not_served_until_restart: Vec<String>,
}

/// Reads the config (file and environment) again and takes its sources' and destinations'
/// secrets, as SIGHUP does: rotation needs no restart. A config that does not load, drops or
/// renames a running source or destination, or changes any other key changes nothing and
/// names the keys that need a restart.
#[utoipa::path(post, path = "/v1/admin/reload", tag = "admin", security(("admin_token" = [])),
    responses(
        (status = 200, description = "Secrets replaced", body = Reloaded),
        (status = 415, description = "`unsupported_media_type`: a body that is not `application/json`",
            body = ErrorBody),
        (status = 422, description = "`invalid_config`: the config does not load, drops or renames a running \
            source or destination, or changes a key other than secrets (named); nothing changed", body = ErrorBody),
        AdminFailures,
    ))]
pub(super) async fn reload(State(state): State<AppState>) -> Response {
    match state.secrets.reload(&state.config, "admin call") {
        Ok(plan) => Json(Reloaded {
            status: "reloaded",
            sources: plan.sources,
            from_environment: plan.from_environment,
            not_served_until_restart: plan.not_served_until_restart,
            destinations: plan.destinations,
            destinations_from_environment: plan.destinations_from_environment,
            destinations_not_served_until_restart: plan.destinations_not_served_until_restart,
        })
        .into_response(),
        Err(err) => Answer::InvalidConfig(err.to_string()).into_response(),
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
