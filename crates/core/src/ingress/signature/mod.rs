//! Signature schemes (docs/contract.md, ingress): pure functions from headers, raw body, secrets
//! and the time of receipt to a verdict. No I/O, no JSON: every MAC is
//! computed over the raw bytes before anything parses them.
//!
//! One module per publisher format; each follows its publisher's published
//! format exactly and exposes its header parsers as pure `&str` functions, so
//! they can be fuzzed alone. This module holds what they share: the secret,
//! the verdicts, the tolerance window and constant-time matching.
//!
//! The configurable schemes (`hmac`, `token`, `basic`; docs/configuration.md)
//! take their headers and format from the source's settings, parsed once into
//! a [`Verifier`]; `hmac` may read fields of the body when its signed content
//! names them, still before the contract parses anything.

pub mod aws_sns;
pub mod basic;
pub mod configurable;
pub mod github;
pub mod public_key;
pub mod seed;
pub mod shopify;
pub mod slack;
pub mod standard_webhooks;
pub mod stripe;
pub mod template;
pub mod token;
pub mod twilio;

use std::fmt;
use std::sync::Arc;

use axum::http::HeaderMap;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

type HmacSha256 = Hmac<Sha256>;

/// How a source's publisher signs its deliveries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scheme {
    /// `X-Signature: <hex HMAC of the raw body>` (first seed).
    HmacHex,
    /// `X-Timestamp: <unix s>` and `X-Signature: <hex HMAC of "{ts}.{body}">` (second seed).
    HmacTimestamped,
    /// Standard Webhooks (Svix and others): `webhook-id`, `webhook-timestamp`, `webhook-signature`.
    StandardWebhooks,
    /// GitHub: `X-Hub-Signature-256: sha256=<hex HMAC of the raw body>`.
    Github,
    /// Stripe: `Stripe-Signature: t=<unix s>,v1=<hex HMAC of "{t}.{body}">`.
    Stripe,
    /// Slack: `X-Slack-Request-Timestamp` and `X-Slack-Signature: v0=<hex HMAC of "v0:{ts}:{body}">`.
    Slack,
    /// Shopify: `X-Shopify-Hmac-SHA256: <base64 HMAC of the raw body>`.
    Shopify,
    /// A configured HMAC: header, algorithm, encoding, signed content and timestamp
    /// from the source's settings ([`configurable`]).
    Hmac,
    /// A shared token in a configured header or query parameter ([`token`]).
    Token,
    /// HTTP Basic credentials ([`basic`]).
    Basic,
    /// Twilio: `X-Twilio-Signature`, HMAC-SHA1 over the URL and the form parameters
    /// ([`twilio`]); needs `public_url`.
    Twilio,
    /// An Ed25519 signature checked with the source's `public_keys` (Discord), header and
    /// signed content configured as for `hmac` ([`public_key`]).
    Ed25519,
    /// A DER ECDSA P-256 / SHA-256 signature checked with the source's `public_keys`
    /// (SendGrid), configured as for `hmac` ([`public_key`]).
    EcdsaP256,
    /// AWS SNS: a JSON message signed with the key of the certificate at its
    /// `SigningCertURL` ([`aws_sns`]), fetched by the server.
    AwsSns,
}

impl Scheme {
    /// Every scheme whose headers and format are fixed, in the order of docs/contract.md
    /// (ingress): each signs and verifies without settings of its source.
    pub const ALL: [Scheme; 7] = [
        Scheme::HmacHex,
        Scheme::HmacTimestamped,
        Scheme::StandardWebhooks,
        Scheme::Github,
        Scheme::Stripe,
        Scheme::Slack,
        Scheme::Shopify,
    ];

    /// The schemes configured by their source's settings ([`Verifier`]).
    pub const CONFIGURABLE: [Scheme; 7] = [
        Scheme::Hmac,
        Scheme::Token,
        Scheme::Basic,
        Scheme::Twilio,
        Scheme::Ed25519,
        Scheme::EcdsaP256,
        Scheme::AwsSns,
    ];

