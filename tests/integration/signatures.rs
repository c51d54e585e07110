//! Every signature scheme over real HTTP, against deliveries signed by each
//! publisher's official library (`tests/vectors/sign.py`, run at test time so
//! timestamps are fresh): they verify with any listed secret; tampering,
//! wrong secrets, stale or future timestamps, missing or malformed headers
//! are each a 401 with the right `error`, and store nothing.
//!
//! The signing libraries are installed by `.ci/run` (see tests/vectors). CI
//! sets `INHOOK_TEST_VECTORS=required`, so there a missing library fails the
//! suite; elsewhere these tests say so on stderr and pass without checking.

use inhook::ingress::signature::{sign, standard_webhooks, Scheme, Secret};
use serde_json::json;

use crate::support::{
    now_s, official, official_one, vectors_available, Headers, Reply, TestServer, ToSign,
};

/// The ed25519 seed of the Standard Webhooks source's `v1a` key pair.
const SW_SEED: [u8; 32] = *b"inhook-test-ed25519-seed-32bytes";

/// A source under test: its name, scheme and two secrets (old, new) for rotation.
struct Case {
    source: &'static str,
    scheme: Scheme,
    secrets: [&'static str; 2],
}

const CASES: [Case; 5] = [
    Case {
        source: "sw",
        scheme: Scheme::StandardWebhooks,
        secrets: [
            "whsec_c3RhbmRhcmQtd2ViaG9va3Mtb2xkLXNlY3JldA==",
            "whsec_c3RhbmRhcmQtd2ViaG9va3MtbmV3LXNlY3JldA==",
        ],
    },
    Case {
        source: "gh",
        scheme: Scheme::Github,
        secrets: ["gh-old-secret", "gh-new-secret"],
    },
    Case {
        source: "stripe",
        scheme: Scheme::Stripe,
        secrets: ["whsec_stripe_old_secret", "whsec_stripe_new_secret"],
    },
    Case {
        source: "slack",
        scheme: Scheme::Slack,
        secrets: ["slack-old-signing-secret", "slack-new-signing-secret"],
    },
    Case {
        source: "shopify",
        scheme: Scheme::Shopify,
        secrets: ["shopify-old-client-secret", "shopify-new-client-secret"],
    },
];

fn sw_keypair() -> (String, String) {
    standard_webhooks::format_keypair(&SW_SEED)
}

/// The `[[sources]]` tables of every case; the Standard Webhooks source also
/// lists the `whpk_` public key, so it accepts `v1a` signatures too.
fn sources_toml() -> String {
    let mut toml = String::new();
    for case in &CASES {
        let mut secrets: Vec<String> = case.secrets.iter().map(|s| format!("{s:?}")).collect();
        if case.scheme == Scheme::StandardWebhooks {
            secrets.push(format!("{:?}", sw_keypair().0));
        }
        toml += &format!(
            "\n[[sources]]\nname = \"{}\"\nkind = \"presence\"\nmode = \"sync\"\nsignature = \"{}\"\ntolerance_s = 300\nsecrets = [{}]\n",
            case.source,
            case.scheme,
            secrets.join(", ")
        );
    }
    toml
}

fn presence(event_id: &str, user: &str, sequence: i64) -> String {
    json!({"event_id": event_id, "user_id": user, "presence": "ONLINE", "sequence_number": sequence})
        .to_string()
}

fn with_header(headers: &Headers, name: &str, value: Option<&str>) -> Headers {
    let mut out: Headers = headers.iter().filter(|(k, _)| k != name).cloned().collect();
    if let Some(value) = value {
        out.push((name.to_owned(), value.to_owned()));
    }
    out
}

#[tokio::test]
async fn official_signatures_verify_with_every_listed_secret() {
    if !vectors_available() {
        return;
    }
    let server = TestServer::in_process()
        .spawn_with_sources(&sources_toml())
        .await;
    let now = now_s();
    let private = sw_keypair().1;
    let mut sent = 0;
    for case in &CASES {
        let mut keys: Vec<&str> = case.secrets.to_vec();
        if case.scheme == Scheme::StandardWebhooks {
            keys.push(&private);
        }
        for (i, secret) in keys.iter().enumerate() {
            let user = format!("usr_{}_{i}", case.source);
            let body = presence(&format!("evt_{}_{i}", case.source), &user, 1);
            let headers = official_one(case.scheme, secret, &body, now, &format!("msg_{user}"));
            let reply = server.post_headers(case.source, &body, &headers).await;
            assert_eq!(
                (reply.code, &reply.body["status"]),
                (200, &json!("applied")),
                "{} signed by its official library with secret #{i}: {:?}",
                case.scheme,
                reply.body
            );
            sent += 1;
        }
    }
    // Standard Webhooks: several signatures in one header, unknown versions ignored.
    let body = presence("evt_sw_multi", "usr_sw_multi", 1);
    let headers = official_one(
        CASES[0].scheme,
        CASES[0].secrets[0],
        &body,
        now,
        "msg_multi",
    );
    let good = headers
        .iter()
        .find(|(k, _)| k == "webhook-signature")
        .unwrap()
        .1
        .clone();
    let crowded =
        format!("v2,c29tZXRoaW5nIGVsc2U= v1,Ceo5qEr07ixe2NLpvHk3FH9bwy/WavXrAFQ/9tdO6mc= {good}");
    let reply = server
        .post_headers(
            "sw",
            &body,
            &with_header(&headers, "webhook-signature", Some(&crowded)),
        )
        .await;
    assert_eq!(reply.code, 200, "{:?}", reply.body);
    sent += 1;
    assert_eq!(server.count().await, sent);
}

#[tokio::test]
async fn bad_deliveries_of_every_scheme_are_401_with_the_reason_and_store_nothing() {
    if !vectors_available() {
        return;
    }
    let server = TestServer::spawn_with_sources(&sources_toml()).await;
    let now = now_s();
    let private = sw_keypair().1;
    let other_private = standard_webhooks::format_keypair(&[9; 32]).1;
    let mut signers: Vec<(&Case, &str, String)> = CASES
        .iter()
        .map(|c| {
            let wrong = match c.scheme {
                Scheme::StandardWebhooks => "whsec_bm90LXRoZS1zZWNyZXQ=".to_owned(),
                _ => "not-the-secret".to_owned(),
            };
            (c, c.secrets[1], wrong)
        })
        .collect();
    signers.push((&CASES[0], &private, other_private));
    for (i, (case, secret, wrong)) in signers.iter().enumerate() {
        let scheme = case.scheme;
        let what = format!("{scheme} ({})", &secret[..5]);
        let body = presence("evt_bad", "usr_bad", 5);
        let mut to_sign = vec![
            ToSign {
                scheme,
                secret,
                body: &body,
                timestamp: now,
                id: "msg_bad",
            },
            ToSign {
                scheme,
                secret: wrong,
                body: &body,
                timestamp: now,
                id: "msg_bad",
            },
        ];
        if scheme.is_timestamped() {
            to_sign.push(ToSign {
                scheme,
                secret,
                body: &body,
                timestamp: now - 600,
                id: "msg_bad",
            });
            to_sign.push(ToSign {
                scheme,
                secret,
                body: &body,
                timestamp: now + 600,
                id: "msg_bad",
            });
        }
        let signed = official(&to_sign);
        let good = &signed[0];
        let expect = |reply: Reply, error: &str, how: &str| {
            assert_eq!(
                (reply.code, &reply.body),
                (401, &json!({"status": "rejected", "error": error})),
                "{what}: {how}"
            );
        };

        let tampered = presence("evt_bad", "usr_bad", 6);
        expect(
            server.post_headers(case.source, &tampered, good).await,
            "invalid_signature",
            "tampered body",
        );
        expect(
            server.post_headers(case.source, &body, &signed[1]).await,
            "invalid_signature",
            "wrong secret",
        );
        if scheme.is_timestamped() {
            expect(
                server.post_headers(case.source, &body, &signed[2]).await,
                "timestamp_out_of_tolerance",
                "stale",
            );
            expect(
                server.post_headers(case.source, &body, &signed[3]).await,
                "timestamp_out_of_tolerance",
                "future",
            );
        }
        for (header, _) in scheme.required_headers() {
            let missing = with_header(good, header, None);
            expect(
                server.post_headers(case.source, &body, &missing).await,
                "missing_signature",
                &format!("no {header}"),
            );
            // `webhook-id` is free text, but signed: another id is another signature.
            let garbled = with_header(good, header, Some("v9 garbage=="));
            expect(
                server.post_headers(case.source, &body, &garbled).await,
                "invalid_signature",
                &format!("malformed {header}"),
            );
        }
        // And the untouched delivery would have verified (guards against a test that rejects everything).
        let fresh = presence(&format!("evt_ok_{i}"), &format!("usr_ok_{i}"), 5);
        let ok = official_one(scheme, secret, &fresh, now, "msg_ok");
        assert_eq!(
            server.post_headers(case.source, &fresh, &ok).await.code,
            200,
            "{what}"
        );
    }
    let logged = server.logged().await;
    assert_eq!(
        logged.len(),
        signers.len(),
        "only the control deliveries are stored: {:?}",
        logged
            .iter()
            .map(|e| (&e.source, &e.event_id))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn delivery_ids_deduplicate_bodies_without_an_event_id() {
    if !vectors_available() {
        return;
    }
    let server = TestServer::spawn_with_sources(&sources_toml()).await;
    let now = now_s();
    let body = json!({"user_id": "usr_noid", "presence": "BUSY", "sequence_number": 1}).to_string();
    for (source, scheme, secret, id) in [
        (
            "sw",
            Scheme::StandardWebhooks,
            CASES[0].secrets[0],
            "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W",
        ),
        (
            "gh",
            Scheme::Github,
            CASES[1].secrets[0],
            "72d3162e-cc78-11e3-81ab-4c9367dc0958",
        ),
    ] {
        let first = official_one(scheme, secret, &body, now, id);
        let reply = server.post_headers(source, &body, &first).await;
        assert_eq!(reply.code, 200, "{scheme}: {:?}", reply.body);
        // The publisher's retry: same id, signed again a second later.
        let retry = official_one(scheme, secret, &body, now + 1, id);
        let reply = server.post_headers(source, &body, &retry).await;
        assert_eq!(
            (reply.code, &reply.body["status"], &reply.body["event_id"]),
            (200, &json!("duplicate"), &json!(id)),
            "{scheme}"
        );
        let logged = server.logged().await;
        assert!(
            logged
                .iter()
                .any(|e| e.source == source && e.event_id == id),
            "{scheme}"
        );
    }
    assert_eq!(server.count().await, 2);

    // The body's own event_id wins over the header's.
    let own = presence("evt_in_body", "usr_own", 1);
    let headers = official_one(
        Scheme::StandardWebhooks,
        CASES[0].secrets[0],
        &own,
        now,
        "msg_header",
    );
    assert_eq!(server.post_headers("sw", &own, &headers).await.code, 200);
    assert!(server
        .logged()
        .await
        .iter()
        .any(|e| e.event_id == "evt_in_body"));

    // A scheme without a delivery id keeps the 400 for a missing event_id.
    let headers = official_one(Scheme::Stripe, CASES[2].secrets[0], &body, now, "");
    let reply = server.post_headers("stripe", &body, &headers).await;
    assert_eq!(reply.code, 400, "{:?}", reply.body);
    assert_eq!(reply.body["details"][0]["field"], "event_id");
    assert_eq!(server.count().await, 3);
}

#[tokio::test]
async fn a_delivery_id_event_is_applied() {
    if !vectors_available() {
        return;
    }
    let server = TestServer::in_process()
        .spawn_with_sources(&sources_toml())
        .await;
    let body = json!({"user_id": "usr_hdr", "presence": "BUSY", "sequence_number": 4}).to_string();
    let headers = official_one(
        Scheme::StandardWebhooks,
        CASES[0].secrets[1],
        &body,
        now_s(),
        "msg_applied",
    );
    let reply = server.post_headers("sw", &body, &headers).await;
    assert_eq!(
        (reply.code, &reply.body["status"]),
        (200, &json!("applied")),
        "{:?}",
        reply.body
    );
    let state = server.get("/v1/presence/usr_hdr?source=sw").await;
    assert_eq!(state.body["status"], "BUSY", "{:?}", state.body);
}

#[tokio::test]
async fn the_verify_command_explains_officially_signed_deliveries() {
    if !vectors_available() {
        return;
    }
    let server = TestServer::in_process()
        .spawn_with_sources(&sources_toml())
        .await;
    let dir = server.dir();
    let body = presence("evt_cli", "usr_cli", 1);
    let then = now_s() - 1_000;
    let headers = official_one(Scheme::Stripe, CASES[2].secrets[1], &body, then, "");
    let headers_file = dir.join("delivery.headers");
    let text: String = headers.iter().map(|(k, v)| format!("{k}: {v}\n")).collect();
    std::fs::write(
        &headers_file,
        format!("POST /webhooks/stripe HTTP/1.1\n{text}"),
    )
    .unwrap();
    let body_file = dir.join("delivery.json");
    std::fs::write(&body_file, &body).unwrap();
    let (h, b) = (headers_file.to_str().unwrap(), body_file.to_str().unwrap());
    let at = then.to_string();

    let (ok, out) = server.cli(&[
        "verify",
        "--source",
        "stripe",
        "--headers",
        h,
        "--at",
        &at,
        b,
    ]);
    assert!(ok, "{out}");
    assert!(out.contains("secret #1 of 2 matched"), "{out}");

    // Judged against now, the same delivery is too old: the skew and the tolerance are named.
    let (ok, out) = server.cli(&["verify", "--source", "stripe", "--headers", h, b]);
    assert!(
        !ok && out.contains("timestamp_out_of_tolerance") && out.contains("300s"),
        "{out}"
    );

    std::fs::write(&body_file, format!("{body}\n")).unwrap();
    let (ok, out) = server.cli(&[
        "verify",
        "--source",
        "stripe",
        "--headers",
        h,
        "--at",
        &at,
        b,
    ]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("invalid_signature") && out.contains("2 configured secrets"),
        "{out}"
    );
    assert!(out.contains("ends with a newline"), "{out}");
    for secret in CASES[2].secrets {
        assert!(!out.contains(secret), "a secret was printed: {out}");
        // What each secret would have signed over these bytes must not show either.
        let expected = sign(
            Scheme::Stripe,
            format!("{body}\n").as_bytes(),
            &Secret::new(secret),
            then,
        );
        let hex = expected[0].1.rsplit_once("v1=").unwrap().1.to_owned();
        assert!(
            !out.contains(&hex),
            "an expected signature was printed: {out}"
        );
    }

    std::fs::write(&headers_file, "content-type: application/json\n").unwrap();
    let (ok, out) = server.cli(&["verify", "--source", "stripe", "--headers", h, b]);
    assert!(
        !ok && out.contains("missing_signature") && out.contains("stripe-signature"),
        "{out}"
    );
}
