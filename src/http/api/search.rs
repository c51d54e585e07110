//! The `where` conditions of `GET /v1/events`: a query string may repeat the key, which
//! the typed query does not take (docs/api.md, search).

use crate::http::answer::Answer;
use crate::search::Where;

/// The `where` values of a raw query string, each parsed (a query string may repeat it).
pub(crate) fn wheres_of_query(raw: Option<&str>) -> Result<Vec<Where>, Answer> {
    let Some(raw) = raw else {
        return Ok(Vec::new());
    };
    form_urlencoded::parse(raw.as_bytes())
        .filter(|(key, _)| key == "where")
        .map(|(_, value)| Where::parse(&value).map_err(Answer::BadRequest))
        .collect()
}
