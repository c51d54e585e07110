//! inhook inside a Rust service (docs/library.md): the service builds a [`Config`] (TOML
//! text and values given in code, [`Settings`]), binds the consumers of its applied events
//! ([`Builder::on_applied`], [`Builder::applied_events`]), starts an [`Inhook`] over its own
//! database, and mounts [`Inhook::router`] on its own axum `Router` and listener. The
//! guarantees are those of `inhook serve` (docs/contract.md, G1–G7): the same store, the
//! same handlers, the same forwarding queue; `inhook serve` itself is built from the same
//! wiring (`app::Core`).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;

use crate::config::{ConfigError, DestinationConfig, ReloadPlan, Target};
use crate::forward::sink::in_process::Consumer;
use crate::forward::sink::Sinks;
use crate::runtime::app::{Core, Running};

pub use crate::config::Config;
pub use crate::forward::sink::in_process::{Applied, AppliedEvents, Pending};

/// A configuration written by the service: TOML text (docs/configuration.md, every key)
/// and values given in code, which win over the text. The process environment is not read
/// unless asked ([`Settings::with_process_env`]): an embedded instance takes its settings
/// from its service alone.
#[derive(Clone, Default)]
pub struct Settings {
    text: Option<String>,
    vars: HashMap<String, String>,
    secrets: Vec<(String, String)>,
    process_env: bool,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values: they hold secrets.
        f.debug_struct("Settings")
            .field("text", &self.text.as_ref().map(|_| "…"))
            .field("vars", &self.vars.keys().collect::<Vec<_>>())
            .field("process_env", &self.process_env)
            .finish_non_exhaustive()
    }
}

impl Settings {
    /// No TOML: the built-in `presence` and `save-game` sources, each needing its secret.
    pub fn new() -> Self {
        Self::default()
    }

    /// The TOML text of a config file (docs/configuration.md).
    pub fn toml(text: impl Into<String>) -> Self {
        Self {
            text: Some(text.into()),
            ..Self::default()
        }
    }

    /// The store: `sqlite://FILE` or `postgres://USER@HOST/DB`, the service's own database.
    pub fn database(self, url: impl Into<String>) -> Self {
        self.var("INHOOK_DATABASE", url)
    }

    /// The token of the read API, the dashboard and `/metrics` when the service mounts
    /// [`Inhook::full_router`] (at least 16 bytes).
    pub fn admin_token(self, token: impl Into<String>) -> Self {
        self.var("INHOOK_ADMIN_TOKEN", token)
    }

    /// A secret of `source`, in place of the TOML's `secrets`; given again, one more
    /// (rotation: any of them verifies).
    pub fn secret(mut self, source: &str, secret: impl Into<String>) -> Self {
        self.secrets.push((source.to_owned(), secret.into()));
        self
    }

    /// The secret (`whsec_…`) a destination's messages are signed with.
    pub fn destination_secret(self, destination: &str, secret: impl Into<String>) -> Self {
        let var = crate::config::destination_secret_env_var(destination);
        self.var(&var, secret)
    }

    /// Any variable of docs/configuration.md (`INHOOK_WORKERS`, `INHOOK_ENCRYPTION_KEYS`, …).
    pub fn var(mut self, name: &str, value: impl Into<String>) -> Self {
        self.vars.insert(name.to_owned(), value.into());
        self
    }

    /// Reads the process environment too, as `inhook serve` does; values given in code win.
    pub fn with_process_env(mut self) -> Self {
        self.process_env = true;
        self
    }

    /// The validated configuration; every refusal names the key, never a secret.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut env: HashMap<String, String> = if self.process_env {
            std::env::vars().collect()
        } else {
            HashMap::new()
        };
        env.extend(self.vars.clone());
        let mut by_var: Vec<(String, Vec<&str>)> = Vec::new();
        for (source, secret) in &self.secrets {
            if secret.contains(',') {
                return Err(ConfigError::new(format!(
                    "source {source:?}: a secret given in code cannot hold a comma"
                )));
            }
            let var = self.secrets_var(source)?;
            match by_var.iter_mut().find(|(v, _)| *v == var) {
                Some((_, secrets)) => secrets.push(secret),
                None => by_var.push((var, vec![secret])),
            }
        }
        for (var, secrets) in by_var {
            env.insert(var, secrets.join(","));
        }
        Config::from_parts(self.text.as_deref(), &env)
    }

    /// The variable `source`'s secrets are read from: its `secrets_env`, else
    /// `INHOOK_<SOURCE>_SECRET`.
    fn secrets_var(&self, source: &str) -> Result<String, ConfigError> {
        let table = match &self.text {
            Some(text) => text.parse::<toml::Table>().map_err(|e| {
                ConfigError::new(format!("the config text is not TOML: {}", e.message()))
            })?,
            None => toml::Table::new(),
        };
        let named = table
            .get("sources")
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_table)
            .find(|s| s.get("name").and_then(toml::Value::as_str) == Some(source))
            .and_then(|s| s.get("secrets_env"))
            .and_then(toml::Value::as_str);
        Ok(named.map_or_else(|| crate::config::secret_env_var(source), str::to_owned))
    }
}

