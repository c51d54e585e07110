//! Configuration (docs/configuration.md): built-in defaults, then a TOML file, then
//! `INHOOK_*` environment variables. Validated once, at start.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::kind::json::contract::{
    AggregateLocations, BodyFormat, JsonSourceSpec, MissingLocations, TypeSpec,
};
use crate::kind::json::JsonKind;
use crate::kind::Kind;
use crate::kind::SourceKind;
use crate::retry::RetryPolicy;
use crate::signature::{Scheme, Secret, Verifier};

/// The keys among `"key" => field.path` whose field differs between `$a` and `$b`, in the
/// order given: what a reload names as needing a restart.
macro_rules! changed_keys {
    ($a:expr, $b:expr, [$($key:literal => $($field:ident).+),* $(,)?]) => {
        [$(($key, $a.$($field).+ != $b.$($field).+)),*]
            .into_iter()
            .filter_map(|(key, changed)| changed.then_some(key))
            .collect::<Vec<&'static str>>()
    };
}

pub mod alerts;
pub mod defaults;
mod destination;
pub mod env_vars;
mod reload;
pub mod response;
pub mod target;
pub mod template;

pub use destination::{
    destination_secret_env_var, destination_url_env_var, in_process_url, DestinationConfig,
};
pub use env_vars::{public_keys_env_var, secret_env_var, sns_topic_arns_env_var};
pub use reload::{check_reload, LiveSecrets, ReloadPlan};
pub use response::SourceResponse;
pub use target::Target;

pub use crate::domain::Mode;

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

/// One configured webhook source.
#[derive(Debug, Clone)]
pub struct SourceConfig {
    /// The name in `/webhooks/{name}`.
    pub name: String,
    /// Its kind: contract, rules, projection and views (a `json` source's compiled locations).
    pub kind: std::sync::Arc<dyn Kind>,
    /// Sync or async processing.
    pub mode: Mode,
    /// Async only: decide an event in the transaction that logs it when its aggregate is
    /// ready, instead of leaving it to the workers (lower latency, more work per request).
    pub decide_at_ingest: bool,
    /// How deliveries are signed: the scheme, with its settings for a configurable one.
    pub verifier: Verifier,
    /// Secrets any of which may verify (rotation).
    pub secrets: Vec<Secret>,
    /// Whether `secrets` came from `INHOOK_<SOURCE>_SECRET`: edits to the file's then change nothing.
    pub secrets_from_environment: bool,
    /// The environment variable the secrets are read from: `secrets_env`, else
    /// `INHOOK_<SOURCE>_SECRET`.
    pub secrets_var: String,
    /// Allowed distance between a signed timestamp and the time of receipt.
    pub tolerance_s: u64,
    /// The first sequence of every aggregate.
    pub first_sequence: i64,
    /// How long an in-order event waits for a gap.
    pub hold_timeout_s: u64,
    /// After how long without an update a presence is reported stale.
    pub stale_after_s: u64,
    /// Undecided events (received, held, retrying) above which deliveries get 429.
    pub max_backlog: u64,
    /// In-order events of one aggregate waiting ahead of a gap above which its deliveries get 429.
    pub max_held_per_aggregate: u64,
    /// Deliveries per second accepted from this source (bursts up to one second's worth); none when unset.
    pub rate_limit_per_s: Option<u32>,
    /// Request headers kept with its events beyond the built-in allowlist (lower case;
    /// the top-level `keep_headers` and the source's own).
    pub keep_headers: Vec<String>,
    /// The client addresses that may deliver (403 `forbidden_peer` to others); everyone when unset.
    pub allow_ips: Option<crate::peers::CidrList>,
    /// `batch = true`: each body is a JSON array of events, at most this many (docs/configuration.md, batches).
    pub batch: Option<usize>,
    /// The answer sent instead of the JSON one when a delivery is logged, applied or a duplicate.
    pub response: Option<SourceResponse>,
    /// The preset its keys were merged from (docs/providers.md), if any.
    pub preset: Option<String>,
    /// The endpoint handshake answered for the publisher (docs/configuration.md, `handshake`).
    pub handshake: Option<crate::handshake::Handshake>,
    /// JSON pointers whose values are indexed at ingest, for searching the log by them
    /// (docs/configuration.md, `search_fields`).
    pub search_fields: Vec<crate::search::SearchField>,
}

/// The validated configuration of one inhook process.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address to listen on.
    pub listen: SocketAddr,
    /// The store.
    pub database: Database,
    /// Token for `/v1/*`: configured, or generated at start by [`Config::generate_admin_token`].
    pub admin_token: Option<Secret>,
    /// Whether `admin_token` was generated for this run rather than configured.
    pub admin_token_generated: bool,
    /// With no `admin_token`, serve `/v1/*` to direct loopback clients without a token (an
    /// explicit opt-in: a same-host proxy makes every client look like loopback).
    pub admin_open_to_loopback: bool,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// How long a store call waits for a lock before answering 503.
    pub busy_timeout_ms: u64,
    /// Log lines as JSON instead of text.
    pub log_json: bool,
    /// The sources, in config order.
    pub sources: Vec<SourceConfig>,
    /// Where applied events are forwarded (docs/forwarding.md), in config order.
    pub destinations: std::sync::Arc<[DestinationConfig]>,
    /// The `[[alerts]]` rules (docs/configuration.md, alerts).
    pub alerts: std::sync::Arc<[alerts::AlertRule]>,
    /// How often the alert rules are evaluated, in milliseconds.
    pub alert_tick_ms: u64,
    /// Aggregates processed in parallel.
    pub workers: usize,
    /// How failed processing is retried.
    pub retry: RetryPolicy,
    /// Decided events older than this are purged from the log.
    pub retention_s: u64,
    /// Dedup keys are kept this long after their event's receipt.
    pub dedup_window_s: u64,
    /// How often the retention task runs.
    pub purge_interval_s: u64,
    /// Figures over time older than this many days are pruned (docs/api.md, stats).
    pub stats_retention_days: u64,
    /// How long shutdown waits for in-flight requests and steps.
    pub shutdown_timeout_s: u64,
    /// A request's head must arrive within this; also how long an idle keep-alive connection stays open.
    pub header_read_timeout_s: u64,
    /// A delivery's body must arrive within this (408 otherwise).
    pub body_read_timeout_s: u64,
    /// Largest request head (request line and headers) in bytes (431 beyond).
    pub max_header_bytes: usize,
    /// Most connections open at once (lowered at start to fit the descriptor limit).
    pub max_connections: usize,
    /// Most connections open at once from one IP address (429 and closed beyond).
    pub max_connections_per_peer: usize,
    /// The proxies whose `Forwarded` / `X-Forwarded-For` is believed for the client address.
    pub trusted_proxies: crate::peers::CidrList,
    /// Most bytes of request bodies being read at once, over all connections (503 beyond).
    pub max_buffered_body_bytes: usize,
    /// Most of `max_buffered_body_bytes` one peer (an IPv6 /64) may hold at once (503 beyond).
    pub max_buffered_body_bytes_per_peer: usize,
    /// The slowest a body may arrive after its first [`BODY_RATE_GRACE_S`] seconds (408
    /// below); 0 leaves only `body_read_timeout_s`.
    pub min_body_bytes_per_s: u64,
    /// Fields masked in all API, stream and dashboard output (names at any depth or dotted
    /// paths, case-insensitive).
    pub mask_fields: Vec<String>,
    /// Request headers kept with every source's events beyond the built-in allowlist (lower case).
    pub keep_headers: Vec<String>,
    /// Most `GET /v1/stream` connections open at once on this node (503 beyond).
    pub max_streams: usize,
    /// Changes held for a stream that reads slowly; past it, the stream catches up from the store.
    pub stream_buffer: usize,
    /// Most PostgreSQL connections one node opens.
    pub pool_size: usize,
    /// Serve `/metrics` without the admin token.
    pub metrics_public: bool,
    /// Commit concurrent deliveries in shared transactions (SQLite); off is one fsync per request.
    pub group_commit: bool,
    /// Serve `POST /bench/ceiling`, a fixed 202 with no work: the HTTP ceiling for benchmarks.
    pub bench_ceiling: bool,
    /// How long an idle sender waits before looking for due deliveries unasked: a safety
    /// net, since commits that write deliveries and retries falling due wake it.
    pub forward_poll_ms: u64,
    /// Export spans over OTLP/HTTP to this URL (e.g. `http://collector:4318/v1/traces`); off when unset.
    pub otlp_endpoint: Option<String>,
    /// The file this config was read from, read again on a reload.
    pub loaded_from: Option<PathBuf>,
    /// The master keys of encryption at rest (`[encryption] keys` or
    /// `INHOOK_ENCRYPTION_KEYS`, docs/encryption.md); none: rows are stored in plaintext.
    pub encryption: Option<std::sync::Arc<crate::encryption::MasterKeys>>,
}

impl Config {
    /// With neither an `admin_token` nor `admin_open_to_loopback`, makes a random token for
    /// this run and answers it (for the operator, once): no admin API without a token unless
    /// the user opted in. `None` when a token is configured or loopback is opted in.
    pub fn generate_admin_token(&mut self) -> Option<String> {
        if self.admin_token.is_some() || self.admin_open_to_loopback {
            return None;
        }
        let token: String = (0..GENERATED_TOKEN_BYTES)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        self.admin_token = Some(Secret::new(token.clone()));
        self.admin_token_generated = true;
        Some(token)
    }

    /// What `inhook serve` warns of at start about the sources: settings that work but leave
    /// a door open. The store adds its own (the database URL's TLS) in the caller, config
    /// being the lower layer. Never holds a secret.
    pub fn start_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        for source in &self.sources {
            if let Some(signed) = source.verifier.unsigned_body() {
                warnings.push(format!(
                    "source {:?}: the {} signature does not cover the body (signed_content = \
                     {signed:?}): every field outside it is unsigned, and whoever holds one \
                     delivery can change them; a delivery is deduplicated by what is signed, so \
                     one signature stands for one event",
                    source.name, source.verifier
                ));
            }
            let Some(spec) = JsonKind::spec_of(source.kind.as_ref()) else {
                continue;
            };
            let aggregate = spec.aggregate.iter().flat_map(|a| a.as_slice());
            for (key, raw) in spec
                .sequence
                .iter()
                .map(|raw| ("sequence", raw))
                .chain(aggregate.map(|raw| ("aggregate", raw)))
                // Each alternative of `a|b` on its own.
                .flat_map(|(key, raw)| raw.split('|').map(move |one| (key, one)))
            {
                let Some(header) = raw.strip_prefix("header:") else {
                    continue;
                };
                if !source
                    .verifier
                    .signed_headers()
                    .iter()
                    .any(|signed| signed.eq_ignore_ascii_case(header))
                {
                    warnings.push(format!(
                        "source {:?}: {key} comes from the header {header}, which the {} signature \
                         does not cover: whoever holds one captured delivery can resend it with \
                         another {key}",
                        source.name, source.verifier
                    ));
                }
            }
        }
        warnings
    }

    /// The source named `name`.
    pub fn source(&self, name: &str) -> Option<&SourceConfig> {
        self.sources.iter().find(|s| s.name == name)
    }

    /// The destination named `name`.
    pub fn destination(&self, name: &str) -> Option<&DestinationConfig> {
        self.destinations.iter().find(|d| d.name == name)
    }
}

/// Whether loading fails on a source without a secret.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Secrets {
    Required,
    Optional,
}

/// A configuration that cannot run, with a sentence saying how to fix it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(String);

impl ConfigError {
    /// A refusal saying `why` (for layers above the config: the embedding facade).
    pub(crate) fn new(why: impl Into<String>) -> Self {
        Self(why.into())
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<String>,
    database: Option<String>,
    admin_token: Option<String>,
    admin_open_to_loopback: Option<bool>,
    max_body_bytes: Option<usize>,
    busy_timeout_ms: Option<u64>,
    log_format: Option<String>,
    sources: Option<Vec<FileSource>>,
    destinations: Option<Vec<destination::FileDestination>>,
    alerts: Option<Vec<alerts::FileAlert>>,
    alert_tick_ms: Option<u64>,
    workers: Option<usize>,
    retry_base_s: Option<u64>,
    retry_max_delay_s: Option<u64>,
    max_attempts: Option<u32>,
    retention_s: Option<u64>,
    dedup_window_s: Option<u64>,
    purge_interval_s: Option<u64>,
    stats_retention_days: Option<u64>,
    shutdown_timeout_s: Option<u64>,
    header_read_timeout_s: Option<u64>,
    body_read_timeout_s: Option<u64>,
    max_header_bytes: Option<usize>,
    max_connections: Option<usize>,
    max_connections_per_peer: Option<usize>,
    trusted_proxies: Option<Vec<String>>,
    max_buffered_body_bytes: Option<usize>,
    max_buffered_body_bytes_per_peer: Option<usize>,
    min_body_bytes_per_s: Option<u64>,
    mask_fields: Option<Vec<String>>,
    keep_headers: Option<Vec<String>>,
    max_streams: Option<usize>,
    stream_buffer: Option<usize>,
    pool_size: Option<usize>,
    metrics_public: Option<bool>,
    group_commit: Option<bool>,
    bench_ceiling: Option<bool>,
    forward_poll_ms: Option<u64>,
    otlp_endpoint: Option<String>,
    encryption: Option<FileEncryption>,
    public_url: Option<String>,
}

/// The `[encryption]` table.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileEncryption {
    keys: Vec<String>,
}

