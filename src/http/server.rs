//! The accept loop: HTTP/1.1 connections with the limits a public endpoint needs
//! (head read timeout, which also bounds idle keep-alive; head size; header count),
//! the peer address for the loopback-only admin rule, and graceful shutdown.

use std::future::Future;
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tower::ServiceExt;

/// Limits applied to every connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A request head must arrive within this; an idle keep-alive connection is closed after it.
    pub header_read_timeout: Duration,
    /// Largest request head in bytes; a larger one gets 431.
    pub max_header_bytes: usize,
}

/// Most headers one request may carry (431 beyond).
const MAX_HEADERS: usize = 100;

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, lets
/// in-flight requests finish and closes idle connections, and returns when all are done.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
) {
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes)
        .max_headers(MAX_HEADERS);
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, or a connection reset before accept: keep serving.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(request)
        });
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                // Timeouts, oversized heads and resets end here; hyper has answered what it could.
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
