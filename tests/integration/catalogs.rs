//! Publishers' catalogs end to end (docs/providers.md, docs/contract.md missing locations):
//! every example a publisher publishes for every event type it documents, signed as the
//! publisher signs, is accepted by its preset; its redelivery is a duplicate; examples of
//! distinct entities are distinct aggregates. GitHub's catalog is its own npm package
//! (`@octokit/webhooks-examples`, installed by `npm ci --prefix tests/vectors`); the other
//! publishers' payloads are built from their docs (tests/fixtures/catalogs/).

use std::collections::{BTreeMap, BTreeSet};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};

use crate::support::TestServer;

/// Headers of one delivery.
type Headers = Vec<(&'static str, String)>;

/// One example of a catalog, ready to post.
struct Example {
    /// The event type or topic, for messages.
    event_type: String,
    /// The body, as sent.
    body: Vec<u8>,
    /// The publisher's headers for it (signature, type, delivery id).
    headers: Headers,
    /// The entity it is about, as the publisher's docs name it; examples of distinct
    /// entities must be logged under distinct aggregates. `None`: no entity to compare.
    entity: Option<String>,
}

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}

/// The examples of `@octokit/webhooks-examples`, every catalog in it (api.github.com and
/// each GHES release), by event type; `None` where the package is not installed.
fn octokit_catalogs() -> Option<BTreeMap<String, Vec<Value>>> {
    let root = format!(
        "{}/tests/vectors/node_modules/@octokit/webhooks-examples",
        env!("CARGO_MANIFEST_DIR")
    );
    let Ok(dirs) = std::fs::read_dir(&root) else {
        let hint = "npm ci --prefix tests/vectors";
        if std::env::var("INHOOK_TEST_VECTORS").as_deref() == Ok("required") {
            panic!("@octokit/webhooks-examples is not installed ({hint})");
        }
        eprintln!("SKIPPED: @octokit/webhooks-examples is not installed ({hint})");
        return None;
    };
    let mut by_type: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for dir in dirs {
        let path = dir.unwrap().path().join("index.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let catalog: Vec<Value> = serde_json::from_str(&text).unwrap();
        for event in catalog {
            let name = event["name"].as_str().unwrap().to_owned();
            for example in event["examples"].as_array().unwrap() {
                // The GHES catalogs repeat most of api.github.com's examples.
                if seen.insert((name.clone(), example.to_string())) {
                    by_type
                        .entry(name.clone())
                        .or_default()
                        .push(example.clone());
                }
            }
        }
    }
    Some(by_type)
}

/// What a GitHub example is about, read as GitHub's docs describe each type's payload
/// (independently of the preset's table): the kind of entity, its owner, and its id.
fn github_entity(event_type: &str, body: &Value) -> Option<String> {
    let at = |p: &str| {
        body.pointer(p)
            .filter(|v| !v.is_null())
            .map(|v| v.to_string())
    };
    let owner = at("/repository/full_name")
        .or_else(|| at("/organization/login"))
        .unwrap_or_default();
    let (kind, id) = match event_type {
        "pull_request"
        | "pull_request_review"
        | "pull_request_review_comment"
        | "pull_request_review_thread" => ("issue", at("/pull_request/number")),
        "issues" | "issue_comment" => ("issue", at("/issue/number")),
        "check_run" => ("check_run", at("/check_run/id")),
        "check_suite" => ("check_suite", at("/check_suite/id")),
        "workflow_run" => ("workflow_run", at("/workflow_run/id")),
        "workflow_job" => ("workflow_job", at("/workflow_job/id")),
        "release" => ("release", at("/release/id")),
        "deployment" => ("deployment", at("/deployment/id")),
        "deployment_status" => ("deployment_status", at("/deployment_status/id")),
        "discussion" => ("discussion", at("/discussion/number")),
        "label" => ("label", at("/label/id")),
        "milestone" => ("milestone", at("/milestone/number")),
        "dependabot_alert" => ("dependabot_alert", at("/alert/number")),
        "code_scanning_alert" => ("code_scanning_alert", at("/alert/number")),
        "project_card" => ("project_card", at("/project_card/id")),
        "installation" | "installation_repositories" => {
            return at("/installation/id").map(|id| format!("installation {id}"))
        }
        "repository" => return at("/repository/id").map(|id| format!("repository {id}")),
        _ => return None,
    };
    Some(format!("{kind} {owner} {}", id?))
}

/// Posts every example to `source`, then again, and checks what the log made of them.
async fn post_catalog(server: &TestServer, source: &str, examples: &[Example]) {
    let mut refused = Vec::new();
    for example in examples {
        let reply = server
            .post_raw(source, &example.body, &example.headers)
            .await;
        let status = reply.body["status"].as_str().unwrap_or_default();
        if reply.code != 200 || !["applied", "stale"].contains(&status) {
            refused.push(format!(
                "{}: {} {}",
                example.event_type, reply.code, reply.body
            ));
        }
    }
    assert!(
        refused.is_empty(),
        "{source}: {} of {} examples refused:\n{}",
        refused.len(),
        examples.len(),
        refused.join("\n")
    );
    for example in examples {
        let reply = server
            .post_raw(source, &example.body, &example.headers)
            .await;
        assert_eq!(
            (reply.code, reply.body["status"].as_str()),
            (200, Some("duplicate")),
            "{source}: redelivery of a {} example {:?}",
            example.event_type,
            reply.body
        );
    }
    let logged: Vec<_> = server
        .logged()
        .await
        .into_iter()
        .filter(|e| e.source == source)
        .collect();
    assert_eq!(
        logged.len(),
        examples.len(),
        "{source}: one event per example"
    );
    // Distinct entities, distinct aggregates: no aggregate holds two entities.
    let mut entity_of: BTreeMap<String, String> = BTreeMap::new();
    for (example, event) in examples.iter().zip(logged.iter().rev()) {
        let Some(entity) = &example.entity else {
            continue;
        };
        if let Some(other) = entity_of.insert(event.aggregate.clone(), entity.clone()) {
            assert_eq!(
                &other, entity,
                "{source}: two entities under aggregate {:?}",
                event.aggregate
            );
        }
    }
    let entities: BTreeSet<&String> = entity_of.values().collect();
    assert_eq!(entities.len(), entity_of.len());
}

const GITHUB_SECRET: &str = "catalog-github-secret";

#[tokio::test]
async fn every_example_of_githubs_catalogs_is_accepted_by_the_github_preset() {
    let Some(catalogs) = octokit_catalogs() else {
        return;
    };
    // The package's own figures: 58 event types, 324 distinct examples on api.github.com.
    assert!(catalogs.len() >= 58, "{} event types", catalogs.len());
    let mut examples = Vec::new();
    for (event_type, bodies) in &catalogs {
        for body in bodies {
            let bytes = serde_json::to_vec(body).unwrap();
            let signature = hex::encode(hmac_sha256(GITHUB_SECRET.as_bytes(), &bytes));
            let id = format!("dlv-{}", examples.len());
            examples.push(Example {
                event_type: event_type.clone(),
                entity: github_entity(event_type, body),
                headers: vec![
                    ("content-type", "application/json".to_owned()),
                    ("x-hub-signature-256", format!("sha256={signature}")),
                    ("x-github-event", event_type.clone()),
                    ("x-github-delivery", id),
                ],
                body: bytes,
            });
        }
    }
    assert!(examples.len() >= 324, "{} examples", examples.len());
    let server = TestServer::spawn_with_sources(&format!(
        "[[sources]]\nname = \"github\"\npreset = \"github\"\nmode = \"sync\"\nsecrets = [\"{GITHUB_SECRET}\"]\n"
    ))
    .await;
    post_catalog(&server, "github", &examples).await;
    // The types the table orders are ordered, by their entity; those whose payload
    // carries no version say so in the log.
    let logged = server.logged().await;
    let unordered = |t: &str| {
        logged
            .iter()
            .filter(|e| e.event_type == t)
            .all(|e| e.unordered.is_some())
    };
    assert!(unordered("star") && unordered("release") && unordered("installation"));
    let ordered = |t: &str| {
        logged
            .iter()
            .filter(|e| e.event_type == t)
            .all(|e| e.unordered.is_none() && e.sequence > 0)
    };
    assert!(ordered("pull_request") && ordered("check_run") && ordered("workflow_run"));
    let star = logged.iter().find(|e| e.event_type == "star").unwrap();
    let detail = server
        .get(&format!("/v1/events/github/{}", star.event_id))
        .await;
    assert_eq!(
        detail.body["unordered"],
        json!("no version: a \"star\" payload carries none"),
        "{detail:?}"
    );
}

/// A hand-written source keyed like a publisher's, strict or opted in to the preset rule.
fn hand_written(name: &str, opt_in: bool) -> String {
    let missing = if opt_in {
        "missing_locations = \"unordered\"\n"
    } else {
        ""
    };
    format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"json\"\nmode = \"sync\"\nsignature = \"hmac-timestamped\"\n\
         secrets = [\"s3cret\"]\n{missing}event_id = \"/id\"\nevent_type = \"/type\"\n\
         aggregate = \"/object/id\"\nsequence = \"/object/version\"\nordering = \"latest-wins\"\n\
         state = \"/object\"\n"
    )
}

