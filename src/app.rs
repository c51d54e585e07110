//! Wiring: open the store, migrate, bind, and run the HTTP server and the
//! worker until shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};

use crate::config::{Config, Database};
use crate::http::{router, AppState};
use crate::store::{SqliteStore, Store};
use crate::worker;

/// Opens the configured store and brings its schema up to date.
pub async fn open_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let store: Arc<dyn Store> = match &config.database {
        Database::Sqlite(path) => Arc::new(
            SqliteStore::open(path, Duration::from_millis(config.busy_timeout_ms))
                .with_context(|| format!("opening SQLite database {}", path.display()))?,
        ),
    };
    store.migrate().await.context("migrating the schema")?;
    Ok(store)
}

/// A bound, ready-to-run inhook.
pub struct Application {
    listener: TcpListener,
    state: AppState,
}

impl Application {
    /// Opens the store, migrates it and binds the listen address (port 0 picks a free port).
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let store = open_store(&config).await?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        Ok(Self {
            listener,
            state: AppState {
                config: Arc::new(config),
                store,
                wake: Arc::new(Notify::new()),
            },
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves, then stops the worker and waits for it.
    pub async fn run_until_stopped(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> anyhow::Result<()> {
        let (stop_tx, stop_rx) = watch::channel(false);
        let worker = tokio::spawn(worker::run(
            Arc::clone(&self.state.config),
            Arc::clone(&self.state.store),
            Arc::clone(&self.state.wake),
            stop_rx,
        ));
        let app = router(self.state).into_make_service_with_connect_info::<SocketAddr>();
        axum::serve(self.listener, app)
            .with_graceful_shutdown(shutdown)
            .await
            .context("serving HTTP")?;
        let _ = stop_tx.send(true);
        worker.await.context("worker task")?;
        Ok(())
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
