//! Text keys page in byte order on both stores, also in a store created
//! before migration 4 made PostgreSQL's key columns byte-ordered, and its state
//! kept when migration 5 moves it into the one aggregate-state table.

use serde_json::{json, Value};

use crate::support::{TestServer, UNDO_MIGRATION_5};

/// Ids whose byte order (`A1 Z_1 a-1 a_1 b_1`) differs from an `en_US` one (`a_1 a-1 A1 b_1 Z_1`).
const IDS: [&str; 5] = ["b_1", "a_1", "Z_1", "a-1", "A1"];

/// Every page of `path` (a list answering `items` and `next_cursor`), two items at a time,
/// as `field` of each item.
async fn walk(server: &TestServer, path: &str, field: &str) -> Vec<String> {
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = match &cursor {
            Some(c) => server.get(&format!("{path}?limit=2&cursor={c}")).await,
            None => server.get(&format!("{path}?limit=2")).await,
        };
        assert_eq!(page.code, 200, "{page:?}");
        for item in page.body["items"].as_array().expect("items") {
            listed.push(item[field].as_str().expect("text field").to_owned());
        }
        match page.body["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => return listed,
        }
        assert!(listed.len() <= IDS.len(), "pages never end: {listed:?}");
    }
}

#[tokio::test]
async fn migrations_4_and_5_upgrade_a_store_in_place_to_byte_ordered_pages() {
    let mut server = TestServer::spawn().await;
    for (i, id) in IDS.iter().enumerate() {
        let presence = json!({"event_id": format!("p{i}"), "user_id": id,
                              "presence": "ONLINE", "sequence_number": 1});
        assert_eq!(server.post_presence(&presence).await.code, 200);
        let save: Value = json!({"event_id": format!("s{i}"), "event_type": "inventory.updated",
                                 "player_id": id, "save_slot": "a", "sequence": 1,
                                 "idempotency_key": format!("s{i}"),
                                 "data": {"added_items": [{"item_id": "gem", "qty": 1}]}});
        let reply = server.post_save(&save).await;
        assert_eq!(reply.code, 202, "{reply:?}");
        server
            .wait_for(&format!("/v1/saves/{id}/a"), |r| r.code == 200)
            .await;
    }
    assert!(server.terminate());
    // Back to version 3, with the typed state tables migration 5 replaced (rebuilt from
    // the generic one: rows as the previous release wrote them); on PostgreSQL as created
    // on an `en_US` database, whose collation the key columns had until migration 4.
    let en_us = r#"TEXT COLLATE "en-US-x-icu""#;
    server
        .run_sql(
            &format!(
                "{}\nDELETE FROM schema_migrations WHERE version >= 4;",
                UNDO_MIGRATION_5.0
            ),
            &format!(
                "{undo}
                 ALTER TABLE events ALTER COLUMN source TYPE {en_us},
                     ALTER COLUMN aggregate TYPE {en_us};
                 ALTER TABLE presence_state ALTER COLUMN user_id TYPE {en_us};
                 ALTER TABLE save_state ALTER COLUMN aggregate TYPE {en_us};
                 DELETE FROM schema_migrations WHERE version >= 4;",
                undo = UNDO_MIGRATION_5.1
            ),
        )
        .await;
    let mut bytewise = IDS.map(str::to_owned).to_vec();
    bytewise.sort();
    server.restart();
    assert_eq!(walk(&server, "/v1/presence", "user_id").await, bytewise);
    assert_eq!(walk(&server, "/v1/saves", "player_id").await, bytewise);
    // Every row is kept, with its state.
    assert_eq!(server.count().await, 2 * IDS.len());
    for id in IDS {
        let presence = server.get(&format!("/v1/presence/{id}")).await;
        assert_eq!(presence.body["status"], "ONLINE", "{id}");
        let save = server.get(&format!("/v1/saves/{id}/a")).await;
        assert_eq!(save.body["inventory"], json!({"gem": 1}), "{id}");
    }
}
