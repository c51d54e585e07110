//! The ready configs of `docs/examples`, each loaded as written (only the
//! secrets come from their `INHOOK_<NAME>_SECRET`, as the files say), fed
//! deliveries shaped like the publisher's real payloads (the bodies of
//! `docs/examples/payloads`, varied) and signed by the publisher's official
//! library (tests/vectors/sign.py). Sent reordered and duplicated, each
//! aggregate ends at the newest state; types outside `event_types` are
//! `200 ignored_unsupported`, logged as such at once and never applied; keys holding `/` round-trip in
//! their text form; the event log shows what was decided for each delivery.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::time::{Duration, Instant};

use inhook::ingress::signature::Scheme;
use serde_json::{json, Value};

use crate::support::{now_s, official, run_cli, vectors_available, Reply, TestServer, ToSign};

/// Where the examples live.
fn examples_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/examples")
}

/// The text of one example config, exactly as a user would copy it.
fn example(file: &str) -> String {
    std::fs::read_to_string(examples_dir().join(file)).expect("read the example config")
}

/// One of the example bodies in `docs/examples/payloads`.
fn payload(name: &str) -> Value {
    let text =
        std::fs::read_to_string(examples_dir().join("payloads").join(format!("{name}.json")))
            .expect("read the example payload");
    serde_json::from_str(&text).expect("the example payload is JSON")
}

/// Starts a server with an example's sources as written, each secret in its source's variable.
async fn serve_example(file: &str, secrets: &[(&str, &str)]) -> TestServer {
    let vars: Vec<(String, &str)> = secrets
        .iter()
        .map(|(source, secret)| (inhook::config::secret_env_var(source), *secret))
        .collect();
    let env: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    TestServer::spawn_with_sources_env(&example(file), &env).await
}

/// One delivery as a publisher sends it.
struct Delivery {
    /// The body, byte for byte.
    body: String,
    /// The delivery id, for the schemes that send one in a header.
    id: String,
    /// The headers the publisher sends beside the signature (event type, delivery id, ...).
    extra: Vec<(&'static str, String)>,
}

impl Delivery {
    fn new(body: &Value, id: &str, extra: &[(&'static str, &str)]) -> Self {
        Self {
            body: body.to_string(),
            id: id.to_owned(),
            extra: extra.iter().map(|(k, v)| (*k, (*v).to_owned())).collect(),
        }
    }
}

/// Posts `deliveries[i]` for each `i` of `schedule` in turn (a retry is signed
/// again, as publishers do), checking each answer: the first receipt of an
/// event is `202 accepted` (the publishers' example sources are async), or
/// `200 ignored_unsupported` for the indices in `ignored`; a repeat of either is
/// `200 duplicate` (an ignored type is logged too).
async fn send_schedule(
    server: &TestServer,
    source: &str,
    scheme: Scheme,
    secret: &str,
    deliveries: &[Delivery],
    schedule: &[usize],
    ignored: &[usize],
) {
    let now = now_s();
    let to_sign: Vec<ToSign<'_>> = schedule
        .iter()
        .map(|&i| ToSign {
            scheme,
            secret,
            body: &deliveries[i].body,
            timestamp: now,
            id: &deliveries[i].id,
        })
        .collect();
    let signed = official(&to_sign);
    let mut seen = Vec::new();
    for (&i, mut headers) in schedule.iter().zip(signed) {
        let delivery = &deliveries[i];
        headers.extend(
            delivery
                .extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone())),
        );
        let reply = server.post_headers(source, &delivery.body, &headers).await;
        let status = reply.body["status"].as_str().unwrap_or_default().to_owned();
        let expected = if seen.contains(&i) {
            (200, "duplicate")
        } else if ignored.contains(&i) {
            (200, "ignored_unsupported")
        } else {
            (202, "accepted")
        };
        assert_eq!(
            (reply.code, status.as_str()),
            expected,
            "{source}: delivery #{i} ({}): {:?}",
            delivery.id,
            reply.body
        );
        seen.push(i);
    }
}

/// The statuses that end an event's processing (only a replay moves it on).
const DECIDED: [&str; 4] = ["processed", "ignored_stale", "ignored_unsupported", "dead"];

/// The source's logged events by event id, once there are `count` and each is decided.
async fn settled_events(server: &TestServer, source: &str, count: usize) -> HashMap<String, Value> {
    let reply = server
        .wait_for(&format!("/v1/events?source={source}&limit=500"), |r| {
            r.body["items"].as_array().is_some_and(|items| {
                items.len() == count
                    && items
                        .iter()
                        .all(|e| DECIDED.contains(&e["status"].as_str().unwrap_or_default()))
            })
        })
        .await;
    reply.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["event_id"].as_str().unwrap().to_owned(), e.clone()))
        .collect()
}

/// Takes out of `logged` the deliveries of types outside `event_types`, checking
/// each was logged `ignored_unsupported` with its type, aggregate text and sequence
/// (event id → those three).
fn take_ignored(logged: &mut HashMap<String, Value>, ignored: &[(&str, &str, &str, i64)]) {
    for (id, event_type, key, sequence) in ignored {
        let event = logged
            .remove(*id)
            .unwrap_or_else(|| panic!("{id} is logged: {logged:#?}"));
        assert_eq!(
            (
                &event["status"],
                &event["event_type"],
                &event["aggregate"],
                &event["sequence"],
                &event["attempts"]
            ),
            (
                &json!("ignored_unsupported"),
                &json!(event_type),
                &json!(key),
                &json!(sequence),
                &json!(0)
            ),
            "{event:#?}"
        );
    }
}

