//! `[[destinations]]` (docs/contract.md, forwarding): where applied events are forwarded, read from
//! the file and the environment and validated at start. Every refusal names the key.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::{ConfigError, SourceConfig};
use crate::kind::json::contract::Glob;
use crate::retry::RetryPolicy;
use crate::signature::standard_webhooks::Key;
use crate::signature::Secret;

/// Seconds a forwarded request may take when `timeout_s` is unset.
pub const DEFAULT_TIMEOUT_S: u64 = 10;
/// Seconds a claim outlasts `timeout_s` when `lease_margin_s` is unset.
pub const DEFAULT_LEASE_MARGIN_S: u64 = 30;
/// Requests on the wire at once when `concurrency` is unset.
pub const DEFAULT_CONCURRENCY: usize = 32;

/// One configured destination, validated. Its Debug output shows the URL without
/// credentials and never the secret.
#[derive(Clone)]
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
    /// How much longer than `timeout_s` a claimed delivery stays leased to its node, in
    /// seconds: after a crash, its in-flight deliveries wait that long to be sent again.
    pub lease_margin_s: u64,
    /// Backoff and attempts (the top-level keys unless the destination sets its own).
    pub retry: RetryPolicy,
    /// Requests on the wire at once (aggregates waiting to retry do not count).
    pub concurrency: usize,
    /// Requests per second at most; none when unset.
    pub rate_limit_per_s: Option<u32>,
    /// A PEM file of the CA certificates `https://` requests verify against instead of the system's roots.
    pub tls_ca_file: Option<PathBuf>,
}

impl std::fmt::Debug for DestinationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestinationConfig")
            .field("name", &self.name)
            .field("url", &self.url_for_display())
            .field("sources", &self.sources)
            .field("event_types", &self.event_types)
            .field("secret", &self.secret)
            .field("secret_from_environment", &self.secret_from_environment)
            .field("timeout_s", &self.timeout_s)
            .field("lease_margin_s", &self.lease_margin_s)
            .field("retry", &self.retry)
            .field("concurrency", &self.concurrency)
            .field("rate_limit_per_s", &self.rate_limit_per_s)
            .field("tls_ca_file", &self.tls_ca_file)
            .finish()
    }
}

