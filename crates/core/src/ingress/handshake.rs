//! Endpoint handshakes (docs/contract.md, handshakes): the checks some publishers make
//! before they send events (Slack's `url_verification`, Zoom's `endpoint.url_validation`,
//! Discord's PING, Twitch's callback verification, X's CRC, Microsoft Graph's, Dropbox's,
//! Okta's and WebSub's challenges). Pure: the request's parts in, "not a handshake", the
//! exact answer, or a refusal out. No I/O; the HTTP layer verifies signatures first and
//! never stores nor forwards what is answered here.
//!
//! Every echoed value is bounded ([`MAX_ECHO_BYTES`], no control characters) and answered
//! as `text/plain; charset=utf-8` or `application/json`, never as HTML.
//!
//! A handshake answered with an HMAC of the source's secret (X's CRC, Zoom's) is a MAC
//! oracle unless two rules hold, and both do here: it is allowed only with its publisher's
//! own signature scheme ([`Handshake::allowed_with`], checked at start), and the value it
//! MACs is an opaque token ([`opaque_token`]: base64 characters, at most [`MAX_TOKEN_BYTES`],
//! not a JSON value) that can never be what that scheme signs for a delivery (a JSON body,
//! `v0:{ts}:{body}`).

use std::fmt;

use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::ingress::signature::configurable::{
    Algorithm, Encoding, Format, HmacConfig, TimestampAt,
};
use crate::ingress::signature::template::Part;
use crate::ingress::signature::token::TokenConfig;
use crate::ingress::signature::{Secret, Verifier};

/// Most bytes of a value a handshake echoes back.
pub const MAX_ECHO_BYTES: usize = 512;

/// Most bytes of an opaque token answered with an HMAC (X's `crc_token`, Zoom's
/// `plainToken`): both publishers send a few dozen characters.
pub const MAX_TOKEN_BYTES: usize = 128;

/// What Microsoft Graph sends as its `validationToken`, before the request id (a GUID).
pub const GRAPH_VALIDATION_PREFIX: &str =
    "Validation: Testing client application reachability for subscription Request-Id: ";

/// The header Twitch names its message type in.
pub const TWITCH_TYPE_HEADER: &str = "Twitch-Eventsub-Message-Type";
/// Twitch's message type of a callback verification.
pub const TWITCH_VERIFICATION: &str = "webhook_callback_verification";
/// Twitch's message type of an event.
pub const TWITCH_NOTIFICATION: &str = "notification";
/// Twitch's message type of a revoked subscription.
pub const TWITCH_REVOCATION: &str = "revocation";
/// The `subscription.status` of a callback verification's body.
pub const TWITCH_VERIFICATION_PENDING: &str = "webhook_callback_verification_pending";
/// The header Okta sends its one-time verification challenge in.
pub const OKTA_CHALLENGE_HEADER: &str = "X-Okta-Verification-Challenge";

/// A source's handshake, as written in `handshake = "…"` (docs/configuration.md).
///
/// `aws-sns` is answered by its own scheme's module, not here: a new kind is a variant here,
/// its name in [`Handshake::ALL`], and its rule in [`detect`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    /// Signed body `{"type":"url_verification","challenge":C}` → `{"challenge":C}`.
    Slack,
    /// Signed body `{"event":"endpoint.url_validation","payload":{"plainToken":P}}`.
    Zoom,
    /// Signed body `{"type":1}` (an interactions PING) → `{"type":1}`.
    Discord,
    /// Signed body `{"challenge":C,"subscription":{"status":"webhook_callback_verification_pending",…}}`
    /// → the challenge. Every Twitch message's type is read from its signed body
    /// ([`twitch_message`]); an unsigned `Twitch-Eventsub-Message-Type` that says otherwise
    /// is refused.
    Twitch,
    /// X (Twitter) CRC: `GET ?crc_token=T` → an HMAC of T with the source's first secret.
    XCrc,
    /// Microsoft Graph: `POST ?validationToken=T`, with the source's token → T, when T is
    /// Graph's validation text.
    Msgraph,
    /// Dropbox: `GET ?challenge=C` → C.
    Dropbox,
    /// Okta event hooks: a `GET` with `X-Okta-Verification-Challenge: C`, carrying the
    /// source's token → `{"verification":C}`.
    Okta,
    /// WebSub: `GET ?hub.mode=subscribe&hub.challenge=C` → C.
    Websub,
}

impl Handshake {
    /// Every handshake answered by this module, in the order of docs/contract.md.
    pub const ALL: [Handshake; 9] = [
        Handshake::Slack,
        Handshake::Zoom,
        Handshake::Discord,
        Handshake::Twitch,
        Handshake::XCrc,
        Handshake::Msgraph,
        Handshake::Dropbox,
        Handshake::Okta,
        Handshake::Websub,
    ];

