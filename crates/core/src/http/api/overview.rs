//! What an operator watches: per-source counts and the Prometheus text.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use std::collections::{BTreeMap, HashMap};

use crate::domain::clock;
use crate::domain::kind::SourceKind;
use crate::domain::EventStatus;
use crate::http::answer::{AdminFailures, Answer, ErrorBody};
use crate::http::AppState;
use crate::store::stats::StatScope;

/// Prometheus text; the backlog gauges are read from the store at each scrape.
#[utoipa::path(get, path = "/metrics", tag = "observability", security((), ("admin_token" = [])),
    responses(
        (status = 200, description = "Prometheus text exposition", body = String,
            content_type = "text/plain"),
        (status = 401, description = "Admin token missing or wrong (unless `metrics_public`)", body = ErrorBody),
    ))]
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    match state.store.undecided_counts().await {
        Ok(counts) => {
            for source in &state.config.sources {
                let count = |wanted: &[EventStatus]| count_of(&counts, &source.name, wanted);
                let held = count(&[EventStatus::Held]);
                let backlog = count(&EventStatus::UNDECIDED);
                crate::operations::metrics::backlog(&source.name, held, backlog);
            }
        }
        Err(err) => tracing::warn!(error = %err, "backlog gauges not refreshed"),
    }
    for destination in state.config.destinations.iter() {
        match state.store.destination_stats(&destination.name).await {
            Ok(stats) => {
                let open = !matches!(
                    state.circuits.state(&destination.name),
                    None | Some(crate::forward::circuit::CircuitState::Closed)
                );
                crate::operations::metrics::forward_gauges(
                    &destination.name,
                    stats.backlog,
                    stats.blocked_aggregates,
                    open,
                );
            }
            Err(err) => tracing::warn!(error = %err, "forwarding gauges not refreshed"),
        }
    }
    let text = crate::operations::metrics::render().unwrap_or_default();
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4",
        )],
        text,
    )
        .into_response()
}

/// Events of `source` in any of the `wanted` statuses, from [`crate::store::Reads::status_counts`].
fn count_of(counts: &[(String, EventStatus, u64)], source: &str, wanted: &[EventStatus]) -> u64 {
    counts
        .iter()
        .filter(|(name, status, _)| name == source && wanted.contains(status))
        .map(|(_, _, n)| n)
        .sum()
}

/// One source's counts in the overview.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SourceOverview {
    /// The source.
    source: String,
    /// What it feeds.
    kind: SourceKind,
    /// `sync` or `async`.
    mode: &'static str,
    /// The preset its keys come from (docs/providers.md), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    preset: Option<String>,
    /// Events logged.
    received: u64,
    /// Events applied.
    processed: u64,
    /// Duplicates answered by this node since it started.
    duplicates: u64,
    /// Duplicate `event_id`s with a different body seen by this node since it started.
    conflicting_duplicates: u64,
    /// Events ignored as stale.
    stale: u64,
    /// Events of unsupported types.
    unsupported: u64,
    /// Events held for a gap.
    held: u64,
    /// Events waiting for a retry.
    retrying: u64,
    /// Dead events.
    dead: u64,
    /// Events not yet decided.
    backlog: u64,
    /// The source's endpoint handshake (docs/configuration.md, `handshake`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    handshake: Option<&'static str>,
    /// Handshakes answered by this node since it started (never stored): sources with a
    /// handshake only.
    #[serde(skip_serializing_if = "Option::is_none")]
    handshakes: Option<u64>,
    /// When the last delivery arrived, whatever its answer (RFC 3339); null when none did
    /// within `stats_retention_days`.
    last_delivery_at: Option<String>,
    /// Deliveries refused in the last 24 hours by every node, by the answer's `error` code.
    rejected: BTreeMap<String, u64>,
}

/// Per source, events by status.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Overview {
    /// Every configured source.
    sources: Vec<SourceOverview>,
    /// When these counts were read (RFC 3339).
    generated_at: String,
}

