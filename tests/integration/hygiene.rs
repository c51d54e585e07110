//! No secret, signature or admin token ever appears in a log line or an API
//! answer, whatever traffic the server saw.

use inhook::ingress::signature::Scheme;
use serde_json::json;

use crate::support::{now_s, signed, TestServer, PRESENCE_SECRET, SAVE_SECRETS};

const ADMIN_TOKEN: &str = "admin-token-never-logged-7f3a";

#[tokio::test]
async fn logs_and_answers_never_show_secrets_signatures_or_the_token() {
    let server = TestServer::spawn_configured(
        &format!("admin_token = \"{ADMIN_TOKEN}\"\nlog_format = \"json\""),
        "",
    )
    .await;
    let mut signatures = Vec::new();
    let mut answers = String::new();
    for (i, seq) in [1, 1, 0, 2].iter().enumerate() {
        let body = serde_json::to_vec(&json!({"event_id": format!("h{i}"), "user_id": "h",
            "presence": "AWAY", "sequence_number": seq}))
        .unwrap();
        let headers = signed(Scheme::HmacHex, PRESENCE_SECRET, &body, now_s());
        signatures.push(headers[0].1.clone());
        answers.push_str(
            &server
                .post_raw("presence", &body, &headers)
                .await
                .body
                .to_string(),
        );
        // The same body under a forged signature: logged as rejected, signature never shown.
        let forged = signed(Scheme::HmacHex, "forged", &body, now_s());
        signatures.push(forged[0].1.clone());
        answers.push_str(
            &server
                .post_raw("presence", &body, &forged)
                .await
                .body
                .to_string(),
        );
    }
    let save = serde_json::to_vec(&json!({"event_id": "hs", "event_type": "progress.saved",
        "player_id": "h", "save_slot": "a", "sequence": 1, "idempotency_key": "hs", "data": {}}))
    .unwrap();
    for at in [now_s(), now_s() - 3_600] {
        let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[1], &save, at);
        signatures.push(
            headers
                .iter()
                .find(|(n, _)| *n == "x-signature")
                .unwrap()
                .1
                .clone(),
        );
        answers.push_str(
            &server
                .post_raw("save-game", &save, &headers)
                .await
                .body
                .to_string(),
        );
    }
    // Wrong and right tokens on the admin API.
    let client = reqwest::Client::new();
    for token in ["wrong-token", ADMIN_TOKEN] {
        let reply = client
            .get(format!("{}/v1/events/save-game/hs", server.url))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        answers.push_str(&reply.text().await.unwrap());
    }
    server.wait_status("save-game", "hs", "processed").await;

    // A reload through the admin API of a config broken on the line of a secret: refused,
    // and neither the answer nor the log line echoes that line.
    let config = std::fs::read_to_string(server.config_path()).unwrap();
    let broken = config.replacen(
        &format!("\"{}\"", SAVE_SECRETS[0]),
        &format!("\"{}", SAVE_SECRETS[0]),
        1,
    );
    assert_ne!(broken, config);
    std::fs::write(server.config_path(), broken).unwrap();
    let reply = client
        .post(format!("{}/v1/admin/reload", server.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 422);
    answers.push_str(&reply.text().await.unwrap());

    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap();
    assert!(
        log.contains("\"decision\""),
        "the log has decision lines: {log}"
    );
    let mut forbidden: Vec<String> = vec![PRESENCE_SECRET.into(), ADMIN_TOKEN.into()];
    forbidden.extend(SAVE_SECRETS.iter().map(|s| s.to_string()));
    forbidden.extend(signatures);
    for secret in &forbidden {
        // A prefix catches a truncated signature too.
        let needle = &secret[..secret.len().min(16)];
        assert!(!log.contains(needle), "log shows {needle}");
        assert!(!answers.contains(needle), "an answer shows {needle}");
    }
}
