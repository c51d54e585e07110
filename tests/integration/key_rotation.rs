//! Master keys over a store's life (docs/encryption.md): rotating under a new first key
//! with `inhook rekey`, a store that needs a key no longer configured refusing to start
//! and naming it, a rekey stopped halfway finishing on the next run, and a store written
//! by the previous release sealed in place by `inhook rekey --encrypt-existing`.

use inhook::ingress::signature::Scheme;
use serde_json::json;

use crate::encryption::{encrypted, holders_of, K1};
use crate::support::{now_s, signed, Backend, TestServer};

/// A second master key.
const K2: &str = "k2:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

const SECRET: &str = "rotation-test-secret";

const SOURCE: &str = r#"
[[sources]]
name = "accounts"
kind = "json"
mode = "sync"
signature = "hmac-hex"
secrets = ["rotation-test-secret"]
event_id = "/id"
aggregate = "/account"
sequence = "/seq"
ordering = "latest-wins"
state = "/data"
"#;

async fn post(server: &TestServer, id: &str, account: &str, seq: i64) {
    let body = serde_json::to_vec(&json!({
        "id": id, "account": account, "seq": seq, "data": {"owner": format!("owner of {account}")},
    }))
    .unwrap();
    let headers = signed(Scheme::HmacHex, SECRET, &body, now_s());
    let answer = server.post_raw("accounts", &body, &headers).await;
    assert!(answer.code < 300, "{id}: {answer:?}");
}

/// Every event and state the test wrote reads back as written.
async fn assert_all_readable(server: &TestServer, accounts: &[&str]) {
    for account in accounts {
        let state = server
            .get(&format!("/v1/sources/accounts/aggregates/{account}"))
            .await;
        assert_eq!(state.code, 200, "{account}: {state:?}");
        assert_eq!(state.body["state"]["owner"], format!("owner of {account}"));
        let event = server
            .get(&format!("/v1/events/accounts/{account}-1"))
            .await;
        assert_eq!(event.code, 200, "{account}: {event:?}");
        assert_eq!(event.body["body"]["account"], *account);
    }
}

async fn keys_not_under(server: &TestServer, id: &str) -> i64 {
    server
        .query_i64(&format!(
            "SELECT COUNT(*) FROM data_keys WHERE master_key <> '{id}'"
        ))
        .await
}

#[tokio::test]
async fn a_new_first_key_then_rekey_lets_the_old_key_go() {
    let mut server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), SOURCE).await;
    post(&server, "a-1", "a", 1).await;
    post(&server, "b-1", "b", 1).await;
    assert!(server.terminate());
    server.replace_in_config(&encrypted(&[K1]), &encrypted(&[K2, K1]));
    server.start();
    // A new aggregate's key is wrapped under the new first key at once.
    post(&server, "c-1", "c", 1).await;
    assert_eq!(keys_not_under(&server, "k1").await, 1);
    assert_all_readable(&server, &["a", "b", "c"]).await;
    // Rekey while the server serves.
    let (ok, out) = server.cli(&["rekey"]);
    assert!(ok, "{out}");
    assert!(out.contains("2 data keys to rewrap under k2"), "{out}");
    assert!(out.contains("rekey: done"), "{out}");
    assert_eq!(keys_not_under(&server, "k2").await, 0);
    let (ok, out) = server.cli(&["rekey"]);
    assert!(ok && out.contains("0 data keys to rewrap"), "{out}");
    assert_all_readable(&server, &["a", "b", "c"]).await;
    assert!(server.terminate());
    server.replace_in_config(&encrypted(&[K2, K1]), &encrypted(&[K2]));
    server.start();
    assert_all_readable(&server, &["a", "b", "c"]).await;
    post(&server, "a-2", "a", 2).await;
}

