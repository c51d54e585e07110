//! `mask_fields` holds on every output path: each GET route of `/openapi.json`
//! (state views, lists, the event log, the overview, the dashboard's data) and
//! the change stream, whatever the case of the key, nested or inside arrays;
//! and the store keeps the values whole.

use serde_json::{json, Value};

use crate::stream::{connect, read_frames};
use crate::support::{now_s, signed, TestServer, PRESENCE_SECRET};

/// Every masked value holds this, so one search finds any leak.
const SECRET: &str = "secret.example";

const MASKED: &str = "\"***\"";

fn save(id: &str, seq: i64, event_type: &str, data: Value) -> Value {
    json!({"event_id": id, "event_type": event_type, "player_id": "player_1",
           "save_slot": "slot_a", "sequence": seq, "idempotency_key": id, "data": data})
}

/// Every concrete URL of an OpenAPI path template, from the values known for its parameters.
fn urls(template: &str, values: &[(&str, Vec<String>)]) -> Vec<String> {
    let mut urls = vec![template.to_owned()];
    for (name, candidates) in values {
        let hole = format!("{{{name}}}");
        if !template.contains(&hole) {
            continue;
        }
        urls = urls
            .iter()
            .flat_map(|url| candidates.iter().map(|v| url.replace(&hole, v)))
            .collect();
    }
    assert!(!urls[0].contains('{'), "no values for {template}");
    urls
}

