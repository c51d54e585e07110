//! Stripe: `Stripe-Signature: t=<unix s>,v1=<hex>[,v1=<hex>…]`, each `v1` an
//! HMAC-SHA256 of `"{t}.{body}"` keyed with the whole endpoint secret
//! (`whsec_…`) as text. Several `v1` appear while Stripe rolls a secret; any
//! one verifies. Other schemes (`v0`, test-mode extras) are ignored, as
//! Stripe's libraries ignore them.

use axum::http::HeaderMap;

use super::{
    header_str, hex_32, hmac_parts, match_hmac, parse_unix_timestamp, Secret, SignatureError,
    Verified,
};

/// The signature header.
pub const SIGNATURE_HEADER: &str = "stripe-signature";
/// What the signature header holds.
pub const SIGNATURE_FORMAT: &str = "t=<unix seconds>,v1=<64 hex digits>[,v1=…]";

/// More comma-separated items than Stripe ever sends: refused rather than scanned.
pub const MAX_ITEMS: usize = 64;

/// A parsed `Stripe-Signature`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StripeHeader {
    /// The signed time, `t`.
    pub timestamp: i64,
    /// Every well-formed `v1` signature.
    pub v1: Vec<[u8; 32]>,
}

/// Parses `Stripe-Signature`, or says what is wrong with it. A second `t` is
/// refused: Stripe's libraries disagree on which one wins.
pub fn parse_header(raw: &str) -> Result<StripeHeader, &'static str> {
    let mut timestamp = None;
    let mut v1 = Vec::new();
    for (i, item) in raw.split(',').enumerate() {
        if i >= MAX_ITEMS {
            return Err("at most 64 comma-separated items");
        }
        let Some((key, value)) = item.trim().split_once('=') else {
            continue;
        };
        match key {
            "t" => {
                if timestamp.is_some() {
                    return Err("a single t=<unix seconds>");
                }
                timestamp =
                    Some(parse_unix_timestamp(value).ok_or("t=<unix seconds>, digits only")?);
            }
            "v1" => v1.extend(hex_32(value)),
            _ => {}
        }
    }
    let timestamp = timestamp.ok_or(SIGNATURE_FORMAT)?;
    if v1.is_empty() {
        return Err("at least one v1=<64 hex digits> (v0 and other schemes are ignored)");
    }
    Ok(StripeHeader { timestamp, v1 })
}

pub(super) fn verify(
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[Secret],
) -> Result<Verified, SignatureError> {
    let raw = header_str(headers, SIGNATURE_HEADER)?;
    let parsed = parse_header(raw).map_err(|expected| SignatureError::Malformed {
        header: SIGNATURE_HEADER,
        expected,
    })?;
    // Stripe's libraries sign the parsed integer, not the text as sent.
    let ts = parsed.timestamp.to_string();
    let parts: [&[u8]; 3] = [ts.as_bytes(), b".", body];
    let secret_index = match_hmac(SIGNATURE_HEADER, secrets, &parts, &parsed.v1)?;
    Ok(Verified {
        secret_index,
        signed_at: Some(parsed.timestamp),
        delivery_id: None,
        signed_content: None,
    })
}

pub(super) fn sign(body: &[u8], secret: &Secret, now: i64) -> Vec<(&'static str, String)> {
    let ts = now.to_string();
    let mac = hmac_parts(secret.expose(), &[ts.as_bytes(), b".", body]);
    vec![(SIGNATURE_HEADER, format!("t={ts},v1={}", hex::encode(mac)))]
}

#[cfg(test)]
mod tests {
    use super::super::tests::{headers_of, NOW};
    use super::super::{sign, verify, Scheme};
    use super::*;

    const BODY: &[u8] = br#"{"id":"evt_test_webhook","object":"event"}"#;
    // stripe-python: WebhookSignature.generate_signature_header(BODY, "whsec_test_secret", timestamp=NOW)
    const LIBRARY_HEADER: &str =
        "t=1800000000,v1=2b7949b5c760d4354e86486377c74f33444ab31ea5140ed1840cf13be62bab95";

    fn check(header: &str) -> Result<Verified, SignatureError> {
        let headers = headers_of(&[(SIGNATURE_HEADER, header.to_owned())]);
        verify(
            Scheme::Stripe,
            &headers,
            BODY,
            &[Secret::new("whsec_other"), Secret::new("whsec_test_secret")],
            NOW,
            300,
        )
    }

    #[test]
    fn the_librarys_header_verifies_and_is_what_we_sign() {
        let v = check(LIBRARY_HEADER).unwrap();
        assert_eq!((v.secret_index, v.signed_at), (1, Some(NOW)));
        assert_eq!(
            sign(Scheme::Stripe, BODY, &Secret::new("whsec_test_secret"), NOW),
            vec![(SIGNATURE_HEADER, LIBRARY_HEADER.to_owned())]
        );
    }

    #[test]
    fn several_v1_and_other_schemes_are_accepted_in_any_order() {
        let good = &LIBRARY_HEADER[13..];
        let bad = format!("v1={}", "0".repeat(64));
        for header in [
            format!("{bad},t={NOW},v0={},{good}", "1".repeat(64)),
            format!("t={NOW}, {good}, {bad}"),
            format!("t={NOW},{good},v1=zz,junk"),
        ] {
            assert!(check(&header).is_ok(), "{header}");
        }
        assert_eq!(
            check(&format!("t={NOW},{bad}")).unwrap_err().code(),
            "invalid_signature"
        );
    }

    #[test]
    fn malformed_headers_say_what_is_expected() {
        let good = &LIBRARY_HEADER[13..];
        for (header, expected) in [
            (good.to_owned(), SIGNATURE_FORMAT),
            (
                format!("t={NOW},t={NOW},{good}"),
                "a single t=<unix seconds>",
            ),
            (format!("t=-{NOW},{good}"), "t=<unix seconds>, digits only"),
            (
                format!("t={NOW},v0={}", "1".repeat(64)),
                "at least one v1=<64 hex digits> (v0 and other schemes are ignored)",
            ),
        ] {
            assert_eq!(
                check(&header),
                Err(SignatureError::Malformed {
                    header: SIGNATURE_HEADER,
                    expected
                }),
                "{header}"
            );
        }
        assert!(parse_header(&",".repeat(MAX_ITEMS + 1)).is_err());
    }

    proptest::proptest! {
        /// Headers assembled from plausible and hostile items parse exactly when
        /// they hold one well-formed `t` and at least one well-formed `v1`.
        #[test]
        fn assembled_headers_parse_by_the_rules(
            items in proptest::collection::vec(
                proptest::prop_oneof![
                    "t=[0-9]{1,12}",
                    "t=[-+ a-z0-9]{0,4}",
                    "v1=[0-9a-f]{64}",
                    "v1=[0-9a-fz]{0,70}",
                    "v0=[0-9a-f]{64}",
                    "[ -+\\--~]{0,8}",
                ],
                0..8,
            )
        ) {
            let raw = items.join(",");
            let t_items: Vec<&String> = items.iter().filter(|i| i.trim().starts_with("t=")).collect();
            let good_t = t_items.len() == 1
                && super::super::parse_unix_timestamp(&t_items[0].trim()[2..]).is_some();
            let good_v1 = items.iter().any(|i| {
                i.trim().strip_prefix("v1=").and_then(super::super::hex_32).is_some()
            });
            proptest::prop_assert_eq!(parse_header(&raw).is_ok(), good_t && good_v1, "{}", raw);
        }
    }
}