/// Checks a latest-wins source's settled log against what was sent: exactly
/// the `expected` events (event id → aggregate text, sequence) are logged, once
/// each (types outside `event_types` taken out by [`take_ignored`]), and in each
/// aggregate the newest is processed while every other one was either applied
/// before a newer one was (processed) or found older (ignored_stale).
fn check_latest_wins(logged: &HashMap<String, Value>, expected: &HashMap<String, (String, i64)>) {
    let as_logged: HashMap<String, (String, i64)> = logged
        .iter()
        .map(|(id, e)| {
            let key = e["aggregate"].as_str().unwrap().to_owned();
            (id.clone(), (key, e["sequence"].as_i64().unwrap()))
        })
        .collect();
    assert_eq!(&as_logged, expected, "{logged:#?}");
    for (id, (key, sequence)) in expected {
        let newest = expected
            .values()
            .filter(|(k, _)| k == key)
            .map(|(_, s)| *s)
            .max()
            .unwrap();
        let status = logged[id]["status"].as_str().unwrap();
        if *sequence == newest {
            assert_eq!(
                status, "processed",
                "{id}, the newest of {key}: {logged:#?}"
            );
        } else {
            assert!(
                ["processed", "ignored_stale"].contains(&status),
                "{id} of {key}: {status}"
            );
        }
    }
}

/// An RFC 3339 time as the sequence inhook orders it by: microseconds since the epoch.
fn micros(rfc3339: &str) -> i64 {
    let at = time::OffsetDateTime::parse(rfc3339, &time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|e| panic!("{rfc3339}: {e}"));
    (at.unix_timestamp_nanos() / 1000) as i64
}

/// GETs an aggregate of the generic read API, by the URL path of its key.
async fn aggregate(server: &TestServer, source: &str, key_path: &str) -> Reply {
    server
        .get(&format!("/v1/sources/{source}/aggregates/{key_path}"))
        .await
}

// ---------------------------------------------------------------- Stripe

const STRIPE_SECRET: &str = "whsec_examples_stripe_endpoint_secret";
const SUBSCRIPTION: &str = "sub_1PkXpY2eZvKYlo2CsXq5E0fJ";
const INVOICE: &str = "in_1PkXq02eZvKYlo2C7sLwVb2N";

/// A Stripe `event` carrying `object` as `data.object`, shaped like the example payload.
fn stripe_event(id: &str, event_type: &str, created: i64, object: Value) -> Value {
    let mut event = payload("stripe-subscription-updated");
    event["id"] = json!(id);
    event["type"] = json!(event_type);
    event["created"] = json!(created);
    event["data"] = json!({ "object": object });
    event
}

/// The example's subscription with another status.
fn subscription(id: &str, status: &str) -> Value {
    let mut object = payload("stripe-subscription-updated")["data"]["object"].clone();
    object["id"] = json!(id);
    object["status"] = json!(status);
    object
}

/// An invoice of the example's subscription.
fn invoice(status: &str) -> Value {
    json!({"id": INVOICE, "object": "invoice", "customer": "cus_Q3ZJw6mFvTtGQ5",
           "subscription": SUBSCRIPTION, "status": status, "currency": "usd",
           "amount_due": 2000, "amount_paid": if status == "paid" { 2000 } else { 0 },
           "lines": {"object": "list", "data": [], "has_more": false}})
}

#[tokio::test]
async fn stripe_events_reordered_and_retried_end_at_each_objects_newest_state() {
    if !vectors_available() {
        return;
    }
    let server = serve_example("stripe.toml", &[("stripe", STRIPE_SECRET)]).await;
    let t0 = 1_714_558_830;
    let month = 30 * 24 * 3600;
    let events = [
        stripe_event(
            "evt_sub_created",
            "customer.subscription.created",
            t0,
            subscription(SUBSCRIPTION, "incomplete"),
        ),
        stripe_event(
            "evt_sub_active",
            "customer.subscription.updated",
            t0 + 4,
            subscription(SUBSCRIPTION, "active"),
        ),
        stripe_event(
            "evt_sub_past_due",
            "customer.subscription.updated",
            t0 + month,
            subscription(SUBSCRIPTION, "past_due"),
        ),
        stripe_event(
            "evt_sub_deleted",
            "customer.subscription.deleted",
            t0 + month + 600,
            subscription(SUBSCRIPTION, "canceled"),
        ),
        stripe_event(
            "evt_in_created",
            "invoice.created",
            t0 + 1,
            invoice("draft"),
        ),
        stripe_event(
            "evt_in_finalized",
            "invoice.finalized",
            t0 + 2,
            invoice("open"),
        ),
        stripe_event("evt_in_paid", "invoice.paid", t0 + 3, invoice("paid")),
        // Not in event_types: answered, never applied.
        stripe_event(
            "evt_charge",
            "charge.succeeded",
            t0 + 3,
            json!({"id": "ch_3PkXqL2eZvKYlo2C1", "object": "charge", "amount": 2000, "status": "succeeded"}),
        ),
    ];
    let deliveries: Vec<Delivery> = events.iter().map(|e| Delivery::new(e, "", &[])).collect();
    let schedule = [1, 6, 0, 2, 1, 4, 3, 7, 5, 6, 0, 7];
    send_schedule(
        &server,
        "stripe",
        Scheme::Stripe,
        STRIPE_SECRET,
        &deliveries,
        &schedule,
        &[7],
    )
    .await;

    let expected: HashMap<String, (String, i64)> = events[..7]
        .iter()
        .map(|e| {
            let object = &e["data"]["object"];
            let key = format!(
                "{}/{}",
                object["object"].as_str().unwrap(),
                object["id"].as_str().unwrap()
            );
            (
                e["id"].as_str().unwrap().to_owned(),
                (key, e["created"].as_i64().unwrap()),
            )
        })
        .collect();
    let mut logged = settled_events(&server, "stripe", expected.len() + 1).await;
    // Logged under the charge's own aggregate and sequence, which it never changes.
    take_ignored(
        &mut logged,
        &[(
            "evt_charge",
            "charge.succeeded",
            "charge/ch_3PkXqL2eZvKYlo2C1",
            t0 + 3,
        )],
    );
    check_latest_wins(&logged, &expected);

    let sub = aggregate(&server, "stripe", &format!("subscription/{SUBSCRIPTION}")).await;
    assert_eq!(sub.code, 200, "{:?}", sub.body);
    assert_eq!(sub.body["source"], "stripe");
    assert_eq!(
        sub.body["aggregate"],
        format!("subscription/{SUBSCRIPTION}")
    );
    assert_eq!(sub.body["sequence"], t0 + month + 600);
    assert_eq!(sub.body["event_id"], "evt_sub_deleted");
    assert_eq!(sub.body["event_type"], "customer.subscription.deleted");
    // `state = "/data/object"`: the object itself, not the event around it.
    assert_eq!(sub.body["state"], subscription(SUBSCRIPTION, "canceled"));

    let inv = aggregate(&server, "stripe", &format!("invoice/{INVOICE}")).await;
    assert_eq!(inv.code, 200, "{:?}", inv.body);
    assert_eq!(
        (
            &inv.body["event_id"],
            &inv.body["state"]["status"],
            &inv.body["sequence"]
        ),
        (&json!("evt_in_paid"), &json!("paid"), &json!(t0 + 3))
    );

    // The ignored charge has no state; the list holds exactly the two objects.
    let list = server.get("/v1/sources/stripe/aggregates").await;
    let mut keys: Vec<&str> = list.body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}", list.body))
        .iter()
        .map(|a| a["aggregate"].as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(
        keys,
        [
            format!("invoice/{INVOICE}"),
            format!("subscription/{SUBSCRIPTION}")
        ]
    );
}

