//! PostgreSQL over TLS: the database URL's `sslmode` and `sslrootcert` as libpq reads
//! them. Each test starts the real binary on a fresh database of the local server (which
//! has TLS on, with Debian's self-signed "snakeoil" certificate for `localhost`) and asks
//! PostgreSQL's `pg_stat_ssl` whether inhook's connections are encrypted.
//!
//! They run on the server of `INHOOK_TEST_DATABASE`, or else on 127.0.0.1:5432 when it
//! answers, so plain `cargo test` runs them too.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::json;

use crate::support::{now_s, signed, PRESENCE_SECRET};
use inhook::ingress::signature::Scheme;

/// A password in every URL: trust authentication ignores it, and no message may show it.
const PASSWORD: &str = "pw-never-shown-7f3a";

/// The PostgreSQL server to test on, as an admin URL; `None` only when
/// `INHOOK_TEST_DATABASE` is unset and nothing listens on 127.0.0.1:5432.
async fn admin_url() -> Option<String> {
    if let Ok(url) = std::env::var("INHOOK_TEST_DATABASE") {
        return Some(url);
    }
    match tokio::net::TcpStream::connect("127.0.0.1:5432").await {
        Ok(_) => Some("postgres://root@127.0.0.1:5432/test".into()),
        Err(_) => {
            eprintln!(
                "no PostgreSQL on 127.0.0.1:5432 and no INHOOK_TEST_DATABASE: TLS test not run"
            );
            None
        }
    }
}

async fn admin_client(admin_url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(admin_url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("PostgreSQL at {admin_url} unreachable: {e}"));
    tokio::spawn(connection);
    client
}

/// A fresh database on the test server, dropped afterwards.
struct Database {
    admin: tokio_postgres::Client,
    name: String,
    /// `user:password@host:port` of the server.
    authority: String,
}

impl Database {
    async fn fresh() -> Option<Self> {
        let admin_url = admin_url().await?;
        let admin = admin_client(&admin_url).await;
        let name = format!(
            "inhook_tls_{}_{}",
            std::process::id(),
            rand::random::<u32>()
        );
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .await
            .expect("create database");
        let rest = admin_url
            .split_once("://")
            .expect("postgres://…")
            .1
            .split('/')
            .next()
            .unwrap();
        let host_port = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
        let user = rest.rsplit_once('@').map_or("root", |(u, _)| u);
        let user = user.split(':').next().unwrap();
        Some(Self {
            admin,
            name,
            authority: format!("{user}:{PASSWORD}@{host_port}"),
        })
    }

    /// The URL of this database with `host` in place of the server's and the given query.
    fn url(&self, host: Option<&str>, query: &str) -> String {
        let authority = match host {
            Some(host) => {
                let (user, host_port) = self.authority.rsplit_once('@').unwrap();
                let port = host_port.rsplit_once(':').map_or("5432", |(_, p)| p);
                format!("{user}@{host}:{port}")
            }
            None => self.authority.clone(),
        };
        format!("postgres://{authority}/{}?{query}", self.name)
    }

    /// The server's certificate file: the root that makes its chain trusted.
    async fn server_certificate(&self) -> PathBuf {
        let row = self
            .admin
            .query_one(
                "SELECT current_setting('ssl'), current_setting('ssl_cert_file')",
                &[],
            )
            .await
            .expect("ssl settings");
        let (ssl, file): (String, String) = (row.get(0), row.get(1));
        assert_eq!(ssl, "on", "the test server must have TLS on");
        PathBuf::from(file)
    }

