//! `signature = "hmac"` (docs/configuration.md): an HMAC whose header,
//! algorithm, encoding, prefix, header format, signed content and timestamp
//! are all configured, for publishers without a scheme of their own (Linear,
//! Paddle, PagerDuty, Twitch, HubSpot, Mailgun, …).
//!
//! The settings are parsed once, at start, into [`HmacConfig`]; a combination
//! that cannot verify anything is refused there, naming the key. Verifying is
//! pure: headers, body, method, URL and secrets in, a verdict out.

use axum::http::{HeaderMap, HeaderName};
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Digest;
use subtle::ConstantTimeEq;

use super::public_key::{self, SignatureLen};
use super::template::{Input, Lacking, Part, Template};
use super::{
    header_str, intern, parse_unix_timestamp, Request, Secret, SignatureError, Verified, BASE64,
};

/// More separated entries in a `pairs` header than any publisher sends: refused rather than scanned.
pub const MAX_ENTRIES: usize = 64;

/// The hash under the HMAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    /// HMAC-SHA1 (20 bytes).
    Sha1,
    /// HMAC-SHA256 (32 bytes).
    Sha256,
    /// HMAC-SHA512 (64 bytes).
    Sha512,
}

impl Algorithm {
    /// Every algorithm, as written in the configuration.
    pub const NAMES: &'static str = "sha1, sha256 or sha512";

    /// The algorithm written `raw`.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "sha1" => Some(Self::Sha1),
            "sha256" => Some(Self::Sha256),
            "sha512" => Some(Self::Sha512),
            _ => None,
        }
    }

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "sha1",
            Self::Sha256 => "sha256",
            Self::Sha512 => "sha512",
        }
    }

    /// The MAC's length in bytes.
    pub fn mac_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Sha256 => 32,
            Self::Sha512 => 64,
        }
    }

    /// The HMAC of `message` under `key`.
    pub fn mac(self, key: &[u8], message: &[u8]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], message: &[u8]) -> Vec<u8> {
            // HMAC accepts keys of any length, so this cannot fail.
            let mut mac =
                <M as hmac::digest::KeyInit>::new_from_slice(key).expect("HMAC takes any key");
            mac.update(message);
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            Self::Sha1 => run::<Hmac<sha1::Sha1>>(key, message),
            Self::Sha256 => run::<Hmac<sha2::Sha256>>(key, message),
            Self::Sha512 => run::<Hmac<sha2::Sha512>>(key, message),
        }
    }
}

/// How the signature's bytes are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// Hex digits, either case.
    Hex,
    /// Standard base64, padded or not.
    Base64,
    /// URL-safe base64, padded or not.
    Base64Url,
}

/// URL-safe base64, padded or not.
const BASE64URL: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

impl Encoding {
    /// Every encoding, as written in the configuration.
    pub const NAMES: &'static str = "hex, base64 or base64url";

    /// The encoding written `raw`.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "hex" => Some(Self::Hex),
            "base64" => Some(Self::Base64),
            "base64url" => Some(Self::Base64Url),
            _ => None,
        }
    }

    /// Its name in the configuration.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hex => "hex",
            Self::Base64 => "base64",
            Self::Base64Url => "base64url",
        }
    }

    /// Decodes exactly `len` bytes; anything else is `None`.
    pub fn decode(self, raw: &str, len: usize) -> Option<Vec<u8>> {
        self.decode_fit(raw, SignatureLen::Exact(len))
    }

    /// Decodes a signature of the length `fit` allows; anything else is `None`.
    pub fn decode_fit(self, raw: &str, fit: SignatureLen) -> Option<Vec<u8>> {
        let len = fit.max();
        // Decoding a longer input would only be thrown away: refuse it before allocating.
        if raw.len() > (2 * len).max(len.div_ceil(3) * 4) {
            return None;
        }
        let bytes = match self {
            Self::Hex => hex::decode(raw).ok()?,
            Self::Base64 => BASE64.decode(raw).ok()?,
            Self::Base64Url => BASE64URL.decode(raw).ok()?,
        };
        fit.fits(bytes.len()).then_some(bytes)
    }

    /// Encodes as the publishers do (lower-case hex, padded base64, unpadded base64url).
    pub fn encode(self, bytes: &[u8]) -> String {
        match self {
            Self::Hex => hex::encode(bytes),
            Self::Base64 => super::base64_encode(bytes),
            Self::Base64Url => base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes),
        }
    }
}

/// How the timestamp is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampUnit {
    /// Unix seconds, digits only.
    Seconds,
    /// Unix milliseconds, digits only.
    Millis,
    /// An RFC 3339 date and time.
    Rfc3339,
}

impl TimestampUnit {
    /// Every unit, as written in the configuration.
    pub const NAMES: &'static str = "s, ms or rfc3339";

    /// The unit written `raw`.
    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "s" => Some(Self::Seconds),
            "ms" => Some(Self::Millis),
            "rfc3339" => Some(Self::Rfc3339),
            _ => None,
        }
    }

    /// What a timestamp in this unit looks like, for explanations.
    pub fn format(self) -> &'static str {
        match self {
            Self::Seconds => "unix time in whole seconds (digits only)",
            Self::Millis => "unix time in milliseconds (digits only)",
            Self::Rfc3339 => "an RFC 3339 date and time",
        }
    }

    /// The unix seconds `raw` stands for.
    pub fn read(self, raw: &str) -> Option<i64> {
        match self {
            Self::Seconds => parse_unix_timestamp(raw),
            Self::Millis => parse_unix_timestamp(raw).map(|ms| ms.div_euclid(1000)),
            Self::Rfc3339 => {
                time::OffsetDateTime::parse(raw, &time::format_description::well_known::Rfc3339)
                    .ok()
                    .map(|t| t.unix_timestamp())
            }
        }
    }

    /// `now` (unix seconds) written in this unit.
    pub fn write(self, now: i64) -> String {
        match self {
            Self::Seconds => now.to_string(),
            Self::Millis => now.saturating_mul(1000).to_string(),
            Self::Rfc3339 => crate::domain::clock::rfc3339(now.saturating_mul(1000)),
        }
    }
}

/// Where the signed timestamp is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimestampAt {
    /// A request header.
    Header(HeaderName),
    /// A JSON pointer into the body.
    Pointer(String),
    /// The `timestamp_key` entry of a `pairs` signature header.
    Pair(String),
}

/// The signed timestamp: where it is, and how it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timestamp {
    /// Where.
    pub at: TimestampAt,
    /// How.
    pub unit: TimestampUnit,
    /// Where, as verdicts name it (the header, or "the body field /…").
    pub location: &'static str,
}

/// How the signature header is laid out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// The header is one signature.
    Plain,
    /// `name=value` entries separated by `,` or `;`: every `signature_key` entry is a
    /// signature (any one may match).
    Pairs {
        /// The name of each signature entry.
        signature_key: String,
    },
}

