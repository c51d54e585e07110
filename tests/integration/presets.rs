//! Presets end to end (docs/providers.md): for every preset (but those tested elsewhere:
//! discord-interactions and sendgrid-events in asymmetric_signatures.rs, aws-sns's scheme
//! in aws_sns.rs, hubspot's batches in preset_vectors.rs, dropbox's handshake below),
//! a publisher-shaped body signed the publisher's way, by hand here (never by inhook's
//! verifier, so a wrong preset fails), is applied; a tampered one is 401; the publisher's
//! retry is a duplicate; a second event of the same entity applies; and the state reads
//! back through the API. One row per preset: adding a publisher is adding a row.

use base64::Engine;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};

use crate::support::{now_s, TestServer};

/// Headers of one delivery.
type Headers = Vec<(&'static str, String)>;

/// One preset under test.
struct Row {
    /// The preset (also the source's name).
    preset: &'static str,
    /// The source's secret.
    secret: &'static str,
    /// A body of event `id` (`n` its version, 1 or 2) for the same entity; holds
    /// `mark-{n}` where the state shows it, and where the signature covers it.
    body: fn(id: &str, n: u32) -> Vec<u8>,
    /// The publisher's signature headers for `body` at `now` (unix s) with delivery `id`.
    sign: fn(secret: &str, body: &[u8], now: i64, id: &str) -> Headers,
    /// Whether a retry carries a new delivery id header (unsigned): it is then a duplicate
    /// by its body or its event id; otherwise the retry keeps the id.
    new_id_on_retry: bool,
    /// The aggregate key's parts the state is read at, for event `id`.
    key: fn(id: &str) -> Vec<String>,
    /// A form body (`application/x-www-form-urlencoded`) rather than JSON.
    form: bool,
}

const PUBLIC_URL: &str = "https://hooks.example.com";

fn mac<M: Mac + hmac::digest::KeyInit>(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key).unwrap();
    mac.update(message);
    mac.finalize().into_bytes().to_vec()
}
fn sha256(key: &str, message: &[u8]) -> Vec<u8> {
    mac::<Hmac<sha2::Sha256>>(key.as_bytes(), message)
}
fn sha1(key: &str, message: &[u8]) -> Vec<u8> {
    mac::<Hmac<sha1::Sha1>>(key.as_bytes(), message)
}
fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}
fn to_vec(v: Value) -> Vec<u8> {
    serde_json::to_vec(&v).unwrap()
}
fn one(part: &str) -> Vec<String> {
    vec![part.to_owned()]
}
fn day(n: u32) -> String {
    format!("2024-01-0{n}T00:00:00Z")
}
/// Standard Webhooks' signature, `v1,<base64 HMAC-SHA256>` of `{id}.{ts}.{body}` under the
/// decoded `whsec_` key.
fn svix(secret: &str, body: &[u8], now: i64, id: &str) -> String {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.trim_start_matches("whsec_"))
        .unwrap();
    let content = cat(&[format!("{id}.{now}.").as_bytes(), body]);
    format!("v1,{}", b64(&mac::<Hmac<sha2::Sha256>>(&key, &content)))
}
/// A `whsec_` key for the Svix-style rows.
const WHSEC: &str = "whsec_cHJlc2V0LXRlc3Qta2V5LTAxMjM0NTY3ODk=";

