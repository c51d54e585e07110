//! What the command line tells a first-time user (docs/api.md, command line): `serve --help`
//! lists what a run needs, commands that read a store never create one, and the start-up
//! lines name the store.

use std::io::BufRead;
use std::process::{Command, Stdio};

use crate::support::{now_s, run_cli, signed, TestServer, PRESENCE_SECRET, SAVE_SECRETS};
use inhook::ingress::signature::Scheme;

#[test]
fn serve_help_lists_the_environment_and_the_admin_token() {
    let (ok, out) = run_cli(&["serve".as_ref(), "--help".as_ref()], &[]);
    assert!(ok, "{out}");
    for needed in [
        "INHOOK_CONFIG",
        "INHOOK_DATABASE",
        "INHOOK_LISTEN",
        "INHOOK_ADMIN_TOKEN",
        "INHOOK_<NAME>_SECRET",
        "INHOOK_ENCRYPTION_KEYS",
        "127.0.0.1:8080",
        "./inhook.db",
        "at least 16 bytes",
    ] {
        assert!(
            out.contains(needed),
            "{needed} missing from serve --help:\n{out}"
        );
    }
}

#[test]
fn a_command_that_reads_a_store_never_creates_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("absent.db");
    let config = dir.path().join("inhook.toml");
    std::fs::write(
        &config,
        format!("database = \"sqlite://{}\"\n", db.display()),
    )
    .unwrap();
    for args in [
        vec!["events"],
        vec!["deliveries", "--destination", "app"],
        vec!["replay", "--source", "presence", "--event-id", "evt_1"],
        vec!["forget", "--source", "presence", "--aggregate", "usr_A"],
        vec!["reset", "--source", "presence", "--aggregate", "usr_A"],
    ] {
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        all.extend([std::ffi::OsStr::new("--config"), config.as_os_str()]);
        let (ok, out) = run_cli(&all, &[]);
        assert!(!ok, "{args:?} succeeded on a missing store:\n{out}");
        assert!(
            out.contains("no inhook store at") && out.contains("absent.db"),
            "{args:?}: {out}"
        );
        assert!(!db.exists(), "{args:?} created {}", db.display());
    }
}

#[tokio::test]
async fn events_prints_fixed_width_times_once_the_store_exists() {
    let server = TestServer::spawn().await;
    for (id, seq) in [("evt_1", 1), ("evt_2", 2)] {
        let reply = server
            .post_presence(&serde_json::json!({"event_id": id, "user_id": "usr_A",
                "presence": "ONLINE", "sequence_number": seq, "timestamp": crate::support::now_s()}))
            .await;
        assert_eq!(reply.code, 200, "{:?}", reply.body);
    }
    let (ok, out) = server.cli(&["events"]);
    assert!(ok, "{out}");
    let rows: Vec<&str> = out.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{out}");
    for row in rows {
        let time = row.split_whitespace().next().unwrap();
        assert_eq!(time.len(), "2026-12-07T14:13:25.100Z".len(), "{row}");
        assert!(time.ends_with('Z') && time.as_bytes()[19] == b'.', "{row}");
    }
}

#[test]
fn the_start_up_lines_name_the_store_without_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("named.db");
    let config = dir.path().join("inhook.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\nadmin_token = \"{}\"\n",
            db.display(),
            "t".repeat(24)
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["serve", "--config"])
        .arg(&config)
        .env_remove("INHOOK_ADMIN_TOKEN")
        .env_remove("INHOOK_DATABASE")
        .env("INHOOK_PRESENCE_SECRET", PRESENCE_SECRET)
        .env("INHOOK_SAVE_GAME_SECRET", SAVE_SECRETS[0])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let second = lines.next().unwrap().unwrap();
    child.kill().unwrap();
    let _ = child.wait();
    assert!(first.starts_with("inhook listening on http://"), "{first}");
    assert_eq!(second, format!("inhook store: sqlite:{}", db.display()));
}