#[tokio::test]
async fn a_hand_written_source_is_strict_unless_it_opts_in_and_the_log_says_why_an_event_is_unordered(
) {
    use crate::support::signed;
    use inhook::ingress::signature::Scheme;
    let server = TestServer::in_process()
        .spawn_with_sources(&format!(
            "{}\n{}",
            hand_written("strict", false),
            hand_written("lenient", true)
        ))
        .await;
    let post = |source: &'static str, body: Value| {
        let server = &server;
        async move {
            let bytes = serde_json::to_vec(&body).unwrap();
            let headers = signed(
                Scheme::HmacTimestamped,
                "s3cret",
                &bytes,
                crate::support::now_s(),
            );
            server.post_raw(source, &bytes, &headers).await
        }
    };
    let versioned = json!({"id": "e1", "type": "thing.updated", "object": {"id": "t1", "version": 5, "v": "five"}});
    let unversioned =
        json!({"id": "e2", "type": "thing.touched", "object": {"id": "t1", "v": "late"}});
    // Strict: the missing version is a 400 naming it; opted in: applied, unordered.
    let refused = post("strict", unversioned.clone()).await;
    assert_eq!(refused.code, 400, "{refused:?}");
    assert!(
        refused.body.to_string().contains("/object/version"),
        "{refused:?}"
    );
    for body in [&versioned, &unversioned] {
        let reply = post("lenient", body.clone()).await;
        assert_eq!(
            (reply.code, reply.body["status"].as_str()),
            (200, Some("applied")),
            "{reply:?}"
        );
    }
    assert_eq!(
        post("lenient", unversioned.clone()).await.body["status"],
        "duplicate"
    );
    // The late unversioned event did not roll back what the versioned one wrote.
    let state = server.get("/v1/sources/lenient/aggregates/t1").await;
    assert_eq!(
        state.body["state"],
        json!({"id": "t1", "version": 5, "v": "five"}),
        "{state:?}"
    );
    let detail = server.get("/v1/events/lenient/e2").await;
    assert_eq!(
        (
            detail.body["unordered"].clone(),
            detail.body["sequence"].clone()
        ),
        (json!("no version: /object/version is absent"), json!(0)),
        "{detail:?}"
    );
    assert_eq!(
        server.get("/v1/events/lenient/e1").await.body["unordered"],
        Value::Null
    );
    // Even a body without the aggregate is the publisher's: under its type, unordered.
    let bare = post("lenient", json!({"id": "e3", "type": "thing.pinged"})).await;
    assert_eq!(bare.body["status"], "applied", "{bare:?}");
    let detail = server.get("/v1/events/lenient/e3").await;
    assert_eq!(detail.body["aggregate"], "thing.pinged", "{detail:?}");
    assert!(detail.body["unordered"]
        .as_str()
        .unwrap()
        .contains("/object/id is absent"));
}

