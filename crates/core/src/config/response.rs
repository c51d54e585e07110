//! A source's own answer to its accepted deliveries (docs/configuration.md, `response`):
//! `response = { status = 200, content_type = "text/plain", body = "" }` replaces the JSON
//! answer of a delivery that is logged, applied or a duplicate, for publishers that show
//! the answer to a person (Slack commands), or read it (Discord's `{"type":5}`, Twilio's
//! TwiML). Errors keep their JSON answers. Checked once, at load.

use axum::http::{HeaderValue, StatusCode};
use serde::Deserialize;

/// The largest `response.body`: an answer, not a document.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// The `response` table as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileResponse {
    status: Option<u16>,
    content_type: Option<String>,
    body: Option<String>,
}

/// A source's answer to an accepted delivery, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceResponse {
    /// A 2xx status: the publisher must see success.
    pub status: StatusCode,
    /// The `content-type` sent.
    pub content_type: HeaderValue,
    /// The body sent, as written.
    pub body: String,
}

impl SourceResponse {
    /// Checks a `response` table: a 2xx status (default 200), a valid header value as the
    /// content type (default `text/plain; charset=utf-8`), a body of at most [`MAX_BODY_BYTES`].
    pub(super) fn parse(file: FileResponse) -> Result<Self, String> {
        let status = file.status.unwrap_or(200);
        let status = StatusCode::from_u16(status)
            .ok()
            .filter(StatusCode::is_success)
            .ok_or_else(|| {
                format!("response.status must be a 2xx status (the publisher must see success), got {status}")
            })?;
        let content_type = file
            .content_type
            .unwrap_or_else(|| "text/plain; charset=utf-8".into());
        let content_type = HeaderValue::from_str(&content_type)
            .ok()
            .filter(|v| !v.is_empty() && v.to_str().is_ok())
            .ok_or_else(|| {
                "response.content_type must be a non-empty header value of visible ASCII".to_owned()
            })?;
        let body = file.body.unwrap_or_default();
        if body.len() > MAX_BODY_BYTES {
            return Err(format!(
                "response.body holds {} bytes, more than the {MAX_BODY_BYTES} an answer may",
                body.len()
            ));
        }
        if status == StatusCode::NO_CONTENT && !body.is_empty() {
            return Err("response.body must be empty with status = 204".into());
        }
        Ok(Self {
            status,
            content_type,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<SourceResponse, String> {
        SourceResponse::parse(toml::from_str(text).unwrap())
    }

    #[test]
    fn defaults_and_checks() {
        let plain = parse("").unwrap();
        assert_eq!(plain.status, StatusCode::OK);
        assert_eq!(plain.content_type, "text/plain; charset=utf-8");
        assert_eq!(plain.body, "");
        let twiml = parse(
            "status = 200\ncontent_type = \"application/xml\"\nbody = \"<Response></Response>\"",
        )
        .unwrap();
        assert_eq!(twiml.content_type, "application/xml");
        assert_eq!(twiml.body, "<Response></Response>");
        for (text, named) in [
            ("status = 302", "2xx"),
            ("status = 500", "2xx"),
            ("status = 99", "2xx"),
            ("content_type = \"text/plain\\n\"", "content_type"),
            ("content_type = \"\"", "content_type"),
            ("status = 204\nbody = \"x\"", "204"),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(named), "{text}: {err}");
        }
        let long = format!("body = \"{}\"", "x".repeat(MAX_BODY_BYTES + 1));
        assert!(parse(&long).unwrap_err().contains("response.body"));
        assert!(toml::from_str::<FileResponse>("code = 200").is_err());
    }
}
