//! The HTTP layer: thin handlers over the signature, contract and store
//! modules. Every answer's code and body comes from [`answer`].

mod admin;
pub mod answer;
pub mod api;
mod auth;
mod dashboard;
mod ingress;
pub mod server;
mod sns;
mod stream;
pub mod tally;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use tokio::sync::Notify;

use crate::config::Config;
use crate::store::Store;
use answer::Answer;
pub use stream::{ChangeFeed, ChangeMask};

/// Largest body an admin API call (e.g. `POST /v1/replay`) may send.
pub const ADMIN_MAX_BODY_BYTES: usize = 64 * 1024;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The store.
    pub store: Arc<dyn Store>,
    /// Wakes the workers when an async event is logged.
    pub wake: Arc<Notify>,
    /// Wakes this node's senders after a commit that wrote delivery rows (docs/contract.md,
    /// forwarding).
    pub forward_wake: Arc<Notify>,
    /// Where "now" comes from.
    pub clock: crate::domain::clock::Clock,
    /// What this node counts per source as deliveries pass, its rate-limit buckets and the
    /// backlog ingress compares against: one entry per configured source.
    pub tallies: Arc<tally::SourceTallies>,
    /// The change feed `GET /v1/stream` follows, and its cap.
    pub feed: Arc<ChangeFeed>,
    /// Wrong admin tokens per peer, which make a guessing peer wait.
    pub token_guesses: Arc<auth::TokenGuesses>,
    /// Each source's and destination's secrets, replaceable without a restart.
    pub secrets: crate::config::LiveSecrets,
    /// Bytes of request bodies being read at once, bounded by `max_buffered_body_bytes`.
    pub body_budget: BodyBudget,
    /// One permit per core for costly signature checks (ed25519, lists of signatures), which
    /// run on blocking threads: a flood of them waits here instead of taking every core.
    pub costly_checks: Arc<tokio::sync::Semaphore>,
    /// Each destination's circuit breaker on this node (docs/forwarding.md), for `GET
    /// /v1/destinations`.
    pub circuits: crate::forward::sender::Circuits,
}

/// The bytes of request bodies all connections may hold at once, and one peer (an IPv6
/// /64) of them: without it, `max_connections` unauthenticated clients could each pin
/// `max_body_bytes`, and one host could take the whole budget.
#[derive(Clone)]
pub struct BodyBudget {
    all: Arc<tokio::sync::Semaphore>,
    per_peer: usize,
    peers: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

/// Bytes of the budget held by one body, given back when dropped.
pub struct BodyHold {
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
    peer: std::net::IpAddr,
    bytes: usize,
    peers: Arc<std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>>,
}

impl BodyBudget {
    /// A budget of `bytes`, of which one peer may hold `per_peer`.
    pub fn new(bytes: usize, per_peer: usize) -> Self {
        Self {
            all: Arc::new(tokio::sync::Semaphore::new(
                bytes.min(tokio::sync::Semaphore::MAX_PERMITS),
            )),
            per_peer,
            peers: Arc::default(),
        }
    }

    /// An empty hold of a body from `peer`.
    pub fn hold(&self, peer: std::net::IpAddr) -> BodyHold {
        BodyHold {
            permit: None,
            peer: server::peer_key(peer),
            bytes: 0,
            peers: Arc::clone(&self.peers),
        }
    }

    /// Adds `bytes` to `hold`; `false` (and nothing taken) when they are not free now,
    /// in the whole budget or in its peer's share.
    pub fn try_take(&self, hold: &mut BodyHold, bytes: usize) -> bool {
        {
            let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            let held = peers.entry(hold.peer).or_default();
            if *held + bytes > self.per_peer {
                if *held == 0 {
                    peers.remove(&hold.peer);
                }
                return false;
            }
            *held += bytes;
        }
        let permits = u32::try_from(bytes).unwrap_or(u32::MAX);
        match Arc::clone(&self.all).try_acquire_many_owned(permits) {
            Ok(taken) => {
                hold.bytes += bytes;
                match hold.permit.as_mut() {
                    Some(permit) => permit.merge(taken),
                    None => hold.permit = Some(taken),
                }
                true
            }
            Err(_) => {
                hold.give_back(bytes);
                false
            }
        }
    }
}

impl BodyHold {
    fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(held) = peers.get_mut(&self.peer) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                peers.remove(&self.peer);
            }
        }
    }
}

impl Drop for BodyHold {
    fn drop(&mut self) {
        self.give_back(self.bytes);
    }
}

/// The OpenAPI document's frame: title, the admin token scheme, tags.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "inhook", description = "A webhook receiver that is correct under retries, duplicates and reordering."),
    modifiers(&AdminTokenScheme),
    paths(
        api::aggregates::aggregate_one,
        api::aggregates::aggregate_forget,
        api::aggregates::aggregate_reset
    ),
    tags(
        (name = "ingress", description = "Signed deliveries from publishers"),
        (name = "state", description = "The projections: every source's aggregates, and the typed presence and save slot views"),
        (name = "events", description = "The event log and replay"),
        (name = "forwarding", description = "Destinations: applied events forwarded to the user's application"),
        (name = "observability", description = "Counts and metrics"),
        (name = "admin", description = "Administration"),
        (name = "health", description = "Probes"),
    )
)]
struct ApiDoc;

