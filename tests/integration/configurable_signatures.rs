//! The configurable schemes end to end (docs/configuration.md, `signature = "hmac"`,
//! `"token"`, `"basic"`): deliveries signed the publisher's way, computed here by hand,
//! are accepted; tampered ones are 401; a timestamp-less HMAC source dedups by body.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::json;

use crate::support::{now_s, Reply, TestServer};

const SOURCES: &str = r#"
[[sources]]
name = "linear"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "Linear-Signature"
timestamp = "/webhookTimestamp"
timestamp_unit = "ms"
secrets = ["lin_wh_secret"]
event_id = "header:Linear-Delivery"
aggregate = "/data/id"
ordering = "unordered"

[[sources]]
name = "pagerduty"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-PagerDuty-Signature"
signature_format = "pairs"
signature_key = "v1"
secrets = ["pd-old", "pd-new"]
event_id = "header:X-Webhook-Id"
aggregate = "/event/data/id"
ordering = "unordered"

[[sources]]
name = "paddle"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "Paddle-Signature"
signature_format = "pairs"
signature_key = "h1"
timestamp_key = "ts"
signed_content = "{timestamp}:{body}"
secrets = ["pdl_ntfset_secret"]
event_id = "/event_id"
aggregate = "/data/id"
ordering = "unordered"

[[sources]]
name = "hubspot"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-HubSpot-Signature-v3"
signature_encoding = "base64"
signed_content = "{method}{url}{body}{timestamp}"
timestamp = "header:X-HubSpot-Request-Timestamp"
timestamp_unit = "ms"
public_url = "https://hooks.example.com"
secrets = ["hubspot-app-secret"]
event_id = "/eventId"
aggregate = "/objectId"
ordering = "unordered"

[[sources]]
name = "gitlab"
kind = "json"
mode = "sync"
signature = "token"
token_header = "X-Gitlab-Token"
secrets = ["gl-token-0000000001", "gl-token-0000000002"]
event_id = "header:X-Gitlab-Event-UUID"
aggregate = "/project/id"
ordering = "unordered"

[[sources]]
name = "query-token"
kind = "json"
mode = "sync"
signature = "token"
token_query = "token"
secrets = ["q-token-0123456789"]
event_id = "/id"
aggregate = "/id"
ordering = "unordered"

[[sources]]
name = "basic"
kind = "json"
mode = "sync"
signature = "basic"
secrets = ["hook:s3cret-s3cret-s3cret"]
event_id = "/id"
aggregate = "/id"
ordering = "unordered"
"#;

async fn server() -> TestServer {
    TestServer::in_process().spawn_with_sources(SOURCES).await
}

fn hmac256(key: &str, message: &[u8]) -> Vec<u8> {
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

async fn post(server: &TestServer, source: &str, body: &[u8], headers: &[(&str, String)]) -> Reply {
    let mut all = headers.to_vec();
    all.push(("content-type", "application/json".into()));
    server.post_raw(source, body, &all).await
}

#[tokio::test]
async fn linear_signs_the_body_and_its_timestamp_bounds_replays() {
    let server = server().await;
    let body = |ms: i64, title: &str| {
        serde_json::to_vec(&json!({"action": "create", "type": "Issue",
            "data": {"id": "iss_1", "title": title}, "webhookTimestamp": ms}))
        .unwrap()
    };
    let fresh = body(now_s() * 1000 + 123, "first");
    let sig = hex::encode(hmac256("lin_wh_secret", &fresh));
    let headers = [
        ("linear-signature", sig.clone()),
        ("linear-delivery", "d-1".to_owned()),
    ];
    let reply = post(&server, "linear", &fresh, &headers).await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // Tampered: the signature of another body.
    let tampered = body(now_s() * 1000 + 123, "second");
    let reply = post(&server, "linear", &tampered, &headers).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("invalid_signature")),
        "{reply:?}"
    );
    // Correctly signed, but an hour old.
    let old = body((now_s() - 3600) * 1000, "old");
    let headers = [
        (
            "linear-signature",
            hex::encode(hmac256("lin_wh_secret", &old)),
        ),
        ("linear-delivery", "d-2".to_owned()),
    ];
    let reply = post(&server, "linear", &old, &headers).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("timestamp_out_of_tolerance")),
        "{reply:?}"
    );
}

