//! `signature = "twilio"` (docs/configuration.md): Twilio's `X-Twilio-Signature`,
//! base64 of HMAC-SHA1 under the account's auth token over the URL Twilio called
//! (`public_url` + path + query) followed by the form parameters sorted by name,
//! each name then its value. A JSON body is covered instead by the `bodySHA256`
//! query parameter (hex SHA-256 of the raw body), checked here, and the signature
//! then covers the URL alone. This is what Twilio's own `RequestValidator` computes.
//!
//! Pure: headers, body, path and secrets in, a verdict out.

use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::configurable::Algorithm;
use super::{header_str, Request, Secret, SignatureError, Verified, BASE64};

/// The header Twilio signs in.
pub const SIGNATURE_HEADER: &str = "x-twilio-signature";

/// What the header holds, for explanations.
pub const SIGNATURE_FORMAT: &str =
    "<base64 of the HMAC-SHA1 of the URL and the sorted form parameters>";

/// The query parameter that carries the SHA-256 of a JSON body.
pub const BODY_HASH_PARAMETER: &str = "bodySHA256";

/// More form parameters than any Twilio request carries: refused rather than sorted.
pub const MAX_PARAMETERS: usize = 1024;

/// A parsed `signature = "twilio"` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TwilioConfig {
    /// The base URL Twilio calls, without its trailing `/`.
    pub public_url: String,
}

impl TwilioConfig {
    /// The full URL Twilio signed for a request to `path_and_query`.
    pub fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.public_url)
    }

    /// Verifies one delivery against every auth token (several while rotating).
    pub fn verify(
        &self,
        request: &Request<'_>,
        secrets: &[Secret],
    ) -> Result<Verified, SignatureError> {
        let raw = header_str(request.headers, SIGNATURE_HEADER)?;
        let candidate =
            BASE64
                .decode(raw)
                .ok()
                .filter(|s| s.len() == 20)
                .ok_or(SignatureError::Malformed {
                    header: SIGNATURE_HEADER,
                    expected: SIGNATURE_FORMAT,
                })?;
        let message = signed_content(&self.url(request.path_and_query), request)?;
        let secret_index = secrets
            .iter()
            .position(|secret| {
                let expected = Algorithm::Sha1.mac(secret.expose(), &message);
                expected.ct_eq(&candidate).into()
            })
            .ok_or(SignatureError::Mismatch {
                header: SIGNATURE_HEADER,
                signatures: 1,
                tried: secrets.len(),
                configured: secrets.len(),
            })?;
        // Reordered fields, a trailing `&` or `%41` for `A` verify alike: what is signed,
        // not the raw body, is the delivery's identity (docs/contract.md, duplicates).
        Ok(Verified {
            secret_index,
            signed_at: None,
            delivery_id: None,
            signed_content: Some(Sha256::digest(&message).into()),
        })
    }

    /// Signs a delivery as Twilio would: the `X-Twilio-Signature` header, and for a
    /// body that is not a form the `bodySHA256` parameter to add to the URL.
    pub fn sign(&self, request: &Request<'_>, secret: &Secret) -> super::Signed {
        // Twilio posts forms, and covers a JSON body by its hash in the URL.
        let is_form = serde_json::from_slice::<serde::de::IgnoredAny>(request.body).is_err();
        let (path, query) = if is_form {
            (request.path_and_query.to_owned(), None)
        } else {
            let hash = hex::encode(Sha256::digest(request.body));
            let sep = if request.path_and_query.contains('?') {
                '&'
            } else {
                '?'
            };
            (
                format!(
                    "{}{sep}{BODY_HASH_PARAMETER}={hash}",
                    request.path_and_query
                ),
                Some((BODY_HASH_PARAMETER.to_owned(), hash)),
            )
        };
        let signed = Request {
            path_and_query: &path,
            ..*request
        };
        let message = signed_content(&self.url(&path), &signed).unwrap_or_default();
        let signature = super::base64_encode(&Algorithm::Sha1.mac(secret.expose(), &message));
        super::Signed {
            headers: vec![(SIGNATURE_HEADER, signature)],
            query,
        }
    }
}

