//! Shopify: `X-Shopify-Hmac-SHA256: <base64 HMAC-SHA256 of the raw body>`,
//! keyed with the app's client secret as text. `X-Shopify-Event-Id` (not
//! signed) is the id Shopify's docs name for spotting duplicate deliveries.

use axum::http::HeaderMap;

use super::{
    base64_encode, base64_exact, header_str, hmac_parts, match_hmac, optional_header, Secret,
    SignatureError, Verified,
};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-shopify-hmac-sha256";
/// The event's id, the same on every delivery of one event.
pub const EVENT_ID_HEADER: &str = "x-shopify-event-id";
/// What the signature header holds.
pub const SIGNATURE_FORMAT: &str = "the base64 of a 32-byte HMAC-SHA256";

/// Parses `X-Shopify-Hmac-SHA256`.
pub fn parse_signature(raw: &str) -> Option<[u8; 32]> {
    base64_exact::<32>(raw)
}

pub(super) fn verify(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let raw = header_str(headers, SIGNATURE_HEADER)?;
    let signature = parse_signature(raw).ok_or(SignatureError::Malformed {
        header: SIGNATURE_HEADER,
        expected: SIGNATURE_FORMAT,
    })?;
    let secret_index = match_hmac(SIGNATURE_HEADER, secrets, &[body], &[signature])?;
    Ok(Verified {
        secret_index,
        signed_at: None,
        delivery_id: optional_header(headers, EVENT_ID_HEADER),
        signed_content: None,
    })
}

pub(super) fn sign(body: &[u8], secret: &Secret, id: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            SIGNATURE_HEADER,
            base64_encode(&hmac_parts(secret.expose(), &[body])),
        ),
        (EVENT_ID_HEADER, id.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers_of, NOW};
    use super::super::{sign, verify, Scheme};
    use super::*;

    #[test]
    fn an_independent_hmac_verifies_and_signs() {
        // Shopify publishes no vector. Computed with Python's standard library:
        // base64.b64encode(hmac.new(b"shop-secret", b'{"id":1}', hashlib.sha256).digest())
        let expected = "plW8VGqq0nDMIEhDqaNNW99asdUCy7EIqLZVcQwtAZ0=";
        let secret = Secret::new("shop-secret");
        let headers = headers_of(&[(SIGNATURE_HEADER, expected.into())]);
        let body = br#"{"id":1}"#;
        assert!(verify(
            Scheme::Shopify,
            &headers,
            body,
            std::slice::from_ref(&secret),
            NOW,
            0
        )
        .is_ok());
        assert_eq!(
            sign(Scheme::Shopify, body, &secret, NOW)[0],
            (SIGNATURE_HEADER, expected.to_owned())
        );
        // Hex, or base64 of the wrong length, is not Shopify's format.
        assert_eq!(parse_signature(&"ab".repeat(32)), None);
        assert_eq!(parse_signature("AAAA"), None);
    }
}