    /// Whether each of inhook's connections to this database is encrypted.
    async fn inhook_connections_encrypted(&self) -> Vec<bool> {
        self.admin
            .query(
                "SELECT ssl FROM pg_stat_ssl JOIN pg_stat_activity USING (pid) \
                 WHERE datname = $1 AND application_name = 'inhook'",
                &[&self.name],
            )
            .await
            .expect("pg_stat_ssl")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    async fn drop(self) {
        self.admin
            .batch_execute(&format!(
                "DROP DATABASE IF EXISTS {} WITH (FORCE)",
                self.name
            ))
            .await
            .expect("drop database");
    }
}

/// A running `inhook serve`.
struct Inhook {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Inhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Inhook {
    /// Starts inhook on `database`: the server once it listens, or what it printed when it exited instead.
    fn start(database: &str) -> Result<Self, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("inhook.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\ndatabase = \"{database}\"\n\n[[sources]]\n\
                 name = \"presence\"\nkind = \"presence\"\nmode = \"sync\"\n\
                 signature = \"hmac-hex\"\nsecrets = [\"{PRESENCE_SECRET}\"]\n"
            ),
        )
        .expect("write config");
        let log = dir.path().join("server.log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_inhook"))
            .args(["serve", "--config"])
            .arg(&config)
            .env_remove("INHOOK_DATABASE")
            .env_remove("INHOOK_PRESENCE_SECRET")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("spawn inhook");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read ready line");
        match line.trim().strip_prefix("inhook listening on ") {
            Some(url) => Ok(Self {
                url: url.to_owned(),
                child,
                _dir: dir,
            }),
            None => {
                let status = child.wait().expect("reap");
                assert!(!status.success(), "inhook exited 0 without listening");
                Err(std::fs::read_to_string(&log).expect("read log"))
            }
        }
    }

    /// Posts a signed presence update through the whole stack (verify, log, apply).
    async fn post_presence(&self) -> serde_json::Value {
        let body = serde_json::to_vec(&json!({"event_id": "evt_tls", "user_id": "usr_tls",
            "presence": "ONLINE", "sequence_number": 1, "timestamp": 1001}))
        .unwrap();
        let mut request = reqwest::Client::new()
            .post(format!("{}/webhooks/presence", self.url))
            .body(body.clone());
        for (name, value) in signed(Scheme::HmacHex, PRESENCE_SECRET, &body, now_s()) {
            request = request.header(name, value);
        }
        let response = request.send().await.expect("POST");
        assert_eq!(response.status(), 200);
        response.json().await.expect("JSON answer")
    }
}

/// Starts inhook on `query` and checks that it works and whether its connections are encrypted.
async fn serves(db: &Database, host: Option<&str>, query: &str) -> Vec<bool> {
    let server = Inhook::start(&db.url(host, query))
        .unwrap_or_else(|log| panic!("inhook did not start with {query}: {log}"));
    assert_eq!(server.post_presence().await["status"], "applied");
    let encrypted = db.inhook_connections_encrypted().await;
    assert!(
        !encrypted.is_empty(),
        "inhook holds connections to its database"
    );
    encrypted
}

/// Starts inhook on `query`, which must fail at start; returns what it printed.
fn refused(db: &Database, host: Option<&str>, query: &str) -> String {
    let log = match Inhook::start(&db.url(host, query)) {
        Ok(_) => panic!("inhook started with {query}"),
        Err(log) => log,
    };
    assert!(!log.contains(PASSWORD), "the password leaked: {log}");
    log
}

/// A CA of its own named `name`, unrelated to the server's certificate, as a PEM file in `dir`.
fn unrelated_ca(dir: &Path, name: &str) -> PathBuf {
    let (_, _, cert) = crate::support::tls::self_signed_ca(name);
    let file = dir.join(format!("{name}.pem"));
    std::fs::write(&file, cert.pem()).expect("write CA");
    file
}

#[tokio::test]
async fn sslmode_require_connects_encrypted() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let encrypted = serves(&db, None, "sslmode=require").await;
    assert!(encrypted.iter().all(|&ssl| ssl), "{encrypted:?}");
    db.drop().await;
}

#[tokio::test]
async fn without_sslmode_tls_is_preferred() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let encrypted = serves(&db, None, "").await;
    assert!(encrypted.iter().all(|&ssl| ssl), "{encrypted:?}");
    db.drop().await;
}

#[tokio::test]
async fn sslmode_disable_is_not_encrypted() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let encrypted = serves(&db, None, "sslmode=disable").await;
    assert!(encrypted.iter().all(|&ssl| !ssl), "{encrypted:?}");
    db.drop().await;
}

#[tokio::test]
async fn verify_ca_trusts_the_server_certificate_whatever_the_host_name() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let root = db.server_certificate().await;
    // The certificate names localhost, not 127.0.0.1: verify-ca does not mind.
    let query = format!("sslmode=verify-ca&sslrootcert={}", root.display());
    let encrypted = serves(&db, Some("127.0.0.1"), &query).await;
    assert!(encrypted.iter().all(|&ssl| ssl), "{encrypted:?}");
    db.drop().await;
}

