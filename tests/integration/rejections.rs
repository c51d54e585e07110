//! Every bad delivery gets its clear 4xx and stores nothing.

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};

use crate::support::{now_s, signed, TestServer, PRESENCE_SECRET, SAVE_SECRETS};

fn save_body() -> Vec<u8> {
    serde_json::to_vec(&json!({"event_id": "evt_1", "event_type": "progress.saved",
        "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "k",
        "data": {"chapter": 1}}))
    .unwrap()
}

#[tokio::test]
async fn bad_signatures_are_401_with_the_reason_and_store_nothing() {
    let server = TestServer::in_process().spawn().await;
    let body = save_body();
    let now = now_s();

    let wrong = signed(Scheme::HmacTimestamped, "not-the-secret", &body, now);
    let reply = server.post_raw("save-game", &body, &wrong).await;
    assert_eq!(
        (reply.code, &reply.body),
        (
            401,
            &json!({"status": "rejected", "error": "invalid_signature"})
        )
    );

    let mut missing = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now);
    missing.retain(|(name, _)| *name != "x-signature");
    let reply = server.post_raw("save-game", &body, &missing).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("missing_signature"))
    );

    let old = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now - 600);
    let reply = server.post_raw("save-game", &body, &old).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("timestamp_out_of_tolerance"))
    );

    // A signature over other bytes than the ones sent: the body was tampered with.
    let tampered = signed(Scheme::HmacHex, PRESENCE_SECRET, b"{}", now);
    let presence = br#"{"event_id":"e","user_id":"u","presence":"BUSY","sequence_number":1}"#;
    let reply = server.post_raw("presence", presence, &tampered).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("invalid_signature"))
    );

    // The second, rotated secret still verifies.
    let rotated = signed(Scheme::HmacTimestamped, SAVE_SECRETS[1], &body, now);
    assert_eq!(
        server.post_raw("save-game", &body, &rotated).await.code,
        202
    );
    assert_eq!(
        server.count().await,
        1,
        "only the verified delivery is logged"
    );
}

#[tokio::test]
async fn malformed_bodies_are_400_naming_the_field_and_store_nothing() {
    let server = TestServer::in_process().spawn().await;
    let base = json!({"event_id": "e1", "user_id": "u1", "presence": "BUSY", "sequence_number": 7});
    let with = |field: &str, value: serde_json::Value| {
        let mut body = base.clone();
        body[field] = value;
        serde_json::to_vec(&body).unwrap()
    };
    let without = |field: &str| {
        let mut body = base.clone();
        body.as_object_mut().unwrap().remove(field);
        serde_json::to_vec(&body).unwrap()
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not JSON", b"{\"event_id\": ".to_vec(), "$"),
        ("not an object", b"[1, 2]".to_vec(), "$"),
        (
            // `\u005f` is `_`: the same key twice, which two readers could each take differently.
            "repeated key",
            br#"{"event_id":"e1","user_id":"u1","presence":"BUSY","sequence_number":7,"user\u005fid":"u2"}"#
                .to_vec(),
            "$",
        ),
        ("missing field", without("user_id"), "user_id"),
        (
            "wrong type",
            with("sequence_number", json!("seven")),
            "sequence_number",
        ),
        (
            "unknown presence",
            with("presence", json!("SLEEPING")),
            "presence",
        ),
        (
            "negative sequence",
            with("sequence_number", json!(-1)),
            "sequence_number",
        ),
        (
            "oversized sequence",
            with("sequence_number", json!(9_223_372_036_854_775_808u64)),
            "sequence_number",
        ),
        (
            "fractional sequence",
            with("sequence_number", json!(1.5)),
            "sequence_number",
        ),
        ("empty id", with("event_id", json!("")), "event_id"),
        (
            "control character in id",
            with("event_id", json!("evt\u{7}")),
            "event_id",
        ),
    ];
    for (what, body, field) in cases {
        let headers = signed(Scheme::HmacHex, PRESENCE_SECRET, &body, now_s());
        let reply = server.post_raw("presence", &body, &headers).await;
        assert_eq!(reply.code, 400, "{what}: {:?}", reply.body);
        assert_eq!(reply.body["status"], "rejected", "{what}");
        assert_eq!(reply.body["error"], "invalid_payload", "{what}");
        let fields: Vec<_> = reply.body["details"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["field"].clone())
            .collect();
        assert_eq!(fields, [json!(field)], "{what}: {:?}", reply.body);
        let problem = reply.body["details"][0]["problem"].as_str().unwrap_or("");
        assert!(!problem.is_empty(), "{what}");
        if what == "repeated key" {
            assert!(
                problem.starts_with("is not acceptable JSON: key \"user_id\" appears twice"),
                "{problem}"
            );
        }
    }
    assert_eq!(server.count().await, 0);
    // The server still serves.
    assert_eq!(server.post_presence(&base).await.code, 200);
}

