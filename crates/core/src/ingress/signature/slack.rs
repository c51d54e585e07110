//! Slack: `X-Slack-Request-Timestamp: <unix s>` and
//! `X-Slack-Signature: v0=<hex HMAC-SHA256 of "v0:{timestamp}:{body}">`,
//! keyed with the app's signing secret as text.

use axum::http::HeaderMap;

use super::{
    header_str, hex_32, hmac_parts, match_hmac, timestamp_header, Secret, SignatureError, Verified,
};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-slack-signature";
/// The signing time header.
pub const TIMESTAMP_HEADER: &str = "x-slack-request-timestamp";
/// What the signature header holds.
pub const SIGNATURE_FORMAT: &str = "v0=<64 hex digits>";

/// Parses `X-Slack-Signature`: `v0` is the only version Slack has published.
pub fn parse_signature(raw: &str) -> Option<[u8; 32]> {
    hex_32(raw.strip_prefix("v0=")?)
}

pub(super) fn verify(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let raw = header_str(headers, SIGNATURE_HEADER)?;
    let (ts, ts_raw) = timestamp_header(headers, TIMESTAMP_HEADER)?;
    let signature = parse_signature(raw).ok_or(SignatureError::Malformed {
        header: SIGNATURE_HEADER,
        expected: SIGNATURE_FORMAT,
    })?;
    // Slack's own verifiers sign the header's text as sent.
    let parts: [&[u8]; 4] = [b"v0:", ts_raw.as_bytes(), b":", body];
    let secret_index = match_hmac(SIGNATURE_HEADER, secrets, &parts, &[signature])?;
    Ok(Verified {
        secret_index,
        signed_at: Some(ts),
        delivery_id: None,
        signed_content: None,
    })
}

pub(super) fn sign(body: &[u8], secret: &Secret, now: i64) -> Vec<(&'static str, String)> {
    let ts = now.to_string();
    let mac = hmac_parts(secret.expose(), &[b"v0:", ts.as_bytes(), b":", body]);
    vec![
        (TIMESTAMP_HEADER, ts),
        (SIGNATURE_HEADER, format!("v0={}", hex::encode(mac))),
    ]
}

#[cfg(test)]
mod tests {
    use super::super::tests::headers_of;
    use super::super::{sign, verify, Scheme};
    use super::*;

    /// The worked example of Slack's "Verifying requests from Slack".
    const DOCS_SECRET: &str = "8f742231b10e8888abcd99yyyzzz85a5";
    const DOCS_TS: i64 = 1531420618;
    const DOCS_BODY: &str = "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text=&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c";
    const DOCS_SIGNATURE: &str =
        "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503";

    #[test]
    fn the_docs_example_verifies_and_signs() {
        let secret = Secret::new(DOCS_SECRET);
        let headers = headers_of(&[
            (TIMESTAMP_HEADER, DOCS_TS.to_string()),
            (SIGNATURE_HEADER, DOCS_SIGNATURE.into()),
        ]);
        let body = DOCS_BODY.as_bytes();
        let v = verify(
            Scheme::Slack,
            &headers,
            body,
            std::slice::from_ref(&secret),
            DOCS_TS + 60,
            300,
        );
        assert_eq!(v.unwrap().signed_at, Some(DOCS_TS));
        assert_eq!(
            headers_of(&sign(Scheme::Slack, body, &secret, DOCS_TS)),
            headers
        );
    }

    #[test]
    fn only_v0_signatures_parse() {
        let hex = &DOCS_SIGNATURE[3..];
        assert!(parse_signature(DOCS_SIGNATURE).is_some());
        for bad in [hex, &format!("v1={hex}"), "v0=", &format!("v0={hex}00")] {
            assert_eq!(parse_signature(bad), None, "{bad}");
        }
    }
}
