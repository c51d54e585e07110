//! Who may call (docs/configuration.md, who may call): a source's `allow_ips` against the
//! client address, which is the TCP peer unless the peer is one of `trusted_proxies`.

use serde_json::{json, Value};

use crate::support::{now_s, signed, Reply, TestServer, PRESENCE_SECRET};
use inhook::ingress::signature::Scheme;

/// A presence source named `gated` that accepts deliveries from `allow` only.
fn gated(allow: &str) -> String {
    format!(
        r#"
[[sources]]
name = "gated"
kind = "presence"
mode = "sync"
signature = "hmac-hex"
secrets = ["{PRESENCE_SECRET}"]
allow_ips = {allow}
"#
    )
}

/// Posts a signed presence event `id` to `gated`, with `extra` headers.
async fn post(server: &TestServer, id: &str, extra: &[(&str, &str)]) -> Reply {
    let body = json!({"event_id": id, "user_id": "usr_A", "presence": "ONLINE",
        "sequence_number": id.len(), "timestamp": now_s()});
    let bytes = serde_json::to_vec(&body).unwrap();
    let mut headers = signed(Scheme::HmacHex, PRESENCE_SECRET, &bytes, now_s());
    headers.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
    server.post_raw("gated", &bytes, &headers).await
}

fn forbidden() -> Value {
    json!({"status": "rejected", "error": "forbidden_peer",
        "detail": "this source accepts deliveries only from the addresses in its allow_ips"})
}

fn server_log(server: &TestServer) -> String {
    std::fs::read_to_string(server.dir().join("server.log")).unwrap_or_default()
}