    /// The scheme's name as written in the config.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::HmacHex => "hmac-hex",
            Scheme::HmacTimestamped => "hmac-timestamped",
            Scheme::StandardWebhooks => "standard-webhooks",
            Scheme::Github => "github",
            Scheme::Stripe => "stripe",
            Scheme::Slack => "slack",
            Scheme::Shopify => "shopify",
            Scheme::Hmac => "hmac",
            Scheme::Token => "token",
            Scheme::Basic => "basic",
            Scheme::Twilio => "twilio",
            Scheme::Ed25519 => "ed25519",
            Scheme::EcdsaP256 => "ecdsa-p256",
            Scheme::AwsSns => "aws-sns",
        }
    }

    /// The scheme written as `name` in the config, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .chain(Self::CONFIGURABLE)
            .find(|s| s.name() == name)
    }

    /// Whether the scheme takes its headers and format from its source's settings.
    pub fn is_configurable(self) -> bool {
        Self::CONFIGURABLE.contains(&self)
    }

    /// The algorithm of the source's `public_keys`, for the schemes that verify with
    /// public keys instead of secrets.
    pub fn public_key(self) -> Option<public_key::Algorithm> {
        match self {
            Scheme::Ed25519 => Some(public_key::Algorithm::Ed25519),
            Scheme::EcdsaP256 => Some(public_key::Algorithm::EcdsaP256),
            _ => None,
        }
    }

    /// Whether the scheme signs a timestamp that must fall inside the tolerance window
    /// (for a configurable scheme, [`Verifier::is_timestamped`] knows).
    pub fn is_timestamped(self) -> bool {
        matches!(
            self,
            Scheme::HmacTimestamped
                | Scheme::StandardWebhooks
                | Scheme::Stripe
                | Scheme::Slack
                | Scheme::AwsSns
        )
    }

    /// Whether a raw body equal to a logged one is a duplicate: the signature covers
    /// neither a delivery id nor a timestamp (every scheme that signs an id signs a time),
    /// so a captured delivery resent under a new unsigned id verifies as a new one. Twilio
    /// signs a canonical form of its body instead: [`Verifier::dedups_by_signed_content`].
    pub fn dedups_by_body(self) -> bool {
        !self.is_timestamped() && self != Scheme::Twilio
    }

    /// The headers a delivery must carry, and what each holds, for explanations.
    pub fn required_headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Scheme::HmacHex => &[(seed::SIGNATURE_HEADER, seed::HEX_FORMAT)],
            Scheme::HmacTimestamped => &[
                (seed::TIMESTAMP_HEADER, TIMESTAMP_FORMAT),
                (seed::SIGNATURE_HEADER, seed::HEX_FORMAT),
            ],
            Scheme::StandardWebhooks => &[
                (standard_webhooks::ID_HEADER, "the message id"),
                (standard_webhooks::TIMESTAMP_HEADER, TIMESTAMP_FORMAT),
                (
                    standard_webhooks::SIGNATURE_HEADER,
                    standard_webhooks::SIGNATURE_FORMAT,
                ),
            ],
            Scheme::Github => &[(github::SIGNATURE_HEADER, github::SIGNATURE_FORMAT)],
            Scheme::Stripe => &[(stripe::SIGNATURE_HEADER, stripe::SIGNATURE_FORMAT)],
            Scheme::Slack => &[
                (slack::TIMESTAMP_HEADER, TIMESTAMP_FORMAT),
                (slack::SIGNATURE_HEADER, slack::SIGNATURE_FORMAT),
            ],
            Scheme::Shopify => &[(shopify::SIGNATURE_HEADER, shopify::SIGNATURE_FORMAT)],
            Scheme::Basic => &[(basic::HEADER, basic::FORMAT)],
            Scheme::Twilio => &[(twilio::SIGNATURE_HEADER, twilio::SIGNATURE_FORMAT)],
            // Configured: [`Verifier::required_headers`].
            Scheme::Hmac | Scheme::Token | Scheme::Ed25519 | Scheme::EcdsaP256 => &[],
            // SNS signs fields of the body.
            Scheme::AwsSns => &[],
        }
    }

    /// The header that carries the signature itself, when the scheme fixes it.
    pub fn signature_header(self) -> Option<&'static str> {
        Some(match self {
            Scheme::HmacHex | Scheme::HmacTimestamped => seed::SIGNATURE_HEADER,
            Scheme::StandardWebhooks => standard_webhooks::SIGNATURE_HEADER,
            Scheme::Github => github::SIGNATURE_HEADER,
            Scheme::Stripe => stripe::SIGNATURE_HEADER,
            Scheme::Slack => slack::SIGNATURE_HEADER,
            Scheme::Shopify => shopify::SIGNATURE_HEADER,
            Scheme::Basic => basic::HEADER,
            Scheme::Twilio => twilio::SIGNATURE_HEADER,
            Scheme::Hmac | Scheme::Token | Scheme::Ed25519 | Scheme::EcdsaP256 | Scheme::AwsSns => {
                return None
            }
        })
    }

    /// The headers the signature covers besides the body: a value read from any other
    /// header can be changed by whoever resends a captured delivery.
    pub fn signed_headers(self) -> &'static [&'static str] {
        match self {
            Scheme::HmacTimestamped => &[seed::TIMESTAMP_HEADER],
            Scheme::StandardWebhooks => &[
                standard_webhooks::ID_HEADER,
                standard_webhooks::TIMESTAMP_HEADER,
            ],
            Scheme::Slack => &[slack::TIMESTAMP_HEADER],
            Scheme::HmacHex | Scheme::Github | Scheme::Stripe | Scheme::Shopify => &[],
            Scheme::Twilio => &[],
            // Configured: [`Verifier::signed_headers`].
            Scheme::Hmac
            | Scheme::Token
            | Scheme::Basic
            | Scheme::Ed25519
            | Scheme::EcdsaP256
            | Scheme::AwsSns => &[],
        }
    }

    /// The header whose value names the delivery, used as `event_id` when the body has none.
    pub fn delivery_id_header(self) -> Option<&'static str> {
        match self {
            Scheme::StandardWebhooks => Some(standard_webhooks::ID_HEADER),
            Scheme::Github => Some(github::DELIVERY_HEADER),
            Scheme::Shopify => Some(shopify::EVENT_ID_HEADER),
            _ => None,
        }
    }

    /// Checks that a configured secret has the form this scheme needs, so a
    /// typo fails at startup instead of as a 401 on every delivery, and that a shared
    /// token or password cannot be guessed ([`MIN_SHARED_SECRET_BYTES`]). The
    /// explanation never contains the secret.
    pub fn check_secret(self, secret: &Secret) -> Result<(), &'static str> {
        if secret.expose().is_empty() {
            return Err("is empty");
        }
        if secret.expose().iter().all(u8::is_ascii_whitespace) {
            return Err("is blank (only whitespace)");
        }
        match self {
            Scheme::StandardWebhooks => standard_webhooks::Key::parse(secret).map(|_| ()),
            Scheme::Basic => basic::check_secret(secret),
            Scheme::Token => token::check_secret(secret),
            Scheme::Ed25519 | Scheme::EcdsaP256 => self
                .public_key()
                .map_or(Ok(()), |alg| public_key::check_key(alg, secret)),
            _ => Ok(()),
        }
    }
}

