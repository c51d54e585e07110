//! The admin API fails closed: an empty or short token does not start, with none configured
//! one is generated for the run, the opted-in loopback mode trusts only direct loopback
//! clients naming a loopback `Host`, a peer guessing tokens must wait, state-changing calls
//! refuse other origins and non-JSON bodies, and every admin answer is `no-store` and `nosniff`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::support::{TestServer, PRESENCE_SECRET, SAVE_SECRETS};

/// An answer's code, headers and JSON body.
async fn call(request: reqwest::RequestBuilder) -> (u16, HeaderMap, Value) {
    let reply = request.send().await.expect("admin call");
    let code = reply.status().as_u16();
    let headers = reply.headers().clone();
    (code, headers, reply.json().await.unwrap_or(Value::Null))
}

/// Asserts the headers every admin answer carries.
fn assert_admin_headers(headers: &HeaderMap, what: &str) {
    assert_eq!(headers["cache-control"], "no-store", "{what}");
    assert_eq!(headers["x-content-type-options"], "nosniff", "{what}");
}

/// The port of a `http://HOST:PORT` URL.
fn port(url: &str) -> u16 {
    url.rsplit(':').next().unwrap().parse().unwrap()
}

/// Runs `inhook serve` on `config` with `env`; returns its stderr once it exits (it must, within 20 s).
fn serve_expecting_failure(config: &str, env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inhook.toml");
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\n{config}\n",
        dir.path().join("inhook.db").display()
    );
    std::fs::write(&path, &config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("INHOOK_ADMIN_TOKEN")
        .env("INHOOK_PRESENCE_SECRET", PRESENCE_SECRET)
        .env("INHOOK_SAVE_GAME_SECRET", SAVE_SECRETS[0])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("inhook started with config {config:?} and env {env:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test]
async fn an_empty_admin_token_is_a_startup_error_naming_the_key() {
    let stderr = serve_expecting_failure("admin_token = \"\"", &[]);
    assert!(stderr.contains("admin_token is set but empty"), "{stderr}");
    // An empty variable must not silently disable the file's token either.
    let stderr = serve_expecting_failure(
        "admin_token = \"file-admin-token-value\"",
        &[("INHOOK_ADMIN_TOKEN", "")],
    );
    assert!(
        stderr.contains("INHOOK_ADMIN_TOKEN is set but empty"),
        "{stderr}"
    );
    assert!(!stderr.contains("file-admin-token-value"), "{stderr}");
}

#[tokio::test]
async fn without_a_token_only_direct_loopback_clients_are_served() {
    let server = TestServer::in_process().spawn().await;
    let client = reqwest::Client::new();
    let events = format!("{}/v1/events", server.url);

    let (code, headers, _) = call(client.get(&events)).await;
    assert_eq!(code, 200);
    assert_admin_headers(&headers, "200");

    // Behind a forwarder every client is a loopback peer; a proxy header gives it away.
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.5"),
        ("forwarded", "for=203.0.113.5"),
        ("x-real-ip", "203.0.113.5"),
    ] {
        let (code, headers, body) = call(client.get(&events).header(name, value)).await;
        assert_eq!(
            (code, &body["error"]),
            (401, &json!("unauthorized")),
            "{name}"
        );
        assert!(body["detail"].as_str().unwrap().contains("proxy"), "{body}");
        assert_admin_headers(&headers, name);
    }

    // A DNS-rebound page reaches loopback under its own name.
    let port = port(&server.url);
    let (code, headers, body) = call(
        client
            .get(&events)
            .header("host", format!("rebind.example:{port}")),
    )
    .await;
    assert_eq!((code, &body["error"]), (403, &json!("forbidden_host")));
    assert_admin_headers(&headers, "403");
    for host in [format!("localhost:{port}"), format!("[::1]:{port}")] {
        let (code, _, _) = call(client.get(&events).header("host", &host)).await;
        assert_eq!(code, 200, "{host}");
    }

    // An unknown admin path is still an admin answer.
    let (code, headers, _) = call(client.get(format!("{}/v1/nothing-here", server.url))).await;
    assert_eq!(code, 404);
    assert_admin_headers(&headers, "404");
}

#[tokio::test]
async fn an_ipv4_client_of_a_dual_stack_listener_is_loopback() {
    let server = TestServer::spawn_with_env("", &[("INHOOK_LISTEN", "[::]:0")]).await;
    let port = port(&server.url);
    let client = reqwest::Client::new();
    // The IPv4 client arrives as ::ffff:127.0.0.1, the IPv6 one as ::1: both are loopback.
    for base in [
        format!("http://127.0.0.1:{port}"),
        format!("http://[::1]:{port}"),
    ] {
        let (code, _, body) = call(client.get(format!("{base}/v1/events"))).await;
        assert_eq!(code, 200, "{base}: {body}");
    }
}

#[tokio::test]
async fn cross_site_state_changes_are_refused_and_change_nothing() {
    let server = TestServer::in_process().spawn().await;
    let client = reqwest::Client::new();
    let reload = format!("{}/v1/admin/reload", server.url);
    let rotated = "save-test-secret-csrf-rotated";
    server.replace_in_config(SAVE_SECRETS[1], rotated);

    // A cross-site form post: foreign Origin, text/plain body.
    let (code, headers, body) = call(
        client
            .post(&reload)
            .header("origin", "http://evil.example")
            .header("content-type", "text/plain")
            .body("x=1"),
    )
    .await;
    assert_eq!((code, &body["error"]), (403, &json!("forbidden_origin")));
    assert_admin_headers(&headers, "403");
    // The same body from this origin is still not JSON.
    let origin = server.url.clone();
    let (code, _, body) = call(
        client
            .post(&reload)
            .header("origin", &origin)
            .header("content-type", "text/plain")
            .body("x=1"),
    )
    .await;
    assert_eq!(
        (code, &body["error"]),
        (415, &json!("unsupported_media_type"))
    );
    // Neither reloaded: the old secret verifies, the rotated one does not.
    assert!(
        server
            .save_secret_verifies(SAVE_SECRETS[1], "csrf_old")
            .await
    );
    assert!(!server.save_secret_verifies(rotated, "csrf_new").await);

    // A cross-site bulk replay with a JSON body is refused too.
    let (code, _, body) = call(
        client
            .post(format!("{}/v1/replay", server.url))
            .header("origin", "null")
            .json(&json!({"status": "dead"})),
    )
    .await;
    assert_eq!((code, &body["error"]), (403, &json!("forbidden_origin")));

    // From this origin, with no body, the reload goes through.
    let (code, headers, body) = call(client.post(&reload).header("origin", &origin)).await;
    assert_eq!(code, 200, "{body}");
    assert_admin_headers(&headers, "200");
    assert!(server.save_secret_verifies(rotated, "csrf_after").await);
}

#[tokio::test]
async fn with_a_token_the_bearer_decides_and_origins_are_still_checked() {
    let token = "admin-auth-test-token";
    let server = TestServer::in_process()
        .spawn_configured(&format!("admin_token = \"{token}\""), "")
        .await;
    let client = reqwest::Client::new();
    let events = format!("{}/v1/events", server.url);
    for wrong in ["", "admin-auth-test", "admin-auth-test-token-and-more", "x"] {
        let (code, headers, body) = call(client.get(&events).bearer_auth(wrong)).await;
        assert_eq!(
            (code, &body["error"]),
            (401, &json!("unauthorized")),
            "{wrong:?}"
        );
        assert_admin_headers(&headers, "401");
        assert!(!body.to_string().contains(token));
    }
    let (code, _, _) = call(client.get(&events)).await;
    assert_eq!(
        code, 401,
        "loopback alone is not enough once a token is set"
    );
    // A token holder may sit behind a proxy under any name.
    let (code, headers, _) = call(
        client
            .get(&events)
            .bearer_auth(token)
            .header("x-forwarded-for", "203.0.113.5")
            .header("host", "inhook.example"),
    )
    .await;
    assert_eq!(code, 200);
    assert_admin_headers(&headers, "200");
    let (code, _, body) = call(
        client
            .post(format!("{}/v1/admin/reload", server.url))
            .bearer_auth(token)
            .header("origin", "https://evil.example"),
    )
    .await;
    assert_eq!((code, &body["error"]), (403, &json!("forbidden_origin")));
}

/// Starts `inhook serve` with neither `admin_token` nor `admin_open_to_loopback`; answers
/// the child, its URL, the token it printed, the dashboard link and its directory.
fn serve_with_a_generated_token() -> (
    std::process::Child,
    String,
    String,
    String,
    tempfile::TempDir,
) {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inhook.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\n",
            dir.path().join("inhook.db").display()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["serve", "--config"])
        .arg(&path)
        .env_remove("INHOOK_ADMIN_TOKEN")
        .env_remove("INHOOK_ADMIN_OPEN_TO_LOOPBACK")
        .env("INHOOK_PRESENCE_SECRET", PRESENCE_SECRET)
        .env("INHOOK_SAVE_GAME_SECRET", SAVE_SECRETS[0])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("a line").expect("stdout");
    let url = next()
        .strip_prefix("inhook listening on ")
        .expect("the listening line first")
        .to_owned();
    let token = next()
        .strip_prefix("inhook admin token for this run: ")
        .expect("the token line")
        .to_owned();
    let dashboard = next()
        .strip_prefix("inhook dashboard: ")
        .expect("the dashboard line")
        .to_owned();
    (child, url, token, dashboard, dir)
}