    /// Its name in the configuration and in `inhook_handshakes_total{kind}`.
    pub fn name(self) -> &'static str {
        match self {
            Handshake::Slack => "slack",
            Handshake::Zoom => "zoom",
            Handshake::Discord => "discord",
            Handshake::Twitch => "twitch",
            Handshake::XCrc => "x-crc",
            Handshake::Msgraph => "msgraph",
            Handshake::Dropbox => "dropbox",
            Handshake::Okta => "okta",
            Handshake::Websub => "websub",
        }
    }

    /// The handshake written `raw` in the configuration.
    pub fn parse(raw: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|h| h.name() == raw)
    }

    /// Every name, for a config error.
    pub fn names() -> String {
        Self::ALL.map(Handshake::name).join(", ")
    }

    /// When the handshake is looked for: what the HTTP layer checks first.
    pub fn stage(self) -> Stage {
        match self {
            Handshake::Slack | Handshake::Zoom | Handshake::Discord | Handshake::Twitch => {
                Stage::SignedPost
            }
            Handshake::Msgraph => Stage::EarlyPost,
            Handshake::Okta => Stage::SignedGet,
            Handshake::XCrc | Handshake::Dropbox | Handshake::Websub => Stage::UnsignedGet,
        }
    }

    /// Whether `GET /webhooks/{source}` is answered (else it keeps its 405).
    pub fn answers_get(self) -> bool {
        matches!(self.stage(), Stage::SignedGet | Stage::UnsignedGet)
    }

    /// Whether the answer is computed with a secret of the source (Zoom's encryptedToken,
    /// X's response_token): such a source must have secrets.
    pub fn needs_secret(self) -> bool {
        matches!(self, Handshake::Zoom | Handshake::XCrc)
    }

    /// Whether a source verified by `verifier` may answer this handshake
    /// (docs/configuration.md, handshakes). A handshake answered with an HMAC of the source's
    /// secret (`x-crc`, `zoom`) is allowed only with its publisher's own scheme: on another,
    /// its answer could be that scheme's signature of a forged delivery (a Stripe `v1` is
    /// the HMAC of `{t}.{body}`, whatever token would spell that). `msgraph` needs the token
    /// Graph carries in its `notificationUrl`, the only credential on its validation request.
    pub fn allowed_with(self, verifier: &Verifier) -> bool {
        match self {
            Handshake::XCrc => matches!(verifier, Verifier::Hmac(c) if is_x_scheme(c)),
            Handshake::Zoom => matches!(verifier, Verifier::Hmac(c) if is_zoom_scheme(c)),
            Handshake::Msgraph => {
                matches!(verifier, Verifier::Token(TokenConfig::Query { .. }))
            }
            Handshake::Slack
            | Handshake::Discord
            | Handshake::Twitch
            | Handshake::Dropbox
            | Handshake::Okta
            | Handshake::Websub => true,
        }
    }

    /// The scheme [`Handshake::allowed_with`] allows, as a config error names it; `None`
    /// when any scheme is.
    pub fn publisher_scheme(self) -> Option<&'static str> {
        match self {
            Handshake::XCrc => Some(
                "X's: signature = \"hmac\", signature_header = \"x-twitter-webhooks-signature\", \
                 signature_prefix = \"sha256=\", signature_encoding = \"base64\", signature_algorithm \
                 sha256 and signed_content = \"{body}\" (the defaults), no timestamp, JSON bodies \
                 (preset = \"x-activity\")",
            ),
            Handshake::Zoom => Some(
                "Zoom's: signature = \"hmac\", signature_header = \"x-zm-signature\", \
                 signature_prefix = \"v0=\", signature_encoding hex and signature_algorithm sha256 \
                 (the defaults), timestamp = \"header:x-zm-request-timestamp\", \
                 signed_content = \"v0:{timestamp}:{body}\" (preset = \"zoom\")",
            ),
            Handshake::Msgraph => Some(
                "Microsoft Graph's: signature = \"token\" with token_query, the token written in \
                 the subscription's notificationUrl (preset = \"msgraph\")",
            ),
            _ => None,
        }
    }
}

/// X's `x-twitter-webhooks-signature: sha256=<base64 HMAC-SHA256 of the body>`: the only
/// content it signs is the body, which a CRC token cannot be.
fn is_x_scheme(c: &HmacConfig) -> bool {
    c.public_key.is_none()
        && c.location.is_none()
        && c.header == "x-twitter-webhooks-signature"
        && c.prefix == "sha256="
        && c.encoding == Encoding::Base64
        && c.algorithm == Algorithm::Sha256
        && c.format == Format::Plain
        && c.timestamp.is_none()
        && c.content.parts() == [Part::Body]
}

/// Zoom's `x-zm-signature: v0=<hex HMAC-SHA256 of "v0:{ts}:{body}">`: what it signs starts
/// with `v0:`, which a plainToken cannot.
fn is_zoom_scheme(c: &HmacConfig) -> bool {
    let timestamp_header = c.timestamp.as_ref().is_some_and(
        |t| matches!(&t.at, TimestampAt::Header(h) if h.as_str() == "x-zm-request-timestamp"),
    );
    c.public_key.is_none()
        && c.location.is_none()
        && c.header == "x-zm-signature"
        && c.prefix == "v0="
        && c.encoding == Encoding::Hex
        && c.algorithm == Algorithm::Sha256
        && c.format == Format::Plain
        && timestamp_header
        && c.content.parts()
            == [
                Part::Literal("v0:".into()),
                Part::Timestamp,
                Part::Literal(":".into()),
                Part::Body,
            ]
}

impl fmt::Display for Handshake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where in the handling of a request a handshake is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// A `POST` whose signature verified with the source's scheme first.
    SignedPost,
    /// A `POST` answered before its content type is checked (Graph's validation comes as
    /// `text/plain`), once the source's token in its query verified.
    EarlyPost,
    /// A `GET` whose token or signature verified with the source's scheme first.
    SignedGet,
    /// A `GET` answered without a signature check.
    UnsignedGet,
}

/// The parts of a request a handshake reads.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    /// `GET` or `POST`.
    pub method: &'a str,
    /// The path and query as requested (`/webhooks/x?challenge=abc`).
    pub path_and_query: &'a str,
    /// The request headers.
    pub headers: &'a HeaderMap,
    /// The raw body (empty for a `GET`).
    pub body: &'a [u8],
    /// The secret that verified the request (signed stages), or the source's first secret
    /// (X's CRC); `None` when the source has none.
    pub secret: Option<&'a Secret>,
}

