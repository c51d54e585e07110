//! Encryption at rest and erasure (docs/encryption.md) end to end, on the store the suite
//! runs on: what a publisher sent is nowhere in the database's files or columns in
//! plaintext, yet the admin reads it; a ciphertext moved to another row does not open;
//! forgetting an aggregate leaves nothing of it readable, and its redeliveries duplicates.

use std::time::Duration;

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};

use crate::application::{serve_recording, Behaviour, Seen, DEST_SECRET};
use crate::support::{now_s, signed, Reply, TestServer};

/// A string that must never reach the store in plaintext.
pub const MARKER: &str = "zq7-marker-ex41";

/// The first master key of these tests.
pub const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

const SECRET: &str = "vault-test-secret";

/// Two json sources, one settled at ingest and one by the worker, whose state and kept
/// header carry what the publisher sent, forwarded to `destination`.
fn sources(destination: &str) -> String {
    let source = |name: &str, mode: &str| {
        format!(
            r#"
[[sources]]
name = "{name}"
kind = "json"
mode = "{mode}"
signature = "hmac-hex"
secrets = ["{SECRET}"]
event_id = "/id"
aggregate = "/customer"
sequence = "/seq"
event_type = "/type"
ordering = "latest-wins"
state = "/data"
keep_headers = ["x-customer-note"]
"#
        )
    };
    format!(
        r#"{}{}
[[destinations]]
name = "app"
url = "{destination}"
secret = "{DEST_SECRET}"
sources = ["vault-sync", "vault-async"]
retry_base_s = 1
"#,
        source("vault-sync", "sync"),
        source("vault-async", "async"),
    )
}

/// A server encrypting under k1 whose forwards go to a closed port, so they stay
/// undelivered.
async fn encrypted_server() -> TestServer {
    TestServer::spawn_top_and_sources(&encrypted(&[K1]), &sources("http://127.0.0.1:9/hooks")).await
}

/// The top-level lines of a store encrypting under `keys`.
pub fn encrypted(keys: &[&str]) -> String {
    let listed: Vec<String> = keys.iter().map(|k| format!("{k:?}")).collect();
    format!("encryption = {{ keys = [{}] }}\n", listed.join(", "))
}

fn body(id: &str, customer: &str, seq: i64, note: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "customer": customer,
        "seq": seq,
        "type": "customer.updated",
        "data": {"email": format!("{note}@example.com"), "name": note},
    }))
    .unwrap()
}

async fn post(server: &TestServer, source: &str, body: &[u8], note: &str) -> Reply {
    let mut headers = signed(Scheme::HmacHex, SECRET, body, now_s());
    headers.push(("x-customer-note", note.to_owned()));
    server.post_raw(source, body, &headers).await
}

/// Every file of a SQLite store (database, WAL, shared memory), or every text and bytes
/// column of every table of a PostgreSQL one, that holds `needle`.
pub async fn holders_of(server: &TestServer, needle: &[u8]) -> Vec<String> {
    if crate::support::Backend::fresh_kind() == "postgres" {
        return postgres_holders(server, needle).await;
    }
    let mut holders = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let path = format!("{}{suffix}", server.db_path().display());
        if let Ok(bytes) = std::fs::read(&path) {
            if bytes.windows(needle.len()).any(|w| w == needle) {
                holders.push(path);
            }
        }
    }
    holders
}

async fn postgres_holders(server: &TestServer, needle: &[u8]) -> Vec<String> {
    // Compared as hex, text columns as their UTF-8 bytes: a needle of any bytes (a
    // wrapped key) needs no quoting, and no text collation can hide it.
    let hex = hex::encode(needle);
    let columns = server
        .query_rows(
            "SELECT table_name, column_name, data_type FROM information_schema.columns
             WHERE table_schema = current_schema() AND data_type IN ('text', 'bytea')",
        )
        .await;
    let mut holders = Vec::new();
    for row in columns {
        let (table, column, kind) = (&row[0], &row[1], &row[2]);
        let bytes = if kind == "bytea" {
            column.clone()
        } else {
            format!("convert_to({column}, 'UTF8')")
        };
        let found = server
            .query_i64(&format!(
                "SELECT COUNT(*) FROM {table} WHERE encode({bytes}, 'hex') LIKE '%{hex}%'"
            ))
            .await;
        if found > 0 {
            holders.push(format!("{table}.{column}"));
        }
    }
    holders
}

