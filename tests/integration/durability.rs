//! Durability (G2), store outages, startup errors and the command line.

use std::process::Command;

use serde_json::json;

use crate::support::{Backend, TestServer, PRESENCE_SECRET};

#[tokio::test]
async fn an_event_answered_202_survives_sigkill_and_is_applied_after_restart() {
    let mut server = TestServer::spawn().await;
    let body = json!({"event_id": "evt_k", "event_type": "inventory.updated", "player_id": "p9",
        "save_slot": "s1", "sequence": 1, "idempotency_key": "p9:s1:1",
        "data": {"added_items": [{"item_id": "old_stamp", "qty": 2}]}});
    let reply = server.post_save(&body).await;
    assert_eq!(reply.code, 202);
    server.kill9();

    assert!(
        server.status("save-game", "evt_k").await.is_some(),
        "the answered event is in the log after SIGKILL"
    );

    server.restart();
    let state = server
        .wait_for("/v1/saves/p9/s1", |r| {
            r.code == 200 && r.body["last_sequence"] == 1
        })
        .await;
    assert_eq!(state.body["inventory"], json!({"old_stamp": 2}));
    assert_eq!(
        server.status("save-game", "evt_k").await.unwrap().0,
        "processed"
    );
    // A publisher retry after the restart is still a duplicate.
    assert_eq!(server.post_save(&body).await.body["status"], "duplicate");
}

#[tokio::test]
async fn a_locked_store_answers_503_with_retry_after_and_recovers() {
    let server = TestServer::spawn().await;
    let body =
        json!({"event_id": "evt_l", "user_id": "u", "presence": "AWAY", "sequence_number": 1});
    let lock = server.lock_store().await;
    let reply = server.post_presence(&body).await;
    assert_eq!(reply.code, 503);
    assert_eq!(reply.body["error"], "store_unavailable");
    assert!(reply.retry_after.is_some(), "503 carries Retry-After");
    lock.release().await;
    assert_eq!(server.count().await, 0);
    let reply = server.post_presence(&body).await;
    assert_eq!(
        (reply.code, &reply.body["status"]),
        (200, &json!("applied"))
    );
}

#[test]
fn a_missing_secret_is_a_clear_startup_error() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .arg("serve")
        .current_dir(dir.path())
        .env_remove("INHOOK_PRESENCE_SECRET")
        .env_remove("INHOOK_SAVE_GAME_SECRET")
        .env("INHOOK_LISTEN", "127.0.0.1:0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("INHOOK_PRESENCE_SECRET"), "{stderr}");
    assert!(
        !dir.path().join("inhook.db").exists(),
        "nothing created on a config error"
    );
}

#[tokio::test]
async fn inhook_send_signs_with_the_source_scheme() {
    let server = TestServer::spawn().await;
    let file = server.dir().join("event.json");
    std::fs::write(
        &file,
        r#"{"event_id":"evt_cli","user_id":"usr_cli","presence":"BUSY","sequence_number":3}"#,
    )
    .unwrap();
    let send = |secret: &str| {
        Command::new(env!("CARGO_BIN_EXE_inhook"))
            .args([
                "send",
                "--url",
                &server.url,
                "--source",
                "presence",
                "--secret",
                secret,
            ])
            .arg(&file)
            .output()
            .unwrap()
    };
    let ok = send(PRESENCE_SECRET);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(String::from_utf8_lossy(&ok.stdout).starts_with("200 "));
    let bad = send("wrong");
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stdout).contains("invalid_signature"));
    assert_eq!(
        server.get("/v1/presence/usr_cli").await.body["status"],
        "BUSY"
    );
}

#[tokio::test]
async fn inhook_migrate_creates_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let backend = Backend::fresh().await;
    let url = backend.url(dir.path());
    let output = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .arg("migrate")
        .env("INHOOK_DATABASE", &url)
        .env_remove("INHOOK_PRESENCE_SECRET")
        .env_remove("INHOOK_SAVE_GAME_SECRET")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let config = inhook::config::Config::from_parts(
        Some(&format!("database = \"{url}\"\n[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]")),
        &Default::default(),
    )
    .unwrap();
    // Without the migration the tables would not exist and this would fail.
    let store = inhook::runtime::app::connect_store(&config).unwrap();
    let page = store.events(&Default::default(), 10, None).await.unwrap();
    assert!(page.items.is_empty());
    backend.drop_database().await;
}

#[tokio::test]
async fn a_new_sqlite_store_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    if Backend::fresh_kind() != "sqlite" {
        return; // PostgreSQL keeps no file of ours.
    }
    let server = TestServer::spawn().await;
    assert_eq!(
        server
            .post_presence(
                &json!({"event_id": "evt_mode", "user_id": "u", "presence": "ONLINE",
                "sequence_number": 1})
            )
            .await
            .code,
        200
    );
    // The raw bodies are in the database and its write-ahead log: neither is world-readable.
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", server.db_path().display());
        let mode = std::fs::metadata(&path).expect(&path).permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{path} has mode {:o}", mode & 0o777);
    }
}
