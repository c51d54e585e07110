//! The admin section (docs/configuration.md, top-level keys; docs/api.md): who may read the
//! admin API, what it and the change stream show, and the optional endpoints.

use super::section::{file_section, section};
use super::ConfigError;
use crate::ingress::signature::Secret;

file_section! {
    /// The admin section's keys as the file (or the environment) gives them.
    pub(super) struct FileAdmin {
        admin_token: String = env "INHOOK_ADMIN_TOKEN",
        admin_open_to_loopback: bool = env "INHOOK_ADMIN_OPEN_TO_LOOPBACK",
        metrics_public: bool,
        bench_ceiling: bool,
        mask_fields: Vec<String>,
        max_streams: usize,
        stream_buffer: usize,
    }
}

section! {
    /// The admin API: its token, what it masks, its change streams and the optional endpoints.
    #[derive(Debug, Clone)]
    pub struct Admin {
        /// Token for `/v1/*`: configured, or generated at start by
        /// [`super::Config::generate_admin_token`]. A reload compares it apart: a generated
        /// one is in no file (config/reload.rs).
        pub admin_token: Option<Secret> => apart,
        /// Whether `admin_token` was generated for this run rather than configured.
        pub admin_token_generated: bool => apart,
        /// With no `admin_token`, serve `/v1/*` to direct loopback clients without a token (an
        /// explicit opt-in: a same-host proxy makes every client look like loopback).
        pub admin_open_to_loopback: bool => restart,
        /// Serve `/metrics` without the admin token.
        pub metrics_public: bool => restart,
        /// Serve `POST /bench/ceiling`, a fixed 202 with no work: the HTTP ceiling for benchmarks.
        pub bench_ceiling: bool => restart,
        /// Fields masked in all API, stream and dashboard output (names at any depth or dotted
        /// paths, case-insensitive).
        pub mask_fields: Vec<String> => restart,
        /// Most `GET /v1/stream` connections open at once on this node (503 beyond).
        pub max_streams: usize => restart,
        /// Changes held for a stream that reads slowly; past it, the stream catches up from the store.
        pub stream_buffer: usize => restart,
    }
}

impl Default for Admin {
    /// The built-in defaults.
    fn default() -> Self {
        Self {
            admin_token: None,
            admin_token_generated: false,
            // Off, so no admin API answers without a token unless opted in.
            admin_open_to_loopback: false,
            // Off, so `/metrics` needs the admin token.
            metrics_public: false,
            // Off, the endpoint is for benchmarks only.
            bench_ceiling: false,
            mask_fields: Vec::new(),
            // 64 change streams per node, plenty of dashboards and consumers.
            max_streams: 64,
            // 1024 changes held for a slow stream before it catches up from the store.
            stream_buffer: 1024,
        }
    }
}

impl Admin {
    /// Validates the section: a token set but empty or short, or a stream limit of 0, is an
    /// error naming the key (or the variable that set it), never the token.
    pub(super) fn resolve(file: FileAdmin) -> Result<Self, ConfigError> {
        let default = Self::default();
        let admin_token = match &file.admin_token {
            Some(token) => Some(admin_token(token, file.origin("admin_token"))?),
            None => None,
        };
        let max_streams = file.max_streams.unwrap_or(default.max_streams);
        if max_streams == 0 {
            return Err(ConfigError(
                "max_streams: must be at least 1 (open change streams per node)".into(),
            ));
        }
        let stream_buffer = file.stream_buffer.unwrap_or(default.stream_buffer);
        if stream_buffer == 0 {
            return Err(ConfigError(
                "stream_buffer: must be at least 1 (changes held for a slow stream)".into(),
            ));
        }
        Ok(Self {
            admin_token,
            admin_token_generated: false,
            admin_open_to_loopback: file
                .admin_open_to_loopback
                .unwrap_or(default.admin_open_to_loopback),
            metrics_public: file.metrics_public.unwrap_or(default.metrics_public),
            bench_ceiling: file.bench_ceiling.unwrap_or(default.bench_ceiling),
            mask_fields: file.mask_fields.unwrap_or_default(),
            max_streams,
            stream_buffer,
        })
    }
}

/// The shortest admin token accepted: 16 random bytes are out of reach of guessing. A
/// source's shared token or Basic password has the same minimum.
pub const MIN_ADMIN_TOKEN_BYTES: usize = crate::ingress::signature::MIN_SHARED_SECRET_BYTES;

/// Random bytes in a generated admin token (printed as twice as many hex digits).
pub(super) const GENERATED_TOKEN_BYTES: usize = 24;

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
