//! Resources a client can take without authenticating are bounded: open
//! connections overall and per peer address, and the bytes of request bodies
//! being read at once; admin bodies are small. Real sockets against the real
//! binary: the server stays up, its descriptors stay bounded, and other clients
//! are still served.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};

use crate::slow_clients::read_until_closed;
use crate::support::{now_s, signed, TestServer, SAVE_SECRETS};

/// Opens a connection whose source address is `ip` (another loopback address is another peer).
async fn connect_from(server: &TestServer, ip: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{ip}:0").parse().unwrap())
        .expect("bind the client address");
    let addr = server.url.trim_start_matches("http://").parse().unwrap();
    socket.connect(addr).await.expect("connect")
}

/// Opens `count` connections from 127.0.0.1 that never send a byte.
async fn half_open(server: &TestServer, count: usize) -> Vec<TcpStream> {
    let mut flood = Vec::with_capacity(count);
    for _ in 0..count {
        flood.push(connect_from(server, "127.0.0.1").await);
    }
    flood
}

/// The descriptors the server process holds open.
fn open_descriptors(server: &TestServer) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .expect("the server is running")
        .count()
}

/// The descriptors the server holds once the closing of earlier connections is done
/// (a client may see the end of a connection before the server has released it).
async fn settled_descriptors(server: &TestServer) -> usize {
    let mut fewest = open_descriptors(server);
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        fewest = fewest.min(open_descriptors(server));
    }
    fewest
}

/// `GET /healthz` from `ip`; the raw answer.
async fn healthz_from(server: &TestServer, ip: &str) -> String {
    let mut stream = connect_from(server, ip).await;
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    read_until_closed(&mut stream).await.0
}

/// A server with these connection limits, warmed up, and its settled descriptor count.
async fn flood_target(max: usize, per_peer: usize, head_timeout_s: u64) -> (TestServer, usize) {
    let server = TestServer::spawn_configured(
        &format!("max_connections = {max}\nmax_connections_per_peer = {per_peer}\nheader_read_timeout_s = {head_timeout_s}\npool_size = 2"),
        "",
    )
    .await;
    // Warmed up over a connection that is closed at once (a pooled one would count as the flood's).
    assert!(healthz_from(&server, "127.0.0.3")
        .await
        .starts_with("HTTP/1.1 200"));
    let before = settled_descriptors(&server).await;
    (server, before)
}

