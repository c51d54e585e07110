//! `[[destinations]]` (SPEC §9): where applied events are forwarded, read from the
//! file and the environment and validated at start. Every refusal names the key.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, SourceConfig};
use crate::contract::json::Glob;
use crate::retry::RetryPolicy;
use crate::signature::standard_webhooks::Key;
use crate::signature::Secret;

/// Seconds a forwarded request may take when `timeout_s` is unset.
pub const DEFAULT_TIMEOUT_S: u64 = 10;
/// Requests on the wire at once when `concurrency` is unset.
pub const DEFAULT_CONCURRENCY: usize = 32;

/// One configured destination, validated.
#[derive(Debug, Clone)]
pub struct DestinationConfig {
    /// The name in `/v1/destinations/{name}` and in metrics.
    pub name: String,
    /// Where requests are POSTed: an `http://` or `https://` URL.
    pub url: String,
    /// The sources whose applied events go there.
    pub sources: Vec<String>,
    /// Only events whose type matches one of these patterns; every type when unset.
    pub event_types: Option<Vec<String>>,
    /// `event_types` compiled.
    pub event_type_globs: Option<Vec<Glob>>,
    /// The Standard Webhooks `whsec_` secret requests are signed with.
    pub secret: Secret,
    /// Whether `secret` came from `INHOOK_DEST_<NAME>_SECRET`: edits to the file's then change nothing.
    pub secret_from_environment: bool,
    /// How long one request may take, in seconds.
    pub timeout_s: u64,
    /// Backoff and attempts (the top-level keys unless the destination sets its own).
    pub retry: RetryPolicy,
    /// Requests on the wire at once (aggregates waiting to retry do not count).
    pub concurrency: usize,
    /// Requests per second at most; none when unset.
    pub rate_limit_per_s: Option<u32>,
    /// A PEM file of the CA certificates `https://` requests verify against instead of the system's roots.
    pub tls_ca_file: Option<PathBuf>,
}

impl DestinationConfig {
    /// Whether an applied event of `source` with type `event_type` goes to this destination.
    pub fn wants(&self, source: &str, event_type: &str) -> bool {
        self.sources.iter().any(|s| s == source)
            && self
                .event_type_globs
                .as_ref()
                .is_none_or(|globs| globs.iter().any(|g| g.matches(event_type)))
    }

    /// The keys whose value differs from `other`'s, the secret aside (a reload may only rotate it).
    pub fn changed_keys(&self, other: &DestinationConfig) -> Vec<&'static str> {
        [
            ("url", self.url != other.url),
            ("sources", self.sources != other.sources),
            ("event_types", self.event_types != other.event_types),
            ("timeout_s", self.timeout_s != other.timeout_s),
            (
                "max_attempts",
                self.retry.max_attempts != other.retry.max_attempts,
            ),
            ("retry_base_s", self.retry.base_ms != other.retry.base_ms),
            (
                "retry_max_delay_s",
                self.retry.max_delay_ms != other.retry.max_delay_ms,
            ),
            ("concurrency", self.concurrency != other.concurrency),
            (
                "rate_limit_per_s",
                self.rate_limit_per_s != other.rate_limit_per_s,
            ),
            ("tls_ca_file", self.tls_ca_file != other.tls_ca_file),
        ]
        .into_iter()
        .filter_map(|(key, changed)| changed.then_some(key))
        .collect()
    }
}

/// A `[[destinations]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileDestination {
    name: String,
    url: Option<String>,
    sources: Option<Vec<String>>,
    event_types: Option<Vec<String>>,
    secret: Option<String>,
    timeout_s: Option<u64>,
    max_attempts: Option<u32>,
    concurrency: Option<usize>,
    rate_limit_per_s: Option<u32>,
    retry_base_s: Option<u64>,
    retry_max_delay_s: Option<u64>,
    tls_ca_file: Option<PathBuf>,
}

/// The environment variable that holds a destination's secret.
pub fn destination_secret_env_var(destination: &str) -> String {
    format!(
        "INHOOK_DEST_{}_SECRET",
        destination.to_uppercase().replace('-', "_")
    )
}

