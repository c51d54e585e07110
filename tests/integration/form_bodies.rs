//! Locations with alternatives, form bodies and `unwrap` end to end
//! (docs/configuration.md, json sources): one GitHub-like source for pull requests
//! and issues alike, Slack-like form sources, with and without a JSON `payload` field.

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};

use crate::support::{now_s, signed, Reply, TestServer};

const SOURCES: &str = r#"
[[sources]]
name = "gh"
kind = "json"
mode = "sync"
signature = "github"
secrets = ["gh-secret"]
event_type = "header:X-GitHub-Event"
aggregate = ["/repository/name", "/pull_request/number|/issue/number"]
sequence = "/pull_request/updated_at|/issue/updated_at"
state = "/pull_request|/issue"
ordering = "latest-wins"

[[sources]]
name = "commands"
kind = "json"
mode = "sync"
signature = "slack"
secrets = ["slack-secret"]
body_format = "form"
event_id = "/trigger_id"
aggregate = "/team_id"
ordering = "unordered"

[[sources]]
name = "interactivity"
kind = "json"
mode = "sync"
signature = "slack"
secrets = ["slack-secret"]
body_format = "form"
unwrap = "/payload"
event_id = "/trigger_id"
aggregate = "/user/id"
event_type = "/type"
state = "/actions/0"
ordering = "unordered"
"#;

/// Posts `body` signed with `scheme`, as `content_type`.
async fn post(
    server: &TestServer,
    source: &str,
    scheme: Scheme,
    secret: &str,
    body: &[u8],
    content_type: &str,
    extra: &[(&str, &str)],
) -> Reply {
    let mut headers: Vec<(&str, String)> = signed(scheme, secret, body, now_s())
        .into_iter()
        .filter(|(name, _)| *name != "content-type")
        .collect();
    headers.push(("content-type", content_type.to_owned()));
    for (name, value) in extra {
        headers.push((name, (*value).to_owned()));
    }
    server.post_raw(source, body, &headers).await
}

const FORM: &str = "application/x-www-form-urlencoded";

fn form(pairs: &[(&str, &str)]) -> String {
    let mut encoder = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs {
        encoder.append_pair(name, value);
    }
    encoder.finish()
}

#[tokio::test]
async fn alternatives_read_pull_requests_and_issues_from_one_source() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    let gh = |body: &Value, event: &'static str, id: &'static str| {
        let body = body.to_string();
        let server = &server;
        async move {
            post(
                server,
                "gh",
                Scheme::Github,
                "gh-secret",
                body.as_bytes(),
                "application/json",
                &[("X-GitHub-Event", event), ("X-GitHub-Delivery", id)],
            )
            .await
        }
    };
    let pr = json!({"repository": {"name": "web"},
                    "pull_request": {"number": 7, "title": "Fix", "updated_at": "2026-01-01T00:00:02Z"}});
    let issue = json!({"repository": {"name": "web"},
                       "issue": {"number": 9, "title": "Bug", "updated_at": "2026-01-01T00:00:01Z"}});
    let r = gh(&pr, "pull_request", "d-1").await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    assert_eq!(r.body["sequence"], 1_767_225_602_000_000_i64);
    let r = gh(&issue, "issues", "d-2").await;
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    assert_eq!(r.body["sequence"], 1_767_225_601_000_000_i64);

    let shown = server.get("/v1/sources/gh/aggregates/web/7").await;
    assert_eq!(shown.code, 200, "{:?}", shown.body);
    assert_eq!(shown.body["state"]["title"], "Fix");
    let shown = server.get("/v1/sources/gh/aggregates/web/9").await;
    assert_eq!(shown.body["state"]["title"], "Bug");

    // Neither alternative present: the whole location is named, nothing is stored.
    let before = server.count().await;
    let neither = json!({"repository": {"name": "web"}, "discussion": {"number": 1}});
    let r = gh(&neither, "discussion", "d-3").await;
    assert_eq!(r.code, 400, "{:?}", r.body);
    let text = r.body.to_string();
    assert!(
        text.contains("/pull_request/number|/issue/number"),
        "{text}"
    );
    assert!(
        text.contains("/pull_request/updated_at|/issue/updated_at"),
        "{text}"
    );
    assert_eq!(server.count().await, before);
}