/// A scheme name that is none of [`Scheme::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown scheme {name:?}: expected one of {}, {}", Scheme::ALL.map(Scheme::name).join(", "), Scheme::CONFIGURABLE.map(Scheme::name).join(", "))]
pub struct UnknownScheme {
    /// The name given.
    pub name: String,
}

impl std::str::FromStr for Scheme {
    type Err = UnknownScheme;

    fn from_str(raw: &str) -> Result<Self, UnknownScheme> {
        Self::from_name(raw).ok_or_else(|| UnknownScheme {
            name: raw.to_owned(),
        })
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Headers that carry credentials whatever their owner calls them.
const CREDENTIAL_HEADERS: [&str; 4] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
];

/// Whether the header `name` (any case) carries a signature of any scheme or a credential:
/// such a header is never kept with an event nor read as one of its fields.
pub fn carries_credential(name: &str) -> bool {
    Scheme::ALL
        .iter()
        .chain(&Scheme::CONFIGURABLE)
        .filter_map(|scheme| scheme.signature_header())
        .chain([standard_webhooks::SVIX_SIGNATURE_HEADER])
        .chain(CREDENTIAL_HEADERS)
        .any(|header| header.eq_ignore_ascii_case(name))
}

/// The shortest token (`token`) or password (`basic`) a source accepts, as the admin
/// token's minimum: whoever can reach the source could otherwise guess it, and with it
/// send deliveries (a `basic` secret of `":"` would let `Basic Og==` in).
pub const MIN_SHARED_SECRET_BYTES: usize = 16;

/// How every timestamped scheme writes its time.
pub const TIMESTAMP_FORMAT: &str = "unix time in whole seconds (digits only)";

/// A shared secret or key. Its `Debug` never shows the bytes, so it cannot leak into a log by accident.
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
        hmac_with(&self.0)
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
    /// No configured secret produces any of the given signatures.
    Mismatch {
        /// The header holding the signatures.
        header: &'static str,
        /// How many well-formed signatures the header held.
        signatures: usize,
        /// How many configured secrets could check them (a Standard Webhooks
        /// `whpk_` key cannot check a `v1` HMAC, nor a `whsec_` key a `v1a`).
        tried: usize,
        /// How many secrets the source lists.
        configured: usize,
    },
    /// A part of the delivery the scheme needs, outside the headers, is absent (a query
    /// parameter, a signed field of the body).
    Absent {
        /// What is absent.
        what: &'static str,
    },
    /// No configured public key verifies any of the given signatures.
    KeyMismatch {
        /// The header holding the signatures.
        header: &'static str,
        /// How many well-formed signatures the header held.
        signatures: usize,
        /// How many public keys the source lists.
        keys: usize,
    },
    /// A shared token or credentials match none of the configured secrets.
    Refused {
        /// Where the token or credentials were.
        what: &'static str,
        /// How many secrets the source lists.
        configured: usize,
    },
    /// A part of the delivery refused for a reason of its own (an SNS field, a certificate
    /// URL outside `sns_cert_hosts`): both names are fixed text, never a value sent.
    Rejected {
        /// What was refused.
        what: &'static str,
        /// Why.
        why: &'static str,
    },
    /// The signature verifies, but its timestamp is outside the tolerance window.
    TimestampOutOfTolerance {
        /// Signed time minus time of receipt, in seconds.
        skew_s: i64,
        /// The source's tolerance, in seconds.
        tolerance_s: u64,
    },
}

impl SignatureError {
    /// The `error` code of the 401 answer (docs/contract.md, ingress).
    pub fn code(&self) -> &'static str {
        match self {
            SignatureError::Missing { .. } | SignatureError::Absent { .. } => "missing_signature",
            SignatureError::Malformed { .. }
            | SignatureError::Mismatch { .. }
            | SignatureError::KeyMismatch { .. }
            | SignatureError::Refused { .. }
            | SignatureError::Rejected { .. } => "invalid_signature",
            SignatureError::TimestampOutOfTolerance { .. } => "timestamp_out_of_tolerance",
        }
    }
}