#[tokio::test]
async fn a_listed_peer_is_served() {
    let server = TestServer::in_process()
        .spawn_with_sources(&gated(r#"["127.0.0.1/32"]"#))
        .await;
    let reply = post(&server, "evt_1", &[]).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(reply.body["status"], "applied");
    assert_eq!(server.count().await, 1);
}

#[tokio::test]
async fn another_peer_is_refused_before_anything_is_read() {
    let server =
        TestServer::spawn_with_sources(&gated(r#"["192.0.2.0/24", "2001:db8::/32"]"#)).await;
    let reply = post(&server, "evt_1", &[]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    // Unsigned, not JSON: still 403, the caller is checked before the body or signature.
    let reply = server.post_raw("gated", b"not json", &[]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    // Without trusted_proxies, a forwarding header changes nothing.
    let reply = post(&server, "evt_2", &[("x-forwarded-for", "192.0.2.7")]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    let reply = post(&server, "evt_3", &[("forwarded", "for=192.0.2.7")]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    assert_eq!(server.count().await, 0, "nothing stored");
    server
        .wait_for_metric(
            "inhook_requests_total",
            &[("source", "gated"), ("code", "403")],
            4.0,
        )
        .await;
    let log = server_log(&server);
    let refusals: Vec<&str> = log
        .lines()
        .filter(|line| line.contains("http") || line.contains("delivery") || line.contains("evt_"))
        .collect();
    assert!(refusals.is_empty(), "nothing logged:\n{log}");
    // Other sources are not gated.
    let reply = server
        .post_presence(&json!({"event_id": "evt_open", "user_id": "usr_A",
            "presence": "ONLINE", "sequence_number": 1, "timestamp": now_s()}))
        .await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
}

#[tokio::test]
async fn a_trusted_proxy_names_the_client() {
    let server = TestServer::in_process()
        .spawn_top_and_sources(
            r#"trusted_proxies = ["127.0.0.1/32"]"#,
            &gated(r#"["192.0.2.0/24"]"#),
        )
        .await;
    // The proxy itself is not allowed.
    let reply = post(&server, "evt_1", &[]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    let reply = post(&server, "evt_2", &[("x-forwarded-for", "192.0.2.7")]).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    let reply = post(&server, "evt_3", &[("forwarded", "for=\"192.0.2.8:4711\"")]).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    // Walked from the right: a client cannot hide behind an allowed address it writes itself.
    let reply = post(
        &server,
        "evt_4",
        &[("x-forwarded-for", "192.0.2.7, 198.51.100.9")],
    )
    .await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    // A hop that does not parse makes the client unknown: refused.
    let reply = post(
        &server,
        "evt_5",
        &[("x-forwarded-for", "192.0.2.7, not-an-ip")],
    )
    .await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    assert_eq!(server.count().await, 2);
}

/// The fourth hardening pass: with `allow_ips` covering the proxies' own range, a hop that
/// does not parse used to drop the chain and make the client the proxy, which passed.
#[tokio::test]
async fn an_unparseable_hop_never_passes_as_the_proxy() {
    let server = TestServer::in_process()
        .spawn_top_and_sources(
            r#"trusted_proxies = ["127.0.0.1/32"]"#,
            &gated(r#"["127.0.0.0/8", "192.0.2.0/24"]"#),
        )
        .await;
    for (i, (name, value)) in [
        ("x-forwarded-for", "junk"),
        ("x-forwarded-for", "192.0.2.7, junk"),
        ("x-forwarded-for", ""),
        ("forwarded", "for=unknown"),
        ("forwarded", "for=_hidden"),
        ("forwarded", "for=192.0.2.7, proto=https"),
    ]
    .into_iter()
    .enumerate()
    {
        let reply = post(&server, &format!("evt_junk_{i}"), &[(name, value)]).await;
        assert_eq!(
            (reply.code, &reply.body),
            (403, &forbidden()),
            "{name}: {value:?}"
        );
    }
    assert_eq!(server.count().await, 0, "nothing stored");
    // The proxy's own request (no forwarding header) and a named allowed client still pass,
    // as does junk left of the first untrusted hop, which is never read.
    let reply = post(&server, "evt_proxy", &[]).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    let reply = post(
        &server,
        "evt_named",
        &[("x-forwarded-for", "junk, 192.0.2.7")],
    )
    .await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    assert_eq!(server.count().await, 2);
}

#[tokio::test]
async fn an_untrusted_peers_forwarding_headers_are_ignored() {
    let server = TestServer::in_process()
        .spawn_top_and_sources(
            r#"trusted_proxies = ["10.0.0.0/8"]"#,
            &gated(r#"["192.0.2.0/24"]"#),
        )
        .await;
    let reply = post(&server, "evt_1", &[("x-forwarded-for", "192.0.2.7")]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    let reply = post(&server, "evt_2", &[("forwarded", "for=192.0.2.7")]).await;
    assert_eq!((reply.code, &reply.body), (403, &forbidden()));
    assert_eq!(server.count().await, 0);
}

/// Sends `request` on a fresh connection from 127.0.0.1, which stays open.
async fn send_raw(server: &TestServer, request: String) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let addr = server.url.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request.as_bytes()).await.unwrap();
    stream
}

/// A body of `length` declared bytes to the presence source, from the client `client`
/// as a proxy on 127.0.0.1 names it; `sent` bytes of it sent.
fn stalled_request(client: &str, length: usize, sent: usize) -> String {
    format!(
        "POST /webhooks/presence HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         x-forwarded-for: {client}\r\ncontent-length: {length}\r\nconnection: close\r\n\r\n{}",
        " ".repeat(sent)
    )
}

#[tokio::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_body_budget() {
    use tokio::io::AsyncReadExt;
    const LIMIT: usize = 16 * 1024;
    let server = TestServer::in_process()
        .spawn_configured(
            &format!(
                "trusted_proxies = [\"127.0.0.1/32\"]\nmax_body_bytes = {LIMIT}\n\
             max_buffered_body_bytes = {}\nmax_buffered_body_bytes_per_peer = {LIMIT}\n\
             body_read_timeout_s = 20\nmin_body_bytes_per_s = 0",
                8 * LIMIT
            ),
            "",
        )
        .await;
    // 192.0.2.7, through the proxy, stalls a body just short of its share.
    let stalled = send_raw(&server, stalled_request("192.0.2.7", LIMIT, LIMIT - 100)).await;
    // A short bounded wait for the server to buffer that body: no answer marks it read.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Its next body does not fit its share, though it comes over the same proxy as others.
    let mut second = send_raw(&server, stalled_request("192.0.2.7", 2048, 2048)).await;
    let mut answer = String::new();
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        second.read_to_string(&mut answer),
    )
    .await
    .expect("answered")
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("server_busy"), "{answer}");
    // Another client behind the same proxy has a share of its own (without
    // trusted_proxies, it would share the proxy's and get 503 too).
    let body = serde_json::to_vec(&json!({"event_id": "evt_other", "user_id": "usr_B",
        "presence": "ONLINE", "sequence_number": 1, "timestamp": now_s()}))
    .unwrap();
    let mut headers = signed(Scheme::HmacHex, PRESENCE_SECRET, &body, now_s());
    headers.push(("x-forwarded-for", "198.51.100.1".into()));
    let reply = server.post_raw("presence", &body, &headers).await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    drop(stalled);
}
