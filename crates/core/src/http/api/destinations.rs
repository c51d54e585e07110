//! `/v1/destinations`: forwarding's destinations (docs/forwarding.md), their figures and
//! deliveries.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::{Path, Query};
use super::{aggregate_filter, page_size, status_filter};
use crate::config::DestinationConfig;
use crate::domain::clock;
use crate::domain::AggregateKey;
use crate::forward::circuit::CircuitState;
use crate::forward::queue::DeliveryStatus;
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::store::{DeliveryFilter, DeliveryRecord};

/// One destination as `GET /v1/destinations` shows it (never its secret or URL credentials).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DestinationView {
    /// The destination's name.
    name: String,
    /// The destination's type: `http`, `nats`, `rabbitmq`, `redis` or `in_process`.
    #[serde(rename = "type")]
    type_name: &'static str,
    /// Where messages go, any `user:password@` shown as `***@` and query values as `***`.
    url: String,
    /// This node's circuit breaker: `closed`, `open` or `probing`.
    circuit: &'static str,
    /// When an open circuit lets its probe go (RFC 3339).
    circuit_open_until: Option<String>,
    /// Deliveries waiting to be sent: pending and retrying.
    backlog: u64,
    /// Requests on the wire.
    in_flight: u64,
    /// Dead deliveries.
    dead: u64,
    /// Aggregates held by a dead in-order delivery.
    blocked_aggregates: u64,
    /// The latest failed attempt's result.
    last_error: Option<String>,
}

/// Every configured destination.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DestinationList {
    /// The destinations, in configuration order.
    items: Vec<DestinationView>,
}

/// `?status=&aggregate=&limit=&cursor=` of a destination's deliveries.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveriesQuery {
    /// Only deliveries in this status: `pending`, `in_flight`, `retrying`, `delivered`, `dead` or `skipped`.
    status: Option<String>,
    /// Only this aggregate's deliveries, in text form (docs/contract.md, json sources).
    aggregate: Option<String>,
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<i64>,
}

/// One attempt of a delivery.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryAttemptView {
    /// Its number since the delivery was written or last replayed (the first is 1).
    attempt: u32,
    /// When the request went (RFC 3339).
    at: String,
    /// How long until the answer or the failure, in milliseconds.
    duration_ms: i64,
    /// The HTTP status, when the application answered.
    status: Option<u16>,
    /// The attempt's result, e.g. `HTTP 500` or `no answer within 10 s`.
    result: String,
}

/// One delivery of an applied event to a destination.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryView {
    /// The delivery's id (rising in applied order).
    id: i64,
    /// The event's source.
    source: String,
    /// The event's id.
    event_id: String,
    /// The event's type.
    event_type: String,
    /// The aggregate, in text form (docs/contract.md, json sources).
    aggregate: String,
    /// The event's sequence.
    sequence: i64,
    /// The request's `webhook-id`, the same for every retry, replay and node.
    webhook_id: String,
    /// `pending`, `in_flight`, `retrying`, `delivered`, `dead` or `skipped`.
    status: &'static str,
    /// Requests started since it was written or last replayed.
    attempts: i64,
    /// A retrying delivery's next attempt (RFC 3339).
    next_attempt_at: Option<String>,
    /// The last failure.
    last_error: Option<String>,
    /// When it was written, with the decision (RFC 3339).
    created_at: String,
    /// When it got its 2xx (RFC 3339).
    delivered_at: Option<String>,
    /// Its attempts, oldest first (one delivery read alone; empty in listings).
    history: Vec<DeliveryAttemptView>,
}

/// A page of a destination's deliveries, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct DeliveryPage {
    /// The deliveries.
    items: Vec<DeliveryView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<i64>,
}

/// A stored delivery as the API shows it.
pub(super) fn delivery_view(record: &DeliveryRecord) -> DeliveryView {
    let time = |ms: Option<i64>| ms.map(clock::rfc3339);
    DeliveryView {
        id: record.id,
        source: record.source.clone(),
        event_id: record.event_id.clone(),
        event_type: record.event_type.clone(),
        aggregate: AggregateKey::text_of_stored(&record.aggregate),
        sequence: record.sequence,
        webhook_id: record.webhook_id.clone(),
        status: record.status.as_str(),
        attempts: record.attempts,
        next_attempt_at: time(record.next_attempt_at_ms),
        last_error: record.last_error.clone(),
        created_at: clock::rfc3339(record.created_at_ms),
        delivered_at: time(record.delivered_at_ms),
        history: record
            .history
            .iter()
            .map(|a| DeliveryAttemptView {
                attempt: a.attempt,
                at: clock::rfc3339(a.at_ms),
                duration_ms: a.duration_ms,
                status: a.status,
                result: a.result.clone(),
            })
            .collect(),
    }
}

