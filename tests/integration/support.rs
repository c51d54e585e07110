//! Runs the real server on a random port with a fresh database, and talks to
//! it over HTTP: as a child process running the `inhook` binary, or (for tests
//! that need no process of their own, [`TestServer::in_process`]) as
//! `inhook::runtime::app::Application` on a thread of the test process. The store is SQLite unless
//! `INHOOK_TEST_DATABASE` names a PostgreSQL server (e.g.
//! `postgres://root@127.0.0.1:5432/test`): then every server gets a fresh
//! database of its own there, dropped afterwards. Server logs go to a file in
//! the test's directory; set `TEST_LOG=1` to see them on stderr instead.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use std::sync::Arc;

use inhook::config::Config;
use inhook::ingress::signature::{self, Scheme, Secret};
use inhook::store::{EventFilter, EventRecord, Store};
use serde_json::Value;

pub mod tcp_proxy;
pub mod tls;

/// The presence source's secret in every test server.
pub const PRESENCE_SECRET: &str = "presence-test-secret-1";
/// The save-game source's secrets: the first is the one tests sign with.
pub const SAVE_SECRETS: [&str; 2] = ["save-test-secret-new", "save-test-secret-old"];

/// A running `inhook serve` and its database.
pub struct TestServer {
    dir: tempfile::TempDir,
    child: Option<Child>,
    /// Set when the server runs in this process rather than as a child.
    in_process: bool,
    /// The in-process server, while it runs.
    running: Option<InProcessServer>,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    client: reqwest::Client,
    extra: String,
    top: String,
    sources: String,
    backend: Backend,
    owns_database: bool,
    store: tokio::sync::OnceCell<Arc<dyn Store>>,
    env: Vec<(String, String)>,
}

/// The store a test server runs on.
#[derive(Debug, Clone)]
pub enum Backend {
    /// A SQLite file in the test's directory.
    Sqlite,
    /// A fresh database on the PostgreSQL server of `INHOOK_TEST_DATABASE`.
    Postgres {
        /// URL of the server's existing database, used to create and drop ours.
        admin_url: String,
        /// Our database's name.
        database: String,
    },
}

impl Backend {
    /// A fresh store for one test server, as chosen by `INHOOK_TEST_DATABASE`.
    pub async fn fresh() -> Self {
        let Ok(admin_url) = std::env::var("INHOOK_TEST_DATABASE") else {
            return Backend::Sqlite;
        };
        Self::fresh_postgres(admin_url).await
    }

    /// A fresh database on the PostgreSQL server of `admin_url`, whatever `INHOOK_TEST_DATABASE` says.
    pub async fn fresh_postgres(admin_url: String) -> Self {
        Self::fresh_postgres_with(admin_url, "").await
    }

    /// Like [`Self::fresh_postgres`], with `options` appended to `CREATE DATABASE` (e.g. a collation).
    pub async fn fresh_postgres_with(admin_url: String, options: &str) -> Self {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let database = format!(
            "inhook_t{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst),
            rand::random::<u32>()
        );
        admin(&admin_url, &format!("CREATE DATABASE {database} {options}")).await;
        Backend::Postgres {
            admin_url,
            database,
        }
    }

    /// `postgres` when `INHOOK_TEST_DATABASE` is set, else `sqlite`.
    pub fn fresh_kind() -> &'static str {
        if std::env::var_os("INHOOK_TEST_DATABASE").is_some() {
            "postgres"
        } else {
            "sqlite"
        }
    }

    /// Drops a PostgreSQL test database (a no-op for SQLite, whose file goes with its directory).
    pub async fn drop_database(&self) {
        if let Backend::Postgres {
            admin_url,
            database,
        } = self
        {
            admin(
                admin_url,
                &format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
            )
            .await;
        }
    }

    /// The `database` setting for a server whose directory is `dir`.
    pub fn url(&self, dir: &Path) -> String {
        match self {
            Backend::Sqlite => format!("sqlite://{}", dir.join("inhook.db").display()),
            Backend::Postgres {
                admin_url,
                database,
            } => {
                let (server, _) = admin_url.rsplit_once('/').expect("postgres://host/db");
                format!("{server}/{database}")
            }
        }
    }
}

/// Runs one statement on the PostgreSQL server (creating or dropping a database).
async fn admin(admin_url: &str, sql: &str) {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("INHOOK_TEST_DATABASE={admin_url} is set but unreachable: {e}"));
    let driver = tokio::spawn(connection);
    client.batch_execute(sql).await.expect(sql);
    drop(client);
    let _ = driver.await;
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

/// How [`TestServer`]'s constructors start the server: as a child process (the
/// `TestServer::spawn*` functions) or in this process ([`TestServer::in_process`]).
#[derive(Debug, Clone, Copy)]
pub struct Spawn {
    in_process: bool,
}

impl Spawn {
    /// Starts a server with the two seed sources; `extra` is appended to each source table's settings.
    pub async fn spawn(self) -> TestServer {
        self.spawn_with("").await
    }