impl fmt::Display for SignatureError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SignatureError::Missing { header } => write!(f, "header {header} is missing"),
            SignatureError::Absent { what } => write!(f, "{what} is missing"),
            SignatureError::Rejected { what, why } => write!(f, "{what} {why}"),
            SignatureError::Refused { what, configured } => write!(
                f,
                "{what} matches none of the {}",
                plural(*configured, "configured secret")
            ),
            SignatureError::KeyMismatch {
                header,
                signatures,
                keys,
            } => write!(
                f,
                "none of the {} verifies the {} in {header} over the signed content",
                plural(*keys, "configured public key"),
                plural(*signatures, "signature")
            ),
            SignatureError::Malformed { header, expected } => {
                write!(f, "header {header} is malformed: expected {expected}")
            }
            SignatureError::Mismatch {
                header,
                signatures,
                tried,
                configured,
            } => {
                let sigs = plural(*signatures, "signature");
                if *tried == 0 {
                    write!(
                        f,
                        "none of the {} can check the {sigs} in {header}",
                        plural(*configured, "configured secret")
                    )
                } else if tried == configured {
                    write!(
                        f,
                        "none of the {} (#0..#{}) produces the {sigs} in {header} over the raw body",
                        plural(*tried, "configured secret"),
                        tried - 1
                    )
                } else {
                    write!(
                        f,
                        "none of the {tried} of {} that can check them produces the {sigs} in {header} over the raw body",
                        plural(*configured, "configured secret")
                    )
                }
            }
            SignatureError::TimestampOutOfTolerance {
                skew_s,
                tolerance_s,
            } => write!(
                f,
                "signed timestamp is {}s {} the time of receipt, beyond the tolerance of {tolerance_s}s",
                skew_s.unsigned_abs(),
                if *skew_s < 0 { "before" } else { "after" }
            ),
        }
    }
}

fn plural(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// What a verified delivery proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Position of the secret that matched in the source's list.
    pub secret_index: usize,
    /// The signed timestamp, for timestamped schemes.
    pub signed_at: Option<i64>,
    /// The publisher's id for the delivery, for schemes that send one
    /// (`webhook-id`, `X-GitHub-Delivery`, `X-Shopify-Event-Id`): the
    /// `event_id` of a body that carries none.
    pub delivery_id: Option<String>,
    /// The SHA-256 of what the signature covers, for a scheme whose signature covers
    /// less than the raw body (an `hmac` `signed_content` without `{body}`: Mailgun's
    /// timestamp and token) or a canonical form of it (`twilio`: the URL and the sorted,
    /// decoded form fields). Two deliveries with the same one carry the same signature
    /// whatever their other bytes: it stands for the body in the dedup
    /// (docs/contract.md, duplicates).
    pub signed_content: Option<[u8; 32]>,
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
    let verified = match scheme {
        Scheme::HmacHex => seed::verify_plain(headers, body, secrets),
        Scheme::HmacTimestamped => seed::verify_timestamped(headers, body, secrets),
        Scheme::StandardWebhooks => standard_webhooks::verify(headers, body, secrets),
        Scheme::Github => github::verify(headers, body, secrets),
        Scheme::Stripe => stripe::verify(headers, body, secrets),
        Scheme::Slack => slack::verify(headers, body, secrets),
        Scheme::Shopify => shopify::verify(headers, body, secrets),
        Scheme::Hmac
        | Scheme::Token
        | Scheme::Basic
        | Scheme::Twilio
        | Scheme::Ed25519
        | Scheme::EcdsaP256
        | Scheme::AwsSns => Err(SignatureError::Absent {
            what: "the source's signature settings",
        }),
    }?;
    judge_time(verified, received_at, tolerance_s)
}

/// Only once the signature is proven is the signed time worth judging: a tampered
/// body on an old timestamp is a mismatch, not a timing problem.
pub(crate) fn judge_time(
    verified: Verified,
    received_at: i64,
    tolerance_s: u64,
) -> Result<Verified, SignatureError> {
    if let Some(ts) = verified.signed_at {
        let skew_s = ts.saturating_sub(received_at);
        if skew_s.unsigned_abs() > tolerance_s {
            return Err(SignatureError::TimestampOutOfTolerance {
                skew_s,
                tolerance_s,
            });
        }
    }
    Ok(verified)
}

/// A delivery as the configurable schemes see it: besides headers and raw body, the
/// method and the path and query it was sent to (for `{method}`, `{url}` and tokens in
/// the query).
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The raw body.
    pub body: &'a [u8],
    /// The method, `POST` for deliveries.
    pub method: &'a str,
    /// The path and query as requested (`/webhooks/name?x=1`).
    pub path_and_query: &'a str,
}

/// How a source's deliveries are verified: a scheme with fixed headers, or a configurable
/// scheme with its parsed settings (docs/configuration.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verifier {
    /// One of [`Scheme::ALL`].
    Fixed(Scheme),
    /// `signature = "hmac"`.
    Hmac(Arc<configurable::HmacConfig>),
    /// `signature = "token"`.
    Token(token::TokenConfig),
    /// `signature = "basic"`.
    Basic,
    /// `signature = "twilio"`.
    Twilio(Arc<twilio::TwilioConfig>),
    /// `signature = "ed25519"` or `"ecdsa-p256"`: the `hmac` settings, checked with the
    /// source's public keys ([`configurable::HmacConfig::public_key`]).
    PublicKey(Arc<configurable::HmacConfig>),
    /// `signature = "aws-sns"`: verified by the server, which fetches the certificate
    /// ([`Verifier::verify`] cannot).
    AwsSns(Arc<aws_sns::SnsConfig>),
}

/// What a publisher-side command sends for a delivery: headers, and for a token in the
/// query a parameter to add to the URL.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Signed {
    /// The headers to send.
    pub headers: Vec<(&'static str, String)>,
    /// A query parameter (name, value) to add.
    pub query: Option<(String, String)>,
}