/// A parsed `signature = "hmac"` source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HmacConfig {
    /// The header holding the signature(s), lower case; with `location`, how verdicts
    /// name that body field.
    pub header: &'static str,
    /// A JSON pointer to the signature in the body (`signature_location`, Mailgun), read
    /// instead of a header.
    pub location: Option<String>,
    /// The hash.
    pub algorithm: Algorithm,
    /// How the signature is written.
    pub encoding: Encoding,
    /// Text before the signature(s), stripped first.
    pub prefix: String,
    /// Plain or pairs.
    pub format: Format,
    /// The signed timestamp, if any.
    pub timestamp: Option<Timestamp>,
    /// What is signed.
    pub content: Template,
    /// The base the publisher calls, for `{url}`.
    pub public_url: Option<String>,
    /// What the header holds, for explanations.
    pub expected: &'static str,
    /// For `signature = "ed25519"` and `"ecdsa-p256"`: the source's "secrets" are its
    /// public keys (docs/configuration.md, `public_keys`) and `algorithm` is unused; the
    /// header, encoding, signed content and timestamp are read as for `hmac`.
    pub public_key: Option<public_key::Algorithm>,
}

/// The keys of a `signature = "hmac"` source, as written (docs/configuration.md).
#[derive(Debug, Clone, Default)]
pub struct HmacKeys<'a> {
    /// `signature_header`.
    pub header: Option<&'a str>,
    /// `signature_location`: a JSON pointer to the signature in the body.
    pub location: Option<&'a str>,
    /// `signature_algorithm`.
    pub algorithm: Option<&'a str>,
    /// `signature_encoding`.
    pub encoding: Option<&'a str>,
    /// `signature_prefix`.
    pub prefix: Option<&'a str>,
    /// `signature_format`.
    pub format: Option<&'a str>,
    /// `signature_key`.
    pub signature_key: Option<&'a str>,
    /// `timestamp_key`.
    pub timestamp_key: Option<&'a str>,
    /// `signed_content`.
    pub signed_content: Option<&'a str>,
    /// `timestamp`.
    pub timestamp: Option<&'a str>,
    /// `timestamp_unit`.
    pub timestamp_unit: Option<&'a str>,
    /// `public_url` (the source's, else the top level's).
    pub public_url: Option<&'a str>,
}

/// A setting that cannot work: the key, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    /// The key to fix.
    pub key: &'static str,
    /// What is wrong with it.
    pub problem: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.problem)
    }
}

fn refuse<T>(key: &'static str, problem: impl Into<String>) -> Result<T, KeyError> {
    Err(KeyError {
        key,
        problem: problem.into(),
    })
}

/// The value of a key that names one of a few choices: `default` when absent, refused
/// with the choices (`names`) when it is none of them.
fn choice<T>(
    key: &'static str,
    raw: Option<&str>,
    default: T,
    parse: fn(&str) -> Option<T>,
    names: &str,
) -> Result<T, KeyError> {
    match raw {
        None => Ok(default),
        Some(raw) => parse(raw).map_or_else(|| refuse(key, format!("{raw:?} is not {names}")), Ok),
    }
}

/// Checks a `public_url`: an absolute http(s) URL without query or fragment; returned
/// without its trailing `/`, ready to take a request's path.
pub fn parse_public_url(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"))
        .ok_or_else(|| format!("{raw:?} is not an http:// or https:// URL"))?;
    if rest.is_empty()
        || rest.contains(['?', '#', ' '])
        || rest.bytes().any(|b| b.is_ascii_control())
    {
        return Err(format!(
            "{raw:?} must be a base URL like https://hooks.example.com, without query or fragment"
        ));
    }
    Ok(trimmed.to_owned())
}

impl HmacConfig {
    /// Parses the keys of a `signature = "hmac"` source, refusing any combination that
    /// cannot verify a delivery.
    pub fn parse(keys: &HmacKeys<'_>) -> Result<Self, KeyError> {
        Self::parse_for(keys, None)
    }

    /// Parses the keys of a `signature = "ed25519"` or `"ecdsa-p256"` source: the same
    /// header, encoding, signed content and timestamp as `hmac`, checked with public keys.
    pub fn parse_public_key(
        keys: &HmacKeys<'_>,
        algorithm: public_key::Algorithm,
    ) -> Result<Self, KeyError> {
        Self::parse_for(keys, Some(algorithm))
    }