#[tokio::test]
async fn a_store_that_needs_a_dropped_key_refuses_to_start_and_names_it() {
    let mut server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), SOURCE).await;
    post(&server, "a-1", "a", 1).await;
    assert!(server.terminate());
    // Dropped before any rekey: every data key is still wrapped under k1.
    server.replace_in_config(&encrypted(&[K1]), &encrypted(&[K2]));
    let (ok, out) = server.cli(&["migrate"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("master key k1, which is not configured"),
        "{out}"
    );
    assert!(!out.contains("AAECAwQF"), "a key value was printed: {out}");
    // Encryption turned off altogether: the same refusal.
    server.replace_in_config(&encrypted(&[K2]), "");
    let (ok, out) = server.cli(&["migrate"]);
    assert!(!ok && out.contains("k1"), "{out}");
    // With k1 back (second), it starts and reads everything.
    let config = std::fs::read_to_string(server.config_path()).unwrap();
    std::fs::write(
        server.config_path(),
        format!("{}{config}", encrypted(&[K2, K1])),
    )
    .unwrap();
    server.start();
    assert_all_readable(&server, &["a"]).await;
}

#[tokio::test]
async fn a_rekey_stopped_halfway_finishes_on_the_next_run() {
    let mut server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), SOURCE).await;
    for account in ["a", "b", "c", "d"] {
        post(&server, &format!("{account}-1"), account, 1).await;
    }
    assert!(server.terminate());
    server.replace_in_config(&encrypted(&[K1]), &encrypted(&[K2, K1]));
    server.start();
    // One step of one key, as a rekey killed after its first commit leaves the store.
    let store = server.store().await;
    let step = store.rekey_step(0, 1).await.expect("a rekey step");
    assert_eq!(step.done, 1);
    assert!(step.next.is_some());
    assert_eq!(keys_not_under(&server, "k2").await, 3);
    let (ok, out) = server.cli(&["rekey"]);
    assert!(ok, "{out}");
    assert!(out.contains("3 data keys to rewrap"), "{out}");
    assert_eq!(keys_not_under(&server, "k2").await, 0);
    assert_all_readable(&server, &["a", "b", "c", "d"]).await;
}

/// Text that the previous release's fixture holds only inside bodies and states.
const FIXTURE_BODY_TEXT: &str = "sequence_number";
const FIXTURE_STATE_TEXT: &str = "progress_sequence";

#[tokio::test]
async fn a_store_of_the_previous_release_is_sealed_in_place_keeping_every_event_and_key() {
    let long_lived = "retention_s = 3153600000\ndedup_window_s = 3153600000\n";
    let mut server = TestServer::unstarted(
        &(encrypted(&[K1]) + long_lived),
        "hold_timeout_s = 3153600000",
        crate::upgrade::SAVE_SYNC_SOURCE,
    )
    .await;
    let dump = std::fs::read_to_string(format!(
        "{}/tests/fixtures/upgrade/{}-previous.sql",
        env!("CARGO_MANIFEST_DIR"),
        Backend::fresh_kind()
    ))
    .unwrap();
    server.run_sql(&dump, &dump).await;
    assert!(!holders_of(&server, FIXTURE_BODY_TEXT.as_bytes())
        .await
        .is_empty());
    let (ok, out) = server.cli(&["migrate"]);
    assert!(ok, "{out}");
    let (ok, out) = server.cli(&["rekey", "--encrypt-existing"]);
    assert!(ok, "{out}");
    assert!(out.contains("encrypt-existing: done"), "{out}");
    let left = server
        .query_i64("SELECT COUNT(*) FROM events WHERE data_key IS NULL AND status <> 'erased'")
        .await;
    assert_eq!(left, 0);
    for text in [FIXTURE_BODY_TEXT, FIXTURE_STATE_TEXT] {
        let holders = holders_of(&server, text.as_bytes()).await;
        assert!(holders.is_empty(), "{text} is still in {holders:?}");
    }
    // Run again: nothing left to do, nothing changes.
    let (ok, out) = server.cli(&["rekey", "--encrypt-existing"]);
    assert!(ok && out.contains("0 events stored in plaintext"), "{out}");
    server.start();
    crate::upgrade::assert_answers_as_recorded(&server).await;
    crate::upgrade::assert_dedup_keys_kept(&server).await;
}

/// The second master key under a longer id: a data key rewrapped under it takes more
/// room than it did, so its row moves within its page or to another one.
const K2_LONGER_ID: &str = "k2-2026:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

/// Every wrapped key the store holds now: the data keys and the store's own.
async fn wrapped_keys(server: &TestServer) -> Vec<Vec<u8>> {
    let mut keys = server.query_bytes("SELECT wrapped FROM data_keys").await;
    keys.extend(server.query_bytes("SELECT wrapped FROM store_keys").await);
    keys
}

