//! Issue #13's ingress attacks, each replayed against the real server and store:
//! credential headers kept with events, a `webhook-signature` list that multiplies
//! the cost of a check, and replays that drain a publisher's rate budget.

use inhook::config::{Config, Database};
use inhook::ingress::signature::standard_webhooks::{
    format_keypair, MAX_CHECKED_SIGNATURES, MAX_SIGNATURES,
};
use inhook::ingress::signature::{try_sign, Scheme, Secret};
use serde_json::{json, Value};

use crate::support::{now_s, signed, TestServer, SAVE_SECRETS};

/// The credential headers the issue found stored and shown, with their values.
const CREDENTIALS: [(&str, &str); 7] = [
    ("x-goog-iap-jwt-assertion", "eyJhbGciOiJFUzI1NiJ9.iap"),
    ("cf-access-jwt-assertion", "eyJhbGciOiJSUzI1NiJ9.cf"),
    ("x-forwarded-client-cert", "By=spiffe://cluster/ns;Hash=abc"),
    ("x-password", "hunter2"),
    ("x-api_key", "ak_live_123"),
    ("x-webhook-key", "whk_456"),
    ("authorization", "Bearer secret-token"),
];

fn save_body(id: &str, sequence: i64) -> Vec<u8> {
    serde_json::to_vec(&json!({"event_id": id, "event_type": "progress.saved",
        "player_id": "hostile", "save_slot": "s", "sequence": sequence,
        "idempotency_key": id, "data": {}}))
    .unwrap()
}

/// The names of a headers object (stored JSON text or API answer).
fn names(headers: &Value) -> Vec<String> {
    headers
        .as_object()
        .map(|map| map.keys().cloned().collect())
        .unwrap_or_default()
}

/// The headers the store holds for one event.
async fn stored_headers(server: &TestServer, source: &str, event_id: &str) -> Value {
    let record = server
        .store()
        .await
        .event(source, event_id)
        .await
        .expect("read the store")
        .expect("the event is logged");
    record
        .headers
        .as_deref()
        .map_or(Value::Null, |text| serde_json::from_str(text).unwrap())
}

/// Overwrites an event's stored headers, as a release that kept every header did.
async fn store_old_headers(server: &TestServer, event_id: &str, headers: &Value) {
    let text = headers.to_string();
    let config = Config::load_for_store(Some(&server.config_path())).expect("test config");
    match config.store.database {
        Database::Sqlite(path) => {
            rusqlite::Connection::open(path)
                .unwrap()
                .execute(
                    "UPDATE events SET headers = ?1 WHERE event_id = ?2",
                    rusqlite::params![text, event_id],
                )
                .unwrap();
        }
        Database::Postgres(url) => {
            let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(connection);
            client
                .execute(
                    "UPDATE events SET headers = $1 WHERE event_id = $2",
                    &[&text, &event_id],
                )
                .await
                .unwrap();
        }
    }
}

#[tokio::test]
async fn only_allowlisted_and_configured_headers_are_stored_and_shown() {
    let server = TestServer::in_process()
        .spawn_configured(
            r#"keep_headers = ["X-Tenant"]"#,
            r#"keep_headers = ["x-region"]"#,
        )
        .await;
    let body = save_body("hdr1", 1);
    let mut headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());
    headers.extend(CREDENTIALS.map(|(name, value)| (name, value.to_owned())));
    headers.extend([
        ("user-agent", "publisher/1.0".to_owned()),
        ("x-tenant", "acme".to_owned()),
        ("x-region", "eu".to_owned()),
        ("x-debug-note", "not kept".to_owned()),
    ]);
    assert_eq!(
        server.post_raw("save-game", &body, &headers).await.code,
        202
    );

    let stored = stored_headers(&server, "save-game", "hdr1").await;
    let detail = server.get("/v1/events/save-game/hdr1").await;
    assert_eq!(detail.code, 200, "{detail:?}");
    for (kept, place) in [(&stored, "stored"), (&detail.body["headers"], "shown")] {
        let mut kept = names(kept);
        kept.sort();
        assert_eq!(
            kept,
            [
                "content-length",
                "content-type",
                "user-agent",
                "x-region",
                "x-tenant",
                "x-timestamp"
            ],
            "{place}"
        );
    }
    assert_eq!(detail.body["headers"]["x-tenant"], "acme");
    let text = detail.body.to_string();
    for (_, value) in CREDENTIALS {
        assert!(!text.contains(value), "{value} shown: {text}");
    }

    // The source-level addition is the save-game source's only; the top-level one is everyone's.
    let presence =
        json!({"event_id": "hdr2", "user_id": "u", "presence": "AWAY", "sequence_number": 1});
    let presence = serde_json::to_vec(&presence).unwrap();
    let mut headers = signed(
        Scheme::HmacHex,
        crate::support::PRESENCE_SECRET,
        &presence,
        now_s(),
    );
    headers.extend([
        ("x-tenant", "acme".to_owned()),
        ("x-region", "eu".to_owned()),
    ]);
    assert_eq!(
        server.post_raw("presence", &presence, &headers).await.code,
        200
    );
    let stored = names(&stored_headers(&server, "presence", "hdr2").await);
    assert!(stored.contains(&"x-tenant".to_owned()), "{stored:?}");
    assert!(!stored.contains(&"x-region".to_owned()), "{stored:?}");

    // A row written by a release that kept every header shows only the allowlisted ones.
    let mut old: serde_json::Map<String, Value> = CREDENTIALS
        .iter()
        .map(|(name, value)| (name.to_string(), json!(value)))
        .collect();
    old.insert("content-type".into(), json!("application/json"));
    store_old_headers(&server, "hdr1", &Value::Object(old)).await;
    let detail = server.get("/v1/events/save-game/hdr1").await;
    assert_eq!(
        detail.body["headers"],
        json!({"content-type": "application/json"})
    );
}