#[tokio::test]
async fn a_form_source_keeps_its_fields_and_refuses_json() {
    let server = TestServer::spawn_with_sources(SOURCES).await;
    let body = form(&[
        ("team_id", "T1"),
        ("command", "/deploy"),
        ("text", "web now+later"),
        ("trigger_id", "tr.1"),
        ("channel", "a"),
        ("channel", "b"),
    ]);
    let r = post(
        &server,
        "commands",
        Scheme::Slack,
        "slack-secret",
        body.as_bytes(),
        FORM,
        &[],
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    let shown = server.get("/v1/sources/commands/aggregates/T1").await;
    assert_eq!(
        shown.body["state"],
        json!({"team_id": "T1", "command": "/deploy", "text": "web now+later",
               "trigger_id": "tr.1", "channel": ["a", "b"]})
    );
    // The raw bytes are what is logged.
    let logged = server.logged().await;
    let event = logged.iter().find(|e| e.event_id == "tr.1").unwrap();
    assert_eq!(event.body, body.as_bytes());

    // A JSON body to a form source: 415, naming the form type; nothing stored.
    let before = server.count().await;
    let json_body = br#"{"team_id":"T1","trigger_id":"tr.2"}"#;
    let r = post(
        &server,
        "commands",
        Scheme::Slack,
        "slack-secret",
        json_body,
        "application/json",
        &[],
    )
    .await;
    assert_eq!(r.code, 415, "{:?}", r.body);
    assert_eq!(r.body["error"], "unsupported_media_type", "{:?}", r.body);
    assert_eq!(r.body["expected"], FORM, "{:?}", r.body);
    // A form body whose field is missing names it.
    let r = post(
        &server,
        "commands",
        Scheme::Slack,
        "slack-secret",
        form(&[("team_id", "T1")]).as_bytes(),
        FORM,
        &[],
    )
    .await;
    assert_eq!(r.code, 400, "{:?}", r.body);
    assert!(r.body.to_string().contains("/trigger_id"), "{:?}", r.body);
    assert_eq!(server.count().await, before);
}

#[tokio::test]
async fn unwrap_reads_the_payload_field_as_the_document() {
    let server = TestServer::in_process().spawn_with_sources(SOURCES).await;
    let payload = json!({"type": "block_actions", "trigger_id": "tr.9",
                         "user": {"id": "U7"}, "actions": [{"action_id": "approve", "value": "yes"}]});
    let body = form(&[("payload", &payload.to_string())]);
    let r = post(
        &server,
        "interactivity",
        Scheme::Slack,
        "slack-secret",
        body.as_bytes(),
        FORM,
        &[],
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    let shown = server.get("/v1/sources/interactivity/aggregates/U7").await;
    assert_eq!(
        shown.body["state"],
        json!({"action_id": "approve", "value": "yes"})
    );
    let detail = server.get("/v1/events/interactivity/tr.9").await;
    assert_eq!(
        detail.body["event_type"], "block_actions",
        "{:?}",
        detail.body
    );

    // A payload that is not JSON, or no payload at all: 400 naming `/payload`.
    let before = server.count().await;
    for bad in [form(&[("payload", "{not json")]), form(&[("other", "1")])] {
        let r = post(
            &server,
            "interactivity",
            Scheme::Slack,
            "slack-secret",
            bad.as_bytes(),
            FORM,
            &[],
        )
        .await;
        assert_eq!(r.code, 400, "{bad}: {:?}", r.body);
        assert_eq!(r.body["error"], "invalid_payload", "{:?}", r.body);
        assert!(r.body.to_string().contains("\"/payload\""), "{:?}", r.body);
    }
    assert_eq!(server.count().await, before);
}

#[tokio::test]
async fn a_form_source_is_forwarded_byte_for_byte_with_its_media_type() {
    use crate::application::{recording_application, Received, DEST_SECRET};

    let received: Received = Received::default();
    let port = recording_application(&received).await;
    let server = TestServer::in_process()
        .spawn_with_sources(&format!(
            r#"{SOURCES}
[[destinations]]
name = "app"
url = "http://127.0.0.1:{port}/hooks"
sources = ["commands", "gh"]
secret = "{DEST_SECRET}"
"#
        ))
        .await;
    let body = form(&[("team_id", "T2"), ("trigger_id", "tr.f"), ("text", "a b")]);
    let r = post(
        &server,
        "commands",
        Scheme::Slack,
        "slack-secret",
        body.as_bytes(),
        FORM,
        &[],
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    server
        .wait_for("/v1/destinations/app/deliveries?status=delivered", |r| {
            r.body["items"]
                .as_array()
                .is_some_and(|items| !items.is_empty())
        })
        .await;
    let received = received.lock().unwrap();
    let (headers, forwarded) = &received[0];
    assert_eq!(forwarded, body.as_bytes(), "byte for byte");
    assert_eq!(headers["content-type"], FORM);
}

#[tokio::test]
async fn send_posts_a_form_body_and_verify_reads_it() {
    let server = TestServer::spawn_with_sources(SOURCES).await;
    let file = server.dir().join("command.form");
    let body = form(&[("team_id", "T3"), ("trigger_id", "tr.s"), ("text", "hi")]);
    std::fs::write(&file, &body).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inhook"))
        .arg("send")
        .args(["--url", &server.url, "--source", "commands", "--config"])
        .arg(server.config_path())
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).starts_with("200 "),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let shown = server.get("/v1/sources/commands/aggregates/T3").await;
    assert_eq!(shown.body["state"]["text"], "hi", "{:?}", shown.body);

    // verify reads a saved form delivery as the server does.
    let headers = server.dir().join("headers.txt");
    let save = |body: &str| {
        std::fs::write(&file, body).unwrap();
        let saved: String = signed(Scheme::Slack, "slack-secret", body.as_bytes(), now_s())
            .into_iter()
            .filter(|(name, _)| *name != "content-type")
            .map(|(name, value)| format!("{name}: {value}\n"))
            .collect();
        std::fs::write(&headers, saved).unwrap();
    };
    let (h, b) = (headers.to_str().unwrap(), file.to_str().unwrap());
    save(&body);
    let (ok, out) = server.cli(&["verify", "--source", "commands", "--headers", h, b]);
    assert!(ok, "{out}");
    assert!(out.contains("event_id tr.s"), "{out}");
    // A good signature over a form whose field is missing: the problem names its location.
    save("team_id=T3");
    let (ok, out) = server.cli(&["verify", "--source", "commands", "--headers", h, b]);
    assert!(ok, "{out}");
    assert!(
        out.contains("invalid_payload") && out.contains("/trigger_id"),
        "{out}"
    );
}

/// Twilio's auth token in the test below.
const TWILIO_TOKEN: &str = "twilio-auth-token-0123456789abcdef";

/// `X-Twilio-Signature` for `pairs` posted to `/webhooks/twilio` (public_url
/// `https://hooks.example.com`): base64 of the HMAC-SHA1 of the URL, then each name and
/// value sorted by name, computed here by hand.
fn twilio_signature(pairs: &[(&str, &str)]) -> String {
    use base64::Engine;
    use hmac::{Hmac, Mac};
    let mut sorted = pairs.to_vec();
    sorted.sort();
    let mut signed = "https://hooks.example.com/webhooks/twilio".to_owned();
    for (name, value) in sorted {
        signed += name;
        signed += value;
    }
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(TWILIO_TOKEN.as_bytes()).unwrap();
    mac.update(signed.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

#[tokio::test]
async fn twilio_one_signed_delivery_in_any_of_its_equivalent_forms_is_one_event() {
    let server = TestServer::spawn_top_and_sources(
        "public_url = \"https://hooks.example.com\"",
        &format!(
            "[[sources]]\nname = \"twilio\"\npreset = \"twilio\"\nmode = \"sync\"\nsecrets = [\"{TWILIO_TOKEN}\"]\n"
        ),
    )
    .await;
    let pairs = [
        ("AccountSid", "AC1"),
        ("MessageSid", "SM1342fe1b2c904d1ab04f0fc7a58abca9"),
        ("MessageStatus", "sent"),
    ];
    let signature = twilio_signature(&pairs);
    let canonical = form(&pairs);
    // One signed delivery, and what its signature still verifies for: a trailing `&`,
    // the fields reordered, `%41` for `A`, a field repeated. Each under a new (unsigned)
    // idempotency token, as a replayer would send it.
    let variants = [
        canonical.clone(),
        format!("{canonical}&"),
        "MessageStatus=sent&MessageSid=SM1342fe1b2c904d1ab04f0fc7a58abca9&AccountSid=AC1"
            .to_owned(),
        canonical.replacen("AccountSid", "%41ccountSid", 1),
        format!("AccountSid=AC1&{canonical}"),
    ];
    for (i, body) in variants.iter().enumerate() {
        let headers = [
            ("x-twilio-signature", signature.clone()),
            ("i-twilio-idempotency-token", format!("idem-{i}")),
            ("content-type", FORM.to_owned()),
        ];
        let reply = server.post_raw("twilio", body.as_bytes(), &headers).await;
        assert_eq!(reply.code, 200, "{body}: {reply:?}");
    }
    let logged = server.logged().await;
    let twilio: Vec<_> = logged.iter().filter(|e| e.source == "twilio").collect();
    assert_eq!(
        twilio.len(),
        1,
        "one signed delivery, one event: {twilio:?}"
    );
    assert_eq!(twilio[0].event_id, "idem-0");

    // Twilio's own retry (same fields, same idempotency token) stays a duplicate, and a
    // new status of the message is a new event.
    let headers = |token: &str, signature: String| {
        [
            ("x-twilio-signature", signature),
            ("i-twilio-idempotency-token", token.to_owned()),
            ("content-type", FORM.to_owned()),
        ]
    };
    let reply = server
        .post_raw(
            "twilio",
            canonical.as_bytes(),
            &headers("idem-0", signature.clone()),
        )
        .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    let delivered = [pairs[0], pairs[1], ("MessageStatus", "delivered")];
    let reply = server
        .post_raw(
            "twilio",
            form(&delivered).as_bytes(),
            &headers("idem-9", twilio_signature(&delivered)),
        )
        .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    let count = server
        .logged()
        .await
        .iter()
        .filter(|e| e.source == "twilio")
        .count();
    assert_eq!(count, 2);
}
