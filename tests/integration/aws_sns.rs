//! `signature = "aws-sns"` end to end (docs/configuration.md, AWS SNS; docs/contract.md,
//! handshakes): a local HTTPS server of a test CA plays SNS's certificate and
//! subscription endpoints, the server trusts that CA through `SSL_CERT_FILE`, and the
//! test signs messages as SNS does with the fixture certificate's RSA key.

use std::net::IpAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::tls::TestCa;
use crate::support::{now_s, Reply, TestServer};

const CERT: &str = include_str!("../fixtures/aws_sns/cert.pem");
const TOPIC: &str = "arn:aws:sns:us-west-2:123456789012:orders";
/// A topic of another AWS account: AWS signs its messages just as well.
const OTHER_TOPIC: &str = "arn:aws:sns:us-west-2:999999999999:orders";

/// The paths the local SNS answers, in AWS's certificate form: the fixture certificate
/// (twice, so that one URL can be first seen during a flood), a 500 and a redirect.
const CERT_PATH: &str = "/SimpleNotificationService-0123456789abcdef0123456789abcdef.pem";
const CERT_PATH_2: &str = "/SimpleNotificationService-fedcba9876543210fedcba9876543210.pem";
const FAIL_PATH: &str = "/SimpleNotificationService-00000000000000000000000000000500.pem";
const REDIRECT_PATH: &str = "/SimpleNotificationService-00000000000000000000000000000302.pem";
/// How long the local SNS takes to answer 404 for any other certificate path: a flood's
/// fetches hold their slots a while, as a far or busy endpoint's would.
const UNKNOWN_CERT_DELAY: Duration = Duration::from_millis(1500);

/// A local SNS: the paths above, `/confirm…` answers 200, `/fail…` 500, any other
/// certificate path 404 after [`UNKNOWN_CERT_DELAY`]; every request's path and query is
/// recorded.
struct LocalSns {
    _ca: TestCa,
    ca_file: tempfile::TempDir,
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

impl LocalSns {
    fn start() -> Self {
        let ca = TestCa::new();
        // The CA file outlives the server process that reads it at start.
        let ca_file = tempfile::tempdir().unwrap();
        std::fs::copy(ca.file(), ca_file.path().join("ca.pem")).unwrap();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let port = ca.front(move |tcp, acceptor| {
            let seen = Arc::clone(&seen);
            async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&head);
                let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
                seen.lock().unwrap().push(target.clone());
                let (status, body) = if target == CERT_PATH || target == CERT_PATH_2 {
                    ("200 OK", CERT.to_owned())
                } else if target.starts_with("/confirm") {
                    ("200 OK", "<ConfirmSubscriptionResponse/>".to_owned())
                } else if target == REDIRECT_PATH {
                    ("302 Found", String::new())
                } else if target.starts_with("/fail") || target == FAIL_PATH {
                    ("500 Internal Server Error", "no".to_owned())
                } else if target.starts_with("/SimpleNotificationService-") {
                    tokio::time::sleep(UNKNOWN_CERT_DELAY).await;
                    ("404 Not Found", String::new())
                } else {
                    ("404 Not Found", String::new())
                };
                // A redirect points at the real certificate: inhook must not follow it.
                let answer = format!(
                    "HTTP/1.1 {status}\r\nlocation: {CERT_PATH}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            }
        });
        Self {
            _ca: ca,
            ca_file,
            port,
            requests,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.port)
    }

    fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }

    fn ca_path(&self) -> String {
        self.ca_file
            .path()
            .join("ca.pem")
            .to_str()
            .unwrap()
            .to_owned()
    }

    /// The `[[sources]]` table of an `aws-sns` source `sns` that trusts this SNS's host,
    /// with `extra` lines (taking [`TOPIC`] unless they say `sns_topic_arns`).
    fn source(extra: &str) -> String {
        let topics = if extra.contains("sns_topic_arns") {
            String::new()
        } else {
            format!("sns_topic_arns = [\"{TOPIC}\"]")
        };
        format!(
            r#"
[[sources]]
name = "sns"
kind = "json"
mode = "sync"
signature = "aws-sns"
sns_cert_hosts = ["localhost"]
unwrap = "/Message"
aggregate = "/order"
ordering = "unordered"
{topics}
{extra}
"#
        )
    }

