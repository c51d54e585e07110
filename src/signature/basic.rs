//! `signature = "basic"` (docs/configuration.md): HTTP Basic authentication.
//! The source's secrets are the accepted `"user:password"` pairs; the
//! decoded credentials are compared with each in constant time.

use base64::Engine;

use super::token::matching_secret;
use super::{header_str, Request, Secret, SignatureError, Verified, BASE64};

/// The header holding the credentials.
pub const HEADER: &str = "authorization";
/// What it holds.
pub const FORMAT: &str = "Basic <base64 of user:password>";

/// Longest credentials decoded: longer ones are refused before decoding.
const MAX_CHARS: usize = 4096;

/// The `user:password` bytes of an `Authorization: Basic …` value.
pub fn parse_header(raw: &str) -> Option<Vec<u8>> {
    let (scheme, rest) = raw.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") || rest.len() > MAX_CHARS {
        return None;
    }
    let decoded = BASE64.decode(rest.trim()).ok()?;
    decoded.contains(&b':').then_some(decoded)
}

/// Checks the delivery's credentials against every secret.
pub fn verify(request: &Request<'_>, secrets: &[Secret]) -> Result<Verified, SignatureError> {
    let raw = header_str(request.headers, HEADER)?;
    let given = parse_header(raw).ok_or(SignatureError::Malformed {
        header: HEADER,
        expected: FORMAT,
    })?;
    let secret_index = matching_secret(&given, secrets).ok_or(SignatureError::Refused {
        what: "the credentials in authorization",
        configured: secrets.len(),
    })?;
    Ok(Verified {
        secret_index,
        signed_at: None,
        delivery_id: None,
    })
}

/// What a publisher sends.
pub fn sign(secret: &Secret) -> Vec<(&'static str, String)> {
    vec![(
        HEADER,
        format!("Basic {}", super::base64_encode(secret.expose())),
    )]
}

/// A secret must be `user:password`.
pub fn check_secret(secret: &Secret) -> Result<(), &'static str> {
    if secret.expose().contains(&b':') {
        Ok(())
    } else {
        Err("is not user:password")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn check(value: &str) -> Result<Verified, SignatureError> {
        let mut headers = HeaderMap::new();
        headers.insert(HEADER, HeaderValue::from_str(value).unwrap());
        let request = Request {
            headers: &headers,
            body: b"{}",
            method: "POST",
            path_and_query: "/",
        };
        verify(
            &request,
            &[Secret::new("hook:old-pass"), Secret::new("hook:new-pass")],
        )
    }

    #[test]
    fn rfc_7617_credentials_verify() {
        // RFC 7617's example: "Aladdin:open sesame".
        assert_eq!(
            parse_header("Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
            Some(b"Aladdin:open sesame".to_vec())
        );
        let signed = sign(&Secret::new("hook:new-pass"));
        assert_eq!(check(&signed[0].1).unwrap().secret_index, 1);
        assert!(check("basic aG9vazpvbGQtcGFzcw").is_ok());
        let err = check(&sign(&Secret::new("hook:other"))[0].1).unwrap_err();
        assert_eq!(err.code(), "invalid_signature");
        assert!(!err.to_string().contains("pass"), "{err}");
        for bad in ["Bearer abc", "Basic !!!", "Basic dXNlcg=="] {
            assert!(
                matches!(check(bad), Err(SignatureError::Malformed { .. })),
                "{bad}"
            );
        }
        assert!(check_secret(&Secret::new("nocolon")).is_err());
    }
}
