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
        signed_content: None,
    })
}

/// What a publisher sends.
pub fn sign(secret: &Secret) -> Vec<(&'static str, String)> {
    vec![(
        HEADER,
        format!("Basic {}", super::base64_encode(secret.expose())),
    )]
}

/// A secret must be `user:password` (split at the first `:`, as the header is), with a
/// user and a password of at least [`super::MIN_SHARED_SECRET_BYTES`].
pub fn check_secret(secret: &Secret) -> Result<(), &'static str> {
    let bytes = secret.expose();
    let Some(colon) = bytes.iter().position(|&b| b == b':') else {
        return Err("is not user:password");
    };
    let (user, password) = (&bytes[..colon], &bytes[colon + 1..]);
    if user.iter().all(u8::is_ascii_whitespace) {
        return Err("has an empty user: write user:password");
    }
    if password.len() < super::MIN_SHARED_SECRET_BYTES {
        return Err(PASSWORD_TOO_SHORT);
    }
    Ok(())
}

/// Why a short password is refused; its length is [`super::MIN_SHARED_SECRET_BYTES`].
const PASSWORD_TOO_SHORT: &str = "has a password shorter than 16 bytes: anyone who can reach \
     the source could guess it. Use a random one, e.g. `openssl rand -hex 24`";
const _: () = assert!(super::MIN_SHARED_SECRET_BYTES == 16);

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

    #[test]
    fn a_secret_needs_a_user_and_a_password_of_sixteen_bytes() {
        assert_eq!(check_secret(&Secret::new("u:sixteen-bytes-ok")), Ok(()));
        // A password may hold a colon: the user ends at the first one.
        assert_eq!(check_secret(&Secret::new("u:a:colon-in-it-is-ok")), Ok(()));
        for (secret, why) in [
            (":", "empty user"),
            (":a-long-enough-password", "empty user"),
            (" :a-long-enough-password", "empty user"),
            ("hook:", "shorter than 16 bytes"),
            ("hook:pw", "shorter than 16 bytes"),
            ("hook:fifteen-bytes!!", "shorter than 16 bytes"),
            ("nocolon-but-long-enough", "user:password"),
        ] {
            let err = check_secret(&Secret::new(secret)).unwrap_err();
            assert!(err.contains(why), "{secret:?}: {err}");
            if secret.len() > 2 {
                assert!(!err.contains(secret), "{err}");
            }
        }
        // `Basic Og==` is ":": no secret above could accept it.
        assert_eq!(parse_header("Basic Og=="), Some(b":".to_vec()));
    }
}