#[tokio::test]
async fn stripe_ties_within_one_second_go_to_the_later_receipt_and_are_counted() {
    if !vectors_available() {
        return;
    }
    let server = serve_example("stripe.toml", &[("stripe", STRIPE_SECRET)]).await;
    // Creating a subscription whose first payment succeeds at once: Stripe
    // emits created (incomplete) and updated (active) in the same second.
    let t = 1_714_560_000;
    let tie = "sub_1PkTieY2eZvKYlo2CsXq5E0";
    let deliveries = [
        Delivery::new(
            &stripe_event(
                "evt_tie_created",
                "customer.subscription.created",
                t,
                subscription(tie, "incomplete"),
            ),
            "",
            &[],
        ),
        Delivery::new(
            &stripe_event(
                "evt_tie_updated",
                "customer.subscription.updated",
                t,
                subscription(tie, "active"),
            ),
            "",
            &[],
        ),
    ];
    send_schedule(
        &server,
        "stripe",
        Scheme::Stripe,
        STRIPE_SECRET,
        &deliveries,
        &[0, 1],
        &[],
    )
    .await;
    let logged = settled_events(&server, "stripe", 2).await;
    assert!(
        logged.values().all(|e| e["status"] == "processed"),
        "{logged:#?}"
    );
    let state = aggregate(&server, "stripe", &format!("subscription/{tie}")).await;
    assert_eq!(
        (
            &state.body["event_id"],
            &state.body["state"]["status"],
            &state.body["sequence"]
        ),
        (&json!("evt_tie_updated"), &json!("active"), &json!(t)),
        "{:?}",
        state.body
    );
    server
        .wait_for_metric("inhook_sequence_ties_total", &[("source", "stripe")], 1.0)
        .await;

    // README.md's line: `inhook send` signs the example body with the source's
    // scheme, read from the example config, and the secret from the environment.
    let config = examples_dir().join("stripe.toml");
    let body = examples_dir().join("payloads/stripe-subscription-updated.json");
    let args: Vec<&OsStr> = vec![
        OsStr::new("send"),
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("--url"),
        OsStr::new(&server.url),
        OsStr::new("--source"),
        OsStr::new("stripe"),
        body.as_os_str(),
    ];
    let (ok, out) = run_cli(&args, &[("INHOOK_STRIPE_SECRET", STRIPE_SECRET)]);
    assert!(ok && out.starts_with("202 "), "{out}");
    server
        .wait_for(
            &format!("/v1/sources/stripe/aggregates/subscription/{SUBSCRIPTION}"),
            |r| r.body["state"]["status"] == "active",
        )
        .await;
}

// ---------------------------------------------------------------- GitHub

const GITHUB_PULLS_SECRET: &str = "gh-examples-pulls-secret";
const GITHUB_ISSUES_SECRET: &str = "gh-examples-issues-secret";

/// The example pull request #7 after `action`, as of `updated_at`.
fn pull_request(
    action: &str,
    updated_at: &str,
    head_sha: &str,
    labels: &[&str],
    merged: bool,
) -> Value {
    let mut event = payload("github-pull-request");
    event["action"] = json!(action);
    let pr = &mut event["pull_request"];
    pr["updated_at"] = json!(updated_at);
    pr["head"]["sha"] = json!(head_sha);
    pr["labels"] = json!(labels
        .iter()
        .map(|l| json!({"name": l}))
        .collect::<Vec<_>>());
    if merged {
        pr["state"] = json!("closed");
        pr["merged"] = json!(true);
        pr["closed_at"] = json!(updated_at);
        pr["merged_at"] = json!(updated_at);
    }
    event
}

