//! The two seed schemes: `hmac-hex` (first seed) and `hmac-timestamped` (second seed).

use axum::http::HeaderMap;

use super::{
    header_str, hex_32, hmac_parts, match_hmac, timestamp_header, Secret, SignatureError, Verified,
};

/// Header carrying the signature in both seed schemes.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// Header carrying the signing time in the timestamped scheme.
pub const TIMESTAMP_HEADER: &str = "x-timestamp";
/// What the signature header holds.
pub const HEX_FORMAT: &str = "64 hex digits (HMAC-SHA256)";

/// Parses `X-Signature`: exactly 64 hex digits.
pub fn parse_signature(raw: &str) -> Option<[u8; 32]> {
    hex_32(raw)
}

fn signature(headers: &HeaderMap) -> Result<[u8; 32], SignatureError> {
    parse_signature(header_str(headers, SIGNATURE_HEADER)?).ok_or(SignatureError::Malformed {
        header: SIGNATURE_HEADER,
        expected: HEX_FORMAT,
    })
}

pub(super) fn verify_plain(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let signature = signature(headers)?;
    let secret_index = match_hmac(SIGNATURE_HEADER, secrets, &[body], &[signature])?;
    Ok(Verified {
        secret_index,
        signed_at: None,
        delivery_id: None,
        signed_content: None,
    })
}

pub(super) fn verify_timestamped(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let signature = signature(headers)?;
    let (ts, raw) = timestamp_header(headers, TIMESTAMP_HEADER)?;
    let parts: [&[u8]; 3] = [raw.as_bytes(), b".", body];
    let secret_index = match_hmac(SIGNATURE_HEADER, secrets, &parts, &[signature])?;
    Ok(Verified {
        secret_index,
        signed_at: Some(ts),
        delivery_id: None,
        signed_content: None,
    })
}

pub(super) fn sign_plain(body: &[u8], secret: &Secret) -> Vec<(&'static str, String)> {
    vec![(
        SIGNATURE_HEADER,
        hex::encode(hmac_parts(secret.expose(), &[body])),
    )]
}

pub(super) fn sign_timestamped(
    body: &[u8],
    secret: &Secret,
    now: i64,
) -> Vec<(&'static str, String)> {
    let ts = now.to_string();
    let mac = hmac_parts(secret.expose(), &[ts.as_bytes(), b".", body]);
    vec![(TIMESTAMP_HEADER, ts), (SIGNATURE_HEADER, hex::encode(mac))]
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers_of, NOW};
    use super::super::{sign, verify, Scheme};
    use super::*;

    #[test]
    fn seed_signatures_match_an_independent_hmac() {
        // Computed with: printf '%s' '{"a":1}' | openssl dgst -sha256 -hmac test-secret-key-12345
        let plain = headers_of(&[(
            SIGNATURE_HEADER,
            "0484274bec357bdf226dd30e7652ee73b6b1166a137099797a2bc93713a8fb22".into(),
        )]);
        // Computed with: printf '%s' '1800000000.{"a":1}' | openssl dgst -sha256 -hmac …
        let timestamped = headers_of(&[
            (TIMESTAMP_HEADER, NOW.to_string()),
            (
                SIGNATURE_HEADER,
                "204db2a8ca4ab672616f6ff9e4ce07bed42fbbf370a419152720be4363586f12".into(),
            ),
        ]);
        let secret = [Secret::new("test-secret-key-12345")];
        let body = br#"{"a":1}"#;
        assert!(verify(Scheme::HmacHex, &plain, body, &secret, NOW, 0).is_ok());
        assert!(verify(Scheme::HmacTimestamped, &timestamped, body, &secret, NOW, 0).is_ok());
        assert_eq!(
            headers_of(&sign(Scheme::HmacHex, body, &secret[0], NOW)),
            plain
        );
        assert_eq!(
            headers_of(&sign(Scheme::HmacTimestamped, body, &secret[0], NOW)),
            timestamped
        );
    }

    #[test]
    fn malformed_headers_are_named() {
        let secrets = [Secret::new("x")];
        let bad_hex = headers_of(&[(SIGNATURE_HEADER, "zz".repeat(32))]);
        assert_eq!(
            verify(Scheme::HmacHex, &bad_hex, b"{}", &secrets, NOW, 300),
            Err(SignatureError::Malformed {
                header: SIGNATURE_HEADER,
                expected: HEX_FORMAT
            })
        );
        let mut signed = sign(Scheme::HmacTimestamped, b"{}", &secrets[0], NOW);
        signed[0].1 = format!("+{NOW}");
        let err = verify(
            Scheme::HmacTimestamped,
            &headers_of(&signed),
            b"{}",
            &secrets,
            NOW,
            300,
        )
        .unwrap_err();
        assert!(
            matches!(err, SignatureError::Malformed { header, .. } if header == TIMESTAMP_HEADER)
        );
    }
}
