//! The HTTP section (docs/configuration.md, top-level keys): where inhook listens and what a
//! request may cost it — heads, bodies, connections, the proxies believed and the headers
//! kept with every event.

use std::net::SocketAddr;

use super::section::{file_section, section};
use super::ConfigError;

file_section! {
    /// The HTTP section's keys as the file (or the environment) gives them.
    pub(super) struct FileHttp {
        listen: String = env "INHOOK_LISTEN",
        max_body_bytes: usize,
        header_read_timeout_s: u64,
        body_read_timeout_s: u64,
        max_header_bytes: usize,
        min_body_bytes_per_s: u64,
        max_buffered_body_bytes: usize,
        max_buffered_body_bytes_per_peer: usize,
        max_connections: usize,
        max_connections_per_peer: usize,
        trusted_proxies: Vec<String>,
        keep_headers: Vec<String>,
    }
}

section! {
    /// Where inhook listens and the limits on what a request may hold or take.
    #[derive(Debug, Clone)]
    pub struct Http {
        /// Address to listen on.
        pub listen: SocketAddr => restart,
        /// Largest accepted request body.
        pub max_body_bytes: usize => restart,
        /// A request's head must arrive within this; also how long an idle keep-alive connection stays open.
        pub header_read_timeout_s: u64 => restart,
        /// A delivery's body must arrive within this (408 otherwise).
        pub body_read_timeout_s: u64 => restart,
        /// Largest request head (request line and headers) in bytes (431 beyond).
        pub max_header_bytes: usize => restart,
        /// The slowest a body may arrive after its first [`BODY_RATE_GRACE_S`] seconds (408
        /// below); 0 leaves only `body_read_timeout_s`.
        pub min_body_bytes_per_s: u64 => restart,
        /// Most bytes of request bodies being read at once, over all connections (503 beyond).
        pub max_buffered_body_bytes: usize => restart,
        /// Most of `max_buffered_body_bytes` one peer (an IPv6 /64) may hold at once (503 beyond).
        pub max_buffered_body_bytes_per_peer: usize => restart,
        /// Most connections open at once (lowered at start to fit the descriptor limit).
        pub max_connections: usize => restart,
        /// Most connections open at once from one IP address (429 and closed beyond).
        pub max_connections_per_peer: usize => restart,
        /// The proxies whose `Forwarded` / `X-Forwarded-For` is believed for the client address.
        pub trusted_proxies: crate::ingress::peers::CidrList => restart,
        /// Request headers kept with every source's events beyond the built-in allowlist (lower case).
        pub keep_headers: Vec<String> => restart,
    }
}

/// Seconds a body may take before [`Http::min_body_bytes_per_s`] applies (a client's
/// first packets, a TLS proxy's buffering).
pub const BODY_RATE_GRACE_S: u64 = 2;

/// The least `max_header_bytes` can be: hyper's floor for its read buffer is 8 KiB.
pub const MIN_HEADER_BYTES: usize = 8 * 1024;

/// `max_buffered_body_bytes_per_peer` is the budget over this: eight hosts to block every body.
pub const BUFFERED_BODY_BYTES_PEERS: usize = 8;

impl Default for Http {
    /// The built-in defaults. The two buffer budgets' defaults also depend on
    /// `max_body_bytes` (at least one largest body), which [`Http::resolve`] applies.
    fn default() -> Self {
        Self {
            // Loopback only, so a first run exposes nothing to the network.
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            // 256 KiB, well above a webhook's body and small enough to buffer many.
            max_body_bytes: 256 * 1024,
            // A request head arrives at once; also the keep-alive idle time.
            header_read_timeout_s: 10,
            // Webhook bodies are small; one still arriving is slow or hostile.
            body_read_timeout_s: 10,
            // 16 KiB, twice hyper's floor, room for long signature headers.
            max_header_bytes: 16 * 1024,
            // The default largest body within a minute; a trickle is cut.
            min_body_bytes_per_s: 4096,
            // 64 MiB, 256 bodies of the default `max_body_bytes`.
            max_buffered_body_bytes: 64 * 1024 * 1024,
            max_buffered_body_bytes_per_peer: 64 * 1024 * 1024 / BUFFERED_BODY_BYTES_PEERS,
            // 1024 open at once, which fits the common open-files limit.
            max_connections: 1024,
            // A proxy's or a benchmark's 64 connections while they reconnect.
            max_connections_per_peer: 128,
            trusted_proxies: crate::ingress::peers::CidrList::default(),
            keep_headers: Vec::new(),
        }
    }
}