/// The master keys: `INHOOK_ENCRYPTION_KEYS` (comma-separated) wins over `[encryption] keys`.
fn encryption(
    file: &FileConfig,
    env: &HashMap<String, String>,
) -> Result<Option<std::sync::Arc<crate::encryption::MasterKeys>>, ConfigError> {
    let entries: Vec<String> = match (env.get("INHOOK_ENCRYPTION_KEYS"), &file.encryption) {
        (Some(listed), _) => listed
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect(),
        (None, Some(table)) => table.keys.clone(),
        (None, None) => return Ok(None),
    };
    crate::encryption::MasterKeys::parse(&entries)
        .map(|keys| Some(std::sync::Arc::new(keys)))
        .map_err(|e| ConfigError(e.to_string()))
}

impl FileConfig {
    /// The file's keys as written, each `preset` merged under its source (the source's own
    /// keys win); none without a file.
    fn parse(text: Option<&str>) -> Result<Self, ConfigError> {
        let Some(text) = text else {
            return Ok(Self::default());
        };
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| ConfigError(toml_problem(text, &e)))?;
        let mut taken: Vec<Vec<String>> = Vec::new();
        let mut any_preset = false;
        if let Some(toml::Value::Array(sources)) = table.get_mut("sources") {
            for (i, source) in sources.iter_mut().enumerate() {
                let toml::Value::Table(source) = source else {
                    taken.push(Vec::new());
                    continue;
                };
                let Some(name) = source.get("preset") else {
                    taken.push(Vec::new());
                    continue;
                };
                any_preset = true;
                let label = match source.get("name").and_then(|n| n.as_str()) {
                    Some(n) => format!("source {n:?}"),
                    None => format!("sources[{i}]"),
                };
                let name = name.as_str().ok_or_else(|| {
                    ConfigError(format!("{label}: preset must be a string naming a preset (inhook presets lists them)"))
                })?;
                let preset = crate::presets::Preset::find(name).ok_or_else(|| {
                    let close = crate::presets::close_names(name);
                    let hint = if close.is_empty() {
                        "inhook presets lists them".to_owned()
                    } else {
                        format!(
                            "did you mean {}? (inhook presets lists them)",
                            close.join(", ")
                        )
                    };
                    ConfigError(format!("{label}: preset {name:?} is unknown: {hint}"))
                })?;
                taken.push(
                    crate::presets::merge(source, &preset)
                        .map_err(|e| ConfigError(format!("{label}: {e}")))?,
                );
            }
        }
        if !any_preset {
            // No merge: deserialise the text itself, so an error names its line.
            return toml::from_str(text).map_err(|e| ConfigError(toml_problem(text, &e)));
        }
        let mut file: Self = toml::Value::Table(table)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError(toml_problem(text, &e)))?;
        for (source, keys) in file.sources.iter_mut().flatten().zip(taken) {
            source.from_preset = keys;
        }
        Ok(file)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSource {
    name: String,
    preset: Option<String>,
    /// The keys merged from `preset` (none the source wrote), for errors that name them.
    #[serde(skip)]
    from_preset: Vec<String>,
    kind: SourceKind,
    mode: Option<Mode>,
    decide_at_ingest: Option<bool>,
    signature: Option<Scheme>,
    #[serde(default)]
    secrets: Vec<String>,
    /// The environment variable the secrets come from, instead of `INHOOK_<NAME>_SECRET`, so
    /// that several sources of one publisher's app share one (docs/configuration.md).
    secrets_env: Option<String>,
    tolerance_s: Option<u64>,
    first_sequence: Option<i64>,
    hold_timeout_s: Option<u64>,
    stale_after_s: Option<u64>,
    max_backlog: Option<u64>,
    max_held_per_aggregate: Option<u64>,
    rate_limit_per_s: Option<u32>,
    allow_ips: Option<Vec<String>>,
    keep_headers: Option<Vec<String>>,
    search_fields: Option<Vec<String>>,
    event_id: Option<String>,
    idempotency_key: Option<String>,
    aggregate: Option<AggregateLocations>,
    sequence: Option<String>,
    event_type: Option<String>,
    event_types: Option<Vec<String>>,
    ordering: Option<String>,
    state: Option<String>,
    body_format: Option<BodyFormat>,
    unwrap: Option<String>,
    missing_locations: Option<MissingLocations>,
    types: Option<Vec<TypeSpec>>,
    batch: Option<bool>,
    batch_max_events: Option<usize>,
    response: Option<response::FileResponse>,
    public_url: Option<String>,
    handshake: Option<String>,
    // The keys of the configurable schemes (docs/configuration.md, `signature = "hmac"`,
    // `"token"`): written inline, as `flatten` cannot refuse unknown keys.
    signature_header: Option<String>,
    signature_location: Option<String>,
    signature_algorithm: Option<String>,
    signature_encoding: Option<String>,
    signature_prefix: Option<String>,
    signature_format: Option<String>,
    signature_key: Option<String>,
    timestamp_key: Option<String>,
    signed_content: Option<String>,
    timestamp: Option<String>,
    timestamp_unit: Option<String>,
    token_header: Option<String>,
    token_query: Option<String>,
    // `signature = "aws-sns"` (docs/configuration.md).
    sns_cert_hosts: Option<Vec<String>>,
    sns_topic_arns: Option<Vec<String>>,
    /// `signature = "ed25519"` / `"ecdsa-p256"`: the publisher's public keys.
    public_keys: Option<Vec<String>>,
}

impl FileSource {
    /// The configurable schemes' keys given, by name, with the schemes each belongs to.
    fn given(&self) -> Vec<(&'static str, &'static [Scheme])> {
        // The public-key schemes read the hmac scheme's keys, all but the algorithm.
        const SIGNED: &[Scheme] = &[Scheme::Hmac, Scheme::Ed25519, Scheme::EcdsaP256];
        const HMAC: &[Scheme] = &[Scheme::Hmac];
        const TOKEN: &[Scheme] = &[Scheme::Token];
        const KEYS: &[Scheme] = &[Scheme::Ed25519, Scheme::EcdsaP256];
        const SNS: &[Scheme] = &[Scheme::AwsSns];
        [
            ("signature_header", self.signature_header.is_some(), SIGNED),
            (
                "signature_location",
                self.signature_location.is_some(),
                HMAC,
            ),
            (
                "signature_algorithm",
                self.signature_algorithm.is_some(),
                HMAC,
            ),
            (
                "signature_encoding",
                self.signature_encoding.is_some(),
                SIGNED,
            ),
            ("signature_prefix", self.signature_prefix.is_some(), SIGNED),
            ("signature_format", self.signature_format.is_some(), SIGNED),
            ("signature_key", self.signature_key.is_some(), SIGNED),
            ("timestamp_key", self.timestamp_key.is_some(), SIGNED),
            ("signed_content", self.signed_content.is_some(), SIGNED),
            ("timestamp", self.timestamp.is_some(), SIGNED),
            ("timestamp_unit", self.timestamp_unit.is_some(), SIGNED),
            ("token_header", self.token_header.is_some(), TOKEN),
            ("token_query", self.token_query.is_some(), TOKEN),
            ("public_keys", self.public_keys.is_some(), KEYS),
            ("sns_cert_hosts", self.sns_cert_hosts.is_some(), SNS),
            ("sns_topic_arns", self.sns_topic_arns.is_some(), SNS),
        ]
        .into_iter()
        .filter_map(|(key, set, schemes)| set.then_some((key, schemes)))
        .collect()
    }
}

/// The verifier of a source: its scheme, and a configurable scheme's settings parsed. A key
/// of another scheme, or settings that cannot verify, are errors naming the key.
fn verifier(
    name: &str,
    scheme: Scheme,
    keys: &FileSource,
    env: &HashMap<String, String>,
    public_url: Option<&str>,
) -> Result<Verifier, ConfigError> {
    if let Some((key, owners)) = keys
        .given()
        .into_iter()
        .find(|(_, owners)| !owners.contains(&scheme))
    {
        let owners: Vec<String> = owners.iter().map(|o| format!("\"{o}\"")).collect();
        return Err(ConfigError(format!(
            "source {name:?}: {key} is only for signature = {} (this source has signature = \"{scheme}\")",
            owners.join(" or ")
        )));
    }
    let problem = |e: crate::signature::configurable::KeyError| {
        ConfigError(format!("source {name:?}: {e} (signature = \"{scheme}\")"))
    };
    let hmac_keys = crate::signature::configurable::HmacKeys {
        header: keys.signature_header.as_deref(),
        location: keys.signature_location.as_deref(),
        algorithm: keys.signature_algorithm.as_deref(),
        encoding: keys.signature_encoding.as_deref(),
        prefix: keys.signature_prefix.as_deref(),
        format: keys.signature_format.as_deref(),
        signature_key: keys.signature_key.as_deref(),
        timestamp_key: keys.timestamp_key.as_deref(),
        signed_content: keys.signed_content.as_deref(),
        timestamp: keys.timestamp.as_deref(),
        timestamp_unit: keys.timestamp_unit.as_deref(),
        public_url,
    };
    Ok(match scheme {
        Scheme::Ed25519 | Scheme::EcdsaP256 => {
            let algorithm = scheme.public_key().expect("a public-key scheme");
            let parsed =
                crate::signature::configurable::HmacConfig::parse_public_key(&hmac_keys, algorithm)
                    .map_err(problem)?;
            Verifier::PublicKey(std::sync::Arc::new(parsed))
        }
        Scheme::Twilio => {
            let public_url = public_url.ok_or_else(|| {
                ConfigError(format!(
                    "source {name:?}: public_url is required for signature = \"twilio\" (Twilio signs the URL it calls: the base URL, top level or per source, e.g. https://hooks.example.com)"
                ))
            })?;
            let public_url = crate::signature::configurable::parse_public_url(public_url)
                .map_err(|e| ConfigError(format!("source {name:?}: public_url: {e}")))?;
            Verifier::Twilio(std::sync::Arc::new(
                crate::signature::twilio::TwilioConfig { public_url },
            ))
        }
        Scheme::Hmac => {
            let parsed =
                crate::signature::configurable::HmacConfig::parse(&hmac_keys).map_err(problem)?;
            Verifier::Hmac(std::sync::Arc::new(parsed))
        }
        Scheme::Token => Verifier::Token(
            crate::signature::token::TokenConfig::parse(
                keys.token_header.as_deref(),
                keys.token_query.as_deref(),
            )
            .map_err(problem)?,
        ),
        Scheme::Basic => Verifier::Basic,
        Scheme::AwsSns => {
            let (topics, from_env) = sns_topic_arns(name, keys, env)?;
            let parsed = crate::signature::aws_sns::SnsConfig::parse(
                keys.sns_cert_hosts.as_deref(),
                &topics,
            )
            .map_err(|e| match from_env {
                Some(var) if e.key == "sns_topic_arns" => ConfigError(format!(
                    "source {name:?}: {e} (from {var}; signature = \"{scheme}\")"
                )),
                _ => problem(e),
            })?;
            Verifier::AwsSns(std::sync::Arc::new(parsed))
        }
        fixed => Verifier::Fixed(fixed),
    })
}

/// An `aws-sns` source's `sns_topic_arns`: `INHOOK_<SOURCE>_SNS_TOPIC_ARNS`
/// (comma-separated) when set, else the file's, and the variable when they came from it.
/// None at all is an error naming the source, the key and the variable: AWS signs for
/// whoever owns a topic, so a source that named none would take any AWS customer's.
fn sns_topic_arns(
    name: &str,
    keys: &FileSource,
    env: &HashMap<String, String>,
) -> Result<(Vec<String>, Option<String>), ConfigError> {
    let var = sns_topic_arns_env_var(name);
    if let Some(list) = env.get(&var) {
        let topics = list
            .split(',')
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .map(str::to_owned)
            .collect();
        return Ok((topics, Some(var)));
    }
    match &keys.sns_topic_arns {
        Some(topics) => Ok((topics.clone(), None)),
        None => Err(ConfigError(format!(
            "source {name:?}: sns_topic_arns is required for signature = \"aws-sns\": list the topics this source takes, e.g. sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"] (or set {var}, comma-separated). AWS signs every topic's messages, whoever owns it: without the list any AWS customer could subscribe this endpoint"
        ))),
    }
}

impl FileSource {
    /// The `json` kind's keys of this source, with the name of each one given.
    fn json_spec(&self) -> (JsonSourceSpec, Vec<&'static str>) {
        let spec = JsonSourceSpec {
            event_id: self.event_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            aggregate: self.aggregate.clone(),
            sequence: self.sequence.clone(),
            event_type: self.event_type.clone(),
            event_types: self.event_types.clone(),
            ordering: self.ordering.clone(),
            state: self.state.clone(),
            body_format: self.body_format,
            unwrap: self.unwrap.clone(),
            missing_locations: self.missing_locations,
            types: self.types.clone(),
        };
        let given = [
            ("event_id", spec.event_id.is_some()),
            ("idempotency_key", spec.idempotency_key.is_some()),
            ("aggregate", spec.aggregate.is_some()),
            ("sequence", spec.sequence.is_some()),
            ("event_type", spec.event_type.is_some()),
            ("event_types", spec.event_types.is_some()),
            ("ordering", spec.ordering.is_some()),
            ("state", spec.state.is_some()),
            ("body_format", spec.body_format.is_some()),
            ("unwrap", spec.unwrap.is_some()),
            ("missing_locations", spec.missing_locations.is_some()),
            ("types", spec.types.is_some()),
        ]
        .into_iter()
        .filter_map(|(key, set)| set.then_some(key))
        .collect();
        (spec, given)
    }