    /// Starts a server whose save-game source gets `extra` TOML lines (e.g. `hold_timeout_s = 1`).
    pub async fn spawn_with(self, extra: &str) -> TestServer {
        self.spawn_configured("", extra).await
    }

    /// Starts a server with `top` TOML lines at the top level and `extra` in the save-game source.
    pub async fn spawn_configured(self, top: &str, extra: &str) -> TestServer {
        self.spawn_full_with(top, extra, "").await
    }

    /// Starts a server with the two seed sources followed by `sources`: whole `[[sources]]` tables.
    pub async fn spawn_with_sources(self, sources: &str) -> TestServer {
        self.spawn_full_with("", "", sources).await
    }

    /// Starts a server with `top` TOML lines and the two seed sources followed by `sources`.
    pub async fn spawn_top_and_sources(self, top: &str, sources: &str) -> TestServer {
        self.spawn_full_with(top, "", sources).await
    }

    /// Starts a server with `top` TOML lines and the environment variables `env` set
    /// (e.g. `INHOOK_SAVE_GAME_SECRET`, or `INHOOK_LISTEN` to bind another address).
    /// In process, `env` is handed to the config loader, never set in this process.
    pub async fn spawn_with_env(self, top: &str, env: &[(&str, &str)]) -> TestServer {
        self.spawn_full_env(top, "", env).await
    }

    /// Starts a server with the two seed sources followed by `sources`, and the
    /// environment variables `env` set (e.g. the added sources' `INHOOK_<NAME>_SECRET`).
    pub async fn spawn_with_sources_env(self, sources: &str, env: &[(&str, &str)]) -> TestServer {
        self.spawn_full_env("", sources, env).await
    }

    async fn spawn_full_env(self, top: &str, sources: &str, env: &[(&str, &str)]) -> TestServer {
        let mut server = self.unstarted(top, "", sources).await;
        server.env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        server.start_any().await;
        server
    }

    /// Starts a server with `top` TOML lines, `extra` in the save-game source, and `sources`
    /// (whole `[[sources]]`, `[[destinations]]` or `[[alerts]]` tables) after the seed sources.
    pub async fn spawn_full_with(self, top: &str, extra: &str, sources: &str) -> TestServer {
        let mut server = self.unstarted(top, extra, sources).await;
        server.start_any().await;
        server
    }

    /// A server configured like [`Self::spawn_full_with`], not started yet: the test may fill
    /// its store first (e.g. with [`TestServer::run_sql`]), then call [`TestServer::start`]
    /// (a child process) or [`TestServer::start_in_process`].
    pub async fn unstarted(self, top: &str, extra: &str, sources: &str) -> TestServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let server = TestServer {
            dir,
            child: None,
            in_process: self.in_process,
            running: None,
            url: String::new(),
            client: reqwest::Client::new(),
            extra: extra.to_owned(),
            top: top.to_owned(),
            sources: sources.to_owned(),
            backend: Backend::fresh().await,
            owns_database: true,
            store: tokio::sync::OnceCell::new(),
            env: Vec::new(),
        };
        server.write_config("127.0.0.1:0");
        server
    }
}

impl TestServer {
    /// The constructors of a server run in this process, on a thread and runtime of its own
    /// (`Application::build`, then `run_until_stopped`), with the same config file and
    /// handle API as the child process: `TestServer::in_process().spawn_with_sources(..)`.
    /// For tests that need no process: not those that kill, restart or signal the server,
    /// read its log or standard output, or read `/metrics` or `/v1/stats` (the metrics
    /// recorder and the figures not yet flushed are one per process, shared by every
    /// server in it).
    pub fn in_process() -> Spawn {
        Spawn { in_process: true }
    }

    /// The constructors of a server run as a child process (what `TestServer::spawn*` do).
    pub fn process() -> Spawn {
        Spawn { in_process: false }
    }

    /// Starts a server with the two seed sources; `extra` is appended to each source table's settings.
    pub async fn spawn() -> Self {
        Self::process().spawn().await
    }

    /// Starts a server whose save-game source gets `extra` TOML lines (e.g. `hold_timeout_s = 1`).
    pub async fn spawn_with(extra: &str) -> Self {
        Self::process().spawn_with(extra).await
    }

    /// Starts a server with `top` TOML lines at the top level and `extra` in the save-game source.
    pub async fn spawn_configured(top: &str, extra: &str) -> Self {
        Self::process().spawn_configured(top, extra).await
    }

    /// Starts a server with the two seed sources followed by `sources`: whole `[[sources]]` tables.
    pub async fn spawn_with_sources(sources: &str) -> Self {
        Self::process().spawn_with_sources(sources).await
    }

    /// Starts a server with `top` TOML lines and the two seed sources followed by `sources`.
    pub async fn spawn_top_and_sources(top: &str, sources: &str) -> Self {
        Self::process().spawn_top_and_sources(top, sources).await
    }

