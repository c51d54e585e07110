//! The store section (docs/configuration.md, top-level keys; docs/encryption.md): where the
//! event log lives, how long a call waits for it, and the master keys of encryption at rest.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;

use super::section::{comma_list, file_section, section, FromEnv};
use super::ConfigError;
use crate::domain::encryption::MasterKeys;

file_section! {
    /// The store section's keys as the file (or the environment) gives them.
    pub(super) struct FileStore {
        database: String = env "INHOOK_DATABASE",
        busy_timeout_ms: u64,
        pool_size: usize,
        group_commit: bool,
        encryption: FileEncryption = env "INHOOK_ENCRYPTION_KEYS",
    }
}

/// The `[encryption]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileEncryption {
    keys: Vec<String>,
}

impl FromEnv for FileEncryption {
    /// `INHOOK_ENCRYPTION_KEYS`: comma-separated entries, replacing the file's list.
    fn from_env(_var: &str, raw: &str) -> Result<Self, ConfigError> {
        Ok(Self {
            keys: comma_list(raw),
        })
    }
}

section! {
    /// Where the event log lives and how it is written.
    #[derive(Debug, Clone)]
    pub struct Store {
        /// The store.
        pub database: Database => restart,
        /// How long a store call waits for a lock before answering 503.
        pub busy_timeout_ms: u64 => restart,
        /// Most PostgreSQL connections one node opens.
        pub pool_size: usize => restart,
        /// Commit concurrent deliveries in shared transactions (SQLite); off is one fsync per request.
        pub group_commit: bool => restart,
        /// The master keys of encryption at rest (`[encryption] keys` or
        /// `INHOOK_ENCRYPTION_KEYS`, docs/encryption.md); none: rows are stored in plaintext.
        /// A reload compares them by [`MasterKeys::same_as`] (config/reload.rs).
        pub encryption: Option<Arc<MasterKeys>> => apart,
    }
}

impl Default for Store {
    /// The built-in defaults.
    fn default() -> Self {
        Self {
            // A SQLite file in the working directory, so zero-config needs no server.
            database: Database::Sqlite(PathBuf::from("inhook.db")),
            // Five seconds waiting for a lock, longer than any healthy transaction.
            busy_timeout_ms: 5_000,
            // 16 PostgreSQL connections per node, well within the server's default 100.
            pool_size: 16,
            // One fsync for many concurrent deliveries.
            group_commit: true,
            encryption: None,
        }
    }
}

impl Store {
    /// Validates the section: the database URL's form and the master keys.
    pub(super) fn resolve(file: FileStore) -> Result<Self, ConfigError> {
        let default = Self::default();
        let database = match &file.database {
            Some(raw) => parse_database(raw)?,
            None => default.database,
        };
        let encryption = match &file.encryption {
            Some(table) => Some(Arc::new(
                MasterKeys::parse(&table.keys).map_err(|e| ConfigError(e.to_string()))?,
            )),
            None => None,
        };
        Ok(Self {
            database,
            busy_timeout_ms: file.busy_timeout_ms.unwrap_or(default.busy_timeout_ms),
            pool_size: file.pool_size.unwrap_or(default.pool_size),
            group_commit: file.group_commit.unwrap_or(default.group_commit),
            encryption,
        })
    }
}

/// Where the event log lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Database {
    /// An embedded SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database URL (`postgres://user@host:port/db`).
    Postgres(String),
}

impl std::fmt::Display for Database {
    /// The store as the start-up line and errors name it, never with credentials:
    /// `sqlite:./inhook.db`, `postgres://host:5432/db`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            // A bare relative name reads as a path: `sqlite:./inhook.db`.
            Database::Sqlite(path) if path.is_relative() && !path.starts_with(".") => {
                write!(f, "sqlite:./{}", path.display())
            }
            Database::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            Database::Postgres(url) => {
                let Ok(parsed) = url.parse::<tokio_postgres::Config>() else {
                    return f.write_str("postgres (unparsable URL)");
                };
                let hosts: Vec<String> = parsed
                    .get_hosts()
                    .iter()
                    .zip(parsed.get_ports().iter().chain(std::iter::repeat(&5432)))
                    .map(|(host, port)| match host {
                        tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                        #[cfg(unix)]
                        tokio_postgres::config::Host::Unix(dir) => format!("{}", dir.display()),
                    })
                    .collect();
                write!(
                    f,
                    "postgres://{}/{}",
                    hosts.join(","),
                    parsed.get_dbname().unwrap_or("")
                )
            }
        }
    }
}

/// A `database` URL: `sqlite://FILE` or a PostgreSQL URL.
fn parse_database(raw: &str) -> Result<Database, ConfigError> {
    if let Some(path) = raw.strip_prefix("sqlite://") {
        if path.is_empty() {
            return Err(ConfigError(
                "database: sqlite:// needs a file path, e.g. sqlite://inhook.db".into(),
            ));
        }
        return Ok(Database::Sqlite(PathBuf::from(path)));
    }
    if raw.starts_with("postgres://") || raw.starts_with("postgresql://") {
        return Ok(Database::Postgres(raw.to_owned()));
    }
    Err(ConfigError(
        "database: expected sqlite://FILE or postgres://USER@HOST/DB".into(),
    ))
}
