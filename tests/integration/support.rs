//! Spawns the real `inhook` binary on a random port with a fresh SQLite
//! database, and talks to it over HTTP. Server logs go to a file in the
//! test's directory; set `TEST_LOG=1` to see them on stderr instead.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inhook::signature::{self, Scheme, Secret};
use serde_json::Value;

/// The presence source's secret in every test server.
pub const PRESENCE_SECRET: &str = "presence-test-secret-1";
/// The save-game source's secrets: the first is the one tests sign with.
pub const SAVE_SECRETS: [&str; 2] = ["save-test-secret-new", "save-test-secret-old"];

/// A running `inhook serve` and its database.
pub struct TestServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    client: reqwest::Client,
    extra: String,
    top: String,
}

/// One HTTP answer: code and JSON body (null when the body is not JSON).
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub code: u16,
    /// The parsed body.
    pub body: Value,
    /// The `Retry-After` header, if any.
    pub retry_after: Option<String>,
}

impl TestServer {
    /// Starts a server with the two seed sources; `extra` is appended to each source table's settings.
    pub async fn spawn() -> Self {
        Self::spawn_with("").await
    }

    /// Starts a server whose save-game source gets `extra` TOML lines (e.g. `hold_timeout_s = 1`).
    pub async fn spawn_with(extra: &str) -> Self {
        Self::spawn_configured("", extra).await
    }

    /// Starts a server with `top` TOML lines at the top level and `extra` in the save-game source.
    pub async fn spawn_configured(top: &str, extra: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Self {
            dir,
            child: None,
            url: String::new(),
            client: reqwest::Client::new(),
            extra: extra.to_owned(),
            top: top.to_owned(),
        };
        server.write_config("127.0.0.1:0");
        server.start();
        server
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.dir.path().join("inhook.db")
    }

    /// The config file.
    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("inhook.toml")
    }

    fn write_config(&self, listen: &str) {
        let config = format!(
            r#"
listen = "{listen}"
database = "sqlite://{db}"
busy_timeout_ms = 300
{top}

[[sources]]
name = "presence"
kind = "presence"
mode = "sync"
signature = "hmac-hex"
secrets = ["{PRESENCE_SECRET}"]

[[sources]]
name = "save-game"
kind = "save-game"
mode = "async"
signature = "hmac-timestamped"
tolerance_s = 300
secrets = ["{s0}", "{s1}"]
{extra}
"#,
            db = self.db_path().display(),
            s0 = SAVE_SECRETS[0],
            s1 = SAVE_SECRETS[1],
            extra = self.extra,
            top = self.top,
        );
        std::fs::write(self.config_path(), config).expect("write config");
    }

    fn start(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("server.log"))
            .expect("log file");
        let stderr = if std::env::var_os("TEST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::from(log)
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
            .arg("serve")
            .arg("--config")
            .arg(self.config_path())
            .env_remove("INHOOK_PRESENCE_SECRET")
            .env_remove("INHOOK_SAVE_GAME_SECRET")
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("spawn inhook");
        let stdout = child.stdout.take().expect("stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read ready line");
        let url = line
            .trim()
            .strip_prefix("inhook listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}; see server.log"))
            .to_owned();
        self.url = url;
        self.child = Some(child);
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited successfully.
    pub fn terminate(&mut self) -> bool {
        let mut child = self.child.take().expect("server running");
        Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("kill -TERM");
        child.wait().expect("reap").success()
    }

    /// Runs the inhook binary with `args` and this server's config; returns (success, stdout).
    pub fn cli(&self, args: &[&str]) -> (bool, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_inhook"))
            .args(args)
            .arg("--config")
            .arg(self.config_path())
            .output()
            .expect("run inhook");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned()
                + &String::from_utf8_lossy(&output.stderr),
        )
    }

    /// Kills the process with SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
        }
    }

    /// Starts the server again on the same database (on a new port).
    pub fn restart(&mut self) {
        self.kill9();
        self.start();
    }

    /// Posts raw bytes with the given headers to `/webhooks/{source}`.
    pub async fn post_raw(&self, source: &str, body: &[u8], headers: &[(&str, String)]) -> Reply {
        let mut request = self
            .client
            .post(format!("{}/webhooks/{source}", self.url))
            .body(body.to_vec());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        reply(request.send().await.expect("POST")).await
    }

    /// Signs a presence body with the source's secret and posts it.
    pub async fn post_presence(&self, body: &Value) -> Reply {
        let bytes = serde_json::to_vec(body).unwrap();
        let headers = signed(Scheme::HmacHex, PRESENCE_SECRET, &bytes, now_s());
        self.post_raw("presence", &bytes, &headers).await
    }

    /// Signs a save-game body with the source's first secret and posts it.
    pub async fn post_save(&self, body: &Value) -> Reply {
        let bytes = serde_json::to_vec(body).unwrap();
        let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &bytes, now_s());
        self.post_raw("save-game", &bytes, &headers).await
    }

    /// GETs a path of the read API.
    pub async fn get(&self, path: &str) -> Reply {
        reply(
            self.client
                .get(format!("{}{path}", self.url))
                .send()
                .await
                .expect("GET"),
        )
        .await
    }

    /// Polls `path` until `done` holds for its answer, or panics after 10 s.
    pub async fn wait_for(&self, path: &str, done: impl Fn(&Reply) -> bool) -> Reply {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let reply = self.get(path).await;
            if done(&reply) {
                return reply;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting on {path}: last {reply:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Opens the server's SQLite database directly.
    pub fn db(&self) -> rusqlite::Connection {
        let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
        conn.busy_timeout(Duration::from_secs(5)).unwrap();
        conn
    }

    /// Number of rows in the event log.
    pub fn event_count(&self) -> i64 {
        self.db()
            .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
            .unwrap()
    }

    /// `(status, dead_reason)` of one logged event.
    pub fn event_status(&self, source: &str, event_id: &str) -> Option<(String, Option<String>)> {
        use rusqlite::OptionalExtension;
        self.db()
            .query_row(
                "SELECT status, dead_reason FROM events WHERE source = ?1 AND event_id = ?2",
                [source, event_id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()
            .unwrap()
    }

    /// The directory holding the config, database and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.kill9();
    }
}

async fn reply(response: reqwest::Response) -> Reply {
    let code = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.expect("body");
    Reply {
        code,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        retry_after,
    }
}

/// Headers for a body signed with `scheme` at `at`, plus the JSON content type.
pub fn signed(scheme: Scheme, secret: &str, body: &[u8], at: i64) -> Vec<(&'static str, String)> {
    let mut headers = signature::sign(scheme, body, &Secret::new(secret), at);
    headers.push(("content-type", "application/json".into()));
    headers
}

/// Now in unix seconds.
pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}