    /// Starts a server with `top` TOML lines and the environment variables `env` set
    /// (e.g. `INHOOK_SAVE_GAME_SECRET`, or `INHOOK_LISTEN` to bind another address).
    pub async fn spawn_with_env(top: &str, env: &[(&str, &str)]) -> Self {
        Self::process().spawn_with_env(top, env).await
    }

    /// Starts a server with the two seed sources followed by `sources`, and the
    /// environment variables `env` set (e.g. the added sources' `INHOOK_<NAME>_SECRET`).
    pub async fn spawn_with_sources_env(sources: &str, env: &[(&str, &str)]) -> Self {
        Self::process().spawn_with_sources_env(sources, env).await
    }

    /// Starts a server with `top` TOML lines, `extra` in the save-game source, and `sources`
    /// (whole `[[sources]]`, `[[destinations]]` or `[[alerts]]` tables) after the seed sources.
    pub async fn spawn_full_with(top: &str, extra: &str, sources: &str) -> Self {
        Self::process().spawn_full_with(top, extra, sources).await
    }

    /// A child-process server configured like [`Self::spawn_full_with`], not started yet: the
    /// test may fill its store first (e.g. with [`Self::run_sql`]), then call [`Self::start`].
    pub async fn unstarted(top: &str, extra: &str, sources: &str) -> Self {
        Self::process().unstarted(top, extra, sources).await
    }

    /// Starts the server the way it was made to run (child process or in process).
    async fn start_any(&mut self) {
        if self.in_process {
            self.start_in_process().await;
        } else {
            self.start();
        }
    }

    /// The name of this server's PostgreSQL database; none on SQLite.
    pub fn database_name(&self) -> Option<String> {
        match &self.backend {
            Backend::Postgres { database, .. } => Some(database.clone()),
            Backend::Sqlite => None,
        }
    }

    /// Runs `sql` on the PostgreSQL server's admin database rather than this server's own
    /// (e.g. to close the latter to connections). Only on PostgreSQL.
    pub async fn run_admin_sql(&self, sql: &str) {
        match &self.backend {
            Backend::Postgres { admin_url, .. } => admin(admin_url, sql).await,
            Backend::Sqlite => panic!("run_admin_sql needs PostgreSQL"),
        }
    }

    /// Starts another node on `first`'s PostgreSQL database, with the same settings, on its own port.
    pub async fn join(first: &TestServer) -> Self {
        Self::join_with_sources(first, &first.sources).await
    }

