//! `[[destinations]]` (docs/forwarding.md): where applied events are forwarded, read from
//! the file and the environment and validated at start. Every refusal names the key.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Deserialize;

use super::section::section;
use super::target::{FileTarget, Target};
use super::{defaults, ConfigError, SourceConfig};
use crate::domain::contract::glob::Glob;
use crate::domain::retry::RetryPolicy;
use crate::ingress::signature::standard_webhooks::Key;
use crate::ingress::signature::Secret;

section! {
    /// One configured destination, validated. Its Debug output shows the URL without
    /// credentials and never the secret. On a reload its secret may rotate; any other key
    /// changed needs a restart (its queues, leases and circuit are built from them).
    #[derive(Clone)]
    pub struct DestinationConfig {
        /// The name in `/v1/destinations/{name}` and in metrics.
        pub name: String => apart,
        /// Where messages go: an `http(s)://` endpoint or a broker (`nats://`, `tls://`,
        /// `amqp(s)://`, `redis(s)://`), from `INHOOK_DEST_<NAME>_URL` when set.
        pub url: String => restart,
        /// The sources whose applied events go there.
        pub sources: Vec<String> => restart,
        /// Only events whose type matches one of these patterns; every type when unset.
        pub event_types: Option<Vec<String>> => restart,
        /// `event_types` compiled.
        pub event_type_globs: Option<Vec<Glob>> => apart,
        /// The Standard Webhooks `whsec_` secret messages are signed with; empty (a sink's
        /// messages unsigned) only for a broker type.
        pub secret: Secret => apart,
        /// Whether `secret` came from `INHOOK_DEST_<NAME>_SECRET`: edits to the file's then change nothing.
        pub secret_from_environment: bool => apart,
        /// How long one request may take, in seconds.
        pub timeout_s: u64 => restart,
        /// How much longer than `timeout_s` a claimed delivery stays leased to its node, in
        /// seconds: after a crash, its in-flight deliveries wait that long to be sent again.
        pub lease_margin_s: u64 => restart,
        /// Backoff and attempts (the top-level keys unless the destination sets its own).
        pub retry: RetryPolicy => restart(
            max_attempts: "max_attempts",
            base_ms: "retry_base_s",
            max_delay_ms: "retry_max_delay_s",
        ),
        /// Requests on the wire at once (aggregates waiting to retry do not count).
        pub concurrency: usize => restart,
        /// Requests per second at most; none when unset.
        pub rate_limit_per_s: Option<u32> => restart,
        /// A PEM file of the CA certificates a TLS connection verifies against instead of the system's roots.
        pub tls_ca_file: Option<PathBuf> => restart,
        /// The destination's type and the keys of that type.
        pub target: Target => nested,
    }
}

impl std::fmt::Debug for DestinationConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DestinationConfig")
            .field("name", &self.name)
            .field("url", &self.url_for_display())
            .field("target", &self.target)
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
    #[serde(rename = "type")]
    type_name: Option<String>,
    subject: Option<String>,
    stream: Option<String>,
    create_stream: Option<bool>,
    duplicate_window_s: Option<u64>,
    exchange: Option<String>,
    routing_key: Option<String>,
    declare: Option<bool>,
    max_len: Option<u64>,
}

impl FileDestination {
    /// The type keys, taken out to be checked on their own.
    fn take_target(&mut self) -> FileTarget {
        FileTarget {
            type_name: self.type_name.take(),
            subject: self.subject.take(),
            stream: self.stream.take(),
            create_stream: self.create_stream.take(),
            duplicate_window_s: self.duplicate_window_s.take(),
            exchange: self.exchange.take(),
            routing_key: self.routing_key.take(),
            declare: self.declare.take(),
            max_len: self.max_len.take(),
        }
    }
}

/// The environment variable that holds a destination's URL (with its credentials), which
/// overrides the file's `url`.
pub fn destination_url_env_var(destination: &str) -> String {
    format!(
        "INHOOK_DEST_{}_URL",
        destination.to_uppercase().replace('-', "_")
    )
}

/// The environment variable that holds a destination's secret.
pub fn destination_secret_env_var(destination: &str) -> String {
    format!(
        "INHOOK_DEST_{}_SECRET",
        destination.to_uppercase().replace('-', "_")
    )
}

/// Validates the file's destinations against the configured `sources`; `retry` is the
/// top-level retry policy. `secrets_required` is false for commands that only open the store.
pub(super) fn destinations(
    file: Vec<FileDestination>,
    env: &HashMap<String, String>,
    sources: &[SourceConfig],
    retry: RetryPolicy,
    secrets_required: bool,
) -> Result<Vec<DestinationConfig>, ConfigError> {
    let mut out: Vec<DestinationConfig> = Vec::with_capacity(file.len());
    for d in file {
        super::check_name("destination", &d.name)?;
        if out.iter().any(|o| o.name == d.name) {
            return Err(ConfigError(format!(
                "destination {:?} is configured twice",
                d.name
            )));
        }
        let destination = destination(d, env, sources, &out, retry, secrets_required)?;
        out.push(destination);
    }
    Ok(out)
}