#[tokio::test]
async fn with_no_token_configured_one_is_generated_and_loopback_alone_is_refused() {
    let (mut child, url, token, dashboard, dir) = serve_with_a_generated_token();
    assert!(
        token.len() >= 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );
    assert_eq!(dashboard, format!("{url}/#token={token}"));
    let client = reqwest::Client::new();
    let events = format!("{url}/v1/events");
    // A same-host proxy (nginx's default proxy_pass) looks exactly like this: refused.
    let (code, headers, body) = call(client.get(&events).header("host", "127.0.0.1:8080")).await;
    assert_eq!(
        (code, &body["error"]),
        (401, &json!("unauthorized")),
        "{body}"
    );
    assert_admin_headers(&headers, "401");
    let (code, _, _) = call(client.get(&events).bearer_auth(&token)).await;
    assert_eq!(code, 200);
    // The token is not in any file, so a reload of the unchanged file keeps it.
    let (code, _, body) = call(
        client
            .post(format!("{url}/v1/admin/reload"))
            .bearer_auth(&token),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(call(client.get(&events).bearer_auth(&token)).await.0, 200);
    Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .unwrap();
    child.wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("server.log")).unwrap();
    assert!(log.contains("no admin_token configured"), "{log}");
    assert!(!log.contains(&token), "the generated token reached the log");
}