/// A catalog built from the publisher's docs: tests/fixtures/catalogs/NAME.json, each
/// entry `{type, entity, body}`.
fn fixture_catalog(name: &str) -> Vec<(String, Option<String>, Vec<u8>)> {
    let path = format!(
        "{}/tests/fixtures/catalogs/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let entries: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    entries
        .into_iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["entity"].as_str().map(str::to_owned),
                serde_json::to_vec(&e["body"]).unwrap(),
            )
        })
        .collect()
}

/// The catalog's examples, each signed by `sign(body, index)` as its publisher signs.
fn signed_catalog(name: &str, sign: impl Fn(&str, &[u8], usize) -> Headers) -> Vec<Example> {
    fixture_catalog(name)
        .into_iter()
        .enumerate()
        .map(|(i, (event_type, entity, body))| {
            let mut headers = sign(&event_type, &body, i);
            headers.push(("content-type", "application/json".to_owned()));
            Example {
                event_type,
                body,
                headers,
                entity,
            }
        })
        .collect()
}

fn preset_source(preset: &str, secret: &str) -> String {
    format!("[[sources]]\nname = \"{preset}\"\npreset = \"{preset}\"\nmode = \"sync\"\nsecrets = [\"{secret}\"]\n")
}

#[tokio::test]
async fn stripe_shopify_and_slack_presets_accept_their_documented_catalogs() {
    let now = crate::support::now_s();
    let stripe = signed_catalog("stripe", |_, body, _| {
        let content = [format!("{now}.").as_bytes(), body].concat();
        let v1 = hex::encode(hmac_sha256(b"whsec_catalog", &content));
        vec![("stripe-signature", format!("t={now},v1={v1}"))]
    });
    let shopify = signed_catalog("shopify", |topic, body, i| {
        use base64::Engine;
        let mac = hmac_sha256(b"shopify-catalog", body);
        vec![
            (
                "x-shopify-hmac-sha256",
                base64::engine::general_purpose::STANDARD.encode(mac),
            ),
            ("x-shopify-topic", topic.to_owned()),
            ("x-shopify-event-id", format!("shop-evt-{i}")),
        ]
    });
    let slack = signed_catalog("slack", |_, body, _| {
        let content = [format!("v0:{now}:").as_bytes(), body].concat();
        vec![
            (
                "x-slack-signature",
                format!(
                    "v0={}",
                    hex::encode(hmac_sha256(b"slack-catalog", &content))
                ),
            ),
            ("x-slack-request-timestamp", now.to_string()),
        ]
    });
    let server = TestServer::spawn_with_sources(&format!(
        "{}\n{}\n{}",
        preset_source("stripe", "whsec_catalog"),
        preset_source("shopify", "shopify-catalog"),
        preset_source("slack-events", "slack-catalog"),
    ))
    .await;
    post_catalog(&server, "stripe", &stripe).await;
    post_catalog(&server, "shopify", &shopify).await;
    post_catalog(&server, "slack-events", &slack).await;
    let logged = server.logged().await;
    let of = |source: &str, t: &str| {
        logged
            .iter()
            .find(|e| e.source == source && e.event_type == t)
            .unwrap_or_else(|| panic!("{source} {t}"))
            .clone()
    };
    // Stripe's thin event is ordered by its related object and `created`; its snapshot
    // events as before, by `/created`.
    let thin = of("stripe", "v2.core.account.updated");
    assert_eq!(
        (thin.aggregate.as_str(), thin.unordered.as_deref()),
        ("acct_1", None)
    );
    assert_eq!(of("stripe", "customer.updated").sequence, 1_700_000_100);
    assert!(of("stripe", "balance.available").unordered.is_some());
    // Shopify's compliance topics are unordered under the shop (and customer).
    let redact = of("shopify", "shop/redact");
    assert_eq!(
        redact.unordered.as_deref(),
        Some("no version: a \"shop/redact\" payload carries none")
    );
    assert!(of("shopify", "orders/updated").unordered.is_none());
    // Slack's app_rate_limited carries no event_id: its body is its id.
    let limited = of("slack-events", "app_rate_limited");
    assert_eq!(limited.event_id.len(), 64);
}

