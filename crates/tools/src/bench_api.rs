//! What the load generator's reports read through the server's API: the admin-token
//! client, the paged listings, and the figures made of them.

/// The server's read API, with the admin token when there is one.
#[derive(Clone)]
pub(crate) struct Api {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Api {
    /// The API at `url`, called with `client` and `token` (when there is one).
    pub(crate) fn new(client: reqwest::Client, url: &str, token: Option<String>) -> Self {
        Self {
            client,
            base: url.trim_end_matches('/').to_owned(),
            token,
        }
    }

    /// GETs `path` (with its query) and parses the JSON answer; a refusal is an error.
    pub(crate) async fn get(&self, path: &str) -> anyhow::Result<serde_json::Value> {
        let mut request = self.client.get(format!("{}{path}", self.base));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await?;
        let code = response.status();
        anyhow::ensure!(
            code.is_success(),
            "{path} answered {code}: pass --admin-token or set INHOOK_ADMIN_TOKEN"
        );
        Ok(response.json().await?)
    }
}

/// An API time (RFC 3339) as unix milliseconds.
pub(crate) fn ms_of(value: &serde_json::Value) -> Option<i64> {
    use time::format_description::well_known::Rfc3339;
    value
        .as_str()
        .and_then(|s| time::OffsetDateTime::parse(s, &Rfc3339).ok())
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
}

/// The value at fraction `p` of `sorted` (nearest rank); the default when it is empty.
pub(crate) fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    if sorted.is_empty() {
        return T::default();
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Calls `each` on every item of the paged listing at `path` (its query already started),
/// following `next_cursor` to the end.
pub(crate) async fn walk_pages(
    api: &Api,
    path: &str,
    mut each: impl FnMut(&serde_json::Value),
) -> anyhow::Result<()> {
    let mut cursor: Option<i64> = None;
    loop {
        let mut page_path = path.to_owned();
        if let Some(c) = cursor {
            page_path.push_str(&format!("&cursor={c}"));
        }
        let page = api.get(&page_path).await?;
        for item in page["items"].as_array().into_iter().flatten() {
            each(item);
        }
        match page["next_cursor"].as_i64() {
            Some(next) => cursor = Some(next),
            None => return Ok(()),
        }
    }
}