/// The example issue #8 after `action`, as of `updated_at`.
fn issue(action: &str, updated_at: &str, state: &str, labels: &[&str]) -> Value {
    let mut event = payload("github-issues");
    event["action"] = json!(action);
    let issue = &mut event["issue"];
    issue["updated_at"] = json!(updated_at);
    issue["state"] = json!(state);
    issue["labels"] = json!(labels
        .iter()
        .map(|l| json!({"name": l}))
        .collect::<Vec<_>>());
    if state == "closed" {
        issue["closed_at"] = json!(updated_at);
    }
    event
}

/// A GitHub delivery of `event` with its type and delivery GUID, as GitHub's hooks send them.
fn github(body: &Value, event: &str, guid: &str) -> Delivery {
    Delivery::new(
        body,
        guid,
        &[
            ("x-github-event", event),
            ("x-github-hook-id", "482910333"),
            ("user-agent", "GitHub-Hookshot/5e6b0c1"),
        ],
    )
}

#[tokio::test]
async fn github_pull_requests_and_issues_converge_in_their_own_sources() {
    if !vectors_available() {
        return;
    }
    let server = serve_example(
        "github.toml",
        &[
            ("github-pulls", GITHUB_PULLS_SECRET),
            ("github-issues", GITHUB_ISSUES_SECRET),
        ],
    )
    .await;
    let mut ping = json!({"zen": "Keep it logically awesome.", "hook_id": 482910333,
        "hook": {"type": "Repository", "id": 482910333, "active": true,
                 "events": ["pull_request"], "config": {"content_type": "json"}}});
    ping["repository"] = payload("github-pull-request")["repository"].clone();
    let pulls = [
        github(
            &pull_request("opened", "2024-05-01T10:20:30Z", "6dcb09b5", &[], false),
            "pull_request",
            "6f3c1e2a-07d8-11ef-8a1c-2f0c1a9b1001",
        ),
        github(
            &pull_request(
                "synchronize",
                "2024-05-01T10:25:00Z",
                "a1b2c3d4",
                &[],
                false,
            ),
            "pull_request",
            "6f3c1e2a-07d8-11ef-8a1c-2f0c1a9b1002",
        ),
        github(
            &pull_request(
                "labeled",
                "2024-05-01T10:25:41Z",
                "a1b2c3d4",
                &["bug"],
                false,
            ),
            "pull_request",
            "6f3c1e2a-07d8-11ef-8a1c-2f0c1a9b1003",
        ),
        github(
            &pull_request("closed", "2024-05-01T11:00:00Z", "a1b2c3d4", &["bug"], true),
            "pull_request",
            "6f3c1e2a-07d8-11ef-8a1c-2f0c1a9b1004",
        ),
        // What the hook sends on creation, and an issue from a hook subscribed to everything.
        github(&ping, "ping", "6f3c1e2a-07d8-11ef-8a1c-2f0c1a9b1005"),
        github(
            &issue("opened", "2024-05-01T11:00:00Z", "open", &[]),
            "issues",
            "6f3c1e2a-07d8-11ef-8a1c-2f0c1a9b1006",
        ),
    ];
    let schedule = [2, 0, 4, 3, 2, 1, 5, 0];
    send_schedule(
        &server,
        "github-pulls",
        Scheme::Github,
        GITHUB_PULLS_SECRET,
        &pulls,
        &schedule,
        &[4, 5],
    )
    .await;

    let issues = [
        github(
            &issue("opened", "2024-05-01T11:00:00Z", "open", &[]),
            "issues",
            "9a7d0c44-07d9-11ef-9f3a-5e2b7c1d2001",
        ),
        github(
            &issue("labeled", "2024-05-01T11:02:13Z", "open", &["bug"]),
            "issues",
            "9a7d0c44-07d9-11ef-9f3a-5e2b7c1d2002",
        ),
        github(
            &issue("closed", "2024-05-01T12:30:00Z", "closed", &["bug"]),
            "issues",
            "9a7d0c44-07d9-11ef-9f3a-5e2b7c1d2003",
        ),
        github(
            &json!({"ref": "refs/heads/main", "before": "9049f126", "after": "a1b2c3d4",
                       "repository": payload("github-issues")["repository"].clone()}),
            "push",
            "9a7d0c44-07d9-11ef-9f3a-5e2b7c1d2004",
        ),
    ];
    let issue_schedule = [1, 3, 2, 0, 1];
    send_schedule(
        &server,
        "github-issues",
        Scheme::Github,
        GITHUB_ISSUES_SECRET,
        &issues,
        &issue_schedule,
        &[3],
    )
    .await;

    for (source, deliveries, ignored, key) in [
        (
            "github-pulls",
            &pulls[..],
            &[(4, "ping"), (5, "issues")][..],
            "octo%2Frepo/7",
        ),
        (
            "github-issues",
            &issues[..],
            &[(3, "push")][..],
            "octo%2Frepo/8",
        ),
    ] {
        let expected: HashMap<String, (String, i64)> = deliveries
            .iter()
            .enumerate()
            .filter(|(i, _)| !ignored.iter().any(|(at, _)| at == i))
            .map(|(_, d)| {
                let body: Value = serde_json::from_str(&d.body).unwrap();
                let item = if source == "github-pulls" {
                    "pull_request"
                } else {
                    "issue"
                };
                let at = micros(body[item]["updated_at"].as_str().unwrap());
                (d.id.clone(), (key.to_owned(), at))
            })
            .collect();
        let mut logged = settled_events(&server, source, expected.len() + ignored.len()).await;
        // None of them has the source's item (a pull request, an issue), so none has its
        // place: each is logged as its own aggregate, keyed by its delivery GUID.
        let ignored: Vec<(&str, &str, &str, i64)> = ignored
            .iter()
            .map(|&(i, event)| {
                (
                    deliveries[i].id.as_str(),
                    event,
                    deliveries[i].id.as_str(),
                    0,
                )
            })
            .collect();
        take_ignored(&mut logged, &ignored);
        check_latest_wins(&logged, &expected);
    }

    // `octo/repo` is one part of the key: `octo%2Frepo/7` in text, URL-encoded in a path.
    let pr = aggregate(&server, "github-pulls", "octo%252Frepo/7").await;
    assert_eq!(pr.code, 200, "{:?}", pr.body);
    assert_eq!(pr.body["aggregate"], "octo%2Frepo/7");
    assert_eq!(pr.body["event_id"], pulls[3].id);
    assert_eq!(pr.body["event_type"], "pull_request");
    assert_eq!(
        pr.body["sequence"], 1_714_561_200_000_000_i64,
        "microseconds of 11:00:00Z"
    );
    assert_eq!(
        (
            &pr.body["state"]["state"],
            &pr.body["state"]["merged"],
            &pr.body["state"]["number"]
        ),
        (&json!("closed"), &json!(true), &json!(7))
    );
    // The `/` inside the repository name never splits it into two parts.
    assert_eq!(
        aggregate(&server, "github-pulls", "octo/repo/7").await.code,
        404
    );

    let issue_state = aggregate(&server, "github-issues", "octo%252Frepo/8").await;
    assert_eq!(issue_state.code, 200, "{:?}", issue_state.body);
    assert_eq!(
        (
            &issue_state.body["aggregate"],
            &issue_state.body["state"]["state"],
            &issue_state.body["event_type"]
        ),
        (&json!("octo%2Frepo/8"), &json!("closed"), &json!("issues"))
    );
    // Issue #8 is not a pull request: the pull-request source ignored it.
    assert_eq!(
        aggregate(&server, "github-pulls", "octo%252Frepo/8")
            .await
            .code,
        404
    );

    // The event log filters by the same text form (URL-encoded as a query value).
    let log = server
        .get("/v1/events?source=github-pulls&aggregate=octo%252Frepo%2F7")
        .await;
    let items = log.body["items"]
        .as_array()
        .unwrap_or_else(|| panic!("{:?}", log.body));
    let mut ids: Vec<&str> = items
        .iter()
        .map(|e| e["event_id"].as_str().unwrap())
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        pulls[..4].iter().map(|d| d.id.as_str()).collect::<Vec<_>>()
    );
    assert!(
        items.iter().all(|e| e["aggregate"] == "octo%2Frepo/7"),
        "{items:#?}"
    );
}

