//! The configuration's layers through the real loader (docs/configuration.md): for each
//! section that has `INHOOK_*` variables, the variable wins over the file's key in a real
//! `inhook serve`; and a reload of the file refuses a changed key of any section as needing
//! a restart, while a rotated secret is applied.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

use crate::support::{TestServer, PRESENCE_SECRET, SAVE_SECRETS};

/// The admin token the file sets, which the environment's replaces.
const FILE_TOKEN: &str = "file-admin-token-0123456789";
/// The admin token `INHOOK_ADMIN_TOKEN` sets.
const ENV_TOKEN: &str = "env-admin-token-0123456789";

/// Each section's variable set against its key in the file: `listen` (HTTP; the file's
/// address is not on this host, so only the variable's can be bound), `database` (store),
/// `admin_token` (admin) and `log_format` (observability). The processing section has no
/// variable (docs/configuration.md, environment variables).
#[tokio::test]
async fn each_sections_variable_wins_over_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let (file_db, env_db) = (dir.path().join("file.db"), dir.path().join("env.db"));
    let config = dir.path().join("inhook.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"192.0.2.1:9\"\ndatabase = \"sqlite://{}\"\nadmin_token = \"{FILE_TOKEN}\"\n\
             log_format = \"text\"\n",
            file_db.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["serve", "--config"])
        .arg(&config)
        .env("INHOOK_LISTEN", "127.0.0.1:0")
        .env("INHOOK_DATABASE", format!("sqlite://{}", env_db.display()))
        .env("INHOOK_ADMIN_TOKEN", ENV_TOKEN)
        .env("INHOOK_LOG_FORMAT", "json")
        .env("INHOOK_PRESENCE_SECRET", PRESENCE_SECRET)
        .env("INHOOK_SAVE_GAME_SECRET", SAVE_SECRETS[0])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let stderr = child.stderr.take().unwrap();
    let listening = stdout.next().unwrap().unwrap();
    let store = stdout.next().unwrap().unwrap();
    let url = listening
        .strip_prefix("inhook listening on ")
        .unwrap_or_else(|| panic!("{listening}"))
        .to_owned();
    let client = reqwest::Client::new();
    let status = |token: &'static str| {
        let request = client.get(format!("{url}/v1/events")).bearer_auth(token);
        async move { request.send().await.unwrap().status().as_u16() }
    };
    let (with_env_token, with_file_token) = (status(ENV_TOKEN).await, status(FILE_TOKEN).await);
    child.kill().unwrap();
    let _ = child.wait();
    let log: Vec<String> = BufReader::new(stderr)
        .lines()
        .map_while(Result::ok)
        .collect();

    assert!(url.starts_with("http://127.0.0.1:"), "{listening}");
    assert_eq!(store, format!("inhook store: sqlite:{}", env_db.display()));
    assert!(env_db.exists() && !file_db.exists());
    assert_eq!((with_env_token, with_file_token), (200, 401));
    assert!(!log.is_empty(), "no log line");
    for line in &log {
        let parsed: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        assert!(parsed.is_object(), "{line}");
    }
}

const TOKEN: &str = "configuration-admin-token";

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

/// A key of each section changed in the file, with a rotated secret, is refused naming the
/// key, and the secret in force stays; the rotated secret alone is then applied.
#[tokio::test]
async fn a_changed_key_of_any_section_needs_a_restart_and_a_secret_rotates() {
    let server = TestServer::spawn_configured(&format!("admin_token = \"{TOKEN}\""), "").await;
    let (running, rotated) = (SAVE_SECRETS[1], "save-test-secret-rotated-in");
    let original = std::fs::read_to_string(server.config_path()).unwrap();
    let with_rotation = original.replace(running, rotated);
    assert_ne!(with_rotation, original);
    for (section, line) in [
        ("http", "max_body_bytes = 1024"),
        ("store", "pool_size = 3"),
        ("admin", "stream_buffer = 7"),
        ("processing", "workers = 9"),
        ("observability", "alert_tick_ms = 123"),
    ] {
        let key = line.split(' ').next().unwrap();
        // Top-level keys go before the first table: at the top of the file.
        std::fs::write(server.config_path(), format!("{line}\n{with_rotation}")).unwrap();
        let (code, body) = reload(&server).await;
        assert_eq!(
            (code, &body["error"]),
            (422, &json!("invalid_config")),
            "{section}: {body}"
        );
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&format!("{key} changed")) && detail.contains("needs a restart"),
            "{section}: {detail}"
        );
        assert!(!detail.contains(rotated), "a secret in {detail}");
        assert!(
            server
                .save_secret_verifies(running, &format!("cf_kept_{section}"))
                .await
        );
        assert!(
            !server
                .save_secret_verifies(rotated, &format!("cf_not_yet_{section}"))
                .await
        );
    }
    std::fs::write(server.config_path(), &with_rotation).unwrap();
    let (code, body) = reload(&server).await;
    assert_eq!((code, &body["status"]), (200, &json!("reloaded")), "{body}");
    assert!(!server.save_secret_verifies(running, "cf_revoked").await);
    assert!(server.save_secret_verifies(rotated, "cf_rotated").await);
}
