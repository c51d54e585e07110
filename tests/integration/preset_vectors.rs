//! Presets against their publishers' OFFICIAL libraries (docs/providers.md, "Checked
//! against"): a server configured with `preset = "NAME"` receives a publisher-shaped
//! body signed by the publisher's own library (tests/vectors/sign.py, presets.mjs) and
//! applies it; the same headers over a tampered body are a 401. Where the publisher's
//! library only verifies, the test signs and that library is run on exactly the
//! headers and body sent to inhook: both accept, and both refuse the tampered one.
//!
//! The libraries are installed by `.ci/run` (tests/vectors); CI sets
//! `INHOOK_TEST_VECTORS=required`, so there a missing library fails the suite;
//! elsewhere these tests say so on stderr and pass without checking.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};

use crate::support::{now_s, vectors_available, TestServer};

const PUBLIC_URL: &str = "https://hooks.example.com";
/// A `whsec_` key for the Standard Webhooks and Svix-signed presets.
const WHSEC: &str = "whsec_cHJlc2V0LXZlY3RvcnMta2V5LTAxMjM0NTY3OA==";

/// Runs `script` in tests/vectors (`python3` or `node`) on the JSON list `input` makes;
/// returns its list. presets.mjs first says `ready` once its libraries are loaded, and
/// only then is `input` made, so timestamps signed in it are fresh.
fn run(program: &str, script: &str, input: impl FnOnce() -> Value) -> Vec<Value> {
    let path = format!("{}/tests/vectors/{script}", env!("CARGO_MANIFEST_DIR"));
    let mut child = Command::new(program)
        .arg(path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    if script.ends_with(".mjs") {
        let mut ready = String::new();
        stdout.read_line(&mut ready).unwrap();
        if ready.trim() != "ready" {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("{script} failed: {err}");
        }
    }
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&input()).unwrap())
        .unwrap();
    let mut out = Vec::new();
    stdout.read_to_end(&mut out).unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice::<Value>(&out)
        .expect("a JSON list")
        .as_array()
        .expect("a JSON list")
        .clone()
}

