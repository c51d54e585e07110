//! An aggregate reset (docs/api.md, docs/contract.md, a publisher's bad version): one
//! event signed with a sequence near `i64::MAX` freezes a latest-wins aggregate, since
//! every later event is older; the operator resets it through the API or the command
//! line, the next event applies, and the event log keeps every event as it was.

use inhook::ingress::signature::Scheme;
use serde_json::json;

use crate::support::{now_s, signed, Reply, TestServer};

const SECRET: &str = "reset-test-secret";

const SOURCE: &str = r#"
[[sources]]
name = "versions"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["reset-test-secret"]
event_id = "/id"
aggregate = "/item"
sequence = "/version"
ordering = "latest-wins"
state = "/data"
"#;

async fn post(server: &TestServer, id: &str, item: &str, version: i64) -> Reply {
    let body = serde_json::to_vec(&json!({
        "id": id, "item": item, "version": version, "data": {"from": id},
    }))
    .unwrap();
    let headers = signed(Scheme::HmacHex, SECRET, &body, now_s());
    server.post_raw("versions", &body, &headers).await
}

async fn reset(server: &TestServer, key: &str) -> Reply {
    server
        .post_admin(
            &format!("/v1/sources/versions/aggregates/{key}/reset"),
            &json!({}),
        )
        .await
}

async fn state_of(server: &TestServer, key: &str) -> Reply {
    server
        .get(&format!("/v1/sources/versions/aggregates/{key}"))
        .await
}

/// The statuses of the source's events, oldest first.
async fn statuses(server: &TestServer) -> Vec<(String, String)> {
    let page = server.get("/v1/events?source=versions&limit=100").await;
    let mut items: Vec<(String, String)> = page.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["event_id"].as_str().unwrap().to_owned(),
                e["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    items.reverse();
    items
}

#[tokio::test]
async fn a_reset_unfreezes_an_aggregate_a_far_future_version_froze_and_keeps_the_log() {
    let server = TestServer::spawn_with_sources(SOURCE).await;
    assert_eq!(post(&server, "v1", "item-1", 1).await.code, 200);
    // A publisher's bug: a version no later event can pass.
    assert_eq!(post(&server, "bad", "item-1", i64::MAX).await.code, 200);
    let frozen = post(&server, "v2", "item-1", 2).await;
    assert_eq!(frozen.body["status"], "stale", "{frozen:?}");
    assert_eq!(frozen.body["current_sequence"], i64::MAX, "{frozen:?}");

    let answer = reset(&server, "item-1").await;
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(
        answer.body,
        json!({"status": "reset", "source": "versions", "aggregate": "item-1",
               "state_deleted": true, "sequence": i64::MAX, "highest_received": i64::MAX})
    );
    assert_eq!(state_of(&server, "item-1").await.code, 404);
    // The next event applies, whatever its version.
    let applied = post(&server, "v3", "item-1", 3).await;
    assert_eq!(applied.code, 200, "{applied:?}");
    assert_eq!(applied.body["status"], "applied", "{applied:?}");
    let state = state_of(&server, "item-1").await;
    assert_eq!(state.body["state"], json!({"from": "v3"}), "{state:?}");
    assert_eq!(state.body["sequence"], 3, "{state:?}");
    // The log is as it was, the reset aside.
    let expected: Vec<(String, String)> = [
        ("v1", "processed"),
        ("bad", "processed"),
        ("v2", "ignored_stale"),
        ("v3", "processed"),
    ]
    .iter()
    .map(|(id, status)| (id.to_string(), status.to_string()))
    .collect();
    assert_eq!(statuses(&server).await, expected);
    // A redelivery of the bad event is still a duplicate: it cannot freeze it again.
    assert_eq!(
        post(&server, "bad", "item-1", i64::MAX).await.body["status"],
        "duplicate"
    );
    // Audited as erasures are.
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    let line = log
        .lines()
        .find(|l| l.contains("aggregate reset on request"))
        .unwrap_or_else(|| panic!("no audit line in:\n{log}"));
    for field in [
        "inhook::audit",
        "versions",
        "item-1",
        "admin API",
        "9223372036854775807",
    ] {
        assert!(line.contains(field), "{field} not in {line}");
    }
}

#[tokio::test]
async fn a_reset_of_nothing_stored_or_of_an_unknown_source_is_404_and_a_bad_key_400() {
    let server = TestServer::in_process().spawn_with_sources(SOURCE).await;
    let unknown = reset(&server, "never-seen").await;
    assert_eq!(unknown.code, 404, "{unknown:?}");
    assert_eq!(unknown.body["error"], "unknown_aggregate");
    let source = server
        .post_admin("/v1/sources/nope/aggregates/item-1/reset", &json!({}))
        .await;
    assert_eq!(source.code, 404, "{source:?}");
    assert_eq!(source.body["error"], "unknown_source");
    let bad = reset(&server, "a%25zz").await;
    assert_eq!(bad.code, 400, "{bad:?}");
    // A key of several parts, or with a `/` inside a part, as the other routes take it.
    assert_eq!(post(&server, "s1", "grp/7", 5).await.code, 200);
    let answer = reset(&server, "grp%252F7").await;
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(answer.body["aggregate"], "grp%2F7", "{answer:?}");
    assert_eq!(answer.body["sequence"], 5, "{answer:?}");
    // A POST on the aggregate itself is no reset.
    let client = reqwest::Client::new();
    let plain = client
        .post(format!(
            "{}/v1/sources/versions/aggregates/item-1",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status().as_u16(), 405);
}

#[tokio::test]
async fn reset_on_the_command_line_names_the_aggregate_and_audits() {
    let server = TestServer::in_process().spawn_with_sources(SOURCE).await;
    assert_eq!(
        post(&server, "v9", "item/2", 9_999_123_456_789).await.code,
        200
    );
    let (ok, out) = server.cli(&["reset", "--source", "versions", "--aggregate", "item%2F2"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("reset versions/item%2F2: state deleted (sequence 9999123456789)"),
        "{out}"
    );
    assert!(
        out.contains(
            "audit: aggregate reset on request: source=versions aggregate=item%2F2 by=command line"
        ),
        "{out}"
    );
    let applied = post(&server, "v1", "item/2", 1).await;
    assert_eq!(applied.body["status"], "applied", "{applied:?}");
    let (ok, out) = server.cli(&["reset", "--source", "nope", "--aggregate", "x"]);
    assert!(!ok && out.contains("unknown source nope"), "{out}");
    let (ok, out) = server.cli(&["reset", "--source", "versions", "--aggregate", "never-seen"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("nothing is stored for aggregate never-seen of source versions"),
        "{out}"
    );
}
