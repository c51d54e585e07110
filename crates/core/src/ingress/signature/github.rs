//! GitHub: `X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>`,
//! keyed with the webhook's secret as text. `X-GitHub-Delivery` (a GUID,
//! not signed) names the delivery.

use axum::http::HeaderMap;

use super::{
    header_str, hex_32, hmac_parts, match_hmac, optional_header, Secret, SignatureError, Verified,
};

/// The signature header (the SHA-256 one; the legacy SHA-1 `X-Hub-Signature` is not accepted).
pub const SIGNATURE_HEADER: &str = "x-hub-signature-256";
/// The delivery's GUID.
pub const DELIVERY_HEADER: &str = "x-github-delivery";
/// What the signature header holds.
pub const SIGNATURE_FORMAT: &str = "sha256=<64 hex digits>";

/// Parses `X-Hub-Signature-256`.
pub fn parse_signature(raw: &str) -> Option<[u8; 32]> {
    hex_32(raw.strip_prefix("sha256=")?)
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
        delivery_id: optional_header(headers, DELIVERY_HEADER),
        signed_content: None,
    })
}

pub(super) fn sign(body: &[u8], secret: &Secret, id: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            SIGNATURE_HEADER,
            format!(
                "sha256={}",
                hex::encode(hmac_parts(secret.expose(), &[body]))
            ),
        ),
        (DELIVERY_HEADER, id.to_owned()),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers_of, NOW};
    use super::super::{sign, verify, Scheme};
    use super::*;

    const DOCS_SIGNATURE: &str =
        "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";

    #[test]
    fn the_docs_example_verifies_and_signs() {
        // docs.github.com, "Validating webhook deliveries": its test values.
        let secret = Secret::new("It's a Secret to Everybody");
        let headers = headers_of(&[
            (SIGNATURE_HEADER, DOCS_SIGNATURE.into()),
            (
                DELIVERY_HEADER,
                "72d3162e-cc78-11e3-81ab-4c9367dc0958".into(),
            ),
        ]);
        let v = verify(
            Scheme::Github,
            &headers,
            b"Hello, World!",
            std::slice::from_ref(&secret),
            NOW,
            0,
        )
        .unwrap();
        assert_eq!(
            v.delivery_id.as_deref(),
            Some("72d3162e-cc78-11e3-81ab-4c9367dc0958")
        );
        let signed = sign(Scheme::Github, b"Hello, World!", &secret, NOW);
        assert_eq!(signed[0], (SIGNATURE_HEADER, DOCS_SIGNATURE.to_owned()));
    }

    #[test]
    fn the_prefix_and_length_are_checked() {
        let hex = &DOCS_SIGNATURE[7..];
        assert!(parse_signature(DOCS_SIGNATURE).is_some());
        for bad in [hex, "sha1=abc", &format!("sha256={}", &hex[1..]), "sha256="] {
            assert_eq!(parse_signature(bad), None, "{bad}");
        }
        // Without the delivery header, there is simply no delivery id.
        let secret = Secret::new("It's a Secret to Everybody");
        let headers = headers_of(&[(SIGNATURE_HEADER, DOCS_SIGNATURE.into())]);
        let v = verify(
            Scheme::Github,
            &headers,
            b"Hello, World!",
            &[secret],
            NOW,
            0,
        )
        .unwrap();
        assert_eq!(v.delivery_id, None);
    }
}