    fn parse_for(
        keys: &HmacKeys<'_>,
        public_key: Option<public_key::Algorithm>,
    ) -> Result<Self, KeyError> {
        let scheme = public_key.map_or("hmac", public_key::Algorithm::name);
        if public_key.is_some() && keys.algorithm.is_some() {
            return refuse(
                "signature_algorithm",
                format!(
                    "is only for signature = \"hmac\" (signature = \"{scheme}\" fixes its hash)"
                ),
            );
        }
        let (header, location) = match (keys.header, keys.location) {
            (Some(_), Some(_)) => {
                return refuse(
                    "signature_location",
                    "and signature_header both say where the signature is: keep one",
                )
            }
            (None, None) => {
                return refuse(
                    "signature_header",
                    format!("is required for signature = \"{scheme}\" (or, for hmac, signature_location: a signature in the body)"),
                )
            }
            (None, Some(pointer)) => {
                if !pointer.starts_with('/') {
                    return refuse(
                        "signature_location",
                        format!("{pointer:?} is not a JSON pointer like /signature/signature"),
                    );
                }
                (
                    intern(&format!("the body field {pointer}")),
                    Some(pointer.to_owned()),
                )
            }
            (Some(header_raw), None) => match HeaderName::from_bytes(header_raw.trim().as_bytes()) {
                Ok(h) => (intern(h.as_str()), None),
                Err(_) => {
                    return refuse(
                        "signature_header",
                        format!("{header_raw:?} is not a header name"),
                    )
                }
            },
        };
        let algorithm = choice(
            "signature_algorithm",
            keys.algorithm,
            Algorithm::Sha256,
            Algorithm::parse,
            Algorithm::NAMES,
        )?;
        // SendGrid writes its DER signatures in base64; Discord its Ed25519 ones in hex.
        let default_encoding = match public_key {
            Some(public_key::Algorithm::EcdsaP256) => Encoding::Base64,
            _ => Encoding::Hex,
        };
        let encoding = choice(
            "signature_encoding",
            keys.encoding,
            default_encoding,
            Encoding::parse,
            Encoding::NAMES,
        )?;
        let prefix = keys.prefix.unwrap_or_default().to_owned();
        if prefix.bytes().any(|b| !(0x20..0x7f).contains(&b)) {
            return refuse("signature_prefix", "must be visible ASCII text");
        }
        let format = match (keys.format.unwrap_or("plain"), keys.signature_key) {
            ("plain", None) => Format::Plain,
            ("plain", Some(_)) => {
                return refuse("signature_key", "is only for signature_format = \"pairs\"")
            }
            ("pairs", None) => {
                return refuse("signature_key", "is required for signature_format = \"pairs\" (the name of each signature entry, e.g. \"v1\")")
            }
            ("pairs", Some(key)) => Format::Pairs {
                signature_key: pair_key("signature_key", key)?,
            },
            (other, _) => return refuse("signature_format", format!("{other:?} is not plain or pairs")),
        };
        let timestamp = timestamp(keys, &format)?;
        let content = match Template::parse(keys.signed_content.unwrap_or("{body}")) {
            Ok(t) => t,
            Err(err) => return refuse("signed_content", err.to_string()),
        };
        if content.uses(&Part::Timestamp) && timestamp.is_none() {
            return refuse(
                "signed_content",
                "uses {timestamp}, but neither timestamp nor timestamp_key says where it is",
            );
        }
        let public_url = match keys.public_url {
            Some(raw) => match parse_public_url(raw) {
                Ok(url) => Some(url),
                Err(problem) => return refuse("public_url", problem),
            },
            None => None,
        };
        if content.uses(&Part::Url) && public_url.is_none() {
            return refuse("signed_content", "uses {url}, but no public_url is set (the base URL the publisher calls, top level or per source)");
        }
        if let Some(ts) = &timestamp {
            check_timestamp_is_signed(ts, &content)?;
        }
        if location.is_some() && matches!(format, Format::Pairs { .. }) {
            return refuse(
                "signature_format",
                "\"pairs\" is for a header; a signature_location holds one signature",
            );
        }
        let mut expected = prefix.clone();
        let one = match public_key {
            None => format!(
                "<{} of the HMAC-{}>",
                encoding.name(),
                algorithm.name().to_uppercase()
            ),
            Some(alg) => format!("<{} of the {}>", encoding.name(), alg.signature_name()),
        };
        match (&format, &timestamp) {
            (Format::Plain, _) => expected += &one,
            (
                Format::Pairs { signature_key },
                Some(Timestamp {
                    at: TimestampAt::Pair(t),
                    unit,
                    ..
                }),
            ) => {
                expected += &format!(
                    "{t}=<{}>,{signature_key}={one}[,{signature_key}=…] (\",\" or \";\")",
                    unit.format()
                )
            }
            (Format::Pairs { signature_key }, _) => {
                expected += &format!("{signature_key}={one}[,{signature_key}=…] (\",\" or \";\")")
            }
        }
        Ok(Self {
            header,
            location,
            algorithm,
            encoding,
            prefix,
            format,
            timestamp,
            content,
            public_url,
            expected: intern(&expected),
            public_key,
        })
    }

    /// Whether the scheme signs a timestamp.
    pub fn is_timestamped(&self) -> bool {
        self.timestamp.is_some()
    }

    /// The request headers the signature covers besides the body.
    pub fn signed_headers(&self) -> Vec<&str> {
        let mut out: Vec<&str> = self
            .content
            .parts()
            .iter()
            .filter_map(|p| match p {
                Part::Header(name) => Some(name.as_str()),
                _ => None,
            })
            .collect();
        if let Some(Timestamp {
            at: TimestampAt::Header(name),
            ..
        }) = &self.timestamp
        {
            if self.content.uses(&Part::Timestamp) {
                out.push(name.as_str());
            }
        }
        out
    }

    /// The headers a delivery must carry, and what each holds.
    pub fn required_headers(&self) -> Vec<(&str, String)> {
        let mut out = Vec::new();
        if self.location.is_none() {
            out.push((self.header, self.expected.to_owned()));
        }
        if let Some(Timestamp {
            at: TimestampAt::Header(name),
            unit,
            ..
        }) = &self.timestamp
        {
            out.push((name.as_str(), unit.format().to_owned()));
        }
        for part in self.content.parts() {
            if let Part::Header(name) = part {
                if !out.iter().any(|(h, _)| *h == name.as_str()) {
                    out.push((name.as_str(), "a value the signature covers".to_owned()));
                }
            }
        }
        out
    }

    /// Verifies one delivery against every secret. The timestamp's tolerance is judged by the caller.
    pub fn verify(
        &self,
        request: &Request<'_>,
        secrets: &[Secret],
    ) -> Result<Verified, SignatureError> {
        // The body read once as JSON, when the signature, the signed content or the
        // timestamp is in it.
        let json = (self.location.is_some()
            || self.content.reads_json()
            || matches!(
                self.timestamp,
                Some(Timestamp {
                    at: TimestampAt::Pointer(_),
                    ..
                })
            ))
        .then(|| serde_json::from_slice::<serde_json::Value>(request.body).ok())
        .flatten();
        let raw = match &self.location {
            None => header_str(request.headers, self.header)?,
            Some(pointer) => json
                .as_ref()
                .and_then(|doc| doc.pointer(pointer))
                .and_then(|v| v.as_str())
                .map(str::trim)
                .ok_or(SignatureError::Absent { what: self.header })?,
        };
        let malformed = SignatureError::Malformed {
            header: self.header,
            expected: self.expected,
        };
        let rest = raw
            .strip_prefix(self.prefix.as_str())
            .ok_or(malformed.clone())?;
        let len = self
            .public_key
            .map_or(SignatureLen::Exact(self.algorithm.mac_len()), |alg| {
                alg.signature_len()
            });
        let (candidates, pair_timestamp) = match &self.format {
            Format::Plain => (
                vec![self
                    .encoding
                    .decode_fit(rest.trim(), len)
                    .ok_or(malformed.clone())?],
                None,
            ),
            Format::Pairs { signature_key } => {
                let ts_key = match &self.timestamp {
                    Some(Timestamp {
                        at: TimestampAt::Pair(k),
                        ..
                    }) => Some(k.as_str()),
                    _ => None,
                };
                let pairs =
                    parse_pairs(rest, signature_key, ts_key).map_err(|_| malformed.clone())?;
                let candidates: Vec<Vec<u8>> = pairs
                    .signatures
                    .iter()
                    .filter_map(|s| self.encoding.decode_fit(s, len))
                    .collect();
                if candidates.is_empty() {
                    return Err(malformed);
                }
                (candidates, pairs.timestamp)
            }
        };
        let (timestamp_text, signed_at) = match &self.timestamp {
            None => (None, None),
            Some(ts) => {
                let (text, location) =
                    self.timestamp_text(ts, request.headers, json.as_ref(), pair_timestamp)?;
                let at = ts.unit.read(&text).ok_or(SignatureError::Malformed {
                    header: location,
                    expected: ts.unit.format(),
                })?;
                (Some(text), Some(at))
            }
        };
        let url = self
            .public_url
            .as_ref()
            .map(|base| format!("{base}{}", request.path_and_query));
        let input = Input {
            body: request.body,
            timestamp: timestamp_text.as_deref(),
            headers: request.headers,
            method: request.method,
            url: url.as_deref(),
            json: json.as_ref(),
        };
        let message = self.content.render(&input).map_err(lacking)?;
        // A signature that leaves the body out proves only what it covers: that, not the
        // raw bytes, is the delivery's identity (docs/contract.md, duplicates).
        let signed_content = (!self.covers_body()).then(|| sha2::Sha256::digest(&message).into());
        if let Some(algorithm) = self.public_key {
            // Public keys: nothing secret to compare, each key checks every signature.
            let secret_index = public_key::find(algorithm, secrets, &message, &candidates).ok_or(
                SignatureError::KeyMismatch {
                    header: self.header,
                    signatures: candidates.len(),
                    keys: secrets.len(),
                },
            )?;
            return Ok(Verified {
                secret_index,
                signed_at,
                delivery_id: None,
                signed_content,
            });
        }
        let secret_index = secrets
            .iter()
            .position(|secret| {
                let expected = self.algorithm.mac(secret.expose(), &message);
                // Every candidate is compared, so timing does not tell which one matched.
                candidates
                    .iter()
                    .fold(subtle::Choice::from(0), |hit, c| hit | expected.ct_eq(c))
                    .into()
            })
            .ok_or(SignatureError::Mismatch {
                header: self.header,
                signatures: candidates.len(),
                tried: secrets.len(),
                configured: secrets.len(),
            })?;
        Ok(Verified {
            secret_index,
            signed_at,
            delivery_id: None,
            signed_content,
        })
    }