/// `inhook send` as a user self-checks the GitHub example: `--header` supplies
/// the event type the source reads from `X-GitHub-Event` (and may set the delivery
/// id, which the scheme then signs); the scheme's own headers are refused, and a
/// source `send` does not know is an error, not a guessed scheme.
#[tokio::test]
async fn send_adds_headers_so_a_github_source_can_be_self_checked() {
    let server = serve_example(
        "github.toml",
        &[
            ("github-pulls", GITHUB_PULLS_SECRET),
            ("github-issues", GITHUB_ISSUES_SECRET),
        ],
    )
    .await;
    let config = examples_dir().join("github.toml");
    let pull = examples_dir().join("payloads/github-pull-request.json");
    // Another body: GitHub signs only the body, so the same one under a new delivery id
    // is a duplicate by body whatever its headers say.
    let comment = server.dir().join("github-issue-comment.json");
    let mut other: Value = serde_json::from_str(&std::fs::read_to_string(&pull).unwrap()).unwrap();
    other["action"] = json!("created");
    std::fs::write(&comment, other.to_string()).unwrap();
    let env = [("INHOOK_GITHUB_PULLS_SECRET", GITHUB_PULLS_SECRET)];
    let send_file = |body: &std::path::Path, with_config: bool, extra: &[&str]| {
        let mut args: Vec<&OsStr> = vec![OsStr::new("send")];
        if with_config {
            args.extend([OsStr::new("--config"), config.as_os_str()]);
        }
        for arg in ["--url", &server.url, "--source", "github-pulls"] {
            args.push(OsStr::new(arg));
        }
        args.extend(extra.iter().map(OsStr::new));
        args.push(body.as_os_str());
        run_cli(&args, &env)
    };
    let send = |with_config: bool, extra: &[&str]| send_file(&pull, with_config, extra);

    let (ok, out) = send(true, &["--header", "X-GitHub-Event: pull_request"]);
    assert!(ok && out.starts_with("202 "), "{out}");
    let pr = server
        .wait_for("/v1/sources/github-pulls/aggregates/octo%252Frepo/7", |r| {
            r.code == 200
        })
        .await;
    assert_eq!(
        (&pr.body["event_type"], &pr.body["state"]["number"]),
        (&json!("pull_request"), &json!(7))
    );
    let (ok, out) = send(true, &["--header", "X-GitHub-Event: pull_request"]);
    assert!(ok && out.contains("\"duplicate\""), "{out}");

    // Another type, under a delivery id of the user's: ignored, logged under that id; the
    // pull request's body under it is the duplicate it is.
    let guid = "0b1c2d3e-4f50-11ef-8a1c-2f0c1a9b7777";
    let extra = [
        "--header",
        "X-GitHub-Event: issue_comment",
        "--header",
        &format!("X-GitHub-Delivery: {guid}"),
    ];
    let (ok, out) = send(true, &extra);
    assert!(ok && out.contains("\"key\":\"body\""), "{out}");
    let (ok, out) = send_file(&comment, true, &extra);
    assert!(ok && out.contains("ignored_unsupported"), "{out}");
    let logged = server.get(&format!("/v1/events/github-pulls/{guid}")).await;
    assert_eq!(
        (&logged.body["status"], &logged.body["event_type"]),
        (&json!("ignored_unsupported"), &json!("issue_comment")),
        "{logged:?}"
    );

    // The scheme's own headers, and the content type, are refused before sending.
    for (header, why) in [
        ("X-Hub-Signature-256: sha256=00", "sets this header itself"),
        ("Content-Type: text/plain", "application/json"),
    ] {
        let (ok, out) = send(true, &["--header", header]);
        assert!(!ok && out.contains(why), "{header}: {out}");
    }
    let (ok, out) = send(true, &["--header", "X-GitHub-Event pull_request"]);
    assert!(!ok && out.contains("is not `Name: value`"), "{out}");
    assert_eq!(server.count().await, 2, "nothing refused was sent");

    // Without --config, a source that is not a default one is not guessed at...
    let (ok, out) = send(false, &["--header", "X-GitHub-Event: pull_request"]);
    assert!(
        !ok && out.contains("not a default source") && out.contains("--scheme"),
        "{out}"
    );
    // ... and --scheme is enough.
    let (ok, out) = send(
        false,
        &[
            "--scheme",
            "github",
            "--header",
            "X-GitHub-Event: pull_request",
        ],
    );
    assert!(ok && out.contains("\"duplicate\""), "{out}");
}