fn rows() -> Vec<Row> {
    vec![
        Row {
            preset: "stripe",
            secret: "whsec_stripe_test",
            body: |id, n| {
                to_vec(
                    json!({"id": id, "object": "event", "type": "customer.updated",
                "created": 1_700_000_000 + n, "data": {"object": {"id": "cus_1", "object": "customer", "name": format!("mark-{n}")}}}),
                )
            },
            sign: |secret, body, now, _| {
                let sig = hex::encode(sha256(secret, &cat(&[format!("{now}.").as_bytes(), body])));
                vec![("stripe-signature", format!("t={now},v1={sig}"))]
            },
            new_id_on_retry: false,
            key: |_| one("cus_1"),
            form: false,
        },
        Row {
            preset: "github",
            secret: "gh-secret",
            body: |_, n| {
                to_vec(
                    json!({"action": "edited", "issue": {"number": 7, "title": format!("mark-{n}"),
                "updated_at": day(n)}, "repository": {"full_name": "octo/hello", "pushed_at": "2024-01-01T00:00:00Z"},
                "sender": {"login": "octocat"}}),
                )
            },
            sign: |secret, body, _, id| {
                vec![
                    (
                        "x-hub-signature-256",
                        format!("sha256={}", hex::encode(sha256(secret, body))),
                    ),
                    ("x-github-delivery", id.to_owned()),
                    ("x-github-event", "issues".to_owned()),
                ]
            },
            new_id_on_retry: true,
            key: |_| vec!["octo/hello".into(), "7".into()],
            form: false,
        },
        Row {
            preset: "gitlab",
            secret: "gl-token-0123456789",
            body: |_, n| {
                to_vec(json!({"object_kind": "issue", "event_type": "issue",
                "project": {"id": 15, "path_with_namespace": "group/project"},
                "object_attributes": {"iid": 23, "title": format!("mark-{n}"), "updated_at": day(n)}}))
            },
            sign: |secret, _, _, id| {
                vec![
                    ("x-gitlab-token", secret.to_owned()),
                    ("x-gitlab-event-uuid", id.to_owned()),
                ]
            },
            new_id_on_retry: true,
            key: |_| vec!["group/project".into(), "issue".into(), "23".into()],
            form: false,
        },
        Row {
            preset: "bitbucket",
            secret: "bb-secret",
            body: |_, n| {
                to_vec(
                    json!({"pullrequest": {"id": 5, "title": format!("mark-{n}")},
                "repository": {"full_name": "team/repo", "uuid": "{abc}"}, "actor": {"nickname": "a"}}),
                )
            },
            sign: |secret, body, _, id| {
                vec![
                    (
                        "x-hub-signature",
                        format!("sha256={}", hex::encode(sha256(secret, body))),
                    ),
                    ("x-request-uuid", id.to_owned()),
                    ("x-event-key", "pullrequest:updated".to_owned()),
                ]
            },
            new_id_on_retry: true,
            key: |_| vec!["team/repo".into(), "5".into()],
            form: false,
        },
        Row {
            preset: "shopify",
            secret: "shpss_secret",
            body: |_, n| {
                to_vec(
                    json!({"id": 820982911946154508_i64, "admin_graphql_api_id": "gid://shopify/Order/820982911946154508",
                "updated_at": format!("2024-01-0{n}T10:00:00-05:00"), "note": format!("mark-{n}")}),
                )
            },
            sign: |secret, body, _, id| {
                vec![
                    ("x-shopify-hmac-sha256", b64(&sha256(secret, body))),
                    ("x-shopify-event-id", id.to_owned()),
                    ("x-shopify-topic", "orders/updated".to_owned()),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("gid://shopify/Order/820982911946154508"),
            form: false,
        },
        Row {
            preset: "slack-events",
            secret: "slack-signing-secret",
            body: |id, n| {
                to_vec(
                    json!({"token": "x", "team_id": "T061EG9R6", "api_app_id": "A0PNCHHK2",
                "event": {"type": "message", "channel": "C1", "user": "U1", "text": format!("mark-{n}"), "ts": "1.0"},
                "type": "event_callback", "event_id": id, "event_time": 1_700_000_000}),
                )
            },
            sign: |secret, body, now, _| {
                vec![
                    ("x-slack-request-timestamp", now.to_string()),
                    (
                        "x-slack-signature",
                        format!(
                            "v0={}",
                            hex::encode(sha256(
                                secret,
                                &cat(&[format!("v0:{now}:").as_bytes(), body])
                            ))
                        ),
                    ),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("T061EG9R6"),
            form: false,
        },
        Row {
            preset: "slack-interactivity",
            secret: "slack-signing-secret",
            body: |id, n| {
                let payload =
                    json!({"type": "block_actions", "trigger_id": id, "user": {"id": "U2"},
                    "actions": [{"value": format!("mark-{n}")}]})
                    .to_string();
                format!(
                    "payload={}",
                    percent_encoding::utf8_percent_encode(
                        &payload,
                        percent_encoding::NON_ALPHANUMERIC
                    )
                )
                .into_bytes()
            },
            sign: |secret, body, now, _| {
                vec![
                    ("x-slack-request-timestamp", now.to_string()),
                    (
                        "x-slack-signature",
                        format!(
                            "v0={}",
                            hex::encode(sha256(
                                secret,
                                &cat(&[format!("v0:{now}:").as_bytes(), body])
                            ))
                        ),
                    ),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("U2"),
            form: true,
        },
        Row {
            preset: "slack-commands",
            secret: "slack-signing-secret",
            body: |id, n| {
                format!("token=x&team_id=T1&channel_id=C1&user_id=U3&command=%2Fdeploy&text=mark-{n}&trigger_id={id}&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2F1").into_bytes()
            },
            sign: |secret, body, now, _| {
                vec![
                    ("x-slack-request-timestamp", now.to_string()),
                    (
                        "x-slack-signature",
                        format!(
                            "v0={}",
                            hex::encode(sha256(
                                secret,
                                &cat(&[format!("v0:{now}:").as_bytes(), body])
                            ))
                        ),
                    ),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("U3"),
            form: true,
        },
        Row {
            preset: "mailgun",
            secret: "mailgun-signing-key",
            // The signature is in the body: a fresh one is written by `body` at the time of the test.
            body: |id, n| {
                let ts = now_s().to_string();
                let token = format!("token-{id}-mark-{n}");
                let sig = hex::encode(sha256(
                    "mailgun-signing-key",
                    format!("{ts}{token}").as_bytes(),
                ));
                to_vec(
                    json!({"signature": {"timestamp": ts, "token": token, "signature": sig},
                    "event-data": {"id": id, "event": "delivered", "message": {"headers": {"message-id": "20240101.1@mg.example.com"}},
                    "delivery-status": {"message": format!("mark-{n}")}}}),
                )
            },
            sign: |_, _, _, _| Vec::new(),
            new_id_on_retry: false,
            key: |_| one("20240101.1@mg.example.com"),
            form: false,
        },
        Row {
            preset: "resend",
            secret: WHSEC,
            body: |_, n| {
                to_vec(
                    json!({"type": "email.delivered", "created_at": format!("2024-02-22T23:41:1{n}.126Z"),
                "data": {"email_id": "56761188-7520-42d8-8898-ff6fc54ce618", "subject": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, id| {
                vec![
                    ("svix-id", id.to_owned()),
                    ("svix-timestamp", now.to_string()),
                    ("svix-signature", svix(secret, body, now, id)),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("56761188-7520-42d8-8898-ff6fc54ce618"),
            form: false,
        },
        Row {
            preset: "clerk",
            secret: WHSEC,
            body: |_, n| {
                to_vec(
                    json!({"object": "event", "type": "user.updated", "timestamp": 1_654_012_591_835_i64,
                "data": {"id": "user_29w83sxmDNGwOuEthce5gg56FcC", "updated_at": 1_654_012_591_835_i64 + n as i64, "first_name": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, id| {
                vec![
                    ("svix-id", id.to_owned()),
                    ("svix-timestamp", now.to_string()),
                    ("svix-signature", svix(secret, body, now, id)),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("user_29w83sxmDNGwOuEthce5gg56FcC"),
            form: false,
        },
        Row {
            preset: "standard-webhooks",
            secret: WHSEC,
            body: |_, n| {
                to_vec(
                    json!({"type": "invoice.paid", "timestamp": "2024-01-01T00:00:00Z", "data": {"mark": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, id| {
                vec![
                    ("webhook-id", id.to_owned()),
                    ("webhook-timestamp", now.to_string()),
                    ("webhook-signature", svix(secret, body, now, id)),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("dlv_2"),
            form: false,
        },
        Row {
            preset: "twitch-eventsub",
            secret: "twitch-secret-0123",
            body: |_, n| {
                to_vec(
                    json!({"subscription": {"id": "f1c2a387-161a-49f9-a165-0f21d7a4e1c4", "type": "channel.follow", "version": "2", "status": "enabled"},
                "event": {"user_name": format!("mark-{n}"), "broadcaster_user_id": "1337"}}),
                )
            },
            sign: |secret, body, now, id| {
                let ts = inhook::domain::clock::rfc3339(now * 1000);
                let sig = hex::encode(sha256(secret, &cat(&[id.as_bytes(), ts.as_bytes(), body])));
                vec![
                    ("twitch-eventsub-message-id", id.to_owned()),
                    ("twitch-eventsub-message-timestamp", ts),
                    ("twitch-eventsub-message-signature", format!("sha256={sig}")),
                    ("twitch-eventsub-message-type", "notification".to_owned()),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("f1c2a387-161a-49f9-a165-0f21d7a4e1c4"),
            form: false,
        },
        Row {
            preset: "linear",
            secret: "lin_wh_secret",
            body: |_, n| {
                to_vec(
                    json!({"action": "update", "type": "Issue", "createdAt": "2024-01-01T00:00:00.000Z",
                "data": {"id": "2174add1-f7c8-44e3-bbf3-2d60b5ea8bc9", "updatedAt": format!("2024-01-0{n}T00:00:00.000Z"), "title": format!("mark-{n}")},
                "webhookTimestamp": now_s() * 1000}),
                )
            },
            sign: |secret, body, _, id| {
                vec![
                    ("linear-signature", hex::encode(sha256(secret, body))),
                    ("linear-delivery", id.to_owned()),
                ]
            },
            new_id_on_retry: false,
            key: |_| {
                vec![
                    "Issue".into(),
                    "2174add1-f7c8-44e3-bbf3-2d60b5ea8bc9".into(),
                ]
            },
            form: false,
        },
        Row {
            preset: "intercom",
            secret: "intercom-client-secret",
            body: |id, n| {
                to_vec(
                    json!({"type": "notification_event", "id": id, "topic": "conversation.user.replied",
                "created_at": 1_700_000_000 + n, "data": {"item": {"type": "conversation", "id": "147", "mark": format!("mark-{n}")}}}),
                )
            },
            sign: |secret, body, _, _| {
                vec![(
                    "x-hub-signature",
                    format!("sha1={}", hex::encode(sha1(secret, body))),
                )]
            },
            new_id_on_retry: false,
            key: |_| vec!["conversation".into(), "147".into()],
            form: false,
        },
        Row {
            preset: "square",
            secret: "square-signature-key",
            body: |id, n| {
                to_vec(
                    json!({"merchant_id": "6SSW7HV8K2ST5", "type": "payment.updated", "event_id": id,
                "created_at": day(n), "data": {"type": "payment", "id": "KkAkhdMsgzn59SM8A89WgKwekxLZY",
                "object": {"payment": {"note": format!("mark-{n}")}}}}),
                )
            },
            sign: |secret, body, _, _| {
                let url = format!("{PUBLIC_URL}/webhooks/square");
                vec![(
                    "x-square-hmacsha256-signature",
                    b64(&sha256(secret, &cat(&[url.as_bytes(), body]))),
                )]
            },
            new_id_on_retry: false,
            key: |_| vec!["payment".into(), "KkAkhdMsgzn59SM8A89WgKwekxLZY".into()],
            form: false,
        },
        Row {
            preset: "paddle",
            secret: "pdl_ntfset_secret",
            body: |id, n| {
                to_vec(
                    json!({"event_id": id, "event_type": "transaction.updated", "occurred_at": day(n),
                "notification_id": "ntf_01", "data": {"id": "txn_01hv8wptq8987qeep44cyrewp9", "status": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, _| {
                let h1 = hex::encode(sha256(secret, &cat(&[format!("{now}:").as_bytes(), body])));
                vec![("paddle-signature", format!("ts={now};h1={h1}"))]
            },
            new_id_on_retry: false,
            key: |_| one("txn_01hv8wptq8987qeep44cyrewp9"),
            form: false,
        },
        Row {
            preset: "pagerduty",
            secret: "pd-secret",
            body: |id, n| {
                to_vec(
                    json!({"event": {"id": id, "event_type": "incident.acknowledged", "resource_type": "incident",
                "occurred_at": day(n), "data": {"id": "PGR0VU2", "type": "incident", "status": format!("mark-{n}")}}}),
                )
            },
            sign: |secret, body, _, _| {
                vec![(
                    "x-pagerduty-signature",
                    format!("v1={}", hex::encode(sha256(secret, body))),
                )]
            },
            new_id_on_retry: false,
            key: |_| vec!["incident".into(), "PGR0VU2".into()],
            form: false,
        },
        Row {
            preset: "sentry",
            secret: "sentry-client-secret",
            body: |_, n| {
                to_vec(
                    json!({"action": "resolved", "installation": {"uuid": "7a485448-a9e2-4c85-8a3c-4f44175783c9"},
                "data": {"issue": {"id": "1170820242", "status": format!("mark-{n}")}}, "actor": {"type": "user", "id": 1}}),
                )
            },
            sign: |secret, body, now, id| {
                vec![
                    ("sentry-hook-signature", hex::encode(sha256(secret, body))),
                    ("sentry-hook-resource", "issue".to_owned()),
                    ("sentry-hook-timestamp", now.to_string()),
                    ("request-id", id.to_owned()),
                ]
            },
            new_id_on_retry: true,
            key: |_| one("1170820242"),
            form: false,
        },
        Row {
            preset: "vercel",
            secret: "vercel-secret",
            body: |id, n| {
                to_vec(
                    json!({"id": id, "type": "deployment.succeeded", "createdAt": 1_700_000_000_000_i64 + n as i64,
                "region": "sfo1", "payload": {"deployment": {"id": "dpl_2euZBFqxx", "name": format!("mark-{n}")}, "project": {"id": "prj_1"}}}),
                )
            },
            sign: |secret, body, _, _| {
                vec![("x-vercel-signature", hex::encode(sha1(secret, body)))]
            },
            new_id_on_retry: false,
            key: |_| one("dpl_2euZBFqxx"),
            form: false,
        },
        Row {
            preset: "typeform",
            secret: "typeform-secret",
            body: |id, n| {
                to_vec(json!({"event_id": id, "event_type": "form_response",
                "form_response": {"form_id": "lT4Z3j", "token": "a3a12ec67a1365927098a606107fac15", "answers": [{"text": format!("mark-{n}")}]}}))
            },
            sign: |secret, body, _, _| {
                vec![(
                    "typeform-signature",
                    format!("sha256={}", b64(&sha256(secret, body))),
                )]
            },
            new_id_on_retry: false,
            key: |_| vec!["lT4Z3j".into(), "a3a12ec67a1365927098a606107fac15".into()],
            form: false,
        },
        Row {
            preset: "workos",
            secret: "workos-secret",
            body: |id, n| {
                to_vec(
                    json!({"id": id, "event": "dsync.user.updated", "created_at": format!("2024-01-0{n}T00:00:00.000Z"),
                "data": {"id": "directory_user_01E1JG7J09H96KYP8HM9B0G5SJ", "first_name": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, _| {
                let ms = now * 1000;
                let v1 = hex::encode(sha256(secret, &cat(&[format!("{ms}.").as_bytes(), body])));
                vec![("workos-signature", format!("t={ms}, v1={v1}"))]
            },
            new_id_on_retry: false,
            key: |_| one("directory_user_01E1JG7J09H96KYP8HM9B0G5SJ"),
            form: false,
        },
        Row {
            preset: "mux",
            secret: "mux-secret",
            body: |id, n| {
                to_vec(
                    json!({"type": "video.asset.ready", "id": id, "created_at": day(n),
                "object": {"type": "asset", "id": "0201p02fGKPE7MrbC269XRD7LpcHhrmbu0002"}, "data": {"status": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, _| {
                let v1 = hex::encode(sha256(secret, &cat(&[format!("{now}.").as_bytes(), body])));
                vec![("mux-signature", format!("t={now},v1={v1}"))]
            },
            new_id_on_retry: false,
            key: |_| {
                vec![
                    "asset".into(),
                    "0201p02fGKPE7MrbC269XRD7LpcHhrmbu0002".into(),
                ]
            },
            form: false,
        },
        Row {
            preset: "notion",
            secret: "secret_notion_verification_token",
            body: |id, n| {
                to_vec(
                    json!({"id": id, "timestamp": day(n), "workspace_id": "w1", "type": "page.properties_updated",
                "entity": {"id": "153104cd-477e-809d-8dc4-ff2d96ae3090", "type": "page"}, "data": {"mark": format!("mark-{n}")}, "attempt_number": 1}),
                )
            },
            sign: |secret, body, _, _| {
                vec![(
                    "x-notion-signature",
                    format!("sha256={}", hex::encode(sha256(secret, body))),
                )]
            },
            new_id_on_retry: false,
            key: |_| vec!["page".into(), "153104cd-477e-809d-8dc4-ff2d96ae3090".into()],
            form: false,
        },
        Row {
            preset: "okta-event-hooks",
            secret: "okta-hook-secret",
            body: |id, n| {
                to_vec(
                    json!({"eventType": "com.okta.event_hook", "eventTypeVersion": "1.0", "eventId": id,
                "source": "https://example.okta.com/api/v1/eventHooks/whoql0HfiLGPWc8Jx0g3",
                "data": {"events": [{"eventType": "user.session.start", "displayMessage": format!("mark-{n}")}]}}),
                )
            },
            sign: |secret, _, _, _| vec![("authorization", secret.to_owned())],
            new_id_on_retry: false,
            key: |_| one("https://example.okta.com/api/v1/eventHooks/whoql0HfiLGPWc8Jx0g3"),
            form: false,
        },
        Row {
            preset: "zendesk",
            secret: "zendesk-signing-secret",
            body: |id, n| {
                to_vec(
                    json!({"id": id, "type": "zen:event-type:ticket.status_changed", "subject": "zen:ticket:1",
                "time": day(n), "detail": {"id": "1", "status": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, now, id| {
                let ts = inhook::domain::clock::rfc3339(now * 1000);
                vec![
                    (
                        "x-zendesk-webhook-signature",
                        b64(&sha256(secret, &cat(&[ts.as_bytes(), body]))),
                    ),
                    ("x-zendesk-webhook-signature-timestamp", ts),
                    ("x-zendesk-webhook-invocation-id", format!("inv-{id}")),
                ]
            },
            new_id_on_retry: false,
            key: one,
            form: false,
        },
        Row {
            preset: "trello",
            secret: "trello-app-secret",
            body: |id, n| {
                to_vec(
                    json!({"action": {"id": id, "type": "updateCard", "date": format!("2024-01-0{n}T00:00:00.000Z"),
                "data": {"card": {"name": format!("mark-{n}")}}}, "model": {"id": "4d5ea62fd76aa1136000000c", "name": format!("mark-{n}")}}),
                )
            },
            sign: |secret, body, _, _| {
                let url = format!("{PUBLIC_URL}/webhooks/trello");
                vec![(
                    "x-trello-webhook",
                    b64(&sha1(secret, &cat(&[body, url.as_bytes()]))),
                )]
            },
            new_id_on_retry: false,
            key: |_| one("4d5ea62fd76aa1136000000c"),
            form: false,
        },
        Row {
            preset: "postmark",
            secret: "hooks:pm-password-0123456",
            body: |_, n| {
                to_vec(
                    json!({"RecordType": "Delivery", "ServerID": 23, "MessageStream": "outbound",
                "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483", "Recipient": "john@example.com",
                "DeliveredAt": day(n), "Details": format!("mark-{n}")}),
                )
            },
            sign: |secret, _, _, _| {
                vec![("authorization", format!("Basic {}", b64(secret.as_bytes())))]
            },
            new_id_on_retry: false,
            key: |_| one("883953f4-6105-42a2-a16a-77a8eac79483"),
            form: false,
        },
        Row {
            preset: "lemonsqueezy",
            secret: "ls-secret",
            body: |_, n| {
                to_vec(json!({"meta": {"event_name": "subscription_updated"},
                "data": {"type": "subscriptions", "id": "1", "attributes": {"status": format!("mark-{n}"),
                "updated_at": day(n)}}}))
            },
            sign: |secret, body, _, _| vec![("x-signature", hex::encode(sha256(secret, body)))],
            new_id_on_retry: false,
            key: |_| vec!["subscriptions".into(), "1".into()],
            form: false,
        },
        Row {
            preset: "calendly",
            secret: "cal-signing-key",
            body: |_, n| {
                to_vec(json!({"event": "invitee.created", "created_at": day(n),
                "payload": {"uri": "https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAA",
                "status": format!("mark-{n}"), "updated_at": day(n)}}))
            },
            sign: |secret, body, now, _| {
                let v1 = hex::encode(sha256(secret, &cat(&[format!("{now}.").as_bytes(), body])));
                vec![("calendly-webhook-signature", format!("t={now},v1={v1}"))]
            },
            new_id_on_retry: false,
            key: |_| {
                one("https://api.calendly.com/scheduled_events/GBGBDCAADAEDCRZ2/invitees/AAAA")
            },
            form: false,
        },
        Row {
            preset: "zoom",
            secret: "zoom-secret-token",
            body: |_, n| {
                to_vec(
                    json!({"event": "meeting.updated", "event_ts": 1_700_000_000_000_u64 + u64::from(n),
                "payload": {"account_id": "AAAAAABBBB", "object": {"uuid": "4444AAAiAAAAAiAiAiiAii==",
                "id": 6_206_345_127_u64, "topic": format!("mark-{n}")}}}),
                )
            },
            sign: |secret, body, now, _| {
                let sig = hex::encode(sha256(
                    secret,
                    &cat(&[format!("v0:{now}:").as_bytes(), body]),
                ));
                vec![
                    ("x-zm-request-timestamp", now.to_string()),
                    ("x-zm-signature", format!("v0={sig}")),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("4444AAAiAAAAAiAiAiiAii=="),
            form: false,
        },
        Row {
            preset: "x-activity",
            secret: "x-consumer-secret",
            body: |_, n| {
                to_vec(json!({"for_user_id": "2244994945",
                "tweet_create_events": [{"id_str": format!("17{n}"), "text": format!("mark-{n}")}]}))
            },
            sign: |secret, body, _, _| {
                vec![(
                    "x-twitter-webhooks-signature",
                    format!("sha256={}", b64(&sha256(secret, body))),
                )]
            },
            new_id_on_retry: false,
            key: |_| one("2244994945"),
            form: false,
        },
        Row {
            preset: "msgraph",
            secret: "graph-client-token",
            body: |_, n| {
                to_vec(
                    json!({"value": [{"subscriptionId": "7f105c7d-2dc5-4530-97cd-4e7ae6534c07",
                "changeType": "updated", "resource": format!("Users/mark-{n}"),
                "tenantId": "84bd8158-6d4d-4958-8b9f-9d6445542f95"}]}),
                )
            },
            // Graph signs nothing: the token goes in the notificationUrl's query ([`post`]).
            sign: |secret, _, _, _| vec![(QUERY_TOKEN, secret.to_owned())],
            new_id_on_retry: false,
            key: |_| one("7f105c7d-2dc5-4530-97cd-4e7ae6534c07"),
            form: false,
        },
        Row {
            preset: "twilio",
            secret: "twilio-auth-token",
            body: |_, n| {
                format!("MessageSid=SM1342fe1b2c904d1ab04f0fc7a58abca9&MessageStatus=mark-{n}&AccountSid=AC1")
                    .into_bytes()
            },
            sign: |secret, body, _, id| {
                let mut params: Vec<(String, String)> =
                    form_urlencoded::parse(body).into_owned().collect();
                params.sort();
                let mut signed = format!("{PUBLIC_URL}/webhooks/twilio");
                for (name, value) in params {
                    signed += &name;
                    signed += &value;
                }
                vec![
                    ("x-twilio-signature", b64(&sha1(secret, signed.as_bytes()))),
                    ("i-twilio-idempotency-token", id.to_owned()),
                ]
            },
            new_id_on_retry: false,
            key: |_| one("SM1342fe1b2c904d1ab04f0fc7a58abca9"),
            form: true,
        },
    ]
}

/// Not a header: the token a row's `sign` puts in the query string instead ([`post`]).
const QUERY_TOKEN: &str = "?token";

/// The presets verified by a shared token, which covers no byte of the body.
const TOKENS: [&str; 4] = ["gitlab", "okta-event-hooks", "postmark", "msgraph"];

/// One `[[sources]]` table per row: the preset, the secret, sync so the answer is the outcome.
fn config(rows: &[Row]) -> String {
    let mut text = format!("public_url = \"{PUBLIC_URL}\"\n");
    for row in rows {
        text += &format!(
            "\n[[sources]]\nname = \"{0}\"\npreset = \"{0}\"\nmode = \"sync\"\nsecrets = [\"{1}\"]\n",
            row.preset, row.secret
        );
    }
    text
}

/// An aggregate key's text form in a URL: `%` and `/` escaped in each part, then the
/// part URL-encoded.
fn key_path(parts: &[String]) -> String {
    parts
        .iter()
        .map(|p| {
            let text = p.replace('%', "%25").replace('/', "%2F");
            percent_encoding::utf8_percent_encode(&text, percent_encoding::NON_ALPHANUMERIC)
                .to_string()
        })
        .collect::<Vec<_>>()
        .join("/")
}

async fn post(
    server: &TestServer,
    row: &Row,
    body: &[u8],
    headers: &Headers,
) -> crate::support::Reply {
    let mut all = headers.clone();
    let media = if row.form {
        "application/x-www-form-urlencoded"
    } else {
        "application/json"
    };
    all.push(("content-type", media.to_owned()));
    if let Some(at) = all.iter().position(|(name, _)| *name == QUERY_TOKEN) {
        // Graph signs nothing: the source's token rides in the notificationUrl's query.
        let (_, token) = all.remove(at);
        let path = format!("{}?token={token}", row.preset);
        return server.post_raw(&path, body, &all).await;
    }
    server.post_raw(row.preset, body, &all).await
}

/// The presets whose `response` replaces the JSON answer (Slack shows it to a person,
/// Twilio reads TwiML).
const RESPONDS: [&str; 3] = ["slack-interactivity", "slack-commands", "twilio"];

/// The outcome of a delivery: its answer's `status`, or for a preset with its own
/// `response` (empty text) what the event log shows: the newest event's status when the
/// log grew, `duplicate` when it did not.
async fn outcome(
    server: &TestServer,
    name: &str,
    reply: &crate::support::Reply,
    logged_before: usize,
) -> String {
    if !RESPONDS.contains(&name) {
        return reply.body["status"].as_str().unwrap_or_default().to_owned();
    }
    assert_eq!(
        reply.body,
        Value::Null,
        "{name}: its response is an empty text {reply:?}"
    );
    let events = server.get(&format!("/v1/events?source={name}")).await;
    let items = events.body["items"].as_array().expect("events").clone();
    if items.len() > logged_before {
        items[0]["status"]
            .as_str()
            .unwrap_or_default()
            .replace("processed", "applied")
    } else {
        "duplicate".into()
    }
}

#[tokio::test]
async fn every_preset_verifies_dedups_orders_and_keeps_the_publishers_events() {
    let rows = rows();
    let server = TestServer::in_process()
        .spawn_top_and_sources(&config(&rows), "")
        .await;
    for row in &rows {
        let name = row.preset;
        let now = now_s();
        let first = (row.body)("evt_1", 1);
        let headers = (row.sign)(row.secret, &first, now, "dlv_1");
        let reply = post(&server, row, &first, &headers).await;
        assert_eq!(reply.code, 200, "{name}: first event {reply:?}");
        assert_eq!(
            outcome(&server, name, &reply, 0).await,
            "applied",
            "{name}: {reply:?}"
        );

        // Tampered: the signed marker changed after signing; a shared token (which covers
        // no body) replaced by another.
        let reply = if TOKENS.contains(&name) {
            let forged = (row.sign)("not-the-token", &first, now, "dlv_x");
            post(&server, row, &first, &forged).await
        } else {
            let tampered = String::from_utf8(first.clone())
                .unwrap()
                .replace("mark", "MARK");
            assert_ne!(
                tampered.as_bytes(),
                first,
                "{name}: the body holds no marker"
            );
            post(&server, row, tampered.as_bytes(), &headers).await
        };
        assert_eq!(reply.code, 401, "{name}: tampered {reply:?}");

        // The publisher's retry: signed again a second later, with a new delivery id
        // header where the publisher sends one.
        let retry_id = if row.new_id_on_retry {
            "dlv_1b"
        } else {
            "dlv_1"
        };
        let headers = (row.sign)(row.secret, &first, now + 1, retry_id);
        let reply = post(&server, row, &first, &headers).await;
        assert_eq!(reply.code, 200, "{name}: retry {reply:?}");
        assert_eq!(
            outcome(&server, name, &reply, 1).await,
            "duplicate",
            "{name}: retry {reply:?}"
        );

        // A second event of the same entity applies, and the state shows it.
        let second = (row.body)("evt_2", 2);
        let headers = (row.sign)(row.secret, &second, now, "dlv_2");
        let reply = post(&server, row, &second, &headers).await;
        assert_eq!(reply.code, 200, "{name}: second event {reply:?}");
        assert_eq!(
            outcome(&server, name, &reply, 1).await,
            "applied",
            "{name}: {reply:?}"
        );

        let key = key_path(&(row.key)("evt_2"));
        let state = server
            .get(&format!("/v1/sources/{name}/aggregates/{key}"))
            .await;
        assert_eq!(state.code, 200, "{name}: state at {key}: {state:?}");
        let shown = state.body["state"].to_string();
        assert!(shown.contains("mark-2"), "{name}: state {shown}");
    }
}

#[tokio::test]
async fn a_preset_key_written_in_the_source_wins_and_an_unknown_preset_names_close_ones() {
    let server = TestServer::unstarted(
        "",
        "",
        "[[sources]]\nname = \"pay\"\npreset = \"strpe\"\nsecrets = [\"x\"]\n",
    )
    .await;
    let (ok, out) = server.cli(&["serve"]);
    assert!(!ok);
    assert!(
        out.contains("preset \"strpe\" is unknown") && out.contains("stripe"),
        "{out}"
    );

    // Overriding: stripe's latest-wins made unordered with an aggregate per event; the
    // preset's state (the object) still applies.
    let server = TestServer::spawn_with_sources(
        "[[sources]]\nname = \"pay\"\npreset = \"stripe\"\nmode = \"sync\"\nordering = \"unordered\"\naggregate = \"/id\"\nsecrets = [\"whsec_x\"]\n",
    )
    .await;
    let body = to_vec(
        json!({"id": "evt_9", "type": "a.b", "created": 1, "data": {"object": {"id": "o"}}}),
    );
    let now = now_s();
    let sig = hex::encode(sha256(
        "whsec_x",
        &cat(&[format!("{now}.").as_bytes(), &body]),
    ));
    let reply = server
        .post_raw(
            "pay",
            &body,
            &[
                ("stripe-signature", format!("t={now},v1={sig}")),
                ("content-type", "application/json".into()),
            ],
        )
        .await;
    assert_eq!(reply.body["status"], "applied", "{reply:?}");
    let state = server.get("/v1/sources/pay/aggregates/evt_9").await;
    assert_eq!(state.body["state"], json!({"id": "o"}), "{state:?}");
    let overview = server.get("/v1/overview").await;
    let pay = overview.body["sources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["source"] == "pay")
        .cloned();
    assert_eq!(pay.unwrap()["preset"], "stripe", "{overview:?}");
}

#[tokio::test]
async fn presets_lists_every_preset_and_prints_one_that_starts_as_is() {
    let (ok, list) = crate::support::run_cli(&["presets".as_ref()], &[]);
    assert!(ok, "{list}");
    for name in [
        "stripe",
        "github",
        "trello",
        "aws-sns",
        "discord-interactions",
    ] {
        assert!(list.lines().any(|l| l.starts_with(name)), "{name}: {list}");
    }
    assert!(
        list.contains("slack-events") && list.contains("slack "),
        "{list}"
    );
    let (ok, paddle) = crate::support::run_cli(&["presets".as_ref(), "paddle".as_ref()], &[]);
    assert!(ok, "{paddle}");
    assert!(
        paddle.contains("[[sources]]\nname = \"paddle\"\n"),
        "{paddle}"
    );
    assert!(paddle.contains("INHOOK_PADDLE_SECRET"), "{paddle}");
    // Pasted with a secret, it starts the same source.
    let pasted = format!("{paddle}secrets = [\"pdl_ntfset_secret\"]\nmode = \"sync\"\n");
    let server = TestServer::spawn_with_sources(&pasted).await;
    let row = rows().into_iter().find(|r| r.preset == "paddle").unwrap();
    let body = (row.body)("evt_p", 1);
    let reply = post(
        &server,
        &row,
        &body,
        &(row.sign)(row.secret, &body, now_s(), "d"),
    )
    .await;
    assert_eq!(reply.body["status"], "applied", "{reply:?}");
    let (ok, out) = crate::support::run_cli(&["presets".as_ref(), "padle".as_ref()], &[]);
    assert!(!ok && out.contains("paddle"), "{out}");
}

#[tokio::test]
async fn send_with_a_preset_signs_as_the_publisher_does() {
    let sources = "[[sources]]\nname = \"pay\"\npreset = \"paddle\"\nmode = \"sync\"\nsecrets = [\"pdl_ntfset_secret\"]\n\n\
                   [[sources]]\nname = \"sq\"\npreset = \"square\"\nmode = \"sync\"\npublic_url = \"https://hooks.example.com\"\nsecrets = [\"sq-key\"]\n";
    let server = TestServer::spawn_with_sources(sources).await;
    let dir = tempfile::tempdir().unwrap();
    for (source, preset, secret) in [
        ("pay", "paddle", "pdl_ntfset_secret"),
        ("sq", "square", "sq-key"),
    ] {
        let row = rows().into_iter().find(|r| r.preset == preset).unwrap();
        let file = dir.path().join(format!("{source}.json"));
        std::fs::write(&file, (row.body)("evt_send", 1)).unwrap();
        let words = [
            "send",
            "--url",
            &server.url,
            "--preset",
            preset,
            "--source",
            source,
            "--secret",
            secret,
        ];
        let mut args: Vec<&std::ffi::OsStr> = words.iter().map(std::ffi::OsStr::new).collect();
        if preset == "square" {
            args.extend(["--public-url", PUBLIC_URL].map(std::ffi::OsStr::new));
        }
        args.push(file.as_os_str());
        let (ok, out) = crate::support::run_cli(&args, &[]);
        assert!(ok && out.contains("applied"), "{preset}: {out}");
        assert!(!out.contains(secret), "{preset}: {out}");
    }
    // A wrong secret is refused by the server, and an unknown preset before sending.
    let file = dir.path().join("pay.json");
    let (ok, out) = crate::support::run_cli(
        &[
            "send",
            "--url",
            &server.url,
            "--preset",
            "paddle",
            "--source",
            "pay",
            "--secret",
            "wrong",
        ]
        .map(std::ffi::OsStr::new)
        .into_iter()
        .chain([file.as_os_str()])
        .collect::<Vec<_>>(),
        &[],
    );
    assert!(!ok && out.contains("401"), "{out}");
    let (ok, out) = crate::support::run_cli(
        &[
            "send", "--preset", "padle", "--source", "pay", "--secret", "x", "-",
        ]
        .map(std::ffi::OsStr::new),
        &[],
    );
    assert!(!ok && out.contains("paddle"), "{out}");
}

/// A preset source answers its publisher's endpoint check as the publisher sends it:
/// the handshake comes with the preset, signed the publisher's way where it is signed.
#[tokio::test]
async fn preset_sources_answer_their_publishers_handshakes() {
    let mut sources = String::new();
    for (preset, secret) in [
        ("slack-events", "slack-secret"),
        ("zoom", "zoom-secret"),
        ("twitch-eventsub", "twitch-secret-0123"),
        ("x-activity", "x-consumer-secret"),
        ("dropbox", "dropbox-secret"),
        ("msgraph", "graph-token-0123456789"),
        ("okta-event-hooks", "okta-token-0123456789"),
    ] {
        sources += &format!(
            "\n[[sources]]\nname = \"{preset}\"\npreset = \"{preset}\"\nsecrets = [\"{secret}\"]\n"
        );
    }
    let server = TestServer::in_process()
        .spawn_top_and_sources("", &sources)
        .await;
    let client = reqwest::Client::new();
    let url = |path: &str| format!("{}/webhooks/{path}", server.url);
    let text = |r: reqwest::Response| async move {
        let status = r.status().as_u16();
        let nosniff = r
            .headers()
            .get("x-content-type-options")
            .map(|v| v.to_str().unwrap().to_owned());
        let body = r.text().await.unwrap();
        assert_eq!(nosniff.as_deref(), Some("nosniff"), "{status} {body}");
        (status, body)
    };
    let now = now_s();

    let body = br#"{"token":"t","challenge":"slack-challenge-1","type":"url_verification"}"#;
    let sig = hex::encode(sha256(
        "slack-secret",
        &cat(&[format!("v0:{now}:").as_bytes(), body]),
    ));
    let reply = client
        .post(url("slack-events"))
        .header("content-type", "application/json")
        .header("x-slack-request-timestamp", now.to_string())
        .header("x-slack-signature", format!("v0={sig}"))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(
        text(reply).await,
        (200, r#"{"challenge":"slack-challenge-1"}"#.into())
    );

    let body = br#"{"event":"endpoint.url_validation","payload":{"plainToken":"qgg8vlvZRS6UYooatFL8Aw"},"event_ts":1654503849680}"#;
    let sig = hex::encode(sha256(
        "zoom-secret",
        &cat(&[format!("v0:{now}:").as_bytes(), body]),
    ));
    let reply = client
        .post(url("zoom"))
        .header("content-type", "application/json")
        .header("x-zm-request-timestamp", now.to_string())
        .header("x-zm-signature", format!("v0={sig}"))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let expected = hex::encode(sha256("zoom-secret", b"qgg8vlvZRS6UYooatFL8Aw"));
    let (code, answer) = text(reply).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).unwrap(),
        json!({"plainToken": "qgg8vlvZRS6UYooatFL8Aw", "encryptedToken": expected})
    );

    let body = br#"{"challenge":"pogchamp-kappa-360noscope-vohiyo","subscription":{"id":"f1c2a387","type":"channel.follow"}}"#;
    let at = time::OffsetDateTime::from_unix_timestamp(now)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let sig = hex::encode(sha256(
        "twitch-secret-0123",
        &cat(&[b"msg-1", at.as_bytes(), body]),
    ));
    let reply = client
        .post(url("twitch-eventsub"))
        .header("content-type", "application/json")
        .header("twitch-eventsub-message-id", "msg-1")
        .header("twitch-eventsub-message-timestamp", &at)
        .header(
            "twitch-eventsub-message-type",
            "webhook_callback_verification",
        )
        .header("twitch-eventsub-message-signature", format!("sha256={sig}"))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    assert_eq!(
        text(reply).await,
        (200, "pogchamp-kappa-360noscope-vohiyo".into())
    );

    let reply = client
        .get(url("x-activity?crc_token=crc-123"))
        .send()
        .await
        .unwrap();
    let token = b64(&sha256("x-consumer-secret", b"crc-123"));
    let (code, answer) = text(reply).await;
    assert_eq!(code, 200, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).unwrap(),
        json!({"response_token": format!("sha256={token}")})
    );

    let reply = client
        .get(url("dropbox?challenge=dbx-challenge"))
        .send()
        .await
        .unwrap();
    assert_eq!(text(reply).await, (200, "dbx-challenge".into()));

    // Graph posts its validation to the notificationUrl, the preset's token in its query.
    let graph = "Validation: Testing client application reachability for subscription Request-Id: 522a8e7e-096a-494c-aaf1-ac0dcfca45b7";
    let reply = client
        .post(url(&format!(
            "msgraph?token=graph-token-0123456789&validationToken={}",
            percent_encoding::utf8_percent_encode(graph, percent_encoding::NON_ALPHANUMERIC)
        )))
        .header("content-type", "text/plain")
        .send()
        .await
        .unwrap();
    assert_eq!(text(reply).await, (200, graph.into()));

    let reply = client
        .get(url("okta-event-hooks"))
        .header("authorization", "okta-token-0123456789")
        .header("x-okta-verification-challenge", "okta-challenge")
        .send()
        .await
        .unwrap();
    assert_eq!(
        text(reply).await,
        (200, r#"{"verification":"okta-challenge"}"#.into())
    );
    let reply = client
        .get(url("okta-event-hooks"))
        .header("authorization", "not-the-token")
        .header("x-okta-verification-challenge", "okta-challenge")
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 401);

    // Nothing of it is an event.
    let events = server.get("/v1/events").await;
    assert_eq!(events.body["items"], json!([]), "{events:?}");
}
