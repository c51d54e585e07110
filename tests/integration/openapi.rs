//! `/openapi.json` describes the whole HTTP interface: every route the server
//! answers, with the answers it gives. (tests/openapi/run.sh runs schemathesis
//! against it; this checks the document's shape and coverage.)

use serde_json::{json, Value};

use crate::support::TestServer;

#[tokio::test]
async fn the_openapi_document_lists_every_route_and_its_answers() {
    let server = TestServer::spawn().await;
    let reply = server.get("/openapi.json").await;
    assert_eq!(reply.code, 200);
    let doc = reply.body;
    assert_eq!(doc["openapi"], "3.1.0");
    let operations: Vec<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |method| (method.clone(), path.clone()))
        })
        .collect();
    let expected = [
        ("post", "/webhooks/{source}"),
        ("get", "/webhooks/{source}"),
        ("get", "/"),
        ("get", "/healthz"),
        ("get", "/readyz"),
        ("get", "/metrics"),
        ("get", "/openapi.json"),
        ("get", "/v1/presence"),
        ("get", "/v1/presence/{user_id}"),
        ("get", "/v1/saves"),
        ("get", "/v1/saves/{player_id}/{save_slot}"),
        ("get", "/v1/sources/{source}/aggregates"),
        ("get", "/v1/sources/{source}/aggregates/{key}"),
        ("delete", "/v1/sources/{source}/aggregates/{key}"),
        ("post", "/v1/sources/{source}/aggregates/{key}/reset"),
        ("get", "/v1/events"),
        ("get", "/v1/events/{source}/{event_id}"),
        ("post", "/v1/events/{source}/{event_id}/replay"),
        ("post", "/v1/replay"),
        ("get", "/v1/replay/{job_id}"),
        ("get", "/v1/overview"),
        ("get", "/v1/stats"),
        ("get", "/v1/stream"),
        ("post", "/v1/admin/reload"),
        ("get", "/v1/destinations"),
        ("get", "/v1/destinations/{name}/deliveries"),
        ("get", "/v1/destinations/{name}/deliveries/{id}"),
        ("post", "/v1/destinations/{name}/deliveries/{id}/replay"),
        ("post", "/v1/destinations/{name}/deliveries/{id}/skip"),
        ("post", "/v1/destinations/{name}/replay"),
        ("get", "/v1/destinations/{name}/replay/{job_id}"),
        ("get", "/v1/alerts"),
    ];
    let mut listed = operations.clone();
    listed.sort();
    let mut wanted: Vec<_> = expected
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    wanted.sort();
    assert_eq!(listed, wanted);

    // Every documented operation is served and answers a documented code (with made-up ids a
    // read may 404 as `unknown_*`, with a JSON body saying so; a GET on a source without a GET
    // handshake is its documented 405).
    let client = reqwest::Client::new();
    for (method, path) in &operations {
        if path == "/v1/stream" {
            continue; // never ends; tests/integration/stream.rs covers it
        }
        let concrete = path
            .replace("{source}", "presence")
            .replace("{job_id}", "1")
            .replace("{id}", "1")
            .replace(['{', '}'], "");
        let request = match method.as_str() {
            "get" => client.get(format!("{}{concrete}", server.url)),
            "delete" => client.delete(format!("{}{concrete}", server.url)),
            _ => client
                .post(format!("{}{concrete}", server.url))
                .json(&json!({})),
        };
        let reply = request.send().await.unwrap();
        let code = reply.status().as_u16();
        let documented = &doc["paths"][path][method]["responses"];
        assert!(
            documented.get(code.to_string()).is_some(),
            "{method} {path} answered {code}, documented {documented}"
        );
        if code == 404 {
            let body: Value = reply.json().await.unwrap();
            assert!(
                body["error"]
                    .as_str()
                    .is_some_and(|e| e.starts_with("unknown_")),
                "{method} {path}: {body}"
            );
        }
    }

    // The admin routes name the bearer scheme; the ingress does not.
    assert_eq!(
        doc["components"]["securitySchemes"]["admin_token"],
        json!({"type": "http", "scheme": "bearer"})
    );
    assert_eq!(
        doc["paths"]["/v1/events"]["get"]["security"],
        json!([{"admin_token": []}])
    );
    assert_eq!(
        doc["paths"]["/webhooks/{source}"]["post"]["security"],
        json!([{}])
    );

    // The event log's search parameters (docs/api.md, search), `where` repeatable.
    let params = doc["paths"]["/v1/events"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let named = |name: &str| params.iter().find(|p| p["name"] == name).cloned();
    for name in ["event_id", "type", "from", "to", "where"] {
        assert!(named(name).is_some(), "GET /v1/events has no {name}");
    }
    assert_eq!(named("where").unwrap()["schema"]["type"], "array");
    let replay = &doc["components"]["schemas"]["ReplayRequest"]["properties"];
    for name in ["event_id", "type", "where"] {
        assert!(replay.get(name).is_some(), "POST /v1/replay has no {name}");
    }
}
