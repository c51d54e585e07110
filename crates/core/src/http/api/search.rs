//! Searching a store (docs/api.md, search), for `GET /v1/events`, bulk replays and the
//! command line: the `where` conditions of a query string, resolved against the sources'
//! declarations into index lookups, or a bounded scan of the bodies.

use serde::Serialize;

use crate::config::Config;
use crate::domain::search::{SearchField, Where};
use crate::http::answer::Answer;
use crate::store::{EventFilter, EventRecord, SearchMatch, Store, StoreError};

/// The `where` values of a raw query string, each parsed (a query string may repeat it).
pub(crate) fn wheres_of_query(raw: Option<&str>) -> Result<Vec<Where>, Answer> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    form_urlencoded::parse(raw.as_bytes())
        .filter(|(key, _)| key == "where")
        .map(|(_, value)| Where::parse(&value).map_err(|e| Answer::BadRequest(e.to_string())))
        .collect()
}

/// Events a scan of an undeclared field reads per request at most (docs/api.md, search).
pub const SCAN_LIMIT: u64 = 10_000;
/// Events read per store query of a scan.
const SCAN_PAGE: usize = 500;

/// Whether `field` is indexed for `source`'s events (without a source: for some source's).
fn declared(config: &Config, source: Option<&str>, field: &SearchField) -> bool {
    let mut sources = config
        .sources
        .iter()
        .filter(|s| source.is_none_or(|name| s.name == name));
    sources.any(|s| s.search_fields.contains(field))
}

/// `wheres` split into index lookups (declared fields, their values keyed as the store
/// keys them) and conditions to scan for. An undeclared field is a 400 on a store that
/// encrypts bodies, and wherever `scan` is false (a bulk replay is no bounded page).
pub fn resolve(
    config: &Config,
    store: &dyn Store,
    source: Option<&str>,
    wheres: Vec<Where>,
    scan: bool,
) -> Result<(Vec<SearchMatch>, Vec<Where>), String> {
    let mut matches = Vec::new();
    let mut scans = Vec::new();
    let keys = store.keys();
    for w in wheres {
        if declared(config, source, &w.field) {
            matches.push(SearchMatch {
                key: keys.map_or_else(
                    || w.value.clone(),
                    |k| k.search_key(w.field.as_str(), &w.value),
                ),
                field: w.field.as_str().to_owned(),
            });
            continue;
        }
        let whose = match source {
            Some(source) => format!("source {source:?}'s"),
            None => "any source's".into(),
        };
        if keys.is_some_and(|k| k.encrypting()) {
            return Err(format!(
                "{} is not in {whose} search_fields: with encryption at rest on, only declared \
                 fields can be searched (docs/configuration.md, search_fields)",
                w.field
            ));
        }
        if !scan {
            return Err(format!(
                "{} is not in {whose} search_fields: a bulk replay selects by declared fields only \
                 (docs/configuration.md, search_fields)",
                w.field
            ));
        }
        scans.push(w);
    }
    Ok((matches, scans))
}

/// What a scan of undeclared fields did, in a page's answer.
#[derive(Debug, Clone, Copy, Serialize, utoipa::ToSchema)]
pub struct ScanView {
    /// Events whose bodies were read.
    pub scanned: u64,
    /// True when the scan stopped at its bound (10,000 events) before filling the page or
    /// reaching the oldest event: `next_cursor` goes on from the last event read.
    pub stopped: bool,
}

/// A page of the events `filter` matches whose bodies also hold every `scans` value,
/// newest first, reading at most `bound` events ([`SCAN_LIMIT`] for the API and the
/// command line): the items, the cursor to go on from, and what the scan read.
pub async fn scan_page(
    store: &dyn Store,
    filter: &EventFilter,
    scans: &[Where],
    limit: usize,
    mut cursor: Option<i64>,
    bound: u64,
) -> Result<(Vec<EventRecord>, Option<i64>, ScanView), StoreError> {
    let mut items = Vec::new();
    let mut scanned = 0u64;
    loop {
        let room = usize::try_from(bound - scanned).unwrap_or(usize::MAX);
        let page = store.events(filter, SCAN_PAGE.min(room), cursor).await?;
        for record in page.items {
            scanned += 1;
            cursor = Some(record.row);
            let body = serde_json::from_slice::<serde_json::Value>(&record.body);
            if body.is_ok_and(|body| scans.iter().all(|w| w.matches(&body))) {
                items.push(record);
                if items.len() == limit {
                    let view = ScanView {
                        scanned,
                        stopped: false,
                    };
                    return Ok((items, cursor, view));
                }
            }
        }
        if page.next_cursor.is_none() {
            let view = ScanView {
                scanned,
                stopped: false,
            };
            return Ok((items, None, view));
        }
        if scanned >= bound {
            let view = ScanView {
                scanned,
                stopped: true,
            };
            return Ok((items, cursor, view));
        }
    }
}
