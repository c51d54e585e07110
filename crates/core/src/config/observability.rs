//! The observability section (docs/configuration.md, top-level keys and alerts): the log's
//! format, trace export and the alert rules.

use std::sync::Arc;

use super::alerts::AlertRule;
use super::section::{file_section, section};
use super::ConfigError;

file_section! {
    /// The observability section's keys as the file (or the environment) gives them; the
    /// `[[alerts]]` tables are read with the sources and destinations they name.
    pub(super) struct FileObservability {
        log_format: String = env "INHOOK_LOG_FORMAT",
        otlp_endpoint: String = env "INHOOK_OTLP_ENDPOINT",
        alert_tick_ms: u64,
    }
}

section! {
    /// How inhook logs, traces and alerts.
    #[derive(Debug, Clone)]
    pub struct Observability {
        /// Log lines as JSON instead of text.
        pub log_json: bool => restart("log_format"),
        /// Export spans over OTLP/HTTP to this URL (e.g. `http://collector:4318/v1/traces`); off when unset.
        pub otlp_endpoint: Option<String> => restart,
        /// How often the alert rules are evaluated, in milliseconds.
        pub alert_tick_ms: u64 => restart,
        /// The `[[alerts]]` rules (docs/configuration.md, alerts): the watcher and its
        /// channels are set up at start.
        pub alerts: Arc<[AlertRule]> => restart,
    }
}

impl Default for Observability {
    /// The built-in defaults.
    fn default() -> Self {
        Self {
            // Text, which reads best on a terminal.
            log_json: false,
            otlp_endpoint: None,
            // The alert rules are evaluated every ten seconds.
            alert_tick_ms: 10_000,
            alerts: Arc::new([]),
        }
    }
}

impl Observability {
    /// Validates the section with its `alerts`, read already: an unknown log format or a
    /// tick of 0 is an error naming the key.
    pub(super) fn resolve(
        file: FileObservability,
        alerts: Arc<[AlertRule]>,
    ) -> Result<Self, ConfigError> {
        let default = Self::default();
        let log_json = match file.log_format.as_deref() {
            None => default.log_json,
            Some("text") => false,
            Some("json") => true,
            Some(other) => {
                return Err(ConfigError(format!(
                    "log_format: {other:?} is neither \"text\" nor \"json\""
                )))
            }
        };
        let alert_tick_ms = match file.alert_tick_ms {
            Some(0) => return Err(ConfigError("alert_tick_ms: must be at least 1".into())),
            Some(ms) => ms,
            None => default.alert_tick_ms,
        };
        Ok(Self {
            log_json,
            otlp_endpoint: file.otlp_endpoint.filter(|e| !e.is_empty()),
            alert_tick_ms,
            alerts,
        })
    }
}
