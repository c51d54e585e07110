//! A public endpoint meets clients that send slowly, never finish, or send heads
//! too large: each gets a bounded answer or a closed connection, nothing is
//! stored, and the server keeps serving the others meanwhile.

use std::time::{Duration, Instant};

use inhook::ingress::signature::Scheme;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{now_s, signed, TestServer, SAVE_SECRETS};

const LIMITS: &str = "header_read_timeout_s = 1\nbody_read_timeout_s = 1";

async fn connect(server: &TestServer) -> TcpStream {
    TcpStream::connect(server.url.trim_start_matches("http://"))
        .await
        .expect("connect")
}

/// Reads until the server closes the connection (or 10 s pass); returns what came and when.
pub(crate) async fn read_until_closed(stream: &mut (impl AsyncRead + Unpin)) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the server kept the connection open for 10 s"),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

#[tokio::test]
async fn a_silent_or_trickling_client_is_cut_off_after_the_head_timeout() {
    let server = TestServer::spawn_configured(LIMITS, "").await;

    let mut silent = connect(&server).await;
    let (mut trickle_read, mut trickle_write) = connect(&server).await.into_split();
    let trickle = async move {
        // One byte of a head every 300 ms: never a whole head within the timeout.
        for byte in b"POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\nx-a: b\r\n" {
            if trickle_write.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        std::future::pending::<()>().await;
    };
    tokio::spawn(trickle);
    let (silent_end, trickle_end) = tokio::join!(
        async {
            // Meanwhile the server answers everyone else.
            assert_eq!(server.get("/healthz").await.code, 200);
            read_until_closed(&mut silent).await
        },
        read_until_closed(&mut trickle_read),
    );
    for (what, (_, after)) in [("silent", silent_end), ("trickling", trickle_end)] {
        assert!(
            after < Duration::from_secs(5),
            "{what} connection held {after:?}"
        );
    }

    // An idle keep-alive connection is closed too, after a request it was answered.
    let mut idle = connect(&server).await;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (answered, after) = read_until_closed(&mut idle).await;
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    assert!(
        after < Duration::from_secs(5),
        "idle connection held {after:?}"
    );
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn a_body_that_stalls_gets_408_and_nothing_is_stored() {
    let server = TestServer::spawn_configured(LIMITS, "").await;
    let body = serde_json::to_vec(&json!({"event_id": "slow", "event_type": "progress.saved",
        "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "slow",
        "data": {}}))
    .unwrap();
    let mut head = format!(
        "POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s()) {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let mut stream = connect(&server).await;
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(&body[..body.len() / 2]).await.unwrap();
    let (answer, after) = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains(r#""error":"request_timeout""#), "{answer}");
    assert!(after < Duration::from_secs(5), "answered after {after:?}");
    assert_eq!(server.count().await, 0);

    // The same delivery sent whole is taken.
    let headers = signed(Scheme::HmacTimestamped, SAVE_SECRETS[0], &body, now_s());
    assert_eq!(
        server.post_raw("save-game", &body, &headers).await.code,
        202
    );
}

#[tokio::test]
async fn unparsable_or_oversized_heads_get_400_or_431_with_a_json_body() {
    let server = TestServer::spawn().await;
    let huge = format!(
        "POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\nx-padding: {}\r\n\r\n",
        "a".repeat(64 * 1024)
    );
    let mut many = String::from("POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\n");
    for i in 0..150 {
        many.push_str(&format!("x-h{i}: v\r\n"));
    }
    many.push_str("\r\n");
    for head in [huge, many] {
        let mut stream = connect(&server).await;
        // The server may answer and close before it has read all of a huge head.
        let _ = stream.write_all(head.as_bytes()).await;
        let (answer, _) = read_until_closed(&mut stream).await;
        assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
        // Like every other answer, with a JSON error body saying what was wrong.
        let (head, body) = answer.split_once("\r\n\r\n").expect("head and body");
        assert!(
            head.contains("\r\ncontent-type: application/json\r\n"),
            "{answer}"
        );
        let body: serde_json::Value = serde_json::from_str(body).expect(&answer);
        assert_eq!(
            (body["status"].as_str(), body["error"].as_str()),
            (Some("rejected"), Some("headers_too_large"))
        );
    }
    // A head hyper cannot parse gets its 400 with a JSON body too.
    let mut stream = connect(&server).await;
    stream
        .write_all(b"POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n")
        .await
        .unwrap();
    let (answer, _) = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    let body: serde_json::Value =
        serde_json::from_str(answer.split_once("\r\n\r\n").unwrap().1).expect(&answer);
    assert_eq!(body["error"], "bad_request");
    assert_eq!(server.get("/healthz").await.code, 200);
    assert_eq!(server.count().await, 0);
}

#[tokio::test]
async fn trickling_bodies_that_declare_the_limit_do_not_block_a_genuine_delivery() {
    // Eight clients each declare a body the size of the limit and send one byte of it:
    // together they declare twice the buffered budget, but they hold only what they sent.
    let server = TestServer::in_process()
        .spawn_configured(
            "max_body_bytes = 4096\nmax_buffered_body_bytes = 16384\nbody_read_timeout_s = 20",
            "",
        )
        .await;
    let mut trickling = Vec::new();
    for _ in 0..8 {
        let mut stream = connect(&server).await;
        let head =
            "POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
                    x-timestamp: 1\r\nx-signature: 00\r\ncontent-length: 4096\r\n\r\n{";
        stream.write_all(head.as_bytes()).await.unwrap();
        trickling.push(stream);
    }
    // Give the server time to start reading every one of those bodies: a short bounded
    // wait, as nothing but /metrics (not read by this test) marks a body begun.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let reply = server
        .post_save(
            &json!({"event_id": "genuine", "event_type": "progress.saved",
            "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "genuine",
            "data": {}}),
        )
        .await;
    assert_eq!(reply.code, 202, "{:?}", reply.body);
    assert_eq!(server.count().await, 1);
    drop(trickling);
}

#[tokio::test]
async fn a_body_slower_than_the_minimum_rate_is_cut_long_before_the_timeout() {
    let server =
        TestServer::spawn_configured("body_read_timeout_s = 60\nmin_body_bytes_per_s = 1024", "")
            .await;
    let (mut read, mut write) = connect(&server).await.into_split();
    write
        .write_all(
            b"POST /webhooks/save-game HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
              content-length: 4096\r\n\r\n{",
        )
        .await
        .unwrap();
    // A byte every 200 ms: 5 bytes a second, against 1024 after a 2 s grace.
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            if write.write_all(b" ").await.is_err() {
                return;
            }
        }
    });
    let (answer, after) = read_until_closed(&mut read).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(after < Duration::from_secs(6), "cut after {after:?}");
    assert_eq!(server.count().await, 0);
    // A genuine delivery, sent at once, is far above the rate.
    let reply = server
        .post_save(&json!({"event_id": "quick", "event_type": "progress.saved",
            "player_id": "p", "save_slot": "s", "sequence": 1, "idempotency_key": "quick",
            "data": {}}))
        .await;
    assert_eq!(reply.code, 202, "{:?}", reply.body);
}
