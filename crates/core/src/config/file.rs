//! The config file as written (docs/configuration.md): one flat TOML table whose keys each
//! belong to a section's module, `[[sources]]` merged with their presets, and the file's
//! errors as line and message, never its values.

use std::sync::OnceLock;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::admin::FileAdmin;
use super::http::FileHttp;
use super::observability::FileObservability;
use super::processing::FileProcessing;
use super::section::{file_section, Env};
use super::source::FileSource;
use super::store::FileStore;
use super::{alerts, destination, ConfigError};

file_section! {
    /// The top-level keys that are no section's settings: the tables, and the base URL
    /// the sources read.
    pub(super) struct FileTables {
        public_url: String = env "INHOOK_PUBLIC_URL",
        sources: Vec<FileSource>,
        destinations: Vec<destination::FileDestination>,
        alerts: Vec<alerts::FileAlert>,
    }
}

/// Every top-level key of the file, by section. A key is the one section's that declares it.
#[derive(Debug, Default)]
pub(super) struct FileConfig {
    pub(super) http: FileHttp,
    pub(super) store: FileStore,
    pub(super) admin: FileAdmin,
    pub(super) observability: FileObservability,
    pub(super) processing: FileProcessing,
    pub(super) tables: FileTables,
}

impl FileConfig {
    /// Every top-level key, section by section: what an unknown key's error lists.
    pub(super) fn keys() -> &'static [&'static str] {
        static KEYS: OnceLock<Vec<&'static str>> = OnceLock::new();
        KEYS.get_or_init(|| {
            [
                FileHttp::KEYS,
                FileStore::KEYS,
                FileAdmin::KEYS,
                FileObservability::KEYS,
                FileProcessing::KEYS,
                FileTables::KEYS,
            ]
            .concat()
        })
    }

    /// Every key an `INHOOK_*` variable replaces, with the variable, section by section.
    #[cfg(test)]
    pub(super) fn variables() -> Vec<(&'static str, &'static str)> {
        [
            FileHttp::VARIABLES,
            FileStore::VARIABLES,
            FileAdmin::VARIABLES,
            FileObservability::VARIABLES,
            FileProcessing::VARIABLES,
            FileTables::VARIABLES,
        ]
        .concat()
    }

    /// Lays the `INHOOK_*` variables over the file's keys, section by section.
    pub(super) fn apply_env(&mut self, env: &Env) -> Result<(), ConfigError> {
        self.http.apply_env(env)?;
        self.store.apply_env(env)?;
        self.admin.apply_env(env)?;
        self.observability.apply_env(env)?;
        self.processing.apply_env(env)?;
        self.tables.apply_env(env)
    }

    /// The file's keys as written, each `preset` merged under its source (the source's own
    /// keys win); none without a file.
    pub(super) fn parse(text: Option<&str>) -> Result<Self, ConfigError> {
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
                let preset = crate::ingress::presets::Preset::find(name).ok_or_else(|| {
                    let close = crate::ingress::presets::close_names(name);
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
                    crate::ingress::presets::merge(source, &preset)
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
        for (source, keys) in file.tables.sources.iter_mut().flatten().zip(taken) {
            source.from_preset = keys;
        }
        Ok(file)
    }
}

impl<'de> Deserialize<'de> for FileConfig {
    /// Reads the flat table key by key, each into the section that declares it, so that an
    /// unknown key and a wrong value are refused with the line they are on, as a derived
    /// struct would (serde's `flatten` loses both).
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_struct("FileConfig", Self::keys(), FileVisitor)
    }
}

/// Reads the file's top-level table into [`FileConfig`].
struct FileVisitor;

impl<'de> Visitor<'de> for FileVisitor {
    type Value = FileConfig;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("struct FileConfig")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FileConfig, A::Error> {
        let mut file = FileConfig::default();
        while let Some(key) = map.next_key_seed(KnownKey)? {
            let key = key.as_str();
            let _taken = file.http.take(key, &mut map)?
                || file.store.take(key, &mut map)?
                || file.admin.take(key, &mut map)?
                || file.observability.take(key, &mut map)?
                || file.processing.take(key, &mut map)?
                || file.tables.take(key, &mut map)?;
        }
        Ok(file)
    }
}

/// A top-level key, refused unless a section declares it: the error is raised while the
/// key is read, so it carries the key's line.
struct KnownKey;

impl<'de> DeserializeSeed<'de> for KnownKey {
    type Value = String;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_identifier(self)
    }
}

impl Visitor<'_> for KnownKey {
    type Value = String;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field identifier")
    }

    fn visit_str<E: serde::de::Error>(self, key: &str) -> Result<String, E> {
        let keys = FileConfig::keys();
        if keys.contains(&key) {
            Ok(key.to_owned())
        } else {
            Err(E::unknown_field(key, keys))
        }
    }
}

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
    FileConfig::keys().contains(&key).then_some(key)
}