/// Waits for writes that may still be in flight after the answers a test has seen (a
/// sender's attempt rows, a worker step begun before a forget) and that no answer marks:
/// kept short and bounded only before scans whose moment no later event proves passed.
async fn settle_files() {
    tokio::time::sleep(Duration::from_millis(300)).await;
}

#[tokio::test]
async fn what_publishers_sent_is_sealed_at_rest_and_shown_to_the_admin() {
    let seen = Seen::behaving(Behaviour {
        fail_rate: 0.0,
        accept_delay_ms: 0,
    });
    let port = serve_recording(&seen).await;
    let destination = format!("http://127.0.0.1:{port}/hooks");
    let server = TestServer::spawn_top_and_sources(
        &(encrypted(&[K1]) + "retention_s = 3600\n"),
        &sources(&destination),
    )
    .await;
    for (source, prefix) in [("vault-sync", "s"), ("vault-async", "a")] {
        for seq in 1..=3 {
            let id = format!("{prefix}-evt-{seq}");
            let sent = body(&id, &format!("cus-{prefix}"), seq, MARKER);
            let answer = post(&server, source, &sent, MARKER).await;
            assert!(answer.code < 300, "{source} {seq}: {answer:?}");
            // A redelivery is still a duplicate: by id, and by body (a keyed hash now).
            let again = post(&server, source, &sent, MARKER).await;
            assert_eq!(again.body["status"], "duplicate", "{again:?}");
        }
    }
    server
        .wait_status("vault-async", "a-evt-3", "processed")
        .await;
    let detail = server
        .wait_detail("vault-async", "a-evt-3", "processed")
        .await;
    assert_eq!(detail["body"]["data"]["name"], MARKER, "{detail}");
    assert_eq!(detail["headers"]["x-customer-note"], MARKER, "{detail}");
    let state = server.get("/v1/sources/vault-sync/aggregates/cus-s").await;
    assert_eq!(state.code, 200, "{state:?}");
    assert_eq!(state.body["state"]["name"], MARKER, "{state:?}");
    // Forwarding sends the original bytes.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let forwarded = {
            let seen = seen.lock().unwrap();
            seen.accepted.values().flatten().count()
        };
        if forwarded >= 6 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "forwarded {forwarded} of 6"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let bodies: Vec<Vec<u8>> = {
        let seen = seen.lock().unwrap();
        seen.accepted
            .values()
            .flatten()
            .map(|(_, b)| b.clone())
            .collect()
    };
    assert!(bodies
        .iter()
        .all(|b| String::from_utf8_lossy(b).contains(MARKER)));
    // A replay reads the sealed body back and applies it again.
    let replayed = server
        .post_admin("/v1/events/vault-async/a-evt-1/replay", &json!({}))
        .await;
    assert!(replayed.code < 300 || replayed.code == 409, "{replayed:?}");
    if replayed.code == 202 {
        // Queued again, then applied: its writes are in the files.
        server
            .wait_for("/v1/events/vault-async/a-evt-1", |r| {
                r.body["replays"] == 1 && r.body["status"] == "processed"
            })
            .await;
    }
    let holders = holders_of(&server, MARKER.as_bytes()).await;
    assert!(
        holders.is_empty(),
        "the marker is stored in plaintext in {holders:?}"
    );
}

#[tokio::test]
async fn a_ciphertext_moved_to_another_row_does_not_open_and_the_server_keeps_serving() {
    let server = encrypted_server().await;
    for (id, seq) in [("evt-a", 1), ("evt-b", 2)] {
        let sent = body(id, "cus-1", seq, "someone");
        assert!(post(&server, "vault-sync", &sent, "note").await.code < 300);
    }
    // Same aggregate, same data key: only the binding to the row keeps it out.
    server
        .run_sql(
            "UPDATE events SET body = (SELECT body FROM events WHERE event_id = 'evt-a')
             WHERE event_id = 'evt-b'",
            "UPDATE events SET body = (SELECT body FROM events WHERE event_id = 'evt-a')
             WHERE event_id = 'evt-b'",
        )
        .await;
    let moved = server.get("/v1/events/vault-sync/evt-b").await;
    assert_eq!(moved.code, 500, "{moved:?}");
    assert_eq!(
        moved.body,
        json!({"status": "error", "error": "undecryptable"})
    );
    let intact = server.get("/v1/events/vault-sync/evt-a").await;
    assert_eq!(intact.code, 200, "{intact:?}");
    assert_eq!(intact.body["body"]["id"], "evt-a");
    let listed = server.get("/v1/events?source=vault-sync").await;
    assert_eq!(listed.code, 200, "{listed:?}");
    let next = body("evt-c", "cus-1", 3, "someone");
    assert!(post(&server, "vault-sync", &next, "note").await.code < 300);
}