    /// Like [`Self::join`], with `sources` (whole `[[sources]]` or `[[destinations]]` tables)
    /// in place of `first`'s: e.g. a destination URL naming the node.
    pub async fn join_with_sources(first: &TestServer, sources: &str) -> Self {
        assert!(
            matches!(first.backend, Backend::Postgres { .. }),
            "several nodes share a database only on PostgreSQL"
        );
        let mut server = Self {
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            in_process: false,
            running: None,
            url: String::new(),
            client: reqwest::Client::new(),
            extra: first.extra.clone(),
            top: first.top.clone(),
            sources: sources.to_owned(),
            backend: first.backend.clone(),
            owns_database: false,
            store: tokio::sync::OnceCell::new(),
            env: first.env.clone(),
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
        // The admin API's loopback mode is opted into unless the test says otherwise: most
        // tests read it without a token (a configured `admin_token` wins anyway).
        let loopback = if self.top.contains("admin_open_to_loopback") {
            ""
        } else {
            "admin_open_to_loopback = true"
        };
        let config = format!(
            r#"
listen = "{listen}"
database = "{db}"
busy_timeout_ms = 300
{loopback}
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
{sources}
"#,
            db = self.backend.url(self.dir.path()),
            s0 = SAVE_SECRETS[0],
            s1 = SAVE_SECRETS[1],
            extra = self.extra,
            top = self.top,
            sources = self.sources,
        );
        std::fs::write(self.config_path(), config).expect("write config");
    }

    /// Starts `inhook serve` on this server's config and waits for its listening line.
    pub fn start(&mut self) {
        self.needs_process("start (an in-process server starts with start_in_process)");
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
            .envs(self.env.iter().map(|(k, v)| (k, v)))
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

    /// Starts the server on this server's config in this process: `Application::build` and
    /// `run_until_stopped` on a thread with a runtime of its own, so that a test's blocking
    /// calls (a SQLite query, a raw socket) never stall the server it talks to. The config
    /// is the file the child process would read, with this process's environment minus the
    /// seed sources' secret variables (as the child gets it) plus the test's `env`, handed
    /// to the loader: nothing is set in this process's environment.
    pub async fn start_in_process(&mut self) {
        assert!(self.running.is_none(), "server already running");
        let text = std::fs::read_to_string(self.config_path()).expect("read config");
        let mut env: std::collections::HashMap<String, String> = std::env::vars()
            .filter(|(k, _)| k != "INHOOK_PRESENCE_SECRET" && k != "INHOOK_SAVE_GAME_SECRET")
            .collect();
        env.extend(self.env.iter().cloned());
        let mut config = Config::from_parts(Some(&text), &env).expect("test config");
        config.loaded_from = Some(self.config_path());
        // As `inhook serve` does: no token and no loopback opening makes a token for the run.
        let _ = config.generate_admin_token();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (kill, kill_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("inhook-in-process".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("server runtime");
                let clean = runtime.block_on(async move {
                    let app = match inhook::runtime::app::Application::build(config).await {
                        Ok(app) => app,
                        Err(err) => {
                            let _ = ready_tx.send(Err(format!("{err:#}")));
                            return false;
                        }
                    };
                    let _ = ready_tx.send(app.local_addr().map_err(|e| e.to_string()));
                    let stopped = async move {
                        let _ = stop_rx.await;
                    };
                    tokio::select! {
                        outcome = app.run_until_stopped(stopped) => {
                            if let Err(err) = &outcome {
                                eprintln!("in-process server failed: {err:#}");
                            }
                            outcome.is_ok()
                        }
                        // Dropped with the test: end now, like the child's SIGKILL.
                        _ = kill_rx => false,
                    }
                });
                // Tasks still in a store call are not waited for: the test is over.
                runtime.shutdown_background();
                clean
            })
            .expect("server thread");
        let addr = match ready_rx.await {
            Ok(Ok(addr)) => addr,
            Ok(Err(err)) => panic!("in-process server did not start: {err}"),
            Err(_) => panic!("in-process server thread ended before it started"),
        };
        self.url = format!("http://{addr}");
        self.running = Some(InProcessServer {
            stop: Some(stop),
            kill: Some(kill),
            thread: Some(thread),
        });
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited successfully.
    /// In process: the graceful stop `run_until_stopped` makes on its shutdown signal
    /// (no new connections, work in hand finished), waited for; whether it returned `Ok`.
    pub fn terminate(&mut self) -> bool {
        if let Some(mut running) = self.running.take() {
            let _ = running.stop.take().expect("stop sender").send(());
            let thread = running.thread.take().expect("server thread");
            return thread.join().expect("server thread panicked");
        }
        let mut child = self.child.take().expect("server running");
        Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("kill -TERM");
        child.wait().expect("reap").success()
    }

    /// The server's process id (e.g. to count its open descriptors in `/proc`).
    pub fn pid(&self) -> u32 {
        self.needs_process("pid");
        self.child.as_ref().expect("server running").id()
    }

    /// Sends SIGHUP: the server reloads its secrets from the config.
    pub fn hangup(&self) {
        self.needs_process("hangup");
        let child = self.child.as_ref().expect("server running");
        let status = Command::new("kill")
            .arg("-HUP")
            .arg(child.id().to_string())
            .status()
            .expect("kill -HUP");
        assert!(status.success());
    }

    /// Runs the inhook binary with `args` and this server's config; returns (success, stdout).
    pub fn cli(&self, args: &[&str]) -> (bool, String) {
        let config = self.config_path();
        let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
        all.extend([std::ffi::OsStr::new("--config"), config.as_os_str()]);
        run_cli(&all, &[])
    }

    /// Whether a save-game delivery (event `id`) signed with `secret` verifies (202) or not (401).
    pub async fn save_secret_verifies(&self, secret: &str, id: &str) -> bool {
        let body = serde_json::to_vec(&serde_json::json!({"event_id": id,
            "event_type": "progress.saved", "player_id": "verifies", "save_slot": "s",
            "sequence": 1, "idempotency_key": id, "data": {}}))
        .unwrap();
        let headers = signed(Scheme::HmacTimestamped, secret, &body, now_s());
        match self.post_raw("save-game", &body, &headers).await.code {
            202 => true,
            401 => false,
            other => panic!("unexpected {other}"),
        }
    }

    /// Panics unless the server runs as a child process: `what` has no in-process form.
    fn needs_process(&self, what: &str) {
        assert!(
            !self.in_process,
            "{what} needs a child process: start this test's server with TestServer::spawn*"
        );
    }

    /// Kills the process with SIGKILL: no shutdown code runs.
    pub fn kill9(&mut self) {
        self.needs_process("kill9");
        self.end_now();
    }

    /// Ends the server at once, whichever way it runs (a child gets SIGKILL).
    fn end_now(&mut self) {
        drop(self.running.take());
        if let Some(mut child) = self.child.take() {
            child.kill().expect("SIGKILL");
            child.wait().expect("reap");
        }
    }

    /// Starts the server again on the same database (on a new port).
    pub fn restart(&mut self) {
        self.needs_process("restart");
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

    /// Posts a JSON body with signed `headers` (as [`official`] returns them) to `/webhooks/{source}`.
    pub async fn post_headers(&self, source: &str, body: &str, headers: &Headers) -> Reply {
        let mut all: Vec<(&str, String)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.clone()))
            .collect();
        all.push(("content-type", "application/json".into()));
        self.post_raw(source, body.as_bytes(), &all).await
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

    /// DELETEs a path of the admin API.
    pub async fn delete(&self, path: &str) -> Reply {
        reply(
            self.client
                .delete(format!("{}{path}", self.url))
                .send()
                .await
                .expect("DELETE"),
        )
        .await
    }

    /// POSTs a JSON body to a path of the admin API.
    pub async fn post_admin(&self, path: &str, body: &Value) -> Reply {
        reply(
            self.client
                .post(format!("{}{path}", self.url))
                .json(body)
                .send()
                .await
                .expect("POST"),
        )
        .await
    }

    /// GETs a path and returns its body as text.
    pub async fn get_text(&self, path: &str) -> String {
        self.client
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .expect("GET")
            .text()
            .await
            .expect("body")
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

    /// Waits until the counter `name` with `labels` on `/metrics` reads `expected`: a worker
    /// records its metrics just after its commit, so a state already visible may be a moment
    /// ahead of them.
    pub async fn wait_for_metric(&self, name: &str, labels: &[(&str, &str)], expected: f64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let text = self.get_text("/metrics").await;
            let value = crate::metrics::sample(&text, name, labels).unwrap_or(0.0);
            if value == expected {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name}{labels:?} is {value}, not {expected}:\n{text}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The server's store, opened from this process (SQLite file or PostgreSQL database).
    pub async fn store(&self) -> Arc<dyn Store> {
        let config = Config::load_for_store(Some(&self.config_path())).expect("test config");
        self.store
            .get_or_init(|| async {
                inhook::runtime::app::connect_store(&config).expect("open store")
            })
            .await
            .clone()
    }

    /// Every logged event, newest first, read from the store.
    pub async fn logged(&self) -> Vec<EventRecord> {
        let page = self
            .store()
            .await
            .events(&EventFilter::default(), 1_000_000, None)
            .await
            .expect("list events");
        page.items
    }

    /// Number of events in the log.
    pub async fn count(&self) -> usize {
        self.logged().await.len()
    }

    /// `(status, dead_reason)` of one logged event, read from the store.
    pub async fn status(&self, source: &str, event_id: &str) -> Option<(String, Option<String>)> {
        let record = self
            .store()
            .await
            .event(source, event_id)
            .await
            .expect("read event")?;
        Some((
            record.status.as_str().to_owned(),
            record.dead_reason.map(|r| r.as_str().to_owned()),
        ))
    }

    /// Waits until the API shows the event with `status`, and returns its detail.
    pub async fn wait_detail(&self, source: &str, event_id: &str, status: &str) -> Value {
        self.wait_for(&format!("/v1/events/{source}/{event_id}"), |r| {
            r.body["status"] == status
        })
        .await
        .body
    }

    /// Replaces `from` with `to` in the config file (a rotation, before a reload).
    pub fn replace_in_config(&self, from: &str, to: &str) {
        let config = std::fs::read_to_string(self.config_path()).unwrap();
        std::fs::write(self.config_path(), config.replace(from, to)).unwrap();
    }

    /// Waits until an event has `status`, or panics after 10 s.
    pub async fn wait_status(&self, source: &str, event_id: &str, status: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.status(source, event_id).await;
            if now.as_ref().is_some_and(|(s, _)| s == status) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{event_id} never became {status}: {now:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Holds the store's write lock until the guard is released, so that writes time out.
    pub async fn lock_store(&self) -> StoreLock {
        match &self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
                conn.execute_batch("BEGIN EXCLUSIVE").expect("lock");
                StoreLock::Sqlite(conn)
            }
            Backend::Postgres { .. } => {
                let url = self.backend.url(self.dir.path());
                let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(connection);
                client
                    .batch_execute("BEGIN; LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
                    .await
                    .expect("lock");
                StoreLock::Postgres(client)
            }
        }
    }

    /// Runs SQL on the server's database: `sqlite` on SQLite, `postgres` on PostgreSQL.
    pub async fn run_sql(&self, sqlite: &str, postgres: &str) {
        match &self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
                conn.execute_batch(sqlite).expect(sqlite);
            }
            Backend::Postgres { .. } => {
                let (client, driver) = self.postgres().await;
                client.batch_execute(postgres).await.expect(postgres);
                drop(client);
                let _ = driver.await;
            }
        }
    }

    /// The first column of the first row `sql` returns, an integer (the same SQL on both stores).
    pub async fn query_i64(&self, sql: &str) -> i64 {
        match &self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
                conn.query_row(sql, [], |row| row.get(0)).expect(sql)
            }
            Backend::Postgres { .. } => {
                let (client, driver) = self.postgres().await;
                let value = client.query_one(sql, &[]).await.expect(sql).get(0);
                drop(client);
                let _ = driver.await;
                value
            }
        }
    }

    /// Every row `sql` returns, each column read as text (the same SQL on both stores;
    /// cast what is not text).
    pub async fn query_rows(&self, sql: &str) -> Vec<Vec<String>> {
        match &self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
                let mut statement = conn.prepare(sql).expect(sql);
                let width = statement.column_count();
                let rows = statement
                    .query_map([], |row| {
                        (0..width)
                            .map(|at| row.get::<_, String>(at))
                            .collect::<rusqlite::Result<Vec<String>>>()
                    })
                    .expect(sql);
                rows.collect::<rusqlite::Result<_>>().expect(sql)
            }
            Backend::Postgres { .. } => {
                let (client, driver) = self.postgres().await;
                let rows = client.query(sql, &[]).await.expect(sql);
                let read = rows
                    .iter()
                    .map(|row| (0..row.len()).map(|at| row.get::<_, String>(at)).collect())
                    .collect();
                drop(client);
                let _ = driver.await;
                read
            }
        }
    }