/// The bytes Twilio signs: the URL, then (without `bodySHA256` in the query) every form
/// parameter sorted by name, each name then value (a repeated name's values sorted and
/// without repeats, as Twilio's validator does). With `bodySHA256`, the body's hash is
/// checked and the URL alone is signed.
pub fn signed_content(url: &str, request: &Request<'_>) -> Result<Vec<u8>, SignatureError> {
    let query = request
        .path_and_query
        .split_once('?')
        .map_or("", |(_, q)| q);
    let body_hash = form_pairs(query.as_bytes())
        .find(|(name, _)| name == BODY_HASH_PARAMETER)
        .map(|(_, value)| value);
    if let Some(sent) = body_hash {
        let actual = hex::encode(Sha256::digest(request.body));
        // Not a secret, but compared in constant time all the same.
        if !bool::from(
            sent.to_ascii_lowercase()
                .as_bytes()
                .ct_eq(actual.as_bytes()),
        ) {
            return Err(SignatureError::Mismatch {
                header: SIGNATURE_HEADER,
                signatures: 1,
                tried: 0,
                configured: 0,
            });
        }
        return Ok(url.as_bytes().to_vec());
    }
    let mut out = url.as_bytes().to_vec();
    let params = parse_form(request.body).ok_or(SignatureError::Absent {
        what: "a form body (application/x-www-form-urlencoded) or the bodySHA256 query parameter",
    })?;
    for (name, value) in params {
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    Ok(out)
}

/// The parameters of a form body, sorted by name then value, repeats removed; `None` when
/// the body is not UTF-8 form text or holds more than [`MAX_PARAMETERS`].
pub fn parse_form(body: &[u8]) -> Option<Vec<(String, String)>> {
    if std::str::from_utf8(body).is_err() {
        return None;
    }
    let mut params: Vec<(String, String)> = Vec::new();
    for pair in form_pairs(body) {
        if params.len() >= MAX_PARAMETERS {
            return None;
        }
        params.push(pair);
    }
    params.sort();
    params.dedup();
    Some(params)
}

/// The `name=value` pairs of form text, `+` as a space and `%XX` decoded (bytes that are
/// not UTF-8 once decoded become U+FFFD, as in every form reader); empty pieces skipped.
fn form_pairs(raw: &[u8]) -> impl Iterator<Item = (String, String)> + '_ {
    fn decode(raw: &[u8]) -> String {
        let spaced: Vec<u8> = raw
            .iter()
            .map(|&b| if b == b'+' { b' ' } else { b })
            .collect();
        let bytes: Vec<u8> = percent_encoding::percent_decode(&spaced).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
    raw.split(|&b| b == b'&')
        .filter(|piece| !piece.is_empty())
        .map(|piece| match piece.iter().position(|&b| b == b'=') {
            Some(at) => (decode(&piece[..at]), decode(&piece[at + 1..])),
            None => (decode(piece), String::new()),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::signature::tests::headers_of;
    use axum::http::HeaderMap;

    fn config() -> TwilioConfig {
        TwilioConfig {
            public_url: "https://mycompany.com".into(),
        }
    }

    fn request<'a>(headers: &'a HeaderMap, body: &'a [u8], path: &'a str) -> Request<'a> {
        Request {
            headers,
            body,
            method: "POST",
            path_and_query: path,
        }
    }

    /// Twilio's published example (the twilio-python RequestValidator tests): auth
    /// token 12345, URL https://mycompany.com/myapp.php?foo=1&bar=2, five form parameters.
    #[test]
    fn twilio_documented_example() {
        let body = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1234&From=%2B14158675309&To=%2B18005551212";
        let path = "/myapp.php?foo=1&bar=2";
        let h = headers_of(&[(SIGNATURE_HEADER, "RSOYDt4T1cUTdK1PDd93/VVr8B8=".into())]);
        let secrets = [Secret::new("other"), Secret::new("12345")];
        let v = config().verify(&request(&h, body, path), &secrets).unwrap();
        assert_eq!(v.secret_index, 1);
        let signed = config().sign(&request(&HeaderMap::new(), body, path), &secrets[1]);
        assert_eq!(signed.headers[0].1, "RSOYDt4T1cUTdK1PDd93/VVr8B8=");
        assert_eq!(signed.query, None);
        // A changed parameter, or another path, does not verify.
        let tampered = b"CallSid=CA1234567890ABCDE&Caller=%2B14158675309&Digits=1235&From=%2B14158675309&To=%2B18005551212";
        assert!(matches!(
            config().verify(&request(&h, tampered, path), &secrets),
            Err(SignatureError::Mismatch { .. })
        ));
        assert!(config()
            .verify(&request(&h, body, "/myapp.php?foo=1&bar=3"), &secrets)
            .is_err());
    }

    /// What one signature verifies for, beyond the bytes Twilio sent: a trailing `&`, the
    /// fields in another order, `%41` for `A`, `+` for `%20`, a field repeated. All carry
    /// the same signed content, the delivery's identity in the dedup.
    #[test]
    fn equivalent_forms_of_one_form_share_their_signed_content() {
        let body = "AccountSid=AC1&Body=hi+there&MessageSid=SM1&MessageStatus=sent";
        let path = "/webhooks/twilio";
        let secret = Secret::new("12345");
        let signed = config().sign(&request(&HeaderMap::new(), body.as_bytes(), path), &secret);
        let h = headers_of(&signed.headers);
        let first = config()
            .verify(
                &request(&h, body.as_bytes(), path),
                std::slice::from_ref(&secret),
            )
            .unwrap();
        let expected: [u8; 32] = Sha256::digest(
            b"https://mycompany.com/webhooks/twilioAccountSidAC1Bodyhi thereMessageSidSM1MessageStatussent",
        )
        .into();
        assert_eq!(first.signed_content, Some(expected));
        for variant in [
            format!("{body}&"),
            "MessageStatus=sent&MessageSid=SM1&Body=hi+there&AccountSid=AC1".to_owned(),
            body.replacen("AccountSid", "%41ccountSid", 1),
            body.replace('+', "%20"),
            format!("AccountSid=AC1&{body}"),
        ] {
            assert_ne!(variant, body);
            let v = config()
                .verify(
                    &request(&h, variant.as_bytes(), path),
                    std::slice::from_ref(&secret),
                )
                .unwrap_or_else(|e| panic!("{variant}: {e}"));
            assert_eq!(v.signed_content, first.signed_content, "{variant}");
        }
        // Another status is another signed content.
        let other = body.replace("sent", "delivered");
        let signed = config().sign(&request(&HeaderMap::new(), other.as_bytes(), path), &secret);
        let v = config()
            .verify(
                &request(&headers_of(&signed.headers), other.as_bytes(), path),
                &[secret],
            )
            .unwrap();
        assert_ne!(v.signed_content, first.signed_content);
    }

    #[test]
    fn json_bodies_are_covered_by_body_sha256() {
        let body = br#"{"event":"x"}"#;
        let secret = Secret::new("token");
        let signed = config().sign(&request(&HeaderMap::new(), body, "/webhooks/t"), &secret);
        let (name, hash) = signed.query.clone().unwrap();
        assert_eq!(name, "bodySHA256");
        let path = format!("/webhooks/t?bodySHA256={hash}");
        let h = headers_of(&signed.headers);
        assert!(config()
            .verify(&request(&h, body, &path), std::slice::from_ref(&secret))
            .is_ok());
        // The body is bound by its hash: another body fails even with the same URL.
        assert!(matches!(
            config().verify(
                &request(&h, br#"{"event":"y"}"#, &path),
                std::slice::from_ref(&secret)
            ),
            Err(SignatureError::Mismatch { .. })
        ));
        // Without the header: missing.
        assert_eq!(
            config().verify(&request(&HeaderMap::new(), body, &path), &[secret]),
            Err(SignatureError::Missing {
                header: SIGNATURE_HEADER
            })
        );
    }

    #[test]
    fn repeated_parameters_sort_by_value() {
        let a = parse_form(b"b=2&a=z&a=y&a=y").unwrap();
        assert_eq!(
            a,
            vec![
                ("a".into(), "y".into()),
                ("a".into(), "z".into()),
                ("b".into(), "2".into())
            ]
        );
        assert!(parse_form(&[0xff]).is_none());
    }
}
