//! A TCP proxy a test puts between inhook and a broker, to take the broker away and bring
//! it back without touching the machine's service: `cut` closes every connection and
//! refuses new ones, `restore` lets them through again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// A running proxy to one upstream address.
pub struct TcpProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl TcpProxy {
    /// Listens on a free local port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("proxy bind");
        let addr = listener.local_addr().expect("proxy address");
        let cut = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let accept = tokio::spawn({
            let (cut, links) = (Arc::clone(&cut), Arc::clone(&links));
            async move {
                loop {
                    let Ok((mut inbound, _)) = listener.accept().await else {
                        continue;
                    };
                    if cut.load(Ordering::SeqCst) {
                        drop(inbound);
                        continue;
                    }
                    let link = tokio::spawn(async move {
                        let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    });
                    let mut links = links.lock().expect("links");
                    links.retain(|l| !l.is_finished());
                    links.push(link);
                }
            }
        });
        Self {
            addr,
            cut,
            links,
            accept,
        }
    }

    /// The address inhook connects to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Closes every open connection and refuses new ones until [`TcpProxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        for link in self.links.lock().expect("links").drain(..) {
            link.abort();
        }
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

#[tokio::test]
async fn a_cut_proxy_closes_and_refuses_connections_until_restored() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = echo.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = echo.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    let proxy = TcpProxy::start(upstream).await;
    let round_trip = |addr| async move {
        let mut conn = TcpStream::connect(addr).await.ok()?;
        conn.write_all(b"ping").await.ok()?;
        let mut got = [0u8; 4];
        conn.read_exact(&mut got).await.ok()?;
        Some((conn, got))
    };
    let (mut open, got) = round_trip(proxy.addr()).await.expect("through");
    assert_eq!(&got, b"ping");
    proxy.cut();
    let mut rest = Vec::new();
    let _ = open.write_all(b"more").await;
    let read = open.read_to_end(&mut rest).await;
    assert!(read.is_err() || rest.is_empty(), "the open link is closed");
    assert!(
        round_trip(proxy.addr()).await.is_none(),
        "new links refused"
    );
    proxy.restore();
    assert_eq!(
        round_trip(proxy.addr()).await.expect("restored").1,
        *b"ping"
    );
}