    /// The bytes the first column of the first row `sql` returns, in hex.
    pub async fn query_hex(&self, sql: &str) -> String {
        match &self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
                let bytes: Vec<u8> = conn.query_row(sql, [], |row| row.get(0)).expect(sql);
                hex::encode(bytes)
            }
            Backend::Postgres { .. } => {
                let (client, driver) = self.postgres().await;
                let bytes: Vec<u8> = client.query_one(sql, &[]).await.expect(sql).get(0);
                drop(client);
                let _ = driver.await;
                hex::encode(bytes)
            }
        }
    }

    /// The bytes of the first column of every row `sql` returns (the same SQL on both stores).
    pub async fn query_bytes(&self, sql: &str) -> Vec<Vec<u8>> {
        match &self.backend {
            Backend::Sqlite => {
                let conn = rusqlite::Connection::open(self.db_path()).expect("open db");
                let mut statement = conn.prepare(sql).expect(sql);
                let rows = statement.query_map([], |row| row.get(0)).expect(sql);
                rows.collect::<rusqlite::Result<_>>().expect(sql)
            }
            Backend::Postgres { .. } => {
                let (client, driver) = self.postgres().await;
                let rows = client.query(sql, &[]).await.expect(sql);
                let read = rows.iter().map(|row| row.get::<_, Vec<u8>>(0)).collect();
                drop(client);
                let _ = driver.await;
                read
            }
        }
    }

    /// The files of the database that may hold `needle` in bytes, and those that do.
    /// SQLite: the database file, its write-ahead log and shared memory, whole. PostgreSQL:
    /// the heap files of `tables`, flushed by a `CHECKPOINT` first (a dead row version stays
    /// in them until a vacuum rewrites the table); `None` when the server's data directory
    /// is not on this machine.
    pub async fn files_holding(&self, needle: &[u8], tables: &[&str]) -> Option<Vec<String>> {
        let paths: Vec<String> = match &self.backend {
            Backend::Sqlite => ["", "-wal", "-shm"]
                .iter()
                .map(|suffix| format!("{}{suffix}", self.db_path().display()))
                .collect(),
            Backend::Postgres { .. } => {
                let (client, driver) = self.postgres().await;
                client
                    .batch_execute("CHECKPOINT")
                    .await
                    .expect("CHECKPOINT");
                let mut paths = Vec::new();
                for table in tables {
                    let sql = format!(
                        "SELECT current_setting('data_directory') || '/' || pg_relation_filepath('{table}')"
                    );
                    let path: String = client.query_one(&sql, &[]).await.expect(&sql).get(0);
                    paths.push(path);
                }
                drop(client);
                let _ = driver.await;
                if !paths.iter().all(|p| Path::new(p).exists()) {
                    eprintln!(
                        "PostgreSQL's data directory is not on this machine: files not scanned"
                    );
                    return None;
                }
                paths
            }
        };
        let holding = paths
            .into_iter()
            .filter(|path| {
                std::fs::read(path)
                    .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle))
            })
            .collect();
        Some(holding)
    }

    /// A connection to the server's PostgreSQL database, and the task that drives it
    /// (awaited after the client is dropped).
    async fn postgres(
        &self,
    ) -> (
        tokio_postgres::Client,
        tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>,
    ) {
        let url = self.backend.url(self.dir.path());
        let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect");
        (client, tokio::spawn(connection))
    }

    /// The directory holding the config, database and log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A held store lock; see [`TestServer::lock_store`].
