//! `GET /`: the dashboard, one static page (`dashboard.html`, inline CSS and
//! vanilla JS) embedded in the binary. The page holds no data: it reads the
//! admin API of docs/api.md (read API) with the token the user enters, so the route itself
//! needs none.
//!
//! The page is served with a strict Content-Security-Policy: its one inline
//! script and one inline style are allowed by hash, it may only talk to its own
//! origin, and nothing else loads. Publisher-controlled strings only ever reach
//! the page as text (never markup), and the policy backs that up.

use std::sync::LazyLock;

use axum::http::header::{self, HeaderName, HeaderValue};
use axum::response::Html;
use base64::Engine as _;
use sha2::{Digest, Sha256};

/// The page.
const PAGE: &str = include_str!("dashboard.html");

/// The Content-Security-Policy of the page, with the hashes of its inline script and style.
static POLICY: LazyLock<HeaderValue> = LazyLock::new(|| {
    let policy = format!(
        "default-src 'none'; script-src '{}'; style-src '{}'; connect-src 'self'; \
         img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
        source_hash(inline(PAGE, "script")),
        source_hash(inline(PAGE, "style")),
    );
    HeaderValue::from_str(&policy).expect("the policy is ASCII")
});

/// The dashboard: a page that reads the `/v1/*` API with the admin token typed into it.
#[utoipa::path(get, path = "/", tag = "observability", security(()),
    responses((status = 200, description = "The dashboard page", body = String, content_type = "text/html")))]
pub(super) async fn index() -> ([(HeaderName, HeaderValue); 5], Html<&'static str>) {
    (
        [
            (header::CONTENT_SECURITY_POLICY, POLICY.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
            (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
            (
                header::REFERRER_POLICY,
                HeaderValue::from_static("no-referrer"),
            ),
            (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
        ],
        Html(PAGE),
    )
}

/// The text of the page's one `<tag>…</tag>` element (panics if it has none or several).
fn inline<'a>(page: &'a str, tag: &str) -> &'a str {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    let start = page.find(&open).expect("an inline element") + open.len();
    let end = start + page[start..].find(&close).expect("a closed element");
    assert!(
        !page[end..].contains(&open),
        "the page must have one inline <{tag}>"
    );
    &page[start..end]
}

/// A CSP hash source (`sha256-<base64>`) for an inline element's text.
fn source_hash(text: &str) -> String {
    let digest = Sha256::digest(text.as_bytes());
    format!(
        "sha256-{}",
        base64::engine::general_purpose::STANDARD.encode(digest)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_allows_exactly_the_inline_script_and_style() {
        let policy = POLICY.to_str().unwrap();
        assert!(policy.contains(&source_hash(inline(PAGE, "script"))));
        assert!(policy.contains(&source_hash(inline(PAGE, "style"))));
        assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"));
        assert_eq!(PAGE.matches("<script").count(), 1, "one inline script");
        assert_eq!(PAGE.matches("<style").count(), 1, "one inline style");
    }

    #[test]
    fn the_page_loads_nothing_and_never_inserts_markup() {
        for banned in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "http://",
            "https://",
            " style=\"",
            "EventSource(",
        ] {
            assert!(!PAGE.contains(banned), "the page must not use {banned:?}");
        }
    }

    #[test]
    fn every_data_call_sends_the_token() {
        let script = inline(PAGE, "script");
        // Every fetch goes through authHeaders(), which adds `Authorization: Bearer <token>`.
        assert_eq!(script.matches("fetch(").count(), 2, "api() and the stream");
        assert_eq!(
            script.matches("authHeaders(").count(),
            4,
            "definition, api(), login check and the stream"
        );
        assert!(script.contains("'Bearer ' + S.token"));
    }
}
