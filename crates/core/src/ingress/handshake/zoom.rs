//! Zoom's `endpoint.url_validation` (handshake = "zoom"): a signed body carrying a
//! `plainToken`, answered with it and its HMAC under the secret that verified the request.

use crate::ingress::signature::configurable::{
    Algorithm, Encoding, Format, HmacConfig, TimestampAt,
};
use crate::ingress::signature::template::Part;
use crate::ingress::signature::Secret;

use super::{contains, hmac_sha256, json, object, opaque_token, Found, Refusal};

/// Zoom's `x-zm-signature: v0=<hex HMAC-SHA256 of "v0:{ts}:{body}">`: what it signs starts
/// with `v0:`, which a plainToken cannot.
pub(super) fn is_zoom_scheme(c: &HmacConfig) -> bool {
    let timestamp_header = c.timestamp.as_ref().is_some_and(
        |t| matches!(&t.at, TimestampAt::Header(h) if h.as_str() == "x-zm-request-timestamp"),
    );
    c.public_key.is_none()
        && c.location.is_none()
        && c.header == "x-zm-signature"
        && c.prefix == "v0="
        && c.encoding == Encoding::Hex
        && c.algorithm == Algorithm::Sha256
        && c.format == Format::Plain
        && timestamp_header
        && c.content.parts()
            == [
                Part::Literal("v0:".into()),
                Part::Timestamp,
                Part::Literal(":".into()),
                Part::Body,
            ]
}

pub(super) fn zoom(body: &[u8], secret: Option<&Secret>) -> Found {
    if !contains(body, b"endpoint.url_validation") {
        return Ok(None);
    }
    let Some(map) = object(body) else {
        return Ok(None);
    };
    if map.get("event").and_then(|t| t.as_str()) != Some("endpoint.url_validation") {
        return Ok(None);
    }
    let token = map
        .get("payload")
        .and_then(|p| p.get("plainToken"))
        .and_then(|t| t.as_str())
        .map(str::as_bytes);
    let plain = opaque_token(token, "the body's payload.plainToken")?;
    let secret = secret.ok_or(Refusal::NoSecret)?;
    let encrypted = hex::encode(hmac_sha256(secret, plain.as_bytes()));
    Ok(Some(json(&serde_json::json!({
        "plainToken": plain,
        "encryptedToken": encrypted,
    }))))
}