    /// An inhook server with an `aws-sns` source that trusts this SNS's CA and host.
    async fn inhook(&self, extra: &str) -> TestServer {
        self.inhook_env(extra, &[]).await
    }

    /// Like [`Self::inhook`], with environment variables besides `SSL_CERT_FILE`.
    async fn inhook_env(&self, extra: &str, env: &[(&str, &str)]) -> TestServer {
        let ca = self.ca_path();
        let mut all = vec![("SSL_CERT_FILE", ca.as_str())];
        all.extend_from_slice(env);
        TestServer::spawn_with_sources_env(&Self::source(extra), &all).await
    }
}

fn rfc3339(at: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(at)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// Signs `message` as SNS does (SignatureVersion `version`, the fixture's key).
fn sign(mut message: Value, version: &str, cert_url: &str) -> Vec<u8> {
    message["SignatureVersion"] = version.into();
    message["SigningCertURL"] = cert_url.into();
    let get = |name: &str| message.get(name).and_then(Value::as_str).map(str::to_owned);
    let names: &[&str] = if get("Type").as_deref() == Some("Notification") {
        &[
            "Message",
            "MessageId",
            "Subject",
            "Timestamp",
            "TopicArn",
            "Type",
        ]
    } else {
        &[
            "Message",
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ]
    };
    let mut text = String::new();
    for name in names {
        if let Some(value) = get(name) {
            text.push_str(&format!("{name}\n{value}\n"));
        }
    }
    let signature = rsa_sign(text.as_bytes(), version);
    use base64::Engine;
    message["Signature"] = base64::engine::general_purpose::STANDARD
        .encode(&signature)
        .into();
    serde_json::to_vec(&message).unwrap()
}

#[path = "../fixtures/aws_sns/rsa_sign.rs"]
mod fixture_signer;
use fixture_signer::rsa_sign;

fn notification(id: &str, order: &str, status: &str, at: i64) -> Value {
    json!({
        "Type": "Notification",
        "MessageId": id,
        "TopicArn": TOPIC,
        "Subject": "order update",
        "Message": json!({"order": order, "status": status}).to_string(),
        "Timestamp": rfc3339(at),
        "UnsubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe"
    })
}

fn confirmation(kind: &str, subscribe_url: &str) -> Value {
    json!({
        "Type": kind,
        "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
        "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a747ba6f3",
        "TopicArn": TOPIC,
        "Message": "You have chosen to subscribe to the topic. To confirm the subscription, visit the SubscribeURL included in this message.",
        "SubscribeURL": subscribe_url,
        "Timestamp": rfc3339(now_s())
    })
}

/// The headers SNS sends with a body.
fn sns_headers(body: &[u8]) -> Vec<(&'static str, String)> {
    let value: Value = serde_json::from_slice(body).unwrap_or_default();
    let field = |name: &str| value[name].as_str().unwrap_or_default().to_owned();
    vec![
        ("content-type", "text/plain; charset=UTF-8".to_owned()),
        ("x-amz-sns-message-type", field("Type")),
        ("x-amz-sns-message-id", field("MessageId")),
        ("x-amz-sns-topic-arn", field("TopicArn")),
    ]
}

/// Posts a body as SNS does: `text/plain` and its `x-amz-sns-*` headers.
async fn post(server: &TestServer, body: &[u8]) -> Reply {
    server.post_raw("sns", body, &sns_headers(body)).await
}

/// Posts a body as SNS does to `{url}/webhooks/{source}` with `client` (e.g. bound to
/// another loopback address); the status and the JSON body.
async fn post_with(client: &reqwest::Client, url: &str, source: &str, body: &[u8]) -> (u16, Value) {
    let mut request = client
        .post(format!("{url}/webhooks/{source}"))
        .body(body.to_vec());
    for (name, value) in sns_headers(body) {
        request = request.header(name, value);
    }
    match request.send().await {
        Ok(response) => {
            let code = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            (
                code,
                serde_json::from_str(&text).unwrap_or(Value::String(text)),
            )
        }
        Err(err) => (0, Value::String(err.to_string())),
    }
}

/// A client whose connections come from `ip` (any 127.0.0.0/8 address is local on Linux):
/// another client than the test's own, as the server sees it.
fn client_from(ip: [u8; 4]) -> reqwest::Client {
    reqwest::Client::builder()
        .local_address(IpAddr::from(ip))
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

#[tokio::test]
async fn signed_notifications_are_logged_with_their_message_as_the_document_and_one_fetch() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let cert = sns.url(CERT_PATH);
    let now = now_s();
    // Both signature versions, several messages: the certificate is fetched once.
    let mut ids = Vec::new();
    for (i, version) in ["1", "2", "1", "2", "2"].into_iter().enumerate() {
        let id = format!("22b80b92-fdea-4c2c-8f9d-bdfb0c7bf32{i}");
        let body = sign(
            notification(&id, &format!("ord_{i}"), "paid", now),
            version,
            &cert,
        );
        let r = post(&server, &body).await;
        assert_eq!(r.code, 200, "{version}: {:?}", r.body);
        assert_eq!(r.body["status"], "applied", "{:?}", r.body);
        ids.push(id);
    }
    let shown = server.get("/v1/sources/sns/aggregates/ord_0").await;
    assert_eq!(
        shown.body["state"],
        json!({"order": "ord_0", "status": "paid"}),
        "{:?}",
        shown.body
    );
    // MessageId is the event id: the same message again is a duplicate.
    let detail = server.get(&format!("/v1/events/sns/{}", ids[0])).await;
    assert_eq!(detail.code, 200, "{:?}", detail.body);
    let again = sign(notification(&ids[0], "ord_0", "paid", now), "2", &cert);
    let r = post(&server, &again).await;
    assert_eq!(r.body["status"], "duplicate", "{:?}", r.body);
    assert_eq!(server.count().await, 5);
    assert_eq!(sns.requests(), vec![CERT_PATH.to_owned()]);

    // Tampered: 401, nothing stored.
    let body = sign(notification("tampered-1", "ord_9", "paid", now), "2", &cert);
    let text = String::from_utf8(body)
        .unwrap()
        .replace("\\\"paid\\\"", "\\\"refunded\\\"");
    assert!(text.contains("refunded"));
    let r = post(&server, text.as_bytes()).await;
    assert_eq!(r.code, 401, "{:?}", r.body);
    assert_eq!(r.body["error"], "invalid_signature");
    // Signed too long ago: 401 timestamp_out_of_tolerance.
    let old = sign(
        notification("old-1", "ord_8", "paid", now - 3600),
        "1",
        &cert,
    );
    let r = post(&server, &old).await;
    assert_eq!(
        r.body["error"], "timestamp_out_of_tolerance",
        "{:?}",
        r.body
    );
    assert_eq!(server.count().await, 5);
    assert_eq!(sns.requests().len(), 1, "still one fetch");
}

#[tokio::test]
async fn a_cert_url_on_another_host_or_not_in_aws_form_is_refused_without_a_request() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let now = now_s();
    let port = sns.port;
    for (url, why) in [
        (
            format!("https://127.0.0.1:{port}{CERT_PATH}"),
            "names a host",
        ),
        (
            format!("http://localhost:{port}{CERT_PATH}"),
            "is not https",
        ),
        (
            format!("https://localhost.evil.example:{port}{CERT_PATH}"),
            "names a host",
        ),
        // The right host, but not AWS's certificate path: never fetched.
        (sns.url("/cert.pem"), "is not an SNS certificate URL"),
        (
            sns.url(&format!("{CERT_PATH}?x=1")),
            "is not an SNS certificate URL",
        ),
        (
            sns.url("/confirm?Action=ConfirmSubscription&Token=2336412f37&x=.pem"),
            "is not an SNS certificate URL",
        ),
    ] {
        let body = sign(notification("elsewhere-1", "ord_1", "paid", now), "2", &url);
        let r = post(&server, &body).await;
        assert_eq!(r.code, 401, "{url}: {:?}", r.body);
        assert_eq!(r.body["error"], "invalid_signature");
        let detail = r.body["detail"].as_str().unwrap_or_default();
        assert!(
            detail.starts_with(&format!("SigningCertURL {why}")),
            "{url}: {detail}"
        );
        assert!(!detail.contains("localhost"), "never the URL: {detail}");
    }
    assert!(sns.requests().is_empty(), "{:?}", sns.requests());
    assert_eq!(server.count().await, 0);
}

