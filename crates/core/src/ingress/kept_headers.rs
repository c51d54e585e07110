//! Which request headers are kept with an event for triage: an allowlist, never a
//! denylist, because credential headers have no common shape
//! (`x-goog-iap-jwt-assertion`, `x-forwarded-client-cert`, `x-password`, …).
//! The same allowlist filters what is stored and what is shown, so rows written
//! by older releases (which kept everything but signatures) stop showing credentials.

use axum::http::HeaderMap;

/// Headers worth keeping whatever the source: the media type, the client, and each
/// scheme's delivery id, timestamp and event type. Never a signature header.
pub const BUILT_IN: [&str; 19] = [
    "content-type",
    "content-length",
    "user-agent",
    "x-timestamp",
    "webhook-id",
    "webhook-timestamp",
    "x-github-delivery",
    "x-github-event",
    "x-github-hook-id",
    "x-github-hook-installation-target-id",
    "x-github-hook-installation-target-type",
    "x-shopify-topic",
    "x-shopify-event-id",
    "x-shopify-webhook-id",
    "x-shopify-shop-domain",
    "x-shopify-api-version",
    "x-shopify-triggered-at",
    "x-slack-request-timestamp",
    "x-slack-retry-num",
];

/// Most headers kept per event, and longest value kept.
const MOST_KEPT: usize = 32;
const LONGEST_VALUE_CHARS: usize = 256;

/// Whether `name` (any case) is kept: built in, or listed in `extra` (lower case).
pub fn is_kept(name: &str, extra: &[String]) -> bool {
    BUILT_IN.iter().any(|kept| kept.eq_ignore_ascii_case(name))
        || extra.iter().any(|kept| kept.eq_ignore_ascii_case(name))
}

/// Why `name` cannot be added to `keep_headers`, if it cannot: it does not parse as a
/// header name, or it carries a signature or a credential.
pub fn refusal(name: &str) -> Option<&'static str> {
    if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Some("is not a header name");
    }
    if crate::ingress::signature::carries_credential(name) {
        return Some("carries a signature or a credential and is never kept");
    }
    None
}

/// The request headers kept with an event: allowlisted ones only, bounded in number and size.
pub fn keep(headers: &HeaderMap, extra: &[String]) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| is_kept(name.as_str(), extra))
        .filter_map(|(name, value)| {
            let value = value.to_str().ok()?;
            Some((name.as_str().to_owned(), shortened(value).to_owned()))
        })
        .take(MOST_KEPT)
        .collect()
}

/// The stored headers (a JSON object text) as shown: the allowlist applied again,
/// since a row written by an older release may hold any header.
pub fn shown(stored: Option<&str>, extra: &[String]) -> serde_json::Value {
    stored
        .and_then(parse_stored)
        .map(|all| allowed(all, extra))
        .unwrap_or_default()
        .into()
}

/// What the allowlist keeps of headers stored by an older release; `None` when it keeps
/// them all. A text that does not parse (never shown) is dropped for an empty set.
pub fn pruned(stored: &str, extra: &[String]) -> Option<String> {
    let Some(all) = parse_stored(stored) else {
        return Some("{}".to_owned());
    };
    let count = all.len();
    let kept = allowed(all, extra);
    (kept.len() < count).then(|| serde_json::Value::from(kept).to_string())
}

type StoredHeaders = serde_json::Map<String, serde_json::Value>;

fn parse_stored(text: &str) -> Option<StoredHeaders> {
    serde_json::from_str(text).ok()
}

/// The allowlisted headers of `all`, at most [`MOST_KEPT`].
fn allowed(all: StoredHeaders, extra: &[String]) -> StoredHeaders {
    all.into_iter()
        .filter(|(name, _)| is_kept(name, extra))
        .take(MOST_KEPT)
        .collect()
}

/// The `content-type` an event was received with, from its kept headers (a JSON object
/// text), when it is there whole: a value at the kept length may have been cut.
pub fn received_content_type(stored: Option<&str>) -> Option<String> {
    let all = parse_stored(stored?)?;
    let value = all
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .and_then(|(_, value)| value.as_str())?;
    let whole = value.chars().count() < LONGEST_VALUE_CHARS;
    (whole && !value.is_empty() && axum::http::HeaderValue::from_str(value).is_ok())
        .then(|| value.to_owned())
}

fn shortened(value: &str) -> &str {
    let end = value
        .char_indices()
        .nth(LONGEST_VALUE_CHARS)
        .map_or(value.len(), |(i, _)| i);
    &value[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    /// Credential headers with no common shape, each of which a denylist would let through.
    const CREDENTIALS: [&str; 8] = [
        "x-goog-iap-jwt-assertion",
        "cf-access-jwt-assertion",
        "x-forwarded-client-cert",
        "x-password",
        "x-api_key",
        "x-webhook-key",
        "authorization",
        "x-signature",
    ];

    fn request(names: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for name in names {
            headers.insert(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_static("value"),
            );
        }
        headers
    }

    #[test]
    fn only_allowlisted_headers_are_kept() {
        let mut names = CREDENTIALS.to_vec();
        names.extend(["content-type", "user-agent", "webhook-id", "x-tenant"]);
        let kept: Vec<String> = keep(&request(&names), &[])
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        assert_eq!(kept.len(), 3, "{kept:?}");
        for name in ["content-type", "user-agent", "webhook-id"] {
            assert!(kept.iter().any(|k| k == name), "{kept:?}");
        }
        let extra = vec!["x-tenant".to_owned()];
        assert!(keep(&request(&names), &extra)
            .iter()
            .any(|(name, _)| name == "x-tenant"));
    }

    #[test]
    fn no_signature_header_of_any_scheme_is_built_in_or_configurable() {
        for scheme in crate::ingress::signature::Scheme::ALL {
            for (header, _) in scheme.required_headers() {
                let timestamp_or_id = header.contains("timestamp") || *header == "webhook-id";
                assert_eq!(is_kept(header, &[]), timestamp_or_id, "{header}");
                assert_eq!(refusal(header).is_none(), timestamp_or_id, "{header}");
            }
        }
        assert!(refusal("Authorization").is_some());
        // Svix's name of the Standard Webhooks signatures header (Clerk, Resend).
        assert!(refusal("Svix-Signature").is_some());
        assert!(!is_kept("svix-signature", &[]));
        assert!(refusal("bad name").is_some());
        assert!(refusal("x-tenant").is_none());
    }

    #[test]
    fn stored_rows_are_rewritten_only_when_they_lose_a_header() {
        let clean = r#"{"content-type":"application/json","x-tenant":"t"}"#;
        assert_eq!(pruned(clean, &["x-tenant".to_owned()]), None);
        assert_eq!(
            pruned(clean, &[]).as_deref(),
            Some(r#"{"content-type":"application/json"}"#)
        );
        assert_eq!(pruned("not json", &[]).as_deref(), Some("{}"));
    }

    #[test]
    fn stored_rows_of_older_releases_are_filtered_when_shown() {
        let old = r#"{"content-type":"application/json","x-goog-iap-jwt-assertion":"eyJ","x-api_key":"k"}"#;
        assert_eq!(
            shown(Some(old), &[]),
            serde_json::json!({"content-type": "application/json"})
        );
        assert_eq!(shown(None, &[]), serde_json::json!({}));
        assert_eq!(shown(Some("not json"), &[]), serde_json::json!({}));
    }

    #[test]
    fn values_are_cut_at_a_character_boundary() {
        let long = "é".repeat(300);
        assert_eq!(shortened(&long).chars().count(), LONGEST_VALUE_CHARS);
    }
}
