//! The health probes load balancers call without a token.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::answer::{Answer, ErrorBody};
use crate::http::AppState;

/// The body of the health probes.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Health {
    /// `ok` (process up) or `ready` (store answers).
    status: &'static str,
}

/// The process is up.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "Up", body = Health)))]
pub(crate) async fn healthz() -> Json<Health> {
    Json(Health { status: "ok" })
}

/// The store answers.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "Ready", body = Health),
    (status = 503, description = "The store cannot be reached", body = ErrorBody,
        headers(("Retry-After" = u32, description = "Seconds to wait"))),
))]
pub(crate) async fn readyz(State(state): State<AppState>) -> Response {
    match state.store.ping().await {
        Ok(()) => Json(Health { status: "ready" }).into_response(),
        Err(_) => Answer::StoreUnavailable.into_response(),
    }
}