/// Spawns `inhook serve` on `config` with `env`; the output when it exits (an error) within
/// 30 s, or `Err` with its first line when it starts instead (then it is killed).
fn serve_outcome(config: &std::path::Path, env: &[(&str, &str)]) -> Result<String, String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .arg("serve")
        .arg("--config")
        .arg(config)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn inhook");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().expect("wait").is_some() {
            let output = child.wait_with_output().expect("output");
            return Ok(String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr));
        }
        if std::time::Instant::now() > deadline {
            child.kill().expect("kill");
            let output = child.wait_with_output().expect("output");
            return Err(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// AWS signs for whoever owns a topic: an `aws-sns` source names its topics or does not
/// start, whether they come from the file or from `INHOOK_<NAME>_SNS_TOPIC_ARNS`.
#[tokio::test]
async fn an_aws_sns_source_without_sns_topic_arns_does_not_start() {
    let sns = LocalSns::start();
    let source = LocalSns::source("")
        .lines()
        .filter(|l| !l.starts_with("sns_topic_arns"))
        .collect::<Vec<_>>()
        .join("\n");
    let server = TestServer::unstarted("", "", &source).await;
    let out = serve_outcome(&server.config_path(), &[])
        .unwrap_or_else(|line| panic!("an aws-sns source without sns_topic_arns started: {line}"));
    assert!(
        out.contains("source \"sns\": sns_topic_arns is required for signature = \"aws-sns\"")
            && out.contains("INHOOK_SNS_SNS_TOPIC_ARNS"),
        "{out}"
    );
    // An empty list, or a wildcard account, is no list of topics either.
    for (lines, env) in [
        ("sns_topic_arns = []", vec![]),
        ("", vec![("INHOOK_SNS_SNS_TOPIC_ARNS", " , ")]),
        (
            "sns_topic_arns = [\"arn:aws:sns:us-west-2:*:orders\"]",
            vec![],
        ),
    ] {
        let server = TestServer::unstarted("", "", &format!("{source}\n{lines}\n")).await;
        let out = serve_outcome(&server.config_path(), &env)
            .unwrap_or_else(|line| panic!("{lines} {env:?}: started: {line}"));
        assert!(
            out.contains("source \"sns\": sns_topic_arns"),
            "{lines}: {out}"
        );
    }

    // From the environment: comma-separated, in place of the file's list.
    let server = sns
        .inhook_env(
            "",
            &[(
                "INHOOK_SNS_SNS_TOPIC_ARNS",
                &format!("arn:aws:sns:us-east-1:123456789012:unrelated, {OTHER_TOPIC}"),
            )],
        )
        .await;
    let now = now_s();
    let cert = sns.url(CERT_PATH);
    let theirs = sign(notification("env-1", "ord_e", "paid", now), "2", &cert);
    let r = post(&server, &theirs).await;
    assert_eq!(r.code, 403, "the file's topic is replaced: {:?}", r.body);
    let mut other = notification("env-2", "ord_e", "paid", now);
    other["TopicArn"] = OTHER_TOPIC.into();
    let r = post(&server, &sign(other, "2", &cert)).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
}

/// A message from a topic outside `sns_topic_arns` (validly signed: AWS signs every
/// customer's topic) is 403 `forbidden_topic` before any request: its subscription is never
/// confirmed, its notifications never stored.
#[tokio::test]
async fn an_unlisted_topic_is_never_confirmed_nor_stored_nor_fetched_for() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let cert = sns.url(CERT_PATH);
    let now = now_s();
    let mut subscribe = confirmation(
        "SubscriptionConfirmation",
        &sns.url("/confirm?Action=ConfirmSubscription&Token=other"),
    );
    subscribe["TopicArn"] = OTHER_TOPIC.into();
    let mut unsubscribe = subscribe.clone();
    unsubscribe["Type"] = "UnsubscribeConfirmation".into();
    let mut notify = notification("other-1", "ord_o", "paid", now);
    notify["TopicArn"] = OTHER_TOPIC.into();
    for (what, message) in [
        ("SubscriptionConfirmation", subscribe),
        ("UnsubscribeConfirmation", unsubscribe),
        ("Notification", notify),
    ] {
        for version in ["1", "2"] {
            let r = post(&server, &sign(message.clone(), version, &cert)).await;
            assert_eq!(r.code, 403, "{what}: {:?}", r.body);
            assert_eq!(
                r.body,
                json!({"status": "rejected", "error": "forbidden_topic",
                       "detail": "this source takes SNS messages only from the topics in its sns_topic_arns"}),
                "{what}"
            );
        }
    }
    assert!(
        sns.requests().is_empty(),
        "no certificate fetched, nothing confirmed: {:?}",
        sns.requests()
    );
    assert_eq!(server.count().await, 0);
    let metrics = server.get_text("/metrics").await;
    assert!(
        !metrics
            .lines()
            .any(|l| l.starts_with("inhook_handshakes_total") && l.contains("aws-sns")),
        "nothing confirmed: {metrics}"
    );

    // The listed topic, the same way: confirmed and stored.
    let r = post(
        &server,
        &sign(
            confirmation(
                "SubscriptionConfirmation",
                &sns.url("/confirm?Action=ConfirmSubscription&Token=ours"),
            ),
            "2",
            &cert,
        ),
    )
    .await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    let r = post(
        &server,
        &sign(notification("ours-1", "ord_1", "paid", now), "2", &cert),
    )
    .await;
    assert_eq!(r.body["status"], "applied", "{:?}", r.body);
    assert_eq!(server.count().await, 1);
    assert_eq!(
        sns.requests(),
        vec![
            CERT_PATH.to_owned(),
            "/confirm?Action=ConfirmSubscription&Token=ours".to_owned()
        ]
    );
}

/// `inhook presets aws-sns` prints the key to fill in; pasted as printed the source does
/// not start, filled in it verifies.
#[tokio::test]
async fn the_aws_sns_preset_asks_for_its_topics() {
    let (ok, paste) = crate::support::run_cli(&["presets".as_ref(), "aws-sns".as_ref()], &[]);
    assert!(ok, "{paste}");
    let example =
        "# sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"]   # required: ";
    assert!(
        paste.contains(example) && paste.contains("INHOOK_AWS_SNS_SNS_TOPIC_ARNS"),
        "{paste}"
    );
    assert!(
        !paste.contains("secrets") && !paste.contains("public_keys"),
        "{paste}"
    );
    let server = TestServer::unstarted("", "", &paste).await;
    let out = serve_outcome(&server.config_path(), &[])
        .unwrap_or_else(|line| panic!("the preset started without topics: {line}"));
    assert!(
        out.contains("source \"aws-sns\": sns_topic_arns is required"),
        "{out}"
    );

    let sns = LocalSns::start();
    let filled = paste.replace(
        "# sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"]",
        &format!("sns_topic_arns = [\"{TOPIC}\"]"),
    ) + "mode = \"sync\"\nsns_cert_hosts = [\"localhost\"]\n";
    let ca = sns.ca_path();
    let server = TestServer::spawn_with_sources_env(&filled, &[("SSL_CERT_FILE", &ca)]).await;
    let body = sign(
        notification("preset-1", "ord_p", "paid", now_s()),
        "2",
        &sns.url(CERT_PATH),
    );
    let (code, answer) = post_with(&reqwest::Client::new(), &server.url, "aws-sns", &body).await;
    assert_eq!(code, 200, "{answer:?}");
    assert_eq!(answer["status"], "applied", "{answer:?}");
}