/// The `X-Gitlab-Event` header GitLab sends with each kind of its catalog
/// (https://docs.gitlab.com/user/project/integrations/webhook_events/).
fn gitlab_hook(kind: &str) -> &'static str {
    match kind {
        "push" => "Push Hook",
        "tag_push" => "Tag Push Hook",
        "issue" | "work_item" => "Issue Hook",
        "note" => "Note Hook",
        "merge_request" => "Merge Request Hook",
        "wiki_page" => "Wiki Page Hook",
        "pipeline" => "Pipeline Hook",
        "build" => "Job Hook",
        "deployment" => "Deployment Hook",
        "feature_flag" => "Feature Flag Hook",
        "release" => "Release Hook",
        "milestone" => "Milestone Hook",
        "emoji" => "Emoji Hook",
        "access_token" => "Resource Access Token Hook",
        "vulnerability" => "Vulnerability Hook",
        "project_create" | "project_destroy" => "Project Hook",
        "subgroup_create" | "subgroup_destroy" => "Subgroup Hook",
        member if member.starts_with("user_") => "Member Hook",
        other => panic!("no GitLab hook for {other}"),
    }
}

#[tokio::test]
async fn every_kind_of_gitlabs_catalog_is_accepted_by_the_gitlab_preset() {
    let gitlab = signed_catalog("gitlab", |kind, _, i| {
        vec![
            ("x-gitlab-token", "gitlab-catalog-token".to_owned()),
            ("x-gitlab-event", gitlab_hook(kind).to_owned()),
            ("x-gitlab-event-uuid", format!("gl-event-{i}")),
            ("x-gitlab-webhook-uuid", "gl-hook-1".to_owned()),
            ("idempotency-key", format!("gl-idem-{i}")),
        ]
    });
    // Every kind of the page: both project and group webhooks' events.
    let kinds: BTreeSet<&str> = gitlab.iter().map(|e| e.event_type.as_str()).collect();
    assert!(kinds.len() >= 25, "{kinds:?}");
    let server =
        TestServer::spawn_with_sources(&preset_source("gitlab", "gitlab-catalog-token")).await;
    post_catalog(&server, "gitlab", &gitlab).await;
    let logged = server.logged().await;
    let of = |t: &str| -> Vec<_> { logged.iter().filter(|e| e.event_type == t).collect() };
    // The kinds that carry a version are ordered by it, whichever way GitLab writes it.
    for kind in [
        "issue",
        "work_item",
        "note",
        "merge_request",
        "milestone",
        "deployment",
    ] {
        for event in of(kind) {
            assert!(
                event.unordered.is_none() && event.sequence > 0,
                "{kind}: {event:?}"
            );
        }
    }
    let mr = of("merge_request");
    assert!(mr[0].sequence > mr[1].sequence, "{mr:?}");
    assert_eq!(mr[0].aggregate, mr[1].aggregate);
    // A job orders once it has started; created, it carries no time to order by.
    let jobs = of("build");
    assert!(jobs[0].unordered.is_none() && jobs[1].unordered.is_some());
    for kind in [
        "push",
        "pipeline",
        "release",
        "wiki_page",
        "emoji",
        "project_create",
    ] {
        let event = of(kind)[0];
        assert_eq!(
            event.unordered.as_deref(),
            Some(format!("no version: a {kind:?} payload carries none").as_str()),
            "{event:?}"
        );
    }
    let deployment = of("deployment")[0];
    assert_eq!(deployment.sequence, 1_619_639_400_000_000);
}