/// Validates one destination; `before` are the destinations validated ahead of it.
fn destination(
    mut d: FileDestination,
    env: &HashMap<String, String>,
    sources: &[SourceConfig],
    before: &[DestinationConfig],
    retry: RetryPolicy,
    secrets_required: bool,
) -> Result<DestinationConfig, ConfigError> {
    let name = std::mem::take(&mut d.name);
    let target = d
        .take_target()
        .check()
        .map_err(|refusal| refused(&name, refusal.key, refusal.why))?;
    let url_var = destination_url_env_var(&name);
    let (url, tls) = if target == Target::InProcess {
        // The consumer is code in this process (docs/library.md): nothing to reach.
        if d.url.is_some() || env.contains_key(&url_var) {
            let why = "is not for type = \"in_process\": its consumer is bound in code";
            return Err(refused(&name, "url", why));
        }
        (in_process_url(&name), false)
    } else {
        let url = env.get(&url_var).cloned().or(d.url.take()).ok_or_else(|| {
            let why = format!("is required (where messages go), in the file or {url_var}");
            refused(&name, "url", why)
        })?;
        let tls = check_url(&url, &target).map_err(|why| refused(&name, "url", why))?;
        (url, tls)
    };
    let sources_named = forwarded_sources(&name, d.sources.take(), sources)?;
    let event_types = d.event_types.take();
    let event_type_globs = event_type_globs(&name, event_types.as_deref())?;
    let (secret, secret_from_environment) = destination_secret(
        &name,
        d.secret.take(),
        env,
        sources,
        before,
        secrets_required && target.requires_secret(),
    )?;
    let sending = sending(&name, &d, retry)?;
    if let Some(path) = &d.tls_ca_file {
        if target == Target::InProcess {
            let why = "is not for type = \"in_process\": nothing goes over the network";
            return Err(refused(&name, "tls_ca_file", why));
        }
        if !tls {
            let [_, scheme] = target.schemes();
            let why = format!("is only for {scheme}:// urls");
            return Err(refused(&name, "tls_ca_file", why));
        }
        check_ca_file(path).map_err(|why| refused(&name, "tls_ca_file", why))?;
    }
    Ok(DestinationConfig {
        name,
        url,
        target,
        sources: sources_named,
        event_types,
        event_type_globs,
        secret,
        secret_from_environment,
        timeout_s: sending.timeout_s,
        lease_margin_s: sending.lease_margin_s,
        retry: sending.retry,
        concurrency: sending.concurrency,
        rate_limit_per_s: d.rate_limit_per_s.filter(|r| *r > 0),
        tls_ca_file: d.tls_ca_file,
    })
}

/// The `url` an in-process destination is shown with (`GET /v1/destinations`): it has none.
pub fn in_process_url(name: &str) -> String {
    format!("in-process:{name}")
}

/// A destination's `event_types` compiled: unset is every type, an empty list is refused.
fn event_type_globs(
    name: &str,
    event_types: Option<&[String]>,
) -> Result<Option<Vec<Glob>>, ConfigError> {
    if event_types.is_some_and(<[String]>::is_empty) {
        return Err(refused(
            name,
            "event_types",
            "is empty: it would forward nothing; remove it to forward every type",
        ));
    }
    Ok(event_types.map(|patterns| patterns.iter().map(|p| Glob::new(p)).collect()))
}

/// How a destination sends: its request timeout, lease margin, concurrency and backoff.
struct Sending {
    timeout_s: u64,
    lease_margin_s: u64,
    concurrency: usize,
    retry: RetryPolicy,
}

/// Reads a destination's sending keys, each at least 1; `retry` is the top-level policy,
/// which the destination's own keys override one by one.
fn sending(name: &str, d: &FileDestination, retry: RetryPolicy) -> Result<Sending, ConfigError> {
    let at_least_1 = |key: &str, value: u64, why: &str| match value {
        0 => Err(refused(name, key, format!("must be at least 1{why}"))),
        _ => Ok(value),
    };
    let timeout_s = d.timeout_s.unwrap_or(defaults::DESTINATION_TIMEOUT_S);
    at_least_1("timeout_s", timeout_s, "")?;
    let lease_margin_s = d
        .lease_margin_s
        .unwrap_or(defaults::DESTINATION_LEASE_MARGIN_S);
    let why = " (time to read the event and record the answer)";
    at_least_1("lease_margin_s", lease_margin_s, why)?;
    let max_attempts = d.max_attempts.unwrap_or(retry.max_attempts);
    let why = " (the first request counts)";
    at_least_1("max_attempts", max_attempts.into(), why)?;
    let concurrency = d.concurrency.unwrap_or(defaults::DESTINATION_CONCURRENCY);
    let why = " (requests on the wire at once)";
    at_least_1("concurrency", concurrency as u64, why)?;
    let ms = |s: u64| (s as i64).saturating_mul(1000);
    Ok(Sending {
        timeout_s,
        lease_margin_s,
        concurrency,
        retry: RetryPolicy {
            base_ms: d.retry_base_s.map_or(retry.base_ms, ms),
            max_delay_ms: d.retry_max_delay_s.map_or(retry.max_delay_ms, ms),
            max_attempts,
        },
    })
}

