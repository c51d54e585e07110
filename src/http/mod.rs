//! The HTTP layer: thin handlers over the signature, contract and store
//! modules. Every answer's code and body comes from [`answer`].

mod admin;
pub mod answer;
mod api;
mod dashboard;
mod ingress;
pub mod kept_headers;
pub mod server;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::post;
use axum::Router;
use subtle::ConstantTimeEq;
use tokio::sync::Notify;

use crate::config::Config;
use crate::store::Store;
use answer::Answer;
pub use api::aggregate_storage_key;

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The store.
    pub store: Arc<dyn Store>,
    /// Wakes the workers when an async event is logged.
    pub wake: Arc<Notify>,
    /// Where "now" comes from.
    pub clock: crate::clock::Clock,
    /// Duplicates answered by this node since it started, per source (for the overview).
    pub duplicates: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// Each source's secrets, replaceable without a restart.
    pub secrets: Secrets,
    /// Token buckets of the sources with a `rate_limit_per_s`.
    pub rate_limits: Arc<std::sync::Mutex<std::collections::HashMap<String, TokenBucket>>>,
    /// Undecided events per source, refreshed every second (for `max_backlog`).
    pub backlog: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// Duplicate `event_id`s with a different body (publisher errors) seen by this node, per source.
    pub conflicting_duplicates: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// One permit per core for costly signature checks (ed25519, lists of signatures), which
    /// run on blocking threads: a flood of them waits here instead of taking every core.
    pub costly_checks: Arc<tokio::sync::Semaphore>,
}

/// Each source's secrets, shared with the reload handler so that rotation needs no restart.
#[derive(Clone, Default)]
pub struct Secrets(
    Arc<std::sync::RwLock<std::collections::HashMap<String, Vec<crate::signature::Secret>>>>,
);

impl Secrets {
    /// The secrets of the configured sources.
    pub fn of(config: &Config) -> Self {
        let secrets = Self::default();
        secrets.replace(config);
        secrets
    }

    /// Takes the secrets of `config`'s sources; returns how many sources it updated.
    pub fn replace(&self, config: &Config) -> usize {
        let fresh: std::collections::HashMap<_, _> = config
            .sources
            .iter()
            .map(|s| (s.name.clone(), s.secrets.clone()))
            .collect();
        let count = fresh.len();
        if let Ok(mut current) = self.0.write() {
            *current = fresh;
        }
        count
    }

    /// Reads the config at `path` (and the environment) again and takes its secrets;
    /// returns how many sources it updated. On an error the secrets in force stay.
    pub fn reload(
        &self,
        path: Option<&std::path::Path>,
    ) -> Result<usize, crate::config::ConfigError> {
        Config::load(path).map(|config| self.replace(&config))
    }

    /// The secrets in force for `source` (its configured ones if never replaced).
    pub fn current(&self, source: &crate::config::SourceConfig) -> Vec<crate::signature::Secret> {
        self.0
            .read()
            .ok()
            .and_then(|map| map.get(&source.name).cloned())
            .unwrap_or_else(|| source.secrets.clone())
    }
}

/// A token bucket: `rate` tokens a second, holding at most one second's worth.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    last: std::time::Instant,
}

impl TokenBucket {
    /// Takes a token if there is one at `now`; otherwise says how long until the next.
    pub fn take(&mut self, rate: u32, now: std::time::Instant) -> Result<(), std::time::Duration> {
        let rate = f64::from(rate);
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64(
                (1.0 - self.tokens) / rate,
            ))
        }
    }

    /// Gives back a token taken for a delivery that turned out to cost nothing (a duplicate).
    pub fn refund(&mut self, rate: u32) {
        self.tokens = (self.tokens + 1.0).min(f64::from(rate));
    }

    /// A full bucket.
    pub fn full(rate: u32, now: std::time::Instant) -> Self {
        Self {
            tokens: f64::from(rate),
            last: now,
        }
    }
}

/// The OpenAPI document's frame: title, the admin token scheme, tags.
#[derive(utoipa::OpenApi)]
#[openapi(
    info(title = "inhook", description = "A webhook receiver that is correct under retries, duplicates and reordering."),
    modifiers(&AdminTokenScheme),
    tags(
        (name = "ingress", description = "Signed deliveries from publishers"),
        (name = "state", description = "The projections: presence and save slots"),
        (name = "events", description = "The event log and replay"),
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
        .routes(routes!(api::presence_list))
        .routes(routes!(api::presence_one))
        .routes(routes!(api::save_one))
        .routes(routes!(api::saves_list))
        .routes(routes!(api::overview))
        .routes(routes!(api::stream))
        .routes(routes!(api::events_list))
        .routes(routes!(api::event_one))
        .routes(routes!(api::event_replay))
        .routes(routes!(api::replay_bulk))
        .routes(routes!(api::replay_job))
        .routes(routes!(admin::reload))
        .route_layer(middleware::from_fn(refuse_nul_in_url))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    let metrics = OpenApiRouter::new().routes(routes!(api::metrics));
    let metrics = if state.config.metrics_public {
        metrics
    } else {
        metrics.route_layer(middleware::from_fn_with_state(state.clone(), require_admin))
    };
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(ingress::receive))
        .routes(routes!(dashboard::index))
        .routes(routes!(api::healthz))
        .routes(routes!(api::readyz))
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
    let ceiling = if state.config.bench_ceiling {
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

/// Lets a request through with the admin token, or from loopback when none is configured.
async fn require_admin(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let allowed = match &state.config.admin_token {
        Some(token) => request
            .headers()
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.expose()))),
        None => peer.ip().is_loopback(),
    };
    if allowed {
        next.run(request).await
    } else {
        axum::response::IntoResponse::into_response(Answer::Unauthorized)
    }
}