pub enum StoreLock {
    /// An exclusive SQLite transaction.
    Sqlite(rusqlite::Connection),
    /// A PostgreSQL transaction holding an exclusive lock on the event log.
    Postgres(tokio_postgres::Client),
}

impl StoreLock {
    /// Releases the lock.
    pub async fn release(self) {
        match self {
            StoreLock::Sqlite(conn) => conn.execute_batch("COMMIT").expect("unlock"),
            StoreLock::Postgres(client) => client.batch_execute("COMMIT").await.expect("unlock"),
        }
    }
}

/// A server running on a thread of the test process; see [`TestServer::start_in_process`].
struct InProcessServer {
    /// Asks for the graceful shutdown `run_until_stopped` performs.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Ends the server at once: its runtime is dropped.
    kill: Option<tokio::sync::oneshot::Sender<()>>,
    /// The server's thread: whether `run_until_stopped` returned `Ok`.
    thread: Option<std::thread::JoinHandle<bool>>,
}

impl Drop for InProcessServer {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Polls `check` until it holds, or panics naming `what` after 10 s: the wait for a
/// condition that takes its time (a worker's step, a retry), never a fixed sleep.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.end_now();
        if let (
            true,
            Backend::Postgres {
                admin_url,
                database,
            },
        ) = (self.owns_database, &self.backend)
        {
            let (admin_url, sql) = (
                admin_url.clone(),
                format!("DROP DATABASE IF EXISTS {database} WITH (FORCE)"),
            );
            // Drop runs inside a test's runtime, which cannot block on itself: use a thread.
            let _ = std::thread::spawn(move || {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime")
                    .block_on(admin(&admin_url, &sql));
            })
            .join();
        }
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

/// Runs the inhook binary with `args` (which name their own `--config`, if
/// any) and the environment variables `env`; returns (success, stdout and stderr).
pub fn run_cli(args: &[&std::ffi::OsStr], env: &[(&str, &str)]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run inhook");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned()
            + &String::from_utf8_lossy(&output.stderr),
    )
}

