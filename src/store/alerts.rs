//! The alerts' history (docs/api.md, alerts) and the figures the alert rules read from the
//! log, written once for both stores.

use std::collections::BTreeMap;

use serde::Serialize;

use super::backend::{text, Cell, Param, Tx};
use super::rows::{all, Columns};
use super::StoreError;

/// One notice as kept: a rule started firing, repeated or resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AlertRecord {
    /// The row's id (rising in the order notices were decided).
    pub id: i64,
    /// The rule's name.
    pub alert: String,
    /// `firing` or `resolved`.
    pub state: String,
    /// What the rule watches (`dead`, `gap_held`, …).
    pub on: String,
    /// The source it is about, for source rules.
    pub source: Option<String>,
    /// The destination it is about, for destination rules.
    pub destination: Option<String>,
    /// When the alert started firing (unix ms).
    pub since_ms: i64,
    /// When this notice was decided (unix ms).
    pub at_ms: i64,
    /// Whether it repeats a firing notice.
    pub repeat: bool,
    /// One line a person reads.
    pub summary: String,
    /// The figures that fired it.
    pub figures: BTreeMap<String, i64>,
}

/// One source's marks in the log the alert rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceMarks {
    /// When its latest delivery was received (unix ms).
    pub last_received_ms: Option<i64>,
    /// When its oldest held event was received (unix ms).
    pub oldest_held_ms: Option<i64>,
}

const COLUMNS: &str =
    "id, alert, state, on_kind, source, destination, since, at, repeated, summary, figures";

fn record(c: &mut Columns) -> Result<AlertRecord, StoreError> {
    Ok(AlertRecord {
        id: c.int()?,
        alert: c.text()?,
        state: c.text()?,
        on: c.text()?,
        source: c.opt_text()?,
        destination: c.opt_text()?,
        since_ms: c.int()?,
        at_ms: c.int()?,
        repeat: c.boolean()?,
        summary: c.text()?,
        figures: serde_json::from_str(&c.text()?).map_err(super::filter::json_err)?,
    })
}

/// Keeps `alert` (its id is the store's); the new row's id.
pub(crate) async fn insert<I: Tx>(io: &I, alert: &AlertRecord) -> Result<i64, StoreError> {
    let figures = serde_json::to_string(&alert.figures).map_err(super::filter::json_err)?;
    let params = [
        text(&alert.alert),
        text(&alert.state),
        text(&alert.on),
        Param::opt_text(alert.source.as_deref()),
        Param::opt_text(alert.destination.as_deref()),
        Param::Int(alert.since_ms),
        Param::Int(alert.at_ms),
        Param::Int(i64::from(alert.repeat)),
        text(&alert.summary),
        Param::owned(figures),
    ];
    io.insert_row(
        "INSERT INTO alerts (alert, state, on_kind, source, destination, since, at, repeated, \
         summary, figures) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
         ON CONFLICT DO NOTHING",
        &params,
    )
    .await?
    .ok_or_else(|| StoreError::Internal("an alert row was not written".into()))
}

/// Kept notices, newest first, before the id `before` when given.
pub(crate) async fn page<I: Tx>(
    io: &I,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<AlertRecord>, StoreError> {
    let rows = io
        .query(
            &format!(
                "SELECT {COLUMNS} FROM alerts WHERE (CAST($1 AS BIGINT) IS NULL OR id < $1) \
                 ORDER BY id DESC LIMIT $2"
            ),
            &[Param::OptInt(before), Param::Int(limit as i64)],
        )
        .await?;
    all(rows, record)
}

/// The latest receipt and the oldest held event of `source`, each read through the
/// `(source, id)` and `(source, status, id)` indexes: one row each, whatever the log holds.
pub(crate) async fn source_marks<I: Tx>(io: &I, source: &str) -> Result<SourceMarks, StoreError> {
    let first =
        |rows: Vec<Vec<Cell>>| match rows.into_iter().next().and_then(|r| r.into_iter().next()) {
            Some(Cell::Int(at)) => Some(at),
            _ => None,
        };
    let last = io
        .query(
            "SELECT received_at FROM events WHERE source = $1 ORDER BY id DESC LIMIT 1",
            &[text(source)],
        )
        .await?;
    let held = io
        .query(
            "SELECT received_at FROM events WHERE source = $1 AND status = 'held' \
             ORDER BY id LIMIT 1",
            &[text(source)],
        )
        .await?;
    Ok(SourceMarks {
        last_received_ms: first(last),
        oldest_held_ms: first(held),
    })
}