impl Verifier {
    /// The scheme, as written in the config.
    pub fn scheme(&self) -> Scheme {
        match self {
            Verifier::Fixed(scheme) => *scheme,
            Verifier::Hmac(_) => Scheme::Hmac,
            Verifier::Token(_) => Scheme::Token,
            Verifier::Basic => Scheme::Basic,
            Verifier::Twilio(_) => Scheme::Twilio,
            Verifier::PublicKey(config) => match config.public_key {
                Some(public_key::Algorithm::EcdsaP256) => Scheme::EcdsaP256,
                _ => Scheme::Ed25519,
            },
            Verifier::AwsSns(_) => Scheme::AwsSns,
        }
    }

    /// Whether the signature covers a timestamp judged against the tolerance window.
    pub fn is_timestamped(&self) -> bool {
        match self {
            Verifier::Fixed(scheme) => scheme.is_timestamped(),
            Verifier::Hmac(config) | Verifier::PublicKey(config) => config.is_timestamped(),
            Verifier::Token(_) | Verifier::Basic | Verifier::Twilio(_) => false,
            Verifier::AwsSns(_) => true,
        }
    }

    /// Whether a raw body equal to a logged one is a duplicate: nothing the publisher
    /// sends bounds a replay (no signed id nor time), see [`Scheme::dedups_by_body`]. A
    /// scheme whose signature does not cover the raw body as such dedups by what it signs
    /// instead ([`Verifier::dedups_by_signed_content`]).
    pub fn dedups_by_body(&self) -> bool {
        !self.is_timestamped() && !self.dedups_by_signed_content()
    }

    /// Whether a delivery whose signed content equals a logged one's is a duplicate, timestamp
    /// or not ([`Verified::signed_content`]): the signature covers less than the raw body
    /// (an `hmac`, `ed25519` or `ecdsa-p256` `signed_content` without `{body}`), so any
    /// number of bodies verify under one signature; or a canonical form of it (`twilio`'s
    /// sorted, decoded fields), so several raw bodies do (docs/contract.md, duplicates).
    pub fn dedups_by_signed_content(&self) -> bool {
        match self {
            Verifier::Hmac(config) | Verifier::PublicKey(config) => !config.covers_body(),
            Verifier::Twilio(_) => true,
            Verifier::Fixed(_) | Verifier::Token(_) | Verifier::Basic | Verifier::AwsSns(_) => {
                false
            }
        }
    }

    /// The `signed_content` of a source whose signature does not cover the body, for the
    /// warning at start: every byte of the body outside it is unsigned.
    pub fn unsigned_body(&self) -> Option<String> {
        match self {
            Verifier::Hmac(config) | Verifier::PublicKey(config) if !config.covers_body() => {
                Some(config.content.to_string())
            }
            _ => None,
        }
    }

    /// The headers the signature covers besides the body.
    pub fn signed_headers(&self) -> Vec<&str> {
        match self {
            Verifier::Fixed(scheme) => scheme.signed_headers().to_vec(),
            Verifier::Hmac(config) | Verifier::PublicKey(config) => config.signed_headers(),
            Verifier::Token(_) | Verifier::Basic | Verifier::Twilio(_) | Verifier::AwsSns(_) => {
                Vec::new()
            }
        }
    }