/// The refusal of `destination`'s `key`, `why` being the words after the key.
fn refused(destination: &str, key: &str, why: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("destination {destination:?}: {key} {why}"))
}

/// The destination's `sources`: required, each a configured source.
fn forwarded_sources(
    name: &str,
    named: Option<Vec<String>>,
    sources: &[SourceConfig],
) -> Result<Vec<String>, ConfigError> {
    let named = named.unwrap_or_default();
    if named.is_empty() {
        return Err(refused(
            name,
            "sources",
            "is required: the sources whose applied events are forwarded, e.g. [\"stripe\"]",
        ));
    }
    if let Some(unknown) = named
        .iter()
        .find(|n| !sources.iter().any(|s| &s.name == *n))
    {
        return Err(refused(
            name,
            "sources",
            format!("names {unknown:?}, which is not a configured source"),
        ));
    }
    Ok(named)
}

/// The destination's secret (`INHOOK_DEST_<NAME>_SECRET`, else the file's), and whether it
/// came from the environment. Empty is an error when required; a malformed one always is.
fn destination_secret(
    name: &str,
    file_secret: Option<String>,
    env: &HashMap<String, String>,
    sources: &[SourceConfig],
    before: &[DestinationConfig],
    secrets_required: bool,
) -> Result<(Secret, bool), ConfigError> {
    let var = destination_secret_env_var(name);
    // One variable must not feed two secrets: `dest-app` the source and `app` the
    // destination, or `my-app` and `my_app`, would share theirs.
    if let Some(source) = sources
        .iter()
        .find(|s| super::secret_env_var(&s.name) == var)
    {
        let why = format!("shares {var} with source {:?}: rename one", source.name);
        return Err(refused(name, "name", why));
    }
    if let Some(other) = before
        .iter()
        .find(|o| destination_secret_env_var(&o.name) == var)
    {
        let why = format!("shares {var} with destination {:?}: rename one", other.name);
        return Err(refused(name, "name", why));
    }
    let raw = env.get(&var).cloned().or(file_secret);
    let secret = Secret::new(raw.as_deref().map(str::trim).unwrap_or_default());
    if !secret.expose().is_empty() {
        check_secret(&secret).map_err(|why| refused(name, "secret", why))?;
    } else if secrets_required {
        let why = format!("is required: set {var} or `secret` (whsec_<base64>) in the config file");
        return Err(refused(name, "secret", why));
    }
    Ok((secret, env.contains_key(&var)))
}

/// Why a destination's `url`, `secret` or `tls_ca_file` is refused: the words after the
/// key. None repeats the URL or the secret, either of which may carry credentials.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    /// The URL does not parse (the parser's reason, which never quotes the input).
    #[error("is not a URL ({0}); expected https://host/path")]
    NotAUrl(String),
    /// Not a scheme of the destination's type.
    #[error(
        "has scheme {given:?}: a destination of type {type_name:?} takes {plain}:// or {tls}://"
    )]
    Scheme {
        given: String,
        type_name: &'static str,
        plain: &'static str,
        tls: &'static str,
    },
    /// No host to send to.
    #[error("has no host")]
    NoHost,
    /// A fragment, which a request never carries.
    #[error("has a #fragment, which is never sent")]
    Fragment,
    /// The secret is no Standard Webhooks key (the reason never quotes it).
    #[error("{0}")]
    Key(&'static str),
    /// A Standard Webhooks key, but not one that signs with HMAC.
    #[error(
        "must be a whsec_ secret: forwarded requests are signed with Standard Webhooks v1 (HMAC)"
    )]
    NotHmac,
    /// The CA file cannot be read.
    #[error("{}: cannot be read ({source})", path.display())]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The CA file holds no PEM certificate.
    #[error("{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path.display())]
    NoCertificate { path: PathBuf },
}