/// Forgets `aggregate` of `source` through the admin API.
pub async fn forget(server: &TestServer, source: &str, aggregate: &str) -> Reply {
    server
        .delete(&format!("/v1/sources/{source}/aggregates/{aggregate}"))
        .await
}

#[tokio::test]
async fn a_forgotten_aggregate_is_gone_for_good_and_its_redeliveries_are_duplicates() {
    // Deliveries to a closed port stay undelivered: forgetting skips them.
    let server = encrypted_server().await;
    let gone = body("gone-1", "cus-gone", 1, MARKER);
    let kept = body("kept-1", "cus-kept", 1, "kept-person");
    assert!(post(&server, "vault-sync", &gone, MARKER).await.code < 300);
    assert!(post(&server, "vault-sync", &kept, "kept").await.code < 300);
    let wrapped_key = server
        .query_hex("SELECT wrapped FROM data_keys WHERE aggregate = 'cus-gone'")
        .await;
    let answer = forget(&server, "vault-sync", "cus-gone").await;
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(answer.body["status"], "erased");
    assert_eq!(answer.body["events_erased"], 1);
    assert_eq!(answer.body["state_deleted"], true);
    assert_eq!(answer.body["data_key_destroyed"], true);
    assert_eq!(answer.body["encrypted"], true);
    assert_eq!(answer.body["deliveries_skipped"], 1, "{answer:?}");
    // Gone from the API: the event erased, the state unknown.
    let event = server.get("/v1/events/vault-sync/gone-1").await;
    assert_eq!(event.code, 200, "{event:?}");
    assert_eq!(event.body["status"], "erased");
    assert_eq!(event.body["body"], Value::Null);
    assert_eq!(
        server
            .get("/v1/sources/vault-sync/aggregates/cus-gone")
            .await
            .code,
        404
    );
    let erased = server.get("/v1/events?status=erased").await;
    assert_eq!(
        erased.body["items"].as_array().unwrap().len(),
        1,
        "{erased:?}"
    );
    // A redelivery is still a duplicate; a second forget finds nothing.
    assert_eq!(
        post(&server, "vault-sync", &gone, MARKER).await.body["status"],
        "duplicate"
    );
    assert_eq!(forget(&server, "vault-sync", "cus-gone").await.code, 404);
    // The other aggregate is untouched.
    let other = server
        .get("/v1/sources/vault-sync/aggregates/cus-kept")
        .await;
    assert_eq!(other.body["state"]["name"], "kept-person", "{other:?}");
    // Its undelivered forward is skipped, named so.
    let skipped = server
        .get("/v1/destinations/app/deliveries?status=skipped")
        .await;
    let items = skipped.body["items"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(items.len(), 1, "{skipped:?}");
    assert_eq!(items[0]["last_error"], "erased", "{skipped:?}");
    // Neither the data key nor the plaintext is left anywhere in the store.
    settle_files().await;
    let holders = holders_of(&server, &hex::decode(&wrapped_key).unwrap()).await;
    assert!(
        holders.is_empty(),
        "the destroyed key is still in {holders:?}"
    );
    assert!(holders_of(&server, MARKER.as_bytes()).await.is_empty());
    // A later event of the aggregate starts it afresh under a new key.
    let fresh = body("gone-2", "cus-gone", 2, "new-life");
    assert!(post(&server, "vault-sync", &fresh, "note").await.code < 300);
    let state = server
        .get("/v1/sources/vault-sync/aggregates/cus-gone")
        .await;
    assert_eq!(state.body["state"]["name"], "new-life", "{state:?}");
}

#[tokio::test]
async fn without_encryption_forget_deletes_the_bodies_and_says_backups_keep_them() {
    let server = TestServer::spawn_with_sources(&sources("http://127.0.0.1:9/hooks")).await;
    let gone = body("gone-1", "cus-gone", 1, MARKER);
    assert!(post(&server, "vault-sync", &gone, MARKER).await.code < 300);
    // The check finds plaintext where there is some: the store holds the marker now.
    crate::support::eventually("the marker in the store's files", || async {
        !holders_of(&server, MARKER.as_bytes()).await.is_empty()
    })
    .await;
    let answer = forget(&server, "vault-sync", "cus-gone").await;
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(answer.body["encrypted"], false);
    assert_eq!(answer.body["data_key_destroyed"], false);
    let note = answer.body["backups"].as_str().unwrap();
    assert!(
        note.contains("backups taken before still hold them"),
        "{note}"
    );
    let event = server.get("/v1/events/vault-sync/gone-1").await;
    assert_eq!(event.body["status"], "erased");
    settle_files().await;
    let holders = holders_of(&server, MARKER.as_bytes()).await;
    assert!(holders.is_empty(), "the marker is still in {holders:?}");
}

#[tokio::test]
async fn forget_on_the_command_line_erases_and_names_the_aggregate() {
    let server = encrypted_server().await;
    let gone = body("gone-1", "cus/1", 1, MARKER);
    assert!(post(&server, "vault-async", &gone, MARKER).await.code < 300);
    let (ok, out) = server.cli(&[
        "forget",
        "--source",
        "vault-async",
        "--aggregate",
        "cus%2F1",
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("1 events erased"), "{out}");
    assert!(out.contains("audit: aggregate erased on request"), "{out}");
    let (ok, out) = server.cli(&[
        "forget",
        "--source",
        "vault-async",
        "--aggregate",
        "cus%2F1",
    ]);
    assert!(!ok, "{out}");
    assert!(out.contains("nothing is stored"), "{out}");
    assert_eq!(
        server.get("/v1/events/vault-async/gone-1").await.body["status"],
        "erased"
    );
}

#[tokio::test]
async fn a_forget_on_one_node_takes_effect_on_another_that_cached_the_key() {
    if crate::support::Backend::fresh_kind() != "postgres" {
        eprintln!("skipped: several nodes share a database only on PostgreSQL");
        return;
    }
    let first = encrypted_server().await;
    let second = TestServer::join(&first).await;
    // The second node seals under the aggregate's key and keeps it cached (read back
    // from the store at its second event).
    for (id, seq) in [("evt-0", 0), ("evt-1", 1)] {
        let sent = body(id, "cus-1", seq, "before");
        assert!(post(&second, "vault-sync", &sent, "note").await.code < 300);
    }
    let answer = forget(&first, "vault-sync", "cus-1").await;
    assert_eq!(answer.body["data_key_destroyed"], true, "{answer:?}");
    assert_eq!(answer.body["events_erased"], 2, "{answer:?}");
    // Its cached key is gone from the store: the next event is sealed under a new one.
    let two = body("evt-2", "cus-1", 2, "after");
    let logged = post(&second, "vault-sync", &two, "note").await;
    assert!(logged.code < 300, "{logged:?}");
    for node in [&first, &second] {
        let event = node.get("/v1/events/vault-sync/evt-2").await;
        assert_eq!(event.code, 200, "{event:?}");
        assert_eq!(event.body["body"]["data"]["name"], "after");
        let erased = node.get("/v1/events/vault-sync/evt-1").await;
        assert_eq!(erased.body["status"], "erased", "{erased:?}");
        let state = node.get("/v1/sources/vault-sync/aggregates/cus-1").await;
        assert_eq!(state.body["state"]["name"], "after", "{state:?}");
    }
    let log = std::fs::read_to_string(second.dir().join("server.log")).unwrap_or_default();
    assert!(
        log.contains("sealed again"),
        "the cached key was not found stale:\n{log}"
    );
    let keys = first
        .query_i64("SELECT COUNT(*) FROM data_keys WHERE aggregate = 'cus-1'")
        .await;
    assert_eq!(keys, 1);
}

/// Text that only the erased aggregate's events carry: in their bodies, kept header and
/// states, and so in its change-feed rows.
const ERASED_MARKER: &str = "zq7-erased-c0ffee";

/// Aggregates written around the erased one, so that its rows and its key's row share
/// pages with others' and move when those pages split: all of them once, then a few
/// again with each of its events.
const NEIGHBOURS: usize = 300;
const BUSY_NEIGHBOURS: usize = 20;

/// An event of `customer` whose state names `note`, padded so that rows fill pages fast.
fn padded_body(id: &str, customer: &str, seq: i64, note: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id,
        "customer": customer,
        "seq": seq,
        "type": "customer.updated",
        "data": {"email": format!("{note}@example.com"), "name": note, "pad": "p".repeat(300)},
    }))
    .unwrap()
}