    /// The header naming the delivery, used as `event_id` when the body has none.
    pub fn delivery_id_header(&self) -> Option<&'static str> {
        match self {
            Verifier::Fixed(scheme) => scheme.delivery_id_header(),
            _ => None,
        }
    }

    /// Whether a verified delivery names itself: a delivery id header, or SNS's signed
    /// `MessageId`. Without it a `json` source must locate its `event_id`.
    pub fn carries_delivery_id(&self) -> bool {
        matches!(self, Verifier::AwsSns(_)) || self.delivery_id_header().is_some()
    }

    /// The headers a delivery must carry, and what each holds, for explanations.
    pub fn required_headers(&self) -> Vec<(&str, String)> {
        match self {
            Verifier::Hmac(config) | Verifier::PublicKey(config) => config.required_headers(),
            Verifier::Token(token) => token
                .header()
                .map(|h| (h, "one of the source's tokens".to_owned()))
                .into_iter()
                .collect(),
            _ => self
                .scheme()
                .required_headers()
                .iter()
                .map(|(h, f)| (*h, (*f).to_owned()))
                .collect(),
        }
    }

    /// The headers of this source that carry a signature or a credential: never kept
    /// with an event nor read as one of its fields.
    pub fn secret_headers(&self) -> Vec<&'static str> {
        match self {
            // A signature read from the body (signature_location) is in no header.
            Verifier::Hmac(config) if config.location.is_some() => Vec::new(),
            Verifier::Hmac(config) | Verifier::PublicKey(config) => vec![config.header],
            Verifier::Token(token) => token.header().into_iter().collect(),
            Verifier::Twilio(_) => vec![twilio::SIGNATURE_HEADER],
            Verifier::Fixed(_) | Verifier::Basic | Verifier::AwsSns(_) => Vec::new(),
        }
    }

    /// Verifies one delivery against every secret of its source, as of `received_at`
    /// (unix seconds).
    pub fn verify(
        &self,
        request: &Request<'_>,
        secrets: &[Secret],
        received_at: i64,
        tolerance_s: u64,
    ) -> Result<Verified, SignatureError> {
        let verified = match self {
            Verifier::Fixed(scheme) => {
                return verify(
                    *scheme,
                    request.headers,
                    request.body,
                    secrets,
                    received_at,
                    tolerance_s,
                )
            }
            Verifier::Hmac(config) | Verifier::PublicKey(config) => {
                config.verify(request, secrets)?
            }
            Verifier::Token(token) => token.verify(request, secrets)?,
            Verifier::Twilio(config) => config.verify(request, secrets)?,
            Verifier::Basic => basic::verify(request, secrets)?,
            // The certificate is fetched by the server (`http::sns`): nothing here can check it.
            Verifier::AwsSns(_) => {
                return Err(SignatureError::Absent {
                    what: "the SigningCertURL certificate (only the server fetches it)",
                })
            }
        };
        judge_time(verified, received_at, tolerance_s)
    }

    /// See [`is_costly`].
    pub fn is_costly(&self, headers: &HeaderMap) -> bool {
        match self {
            Verifier::Fixed(scheme) => is_costly(*scheme, headers),
            // A public-key check per listed key costs far more than an HMAC.
            Verifier::PublicKey(_) => true,
            // One HMAC per secret, or one comparison per token.
            _ => false,
        }
    }

    /// See [`ignored_signatures`].
    pub fn ignored_signatures(&self, headers: &HeaderMap) -> usize {
        match self {
            Verifier::Fixed(scheme) => ignored_signatures(*scheme, headers),
            _ => 0,
        }
    }

    /// Signs a delivery as the publisher would, at `now` (unix seconds); `request`'s
    /// headers are those the sender already sends.
    pub fn sign(
        &self,
        request: &Request<'_>,
        secret: &Secret,
        now: i64,
        delivery_id: Option<&str>,
    ) -> Result<Signed, SignError> {
        let id = delivery_id
            .map(str::to_owned)
            .unwrap_or_else(|| derived_delivery_id(self.scheme(), request.body));
        match self {
            Verifier::Fixed(scheme) => Ok(Signed {
                headers: try_sign(*scheme, request.body, secret, now, delivery_id)?,
                query: None,
            }),
            Verifier::Hmac(config) | Verifier::PublicKey(config) => Ok(Signed {
                headers: config.sign(request, secret, now, &id)?,
                query: None,
            }),
            Verifier::Twilio(config) => Ok(config.sign(request, secret)),
            Verifier::Token(token) => Ok(token.sign(secret)),
            Verifier::Basic => Ok(Signed {
                headers: basic::sign(secret),
                query: None,
            }),
            Verifier::AwsSns(_) => Err(SignError(
                "aws-sns is signed by AWS with its certificate's private key, which inhook never holds",
            )),
        }
    }
}

impl fmt::Display for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.scheme().name())
    }
}

/// The one `&'static str` of a configured name (a header, a location), for verdicts that
/// name it: each distinct name is leaked once, so reloads do not grow memory.
pub(crate) fn intern(name: &str) -> &'static str {
    static NAMES: std::sync::OnceLock<std::sync::Mutex<std::collections::HashSet<&'static str>>> =
        std::sync::OnceLock::new();
    let mut names = NAMES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = names.get(name) {
        return found;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.insert(leaked);
    leaked
}

/// Whether verifying this delivery may cost more than one HMAC per secret (an ed25519
/// signature, or a list of signatures to check): such checks belong off the async threads.
pub fn is_costly(scheme: Scheme, headers: &HeaderMap) -> bool {
    match scheme {
        Scheme::StandardWebhooks => header_str(headers, standard_webhooks::SIGNATURE_HEADER)
            .is_ok_and(standard_webhooks::is_costly),
        // One HMAC per secret, compared with every listed signature: cheap whatever the list.
        _ => false,
    }
}

/// How many of the delivery's signatures go unchecked beyond the scheme's cap
/// ([`standard_webhooks::MAX_CHECKED_SIGNATURES`]).
pub fn ignored_signatures(scheme: Scheme, headers: &HeaderMap) -> usize {
    match scheme {
        Scheme::StandardWebhooks => header_str(headers, standard_webhooks::SIGNATURE_HEADER)
            .map_or(0, standard_webhooks::ignored_signatures),
        _ => 0,
    }
}

/// Why a secret cannot sign for a scheme.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SignError(pub &'static str);

/// Signs a body the way the scheme's publisher would, at `now` (unix seconds).
/// Returns the headers to send. A key that cannot sign (a Standard Webhooks
/// `whpk_` public key, malformed base64) yields no signature header, so the
/// receiver answers `missing_signature`; [`try_sign`] says why instead.
pub fn sign(scheme: Scheme, body: &[u8], secret: &Secret, now: i64) -> Vec<(&'static str, String)> {
    try_sign(scheme, body, secret, now, None).unwrap_or_default()
}

/// Signs a body as the scheme's publisher would, with the given delivery id
/// for schemes that send one (default: derived from the body, so a resend
/// carries the same id as a publisher's retry would).
pub fn try_sign(
    scheme: Scheme,
    body: &[u8],
    secret: &Secret,
    now: i64,
    delivery_id: Option<&str>,
) -> Result<Vec<(&'static str, String)>, SignError> {
    let derived;
    let id = match delivery_id {
        Some(id) => id,
        None => {
            derived = derived_delivery_id(scheme, body);
            &derived
        }
    };
    Ok(match scheme {
        Scheme::HmacHex => seed::sign_plain(body, secret),
        Scheme::HmacTimestamped => seed::sign_timestamped(body, secret, now),
        Scheme::StandardWebhooks => standard_webhooks::sign(body, secret, now, id)?,
        Scheme::Github => github::sign(body, secret, id),
        Scheme::Stripe => stripe::sign(body, secret, now),
        Scheme::Slack => slack::sign(body, secret, now),
        Scheme::Shopify => shopify::sign(body, secret, id),
        Scheme::Hmac
        | Scheme::Token
        | Scheme::Basic
        | Scheme::Twilio
        | Scheme::Ed25519
        | Scheme::EcdsaP256
        | Scheme::AwsSns => {
            return Err(SignError(
                "signs with its source's settings: give the config that holds the source",
            ))
        }
    })
}