/// A library's headers as (name, value) pairs.
fn pairs(headers: &Value) -> Vec<(String, String)> {
    headers
        .as_object()
        .expect("headers")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// A server with one sync source per preset, named after it.
async fn server(presets: &[(&str, &str)]) -> TestServer {
    let mut config = format!("public_url = \"{PUBLIC_URL}\"\n");
    for (preset, secret) in presets {
        config += &format!(
            "\n[[sources]]\nname = \"{preset}\"\npreset = \"{preset}\"\nmode = \"sync\"\nsecrets = [\"{secret}\"]\n"
        );
    }
    TestServer::in_process()
        .spawn_top_and_sources(&config, "")
        .await
}

/// Posts `body` with `headers` (and a JSON content type) to the preset's source;
/// returns the status code and the answer's `status` (or `error` when rejected).
async fn post(
    server: &TestServer,
    preset: &str,
    body: &str,
    headers: &[(String, String)],
) -> (u16, String) {
    let mut all: Vec<(&str, String)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect();
    all.push(("content-type", "application/json".into()));
    let reply = server.post_raw(preset, body.as_bytes(), &all).await;
    // A batch (HubSpot's) of one element answers as that element would.
    let answer = match reply.body["events"].as_array() {
        Some(events) if reply.body["status"] == "batch" && events.len() == 1 => &events[0],
        _ => &reply.body,
    };
    let what = answer["status"]
        .as_str()
        .filter(|s| *s != "rejected")
        .or(answer["error"].as_str())
        .unwrap_or_default()
        .to_owned();
    (reply.code, what)
}

/// The body with its signed marker changed after signing.
fn tampered(body: &str) -> String {
    assert!(body.contains("mark"), "the body holds no marker: {body}");
    body.replace("mark", "MARK")
}

/// Presets whose publisher's library signs: (preset, sign.py or presets.mjs scheme,
/// secret, body).
fn signed_by_libraries(now: i64) -> Vec<(&'static str, &'static str, &'static str, String)> {
    vec![
        ("stripe", "stripe", "whsec_vectors_stripe",
         r#"{"id":"evt_v1","object":"event","type":"customer.updated","created":1700000001,"data":{"object":{"id":"cus_v1","object":"customer","name":"mark"}}}"#.into()),
        ("slack-events", "slack", "slack-vectors-secret",
         r#"{"token":"tok","team_id":"T0V1","api_app_id":"A0V1","event":{"type":"app_mention","user":"U0V1","text":"mark","ts":"1700000000.000100"},"type":"event_callback","event_id":"Ev0V1","event_time":1700000000}"#.into()),
        ("github", "github", "gh-vectors-secret",
         r#"{"action":"edited","issue":{"number":7,"title":"mark","updated_at":"2024-01-01T00:00:00Z"},"repository":{"full_name":"octo/vectors"},"sender":{"login":"octocat"}}"#.into()),
        ("standard-webhooks", "standard-webhooks", WHSEC,
         r#"{"type":"invoice.paid","timestamp":"2024-01-01T00:00:00Z","data":{"id":"inv_v1","note":"mark"}}"#.into()),
        ("resend", "svix", WHSEC,
         r#"{"type":"email.delivered","created_at":"2024-01-01T00:00:00.000Z","data":{"email_id":"em_v1","subject":"mark","to":["a@example.com"]}}"#.into()),
        ("clerk", "svix", WHSEC,
         r#"{"type":"user.updated","object":"event","timestamp":1700000000000,"data":{"id":"user_v1","first_name":"mark","updated_at":1700000000000}}"#.into()),
        ("workos", "workos", "workos-vectors-secret",
         format!(r#"{{"id":"event_v1","event":"user.updated","created_at":"2024-01-01T00:00:00.000Z","data":{{"id":"user_v1","object":"user","first_name":"mark","t":{now}}}}}"#)),
        ("mux", "mux", "mux-vectors-secret",
         r#"{"type":"video.asset.ready","id":"evt_mux_v1","created_at":"2024-01-01T00:00:00Z","object":{"type":"asset","id":"asset_v1"},"data":{"id":"asset_v1","passthrough":"mark"}}"#.into()),
        ("hubspot", "hubspot", "hubspot-vectors-secret", hubspot_body(1)),
    ]
}

#[tokio::test]
async fn what_the_publishers_libraries_sign_the_presets_accept() {
    if !vectors_available() {
        return;
    }
    let now = now_s();
    let rows = signed_by_libraries(now);
    let presets: Vec<(&str, &str)> = rows.iter().map(|r| (r.0, r.2)).collect();
    let server = server(&presets).await;

    let request = |(preset, scheme, secret, body): &(&str, &str, &str, String)| {
        json!({"op": "sign", "preset": preset, "scheme": scheme, "secret": secret,
               "body": body, "timestamp": now, "id": format!("msg_{preset}"),
               "url": format!("{PUBLIC_URL}/webhooks/{preset}")})
    };
    let (python, node): (Vec<_>, Vec<_>) = rows
        .iter()
        .partition(|r| !["workos", "mux", "hubspot"].contains(&r.1));
    let mut signed = run("python3", "sign.py", || {
        python.iter().map(|r| request(r)).collect()
    });
    signed.extend(run("node", "presets.mjs", || {
        node.iter().map(|r| request(r)).collect()
    }));
    let rows: Vec<_> = python.into_iter().chain(node).collect();

    for ((preset, _, _, body), signed) in rows.iter().zip(&signed) {
        let library = signed["library"].as_str().unwrap_or_default();
        let mut headers = pairs(&signed["headers"]);
        if *preset == "github" {
            headers.push(("x-github-event".into(), "issues".into()));
        }
        let answer = post(&server, preset, body, &headers).await;
        assert_eq!(
            answer,
            (200, "applied".into()),
            "{preset}: signed by {library}"
        );
        let answer = post(&server, preset, &tampered(body), &headers).await;
        assert_eq!(answer.0, 401, "{preset}: tampered, {answer:?}");
    }
}

/// A HubSpot batch of one property change (event `n`).
fn hubspot_body(n: u32) -> String {
    format!(
        r#"[{{"eventId":{n},"subscriptionId":2,"portalId":3,"appId":4,"occurredAt":1700000000000,"subscriptionType":"contact.propertyChange","attemptNumber":0,"objectId":12{n},"propertyName":"firstname","propertyValue":"mark","changeSource":"CRM"}}]"#
    )
}

fn hmac256(key: &str, message: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key.as_bytes()).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// One delivery the test signs the publisher's documented way for a preset whose
/// publisher's library verifies: (preset, secret, body, headers).
type Delivery = (&'static str, &'static str, String, Vec<(String, String)>);

fn signed_by_the_test(now: i64) -> Vec<Delivery> {
    let hex = |key: &str, message: &str| hex::encode(hmac256(key, message.as_bytes()));
    let h = |name: &str, value: String| (name.to_owned(), value);
    let mut out: Vec<Delivery> = Vec::new();

    let body = r#"{"event_id":"evt_v1","event_type":"subscription.updated","occurred_at":"2024-01-01T00:00:00.000Z","notification_id":"ntf_v1","data":{"id":"sub_v1","status":"active","custom_data":{"note":"mark"}}}"#;
    let sig = hex("pdl_ntfset_vectors", &format!("{now}:{body}"));
    out.push((
        "paddle",
        "pdl_ntfset_vectors",
        body.into(),
        vec![h("paddle-signature", format!("ts={now};h1={sig}"))],
    ));

    let body = r#"{"merchant_id":"MV1","type":"payment.updated","event_id":"ev-v1","created_at":"2024-01-01T00:00:00Z","data":{"type":"payment","id":"pay_v1","object":{"payment":{"id":"pay_v1","note":"mark"}}}}"#;
    let url = format!("{PUBLIC_URL}/webhooks/square");
    let sig = base64::engine::general_purpose::STANDARD.encode(hmac256(
        "square-vectors-key",
        format!("{url}{body}").as_bytes(),
    ));
    out.push((
        "square",
        "square-vectors-key",
        body.into(),
        vec![h("x-square-hmacsha256-signature", sig)],
    ));

    let body = r#"{"id":"event_v2","event":"user.updated","created_at":"2024-01-01T00:00:00.000Z","data":{"id":"user_v2","object":"user","first_name":"mark"}}"#;
    let ms = now * 1000;
    let sig = hex("workos-vectors-secret", &format!("{ms}.{body}"));
    out.push((
        "workos",
        "workos-vectors-secret",
        body.into(),
        vec![h("workos-signature", format!("t={ms}, v1={sig}"))],
    ));

    let body = r#"{"type":"video.asset.ready","id":"evt_mux_v2","created_at":"2024-01-01T00:00:00Z","object":{"type":"asset","id":"asset_v2"},"data":{"id":"asset_v2","passthrough":"mark"}}"#;
    let sig = hex("mux-vectors-secret", &format!("{now}.{body}"));
    out.push((
        "mux",
        "mux-vectors-secret",
        body.into(),
        vec![h("mux-signature", format!("t={now},v1={sig}"))],
    ));

    let body = format!(
        r#"{{"action":"update","type":"Issue","createdAt":"2024-01-01T00:00:00.000Z","data":{{"id":"iss_v1","title":"mark","updatedAt":"2024-01-01T00:00:00.000Z"}},"url":"https://linear.app/x/issue/X-1","webhookTimestamp":{ms},"webhookId":"wh_v1"}}"#
    );
    let sig = hex("lin_wh_vectors", &body);
    out.push((
        "linear",
        "lin_wh_vectors",
        body,
        vec![
            h("linear-signature", sig),
            h("linear-delivery", "dlv-linear-v1".into()),
        ],
    ));
    let body = hubspot_body(2);
    let url = format!("{PUBLIC_URL}/webhooks/hubspot");
    let sig = base64::engine::general_purpose::STANDARD.encode(hmac256(
        "hubspot-vectors-secret",
        format!("POST{url}{body}{ms}").as_bytes(),
    ));
    out.push((
        "hubspot",
        "hubspot-vectors-secret",
        body,
        vec![
            h("x-hubspot-signature-v3", sig),
            h("x-hubspot-request-timestamp", ms.to_string()),
        ],
    ));
    out
}

#[tokio::test]
async fn what_the_publishers_libraries_verify_the_presets_accept_and_both_refuse_tampering() {
    if !vectors_available() {
        return;
    }
    let presets = [
        ("paddle", "pdl_ntfset_vectors"),
        ("square", "square-vectors-key"),
        ("workos", "workos-vectors-secret"),
        ("mux", "mux-vectors-secret"),
        ("linear", "lin_wh_vectors"),
        ("hubspot", "hubspot-vectors-secret"),
    ];
    let server = server(&presets).await;
    // Signed once the libraries are loaded, just before they and inhook see it:
    // Paddle allows 5 s.
    let mut deliveries = Vec::new();
    let verdicts = run("node", "presets.mjs", || {
        deliveries = signed_by_the_test(now_s());
        let mut requests = Vec::new();
        for (preset, secret, body, headers) in &deliveries {
            let headers: serde_json::Map<String, Value> = headers
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                .collect();
            let url = format!("{PUBLIC_URL}/webhooks/{preset}");
            for body in [body.clone(), tampered(body)] {
                requests.push(json!({"op": "verify", "preset": preset, "secret": secret,
                                     "body": body, "headers": headers, "url": url}));
            }
        }
        Value::Array(requests)
    });

    for ((preset, _, body, headers), verdicts) in deliveries.iter().zip(verdicts.chunks(2)) {
        let library = verdicts[0]["library"].as_str().unwrap_or_default();
        assert_eq!(
            verdicts[0]["ok"], true,
            "{preset}: {library} refused {:?}",
            verdicts[0]
        );
        assert_eq!(
            verdicts[1]["ok"], false,
            "{preset}: {library} accepted a tampered body"
        );
        let answer = post(&server, preset, body, headers).await;
        assert_eq!(
            answer,
            (200, "applied".into()),
            "{preset}: {library} accepted it"
        );
        let answer = post(&server, preset, &tampered(body), headers).await;
        assert_eq!(answer.0, 401, "{preset}: tampered, {answer:?}");
    }
}

/// Slack's form-bodied presets (slash commands, interactivity): slack_sdk signs the
/// form body as sent; the source answers Slack's empty 200 and logs the event; the
/// tampered body is a 401 and logs nothing.
#[tokio::test]
async fn slack_sdk_signs_what_the_slack_form_presets_accept() {
    if !vectors_available() {
        return;
    }
    let secret = "slack-vectors-secret";
    let server = server(&[("slack-commands", secret), ("slack-interactivity", secret)]).await;
    let payload = r#"{"type":"block_actions","trigger_id":"13345224609.738474920.8088930838d88f008e0","user":{"id":"U0V2"},"actions":[{"value":"mark"}]}"#;
    let payload: String =
        percent_encoding::utf8_percent_encode(payload, percent_encoding::NON_ALPHANUMERIC)
            .to_string();
    let rows = [
        ("slack-commands", "token=tok&team_id=T0V1&channel_id=C0V1&user_id=U0V1&user_name=mark&command=%2Fdeploy&text=mark&trigger_id=13345224609.738474920.8088930838d88f008e1&api_app_id=A0V1".to_owned()),
        ("slack-interactivity", format!("payload={payload}")),
    ];
    let now = now_s();
    let signed = run("python3", "sign.py", || {
        rows.iter()
            .map(|(_, body)| json!({"scheme": "slack", "secret": secret, "body": body, "timestamp": now}))
            .collect()
    });
    for ((preset, body), signed) in rows.iter().zip(&signed) {
        let mut headers: Vec<(&str, String)> = Vec::new();
        let pairs = pairs(&signed["headers"]);
        headers.extend(pairs.iter().map(|(k, v)| (k.as_str(), v.clone())));
        headers.push(("content-type", "application/x-www-form-urlencoded".into()));
        let tampered = tampered(body);
        let reply = server.post_raw(preset, tampered.as_bytes(), &headers).await;
        assert_eq!(reply.code, 401, "{preset}: tampered {reply:?}");
        let reply = server.post_raw(preset, body.as_bytes(), &headers).await;
        assert_eq!(reply.code, 200, "{preset}: signed by slack_sdk {reply:?}");
        let events = server.get(&format!("/v1/events?source={preset}")).await;
        let items = events.body["items"].as_array().expect("events").clone();
        assert_eq!(items.len(), 1, "{preset}: {events:?}");
        assert_eq!(items[0]["status"], "processed", "{preset}: {events:?}");
    }
}
