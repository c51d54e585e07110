//! `/v1/alerts`: the notices the `[[alerts]]` rules decided (docs/api.md, alerts), newest first.

use std::collections::BTreeMap;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::extract::Query;
use super::page_size;
use crate::domain::clock;
use crate::http::answer::{AdminFailures, Answer};
use crate::http::AppState;
use crate::store::alerts::{AlertRecord, NoticeChannel};

/// `?limit=&cursor=` of the alerts.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct AlertsQuery {
    /// Page size, 1..=500 (default 100).
    #[param(minimum = 1, maximum = 500)]
    limit: Option<u64>,
    /// `next_cursor` of the previous page.
    cursor: Option<i64>,
}

/// One notice: a rule started firing, repeated or resolved.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AlertView {
    /// The notice's id (rising in the order notices were decided).
    id: i64,
    /// The rule's name.
    alert: String,
    /// `firing` or `resolved`.
    state: String,
    /// What the rule watches: `dead`, `gap_held`, `destination_failing`, `circuit_open`,
    /// `rejections`, `backlog`, `source_silent` or `store_unavailable`.
    on: String,
    /// The source it is about, for source rules.
    source: Option<String>,
    /// The destination it is about, for destination rules.
    destination: Option<String>,
    /// When the alert started firing (RFC 3339).
    since: String,
    /// When this notice was decided (RFC 3339).
    at: String,
    /// Whether it repeats a firing notice (at most one per `repeat_s`).
    repeat: bool,
    /// One line a person reads.
    summary: String,
    /// The figures that fired it (or, resolved, the figures then).
    figures: BTreeMap<String, i64>,
    /// The node that decided it, for a rule over a node's own view (`destination_failing`,
    /// `circuit_open`, `rejections`, `store_unavailable`); null for one decided once across
    /// nodes.
    node: Option<String>,
    /// Each channel the notice goes to, and whether it was sent.
    channels: Vec<ChannelView>,
}

/// One channel's copy of a notice.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ChannelView {
    /// `destination:NAME`, `slack#HASH` or `email:RECIPIENTS#HASH` (a hash of the URL, never
    /// the URL: it holds credentials).
    channel: String,
    /// `pending` (not sent yet: waiting, or being retried), `sent` or `given_up`.
    state: String,
    /// Attempts made so far.
    attempts: i64,
    /// When it was sent (RFC 3339); null until then.
    sent_at: Option<String>,
    /// The last failed attempt's reason; null when none failed.
    error: Option<String>,
}

fn channel_view(channel: NoticeChannel) -> ChannelView {
    ChannelView {
        channel: channel.channel,
        state: channel.state,
        attempts: channel.attempts,
        sent_at: channel.sent_ms.map(clock::rfc3339),
        error: channel.error,
    }
}

/// A page of notices, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct AlertPage {
    /// The notices.
    items: Vec<AlertView>,
    /// Pass as `cursor` for the next page; null on the last.
    next_cursor: Option<i64>,
}

fn view(alert: AlertRecord) -> AlertView {
    AlertView {
        id: alert.id,
        alert: alert.alert,
        state: alert.state,
        on: alert.on,
        source: alert.source,
        destination: alert.destination,
        since: clock::rfc3339(alert.since_ms),
        at: clock::rfc3339(alert.at_ms),
        repeat: alert.repeat,
        summary: alert.summary,
        figures: alert.figures,
        node: alert.node,
        channels: alert.channels.into_iter().map(channel_view).collect(),
    }
}

/// The alerts' notices, newest first.
#[utoipa::path(get, path = "/v1/alerts", tag = "observability", security(("admin_token" = [])),
    params(AlertsQuery),
    responses(
        (status = 200, description = "The notices, newest first", body = AlertPage),
        AdminFailures,
    ))]
pub(crate) async fn alerts_list(
    State(state): State<AppState>,
    Query(query): Query<AlertsQuery>,
) -> Result<Response, Answer> {
    let limit = page_size(query.limit)?;
    let alerts = state.store.alerts(query.cursor, limit).await?;
    let next_cursor = (alerts.len() == limit)
        .then(|| alerts.last().map(|a| a.id))
        .flatten();
    let items = alerts.into_iter().map(view).collect();
    Ok(Json(AlertPage { items, next_cursor }).into_response())
}
