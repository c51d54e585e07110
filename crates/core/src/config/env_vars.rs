//! The environment variables named after a source (docs/configuration.md, environment variables):
//! a file of its own so that what reads them (the presets' paste, the CLI) needs nothing
//! else of the config.

/// The environment variable that holds a source's secrets.
pub fn secret_env_var(source: &str) -> String {
    format!("INHOOK_{}_SECRET", env_name(source))
}

/// The environment variable that holds a source's public keys (`ed25519`, `ecdsa-p256`).
pub fn public_keys_env_var(source: &str) -> String {
    format!("INHOOK_{}_PUBLIC_KEYS", env_name(source))
}

/// The environment variable that holds an `aws-sns` source's topics (`sns_topic_arns`).
pub fn sns_topic_arns_env_var(source: &str) -> String {
    format!("INHOOK_{}_SNS_TOPIC_ARNS", env_name(source))
}

/// A source's name as it appears in its variables: upper case, `-` as `_`.
fn env_name(source: &str) -> String {
    source.to_uppercase().replace('-', "_")
}
