//! `/v1/stats`: one source's or destination's figures over time (docs/api.md, stats), from
//! the store and this node's figures not yet flushed.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::Query;
use crate::domain::clock;
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::operations::stats::series::{parse_time, Window};
use crate::operations::stats::Figures;
use crate::store::stats::StatScope;

/// `?source=` or `?destination=`, and the window.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct StatsQuery {
    /// The source whose figures to read (this or `destination`).
    source: Option<String>,
    /// The destination whose figures to read (this or `source`).
    destination: Option<String>,
    /// The window's start: unix milliseconds or RFC 3339 (default: an hour before `to`),
    /// rounded down to a whole step.
    from: Option<String>,
    /// The window's end: unix milliseconds or RFC 3339 (default: now).
    to: Option<String>,
    /// Seconds per point, a whole number of minutes (default 60); at most 1440 points.
    step: Option<i64>,
}

/// One step's figures.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct StatsPoint {
    /// The step's start (RFC 3339).
    at: String,
    /// Deliveries posted, whatever their answer (a source).
    received: u64,
    /// Events logged; a batch counts each element (a source).
    accepted: u64,
    /// Deliveries answered as duplicates (a source).
    duplicate: u64,
    /// Deliveries refused, by the answer's `error` code (a source).
    rejected: BTreeMap<String, u64>,
    /// Events applied (a source).
    applied: u64,
    /// Events ignored as stale (a source).
    stale: u64,
    /// Events (a source) or deliveries (a destination) that went dead.
    dead: u64,
    /// Deliveries acknowledged (a destination).
    forwarded: u64,
    /// Delivery attempts that failed, the last of a dead delivery's included (a destination).
    failed: u64,
    /// Undecided events (a source) or undelivered deliveries (a destination), the greatest
    /// sampled in the step; null where no node sampled it.
    backlog: Option<u64>,
    /// Median lag in ms: receipt → decision (a source), applied → acknowledged (a
    /// destination); null where nothing was decided.
    lag_p50_ms: Option<u64>,
    /// 99th percentile of the same lag.
    lag_p99_ms: Option<u64>,
}

impl StatsPoint {
    fn of(at_ms: i64, f: Figures) -> Self {
        Self {
            at: clock::rfc3339(at_ms),
            received: f.received,
            accepted: f.accepted,
            duplicate: f.duplicate,
            rejected: f.rejected,
            applied: f.applied,
            stale: f.stale,
            dead: f.dead,
            forwarded: f.forwarded,
            failed: f.failed,
            backlog: f.backlog,
            lag_p50_ms: f.lag.quantile_ms(0.5),
            lag_p99_ms: f.lag.quantile_ms(0.99),
        }
    }
}

/// Figures per step, oldest first, one point per step of the window (empty steps too).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Stats {
    /// The source read, if a source was.
    #[serde(skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    /// The destination read, if a destination was.
    #[serde(skip_serializing_if = "Option::is_none")]
    destination: Option<String>,
    /// The first step's start (RFC 3339).
    from: String,
    /// The last step's end (RFC 3339).
    to: String,
    /// Seconds per point.
    step: i64,
    /// One per step.
    points: Vec<StatsPoint>,
}

/// A source's or a destination's figures per step, every node's added up.
#[utoipa::path(get, path = "/v1/stats", tag = "observability", security(("admin_token" = [])),
    params(StatsQuery),
    responses(
        (status = 200, description = "The figures", body = Stats),
        (status = 404, description = "`unknown_source` or `unknown_destination`", body = ErrorBody),
        AdminFailures,
    ))]
pub(crate) async fn stats(
    State(state): State<AppState>,
    Query(query): Query<StatsQuery>,
) -> Result<Response, Answer> {
    let (scope, name) = match (&query.source, &query.destination) {
        (Some(source), None) => {
            let known = state.config.sources.iter().any(|s| &s.name == source);
            known
                .then_some((StatScope::Source, source.clone()))
                .ok_or(Answer::NotFound("unknown_source"))?
        }
        (None, Some(destination)) => {
            let known = state
                .config
                .destinations
                .iter()
                .any(|d| &d.name == destination);
            known
                .then_some((StatScope::Destination, destination.clone()))
                .ok_or(Answer::NotFound("unknown_destination"))?
        }
        _ => {
            return Err(Answer::BadRequest(
                "give either source or destination".into(),
            ))
        }
    };
    let time = |field: &str, raw: &Option<String>| {
        raw.as_deref()
            .map(|raw| parse_time(field, raw))
            .transpose()
            .map_err(Answer::BadRequest)
    };
    let window = Window::of(
        time("from", &query.from)?,
        time("to", &query.to)?,
        query.step,
        clock::now_ms(),
    )
    .map_err(Answer::BadRequest)?;
    let cells = state
        .store
        .stats_series(scope, &name, (window.from_ms, window.to_ms, window.step_ms))
        .await?;
    let unflushed = crate::operations::stats::recorder().unflushed(
        scope,
        &name,
        (window.from_ms, window.to_ms),
    );
    let points = window
        .points(&cells, &unflushed)
        .into_iter()
        .enumerate()
        .map(|(i, f)| StatsPoint::of(window.from_ms + i as i64 * window.step_ms, f))
        .collect();
    let (source, destination) = match scope {
        StatScope::Source => (Some(name), None),
        StatScope::Destination => (None, Some(name)),
    };
    Ok(Json(Stats {
        source,
        destination,
        from: clock::rfc3339(window.from_ms),
        to: clock::rfc3339(window.to_ms),
        step: window.step_ms / 1000,
        points,
    })
    .into_response())
}
