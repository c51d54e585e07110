//! Wiring: open the store, migrate, bind, and run the HTTP server and the
//! worker until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::config::{Config, Database};
use crate::domain::clock::Clock;
use crate::forward::sender::{Circuits, Sender};
use crate::forward::sink::Sinks;
use crate::http::server::{effective_max_connections, open_files_limit, serve, ConnectionLimits};
use crate::http::tally::SourceTallies;
use crate::http::{router, AppState};
use crate::runtime::replays::BulkReplays;
use crate::runtime::worker::Worker;
use crate::store::{PoolSettings, PostgresStore, SqliteStore, Store, StoreError};

/// Opens the configured store and brings its schema up to date.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store = connect_store(config)?;
    store.migrate().await.context("migrating the schema")?;
    store.unlock().await.context("unlocking the store's keys")?;
    Ok(store)
}

/// Opens the configured store for a command that reads one (`events`, `replay`, `forget`…):
/// an SQLite file that does not exist is an error, never a new empty store, so a command run
/// in the wrong folder says so instead of printing an empty table.
pub async fn open_existing_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    if let Database::Sqlite(path) = &config.store.database {
        if !path.exists() {
            anyhow::bail!(
                "no inhook store at {} ({}): run the command where `inhook serve` runs, or name \
                 the store with --config or INHOOK_DATABASE",
                path.display(),
                config.store.database
            );
        }
    }
    open_store(config).await
}

/// Events read per transaction by the headers upgrade step.
const PRUNE_BATCH: usize = 1_000;

/// The upgrade step queued by migration 12: rows of older releases kept every request
/// header but signatures; those holding a header the allowlist now refuses for their
/// source are rewritten (docs/contract.md, what is stored), so credentials leave the store
/// and its backups. `inhook migrate` runs it to the end; `inhook serve` runs it in the
/// background (reads hide those headers meanwhile), so a large store starts at once.
pub async fn prune_stored_headers(store: &dyn Store, config: &Config) -> Result<(), StoreError> {
    use crate::store::PRUNE_HEADERS_STEP;
    if !store.upgrade_step_pending(PRUNE_HEADERS_STEP).await? {
        return Ok(());
    }
    let by_source: std::collections::HashMap<String, Vec<String>> = config
        .sources
        .iter()
        .map(|s| (s.name.clone(), s.keep_headers.clone()))
        .collect();
    let top_level = config.http.keep_headers.clone();
    let keep: Arc<crate::store::HeaderFilter> = Arc::new(move |source: &str, stored: &str| {
        let extra = by_source.get(source).unwrap_or(&top_level);
        crate::ingress::kept_headers::pruned(stored, extra)
    });
    let (mut after, mut rewritten) = (0, 0);
    while let (Some(last), changed) = store
        .prune_headers(after, PRUNE_BATCH, Arc::clone(&keep))
        .await?
    {
        after = last;
        rewritten += changed;
    }
    store.finish_upgrade_step(PRUNE_HEADERS_STEP).await?;
    tracing::info!(rewritten, "stored request headers pruned to the allowlist");
    Ok(())
}

/// Opens the configured store as it is, without migrating.
pub fn connect_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match &config.store.database {
        Database::Sqlite(path) => {
            let store =
                SqliteStore::open(path, Duration::from_millis(config.store.busy_timeout_ms))
                    .with_context(|| format!("opening SQLite database {}", path.display()))?;
            let store = store.with_encryption(config.store.encryption.clone());
            Arc::new(if config.store.group_commit {
                store
            } else {
                store.without_group_commit()
            })
        }
        Database::Postgres(url) => {
            let store = PostgresStore::connect(
                url,
                PoolSettings {
                    max_size: config.store.pool_size,
                    timeout: Duration::from_millis(config.store.busy_timeout_ms),
                },
            )?
            .with_encryption(config.store.encryption.clone());
            Arc::new(if config.store.group_commit {
                store
            } else {
                store.without_group_commit()
            })
        }
    };
    Ok(store)
}

/// Everything one inhook runs, built and not started: the state the handlers share, the
/// senders and the alert channels. `inhook serve` ([`Application`]) and a service embedding
/// inhook ([`crate::embed`]) both build it here, and start it with [`Core::start`].
pub(crate) struct Core {
    /// What every handler shares.
    pub(crate) state: AppState,
    /// One per configured destination (docs/forwarding.md), started with the background work.
    senders: Vec<Sender>,
    /// The `[[alerts]]` channels, started with the background work.
    alerts: crate::operations::alerts::send::Outbox,
}

