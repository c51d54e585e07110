//! A source's signature settings, secrets, public keys and handshakes through
//! [`Config::from_parts`]: what each scheme takes and the error a user sees for what it
//! refuses, never with a secret in it.

use super::*;

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
    let crate::ingress::signature::Verifier::Hmac(hmac) = &config.sources[0].verifier else {
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
    use crate::ingress::handshake::Handshake;
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
        Some(crate::ingress::handshake::Handshake::Zoom)
    );
}

const X_LINES: &str = "signature = \"hmac\"\nsignature_header = \"x-twitter-webhooks-signature\"\n\
                       signature_prefix = \"sha256=\"\nsignature_encoding = \"base64\"";
const ZOOM_LINES: &str = "signature = \"hmac\"\nsignature_header = \"x-zm-signature\"\n\
                          signature_prefix = \"v0=\"\ntimestamp = \"header:x-zm-request-timestamp\"\n\
                          signed_content = \"v0:{timestamp}:{body}\"";
const GRAPH_LINES: &str = "signature = \"token\"\ntoken_query = \"token\"";

/// The scheme lines of a handshake's publisher, for one allowed only with it.
fn publisher_scheme_lines(h: crate::ingress::handshake::Handshake) -> Option<&'static str> {
    use crate::ingress::handshake::Handshake;
    match h {
        Handshake::XCrc => Some(X_LINES),
        Handshake::Zoom => Some(ZOOM_LINES),
        Handshake::Msgraph => Some(GRAPH_LINES),
        _ => None,
    }
}

#[test]
fn a_handshake_answered_with_the_secret_is_allowed_only_with_its_publishers_scheme() {
    use crate::ingress::handshake::Handshake;
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