    fn default_for(name: &str, kind: SourceKind) -> Self {
        Self {
            name: name.into(),
            preset: None,
            from_preset: Vec::new(),
            kind,
            mode: None,
            decide_at_ingest: None,
            signature: None,
            secrets: Vec::new(),
            secrets_env: None,
            tolerance_s: None,
            first_sequence: None,
            hold_timeout_s: None,
            stale_after_s: None,
            max_backlog: None,
            max_held_per_aggregate: None,
            rate_limit_per_s: None,
            allow_ips: None,
            keep_headers: None,
            search_fields: None,
            event_id: None,
            idempotency_key: None,
            aggregate: None,
            sequence: None,
            event_type: None,
            event_types: None,
            ordering: None,
            state: None,
            body_format: None,
            unwrap: None,
            missing_locations: None,
            types: None,
            batch: None,
            batch_max_events: None,
            response: None,
            public_url: None,
            handshake: None,
            signature_header: None,
            signature_location: None,
            signature_algorithm: None,
            signature_encoding: None,
            signature_prefix: None,
            signature_format: None,
            signature_key: None,
            timestamp_key: None,
            signed_content: None,
            timestamp: None,
            timestamp_unit: None,
            token_header: None,
            token_query: None,
            sns_cert_hosts: None,
            sns_topic_arns: None,
            public_keys: None,
        }
    }
}

/// Seconds a body may take before [`Config::min_body_bytes_per_s`] applies (a client's
/// first packets, a TLS proxy's buffering).
pub const BODY_RATE_GRACE_S: u64 = 2;

/// The kind of a configured source: a built-in one, or a `json` source's compiled
/// locations. An inconsistent `json` source does not start, and the error names the key.
fn source_kind(
    name: &str,
    kind: SourceKind,
    (spec, given): (JsonSourceSpec, Vec<&'static str>),
    verifier: &Verifier,
    stale_after_s: u64,
) -> Result<std::sync::Arc<dyn Kind>, ConfigError> {
    if kind != SourceKind::Json {
        if let Some(key) = given.first() {
            return Err(ConfigError(format!(
                "source {name:?}: {key} is only for kind = \"json\""
            )));
        }
    } else if spec.event_id.is_none() && !verifier.carries_delivery_id() {
        return Err(ConfigError(format!(
            "source {name:?}: event_id is required: signature = \"{verifier}\" carries no delivery id"
        )));
    }
    let stale_after_ms = (stale_after_s as i64).saturating_mul(1000);
    kind.configure(&spec, stale_after_ms)
        .map_err(|err| ConfigError(format!("source {name:?}: {err}")))
}

/// The secret a publisher-side command (`send`, `simulate`, `bench`) signs a source's
/// deliveries with: its flag, else `INHOOK_<SOURCE>_SECRET`, else the config's first
/// secret. Of a comma-separated list the first signs, as the server tries each.
pub fn signing_secret(
    source: &str,
    flag: Option<&str>,
    flag_name: &str,
    config: Option<&Config>,
) -> Result<Secret, ConfigError> {
    let var = config
        .and_then(|c| c.source(source))
        .map_or_else(|| secret_env_var(source), |s| s.secrets_var.clone());
    if let Some(raw) = flag.map(str::to_owned).or_else(|| std::env::var(&var).ok()) {
        return Ok(Secret::new(
            raw.split(',').next().unwrap_or_default().trim(),
        ));
    }
    config
        .and_then(|c| c.source(source))
        .and_then(|s| s.secrets.first().cloned())
        .ok_or_else(|| {
            ConfigError(format!(
                "no secret for source {source}: pass {flag_name}, set {var}, or give a --config that holds it"
            ))
        })
}

/// The admin token a client command (`simulate`, `bench`) reads the API with: its flag
/// (or `INHOOK_ADMIN_TOKEN`), else the given config's.
pub fn client_admin_token(flag: Option<&str>, config: Option<&Config>) -> Option<String> {
    flag.map(str::to_owned).or_else(|| {
        config
            .and_then(|c| c.admin_token.as_ref())
            .map(|t| String::from_utf8_lossy(t.expose()).into_owned())
    })
}

impl Config {
    /// Loads the file at `path` (if any) and applies the process environment.
    pub fn load(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(path, Secrets::Required)
    }

    /// Loads the config for a command that only opens the store (`events`, `replay`,
    /// `migrate`): sources without a secret are kept, with no secret.
    pub fn load_for_store(path: Option<&Path>) -> Result<Self, ConfigError> {
        Self::load_with(path, Secrets::Optional)
    }

    /// Loads the config a publisher-side command (`send`, `simulate`, `bench`) was
    /// given, if any: its sources' schemes, locations and secrets (a source without
    /// a secret is kept, its secret then coming from a flag).
    pub fn load_given(path: Option<&Path>) -> Result<Option<Self>, ConfigError> {
        path.map(|path| Self::load_for_store(Some(path)))
            .transpose()
    }

    fn load_with(path: Option<&Path>, secrets: Secrets) -> Result<Self, ConfigError> {
        // Every variable, not only INHOOK_*: a source's `secrets_env` may name any.
        let env: HashMap<String, String> = std::env::vars().collect();
        let text = match path {
            Some(path) => Some(std::fs::read_to_string(path).map_err(|e| {
                ConfigError(format!("cannot read config file {}: {e}", path.display()))
            })?),
            None => None,
        };
        let mut config = Self::build(text.as_deref(), &env, secrets)?;
        config.loaded_from = path.map(Path::to_path_buf);
        Ok(config)
    }

    /// Builds a config from a file's text and environment variables (pure, for tests).
    pub fn from_parts(
        text: Option<&str>,
        env: &HashMap<String, String>,
    ) -> Result<Self, ConfigError> {
        Self::build(text, env, Secrets::Required)
    }

    fn build(
        text: Option<&str>,
        env: &HashMap<String, String>,
        secret_rule: Secrets,
    ) -> Result<Self, ConfigError> {
        let mut file = FileConfig::parse(text)?;
        let server = server(&file, env)?;
        let encryption = encryption(&file, env)?;
        let keep_headers =
            header_names("keep_headers", file.keep_headers.take().unwrap_or_default())?;
        let public_url = match env
            .get("INHOOK_PUBLIC_URL")
            .cloned()
            .or(file.public_url.take())
        {
            Some(raw) => Some(
                crate::signature::configurable::parse_public_url(&raw)
                    .map_err(|e| ConfigError(format!("public_url: {e}")))?,
            ),
            None => None,
        };
        let sources = sources(
            file.sources.take(),
            env,
            &keep_headers,
            public_url.as_deref(),
            secret_rule,
        )?;
        let retry = retry(&file);
        let destinations: std::sync::Arc<[DestinationConfig]> = destination::destinations(
            file.destinations.take().unwrap_or_default(),
            env,
            &sources,
            retry,
            secret_rule == Secrets::Required,
        )?
        .into();
        let alerts = alerts::alerts(
            file.alerts.take().unwrap_or_default(),
            &sources,
            &destinations,
        )?
        .into();
        let alert_tick_ms = match file.alert_tick_ms {
            Some(0) => return Err(ConfigError("alert_tick_ms: must be at least 1".into())),
            Some(ms) => ms,
            None => defaults::ALERT_TICK_MS,
        };
        let bodies = bodies(&file)?;
        let (max_connections, max_connections_per_peer) = connections(&file)?;
        let trusted_proxies = crate::peers::CidrList::parse(
            "trusted_proxies",
            file.trusted_proxies.as_deref().unwrap_or_default(),
        )
        .map_err(ConfigError)?;
        let (max_streams, stream_buffer) = streams(&file)?;
        let processing = processing(file);
        Ok(Self {
            listen: server.listen,
            database: server.database,
            admin_token: server.admin_token,
            admin_token_generated: false,
            admin_open_to_loopback: server.admin_open_to_loopback,
            log_json: server.log_json,
            encryption,
            otlp_endpoint: server.otlp_endpoint,
            sources,
            destinations,
            alerts,
            alert_tick_ms,
            retry,
            max_body_bytes: bodies.max_body_bytes,
            max_buffered_body_bytes: bodies.max_buffered_body_bytes,
            max_buffered_body_bytes_per_peer: bodies.max_buffered_body_bytes_per_peer,
            min_body_bytes_per_s: bodies.min_body_bytes_per_s,
            body_read_timeout_s: bodies.body_read_timeout_s,
            header_read_timeout_s: bodies.header_read_timeout_s,
            max_header_bytes: bodies.max_header_bytes,
            max_connections,
            max_connections_per_peer,
            trusted_proxies,
            max_streams,
            stream_buffer,
            keep_headers,
            mask_fields: processing.mask_fields,
            workers: processing.workers,
            busy_timeout_ms: processing.busy_timeout_ms,
            pool_size: processing.pool_size,
            group_commit: processing.group_commit,
            retention_s: processing.retention_s,
            dedup_window_s: processing.dedup_window_s,
            purge_interval_s: processing.purge_interval_s,
            stats_retention_days: processing.stats_retention_days,
            shutdown_timeout_s: processing.shutdown_timeout_s,
            forward_poll_ms: processing.forward_poll_ms,
            metrics_public: processing.metrics_public,
            bench_ceiling: processing.bench_ceiling,
            loaded_from: None,
        })
    }
}

/// The server section: where inhook listens and stores, its admin access and its logs.
struct Server {
    listen: SocketAddr,
    database: Database,
    admin_token: Option<Secret>,
    admin_open_to_loopback: bool,
    log_json: bool,
    otlp_endpoint: Option<String>,
}

/// Reads the server section; the environment wins over the file.
fn server(file: &FileConfig, env: &HashMap<String, String>) -> Result<Server, ConfigError> {
    let from = |var: &str, key: &Option<String>| env.get(var).cloned().or_else(|| key.clone());
    let listen_raw = from("INHOOK_LISTEN", &file.listen).unwrap_or_else(|| defaults::LISTEN.into());
    let listen = listen_raw.parse().map_err(|_| {
        ConfigError(format!(
            "listen: {listen_raw:?} is not an address like 127.0.0.1:8080"
        ))
    })?;
    let database =
        from("INHOOK_DATABASE", &file.database).unwrap_or_else(|| defaults::DATABASE.into());
    let admin_token = match (env.get("INHOOK_ADMIN_TOKEN"), &file.admin_token) {
        (Some(token), _) => Some(admin_token(token, "INHOOK_ADMIN_TOKEN")?),
        (None, Some(token)) => Some(admin_token(token, "admin_token")?),
        (None, None) => None,
    };
    let admin_open_to_loopback = match env.get("INHOOK_ADMIN_OPEN_TO_LOOPBACK").map(String::as_str)
    {
        Some("true" | "1") => true,
        Some("false" | "0" | "") => false,
        Some(_) => {
            return Err(ConfigError(
                "INHOOK_ADMIN_OPEN_TO_LOOPBACK: must be true or false".into(),
            ))
        }
        None => file
            .admin_open_to_loopback
            .unwrap_or(defaults::ADMIN_OPEN_TO_LOOPBACK),
    };
    let log_json = match from("INHOOK_LOG_FORMAT", &file.log_format).as_deref() {
        None => defaults::LOG_JSON,
        Some("text") => false,
        Some("json") => true,
        Some(other) => {
            return Err(ConfigError(format!(
                "log_format: {other:?} is neither \"text\" nor \"json\""
            )))
        }
    };
    Ok(Server {
        listen,
        database: parse_database(&database)?,
        admin_token,
        admin_open_to_loopback,
        log_json,
        otlp_endpoint: from("INHOOK_OTLP_ENDPOINT", &file.otlp_endpoint).filter(|e| !e.is_empty()),
    })
}

/// Builds every source of the file (the zero-config ones when it has none), in file order.
fn sources(
    file: Option<Vec<FileSource>>,
    env: &HashMap<String, String>,
    keep_headers: &[String],
    public_url: Option<&str>,
    secret_rule: Secrets,
) -> Result<Vec<SourceConfig>, ConfigError> {
    let file = file.unwrap_or_else(|| {
        defaults::ZERO_CONFIG_SOURCES
            .iter()
            .map(|(name, kind)| FileSource::default_for(name, *kind))
            .collect()
    });
    let mut sources: Vec<SourceConfig> = Vec::with_capacity(file.len());
    for s in file {
        check_name("source", &s.name)?;
        if sources.iter().any(|o| o.name == s.name) {
            return Err(ConfigError(format!(
                "source {:?} is configured twice",
                s.name
            )));
        }
        sources.push(source(s, env, keep_headers, public_url, secret_rule)?);
    }
    Ok(sources)
}

/// Refuses a source name that is empty or holds anything but letters, digits, '-' or '_'.
pub fn check_source_name(name: &str) -> Result<(), ConfigError> {
    check_name("source", name)
}

/// Refuses a source's or a destination's name that is empty or holds anything but
/// letters, digits, '-' or '_' (it is a URL segment and part of an environment variable).
fn check_name(what: &str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(ConfigError(format!(
            "{what} name {name:?} must be non-empty letters, digits, '-' or '_'"
        )));
    }
    Ok(())
}