/// A Standard Webhooks source verified with two ed25519 public keys, as in the issue.
async fn ed25519_server() -> (TestServer, Secret) {
    let (first, _) = format_keypair(&[1; 32]);
    let (second, signing) = format_keypair(&[2; 32]);
    let server = TestServer::spawn_with_sources(&format!(
        r#"
[[sources]]
name = "svix"
kind = "presence"
mode = "sync"
signature = "standard-webhooks"
secrets = ["{first}", "{second}"]
"#
    ))
    .await;
    (server, Secret::new(signing))
}

/// A `webhook-signature` of `forged` well-formed `v1a` signatures (valid points, each a
/// full verification) by a key the source does not know, then `valid` if any.
fn signature_list(body: &[u8], id: &str, at: i64, forged: usize, valid: Option<&str>) -> String {
    let (_, attacker) = format_keypair(&[9; 32]);
    let attacker = try_sign(
        Scheme::StandardWebhooks,
        body,
        &Secret::new(attacker),
        at,
        Some(id),
    )
    .unwrap();
    let mut list = vec![attacker[2].1.clone(); forged];
    list.extend(valid.map(str::to_owned));
    list.join(" ")
}

/// Posts a delivery whose signature list holds `forged` signatures, then the valid one if
/// the list has room; returns the answer's code and the list sent.
async fn post_svix(
    server: &TestServer,
    signing: &Secret,
    id: &str,
    forged: usize,
) -> (u16, String) {
    let body = serde_json::to_vec(
        &json!({"event_id": id, "user_id": "u", "presence": "BUSY", "sequence_number": 1}),
    )
    .unwrap();
    let at = now_s();
    let mut headers = try_sign(Scheme::StandardWebhooks, &body, signing, at, Some(id)).unwrap();
    let valid = headers[2].1.clone();
    let room = forged < MAX_SIGNATURES;
    headers[2].1 = signature_list(&body, id, at, forged, room.then_some(valid.as_str()));
    let list = headers[2].1.clone();
    let mut headers: Vec<(&str, String)> = headers;
    headers.push(("content-type", "application/json".into()));
    let reply = server.post_raw("svix", &body, &headers).await;
    if reply.code == 401 {
        assert_eq!(reply.body["error"], "invalid_signature", "{reply:?}");
    }
    (reply.code, list)
}

#[tokio::test]
async fn a_long_v1a_list_is_checked_only_up_to_the_cap() {
    let (server, signing) = ed25519_server().await;
    // The issue's attack: 64 forged v1a tokens against two whpk_ keys.
    let (code, attack) = post_svix(&server, &signing, "cap64", MAX_SIGNATURES).await;
    assert_eq!(code, 401);
    // A valid signature within the first MAX_CHECKED_SIGNATURES verifies...
    assert_eq!(
        post_svix(&server, &signing, "cap_in", MAX_CHECKED_SIGNATURES - 1)
            .await
            .0,
        200
    );
    // ...one past them is never checked.
    assert_eq!(
        post_svix(&server, &signing, "cap_out", MAX_CHECKED_SIGNATURES)
            .await
            .0,
        401
    );
    let logged: Vec<String> = server
        .logged()
        .await
        .into_iter()
        .map(|e| e.event_id)
        .collect();
    assert_eq!(logged, ["cap_in"]);
    // The operator learns of the ignored signatures, never their values.
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap();
    assert!(log.contains("the rest are ignored"), "{log}");
    let token = attack.split(' ').next().unwrap().trim_start_matches("v1a,");
    assert!(!log.contains(&token[..24]), "a signature was logged");
}

#[tokio::test]
async fn replays_of_a_captured_delivery_do_not_spend_the_publishers_budget() {
    let server = TestServer::in_process()
        .spawn_with("rate_limit_per_s = 2")
        .await;
    let captured = save_body("rl_captured", 1);
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &captured, now_s());
    assert_eq!(
        server.post_raw("save-game", &captured, &headers).await.code,
        202
    );
    // 30 replays, half of them at once: each is the duplicate it is, none a 429.
    let concurrent = (0..15).map(|_| server.post_raw("save-game", &captured, &headers));
    let mut replies = futures_util::future::join_all(concurrent).await;
    for _ in 0..15 {
        replies.push(server.post_raw("save-game", &captured, &headers).await);
    }
    for reply in &replies {
        assert_eq!(reply.code, 200, "{reply:?}");
        assert_eq!(reply.body["status"], "duplicate");
    }
    // The publisher's next genuine delivery still finds its budget.
    let genuine = save_body("rl_genuine", 2);
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &genuine, now_s());
    assert_eq!(
        server.post_raw("save-game", &genuine, &headers).await.code,
        202
    );
    assert_eq!(server.count().await, 2, "replays store nothing");
}
