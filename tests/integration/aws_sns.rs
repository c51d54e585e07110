//! `signature = "aws-sns"` end to end (docs/configuration.md, AWS SNS; docs/contract.md,
//! handshakes): a local HTTPS server of a test CA plays SNS's certificate and
//! subscription endpoints, the server trusts that CA through `SSL_CERT_FILE`, and the
//! test signs messages as SNS does with the fixture certificate's RSA key.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::tls::TestCa;
use crate::support::{now_s, Reply, TestServer};

const CERT: &str = include_str!("../fixtures/aws_sns/cert.pem");
const TOPIC: &str = "arn:aws:sns:us-west-2:123456789012:orders";

/// A local SNS: `/cert.pem` serves the fixture certificate, `/confirm…` answers 200,
/// `/fail…` 500; every request's path and query is recorded.
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
                let (status, body) = if target == "/cert.pem" {
                    ("200 OK", CERT.to_owned())
                } else if target.starts_with("/confirm") {
                    ("200 OK", "<ConfirmSubscriptionResponse/>".to_owned())
                } else if target == "/redirect.pem" {
                    ("302 Found", String::new())
                } else if target.starts_with("/fail") {
                    ("500 Internal Server Error", "no".to_owned())
                } else {
                    ("404 Not Found", String::new())
                };
                // A redirect points at the real certificate: inhook must not follow it.
                let answer = format!(
                    "HTTP/1.1 {status}\r\nlocation: /cert.pem\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
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

    /// An inhook server with an `aws-sns` source that trusts this SNS's CA and host.
    async fn inhook(&self, extra: &str) -> TestServer {
        let sources = format!(
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
{extra}
"#
        );
        let ca = self.ca_file.path().join("ca.pem");
        TestServer::spawn_with_sources_env(&sources, &[("SSL_CERT_FILE", ca.to_str().unwrap())])
            .await
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

/// Posts a body as SNS does: `text/plain` and its `x-amz-sns-*` headers.
async fn post(server: &TestServer, body: &[u8]) -> Reply {
    let value: Value = serde_json::from_slice(body).unwrap();
    let headers = [
        ("content-type", "text/plain; charset=UTF-8".to_owned()),
        (
            "x-amz-sns-message-type",
            value["Type"].as_str().unwrap_or_default().to_owned(),
        ),
        (
            "x-amz-sns-message-id",
            value["MessageId"].as_str().unwrap_or_default().to_owned(),
        ),
        ("x-amz-sns-topic-arn", TOPIC.to_owned()),
    ];
    server.post_raw("sns", body, &headers).await
}

#[tokio::test]
async fn signed_notifications_are_logged_with_their_message_as_the_document_and_one_fetch() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let cert = sns.url("/cert.pem");
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
    assert_eq!(sns.requests(), vec!["/cert.pem".to_owned()]);

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
async fn a_cert_url_on_another_host_is_refused_without_a_request() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let now = now_s();
    for url in [
        format!("https://127.0.0.1:{}/cert.pem", sns.port),
        format!("http://localhost:{}/cert.pem", sns.port),
        format!("https://localhost.evil.example:{}/cert.pem", sns.port),
    ] {
        let body = sign(notification("elsewhere-1", "ord_1", "paid", now), "2", &url);
        let r = post(&server, &body).await;
        assert_eq!(r.code, 401, "{url}: {:?}", r.body);
        assert_eq!(r.body["error"], "invalid_signature");
        let detail = r.body["detail"].as_str().unwrap_or_default();
        assert!(detail.starts_with("SigningCertURL "), "{detail}");
        assert!(!detail.contains("cert.pem"), "never the URL: {detail}");
    }
    assert!(sns.requests().is_empty(), "{:?}", sns.requests());
    assert_eq!(server.count().await, 0);
    // A topic outside sns_topic_arns is refused before any fetch, too.
    let server2 = sns
        .inhook(r#"sns_topic_arns = ["arn:aws:sns:us-west-2:123456789012:other"]"#)
        .await;
    let body = sign(
        notification("topic-1", "ord_1", "paid", now),
        "2",
        &sns.url("/cert.pem"),
    );
    let r = post(&server2, &body).await;
    assert_eq!(r.code, 401, "{:?}", r.body);
    assert!(sns.requests().is_empty(), "{:?}", sns.requests());
}

#[tokio::test]
async fn a_subscription_confirmation_gets_its_subscribe_url_once_and_is_not_stored() {
    let sns = LocalSns::start();
    let server = sns.inhook("").await;
    let cert = sns.url("/cert.pem");
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
            "/cert.pem".to_owned(),
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
        &sns.url("/fail.pem"),
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
    let cert = sns.url("/cert.pem");
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
    assert_eq!(sns.requests(), vec!["/cert.pem".to_owned()]);
    assert_eq!(server.count().await, 8);

    let redirected = sign(
        notification("redirected-1", "ord_r", "paid", now),
        "2",
        &sns.url("/redirect.pem"),
    );
    let r = post(&server, &redirected).await;
    assert_eq!(r.code, 502, "{:?}", r.body);
    assert_eq!(r.body["error"], "certificate_unavailable");
    assert_eq!(
        sns.requests(),
        vec!["/cert.pem".to_owned(), "/redirect.pem".to_owned()]
    );
}