#[tokio::test]
async fn a_timestamp_less_hmac_dedups_a_replay_by_body_whatever_its_id_header() {
    let server = server().await;
    let body = serde_json::to_vec(
        &json!({"event": {"id": "01ABC", "event_type": "incident.triggered",
        "data": {"id": "PINC1"}}}),
    )
    .unwrap();
    let old = hex::encode(hmac256("pd-old", &body));
    let new = hex::encode(hmac256("pd-new", &body));
    let signed = |id: &str| {
        [
            ("x-pagerduty-signature", format!("v1={old},v1={new}")),
            ("x-webhook-id", id.to_owned()),
        ]
    };
    let first = post(&server, "pagerduty", &body, &signed("wh-1")).await;
    assert_eq!(first.code, 200, "{first:?}");
    assert_eq!(first.body["status"], "applied", "{first:?}");
    // A captured delivery resent under another unsigned id is the same delivery.
    let replay = post(&server, "pagerduty", &body, &signed("wh-2")).await;
    assert_eq!(replay.body["status"], "duplicate", "{replay:?}");
    assert_eq!(replay.body["key"], "body", "{replay:?}");
    // Only the second secret's signature: rotation, still accepted; tampered: refused.
    let other = serde_json::to_vec(
        &json!({"event": {"id": "01ABD", "event_type": "incident.resolved",
        "data": {"id": "PINC1"}}}),
    )
    .unwrap();
    let headers = [
        (
            "x-pagerduty-signature",
            format!("v1={}", hex::encode(hmac256("pd-new", &other))),
        ),
        ("x-webhook-id", "wh-3".to_owned()),
    ];
    assert_eq!(post(&server, "pagerduty", &other, &headers).await.code, 200);
    let reply = post(&server, "pagerduty", b"{\"event\":{}}", &headers).await;
    assert_eq!(reply.code, 401, "{reply:?}");
    let reply = post(&server, "pagerduty", &other, &headers[1..]).await;
    assert_eq!(reply.body["error"], "missing_signature", "{reply:?}");
}

#[tokio::test]
async fn paddle_and_hubspot_sign_timestamps_methods_and_urls() {
    let server = server().await;
    let body = serde_json::to_vec(
        &json!({"event_id": "evt_01", "event_type": "transaction.paid",
        "data": {"id": "txn_01"}}),
    )
    .unwrap();
    let ts = now_s().to_string();
    let mut signed = format!("{ts}:").into_bytes();
    signed.extend_from_slice(&body);
    let h1 = hex::encode(hmac256("pdl_ntfset_secret", &signed));
    let reply = post(
        &server,
        "paddle",
        &body,
        &[("paddle-signature", format!("ts={ts};h1={h1}"))],
    )
    .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // The same signature under another timestamp does not verify.
    let later = (now_s() + 1).to_string();
    let reply = post(
        &server,
        "paddle",
        &body,
        &[("paddle-signature", format!("ts={later};h1={h1}"))],
    )
    .await;
    assert_eq!(reply.code, 401, "{reply:?}");

    // HubSpot v3: method, the public URL with the path, the body, the timestamp.
    let body = serde_json::to_vec(&json!([{"eventId": 100, "objectId": 123}])).unwrap();
    let body = &body[1..body.len() - 1];
    let ms = (now_s() * 1000).to_string();
    let mut message = b"POSThttps://hooks.example.com/webhooks/hubspot".to_vec();
    message.extend_from_slice(body);
    message.extend_from_slice(ms.as_bytes());
    let sig =
        base64::engine::general_purpose::STANDARD.encode(hmac256("hubspot-app-secret", &message));
    let headers = [
        ("x-hubspot-signature-v3", sig),
        ("x-hubspot-request-timestamp", ms),
    ];
    let reply = post(&server, "hubspot", body, &headers).await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // Sent to another path and query, the URL differs: refused.
    let reply = reqwest::Client::new()
        .post(format!("{}/webhooks/hubspot?portalId=1", server.url))
        .header("content-type", "application/json")
        .header(headers[0].0, &headers[0].1)
        .header(headers[1].0, &headers[1].1)
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 401);
}

