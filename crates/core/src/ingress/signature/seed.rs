//! The two seed schemes: `hmac-hex` (first seed) and `hmac-timestamped` (second seed),
//! stated as `hmac` settings ([`plain_keys`], [`timestamped_keys`]): verified and signed
//! by the one configurable HMAC ([`super::configurable`]).

use super::configurable::HmacKeys;
use super::Scheme;

/// Header carrying the signature in both seed schemes.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// Header carrying the signing time in the timestamped scheme.
pub const TIMESTAMP_HEADER: &str = "x-timestamp";
/// What the signature header holds.
pub const HEX_FORMAT: &str = "64 hex digits (HMAC-SHA256)";

/// `signature = "hmac-hex"` as the `hmac` settings it stands for.
pub fn plain_keys() -> HmacKeys<'static> {
    HmacKeys {
        header: Some(SIGNATURE_HEADER),
        ..Default::default()
    }
}

/// `signature = "hmac-timestamped"` as the `hmac` settings it stands for.
pub fn timestamped_keys() -> HmacKeys<'static> {
    HmacKeys {
        header: Some(SIGNATURE_HEADER),
        signed_content: Some("{timestamp}.{body}"),
        timestamp: Some("header:x-timestamp"),
        ..Default::default()
    }
}

/// Parses `X-Signature`: exactly 64 hex digits.
pub fn parse_signature(raw: &str) -> Option<[u8; 32]> {
    super::alias_signature(Scheme::HmacHex, raw)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers_of, NOW};
    use super::super::{sign, verify, Scheme, Secret, SignatureError};
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