/// A stable id for a body, shaped like the publisher's ids.
fn derived_delivery_id(scheme: Scheme, body: &[u8]) -> String {
    let digest = hex::encode(&Sha256::digest(body)[..16]);
    match scheme {
        Scheme::StandardWebhooks => format!("msg_{digest}"),
        // GitHub's delivery ids are GUIDs.
        Scheme::Github => format!(
            "{}-{}-{}-{}-{}",
            &digest[0..8],
            &digest[8..12],
            &digest[12..16],
            &digest[16..20],
            &digest[20..32]
        ),
        _ => digest,
    }
}

/// Base64 as the publishers write it, tolerating missing padding as their libraries do.
pub(crate) const BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// Base64 with padding, as every publisher sends it.
pub(crate) fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Decodes base64 into exactly `N` bytes.
pub(crate) fn base64_exact<const N: usize>(raw: &str) -> Option<[u8; N]> {
    use base64::Engine;
    // Decoding a longer input would only be thrown away: refuse it before allocating.
    if raw.len() > N.div_ceil(3) * 4 {
        return None;
    }
    BASE64.decode(raw).ok()?.try_into().ok()
}

/// Decodes exactly 64 hex digits (an HMAC-SHA256).
pub(crate) fn hex_32(raw: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    hex::decode_to_slice(raw, &mut out).ok()?;
    Some(out)
}

/// Parses a timestamp header's value: plain digits only, since `+5` or ` 5`
/// would be signed differently by the publisher.
pub fn parse_unix_timestamp(raw: &str) -> Option<i64> {
    if raw.is_empty() || raw.len() > 18 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse().ok()
}

fn hmac_with(key: &[u8]) -> HmacSha256 {
    // HMAC accepts keys of any length, so this cannot fail.
    HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length")
}

/// HMAC-SHA256 of the concatenated parts.
pub(crate) fn hmac_parts(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = hmac_with(key);
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

/// Finds the first secret whose HMAC over `parts` equals one of `candidates`,
/// comparing in constant time.
pub(crate) fn match_hmac(
    header: &'static str,
    secrets: &[Secret],
    parts: &[&[u8]],
    candidates: &[[u8; 32]],
) -> Result<usize, SignatureError> {
    secrets
        .iter()
        .position(|secret| {
            let mut mac = secret.mac();
            for part in parts {
                mac.update(part);
            }
            let expected: [u8; 32] = mac.finalize().into_bytes().into();
            // `ct_eq` compares in constant time; folding with `|` keeps every
            // candidate compared, so timing does not tell which one matched.
            candidates
                .iter()
                .fold(subtle::Choice::from(0), |hit, c| hit | expected.ct_eq(c))
                .into()
        })
        .ok_or(SignatureError::Mismatch {
            header,
            signatures: candidates.len(),
            tried: secrets.len(),
            configured: secrets.len(),
        })
}

/// A header's value as text.
pub(crate) fn header_str<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<&'h str, SignatureError> {
    let value = headers
        .get(name)
        .ok_or(SignatureError::Missing { header: name })?;
    value
        .to_str()
        .map(str::trim)
        .map_err(|_| SignatureError::Malformed {
            header: name,
            expected: "visible ASCII text",
        })
}