/// Per source, events by status and duplicates seen by this node.
#[utoipa::path(get, path = "/v1/overview", tag = "observability", security(("admin_token" = [])),
    responses(
        (status = 200, description = "The counts", body = Overview),
        AdminFailures,
    ))]
pub(crate) async fn overview(State(state): State<AppState>) -> Result<Response, Answer> {
    let counts = state.store.status_counts().await?;
    let now_ms = clock::now_ms();
    let figures = recent_figures(&state, now_ms).await?;
    let tallies = &state.tallies;
    let sources: Vec<_> = state
        .config
        .sources
        .iter()
        .map(|source| {
            let count = |wanted: &[EventStatus]| count_of(&counts, &source.name, wanted);
            SourceOverview {
                source: source.name.clone(),
                kind: source.kind.source_kind(),
                preset: source.preset.clone(),
                mode: if source.mode == crate::config::Mode::Sync {
                    "sync"
                } else {
                    "async"
                },
                received: count(&EventStatus::ALL),
                processed: count(&[EventStatus::Processed]),
                duplicates: tallies.of(&source.name).map_or(0, |t| t.duplicates()),
                conflicting_duplicates: tallies
                    .of(&source.name)
                    .map_or(0, |t| t.conflicting_duplicates()),
                stale: count(&[EventStatus::IgnoredStale]),
                unsupported: count(&[EventStatus::IgnoredUnsupported]),
                held: count(&[EventStatus::Held]),
                retrying: count(&[EventStatus::Retrying]),
                dead: count(&[EventStatus::Dead]),
                backlog: count(&EventStatus::UNDECIDED),
                handshake: source.handshake.map(|h| h.name()),
                handshakes: source
                    .handshake
                    .map(|_| tallies.of(&source.name).map_or(0, |t| t.handshakes())),
                last_delivery_at: figures
                    .get(&source.name)
                    .and_then(|f| f.last_at)
                    .map(clock::rfc3339),
                rejected: figures
                    .get(&source.name)
                    .map(|f| f.rejected.clone())
                    .unwrap_or_default(),
            }
        })
        .collect();
    Ok(Json(Overview {
        sources,
        generated_at: clock::rfc3339(now_ms),
    })
    .into_response())
}

/// How long back the overview counts rejections.
const REJECTED_SPAN_MS: i64 = 86_400_000;

/// Per source, its rejections of the last day and its last delivery, stored or not yet
/// flushed (docs/api.md, stats).
async fn recent_figures(
    state: &AppState,
    now_ms: i64,
) -> Result<HashMap<String, crate::operations::stats::Figures>, Answer> {
    let names: Vec<String> = state
        .config
        .sources
        .iter()
        .map(|s| s.name.clone())
        .collect();
    let since_ms = crate::operations::stats::minute_of(now_ms - REJECTED_SPAN_MS);
    let stored = state.store.source_stats(names.clone(), since_ms).await?;
    let mut figures: HashMap<String, crate::operations::stats::Figures> = HashMap::new();
    for (source, figure, n) in &stored.rejected {
        figures
            .entry(source.clone())
            .or_default()
            .add_stored(figure, *n, *n);
    }
    for (source, at) in &stored.last_delivery {
        let f = figures.entry(source.clone()).or_default();
        f.last_at = f.last_at.max(Some(*at));
    }
    let recorder = crate::operations::stats::recorder();
    for name in names {
        let unflushed = recorder.unflushed(StatScope::Source, &name, (i64::MIN, i64::MAX));
        let f = figures.entry(name).or_default();
        for (minute, counted) in &unflushed {
            f.last_at = f.last_at.max(counted.last_at);
            if *minute >= since_ms {
                for (reason, n) in &counted.rejected {
                    *f.rejected.entry(reason.clone()).or_insert(0) += n;
                }
            }
        }
    }
    Ok(figures)
}