/// Builds one source from its `[[sources]]` table; `keep_headers` is the top-level list.
/// An error of a preset source says which of the keys it names came from the preset.
fn source(
    s: FileSource,
    env: &HashMap<String, String>,
    keep_headers: &[String],
    public_url: Option<&str>,
    secret_rule: Secrets,
) -> Result<SourceConfig, ConfigError> {
    let Some(preset) = s.preset.clone() else {
        return source_of(s, env, keep_headers, public_url, secret_rule);
    };
    let from_preset = s.from_preset.clone();
    source_of(s, env, keep_headers, public_url, secret_rule).map_err(|ConfigError(message)| {
        let named: Vec<&str> = from_preset
            .iter()
            .map(String::as_str)
            .filter(|key| {
                message
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .any(|word| word == *key)
            })
            .collect();
        let origin = if named.is_empty() {
            format!("the source uses preset {preset:?}")
        } else {
            format!(
                "{} from preset {preset:?}; a key written in the source overrides it",
                named.join(", ")
            )
        };
        ConfigError(format!("{message} ({origin})"))
    })
}

/// Builds one source from its `[[sources]]` table, presets merged.
fn source_of(
    s: FileSource,
    env: &HashMap<String, String>,
    keep_headers: &[String],
    public_url: Option<&str>,
    secret_rule: Secrets,
) -> Result<SourceConfig, ConfigError> {
    let json_keys = s.json_spec();
    let scheme = s.signature.or(s.kind.default_scheme()).ok_or_else(|| {
        ConfigError(format!(
            "source {:?}: signature is required for kind = \"{}\"",
            s.name,
            s.kind.as_str()
        ))
    })?;
    let secrets_var = secrets_var(&s)?;
    let (secrets, secrets_from_environment) = match scheme.public_key() {
        Some(algorithm) => source_public_keys(&s, env, algorithm)?,
        None => {
            // AWS signs SNS messages with its certificate's key: such a source has no secret.
            let secret_rule = match scheme {
                Scheme::AwsSns => Secrets::Optional,
                _ => secret_rule,
            };
            let (raw, from_env) = source_secrets(&s, env, secret_rule)?;
            (raw.into_iter().map(Secret::new).collect(), from_env)
        }
    };
    let first_sequence = s.first_sequence.unwrap_or(defaults::FIRST_SEQUENCE);
    if first_sequence < 0 {
        return Err(ConfigError(format!(
            "source {:?}: first_sequence must not be negative",
            s.name
        )));
    }
    let stale_after_s = s.stale_after_s.unwrap_or(defaults::STALE_AFTER_S);
    if let Some(own) = &s.public_url {
        crate::signature::configurable::parse_public_url(own)
            .map_err(|e| ConfigError(format!("source {:?}: public_url: {e}", s.name)))?;
    }
    let public_url = s.public_url.as_deref().or(public_url);
    let verifier = verifier(&s.name, scheme, &s, env, public_url)?;
    let kind = source_kind(&s.name, s.kind, json_keys, &verifier, stale_after_s)?;
    let batch = batch(&s, kind.as_ref())?;
    let response = s
        .response
        .clone()
        .map(SourceResponse::parse)
        .transpose()
        .map_err(|e| ConfigError(format!("source {:?}: {e}", s.name)))?;
    // A secret in the wrong form would turn every delivery into a 401: fail now instead.
    for (i, secret) in secrets.iter().enumerate() {
        if let Err(problem) = scheme.check_secret(secret) {
            return Err(ConfigError(format!(
                "source {:?}: secret #{i} {problem} (signature = \"{scheme}\")",
                s.name
            )));
        }
    }
    let keep_headers = source_keep_headers(&s.name, keep_headers, s.keep_headers)?;
    let allow_ips = allow_ips(&s.name, s.allow_ips.as_deref())?;
    let search_fields = search_fields(&s.name, s.search_fields.as_deref().unwrap_or_default())?;
    let handshake = match s.handshake.as_deref() {
        // The aws-sns scheme confirms its subscriptions itself (docs/configuration.md, AWS SNS).
        Some(AWS_SNS_HANDSHAKE) if scheme == Scheme::AwsSns => None,
        Some(AWS_SNS_HANDSHAKE) => {
            return Err(ConfigError(format!(
                "source {:?}: handshake = \"{AWS_SNS_HANDSHAKE}\" needs signature = \"aws-sns\": only a verified SubscriptionConfirmation is confirmed",
                s.name
            )))
        }
        raw => handshake(&s.name, raw, &secrets, secret_rule)?,
    };
    if let Some(h) = handshake {
        handshake_fits(&s.name, h, &verifier, kind.as_ref())?;
    }
    // The source's own signature or token header is a credential like the built-in ones.
    for header in verifier.secret_headers() {
        if crate::kept_headers::is_kept(header, &[]) {
            let key = match verifier.scheme() {
                Scheme::Token => "token_header",
                _ => "signature_header",
            };
            return Err(ConfigError(format!(
                "source {:?}: {key}: {header} is kept with every event, so it cannot carry a signature or token",
                s.name
            )));
        }
        if keep_headers.iter().any(|k| k.eq_ignore_ascii_case(header)) {
            return Err(ConfigError(format!(
                "source {:?}: keep_headers: {header} carries the source's signature or token and is never kept",
                s.name
            )));
        }
        if let Some((key, _)) = JsonKind::spec_of(kind.as_ref()).and_then(|spec| {
            let aggregate = spec.aggregate.iter().flat_map(|a| a.as_slice());
            spec.sequence
                .iter()
                .map(|raw| ("sequence", raw))
                .chain(aggregate.map(|raw| ("aggregate", raw)))
                .flat_map(|(key, raw)| raw.split('|').map(move |one| (key, one)))
                .find(|(_, raw)| {
                    raw.strip_prefix("header:")
                        .is_some_and(|h| h.eq_ignore_ascii_case(header))
                })
        }) {
            return Err(ConfigError(format!(
                "source {:?}: {key} reads the header {header}, which carries the source's signature or token: it is never read as a field",
                s.name
            )));
        }
    }
    Ok(SourceConfig {
        keep_headers,
        allow_ips,
        search_fields,
        preset: s.preset,
        handshake,
        name: s.name,
        kind,
        mode: s.mode.unwrap_or(s.kind.default_mode()),
        decide_at_ingest: s.decide_at_ingest.unwrap_or(defaults::DECIDE_AT_INGEST),
        verifier,
        secrets,
        secrets_from_environment,
        secrets_var,
        tolerance_s: s.tolerance_s.unwrap_or(defaults::TOLERANCE_S),
        first_sequence,
        hold_timeout_s: s.hold_timeout_s.unwrap_or(defaults::HOLD_TIMEOUT_S),
        stale_after_s,
        max_backlog: s.max_backlog.unwrap_or(defaults::MAX_BACKLOG),
        max_held_per_aggregate: s
            .max_held_per_aggregate
            .unwrap_or(defaults::MAX_HELD_PER_AGGREGATE),
        rate_limit_per_s: s.rate_limit_per_s.filter(|r| *r > 0),
        batch,
        response,
    })
}

/// A source's `search_fields`: JSON pointers, each once.
fn search_fields(
    name: &str,
    raw: &[String],
) -> Result<Vec<crate::search::SearchField>, ConfigError> {
    let mut fields = Vec::with_capacity(raw.len());
    for pointer in raw {
        let field = crate::search::SearchField::parse(pointer)
            .map_err(|e| ConfigError(format!("source {name:?}: search_fields: {e}")))?;
        if fields.contains(&field) {
            return Err(ConfigError(format!(
                "source {name:?}: search_fields: {pointer} is listed twice"
            )));
        }
        fields.push(field);
    }
    Ok(fields)
}

/// A source's `batch` settings: the most events a batch may hold, `None` without
/// `batch = true`. A batch is a JSON array of json events, each with an id of its own.
fn batch(s: &FileSource, kind: &dyn Kind) -> Result<Option<usize>, ConfigError> {
    let problem = |p: &str| Err(ConfigError(format!("source {:?}: {p}", s.name)));
    if s.batch != Some(true) {
        if s.batch_max_events.is_some() {
            return problem("batch_max_events is only for batch = true");
        }
        return Ok(None);
    }
    let Some(spec) = JsonKind::spec_of(kind) else {
        return problem("batch is only for kind = \"json\"");
    };
    if spec.body_format.is_some_and(|f| f != BodyFormat::Json) {
        return problem("batch needs JSON bodies: it cannot be used with body_format = \"form\"");
    }
    if spec.event_id.is_none() {
        // One delivery id for every element would make each element a duplicate of the first.
        return problem(
            "batch needs event_id, a location in each event or \"body\": the delivery id is one for the whole batch",
        );
    }
    match s
        .batch_max_events
        .unwrap_or(crate::kind::json::batch::DEFAULT_MAX_EVENTS)
    {
        0 => problem("batch_max_events must be at least 1"),
        max => Ok(Some(max)),
    }
}

/// The handshake of the `aws-sns` scheme, which comes with it (src/handshake/sns.rs).
const AWS_SNS_HANDSHAKE: &str = "aws-sns";

/// A source's `handshake` (docs/configuration.md): one of the known kinds, and the secret
/// its answer is computed with when it needs one.
fn handshake(
    name: &str,
    raw: Option<&str>,
    secrets: &[Secret],
    secret_rule: Secrets,
) -> Result<Option<crate::handshake::Handshake>, ConfigError> {
    use crate::handshake::Handshake;
    let Some(raw) = raw else {
        return Ok(None);
    };
    let handshake = Handshake::parse(raw).ok_or_else(|| {
        ConfigError(format!(
            "source {name:?}: handshake {raw:?} is unknown: expected one of {}",
            Handshake::names()
        ))
    })?;
    if handshake.needs_secret() && secrets.is_empty() && secret_rule == Secrets::Required {
        return Err(ConfigError(format!(
            "source {name:?}: handshake = \"{handshake}\" answers with an HMAC of the source's secret: set secrets (or {})",
            secret_env_var(name)
        )));
    }
    Ok(Some(handshake))
}

/// A handshake answered with an HMAC of the source's secret, or answered before a
/// delivery's checks, is allowed only with its publisher's scheme
/// ([`crate::handshake::Handshake::allowed_with`]): on another, a challenge's answer could be
/// a valid signature of a forged delivery. X's CRC also needs JSON bodies: a token can be a
/// form body (`a=b`), never a JSON one.
fn handshake_fits(
    name: &str,
    handshake: crate::handshake::Handshake,
    verifier: &crate::signature::Verifier,
    kind: &dyn Kind,
) -> Result<(), ConfigError> {
    let Some(scheme) = handshake.publisher_scheme() else {
        return Ok(());
    };
    let form = kind.body_format() != BodyFormat::Json;
    let json_only = handshake == crate::handshake::Handshake::XCrc;
    let has = if !handshake.allowed_with(verifier) {
        let base = match handshake {
            crate::handshake::Handshake::Msgraph => Scheme::Token,
            _ => Scheme::Hmac,
        };
        if verifier.scheme() == base {
            format!("this source's signature = \"{base}\" has other settings")
        } else {
            format!("this source has signature = \"{}\"", verifier.scheme())
        }
    } else if json_only && form {
        "this source has body_format = \"form\"".to_owned()
    } else {
        return Ok(());
    };
    Err(ConfigError(format!(
        "source {name:?}: handshake = \"{handshake}\" is allowed only with its publisher's signature scheme, {scheme}; {has} (a handshake's answer must never be a valid signature of a delivery, nor an echo for anyone: docs/configuration.md, handshakes)"
    )))
}

/// A source's `allow_ips`: `None` (everyone) when unset; an empty list would refuse
/// everyone, so it is an error.
fn allow_ips(
    name: &str,
    entries: Option<&[String]>,
) -> Result<Option<crate::peers::CidrList>, ConfigError> {
    let Some(entries) = entries else {
        return Ok(None);
    };
    let list = crate::peers::CidrList::parse("allow_ips", entries)
        .map_err(|e| ConfigError(format!("source {name:?}: {e}")))?;
    if list.is_empty() {
        return Err(ConfigError(format!(
            "source {name:?}: allow_ips is empty, so no one could deliver; remove the key to allow every address"
        )));
    }
    Ok(Some(list))
}

/// The headers a source keeps: the top-level list, then the source's own not already in it.
fn source_keep_headers(
    name: &str,
    top_level: &[String],
    own: Option<Vec<String>>,
) -> Result<Vec<String>, ConfigError> {
    let mut kept = top_level.to_vec();
    let setting = format!("source {name:?}: keep_headers");
    for header in header_names(&setting, own.unwrap_or_default())? {
        if !kept.contains(&header) {
            kept.push(header);
        }
    }
    Ok(kept)
}

