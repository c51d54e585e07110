//! The public-key and Twilio schemes end to end (docs/configuration.md, "Public keys and
//! Twilio"): Discord-shaped interactions signed with Ed25519, SendGrid-shaped event
//! batches signed with ECDSA P-256, Twilio form and JSON requests signed with
//! HMAC-SHA1 over the URL. Signatures are computed here with the primitives
//! (ed25519-dalek, ring, hmac), not with inhook's signers.

use base64::Engine;
use ed25519_dalek::{Signer, SigningKey};
use hmac::{Hmac, Mac};
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use serde_json::json;
use sha2::Digest;

use crate::support::{now_s, Reply, TestServer};

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::STANDARD;

/// The DER prefix of a P-256 SubjectPublicKeyInfo, before the 65-byte point.
const SPKI_PREFIX: &str = "3059301306072a8648ce3d020106082a8648ce3d030107034200";

fn discord_key(n: u8) -> SigningKey {
    SigningKey::from_bytes(&[n; 32])
}

fn discord_public(n: u8) -> String {
    hex::encode(discord_key(n).verifying_key().as_bytes())
}

/// A P-256 key pair: (PKCS#8 to sign with, base64 SPKI as SendGrid shows it).
fn sendgrid_key() -> (EcdsaKeyPair, String) {
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let mut spki = hex::decode(SPKI_PREFIX).unwrap();
    spki.extend_from_slice(pair.public_key().as_ref());
    (pair, B64.encode(spki))
}

fn sources(discord: &str, sendgrid: &str) -> String {
    format!(
        r#"
[[sources]]
name = "discord"
kind = "json"
mode = "sync"
signature = "ed25519"
signature_header = "X-Signature-Ed25519"
signed_content = "{{timestamp}}{{body}}"
timestamp = "header:X-Signature-Timestamp"
public_keys = {discord}
event_id = "/id"
ordering = "unordered"

[[sources]]
name = "sendgrid"
kind = "json"
mode = "sync"
signature = "ecdsa-p256"
signature_header = "X-Twilio-Email-Event-Webhook-Signature"
signed_content = "{{timestamp}}{{body}}"
timestamp = "header:X-Twilio-Email-Event-Webhook-Timestamp"
public_keys = {sendgrid}
event_id = "/0/sg_event_id"
ordering = "unordered"

[[sources]]
name = "twilio"
kind = "json"
mode = "sync"
signature = "twilio"
public_url = "https://hooks.example.com"
body_format = "form"
secrets = ["twilio-old-token", "twilio-new-token"]
event_id = "/MessageSid"
ordering = "unordered"

[[sources]]
name = "twilio-json"
kind = "json"
mode = "sync"
signature = "twilio"
public_url = "https://hooks.example.com/"
secrets = ["twilio-token"]
event_id = "/sid"
ordering = "unordered"
"#
    )
}

fn discord_signed(key: &SigningKey, ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let mut message = ts.to_string().into_bytes();
    message.extend_from_slice(body);
    vec![
        (
            "x-signature-ed25519",
            hex::encode(key.sign(&message).to_bytes()),
        ),
        ("x-signature-timestamp", ts.to_string()),
        ("content-type", "application/json".into()),
    ]
}

fn sendgrid_signed(key: &EcdsaKeyPair, ts: i64, body: &[u8]) -> Vec<(&'static str, String)> {
    let mut message = ts.to_string().into_bytes();
    message.extend_from_slice(body);
    let sig = key
        .sign(&ring::rand::SystemRandom::new(), &message)
        .unwrap();
    vec![
        (
            "x-twilio-email-event-webhook-signature",
            B64.encode(sig.as_ref()),
        ),
        ("x-twilio-email-event-webhook-timestamp", ts.to_string()),
        ("content-type", "application/json".into()),
    ]
}

fn twilio_signature(token: &str, url: &str, params: &[(&str, &str)]) -> String {
    let mut sorted = params.to_vec();
    sorted.sort();
    let mut message = url.to_owned();
    for (name, value) in sorted {
        message += name;
        message += value;
    }
    let mut mac = Hmac::<sha1::Sha1>::new_from_slice(token.as_bytes()).unwrap();
    mac.update(message.as_bytes());
    B64.encode(mac.finalize().into_bytes())
}