    /// Whether the signature covers the raw body (`{body}` in `signed_content`). One that
    /// does not (Mailgun signs its timestamp and token) leaves every other byte unsigned.
    pub fn covers_body(&self) -> bool {
        self.content.uses(&Part::Body)
    }

    /// The timestamp's text as sent, and where it was read (for explanations).
    fn timestamp_text(
        &self,
        ts: &Timestamp,
        headers: &HeaderMap,
        json: Option<&serde_json::Value>,
        pair: Option<&str>,
    ) -> Result<(String, &'static str), SignatureError> {
        match &ts.at {
            TimestampAt::Pair(_) => {
                pair.map(|t| (t.to_owned(), self.header))
                    .ok_or(SignatureError::Malformed {
                        header: self.header,
                        expected: self.expected,
                    })
            }
            TimestampAt::Header(_) => {
                header_str(headers, ts.location).map(|t| (t.to_owned(), ts.location))
            }
            TimestampAt::Pointer(pointer) => {
                let what = ts.location;
                let text = match json.and_then(|j| j.pointer(pointer)) {
                    Some(serde_json::Value::String(s)) => s.clone(),
                    Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => n.to_string(),
                    _ => return Err(SignatureError::Absent { what }),
                };
                Ok((text, what))
            }
        }
    }

