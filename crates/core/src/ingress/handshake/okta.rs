//! Okta event hooks' verification (handshake = "okta"): a `GET` carrying the source's
//! token and `X-Okta-Verification-Challenge: C`, answered `{"verification":C}`.

use super::{echoable, json, Found, Parts, OKTA_CHALLENGE_HEADER};

pub(super) fn okta(parts: &Parts<'_>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let challenge = parts
        .headers
        .get(OKTA_CHALLENGE_HEADER)
        .map(|v| v.as_bytes());
    let challenge = echoable(challenge, "the header X-Okta-Verification-Challenge")?;
    Ok(Some(json(
        &serde_json::json!({ "verification": challenge }),
    )))
}