#[tokio::test]
async fn a_save_repeating_a_key_deep_in_data_is_400_and_logs_nothing() {
    let server = TestServer::in_process().spawn().await;
    // One item with `qty` twice: one reader could add 1 gold, another 900.
    let body = br#"{"event_id":"evt_1","event_type":"inventory.updated","player_id":"p",
        "save_slot":"s","sequence":1,"idempotency_key":"k",
        "data":{"added_items":[{"item_id":"gold","qty":1,"qty":900}],"removed_items":[]}}"#;
    let good = String::from_utf8_lossy(body).replace(r#""qty":1,"qty":900"#, r#""qty":1"#);
    let good = good.into_bytes();
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], body, now_s());
    let reply = server.post_raw("save-game", body, &headers).await;
    assert_eq!(reply.code, 400, "{:?}", reply.body);
    assert_eq!(reply.body["error"], "invalid_payload");
    assert_eq!(reply.body["details"][0]["field"], "$");
    assert!(reply.body["details"][0]["problem"]
        .as_str()
        .is_some_and(|p| p.starts_with("is not acceptable JSON: key \"qty\" appears twice")));
    assert_eq!(server.count().await, 0);
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &good, now_s());
    assert_eq!(
        server.post_raw("save-game", &good, &headers).await.code,
        202
    );
}

#[tokio::test]
async fn unknown_source_size_and_content_type_are_checked_in_order() {
    let server = TestServer::in_process().spawn().await;
    let body = save_body();
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());

    let reply = server.post_raw("nope", &body, &headers).await;
    assert_eq!(
        (reply.code, &reply.body),
        (
            404,
            &json!({"status": "rejected", "error": "unknown_source"})
        )
    );

    let huge = vec![b' '; 256 * 1024 + 1];
    let reply = server.post_raw("save-game", &huge, &headers).await;
    assert_eq!(reply.code, 413);
    // Unsigned and oversized: the size is checked before the signature.
    let reply = server.post_raw("save-game", &huge, &[]).await;
    assert_eq!(reply.code, 413);

    let mut form = headers.clone();
    form.retain(|(name, _)| *name != "content-type");
    form.push(("content-type", "text/plain".into()));
    let reply = server.post_raw("save-game", &body, &form).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (415, &json!("unsupported_media_type"))
    );
    let reply = server.post_raw("save-game", &body, &[]).await;
    assert_eq!(reply.code, 415, "no content type at all");

    assert_eq!(server.count().await, 0);
}

/// A save-game delivery with `id` as event id and idempotency key, for the rotation tests.
fn body(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"event_id": id, "event_type": "progress.saved",
        "player_id": "r", "save_slot": "s", "sequence": 1, "idempotency_key": id,
        "data": {}}))
    .unwrap()
}

#[tokio::test]
async fn secrets_rotate_on_sighup_without_a_restart() {
    let server = TestServer::spawn().await;
    let rotated = "save-test-secret-rotated";
    server.replace_in_config(SAVE_SECRETS[1], rotated);
    server.hangup();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let b = body("rot_new");
        let headers = signed(Scheme::HmacTimestamped, rotated, &b, now_s());
        let reply = server.post_raw("save-game", &b, &headers).await;
        if reply.code == 202 {
            break;
        }
        assert_eq!(reply.code, 401);
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated secret never verified"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let b = body("rot_old");
    let removed = signed(Scheme::HmacTimestamped, SAVE_SECRETS[1], &b, now_s());
    let reply = server.post_raw("save-game", &b, &removed).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("invalid_signature"))
    );
    let kept = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &b, now_s());
    assert_eq!(
        server.post_raw("save-game", &b, &kept).await.code,
        202,
        "the other secret stays"
    );
}

