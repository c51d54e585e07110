//! Forwarding (SPEC §9): what the application receives verifies with the official
//! Standard Webhooks library, as SPEC §9 promises ("so the publishers' official
//! libraries verify it").

use std::io::Write;
use std::process::{Command, Stdio};

use inhook::forward::message::{request_headers, ForwardedEvent, WebhookId};
use inhook::signature::Secret;
use serde_json::{json, Value};

use crate::support::now_s;

/// Verifies each (headers, body) with `standardwebhooks.Webhook.verify`; `None` when the
/// library is missing outside CI (CI sets `INHOOK_TEST_VECTORS=required`).
fn official_verdicts(
    secret: &str,
    requests: &[(Vec<(&'static str, String)>, &str)],
) -> Option<Vec<bool>> {
    const SCRIPT: &str = r#"
import json, sys
from standardwebhooks import Webhook
req = json.load(sys.stdin)
hook = Webhook(req["secret"])
out = []
for r in req["requests"]:
    try:
        hook.verify(r["body"].encode(), r["headers"])
        out.append(True)
    except Exception:
        out.append(False)
print(json.dumps(out))
"#;
    let input = json!({
        "secret": secret,
        "requests": requests.iter().map(|(headers, body)| json!({
            "headers": headers.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
            "body": body,
        })).collect::<Vec<_>>(),
    });
    let child = Command::new("python3")
        .args(["-c", SCRIPT])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(err) => return unavailable(&format!("cannot run python3: {err}")),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(&serde_json::to_vec(&input).unwrap())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    if !output.status.success() {
        return unavailable(&String::from_utf8_lossy(&output.stderr));
    }
    let verdicts: Value = serde_json::from_slice(&output.stdout).expect("the verdicts");
    Some(
        verdicts
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_bool().unwrap())
            .collect(),
    )
}

fn unavailable(problem: &str) -> Option<Vec<bool>> {
    let hint = "pip install -r tests/vectors/requirements.txt";
    if std::env::var("INHOOK_TEST_VECTORS").as_deref() == Ok("required") {
        panic!("the official standardwebhooks library is unavailable ({hint}):\n{problem}");
    }
    eprintln!("SKIPPED: the official standardwebhooks library is unavailable ({hint}):\n{problem}");
    None
}

#[test]
fn forwarded_requests_verify_with_the_official_standard_webhooks_library() {
    let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let bodies = [
        r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_1"}}}"#,
        "{ \"spaced\" : [1, 2.50, \"é\\u00e9\"],\n  \"kept\": true }",
    ];
    let now = now_s();
    let mut requests = Vec::new();
    for (i, body) in bodies.iter().enumerate() {
        let event_id = format!("evt_{i}");
        let id = WebhookId::of("stripe", &event_id);
        let event = ForwardedEvent {
            webhook_id: &id,
            source: "stripe",
            event_id: &event_id,
            event_type: "invoice.paid",
            aggregate: "invoice/in_1",
            sequence: 1_700_000_000 + i as i64,
            body: body.as_bytes(),
        };
        let attempt = i as u32 + 1;
        requests.push((
            request_headers(&event, &Secret::new(secret), attempt, now).unwrap(),
            *body,
        ));
    }
    // The same headers over a body changed by one byte must not verify.
    requests.push((
        requests[0].0.clone(),
        r#"{"id":"evt_1","type":"invoice.paid","data":{"object":{"id":"in_2"}}}"#,
    ));
    let Some(verdicts) = official_verdicts(secret, &requests) else {
        return;
    };
    assert_eq!(verdicts, [true, true, false]);
}

/// Until the sender lands, a configured destination would receive nothing: the server
/// refuses to start rather than accept deliveries it would never forward.
#[test]
fn a_configured_destination_is_refused_at_start_until_forwarding_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inhook.toml");
    let config = format!(
        "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\n\n[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\n\n[[destinations]]\nname = \"app\"\nurl = \"http://127.0.0.1:9/hooks\"\nsources = [\"p\"]\nsecret = \"whsec_c2VjcmV0c2VjcmV0c2VjcmV0\"\n",
        dir.path().join("inhook.db").display()
    );
    std::fs::write(&path, config).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!output.status.success(), "started with a destination");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("destination \"app\"") && stderr.contains("not served"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("whsec_"),
        "the secret must not show: {stderr}"
    );
}

/// SPEC §9 "the delivery rows are written in the same transaction as the decision": a
/// settle that fails after writing one destination's row leaves none, and the event
/// undecided; settled again, it writes every row once.
#[tokio::test]
async fn a_failed_settle_writes_no_delivery() {
    use crate::conformance::{delta, ingest, logged, slot, T0};
    use inhook::config::Config;
    use inhook::store::{DeliveryFilter, IngestLimits};

    let mut server = crate::support::TestServer::spawn().await;
    let store = server.store().await;
    server.terminate();
    let config = Config::from_parts(
        Some(
            r#"
            [[sources]]
            name = "saves"
            kind = "save-game"
            secrets = ["s"]
            [[destinations]]
            name = "app"
            url = "http://127.0.0.1:9/"
            sources = ["saves"]
            secret = "whsec_c2VjcmV0"
            [[destinations]]
            name = "broken"
            url = "http://127.0.0.1:9/"
            sources = ["saves"]
            secret = "whsec_c2VjcmV0"
            "#,
        ),
        &std::collections::HashMap::new(),
    )
    .expect("config");
    let rules = config
        .source("saves")
        .expect("source")
        .rules(&config.destinations);
    server
        .run_sql(
            "CREATE TRIGGER deliveries_refuse BEFORE INSERT ON deliveries
                 WHEN NEW.destination = 'broken' BEGIN SELECT RAISE(ABORT, 'refused'); END;",
            "CREATE FUNCTION deliveries_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN RAISE EXCEPTION 'refused'; END $$;
             CREATE TRIGGER deliveries_refuse BEFORE INSERT ON deliveries FOR EACH ROW
                 WHEN (NEW.destination = 'broken') EXECUTE FUNCTION deliveries_refuse();",
        )
        .await;
    let body = delta("d1", "slot_a", 1, 2);
    logged(&ingest(&*store, &rules, &body, T0, IngestLimits::NONE, false).await);
    let aggregate = slot("slot_a");
    assert!(store.settle(&rules, &aggregate, T0 + 1).await.is_err());
    let none = DeliveryFilter::default();
    let app = store.deliveries("app", &none, 10, None).await.unwrap();
    assert!(
        app.items.is_empty(),
        "app's row went with the failed decision"
    );
    let event = store.event("saves", "d1").await.unwrap().expect("logged");
    assert_eq!(event.status, inhook::domain::EventStatus::Received);
    assert_eq!(store.aggregate("saves", &aggregate).await.unwrap(), None);

    server
        .run_sql(
            "DROP TRIGGER deliveries_refuse;",
            "DROP TRIGGER deliveries_refuse ON deliveries;",
        )
        .await;
    let report = store
        .settle(&rules, &aggregate, T0 + 2)
        .await
        .expect("settle");
    assert_eq!(report.applied, 1);
    for destination in ["app", "broken"] {
        let page = store
            .deliveries(destination, &none, 10, None)
            .await
            .unwrap();
        let events: Vec<&str> = page.items.iter().map(|d| d.event_id.as_str()).collect();
        assert_eq!(events, ["d1"], "{destination}");
    }
}