/// Builds an [`Inhook`] from a [`Config`], with the consumers of its in-process destinations.
pub struct Builder {
    config: Config,
    consumers: HashMap<String, Consumer>,
    /// Destination names in the order they were bound.
    order: Vec<String>,
    /// A destination bound twice, refused by [`Builder::start`].
    twice: Option<String>,
}

impl Builder {
    /// A builder over `config`.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            consumers: HashMap::new(),
            order: Vec::new(),
            twice: None,
        }
    }

    /// Calls `callback` with each applied event forwarded to `destination`: one event per
    /// aggregate at a time, in sequence order; `Ok` takes it, an error (or a panic, or
    /// running past the destination's `timeout_s`) is retried with its backoff, and after
    /// `max_attempts` the delivery is dead (docs/forwarding.md). At least once: a callback
    /// must tolerate an event again (`Applied::webhook_id` names it).
    ///
    /// `destination` is a `[[destinations]]` table with `type = "in_process"` when the
    /// config has one by that name (its keys apply: `sources`, `event_types`, retries,
    /// `concurrency`, `timeout_s`); else one taking every source's events, with the
    /// defaults and the top-level retry keys.
    pub fn on_applied<F, Fut>(mut self, destination: &str, callback: F) -> Self
    where
        F: Fn(Applied) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        let consumer: Consumer = Arc::new(move |event| Box::pin(callback(event)));
        self.bind(destination, consumer);
        self
    }

    /// The applied events forwarded to `destination`, as a stream the service reads and
    /// acks ([`Pending::ack`]); otherwise as [`Builder::on_applied`]. The next event of an
    /// aggregate comes once the previous is acked; one not acked within `timeout_s` is
    /// sent again.
    pub fn applied_events(&mut self, destination: &str) -> AppliedEvents {
        let (events, consumer) = AppliedEvents::channel();
        self.bind(destination, consumer);
        events
    }

    fn bind(&mut self, destination: &str, consumer: Consumer) {
        if self
            .consumers
            .insert(destination.to_owned(), consumer)
            .is_some()
        {
            // Said by `start`, which answers errors.
            self.twice.get_or_insert_with(|| destination.to_owned());
        } else {
            self.order.push(destination.to_owned());
        }
    }

    /// Opens and migrates the store, and starts the background work (workers, retention,
    /// senders, alerts, stats). Needs a tokio runtime (multi-threaded: SQLite's commits
    /// block a thread).
    pub async fn start(self) -> anyhow::Result<Inhook> {
        let Builder {
            mut config,
            consumers,
            order,
            twice,
        } = self;
        if let Some(twice) = twice {
            anyhow::bail!("destination {twice:?}: a consumer is bound to it twice");
        }
        config = with_in_process(config, &order)?;
        if config.admin.admin_token.is_none() && !config.admin.admin_open_to_loopback {
            // Fail closed: without a token of the service's, the read API refuses every call.
            config.generate_admin_token();
        }
        let core = Core::build(config, Sinks::with_consumers(consumers)).await?;
        Ok(Inhook {
            running: Some(core.start()),
            bound: order,
        })
    }
}

/// `config` with an in-process destination for each name of `bound` that it lacks; a
/// destination of another type by such a name is an error.
fn with_in_process(mut config: Config, bound: &[String]) -> Result<Config, ConfigError> {
    let mut destinations: Vec<DestinationConfig> = config.destinations.to_vec();
    for name in bound {
        match config.destination(name) {
            Some(d) if d.target == Target::InProcess => {}
            Some(d) => {
                return Err(ConfigError::new(format!(
                    "destination {name:?} is type = {:?}: a consumer binds only to type = \
                     \"in_process\"",
                    d.target.type_name()
                )))
            }
            None => {
                if name.is_empty()
                    || !name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(ConfigError::new(format!(
                        "destination name {name:?} must be non-empty letters, digits, '-' or '_'"
                    )));
                }
                destinations.push(in_process_destination(&config, name));
            }
        }
    }
    config.destinations = destinations.into();
    Ok(config)
}