// ---------------------------------------------------------------- Shopify

const SHOPIFY_SECRET: &str = "shpss_examples_client_secret";
const ORDER: u64 = 820_982_911_946_154_508;
const OTHER_ORDER: u64 = 450_789_469;

/// The example order as of `updated_at` (with the shop's offset).
fn order(id: u64, updated_at: &str, financial: &str, fulfillment: Option<&str>) -> Value {
    let mut body = payload("shopify-orders-updated");
    body["id"] = json!(id);
    body["admin_graphql_api_id"] = json!(format!("gid://shopify/Order/{id}"));
    body["updated_at"] = json!(updated_at);
    body["financial_status"] = json!(financial);
    body["fulfillment_status"] = json!(fulfillment);
    body
}

/// A Shopify delivery of `topic`, with its event id and the headers Shopify sends.
fn shopify(body: &Value, topic: &str, event_id: &str) -> Delivery {
    let mut delivery = Delivery::new(
        body,
        event_id,
        &[
            ("x-shopify-topic", topic),
            ("x-shopify-event-id", event_id),
            ("x-shopify-shop-domain", "examples.myshopify.com"),
            ("x-shopify-api-version", "2024-04"),
        ],
    );
    // Each delivery (retries included) has its own webhook id; dedup is by the event id.
    delivery
        .extra
        .push(("x-shopify-webhook-id", format!("wh-{event_id}")));
    delivery
}

#[tokio::test]
async fn shopify_orders_converge_across_offsets_and_ignore_other_topics() {
    if !vectors_available() {
        return;
    }
    let server = serve_example("shopify.toml", &[("shopify-orders", SHOPIFY_SECRET)]).await;
    // The night US daylight saving time ends: 01:10-05:00 is AFTER 01:55-04:00,
    // though it sorts before it as text.
    let deliveries = [
        shopify(
            &order(ORDER, "2024-11-03T01:20:00-04:00", "pending", None),
            "orders/create",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0001",
        ),
        shopify(
            &order(ORDER, "2024-11-03T01:50:00-04:00", "paid", None),
            "orders/paid",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0002",
        ),
        shopify(
            &order(ORDER, "2024-11-03T01:55:00-04:00", "paid", None),
            "orders/updated",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0003",
        ),
        shopify(
            &order(
                ORDER,
                "2024-11-03T01:10:00-05:00",
                "paid",
                Some("fulfilled"),
            ),
            "orders/fulfilled",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0004",
        ),
        // Not an order body: its topic is left out of event_types.
        shopify(
            &json!({"id": ORDER}),
            "orders/delete",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0005",
        ),
        shopify(
            &json!({"id": 632_910_392, "title": "IPod Nano - 8GB", "updated_at": "2024-11-03T01:12:00-05:00"}),
            "products/update",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0006",
        ),
        shopify(
            &order(OTHER_ORDER, "2024-11-03T01:30:00-04:00", "pending", None),
            "orders/create",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0007",
        ),
        shopify(
            &order(OTHER_ORDER, "2024-11-03T01:00:00-05:00", "voided", None),
            "orders/cancelled",
            "b54557e4-bdd9-4b37-8a5f-0a1b2c3d0008",
        ),
    ];
    let schedule = [0, 3, 7, 2, 3, 4, 1, 6, 5, 0, 2];
    send_schedule(
        &server,
        "shopify-orders",
        Scheme::Shopify,
        SHOPIFY_SECRET,
        &deliveries,
        &schedule,
        &[4, 5],
    )
    .await;

    let expected: HashMap<String, (String, i64)> = deliveries
        .iter()
        .enumerate()
        .filter(|(i, _)| ![4, 5].contains(i))
        .map(|(_, d)| {
            let body: Value = serde_json::from_str(&d.body).unwrap();
            let at = micros(body["updated_at"].as_str().unwrap());
            (d.id.clone(), (body["id"].to_string(), at))
        })
        .collect();
    let mut logged = settled_events(&server, "shopify-orders", expected.len() + 2).await;
    // The delete carries no `updated_at`: logged as its own aggregate. The product has
    // an id and a time: logged under them, though it is no order and gets no state.
    take_ignored(
        &mut logged,
        &[
            (&deliveries[4].id, "orders/delete", &deliveries[4].id, 0),
            (
                &deliveries[5].id,
                "products/update",
                "632910392",
                micros("2024-11-03T01:12:00-05:00"),
            ),
        ],
    );
    check_latest_wins(&logged, &expected);
    assert_eq!(
        aggregate(&server, "shopify-orders", "632910392").await.code,
        404,
        "an ignored type creates no state"
    );
    // The DST night: the fulfilment, text-wise the smallest time, is the newest.
    assert!(expected[&deliveries[3].id].1 > expected[&deliveries[2].id].1);

    let state = aggregate(&server, "shopify-orders", &ORDER.to_string()).await;
    assert_eq!(state.code, 200, "{:?}", state.body);
    assert_eq!(state.body["aggregate"], ORDER.to_string());
    assert_eq!(state.body["event_id"], deliveries[3].id);
    assert_eq!(state.body["event_type"], "orders/fulfilled");
    assert_eq!(
        state.body["sequence"], 1_730_614_200_000_000_i64,
        "microseconds of 06:10:00Z"
    );
    // No `state` key: the whole order, its id the full 64-bit integer.
    assert_eq!(
        state.body["state"],
        serde_json::from_str::<Value>(&deliveries[3].body).unwrap()
    );

    let other = aggregate(&server, "shopify-orders", &OTHER_ORDER.to_string()).await;
    assert_eq!(
        (
            &other.body["event_type"],
            &other.body["state"]["financial_status"],
            &other.body["sequence"]
        ),
        (
            &json!("orders/cancelled"),
            &json!("voided"),
            &json!(1_730_613_600_000_000_i64)
        ),
        "{:?}",
        other.body
    );
}

