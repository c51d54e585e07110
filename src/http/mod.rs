//! The HTTP layer: thin handlers over the signature, contract and store
//! modules. Every answer's code and body comes from [`answer`].

mod admin;
pub mod answer;
pub mod api;
mod auth;
mod dashboard;
mod ingress;
pub mod server;
mod stream;

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
    pub clock: crate::clock::Clock,
    /// Duplicates answered by this node since it started, per source (for the overview).
    pub duplicates: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// The change feed `GET /v1/stream` follows, and its cap.
    pub feed: Arc<ChangeFeed>,
    /// Wrong admin tokens per peer, which make a guessing peer wait.
    pub token_guesses: Arc<auth::TokenGuesses>,
    /// Each source's and destination's secrets, replaceable without a restart.
    pub secrets: crate::config::LiveSecrets,
    /// Token buckets of the sources with a `rate_limit_per_s`.
    pub rate_limits: Arc<std::sync::Mutex<std::collections::HashMap<String, TokenBucket>>>,
    /// Undecided events per source, refreshed every second (for `max_backlog`).
    pub backlog: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// Duplicate `event_id`s with a different body (publisher errors) seen by this node, per source.
    pub conflicting_duplicates: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
    /// Handshakes answered by this node since it started, per source (for the overview).
    pub handshakes: Arc<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
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

/// A token bucket: `rate` tokens a second, holding at most one second's worth.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    last: std::time::Instant,
}

impl TokenBucket {
    /// Takes a token if there is one at `now`; otherwise says how long until the next.
    pub fn take(&mut self, rate: u32, now: std::time::Instant) -> Result<(), std::time::Duration> {
        self.take_n(1, rate, now)
    }

    /// Takes `n` tokens (a batch's events) if there are that many at `now`; otherwise says
    /// how long until there are. A batch larger than the bucket (`rate`) needs it full and
    /// leaves it in debt by the difference, which later deliveries wait out: it is never
    /// refused for ever, and over time no more than `rate` events a second get in.
    pub fn take_n(
        &mut self,
        n: u64,
        rate: u32,
        now: std::time::Instant,
    ) -> Result<(), std::time::Duration> {
        let rate = f64::from(rate);
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate).min(rate);
        self.last = now;
        let n = n as f64;
        let needed = n.min(rate);
        if self.tokens >= needed {
            self.tokens -= n;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64(
                (needed - self.tokens) / rate,
            ))
        }
    }

    /// Gives back a token taken for a delivery that turned out to cost nothing (a duplicate).
    pub fn refund(&mut self, rate: u32) {
        self.refund_n(1, rate);
    }

    /// Gives back `n` tokens taken for events that cost nothing (a batch's duplicates).
    pub fn refund_n(&mut self, n: u64, rate: u32) {
        self.tokens = (self.tokens + n as f64).min(f64::from(rate));
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
    let metrics = if state.config.metrics_public {
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

#[cfg(test)]
mod tests {
    use super::TokenBucket;
    use std::time::{Duration, Instant};

    #[test]
    fn a_batch_spends_a_token_per_event_and_waits_for_as_many() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(10, start);
        assert_eq!(bucket.take_n(4, 10, start), Ok(()));
        assert_eq!(bucket.take_n(6, 10, start), Ok(()));
        // Empty: 3 events wait 0.3 s for 3 tokens; nothing is taken meanwhile.
        let wait = bucket.take_n(3, 10, start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.3).abs() < 1e-9, "{wait:?}");
        assert!(bucket
            .take_n(3, 10, start + Duration::from_millis(200))
            .is_err());
        assert_eq!(
            bucket.take_n(3, 10, start + Duration::from_millis(300)),
            Ok(())
        );
        // The duplicates of a batch give their tokens back, never beyond a full bucket.
        bucket.refund_n(25, 10);
        assert_eq!(
            bucket.take_n(10, 10, start + Duration::from_millis(300)),
            Ok(())
        );
        assert!(bucket.take(10, start + Duration::from_millis(300)).is_err());
    }

    #[test]
    fn a_batch_larger_than_the_bucket_takes_it_full_and_leaves_a_debt() {
        let start = Instant::now();
        let mut bucket = TokenBucket::full(2, start);
        // Not full: wait until it is, not for ever.
        assert_eq!(bucket.take(2, start), Ok(()));
        let wait = bucket.take_n(5, 2, start).unwrap_err();
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-9, "{wait:?}");
        let full = start + Duration::from_millis(500);
        assert_eq!(bucket.take_n(5, 2, full), Ok(()));
        // 3 tokens owed: the next event waits 2 s (4 tokens at 2 a second), not 0.5 s.
        let wait = bucket.take(2, full).unwrap_err();
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-9, "{wait:?}");
        assert_eq!(bucket.take(2, full + Duration::from_secs(2)), Ok(()));
    }
}
