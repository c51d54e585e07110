//! The read API of docs/api.md (read API) and the health probes, one module per resource.
//! What every resource shares lives here: extractors whose rejections are
//! answered once, page sizes, source lookup, aggregate filters and masking.

pub(super) mod aggregates;
pub(super) mod alerts;
pub(super) mod delivery_replay;
pub(super) mod destinations;
pub(super) mod events;
pub(super) mod extract;
pub(super) mod health;
pub(super) mod overview;
pub(super) mod presence;
pub(super) mod replay;
pub(super) mod saves;
pub mod search;
pub(super) mod stats;

use serde::Deserialize;
use utoipa::IntoParams;

use super::answer::Answer;
use super::AppState;
use crate::config::SourceConfig;
use crate::domain::kind::SourceKind;
use crate::domain::AggregateKey;

/// Most items one page may hold.
const MAX_PAGE: usize = 500;

/// Optional `?source=` choosing among several sources of one kind.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct SourceQuery {
    /// The source to read (default: the first configured source of this kind).
    source: Option<String>,
}

/// A page size from `?limit=`, checked against [`MAX_PAGE`].
fn page_size(limit: Option<u64>) -> Result<usize, Answer> {
    match limit {
        None => Ok(100),
        Some(n @ 1..) if n <= MAX_PAGE as u64 => Ok(n as usize),
        Some(_) => Err(Answer::BadRequest(format!(
            "limit must be in 1..={MAX_PAGE}"
        ))),
    }
}

/// The stored key a `?cursor=` (a previous page's `next_cursor`, an aggregate's text form)
/// resumes after; empty means the first page.
fn aggregate_cursor(cursor: Option<&str>) -> Result<Option<String>, Answer> {
    cursor
        .filter(|c| !c.is_empty())
        .map(|text| {
            AggregateKey::parse_text(text)
                .map(|key| key.storage_key())
                .map_err(|_| {
                    Answer::BadRequest("cursor must be a next_cursor of this listing".into())
                })
        })
        .transpose()
}

/// A `?status=` filter over the values `all` (written as `name` gives them): empty means
/// no filter, any other value not among them a 400 listing them.
fn status_filter<T: Copy>(
    raw: Option<&str>,
    all: &[T],
    name: fn(T) -> &'static str,
) -> Result<Option<T>, Answer> {
    match raw {
        None | Some("") => Ok(None),
        Some(raw) => all
            .iter()
            .copied()
            .find(|value| name(*value) == raw)
            .map(Some)
            .ok_or_else(|| {
                let names: Vec<_> = all.iter().copied().map(name).collect();
                Answer::BadRequest(format!("status must be one of {}", names.join(", ")))
            }),
    }
}

/// The source of `kind` named `name`, or the first of that kind.
fn source_of_kind<'a>(
    state: &'a AppState,
    kind: SourceKind,
    name: Option<&str>,
) -> Result<&'a SourceConfig, Answer> {
    let mut sources = state
        .config
        .sources
        .iter()
        .filter(|s| s.kind.source_kind() == kind);
    match name {
        Some(name) => sources
            .find(|s| s.name == name)
            .ok_or(Answer::NotFound("unknown_source")),
        None => sources.next().ok_or(Answer::NotFound("unknown_source")),
    }
}

/// The stored form of an aggregate filter given in text form (docs/contract.md, json sources);
/// empty means no filter, a text that is no key's a 400 naming what is wrong.
pub(super) fn aggregate_filter(text: Option<&str>) -> Result<Option<String>, Answer> {
    text.filter(|t| !t.is_empty())
        .map(|t| {
            AggregateKey::parse_text(t)
                .map(|key| key.storage_key())
                .map_err(|problem| Answer::BadRequest(format!("aggregate {problem}")))
        })
        .transpose()
}