/// The three Slack presets of one app sign with one secret: each source names the variable
/// it reads (`secrets_env`), so it is set once.
#[tokio::test]
async fn sources_can_share_one_secret_variable() {
    const SECRET: &str = "one-slack-signing-secret-for-the-app";
    let sources = r#"
[[sources]]
name = "slack-events"
preset = "slack-events"
secrets_env = "SLACK_SIGNING_SECRET"

[[sources]]
name = "slack-commands"
preset = "slack-commands"
secrets_env = "SLACK_SIGNING_SECRET"
"#;
    let server =
        TestServer::spawn_with_sources_env(sources, &[("SLACK_SIGNING_SECRET", SECRET)]).await;
    let event = br#"{"token":"t","team_id":"T1","api_app_id":"A1","type":"event_callback","event_id":"Ev1","event_time":1796649298,"event":{"type":"app_mention","user":"U1","text":"hi","ts":"1796649298.000100","channel":"C1","event_ts":"1796649298.000100"}}"#;
    let mut headers = signed(Scheme::Slack, SECRET, event, now_s());
    headers.push(("content-type", "application/json".into()));
    let reply = server.post_raw("slack-events", event, &headers).await;
    assert_eq!(reply.code, 202, "{:?}", reply.body);
    let command = b"team_id=T1&command=%2Fdeploy&text=web&trigger_id=tr.1&user_id=U1";
    let mut headers = signed(Scheme::Slack, SECRET, command, now_s());
    headers.retain(|(name, _)| !name.eq_ignore_ascii_case("content-type"));
    headers.push(("content-type", "application/x-www-form-urlencoded".into()));
    let reply = server.post_raw("slack-commands", command, &headers).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    // Another secret verifies on neither.
    let mut headers = signed(
        Scheme::Slack,
        "another-secret-of-the-same-size",
        event,
        now_s(),
    );
    headers.push(("content-type", "application/json".into()));
    assert_eq!(
        server.post_raw("slack-events", event, &headers).await.code,
        401
    );
    assert_eq!(server.count().await, 2);
}

#[test]
fn a_missing_shared_secret_names_its_variable() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("inhook.toml");
    std::fs::write(
        &config,
        format!(
            "database = \"sqlite://{}\"\n[[sources]]\nname = \"slack-events\"\npreset = \"slack-events\"\nsecrets_env = \"SLACK_SIGNING_SECRET_UNSET\"\n",
            dir.path().join("s.db").display()
        ),
    )
    .unwrap();
    let (ok, out) = run_cli(
        &["serve".as_ref(), "--config".as_ref(), config.as_os_str()],
        &[],
    );
    assert!(!ok, "{out}");
    assert!(out.contains("SLACK_SIGNING_SECRET_UNSET"), "{out}");
}

/// `inhook serve &` then `inhook send`, as the docs' examples run: a server that starts
/// listening a moment after send begins still gets the delivery; a port nobody opens fails
/// within the patience, naming the address.
#[test]
fn send_waits_for_a_server_that_is_starting() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("online.json");
    std::fs::write(
        &body,
        r#"{"event_id":"evt_w","user_id":"usr_W","presence":"ONLINE","sequence_number":1}"#,
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let send = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args([
            "send",
            "--url",
            &url,
            "--source",
            "presence",
            "--secret",
            PRESENCE_SECRET,
        ])
        .arg(&body)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The port opens a second later; the one answer it gives is the request's proof.
    std::thread::sleep(std::time::Duration::from_secs(1));
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let (mut conn, _) = listener.accept().unwrap();
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&request).contains("evt_w") {
        let n = std::io::Read::read(&mut conn, &mut buf).unwrap();
        assert!(n > 0, "the request ended early");
        request.extend_from_slice(&buf[..n]);
    }
    std::io::Write::write_all(
        &mut conn,
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 20\r\nconnection: close\r\n\r\n{\"status\":\"applied\"}",
    )
    .unwrap();
    let output = send.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(printed.trim(), r#"200 {"status":"applied"}"#);
    assert!(String::from_utf8_lossy(&request).starts_with("POST /webhooks/presence "));

    drop(listener);
    let started = std::time::Instant::now();
    let (ok, out) = run_cli(
        &[
            "send".as_ref(),
            "--url".as_ref(),
            url.as_ref(),
            "--source".as_ref(),
            "presence".as_ref(),
            "--secret".as_ref(),
            PRESENCE_SECRET.as_ref(),
            body.as_os_str(),
        ],
        &[],
    );
    assert!(!ok, "{out}");
    assert!(out.contains(&format!("127.0.0.1:{port}")), "{out}");
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(5),
        "it waited its patience"
    );
}