// The publishers' official signing libraries (tests/vectors/sign.py), run at
// test time so timestamps are fresh. They are installed by `.ci/run`; CI sets
// `INHOOK_TEST_VECTORS=required`, so there a missing library fails the suite;
// elsewhere the tests that need them say so on stderr and pass without checking.

/// A delivery's headers as the official signer returns them: (lower-case name, value).
pub type Headers = Vec<(String, String)>;

/// One delivery for the official signer.
pub struct ToSign<'a> {
    /// Whose library signs it.
    pub scheme: Scheme,
    /// The secret it signs with.
    pub secret: &'a str,
    /// The exact body text.
    pub body: &'a str,
    /// The signing time for timestamped schemes (unix seconds).
    pub timestamp: i64,
    /// The delivery id, for the schemes that send one (`webhook-id`, `X-GitHub-Delivery`).
    pub id: &'a str,
}

/// Whether the official libraries are installed; panics where CI requires them.
pub fn vectors_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        let output = Command::new("python3")
            .arg(sign_script())
            .arg("--check")
            .output();
        let problem = match output {
            Ok(out) if out.status.success() => return true,
            Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
            Err(err) => format!("cannot run python3: {err}"),
        };
        let hint = "install them: pip install -r tests/vectors/requirements.txt && npm ci --prefix tests/vectors";
        if std::env::var("INHOOK_TEST_VECTORS").as_deref() == Ok("required") {
            panic!("official signing libraries unavailable ({hint}):\n{problem}");
        }
        eprintln!("SKIPPED: official signing libraries unavailable ({hint}):\n{problem}");
        false
    })
}

/// Whether the broker `name` listens at `addr` (the sink suites need NATS, RabbitMQ and
/// Redis). Without it a test prints `SKIPPED` and passes, unless `INHOOK_TEST_BROKERS` is
/// `required` (CI), where a missing broker fails the test.
pub fn broker_available(name: &str, addr: &str) -> bool {
    let reachable = addr
        .parse()
        .ok()
        .and_then(|addr| std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok())
        .is_some();
    if reachable {
        return true;
    }
    if std::env::var("INHOOK_TEST_BROKERS").as_deref() == Ok("required") {
        panic!("{name} is not listening at {addr} (INHOOK_TEST_BROKERS=required)");
    }
    eprintln!("SKIPPED: {name} is not listening at {addr}; start it to run the sink tests");
    false
}

fn sign_script() -> String {
    format!("{}/tests/vectors/sign.py", env!("CARGO_MANIFEST_DIR"))
}