/// An aggregate written six times among hundreds of others (each event's row moved when the
/// worker decides it, its state rewritten, its change rows appended, its key's row moved
/// by page splits), then erased: once the server has stopped cleanly, no copy of what it
/// held is anywhere in the database's files, nor (encrypted) its wrapped data key. On
/// PostgreSQL the key table's files are scanned: a deleted key's row version must not
/// outlive the erasure there either (the plaintext rows' dead versions do, docs/encryption.md).
async fn an_erased_aggregate_leaves_no_copy_in_the_files(top: &str) {
    let encrypting = !top.is_empty();
    let postgres = crate::support::Backend::fresh_kind() == "postgres";
    let mut server =
        TestServer::spawn_top_and_sources(top, &sources("http://127.0.0.1:9/hooks")).await;
    for seq in 1..=6 {
        let note = format!("{ERASED_MARKER}-{seq}");
        let sent = padded_body(&format!("gone-{seq}"), "cus-gone", seq, &note);
        let answer = post(&server, "vault-async", &sent, &note).await;
        assert!(answer.code < 300, "{answer:?}");
        let neighbours = if seq == 1 {
            NEIGHBOURS
        } else {
            BUSY_NEIGHBOURS
        };
        for other in 0..neighbours {
            let id = format!("other-{other}-{seq}");
            let sent = padded_body(&id, &format!("cus-{other}"), seq, "someone-else");
            let answer = post(&server, "vault-async", &sent, "someone-else").await;
            assert!(answer.code < 300, "{answer:?}");
        }
        // Decided (its row rewritten) before the next one rewrites its state.
        server
            .wait_status("vault-async", &format!("gone-{seq}"), "processed")
            .await;
    }
    let last = format!("other-{}-6", BUSY_NEIGHBOURS - 1);
    server.wait_status("vault-async", &last, "processed").await;
    let state = server
        .get("/v1/sources/vault-async/aggregates/cus-gone")
        .await;
    assert_eq!(
        state.body["state"]["name"],
        format!("{ERASED_MARKER}-6"),
        "{state:?}"
    );
    let mut needles = vec![ERASED_MARKER.as_bytes().to_vec()];
    if encrypting {
        let wrapped = server
            .query_hex("SELECT wrapped FROM data_keys WHERE aggregate = 'cus-gone'")
            .await;
        needles.push(hex::decode(wrapped).unwrap());
    }
    // The scan finds what is there: before the erasure, the files hold it.
    let tables = ["data_keys"];
    if !postgres || encrypting {
        let last = needles.last().unwrap();
        if let Some(found) = server.files_holding(last, &tables).await {
            assert!(
                !found.is_empty(),
                "the scan found nothing before the erasure"
            );
        }
    }
    let answer = forget(&server, "vault-async", "cus-gone").await;
    assert_eq!(answer.code, 200, "{answer:?}");
    assert_eq!(answer.body["events_erased"], 6, "{answer:?}");
    assert_eq!(answer.body["data_key_destroyed"], encrypting, "{answer:?}");
    assert!(server.terminate(), "the server did not stop cleanly");
    if postgres && !encrypting {
        // The deleted rows' dead versions stay in the files until a vacuum
        // (docs/encryption.md, erasure): only the live rows can be checked.
        assert!(holders_of(&server, ERASED_MARKER.as_bytes())
            .await
            .is_empty());
        return;
    }
    for needle in &needles {
        if let Some(found) = server.files_holding(needle, &tables).await {
            assert!(
                found.is_empty(),
                "{:?} of the erased aggregate is still in {found:?}",
                String::from_utf8_lossy(needle)
            );
        }
    }
}

#[tokio::test]
async fn an_erased_aggregate_leaves_no_plaintext_in_the_files() {
    an_erased_aggregate_leaves_no_copy_in_the_files("").await;
}

#[tokio::test]
async fn an_erased_aggregate_leaves_no_wrapped_key_in_the_files() {
    an_erased_aggregate_leaves_no_copy_in_the_files(&encrypted(&[K1])).await;
}
