//! The configuration's checks through [`Config::from_parts`]: what each key takes, and the
//! error a user sees for what it refuses.

use super::*;
use crate::kind::SourceKind;
use crate::retry::RetryPolicy;
use crate::signature::{Scheme, Verifier};
use source::signing::handshake;
use test_env as env;

#[test]
fn sources_may_share_a_secret_variable_and_a_bad_name_is_refused() {
    let text = "[[sources]]\nname = \"a\"\nkind = \"presence\"\nsecrets_env = \"SHARED_SECRET\"\n\
                [[sources]]\nname = \"b\"\nkind = \"presence\"\nsecrets_env = \"SHARED_SECRET\"\n";
    let config = Config::from_parts(
        Some(text),
        &env(&[("SHARED_SECRET", "shared-one, shared-two")]),
    )
    .unwrap();
    for source in &config.sources {
        assert_eq!(source.secrets_var, "SHARED_SECRET");
        assert!(source.secrets_from_environment);
        assert_eq!(source.secrets.len(), 2, "{}", source.name);
    }
    let err = Config::from_parts(Some(text), &env(&[("INHOOK_A_SECRET", "not-this")]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("SHARED_SECRET"), "{err}");
    let bad = text.replace("SHARED_SECRET", "1-not a name");
    let err = Config::from_parts(Some(&bad), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("secrets_env") && err.contains("not an environment variable name"),
        "{err}"
    );
}

#[test]
fn a_top_level_key_after_a_table_names_its_own_line() {
    let text = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s3cret-value-long-enough\"]\n\nlisten = \"127.0.0.1:0\"\n";
    let err = Config::from_parts(Some(text), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("config file, line 6: unknown field `listen`"),
        "{err}"
    );
    assert!(err.contains("top-level keys go before"), "{err}");
    let first = "listen = 12\n";
    let err = Config::from_parts(Some(first), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("config file, line 1: "), "{err}");
}

#[test]
fn a_store_is_named_without_credentials() {
    assert_eq!(
        Database::Sqlite("./inhook.db".into()).to_string(),
        "sqlite:./inhook.db"
    );
    assert_eq!(
        Database::Sqlite("inhook.db".into()).to_string(),
        "sqlite:./inhook.db"
    );
    assert_eq!(
        Database::Sqlite("/var/lib/inhook/events.db".into()).to_string(),
        "sqlite:/var/lib/inhook/events.db"
    );
    let named = Database::Postgres(
        "postgres://app:hunter2-secret@db.internal:6432/events?sslmode=require".into(),
    )
    .to_string();
    assert_eq!(named, "postgres://db.internal:6432/events");
    assert!(!named.contains("hunter2") && !named.contains("app@"));
    assert_eq!(
        Database::Postgres("postgres://root@127.0.0.1/test".into()).to_string(),
        "postgres://127.0.0.1:5432/test"
    );
}

#[test]
fn batch_and_response_are_checked_at_load() {
    let source = |keys: &str| {
        format!(
            "[[sources]]\nname = \"sg\"\nkind = \"json\"\nsignature = \"github\"\nsecrets = [\"s\"]\nordering = \"unordered\"\n{keys}\n"
        )
    };
    let load = |keys: &str| Config::from_parts(Some(&source(keys)), &env(&[]));
    let config = load("batch = true\nevent_id = \"/sg_event_id\"").unwrap();
    assert_eq!(
        config.sources[0].batch,
        Some(crate::kind::json::batch::DEFAULT_MAX_EVENTS)
    );
    let config = load("batch = true\nbatch_max_events = 7\nevent_id = \"body\"").unwrap();
    assert_eq!(config.sources[0].batch, Some(7));
    assert_eq!(load("event_id = \"/id\"").unwrap().sources[0].batch, None);
    for (keys, named) in [
        ("batch = true", "batch needs event_id"),
        (
            "batch = true\nevent_id = \"/id\"\nbody_format = \"form\"",
            "body_format",
        ),
        (
            "batch_max_events = 3\nevent_id = \"/id\"",
            "batch_max_events",
        ),
        (
            "batch = true\nbatch_max_events = 0\nevent_id = \"/id\"",
            "at least 1",
        ),
        ("event_id = \"/id\"\nresponse = { status = 301 }", "2xx"),
        (
            "event_id = \"/id\"\nresponse = { body = \"x\", code = 1 }",
            "code",
        ),
    ] {
        let err = load(keys).unwrap_err().to_string();
        assert!(
            err.contains("\"sg\"") || err.contains(named),
            "{keys}: {err}"
        );
        assert!(err.contains(named), "{keys}: {err}");
    }
    let presence =
        "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nbatch = true\n";
    let err = Config::from_parts(Some(presence), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("only for kind = \"json\""), "{err}");
    let config = load("event_id = \"/id\"\nresponse = { body = '{\"type\":5}', content_type = \"application/json\" }").unwrap();
    let response = config.sources[0].response.as_ref().unwrap();
    assert_eq!(response.body, r#"{"type":5}"#);
    assert_eq!(response.status, axum::http::StatusCode::OK);
}

#[test]
fn a_top_level_key_after_the_first_table_says_where_it_belongs() {
    let text = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nlisten = \"127.0.0.1:9\"\n";
    let err = Config::from_parts(Some(text), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown field `listen`") && err.contains("top-level keys go before"),
        "{err}"
    );
    let typo = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecretz = [\"s\"]\n";
    let err = Config::from_parts(Some(typo), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown field `secretz`") && !err.contains("top-level"),
        "{err}"
    );
}

fn preset_source(name: &str, extra: &str) -> Result<Config, ConfigError> {
    use crate::signature::public_key::{generate, Algorithm};
    let credential = match name {
        "postmark" => "secrets = [\"u:sixteen-bytes-pass\"]".to_owned(),
        "aws-sns" => "sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"]".to_owned(),
        "discord-interactions" => {
            let (public, _) = generate(Algorithm::Ed25519, [7; 32]).unwrap();
            format!("public_keys = [\"{public}\"]")
        }
        "sendgrid-events" => {
            let (public, _) = generate(Algorithm::EcdsaP256, [7; 32]).unwrap();
            format!("public_keys = [\"{public}\"]")
        }
        // A token is at least 16 bytes; a whsec_ key is base64.
        _ => "secrets = [\"whsec_c2VjcmV0LWZvci1wcmVzZXRz\"]".to_owned(),
    };
    let text = format!(
        "public_url = \"https://hooks.example.com\"\n[[sources]]\nname = \"s\"\npreset = \"{name}\"\n{credential}\n{extra}"
    );
    Config::from_parts(Some(&text), &env(&[]))
}

#[test]
fn every_preset_parses_into_a_valid_source() {
    for preset in crate::presets::Preset::all() {
        let parsed = preset_source(preset.name, "");
        let config = parsed.unwrap_or_else(|e| panic!("{}: {e}", preset.name));
        let source = config.source("s").unwrap();
        assert_eq!(source.preset.as_deref(), Some(preset.name));
        assert!(
            JsonKind::spec_of(source.kind.as_ref()).is_some(),
            "{}",
            preset.name
        );
        // Pasted as printed, no preset starts before its commented line is filled in:
        // the publisher's secret or keys, or (aws-sns, which needs no secret) its topics.
        let pasted = Config::from_parts(Some(&preset.paste().unwrap()), &env(&[]));
        let err = pasted.expect_err(preset.name).to_string();
        if source.verifier.scheme() == Scheme::AwsSns {
            assert!(err.contains("sns_topic_arns is required"), "{err}");
        }
    }
}

#[test]
fn a_preset_source_error_names_the_keys_from_the_preset() {
    // A scheme written in the source, the preset's hmac keys left over: named as the preset's.
    let err = preset_source("linear", "signature = \"github\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("signature_header") && err.contains("from preset \"linear\""),
        "{err}"
    );
    let err = preset_source("strip", "").unwrap_err().to_string();
    assert!(
        err.contains("preset \"strip\" is unknown") && err.contains("stripe"),
        "{err}"
    );
    let err = preset_source("stripe", "signature_header = \"X\"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("signature_header"), "{err}");
    assert!(!err.contains("whsec_c2VjcmV0"), "{err}");
}

#[test]
fn a_short_admin_token_is_refused_without_showing_it() {
    let secrets = [
        ("INHOOK_PRESENCE_SECRET", "a"),
        ("INHOOK_SAVE_GAME_SECRET", "b"),
    ];
    let with_token = [
        secrets[0],
        secrets[1],
        ("INHOOK_ADMIN_TOKEN", "fifteen-bytes!!"),
    ];
    for (text, vars) in [
        ("admin_token = \"a\"", env(&secrets)),
        ("", env(&with_token)),
    ] {
        let err = Config::from_parts(Some(text), &vars)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shorter than 16 bytes"), "{err}");
        assert!(!err.contains("fifteen"), "{err}");
    }
    let config = Config::from_parts(Some("admin_token = \"sixteen-bytes-ok\""), &env(&secrets));
    assert!(config.unwrap().admin.admin_token.is_some());
}

#[test]
fn a_signing_secret_comes_from_the_flag_before_the_config_and_its_absence_says_where_to_put_it() {
    // A name no test's environment sets, so INHOOK_<SOURCE>_SECRET is absent.
    let name = "signing-secret-test-source";
    let text = format!(
        "[[sources]]\nname = \"{name}\"\nkind = \"presence\"\nsignature = \"hmac-hex\"\n\
         secrets = [\"from-config\", \"older\"]\n"
    );
    let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
    let secret = |flag, config| signing_secret(name, flag, "--secret", config);
    assert_eq!(
        secret(Some("new, old"), Some(&config)).unwrap().expose(),
        b"new",
        "the first of a list signs"
    );
    assert_eq!(
        secret(None, Some(&config)).unwrap().expose(),
        b"from-config"
    );
    let err = secret(None, None).unwrap_err().to_string();
    assert!(err.contains("--secret"), "{err}");
    assert!(
        err.contains("INHOOK_SIGNING_SECRET_TEST_SOURCE_SECRET"),
        "{err}"
    );
    assert!(!err.contains("from-config"), "{err}");
}

#[test]
fn json_sources_default_to_async_and_inconsistent_ones_name_the_key() {
    let source = |keys: &str| {
        format!(
            "[[sources]]\nname = \"j\"\nkind = \"json\"\nsecrets = [\"whsec_c2VjcmV0\"]\n{keys}\n"
        )
    };
    let ok = source("signature = \"standard-webhooks\"\nordering = \"unordered\"");
    let config = Config::from_parts(Some(&ok), &env(&[])).unwrap();
    let j = config.source("j").unwrap();
    assert_eq!(
        (j.kind.source_kind(), j.mode),
        (SourceKind::Json, Mode::Async)
    );
    assert_eq!(j.kind.source_kind().label(), "json");
    for (keys, named) in [
        ("ordering = \"unordered\"", "signature is required"),
        (
            "signature = \"hmac-hex\"\nordering = \"unordered\"",
            "event_id is required",
        ),
        (
            "signature = \"github\"\nordering = \"in-order\"\naggregate = \"/a\"",
            "sequence:",
        ),
        (
            "signature = \"github\"\nordering = \"unordered\"\nstate = \"header:X\"",
            "state:",
        ),
        (
            "signature = \"github\"\nordering = \"unordered\"\nevent_types = [\"a.*\"]",
            "event_types:",
        ),
        (
            "signature = \"github\"\nordering = \"unordered\"\nevent_id = \"/a||/b\"",
            "event_id:",
        ),
        (
            "signature = \"github\"\nordering = \"unordered\"\nunwrap = \"header:X-P\"",
            "unwrap:",
        ),
        (
            "signature = \"github\"\nordering = \"unordered\"\nbody_format = \"xml\"",
            "body_format",
        ),
    ] {
        let err = Config::from_parts(Some(&source(keys)), &env(&[])).unwrap_err();
        assert!(err.to_string().contains(named), "{keys}: {err}");
    }
    let built_in = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nordering = \"unordered\"\n";
    let err = Config::from_parts(Some(built_in), &env(&[])).unwrap_err();
    assert!(
        err.to_string()
            .contains("ordering is only for kind = \"json\""),
        "{err}"
    );
    for key in ["body_format = \"form\"", "unwrap = \"/payload\""] {
        let text =
            format!("[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\n{key}\n");
        let err = Config::from_parts(Some(&text), &env(&[])).unwrap_err();
        let name = key.split(' ').next().unwrap();
        assert!(
            err.to_string()
                .contains(&format!("{name} is only for kind = \"json\"")),
            "{err}"
        );
    }
}

#[test]
fn bad_cidr_blocks_are_config_errors_naming_key_and_entry() {
    let secrets = env(&[("INHOOK_P_SECRET", "a")]);
    let source = |allow: &str| {
        format!("[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"a\"]\nallow_ips = {allow}")
    };
    let err = Config::from_parts(
        Some(&source(r#"["192.0.2.0/24", "192.0.2.0/33"]"#)),
        &secrets,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("source \"p\": allow_ips: \"192.0.2.0/33\" is not a CIDR block"),
        "{err}"
    );
    let err = Config::from_parts(Some(&source("[]")), &secrets)
        .unwrap_err()
        .to_string();
    assert!(err.contains("allow_ips is empty"), "{err}");
    let proxies = format!(
        "trusted_proxies = [\"10.0.0.1/8\"]\n{}",
        source("[\"::1\"]")
    );
    let err = Config::from_parts(Some(&proxies), &secrets)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("trusted_proxies: \"10.0.0.1/8\" has bits set past its prefix length; did you mean \"10.0.0.0/8\"?"),
        "{err}"
    );
    let config = Config::from_parts(
        Some(&format!(
            "trusted_proxies = [\"10.0.0.0/8\"]\n{}",
            source(r#"["192.0.2.0/24", "2001:db8::/32"]"#)
        )),
        &secrets,
    )
    .unwrap();
    assert!(config
        .http
        .trusted_proxies
        .contains("10.1.2.3".parse().unwrap()));
    let allowed = config.sources[0].allow_ips.as_ref().unwrap();
    assert!(allowed.contains("2001:db8::1".parse().unwrap()));
    assert!(!allowed.contains("198.51.100.1".parse().unwrap()));
}

#[test]
fn connection_and_buffer_limits_have_safe_defaults_and_are_checked() {
    let secrets = env(&[
        ("INHOOK_PRESENCE_SECRET", "a"),
        ("INHOOK_SAVE_GAME_SECRET", "b"),
    ]);
    let config = Config::from_parts(None, &secrets).unwrap();
    assert_eq!(config.http.max_connections, Http::default().max_connections);
    assert_eq!(
        config.http.max_connections_per_peer,
        Http::default().max_connections_per_peer
    );
    assert_eq!(
        config.http.max_buffered_body_bytes,
        Http::default().max_buffered_body_bytes
    );
    let big_bodies = Config::from_parts(Some("max_body_bytes = 100000000"), &secrets).unwrap();
    assert_eq!(big_bodies.http.max_buffered_body_bytes, 100_000_000);
    for text in [
        "max_body_bytes = 2000\nmax_buffered_body_bytes = 1000",
        "max_connections = 0",
        "max_connections_per_peer = 0",
    ] {
        assert!(Config::from_parts(Some(text), &secrets).is_err(), "{text}");
    }
}

#[test]
fn a_broken_config_file_never_echoes_its_secrets() {
    for text in [
        "[[sources]]\nname = \"p\"\nsecrets = \"hunter2-secret\"\n",
        "[[sources]]\nname = \"p\"\nsecrets = [\"hunter2-secret\n",
        "admin_token = hunter2-secret\n",
    ] {
        let err = Config::from_parts(Some(text), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
        assert!(err.starts_with("config file, line "), "{err}");
    }
}

#[test]
fn an_empty_admin_token_is_refused_by_name_never_by_value() {
    let secrets = [
        ("INHOOK_PRESENCE_SECRET", "a"),
        ("INHOOK_SAVE_GAME_SECRET", "b"),
    ];
    let err = Config::from_parts(Some("admin_token = \" \""), &env(&secrets)).unwrap_err();
    assert!(
        err.to_string().starts_with("admin_token is set but empty"),
        "{err}"
    );
    let mut with_empty_var = secrets.to_vec();
    with_empty_var.push(("INHOOK_ADMIN_TOKEN", ""));
    let err = Config::from_parts(
        Some("admin_token = \"file-token-value\""),
        &env(&with_empty_var),
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.starts_with("INHOOK_ADMIN_TOKEN is set but empty"),
        "{err}"
    );
    assert!(!err.contains("file-token-value"), "{err}");
    let config = Config::from_parts(None, &env(&secrets)).unwrap();
    assert!(config.admin.admin_token.is_none(), "unset is no-token mode");
}

#[test]
fn zero_config_needs_both_secrets() {
    let err = Config::from_parts(None, &env(&[("INHOOK_PRESENCE_SECRET", "a")])).unwrap_err();
    assert!(err.to_string().contains("INHOOK_SAVE_GAME_SECRET"), "{err}");
    let config = Config::from_parts(
        None,
        &env(&[
            ("INHOOK_PRESENCE_SECRET", "a"),
            ("INHOOK_SAVE_GAME_SECRET", "b, c"),
        ]),
    )
    .unwrap();
    assert_eq!(config.http.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.store.database, Database::Sqlite("inhook.db".into()));
    let save = config.source("save-game").unwrap();
    assert_eq!(
        (save.mode, save.verifier.scheme()),
        (Mode::Async, Scheme::HmacTimestamped)
    );
    assert_eq!(save.secrets, vec![Secret::new("b"), Secret::new("c")]);
    let presence = config.source("presence").unwrap();
    assert_eq!(
        (presence.mode, presence.verifier.scheme()),
        (Mode::Sync, Scheme::HmacHex)
    );
}

#[test]
fn the_environment_wins_over_the_file() {
    let text = r#"
        listen = "127.0.0.1:9000"
        [[sources]]
        name = "p"
        kind = "presence"
        secrets = ["from-file"]
    "#;
    let config = Config::from_parts(Some(text), &env(&[("INHOOK_P_SECRET", "from-env")])).unwrap();
    assert_eq!(config.http.listen.port(), 9000);
    assert_eq!(config.sources[0].secrets, vec![Secret::new("from-env")]);
    let err = Config::from_parts(Some("bogus = 1"), &env(&[])).unwrap_err();
    assert!(err.to_string().contains("bogus"), "{err}");
}

#[test]
fn kept_headers_merge_the_top_level_and_the_source_lists_and_refuse_credentials() {
    let text = r#"
        keep_headers = ["X-Tenant"]
        [[sources]]
        name = "p"
        kind = "presence"
        secrets = ["s"]
        keep_headers = ["x-region", "x-tenant"]
    "#;
    let config = Config::from_parts(Some(text), &env(&[])).unwrap();
    assert_eq!(config.http.keep_headers, ["x-tenant"]);
    assert_eq!(config.sources[0].keep_headers, ["x-tenant", "x-region"]);
    for bad in ["X-Hub-Signature-256", "authorization", "not a header"] {
        let text = format!(
            "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\nkeep_headers = [\"{bad}\"]\n"
        );
        let err = Config::from_parts(Some(&text), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("keep_headers"), "{err}");
    }
}

#[test]
fn every_scheme_is_configurable_and_bad_keys_fail_at_start() {
    for scheme in crate::signature::Scheme::ALL {
        let text = format!(
            "[[sources]]\nname = \"s\"\nkind = \"presence\"\nsignature = \"{scheme}\"\nsecrets = [\"whsec_c2VjcmV0\"]\n"
        );
        let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
        assert_eq!(config.sources[0].verifier.scheme(), scheme);
    }
    let text = r#"
        [[sources]]
        name = "sw"
        kind = "presence"
        signature = "standard-webhooks"
        secrets = ["whsec_c2VjcmV0", "whpk_not-base64!"]
    "#;
    let err = Config::from_parts(Some(text), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("secret #1") && err.contains("whpk_"), "{err}");
    assert!(
        !err.contains("not-base64"),
        "the key must not be echoed: {err}"
    );
}

#[test]
fn the_default_retry_policy_is_the_documented_one() {
    let secrets = env(&[
        ("INHOOK_PRESENCE_SECRET", "a"),
        ("INHOOK_SAVE_GAME_SECRET", "b"),
    ]);
    let config = Config::from_parts(None, &secrets).unwrap();
    // RetryPolicy::default (below config) states the same values: the two must agree.
    assert_eq!(config.processing.retry, RetryPolicy::default());
}

#[test]
fn stream_limits_default_and_must_allow_one() {
    let secrets = env(&[("INHOOK_P_SECRET", "s")]);
    let source = "[[sources]]\nname = \"p\"\nkind = \"presence\"\n";
    let config = Config::from_parts(Some(source), &secrets).unwrap();
    assert_eq!(config.admin.max_streams, Admin::default().max_streams);
    let config = Config::from_parts(Some(&format!("max_streams = 2\n{source}")), &secrets);
    assert_eq!(config.unwrap().admin.max_streams, 2);
    let err = Config::from_parts(Some(&format!("max_streams = 0\n{source}")), &secrets)
        .unwrap_err()
        .to_string();
    assert!(err.contains("max_streams"), "{err}");
    let err = Config::from_parts(Some(&format!("stream_buffer = 0\n{source}")), &secrets)
        .unwrap_err()
        .to_string();
    assert!(err.contains("stream_buffer"), "{err}");
}

/// A `json` source with the given signature lines, as the configurable schemes' tests write it.
#[test]
fn public_key_sources_read_public_keys_and_keep_their_signature_header_secret() {
    let key = "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c";
    let source = |extra: &str| {
        format!(
            "[[sources]]\nname = \"d\"\nkind = \"json\"\nevent_id = \"/id\"\nordering = \"unordered\"\nsignature = \"ed25519\"\nsignature_header = \"X-Signature-Ed25519\"\n{extra}\n"
        )
    };
    let config = Config::from_parts(
        Some(&source(&format!("public_keys = [\"{key}\"]"))),
        &env(&[]),
    )
    .unwrap();
    assert_eq!(config.sources[0].secrets.len(), 1);
    assert_eq!(
        config.sources[0].verifier.secret_headers(),
        vec!["x-signature-ed25519"]
    );
    let from_env = Config::from_parts(
        Some(&source("")),
        &env(&[("INHOOK_D_PUBLIC_KEYS", &format!("{key},{key}"))]),
    )
    .unwrap();
    assert!(from_env.sources[0].secrets_from_environment);
    assert_eq!(from_env.sources[0].secrets.len(), 2);
    for (extra, named) in [
        ("", "public_keys: entry #0 is missing"),
        (
            &format!("public_keys = [\"{key}\"]\nsecrets = [\"s\"]") as &str,
            "secrets are not used",
        ),
        (
            &format!("public_keys = [\"{key}\"]\nkeep_headers = [\"X-Signature-Ed25519\"]"),
            "keep_headers: x-signature-ed25519",
        ),
        (
            &format!("public_keys = [\"{key}\"]\nsignature_algorithm = \"sha1\""),
            "signature_algorithm is only for signature = \"hmac\"",
        ),
    ] {
        let err = Config::from_parts(Some(&source(extra)), &env(&[])).unwrap_err();
        assert!(err.to_string().contains(named), "{extra}: {err}");
    }
    let err =
        configurable("signature = \"hmac\"\nsignature_header = \"X-S\"\npublic_keys = [\"k\"]")
            .unwrap_err();
    assert!(
        err.to_string()
            .contains("public_keys is only for signature = \"ed25519\" or \"ecdsa-p256\""),
        "{err}"
    );
}

fn configurable(lines: &str) -> Result<Config, ConfigError> {
    let text = format!(
        "[[sources]]\nname = \"c\"\nkind = \"json\"\nevent_id = \"/id\"\naggregate = \"/a\"\nordering = \"unordered\"\n{lines}\n"
    );
    Config::from_parts(
        Some(&text),
        &env(&[("INHOOK_C_SECRET", "user:sixteen-bytes-pass")]),
    )
}

#[test]
fn configurable_schemes_parse_into_their_settings() {
    let config = configurable(
        "signature = \"hmac\"\nsignature_header = \"Paddle-Signature\"\n\
         signature_format = \"pairs\"\nsignature_key = \"h1\"\ntimestamp_key = \"ts\"\n\
         signed_content = \"{timestamp}:{body}\"",
    )
    .unwrap();
    let verifier = &config.sources[0].verifier;
    assert_eq!(verifier.scheme(), Scheme::Hmac);
    assert!(verifier.is_timestamped() && !verifier.dedups_by_body());
    let config =
        configurable("signature = \"hmac\"\nsignature_header = \"Linear-Signature\"").unwrap();
    assert!(config.sources[0].verifier.dedups_by_body());
    let config = configurable("signature = \"token\"\ntoken_header = \"X-Gitlab-Token\"").unwrap();
    assert_eq!(
        config.sources[0].verifier.secret_headers(),
        vec!["x-gitlab-token"]
    );
    assert!(configurable("signature = \"basic\"").is_ok());
    // {url} takes the top-level public_url, or the source's.
    let text = "public_url = \"https://hooks.example.com/\"\n[[sources]]\nname = \"c\"\n\
                kind = \"json\"\nevent_id = \"/id\"\naggregate = \"/a\"\nordering = \"unordered\"\nsignature = \"hmac\"\n\
                signature_header = \"X-Sig\"\nsigned_content = \"{url}{body}\"\n";
    let config = Config::from_parts(Some(text), &env(&[("INHOOK_C_SECRET", "s")])).unwrap();
    let crate::signature::Verifier::Hmac(hmac) = &config.sources[0].verifier else {
        panic!("not hmac");
    };
    assert_eq!(
        hmac.public_url.as_deref(),
        Some("https://hooks.example.com")
    );
}

#[test]
fn aws_sns_sources_need_no_secret_nor_event_id_and_bad_hosts_name_the_key() {
    let base = "[[sources]]\nname = \"sns\"\nkind = \"json\"\nsignature = \"aws-sns\"\n\
                unwrap = \"/Message\"\naggregate = \"/a\"\nordering = \"unordered\"\n";
    let text = format!("{base}sns_topic_arns = [\"arn:aws:sns:eu-west-1:123456789012:orders\"]\n");
    let config = Config::from_parts(Some(&text), &env(&[])).unwrap();
    let Verifier::AwsSns(sns) = &config.sources[0].verifier else {
        panic!("{:?}", config.sources[0].verifier);
    };
    assert!(sns
        .cert_url(
            "https://sns.eu-west-1.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem"
        )
        .is_ok());
    assert_eq!(
        sns.topic_arns,
        ["arn:aws:sns:eu-west-1:123456789012:orders"]
    );
    assert!(config.sources[0].secrets.is_empty());
    for (lines, key) in [
        (
            "sns_cert_hosts = [\"sns.*x.amazonaws.com\"]",
            "sns_cert_hosts",
        ),
        ("sns_cert_hosts = []", "sns_cert_hosts"),
    ] {
        let err = Config::from_parts(Some(&format!("{text}{lines}\n")), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("source \"sns\": ") && err.contains(key),
            "{lines}: {err}"
        );
    }
    for lines in [
        "sns_topic_arns = []",
        "sns_topic_arns = [\"arn:aws:sns:eu-west-1:*:orders\"]",
    ] {
        let err = Config::from_parts(Some(&format!("{base}{lines}\n")), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("source \"sns\": sns_topic_arns"),
            "{lines}: {err}"
        );
    }
    let err = configurable(
        "signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsns_cert_hosts = [\"localhost\"]",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("sns_cert_hosts is only for signature = \"aws-sns\""),
        "{err}"
    );
}

#[test]
fn aws_sns_sources_must_name_their_topics_in_the_file_or_the_environment() {
    let base = "[[sources]]\nname = \"orders-sns\"\nkind = \"json\"\nsignature = \"aws-sns\"\n\
                aggregate = \"/a\"\nordering = \"unordered\"\n";
    let err = Config::from_parts(Some(base), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("source \"orders-sns\": sns_topic_arns is required")
            && err.contains("INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS"),
        "{err}"
    );
    // The variable replaces the file's list; comma-separated, spaces trimmed.
    let topics = " arn:aws:sns:us-east-1:123456789012:a , arn:aws:sns:us-east-1:123456789012:b";
    let var = [("INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS", topics)];
    let file = format!("{base}sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:c\"]\n");
    for text in [base, file.as_str()] {
        let config = Config::from_parts(Some(text), &env(&var)).unwrap();
        let Verifier::AwsSns(sns) = &config.sources[0].verifier else {
            panic!("{:?}", config.sources[0].verifier);
        };
        assert_eq!(
            sns.topic_arns,
            [
                "arn:aws:sns:us-east-1:123456789012:a",
                "arn:aws:sns:us-east-1:123456789012:b"
            ]
        );
    }
    for bad in ["", " , ", "arn:aws:sns:us-east-1:123456789012:*"] {
        let err = Config::from_parts(
            Some(base),
            &env(&[("INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS", bad)]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.starts_with("source \"orders-sns\": sns_topic_arns")
                && err.contains("from INHOOK_ORDERS_SNS_SNS_TOPIC_ARNS"),
            "{bad:?}: {err}"
        );
    }
    // Another scheme's source never reads the variable.
    let other = "[[sources]]\nname = \"p\"\nkind = \"presence\"\nsecrets = [\"s\"]\n";
    assert!(Config::from_parts(
        Some(other),
        &env(&[(
            "INHOOK_P_SNS_TOPIC_ARNS",
            "arn:aws:sns:us-east-1:123456789012:a"
        )])
    )
    .is_ok());
}

#[test]
fn configurable_settings_that_cannot_work_name_the_key() {
    for (lines, key) in [
        ("signature = \"hmac\"", "signature_header"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsignature_algorithm = \"md5\"", "signature_algorithm"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{timestamp}{body}\"", "signed_content"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{url}{body}\"", "signed_content"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{bdoy}\"", "signed_content"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nsigned_content = \"{body\"", "signed_content"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\ntimestamp_key = \"t\"", "timestamp_key"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\ntoken_header = \"X-T\"", "token_header"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\npublic_url = \"ftp://x\"", "public_url"),
        ("signature = \"token\"", "token_header"),
        ("signature = \"token\"\ntoken_header = \"X-T\"\ntoken_query = \"t\"", "token_query"),
        ("signature = \"github\"\nsignature_header = \"X-Sig\"", "signature_header"),
        ("signature = \"basic\"\ntimestamp = \"/ts\"", "timestamp"),
        ("signature = \"hmac\"\nsignature_header = \"X-Sig\"\nkeep_headers = [\"x-sig\"]", "keep_headers"),
        ("signature = \"token\"\ntoken_header = \"User-Agent\"", "token_header"),
        ("signature = \"token\"\ntoken_header = \"X-T\"\nsequence = \"header:X-T\"", "sequence"),
    ] {
        let err = configurable(lines).unwrap_err().to_string();
        assert!(err.starts_with("source \"c\": ") && err.contains(key), "{lines}: {err}");
        if matches!(key, "keep_headers" | "sequence") {
            assert!(err.contains("carries the source's signature or token"), "{err}");
        }
    }
    // A Basic secret must be user:password, and the error does not show it.
    let text = "[[sources]]\nname = \"c\"\nkind = \"json\"\nevent_id = \"/id\"\n\
                aggregate = \"/a\"\nordering = \"unordered\"\nsignature = \"basic\"\n";
    let err = Config::from_parts(Some(text), &env(&[("INHOOK_C_SECRET", "hunter2")]))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("user:password") && !err.contains("hunter2"),
        "{err}"
    );
    let err = Config::from_parts(Some("public_url = \"x\""), &env(&[]))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("public_url"), "{err}");
}

#[test]
fn blank_or_guessable_shared_secrets_are_refused_by_position_never_by_value() {
    let base = "[[sources]]\nname = \"c\"\nkind = \"json\"\nevent_id = \"/id\"\n\
                aggregate = \"/a\"\nordering = \"unordered\"\n";
    for (scheme, secret, why) in [
        (
            "signature = \"token\"\ntoken_header = \"X-T\"",
            "t",
            "shorter than 16 bytes",
        ),
        (
            "signature = \"token\"\ntoken_query = \"t\"",
            "fifteen-bytes!!",
            "shorter than 16 bytes",
        ),
        ("signature = \"basic\"", ":", "empty user"),
        (
            "signature = \"basic\"",
            ":a-long-enough-password",
            "empty user",
        ),
        (
            "signature = \"basic\"",
            "hook:pw-12345",
            "password shorter than 16 bytes",
        ),
        (
            "signature = \"hmac\"\nsignature_header = \"X-S\"",
            "   ",
            "is blank",
        ),
        ("signature = \"github\"", " \t", "is blank"),
    ] {
        let text = format!("{base}{scheme}\nsecrets = [\"sixteen-bytes-ok\", {secret:?}]\n");
        let text = text.replace(
            "sixteen-bytes-ok",
            if scheme.contains("basic") {
                "u:sixteen-bytes-ok"
            } else {
                "sixteen-bytes-ok"
            },
        );
        let err = Config::from_parts(Some(&text), &env(&[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("source \"c\": secret #1 ") && err.contains(why),
            "{secret:?}: {err}"
        );
        if secret.trim().len() > 1 {
            assert!(!err.contains(secret), "{err}");
        }
    }
    // Sixteen bytes of token, a user and sixteen bytes of password, any HMAC key.
    for (scheme, secret) in [
        (
            "signature = \"token\"\ntoken_header = \"X-T\"",
            "sixteen-bytes-ok",
        ),
        ("signature = \"basic\"", "u:sixteen-bytes-ok"),
        ("signature = \"hmac\"\nsignature_header = \"X-S\"", "k"),
    ] {
        let text = format!("{base}{scheme}\nsecrets = [{secret:?}]\n");
        assert!(
            Config::from_parts(Some(&text), &env(&[])).is_ok(),
            "{scheme}"
        );
    }
}

#[test]
fn a_handshake_is_parsed_at_start_and_an_unknown_one_names_the_key() {
    use crate::handshake::Handshake;
    for h in Handshake::ALL {
        let scheme = publisher_scheme_lines(h).unwrap_or("signature = \"basic\"");
        let config = configurable(&format!("{scheme}\nhandshake = \"{h}\"")).unwrap();
        assert_eq!(config.sources[0].handshake, Some(h));
    }
    let config = configurable("signature = \"basic\"").unwrap();
    assert_eq!(config.sources[0].handshake, None);
    let err = configurable("signature = \"basic\"\nhandshake = \"slak\"")
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("source \"c\": handshake \"slak\"") && err.contains("x-crc"),
        "{err}"
    );
}

#[test]
fn a_handshake_answered_with_a_secret_needs_one() {
    let text = "[[sources]]\nname = \"z\"\nkind = \"json\"\nevent_id = \"/id\"\n\
                aggregate = \"/a\"\nordering = \"unordered\"\nsignature = \"github\"\n\
                handshake = \"zoom\"\n";
    let secrets = handshake("z", Some("zoom"), &[], Secrets::Required)
        .unwrap_err()
        .to_string();
    assert!(
        secrets.contains("handshake = \"zoom\"") && secrets.contains("INHOOK_Z_SECRET"),
        "{secrets}"
    );
    assert!(handshake("z", Some("x-crc"), &[], Secrets::Required).is_err());
    assert!(handshake("z", Some("dropbox"), &[], Secrets::Required).is_ok());
    let text = text.replace("signature = \"github\"\n", &format!("{ZOOM_LINES}\n"));
    let config = Config::from_parts(Some(&text), &env(&[("INHOOK_Z_SECRET", "zs")])).unwrap();
    assert_eq!(
        config.sources[0].handshake,
        Some(crate::handshake::Handshake::Zoom)
    );
}

const X_LINES: &str = "signature = \"hmac\"\nsignature_header = \"x-twitter-webhooks-signature\"\n\
                       signature_prefix = \"sha256=\"\nsignature_encoding = \"base64\"";
const ZOOM_LINES: &str = "signature = \"hmac\"\nsignature_header = \"x-zm-signature\"\n\
                          signature_prefix = \"v0=\"\ntimestamp = \"header:x-zm-request-timestamp\"\n\
                          signed_content = \"v0:{timestamp}:{body}\"";
const GRAPH_LINES: &str = "signature = \"token\"\ntoken_query = \"token\"";

/// The scheme lines of a handshake's publisher, for one allowed only with it.
fn publisher_scheme_lines(h: crate::handshake::Handshake) -> Option<&'static str> {
    use crate::handshake::Handshake;
    match h {
        Handshake::XCrc => Some(X_LINES),
        Handshake::Zoom => Some(ZOOM_LINES),
        Handshake::Msgraph => Some(GRAPH_LINES),
        _ => None,
    }
}

#[test]
fn a_handshake_answered_with_the_secret_is_allowed_only_with_its_publishers_scheme() {
    use crate::handshake::Handshake;
    // The red team's forgeries: x-crc on github and stripe sources (a crc answer is
    // the HMAC of any token, so of "{t}.{body}" too), zoom on another hmac.
    for (h, lines, has) in [
        (Handshake::XCrc, "signature = \"github\"", "has signature = \"github\""),
        (Handshake::XCrc, "signature = \"stripe\"", "has signature = \"stripe\""),
        (
            Handshake::XCrc,
            "signature = \"hmac\"\nsignature_header = \"x-twitter-webhooks-signature\"\n\
             signature_prefix = \"sha256=\"\nsignature_encoding = \"base64\"\n\
             timestamp = \"header:X-Ts\"\nsigned_content = \"{timestamp}.{body}\"",
            "signature = \"hmac\" has other settings",
        ),
        (Handshake::XCrc, ZOOM_LINES, "other settings"),
        (
            Handshake::XCrc,
            &format!("{X_LINES}\nbody_format = \"form\""),
            "has body_format = \"form\"",
        ),
        (Handshake::Zoom, "signature = \"slack\"", "has signature = \"slack\""),
        (Handshake::Zoom, X_LINES, "other settings"),
        (
            Handshake::Zoom,
            "signature = \"hmac\"\nsignature_header = \"x-zm-signature\"\nsignature_prefix = \"v0=\"",
            "other settings",
        ),
        (Handshake::Msgraph, "signature = \"basic\"", "has signature = \"basic\""),
        (
            Handshake::Msgraph,
            "signature = \"token\"\ntoken_header = \"X-Graph-Token\"",
            "signature = \"token\" has other settings",
        ),
    ] {
        let err = configurable(&format!("{lines}\nhandshake = \"{h}\""))
            .unwrap_err()
            .to_string();
        let allowed = h.publisher_scheme().unwrap();
        assert!(
            err.starts_with(&format!("source \"c\": handshake = \"{h}\" is allowed only with"))
                && err.contains(allowed)
                && err.contains(has),
            "{h} with {lines}: {err}"
        );
    }
    // Echo handshakes answer nothing computed with the secret: any scheme.
    for h in [
        Handshake::Slack,
        Handshake::Discord,
        Handshake::Twitch,
        Handshake::Dropbox,
        Handshake::Okta,
        Handshake::Websub,
    ] {
        assert!(h.publisher_scheme().is_none());
        configurable(&format!("signature = \"github\"\nhandshake = \"{h}\"")).unwrap();
    }
    // A preset's handshake comes with its scheme; written over, the error names the preset.
    for (preset, over) in [
        ("x-activity", "signature_encoding = \"hex\""),
        ("zoom", "signed_content = \"{timestamp}.{body}\""),
        ("msgraph", ""),
    ] {
        let text = format!("[[sources]]\nname = \"p\"\npreset = \"{preset}\"\n");
        Config::from_parts(
            Some(&text),
            &env(&[("INHOOK_P_SECRET", "s3cret-value-of-24-bytes")]),
        )
        .unwrap();
        if over.is_empty() {
            continue;
        }
        let text = format!("{text}{over}\n");
        let err = Config::from_parts(
            Some(&text),
            &env(&[("INHOOK_P_SECRET", "s3cret-value-of-24-bytes")]),
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("is allowed only with") && err.contains(preset),
            "{preset}: {err}"
        );
    }
}