    /// Signs a body as the publisher would, at `now`: the headers to send. Headers the
    /// signed content names are filled with `id`; a timestamp in the body is read there.
    pub fn sign(
        &self,
        request: &Request<'_>,
        secret: &Secret,
        now: i64,
        id: &str,
    ) -> Result<Vec<(&'static str, String)>, super::SignError> {
        let mut out: Vec<(&'static str, String)> = Vec::new();
        let mut headers = request.headers.clone();
        fn put(
            out: &mut Vec<(&'static str, String)>,
            headers: &mut HeaderMap,
            name: &HeaderName,
            value: String,
        ) {
            if let Ok(v) = axum::http::HeaderValue::from_str(&value) {
                headers.insert(name.clone(), v);
            }
            out.push((intern(name.as_str()), value));
        }
        let mut ts_text = None;
        if let Some(ts) = &self.timestamp {
            let text = ts.unit.write(now);
            match &ts.at {
                TimestampAt::Header(name) => put(&mut out, &mut headers, name, text.clone()),
                TimestampAt::Pair(_) => {}
                TimestampAt::Pointer(pointer) => {
                    let json: Option<serde_json::Value> = serde_json::from_slice(request.body).ok();
                    let found = match json.as_ref().and_then(|j| j.pointer(pointer)) {
                        Some(serde_json::Value::String(s)) => Some(s.clone()),
                        Some(serde_json::Value::Number(n)) => Some(n.to_string()),
                        _ => None,
                    };
                    ts_text = Some(found.ok_or(super::SignError(
                        "the body holds no timestamp where the source's timestamp points",
                    ))?);
                }
            }
            ts_text.get_or_insert(text);
        }
        for part in self.content.parts() {
            if let Part::Header(name) = part {
                if !headers.contains_key(name) {
                    put(&mut out, &mut headers, name, id.to_owned());
                }
            }
        }
        let json = self
            .content
            .reads_json()
            .then(|| serde_json::from_slice::<serde_json::Value>(request.body).ok())
            .flatten();
        let url = self
            .public_url
            .as_ref()
            .map(|base| format!("{base}{}", request.path_and_query));
        let input = Input {
            body: request.body,
            timestamp: ts_text.as_deref(),
            headers: &headers,
            method: request.method,
            url: url.as_deref(),
            json: json.as_ref(),
        };
        let message = self
            .content
            .render(&input)
            .map_err(|_| super::SignError("the body lacks a field the signed content names"))?;
        let raw_signature = match self.public_key {
            // The publisher's private key, as `inhook send --private-key` takes it.
            Some(algorithm) => {
                let text = std::str::from_utf8(secret.expose())
                    .map_err(|_| super::SignError("the private key is not text"))?;
                let key =
                    public_key::PrivateKey::parse(algorithm, text).map_err(super::SignError)?;
                key.sign(&message)
            }
            None => self.algorithm.mac(secret.expose(), &message),
        };
        let signature = self.encoding.encode(&raw_signature);
        let value = match (&self.format, &self.timestamp) {
            (Format::Plain, _) => format!("{}{signature}", self.prefix),
            (
                Format::Pairs { signature_key },
                Some(Timestamp {
                    at: TimestampAt::Pair(t),
                    ..
                }),
            ) => format!(
                "{}{t}={},{signature_key}={signature}",
                self.prefix,
                ts_text.unwrap_or_default()
            ),
            (Format::Pairs { signature_key }, _) => {
                format!("{}{signature_key}={signature}", self.prefix)
            }
        };
        if self.location.is_some() {
            return Err(super::SignError(
                "this source reads its signature from the body (signature_location): the publisher writes it there, so sign the body's fields by hand",
            ));
        }
        out.push((self.header, value));
        Ok(out)
    }
}

/// A `SignatureError` for a part of the signed content the delivery lacks.
fn lacking(lack: Lacking<'_>) -> SignatureError {
    match lack {
        Lacking::Header(name) => SignatureError::Missing {
            header: intern(name.as_str()),
        },
        Lacking::Pointer(pointer) => SignatureError::Absent {
            what: intern(&format!("the body field {pointer} (a string or integer)")),
        },
        // Refused at start: a template that needs them has them.
        Lacking::Timestamp | Lacking::Url => SignatureError::Absent {
            what: "a part of the signed content",
        },
    }
}

/// The timestamp keys: at most one of `timestamp` and `timestamp_key`, and `timestamp_unit`
/// only with one of them.
fn timestamp(keys: &HmacKeys<'_>, format: &Format) -> Result<Option<Timestamp>, KeyError> {
    let unit = choice(
        "timestamp_unit",
        keys.timestamp_unit,
        TimestampUnit::Seconds,
        TimestampUnit::parse,
        TimestampUnit::NAMES,
    )?;
    let at = match (keys.timestamp, keys.timestamp_key) {
        (Some(_), Some(_)) => {
            return refuse(
                "timestamp_key",
                "and timestamp both say where the timestamp is: keep one",
            )
        }
        (None, Some(key)) => {
            if !matches!(format, Format::Pairs { .. }) {
                return refuse("timestamp_key", "is only for signature_format = \"pairs\"");
            }
            let key = pair_key("timestamp_key", key)?;
            if matches!(format, Format::Pairs { signature_key } if *signature_key == key) {
                return refuse("timestamp_key", "is the same as signature_key");
            }
            TimestampAt::Pair(key)
        }
        (Some(location), None) => {
            if let Some(name) = location.strip_prefix("header:") {
                match HeaderName::from_bytes(name.trim().as_bytes()) {
                    Ok(h) => TimestampAt::Header(h),
                    Err(_) => {
                        return refuse("timestamp", format!("{location:?} does not name a header"))
                    }
                }
            } else if location.starts_with('/') {
                TimestampAt::Pointer(location.to_owned())
            } else {
                return refuse(
                    "timestamp",
                    format!("{location:?} is neither header:Name nor a JSON pointer like /webhookTimestamp"),
                );
            }
        }
        (None, None) => {
            if keys.timestamp_unit.is_some() {
                return refuse(
                    "timestamp_unit",
                    "is only for a source with timestamp or timestamp_key",
                );
            }
            return Ok(None);
        }
    };
    let location = match &at {
        TimestampAt::Header(name) => intern(name.as_str()),
        TimestampAt::Pointer(pointer) => intern(&format!("the body field {pointer}")),
        // The pairs header itself, filled in by the caller's verdicts.
        TimestampAt::Pair(_) => "",
    };
    Ok(Some(Timestamp { at, unit, location }))
}

/// A timestamp the signature does not cover bounds nothing: whoever holds a captured
/// delivery would resend it with a fresh one.
fn check_timestamp_is_signed(ts: &Timestamp, content: &Template) -> Result<(), KeyError> {
    let signed = content.uses(&Part::Timestamp)
        || match &ts.at {
            TimestampAt::Header(name) => content.uses(&Part::Header(name.clone())),
            TimestampAt::Pointer(p) => {
                content.uses(&Part::Body) || content.uses(&Part::Pointer(p.clone()))
            }
            TimestampAt::Pair(_) => false,
        };
    if signed {
        return Ok(());
    }
    let key = match ts.at {
        TimestampAt::Pair(_) => "timestamp_key",
        _ => "timestamp",
    };
    refuse(
        key,
        "names a timestamp that signed_content does not cover (add {timestamp}): it would bound nothing",
    )
}

fn pair_key(key: &'static str, raw: &str) -> Result<String, KeyError> {
    if raw.is_empty()
        || raw.contains([',', ';', '=', ' '])
        || raw.bytes().any(|b| !(0x21..0x7f).contains(&b))
    {
        return refuse(
            key,
            format!("{raw:?} must be a non-empty name without ',', ';', '=' or spaces"),
        );
    }
    Ok(raw.to_owned())
}

/// The entries of a `pairs` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pairs<'a> {
    /// Every `signature_key` value, in order, as written.
    pub signatures: Vec<&'a str>,
    /// The `timestamp_key` value, if asked for and present.
    pub timestamp: Option<&'a str>,
}

/// Why a `pairs` header does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PairsError {
    /// More than [`MAX_ENTRIES`] entries.
    #[error("more than 64 entries")]
    TooMany,
    /// The timestamp entry appears twice.
    #[error("the timestamp entry appears twice")]
    TwoTimestamps,
    /// No entry named `signature_key`.
    #[error("no signature entry")]
    NoSignature,
}

