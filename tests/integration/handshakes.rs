//! Endpoint handshakes end to end (docs/contract.md, handshakes): each kind answered with its
//! exact bytes, status, content type and `X-Content-Type-Options: nosniff`; refused (401) when
//! its signature or token fails; echoed values bounded; never stored, never forwarded, counted
//! in `inhook_handshakes_total{source,kind}`; a `GET` on a source without a `GET` handshake
//! keeps its 405.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};

use crate::application::{recording_application, Received, DEST_SECRET};
use crate::support::{now_s, TestServer};

const SLACK_SECRET: &str = "slack-signing-secret";
const ZOOM_SECRETS: [&str; 2] = ["zoom-old-secret", "zoom-new-secret"];
const TWITCH_SECRET: &str = "twitch-eventsub-secret";
const DISCORD_SECRET: &str = "discord-test-secret";
const X_SECRETS: [&str; 2] = ["x-consumer-secret", "x-consumer-secret-next"];
const DROPBOX_SECRET: &str = "dropbox-app-secret";
const OKTA_TOKEN: &str = "okta-shared-token";
const WEBSUB_SECRET: &str = "websub-secret";
const GRAPH_TOKEN: &str = "graph-client-state";

/// Every kind on a source of its own, and one destination fed by all of them.
fn sources(port: u16) -> String {
    format!(
        r#"
[[sources]]
name = "slack"
kind = "json"
mode = "sync"
signature = "slack"
secrets = ["{SLACK_SECRET}"]
event_id = "/event_id"
aggregate = "/team_id"
ordering = "unordered"
handshake = "slack"

[[sources]]
name = "zoom"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "x-zm-signature"
signature_prefix = "v0="
signed_content = "v0:{{timestamp}}:{{body}}"
timestamp = "header:x-zm-request-timestamp"
secrets = ["{}", "{}"]
event_id = "/event_ts"
aggregate = "/event"
ordering = "unordered"
handshake = "zoom"

[[sources]]
name = "discord"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-Test-Signature"
secrets = ["{DISCORD_SECRET}"]
event_id = "/id"
aggregate = "/application_id"
ordering = "unordered"
handshake = "discord"

[[sources]]
name = "twitch"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "Twitch-Eventsub-Message-Signature"
signature_prefix = "sha256="
signed_content = "{{header:Twitch-Eventsub-Message-Id}}{{header:Twitch-Eventsub-Message-Timestamp}}{{body}}"
timestamp = "header:Twitch-Eventsub-Message-Timestamp"
timestamp_unit = "rfc3339"
secrets = ["{TWITCH_SECRET}"]
event_id = "header:Twitch-Eventsub-Message-Id"
aggregate = "/subscription/id"
ordering = "unordered"
handshake = "twitch"

[[sources]]
name = "x"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "x-twitter-webhooks-signature"
signature_prefix = "sha256="
signature_encoding = "base64"
secrets = ["{}", "{}"]
event_id = "/id"
aggregate = "/for_user_id"
ordering = "unordered"
handshake = "x-crc"

[[sources]]
name = "graph"
kind = "json"
mode = "sync"
signature = "token"
token_query = "token"
secrets = ["{GRAPH_TOKEN}"]
event_id = "/id"
aggregate = "/id"
ordering = "unordered"
handshake = "msgraph"

[[sources]]
name = "dropbox"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-Dropbox-Signature"
secrets = ["{DROPBOX_SECRET}"]
event_id = "/id"
aggregate = "/account"
ordering = "unordered"
handshake = "dropbox"

[[sources]]
name = "okta"
kind = "json"
mode = "sync"
signature = "token"
token_header = "Authorization"
secrets = ["{OKTA_TOKEN}"]
event_id = "/eventId"
aggregate = "/eventType"
ordering = "unordered"
handshake = "okta"

[[sources]]
name = "websub"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-Hub-Signature"
signature_prefix = "sha256="
secrets = ["{WEBSUB_SECRET}"]
event_id = "/id"
aggregate = "/id"
ordering = "unordered"
handshake = "websub"

[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["slack", "zoom", "discord", "twitch", "x", "graph", "dropbox", "okta", "websub"]
secret = "{DEST_SECRET}"
"#,
        ZOOM_SECRETS[0], ZOOM_SECRETS[1], X_SECRETS[0], X_SECRETS[1],
    )
}

async fn server() -> (TestServer, Received) {
    let received = Received::default();
    let port = recording_application(&received).await;
    (
        TestServer::spawn_with_sources(&sources(port)).await,
        received,
    )
}

fn hmac256(key: &str, message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// An answer as the publisher sees it: code, the headers that matter, raw bytes.
#[derive(Debug)]
struct Raw {
    code: u16,
    content_type: Option<String>,
    nosniff: bool,
    body: Vec<u8>,
}

impl Raw {
    fn text(&self) -> &str {
        std::str::from_utf8(&self.body).unwrap()
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// A handshake's 200: these bytes, this media type, nosniff.
    fn assert_answer(&self, content_type: &str, body: &str) {
        assert_eq!(self.code, 200, "{self:?} {}", self.text());
        assert_eq!(self.content_type.as_deref(), Some(content_type), "{self:?}");
        assert!(self.nosniff, "nosniff: {self:?}");
        assert_eq!(self.text(), body);
    }

    fn assert_error(&self, code: u16, error: &str) {
        assert_eq!(self.code, code, "{self:?} {}", self.text());
        assert_eq!(self.json()["error"], error, "{}", self.text());
    }
}

async fn send(request: reqwest::RequestBuilder) -> Raw {
    let response = request.send().await.expect("request");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().unwrap().to_owned())
    };
    let (content_type, nosniff) = (
        header("content-type"),
        header("x-content-type-options").as_deref() == Some("nosniff"),
    );
    Raw {
        code: response.status().as_u16(),
        content_type,
        nosniff,
        body: response.bytes().await.unwrap().to_vec(),
    }
}

async fn get(server: &TestServer, path: &str, headers: &[(&str, &str)]) -> Raw {
    let mut request = reqwest::Client::new().get(format!("{}{path}", server.url));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    send(request).await
}

async fn post(
    server: &TestServer,
    path: &str,
    body: &[u8],
    headers: &[(&str, String)],
    content_type: &str,
) -> Raw {
    let mut request = reqwest::Client::new()
        .post(format!("{}{path}", server.url))
        .header("content-type", content_type)
        .body(body.to_vec());
    for (name, value) in headers {
        request = request.header(*name, value);
    }
    send(request).await
}

fn slack_headers(secret: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    crate::support::signed(
        inhook::ingress::signature::Scheme::Slack,
        secret,
        body,
        now_s(),
    )
}

fn zoom_headers(secret: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    let ts = now_s().to_string();
    let mut content = format!("v0:{ts}:").into_bytes();
    content.extend_from_slice(body);
    vec![
        ("x-zm-request-timestamp", ts),
        (
            "x-zm-signature",
            format!("v0={}", hex::encode(hmac256(secret, &content))),
        ),
    ]
}

fn twitch_headers(secret: &str, body: &[u8], kind: &str) -> Vec<(&'static str, String)> {
    let id = format!("msg-{}", rand::random::<u32>());
    let ts = time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let mut content = format!("{id}{ts}").into_bytes();
    content.extend_from_slice(body);
    vec![
        ("Twitch-Eventsub-Message-Id", id),
        ("Twitch-Eventsub-Message-Timestamp", ts),
        ("Twitch-Eventsub-Message-Type", kind.to_owned()),
        (
            "Twitch-Eventsub-Message-Signature",
            format!("sha256={}", hex::encode(hmac256(secret, &content))),
        ),
    ]
}

fn hex_headers(header: &'static str, secret: &str, body: &[u8]) -> Vec<(&'static str, String)> {
    vec![(header, hex::encode(hmac256(secret, body)))]
}

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";

/// What Microsoft Graph sends as its validationToken, as it comes in the query and decoded.
const GRAPH_VALIDATION: &str = "Validation%3a+Testing+client+application+reachability+for+subscription+Request-Id%3a+877cb92e-a60b-483b-8a39-79aa5f64f5a3";
const GRAPH_VALIDATION_TEXT: &str = "Validation: Testing client application reachability for subscription Request-Id: 877cb92e-a60b-483b-8a39-79aa5f64f5a3";

/// Graph's validation request: the subscription's notificationUrl (the source's token in its
/// query) with `validationToken` added.
fn graph_validation(token: &str, validation: &str) -> String {
    format!("/webhooks/graph?token={token}&validationToken={validation}")
}

#[tokio::test]
async fn every_handshake_is_answered_exactly_and_never_stored_nor_forwarded() {
    let (server, received) = server().await;

    // Slack: url_verification, signed with the built-in slack scheme.
    let body = br#"{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}"#;
    post(
        &server,
        "/webhooks/slack",
        body,
        &slack_headers(SLACK_SECRET, body),
        JSON,
    )
    .await
    .assert_answer(
        JSON,
        r#"{"challenge":"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"}"#,
    );

    // Zoom: the encryptedToken uses the secret that verified: here the second one.
    let body = br#"{"payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680,"event":"endpoint.url_validation"}"#;
    let encrypted = hex::encode(hmac256(ZOOM_SECRETS[1], b"qgg8vlvZRS6UYooatFL8Aw"));
    post(
        &server,
        "/webhooks/zoom",
        body,
        &zoom_headers(ZOOM_SECRETS[1], body),
        JSON,
    )
    .await
    .assert_answer(
        JSON,
        &format!(r#"{{"encryptedToken":"{encrypted}","plainToken":"qgg8vlvZRS6UYooatFL8Aw"}}"#),
    );
    let first = hex::encode(hmac256(ZOOM_SECRETS[0], b"qgg8vlvZRS6UYooatFL8Aw"));
    let answered = post(
        &server,
        "/webhooks/zoom",
        body,
        &zoom_headers(ZOOM_SECRETS[0], body),
        JSON,
    )
    .await;
    assert_eq!(answered.json()["encryptedToken"], first.as_str());

    // Discord: a PING, whatever else it carries (signed here with hmac; ed25519 is its own).
    let body = br#"{"application_id":"1","id":"2","token":"t","type":1,"version":1}"#;
    post(
        &server,
        "/webhooks/discord",
        body,
        &hex_headers("X-Test-Signature", DISCORD_SECRET, body),
        JSON,
    )
    .await
    .assert_answer(JSON, r#"{"type":1}"#);

    // Twitch: the challenge of a webhook_callback_verification, as text.
    let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387","status":"webhook_callback_verification_pending","type":"channel.follow","version":"1","cost":1,"condition":{"broadcaster_user_id":"12826"},"transport":{"method":"webhook","callback":"https://example.com/webhooks/callback"},"created_at":"2019-11-16T10:11:12.634234626Z"}}"#;
    post(
        &server,
        "/webhooks/twitch",
        body,
        &twitch_headers(TWITCH_SECRET, body, "webhook_callback_verification"),
        JSON,
    )
    .await
    .assert_answer(TEXT, "pogchamp-kappa-360noscope-vohiyo");

    // X: the CRC, an HMAC of the token with the source's first secret.
    let expected =
        base64::engine::general_purpose::STANDARD.encode(hmac256(X_SECRETS[0], b"crc-token+1"));
    get(&server, "/webhooks/x?crc_token=crc-token%2B1", &[])
        .await
        .assert_answer(
            JSON,
            &format!(r#"{{"response_token":"sha256={expected}"}}"#),
        );

    // Microsoft Graph: a POST with validationToken, to the notificationUrl with its token,
    // as text, whatever its (empty) body's type.
    post(
        &server,
        &graph_validation(GRAPH_TOKEN, GRAPH_VALIDATION),
        b"",
        &[],
        "text/plain",
    )
    .await
    .assert_answer(TEXT, GRAPH_VALIDATION_TEXT);

    // Dropbox and WebSub: the challenge as text.
    get(&server, "/webhooks/dropbox?challenge=dbx-challenge-42", &[])
        .await
        .assert_answer(TEXT, "dbx-challenge-42");
    get(
        &server,
        "/webhooks/websub?hub.mode=subscribe&hub.topic=https%3A%2F%2Fexample.com%2Ffeed&hub.challenge=ws-c-7&hub.lease_seconds=86400",
        &[],
    )
    .await
    .assert_answer(TEXT, "ws-c-7");

    // Okta: the header's challenge as JSON, with the source's token.
    get(
        &server,
        "/webhooks/okta",
        &[
            ("X-Okta-Verification-Challenge", "okta-one-time"),
            ("Authorization", OKTA_TOKEN),
        ],
    )
    .await
    .assert_answer(JSON, r#"{"verification":"okta-one-time"}"#);

    // Counted per source and kind.
    for (source, kind, n) in [
        ("slack", "slack", 1.0),
        ("zoom", "zoom", 2.0),
        ("discord", "discord", 1.0),
        ("twitch", "twitch", 1.0),
        ("x", "x-crc", 1.0),
        ("graph", "msgraph", 1.0),
        ("dropbox", "dropbox", 1.0),
        ("okta", "okta", 1.0),
        ("websub", "websub", 1.0),
    ] {
        server
            .wait_for_metric(
                "inhook_handshakes_total",
                &[("source", source), ("kind", kind)],
                n,
            )
            .await;
    }
    let overview = server.get("/v1/overview").await;
    let zoom = overview.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "zoom")
        .unwrap()
        .clone();
    assert_eq!(
        (zoom["handshake"].clone(), zoom["handshakes"].clone()),
        (json!("zoom"), json!(2))
    );
    let presence = &overview.body["sources"][0];
    assert!(presence.get("handshake").is_none() && presence.get("handshakes").is_none());

    // Nothing stored: the event API and the log are empty.
    assert_eq!(server.count().await, 0);
    assert_eq!(server.get("/v1/events").await.body["items"], json!([]));

    // An ordinary delivery of the same source is logged and forwarded: the destination
    // works, and it is all it ever received.
    let event = br#"{"id":"dbx-1","account":"dbid:AAH4f99"}"#;
    let logged = post(
        &server,
        "/webhooks/dropbox",
        event,
        &hex_headers("X-Dropbox-Signature", DROPBOX_SECRET, event),
        JSON,
    )
    .await;
    assert_eq!(logged.code, 200, "{}", logged.text());
    assert_eq!(logged.json()["status"], "applied");
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
        })
        .await;
    assert_eq!(server.count().await, 1);
    let received = received.lock().unwrap();
    assert_eq!(received.len(), 1, "only the ordinary delivery is forwarded");
    assert_eq!(received[0].1, event);
}

#[tokio::test]
async fn a_handshake_whose_signature_or_token_fails_is_401_and_not_answered() {
    let (server, _received) = server().await;
    let slack = br#"{"type":"url_verification","challenge":"c"}"#;
    let reply = post(
        &server,
        "/webhooks/slack",
        slack,
        &slack_headers("wrong", slack),
        JSON,
    )
    .await;
    reply.assert_error(401, "invalid_signature");
    post(&server, "/webhooks/slack", slack, &[], JSON)
        .await
        .assert_error(401, "missing_signature");

    let zoom = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"p"}}"#;
    post(
        &server,
        "/webhooks/zoom",
        zoom,
        &zoom_headers("wrong", zoom),
        JSON,
    )
    .await
    .assert_error(401, "invalid_signature");

    let discord = br#"{"type":1}"#;
    post(
        &server,
        "/webhooks/discord",
        discord,
        &hex_headers("X-Test-Signature", "wrong", discord),
        JSON,
    )
    .await
    .assert_error(401, "invalid_signature");

    let twitch = br#"{"challenge":"c"}"#;
    post(
        &server,
        "/webhooks/twitch",
        twitch,
        &twitch_headers("wrong", twitch, "webhook_callback_verification"),
        JSON,
    )
    .await
    .assert_error(401, "invalid_signature");

    get(
        &server,
        "/webhooks/okta",
        &[
            ("X-Okta-Verification-Challenge", "c"),
            ("Authorization", "wrong"),
        ],
    )
    .await
    .assert_error(401, "invalid_signature");
    get(
        &server,
        "/webhooks/okta",
        &[("X-Okta-Verification-Challenge", "c")],
    )
    .await
    .assert_error(401, "missing_signature");

    // Graph's validation carries the token of the subscription's notificationUrl: without
    // it, the echo is no one's to get.
    post(
        &server,
        &format!("/webhooks/graph?validationToken={GRAPH_VALIDATION}"),
        b"",
        &[],
        "text/plain",
    )
    .await
    .assert_error(401, "missing_signature");
    post(
        &server,
        &graph_validation("wrong", GRAPH_VALIDATION),
        b"",
        &[],
        "text/plain",
    )
    .await
    .assert_error(401, "invalid_signature");

    let text = server.get_text("/metrics").await;
    assert!(!text.contains("inhook_handshakes_total"), "{text}");
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn echoed_values_are_bounded_and_never_carry_control_characters() {
    let (server, _received) = server().await;
    let longest = "a".repeat(512);
    get(
        &server,
        &format!("/webhooks/dropbox?challenge={longest}"),
        &[],
    )
    .await
    .assert_answer(TEXT, &longest);
    let reply = get(
        &server,
        &format!("/webhooks/dropbox?challenge={longest}a"),
        &[],
    )
    .await;
    reply.assert_error(400, "invalid_handshake");
    assert!(reply.nosniff);
    assert!(
        reply.json()["detail"]
            .as_str()
            .unwrap()
            .contains("512 bytes"),
        "{}",
        reply.text()
    );
    for bad in ["a%09b", "a%0Db", "a%0Ab", "%00", "%FF"] {
        get(&server, &format!("/webhooks/dropbox?challenge={bad}"), &[])
            .await
            .assert_error(400, "invalid_handshake");
        get(
            &server,
            &format!("/webhooks/websub?hub.mode=subscribe&hub.challenge={bad}"),
            &[],
        )
        .await
        .assert_error(400, "invalid_handshake");
        post(
            &server,
            &graph_validation(GRAPH_TOKEN, bad),
            b"",
            &[],
            "text/plain",
        )
        .await
        .assert_error(400, "invalid_handshake");
        get(&server, &format!("/webhooks/x?crc_token={bad}"), &[])
            .await
            .assert_error(400, "invalid_handshake");
    }
    get(&server, "/webhooks/dropbox?challenge=", &[])
        .await
        .assert_error(400, "invalid_handshake");
    get(&server, "/webhooks/dropbox", &[])
        .await
        .assert_error(400, "invalid_handshake");
    get(
        &server,
        "/webhooks/okta",
        &[
            ("X-Okta-Verification-Challenge", "a\tb"),
            ("Authorization", OKTA_TOKEN),
        ],
    )
    .await
    .assert_error(400, "invalid_handshake");

    // Signed bodies too: a tab in Slack's challenge, 513 bytes in Twitch's.
    let slack = b"{\"type\":\"url_verification\",\"challenge\":\"a\\tb\"}";
    post(
        &server,
        "/webhooks/slack",
        slack,
        &slack_headers(SLACK_SECRET, slack),
        JSON,
    )
    .await
    .assert_error(400, "invalid_handshake");
    let twitch = format!(r#"{{"challenge":"{longest}a"}}"#);
    post(
        &server,
        "/webhooks/twitch",
        twitch.as_bytes(),
        &twitch_headers(
            TWITCH_SECRET,
            twitch.as_bytes(),
            "webhook_callback_verification",
        ),
        JSON,
    )
    .await
    .assert_error(400, "invalid_handshake");

    // Markup is echoed as inert text, never as HTML.
    get(&server, "/webhooks/dropbox?challenge=%3Cscript%3E", &[])
        .await
        .assert_answer(TEXT, "<script>");
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn get_keeps_its_405_where_no_handshake_comes_as_a_get_and_events_stay_events() {
    let (server, _received) = server().await;
    for source in ["presence", "slack", "graph", "twitch"] {
        let reply = get(&server, &format!("/webhooks/{source}?challenge=c"), &[]).await;
        assert_eq!(reply.code, 405, "{source}: {}", reply.text());
        assert!(reply.body.is_empty());
    }
    get(&server, "/webhooks/nope?challenge=c", &[])
        .await
        .assert_error(404, "unknown_source");

    // Twitch's revocation and notification messages are ordinary events.
    let body = br#"{"subscription":{"id":"sub-1","status":"authorization_revoked"}}"#;
    let headers = twitch_headers(TWITCH_SECRET, body, "revocation");
    let reply = post(&server, "/webhooks/twitch", body, &headers, JSON).await;
    assert_eq!(reply.code, 200, "{}", reply.text());
    assert_eq!(reply.json()["status"], "applied");
    // A Graph notification (no validationToken) is an ordinary delivery, token checked.
    let body = br#"{"id":"g-1"}"#;
    let reply = post(
        &server,
        &format!("/webhooks/graph?token={GRAPH_TOKEN}"),
        body,
        &[],
        JSON,
    )
    .await;
    assert_eq!(reply.json()["status"], "applied", "{}", reply.text());
    // A Slack event that is no url_verification is logged.
    let body = br#"{"type":"event_callback","event_id":"Ev1","team_id":"T1"}"#;
    let reply = post(
        &server,
        "/webhooks/slack",
        body,
        &slack_headers(SLACK_SECRET, body),
        JSON,
    )
    .await;
    assert_eq!(reply.json()["status"], "applied", "{}", reply.text());
    assert_eq!(server.count().await, 3);
}

#[tokio::test]
async fn handshakes_skip_the_store_limits_but_not_allow_ips() {
    let server = TestServer::in_process()
        .spawn_with_sources(&format!(
            r#"
[[sources]]
name = "slack"
kind = "json"
mode = "sync"
signature = "slack"
secrets = ["{SLACK_SECRET}"]
event_id = "/event_id"
aggregate = "/team_id"
ordering = "unordered"
handshake = "slack"
max_backlog = 0
rate_limit_per_s = 1

[[sources]]
name = "fenced"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-Dropbox-Signature"
secrets = ["{DROPBOX_SECRET}"]
event_id = "/id"
aggregate = "/account"
ordering = "unordered"
handshake = "dropbox"
allow_ips = ["192.0.2.0/24"]
"#
        ))
        .await;
    // No backlog nor rate check: a source that refuses every delivery still answers them.
    let body = br#"{"type":"url_verification","challenge":"c"}"#;
    for _ in 0..3 {
        post(
            &server,
            "/webhooks/slack",
            body,
            &slack_headers(SLACK_SECRET, body),
            JSON,
        )
        .await
        .assert_answer(JSON, r#"{"challenge":"c"}"#);
    }
    let event = br#"{"type":"event_callback","event_id":"Ev1","team_id":"T1"}"#;
    let refused = post(
        &server,
        "/webhooks/slack",
        event,
        &slack_headers(SLACK_SECRET, event),
        JSON,
    )
    .await;
    assert_eq!(refused.code, 429, "{}", refused.text());
    // allow_ips comes first, for a GET handshake too.
    get(&server, "/webhooks/fenced?challenge=c", &[])
        .await
        .assert_error(403, "forbidden_peer");
    assert_eq!(server.count().await, 0);
}

/// The X CRC was a signing oracle: `GET ?crc_token=T` answered `sha256=base64(HMAC(secret,
/// T))`, exactly the `x-twitter-webhooks-signature` of a body T. The red team's attack,
/// replayed: ask the CRC for a JSON event, post that event with the answer as its signature.
/// The CRC now answers only an opaque token, so there is no answer to post.
#[tokio::test]
async fn a_crc_answer_is_never_the_signature_of_a_delivery() {
    let (server, received) = server().await;
    for (n, event) in [
        r#"{"id":"forged-1","for_user_id":"2244994945"}"#.to_owned(),
        // A compact event with every field the source reads, well under 512 bytes.
        format!(
            r#"{{"id":"forged-2","for_user_id":"1","tweet_create_events":[{{"text":"{}"}}]}}"#,
            "x".repeat(300)
        ),
    ]
    .iter()
    .enumerate()
    {
        let token =
            percent_encoding::utf8_percent_encode(event, percent_encoding::NON_ALPHANUMERIC);
        let crc = get(&server, &format!("/webhooks/x?crc_token={token}"), &[]).await;
        let signature = crc.json()["response_token"]
            .as_str()
            .unwrap_or("sha256=")
            .to_owned();
        let forged = post(
            &server,
            "/webhooks/x",
            event.as_bytes(),
            &[("x-twitter-webhooks-signature", signature)],
            JSON,
        )
        .await;
        assert_eq!(
            forged.code,
            401,
            "forgery #{n} answered {}: {}",
            forged.code,
            forged.text()
        );
        crc.assert_error(400, "invalid_handshake");
        let detail = crc.json()["detail"].as_str().unwrap().to_owned();
        assert!(
            detail.contains("crc_token") && detail.contains("opaque token"),
            "{detail}"
        );
        assert!(
            !detail.contains("forged"),
            "the refusal never shows the value: {detail}"
        );
    }
    // X's own tokens are still answered, and an event X signs is still logged.
    let reply = get(
        &server,
        "/webhooks/x?crc_token=NDY2YjFjNzctZTQ4MC00ZjVhLWJk%2BNzY%3D",
        &[],
    )
    .await;
    assert_eq!(reply.code, 200, "{}", reply.text());
    let event = br#"{"id":"x-1","for_user_id":"2244994945"}"#;
    let signature = format!(
        "sha256={}",
        base64::engine::general_purpose::STANDARD.encode(hmac256(X_SECRETS[0], event))
    );
    let logged = post(
        &server,
        "/webhooks/x",
        event,
        &[("x-twitter-webhooks-signature", signature)],
        JSON,
    )
    .await;
    assert_eq!(logged.json()["status"], "applied", "{}", logged.text());
    assert_eq!(server.count().await, 1, "only X's own event is stored");
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
        })
        .await;
    assert_eq!(
        received.lock().unwrap().len(),
        1,
        "only X's own event is forwarded"
    );
}

/// `handshake = "x-crc"` on a GitHub or Stripe source made the CRC their signing oracle too:
/// a GitHub signature is the HMAC of the body, a Stripe `v1` that of `{t}.{body}`, each
/// whatever token spells it. Such a source no longer starts; were it to, the forgery over
/// HTTP would have to be refused.
#[tokio::test]
async fn x_crc_on_another_scheme_does_not_start() {
    const GITHUB_SECRET: &str = "github-webhook-secret";
    const STRIPE_SECRET: &str = "whsec_stripe_endpoint_secret";
    let sources = format!(
        r#"
[[sources]]
name = "gh"
kind = "json"
mode = "sync"
signature = "github"
secrets = ["{GITHUB_SECRET}"]
event_id = "/id"
aggregate = "/repo"
ordering = "unordered"
handshake = "x-crc"

[[sources]]
name = "pay"
kind = "json"
mode = "sync"
signature = "stripe"
secrets = ["{STRIPE_SECRET}"]
event_id = "/id"
aggregate = "/object"
ordering = "unordered"
handshake = "x-crc"
"#
    );
    let mut server = TestServer::unstarted("", "", &sources).await;
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.start())).is_ok();
    if started {
        // The red team's forgeries, each an event the source stores.
        let crc = |token: String| {
            let server = &server;
            async move {
                let token = percent_encoding::utf8_percent_encode(
                    &token,
                    percent_encoding::NON_ALPHANUMERIC,
                );
                let answer = get(server, &format!("/webhooks/gh?crc_token={token}"), &[]).await;
                let answer = answer.json()["response_token"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned();
                let mac = base64::engine::general_purpose::STANDARD
                    .decode(answer.trim_start_matches("sha256="))
                    .unwrap_or_default();
                hex::encode(mac)
            }
        };
        let body = r#"{"id":"forged-gh","repo":"acme/app"}"#;
        let mac = crc(body.to_owned()).await;
        let github = post(
            &server,
            "/webhooks/gh",
            body.as_bytes(),
            &[
                ("x-hub-signature-256", format!("sha256={mac}")),
                ("x-github-event", "push".into()),
                ("x-github-delivery", "d-1".into()),
            ],
            JSON,
        )
        .await;
        // The CRC of the github source answers with its own secret: Stripe's forgery needs
        // the stripe source's own CRC.
        let t = now_s();
        let body = r#"{"id":"forged-pay","object":"ch_1"}"#;
        let token = percent_encoding::utf8_percent_encode(
            &format!("{t}.{body}"),
            percent_encoding::NON_ALPHANUMERIC,
        )
        .to_string();
        let answer = get(&server, &format!("/webhooks/pay?crc_token={token}"), &[]).await;
        let answer = answer.json()["response_token"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        let mac = hex::encode(
            base64::engine::general_purpose::STANDARD
                .decode(answer.trim_start_matches("sha256="))
                .unwrap_or_default(),
        );
        let stripe = post(
            &server,
            "/webhooks/pay",
            body.as_bytes(),
            &[("stripe-signature", format!("t={t},v1={mac}"))],
            JSON,
        )
        .await;
        panic!(
            "a github and a stripe source started with handshake = \"x-crc\"; forged deliveries \
             answered {} {} and {} {}; {} stored",
            github.code,
            github.text(),
            stripe.code,
            stripe.text(),
            server.count().await
        );
    }
    let (ok, out) = server.cli(&["serve"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("source \"gh\": handshake = \"x-crc\" is allowed only with")
            && out.contains("x-twitter-webhooks-signature")
            && out.contains("preset = \"x-activity\"")
            && out.contains("has signature = \"github\""),
        "{out}"
    );
    // Each source is named: with the first fixed, the second stops the start.
    server.replace_in_config("handshake = \"x-crc\"\n\n[[sources]]", "\n[[sources]]");
    let (ok, out) = server.cli(&["serve"]);
    assert!(
        !ok && out.contains("source \"pay\": handshake = \"x-crc\"")
            && out.contains("has signature = \"stripe\""),
        "{out}"
    );
}

/// Twitch signs the message id, timestamp and body, not `Twitch-Eventsub-Message-Type`: a
/// captured callback verification resent as a `notification` was logged and forwarded as an
/// event. The type is read from the signed body; a header that disagrees is 400.
#[tokio::test]
async fn a_twitch_verification_resent_as_a_notification_is_refused() {
    let (server, received) = server().await;
    let verification = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387","status":"webhook_callback_verification_pending","type":"channel.follow","version":"1","cost":1,"condition":{"broadcaster_user_id":"12826"},"transport":{"method":"webhook","callback":"https://example.com/webhooks/callback"},"created_at":"2019-11-16T10:11:12.634234626Z"}}"#;
    let captured = twitch_headers(TWITCH_SECRET, verification, "webhook_callback_verification");
    post(&server, "/webhooks/twitch", verification, &captured, JSON)
        .await
        .assert_answer(TEXT, "pogchamp-kappa-360noscope-vohiyo");
    for kind in ["notification", "revocation"] {
        let resent: Vec<(&str, String)> = captured
            .iter()
            .map(|(name, value)| match *name {
                "Twitch-Eventsub-Message-Type" => (*name, kind.to_owned()),
                _ => (*name, value.clone()),
            })
            .collect();
        let reply = post(&server, "/webhooks/twitch", verification, &resent, JSON).await;
        reply.assert_error(400, "invalid_handshake");
        let detail = reply.json()["detail"].as_str().unwrap().to_owned();
        assert!(
            detail.contains("webhook_callback_verification")
                && detail.contains("Twitch-Eventsub-Message-Type"),
            "{detail}"
        );
    }
    // A notification under another type is refused the same way; under its own, logged.
    let notification = br#"{"subscription":{"id":"f1c2a387","status":"enabled","type":"channel.follow"},"event":{"user_id":"1337","broadcaster_user_id":"12826"}}"#;
    post(
        &server,
        "/webhooks/twitch",
        notification,
        &twitch_headers(TWITCH_SECRET, notification, "revocation"),
        JSON,
    )
    .await
    .assert_error(400, "invalid_handshake");
    let logged = post(
        &server,
        "/webhooks/twitch",
        notification,
        &twitch_headers(TWITCH_SECRET, notification, "notification"),
        JSON,
    )
    .await;
    assert_eq!(logged.json()["status"], "applied", "{}", logged.text());
    assert_eq!(server.count().await, 1, "only the notification is stored");
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
        })
        .await;
    let received = received.lock().unwrap();
    assert_eq!(received.len(), 1, "only the notification is forwarded");
    assert_eq!(received[0].1, notification);
}

/// Graph's validation signs nothing: it was an open text reflector. It is answered only with
/// the source's token (in the subscription's notificationUrl) and only for Graph's own text.
#[tokio::test]
async fn graph_validation_echoes_only_graphs_text_with_the_sources_token() {
    let (server, _received) = server().await;
    for reflected in [
        "%3Chtml%3E%3Cscript%3Ealert(1)%3C%2Fscript%3E",
        "%7B%22id%22%3A%22evt_1%22%7D",
        "Validation%3a+Testing+client+application+reachability",
        &format!("{GRAPH_VALIDATION}%3Cb%3E"),
    ] {
        post(
            &server,
            &graph_validation(GRAPH_TOKEN, reflected),
            b"",
            &[],
            "text/plain",
        )
        .await
        .assert_error(400, "invalid_handshake");
        // Without the token, not even that is said.
        post(
            &server,
            &format!("/webhooks/graph?validationToken={reflected}"),
            b"",
            &[],
            "text/plain",
        )
        .await
        .assert_error(401, "missing_signature");
    }
    post(
        &server,
        &graph_validation(GRAPH_TOKEN, GRAPH_VALIDATION),
        b"",
        &[],
        "text/plain",
    )
    .await
    .assert_answer(TEXT, GRAPH_VALIDATION_TEXT);
    assert_eq!(server.count().await, 0);
}