/// A public-key source's keys (`INHOOK_<SOURCE>_PUBLIC_KEYS`, comma-separated, else the
/// file's `public_keys`), parsed, kept where other sources keep secrets so they rotate by
/// reload alike; and whether they came from the environment. A bad key is an error naming
/// the source, the key and the entry, never the entry's text.
fn source_public_keys(
    s: &FileSource,
    env: &HashMap<String, String>,
    algorithm: crate::signature::public_key::Algorithm,
) -> Result<(Vec<Secret>, bool), ConfigError> {
    if !s.secrets.is_empty() {
        return Err(ConfigError(format!(
            "source {:?}: secrets are not used by signature = \"{}\": list the publisher's public keys in public_keys",
            s.name,
            algorithm.name()
        )));
    }
    let var = public_keys_env_var(&s.name);
    let (entries, from_env): (Vec<String>, bool) = match env.get(&var) {
        Some(list) => (
            list.split(',')
                .map(str::trim)
                .filter(|k| !k.is_empty())
                .map(str::to_owned)
                .collect(),
            true,
        ),
        None => (s.public_keys.clone().unwrap_or_default(), false),
    };
    let keys = crate::signature::public_key::parse_keys(algorithm, &entries).map_err(|e| {
        let from = if from_env {
            format!("public_keys (from {var})")
        } else {
            "public_keys".to_owned()
        };
        ConfigError(format!(
            "source {:?}: {from}: {e} (signature = \"{}\"; set public_keys or {var})",
            s.name,
            algorithm.name()
        ))
    })?;
    Ok((keys, from_env))
}

/// The environment variable a source's secrets come from: its `secrets_env`, which must be a
/// variable name, else `INHOOK_<SOURCE>_SECRET`.
fn secrets_var(s: &FileSource) -> Result<String, ConfigError> {
    let Some(named) = &s.secrets_env else {
        return Ok(secret_env_var(&s.name));
    };
    let mut chars = named.chars();
    let valid = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid {
        return Err(ConfigError(format!(
            "source {:?}: secrets_env {named:?} is not an environment variable name \
             (letters, digits and _, not starting with a digit)",
            s.name
        )));
    }
    Ok(named.clone())
}

/// A source's secrets as written (`secrets_env` or `INHOOK_<SOURCE>_SECRET`, several
/// comma-separated, else the file's), and whether they came from the environment. None is an error when required.
fn source_secrets(
    s: &FileSource,
    env: &HashMap<String, String>,
    secret_rule: Secrets,
) -> Result<(Vec<String>, bool), ConfigError> {
    let var = secrets_var(s)?;
    let secrets: Vec<String> = match env.get(&var) {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
        None => s.secrets.clone(),
    };
    if secret_rule == Secrets::Required
        && (secrets.is_empty() || secrets.iter().any(String::is_empty))
    {
        return Err(ConfigError(format!(
            "source {:?} has no secret: set {var} (several comma-separated) or `secrets` in the config file",
            s.name
        )));
    }
    Ok((secrets, env.contains_key(&var)))
}

/// The top-level retry policy: also every destination's unless it sets its own keys.
fn retry(file: &FileConfig) -> RetryPolicy {
    let ms = |s: u64| (s as i64).saturating_mul(1000);
    RetryPolicy {
        base_ms: ms(file.retry_base_s.unwrap_or(defaults::RETRY_BASE_S)),
        max_delay_ms: ms(file
            .retry_max_delay_s
            .unwrap_or(defaults::RETRY_MAX_DELAY_S)),
        max_attempts: file.max_attempts.unwrap_or(defaults::MAX_ATTEMPTS).max(1),
    }
}

/// The limits on request heads and bodies: sizes, read times and the shared buffer budget.
struct Bodies {
    max_body_bytes: usize,
    max_buffered_body_bytes: usize,
    max_buffered_body_bytes_per_peer: usize,
    min_body_bytes_per_s: u64,
    body_read_timeout_s: u64,
    header_read_timeout_s: u64,
    max_header_bytes: usize,
}

/// Reads the body limits: a budget that could not hold one largest body is an error.
fn bodies(file: &FileConfig) -> Result<Bodies, ConfigError> {
    let max_body_bytes = file.max_body_bytes.unwrap_or(defaults::MAX_BODY_BYTES);
    let max_buffered_body_bytes = file
        .max_buffered_body_bytes
        .unwrap_or(defaults::MAX_BUFFERED_BODY_BYTES.max(max_body_bytes));
    if max_buffered_body_bytes < max_body_bytes {
        return Err(ConfigError(format!(
            "max_buffered_body_bytes ({max_buffered_body_bytes}) must be at least max_body_bytes ({max_body_bytes}): \
             otherwise no body of the largest size could ever be read"
        )));
    }
    let max_buffered_body_bytes_per_peer = file
        .max_buffered_body_bytes_per_peer
        .unwrap_or(
            (max_buffered_body_bytes / defaults::BUFFERED_BODY_BYTES_PEERS).max(max_body_bytes),
        )
        .min(max_buffered_body_bytes);
    if max_buffered_body_bytes_per_peer < max_body_bytes {
        return Err(ConfigError(format!(
            "max_buffered_body_bytes_per_peer ({max_buffered_body_bytes_per_peer}) must be at \
             least max_body_bytes ({max_body_bytes}): otherwise no body of the largest size \
             could ever be read"
        )));
    }
    Ok(Bodies {
        max_body_bytes,
        max_buffered_body_bytes,
        max_buffered_body_bytes_per_peer,
        min_body_bytes_per_s: file
            .min_body_bytes_per_s
            .unwrap_or(defaults::MIN_BODY_BYTES_PER_S),
        body_read_timeout_s: file
            .body_read_timeout_s
            .unwrap_or(defaults::BODY_READ_TIMEOUT_S)
            .max(1),
        header_read_timeout_s: file
            .header_read_timeout_s
            .unwrap_or(defaults::HEADER_READ_TIMEOUT_S)
            .max(1),
        max_header_bytes: file
            .max_header_bytes
            .unwrap_or(defaults::MAX_HEADER_BYTES)
            .max(defaults::MIN_HEADER_BYTES),
    })
}

/// The processing section: workers, the store, retention, shutdown, forwarding's poll,
/// the optional endpoints and masking.
struct Processing {
    workers: usize,
    busy_timeout_ms: u64,
    pool_size: usize,
    group_commit: bool,
    retention_s: u64,
    dedup_window_s: u64,
    purge_interval_s: u64,
    stats_retention_days: u64,
    shutdown_timeout_s: u64,
    forward_poll_ms: u64,
    metrics_public: bool,
    bench_ceiling: bool,
    mask_fields: Vec<String>,
}

/// Reads the processing section; nothing in it can be refused (0 workers and a 0 ms poll
/// are taken as 1).
fn processing(file: FileConfig) -> Processing {
    Processing {
        workers: file.workers.unwrap_or(defaults::WORKERS).max(1),
        busy_timeout_ms: file.busy_timeout_ms.unwrap_or(defaults::BUSY_TIMEOUT_MS),
        pool_size: file.pool_size.unwrap_or(defaults::POOL_SIZE),
        group_commit: file.group_commit.unwrap_or(defaults::GROUP_COMMIT),
        retention_s: file.retention_s.unwrap_or(defaults::RETENTION_S),
        dedup_window_s: file.dedup_window_s.unwrap_or(defaults::DEDUP_WINDOW_S),
        purge_interval_s: file.purge_interval_s.unwrap_or(defaults::PURGE_INTERVAL_S),
        stats_retention_days: file
            .stats_retention_days
            .unwrap_or(defaults::STATS_RETENTION_DAYS),
        shutdown_timeout_s: file
            .shutdown_timeout_s
            .unwrap_or(defaults::SHUTDOWN_TIMEOUT_S),
        forward_poll_ms: file
            .forward_poll_ms
            .unwrap_or(defaults::FORWARD_POLL_MS)
            .max(1),
        metrics_public: file.metrics_public.unwrap_or(defaults::METRICS_PUBLIC),
        bench_ceiling: file.bench_ceiling.unwrap_or(defaults::BENCH_CEILING),
        mask_fields: file.mask_fields.unwrap_or_default(),
    }
}

/// Reads `max_connections` and `max_connections_per_peer`, each at least 1.
fn connections(file: &FileConfig) -> Result<(usize, usize), ConfigError> {
    let max_connections = file.max_connections.unwrap_or(defaults::MAX_CONNECTIONS);
    let per_peer = file
        .max_connections_per_peer
        .unwrap_or(defaults::MAX_CONNECTIONS_PER_PEER);
    if max_connections == 0 || per_peer == 0 {
        return Err(ConfigError(
            "max_connections and max_connections_per_peer must be at least 1".into(),
        ));
    }
    Ok((max_connections, per_peer))
}

/// Reads `max_streams` and `stream_buffer`, each at least 1.
fn streams(file: &FileConfig) -> Result<(usize, usize), ConfigError> {
    let max_streams = file.max_streams.unwrap_or(defaults::MAX_STREAMS);
    if max_streams == 0 {
        return Err(ConfigError(
            "max_streams: must be at least 1 (open change streams per node)".into(),
        ));
    }
    let stream_buffer = file.stream_buffer.unwrap_or(defaults::STREAM_BUFFER);
    if stream_buffer == 0 {
        return Err(ConfigError(
            "stream_buffer: must be at least 1 (changes held for a slow stream)".into(),
        ));
    }
    Ok((max_streams, stream_buffer))
}

/// Header names of a `keep_headers` list in lower case, refusing any that is not a
/// header name or that carries a signature or a credential.
fn header_names(setting: &str, names: Vec<String>) -> Result<Vec<String>, ConfigError> {
    names
        .into_iter()
        .map(|name| {
            let name = name.trim().to_ascii_lowercase();
            match crate::kept_headers::refusal(&name) {
                Some(problem) => Err(ConfigError(format!("{setting}: {name:?} {problem}"))),
                None => Ok(name),
            }
        })
        .collect()
}

/// The admin token set by `key`, refused when empty: an empty token would silently
/// turn token mode into no-token mode (loopback trust). The error names the key, never the value.
fn admin_token(token: &str, key: &str) -> Result<Secret, ConfigError> {
    if token.trim().is_empty() {
        return Err(ConfigError(format!(
            "{key} is set but empty: set a token, or remove {key} to serve /v1/* to direct loopback clients only"
        )));
    }
    if token.len() < MIN_ADMIN_TOKEN_BYTES {
        return Err(ConfigError(format!(
            "{key} is shorter than {MIN_ADMIN_TOKEN_BYTES} bytes: anyone who can reach /v1/* could \
             guess it. Use a random one, e.g. `openssl rand -hex 24`"
        )));
    }
    Ok(Secret::new(token))
}

/// Random bytes in a generated admin token (printed as twice as many hex digits).
const GENERATED_TOKEN_BYTES: usize = 24;

/// The shortest admin token accepted: 16 random bytes are out of reach of guessing. A
/// source's shared token or Basic password has the same minimum.
pub const MIN_ADMIN_TOKEN_BYTES: usize = crate::signature::MIN_SHARED_SECRET_BYTES;

/// A TOML error as line and message, without the source snippet toml prints (it could hold
/// a secret) and with quoted values elided (serde quotes the value it could not take).
fn toml_problem(text: &str, err: &toml::de::Error) -> String {
    let line = err
        .span()
        // The line the span starts on: one more than the line breaks before it (a span at
        // the start of a line follows a break that `lines()` would not count).
        .map(|span| {
            text.as_bytes()[..span.start.min(text.len())]
                .iter()
                .filter(|b| **b == b'\n')
                .count()
                + 1
        });
    let mut message = String::new();
    let mut quoted = false;
    for c in err.message().chars() {
        match (c, quoted) {
            ('"', false) => {
                quoted = true;
                message.push_str("\"…\"");
            }
            ('"', true) => quoted = false,
            (_, true) => {}
            (c, false) => message.push(c),
        }
    }
    let message = message.trim_end();
    let hint = misplaced_top_level_key(err.message())
        .map(|key| {
            format!(
                " (`{key}` is a top-level key: top-level keys go before the first \
                 [[sources]] or [[destinations]] table, which takes every line after it)"
            )
        })
        .unwrap_or_default();
    match line {
        Some(line) => format!("config file, line {line}: {message}{hint}"),
        None => format!("config file: {message}{hint}"),
    }
}

/// The key of an "unknown field" error when it is a top-level key, so written inside a
/// table: TOML gives every line after a `[[table]]` header to that table.
fn misplaced_top_level_key(message: &str) -> Option<&str> {
    let key = message.strip_prefix("unknown field `")?.split('`').next()?;
    let alone = toml::from_str::<FileConfig>(&format!("{key} = 0"));
    // Read alone at the top, it is known there (a wrong type is still a known key).
    let known = alone.map_or_else(|e| !e.message().starts_with("unknown field"), |_| true);
    known.then_some(key)
}

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