#[tokio::test]
async fn verify_full_checks_the_host_name() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let root = db.server_certificate().await;
    let query = format!("sslmode=verify-full&sslrootcert={}", root.display());
    let encrypted = serves(&db, Some("localhost"), &query).await;
    assert!(encrypted.iter().all(|&ssl| ssl), "{encrypted:?}");

    let log = refused(&db, Some("127.0.0.1"), &query);
    assert!(
        log.contains("host name mismatch: the server's certificate is not valid for 127.0.0.1"),
        "{log}"
    );
    db.drop().await;
}

#[tokio::test]
async fn verify_full_with_an_unrelated_root_is_a_clear_startup_error() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = unrelated_ca(dir.path(), "inhook-test-ca");
    let query = format!("sslmode=verify-full&sslrootcert={}", root.display());
    let log = refused(&db, Some("localhost"), &query);
    assert!(
        log.contains(&format!(
            "the server's certificate is not trusted by sslrootcert {}",
            root.display()
        )),
        "{log}"
    );
    // require with a root certificate checks the chain too, as libpq does; this root even
    // has the name of the server certificate's issuer, but not its key.
    let impostor = unrelated_ca(dir.path(), "localhost");
    let query = format!("sslmode=require&sslrootcert={}", impostor.display());
    let log = refused(&db, None, &query);
    assert!(log.contains("not trusted by sslrootcert"), "{log}");
    assert!(db.inhook_connections_encrypted().await.is_empty());
    db.drop().await;
}

#[tokio::test]
async fn a_missing_root_file_is_a_clear_startup_error() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let log = refused(&db, None, "sslmode=verify-ca&sslrootcert=/no/such/root.crt");
    assert!(log.contains("sslrootcert /no/such/root.crt: "), "{log}");
    db.drop().await;
}

#[tokio::test]
async fn an_unknown_sslmode_is_a_clear_startup_error() {
    // Rejected before any connection: no server is needed.
    let log = match Inhook::start(&format!(
        "postgres://root:{PASSWORD}@127.0.0.1:1/none?sslmode=bogus"
    )) {
        Ok(_) => panic!("inhook started with sslmode=bogus"),
        Err(log) => log,
    };
    assert!(log.contains("sslmode \"bogus\" is not one of"), "{log}");
    assert!(!log.contains(PASSWORD), "the password leaked: {log}");
}

/// A stand-in for a PostgreSQL server without TLS: it refuses every TLS request (answers
/// `N`, as such a server does) and relays the rest to the real server at `upstream`.
async fn tls_refusing_proxy(upstream: String) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// The SSLRequest message: length 8, code 80877103.
    const SSL_REQUEST: [u8; 8] = [0, 0, 0, 8, 4, 210, 22, 47];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            tokio::spawn(async move {
                let mut server = tokio::net::TcpStream::connect(&upstream).await?;
                let mut first = [0u8; 8];
                client.read_exact(&mut first).await?;
                if first == SSL_REQUEST {
                    client.write_all(b"N").await?;
                } else {
                    server.write_all(&first).await?;
                }
                tokio::io::copy_bidirectional(&mut client, &mut server).await?;
                Ok::<_, std::io::Error>(())
            });
        }
    });
    port
}

// Multi-threaded: the proxy's tasks relay while this thread waits for inhook to start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefer_falls_back_to_plain_when_the_server_refuses_tls_and_require_does_not() {
    let Some(db) = Database::fresh().await else {
        return;
    };
    let upstream = db.authority.rsplit_once('@').unwrap().1.to_owned();
    let port = tls_refusing_proxy(upstream).await;
    let host = format!("127.0.0.1:{port}");
    let url = |query: &str| {
        let user = db.authority.rsplit_once('@').unwrap().0;
        format!("postgres://{user}@{host}/{}?{query}", db.name)
    };

    let server = Inhook::start(&url("sslmode=prefer")).expect("prefer starts without TLS");
    assert_eq!(server.post_presence().await["status"], "applied");
    let encrypted = db.inhook_connections_encrypted().await;
    assert!(
        !encrypted.is_empty() && encrypted.iter().all(|&ssl| !ssl),
        "{encrypted:?}"
    );
    drop(server);

    let log = match Inhook::start(&url("sslmode=require")) {
        Ok(_) => panic!("require started without TLS"),
        Err(log) => log,
    };
    assert!(log.contains("server does not support TLS"), "{log}");
    assert!(!log.contains(PASSWORD), "the password leaked: {log}");
    db.drop().await;
}