/// Checks a destination URL against its type's schemes; true for the TLS one.
fn check_url(raw: &str, target: &Target) -> Result<bool, Refusal> {
    let url = reqwest::Url::parse(raw).map_err(|e| Refusal::NotAUrl(e.to_string()))?;
    let [plain, tls] = target.schemes();
    let tls = match url.scheme() {
        scheme if scheme == tls => true,
        scheme if scheme == plain => false,
        other => {
            return Err(Refusal::Scheme {
                given: other.to_owned(),
                type_name: target.type_name(),
                plain,
                tls,
            })
        }
    };
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Refusal::NoHost);
    }
    if url.fragment().is_some() {
        return Err(Refusal::Fragment);
    }
    Ok(tls)
}

/// Checks that a secret can sign Standard Webhooks `v1`: an HMAC key (`whsec_<base64>`).
fn check_secret(secret: &Secret) -> Result<(), Refusal> {
    match Key::parse(secret).map_err(Refusal::Key)? {
        Key::Hmac(_) => Ok(()),
        Key::Public(_) | Key::Private(_) => Err(Refusal::NotHmac),
    }
}

/// Checks that a CA file can be read and holds a PEM certificate.
fn check_ca_file(path: &std::path::Path) -> Result<(), Refusal> {
    let text = std::fs::read(path).map_err(|source| Refusal::Unreadable {
        path: path.to_owned(),
        source,
    })?;
    if !text
        .windows(b"-----BEGIN CERTIFICATE-----".len())
        .any(|w| w == b"-----BEGIN CERTIFICATE-----")
    {
        return Err(Refusal::NoCertificate {
            path: path.to_owned(),
        });
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

    use crate::config::test_env as env;

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
    fn an_in_process_destination_takes_no_url_secret_or_ca_file() {
        let text =
            with_destination("type = \"in_process\"\nsources = [\"stripe\"]\nmax_attempts = 3\n");
        let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
        let app = config.destination("app").unwrap();
        assert_eq!(app.target, Target::InProcess);
        assert_eq!(app.url_for_display(), "in-process:app");
        assert_eq!(app.retry.max_attempts, 3);
        assert!(app.secret.expose().is_empty(), "nothing to sign");
        for (key, line) in [
            ("url", "url = \"https://app.example/hooks\""),
            ("tls_ca_file", "tls_ca_file = \"ca.pem\""),
        ] {
            let refused = error(&format!(
                "type = \"in_process\"\nsources = [\"stripe\"]\n{line}\n"
            ));
            assert!(
                refused.contains(&format!("{key} is not for type = \"in_process\"")),
                "{refused}"
            );
        }
        let from_env = Config::from_parts(
            Some(&text),
            &env(&[("INHOOK_DEST_APP_URL", "https://app.example/hooks")]),
        )
        .unwrap_err()
        .to_string();
        assert!(from_env.contains("url is not for type"), "{from_env}");
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
                defaults::DESTINATION_TIMEOUT_S,
                defaults::DESTINATION_LEASE_MARGIN_S,
                defaults::DESTINATION_CONCURRENCY
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
    fn a_broker_destination_takes_its_type_keys_its_url_from_the_environment_and_no_secret() {
        let text = with_destination(
            "type = \"nats\"\nsources = [\"stripe\"]\nsubject = \"w.{source}.{aggregate}\"\n\
             stream = \"W\"\ncreate_stream = true",
        );
        let var = destination_url_env_var("app");
        assert_eq!(var, "INHOOK_DEST_APP_URL");
        let url = "nats://inhook:pa55@nats.internal:4222";
        let config = Config::from_parts(Some(&text), &env(&[(&var, url)])).unwrap();
        let app = config.destination("app").unwrap();
        assert_eq!(app.url, url);
        assert_eq!(app.url_for_display(), "nats://***@nats.internal:4222");
        assert!(!format!("{config:?}").contains("pa55"));
        assert_eq!(app.target.type_name(), "nats");
        assert!(
            app.secret.expose().is_empty(),
            "a sink's secret is optional"
        );
        let err = Config::from_parts(Some(&text), &env(&[])).unwrap_err();
        assert!(
            err.to_string().contains("url is required") && err.to_string().contains(&var),
            "{err}"
        );
        let wrong_scheme = with_destination(
            "type = \"redis\"\nurl = \"https://a.example/\"\nsources = [\"stripe\"]\nstream = \"s\"",
        );
        let err = Config::from_parts(Some(&wrong_scheme), &env(&[])).unwrap_err();
        assert!(
            err.to_string().contains(
                "url has scheme \"https\": a destination of type \"redis\" takes redis:// or rediss://"
            ),
            "{err}"
        );
        let foreign = with_destination(&format!(
            "url = \"https://a.example/\"\nsources = [\"stripe\"]\nsecret = \"{SECRET}\"\nexchange = \"x\""
        ));
        let err = Config::from_parts(Some(&foreign), &env(&[])).unwrap_err();
        assert!(
            err.to_string()
                .contains("destination \"app\": exchange is only for type = \"rabbitmq\""),
            "{err}"
        );
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