#[tokio::test]
async fn a_subscription_confirmation_gets_its_subscribe_url_once_and_is_not_stored() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let cert = sns.url(CERT_PATH);
    let subscribe = sns.url("/confirm?Action=ConfirmSubscription&Token=2336412f37");
    let body = sign(
        confirmation("SubscriptionConfirmation", &subscribe),
        "1",
        &cert,
    );
    let r = post(&server, &body).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({"status": "handshake", "handshake": "aws-sns"})
    );
    assert_eq!(
        sns.requests(),
        vec![
            CERT_PATH.to_owned(),
            "/confirm?Action=ConfirmSubscription&Token=2336412f37".to_owned()
        ]
    );
    assert_eq!(server.count().await, 0, "a handshake is never stored");
    server
        .wait_for_metric(
            "inhook_handshakes_total",
            &[("source", "sns"), ("kind", "aws-sns")],
            1.0,
        )
        .await;

    // A failing SubscribeURL: 502, so that SNS sends it again; nothing stored or counted.
    let failing = sign(
        confirmation("SubscriptionConfirmation", &sns.url("/fail?Token=x")),
        "2",
        &cert,
    );
    let r = post(&server, &failing).await;
    assert_eq!(r.code, 502, "{:?}", r.body);
    assert_eq!(r.body["error"], "subscription_confirmation_failed");
    assert_eq!(sns.requests().last().unwrap(), "/fail?Token=x");

    // A SubscribeURL outside sns_cert_hosts: 401, no request.
    let before = sns.requests().len();
    let foreign = sign(
        confirmation(
            "SubscriptionConfirmation",
            &format!("https://127.0.0.1:{}/confirm", sns.port),
        ),
        "2",
        &cert,
    );
    let r = post(&server, &foreign).await;
    assert_eq!(r.code, 401, "{:?}", r.body);
    assert!(r.body["detail"]
        .as_str()
        .unwrap()
        .starts_with("SubscribeURL "));
    assert_eq!(sns.requests().len(), before);

    // An UnsubscribeConfirmation: 200, not stored, no request.
    let unsubscribe = sign(
        confirmation("UnsubscribeConfirmation", &subscribe),
        "2",
        &cert,
    );
    let r = post(&server, &unsubscribe).await;
    assert_eq!(r.code, 200, "{:?}", r.body);
    assert_eq!(
        r.body,
        json!({"status": "not_stored", "reason": "unsubscribe_confirmation"})
    );
    assert_eq!(sns.requests().len(), before);
    assert_eq!(server.count().await, 0);
    server
        .wait_for_metric(
            "inhook_handshakes_total",
            &[("source", "sns"), ("kind", "aws-sns")],
            1.0,
        )
        .await;
}