/// An optional header's value, when it is text.
pub(crate) fn optional_header(headers: &HeaderMap, name: &'static str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

/// A timestamp header: its value and its text as sent.
pub(crate) fn timestamp_header<'h>(
    headers: &'h HeaderMap,
    name: &'static str,
) -> Result<(i64, &'h str), SignatureError> {
    let raw = header_str(headers, name)?;
    let ts = parse_unix_timestamp(raw).ok_or(SignatureError::Malformed {
        header: name,
        expected: TIMESTAMP_FORMAT,
    })?;
    Ok((ts, raw))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use proptest::prelude::*;

    pub const NOW: i64 = 1_800_000_000;

    pub fn headers_of(pairs: &[(&'static str, String)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        headers
    }

    /// Two secrets per scheme, in the form each scheme's config holds.
    pub fn secrets_for(scheme: Scheme) -> Vec<Secret> {
        match scheme {
            Scheme::StandardWebhooks => vec![
                Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
                Secret::new("whsec_c2Vjb25kLXNlY3JldC1mb3ItdGVzdHM="),
            ],
            Scheme::Stripe => vec![
                Secret::new("whsec_old_stripe_secret"),
                Secret::new("whsec_new_stripe_secret"),
            ],
            _ => vec![Secret::new("old-secret"), Secret::new("new-secret")],
        }
    }

    #[test]
    fn every_scheme_verifies_its_own_signatures_with_any_listed_secret() {
        for scheme in Scheme::ALL {
            let secrets = secrets_for(scheme);
            for (index, secret) in secrets.iter().enumerate() {
                let headers = headers_of(&sign(scheme, b"{}", secret, NOW));
                let verified = verify(scheme, &headers, b"{}", &secrets, NOW, 300)
                    .unwrap_or_else(|e| panic!("{scheme}: {e}"));
                assert_eq!(verified.secret_index, index, "{scheme}");
                assert_eq!(verified.signed_at.is_some(), scheme.is_timestamped());
                assert_eq!(
                    verified.delivery_id.is_some(),
                    scheme.delivery_id_header().is_some(),
                    "{scheme}"
                );
            }
        }
    }

    #[test]
    fn every_scheme_refuses_tampering_wrong_secrets_and_missing_headers() {
        for scheme in Scheme::ALL {
            let secrets = secrets_for(scheme);
            let headers = headers_of(&sign(scheme, b"{}", &secrets[0], NOW));
            let err = verify(scheme, &headers, b"{ }", &secrets, NOW, 300).unwrap_err();
            assert!(
                matches!(err, SignatureError::Mismatch { configured: 2, .. }),
                "{scheme}: {err:?}"
            );
            let other = match scheme {
                Scheme::StandardWebhooks => Secret::new("whsec_b3RoZXI="),
                _ => Secret::new("other"),
            };
            let err = verify(scheme, &headers, b"{}", &[other], NOW, 300).unwrap_err();
            assert_eq!(err.code(), "invalid_signature", "{scheme}");
            for (header, _) in scheme.required_headers() {
                let mut partial = headers.clone();
                partial.remove(*header);
                assert_eq!(
                    verify(scheme, &partial, b"{}", &secrets, NOW, 300),
                    Err(SignatureError::Missing { header }),
                    "{scheme}"
                );
            }
        }
    }

    #[test]
    fn timestamps_outside_the_window_fail_only_after_the_signature_verifies() {
        for scheme in Scheme::ALL.into_iter().filter(|s| s.is_timestamped()) {
            let secrets = secrets_for(scheme);
            let at = |t: i64| headers_of(&sign(scheme, b"{}", &secrets[0], t));
            let check = |h: &HeaderMap, body: &[u8]| verify(scheme, h, body, &secrets, NOW, 300);
            assert_eq!(
                check(&at(NOW - 600), b"{}"),
                Err(SignatureError::TimestampOutOfTolerance {
                    skew_s: -600,
                    tolerance_s: 300
                }),
                "{scheme}"
            );
            assert_eq!(
                check(&at(NOW + 301), b"{}").unwrap_err().code(),
                "timestamp_out_of_tolerance",
                "{scheme}"
            );
            assert!(check(&at(NOW - 300), b"{}").is_ok(), "{scheme}");
            assert!(check(&at(NOW + 300), b"{}").is_ok(), "{scheme}");
            // A tampered body on an old timestamp is a mismatch, not a timing problem.
            assert_eq!(
                check(&at(NOW - 600), b"[]").unwrap_err().code(),
                "invalid_signature",
                "{scheme}"
            );
        }
    }

    #[test]
    fn scheme_names_round_trip_and_match_the_config_spelling() {
        for scheme in Scheme::ALL.into_iter().chain(Scheme::CONFIGURABLE) {
            assert_eq!(Scheme::from_name(scheme.name()), Some(scheme));
            let parsed: Scheme = serde_json::from_value(scheme.name().into()).unwrap();
            assert_eq!(parsed, scheme);
        }
        assert_eq!(Scheme::from_name("svix"), None);
    }

    #[test]
    fn errors_never_show_secrets_or_expected_signatures() {
        for scheme in Scheme::ALL {
            let secrets = secrets_for(scheme);
            let good = sign(scheme, b"{}", &secrets[0], NOW);
            let headers = headers_of(&good);
            let err = verify(scheme, &headers, b"{ }", &secrets, NOW, 300).unwrap_err();
            let text = format!("{err} {err:?}");
            for secret in &secrets {
                assert!(!text.contains(&*String::from_utf8_lossy(secret.expose())));
            }
            // The signature over the tampered body is what a leak would show.
            for (_, value) in sign(scheme, b"{ }", &secrets[0], NOW) {
                if value.len() > 20 {
                    assert!(!text.contains(&value), "{scheme}: {text}");
                }
            }
        }
        assert!(!format!("{:?}", Secret::new("hunter2")).contains("hunter2"));
    }

    #[test]
    fn mismatch_explanations_count_the_secrets() {
        let err = SignatureError::Mismatch {
            header: "x-signature",
            signatures: 1,
            tried: 2,
            configured: 2,
        };
        assert_eq!(
            err.to_string(),
            "none of the 2 configured secrets (#0..#1) produces the 1 signature in x-signature over the raw body"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Hostile header values never panic any scheme, and never verify.
        #[test]
        fn arbitrary_headers_never_panic(
            values in proptest::collection::vec("[ -~]{0,120}", 4),
            body in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            for scheme in Scheme::ALL {
                let mut headers = HeaderMap::new();
                let names = scheme.required_headers();
                for ((name, _), value) in names.iter().zip(&values) {
                    if let Ok(v) = HeaderValue::from_str(value) {
                        headers.insert(*name, v);
                    }
                }
                let secrets = secrets_for(scheme);
                let result = verify(scheme, &headers, &body, &secrets, NOW, 300);
                prop_assert!(result.is_err());
            }
        }
    }
}
