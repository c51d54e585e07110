//! Slack's `url_verification` (handshake = "slack"): a signed body
//! `{"type":"url_verification","challenge":C}` answered `{"challenge":C}`.

use super::{contains, echoable, json, member, object, Found};

pub(super) fn slack(body: &[u8]) -> Found {
    // Cheap first: every event of the source passes here.
    if !contains(body, b"url_verification") {
        return Ok(None);
    }
    let Some(map) = object(body) else {
        return Ok(None);
    };
    if map.get("type").and_then(|t| t.as_str()) != Some("url_verification") {
        return Ok(None);
    }
    let challenge = echoable(member(&map, "challenge"), "the body's challenge")?;
    Ok(Some(json(&serde_json::json!({ "challenge": challenge }))))
}
