//! The configuration's checks through [`Config::from_parts`]: what each key takes, and the
//! error a user sees for what it refuses.

use super::*;
use crate::domain::kind::SourceKind;
use crate::domain::retry::RetryPolicy;
use crate::ingress::signature::{Scheme, Verifier};
use source::signing::handshake;
use test_env as env;

mod signing;

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
        Some(crate::domain::kind::json::batch::DEFAULT_MAX_EVENTS)
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
    use crate::ingress::signature::public_key::{generate, Algorithm};
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
    for preset in crate::ingress::presets::Preset::all() {
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
    for scheme in crate::ingress::signature::Scheme::ALL {
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

/// Every top-level key a section reads is in docs/configuration.md's table of top-level
/// keys, and every key there is read; every variable a section reads is in its table of
/// environment variables, with the key it replaces. A key or variable added to a section
/// without its line in the docs fails here.
#[test]
fn the_documented_keys_and_variables_are_the_ones_the_sections_read() {
    let docs = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/configuration.md"
    ))
    .unwrap();
    // The first two cells of each row of the table under `heading`.
    let table = |heading: &str| -> Vec<(String, String)> {
        let start = docs.find(heading).unwrap_or_else(|| panic!("no {heading}"));
        docs[start..]
            .lines()
            .skip(1)
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2) // The header and its separator.
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1].trim_matches('`').to_owned(), cells[2].to_owned())
            })
            .collect()
    };
    let mut documented: Vec<String> = table("## Top-level keys")
        .into_iter()
        .map(|(key, _)| key)
        .collect();
    let mut read: Vec<String> = file::FileConfig::keys()
        .iter()
        .map(|k| k.to_string())
        .collect();
    documented.sort();
    read.sort();
    assert_eq!(documented, read);
    let variables = table("## Environment variables");
    for (key, var) in file::FileConfig::variables() {
        let (_, meaning) = variables
            .iter()
            .find(|(v, _)| v == var)
            .unwrap_or_else(|| panic!("{var} is not documented"));
        assert!(meaning.contains(key), "{var}: {meaning}");
    }
}