impl DestinationConfig {
    /// The URL as logs, errors and API answers may show it: any `user:password@` replaced by
    /// `***@`, every query value by `***` (a `?token=…` is a credential too; the names stay,
    /// so the user can tell which URL it is), and no fragment.
    pub fn url_for_display(&self) -> String {
        let Ok(mut url) = reqwest::Url::parse(&self.url) else {
            return "(not a url)".into();
        };
        if !url.username().is_empty() || url.password().is_some() {
            let _ = url.set_password(None);
            let _ = url.set_username("***");
        }
        if url.query().is_some() {
            let names: Vec<String> = url
                .query_pairs()
                .map(|(name, _)| name.into_owned())
                .collect();
            url.query_pairs_mut()
                .clear()
                .extend_pairs(names.iter().map(|name| (name, "***")));
        }
        url.set_fragment(None);
        url.to_string()
    }

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
                "lease_margin_s",
                self.lease_margin_s != other.lease_margin_s,
            ),
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
    lease_margin_s: Option<u64>,
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
        // One variable must not feed two secrets: `dest-app` the source and `app` the
        // destination, or `my-app` and `my_app`, would share theirs.
        if let Some(source) = sources
            .iter()
            .find(|s| super::secret_env_var(&s.name) == var)
        {
            return Err(problem(
                "name",
                format!("shares {var} with source {:?}: rename one", source.name),
            ));
        }
        if let Some(other) = out
            .iter()
            .find(|o| destination_secret_env_var(&o.name) == var)
        {
            return Err(problem(
                "name",
                format!("shares {var} with destination {:?}: rename one", other.name),
            ));
        }
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
        let lease_margin_s = d.lease_margin_s.unwrap_or(DEFAULT_LEASE_MARGIN_S);
        if lease_margin_s == 0 {
            return Err(problem(
                "lease_margin_s",
                "must be at least 1 (time to read the event and record the answer)".into(),
            ));
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
            lease_margin_s,
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

#[cfg(test)]
mod tests {
    use super::super::Config;
    use super::*;

    const SOURCES: &str = r#"
        retry_base_s = 2
        retry_max_delay_s = 60
        max_attempts = 5
        [[sources]]
        name = "stripe"
        kind = "json"
        signature = "stripe"
        secrets = ["whsec_x"]
        ordering = "unordered"
        event_id = "/id"
        event_type = "/type"
        [[sources]]
        name = "save-game"
        kind = "save-game"
        secrets = ["s"]
    "#;

    const SECRET: &str = "whsec_c2VjcmV0LXNpZ25pbmcta2V5";

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn with_destination(keys: &str) -> String {
        format!("{SOURCES}\n[[destinations]]\nname = \"app\"\n{keys}\n")
    }

    fn error(keys: &str) -> String {
        Config::from_parts(Some(&with_destination(keys)), &env(&[]))
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn credentials_in_the_url_are_never_shown() {
        let shown = |url: &str| {
            let text = with_destination(&format!(
                "url = \"{url}\"\nsources = [\"stripe\"]\nsecret = \"{SECRET}\"\n"
            ));
            let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
            let destination = config.destination("app").unwrap();
            (destination.url_for_display(), format!("{destination:?}"))
        };
        let (url, debug) = shown("https://user:pw@app.example/hooks?token=s3cr3t&v=2&flag");
        assert_eq!(
            url,
            "https://***@app.example/hooks?token=***&v=***&flag=***"
        );
        assert!(debug.contains(&url), "{debug}");
        for leaked in ["pw", "s3cr3t", "v=2"] {
            assert!(!debug.contains(leaked), "{leaked} in {debug}");
        }
        assert_eq!(
            shown("http://127.0.0.1:9/hooks").0,
            "http://127.0.0.1:9/hooks"
        );
    }

    #[test]
    fn a_destination_takes_every_key_and_defaults_to_the_top_level_retry_keys() {
        let ca = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            ca.path(),
            "-----BEGIN CERTIFICATE-----\nMII\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let text = with_destination(&format!(
            "url = \"https://app.example.com/hooks/inhook\"\nsources = [\"stripe\", \"save-game\"]\n\
             event_types = [\"invoice.*\"]\nsecret = \"{SECRET}\"\ntimeout_s = 3\nlease_margin_s = 2\nmax_attempts = 12\n\
             concurrency = 8\nrate_limit_per_s = 100\nretry_base_s = 1\ntls_ca_file = {:?}\n",
            ca.path()
        ));
        let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
        let app = config.destination("app").unwrap();
        assert_eq!(app.url, "https://app.example.com/hooks/inhook");
        assert_eq!(app.sources, ["stripe", "save-game"]);
        assert_eq!(app.secret, Secret::new(SECRET));
        assert!(!app.secret_from_environment);
        assert_eq!(
            (app.timeout_s, app.lease_margin_s, app.concurrency),
            (3, 2, 8)
        );
        assert_eq!(app.rate_limit_per_s, Some(100));
        assert_eq!(
            app.retry,
            RetryPolicy {
                base_ms: 1_000,
                max_delay_ms: 60_000,
                max_attempts: 12
            }
        );
        assert_eq!(app.tls_ca_file.as_deref(), Some(ca.path()));
        assert!(app.wants("stripe", "invoice.paid"));
        assert!(!app.wants("stripe", "customer.created"));
        assert!(!app.wants("presence", "invoice.paid"));

        let minimal = with_destination(&format!(
            "url = \"http://127.0.0.1:9000/\"\nsources = [\"save-game\"]\nsecret = \"{SECRET}\""
        ));
        let config = Config::from_parts(Some(&minimal), &env(&[])).unwrap();
        let app = config.destination("app").unwrap();
        assert_eq!(
            app.retry,
            RetryPolicy {
                base_ms: 2_000,
                max_delay_ms: 60_000,
                max_attempts: 5
            }
        );
        assert_eq!(
            (app.timeout_s, app.lease_margin_s, app.concurrency),
            (
                DEFAULT_TIMEOUT_S,
                DEFAULT_LEASE_MARGIN_S,
                DEFAULT_CONCURRENCY
            )
        );
        assert_eq!(
            (app.rate_limit_per_s, app.event_types.as_ref()),
            (None, None)
        );
        assert!(app.wants("save-game", "anything"));
        let none = Config::from_parts(Some(SOURCES), &env(&[])).unwrap();
        assert!(none.destinations.is_empty());
    }

    #[test]
    fn the_environment_secret_wins_and_never_shows() {
        let text = with_destination(
            "url = \"https://a.example/\"\nsources = [\"stripe\"]\nsecret = \"whsec_ZmlsZQ==\"",
        );
        let var = destination_secret_env_var("app");
        assert_eq!(var, "INHOOK_DEST_APP_SECRET");
        assert_eq!(
            destination_secret_env_var("my-app"),
            "INHOOK_DEST_MY_APP_SECRET"
        );
        let config = Config::from_parts(Some(&text), &env(&[(&var, SECRET)])).unwrap();
        let app = config.destination("app").unwrap();
        assert_eq!(app.secret, Secret::new(SECRET));
        assert!(app.secret_from_environment);
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("c2VjcmV0") && !shown.contains("ZmlsZQ"),
            "{shown}"
        );
        let err = Config::from_parts(Some(&text), &env(&[(&var, "whpk_bm90LWEta2V5")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("destination \"app\": secret"), "{err}");
        assert!(!err.contains("bm90LWEta2V5"), "{err}");
    }

    #[test]
    fn bad_destinations_fail_at_start_naming_the_key() {
        let ok_rest = format!("sources = [\"stripe\"]\nsecret = \"{SECRET}\"");
        let url = |u: &str| format!("url = \"{u}\"\n{ok_rest}");
        let https = "url = \"https://a.example/\"";
        for (keys, named) in [
            (ok_rest.clone(), "url is required"),
            (url("ftp://a.example/"), "url has scheme \"ftp\""),
            (url("not a url"), "url is not a URL"),
            (
                url("https://user:hunter2@a.example/#top"),
                "url has a #fragment",
            ),
            (
                format!("{https}\nsecret = \"{SECRET}\""),
                "sources is required",
            ),
            (
                format!("{https}\nsources = [\"github\"]\nsecret = \"{SECRET}\""),
                "sources names \"github\"",
            ),
            (
                format!("{https}\nsources = [\"stripe\"]"),
                "INHOOK_DEST_APP_SECRET",
            ),
            (
                format!("{https}\nsources = [\"stripe\"]\nsecret = \"  \""),
                "secret is required",
            ),
            (
                format!("{https}\n{ok_rest}\nconcurrency = 0"),
                "concurrency must be at least 1",
            ),
            (
                format!("{https}\n{ok_rest}\nmax_attempts = 0"),
                "max_attempts must be at least 1",
            ),
            (
                format!("{https}\n{ok_rest}\ntimeout_s = 0"),
                "timeout_s must be at least 1",
            ),
            (
                format!("{https}\n{ok_rest}\nlease_margin_s = 0"),
                "lease_margin_s must be at least 1",
            ),
            (
                format!("{https}\n{ok_rest}\nevent_types = []"),
                "event_types is empty",
            ),
            (
                format!("{https}\n{ok_rest}\ntls_ca_file = \"/nonexistent/ca.pem\""),
                "tls_ca_file /nonexistent/ca.pem: cannot be read",
            ),
            (
                format!("url = \"http://a.example/\"\n{ok_rest}\ntls_ca_file = \"/etc/hostname\""),
                "tls_ca_file is only for https://",
            ),
            (
                format!("{https}\n{ok_rest}\nsecrets = [\"x\"]"),
                "unknown field `secrets`",
            ),
        ] {
            let err = error(&keys);
            assert!(err.contains(named), "{keys}: {err}");
            assert!(
                !err.contains("hunter2") && !err.contains("c2VjcmV0"),
                "{err}"
            );
        }
        let twice = format!(
            "{}\n[[destinations]]\nname = \"app\"\nurl = \"https://b.example/\"\n{ok_rest}\n",
            with_destination(&url("https://a.example/"))
        );
        let err = Config::from_parts(Some(&twice), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("configured twice"), "{err}");
        let bad_name = format!(
            "{SOURCES}\n[[destinations]]\nname = \"a b\"\n{}\n",
            url("https://a.example/")
        );
        let err = Config::from_parts(Some(&bad_name), &env(&[])).unwrap_err();
        assert!(err.to_string().contains("destination name"), "{err}");
        let clash = format!(
            "{SOURCES}\n[[sources]]\nname = \"dest-app\"\nkind = \"presence\"\nsecrets = [\"x\"]\n\
             [[destinations]]\nname = \"app\"\n{}\n",
            url("https://a.example/")
        );
        let err = Config::from_parts(Some(&clash), &env(&[])).unwrap_err();
        assert!(
            err.to_string()
                .contains("shares INHOOK_DEST_APP_SECRET with source \"dest-app\""),
            "{err}"
        );
        let twins = format!(
            "{}\n[[destinations]]\nname = \"App\"\n{}\n",
            with_destination(&url("https://a.example/")),
            url("https://b.example/")
        );
        let err = Config::from_parts(Some(&twins), &env(&[])).unwrap_err();
        assert!(
            err.to_string().contains("with destination \"app\""),
            "{err}"
        );
        let pem_less = tempfile::NamedTempFile::new().unwrap();
        let err = error(&format!(
            "{https}\n{ok_rest}\ntls_ca_file = {:?}",
            pem_less.path()
        ));
        assert!(err.contains("holds no PEM certificate"), "{err}");
    }

    #[test]
    fn commands_that_only_open_the_store_need_no_destination_secret() {
        let text = with_destination("url = \"https://a.example/\"\nsources = [\"stripe\"]");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inhook.toml");
        std::fs::write(&path, text).unwrap();
        let config = Config::load_for_store(Some(&path)).unwrap();
        assert!(config
            .destination("app")
            .unwrap()
            .secret
            .expose()
            .is_empty());
        assert!(Config::load(Some(&path)).is_err());
    }
}