/// The JSON body of a raw HTTP answer.
fn json_body(answer: &str) -> Value {
    let (_, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {answer}"))
}

#[tokio::test]
async fn one_peer_flooding_connections_holds_its_share_and_others_are_served_at_once() {
    const PER_PEER: usize = 4;
    const FLOOD: usize = 100;
    let (server, before) = flood_target(16, PER_PEER, 3).await;

    let flood = half_open(&server, FLOOD).await;
    // Queued behind the whole flood in the listen backlog, yet answered before any
    // of the flood's kept connections has timed out: the flood's extra ones were refused.
    let started = Instant::now();
    let answer = healthz_from(&server, "127.0.0.2").await;
    let waited = started.elapsed();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        waited < Duration::from_secs(3),
        "another peer waited {waited:?}, longer than the head read timeout"
    );
    let during = open_descriptors(&server);
    assert!(
        during <= before + PER_PEER + 4,
        "{during} descriptors open during the flood, {before} before"
    );

    let answers = futures_util::future::join_all(
        flood
            .into_iter()
            .map(|mut stream| async move { read_until_closed(&mut stream).await.0 }),
    )
    .await;
    let refused: Vec<_> = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 429"))
        .collect();
    assert_eq!(
        refused.len(),
        FLOOD - PER_PEER,
        "all but {PER_PEER} refused"
    );
    let body = json_body(refused[0]);
    assert_eq!(
        (body["status"].as_str(), body["error"].as_str()),
        (Some("rejected"), Some("too_many_connections"))
    );
    assert!(refused[0].contains("retry-after: 1\r\n"), "{}", refused[0]);
    // The kept ones were served as usual: closed after the head timeout, without an answer.
    assert!(
        answers
            .iter()
            .filter(|a| !a.starts_with("HTTP/1.1 429"))
            .all(String::is_empty),
        "{answers:?}"
    );
    assert_eq!(server.get("/healthz").await.code, 200);
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn at_max_connections_accepting_waits_and_descriptors_stay_bounded() {
    const CAP: usize = 8;
    const FLOOD: usize = 40;
    let (server, before) = flood_target(CAP, 1000, 1).await;

    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (most, done, pid) = (Arc::clone(&most), Arc::clone(&done), server.pid());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
                    most.fetch_max(fds.count(), Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let flood = half_open(&server, FLOOD).await;
    // Each is taken in its turn, as slots free up, and closed after the head timeout:
    // none is dropped unserved and the server never crashes.
    let ends = futures_util::future::join_all(
        flood
            .into_iter()
            .map(|mut stream| async move { read_until_closed(&mut stream).await }),
    )
    .await;
    done.store(true, Ordering::SeqCst);
    sampler.await.unwrap();
    let last = ends.iter().map(|(_, after)| *after).max().unwrap();
    assert!(
        last >= Duration::from_secs(2),
        "{FLOOD} connections over a cap of {CAP} took turns, yet the last closed after {last:?}"
    );
    let most = most.load(Ordering::SeqCst);
    assert!(
        most <= before + CAP + 4,
        "{most} descriptors open at the peak, {before} before, cap {CAP}"
    );
    assert!(
        most >= before + CAP,
        "the flood never reached the cap ({most} descriptors, {before} before)"
    );
    assert_eq!(
        healthz_from(&server, "127.0.0.2").await[..12],
        *"HTTP/1.1 200"
    );
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn bodies_read_at_once_are_bounded_by_the_buffer_budget() {
    const LIMIT: usize = 16 * 1024;
    let server = TestServer::spawn_configured(
        &format!(
            // One peer may hold the whole budget here: the share of one peer is tested below.
            "max_body_bytes = {LIMIT}\nmax_buffered_body_bytes = {}\n\
             max_buffered_body_bytes_per_peer = {}\nbody_read_timeout_s = 9",
            2 * LIMIT,
            2 * LIMIT
        ),
        "",
    )
    .await;
    let filler = vec![b' '; LIMIT];
    // Two deliveries that send all but one byte of a whole limit's worth and then stall
    // hold the budget: it is taken as bytes arrive, not from the declared length.
    // Polled well inside their 9 s read timeout (each 408 must still come within
    // read_until_closed's 10 s). Under the parallel PostgreSQL suite a round now and then
    // saw no 503 within 8 s, cause not found (the heads are read before any store access);
    // a fresh pair of stalled deliveries is tried then, and three such rounds fail the test.
    let mut rounds = 0;
    let (busy, stalled) = loop {
        rounds += 1;
        let mut stalled = Vec::new();
        for _ in 0..2 {
            let mut stream = connect_from(&server, "127.0.0.1").await;
            stream
                .write_all(
                    format!(
                        "POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: {LIMIT}\r\n\r\n{{{}",
                        " ".repeat(LIMIT - 2)
                    )
                    .as_bytes(),
                )
                .await
                .unwrap();
            stalled.push(stream);
        }
        let deadline = Instant::now() + Duration::from_secs(8);
        let busy = loop {
            // Unsigned: it would be a 401 if its body were read at all.
            let reply = server
                .post_raw(
                    "save-game",
                    &filler,
                    &[("content-type", "application/json".to_owned())],
                )
                .await;
            if reply.code == 503 {
                break Some(reply);
            }
            assert_eq!(reply.code, 401, "{reply:?}");
            if Instant::now() >= deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        match busy {
            Some(busy) => break (busy, stalled),
            None => {
                assert!(rounds < 3, "the stalled bodies never held the budget");
                drop(stalled);
                // Closed bodies give their share back as the server reads their end.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    assert_eq!(
        (busy.body["status"].as_str(), busy.body["error"].as_str()),
        (Some("error"), Some("server_busy"))
    );
    assert_eq!(busy.retry_after.as_deref(), Some("1"));
    for mut stream in stalled {
        let (answer, _) = read_until_closed(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    assert_eq!(server.count().await, 0);

    // The budget comes back with the connections: a delivery is taken again.
    let body = serde_json::to_vec(&json!({"event_id": "after", "event_type": "progress.saved",
        "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "after",
        "data": {}}))
    .unwrap();
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());
    assert_eq!(
        server.post_raw("save-game", &body, &headers).await.code,
        202
    );
    assert_eq!(server.count().await, 1);
}

#[tokio::test]
async fn one_peer_holds_at_most_its_share_of_the_body_budget() {
    const LIMIT: usize = 16 * 1024;
    let server = TestServer::spawn_configured(
        &format!(
            "max_body_bytes = {LIMIT}\nmax_buffered_body_bytes = {}\nbody_read_timeout_s = 20\n\
             min_body_bytes_per_s = 0",
            8 * LIMIT
        ),
        "",
    )
    .await;
    // 127.0.0.2 stalls a body just short of its share (an eighth of the budget, one limit).
    let mut stalled = connect_from(&server, "127.0.0.2").await;
    stalled
        .write_all(
            format!(
                "POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                 content-length: {LIMIT}\r\n\r\n{{{}",
                " ".repeat(LIMIT - 100)
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // A short bounded wait for the server to buffer that body: no answer marks it read.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Its next body does not fit its share: 503, though the budget has room for six more.
    let mut second = connect_from(&server, "127.0.0.2").await;
    second
        .write_all(
            format!(
                "POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                 content-length: 2048\r\nconnection: close\r\n\r\n{}",
                " ".repeat(2048)
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut second).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("server_busy"), "{answer}");
    // Another peer is served meanwhile.
    let body = serde_json::to_vec(
        &json!({"event_id": "other-peer", "event_type": "progress.saved",
        "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "other-peer",
        "data": {}}),
    )
    .unwrap();
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());
    assert_eq!(
        server.post_raw("save-game", &body, &headers).await.code,
        202
    );
    drop(stalled);
    assert_eq!(server.count().await, 1);
}

#[tokio::test]
async fn a_replay_filter_over_64_kib_gets_413_and_no_job() {
    let server = TestServer::spawn().await;
    let client = reqwest::Client::new();
    let huge = client
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({"status": "dead", "aggregate": "a".repeat(1024 * 1024)}))
        .send()
        .await
        .unwrap();
    assert_eq!(huge.status(), 413);
    let body: Value = huge.json().await.unwrap();
    assert_eq!(
        (body["status"].as_str(), body["error"].as_str()),
        (Some("rejected"), Some("payload_too_large"))
    );
    assert_eq!(body["limit_bytes"], 64 * 1024);
    assert_eq!(server.get("/v1/replay/1").await.code, 404, "nothing stored");

    // A fresh connection: the server closes the one whose body it refused unread, and a
    // pooled reuse of it could race that close (IncompleteMessage).
    let small = reqwest::Client::new()
        .post(format!("{}/v1/replay", server.url))
        // The longest aggregate a filter can name: two parts of 128 bytes.
        .json(&json!({"status": "dead", "aggregate": format!("{}/{}", "a".repeat(128), "b".repeat(128))}))
        .send()
        .await
        .unwrap();
    assert_eq!(small.status(), 202);
    assert_eq!(
        small.json::<Value>().await.unwrap()["job_id"],
        1,
        "the refused one took no job id"
    );
}