#[tokio::test]
async fn a_short_admin_token_does_not_start() {
    let stderr = serve_expecting_failure("admin_token = \"a\"", &[]);
    assert!(
        stderr.contains("admin_token is shorter than 16 bytes"),
        "{stderr}"
    );
}

#[tokio::test]
async fn a_peer_guessing_tokens_must_wait_and_cannot_tell_a_right_guess() {
    let token = "admin-guessing-test-token";
    let server = TestServer::spawn_configured(&format!("admin_token = \"{token}\""), "").await;
    let client = reqwest::Client::new();
    let events = format!("{}/v1/events", server.url);
    for guess in 0..10 {
        let (code, _, _) = call(client.get(&events).bearer_auth(format!("guess-{guess}"))).await;
        assert_eq!(code, 401, "guess {guess}");
    }
    // Past ten wrong tokens in a row, even the right one is not compared for a while.
    for bearer in ["guess-10", token] {
        let (code, headers, body) = call(client.get(&events).bearer_auth(bearer)).await;
        assert_eq!(
            (code, &body["error"]),
            (429, &json!("too_many_wrong_tokens")),
            "{body}"
        );
        assert_eq!(headers["retry-after"], "1");
        assert_admin_headers(&headers, "429");
    }
    // The lockout's own length (Retry-After: 1), not a condition to poll: a call during it
    // would be part of what it counts.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert_eq!(call(client.get(&events).bearer_auth(token)).await.0, 200);
    // The right token cleared the count: the next wrong ones are free again.
    assert_eq!(call(client.get(&events).bearer_auth("wrong")).await.0, 401);
    assert_eq!(call(client.get(&events).bearer_auth(token)).await.0, 200);
    let log = std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default();
    let refused = log
        .lines()
        .filter(|l| l.contains("admin call refused"))
        .count();
    assert!(refused <= 2, "{refused} refusal lines: they are throttled");
}
