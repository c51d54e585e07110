//! Configuration (docs/configuration.md): built-in defaults, then a TOML file, then
//! `INHOOK_*` environment variables. Validated once, at start.
//!
//! The file is flat, but each top-level key belongs to one section, a module of its own
//! with its keys, its variables, its defaults and its checks ([`http`], [`store`],
//! [`admin`], [`processing`], [`observability`]); the sources and destinations are tables
//! ([`source`], `destination`). A new top-level key is one line in its section's
//! `file_section!`, one field in its `section!` (with its doc comment and whether a reload
//! may change it), its default in the section's `Default` and its reading in `resolve`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::domain::kind::json::JsonKind;
use crate::ingress::signature::Secret;

/// The keys among `"key" => field.path` whose field differs between `$a` and `$b`, in the
/// order given: what a reload names as needing a restart of a destination or its target.
macro_rules! changed_keys {
    ($a:expr, $b:expr, [$($key:literal => $($field:ident).+),* $(,)?]) => {
        [$(($key, $a.$($field).+ != $b.$($field).+)),*]
            .into_iter()
            .filter_map(|(key, changed)| changed.then_some(key))
            .collect::<Vec<&'static str>>()
    };
}

pub mod admin;
pub mod alerts;
pub mod defaults;
mod destination;
pub mod env_vars;
mod file;
pub mod http;
pub mod observability;
pub mod processing;
mod reload;
pub mod response;
mod section;
pub mod source;
pub mod store;
pub mod target;
pub mod template;
#[cfg(test)]
mod tests;

pub use admin::{Admin, MIN_ADMIN_TOKEN_BYTES};
pub use destination::{
    destination_secret_env_var, destination_url_env_var, in_process_url, DestinationConfig,
};
pub use env_vars::{public_keys_env_var, secret_env_var, sns_topic_arns_env_var};
pub use http::{Http, BODY_RATE_GRACE_S};
pub use observability::Observability;
pub use processing::Processing;
pub use reload::{check_reload, LiveSecrets, ReloadPlan};
pub use response::SourceResponse;
pub use source::{check_source_name, SourceConfig};
pub use store::{Database, Store};
pub use target::Target;

pub use crate::domain::Mode;

use admin::GENERATED_TOKEN_BYTES;
use file::FileConfig;

/// The validated configuration of one inhook process: its sections, then its tables.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where inhook listens and what a request may cost.
    pub http: Http,
    /// The event log: where it lives and how it is written.
    pub store: Store,
    /// The admin API: its token, masking, streams and optional endpoints.
    pub admin: Admin,
    /// The workers, retries, retention and shutdown.
    pub processing: Processing,
    /// Logs, traces and alerts.
    pub observability: Observability,
    /// The sources, in config order.
    pub sources: Vec<SourceConfig>,
    /// Where applied events are forwarded (docs/forwarding.md), in config order.
    pub destinations: Arc<[DestinationConfig]>,
    /// The file this config was read from, read again on a reload.
    pub loaded_from: Option<PathBuf>,
}

impl Config {
    /// With neither an `admin_token` nor `admin_open_to_loopback`, makes a random token for
    /// this run and answers it (for the operator, once): no admin API without a token unless
    /// the user opted in. `None` when a token is configured or loopback is opted in.
    pub fn generate_admin_token(&mut self) -> Option<String> {
        if self.admin.admin_token.is_some() || self.admin.admin_open_to_loopback {
            return None;
        }
        let token: String = (0..GENERATED_TOKEN_BYTES)
            .map(|_| format!("{:02x}", rand::random::<u8>()))
            .collect();
        self.admin.admin_token = Some(Secret::new(token.clone()));
        self.admin.admin_token_generated = true;
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
            .and_then(|c| c.admin.admin_token.as_ref())
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

    /// The layers in order (docs/configuration.md): each section starts from its built-in
    /// defaults, takes the file's keys, then the `INHOOK_*` variables over them, and is
    /// validated; the sources, destinations and alerts follow from the sections.
    fn build(
        text: Option<&str>,
        env: &HashMap<String, String>,
        secret_rule: Secrets,
    ) -> Result<Self, ConfigError> {
        let mut file = FileConfig::parse(text)?;
        file.apply_env(env)?;
        let http = Http::resolve(file.http)?;
        let store = Store::resolve(file.store)?;
        let admin = Admin::resolve(file.admin)?;
        let processing = Processing::resolve(file.processing);
        let tables = file.tables;
        let public_url = match tables.public_url {
            Some(raw) => Some(
                crate::ingress::signature::configurable::parse_public_url(&raw)
                    .map_err(|e| ConfigError(format!("public_url: {e}")))?,
            ),
            None => None,
        };
        let sources = source::sources(
            tables.sources,
            env,
            &http.keep_headers,
            public_url.as_deref(),
            secret_rule,
        )?;
        let destinations: Arc<[DestinationConfig]> = destination::destinations(
            tables.destinations.unwrap_or_default(),
            env,
            &sources,
            processing.retry,
            secret_rule == Secrets::Required,
        )?
        .into();
        let alerts = alerts::alerts(tables.alerts.unwrap_or_default(), &sources, &destinations)?;
        let observability = Observability::resolve(file.observability, alerts.into())?;
        Ok(Self {
            http,
            store,
            admin,
            processing,
            observability,
            sources,
            destinations,
            loaded_from: None,
        })
    }
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

/// Header names of a `keep_headers` list in lower case, refusing any that is not a
/// header name or that carries a signature or a credential.
fn header_names(setting: &str, names: Vec<String>) -> Result<Vec<String>, ConfigError> {
    names
        .into_iter()
        .map(|name| {
            let name = name.trim().to_ascii_lowercase();
            match crate::ingress::kept_headers::refusal(&name) {
                Some(problem) => Err(ConfigError(format!("{setting}: {name:?} {problem}"))),
                None => Ok(name),
            }
        })
        .collect()
}

/// The admin token set by `key`, refused when empty: an empty token would silently
/// An environment of `pairs`, as the config's tests read it.
#[cfg(test)]
pub(crate) fn test_env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}
