//! Issue #12: every outbound client verifies `https://` servers against the system's
//! roots plus `--tls-ca-file`. A TLS front signed by a CA the test makes stands before a
//! real server: `send`, `simulate` and `bench` reach it with the CA and are refused
//! without, naming the certificate problem and exiting non-zero.

use crate::support::tls::TestCa;
use crate::support::{TestServer, PRESENCE_SECRET, SAVE_SECRETS};

/// A server behind an HTTPS front of a fresh test CA; the front's `https://localhost` URL.
async fn behind_https() -> (TestServer, TestCa, String) {
    let server = TestServer::spawn().await;
    let ca = TestCa::new();
    let upstream = server.url.strip_prefix("http://").unwrap().parse().unwrap();
    let port = ca.https_front(upstream);
    (server, ca, format!("https://localhost:{port}"))
}

/// Asserts that a run failed on the certificate check, and said so.
fn refused_by_certificate(ok: bool, out: &str) {
    assert!(!ok, "succeeded without the CA:\n{out}");
    assert!(
        out.contains("the server's certificate is refused") && out.contains("UnknownIssuer"),
        "{out}"
    );
}

#[tokio::test]
async fn send_reaches_an_https_server_with_its_ca_only() {
    let (server, ca, url) = behind_https().await;
    let ca_file = ca.file();
    let ca_file = ca_file.to_str().unwrap();
    let file = server.dir().join("event.json");
    let send = |event: &str, extra: &[&str]| {
        std::fs::write(
            &file,
            format!(
                r#"{{"event_id":"{event}","user_id":"usr_tls","presence":"BUSY","sequence_number":{}}}"#,
                event.len()
            ),
        )
        .unwrap();
        let mut args = vec![
            "send",
            "--url",
            &url,
            "--source",
            "presence",
            "--secret",
            PRESENCE_SECRET,
        ];
        args.extend_from_slice(extra);
        args.push(file.to_str().unwrap());
        server.cli(&args)
    };

    let (ok, out) = send("evt_refused", &[]);
    refused_by_certificate(ok, &out);
    assert!(out.contains(&url), "the URL is named: {out}");
    assert_eq!(server.count().await, 0, "nothing reached the server");

    let (ok, out) = send("evt_tls", &["--tls-ca-file", ca_file]);
    assert!(ok && out.starts_with("200 "), "{out}");
    assert_eq!(
        server.get("/v1/presence/usr_tls").await.body["status"],
        "BUSY"
    );
    assert_eq!(
        server.status("presence", "evt_tls").await.unwrap().0,
        "processed"
    );
}

#[tokio::test]
async fn the_ca_file_may_come_from_the_environment() {
    let (server, ca, url) = behind_https().await;
    let file = server.dir().join("event.json");
    std::fs::write(
        &file,
        r#"{"event_id":"evt_env","user_id":"usr_env","presence":"AWAY","sequence_number":1}"#,
    )
    .unwrap();
    let config = server.config_path();
    let args: Vec<&std::ffi::OsStr> = [
        "send",
        "--url",
        &url,
        "--source",
        "presence",
        "--secret",
        PRESENCE_SECRET,
        "--config",
    ]
    .into_iter()
    .map(std::ffi::OsStr::new)
    .chain([config.as_os_str(), file.as_os_str()])
    .collect();
    let ca_file = ca.file();
    let (ok, out) =
        crate::support::run_cli(&args, &[("INHOOK_TLS_CA_FILE", ca_file.to_str().unwrap())]);
    assert!(ok && out.starts_with("200 "), "{out}");
    assert_eq!(
        server.get("/v1/presence/usr_env").await.body["status"],
        "AWAY"
    );
}

#[tokio::test]
async fn simulate_reaches_an_https_server_with_its_ca_only() {
    let (server, ca, url) = behind_https().await;
    let ca_file = ca.file();
    let simulate = |extra: &[&str]| {
        let mut args = vec![
            "simulate",
            "--url",
            &url,
            "--events",
            "20",
            "--aggregates",
            "4",
            "--seed",
            "12",
            "--presence-secret",
            PRESENCE_SECRET,
            "--save-secret",
            SAVE_SECRETS[0],
        ];
        args.extend_from_slice(extra);
        server.cli(&args)
    };

    let (ok, out) = simulate(&[]);
    refused_by_certificate(ok, &out);
    assert_eq!(server.count().await, 0, "nothing reached the server");

    let (ok, out) = simulate(&["--tls-ca-file", ca_file.to_str().unwrap()]);
    assert!(ok, "{out}");
    assert!(out.contains("failures:    0"), "{out}");
    assert_eq!(server.count().await, 20);
}

#[tokio::test]
async fn bench_reaches_an_https_server_with_its_ca_only() {
    let (server, ca, url) = behind_https().await;
    let ca_file = ca.file();
    let bench = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "--url",
            &url,
            "--events",
            "12",
            "--aggregates",
            "3",
            "--connections",
            "2",
            "--secret",
            SAVE_SECRETS[0],
        ];
        args.extend_from_slice(extra);
        server.cli(&args)
    };

    let (ok, out) = bench(&[]);
    refused_by_certificate(ok, &out);
    assert_eq!(server.count().await, 0, "nothing reached the server");

    let (ok, out) = bench(&["--tls-ca-file", ca_file.to_str().unwrap(), "--wait-applied"]);
    assert!(ok, "{out}");
    assert!(out.contains("bench: 12 requests"), "{out}");
    assert_eq!(server.count().await, 12);
}
