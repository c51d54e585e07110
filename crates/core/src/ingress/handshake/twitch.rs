//! Twitch's EventSub callback verification (handshake = "twitch"): the signed body says
//! what a message is; its challenge is echoed as text.

use axum::http::HeaderMap;

use super::{
    echoable, member, object, text, Found, Refusal, TWITCH_NOTIFICATION, TWITCH_REVOCATION,
    TWITCH_TYPE_HEADER, TWITCH_VERIFICATION, TWITCH_VERIFICATION_PENDING,
};

pub(super) fn twitch(headers: &HeaderMap, body: &[u8]) -> Found {
    // The type header is not signed: the signed body says what the message is, and a header
    // that says otherwise is refused (a captured verification resent as a `notification`
    // must not become an event). Without the header, the body alone decides.
    let said = headers.get(TWITCH_TYPE_HEADER).map(|v| v.as_bytes());
    let map = object(body).unwrap_or_default();
    let Some(signed) = twitch_message(&map) else {
        if said == Some(TWITCH_VERIFICATION.as_bytes()) {
            return Err(Refusal::Missing {
                what: "the body's challenge",
            });
        }
        // A body of no known shape: the contract says what is wrong with it.
        return Ok(None);
    };
    if said.is_some_and(|said| said != signed.as_bytes()) {
        return Err(Refusal::TwitchType { body: signed });
    }
    if signed != TWITCH_VERIFICATION {
        // `notification` and `revocation` messages are ordinary events.
        return Ok(None);
    }
    let challenge = echoable(member(&map, "challenge"), "the body's challenge")?;
    Ok(Some(text(challenge)))
}

/// The type of a Twitch EventSub message, read from its signed body: a
/// `webhook_callback_verification` carries `challenge` (and `subscription.status` =
/// `webhook_callback_verification_pending`), a `notification` its `event` (or `events`), a
/// `revocation` a `subscription` with its `status` and no event. `None`: none of these.
pub fn twitch_message(body: &serde_json::Map<String, serde_json::Value>) -> Option<&'static str> {
    let status = body
        .get("subscription")
        .and_then(|s| s.get("status"))
        .and_then(serde_json::Value::as_str);
    if body.contains_key("challenge") || status == Some(TWITCH_VERIFICATION_PENDING) {
        Some(TWITCH_VERIFICATION)
    } else if body.contains_key("event") || body.contains_key("events") {
        Some(TWITCH_NOTIFICATION)
    } else if status.is_some() {
        Some(TWITCH_REVOCATION)
    } else {
        None
    }
}