/// The media type of a handshake answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentType {
    /// `text/plain; charset=utf-8`: the echoed value alone.
    Text,
    /// `application/json`.
    Json,
}

impl ContentType {
    /// The `Content-Type` header value.
    pub fn header_value(self) -> &'static str {
        match self {
            ContentType::Text => "text/plain; charset=utf-8",
            ContentType::Json => "application/json",
        }
    }
}

/// The exact answer to a handshake: always 200.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// Its media type.
    pub content_type: ContentType,
    /// Its bytes.
    pub body: Vec<u8>,
}

/// Why a request that is a handshake cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The value to echo is absent or empty.
    Missing {
        /// Where it should be.
        what: &'static str,
    },
    /// The value to echo is longer than [`MAX_ECHO_BYTES`].
    TooLong {
        /// Where it was.
        what: &'static str,
    },
    /// The value to echo holds a control character (TAB, CR and LF included) or is not UTF-8.
    NotText {
        /// Where it was.
        what: &'static str,
    },
    /// The value is not what the publisher sends (an opaque token, Graph's validation
    /// text): never answered, so that the answer is never anything but the publisher's.
    NotShape {
        /// Where it was.
        what: &'static str,
        /// What the publisher sends there.
        expected: &'static str,
    },
    /// A Twitch message whose unsigned `Twitch-Eventsub-Message-Type` is not the type of its
    /// signed body ([`twitch_message`]).
    TwitchType {
        /// The type of the signed body.
        body: &'static str,
    },
    /// The answer needs a secret and the source has none.
    NoSecret,
}

/// What an opaque token answered with an HMAC is, as a refusal names it.
const TOKEN_SHAPE: &str = "an opaque token: 1 to 128 characters of A-Z, a-z, 0-9, '+', '/', '=', '_' and '-', not a JSON value";

/// What Graph's validation token is, as a refusal names it.
const GRAPH_SHAPE: &str = "Microsoft Graph's validation text: \"Validation: Testing client application reachability for subscription Request-Id: \" and a GUID";

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Missing { what } => write!(f, "{what} is missing or empty"),
            Refusal::TooLong { what } => {
                write!(f, "{what} is longer than {MAX_ECHO_BYTES} bytes")
            }
            Refusal::NotText { what } => write!(
                f,
                "{what} is not UTF-8 text without control characters (TAB, CR and LF included)"
            ),
            Refusal::NotShape { what, expected } => write!(f, "{what} is not {expected}"),
            Refusal::TwitchType { body } => write!(
                f,
                "the signed body is a Twitch {body} message and the (unsigned) {TWITCH_TYPE_HEADER} header says otherwise"
            ),
            Refusal::NoSecret => f.write_str("the source has no secret to answer with"),
        }
    }
}

/// What a request is to a source's handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// An ordinary delivery (or, for a `GET`, not a handshake either: the caller refuses it).
    NotHandshake,
    /// A handshake, answered 200 with this.
    Answer(Reply),
    /// A handshake whose value cannot be echoed: 400.
    Refused(Refusal),
}

/// What `parts` is to `handshake`. The caller has checked the stage: a signed stage's
/// request verified, and `parts.secret` is the secret that verified it.
pub fn detect(handshake: Handshake, parts: &Parts<'_>) -> Outcome {
    let result = match handshake {
        Handshake::Slack => slack(parts.body),
        Handshake::Zoom => zoom(parts.body, parts.secret),
        Handshake::Discord => discord(parts.body),
        Handshake::Twitch => twitch(parts.headers, parts.body),
        Handshake::XCrc => x_crc(parts, parts.secret),
        Handshake::Msgraph => msgraph(parts),
        Handshake::Dropbox => query_echo(parts, "challenge", "the query parameter challenge"),
        Handshake::Okta => okta(parts),
        Handshake::Websub => websub(parts),
    };
    match result {
        Ok(Some(reply)) => Outcome::Answer(reply),
        Ok(None) => Outcome::NotHandshake,
        Err(refusal) => Outcome::Refused(refusal),
    }
}

/// `Ok(None)`: not a handshake; `Ok(Some)`: its answer; `Err`: a handshake refused.
type Found = Result<Option<Reply>, Refusal>;

/// A value fit to echo: present, non-empty, at most [`MAX_ECHO_BYTES`], no control characters.
pub fn echoable<'v>(value: Option<&'v [u8]>, what: &'static str) -> Result<&'v str, Refusal> {
    let value = value
        .filter(|v| !v.is_empty())
        .ok_or(Refusal::Missing { what })?;
    if value.len() > MAX_ECHO_BYTES {
        return Err(Refusal::TooLong { what });
    }
    let text = std::str::from_utf8(value).map_err(|_| Refusal::NotText { what })?;
    if text.chars().any(char::is_control) {
        return Err(Refusal::NotText { what });
    }
    Ok(text)
}

fn text(value: &str) -> Reply {
    Reply {
        content_type: ContentType::Text,
        body: value.as_bytes().to_vec(),
    }
}

fn json(value: &serde_json::Value) -> Reply {
    Reply {
        content_type: ContentType::Json,
        body: serde_json::to_vec(value).unwrap_or_default(),
    }
}

/// The body as a JSON object, when it is one; a body that is not is no handshake (the
/// contract then says what is wrong with it).
fn object(body: &[u8]) -> Option<serde_json::Map<String, serde_json::Value>> {
    match serde_json::from_slice(body).ok()? {
        serde_json::Value::Object(map) => Some(map),
        _ => None,
    }
}