#[tokio::test]
async fn a_certificate_that_cannot_be_fetched_is_a_502() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let body = sign(
        notification("nocert-1", "ord_1", "paid", now_s()),
        "2",
        &sns.url(FAIL_PATH),
    );
    let r = post(&server, &body).await;
    assert_eq!(r.code, 502, "{:?}", r.body);
    assert_eq!(r.body["error"], "certificate_unavailable");
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn concurrent_deliveries_share_one_fetch_and_redirects_are_not_followed() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let cert = sns.url(CERT_PATH);
    let now = now_s();
    let bodies: Vec<Vec<u8>> = (0..8)
        .map(|i| {
            sign(
                notification(&format!("concurrent-{i}"), &format!("ord_{i}"), "paid", now),
                "2",
                &cert,
            )
        })
        .collect();
    let replies = futures_util::future::join_all(bodies.iter().map(|b| post(&server, b))).await;
    for r in &replies {
        assert_eq!(r.code, 200, "{:?}", r.body);
    }
    assert_eq!(sns.requests(), vec![CERT_PATH.to_owned()]);
    assert_eq!(server.count().await, 8);

    let redirected = sign(
        notification("redirected-1", "ord_r", "paid", now),
        "2",
        &sns.url(REDIRECT_PATH),
    );
    let r = post(&server, &redirected).await;
    assert_eq!(r.code, 502, "{:?}", r.body);
    assert_eq!(r.body["error"], "certificate_unavailable");
    assert_eq!(
        sns.requests(),
        vec![CERT_PATH.to_owned(), REDIRECT_PATH.to_owned()]
    );
}

