//! X's CRC (handshake = "x-crc"): `GET ?crc_token=T` answered with an HMAC of T under
//! the source's first secret, allowed only with X's own signature scheme.

use base64::Engine as _;

use crate::ingress::signature::configurable::{Algorithm, Encoding, Format, HmacConfig};
use crate::ingress::signature::template::Part;
use crate::ingress::signature::Secret;

use super::{hmac_sha256, json, opaque_token, query, Found, Parts, Refusal};

/// X's `x-twitter-webhooks-signature: sha256=<base64 HMAC-SHA256 of the body>`: the only
/// content it signs is the body, which a CRC token cannot be.
pub(super) fn is_x_scheme(c: &HmacConfig) -> bool {
    c.public_key.is_none()
        && c.location.is_none()
        && c.header == "x-twitter-webhooks-signature"
        && c.prefix == "sha256="
        && c.encoding == Encoding::Base64
        && c.algorithm == Algorithm::Sha256
        && c.format == Format::Plain
        && c.timestamp.is_none()
        && c.content.parts() == [Part::Body]
}

pub(super) fn x_crc(parts: &Parts<'_>, secret: Option<&Secret>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let token = query(parts.path_and_query, "crc_token");
    let token = opaque_token(token.as_deref(), "the query parameter crc_token")?;
    let secret = secret.ok_or(Refusal::NoSecret)?;
    let mac =
        base64::engine::general_purpose::STANDARD.encode(hmac_sha256(secret, token.as_bytes()));
    Ok(Some(json(&serde_json::json!({
        "response_token": format!("sha256={mac}"),
    }))))
}