/// A string member of a JSON object, as bytes for [`echoable`]; a non-string is absent.
fn member<'m>(map: &'m serde_json::Map<String, serde_json::Value>, name: &str) -> Option<&'m [u8]> {
    map.get(name)
        .and_then(serde_json::Value::as_str)
        .map(str::as_bytes)
}

fn slack(body: &[u8]) -> Found {
    // Cheap first: every event of the source passes here.
    if !contains(body, b"url_verification") {
        return Ok(None);
    }
    let Some(map) = object(body) else {
        return Ok(None);
    };
    if map.get("type").and_then(|t| t.as_str()) != Some("url_verification") {
        return Ok(None);
    }
    let challenge = echoable(member(&map, "challenge"), "the body's challenge")?;
    Ok(Some(json(&serde_json::json!({ "challenge": challenge }))))
}

fn zoom(body: &[u8], secret: Option<&Secret>) -> Found {
    if !contains(body, b"endpoint.url_validation") {
        return Ok(None);
    }
    let Some(map) = object(body) else {
        return Ok(None);
    };
    if map.get("event").and_then(|t| t.as_str()) != Some("endpoint.url_validation") {
        return Ok(None);
    }
    let token = map
        .get("payload")
        .and_then(|p| p.get("plainToken"))
        .and_then(|t| t.as_str())
        .map(str::as_bytes);
    let plain = opaque_token(token, "the body's payload.plainToken")?;
    let secret = secret.ok_or(Refusal::NoSecret)?;
    let encrypted = hex::encode(hmac_sha256(secret, plain.as_bytes()));
    Ok(Some(json(&serde_json::json!({
        "plainToken": plain,
        "encryptedToken": encrypted,
    }))))
}

fn discord(body: &[u8]) -> Found {
    #[derive(serde::Deserialize)]
    struct Interaction {
        #[serde(rename = "type")]
        kind: Option<serde_json::Value>,
    }
    let Ok(interaction) = serde_json::from_slice::<Interaction>(body) else {
        return Ok(None);
    };
    // A PING is type 1, whatever else it carries (id, application_id, token, …).
    if interaction.kind.and_then(|k| k.as_u64()) != Some(1) {
        return Ok(None);
    }
    Ok(Some(Reply {
        content_type: ContentType::Json,
        body: br#"{"type":1}"#.to_vec(),
    }))
}

fn twitch(headers: &HeaderMap, body: &[u8]) -> Found {
    // The type header is not signed: the signed body says what the message is, and a header
    // that says otherwise is refused (a captured verification resent as a `notification`
    // must not become an event). Without the header, the body alone decides.
    let said = headers.get(TWITCH_TYPE_HEADER).map(|v| v.as_bytes());
    let map = object(body).unwrap_or_default();
    let Some(signed) = twitch_message(&map) else {
        if said == Some(TWITCH_VERIFICATION.as_bytes()) {
            return Err(Refusal::Missing {
                what: "the body's challenge",
            });
        }
        // A body of no known shape: the contract says what is wrong with it.
        return Ok(None);
    };
    if said.is_some_and(|said| said != signed.as_bytes()) {
        return Err(Refusal::TwitchType { body: signed });
    }
    if signed != TWITCH_VERIFICATION {
        // `notification` and `revocation` messages are ordinary events.
        return Ok(None);
    }
    let challenge = echoable(member(&map, "challenge"), "the body's challenge")?;
    Ok(Some(text(challenge)))
}

/// The type of a Twitch EventSub message, read from its signed body: a
/// `webhook_callback_verification` carries `challenge` (and `subscription.status` =
/// `webhook_callback_verification_pending`), a `notification` its `event` (or `events`), a
/// `revocation` a `subscription` with its `status` and no event. `None`: none of these.
pub fn twitch_message(body: &serde_json::Map<String, serde_json::Value>) -> Option<&'static str> {
    let status = body
        .get("subscription")
        .and_then(|s| s.get("status"))
        .and_then(serde_json::Value::as_str);
    if body.contains_key("challenge") || status == Some(TWITCH_VERIFICATION_PENDING) {
        Some(TWITCH_VERIFICATION)
    } else if body.contains_key("event") || body.contains_key("events") {
        Some(TWITCH_NOTIFICATION)
    } else if status.is_some() {
        Some(TWITCH_REVOCATION)
    } else {
        None
    }
}

fn x_crc(parts: &Parts<'_>, secret: Option<&Secret>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let token = query(parts.path_and_query, "crc_token");
    let token = opaque_token(token.as_deref(), "the query parameter crc_token")?;
    let secret = secret.ok_or(Refusal::NoSecret)?;
    let mac =
        base64::engine::general_purpose::STANDARD.encode(hmac_sha256(secret, token.as_bytes()));
    Ok(Some(json(&serde_json::json!({
        "response_token": format!("sha256={mac}"),
    }))))
}

fn msgraph(parts: &Parts<'_>) -> Found {
    if parts.method != "POST" {
        return Ok(None);
    }
    let Some(token) = query(parts.path_and_query, "validationToken") else {
        // A notification: an ordinary delivery.
        return Ok(None);
    };
    let token = graph_validation(Some(token.as_slice()))?;
    Ok(Some(text(token)))
}

/// Whether `parts` is Microsoft Graph's validation request (`POST ?validationToken=`),
/// whatever its token: the HTTP layer verifies the source's token before answering it.
pub fn is_graph_validation(parts: &Parts<'_>) -> bool {
    parts.method == "POST" && query(parts.path_and_query, "validationToken").is_some()
}