#[tokio::test]
async fn no_output_route_shows_a_masked_field() {
    let server = TestServer::spawn_configured(
        "mask_fields = [\"email\", \"data.card.number\", \"X-Contact\"]\nkeep_headers = [\"x-contact\"]",
        // A destination nothing answers: its deliveries are listed while they retry.
        "\n[[destinations]]\nname = \"app\"\nurl = \"http://127.0.0.1:9/hooks\"\n\
         sources = [\"save-game\"]\nsecret = \"whsec_c2VjcmV0c2VjcmV0c2VjcmV0\"\n",
    )
    .await;
    let mut live = connect(&server, None).await;

    // Presence: unknown fields are kept in the body; a header named like a masked field.
    let body = serde_json::to_vec(&json!({
        "event_id": "p1", "user_id": "usr_1", "presence": "ONLINE", "sequence_number": 1,
        "Email": format!("ann@{SECRET}"), "profile": {"EMAIL": format!("ann2@{SECRET}")},
        "contacts": [{"eMail": format!("ann3@{SECRET}")}, [{"email": format!("ann4@{SECRET}")}]]
    }))
    .unwrap();
    let mut headers = signed(
        inhook::ingress::signature::Scheme::HmacHex,
        PRESENCE_SECRET,
        &body,
        now_s(),
    );
    headers.push(("X-Contact", format!("hdr@{SECRET}")));
    assert_eq!(server.post_raw("presence", &body, &headers).await.code, 200);

    // Save game: progress carries the fields in every case, nested and in arrays.
    let progress = json!({
        "level": 3, "email": format!("bo@{SECRET}"), "Email": format!("bo2@{SECRET}"),
        "friends": [{"EMAIL": format!("bo3@{SECRET}"), "name": "cy"}],
        "card": {"Number": format!("4111-{SECRET}"), "brand": "visa"}
    });
    server
        .post_save(&save("s1", 1, "progress.saved", progress))
        .await;
    server
        .post_save(&save(
            "s2",
            2,
            "inventory.updated",
            json!({"added_items": [{"item_id": "gem", "qty": 1}], "email": format!("bo4@{SECRET}")}),
        ))
        .await;
    // A dead event, so the replay routes have something to show.
    server
        .post_save(&save(
            "s3",
            3,
            "inventory.updated",
            json!({"removed_items": [{"item_id": "rock", "qty": 1}], "EMAIL": format!("bo5@{SECRET}")}),
        ))
        .await;
    server.wait_status("save-game", "s2", "processed").await;
    server.wait_status("save-game", "s3", "dead").await;

    // The store keeps every value: masking is output only.
    let stored: Vec<String> = server
        .logged()
        .await
        .iter()
        .map(|e| String::from_utf8_lossy(&e.body).into_owned())
        .collect();
    assert_eq!(
        stored.iter().filter(|b| b.contains(SECRET)).count(),
        4,
        "{stored:?}"
    );

    // One change per settle (s1..s3 may be settled together or apart): count what the store has.
    let changes = server
        .store()
        .await
        .changes_after(0, None, None, 100)
        .await
        .expect("changes")
        .len();
    assert!((2..=4).contains(&changes), "{changes} changes");

    let job = reqwest::Client::new()
        .post(format!("{}/v1/replay", server.url))
        .json(&json!({"source": "save-game", "status": "dead"}))
        .send()
        .await
        .expect("replay")
        .json::<Value>()
        .await
        .expect("job");
    let forward_job = reqwest::Client::new()
        .post(format!("{}/v1/destinations/app/replay", server.url))
        .json(&json!({}))
        .send()
        .await
        .expect("forwarding replay")
        .json::<Value>()
        .await
        .expect("forwarding job");
    let deliveries = server.get("/v1/destinations/app/deliveries").await;
    let delivery = deliveries.body["items"][0]["id"].to_string();
    let values = [
        ("user_id", vec!["usr_1".to_owned()]),
        ("player_id", vec!["player_1".to_owned()]),
        ("save_slot", vec!["slot_a".to_owned()]),
        (
            "source",
            vec!["presence".to_owned(), "save-game".to_owned()],
        ),
        (
            "event_id",
            ["p1", "s1", "s2", "s3"].map(str::to_owned).to_vec(),
        ),
        (
            "job_id",
            vec![job["job_id"].to_string(), forward_job["job_id"].to_string()],
        ),
        ("id", vec![delivery]),
        ("name", vec!["app".to_owned()]),
        (
            "key",
            vec!["usr_1".to_owned(), "player_1/slot_a".to_owned()],
        ),
    ];

    let doc = server.get("/openapi.json").await.body;
    let mut walked = Vec::new();
    for (template, item) in doc["paths"].as_object().unwrap() {
        // A GET on ingress answers only a publisher's handshake: it echoes the request and
        // reads nothing stored (tests/integration/handshakes.rs).
        if item.get("get").is_none() || template == "/webhooks/{source}" {
            continue;
        }
        if template == "/v1/stream" {
            // From the start of the log, so the store's catch-up path is walked too.
            let mut stream = connect(&server, Some(0)).await;
            let frames = read_frames(&mut stream, changes).await;
            for frame in &frames {
                assert!(!frame.raw.contains(SECRET), "{}", frame.raw);
            }
            assert!(frames.iter().any(|f| f.raw.contains(MASKED)));
            walked.push(template.clone());
            continue;
        }
        let mut answered = false;
        let mut candidates = urls(template, &values);
        if template == "/v1/stats" {
            // Figures are about one source or one destination, named in the query.
            candidates = ["?source=presence", "?source=save-game", "?destination=app"]
                .map(|query| format!("{template}{query}"))
                .into();
        }
        for url in candidates {
            let text = reqwest::get(format!("{}{url}", server.url))
                .await
                .expect("GET");
            let code = text.status();
            let text = text.text().await.expect("body");
            assert!(!text.contains(SECRET), "{url} shows a masked value: {text}");
            answered |= code == 200;
        }
        assert!(answered, "{template} never answered 200");
        walked.push(template.clone());
    }
    for route in [
        "/",
        "/v1/presence",
        "/v1/presence/{user_id}",
        "/v1/saves",
        "/v1/saves/{player_id}/{save_slot}",
        "/v1/events",
        "/v1/events/{source}/{event_id}",
        "/v1/overview",
        "/v1/stream",
        "/v1/sources/{source}/aggregates",
        "/v1/sources/{source}/aggregates/{key}",
        "/v1/destinations",
        "/v1/destinations/{name}/deliveries",
        "/v1/destinations/{name}/deliveries/{id}",
        "/v1/destinations/{name}/replay/{job_id}",
        "/v1/stats",
        "/v1/alerts",
    ] {
        assert!(walked.iter().any(|w| w == route), "{route} not walked");
    }

    // And the placeholder is where the values were, keys kept as sent.
    let slot = server.get("/v1/saves/player_1/slot_a").await.body;
    assert_eq!(
        slot["progress"],
        json!({"level": 3, "email": "***", "Email": "***", "friends": [{"EMAIL": "***", "name": "cy"}],
               "card": {"Number": "***", "brand": "visa"}})
    );
    assert_eq!(
        server.get("/v1/saves").await.body["items"][0]["progress"],
        slot["progress"]
    );
    let detail = server.get("/v1/events/presence/p1").await.body;
    assert_eq!(detail["body"]["Email"], "***");
    assert_eq!(detail["body"]["profile"]["EMAIL"], "***");
    assert_eq!(detail["body"]["contacts"][0]["eMail"], "***");
    assert_eq!(detail["body"]["contacts"][1][0]["email"], "***");
    assert_eq!(detail["body"]["presence"], "ONLINE");
    assert_eq!(detail["headers"]["x-contact"], "***");
    let detail = server.get("/v1/events/save-game/s1").await.body;
    assert_eq!(detail["body"]["data"]["card"]["Number"], "***");

    // The stream that was open all along: the save change shows the masked progress.
    let frames = read_frames(&mut live, changes).await;
    let saved = frames
        .iter()
        .find(|f| f.event == "save" && !f.data["state"]["progress"].is_null())
        .expect("a save change with progress");
    assert_eq!(saved.data["state"]["progress"], slot["progress"]);
    assert!(frames.iter().all(|f| !f.raw.contains(SECRET)));
}