#[tokio::test]
async fn tokens_and_basic_credentials_accept_any_listed_secret_and_refuse_others() {
    let server = server().await;
    let body = serde_json::to_vec(&json!({"object_kind": "push", "project": {"id": 7}})).unwrap();
    for (token, id, code) in [
        ("gl-token-0000000002", "u-1", 200),
        ("gl-token-0000000001", "u-2", 200),
        ("gl-token-0000000003", "u-3", 401),
        ("gl-token-", "u-4", 401),
    ] {
        let headers = [
            ("x-gitlab-token", token.to_owned()),
            ("x-gitlab-event-uuid", id.to_owned()),
        ];
        let reply = post(&server, "gitlab", &body, &headers).await;
        assert_eq!(reply.code, code, "{token}: {reply:?}");
        assert!(!reply.body.to_string().contains("gl-token"), "{reply:?}");
    }
    let reply = post(
        &server,
        "gitlab",
        &body,
        &[("x-gitlab-event-uuid", "u-5".to_owned())],
    )
    .await;
    assert_eq!(reply.body["error"], "missing_signature", "{reply:?}");

    let body = br#"{"id":"q-1"}"#;
    let client = reqwest::Client::new();
    let query = |q: &str| {
        client
            .post(format!("{}/webhooks/query-token{q}", server.url))
            .header("content-type", "application/json")
            .body(body.to_vec())
            .send()
    };
    assert_eq!(
        query("?token=q-token-0123456789")
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    assert_eq!(
        query("?token=q-token-012345678")
            .await
            .unwrap()
            .status()
            .as_u16(),
        401
    );
    assert_eq!(query("").await.unwrap().status().as_u16(), 401);

    let basic = |credentials: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials)
        )
    };
    for (credentials, id, code) in [
        ("hook:s3cret-s3cret-s3cret", "b-1", 200),
        ("hook:wrong", "b-2", 401),
        ("other:s3cret-s3cret-s3cret", "b-3", 401),
    ] {
        let body = format!(r#"{{"id":"{id}"}}"#);
        let reply = post(
            &server,
            "basic",
            body.as_bytes(),
            &[("authorization", basic(credentials))],
        )
        .await;
        assert_eq!(reply.code, code, "{credentials}: {reply:?}");
    }
    let reply = post(&server, "basic", br#"{"id":"b-4"}"#, &[]).await;
    assert_eq!(reply.body["error"], "missing_signature", "{reply:?}");
}

#[tokio::test]
async fn send_signs_and_verify_explains_for_the_configurable_schemes() {
    let server = server().await;
    let file = server.dir().join("event.json");
    let config = server.config_path();
    let send = |source: &str, body: &str| {
        std::fs::write(&file, body).unwrap();
        // The sources that read their event id from a header get one.
        let id_header = match source {
            "linear" => "Linear-Delivery: d-9",
            "pagerduty" => "X-Webhook-Id: wh-9",
            "gitlab" => "X-Gitlab-Event-UUID: u-9",
            _ => "X-Unused: 1",
        };
        std::process::Command::new(env!("CARGO_BIN_EXE_inhook"))
            .arg("send")
            .args(["--url", &server.url, "--source", source, "--config"])
            .arg(&config)
            .args(["--header", id_header])
            .arg(&file)
            .output()
            .unwrap()
    };
    let ms = now_s() * 1000;
    for (source, body) in [
        (
            "linear",
            format!(r#"{{"data":{{"id":"iss_9"}},"webhookTimestamp":{ms}}}"#),
        ),
        ("pagerduty", r#"{"event":{"data":{"id":"P9"}}}"#.to_owned()),
        (
            "paddle",
            r#"{"event_id":"evt_9","data":{"id":"txn_9"}}"#.to_owned(),
        ),
        ("hubspot", r#"{"eventId":9,"objectId":9}"#.to_owned()),
        ("gitlab", r#"{"project":{"id":9}}"#.to_owned()),
        ("query-token", r#"{"id":"q-9"}"#.to_owned()),
        ("basic", r#"{"id":"b-9"}"#.to_owned()),
    ] {
        let out = send(source, &body);
        assert!(
            out.status.success(),
            "{source}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("200 "),
            "{source}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }

    // verify: a tampered Paddle delivery is explained in the source's own terms.
    let headers = server.dir().join("headers.txt");
    let body = server.dir().join("body.json");
    std::fs::write(
        &headers,
        format!("Paddle-Signature: ts={};h1={}\n", now_s(), "0".repeat(64)),
    )
    .unwrap();
    std::fs::write(&body, r#"{"event_id":"evt_x"}"#).unwrap();
    let (h, b) = (headers.to_str().unwrap(), body.to_str().unwrap());
    let (ok, out) = server.cli(&["verify", "--source", "paddle", "--headers", h, b]);
    assert!(!ok);
    assert!(
        out.contains("{timestamp}:{body}") && out.contains("HMAC-SHA256"),
        "{out}"
    );
    assert!(!out.contains("pdl_ntfset_secret"), "{out}");
    // A wrong token names where it was looked for, never the token.
    std::fs::write(&headers, "X-Gitlab-Token: nope\n").unwrap();
    let (ok, out) = server.cli(&["verify", "--source", "gitlab", "--headers", h, b]);
    assert!(!ok);
    assert!(
        out.contains("x-gitlab-token matches none of the 2 configured secrets"),
        "{out}"
    );
    assert!(!out.contains("gl-token"), "{out}");
}

/// Mailgun's signing key in the tests below.
const MAILGUN_KEY: &str = "mailgun-http-webhook-signing-key";

/// A Mailgun source (the preset: the signature block signs `{timestamp}{token}` only) and
/// a plain `hmac` source signing a header and the body, which has nothing to warn of.
const MAILGUN_SOURCES: &str = r#"
[[sources]]
name = "mailgun"
preset = "mailgun"
mode = "sync"
secrets = ["mailgun-http-webhook-signing-key"]

[[sources]]
name = "signs-body"
kind = "json"
mode = "sync"
signature = "hmac"
signature_header = "X-Sig"
signed_content = "{header:X-Id}.{body}"
secrets = ["signs-body-secret"]
event_id = "header:X-Id"
ordering = "unordered"
"#;

/// Mailgun's signature block for `token` at `ts`.
fn mailgun_block(ts: &str, token: &str) -> serde_json::Value {
    let sig = hex::encode(hmac256(MAILGUN_KEY, format!("{ts}{token}").as_bytes()));
    json!({"timestamp": ts, "token": token, "signature": sig})
}

/// A Mailgun event body carrying `block`; its `event-data` (id included) is unsigned.
fn mailgun_body(block: &serde_json::Value, id: &str, event: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"signature": block, "event-data": {"id": id, "event": event,
        "message": {"headers": {"message-id": format!("{id}@mg.example.com")}}}}),
    )
    .unwrap()
}

#[tokio::test]
async fn mailgun_one_signature_block_is_one_delivery_whatever_its_unsigned_event_id() {
    let server = TestServer::spawn_with_sources(MAILGUN_SOURCES).await;
    let ts = now_s().to_string();
    let block = mailgun_block(&ts, "c4b3a2f1e0d9c8b7a6f5e4d3c2b1a0f9e8d7c6b5a4f3e2d1c0");
    let first = post(
        &server,
        "mailgun",
        &mailgun_body(&block, "evt-A", "delivered"),
        &[],
    )
    .await;
    assert_eq!(first.code, 200, "{first:?}");
    assert_eq!(first.body["status"], "applied", "{first:?}");
    // The same signature block under other unsigned event ids and content: each a
    // duplicate of the first delivery, keyed by what the signature covers.
    for (id, event) in [
        ("evt-B", "delivered"),
        ("evt-C", "opened"),
        ("evt-A", "failed"),
    ] {
        let reply = post(&server, "mailgun", &mailgun_body(&block, id, event), &[]).await;
        assert_eq!(reply.code, 200, "{id}: {reply:?}");
        assert_eq!(reply.body["status"], "duplicate", "{id}: {reply:?}");
        assert_eq!(reply.body["event_id"], id, "{reply:?}");
    }
    let logged: Vec<_> = server
        .logged()
        .await
        .into_iter()
        .filter(|e| e.source == "mailgun")
        .collect();
    assert_eq!(
        logged.len(),
        1,
        "one signature block, one event: {logged:?}"
    );
    assert_eq!(logged[0].event_id, "evt-A");

    // A new delivery (Mailgun signs a fresh token each time) is a new event, even one
    // that repeats the first one's unsigned event id... which its event id dedups.
    let fresh = mailgun_block(&ts, "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a6978");
    let reply = post(
        &server,
        "mailgun",
        &mailgun_body(&fresh, "evt-D", "delivered"),
        &[],
    )
    .await;
    assert_eq!(reply.body["status"], "applied", "{reply:?}");
    let reply = post(
        &server,
        "mailgun",
        &mailgun_body(&fresh, "evt-D", "delivered"),
        &[],
    )
    .await;
    assert_eq!(
        reply.body["status"], "duplicate",
        "the retry of a delivery: {reply:?}"
    );

    // Told once at start, per such source, naming the source and what is unsigned, never the key.
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("does not cover the body"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(
        warned[0].contains("mailgun")
            && warned[0].contains("{timestamp}{pointer:/signature/token}"),
        "{}",
        warned[0]
    );
    assert!(!log.contains(MAILGUN_KEY), "{log}");
    assert!(!log.contains("signs-body-secret"), "{log}");
}

#[tokio::test]
async fn blank_and_short_shared_secrets_stop_the_server_naming_the_source_never_the_value() {
    for (scheme_keys, secret, why) in [
        (
            "signature = \"token\"\ntoken_header = \"X-Token\"",
            "t",
            "shorter than 16 bytes",
        ),
        (
            "signature = \"token\"\ntoken_query = \"token\"",
            "fifteen-bytes!!",
            "shorter than 16 bytes",
        ),
        ("signature = \"basic\"", ":", "user"),
        ("signature = \"basic\"", ":a-long-enough-password", "user"),
        ("signature = \"basic\"", "hook:pw", "password"),
        ("signature = \"basic\"", "hook:fifteen-bytes!!", "password"),
        (
            "signature = \"hmac\"\nsignature_header = \"X-Sig\"",
            "",
            "has no secret",
        ),
        (
            "signature = \"hmac\"\nsignature_header = \"X-Sig\"",
            "   ",
            "blank",
        ),
    ] {
        // The first secret is a good one: the error names the second by its position.
        let good = if scheme_keys.contains("basic") {
            "hook:ok-password-0123456789"
        } else {
            "ok-secret-0123456789"
        };
        let sources = format!(
            "[[sources]]\nname = \"weak\"\nkind = \"json\"\n{scheme_keys}\nsecrets = [{good:?}, {secret:?}]\nevent_id = \"/id\"\nordering = \"unordered\"\n"
        );
        let server = TestServer::unstarted("", "", &sources).await;
        let (ok, out) = server.cli(&["serve"]);
        assert!(!ok, "{secret:?} started: {out}");
        assert!(
            out.contains("source \"weak\"")
                && (secret.is_empty() || out.contains("secret #1"))
                && out.contains(why),
            "{secret:?}: {out}"
        );
        if secret.trim().len() > 1 {
            assert!(!out.contains(secret), "{out}");
        }
    }
    // The shortest accepted: 16 bytes of token, a user and 16 bytes of password.
    for (scheme_keys, secret) in [
        (
            "signature = \"token\"\ntoken_header = \"X-Token\"",
            "sixteen-bytes-ok",
        ),
        ("signature = \"basic\"", "u:sixteen-bytes-ok"),
    ] {
        let sources = format!(
            "[[sources]]\nname = \"fine\"\nkind = \"json\"\nmode = \"sync\"\n{scheme_keys}\nsecrets = [{secret:?}]\nevent_id = \"/id\"\nordering = \"unordered\"\n"
        );
        let server = TestServer::spawn_with_sources(&sources).await;
        assert_eq!(server.get("/healthz").await.code, 200, "{secret:?}");
    }
}
