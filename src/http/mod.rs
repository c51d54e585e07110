//! The HTTP layer: thin handlers over the signature, contract and store
//! modules. Every answer's code and body comes from [`answer`].

pub mod answer;
mod api;
mod dashboard;
mod ingress;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{ConnectInfo, DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
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

    /// A full bucket.
    pub fn full(rate: u32, now: std::time::Instant) -> Self {
        Self {
            tokens: f64::from(rate),
            last: now,
        }
    }
}

/// Builds the router: ingress, read API, health.
pub fn router(state: AppState) -> Router {
    let admin = Router::new()
        .route("/v1/presence", get(api::presence_list))
        .route("/v1/presence/{user_id}", get(api::presence_one))
        .route("/v1/saves/{player_id}/{save_slot}", get(api::save_one))
        .route("/v1/saves", get(api::saves_list))
        .route("/v1/overview", get(api::overview))
        .route("/v1/stream", get(api::stream))
        .route("/v1/events", get(api::events_list))
        .route("/v1/events/{source}/{event_id}", get(api::event_one))
        .route(
            "/v1/events/{source}/{event_id}/replay",
            post(api::event_replay),
        )
        .route("/v1/replay", post(api::replay_bulk))
        .route("/v1/replay/{job_id}", get(api::replay_job))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_admin));
    let metrics = Router::new().route("/metrics", get(api::metrics));
    let metrics = if state.config.metrics_public {
        metrics
    } else {
        metrics.route_layer(middleware::from_fn_with_state(state.clone(), require_admin))
    };
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
    Router::new()
        .merge(ceiling)
        .route("/webhooks/{source}", post(ingress::receive))
        .merge(metrics)
        .route("/", get(dashboard::index))
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .merge(admin)
        // The ingress handler enforces each source's limit itself, after the 404 check.
        .layer(DefaultBodyLimit::disable())
        .with_state(state)
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
