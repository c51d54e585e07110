//! A revoked secret stays revoked: a reload (admin API or SIGHUP) that would drop, rename
//! or re-kind a running source is refused whole, and nothing ever falls back to the
//! secrets read at start. Secrets set in the environment win over the file, and the
//! reload answer says so. A destination's secret rotates the same way, and a reload that
//! changes anything else is refused naming the keys that need a restart.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use std::sync::Arc;

use inhook::ingress::signature::{Scheme, Secret};

use crate::application::{recording_application, Received};
use crate::conformance::delta;
use crate::support::{now_s, TestServer, SAVE_SECRETS};

const TOKEN: &str = "revocation-admin-token";

/// `POST /v1/admin/reload` with the admin token: code and body.
async fn reload(server: &TestServer) -> (u16, Value) {
    let reply = reqwest::Client::new()
        .post(format!("{}/v1/admin/reload", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    let code = reply.status().as_u16();
    (code, reply.json().await.unwrap())
}

/// Rewrites the config file through `edit`.
fn edit_config(server: &TestServer, edit: impl FnOnce(String) -> String) {
    let config = std::fs::read_to_string(server.config_path()).unwrap();
    let edited = edit(config.clone());
    assert_ne!(edited, config, "the edit changed nothing");
    std::fs::write(server.config_path(), edited).unwrap();
}

/// Asserts a refused reload: 422 `invalid_config` whose detail holds `needle`.
async fn assert_refused(server: &TestServer, needle: &str) {
    let (code, body) = reload(server).await;
    assert_eq!(
        (code, &body["error"]),
        (422, &json!("invalid_config")),
        "{body}"
    );
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains(needle), "{detail}");
    assert!(!detail.contains("save-test-secret"), "a secret in {detail}");
}

/// Waits until a line of the server log holds all of `needles`.
async fn wait_for_log(server: &TestServer, needles: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
        if log.lines().any(|l| needles.iter().all(|n| l.contains(n))) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {needles:?} in the log: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_revoked_secret_never_comes_back_when_a_source_is_dropped_or_renamed() {
    let server = TestServer::spawn_configured(&format!("admin_token = \"{TOKEN}\""), "").await;
    let (revoked, rotated) = (SAVE_SECRETS[1], "save-test-secret-rotated-in");
    assert!(server.save_secret_verifies(revoked, "rv_before").await);

    // Rotate A→B and reload: A is refused.
    let running = std::fs::read_to_string(server.config_path()).unwrap();
    edit_config(&server, |c| c.replace(revoked, rotated));
    let rotated_config = std::fs::read_to_string(server.config_path()).unwrap();
    let (code, body) = reload(&server).await;
    assert_eq!(
        (code, body),
        (
            200,
            json!({"status": "reloaded", "sources": 2, "from_environment": [],
                "not_served_until_restart": [], "destinations": 0,
                "destinations_from_environment": [],
                "destinations_not_served_until_restart": []})
        )
    );
    assert!(!server.save_secret_verifies(revoked, "rv_rotated_a").await);
    assert!(server.save_secret_verifies(rotated, "rv_rotated_b").await);

    // Drop the source, then rename it: each reload is refused and changes nothing.
    let save_table = "[[sources]]\nname = \"save-game\"\nkind = \"save-game\"";
    edit_config(&server, |c| c[..c.find(save_table).unwrap()].to_owned());
    assert!(!std::fs::read_to_string(server.config_path())
        .unwrap()
        .contains("save-game"));
    assert_refused(&server, "\"save-game\" is running but missing").await;
    assert!(!server.save_secret_verifies(revoked, "rv_dropped_a").await);
    assert!(server.save_secret_verifies(rotated, "rv_dropped_b").await);
    // SIGHUP takes the same path.
    server.hangup();
    wait_for_log(&server, &["SIGHUP", "config not reloaded", "save-game"]).await;
    assert!(!server.save_secret_verifies(revoked, "rv_hup_a").await);
    assert!(server.save_secret_verifies(rotated, "rv_hup_b").await);

    std::fs::write(
        server.config_path(),
        rotated_config.replace("name = \"save-game\"", "name = \"save-game-2\""),
    )
    .unwrap();
    assert_refused(&server, "\"save-game\" is running but missing").await;
    assert!(!server.save_secret_verifies(revoked, "rv_renamed_a").await);
    assert!(server.save_secret_verifies(rotated, "rv_renamed_b").await);

    // A changed kind or signature scheme cannot be taken without a restart either.
    std::fs::write(
        server.config_path(),
        rotated_config.replace(
            "signature = \"hmac-timestamped\"",
            "signature = \"hmac-hex\"",
        ),
    )
    .unwrap();
    assert_refused(&server, "signature changed").await;
    assert!(server.save_secret_verifies(rotated, "rv_scheme_b").await);

    // A new source is reported, not silently ignored, and not served until a restart.
    std::fs::write(
        server.config_path(),
        format!(
            "{rotated_config}\n[[sources]]\nname = \"newcomer\"\nkind = \"presence\"\nsecrets = [\"newcomer-secret\"]\n"
        ),
    )
    .unwrap();
    let (code, body) = reload(&server).await;
    assert_eq!(
        (code, &body["not_served_until_restart"]),
        (200, &json!(["newcomer"]))
    );
    assert_eq!(server.post_raw("newcomer", b"{}", &[]).await.code, 404);

    // Putting the start-up config back is an explicit re-grant, and only that brings A back.
    std::fs::write(server.config_path(), running).unwrap();
    assert_eq!(reload(&server).await.0, 200);
    assert!(server.save_secret_verifies(revoked, "rv_regranted_a").await);
}

#[tokio::test]
async fn secrets_from_the_environment_win_and_the_reload_says_so() {
    let env_secret = "save-env-secret-wins";
    let server = TestServer::spawn_with_env(
        &format!("admin_token = \"{TOKEN}\""),
        &[("INHOOK_SAVE_GAME_SECRET", env_secret)],
    )
    .await;
    assert!(server.save_secret_verifies(env_secret, "env_before").await);
    assert!(
        !server
            .save_secret_verifies(SAVE_SECRETS[0], "env_file_before")
            .await
    );

    let edited = "save-test-secret-edited-in-file";
    edit_config(&server, |c| c.replace(SAVE_SECRETS[0], edited));
    let (code, body) = reload(&server).await;
    assert_eq!(
        (code, body),
        (
            200,
            json!({"status": "reloaded", "sources": 2, "from_environment": ["save-game"],
                "not_served_until_restart": [], "destinations": 0,
                "destinations_from_environment": [],
                "destinations_not_served_until_restart": []})
        )
    );
    assert!(server.save_secret_verifies(env_secret, "env_after").await);
    assert!(!server.save_secret_verifies(edited, "env_file_after").await);
}

/// Posts one save event and waits until the application received it; answers its request.
async fn forward_one(
    server: &TestServer,
    received: &Received,
    event_id: &str,
    sequence: i64,
) -> (axum::http::HeaderMap, Vec<u8>) {
    let before = received.lock().unwrap().len();
    assert_eq!(
        server
            .post_save(&delta(event_id, "slot_rot", sequence, 1))
            .await
            .code,
        202
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(request) = received.lock().unwrap().get(before) {
            return request.clone();
        }
        assert!(Instant::now() < deadline, "{event_id} was never forwarded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether `request` verifies with exactly the destination secret `secret`.
fn signed_with(request: &(axum::http::HeaderMap, Vec<u8>), secret: &str) -> bool {
    inhook::ingress::signature::verify(
        Scheme::StandardWebhooks,
        &request.0,
        &request.1,
        &[Secret::new(secret)],
        now_s(),
        300,
    )
    .is_ok()
}

#[tokio::test]
async fn a_destination_secret_rotates_on_reload_and_sighup() {
    let (first, second, third) = (
        "whsec_Zmlyc3QtZGVzdGluYXRpb24tc2VjcmV0",
        "whsec_c2Vjb25kLWRlc3RpbmF0aW9uLXNlY3JldA==",
        "whsec_dGhpcmQtZGVzdGluYXRpb24tc2VjcmV0",
    );
    let received: Received = Arc::default();
    let port = recording_application(&received).await;
    let server = TestServer::spawn_top_and_sources(
        &format!("admin_token = \"{TOKEN}\""),
        &format!(
            "[[destinations]]\nname = \"app\"\nurl = \"http://127.0.0.1:{port}/hooks\"\n\
             sources = [\"save-game\"]\nsecret = \"{first}\"\n"
        ),
    )
    .await;
    let before = forward_one(&server, &received, "rot-1", 1).await;
    assert!(signed_with(&before, first));

    edit_config(&server, |c| c.replace(first, second));
    let (code, body) = reload(&server).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        (
            &body["destinations"],
            &body["destinations_from_environment"],
            &body["destinations_not_served_until_restart"]
        ),
        (&json!(1), &json!([]), &json!([]))
    );
    assert!(!body.to_string().contains("whsec_"), "{body}");
    let after = forward_one(&server, &received, "rot-2", 2).await;
    assert!(signed_with(&after, second), "the new secret signs");
    assert!(!signed_with(&after, first), "the old one never again");

    // SIGHUP takes the same path.
    edit_config(&server, |c| c.replace(second, third));
    server.hangup();
    wait_for_log(&server, &["SIGHUP", "secrets reloaded", "destinations=1"]).await;
    let hup = forward_one(&server, &received, "rot-3", 3).await;
    assert!(signed_with(&hup, third));
    assert!(!signed_with(&hup, second) && !signed_with(&hup, first));
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    assert!(!log.contains("whsec_"), "a secret in the log");
}

#[tokio::test]
async fn a_reload_that_changes_more_than_secrets_names_the_keys_and_changes_nothing() {
    let server = TestServer::in_process()
        .spawn_configured(
            &format!("admin_token = \"{TOKEN}\"\nmask_fields = [\"coins\"]"),
            "",
        )
        .await;
    let running = std::fs::read_to_string(server.config_path()).unwrap();
    let top = |extra: &str| running.replacen("[[sources]]", &format!("{extra}\n[[sources]]"), 1);
    for (edited, named) in [
        (
            running.replace(TOKEN, "a-different-admin-token"),
            "admin_token changed",
        ),
        (
            running.replace("[\"coins\"]", "[\"coins\", \"gems\"]"),
            "mask_fields changed",
        ),
        (top("keep_headers = [\"x-trace\"]"), "keep_headers changed"),
        (
            running.replace(
                "name = \"save-game\"\nkind = \"save-game\"",
                "name = \"save-game\"\nkind = \"save-game\"\nmax_backlog = 7",
            ),
            "source \"save-game\": max_backlog changed",
        ),
    ] {
        assert_ne!(edited, running, "{named}: the edit changed nothing");
        std::fs::write(server.config_path(), edited).unwrap();
        assert_refused(&server, named).await;
        let detail = reload(&server).await.1["detail"].to_string();
        assert!(detail.contains("restart"), "{detail}");
        assert!(
            !detail.contains(TOKEN) && !detail.contains("a-different"),
            "{detail}"
        );
    }
    // The token in force is still the one read at start.
    let events = reqwest::Client::new()
        .get(format!("{}/v1/events", server.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    std::fs::write(server.config_path(), running).unwrap();
    assert_eq!(reload(&server).await.0, 200);
}
