//! Endpoint handshakes (docs/contract.md, handshakes): the checks some publishers make
//! before they send events (Slack's `url_verification`, Zoom's `endpoint.url_validation`,
//! Discord's PING, Twitch's callback verification, X's CRC, Microsoft Graph's, Dropbox's,
//! Okta's and WebSub's challenges). Pure: the request's parts in, "not a handshake", the
//! exact answer, or a refusal out. No I/O; the HTTP layer verifies signatures first and
//! never stores nor forwards what is answered here.
//!
//! Every echoed value is bounded ([`MAX_ECHO_BYTES`], no control characters) and answered
//! as `text/plain; charset=utf-8` or `application/json`, never as HTML.

use std::fmt;

use axum::http::HeaderMap;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::signature::Secret;

/// Most bytes of a value a handshake echoes back.
pub const MAX_ECHO_BYTES: usize = 512;

/// The header Twitch names its message type in.
pub const TWITCH_TYPE_HEADER: &str = "Twitch-Eventsub-Message-Type";
/// Twitch's message type of a callback verification.
pub const TWITCH_VERIFICATION: &str = "webhook_callback_verification";
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
    /// Signed, `Twitch-Eventsub-Message-Type: webhook_callback_verification` → the challenge.
    Twitch,
    /// X (Twitter) CRC: `GET ?crc_token=T` → an HMAC of T with the source's first secret.
    XCrc,
    /// Microsoft Graph: `POST ?validationToken=T` → T.
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
            Handshake::Msgraph => Stage::UnsignedPost,
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
    /// A `POST` answered before any signature check (the publisher signs nothing).
    UnsignedPost,
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
    /// The answer needs a secret and the source has none.
    NoSecret,
}

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
    let plain = echoable(token, "the body's payload.plainToken")?;
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
    let is_verification = headers
        .get(TWITCH_TYPE_HEADER)
        .is_some_and(|v| v.as_bytes() == TWITCH_VERIFICATION.as_bytes());
    if !is_verification {
        // `notification` and `revocation` messages are ordinary events.
        return Ok(None);
    }
    let map = object(body).unwrap_or_default();
    let challenge = echoable(member(&map, "challenge"), "the body's challenge")?;
    Ok(Some(text(challenge)))
}

fn x_crc(parts: &Parts<'_>, secret: Option<&Secret>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let token = query(parts.path_and_query, "crc_token");
    let token = echoable(token.as_deref(), "the query parameter crc_token")?;
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
    let token = echoable(
        Some(token.as_slice()),
        "the query parameter validationToken",
    )?;
    Ok(Some(text(token)))
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
    crate::signature::token::query_value(path_and_query, name)
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
        assert_eq!(plain(&headers), Outcome::NotHandshake);
        headers.insert(TWITCH_TYPE_HEADER, HeaderValue::from_static("revocation"));
        assert_eq!(plain(&headers), Outcome::NotHandshake);
        headers.insert(
            TWITCH_TYPE_HEADER,
            HeaderValue::from_static(TWITCH_VERIFICATION),
        );
        assert_eq!(
            answer(plain(&headers)),
            (ContentType::Text, "pogchamp-kappa-360noscope-vohiyo".into())
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

    #[test]
    fn msgraph_echoes_the_validation_token_of_a_post() {
        let headers = HeaderMap::new();
        let out = detect(
            Handshake::Msgraph,
            &parts(
                "POST",
                "/w/g?validationToken=Validation%3a+Testing+client",
                &headers,
                b"",
                None,
            ),
        );
        assert_eq!(
            answer(out),
            (ContentType::Text, "Validation: Testing client".into())
        );
        let notification = detect(
            Handshake::Msgraph,
            &parts("POST", "/w/g", &headers, b"{\"value\":[]}", None),
        );
        assert_eq!(notification, Outcome::NotHandshake);
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