/// The configured destination named `name`.
pub(super) fn destination<'a>(
    state: &'a AppState,
    name: &str,
) -> Result<&'a DestinationConfig, Answer> {
    state
        .config
        .destinations
        .iter()
        .find(|d| d.name == name)
        .ok_or(Answer::NotFound("unknown_destination"))
}

/// Every destination with its circuit, backlog, in flight, dead, blocked aggregates and last error.
#[utoipa::path(get, path = "/v1/destinations", tag = "forwarding", security(("admin_token" = [])),
    responses(
        (status = 200, description = "The destinations", body = DestinationList),
        AdminFailures,
    ))]
pub(crate) async fn destinations_list(State(state): State<AppState>) -> Result<Response, Answer> {
    let mut items = Vec::with_capacity(state.config.destinations.len());
    for destination in state.config.destinations.iter() {
        let stats = state.store.destination_stats(&destination.name).await?;
        let circuit = state.circuits.state(&destination.name);
        let (circuit, circuit_open_until) = match circuit {
            None | Some(CircuitState::Closed) => ("closed", None),
            Some(CircuitState::Open { until_ms }) => ("open", Some(clock::rfc3339(until_ms))),
            Some(CircuitState::Probing) => ("probing", None),
        };
        items.push(DestinationView {
            name: destination.name.clone(),
            type_name: destination.target.type_name(),
            url: destination.url_for_display(),
            circuit,
            circuit_open_until,
            backlog: stats.backlog,
            in_flight: stats.in_flight,
            dead: stats.dead,
            blocked_aggregates: stats.blocked_aggregates,
            last_error: stats.last_error,
        });
    }
    Ok(Json(DestinationList { items }).into_response())
}

/// A destination's deliveries, newest first.
#[utoipa::path(get, path = "/v1/destinations/{name}/deliveries", tag = "forwarding",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The destination", example = "app"),
        DeliveriesQuery),
    responses(
        (status = 200, description = "A page of the destination's deliveries", body = DeliveryPage),
        (status = 404, description = "`unknown_destination`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn deliveries_list(
    State(state): State<AppState>,
    Path(name): Path<String>,
    Query(query): Query<DeliveriesQuery>,
) -> Result<Response, Answer> {
    let destination = destination(&state, &name)?;
    let limit = page_size(query.limit)?;
    let filter = DeliveryFilter {
        status: status_filter(
            query.status.as_deref(),
            &DeliveryStatus::ALL,
            DeliveryStatus::as_str,
        )?,
        aggregate: aggregate_filter(query.aggregate.as_deref())?,
    };
    let page = state
        .store
        .deliveries(&destination.name, &filter, limit, query.cursor)
        .await?;
    Ok(Json(DeliveryPage {
        items: page.items.iter().map(delivery_view).collect(),
        next_cursor: page.next_cursor,
    })
    .into_response())
}

/// One delivery with its attempt history.
#[utoipa::path(get, path = "/v1/destinations/{name}/deliveries/{id}", tag = "forwarding",
    security(("admin_token" = [])),
    params(("name" = String, Path, description = "The destination", example = "app"),
        ("id" = i64, Path, description = "The delivery's id", example = 1)),
    responses(
        (status = 200, description = "The delivery and its attempts, oldest first", body = DeliveryView),
        (status = 404, description = "`unknown_destination` or `unknown_delivery`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn delivery_one(
    State(state): State<AppState>,
    Path((name, id)): Path<(String, i64)>,
) -> Result<Response, Answer> {
    let destination = destination(&state, &name)?;
    let record = state
        .store
        .delivery(&destination.name, id)
        .await?
        .ok_or(Answer::NotFound("unknown_delivery"))?;
    Ok(Json(delivery_view(&record)).into_response())
}
