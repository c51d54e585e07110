//! What both stores share below the SQL dialect: the event columns, the
//! conditions of an [`EventFilter`] (only the placeholder syntax differs: `?1`
//! in SQLite, `$1` in PostgreSQL), and the decoding of stored values.

use super::backend::{text, Param};
use super::{sql, EventFilter, Failure, StoreError};
use crate::domain::search::TypePattern;
use crate::domain::{EventId, EventStatus};

/// History kind recorded on an event when its `event_id` is resent with another body.
pub(crate) const CONFLICTING_DUPLICATE: &str = "conflicting_duplicate";
/// The history detail of a [`CONFLICTING_DUPLICATE`].
pub(crate) const CONFLICT_DETAIL: &str = "event_id resent with a different body (publisher error)";

/// Conditions and their values; `placeholder(n)` writes the n-th (1-based) placeholder.
pub(crate) fn filter_sql<'f>(
    filter: &'f EventFilter,
    placeholder: fn(usize) -> String,
) -> (Vec<String>, Vec<Param<'f>>) {
    let mut clauses = Vec::new();
    let mut values = Vec::new();
    let mut push = |column: &str, op: &str, value: Param<'f>| {
        values.push(value);
        clauses.push(format!("{column} {op} {}", placeholder(values.len())));
    };
    if let Some(source) = &filter.source {
        push("source", "=", text(source));
    }
    if let Some(aggregate) = &filter.aggregate {
        push("aggregate", "=", text(aggregate));
    }
    if let Some(from) = filter.received_from_ms {
        push("received_at", ">=", Param::Int(from));
    }
    if let Some(to) = filter.received_to_ms {
        push("received_at", "<", Param::Int(to));
    }
    if let Some(event_id) = &filter.event_id {
        push("event_id", "=", text(event_id));
    }
    match &filter.event_type {
        Some(TypePattern::Exact(t)) => push("event_type", "=", text(t)),
        Some(TypePattern::Prefix(p)) if !p.is_empty() => {
            // Characters on both stores; a literal count, the prefix a parameter.
            let n = p.chars().count();
            push(&format!("substr(event_type, 1, {n})"), "=", text(p));
        }
        Some(TypePattern::Prefix(_)) | None => {}
    }
    if let Some(status) = filter.status {
        clauses.push(status_condition(status));
    }
    for m in &filter.search {
        values.extend([text(&m.field), text(&m.key)]);
        let (field, key) = (placeholder(values.len() - 1), placeholder(values.len()));
        let source = match &filter.source {
            Some(source) => {
                values.push(text(source));
                format!(" AND source = {}", placeholder(values.len()))
            }
            None => String::new(),
        };
        // The index's key prefix (field, value[, source]) finds the rows; the events'
        // primary key the events.
        clauses.push(format!(
            "id IN (SELECT event_row FROM event_search WHERE field = {field} AND value = {key}{source})"
        ));
    }
    (clauses, values)
}

/// Writes `logged`'s search index rows (its declared fields' values) for its event `row`,
/// in the transaction that logs it.
pub(crate) async fn write_search<I: super::backend::Tx>(
    io: &I,
    row: i64,
    logged: &super::EventRow,
) -> Result<(), StoreError> {
    if logged.search.is_empty() {
        return Ok(());
    }
    let mut params = Vec::with_capacity(logged.search.len() * 2 + 2);
    params.extend([text(&logged.source), Param::Int(row)]);
    let mut tuples = Vec::with_capacity(logged.search.len());
    for (field, key) in &logged.search {
        params.extend([text(field), text(key)]);
        let n = params.len();
        tuples.push(format!("(${}, ${n}, $1, $2)", n - 1));
    }
    io.execute(
        &format!(
            "INSERT INTO event_search (field, value, source, event_row) VALUES {}
             ON CONFLICT DO NOTHING",
            tuples.join(", ")
        ),
        &params,
    )
    .await
    .map(drop)
}

/// `status = 'x'` written as a literal (a closed set, so no injection), with its partial
/// index's own condition beside it: SQLite uses a partial index only when the query names
/// its condition, and neither store uses one for a bound parameter, so without both a page
/// of rare statuses walked the whole log by id.
pub(crate) fn status_condition(status: EventStatus) -> String {
    let index = if status.is_undecided() {
        Some(sql::undecided!())
    } else if !matches!(status, EventStatus::Processed | EventStatus::Erased) {
        Some(sql::rare_decided!())
    } else {
        None
    };
    let literal = format!("status = '{}'", status.as_str());
    match index {
        Some(index) => format!("{index} AND {literal}"),
        None => literal,
    }
}

/// The conditions joined into a `WHERE` body (true when there are none).
pub(crate) fn where_of(clauses: &[String]) -> String {
    if clauses.is_empty() {
        "TRUE".into()
    } else {
        clauses.join(" AND ")
    }
}

/// A stored JSON column that no longer parses.
pub(crate) fn json_err(err: serde_json::Error) -> StoreError {
    StoreError::Internal(Failure::caused(
        format!("corrupt JSON in store: {err}"),
        err,
    ))
}

/// A stored status.
pub(crate) fn parse_status(raw: &str) -> Result<EventStatus, StoreError> {
    EventStatus::parse(raw)
        .ok_or_else(|| StoreError::Internal(format!("unknown status {raw:?} in store").into()))
}

/// A stored event id.
pub(crate) fn parse_event_id(raw: &str) -> Result<EventId, StoreError> {
    // The widest id rule: a json source's ids are logged under it.
    EventId::parse_located(raw)
        .map_err(|p| StoreError::Internal(format!("stored event_id {p}").into()))
}

/// Kept request headers as a JSON object text, or NULL when there are none.
pub(crate) fn headers_json(headers: &[(String, String)]) -> Option<String> {
    (!headers.is_empty()).then(|| {
        // Borrowed, by name, the last of a repeated name kept: no copy of any header.
        let map: std::collections::BTreeMap<&str, &str> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        serde_json::to_string(&map).expect("a map of strings serializes")
    })
}
