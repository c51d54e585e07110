//! The sources (docs/configuration.md, per-source keys): each `[[sources]]` table as
//! written, and the validated [`SourceConfig`] built from it (its signature's keys and
//! secrets in [`signing`]).

use std::collections::HashMap;

use serde::Deserialize;

use super::section::section;
use super::{
    check_name, defaults, header_names, response, ConfigError, Mode, Secrets, SourceResponse,
};
use crate::domain::kind::json::contract::{
    AggregateLocations, BodyFormat, JsonSourceSpec, MissingLocations, TypeSpec,
};
use crate::domain::kind::json::JsonKind;
use crate::domain::kind::Kind;
use crate::domain::kind::SourceKind;
use crate::ingress::signature::{Scheme, Secret, Verifier};

use signing::AWS_SNS_HANDSHAKE;
use signing::{
    handshake, handshake_fits, secrets_var, source_public_keys, source_secrets, verifier,
};

pub(in crate::config) mod signing;

section! {
    /// One configured webhook source. Its kind, signature and json locations are checked
    /// apart on a reload (config/reload.rs), its secrets rotate; any other key changed
    /// needs a restart.
    #[derive(Debug, Clone)]
    pub struct SourceConfig {
        /// The name in `/webhooks/{name}`.
        pub name: String => apart,
        /// Its kind: contract, rules, projection and views (a `json` source's compiled locations).
        pub kind: std::sync::Arc<dyn Kind> => apart,
        /// Sync or async processing.
        pub mode: Mode => restart,
        /// Async only: decide an event in the transaction that logs it when its aggregate is
        /// ready, instead of leaving it to the workers (lower latency, more work per request).
        pub decide_at_ingest: bool => restart,
        /// How deliveries are signed: the scheme, with its settings for a configurable one.
        pub verifier: Verifier => apart,
        /// Secrets any of which may verify (rotation).
        pub secrets: Vec<Secret> => apart,
        /// Whether `secrets` came from `INHOOK_<SOURCE>_SECRET`: edits to the file's then change nothing.
        pub secrets_from_environment: bool => apart,
        /// The environment variable the secrets are read from: `secrets_env`, else
        /// `INHOOK_<SOURCE>_SECRET`.
        pub secrets_var: String => apart,
        /// Allowed distance between a signed timestamp and the time of receipt.
        pub tolerance_s: u64 => restart,
        /// The first sequence of every aggregate.
        pub first_sequence: i64 => restart,
        /// How long an in-order event waits for a gap.
        pub hold_timeout_s: u64 => restart,
        /// After how long without an update a presence is reported stale.
        pub stale_after_s: u64 => restart,
        /// Undecided events (received, held, retrying) above which deliveries get 429.
        pub max_backlog: u64 => restart,
        /// In-order events of one aggregate waiting ahead of a gap above which its deliveries get 429.
        pub max_held_per_aggregate: u64 => restart,
        /// Deliveries per second accepted from this source (bursts up to one second's worth); none when unset.
        pub rate_limit_per_s: Option<u32> => restart,
        /// Request headers kept with its events beyond the built-in allowlist (lower case;
        /// the top-level `keep_headers` and the source's own).
        pub keep_headers: Vec<String> => restart,
        /// The client addresses that may deliver (403 `forbidden_peer` to others); everyone when unset.
        pub allow_ips: Option<crate::ingress::peers::CidrList> => restart,
        /// `batch = true`: each body is a JSON array of events, at most this many (docs/configuration.md, batches).
        pub batch: Option<usize> => restart,
        /// The answer sent instead of the JSON one when a delivery is logged, applied or a duplicate.
        pub response: Option<SourceResponse> => restart,
        /// The preset its keys were merged from (docs/providers.md), if any.
        pub preset: Option<String> => apart,
        /// The endpoint handshake answered for the publisher (docs/configuration.md, `handshake`).
        pub handshake: Option<crate::ingress::handshake::Handshake> => restart,
        /// JSON pointers whose values are indexed at ingest, for searching the log by them
        /// (docs/configuration.md, `search_fields`).
        pub search_fields: Vec<crate::domain::search::SearchField> => restart,
    }
}

/// One `[[sources]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileSource {
    name: String,
    preset: Option<String>,
    /// The keys merged from `preset` (none the source wrote), for errors that name them.
    #[serde(skip)]
    pub(super) from_preset: Vec<String>,
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

/// Builds every source of the file (the zero-config ones when it has none), in file order.
pub(super) fn sources(
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
        crate::ingress::signature::configurable::parse_public_url(own)
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
        if crate::ingress::kept_headers::is_kept(header, &[]) {
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
) -> Result<Vec<crate::domain::search::SearchField>, ConfigError> {
    let mut fields = Vec::with_capacity(raw.len());
    for pointer in raw {
        let field = crate::domain::search::SearchField::parse(pointer)
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
        .unwrap_or(crate::domain::kind::json::batch::DEFAULT_MAX_EVENTS)
    {
        0 => problem("batch_max_events must be at least 1"),
        max => Ok(Some(max)),
    }
}

/// A source's `allow_ips`: `None` (everyone) when unset; an empty list would refuse
/// everyone, so it is an error.
fn allow_ips(
    name: &str,
    entries: Option<&[String]>,
) -> Result<Option<crate::ingress::peers::CidrList>, ConfigError> {
    let Some(entries) = entries else {
        return Ok(None);
    };
    let list = crate::ingress::peers::CidrList::parse("allow_ips", entries)
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