/// The keys of `old` still found in the database's files (SQLite: whole; PostgreSQL:
/// the key tables' files); `None` where they cannot be read.
async fn old_keys_in_files(server: &TestServer, old: &[Vec<u8>]) -> Option<Vec<String>> {
    let mut found = Vec::new();
    for (at, key) in old.iter().enumerate() {
        let holders = server
            .files_holding(key, &["data_keys", "store_keys"])
            .await?;
        found.extend(holders.into_iter().map(|h| format!("key {at} in {h}")));
    }
    Some(found)
}

#[tokio::test]
async fn a_rekey_leaves_no_key_wrapped_under_the_old_master_key_in_the_files() {
    let mut server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), SOURCE).await;
    for n in 0..150 {
        let account = format!("acct{n:03}");
        post(&server, &format!("{account}-1"), &account, 1).await;
    }
    let old = wrapped_keys(&server).await;
    assert_eq!(old.len(), 151, "150 data keys and the body-hash key");
    // The scan finds what is there.
    if let Some(found) = old_keys_in_files(&server, &old[..1]).await {
        assert!(!found.is_empty(), "the scan found no key before the rekey");
    }
    assert!(server.terminate());
    server.replace_in_config(&encrypted(&[K1]), &encrypted(&[K2_LONGER_ID, K1]));
    server.start();
    let (ok, out) = server.cli(&["rekey"]);
    assert!(ok, "{out}");
    assert!(
        out.contains("150 data keys to rewrap under k2-2026"),
        "{out}"
    );
    let new = wrapped_keys(&server).await;
    assert!(
        new.iter().all(|key| !old.contains(key)),
        "a key was not rewrapped"
    );
    // While the server still runs (its write-ahead log open), then once it has stopped.
    if let Some(found) = old_keys_in_files(&server, &old).await {
        assert!(found.is_empty(), "after the rekey: {found:?}");
    }
    assert!(server.terminate());
    if let Some(found) = old_keys_in_files(&server, &old).await {
        assert!(found.is_empty(), "after the server stopped: {found:?}");
    }
    server.replace_in_config(&encrypted(&[K2_LONGER_ID, K1]), &encrypted(&[K2_LONGER_ID]));
    server.start();
    assert_all_readable(&server, &["acct000", "acct149"]).await;
}

#[tokio::test]
async fn aggregates_erased_after_a_rekey_leave_neither_of_their_wrapped_keys_in_the_files() {
    let mut server = TestServer::spawn_top_and_sources(&encrypted(&[K1]), SOURCE).await;
    for n in 0..150 {
        let account = format!("acct{n:03}");
        post(&server, &format!("{account}-1"), &account, 1).await;
    }
    // Every seventh account is erased once its key has been rewrapped (its row moved).
    let erased: Vec<String> = (0..150).step_by(7).map(|n| format!("acct{n:03}")).collect();
    let key_of =
        |account: &str| format!("SELECT wrapped FROM data_keys WHERE aggregate = '{account}'");
    let mut wrapped = Vec::new();
    for account in &erased {
        wrapped.extend(server.query_bytes(&key_of(account)).await);
    }
    assert!(server.terminate());
    server.replace_in_config(&encrypted(&[K1]), &encrypted(&[K2_LONGER_ID, K1]));
    server.start();
    let (ok, out) = server.cli(&["rekey"]);
    assert!(ok, "{out}");
    for account in &erased {
        wrapped.extend(server.query_bytes(&key_of(account)).await);
        let answer = crate::encryption::forget(&server, "accounts", account).await;
        assert_eq!(answer.code, 200, "{answer:?}");
        assert_eq!(answer.body["data_key_destroyed"], true, "{answer:?}");
    }
    assert_eq!(
        wrapped.len(),
        2 * erased.len(),
        "a key before and after the rekey each"
    );
    assert!(server.terminate());
    let mut found = Vec::new();
    for (at, key) in wrapped.iter().enumerate() {
        if let Some(holders) = server.files_holding(key, &["data_keys"]).await {
            found.extend(holders.into_iter().map(|h| format!("key {at} in {h}")));
        }
    }
    assert!(found.is_empty(), "destroyed keys left: {found:?}");
}