/// Graph's validation token, echoed only when it is what Graph sends: its fixed text and
/// a GUID ([`GRAPH_VALIDATION_PREFIX`]), so that the echo reflects nothing of a caller's.
fn graph_validation(value: Option<&[u8]>) -> Result<&str, Refusal> {
    let what = "the query parameter validationToken";
    let text = echoable(value, what)?;
    let fits = text
        .strip_prefix(GRAPH_VALIDATION_PREFIX)
        .is_some_and(is_guid);
    if !fits {
        return Err(Refusal::NotShape {
            what,
            expected: GRAPH_SHAPE,
        });
    }
    Ok(text)
}

/// `8-4-4-4-12` hex digits, either case.
fn is_guid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A token answered with an HMAC of the source's secret (X's `crc_token`, Zoom's
/// `plainToken`): 1 to [`MAX_TOKEN_BYTES`] of base64 or base64url characters, and not a JSON
/// value (`123`, `true`). Such a token is never a body a delivery carries, nor `v0:{ts}:…`,
/// `{t}.{body}` or any other content a scheme signs: its HMAC signs nothing but itself.
pub fn opaque_token<'v>(value: Option<&'v [u8]>, what: &'static str) -> Result<&'v str, Refusal> {
    let text = echoable(value, what)?;
    let alphabet = text
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"+/=_-".contains(&b));
    if text.len() > MAX_TOKEN_BYTES
        || !alphabet
        || serde_json::from_str::<serde::de::IgnoredAny>(text).is_ok()
    {
        return Err(Refusal::NotShape {
            what,
            expected: TOKEN_SHAPE,
        });
    }
    Ok(text)
}

fn okta(parts: &Parts<'_>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let challenge = parts
        .headers
        .get(OKTA_CHALLENGE_HEADER)
        .map(|v| v.as_bytes());
    let challenge = echoable(challenge, "the header X-Okta-Verification-Challenge")?;
    Ok(Some(json(
        &serde_json::json!({ "verification": challenge }),
    )))
}

fn websub(parts: &Parts<'_>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let mode = query(parts.path_and_query, "hub.mode");
    if mode.as_deref() != Some(b"subscribe") {
        return Err(Refusal::Missing {
            what: "the query parameter hub.mode=subscribe",
        });
    }
    query_echo(parts, "hub.challenge", "the query parameter hub.challenge")
}

/// A `GET` echoing the query parameter `name` as text.
fn query_echo(parts: &Parts<'_>, name: &str, what: &'static str) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let value = query(parts.path_and_query, name);
    Ok(Some(text(echoable(value.as_deref(), what)?)))
}