impl Core {
    /// Opens the store, migrates it and builds the state and senders of `config`; `sinks`
    /// holds the consumers of its in-process destinations.
    pub(crate) async fn build(config: Config, sinks: Sinks) -> anyhow::Result<Self> {
        // A process holding another recorder keeps it (docs/library.md, limits).
        crate::operations::metrics::try_install();
        let store = open_store(&config).await?;
        let secrets = crate::config::LiveSecrets::of(&config);
        let mut senders = Sender::for_destinations_with(
            &config.destinations,
            &store,
            Clock::System,
            &secrets,
            sinks,
        )?;
        for sender in &mut senders {
            sender.poll = Duration::from_millis(config.processing.forward_poll_ms);
        }
        Sender::set_media_types(&mut senders, &config.sources);
        Sender::prepare_all(&senders).await;
        let circuits = Circuits::of(&senders);
        let alerts = crate::operations::alerts::send::Outbox::of(&config, &secrets)?;
        let wake = Arc::new(Notify::new());
        store.subscribe(Arc::clone(&wake));
        let feed_start = store
            .last_change_id()
            .await
            .context("reading the last state change")?;
        let feed = Arc::new(crate::http::ChangeFeed::new(
            feed_start,
            config.admin.max_streams,
            config.admin.stream_buffer,
        ));
        let body_budget = crate::http::BodyBudget::new(
            config.http.max_buffered_body_bytes,
            config.http.max_buffered_body_bytes_per_peer,
        );
        let tallies = Arc::new(SourceTallies::new(
            config.sources.iter().map(|source| source.name.as_str()),
        ));
        Ok(Self {
            senders,
            alerts,
            state: AppState {
                config: Arc::new(config),
                store,
                wake,
                forward_wake: Arc::new(Notify::new()),
                feed,
                clock: Clock::System,
                tallies,
                secrets,
                token_guesses: Arc::default(),
                body_budget,
                costly_checks: Arc::new(tokio::sync::Semaphore::new(
                    std::thread::available_parallelism().map_or(1, |n| n.get()),
                )),
                circuits,
            },
        })
    }

    /// Starts the background work: workers, retention, backlog, metrics upkeep, stats,
    /// the headers upgrade step, bulk replays, senders, alerts and the change feed.
    pub(crate) fn start(self) -> Running {
        let (stop_tx, stop_rx) = watch::channel(false);
        let worker = Worker {
            config: Arc::clone(&self.state.config),
            store: self.state.store.clone(),
            wake: Arc::clone(&self.state.wake),
            forward_wake: Arc::clone(&self.state.forward_wake),
            clock: self.state.clock,
        };
        let mut background = tokio::task::JoinSet::new();
        background.spawn(worker.clone().run(stop_rx.clone()));
        background.spawn(
            crate::runtime::worker::Retention {
                config: Arc::clone(&self.state.config),
                store: self.state.store.clone(),
                clock: self.state.clock,
            }
            .run(stop_rx.clone()),
        );
        background.spawn(watch_backlog(self.state.clone(), stop_rx.clone()));
        background.spawn(metrics_upkeep(stop_rx.clone()));
        background.spawn(crate::operations::stats::run_flush(
            Arc::clone(&self.state.store),
            Arc::clone(&self.state.config),
            stop_rx.clone(),
        ));
        let (store, config) = (
            Arc::clone(&self.state.store),
            Arc::clone(&self.state.config),
        );
        background.spawn(async move {
            if let Err(err) = prune_stored_headers(store.as_ref(), &config).await {
                tracing::warn!(error = %err, "stored request headers not pruned; tried again at the next start");
            }
        });
        background.spawn(
            BulkReplays {
                store: self.state.store.clone(),
                worker_wake: Arc::clone(&self.state.wake),
                forward_wake: Arc::clone(&self.state.forward_wake),
                forwarding: !self.senders.is_empty(),
                clock: self.state.clock,
            }
            .run(stop_rx.clone()),
        );
        if !self.senders.is_empty() {
            // This node's committers ring it themselves; the store rings it for the others'.
            let forward_wake = Arc::clone(&self.state.forward_wake);
            self.state
                .store
                .subscribe_deliveries(Arc::clone(&forward_wake));
            background.spawn(Sender::run_all(self.senders, forward_wake, stop_rx.clone()));
        }
        if !self.state.config.observability.alerts.is_empty() {
            // This node's name: on its own notices, and on the outbox rows it holds.
            let node: Arc<str> = crate::forward::sender::node_id().into();
            let outbox = self.alerts.start(
                &mut background,
                &stop_rx,
                Arc::clone(&self.state.store),
                Arc::clone(&node),
                self.state.clock,
                Duration::from_millis(self.state.config.observability.alert_tick_ms),
            );
            background.spawn(
                crate::operations::alerts::AlertWatch {
                    config: Arc::clone(&self.state.config),
                    store: Arc::clone(&self.state.store),
                    circuits: self.state.circuits.clone(),
                    clock: self.state.clock,
                    outbox,
                    node,
                }
                .run(stop_rx.clone()),
            );
        }
        background.spawn(Arc::clone(&self.state.feed).run(
            Arc::clone(&self.state.store),
            crate::http::ChangeMask::of(&self.state.config),
            stop_rx.clone(),
        ));
        Running {
            state: self.state,
            stop: stop_tx,
            background,
        }
    }
}

