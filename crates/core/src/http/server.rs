//! The accept loop: HTTP/1.1 connections with the limits a public endpoint needs
//! (a cap on open connections overall and per peer, head read timeout, which also
//! bounds idle keep-alive; head size; header count), the peer address for the
//! loopback-only admin rule, and graceful shutdown.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt;

use crate::operations::log_throttle::{LogThrottle, NOISY_LOG_INTERVAL};

/// Limits applied to every connection.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// A request head must arrive within this; an idle keep-alive connection is closed after it.
    pub header_read_timeout: Duration,
    /// Largest request head in bytes; a larger one gets 431.
    pub max_header_bytes: usize,
    /// Most connections open at once; at the cap, accepting waits (the kernel's backlog holds new ones).
    pub max_connections: usize,
    /// Most connections open at once from one IP address (IPv6: one /64); beyond, a new one gets 429 and is closed.
    pub max_connections_per_peer: usize,
}

/// Most headers one request may carry (431 beyond).
const MAX_HEADERS: usize = 100;

/// Descriptors kept out of `max_connections` for everything else: listener, log,
/// SQLite files and their readers, and the DNS and OTLP clients (the PostgreSQL pool comes on top).
const RESERVED_DESCRIPTORS: usize = 64;

/// The `max_connections` this process can hold given its descriptor limit
/// (`RLIMIT_NOFILE`), keeping `RESERVED_DESCRIPTORS` and `other_descriptors` for the rest.
pub fn effective_max_connections(configured: usize, other_descriptors: usize) -> usize {
    match open_files_limit() {
        Some(limit) => capped(configured, limit, other_descriptors),
        None => configured,
    }
}

fn capped(configured: usize, open_files_limit: u64, other_descriptors: usize) -> usize {
    let available = usize::try_from(open_files_limit)
        .unwrap_or(usize::MAX)
        .saturating_sub(RESERVED_DESCRIPTORS + other_descriptors);
    configured.min(available).max(1)
}