/// Signs each delivery with its publisher's official library (one run of
/// sign.py for the whole batch); returns the headers of each.
pub fn official(deliveries: &[ToSign<'_>]) -> Vec<Headers> {
    let input: Vec<Value> = deliveries
        .iter()
        .map(|d| {
            serde_json::json!({"scheme": d.scheme.name(), "secret": d.secret, "body": d.body,
                   "timestamp": d.timestamp, "id": d.id})
        })
        .collect();
    let mut child = Command::new("python3")
        .arg(sign_script())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tests/vectors/sign.py");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&input).unwrap())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "sign.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let signed: Vec<Value> = serde_json::from_slice(&output.stdout).expect("sign.py output");
    signed
        .iter()
        .map(|s| {
            s["headers"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect()
        })
        .collect()
}

/// Signs one delivery with its publisher's official library.
pub fn official_one(scheme: Scheme, secret: &str, body: &str, timestamp: i64, id: &str) -> Headers {
    official(&[ToSign {
        scheme,
        secret,
        body,
        timestamp,
        id,
    }])
    .remove(0)
}

/// SQL (SQLite's, PostgreSQL's) that puts back the typed state tables migration 5
/// replaced, rebuilt with their rows from the generic table, and drops that table: a
/// store's state as the release before migration 5 wrote it. Remove migration 5's row
/// from `schema_migrations` too, and the next start migrates it again. Migration 6's
/// tables (deliveries), migration 7's indexes and counts and migration 9's index and
/// backlog decrements, migration 12's upgrade steps, 13's body keys, 14's delivery
/// counts, 15's keys, 17's unordered column, 18's `schema_migrations.release`, 19's alerts,
/// 20's figures over time, 21's search index and 22's alert state and outbox, which come
/// after it, are dropped first (migration 11's column goes with the generic table, 14's
/// PostgreSQL trigger function with the deliveries).
pub const UNDO_MIGRATION_5: (&str, &str) = (
    "DROP TABLE alert_outbox; DROP TABLE alerts_firing;
     DROP TABLE stats; DROP TABLE alerts; DROP TABLE event_search;
     ALTER TABLE schema_migrations DROP COLUMN release;
     DROP TABLE pending_upgrade_steps;
     DROP INDEX events_by_status; DROP INDEX events_by_source_status; DROP INDEX events_by_source;
     DROP INDEX events_arriving;
     DROP TABLE delivery_replay_jobs; DROP TABLE delivery_attempts; DROP TABLE deliveries;
     DROP TABLE delivery_counts; DROP TABLE delivery_count_deltas; DROP TABLE blocked_queues;
     DROP TABLE data_keys; DROP TABLE store_keys; ALTER TABLE events DROP COLUMN data_key;
     DROP INDEX state_changes_aggregate;
     ALTER TABLE events DROP COLUMN unordered;
     DROP INDEX events_body; ALTER TABLE events DROP COLUMN body_sha256;
     CREATE TABLE presence_state AS
         SELECT source, aggregate AS user_id, json_extract(state, '$.presence') AS presence,
                sequence, updated_at FROM aggregate_state WHERE tag IS NOT NULL;
     CREATE TABLE save_state AS
         SELECT source, aggregate, watermark AS last_sequence,
                json_extract(state, '$.progress') AS progress,
                json_extract(state, '$.progress_sequence') AS progress_sequence,
                json_extract(state, '$.inventory') AS inventory,
                json_extract(state, '$.inventory_sequence') AS inventory_sequence,
                json_extract(state, '$.snapshot_sequence') AS snapshot_sequence,
                json_extract(state, '$.achievements') AS achievements, updated_at
         FROM aggregate_state WHERE watermark IS NOT NULL;
     DROP TABLE aggregate_state;",
    "DROP TABLE alert_outbox; DROP TABLE alerts_firing;
     DROP TABLE stats; DROP TABLE alerts; DROP TABLE event_search;
     ALTER TABLE schema_migrations DROP COLUMN release;
     DROP TABLE pending_upgrade_steps;
     DROP INDEX events_by_status; DROP INDEX events_by_source_status; DROP INDEX events_by_source;
     DROP INDEX events_arriving;
     DROP TRIGGER event_counts_insert ON events; DROP TRIGGER event_counts_update ON events;
     DROP TRIGGER event_counts_delete ON events; DROP FUNCTION event_counts_apply();
     DROP TABLE event_counts; DROP TABLE event_count_deltas; DROP TABLE backlog_decrements;
     DROP TABLE delivery_replay_jobs; DROP TABLE delivery_attempts; DROP TABLE deliveries;
     DROP FUNCTION delivery_counts_apply();
     DROP TABLE delivery_counts; DROP TABLE delivery_count_deltas;
     DROP TABLE data_keys; DROP TABLE store_keys; ALTER TABLE events DROP COLUMN data_key;
     DROP INDEX state_changes_aggregate;
     ALTER TABLE events DROP COLUMN unordered;
     DROP INDEX events_body; ALTER TABLE events DROP COLUMN body_sha256;
     CREATE TABLE presence_state AS
         SELECT source, aggregate AS user_id, state::json->>'presence' AS presence,
                sequence, updated_at FROM aggregate_state WHERE tag IS NOT NULL;
     CREATE TABLE save_state AS
         SELECT source, aggregate, watermark AS last_sequence,
                (state::json->'progress')::text AS progress,
                (state::json->>'progress_sequence')::bigint AS progress_sequence,
                (state::json->'inventory')::text AS inventory,
                (state::json->>'inventory_sequence')::bigint AS inventory_sequence,
                (state::json->>'snapshot_sequence')::bigint AS snapshot_sequence,
                (state::json->'achievements')::text AS achievements, updated_at
         FROM aggregate_state WHERE watermark IS NOT NULL;
     DROP TABLE aggregate_state;",
);