/// Parses `name=value` entries separated by `,` or `;` (spaces around them ignored):
/// every `signature_key` value, and the one `timestamp_key` value if one is asked for.
/// Entries of other names and entries without `=` are ignored, as publishers add them.
pub fn parse_pairs<'a>(
    raw: &'a str,
    signature_key: &str,
    timestamp_key: Option<&str>,
) -> Result<Pairs<'a>, PairsError> {
    let mut signatures = Vec::new();
    let mut timestamp = None;
    for (i, entry) in raw.split([',', ';']).enumerate() {
        if i >= MAX_ENTRIES {
            return Err(PairsError::TooMany);
        }
        let Some((key, value)) = entry.trim().split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        if key == signature_key {
            signatures.push(value);
        } else if Some(key) == timestamp_key && timestamp.replace(value).is_some() {
            return Err(PairsError::TwoTimestamps);
        }
    }
    if signatures.is_empty() {
        return Err(PairsError::NoSignature);
    }
    Ok(Pairs {
        signatures,
        timestamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    const NOW: i64 = 1_700_000_000;

    fn config(keys: HmacKeys<'_>) -> HmacConfig {
        HmacConfig::parse(&keys).unwrap_or_else(|e| panic!("{e}"))
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    fn request<'a>(headers: &'a HeaderMap, body: &'a [u8]) -> Request<'a> {
        Request {
            headers,
            body,
            method: "POST",
            path_and_query: "/webhooks/src",
        }
    }

    fn hmac_hex(alg: Algorithm, key: &str, message: &str) -> String {
        hex::encode(alg.mac(key.as_bytes(), message.as_bytes()))
    }

    #[test]
    fn known_vectors() {
        // RFC 4231 test case 2 (HMAC-SHA256 and -SHA512) and RFC 2202 test case 2 (SHA1).
        let msg = "what do ya want for nothing?";
        assert_eq!(
            hmac_hex(Algorithm::Sha256, "Jefe", msg),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hmac_hex(Algorithm::Sha512, "Jefe", msg),
            "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea2505549758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737"
        );
        assert_eq!(
            hmac_hex(Algorithm::Sha1, "Jefe", msg),
            "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79"
        );
    }

    #[test]
    fn linear_hex_sha256_of_the_body() {
        let c = config(HmacKeys {
            header: Some("Linear-Signature"),
            timestamp: Some("/webhookTimestamp"),
            timestamp_unit: Some("ms"),
            ..Default::default()
        });
        let body = br#"{"action":"create","webhookTimestamp":1700000000123}"#;
        let sig = hmac_hex(
            Algorithm::Sha256,
            "lin_wh_secret",
            std::str::from_utf8(body).unwrap(),
        );
        let h = headers(&[("linear-signature", &sig)]);
        let secrets = [Secret::new("other"), Secret::new("lin_wh_secret")];
        let v = c.verify(&request(&h, body), &secrets).unwrap();
        assert_eq!((v.secret_index, v.signed_at), (1, Some(NOW)));
        // The body is signed: its bytes, not a signed content, are what dedups.
        assert!(c.covers_body());
        assert_eq!(v.signed_content, None);
        assert!(c.is_timestamped());
        let tampered = br#"{"action":"create","webhookTimestamp":1700000000124}"#;
        assert!(matches!(
            c.verify(&request(&h, tampered), &secrets),
            Err(SignatureError::Mismatch { .. })
        ));
        assert_eq!(
            c.sign(&request(&HeaderMap::new(), body), &secrets[1], 0, "id")
                .unwrap(),
            vec![("linear-signature", sig)]
        );
    }

    #[test]
    fn mailgun_signature_read_from_the_body_over_timestamp_and_token() {
        let c = config(HmacKeys {
            location: Some("/signature/signature"),
            timestamp: Some("/signature/timestamp"),
            signed_content: Some("{timestamp}{pointer:/signature/token}"),
            ..Default::default()
        });
        let ts = NOW.to_string();
        let sig = hmac_hex(Algorithm::Sha256, "key-mg", &format!("{ts}tok-1"));
        let body = format!(
            r#"{{"signature":{{"timestamp":"{ts}","token":"tok-1","signature":"{sig}"}},"event-data":{{"id":"e1"}}}}"#
        );
        let none = HeaderMap::new();
        let v = c
            .verify(&request(&none, body.as_bytes()), &[Secret::new("key-mg")])
            .unwrap();
        assert_eq!(v.signed_at, Some(NOW));
        assert!(c.required_headers().is_empty());
        // The body is not signed: the signed content (timestamp and token) is the
        // delivery's identity, the same under any event-data.
        assert!(!c.covers_body());
        let digest: [u8; 32] = sha2::Sha256::digest(format!("{ts}tok-1")).into();
        assert_eq!(v.signed_content, Some(digest));
        let other_event = body.replace(r#""id":"e1""#, r#""id":"e2","event":"x""#);
        let again = c
            .verify(
                &request(&none, other_event.as_bytes()),
                &[Secret::new("key-mg")],
            )
            .unwrap();
        assert_eq!(again.signed_content, v.signed_content);
        let forged = body.replace("tok-1", "tok-2");
        assert!(matches!(
            c.verify(&request(&none, forged.as_bytes()), &[Secret::new("key-mg")]),
            Err(SignatureError::Mismatch { .. })
        ));
        let unsigned = body.replace(&sig, "").replace(",\"signature\":\"\"", "");
        assert!(matches!(
            c.verify(
                &request(&none, unsigned.as_bytes()),
                &[Secret::new("key-mg")]
            ),
            Err(SignatureError::Absent { .. })
        ));
        // One place only, a pointer, and one signature.
        for (keys, key) in [
            (
                HmacKeys {
                    header: Some("X-Sig"),
                    location: Some("/s"),
                    ..Default::default()
                },
                "signature_location",
            ),
            (
                HmacKeys {
                    location: Some("s"),
                    ..Default::default()
                },
                "signature_location",
            ),
            (
                HmacKeys {
                    location: Some("/s"),
                    format: Some("pairs"),
                    signature_key: Some("v1"),
                    ..Default::default()
                },
                "signature_format",
            ),
        ] {
            assert_eq!(HmacConfig::parse(&keys).unwrap_err().key, key);
        }
    }

    #[test]
    fn paddle_ts_h1_with_semicolons() {
        let c = config(HmacKeys {
            header: Some("Paddle-Signature"),
            format: Some("pairs"),
            signature_key: Some("h1"),
            timestamp_key: Some("ts"),
            signed_content: Some("{timestamp}:{body}"),
            ..Default::default()
        });
        let body = br#"{"event_id":"evt_01","event_type":"transaction.paid"}"#;
        let sig = hmac_hex(
            Algorithm::Sha256,
            "pdl_ntfset_secret",
            &format!("{NOW}:{}", std::str::from_utf8(body).unwrap()),
        );
        let h = headers(&[("paddle-signature", &format!("ts={NOW};h1={sig}"))]);
        let secrets = [Secret::new("pdl_ntfset_secret")];
        let v = c.verify(&request(&h, body), &secrets).unwrap();
        assert_eq!(v.signed_at, Some(NOW));
        // Another h1 during a rotation, either order.
        let h = headers(&[(
            "paddle-signature",
            &format!("h1={};ts={NOW};h1={sig}", "0".repeat(64)),
        )]);
        assert!(c.verify(&request(&h, body), &secrets).is_ok());
        // Without ts, malformed.
        let h = headers(&[("paddle-signature", &format!("h1={sig}"))]);
        assert!(matches!(
            c.verify(&request(&h, body), &secrets),
            Err(SignatureError::Malformed {
                header: "paddle-signature",
                ..
            })
        ));
        let signed = c
            .sign(&request(&HeaderMap::new(), body), &secrets[0], NOW, "id")
            .unwrap();
        assert_eq!(
            signed,
            vec![("paddle-signature", format!("ts={NOW},h1={sig}"))]
        );
    }

    #[test]
    fn pagerduty_several_v1_any_of_which_verifies() {
        let c = config(HmacKeys {
            header: Some("X-PagerDuty-Signature"),
            format: Some("pairs"),
            signature_key: Some("v1"),
            ..Default::default()
        });
        assert!(!c.is_timestamped());
        let body = br#"{"event":{"id":"5ac64822","event_type":"incident.triggered"}}"#;
        let text = std::str::from_utf8(body).unwrap();
        let old = hmac_hex(Algorithm::Sha256, "old", text);
        let new = hmac_hex(Algorithm::Sha256, "new", text);
        let h = headers(&[("x-pagerduty-signature", &format!("v1={old},v1={new}"))]);
        let v = c.verify(&request(&h, body), &[Secret::new("new")]).unwrap();
        assert_eq!(v.secret_index, 0);
        let err = c
            .verify(&request(&h, body), &[Secret::new("neither")])
            .unwrap_err();
        assert_eq!(
            err,
            SignatureError::Mismatch {
                header: "x-pagerduty-signature",
                signatures: 2,
                tried: 1,
                configured: 1
            }
        );
    }

    #[test]
    fn public_keys_read_the_same_settings_as_hmac() {
        use crate::ingress::signature::public_key::{generate, parse_keys, Algorithm as Key};
        let discord = HmacConfig::parse_public_key(
            &HmacKeys {
                header: Some("X-Signature-Ed25519"),
                signed_content: Some("{timestamp}{body}"),
                timestamp: Some("header:X-Signature-Timestamp"),
                ..Default::default()
            },
            Key::Ed25519,
        )
        .unwrap();
        assert_eq!(discord.encoding, Encoding::Hex);
        let sendgrid = HmacConfig::parse_public_key(
            &HmacKeys {
                header: Some("X-Twilio-Email-Event-Webhook-Signature"),
                signed_content: Some("{timestamp}{body}"),
                timestamp: Some("header:X-Twilio-Email-Event-Webhook-Timestamp"),
                ..Default::default()
            },
            Key::EcdsaP256,
        )
        .unwrap();
        assert_eq!(sendgrid.encoding, Encoding::Base64);
        for (config, alg) in [(discord, Key::Ed25519), (sendgrid, Key::EcdsaP256)] {
            let (public1, private1) = generate(alg, [1; 32]).unwrap();
            let (public2, private2) = generate(alg, [2; 32]).unwrap();
            let keys = parse_keys(alg, &[public1, public2]).unwrap();
            let body = br#"{"type":1}"#;
            for (index, private) in [private1, private2].iter().enumerate() {
                let signed = config
                    .sign(
                        &request(&HeaderMap::new(), body),
                        &Secret::new(private.as_str()),
                        NOW,
                        "id",
                    )
                    .unwrap();
                let pairs: Vec<(&str, &str)> =
                    signed.iter().map(|(n, v)| (*n, v.as_str())).collect();
                let h = headers(&pairs);
                let v = config.verify(&request(&h, body), &keys).unwrap();
                assert_eq!((v.secret_index, v.signed_at), (index, Some(NOW)));
                assert!(matches!(
                    config.verify(&request(&h, br#"{"type":2}"#), &keys),
                    Err(SignatureError::KeyMismatch { keys: 2, .. })
                ));
                assert!(matches!(
                    config.verify(&request(&h, body), &keys[..0]),
                    Err(SignatureError::KeyMismatch { keys: 0, .. })
                ));
            }
        }
        let refused = HmacConfig::parse_public_key(
            &HmacKeys {
                header: Some("X-Signature-Ed25519"),
                algorithm: Some("sha256"),
                ..Default::default()
            },
            Key::Ed25519,
        )
        .unwrap_err();
        assert_eq!(refused.key, "signature_algorithm");
    }

    #[test]
    fn twitch_message_id_timestamp_body_with_prefix() {
        let c = config(HmacKeys {
            header: Some("Twitch-Eventsub-Message-Signature"),
            prefix: Some("sha256="),
            signed_content: Some("{header:Twitch-Eventsub-Message-Id}{timestamp}{body}"),
            timestamp: Some("header:Twitch-Eventsub-Message-Timestamp"),
            timestamp_unit: Some("rfc3339"),
            ..Default::default()
        });
        let ts = "2023-11-14T22:13:20.123456789Z";
        let body = br#"{"subscription":{"type":"channel.follow"}}"#;
        let sig = hmac_hex(
            Algorithm::Sha256,
            "twitch-secret",
            &format!(
                "e76c6bd4-55c9-4987-8304-da1588d8988b{ts}{}",
                std::str::from_utf8(body).unwrap()
            ),
        );
        let h = headers(&[
            (
                "twitch-eventsub-message-id",
                "e76c6bd4-55c9-4987-8304-da1588d8988b",
            ),
            ("twitch-eventsub-message-timestamp", ts),
            (
                "twitch-eventsub-message-signature",
                &format!("sha256={sig}"),
            ),
        ]);
        let secrets = [Secret::new("twitch-secret")];
        let v = c.verify(&request(&h, body), &secrets).unwrap();
        assert_eq!(v.signed_at, Some(NOW));
        assert_eq!(
            c.signed_headers(),
            vec![
                "twitch-eventsub-message-id",
                "twitch-eventsub-message-timestamp"
            ]
        );
        // Without the prefix, malformed.
        let mut bare = h.clone();
        bare.insert(
            "twitch-eventsub-message-signature",
            HeaderValue::from_str(&sig).unwrap(),
        );
        assert_eq!(
            c.verify(&request(&bare, body), &secrets)
                .unwrap_err()
                .code(),
            "invalid_signature"
        );
        // Without the id, missing.
        let mut no_id = h.clone();
        no_id.remove("twitch-eventsub-message-id");
        assert_eq!(
            c.verify(&request(&no_id, body), &secrets),
            Err(SignatureError::Missing {
                header: "twitch-eventsub-message-id"
            })
        );
        // What we sign verifies.
        let signed = c
            .sign(&request(&HeaderMap::new(), body), &secrets[0], NOW, "msg-1")
            .unwrap();
        let mut map = HeaderMap::new();
        for (name, value) in signed {
            map.insert(name, HeaderValue::from_str(&value).unwrap());
        }
        assert_eq!(
            c.verify(&request(&map, body), &secrets).unwrap().signed_at,
            Some(NOW)
        );
    }

    #[test]
    fn hubspot_v3_method_url_body_timestamp_base64() {
        let c = config(HmacKeys {
            header: Some("X-HubSpot-Signature-v3"),
            encoding: Some("base64"),
            signed_content: Some("{method}{url}{body}{timestamp}"),
            timestamp: Some("header:X-HubSpot-Request-Timestamp"),
            timestamp_unit: Some("ms"),
            public_url: Some("https://hooks.example.com/"),
            ..Default::default()
        });
        let body = br#"[{"eventId":1,"subscriptionType":"contact.creation"}]"#;
        let ms = "1700000000000";
        let message = format!(
            "POSThttps://hooks.example.com/webhooks/src?portal=1{}{ms}",
            std::str::from_utf8(body).unwrap()
        );
        let sig =
            super::super::base64_encode(&Algorithm::Sha256.mac(b"app-secret", message.as_bytes()));
        let h = headers(&[
            ("x-hubspot-signature-v3", &sig),
            ("x-hubspot-request-timestamp", ms),
        ]);
        let req = Request {
            headers: &h,
            body,
            method: "POST",
            path_and_query: "/webhooks/src?portal=1",
        };
        let v = c.verify(&req, &[Secret::new("app-secret")]).unwrap();
        assert_eq!(v.signed_at, Some(NOW));
        let other_path = Request {
            path_and_query: "/webhooks/src",
            ..req
        };
        assert!(c.verify(&other_path, &[Secret::new("app-secret")]).is_err());
    }

    #[test]
    fn mailgun_like_fields_of_the_body() {
        let c = config(HmacKeys {
            header: Some("X-Unused"),
            signed_content: Some("{pointer:/signature/timestamp}{pointer:/signature/token}"),
            ..Default::default()
        });
        let sig = hmac_hex(Algorithm::Sha256, "mg-key", "1700000000tok123");
        let body = format!(
            r#"{{"signature":{{"timestamp":"1700000000","token":"tok123","signature":"{sig}"}}}}"#
        );
        let h = headers(&[("x-unused", &sig)]);
        assert!(c
            .verify(&request(&h, body.as_bytes()), &[Secret::new("mg-key")])
            .is_ok());
        let err = c
            .verify(
                &request(&h, br#"{"signature":{"timestamp":"1"}}"#),
                &[Secret::new("mg-key")],
            )
            .unwrap_err();
        assert_eq!(err.code(), "missing_signature");
        assert!(err.to_string().contains("/signature/token"), "{err}");
    }

    #[test]
    fn encodings_and_lengths() {
        let mac = Algorithm::Sha512.mac(b"k", b"m");
        for enc in [Encoding::Hex, Encoding::Base64, Encoding::Base64Url] {
            assert_eq!(enc.decode(&enc.encode(&mac), 64), Some(mac.clone()));
            assert_eq!(enc.decode(&enc.encode(&mac), 32), None);
        }
        use base64::Engine;
        let padded = base64::engine::general_purpose::URL_SAFE.encode(&mac);
        assert_eq!(Encoding::Base64Url.decode(&padded, 64), Some(mac.clone()));
        assert_eq!(
            Encoding::Hex.decode(&hex::encode_upper(&mac), 64),
            Some(mac)
        );
        assert_eq!(Encoding::Hex.decode(&"a".repeat(10_000), 64), None);
    }

    #[test]
    fn pairs_parse_by_the_rules() {
        let p = parse_pairs(" t=1 ; v1=a,v1=b , x, v0=c", "v1", Some("t")).unwrap();
        assert_eq!(p.signatures, vec!["a", "b"]);
        assert_eq!(p.timestamp, Some("1"));
        assert_eq!(
            parse_pairs("t=1,t=2,v1=a", "v1", Some("t")),
            Err(PairsError::TwoTimestamps)
        );
        assert_eq!(
            parse_pairs("t=1", "v1", Some("t")),
            Err(PairsError::NoSignature)
        );
        assert_eq!(
            parse_pairs(&",".repeat(MAX_ENTRIES), "v1", None),
            Err(PairsError::TooMany)
        );
    }

    #[test]
    fn settings_that_cannot_work_name_their_key() {
        let base = HmacKeys {
            header: Some("X-Sig"),
            ..Default::default()
        };
        for (keys, key) in [
            (
                HmacKeys {
                    header: None,
                    ..base.clone()
                },
                "signature_header",
            ),
            (
                HmacKeys {
                    header: Some("a b"),
                    ..base.clone()
                },
                "signature_header",
            ),
            (
                HmacKeys {
                    algorithm: Some("md5"),
                    ..base.clone()
                },
                "signature_algorithm",
            ),
            (
                HmacKeys {
                    encoding: Some("base32"),
                    ..base.clone()
                },
                "signature_encoding",
            ),
            (
                HmacKeys {
                    format: Some("list"),
                    ..base.clone()
                },
                "signature_format",
            ),
            (
                HmacKeys {
                    format: Some("pairs"),
                    ..base.clone()
                },
                "signature_key",
            ),
            (
                HmacKeys {
                    signature_key: Some("v1"),
                    ..base.clone()
                },
                "signature_key",
            ),
            (
                HmacKeys {
                    timestamp_key: Some("t"),
                    ..base.clone()
                },
                "timestamp_key",
            ),
            (
                HmacKeys {
                    signed_content: Some("{timestamp}.{body}"),
                    ..base.clone()
                },
                "signed_content",
            ),
            (
                HmacKeys {
                    signed_content: Some("{url}{body}"),
                    ..base.clone()
                },
                "signed_content",
            ),
            (
                HmacKeys {
                    signed_content: Some("{nonce}{body}"),
                    ..base.clone()
                },
                "signed_content",
            ),
            (
                HmacKeys {
                    signed_content: Some("{body}}"),
                    ..base.clone()
                },
                "signed_content",
            ),
            (
                HmacKeys {
                    timestamp_unit: Some("ms"),
                    ..base.clone()
                },
                "timestamp_unit",
            ),
            (
                HmacKeys {
                    timestamp: Some("header:X-Ts"),
                    timestamp_unit: Some("h"),
                    ..base.clone()
                },
                "timestamp_unit",
            ),
            (
                HmacKeys {
                    timestamp: Some("webhookTimestamp"),
                    ..base.clone()
                },
                "timestamp",
            ),
            // An unsigned timestamp header bounds nothing.
            (
                HmacKeys {
                    timestamp: Some("header:X-Ts"),
                    ..base.clone()
                },
                "timestamp",
            ),
            (
                HmacKeys {
                    public_url: Some("hooks.example.com"),
                    ..base.clone()
                },
                "public_url",
            ),
            (
                HmacKeys {
                    format: Some("pairs"),
                    signature_key: Some("v1"),
                    timestamp_key: Some("t"),
                    ..base.clone()
                },
                "timestamp_key",
            ),
        ] {
            let err = HmacConfig::parse(&keys).unwrap_err();
            assert_eq!(err.key, key, "{err}");
        }
        // A timestamp in a signed body is covered by {body}.
        assert!(HmacConfig::parse(&HmacKeys {
            timestamp: Some("/ts"),
            ..base.clone()
        })
        .is_ok());
    }

    proptest::proptest! {
        /// Hostile signature, timestamp and id headers never panic, and never verify.
        #[test]
        fn hostile_headers_never_panic_nor_verify(
            signature in "[ -~]{0,160}",
            timestamp in "[ -~]{0,40}",
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let pairs = config(HmacKeys {
                header: Some("X-Sig"),
                format: Some("pairs"),
                signature_key: Some("v1"),
                timestamp_key: Some("t"),
                signed_content: Some("{timestamp}.{header:X-Id}.{pointer:/a}{body}"),
                ..Default::default()
            });
            let plain = config(HmacKeys {
                header: Some("X-Sig"),
                encoding: Some("base64url"),
                algorithm: Some("sha512"),
                timestamp: Some("header:X-Ts"),
                timestamp_unit: Some("rfc3339"),
                signed_content: Some("{timestamp}{body}"),
                ..Default::default()
            });
            let mut map = HeaderMap::new();
            for (name, value) in [("x-sig", &signature), ("x-ts", &timestamp), ("x-id", &timestamp)] {
                if let Ok(v) = HeaderValue::from_str(value) {
                    map.insert(name, v);
                }
            }
            for c in [&pairs, &plain] {
                proptest::prop_assert!(c.verify(&request(&map, &body), &[Secret::new("k")]).is_err());
            }
        }
    }
}