impl Http {
    /// Validates the section: a budget that could not hold one largest body, or a
    /// connection limit of 0, is an error; read timeouts of 0 are taken as 1.
    pub(super) fn resolve(file: FileHttp) -> Result<Self, ConfigError> {
        let default = Self::default();
        let listen = match &file.listen {
            Some(raw) => raw.parse().map_err(|_| {
                ConfigError(format!(
                    "listen: {raw:?} is not an address like 127.0.0.1:8080"
                ))
            })?,
            None => default.listen,
        };
        let keep_headers =
            super::header_names("keep_headers", file.keep_headers.unwrap_or_default())?;
        let max_body_bytes = file.max_body_bytes.unwrap_or(default.max_body_bytes);
        let max_buffered_body_bytes = file
            .max_buffered_body_bytes
            .unwrap_or(default.max_buffered_body_bytes.max(max_body_bytes));
        if max_buffered_body_bytes < max_body_bytes {
            return Err(ConfigError(format!(
                "max_buffered_body_bytes ({max_buffered_body_bytes}) must be at least max_body_bytes ({max_body_bytes}): \
                 otherwise no body of the largest size could ever be read"
            )));
        }
        let max_buffered_body_bytes_per_peer = file
            .max_buffered_body_bytes_per_peer
            .unwrap_or((max_buffered_body_bytes / BUFFERED_BODY_BYTES_PEERS).max(max_body_bytes))
            .min(max_buffered_body_bytes);
        if max_buffered_body_bytes_per_peer < max_body_bytes {
            return Err(ConfigError(format!(
                "max_buffered_body_bytes_per_peer ({max_buffered_body_bytes_per_peer}) must be at \
                 least max_body_bytes ({max_body_bytes}): otherwise no body of the largest size \
                 could ever be read"
            )));
        }
        let max_connections = file.max_connections.unwrap_or(default.max_connections);
        let max_connections_per_peer = file
            .max_connections_per_peer
            .unwrap_or(default.max_connections_per_peer);
        if max_connections == 0 || max_connections_per_peer == 0 {
            return Err(ConfigError(
                "max_connections and max_connections_per_peer must be at least 1".into(),
            ));
        }
        let trusted_proxies = crate::ingress::peers::CidrList::parse(
            "trusted_proxies",
            file.trusted_proxies.as_deref().unwrap_or_default(),
        )
        .map_err(ConfigError)?;
        Ok(Self {
            listen,
            max_body_bytes,
            header_read_timeout_s: file
                .header_read_timeout_s
                .unwrap_or(default.header_read_timeout_s)
                .max(1),
            body_read_timeout_s: file
                .body_read_timeout_s
                .unwrap_or(default.body_read_timeout_s)
                .max(1),
            max_header_bytes: file
                .max_header_bytes
                .unwrap_or(default.max_header_bytes)
                .max(MIN_HEADER_BYTES),
            min_body_bytes_per_s: file
                .min_body_bytes_per_s
                .unwrap_or(default.min_body_bytes_per_s),
            max_buffered_body_bytes,
            max_buffered_body_bytes_per_peer,
            max_connections,
            max_connections_per_peer,
            trusted_proxies,
            keep_headers,
        })
    }
}