/// The background work of a started [`Core`], until [`Running::finish`].
pub(crate) struct Running {
    /// What every handler shares.
    pub(crate) state: AppState,
    /// Turned true to stop the background work.
    pub(crate) stop: watch::Sender<bool>,
    background: tokio::task::JoinSet<()>,
}

impl Running {
    /// Tells the background work to stop and leaves it to end on its own (an
    /// [`crate::embed::Inhook`] dropped without its shutdown).
    pub(crate) fn detach(mut self) {
        let _ = self.stop.send(true);
        self.background.detach_all();
    }

    /// Stops the background work: lets worker steps and requests to destinations finish
    /// for up to `shutdown_timeout_s` (their transactions roll back after it), then flushes
    /// the figures they counted.
    pub(crate) async fn finish(mut self) {
        let _ = self.stop.send(true);
        let grace = Duration::from_secs(self.state.config.processing.shutdown_timeout_s);
        let drained = tokio::time::timeout(grace, async {
            while self.background.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "shutdown timeout: abandoning worker steps (their transactions roll back)"
            );
        }
        // After the work in hand: what it counted is flushed too.
        let _ = tokio::time::timeout(
            grace,
            crate::operations::stats::flush_all(self.state.store.as_ref(), &self.state.config),
        )
        .await;
    }
}

/// A bound, ready-to-run inhook.
pub struct Application {
    listener: TcpListener,
    core: Core,
}

impl Application {
    /// Opens the store, migrates it and binds the listen address (port 0 picks a free port).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let listen = config.http.listen;
        let core = Core::build(config, Sinks::default()).await?;
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        Ok(Self { listener, core })
    }

    /// The handle through which a config reload replaces the sources' and destinations' secrets.
    pub fn secrets(&self) -> crate::config::LiveSecrets {
        self.core.state.secrets.clone()
    }

    /// The running configuration, which a reload checks the config read against.
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.core.state.config)
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves: then stops accepting, lets in-flight requests and
    /// worker steps finish for up to `shutdown_timeout_s`, and returns.
    pub async fn run_until_stopped(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let running = self.core.start();
        let stop_rx = running.stop.subscribe();
        let grace = Duration::from_secs(running.state.config.processing.shutdown_timeout_s);
        let config = &running.state.config;
        let pool = match config.store.database {
            Database::Postgres(_) => config.store.pool_size,
            Database::Sqlite(_) => 0,
        };
        let max_connections = effective_max_connections(config.http.max_connections, pool);
        let mut max_connections_per_peer = config.http.max_connections_per_peer;
        if max_connections < config.http.max_connections {
            // The cap the operator chose no longer leaves room for other peers: keep half for them.
            if max_connections_per_peer >= max_connections {
                max_connections_per_peer = (max_connections / 2).max(1);
            }
            tracing::warn!(
                max_connections,
                max_connections_per_peer,
                configured = config.http.max_connections,
                open_files_limit = open_files_limit(),
                "max_connections lowered to fit the open files limit (ulimit -n)"
            );
        } else {
            tracing::info!(
                max_connections,
                max_connections_per_peer = config.http.max_connections_per_peer,
                open_files_limit = open_files_limit(),
                "connection cap"
            );
        }
        let limits = ConnectionLimits {
            header_read_timeout: Duration::from_secs(config.http.header_read_timeout_s),
            max_header_bytes: config.http.max_header_bytes,
            max_connections,
            max_connections_per_peer,
        };
        let app = router(running.state.clone());
        let stopping = {
            let stop_tx = running.stop.clone();
            async move {
                shutdown.await;
                tracing::info!("shutting down: no new connections; finishing work in hand");
                let _ = stop_tx.send(true);
            }
        };
        let server = serve(self.listener, app, limits, stopping);
        let mut stopped = stop_rx.clone();
        let deadline = async move {
            let _ = stopped.wait_for(|s| *s).await;
            tokio::time::sleep(grace).await;
        };
        tokio::select! {
            () = server => {}
            () = deadline => tracing::warn!("shutdown timeout: dropping open connections"),
        }
        running.finish().await;
        Ok(())
    }
}

/// How often the backlog that `max_backlog` limits is read from the store.
const BACKLOG_REFRESH: Duration = Duration::from_secs(1);

/// Keeps each source's backlog in `state.tallies` current, so ingress compares against it without a query per request.
async fn watch_backlog(state: AppState, mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        if let Ok(counts) = state.store.undecided_counts().await {
            let mut backlog = std::collections::HashMap::new();
            for (source, _, n) in counts {
                *backlog.entry(source).or_insert(0) += n;
            }
            state.tallies.set_backlogs(&backlog);
        }
        tokio::select! {
            _ = tokio::time::sleep(BACKLOG_REFRESH) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Runs [`crate::operations::metrics::run_upkeep`] until shutdown.
async fn metrics_upkeep(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow() {
        crate::operations::metrics::run_upkeep();
        tokio::select! {
            _ = tokio::time::sleep(crate::operations::metrics::UPKEEP_EVERY) => {}
            _ = stop.changed() => {}
        }
    }
}

/// Resolves on ctrl-c or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}
