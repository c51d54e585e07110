//! Signature schemes (SPEC §2): pure functions from headers, raw body, secrets
//! and the time of receipt to a verdict. No I/O, no JSON: the HMAC is computed
//! over the raw bytes before anything parses them.

use std::fmt;

use axum::http::HeaderMap;
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// How a source's publisher signs its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// `X-Signature: <hex HMAC of the raw body>` (first seed).
    HmacHex,
    /// `X-Timestamp: <unix s>` and `X-Signature: <hex HMAC of "{ts}.{body}">` (second seed).
    HmacTimestamped,
}

/// Header carrying the signature in both seed schemes.
pub const SIGNATURE_HEADER: &str = "x-signature";
/// Header carrying the signing time in the timestamped scheme.
pub const TIMESTAMP_HEADER: &str = "x-timestamp";

impl Scheme {
    /// The scheme's name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::HmacHex => "hmac-hex",
            Scheme::HmacTimestamped => "hmac-timestamped",
        }
    }

    /// Whether the scheme signs a timestamp that must fall inside the tolerance window.
    pub fn is_timestamped(self) -> bool {
        matches!(self, Scheme::HmacTimestamped)
    }
}

/// A shared secret. Its `Debug` never shows the bytes, so it cannot leak into a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps the secret's bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// The secret's bytes, for constant-time comparisons and signing; never log them.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC accepts keys of any length, so this cannot fail.
        HmacSha256::new_from_slice(&self.0).expect("HMAC takes keys of any length")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Why a delivery did not verify. Never carries a secret or an expected signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SignatureError {
    /// A header the scheme needs is absent.
    Missing {
        /// The absent header.
        header: &'static str,
    },
    /// A header is present but not in the scheme's format.
    Malformed {
        /// The malformed header.
        header: &'static str,
        /// What the scheme expects there.
        expected: &'static str,
    },
    /// No configured secret produces the given signature.
    Mismatch,
    /// The signature verifies, but its timestamp is outside the tolerance window.
    TimestampOutOfTolerance {
        /// Signed time minus time of receipt, in seconds.
        skew_s: i64,
    },
}

impl SignatureError {
    /// The `error` code of the 401 answer (SPEC §2).
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::Missing { .. } => "missing_signature",
            SignatureError::Malformed { .. } | SignatureError::Mismatch => "invalid_signature",
            SignatureError::TimestampOutOfTolerance { .. } => "timestamp_out_of_tolerance",
        }
    }
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureError::Missing { header } => write!(f, "header {header} is missing"),
            SignatureError::Malformed { header, expected } => {
                write!(f, "header {header} is malformed: expected {expected}")
            }
            SignatureError::Mismatch => {
                f.write_str("no configured secret produces this signature over the raw body")
            }
            SignatureError::TimestampOutOfTolerance { skew_s } => write!(
                f,
                "signed timestamp is {}s {} the time of receipt, beyond the tolerance",
                skew_s.unsigned_abs(),
                if *skew_s < 0 { "before" } else { "after" }
            ),
        }
    }
}

/// What a verified delivery proved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    /// Position of the secret that matched in the source's list.
    pub secret_index: usize,
    /// The signed timestamp, for timestamped schemes.
    pub signed_at: Option<i64>,
}

/// Verifies one delivery against every secret of its source, as of `received_at` (unix seconds).
pub fn verify(
    scheme: Scheme,
    headers: &HeaderMap,
    body: &[u8],
    secrets: &[Secret],
    received_at: i64,
    tolerance_s: u64,
) -> Result<Verified, SignatureError> {
    let signature = hex_signature(headers, SIGNATURE_HEADER)?;
    let timestamp = match scheme {
        Scheme::HmacHex => None,
        Scheme::HmacTimestamped => Some(unix_timestamp(headers, TIMESTAMP_HEADER)?),
    };
    let secret_index = secrets
        .iter()
        .position(|secret| {
            let mut mac = secret.mac();
            if let Some((_, raw)) = timestamp {
                mac.update(raw.as_bytes());
                mac.update(b".");
            }
            mac.update(body);
            // `verify_slice` compares in constant time.
            mac.verify_slice(&signature).is_ok()
        })
        .ok_or(SignatureError::Mismatch)?;
    let signed_at = timestamp.map(|(ts, _)| ts);
    if let Some(ts) = signed_at {
        let skew_s = ts.saturating_sub(received_at);
        if skew_s.unsigned_abs() > tolerance_s {
            return Err(SignatureError::TimestampOutOfTolerance { skew_s });
        }
    }
    Ok(Verified {
        secret_index,
        signed_at,
    })
}

/// Signs a body the way the scheme's publisher would, at `now` (unix seconds).
/// Returns the headers to send.
pub fn sign(scheme: Scheme, body: &[u8], secret: &Secret, now: i64) -> Vec<(&'static str, String)> {
    let mut mac = secret.mac();
    let mut headers = Vec::with_capacity(2);
    if scheme.is_timestamped() {
        let ts = now.to_string();
        mac.update(ts.as_bytes());
        mac.update(b".");
        headers.push((TIMESTAMP_HEADER, ts));
    }
    mac.update(body);
    headers.push((SIGNATURE_HEADER, hex::encode(mac.finalize().into_bytes())));
    headers
}