/// A flood of unsigned messages from a listed topic (so they pass the topic check), each
/// naming a fresh certificate URL of AWS's form, starves no genuine notification, during
/// it or after: a certificate that verified is never evicted by unverified URLs, one
/// client's fetches cannot take every slot, and a fetch that waited for a slot is not
/// remembered as a failure.
#[tokio::test]
async fn a_flood_of_fresh_certificate_urls_starves_no_genuine_notification() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    // The genuine publisher and the flood come from two addresses, as SNS and an attacker do.
    let publisher = client_from([127, 0, 0, 2]);
    let genuine = Arc::new(AtomicUsize::new(0));
    let post_genuine = |cert_path: &'static str| {
        let (publisher, url, genuine) =
            (publisher.clone(), server.url.clone(), Arc::clone(&genuine));
        let cert = sns.url(cert_path);
        async move {
            let i = genuine.fetch_add(1, Ordering::SeqCst);
            let body = sign(
                notification(
                    &format!("genuine-{i}"),
                    &format!("ord_{i}"),
                    "paid",
                    now_s(),
                ),
                "2",
                &cert,
            );
            post_with(&publisher, &url, "sns", &body).await
        }
    };
    // The certificate verified once before the flood.
    let (code, answer) = post_genuine(CERT_PATH).await;
    assert_eq!(code, 200, "{answer:?}");

    // The flood: 240 messages, 96 in flight at once, each naming a URL never seen.
    let flood = {
        let url = server.url.clone();
        let host = sns.url("");
        tokio::spawn(async move {
            let attacker = client_from([127, 0, 0, 1]);
            let gate = Arc::new(tokio::sync::Semaphore::new(96));
            let mut tasks = Vec::new();
            for i in 0..240u32 {
                let permit = Arc::clone(&gate).acquire_owned().await.unwrap();
                let (attacker, url) = (attacker.clone(), url.clone());
                let mut message = notification(&format!("flood-{i}"), "ord_f", "paid", now_s());
                message["SignatureVersion"] = "2".into();
                message["SigningCertURL"] = format!(
                    "{host}/SimpleNotificationService-{:032x}.pem",
                    0xf100_d000_u64 + u64::from(i)
                )
                .into();
                message["Signature"] = "AAAA".repeat(86).into();
                tasks.push(tokio::spawn(async move {
                    let body = serde_json::to_vec(&message).unwrap();
                    let (code, _) = post_with(&attacker, &url, "sns", &body).await;
                    drop(permit);
                    code
                }));
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let mut codes = Vec::new();
            for task in tasks {
                codes.push(task.await.unwrap());
            }
            codes
        })
    };

    // During the flood: the warm certificate's notifications, and one naming a second URL
    // of the same certificate, first seen now, which must be fetched in spite of the flood.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut during = Vec::new();
    for i in 0..12 {
        let path = if i == 6 { CERT_PATH_2 } else { CERT_PATH };
        during.push((path, post_genuine(path).await));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let flooded = flood.await.unwrap();
    // After it: more of both.
    let mut after = Vec::new();
    for i in 0..12 {
        let path = if i % 4 == 0 { CERT_PATH_2 } else { CERT_PATH };
        after.push((path, post_genuine(path).await));
    }
    for (when, replies) in [("during", &during), ("after", &after)] {
        for (path, (code, answer)) in replies {
            assert_eq!(*code, 200, "{when} the flood, {path}: {answer:?}");
            assert_eq!(answer["status"], "applied", "{when}: {answer:?}");
        }
    }
    // The flood was refused, and did reach the fetches (its topic is listed).
    assert!(
        flooded.iter().all(|c| [401, 502].contains(c)),
        "{flooded:?}"
    );
    let fetched = sns
        .requests()
        .iter()
        .filter(|p| ![CERT_PATH, CERT_PATH_2].contains(&p.as_str()))
        .count();
    assert!(fetched > 0, "{:?}", sns.requests());
    // Each genuine URL was fetched once: the flood never evicted a certificate that verified.
    for path in [CERT_PATH, CERT_PATH_2] {
        let times = sns.requests().iter().filter(|p| *p == path).count();
        assert_eq!(times, 1, "{path}");
    }
    assert_eq!(server.count().await, 1 + during.len() + after.len());
}
