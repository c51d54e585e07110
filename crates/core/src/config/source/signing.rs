//! A source's signature keys and secrets (docs/configuration.md, signatures and
//! handshakes): the verifier its scheme's keys build, the secrets or public keys it
//! verifies with (the file's, or its `INHOOK_*` variable's), and its handshake.

use std::collections::HashMap;

use super::FileSource;
use crate::config::{
    public_keys_env_var, secret_env_var, sns_topic_arns_env_var, ConfigError, Secrets,
};
use crate::domain::kind::json::contract::BodyFormat;
use crate::domain::kind::Kind;
use crate::ingress::signature::{Scheme, Secret, Verifier};

impl FileSource {
    /// The configurable schemes' keys given, by name, with the schemes each belongs to.
    pub(super) fn given(&self) -> Vec<(&'static str, &'static [Scheme])> {
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
pub(super) fn verifier(
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
    let problem = |e: crate::ingress::signature::configurable::KeyError| {
        ConfigError(format!("source {name:?}: {e} (signature = \"{scheme}\")"))
    };
    let hmac_keys = crate::ingress::signature::configurable::HmacKeys {
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
            let parsed = crate::ingress::signature::configurable::HmacConfig::parse_public_key(
                &hmac_keys, algorithm,
            )
            .map_err(problem)?;
            Verifier::PublicKey(std::sync::Arc::new(parsed))
        }
        Scheme::Twilio => {
            let public_url = public_url.ok_or_else(|| {
                ConfigError(format!(
                    "source {name:?}: public_url is required for signature = \"twilio\" (Twilio signs the URL it calls: the base URL, top level or per source, e.g. https://hooks.example.com)"
                ))
            })?;
            let public_url = crate::ingress::signature::configurable::parse_public_url(public_url)
                .map_err(|e| ConfigError(format!("source {name:?}: public_url: {e}")))?;
            Verifier::Twilio(std::sync::Arc::new(
                crate::ingress::signature::twilio::TwilioConfig { public_url },
            ))
        }
        Scheme::Hmac => {
            let parsed = crate::ingress::signature::configurable::HmacConfig::parse(&hmac_keys)
                .map_err(problem)?;
            Verifier::Hmac(std::sync::Arc::new(parsed))
        }
        Scheme::Token => Verifier::Token(
            crate::ingress::signature::token::TokenConfig::parse(
                keys.token_header.as_deref(),
                keys.token_query.as_deref(),
            )
            .map_err(problem)?,
        ),
        Scheme::Basic => Verifier::Basic,
        Scheme::AwsSns => {
            let (topics, from_env) = sns_topic_arns(name, keys, env)?;
            let parsed = crate::ingress::signature::aws_sns::SnsConfig::parse(
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

/// The handshake of the `aws-sns` scheme, which answers it itself (src/http/sns.rs).
pub(super) const AWS_SNS_HANDSHAKE: &str = "aws-sns";

/// A source's `handshake` (docs/configuration.md): one of the known kinds, and the secret
/// its answer is computed with when it needs one.
pub(in crate::config) fn handshake(
    name: &str,
    raw: Option<&str>,
    secrets: &[Secret],
    secret_rule: Secrets,
) -> Result<Option<crate::ingress::handshake::Handshake>, ConfigError> {
    use crate::ingress::handshake::Handshake;
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
/// ([`crate::ingress::handshake::Handshake::allowed_with`]): on another, a challenge's answer could be
/// a valid signature of a forged delivery. X's CRC also needs JSON bodies: a token can be a
/// form body (`a=b`), never a JSON one.
pub(super) fn handshake_fits(
    name: &str,
    handshake: crate::ingress::handshake::Handshake,
    verifier: &crate::ingress::signature::Verifier,
    kind: &dyn Kind,
) -> Result<(), ConfigError> {
    let Some(scheme) = handshake.publisher_scheme() else {
        return Ok(());
    };
    let form = kind.body_format() != BodyFormat::Json;
    let json_only = handshake == crate::ingress::handshake::Handshake::XCrc;
    let has = if !handshake.allowed_with(verifier) {
        let base = match handshake {
            crate::ingress::handshake::Handshake::Msgraph => Scheme::Token,
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

/// A public-key source's keys (`INHOOK_<SOURCE>_PUBLIC_KEYS`, comma-separated, else the
/// file's `public_keys`), parsed, kept where other sources keep secrets so they rotate by
/// reload alike; and whether they came from the environment. A bad key is an error naming
/// the source, the key and the entry, never the entry's text.
pub(super) fn source_public_keys(
    s: &FileSource,
    env: &HashMap<String, String>,
    algorithm: crate::ingress::signature::public_key::Algorithm,
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
    let keys =
        crate::ingress::signature::public_key::parse_keys(algorithm, &entries).map_err(|e| {
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
pub(super) fn secrets_var(s: &FileSource) -> Result<String, ConfigError> {
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
pub(super) fn source_secrets(
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