fn header_str<'h>(headers: &'h HeaderMap, name: &'static str) -> Result<&'h str, SignatureError> {
    let value = headers
        .get(name)
        .ok_or(SignatureError::Missing { header: name })?;
    value
        .to_str()
        .map(str::trim)
        .map_err(|_| SignatureError::Malformed {
            header: name,
            expected: "ASCII text",
        })
}

fn hex_signature(headers: &HeaderMap, name: &'static str) -> Result<Vec<u8>, SignatureError> {
    let raw = header_str(headers, name)?;
    let malformed = SignatureError::Malformed {
        header: name,
        expected: "64 hex digits (HMAC-SHA256)",
    };
    if raw.len() != 64 {
        return Err(malformed);
    }
    hex::decode(raw).map_err(|_| malformed)
}

fn unix_timestamp<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<(i64, &'h str), SignatureError> {
    let raw = header_str(headers, name)?;
    // Only plain digits: "+5" or " 5" would verify differently at the publisher.
    if raw.is_empty() || raw.len() > 18 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SignatureError::Malformed {
            header: name,
            expected: "unix time in whole seconds",
        });
    }
    let ts = raw.parse().map_err(|_| SignatureError::Malformed {
        header: name,
        expected: "unix time in whole seconds",
    })?;
    Ok((ts, raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const NOW: i64 = 1_800_000_000;

    fn headers_of(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    fn secrets() -> Vec<Secret> {
        vec![Secret::new("old-secret"), Secret::new("new-secret")]
    }

    #[test]
    fn signed_bodies_verify_with_any_listed_secret() {
        for scheme in [Scheme::HmacHex, Scheme::HmacTimestamped] {
            for (index, secret) in secrets().iter().enumerate() {
                let headers = headers_of(&sign(scheme, b"{}", secret, NOW));
                let verified = verify(scheme, &headers, b"{}", &secrets(), NOW, 300).unwrap();
                assert_eq!(verified.secret_index, index);
            }
        }
    }

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
    fn tampering_and_wrong_secrets_are_mismatches() {
        let headers = headers_of(&sign(Scheme::HmacHex, b"{}", &Secret::new("x"), NOW));
        assert_eq!(
            verify(
                Scheme::HmacHex,
                &headers,
                b"{ }",
                &[Secret::new("x")],
                NOW,
                300
            ),
            Err(SignatureError::Mismatch)
        );
        assert_eq!(
            verify(Scheme::HmacHex, &headers, b"{}", &secrets(), NOW, 300),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn missing_and_malformed_headers_are_named() {
        let none = HeaderMap::new();
        assert_eq!(
            verify(Scheme::HmacHex, &none, b"{}", &secrets(), NOW, 300),
            Err(SignatureError::Missing {
                header: SIGNATURE_HEADER
            })
        );
        let bad_hex = headers_of(&[(SIGNATURE_HEADER, "zz".repeat(32))]);
        let err = verify(Scheme::HmacHex, &bad_hex, b"{}", &secrets(), NOW, 300).unwrap_err();
        assert_eq!(err.code(), "invalid_signature");
        let mut no_ts = sign(Scheme::HmacTimestamped, b"{}", &secrets()[0], NOW);
        no_ts.retain(|(name, _)| *name != TIMESTAMP_HEADER);
        assert_eq!(
            verify(
                Scheme::HmacTimestamped,
                &headers_of(&no_ts),
                b"{}",
                &secrets(),
                NOW,
                300
            ),
            Err(SignatureError::Missing {
                header: TIMESTAMP_HEADER
            })
        );
    }

    #[test]
    fn timestamps_outside_the_window_fail_only_after_the_signature_verifies() {
        let old = headers_of(&sign(
            Scheme::HmacTimestamped,
            b"{}",
            &secrets()[0],
            NOW - 600,
        ));
        let future = headers_of(&sign(
            Scheme::HmacTimestamped,
            b"{}",
            &secrets()[0],
            NOW + 301,
        ));
        let edge = headers_of(&sign(
            Scheme::HmacTimestamped,
            b"{}",
            &secrets()[0],
            NOW - 300,
        ));
        let verify_at = |h: &HeaderMap, body: &[u8]| {
            verify(Scheme::HmacTimestamped, h, body, &secrets(), NOW, 300)
        };
        assert_eq!(
            verify_at(&old, b"{}"),
            Err(SignatureError::TimestampOutOfTolerance { skew_s: -600 })
        );
        assert_eq!(
            verify_at(&future, b"{}"),
            Err(SignatureError::TimestampOutOfTolerance { skew_s: 301 })
        );
        assert!(verify_at(&edge, b"{}").is_ok());
        // A tampered body on an old timestamp is a mismatch, not a timing problem.
        assert_eq!(verify_at(&old, b"[]"), Err(SignatureError::Mismatch));
    }

    #[test]
    fn secrets_never_print() {
        assert!(!format!("{:?}", Secret::new("hunter2")).contains("hunter2"));
    }
}