// ---------------------------------------------------------------- a team's own service

const LEDGER_SECRET: &str = "ledger-examples-hmac-secret";

/// Entry `seq` of `account`, with the balance after it.
fn entry(account: &str, seq: i64, amount_cents: i64, balance_cents: i64) -> Value {
    let mut body = payload("ledger-entry");
    body["event_id"] = json!(format!("led_{}_{seq}", account.replace('/', "_")));
    body["account"] = json!(account);
    body["seq"] = json!(seq);
    body["entry"] = json!({"amount_cents": amount_cents, "memo": format!("entry {seq}")});
    body["balance_cents"] = json!(balance_cents);
    body
}

/// Posts one ledger body, signed as the service signs, with extra headers.
async fn post_ledger(server: &TestServer, body: &str, extra: &[(&str, &str)]) -> Reply {
    let mut headers = official(&[ToSign {
        scheme: Scheme::HmacHex,
        secret: LEDGER_SECRET,
        body,
        timestamp: now_s(),
        id: "",
    }])
    .remove(0);
    headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    server.post_headers("ledger", body, &headers).await
}

/// Waits until the ledger aggregate at `key_path` has applied up to `sequence`.
async fn ledger_at(server: &TestServer, key_path: &str, sequence: i64) -> Reply {
    server
        .wait_for(&format!("/v1/sources/ledger/aggregates/{key_path}"), |r| {
            r.body["sequence"] == sequence
        })
        .await
}