/// Declares the `admin_token` bearer scheme the `/v1/*` routes name.
struct AdminTokenScheme;

impl utoipa::Modify for AdminTokenScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        openapi
            .components
            .get_or_insert_with(Default::default)
            .add_security_scheme(
                "admin_token",
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
    }
}

/// The documented routes and the OpenAPI document built from their handlers.
fn documented_routes(state: &AppState) -> (Router<AppState>, utoipa::openapi::OpenApi) {
    use utoipa::OpenApi;
    use utoipa_axum::{router::OpenApiRouter, routes};
    let admin = OpenApiRouter::new()
        .routes(routes!(api::presence::presence_list))
        .routes(routes!(api::presence::presence_one))
        .routes(routes!(api::saves::save_one))
        .routes(routes!(api::saves::saves_list))
        .routes(routes!(api::aggregates::aggregates_list))
        // The key's parts span path segments: routed as a wildcard, documented as `{key}`
        // (in [`ApiDoc`]) since OpenAPI has no multi-segment parameter.
        .route(
            "/v1/sources/{source}/aggregates/{*key}",
            axum::routing::get(api::aggregates::aggregate_one)
                .delete(api::aggregates::aggregate_forget)
                // `…/{key}/reset`: the key's parts end where `/reset` begins.
                .post(api::aggregates::aggregate_reset),
        )
        .routes(routes!(api::overview::overview))
        .routes(routes!(api::stats::stats))
        .routes(routes!(stream::stream))
        .routes(routes!(api::events::events_list))
        .routes(routes!(api::events::event_one))
        .routes(routes!(api::replay::event_replay))
        .routes(routes!(api::replay::replay_bulk))
        .routes(routes!(api::replay::replay_job))
        .routes(routes!(admin::reload))
        .routes(routes!(api::destinations::destinations_list))
        .routes(routes!(api::destinations::deliveries_list))
        .routes(routes!(api::destinations::delivery_one))
        .routes(routes!(api::delivery_replay::delivery_replay))
        .routes(routes!(api::delivery_replay::delivery_skip))
        .routes(routes!(api::delivery_replay::destination_replay_bulk))
        .routes(routes!(api::delivery_replay::destination_replay_job))
        .routes(routes!(api::alerts::alerts_list))
        // Admin bodies are small filters: anything larger is refused (413), not stored.
        .route_layer(DefaultBodyLimit::max(ADMIN_MAX_BODY_BYTES))
        .route_layer(middleware::from_fn(refuse_nul_in_url))
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_admin,
        ));
    let metrics = OpenApiRouter::new().routes(routes!(api::overview::metrics));
    let metrics = if state.config.admin.metrics_public {
        metrics
    } else {
        metrics.route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_admin,
        ))
    };
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(ingress::receive, ingress::handshake_get))
        .routes(routes!(dashboard::index))
        .routes(routes!(api::health::healthz))
        .routes(routes!(api::health::readyz))
        .routes(routes!(admin::openapi_json))
        .merge(metrics)
        .merge(admin)
        .split_for_parts()
}

/// Builds the router: ingress, read API, health, and `/openapi.json` describing them.
pub fn router(state: AppState) -> Router {
    let (documented, document) = documented_routes(&state);
    let document = admin::OpenApiJson(
        document
            .to_json()
            .unwrap_or_else(|_| "{}".to_owned())
            .into(),
    );
    let ceiling = if state.config.admin.bench_ceiling {
        // Reads the body and answers a fixed 202: what the HTTP stack costs with no work.
        Router::new().route(
            "/bench/ceiling",
            post(|_body: axum::body::Bytes| async {
                (
                    axum::http::StatusCode::ACCEPTED,
                    axum::Json(serde_json::json!({"status": "accepted"})),
                )
            }),
        )
    } else {
        Router::new()
    };
    documented
        .merge(ceiling)
        .layer(axum::Extension(document))
        .layer(middleware::from_fn(auth::mark_admin_answers))
        // The ingress handler enforces each source's limit itself, after the 404 check.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Builds the router of `POST /webhooks/{source}` alone (and its `GET` handshakes): what a
/// service embedding inhook mounts when it serves no read API (docs/library.md).
pub fn ingress_router(state: AppState) -> Router {
    Router::new()
        .route(
            "/webhooks/{source}",
            post(ingress::receive).get(ingress::handshake_get),
        )
        // The ingress handler enforces each source's limit itself, after the 404 check.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
}

/// Refuses a URL holding a NUL character (`%00`): no id or name can hold one, and
/// PostgreSQL cannot even compare text with it, so it is a 400 before any query.
async fn refuse_nul_in_url(request: Request, next: Next) -> Response {
    let uri = request.uri();
    if uri.path().contains("%00") || uri.query().is_some_and(|q| q.contains("%00")) {
        return axum::response::IntoResponse::into_response(Answer::BadRequest(
            "the URL holds a NUL character (%00), which no id or name can hold".into(),
        ));
    }
    next.run(request).await
}