/// The percent-decoded value of the first query parameter `name` (`+` is a space).
fn query(path_and_query: &str, name: &str) -> Option<Vec<u8>> {
    crate::ingress::signature::token::query_value(path_and_query, name)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

fn hmac_sha256(secret: &Secret, message: &[u8]) -> Vec<u8> {
    // HMAC takes a key of any length: this cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.expose())
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"));
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn parts<'a>(
        method: &'a str,
        path: &'a str,
        headers: &'a HeaderMap,
        body: &'a [u8],
        secret: Option<&'a Secret>,
    ) -> Parts<'a> {
        Parts {
            method,
            path_and_query: path,
            headers,
            body,
            secret,
        }
    }

    fn answer(outcome: Outcome) -> (ContentType, String) {
        match outcome {
            Outcome::Answer(reply) => (reply.content_type, String::from_utf8(reply.body).unwrap()),
            other => panic!("not answered: {other:?}"),
        }
    }

    fn post(handshake: Handshake, body: &str) -> Outcome {
        let headers = HeaderMap::new();
        let secret = Secret::new("s3cret");
        detect(
            handshake,
            &parts(
                "POST",
                "/webhooks/s",
                &headers,
                body.as_bytes(),
                Some(&secret),
            ),
        )
    }

    fn get(handshake: Handshake, path: &str, headers: &HeaderMap) -> Outcome {
        let secret = Secret::new("s3cret");
        detect(handshake, &parts("GET", path, headers, b"", Some(&secret)))
    }

    #[test]
    fn names_round_trip() {
        for h in Handshake::ALL {
            assert_eq!(Handshake::parse(h.name()), Some(h));
        }
        assert_eq!(Handshake::parse("aws"), None);
        assert!(Handshake::names().contains("x-crc"));
    }

    #[test]
    fn slack_echoes_the_challenge_as_json() {
        let out = post(
            Handshake::Slack,
            r#"{"token":"t","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#,
        );
        assert_eq!(
            answer(out),
            (
                ContentType::Json,
                r#"{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#.into()
            )
        );
        assert_eq!(
            post(Handshake::Slack, r#"{"type":"event_callback","event":{}}"#),
            Outcome::NotHandshake
        );
        assert_eq!(
            post(Handshake::Slack, r#"{"type":"url_verification"}"#),
            Outcome::Refused(Refusal::Missing {
                what: "the body's challenge"
            })
        );
    }

    #[test]
    fn zoom_answers_the_hmac_of_the_plain_token() {
        let out = post(
            Handshake::Zoom,
            r#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#,
        );
        let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cret").unwrap();
        mac.update(b"qgg8vlvZRS6UYooatFL8Aw");
        let expected = hex::encode(mac.finalize().into_bytes());
        assert_eq!(
            answer(out),
            (
                ContentType::Json,
                format!(
                    r#"{{"encryptedToken":"{expected}","plainToken":"qgg8vlvZRS6UYooatFL8Aw"}}"#
                )
            )
        );
        let headers = HeaderMap::new();
        let body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"p"}}"#;
        assert_eq!(
            detect(Handshake::Zoom, &parts("POST", "/", &headers, body, None)),
            Outcome::Refused(Refusal::NoSecret)
        );
        assert_eq!(
            post(
                Handshake::Zoom,
                r#"{"event":"meeting.started","payload":{}}"#
            ),
            Outcome::NotHandshake
        );
    }

    #[test]
    fn discord_answers_a_ping_only() {
        assert_eq!(
            answer(post(
                Handshake::Discord,
                r#"{"type":1,"id":"1","application_id":"2","token":"x"}"#
            )),
            (ContentType::Json, r#"{"type":1}"#.into())
        );
        assert_eq!(
            post(Handshake::Discord, r#"{"type":2}"#),
            Outcome::NotHandshake
        );
        assert_eq!(
            post(Handshake::Discord, r#"{"type":"1"}"#),
            Outcome::NotHandshake
        );
        assert_eq!(post(Handshake::Discord, "not json"), Outcome::NotHandshake);
    }

    #[test]
    fn twitch_echoes_the_challenge_of_a_verification_only() {
        let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{}}"#;
        let mut headers = HeaderMap::new();
        let plain = |headers: &HeaderMap| {
            detect(Handshake::Twitch, &parts("POST", "/", headers, body, None))
        };
        // Without the (unsigned) type header, the signed body decides.
        assert_eq!(
            answer(plain(&headers)),
            (ContentType::Text, "pogchamp-kappa-360noscope-vohiyo".into())
        );
        headers.insert(
            TWITCH_TYPE_HEADER,
            HeaderValue::from_static(TWITCH_VERIFICATION),
        );
        assert_eq!(
            answer(plain(&headers)),
            (ContentType::Text, "pogchamp-kappa-360noscope-vohiyo".into())
        );
    }

    /// Twitch signs the message id, timestamp and body, not `Twitch-Eventsub-Message-Type`:
    /// a captured verification resent as a `notification` (or `revocation`) is refused, not
    /// logged as an event; each type is read from the signed body.
    #[test]
    fn twitch_reads_the_message_type_from_the_signed_body() {
        let verification = br#"{"challenge":"c-1","subscription":{"id":"s","status":"webhook_callback_verification_pending","type":"channel.follow"}}"#;
        let notification = br#"{"subscription":{"id":"s","status":"enabled","type":"channel.follow"},"event":{"user_id":"1"}}"#;
        let batched = br#"{"subscription":{"id":"s","status":"enabled","type":"drop.entitlement.grant"},"events":[{"id":"1"}]}"#;
        let revocation = br#"{"subscription":{"id":"s","status":"authorization_revoked","type":"channel.follow"}}"#;
        let run = |said: Option<&'static str>, body: &[u8]| {
            let mut headers = HeaderMap::new();
            if let Some(said) = said {
                headers.insert(TWITCH_TYPE_HEADER, HeaderValue::from_static(said));
            }
            detect(Handshake::Twitch, &parts("POST", "/", &headers, body, None))
        };
        let refused = |body| Outcome::Refused(Refusal::TwitchType { body });
        // The replay of the red team: a verification under another type.
        for said in [
            Some(TWITCH_NOTIFICATION),
            Some(TWITCH_REVOCATION),
            Some("NOTIFICATION"),
        ] {
            assert_eq!(
                run(said, verification),
                refused(TWITCH_VERIFICATION),
                "{said:?}"
            );
        }
        assert_eq!(
            answer(run(Some(TWITCH_VERIFICATION), verification)).1,
            "c-1"
        );
        // The pending status alone makes a verification too, whose challenge must be there.
        let no_challenge =
            br#"{"subscription":{"status":"webhook_callback_verification_pending"}}"#;
        assert_eq!(
            run(Some(TWITCH_NOTIFICATION), no_challenge),
            refused(TWITCH_VERIFICATION)
        );
        assert!(matches!(
            run(Some(TWITCH_VERIFICATION), no_challenge),
            Outcome::Refused(Refusal::Missing { .. })
        ));
        // Events and revocations are ordinary deliveries under their own type only.
        for (body, kind) in [
            (&notification[..], TWITCH_NOTIFICATION),
            (&batched[..], TWITCH_NOTIFICATION),
            (&revocation[..], TWITCH_REVOCATION),
        ] {
            assert_eq!(run(Some(kind), body), Outcome::NotHandshake, "{kind}");
            assert_eq!(run(None, body), Outcome::NotHandshake, "{kind}");
            for other in [TWITCH_VERIFICATION, TWITCH_NOTIFICATION, TWITCH_REVOCATION] {
                if other != kind {
                    assert_eq!(run(Some(other), body), refused(kind), "{kind} as {other}");
                }
            }
        }
        // A body of no known shape is left to the contract, unless it claims a verification.
        assert_eq!(run(Some(TWITCH_NOTIFICATION), b"{}"), Outcome::NotHandshake);
        assert_eq!(
            run(Some(TWITCH_NOTIFICATION), b"not json"),
            Outcome::NotHandshake
        );
        assert!(matches!(
            run(Some(TWITCH_VERIFICATION), b"{}"),
            Outcome::Refused(Refusal::Missing { .. })
        ));
        // The refusal names the types, never the header's value.
        let shown = Refusal::TwitchType {
            body: TWITCH_VERIFICATION,
        }
        .to_string();
        assert!(
            shown.contains("webhook_callback_verification") && shown.contains(TWITCH_TYPE_HEADER)
        );
    }

    #[test]
    fn x_crc_signs_the_token_with_the_secret() {
        let headers = HeaderMap::new();
        let (kind, body) = answer(get(Handshake::XCrc, "/w/x?crc_token=abc%2B1", &headers));
        let mut mac = Hmac::<Sha256>::new_from_slice(b"s3cret").unwrap();
        mac.update(b"abc+1");
        let expected =
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        assert_eq!(kind, ContentType::Json);
        assert_eq!(body, format!(r#"{{"response_token":"sha256={expected}"}}"#));
        assert!(matches!(
            get(Handshake::XCrc, "/w/x", &headers),
            Outcome::Refused(Refusal::Missing { .. })
        ));
    }

    /// A CRC answer is `HMAC-SHA256(secret, T)`: X's signature of a body T. A token that
    /// could be a body (a JSON object or value), `{t}.{body}` (Stripe) or `v0:{ts}:{body}`
    /// (Slack, Zoom) is never answered.
    #[test]
    fn x_crc_never_signs_what_a_delivery_could_carry() {
        let headers = HeaderMap::new();
        let forged = [
            // {"id":"evt_1","for_user_id":"1"}
            "%7B%22id%22%3A%22evt_1%22%2C%22for_user_id%22%3A%221%22%7D",
            // 1700000000.{"id":1}
            "1700000000.%7B%22id%22%3A1%7D",
            // v0:1700000000:{}
            "v0%3A1700000000%3A%7B%7D",
            "%5B1%5D",
            "123",
            "-1",
            "1e5",
            "true",
            "null",
            "a+b",
            "a%20b",
            "a,b",
        ];
        for token in forged {
            assert!(
                matches!(
                    get(
                        Handshake::XCrc,
                        &format!("/w/x?crc_token={token}"),
                        &headers
                    ),
                    Outcome::Refused(Refusal::NotShape { .. })
                ),
                "{token}"
            );
        }
        let longest = "A".repeat(MAX_TOKEN_BYTES);
        assert!(matches!(
            get(Handshake::XCrc, &format!("/?crc_token={longest}"), &headers),
            Outcome::Answer(_)
        ));
        assert!(matches!(
            get(
                Handshake::XCrc,
                &format!("/?crc_token={longest}A"),
                &headers
            ),
            Outcome::Refused(Refusal::NotShape { .. })
        ));
        for fine in [
            "crc-token%2B1",
            "NDY2YjFjNzctZTQ4MC00ZjVh",
            "a_b-c%2Fd%3D%3D",
            "1a",
        ] {
            assert!(
                matches!(
                    get(Handshake::XCrc, &format!("/?crc_token={fine}"), &headers),
                    Outcome::Answer(_)
                ),
                "{fine}"
            );
        }
    }

    /// Zoom's encryptedToken is `HMAC-SHA256(secret, plainToken)`; its scheme signs
    /// `v0:{ts}:{body}`, which a plainToken never is.
    #[test]
    fn zoom_answers_an_opaque_plain_token_only() {
        for plain in [
            "v0:1700000000:{\\\"event\\\":\\\"meeting.started\\\"}",
            "v0:1700000000:x",
            "a b",
            "12",
        ] {
            let body = format!(
                r#"{{"event":"endpoint.url_validation","payload":{{"plainToken":"{plain}"}}}}"#
            );
            assert!(
                matches!(
                    post(Handshake::Zoom, &body),
                    Outcome::Refused(Refusal::NotShape { .. })
                ),
                "{plain}: {body}"
            );
        }
    }

    const GRAPH_TOKEN: &str = "Validation%3a+Testing+client+application+reachability+for+subscription+Request-Id%3a+877cb92e-a60b-483b-8a39-79aa5f64f5a3";

    #[test]
    fn msgraph_echoes_the_validation_token_of_a_post() {
        let headers = HeaderMap::new();
        let path = format!("/w/g?token=t&validationToken={GRAPH_TOKEN}");
        let validation = parts("POST", &path, &headers, b"", None);
        assert!(is_graph_validation(&validation));
        assert_eq!(
            answer(detect(Handshake::Msgraph, &validation)),
            (
                ContentType::Text,
                format!("{GRAPH_VALIDATION_PREFIX}877cb92e-a60b-483b-8a39-79aa5f64f5a3")
            )
        );
        let notification = parts("POST", "/w/g", &headers, b"{\"value\":[]}", None);
        assert!(!is_graph_validation(&notification));
        assert_eq!(
            detect(Handshake::Msgraph, &notification),
            Outcome::NotHandshake
        );
    }

    /// Graph's validation is unsigned: only its own text is ever echoed, so that the echo
    /// reflects nothing a caller chose beyond a GUID's hex digits.
    #[test]
    fn msgraph_echoes_nothing_but_graphs_validation_text() {
        let headers = HeaderMap::new();
        let upper = GRAPH_TOKEN.replace("877cb92e", "877CB92E");
        assert!(matches!(
            detect(
                Handshake::Msgraph,
                &parts(
                    "POST",
                    &format!("/?validationToken={upper}"),
                    &headers,
                    b"",
                    None
                )
            ),
            Outcome::Answer(_)
        ));
        let prefix =
            "Validation%3a+Testing+client+application+reachability+for+subscription+Request-Id%3a+";
        for bad in [
            "Validation%3a+Testing+client".to_owned(),
            "%3Cscript%3Ealert(1)%3C%2Fscript%3E".to_owned(),
            "%7B%22id%22%3A%22evt_1%22%7D".to_owned(),
            format!("{prefix}877cb92e-a60b-483b-8a39-79aa5f64f5a3%3Cb%3E"),
            format!("{prefix}877cb92e-a60b-483b-8a39-79aa5f64f5a"),
            format!("{prefix}877cb92e-a60b-483b-8a39-79aa5f64f5ag"),
            format!("{prefix}877cb92ea60b-483b-8a39-79aa5f64f5a3a"),
            format!("x{prefix}877cb92e-a60b-483b-8a39-79aa5f64f5a3"),
        ] {
            let path = format!("/?validationToken={bad}");
            assert!(
                matches!(
                    detect(
                        Handshake::Msgraph,
                        &parts("POST", &path, &headers, b"", None)
                    ),
                    Outcome::Refused(Refusal::NotShape { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn dropbox_and_websub_echo_their_challenge() {
        let headers = HeaderMap::new();
        assert_eq!(
            answer(get(Handshake::Dropbox, "/w/d?challenge=xyz", &headers)),
            (ContentType::Text, "xyz".into())
        );
        assert_eq!(
            answer(get(
                Handshake::Websub,
                "/w/h?hub.mode=subscribe&hub.topic=t&hub.challenge=c1&hub.lease_seconds=9",
                &headers
            )),
            (ContentType::Text, "c1".into())
        );
        assert!(matches!(
            get(
                Handshake::Websub,
                "/w/h?hub.mode=unsubscribe&hub.challenge=c1",
                &headers
            ),
            Outcome::Refused(_)
        ));
    }

    #[test]
    fn okta_echoes_its_header_as_json() {
        let mut headers = HeaderMap::new();
        headers.insert(OKTA_CHALLENGE_HEADER, HeaderValue::from_static("okta-c"));
        assert_eq!(
            answer(get(Handshake::Okta, "/w/o", &headers)),
            (ContentType::Json, r#"{"verification":"okta-c"}"#.into())
        );
        assert!(matches!(
            get(Handshake::Okta, "/w/o", &HeaderMap::new()),
            Outcome::Refused(Refusal::Missing { .. })
        ));
    }

    #[test]
    fn echoed_values_are_bounded_and_plain_text() {
        let headers = HeaderMap::new();
        let long = "a".repeat(MAX_ECHO_BYTES);
        assert_eq!(
            answer(get(
                Handshake::Dropbox,
                &format!("/?challenge={long}"),
                &headers
            ))
            .1,
            long
        );
        assert!(matches!(
            get(
                Handshake::Dropbox,
                &format!("/?challenge={long}a"),
                &headers
            ),
            Outcome::Refused(Refusal::TooLong { .. })
        ));
        for bad in ["a%09b", "a%0Db", "a%0Ab", "a%00", "%FF", "a%7F", "%C2%85"] {
            assert!(
                matches!(
                    get(Handshake::Dropbox, &format!("/?challenge={bad}"), &headers),
                    Outcome::Refused(Refusal::NotText { .. })
                ),
                "{bad}"
            );
        }
        let tab = post(
            Handshake::Slack,
            "{\"type\":\"url_verification\",\"challenge\":\"a\\tb\"}",
        );
        assert!(matches!(tab, Outcome::Refused(Refusal::NotText { .. })));
        // `<` is no control character: text/plain or JSON keep it inert.
        assert_eq!(
            answer(get(Handshake::Dropbox, "/?challenge=%3Cb%3E", &headers)).1,
            "<b>"
        );
    }

    #[test]
    fn get_handshakes_ignore_posts_and_the_reverse() {
        let headers = HeaderMap::new();
        for h in [
            Handshake::XCrc,
            Handshake::Dropbox,
            Handshake::Okta,
            Handshake::Websub,
        ] {
            assert!(h.answers_get());
            assert_eq!(
                detect(
                    h,
                    &parts("POST", "/?challenge=c&crc_token=c", &headers, b"", None)
                ),
                Outcome::NotHandshake
            );
        }
        assert!(!Handshake::Msgraph.answers_get());
        assert_eq!(
            detect(
                Handshake::Msgraph,
                &parts("GET", "/?validationToken=t", &headers, b"", None)
            ),
            Outcome::NotHandshake
        );
    }

    proptest::proptest! {
        /// Whatever a token is, one answered with an HMAC holds no character of any signed
        /// content around a body (`{`, `"`, `:`, `.`, `,`, a space) and is no JSON value.
        #[test]
        fn an_answered_token_is_never_json_nor_a_signed_content(value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Ok(token) = opaque_token(Some(&value), "t") {
                proptest::prop_assert!(token.len() <= MAX_TOKEN_BYTES);
                proptest::prop_assert!(serde_json::from_str::<serde_json::Value>(token).is_err());
                let signed_content_chars = ['{', '[', '"', ':', '.', ',', ' '];
                proptest::prop_assert!(!token.contains(signed_content_chars), "{}", token);
            }
        }

        /// Whatever bytes come, an echoed value is 1 to 512 bytes of text without a control
        /// character, and the value itself when it is one.
        #[test]
        fn only_bounded_plain_text_is_ever_echoed(value in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            match echoable(Some(&value), "v") {
                Ok(text) => {
                    proptest::prop_assert_eq!(text.as_bytes(), &value[..]);
                    proptest::prop_assert!(!value.is_empty() && value.len() <= MAX_ECHO_BYTES);
                    proptest::prop_assert!(!text.chars().any(char::is_control));
                }
                Err(_) => {
                    let fits = std::str::from_utf8(&value).is_ok_and(|t| {
                        !t.is_empty() && t.len() <= MAX_ECHO_BYTES && !t.chars().any(char::is_control)
                    });
                    proptest::prop_assert!(!fits);
                }
            }
        }
    }
}