fn discord_body(id: &str, command: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "id": id, "application_id": "775799577604522054", "type": 2,
        "token": "interaction-token", "version": 1,
        "data": {"id": "771825006014889984", "name": command, "type": 1},
        "guild_id": "290926798626357999",
        "member": {"user": {"id": "53908232506183680", "username": "Mason"}}
    }))
    .unwrap()
}

fn sendgrid_body(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!([{
        "email": "example@test.com", "timestamp": 1513299569, "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
        "event": "delivered", "category": "cat facts", "sg_event_id": id,
        "sg_message_id": "14c5d75ce93.dfd.64b469.filter0001.16648.5515E0B88.0",
        "response": "250 OK"
    }]))
    .unwrap()
}

async fn post(server: &TestServer, source: &str, body: &[u8], headers: &[(&str, String)]) -> Reply {
    server.post_raw(source, body, headers).await
}

#[tokio::test]
async fn discord_ed25519_accepts_any_listed_key_and_refuses_tampering() {
    let (_, sendgrid_public) = sendgrid_key();
    let keys = format!(r#"["{}", "{}"]"#, discord_public(1), discord_public(2));
    let server = TestServer::in_process()
        .spawn_with_sources(&sources(&keys, &format!(r#"["{sendgrid_public}"]"#)))
        .await;
    let now = now_s();
    let body = discord_body("i-1", "ping");
    let reply = post(
        &server,
        "discord",
        &body,
        &discord_signed(&discord_key(1), now, &body),
    )
    .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // Rotation: the second listed key verifies too.
    let body2 = discord_body("i-2", "ping");
    let reply = post(
        &server,
        "discord",
        &body2,
        &discord_signed(&discord_key(2), now, &body2),
    )
    .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // A key not listed, a tampered body, another timestamp: 401 invalid_signature.
    let body3 = discord_body("i-3", "ping");
    let unlisted = discord_signed(&discord_key(3), now, &body3);
    let signed = discord_signed(&discord_key(1), now, &body3);
    let tampered = discord_body("i-3", "pong");
    let mut moved = signed.clone();
    moved[1].1 = (now + 1).to_string();
    for (body, headers) in [(&body3, &unlisted), (&tampered, &signed), (&body3, &moved)] {
        let reply = post(&server, "discord", body, headers).await;
        assert_eq!(
            (reply.code, &reply.body["error"]),
            (401, &json!("invalid_signature")),
            "{reply:?}"
        );
    }
    // Signed long ago: the signature verifies, the time does not.
    let old = discord_signed(&discord_key(1), now - 3600, &body3);
    let reply = post(&server, "discord", &body3, &old).await;
    assert_eq!(
        reply.body["error"], "timestamp_out_of_tolerance",
        "{reply:?}"
    );
    // Missing signature header: 401 missing_signature; verify names the header.
    let reply = post(&server, "discord", &body3, &signed[1..]).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("missing_signature")),
        "{reply:?}"
    );
    let headers = server.dir().join("headers.txt");
    let body_file = server.dir().join("body.json");
    std::fs::write(&headers, format!("X-Signature-Timestamp: {now}\n")).unwrap();
    std::fs::write(&body_file, &body3).unwrap();
    let (h, b) = (headers.to_str().unwrap(), body_file.to_str().unwrap());
    let (ok, out) = server.cli(&["verify", "--source", "discord", "--headers", h, b]);
    assert!(!ok);
    assert!(out.contains("x-signature-ed25519 is missing"), "{out}");
    // A good signature is explained with the key that matched; a bad one in the
    // source's terms, never echoing the signature.
    let good: String = discord_signed(&discord_key(2), now, &body3)
        .iter()
        .map(|(n, v)| format!("{n}: {v}\n"))
        .collect();
    std::fs::write(&headers, &good).unwrap();
    let (ok, out) = server.cli(&["verify", "--source", "discord", "--headers", h, b]);
    assert!(ok, "{out}");
    assert!(out.contains("public key #1 of 2 matched"), "{out}");
    std::fs::write(&body_file, &tampered).unwrap();
    let (ok, out) = server.cli(&["verify", "--source", "discord", "--headers", h, b]);
    assert!(!ok);
    assert!(
        out.contains("none of the 2 configured public keys") && out.contains("{timestamp}{body}"),
        "{out}"
    );
    assert!(!out.contains(&good[25..60]), "{out}");
}

#[tokio::test]
async fn sendgrid_ecdsa_p256_accepts_any_listed_key_and_refuses_tampering() {
    let (old, old_public) = sendgrid_key();
    let (new, new_public) = sendgrid_key();
    let (unlisted, _) = sendgrid_key();
    let keys = format!(
        r#"["{old_public}", """-----BEGIN PUBLIC KEY-----
{}
{}
-----END PUBLIC KEY-----"""]"#,
        &new_public[..64],
        &new_public[64..]
    );
    let server = TestServer::in_process()
        .spawn_with_sources(&sources(&format!(r#"["{}"]"#, discord_public(1)), &keys))
        .await;
    let now = now_s();
    let body = sendgrid_body("sg-1");
    let reply = post(
        &server,
        "sendgrid",
        &body,
        &sendgrid_signed(&old, now, &body),
    )
    .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // Rotation: the second key, listed as a PEM block, verifies too.
    let body2 = sendgrid_body("sg-2");
    let reply = post(
        &server,
        "sendgrid",
        &body2,
        &sendgrid_signed(&new, now, &body2),
    )
    .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    let body3 = sendgrid_body("sg-3");
    let signed = sendgrid_signed(&old, now, &body3);
    for (body, headers) in [
        (sendgrid_body("sg-4"), signed.clone()),
        (body3.clone(), sendgrid_signed(&unlisted, now, &body3)),
    ] {
        let reply = post(&server, "sendgrid", &body, &headers).await;
        assert_eq!(
            (reply.code, &reply.body["error"]),
            (401, &json!("invalid_signature")),
            "{reply:?}"
        );
    }
    let reply = post(&server, "sendgrid", &body3, &signed[1..]).await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("missing_signature")),
        "{reply:?}"
    );
}

#[tokio::test]
async fn public_keys_from_the_environment_replace_the_files() {
    let (_, sendgrid_public) = sendgrid_key();
    let server = TestServer::spawn_with_sources_env(
        &sources(
            &format!(r#"["{}"]"#, discord_public(1)),
            &format!(r#"["{sendgrid_public}"]"#),
        ),
        &[(
            "INHOOK_DISCORD_PUBLIC_KEYS",
            &format!("{} , {}", discord_public(4), discord_public(5)),
        )],
    )
    .await;
    let now = now_s();
    for (n, id, code) in [(5, "e-1", 200), (4, "e-2", 200), (1, "e-3", 401)] {
        let body = discord_body(id, "ping");
        let reply = post(
            &server,
            "discord",
            &body,
            &discord_signed(&discord_key(n), now, &body),
        )
        .await;
        assert_eq!(reply.code, code, "key {n}: {reply:?}");
    }
}

#[test]
fn a_bad_public_key_refuses_the_start_naming_source_key_and_entry() {
    let (_, sendgrid_public) = sendgrid_key();
    let good = discord_public(1);
    let cases = [
        // Ed25519: 31 bytes; not hex nor base64; 33 bytes.
        ("discord", format!(r#"["{good}", "{}"]"#, &good[2..]), "#1"),
        ("discord", r#"["not a key!"]"#.to_owned(), "#0"),
        ("discord", format!(r#"["{}"]"#, "ab".repeat(33)), "#0"),
        // P-256: an Ed25519 key, a truncated SPKI.
        (
            "sendgrid",
            format!(r#"["{sendgrid_public}", "{good}"]"#),
            "#1",
        ),
        (
            "sendgrid",
            format!(r#"["{}"]"#, &sendgrid_public[..60]),
            "#0",
        ),
    ];
    for (source, keys, entry) in cases {
        let (discord, sendgrid) = match source {
            "discord" => (keys.clone(), format!(r#"["{sendgrid_public}"]"#)),
            _ => (format!(r#"["{good}"]"#), keys.clone()),
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("inhook.toml");
        let config = format!(
            "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\n{}",
            dir.path().join("inhook.db").display(),
            sources(&discord, &sendgrid)
        );
        std::fs::write(&path, config).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_inhook"))
            .args(["serve", "--config"])
            .arg(&path)
            .env("INHOOK_TWILIO_SECRET", "t")
            .output()
            .unwrap();
        assert!(!output.status.success(), "{keys} started");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(&format!("source \"{source}\": public_keys: entry {entry}")),
            "{keys}: {stderr}"
        );
    }
    // twilio without public_url does not start either.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("inhook.toml");
    std::fs::write(
        &path,
        format!(
            "listen = \"127.0.0.1:0\"\ndatabase = \"sqlite://{}\"\n[[sources]]\nname = \"t\"\nkind = \"json\"\nsignature = \"twilio\"\nsecrets = [\"x\"]\nevent_id = \"/id\"\nordering = \"unordered\"\n",
            dir.path().join("inhook.db").display()
        ),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_inhook"))
        .args(["serve", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("source \"t\": public_url is required for signature = \"twilio\""),
        "{stderr}"
    );
}

#[tokio::test]
async fn twilio_signs_the_url_and_sorted_form_parameters_or_the_body_hash() {
    let (_, sendgrid_public) = sendgrid_key();
    let server = TestServer::in_process()
        .spawn_with_sources(&sources(
            &format!(r#"["{}"]"#, discord_public(1)),
            &format!(r#"["{sendgrid_public}"]"#),
        ))
        .await;
    let params = [
        ("ToCountry", "US"),
        ("SmsMessageSid", "SM1"),
        ("Body", "Hello world+more & €"),
        ("From", "+14158675309"),
        ("To", "+18005551212"),
        ("MessageSid", "SM1"),
        ("AccountSid", "AC0123"),
    ];
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(params)
        .finish();
    let url = "https://hooks.example.com/webhooks/twilio";
    let form = |sig: String| {
        vec![
            ("x-twilio-signature", sig),
            (
                "content-type",
                "application/x-www-form-urlencoded".to_owned(),
            ),
        ]
    };
    let reply = post(
        &server,
        "twilio",
        body.as_bytes(),
        &form(twilio_signature("twilio-old-token", url, &params)),
    )
    .await;
    assert_eq!(reply.code, 200, "{reply:?}");
    // Rotation: the second auth token; a redelivery of the same body is a duplicate.
    let reply = post(
        &server,
        "twilio",
        body.as_bytes(),
        &form(twilio_signature("twilio-new-token", url, &params)),
    )
    .await;
    assert_eq!(
        (reply.code, &reply.body["status"]),
        (200, &json!("duplicate")),
        "{reply:?}"
    );
    // A changed parameter, a signature for another URL, another token: refused.
    let tampered = body.replace("Hello", "Jello");
    for (body, sig) in [
        (
            tampered.as_str(),
            twilio_signature("twilio-old-token", url, &params),
        ),
        (
            body.as_str(),
            twilio_signature(
                "twilio-old-token",
                "https://hooks.example.com/other",
                &params,
            ),
        ),
        (body.as_str(), twilio_signature("other", url, &params)),
    ] {
        let reply = post(&server, "twilio", body.as_bytes(), &form(sig)).await;
        assert_eq!(
            (reply.code, &reply.body["error"]),
            (401, &json!("invalid_signature")),
            "{reply:?}"
        );
    }
    let reply = post(
        &server,
        "twilio",
        body.as_bytes(),
        &form(String::new())[1..],
    )
    .await;
    assert_eq!(
        (reply.code, &reply.body["error"]),
        (401, &json!("missing_signature")),
        "{reply:?}"
    );

    // JSON: bodySHA256 in the query carries the body's hash, the signature the URL.
    let json_body = br#"{"sid":"EV1","type":"com.twilio.messaging.message.delivered"}"#;
    let hash = hex::encode(sha2::Sha256::digest(json_body));
    let query = format!("?bodySHA256={hash}");
    let signed_url = format!("https://hooks.example.com/webhooks/twilio-json{query}");
    let client = reqwest::Client::new();
    let send = |body: &'static [u8], sig: String| {
        client
            .post(format!("{}/webhooks/twilio-json{query}", server.url))
            .header("content-type", "application/json")
            .header("x-twilio-signature", sig)
            .body(body.to_vec())
            .send()
    };
    let good = twilio_signature("twilio-token", &signed_url, &[]);
    assert_eq!(
        send(json_body, good.clone())
            .await
            .unwrap()
            .status()
            .as_u16(),
        200
    );
    let other = br#"{"sid":"EV2","type":"com.twilio.messaging.message.delivered"}"#;
    assert_eq!(send(other, good).await.unwrap().status().as_u16(), 401);
}

#[tokio::test]
async fn send_signs_for_each_scheme_and_keygen_makes_usable_pairs() {
    let (ok, out) = crate::support::run_cli(
        &["keygen".as_ref(), "--scheme".as_ref(), "ed25519".as_ref()],
        &[],
    );
    assert!(ok, "{out}");
    let line = |prefix: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap()
            .trim()
            .to_owned()
    };
    let (ed_public, ed_private) = (line("public:"), line("private:"));
    let (ok, out) = crate::support::run_cli(
        &[
            "keygen".as_ref(),
            "--scheme".as_ref(),
            "ecdsa-p256".as_ref(),
        ],
        &[],
    );
    assert!(ok, "{out}");
    let line = |prefix: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap()
            .trim()
            .to_owned()
    };
    let (p256_public, p256_private) = (line("public:"), line("private:"));
    let server = TestServer::spawn_with_sources(&sources(
        &format!(r#"["{ed_public}"]"#),
        &format!(r#"["{p256_public}"]"#),
    ))
    .await;
    let file = server.dir().join("event.body");
    let config = server.config_path();
    let send = |source: &str, body: &[u8], key: Option<&str>| {
        std::fs::write(&file, body).unwrap();
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_inhook"));
        command
            .arg("send")
            .args(["--url", &server.url, "--source", source, "--config"])
            .arg(&config);
        if let Some(key) = key {
            command.args(["--private-key", key]);
        }
        command.arg(&file).output().unwrap()
    };
    for (source, body, key) in [
        (
            "discord",
            discord_body("s-1", "ping"),
            Some(ed_private.as_str()),
        ),
        (
            "sendgrid",
            sendgrid_body("s-2"),
            Some(p256_private.as_str()),
        ),
        ("twilio", b"MessageSid=SM9&Body=hi+there".to_vec(), None),
        ("twilio-json", br#"{"sid":"EV9"}"#.to_vec(), None),
    ] {
        let out = send(source, &body, key);
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("200 "),
            "{source}: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    // Without a private key, send says which flag it needs.
    let out = send("discord", &discord_body("s-3", "ping"), None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--private-key"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn the_official_libraries_sign_what_inhook_accepts() {
    use crate::support::{official, vectors_available, ToSign};
    use inhook::ingress::signature::Scheme;
    if !vectors_available() {
        return;
    }
    let seed = hex::encode([7u8; 32]);
    let rng = ring::rand::SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, &rng).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let mut spki = hex::decode(SPKI_PREFIX).unwrap();
    spki.extend_from_slice(pair.public_key().as_ref());
    let discord_keys = format!(r#"["{}"]"#, discord_public(7));
    let sendgrid_keys = format!(r#"["{}"]"#, B64.encode(spki));
    // The same publishers as presets (docs/providers.md): what the libraries sign, the
    // preset sources accept too.
    let presets = format!(
        r#"
[[sources]]
name = "discord-interactions"
preset = "discord-interactions"
public_keys = {discord_keys}

[[sources]]
name = "sendgrid-events"
preset = "sendgrid-events"
mode = "sync"
public_keys = {sendgrid_keys}

[[sources]]
name = "twilio-preset"
preset = "twilio"
mode = "sync"
public_url = "https://hooks.example.com"
secrets = ["twilio-new-token"]
"#
    );
    let server = TestServer::in_process()
        .spawn_with_sources(&(sources(&discord_keys, &sendgrid_keys) + &presets))
        .await;
    let now = now_s();
    let discord = String::from_utf8(discord_body("o-1", "ping")).unwrap();
    let sendgrid = String::from_utf8(sendgrid_body("o-2")).unwrap();
    let form = "MessageSid=SM77&Body=caf%C3%A9+%26+more&To=%2B18005551212&From=%2B14158675309";
    let json_body = r#"{"sid":"EV77"}"#;
    let private = B64.encode(pkcs8.as_ref());
    let signed = official(&[
        ToSign {
            scheme: Scheme::Ed25519,
            secret: &seed,
            body: &discord,
            timestamp: now,
            id: "",
        },
        ToSign {
            scheme: Scheme::EcdsaP256,
            secret: &private,
            body: &sendgrid,
            timestamp: now,
            id: "",
        },
        ToSign {
            scheme: Scheme::Twilio,
            secret: "twilio-new-token",
            body: form,
            timestamp: now,
            id: "https://hooks.example.com/webhooks/twilio",
        },
        ToSign {
            scheme: Scheme::Twilio,
            secret: "twilio-token",
            body: json_body,
            timestamp: now,
            id: "https://hooks.example.com/webhooks/twilio-json",
        },
        ToSign {
            scheme: Scheme::Twilio,
            secret: "twilio-new-token",
            body: form,
            timestamp: now,
            id: "https://hooks.example.com/webhooks/twilio-preset",
        },
    ]);
    let headers = |i: usize, content_type: &str| -> Vec<(&str, String)> {
        let mut h: Vec<(&str, String)> = signed[i]
            .iter()
            .map(|(n, v)| (n.as_str(), v.clone()))
            .collect();
        h.push(("content-type", content_type.to_owned()));
        h
    };
    for (i, source, body, content_type) in [
        (0, "discord", discord.as_str(), "application/json"),
        (1, "sendgrid", sendgrid.as_str(), "application/json"),
        (2, "twilio", form, "application/x-www-form-urlencoded"),
    ] {
        let reply = post(&server, source, body.as_bytes(), &headers(i, content_type)).await;
        assert_eq!(reply.code, 200, "{source}: {reply:?}");
    }
    // The presets: Discord's deferred answer, SendGrid's batch, Twilio's empty TwiML.
    let reply = post(
        &server,
        "discord-interactions",
        discord.as_bytes(),
        &headers(0, "application/json"),
    )
    .await;
    assert_eq!((reply.code, reply.body.clone()), (200, json!({"type": 5})));
    let reply = post(
        &server,
        "sendgrid-events",
        sendgrid.as_bytes(),
        &headers(1, "application/json"),
    )
    .await;
    assert_eq!(reply.code, 200, "sendgrid-events: {reply:?}");
    assert_eq!(reply.body["logged"], 1, "sendgrid-events: {reply:?}");
    // Twilio names each webhook with an unsigned idempotency token, kept on its retries.
    let mut twilio = headers(4, "application/x-www-form-urlencoded");
    twilio.push(("i-twilio-idempotency-token", "idem-77".into()));
    let reply = post(&server, "twilio-preset", form.as_bytes(), &twilio).await;
    assert_eq!(reply.code, 200, "twilio: {reply:?}");
    for (source, tampered, i, content_type) in [
        (
            "discord-interactions",
            discord.replace("ping", "pong"),
            0,
            "application/json",
        ),
        (
            "sendgrid-events",
            sendgrid.replace("delivered", "bounce"),
            1,
            "application/json",
        ),
        (
            "twilio-preset",
            form.replace("SM77", "SM78"),
            4,
            "application/x-www-form-urlencoded",
        ),
    ] {
        let reply = post(
            &server,
            source,
            tampered.as_bytes(),
            &headers(i, content_type),
        )
        .await;
        assert_eq!(reply.code, 401, "{source} tampered: {reply:?}");
    }
    let logged = server.get("/v1/events?source=twilio-preset").await;
    assert_eq!(logged.body["items"][0]["status"], "processed", "{logged:?}");
    let hash = hex::encode(sha2::Sha256::digest(json_body.as_bytes()));
    let reply = reqwest::Client::new()
        .post(format!(
            "{}/webhooks/twilio-json?bodySHA256={hash}",
            server.url
        ))
        .header("content-type", "application/json")
        .header("x-twilio-signature", &signed[3][0].1)
        .body(json_body)
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200);
}