#[tokio::test]
async fn a_plain_hmac_service_applies_each_accounts_entries_in_order() {
    if !vectors_available() {
        return;
    }
    let server = serve_example("plain-hmac.toml", &[("ledger", LEDGER_SECRET)]).await;
    let answer = |reply: Reply| {
        (
            reply.code,
            reply.body["status"].as_str().unwrap_or_default().to_owned(),
        )
    };

    // README.md's line sends entry 1 of acct_42, as written in payloads/.
    let config = examples_dir().join("plain-hmac.toml");
    let first = examples_dir().join("payloads/ledger-entry.json");
    let args: Vec<&OsStr> = vec![
        OsStr::new("send"),
        OsStr::new("--config"),
        config.as_os_str(),
        OsStr::new("--url"),
        OsStr::new(&server.url),
        OsStr::new("--source"),
        OsStr::new("ledger"),
        first.as_os_str(),
    ];
    let third = entry("acct_42", 3, 250, 1750).to_string();
    // Entry 3 first: held for 1 and 2.
    assert_eq!(
        answer(post_ledger(&server, &third, &[]).await),
        (202, "accepted".into())
    );
    let (ok, out) = run_cli(&args, &[("INHOOK_LEDGER_SECRET", LEDGER_SECRET)]);
    assert!(
        ok && out.starts_with("200 ") && out.contains("\"applied\""),
        "{out}"
    );
    // The service's retry of entry 1: the same bytes, the same event_id.
    let file_body = std::fs::read_to_string(&first).unwrap();
    assert_eq!(
        answer(post_ledger(&server, &file_body, &[]).await),
        (200, "duplicate".into())
    );
    let second = entry("acct_42", 2, -500, 1500).to_string();
    let reply = post_ledger(&server, &second, &[]).await;
    assert_eq!(
        (reply.code, &reply.body),
        (200, &json!({"status": "applied", "sequence": 2}))
    );
    // The held entry 3 follows on its own.
    ledger_at(&server, "acct_42", 3).await;

    let fifth = entry("acct_42", 5, 100, 850).to_string();
    assert_eq!(
        answer(post_ledger(&server, &fifth, &[]).await),
        (202, "accepted".into())
    );
    let fourth = entry("acct_42", 4, -1000, 750).to_string();
    let keyed = [("idempotency-key", "acct_42/entry-4")];
    assert_eq!(
        answer(post_ledger(&server, &fourth, &keyed).await),
        (200, "applied".into())
    );
    // The service re-sends entry 4 under a new event_id after a restart: the
    // Idempotency-Key header makes it the same operation.
    let mut resent: Value = serde_json::from_str(&fourth).unwrap();
    resent["event_id"] = json!("led_acct_42_4_after_restart");
    let reply = post_ledger(&server, &resent.to_string(), &keyed).await;
    assert_eq!(
        (reply.code, &reply.body["status"], &reply.body["key"]),
        (200, &json!("duplicate"), &json!("idempotency_key")),
        "{:?}",
        reply.body
    );
    let account = ledger_at(&server, "acct_42", 5).await;
    assert_eq!(account.body["aggregate"], "acct_42");
    assert_eq!(account.body["event_id"], "led_acct_42_5");
    assert_eq!(account.body["event_type"], "entry.posted");
    assert_eq!(account.body["state"]["balance_cents"], 850);

    // An account id holding `/`: one key part, `team%2Fops` in text.
    for (seq, amount, balance) in [(3, -300, 3500), (1, 5000, 5000), (2, -1200, 3800)] {
        let reply = post_ledger(
            &server,
            &entry("team/ops", seq, amount, balance).to_string(),
            &[],
        )
        .await;
        assert!([200, 202].contains(&reply.code), "{:?}", reply.body);
    }
    let team = ledger_at(&server, "team%252Fops", 3).await;
    assert_eq!(
        (
            &team.body["aggregate"],
            &team.body["state"]["balance_cents"]
        ),
        (&json!("team%2Fops"), &json!(3500))
    );

    // The log: every entry processed once, in each account's order.
    let deadline = Instant::now() + Duration::from_secs(10);
    let by_account = |items: &[Value], key: &str| -> Vec<i64> {
        let mut seqs: Vec<i64> = items
            .iter()
            .filter(|e| e["aggregate"] == key && e["status"] == "processed")
            .map(|e| e["sequence"].as_i64().unwrap())
            .collect();
        seqs.sort();
        seqs
    };
    loop {
        let log = server.get("/v1/events?source=ledger&limit=500").await;
        let items = log.body["items"].as_array().cloned().unwrap_or_default();
        if items.len() == 8 && by_account(&items, "acct_42") == [1, 2, 3, 4, 5] {
            assert_eq!(by_account(&items, "team%2Fops"), [1, 2, 3], "{items:#?}");
            break;
        }
        assert!(Instant::now() < deadline, "ledger log: {items:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let filtered = server
        .get("/v1/events?source=ledger&aggregate=team%252Fops")
        .await;
    assert_eq!(
        filtered.body["items"].as_array().map(Vec::len),
        Some(3),
        "{:?}",
        filtered.body
    );
}

/// GitHub signs only the body: a captured delivery resent under new `X-GitHub-Delivery`
/// ids (and junk event types) is the duplicate it is, never a second event; an id resent
/// with another body spends its rate token and stays one line of the original's history.
#[tokio::test]
async fn a_captured_github_delivery_resent_under_new_ids_is_one_event() {
    let server = serve_example(
        "github.toml",
        &[
            ("github-pulls", GITHUB_PULLS_SECRET),
            ("github-issues", GITHUB_ISSUES_SECRET),
        ],
    )
    .await;
    let post = |body: &[u8], guid: &str, event: &str| {
        let mut headers =
            crate::support::signed(Scheme::Github, GITHUB_PULLS_SECRET, body, now_s());
        headers.retain(|(name, _)| !name.eq_ignore_ascii_case("x-github-delivery"));
        headers.push(("x-github-delivery", guid.to_owned()));
        headers.push(("x-github-event", event.to_owned()));
        let body = body.to_vec();
        let server = &server;
        async move { server.post_raw("github-pulls", &body, &headers).await }
    };
    let merged = pull_request("closed", "2024-05-01T11:00:00Z", "a1b2c3d4", &[], true)
        .to_string()
        .into_bytes();
    assert_eq!(post(&merged, "guid-1", "pull_request").await.code, 202);
    for (n, event) in ["pull_request", "junk1", "junk2"].into_iter().enumerate() {
        let again = post(&merged, &format!("guid-resent-{n}"), event).await;
        assert_eq!(again.code, 200, "{:?}", again.body);
        assert_eq!(
            (&again.body["status"], &again.body["key"]),
            (&json!("duplicate"), &json!("body")),
            "{:?}",
            again.body
        );
    }
    let logged = server.get("/v1/events?source=github-pulls").await;
    assert_eq!(
        logged.body["items"].as_array().unwrap().len(),
        1,
        "{:?}",
        logged.body
    );

    // The same id with another body: each is a conflicting duplicate, one history line.
    for n in 0..4 {
        let other = pull_request(
            "reopened",
            &format!("2024-05-01T11:0{n}:00Z"),
            "ffff",
            &[],
            false,
        )
        .to_string()
        .into_bytes();
        let reply = post(&other, "guid-1", "pull_request").await;
        assert_eq!(reply.code, 200, "{:?}", reply.body);
    }
    let detail = server.get("/v1/events/github-pulls/guid-1").await;
    let kinds: Vec<&str> = detail.body["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["kind"].as_str())
        .filter(|k| *k == "conflicting_duplicate")
        .collect();
    assert_eq!(kinds.len(), 1, "{:?}", detail.body["history"]);
    server
        .wait_for_metric(
            "inhook_duplicates_total",
            &[("source", "github-pulls"), ("key", "body")],
            3.0,
        )
        .await;
}