/// Validates the file's destinations against the configured `sources`; `defaults` is the
/// top-level retry policy. `secrets_required` is false for commands that only open the store.
pub(super) fn destinations(
    file: Vec<FileDestination>,
    env: &HashMap<String, String>,
    sources: &[SourceConfig],
    defaults: RetryPolicy,
    secrets_required: bool,
) -> Result<Vec<DestinationConfig>, ConfigError> {
    let mut out: Vec<DestinationConfig> = Vec::with_capacity(file.len());
    for d in file {
        if d.name.is_empty()
            || !d
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(ConfigError(format!(
                "destination name {:?} must be non-empty letters, digits, '-' or '_'",
                d.name
            )));
        }
        if out.iter().any(|o| o.name == d.name) {
            return Err(ConfigError(format!(
                "destination {:?} is configured twice",
                d.name
            )));
        }
        let name = d.name;
        let problem =
            |key: &str, text: String| ConfigError(format!("destination {name:?}: {key} {text}"));
        let url = d
            .url
            .ok_or_else(|| problem("url", "is required (the application's endpoint)".into()))?;
        let https = check_url(&url).map_err(|text| problem("url", text))?;
        let sources_named = d.sources.unwrap_or_default();
        if sources_named.is_empty() {
            return Err(problem(
                "sources",
                "is required: the sources whose applied events are forwarded, e.g. [\"stripe\"]"
                    .into(),
            ));
        }
        for source in &sources_named {
            if !sources.iter().any(|s| &s.name == source) {
                return Err(problem(
                    "sources",
                    format!("names {source:?}, which is not a configured source"),
                ));
            }
        }
        let event_types = d.event_types;
        if event_types.as_ref().is_some_and(|t| t.is_empty()) {
            return Err(problem(
                "event_types",
                "is empty: it would forward nothing; remove it to forward every type".into(),
            ));
        }
        let event_type_globs = event_types
            .as_ref()
            .map(|patterns| patterns.iter().map(|p| Glob::new(p)).collect());
        let var = destination_secret_env_var(&name);
        let secret_from_environment = env.contains_key(&var);
        let raw_secret = env
            .get(&var)
            .cloned()
            .or(d.secret)
            .map(|s| s.trim().to_owned())
            .unwrap_or_default();
        let secret = Secret::new(raw_secret);
        if secret.expose().is_empty() {
            if secrets_required {
                return Err(problem(
                    "secret",
                    format!(
                        "is required: set {var} or `secret` (whsec_<base64>) in the config file"
                    ),
                ));
            }
        } else {
            check_secret(&secret).map_err(|text| problem("secret", text.into()))?;
        }
        let timeout_s = d.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S);
        if timeout_s == 0 {
            return Err(problem("timeout_s", "must be at least 1".into()));
        }
        let max_attempts = d.max_attempts.unwrap_or(defaults.max_attempts);
        if max_attempts == 0 {
            return Err(problem(
                "max_attempts",
                "must be at least 1 (the first request counts)".into(),
            ));
        }
        let concurrency = d.concurrency.unwrap_or(DEFAULT_CONCURRENCY);
        if concurrency == 0 {
            return Err(problem(
                "concurrency",
                "must be at least 1 (requests on the wire at once)".into(),
            ));
        }
        let retry = RetryPolicy {
            base_ms: d
                .retry_base_s
                .map_or(defaults.base_ms, |s| (s as i64).saturating_mul(1000)),
            max_delay_ms: d
                .retry_max_delay_s
                .map_or(defaults.max_delay_ms, |s| (s as i64).saturating_mul(1000)),
            max_attempts,
        };
        if let Some(path) = &d.tls_ca_file {
            if !https {
                return Err(problem("tls_ca_file", "is only for https:// urls".into()));
            }
            check_ca_file(path).map_err(|text| problem("tls_ca_file", text))?;
        }
        out.push(DestinationConfig {
            name,
            url,
            sources: sources_named,
            event_types,
            event_type_globs,
            secret,
            secret_from_environment,
            timeout_s,
            retry,
            concurrency,
            rate_limit_per_s: d.rate_limit_per_s.filter(|r| *r > 0),
            tls_ca_file: d.tls_ca_file,
        });
    }
    Ok(out)
}

/// Checks a destination URL; true for `https://`. The explanation never repeats the URL,
/// which may carry credentials.
fn check_url(raw: &str) -> Result<bool, String> {
    let url = reqwest::Url::parse(raw)
        .map_err(|e| format!("is not a URL ({e}); expected https://host/path"))?;
    let https = match url.scheme() {
        "https" => true,
        "http" => false,
        other => {
            return Err(format!(
                "has scheme {other:?}: only http:// and https:// are forwarded to"
            ))
        }
    };
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host".into());
    }
    if url.fragment().is_some() {
        return Err("has a #fragment, which is never sent".into());
    }
    Ok(https)
}

/// Checks that a secret can sign Standard Webhooks `v1`: an HMAC key (`whsec_<base64>`).
fn check_secret(secret: &Secret) -> Result<(), &'static str> {
    match Key::parse(secret)? {
        Key::Hmac(_) => Ok(()),
        Key::Public(_) | Key::Private(_) => Err(
            "must be a whsec_ secret: forwarded requests are signed with Standard Webhooks v1 (HMAC)",
        ),
    }
}

/// Checks that a CA file can be read and holds a PEM certificate.
fn check_ca_file(path: &std::path::Path) -> Result<(), String> {
    let text =
        std::fs::read(path).map_err(|e| format!("{}: cannot be read ({e})", path.display()))?;
    if !text
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(format!(
            "{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(())
}