#[tokio::test]
async fn paddles_catalog_is_accepted_by_the_paddle_preset() {
    // Paddle allows five seconds and re-signs a retry; these redeliveries keep the first
    // signature, so the source allows more than the whole catalog takes to post twice.
    let server = TestServer::spawn_with_sources(&format!(
        "{}tolerance_s = 300\n",
        preset_source("paddle", "pdl_ntfset_catalog")
    ))
    .await;
    let now = crate::support::now_s();
    let paddle = signed_catalog("paddle", |_, body, _| {
        let content = [format!("{now}:").as_bytes(), body].concat();
        let h1 = hex::encode(hmac_sha256(b"pdl_ntfset_catalog", &content));
        vec![("paddle-signature", format!("ts={now};h1={h1}"))]
    });
    post_catalog(&server, "paddle", &paddle).await;
    // Every Paddle event carries its entity's id and `occurred_at`: all are ordered.
    let logged = server.logged().await;
    assert!(
        logged
            .iter()
            .all(|e| e.unordered.is_none() && e.sequence > 0),
        "{logged:?}"
    );
}

#[tokio::test]
async fn postmark_linear_and_typeform_presets_accept_their_documented_catalogs() {
    use base64::Engine;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("hooks:pm-catalog-password")
    );
    let postmark = signed_catalog("postmark", |_, _, _| vec![("authorization", basic.clone())]);
    let typeform = signed_catalog("typeform", |_, body, _| {
        let mac = hmac_sha256(b"typeform-catalog", body);
        let signature = base64::engine::general_purpose::STANDARD.encode(mac);
        vec![("typeform-signature", format!("sha256={signature}"))]
    });
    let server = TestServer::spawn_with_sources(&format!(
        "{}\n{}\n{}",
        preset_source("postmark", "hooks:pm-catalog-password"),
        preset_source("linear", "lin_wh_catalog"),
        preset_source("typeform", "typeform-catalog"),
    ))
    .await;
    // Linear checks `webhookTimestamp` is within a minute: the page's is set to now.
    let now_ms = crate::support::now_s() * 1000;
    let linear: Vec<Example> = fixture_catalog("linear")
        .into_iter()
        .enumerate()
        .map(|(i, (event_type, entity, body))| {
            let mut body: Value = serde_json::from_slice(&body).unwrap();
            body["webhookTimestamp"] = json!(now_ms);
            let body = serde_json::to_vec(&body).unwrap();
            let signature = hex::encode(hmac_sha256(b"lin_wh_catalog", &body));
            Example {
                headers: vec![
                    ("content-type", "application/json".to_owned()),
                    ("linear-signature", signature),
                    ("linear-event", event_type.clone()),
                    ("linear-delivery", format!("lin-dlv-{i}")),
                ],
                event_type,
                body,
                entity,
            }
        })
        .collect();
    post_catalog(&server, "postmark", &postmark).await;
    post_catalog(&server, "linear", &linear).await;
    post_catalog(&server, "typeform", &typeform).await;
    let logged = server.logged().await;
    let of = |t: &str| {
        logged
            .iter()
            .find(|e| e.source == "linear" && e.event_type == t)
            .unwrap_or_else(|| panic!("linear {t}"))
    };
    // Data changes are ordered by their entity's updatedAt; an SLA by the time of its
    // action; a revoked app carries no version.
    assert!(of("Issue").unordered.is_none() && of("IssueSLA").unordered.is_none());
    assert_eq!(
        of("IssueSLA").aggregate,
        "IssueSLA\u{1f}539068e2-ae88-4d09-bd75-22eb4a59612f"
    );
    assert_eq!(
        of("OAuthApp").unordered.as_deref(),
        Some("no version: a \"OAuthApp\" payload carries none")
    );
}