/// An environment of `pairs`, as the config's tests read it.
#[cfg(test)]
pub(crate) fn test_env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_env as env;

    #[test]
    fn sources_may_share_a_secret_variable_and_a_bad_name_is_refused() {
        let text = "[[sources]]\nname = \"a\"\nkind = \"presence\"\nsecrets_env = \"SHARED_SECRET\"\n\
                    [[sources]]\nname = \"b\"\nkind = \"presence\"\nsecrets_env = \"SHARED_SECRET\"\n";
        let config = Config::from_parts(
            Some(text),
            &env(&[("SHARED_SECRET", "shared-one, shared-two")]),
        )
        .unwrap();
        for source in &config.sources {
            assert_eq!(source.secrets_var, "SHARED_SECRET");
            assert!(source.secrets_from_environment);
            assert_eq!(source.secrets.len(), 2, "{}", source.name);
        }
        let err = Config::from_parts(Some(text), &env(&[("INHOOK_A_SECRET", "not-this")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("SHARED_SECRET"), "{err}");
        let bad = text.replace("SHARED_SECRET", "1-not a name");
        let err = Config::from_parts(Some(&bad), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("secrets_env") && err.contains("not an environment variable name"),
            "{err}"
        );
    }

    #[test]
    fn a_top_level_key_after_a_table_names_its_own_line() {
        let text = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s3cret-value-long-enough\"]\n\nlisten = \"127.0.0.1:0\"\n";
        let err = Config::from_parts(Some(text), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("config file, line 6: unknown field `listen`"),
            "{err}"
        );
        assert!(err.contains("top-level keys go before"), "{err}");
        let first = "listen = 12\n";
        let err = Config::from_parts(Some(first), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("config file, line 1: "), "{err}");
    }

    #[test]
    fn a_store_is_named_without_credentials() {
        assert_eq!(
            Database::Sqlite("./inhook.db".into()).to_string(),
            "sqlite:./inhook.db"
        );
        assert_eq!(
            Database::Sqlite("inhook.db".into()).to_string(),
            "sqlite:./inhook.db"
        );
        assert_eq!(
            Database::Sqlite("/var/lib/inhook/events.db".into()).to_string(),
            "sqlite:/var/lib/inhook/events.db"
        );
        let named = Database::Postgres(
            "postgres://app:hunter2-secret@db.internal:6432/events?sslmode=require".into(),
        )
        .to_string();
        assert_eq!(named, "postgres://db.internal:6432/events");
        assert!(!named.contains("hunter2") && !named.contains("app@"));
        assert_eq!(
            Database::Postgres("postgres://root@127.0.0.1/test".into()).to_string(),
            "postgres://127.0.0.1:5432/test"
        );
    }

    #[test]
    fn batch_and_response_are_checked_at_load() {
        let source = |keys: &str| {
            format!(
                "[[sources]]\nname = \"sg\"\nkind = \"json\"\nsignature = \"github\"\nsecrets = [\"s\"]\nordering = \"unordered\"\n{keys}\n"
            )
        };
        let load = |keys: &str| Config::from_parts(Some(&source(keys)), &env(&[]));
        let config = load("batch = true\nevent_id = \"/sg_event_id\"").unwrap();
        assert_eq!(
            config.sources[0].batch,
            Some(crate::kind::json::batch::DEFAULT_MAX_EVENTS)
        );
        let config = load("batch = true\nbatch_max_events = 7\nevent_id = \"body\"").unwrap();
        assert_eq!(config.sources[0].batch, Some(7));
        assert_eq!(load("event_id = \"/id\"").unwrap().sources[0].batch, None);
        for (keys, named) in [
            ("batch = true", "batch needs event_id"),
            (
                "batch = true\nevent_id = \"/id\"\nbody_format = \"form\"",
                "body_format",
            ),
            (
                "batch_max_events = 3\nevent_id = \"/id\"",
                "batch_max_events",
            ),
            (
                "batch = true\nbatch_max_events = 0\nevent_id = \"/id\"",
                "at least 1",
            ),
            ("event_id = \"/id\"\nresponse = { status = 301 }", "2xx"),
            (
                "event_id = \"/id\"\nresponse = { body = \"x\", code = 1 }",
                "code",
            ),
        ] {
            let err = load(keys).unwrap_err().to_string();
            assert!(
                err.contains("\"sg\"") || err.contains(named),
                "{keys}: {err}"
            );
            assert!(err.contains(named), "{keys}: {err}");
        }
        let presence =
            "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nbatch = true\n";
        let err = Config::from_parts(Some(presence), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("only for kind = \"json\""), "{err}");
        let config = load("event_id = \"/id\"\nresponse = { body = '{\"type\":5}', content_type = \"application/json\" }").unwrap();
        let response = config.sources[0].response.as_ref().unwrap();
        assert_eq!(response.body, r#"{"type":5}"#);
        assert_eq!(response.status, axum::http::StatusCode::OK);
    }

    #[test]
    fn a_top_level_key_after_the_first_table_says_where_it_belongs() {
        let text = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nlisten = \"127.0.0.1:9\"\n";
        let err = Config::from_parts(Some(text), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `listen`") && err.contains("top-level keys go before"),
            "{err}"
        );
        let typo = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecretz = [\"s\"]\n";
        let err = Config::from_parts(Some(typo), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown field `secretz`") && !err.contains("top-level"),
            "{err}"
        );
    }

    fn preset_source(name: &str, extra: &str) -> Result<Config, ConfigError> {
        use crate::signature::public_key::{generate, Algorithm};
        let credential = match name {
            "postmark" => "secrets = [\"u:sixteen-bytes-pass\"]".to_owned(),
            "aws-sns" => {
                "sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"]".to_owned()
            }
            "discord-interactions" => {
                let (public, _) = generate(Algorithm::Ed25519, [7; 32]).unwrap();
                format!("public_keys = [\"{public}\"]")
            }
            "sendgrid-events" => {
                let (public, _) = generate(Algorithm::EcdsaP256, [7; 32]).unwrap();
                format!("public_keys = [\"{public}\"]")
            }
            // A token is at least 16 bytes; a whsec_ key is base64.
            _ => "secrets = [\"whsec_c2VjcmV0LWZvci1wcmVzZXRz\"]".to_owned(),
        };
        let text = format!(
            "public_url = \"https://hooks.example.com\"\n[[sources]]\nname = \"s\"\npreset = \"{name}\"\n{credential}\n{extra}"
        );
        Config::from_parts(Some(&text), &env(&[]))
    }

    #[test]
    fn every_preset_parses_into_a_valid_source() {
        for preset in crate::presets::Preset::all() {
            let parsed = preset_source(preset.name, "");
            let config = parsed.unwrap_or_else(|e| panic!("{}: {e}", preset.name));
            let source = config.source("s").unwrap();
            assert_eq!(source.preset.as_deref(), Some(preset.name));
            assert!(
                JsonKind::spec_of(source.kind.as_ref()).is_some(),
                "{}",
                preset.name
            );
            // Pasted as printed, no preset starts before its commented line is filled in:
            // the publisher's secret or keys, or (aws-sns, which needs no secret) its topics.
            let pasted = Config::from_parts(Some(&preset.paste().unwrap()), &env(&[]));
            let err = pasted.expect_err(preset.name).to_string();
            if source.verifier.scheme() == Scheme::AwsSns {
                assert!(err.contains("sns_topic_arns is required"), "{err}");
            }
        }
    }

    #[test]
    fn a_preset_source_error_names_the_keys_from_the_preset() {
        // A scheme written in the source, the preset's hmac keys left over: named as the preset's.
        let err = preset_source("linear", "signature = \"github\"\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("signature_header") && err.contains("from preset \"linear\""),
            "{err}"
        );
        let err = preset_source("strip", "").unwrap_err().to_string();
        assert!(
            err.contains("preset \"strip\" is unknown") && err.contains("stripe"),
            "{err}"
        );
        let err = preset_source("stripe", "signature_header = \"X\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("signature_header"), "{err}");
        assert!(!err.contains("whsec_c2VjcmV0"), "{err}");
    }

    #[test]
    fn a_short_admin_token_is_refused_without_showing_it() {
        let secrets = [
            ("INHOOK_PRESENCE_SECRET", "a"),
            ("INHOOK_SAVE_GAME_SECRET", "b"),
        ];
        let with_token = [
            secrets[0],
            secrets[1],
            ("INHOOK_ADMIN_TOKEN", "fifteen-bytes!!"),
        ];
        for (text, vars) in [
            ("admin_token = \"a\"", env(&secrets)),
            ("", env(&with_token)),
        ] {
            let err = Config::from_parts(Some(text), &vars)
                .unwrap_err()
                .to_string();
            assert!(err.contains("shorter than 16 bytes"), "{err}");
            assert!(!err.contains("fifteen"), "{err}");
        }
        let config = Config::from_parts(Some("admin_token = \"sixteen-bytes-ok\""), &env(&secrets));
        assert!(config.unwrap().admin_token.is_some());
    }

    #[test]
    fn a_signing_secret_comes_from_the_flag_before_the_config_and_its_absence_says_where_to_put_it()
    {
        // A name no test's environment sets, so INHOOK_<SOURCE>_SECRET is absent.
        let name = "signing-secret-test-source";
        let text = format!(
            "[[sources]]\nname = \"{name}\"\nkind = \"presence\"\nsignature = \"hmac-hex\"\n\
             secrets = [\"from-config\", \"older\"]\n"
        );
        let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
        let secret = |flag, config| signing_secret(name, flag, "--secret", config);
        assert_eq!(
            secret(Some("new, old"), Some(&config)).unwrap().expose(),
            b"new",
            "the first of a list signs"
        );
        assert_eq!(
            secret(None, Some(&config)).unwrap().expose(),
            b"from-config"
        );
        let err = secret(None, None).unwrap_err().to_string();
        assert!(err.contains("--secret"), "{err}");
        assert!(
            err.contains("INHOOK_SIGNING_SECRET_TEST_SOURCE_SECRET"),
            "{err}"
        );
        assert!(!err.contains("from-config"), "{err}");
    }

    #[test]
    fn json_sources_default_to_async_and_inconsistent_ones_name_the_key() {
        let source = |keys: &str| {
            format!("[[sources]]\nname = \"j\"\nkind = \"json\"\nsecrets = [\"whsec_c2VjcmV0\"]\n{keys}\n")
        };
        let ok = source("signature = \"standard-webhooks\"\nordering = \"unordered\"");
        let config = Config::from_parts(Some(&ok), &env(&[])).unwrap();
        let j = config.source("j").unwrap();
        assert_eq!(
            (j.kind.source_kind(), j.mode),
            (SourceKind::Json, Mode::Async)
        );
        assert_eq!(j.kind.source_kind().label(), "json");
        for (keys, named) in [
            ("ordering = \"unordered\"", "signature is required"),
            (
                "signature = \"hmac-hex\"\nordering = \"unordered\"",
                "event_id is required",
            ),
            (
                "signature = \"github\"\nordering = \"in-order\"\naggregate = \"/a\"",
                "sequence:",
            ),
            (
                "signature = \"github\"\nordering = \"unordered\"\nstate = \"header:X\"",
                "state:",
            ),
            (
                "signature = \"github\"\nordering = \"unordered\"\nevent_types = [\"a.*\"]",
                "event_types:",
            ),
            (
                "signature = \"github\"\nordering = \"unordered\"\nevent_id = \"/a||/b\"",
                "event_id:",
            ),
            (
                "signature = \"github\"\nordering = \"unordered\"\nunwrap = \"header:X-P\"",
                "unwrap:",
            ),
            (
                "signature = \"github\"\nordering = \"unordered\"\nbody_format = \"xml\"",
                "body_format",
            ),
        ] {
            let err = Config::from_parts(Some(&source(keys)), &env(&[])).unwrap_err();
            assert!(err.to_string().contains(named), "{keys}: {err}");
        }
        let built_in = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nordering = \"unordered\"\n";
        let err = Config::from_parts(Some(built_in), &env(&[])).unwrap_err();
        assert!(
            err.to_string()
                .contains("ordering is only for kind = \"json\""),
            "{err}"
        );
        for key in ["body_format = \"form\"", "unwrap = \"/payload\""] {
            let text = format!(
                "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\n{key}\n"
            );
            let err = Config::from_parts(Some(&text), &env(&[])).unwrap_err();
            let name = key.split(' ').next().unwrap();
            assert!(
                err.to_string()
                    .contains(&format!("{name} is only for kind = \"json\"")),
                "{err}"
            );
        }
    }

    #[test]
    fn bad_cidr_blocks_are_config_errors_naming_key_and_entry() {
        let secrets = env(&[("INHOOK_P_SECRET", "a")]);
        let source = |allow: &str| {
            format!("[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"a\"]\nallow_ips = {allow}")
        };
        let err = Config::from_parts(
            Some(&source(r#"["192.0.2.0/24", "192.0.2.0/33"]"#)),
            &secrets,
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("source \"p\": allow_ips: \"192.0.2.0/33\" is not a CIDR block"),
            "{err}"
        );
        let err = Config::from_parts(Some(&source("[]")), &secrets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("allow_ips is empty"), "{err}");
        let proxies = format!(
            "trusted_proxies = [\"10.0.0.1/8\"]\n{}",
            source("[\"::1\"]")
        );
        let err = Config::from_parts(Some(&proxies), &secrets)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("trusted_proxies: \"10.0.0.1/8\" has bits set past its prefix length; did you mean \"10.0.0.0/8\"?"),
            "{err}"
        );
        let config = Config::from_parts(
            Some(&format!(
                "trusted_proxies = [\"10.0.0.0/8\"]\n{}",
                source(r#"["192.0.2.0/24", "2001:db8::/32"]"#)
            )),
            &secrets,
        )
        .unwrap();
        assert!(config.trusted_proxies.contains("10.1.2.3".parse().unwrap()));
        let allowed = config.sources[0].allow_ips.as_ref().unwrap();
        assert!(allowed.contains("2001:db8::1".parse().unwrap()));
        assert!(!allowed.contains("198.51.100.1".parse().unwrap()));
    }

    #[test]
    fn connection_and_buffer_limits_have_safe_defaults_and_are_checked() {
        let secrets = env(&[
            ("INHOOK_PRESENCE_SECRET", "a"),
            ("INHOOK_SAVE_GAME_SECRET", "b"),
        ]);
        let config = Config::from_parts(None, &secrets).unwrap();
        assert_eq!(config.max_connections, defaults::MAX_CONNECTIONS);
        assert_eq!(
            config.max_connections_per_peer,
            defaults::MAX_CONNECTIONS_PER_PEER
        );
        assert_eq!(
            config.max_buffered_body_bytes,
            defaults::MAX_BUFFERED_BODY_BYTES
        );
        let big_bodies = Config::from_parts(Some("max_body_bytes = 100000000"), &secrets).unwrap();
        assert_eq!(big_bodies.max_buffered_body_bytes, 100_000_000);
        for text in [
            "max_body_bytes = 2000\nmax_buffered_body_bytes = 1000",
            "max_connections = 0",
            "max_connections_per_peer = 0",
        ] {
            assert!(Config::from_parts(Some(text), &secrets).is_err(), "{text}");
        }
    }

    #[test]
    fn a_broken_config_file_never_echoes_its_secrets() {
        for text in [
            "[[sources]]\nname = \"p\"\nsecrets = \"hunter2-secret\"\n",
            "[[sources]]\nname = \"p\"\nsecrets = [\"hunter2-secret\n",
            "admin_token = hunter2-secret\n",
        ] {
            let err = Config::from_parts(Some(text), &env(&[]))
                .unwrap_err()
                .to_string();
            assert!(!err.contains("hunter2"), "{err}");
            assert!(err.starts_with("config file, line "), "{err}");
        }
    }

    #[test]
    fn an_empty_admin_token_is_refused_by_name_never_by_value() {
        let secrets = [
            ("INHOOK_PRESENCE_SECRET", "a"),
            ("INHOOK_SAVE_GAME_SECRET", "b"),
        ];
        let err = Config::from_parts(Some("admin_token = \" \""), &env(&secrets)).unwrap_err();
        assert!(
            err.to_string().starts_with("admin_token is set but empty"),
            "{err}"
        );
        let mut with_empty_var = secrets.to_vec();
        with_empty_var.push(("INHOOK_ADMIN_TOKEN", ""));
        let err = Config::from_parts(
            Some("admin_token = \"file-token-value\""),
            &env(&with_empty_var),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("INHOOK_ADMIN_TOKEN is set but empty"),
            "{err}"
        );
        assert!(!err.contains("file-token-value"), "{err}");
        let config = Config::from_parts(None, &env(&secrets)).unwrap();
        assert!(config.admin_token.is_none(), "unset is no-token mode");
    }

    #[test]
    fn zero_config_needs_both_secrets() {
        let err = Config::from_parts(None, &env(&[("INHOOK_PRESENCE_SECRET", "a")])).unwrap_err();
        assert!(err.to_string().contains("INHOOK_SAVE_GAME_SECRET"), "{err}");
        let config = Config::from_parts(
            None,
            &env(&[
                ("INHOOK_PRESENCE_SECRET", "a"),
                ("INHOOK_SAVE_GAME_SECRET", "b, c"),
            ]),
        )
        .unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(config.database, Database::Sqlite("inhook.db".into()));
        let save = config.source("save-game").unwrap();
        assert_eq!(
            (save.mode, save.verifier.scheme()),
            (Mode::Async, Scheme::HmacTimestamped)
        );
        assert_eq!(save.secrets, vec![Secret::new("b"), Secret::new("c")]);
        let presence = config.source("presence").unwrap();
        assert_eq!(
            (presence.mode, presence.verifier.scheme()),
            (Mode::Sync, Scheme::HmacHex)
        );
    }

    #[test]
    fn the_environment_wins_over_the_file() {
        let text = r#"
            listen = "127.0.0.1:9000"
            [[sources]]
            name = "p"
            kind = "presence"
            secrets = ["from-file"]
        "#;
        let config =
            Config::from_parts(Some(text), &env(&[("INHOOK_P_SECRET", "from-env")])).unwrap();
        assert_eq!(config.listen.port(), 9000);
        assert_eq!(config.sources[0].secrets, vec![Secret::new("from-env")]);
        let err = Config::from_parts(Some("bogus = 1"), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }

    #[test]
    fn kept_headers_merge_the_top_level_and_the_source_lists_and_refuse_credentials() {
        let text = r#"
            keep_headers = ["X-Tenant"]
            [[sources]]
            name = "p"
            kind = "presence"
            secrets = ["s"]
            keep_headers = ["x-region", "x-tenant"]
        "#;
        let config = Config::from_parts(Some(text), &env(&[])).unwrap();
        assert_eq!(config.keep_headers, ["x-tenant"]);
        assert_eq!(config.sources[0].keep_headers, ["x-tenant", "x-region"]);
        for bad in ["X-Hub-Signature-256", "authorization", "not a header"] {
            let text = format!(
                "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nkeep_headers = [\"{bad}\"]\n"
            );
            let err = Config::from_parts(Some(&text), &env(&[]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("keep_headers"), "{err}");
        }
    }

    #[test]
    fn every_scheme_is_configurable_and_bad_keys_fail_at_start() {
        for scheme in crate::signature::Scheme::ALL {
            let text = format!(
                "[[sources]]\nname = \"s\"\nkind = \"presence\"\nsignature = \"{scheme}\"\nsecrets = [\"whsec_c2VjcmV0\"]\n"
            );
            let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
            assert_eq!(config.sources[0].verifier.scheme(), scheme);
        }
        let text = r#"
            [[sources]]
            name = "sw"
            kind = "presence"
            signature = "standard-webhooks"
            secrets = ["whsec_c2VjcmV0", "whpk_not-base64!"]
        "#;
        let err = Config::from_parts(Some(text), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("secret #1") && err.contains("whpk_"), "{err}");
        assert!(
            !err.contains("not-base64"),
            "the key must not be echoed: {err}"
        );
    }

    #[test]
    fn the_default_retry_policy_is_the_documented_one() {
        let secrets = env(&[
            ("INHOOK_PRESENCE_SECRET", "a"),
            ("INHOOK_SAVE_GAME_SECRET", "b"),
        ]);
        let config = Config::from_parts(None, &secrets).unwrap();
        // RetryPolicy::default (below config) states the same values: the two must agree.
        assert_eq!(config.retry, RetryPolicy::default());
    }

    #[test]
    fn stream_limits_default_and_must_allow_one() {
        let secrets = env(&[("INHOOK_P_SECRET", "s")]);
        let source = "[[sources]]\nname = \"p\"\nkind = \"presence\"\n";
        let config = Config::from_parts(Some(source), &secrets).unwrap();
        assert_eq!(config.max_streams, defaults::MAX_STREAMS);
        let config = Config::from_parts(Some(&format!("max_streams = 2\n{source}")), &secrets);
        assert_eq!(config.unwrap().max_streams, 2);
        let err = Config::from_parts(Some(&format!("max_streams = 0\n{source}")), &secrets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("max_streams"), "{err}");
        let err = Config::from_parts(Some(&format!("stream_buffer = 0\n{source}")), &secrets)
            .unwrap_err()
            .to_string();
        assert!(err.contains("stream_buffer"), "{err}");
    }

    /// A `json` source with the given signature lines, as the configurable schemes' tests write it.
    #[test]
    fn public_key_sources_read_public_keys_and_keep_their_signature_header_secret() {
        let key = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
        let source = |extra: &str| {
            format!(
                "[[sources]]\nname = \"d\"\nkind = \"json\"\nevent_id = \"/id\"\nordering = \"unordered\"\nsignature = \"ed25519\"\nsignature_header = \"X-Signature-Ed25519\"\n{extra}\n"
            )
        };
        let config = Config::from_parts(
            Some(&source(&format!("public_keys = [\"{key}\"]"))),
            &env(&[]),
        )
        .unwrap();
        assert_eq!(config.sources[0].secrets.len(), 1);
        assert_eq!(
            config.sources[0].verifier.secret_headers(),
            vec!["x-signature-ed25519"]
        );
        let from_env = Config::from_parts(
            Some(&source("")),
            &env(&[("INHOOK_D_PUBLIC_KEYS", &format!("{key},{key}"))]),
        )
        .unwrap();
        assert!(from_env.sources[0].secrets_from_environment);
        assert_eq!(from_env.sources[0].secrets.len(), 2);
        for (extra, named) in [
            ("", "public_keys: entry #0 is missing"),
            (
                &format!("public_keys = [\"{key}\"]\nsecrets = [\"s\"]") as &str,
                "secrets are not used",
            ),
            (
                &format!("public_keys = [\"{key}\"]\nkeep_headers = [\"X-Signature-Ed25519\"]"),
                "keep_headers: x-signature-ed25519",
            ),
            (
                &format!("public_keys = [\"{key}\"]\nsignature_algorithm = \"sha1\""),
                "signature_algorithm is only for signature = \"hmac\"",
            ),
        ] {
            let err = Config::from_parts(Some(&source(extra)), &env(&[])).unwrap_err();
            assert!(err.to_string().contains(named), "{extra}: {err}");
        }
        let err =
            configurable("signature = \"hmac\"\nsignature_header = \"X-S\"\npublic_keys = [\"k\"]")
                .unwrap_err();
        assert!(
            err.to_string()
                .contains("public_keys is only for signature = \"ed25519\" or \"ecdsa-p256\""),
            "{err}"
        );
    }

    fn configurable(lines: &str) -> Result<Config, ConfigError> {
        let text = format!(
            "[[sources]]\nname = \"c\"\nkind = \"json\"\nevent_id = \"/id\"\naggregate = \"/a\"\nordering = \"unordered\"\n{lines}\n"
        );
        Config::from_parts(
            Some(&text),
            &env(&[("INHOOK_C_SECRET", "user:sixteen-bytes-pass")]),
        )
    }

    #[test]
    fn configurable_schemes_parse_into_their_settings() {
        let config = configurable(
            "signature = \"hmac\"\nsignature_header = \"Paddle-Signature\"\n\
             signature_format = \"pairs\"\nsignature_key = \"h1\"\ntimestamp_key = \"ts\"\n\
             signed_content = \"{timestamp}:{body}\"",
        )
        .unwrap();
        let verifier = &config.sources[0].verifier;
        assert_eq!(verifier.scheme(), Scheme::Hmac);
        assert!(verifier.is_timestamped() && !verifier.dedups_by_body());
        let config =
            configurable("signature = \"hmac\"\nsignature_header = \"Linear-Signature\"").unwrap();
        assert!(config.sources[0].verifier.dedups_by_body());
        let config =
            configurable("signature = \"token\"\ntoken_header = \"X-Gitlab-Token\"").unwrap();
        assert_eq!(
            config.sources[0].verifier.secret_headers(),
            vec!["x-gitlab-token"]
        );
        assert!(configurable("signature = \"basic\"").is_ok());
        // {url} takes the top-level public_url, or the source's.
        let text = "public_url = \"https://hooks.example.com/\"\n[[sources]]\nname = \"c\"\n\
                    kind = \"json\"\nevent_id = \"/id\"\naggregate = \"/a\"\nordering = \"unordered\"\nsignature = \"hmac\"\n\
                    signature_header = \"X-Sig\"\nsigned_content = \"{url}{body}\"\n";
        let config = Config::from_parts(Some(text), &env(&[("INHOOK_C_SECRET", "s")])).unwrap();
        let crate::signature::Verifier::Hmac(hmac) = &config.sources[0].verifier else {
            panic!("not hmac");
        };
        assert_eq!(
            hmac.public_url.as_deref(),
            Some("https://hooks.example.com")
        );
    }

    #[test]
    fn aws_sns_sources_need_no_secret_nor_event_id_and_bad_hosts_name_the_key() {
        let base = "[[sources]]\nname = \"sns\"\nkind = \"json\"\nsignature = \"aws-sns\"\n\
                    unwrap = \"/Message\"\naggregate = \"/a\"\nordering = \"unordered\"\n";
        let text =
            format!("{base}sns_topic_arns = [\"arn:aws:sns:eu-west-1:123456789012:orders\"]\n");
        let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
        let Verifier::AwsSns(sns) = &config.sources[0].verifier else {
            panic!("{:?}", config.sources[0].verifier);
        };
        assert!(sns
            .cert_url(
                "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem"
            )
            .is_ok());
        assert_eq!(
            sns.topic_arns,
            ["arn:aws:sns:eu-west-1:123456789012:orders"]
        );
        assert!(config.sources[0].secrets.is_empty());
        for (lines, key) in [
            (
                "sns_cert_hosts = [\"sns.*x.amazonaws.com\"]",
                "sns_cert_hosts",
            ),
            ("sns_cert_hosts = []", "sns_cert_hosts"),
        ] {
            let err = Config::from_parts(Some(&format!("{text}{lines}\n")), &env(&[]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("source \"sns\": ") && err.contains(key),
                "{lines}: {err}"
            );
        }
        for lines in [
            "sns_topic_arns = []",
            "sns_topic_arns = [\"arn:aws:sns:eu-west-1:*:orders\"]",
        ] {
            let err = Config::from_parts(Some(&format!("{base}{lines}\n")), &env(&[]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("source \"sns\": sns_topic_arns"),
                "{lines}: {err}"
            );
        }
        let err = configurable(
            "signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsns_cert_hosts = [\"localhost\"]",
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("sns_cert_hosts is only for signature = \"aws-sns\""),
            "{err}"
        );
    }

    #[test]
    fn aws_sns_sources_must_name_their_topics_in_the_file_or_the_environment() {
        let base = "[[sources]]\nname = \"orders-sns\"\nkind = \"json\"\nsignature = \"aws-sns\"\n\
                    aggregate = \"/a\"\nordering = \"unordered\"\n";
        let err = Config::from_parts(Some(base), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("source \"orders-sns\": sns_topic_arns is required")
                && err.contains("INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS"),
            "{err}"
        );
        // The variable replaces the file's list; comma-separated, spaces trimmed.
        let topics = " arn:aws:sns:us-east-1:123456789012:a , arn:aws:sns:us-east-1:123456789012:b";
        let var = [("INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS", topics)];
        let file = format!("{base}sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:c\"]\n");
        for text in [base, file.as_str()] {
            let config = Config::from_parts(Some(text), &env(&var)).unwrap();
            let Verifier::AwsSns(sns) = &config.sources[0].verifier else {
                panic!("{:?}", config.sources[0].verifier);
            };
            assert_eq!(
                sns.topic_arns,
                [
                    "arn:aws:sns:us-east-1:123456789012:a",
                    "arn:aws:sns:us-east-1:123456789012:b"
                ]
            );
        }
        for bad in ["", " , ", "arn:aws:sns:us-east-1:123456789012:*"] {
            let err = Config::from_parts(
                Some(base),
                &env(&[("INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS", bad)]),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.starts_with("source \"orders-sns\": sns_topic_arns")
                    && err.contains("from INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS"),
                "{bad:?}: {err}"
            );
        }
        // Another scheme's source never reads the variable.
        let other = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\n";
        assert!(Config::from_parts(
            Some(other),
            &env(&[(
                "INHOOK_P_SNS_TOPIC_ARNS",
                "arn:aws:sns:us-east-1:123456789012:a"
            )])
        )
        .is_ok());
    }

    #[test]
    fn configurable_settings_that_cannot_work_name_the_key() {
        for (lines, key) in [
            ("signature = \"hmac\"", "signature_header"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsignature_algorithm = \"md5\"", "signature_algorithm"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{timestamp}{body}\"", "signed_content"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{url}{body}\"", "signed_content"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{bdoy}\"", "signed_content"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{body\"", "signed_content"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\ntimestamp_key = \"t\"", "timestamp_key"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\ntoken_header = \"X-T\"", "token_header"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\npublic_url = \"ftp://x\"", "public_url"),
            ("signature = \"token\"", "token_header"),
            ("signature = \"token\"\ntoken_header = \"X-T\"\ntoken_query = \"t\"", "token_query"),
            ("signature = \"github\"\nsignature_header = \"X-Sig\"", "signature_header"),
            ("signature = \"basic\"\ntimestamp = \"/ts\"", "timestamp"),
            ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nkeep_headers = [\"x-sig\"]", "keep_headers"),
            ("signature = \"token\"\ntoken_header = \"User-Agent\"", "token_header"),
            ("signature = \"token\"\ntoken_header = \"X-T\"\nsequence = \"header:X-T\"", "sequence"),
        ] {
            let err = configurable(lines).unwrap_err().to_string();
            assert!(err.starts_with("source \"c\": ") && err.contains(key), "{lines}: {err}");
            if matches!(key, "keep_headers" | "sequence") {
                assert!(err.contains("carries the source's signature or token"), "{err}");
            }
        }
        // A Basic secret must be user:password, and the error does not show it.
        let text = "[[sources]]\nname = \"c\"\nkind = \"json\"\nevent_id = \"/id\"\n\
                    aggregate = \"/a\"\nordering = \"unordered\"\nsignature = \"basic\"\n";
        let err = Config::from_parts(Some(text), &env(&[("INHOOK_C_SECRET", "hunter2")]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("user:password") && !err.contains("hunter2"),
            "{err}"
        );
        let err = Config::from_parts(Some("public_url = \"x\""), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("public_url"), "{err}");
    }

    #[test]
    fn blank_or_guessable_shared_secrets_are_refused_by_position_never_by_value() {
        let base = "[[sources]]\nname = \"c\"\nkind = \"json\"\nevent_id = \"/id\"\n\
                    aggregate = \"/a\"\nordering = \"unordered\"\n";
        for (scheme, secret, why) in [
            (
                "signature = \"token\"\ntoken_header = \"X-T\"",
                "t",
                "shorter than 16 bytes",
            ),
            (
                "signature = \"token\"\ntoken_query = \"t\"",
                "fifteen-bytes!!",
                "shorter than 16 bytes",
            ),
            ("signature = \"basic\"", ":", "empty user"),
            (
                "signature = \"basic\"",
                ":a-long-enough-password",
                "empty user",
            ),
            (
                "signature = \"basic\"",
                "hook:pw-12345",
                "password shorter than 16 bytes",
            ),
            (
                "signature = \"hmac\"\nsignature_header = \"X-S\"",
                "   ",
                "is blank",
            ),
            ("signature = \"github\"", " \t", "is blank"),
        ] {
            let text = format!("{base}{scheme}\nsecrets = [\"sixteen-bytes-ok\", {secret:?}]\n");
            let text = text.replace(
                "sixteen-bytes-ok",
                if scheme.contains("basic") {
                    "u:sixteen-bytes-ok"
                } else {
                    "sixteen-bytes-ok"
                },
            );
            let err = Config::from_parts(Some(&text), &env(&[]))
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("source \"c\": secret #1 ") && err.contains(why),
                "{secret:?}: {err}"
            );
            if secret.trim().len() > 1 {
                assert!(!err.contains(secret), "{err}");
            }
        }
        // Sixteen bytes of token, a user and sixteen bytes of password, any HMAC key.
        for (scheme, secret) in [
            (
                "signature = \"token\"\ntoken_header = \"X-T\"",
                "sixteen-bytes-ok",
            ),
            ("signature = \"basic\"", "u:sixteen-bytes-ok"),
            ("signature = \"hmac\"\nsignature_header = \"X-S\"", "k"),
        ] {
            let text = format!("{base}{scheme}\nsecrets = [{secret:?}]\n");
            assert!(
                Config::from_parts(Some(&text), &env(&[])).is_ok(),
                "{scheme}"
            );
        }
    }

    #[test]
    fn a_handshake_is_parsed_at_start_and_an_unknown_one_names_the_key() {
        use crate::handshake::Handshake;
        for h in Handshake::ALL {
            let scheme = publisher_scheme_lines(h).unwrap_or("signature = \"basic\"");
            let config = configurable(&format!("{scheme}\nhandshake = \"{h}\"")).unwrap();
            assert_eq!(config.sources[0].handshake, Some(h));
        }
        let config = configurable("signature = \"basic\"").unwrap();
        assert_eq!(config.sources[0].handshake, None);
        let err = configurable("signature = \"basic\"\nhandshake = \"slak\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("source \"c\": handshake \"slak\"") && err.contains("x-crc"),
            "{err}"
        );
    }

    #[test]
    fn a_handshake_answered_with_a_secret_needs_one() {
        let text = "[[sources]]\nname = \"z\"\nkind = \"json\"\nevent_id = \"/id\"\n\
                    aggregate = \"/a\"\nordering = \"unordered\"\nsignature = \"github\"\n\
                    handshake = \"zoom\"\n";
        let secrets = handshake("z", Some("zoom"), &[], Secrets::Required)
            .unwrap_err()
            .to_string();
        assert!(
            secrets.contains("handshake = \"zoom\"") && secrets.contains("INHOOK_Z_SECRET"),
            "{secrets}"
        );
        assert!(handshake("z", Some("x-crc"), &[], Secrets::Required).is_err());
        assert!(handshake("z", Some("dropbox"), &[], Secrets::Required).is_ok());
        let text = text.replace("signature = \"github\"\n", &format!("{ZOOM_LINES}\n"));
        let config = Config::from_parts(Some(&text), &env(&[("INHOOK_Z_SECRET", "zs")])).unwrap();
        assert_eq!(
            config.sources[0].handshake,
            Some(crate::handshake::Handshake::Zoom)
        );
    }

    const X_LINES: &str =
        "signature = \"hmac\"\nsignature_header = \"x-twitter-webhooks-signature\"\n\
                           signature_prefix = \"sha256=\"\nsignature_encoding = \"base64\"";
    const ZOOM_LINES: &str = "signature = \"hmac\"\nsignature_header = \"x-zm-signature\"\n\
                              signature_prefix = \"v0=\"\ntimestamp = \"header:x-zm-request-timestamp\"\n\
                              signed_content = \"v0:{timestamp}:{body}\"";
    const GRAPH_LINES: &str = "signature = \"token\"\ntoken_query = \"token\"";

    /// The scheme lines of a handshake's publisher, for one allowed only with it.
    fn publisher_scheme_lines(h: crate::handshake::Handshake) -> Option<&'static str> {
        use crate::handshake::Handshake;
        match h {
            Handshake::XCrc => Some(X_LINES),
            Handshake::Zoom => Some(ZOOM_LINES),
            Handshake::Msgraph => Some(GRAPH_LINES),
            _ => None,
        }
    }

    #[test]
    fn a_handshake_answered_with_the_secret_is_allowed_only_with_its_publishers_scheme() {
        use crate::handshake::Handshake;
        // The red team's forgeries: x-crc on github and stripe sources (a crc answer is
        // the HMAC of any token, so of "{t}.{body}" too), zoom on another hmac.
        for (h, lines, has) in [
            (Handshake::XCrc, "signature = \"github\"", "has signature = \"github\""),
            (Handshake::XCrc, "signature = \"stripe\"", "has signature = \"stripe\""),
            (
                Handshake::XCrc,
                "signature = \"hmac\"\nsignature_header = \"x-twitter-webhooks-signature\"\n\
                 signature_prefix = \"sha256=\"\nsignature_encoding = \"base64\"\n\
                 timestamp = \"header:X-Ts\"\nsigned_content = \"{timestamp}.{body}\"",
                "signature = \"hmac\" has other settings",
            ),
            (Handshake::XCrc, ZOOM_LINES, "other settings"),
            (
                Handshake::XCrc,
                &format!("{X_LINES}\nbody_format = \"form\""),
                "has body_format = \"form\"",
            ),
            (Handshake::Zoom, "signature = \"slack\"", "has signature = \"slack\""),
            (Handshake::Zoom, X_LINES, "other settings"),
            (
                Handshake::Zoom,
                "signature = \"hmac\"\nsignature_header = \"x-zm-signature\"\nsignature_prefix = \"v0=\"",
                "other settings",
            ),
            (Handshake::Msgraph, "signature = \"basic\"", "has signature = \"basic\""),
            (
                Handshake::Msgraph,
                "signature = \"token\"\ntoken_header = \"X-Graph-Token\"",
                "signature = \"token\" has other settings",
            ),
        ] {
            let err = configurable(&format!("{lines}\nhandshake = \"{h}\""))
                .unwrap_err()
                .to_string();
            let allowed = h.publisher_scheme().unwrap();
            assert!(
                err.starts_with(&format!("source \"c\": handshake = \"{h}\" is allowed only with"))
                    && err.contains(allowed)
                    && err.contains(has),
                "{h} with {lines}: {err}"
            );
        }
        // Echo handshakes answer nothing computed with the secret: any scheme.
        for h in [
            Handshake::Slack,
            Handshake::Discord,
            Handshake::Twitch,
            Handshake::Dropbox,
            Handshake::Okta,
            Handshake::Websub,
        ] {
            assert!(h.publisher_scheme().is_none());
            configurable(&format!("signature = \"github\"\nhandshake = \"{h}\"")).unwrap();
        }
        // A preset's handshake comes with its scheme; written over, the error names the preset.
        for (preset, over) in [
            ("x-activity", "signature_encoding = \"hex\""),
            ("zoom", "signed_content = \"{timestamp}.{body}\""),
            ("msgraph", ""),
        ] {
            let text = format!("[[sources]]\nname = \"p\"\npreset = \"{preset}\"\n");
            Config::from_parts(
                Some(&text),
                &env(&[("INHOOK_P_SECRET", "s3cret-value-of-24-bytes")]),
            )
            .unwrap();
            if over.is_empty() {
                continue;
            }
            let text = format!("{text}{over}\n");
            let err = Config::from_parts(
                Some(&text),
                &env(&[("INHOOK_P_SECRET", "s3cret-value-of-24-bytes")]),
            )
            .unwrap_err()
            .to_string();
            assert!(
                err.contains("is allowed only with") && err.contains(preset),
                "{preset}: {err}"
            );
        }
    }
}