#[tokio::test]
async fn secrets_rotate_through_the_admin_api_without_a_restart() {
    let token = "reload-admin-token";
    let server = TestServer::spawn_configured(&format!("admin_token = \"{token}\""), "").await;
    let reload = |bearer: &'static str| {
        let url = format!("{}/v1/admin/reload", server.url);
        async move {
            let reply = reqwest::Client::new()
                .post(url)
                .bearer_auth(bearer)
                .send()
                .await
                .unwrap();
            let code = reply.status().as_u16();
            (code, reply.json::<Value>().await.unwrap())
        }
    };
    let rotated = "save-test-secret-rotated-by-api";
    server.replace_in_config(SAVE_SECRETS[1], rotated);

    // Before the reload the new secret does not verify; a wrong token changes nothing.
    let b = body("api_new");
    let with_rotated = signed(Scheme::HmacTimestamped, rotated, &b, now_s());
    assert_eq!(
        server.post_raw("save-game", &b, &with_rotated).await.code,
        401
    );
    assert_eq!(reload("not-the-token").await.0, 401);
    assert_eq!(
        server.post_raw("save-game", &b, &with_rotated).await.code,
        401
    );

    assert_eq!(
        reload(token).await,
        (
            200,
            json!({"status": "reloaded", "sources": 2, "from_environment": [],
                "not_served_until_restart": [], "destinations": 0,
                "destinations_from_environment": [],
                "destinations_not_served_until_restart": []})
        )
    );
    assert_eq!(
        server.post_raw("save-game", &b, &with_rotated).await.code,
        202
    );
    let b = body("api_old");
    let removed = signed(Scheme::HmacTimestamped, SAVE_SECRETS[1], &b, now_s());
    assert_eq!(server.post_raw("save-game", &b, &removed).await.code, 401);

    // A config that no longer loads is refused, and the secrets in force stay.
    std::fs::write(server.config_path(), "listen = ").unwrap();
    let (code, answer) = reload(token).await;
    assert_eq!((code, &answer["error"]), (422, &json!("invalid_config")));
    let b = body("api_kept");
    let kept = signed(Scheme::HmacTimestamped, rotated, &b, now_s());
    assert_eq!(server.post_raw("save-game", &b, &kept).await.code, 202);
}

#[tokio::test]
async fn a_source_over_its_rate_limit_gets_429_with_retry_after() {
    let server = TestServer::in_process()
        .spawn_with("rate_limit_per_s = 2")
        .await;
    let mut codes = Vec::new();
    let mut refused = Vec::new();
    for i in 0..5 {
        let id = format!("rl{i}");
        let body = serde_json::to_vec(&json!({"event_id": id, "event_type": "progress.saved",
            "player_id": "rl", "save_slot": "s", "sequence": i + 1, "idempotency_key": id,
            "data": {}}))
        .unwrap();
        let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());
        let reply = server.post_raw("save-game", &body, &headers).await;
        if reply.code == 429 {
            assert_eq!(reply.body["error"], "rate_limited");
            assert!(reply
                .retry_after
                .as_deref()
                .is_some_and(|s| s.parse::<u64>().unwrap() >= 1));
            refused.push(id.clone());
        }
        codes.push(reply.code);
    }
    assert_eq!(
        &codes[..2],
        [202, 202],
        "a full bucket takes a second's worth: {codes:?}"
    );
    assert!(!refused.is_empty(), "{codes:?}");
    for id in &refused {
        assert!(
            server.status("save-game", id).await.is_none(),
            "a refused delivery stores nothing"
        );
    }
    // Presence has no limit configured: never refused.
    for i in 0..5 {
        let body = json!({"event_id": format!("np{i}"), "user_id": "np", "presence": "BUSY", "sequence_number": i});
        assert_ne!(server.post_presence(&body).await.code, 429);
    }
}

#[tokio::test]
async fn an_event_id_resent_with_other_bodies_spends_the_rate_limit() {
    let server = TestServer::in_process()
        .spawn_with("rate_limit_per_s = 2")
        .await;
    let save = |qty: i64| {
        json!({"event_id": "conflicted", "event_type": "inventory.updated",
               "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "conflicted",
               "data": {"added_items": [{"item_id": "gem", "qty": qty}]}})
    };
    assert_eq!(server.post_save(&save(1)).await.code, 202);
    // An exact resend is free: it is answered as the duplicate it is, however many.
    for _ in 0..4 {
        assert_eq!(server.post_save(&save(1)).await.code, 200);
    }
    // Other bodies under the logged id spend tokens like any delivery: the bucket of two
    // is empty after the first (the original took one).
    let codes: Vec<u16> = {
        let mut codes = Vec::new();
        for qty in 2..6 {
            codes.push(server.post_save(&save(qty)).await.code);
        }
        codes
    };
    assert_eq!(codes[0], 200, "{codes:?}");
    assert!(codes[1..].contains(&429), "{codes:?}");
    assert_eq!(server.count().await, 1);
}