/// An in-process destination named `name` taking every source's applied events, with the
/// defaults of docs/forwarding.md and the top-level retry keys.
fn in_process_destination(config: &Config, name: &str) -> DestinationConfig {
    use crate::config::defaults;
    DestinationConfig {
        name: name.to_owned(),
        url: crate::config::in_process_url(name),
        target: Target::InProcess,
        sources: config.sources.iter().map(|s| s.name.clone()).collect(),
        event_types: None,
        event_type_globs: None,
        secret: crate::ingress::signature::Secret::new(""),
        secret_from_environment: false,
        timeout_s: defaults::DESTINATION_TIMEOUT_S,
        lease_margin_s: defaults::DESTINATION_LEASE_MARGIN_S,
        retry: config.processing.retry,
        concurrency: defaults::DESTINATION_CONCURRENCY,
        rate_limit_per_s: None,
        tls_ca_file: None,
    }
}

/// A running inhook inside a service: its routes to mount, and its background work, which
/// [`Inhook::shutdown`] stops. Dropped without it, the background work is told to stop and
/// ends on its own.
pub struct Inhook {
    running: Option<Running>,
    bound: Vec<String>,
}

impl Inhook {
    /// A builder over `config` ([`Settings::load`] makes one).
    pub fn builder(config: Config) -> Builder {
        Builder::new(config)
    }

    fn state(&self) -> &crate::http::AppState {
        &self.running.as_ref().expect("running until shutdown").state
    }

    /// The receiver's routes, `POST /webhooks/{source}` (and the `GET` handshakes some
    /// publishers make), to `nest` or `merge` into the service's router. Serve it with
    /// `into_make_service_with_connect_info::<SocketAddr>()`, so that `allow_ips` and the
    /// per-peer limits see each caller's address.
    pub fn router(&self) -> Router {
        with_peer(crate::http::ingress_router(self.state().clone()))
    }

    /// Every route `inhook serve` serves: the receiver, the read API and the dashboard
    /// (`/v1/*`, `/`, behind the admin token), `/metrics`, `/healthz`, `/readyz`,
    /// `/openapi.json`. `POST /v1/admin/reload` answers 422: an embedded inhook takes new
    /// secrets through [`Inhook::reload_secrets`].
    pub fn full_router(&self) -> Router {
        if self.state().config.admin.admin_token_generated {
            tracing::warn!(
                "no admin_token given: the read API and the dashboard refuse every call \
                 (Settings::admin_token)"
            );
        }
        with_peer(
            crate::http::router(self.state().clone())
                .layer(axum::middleware::from_fn(refuse_reload)),
        )
    }

    /// The running configuration, with the in-process destinations bound in code.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.state().config)
    }

    /// Takes the sources' and destinations' secrets of `fresh` (a [`Settings::load`] of the
    /// same settings with new secrets) without a restart, as `inhook serve` does on SIGHUP:
    /// any other change is refused, naming its keys, and nothing changes.
    pub fn reload_secrets(&self, fresh: Config) -> Result<ReloadPlan, ConfigError> {
        let state = self.state();
        let mut fresh = with_in_process(fresh, &self.bound)?;
        if state.config.admin.admin_token_generated && fresh.admin.admin_token.is_none() {
            // The token made at start is no key of the settings: it stays as it is.
            fresh.admin.admin_token = state.config.admin.admin_token.clone();
            fresh.admin.admin_token_generated = true;
        }
        state.secrets.replace(&state.config, &fresh)
    }

    /// Stops the background work: worker steps and calls to consumers and destinations in
    /// hand finish (up to `shutdown_timeout_s`), claimed deliveries not yet sent are given
    /// back, and the figures counted are flushed. Stop serving the routes first.
    pub async fn shutdown(mut self) {
        if let Some(running) = self.running.take() {
            running.finish().await;
        }
    }
}

impl Drop for Inhook {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.detach();
        }
    }
}

/// Answers `POST /v1/admin/reload` of an embedded instance: it reads no config file.
async fn refuse_reload(request: Request, next: Next) -> Response {
    if request.uri().path() == "/v1/admin/reload" {
        return crate::http::answer::Answer::InvalidConfig(
            "an embedded inhook reads no config file: its service passes new secrets to \
             Inhook::reload_secrets (docs/library.md)"
                .into(),
        )
        .into_response();
    }
    next.run(request).await
}

/// `router`, taking the unspecified address as the peer of a request served without
/// `ConnectInfo` (a plain `axum::serve(listener, router)`): allowed by no `allow_ips` and
/// not loopback, so those checks fail closed, and said once in the log.
fn with_peer(router: Router) -> Router {
    router.layer(axum::middleware::from_fn(
        |mut request: Request, next: Next| async move {
            if request
                .extensions()
                .get::<ConnectInfo<SocketAddr>>()
                .is_none()
            {
                static SAID: AtomicBool = AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        "inhook's routes are served without the caller's address: serve the \
                         router with into_make_service_with_connect_info::<SocketAddr>() for \
                         allow_ips, the admin loopback rule and the per-peer limits"
                    );
                }
                let unspecified = SocketAddr::from(([0, 0, 0, 0], 0));
                request.extensions_mut().insert(ConnectInfo(unspecified));
            }
            next.run(request).await
        },
    ))
}