/// The soft `RLIMIT_NOFILE`: the most descriptors this process may open; `None` when unlimited.
pub fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives for the call.
    let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (read == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// Open connections per peer address, so that one peer cannot take every slot; and per
/// IPv6 /48, since a host (or one customer of a provider) may hold a whole /48 and so
/// thousands of /64 peers.
#[derive(Default, Clone)]
struct PeerCounts(Arc<Mutex<HashMap<IpAddr, usize>>>);

/// How many peers' caps one IPv6 /48 may hold at most.
const PEERS_PER_SITE: usize = 4;

/// One counted connection of a peer; uncounted when dropped.
struct PeerSlot {
    counts: PeerCounts,
    keys: [Option<IpAddr>; 2],
}

impl PeerCounts {
    /// Counts a new connection from `peer`, unless it holds `cap` already (or, over IPv6,
    /// its /48 holds [`PEERS_PER_SITE`] times that).
    fn enter(&self, peer: IpAddr, cap: usize) -> Option<PeerSlot> {
        let keys = [Some(peer_key(peer)), site_key(peer)];
        let caps = [cap, cap.saturating_mul(PEERS_PER_SITE)];
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let full = keys
            .iter()
            .zip(caps)
            .any(|(key, cap)| key.is_some_and(|k| counts.get(&k).copied().unwrap_or(0) >= cap));
        if full {
            return None;
        }
        for key in keys.iter().flatten() {
            *counts.entry(*key).or_default() += 1;
        }
        Some(PeerSlot {
            counts: self.clone(),
            keys,
        })
    }
}

/// The IPv6 /48 of `ip`, kept apart from every /64 key (its low 64 bits are all ones, which
/// no /64 key has); `None` over IPv4.
fn site_key(ip: IpAddr) -> Option<IpAddr> {
    match ip.to_canonical() {
        IpAddr::V6(v6) => Some(IpAddr::V6(std::net::Ipv6Addr::from_bits(
            (v6.to_bits() & !((1u128 << 80) - 1)) | ((1u128 << 64) - 1),
        ))),
        IpAddr::V4(_) => None,
    }
}

/// Whom a connection is counted against: its IPv4 address (also when it arrives
/// IPv4-mapped on a dual-stack socket), or its IPv6 /64, the block one host usually holds.
pub(super) fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(std::net::Ipv6Addr::from_bits(
            v6.to_bits() & !((1u128 << 64) - 1),
        )),
        v4 => v4,
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut counts = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        for key in self.keys.iter().flatten() {
            if let Some(open) = counts.get_mut(key) {
                *open -= 1;
                if *open == 0 {
                    counts.remove(key);
                }
            }
        }
    }
}

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
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let peers = PeerCounts::default();
    let accept_failures = LogThrottle::new(NOISY_LOG_INTERVAL);
    let peer_refusals = LogThrottle::new(NOISY_LOG_INTERVAL);
    let at_cap = LogThrottle::new(NOISY_LOG_INTERVAL);
    tokio::pin!(shutdown);
    loop {
        if slots.available_permits() == 0 {
            if let Some(suppressed) = at_cap.admit() {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    suppressed,
                    "max_connections open: new connections wait in the listen backlog"
                );
            }
        }
        // Waiting for a free slot before accepting leaves new connections to the kernel's
        // backlog: no descriptor is taken, nothing spins, and nothing crashes.
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of descriptors, or a connection reset before accept: keep serving.
                    if let Some(suppressed) = accept_failures.admit() {
                        tracing::warn!(error = %err, suppressed, "accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(peer_slot) = peers.enter(peer.ip(), limits.max_connections_per_peer) else {
            if let Some(suppressed) = peer_refusals.admit() {
                tracing::warn!(
                    peer = %peer.ip(),
                    max_connections_per_peer = limits.max_connections_per_peer,
                    suppressed,
                    "connection refused: the peer holds max_connections_per_peer"
                );
            }
            refuse(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let service = hyper::service::service_fn(move |mut request: hyper::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            app.clone().oneshot(request)
        });
        let io = JsonParseErrors::new(TokioIo::new(stream));
        let connection = graceful.watch(http.serve_connection(io, service));
        tokio::spawn(async move {
            let _held = (slot, peer_slot);
            if let Err(err) = connection.await {
                // Timeouts, oversized heads and resets end here; hyper has answered what it could.
                tracing::debug!(%peer, error = %err, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Closes a connection over the per-peer cap with a 429, without waiting on the peer:
/// the answer fits the fresh socket's send buffer, and what the peer already sent is
/// read first so that closing does not reset the connection under the answer.
fn refuse(stream: TcpStream) {
    let mut sent = [0u8; 4096];
    for _ in 0..4 {
        match stream.try_read(&mut sent) {
            Ok(n) if n > 0 => {}
            _ => break,
        }
    }
    let _ = stream.try_write(super::answer::too_many_connections());
}

/// The connection's IO, which gives hyper's own answers to requests it cannot parse
/// (400, 414, 431: written by hyper with an empty body) the JSON error body of every
/// other answer. Everything else passes through untouched.
struct JsonParseErrors<T> {
    inner: T,
    replacing: Option<Replacement>,
}

/// A JSON answer written in place of hyper's, and how many of hyper's bytes it stands for.
struct Replacement {
    answer: Vec<u8>,
    written: usize,
    stands_for: usize,
}

impl<T> JsonParseErrors<T> {
    fn new(inner: T) -> Self {
        Self {
            inner,
            replacing: None,
        }
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for JsonParseErrors<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for JsonParseErrors<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.replacing.is_none() {
            this.replacing = super::answer::with_json_body(buf).map(|answer| Replacement {
                answer,
                written: 0,
                stands_for: buf.len(),
            });
        }
        let Some(replacement) = &mut this.replacing else {
            return Pin::new(&mut this.inner).poll_write(cx, buf);
        };
        // hyper calls again with the same bytes until told they are written.
        while replacement.written < replacement.answer.len() {
            let rest = &replacement.answer[replacement.written..];
            let n = ready!(Pin::new(&mut this.inner).poll_write(cx, rest))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            replacement.written += n;
        }
        let stands_for = replacement.stands_for;
        this.replacing = None;
        Poll::Ready(Ok(stands_for))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        // hyper's own answer is a lone head: the first non-empty slice.
        let first = bufs.iter().find(|b| !b.is_empty());
        if let Some(first) = first {
            if self.replacing.is_some() || super::answer::with_json_body(first).is_some() {
                return self.poll_write(cx, first);
            }
        }
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_connection_cap_leaves_room_under_the_descriptor_limit() {
        assert_eq!(capped(1024, 1_048_576, 16), 1024);
        assert_eq!(capped(1024, 256, 16), 256 - RESERVED_DESCRIPTORS - 16);
        assert_eq!(
            capped(1024, 10, 16),
            1,
            "never zero: the server must still serve"
        );
    }

    #[test]
    fn each_peer_holds_at_most_its_cap_and_gets_slots_back() {
        let peers = PeerCounts::default();
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let first = peers.enter(a, 2).unwrap();
        let _second = peers.enter(a, 2).unwrap();
        assert!(peers.enter(a, 2).is_none());
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        assert!(peers.enter(mapped, 2).is_none(), "the same peer over IPv6");
        assert!(peers.enter(b, 2).is_some(), "another peer is not affected");
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        let same_block: IpAddr = "2001:db8::ffff:2".parse().unwrap();
        let other_block: IpAddr = "2001:db8:0:1::1".parse().unwrap();
        let _v6 = peers.enter(v6, 1).unwrap();
        assert!(
            peers.enter(same_block, 1).is_none(),
            "one IPv6 /64 is one peer"
        );
        assert!(peers.enter(other_block, 1).is_some());
        // One /48 holds at most four peers' caps, however many /64s it has.
        let site: Vec<IpAddr> = (2..8)
            .map(|n| format!("2001:db8:0:{n}::1").parse().unwrap())
            .collect();
        // 2001:db8::1 holds one already; three more /64s of its /48 fill it.
        let _held: Vec<_> = site[..3]
            .iter()
            .map(|ip| peers.enter(*ip, 1).unwrap())
            .collect();
        assert!(
            peers.enter(site[3], 1).is_none(),
            "the /48 holds four already"
        );
        let elsewhere: IpAddr = "2001:db8:1::1".parse().unwrap();
        assert!(
            peers.enter(elsewhere, 1).is_some(),
            "another /48 is another site"
        );
        drop(first);
        assert!(
            peers.enter(a, 2).is_some(),
            "a closed connection frees its slot"
        );
    }
}
