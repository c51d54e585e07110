//! Issue #12: every outbound client verifies `https://` servers against the system's
//! roots plus `--tls-ca-file`. A TLS front signed by a CA the test makes stands before a
//! real server: `send`, `simulate` and `bench` reach it with the CA and are refused
//! without, naming the certificate problem and exiting non-zero.

use crate::support::tls::TestCa;
use crate::support::{TestServer, PRESENCE_SECRET, SAVE_SECRETS};

/// A server behind an HTTPS front of a fresh test CA; the front's `https://localhost` URL.
async fn behind_https() -> (TestServer, TestCa, String) {
    let server = TestServer::in_process().spawn().await;
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

/// `inhook send` follows no redirect (it would re-send the signed delivery to wherever the
/// answer points), takes no proxy from the environment, and prints a bounded, escaped body.
#[tokio::test]
async fn send_follows_no_redirect_and_prints_a_bounded_escaped_answer() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    let followed = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&followed);
    let target =
        crate::application::serve_application(axum::Router::new().fallback(move || async move {
            counter.fetch_add(1, Ordering::SeqCst);
            "followed"
        }))
        .await;
    let location = format!("http://127.0.0.1:{target}/webhooks/presence");
    let redirector =
        crate::application::serve_application(axum::Router::new().fallback(move || async move {
            let body = format!("\x1b[2J\u{202e}moved{}", "x".repeat(1 << 20));
            (
                axum::http::StatusCode::TEMPORARY_REDIRECT,
                [(axum::http::header::LOCATION, location)],
                body,
            )
        }))
        .await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("event.json");
    std::fs::write(
        &file,
        r#"{"event_id":"evt_redir","user_id":"usr_redir","presence":"BUSY","sequence_number":1}"#,
    )
    .unwrap();
    let url = format!("http://127.0.0.1:{redirector}");
    let file = file.to_str().unwrap().to_owned();
    // Blocking, so off the runtime thread that serves the two applications.
    let (ok, out) = tokio::task::spawn_blocking(move || {
        let words = [
            "send",
            "--url",
            &url,
            "--source",
            "presence",
            "--secret",
            PRESENCE_SECRET,
            &file,
        ];
        let args: Vec<&std::ffi::OsStr> = words.iter().map(std::ffi::OsStr::new).collect();
        // A proxy that is not there: taking it would fail to connect at all.
        let proxy = [
            ("HTTP_PROXY", "http://127.0.0.1:9"),
            ("http_proxy", "http://127.0.0.1:9"),
            ("ALL_PROXY", "http://127.0.0.1:9"),
            ("NO_PROXY", ""),
        ];
        crate::support::run_cli(&args, &proxy)
    })
    .await
    .unwrap();
    assert!(!ok, "{out}");
    assert!(out.starts_with("307 "), "{}", &out[..out.len().min(300)]);
    assert!(out.contains("redirects are not followed"), "{out}");
    assert!(out.contains("\\u{1b}[2J\\u{202e}moved"), "escaped: {out}");
    assert!(
        !out.contains('\x1b') && !out.contains('\u{202e}'),
        "raw control characters"
    );
    assert!(out.len() < 8 << 10, "{} bytes printed", out.len());
    assert_eq!(
        followed.load(Ordering::SeqCst),
        0,
        "the redirect was followed"
    );
}
