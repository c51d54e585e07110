use super::*;
use axum::http::HeaderValue;
use serde_json::{json, Map};

fn spec(toml_text: &str) -> JsonSourceSpec {
    toml::from_str(toml_text).unwrap()
}

fn contract(toml_text: &str) -> JsonContract {
    JsonContract::compile(&spec(toml_text)).unwrap()
}

fn config_error(toml_text: &str) -> ContractConfigError {
    JsonContract::compile(&spec(toml_text)).unwrap_err()
}

#[test]
fn a_body_event_id_is_the_bodys_sha256_whatever_the_delivery_id() {
    let c = contract(
            "ordering = \"unordered\"\nevent_id = \"body\"\nevent_type = \"/t\"\nevent_types = [\"a.*\"]",
        );
    assert!(c.event_id_from_body());
    let body = br#"{"t":"a.b","x":1}"#;
    let hex_id = body_event_id(body);
    assert_eq!(hex_id.len(), 64);
    assert!(hex_id
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let JsonParsed::Event(e) = c.parse_bytes(body, &headers(&[]), Some("msg_1")).unwrap() else {
        panic!("an event");
    };
    assert_eq!(e.event_id.as_str(), hex_id);
    assert_eq!(e.aggregate[0].as_str(), hex_id);
    // One byte more is another event; an ignored type is logged under its body id too.
    assert_ne!(body_event_id(br#"{"t":"a.b","x":1} "#), hex_id);
    let ignored = br#"{"t":"z"}"#;
    let JsonParsed::Ignored { event_id, .. } = c.parse_bytes(ignored, &headers(&[]), None).unwrap()
    else {
        panic!("ignored");
    };
    assert_eq!(event_id.unwrap().as_str(), body_event_id(ignored));
    // The SHA-256 of the empty string, as every tool computes it.
    assert_eq!(
        body_event_id(b""),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn a_body_that_is_no_object_is_one_problem_on_the_whole_body() {
    let whole = vec![FieldProblem {
        field: "$".into(),
        problem: "must be a JSON object".into(),
    }];
    // Without event_types, and with them for an accepted type read from a header.
    let plain = contract(
        "event_id = \"/id\"\naggregate = \"/a\"\nsequence = \"/seq\"\nordering = \"in-order\"",
    );
    let typed = contract(
        "event_id = \"/id\"\naggregate = \"/a\"\nordering = \"unordered\"\n\
             event_type = \"header:X-Type\"\nevent_types = [\"a.*\"]",
    );
    let accepted = headers(&[("x-type", "a.b")]);
    for body in [
        &br#"[{"id":"e1","a":"k","seq":1}]"#[..],
        b"7",
        b"\"text\"",
        b"null",
        b"[]",
    ] {
        for (c, h) in [(&plain, &headers(&[])), (&typed, &accepted)] {
            let err = c.parse_bytes(body, h, None).unwrap_err();
            assert_eq!(err.problems, whole, "{}", String::from_utf8_lossy(body));
        }
    }
    // A type outside the list is ignored, whatever the body holds.
    let outside = headers(&[("x-type", "z")]);
    assert!(matches!(
        typed.parse_bytes(b"[1]", &outside, None),
        Ok(JsonParsed::Ignored { .. })
    ));
    // A source whose locations reach into an array takes one, and names what it misses.
    let array = contract("event_id = \"/0/id\"\nordering = \"unordered\"");
    assert!(array
        .parse_bytes(br#"[{"id":"e1"}]"#, &headers(&[]), None)
        .is_ok());
    let err = array
        .parse_bytes(br#"[{"other":1}]"#, &headers(&[]), None)
        .unwrap_err();
    assert_eq!(err.problems[0].field, "/0/id", "{err}");
    // A source that reads nothing of the body takes any JSON, as before.
    let headers_only = contract("event_id = \"header:X-Id\"\nordering = \"unordered\"");
    assert!(headers_only
        .parse_bytes(b"[]", &headers(&[("x-id", "e1")]), None)
        .is_ok());
    // Without its header, it names the header, not the body.
    let err = headers_only
        .parse_bytes(b"[]", &headers(&[]), None)
        .unwrap_err();
    assert_eq!(err.problems[0].field, "header:X-Id", "{err}");
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut map = HeaderMap::new();
    for (name, value) in pairs {
        map.append(
            HeaderName::from_bytes(name.as_bytes()).unwrap(),
            HeaderValue::from_str(value).unwrap(),
        );
    }
    map
}

fn event(c: &JsonContract, body: Value, h: &HeaderMap, delivery: Option<&str>) -> JsonEvent {
    match c.parse(body, h, delivery) {
        Ok(JsonParsed::Event(e)) => e,
        other => panic!("expected an event, got {other:?}"),
    }
}

fn problems(c: &JsonContract, body: Value, h: &HeaderMap) -> Vec<(String, String)> {
    c.parse(body, h, None)
        .unwrap_err()
        .problems
        .into_iter()
        .map(|p| (p.field, p.problem))
        .collect()
}

const LATEST: &str = r#"
        event_id = "/id"
        aggregate = "/key"
        sequence = "/seq"
        ordering = "latest-wins"
    "#;

/// A GitHub-like source: pull requests ordered, check runs by their own locations,
/// stars with no version.
const TYPED: &str = r#"
        event_id = "header:X-Delivery"
        event_type = "header:X-Event"
        aggregate = ["/repo", "/pull/number"]
        sequence = "/pull/updated_at"
        ordering = "latest-wins"
        [[types]]
        match = "check_*"
        aggregate = ["/repo", "=check_run", "/check_run/id"]
        sequence = "/check_run/completed_at|/check_run/started_at"
        state = "/check_run"
        [[types]]
        match = ["star", "fork"]
        aggregate = ["/repo", "/sender"]
    "#;

fn typed_event(c: &JsonContract, kind: &str, body: Value) -> Result<JsonEvent, Vec<String>> {
    let h = headers(&[("X-Delivery", "d1"), ("X-Event", kind)]);
    match c.parse(body, &h, None) {
        Ok(JsonParsed::Event(e)) => Ok(e),
        Ok(other) => panic!("an event, got {other:?}"),
        Err(e) => Err(e.problems.into_iter().map(|p| p.field).collect()),
    }
}

#[test]
fn a_types_entry_gives_its_types_locations_and_literals_tell_entities_apart() {
    let c = contract(TYPED);
    let run = typed_event(
        &c,
        "check_run",
        json!({"repo": "o/r", "check_run": {"id": 4, "started_at": "2024-01-01T00:00:00Z"}}),
    )
    .unwrap();
    let parts: Vec<&str> = run.aggregate.iter().map(Ident::as_str).collect();
    assert_eq!(parts, ["o/r", "check_run", "4"]);
    assert_eq!(run.sequence.unwrap().source, SequenceSource::Timestamp);
    assert_eq!(
        run.state,
        Some(json!({"id": 4, "started_at": "2024-01-01T00:00:00Z"}))
    );
    assert_eq!(run.unordered, None);
    // A pull request keeps the source's own locations.
    let pull = typed_event(
        &c,
        "pull_request",
        json!({"repo": "o/r", "pull": {"number": 4, "updated_at": 7}}),
    )
    .unwrap();
    assert_eq!(pull.aggregate.len(), 2);
    assert_eq!(pull.sequence.unwrap().value.get(), 7);
    // A type whose entry names no sequence is unordered, and says why.
    let star = typed_event(&c, "star", json!({"repo": "o/r", "sender": "u"})).unwrap();
    assert_eq!(star.sequence, None);
    assert!(star
        .unordered
        .unwrap()
        .contains("\"star\" payload carries none"));
    // The state of a logged row is read by its logged type.
    let body = br#"{"repo":"o/r","check_run":{"id":4}}"#;
    assert_eq!(
        c.state_of(body, "check_suite").unwrap(),
        Some(json!({"id": 4}))
    );
    assert!(c
        .state_of(body, "push")
        .unwrap()
        .unwrap()
        .get("repo")
        .is_some());
    assert!(c.state_locations().contains(&vec!["check_run".to_owned()]));
}

#[test]
fn a_strict_source_refuses_a_missing_location_and_an_opted_in_one_applies_it_unordered() {
    let strict = contract(TYPED);
    let body = json!({"repo": "o/r", "check_run": {"id": 4}});
    assert_eq!(
        typed_event(&strict, "check_run", body.clone()).unwrap_err(),
        ["/check_run/completed_at|/check_run/started_at"]
    );
    let lenient = contract(&format!("missing_locations = \"unordered\"\n{TYPED}"));
    let run = typed_event(&lenient, "check_run", body).unwrap();
    assert_eq!(run.sequence, None);
    let why = run.unordered.unwrap();
    assert!(
        why.contains("no version: /check_run/completed_at|/check_run/started_at is absent"),
        "{why}"
    );
    // An aggregate part the body lacks: the type stands in, and the event is unordered
    // even though a sequence read (it versions another entity).
    let other = typed_event(
        &lenient,
        "deployment",
        json!({"repo": "o/r", "pull": {"updated_at": 3}}),
    )
    .unwrap();
    let parts: Vec<&str> = other.aggregate.iter().map(Ident::as_str).collect();
    assert_eq!(parts, ["o/r", "deployment"]);
    assert_eq!(other.sequence, None);
    assert!(other.unordered.unwrap().contains("/pull/number is absent"));
    // A malformed value is no refusal either.
    let odd = typed_event(
        &lenient,
        "pull_request",
        json!({"repo": {"x": 1}, "pull": {"number": 1, "updated_at": 1}}),
    )
    .unwrap();
    assert_eq!(odd.aggregate[0].as_str(), "pull_request");
    assert!(odd.unordered.is_some());
}

#[test]
fn an_event_id_the_body_lacks_is_the_delivery_id_else_the_bodys_hash() {
    let c = contract(
            "missing_locations = \"unordered\"\nordering = \"unordered\"\nevent_id = \"/event_id\"\naggregate = \"/team_id\"",
        );
    let body = json!({"type": "app_rate_limited", "team_id": "T1"});
    let hashed = event(&c, body.clone(), &headers(&[]), None);
    assert_eq!(hashed.event_id.as_str().len(), 64);
    assert_eq!(
        event(&c, body.clone(), &headers(&[]), None).event_id,
        hashed.event_id
    );
    assert_eq!(hashed.unordered, None, "an unordered source says nothing");
    assert_eq!(
        event(&c, body, &headers(&[]), Some("d9")).event_id.as_str(),
        "d9"
    );
    // Strict, the same body is refused.
    let strict =
        contract("ordering = \"unordered\"\nevent_id = \"/event_id\"\naggregate = \"/team_id\"");
    assert!(strict
        .parse(json!({"team_id": "T1"}), &headers(&[]), None)
        .is_err());
}

#[test]
fn types_and_missing_locations_are_checked_at_start() {
    for (text, key) in [
            ("ordering = \"unordered\"\n[[types]]\nmatch = \"a\"", "types"),
            ("ordering = \"unordered\"\nevent_type = \"/t\"\n[[types]]\nmatch = []", "types[0].match"),
            ("ordering = \"unordered\"\nevent_type = \"/t\"\n[[types]]\nmatch = \"a\"\nstate = \"header:X\"", "types[0].state"),
            ("ordering = \"unordered\"\nevent_type = \"/t\"\n[[types]]\nmatch = \"a\"\nsequence = \"x\"", "types[0].sequence"),
        ] {
            assert_eq!(config_error(text).key, key, "{text}");
        }
    assert!(toml::from_str::<JsonSourceSpec>("missing_locations = \"maybe\"").is_err());
    assert!(
        toml::from_str::<JsonSourceSpec>("[[types]]\nmatch = \"a\"\nordering = \"x\"").is_err()
    );
    assert!(Location::parse("=").is_err());
}

#[test]
fn aggregate_is_one_location_or_a_list() {
    assert_eq!(
        spec("aggregate = \"/a\"").aggregate,
        Some(AggregateLocations::One("/a".into()))
    );
    assert_eq!(
        spec("aggregate = [\"/a\", \"header:X-B\"]").aggregate,
        Some(AggregateLocations::Many(vec![
            "/a".into(),
            "header:X-B".into()
        ]))
    );
}

#[test]
fn inconsistent_keys_name_the_key() {
    let cases: [(&str, &str, &str); 19] = [
            (
                "aggregate = \"/a\"\nsequence = \"/s\"",
                "ordering",
                "is required",
            ),
            (
                "ordering = \"newest\"\naggregate = \"/a\"\nsequence = \"/s\"",
                "ordering",
                "\"newest\"",
            ),
            (
                "ordering = \"in-order\"\naggregate = \"/a\"",
                "sequence",
                "in-order",
            ),
            (
                "ordering = \"latest-wins\"\naggregate = \"/a\"",
                "sequence",
                "latest-wins",
            ),
            (
                "ordering = \"latest-wins\"\nsequence = \"/s\"",
                "aggregate",
                "is required",
            ),
            (
                "ordering = \"unordered\"\naggregate = []",
                "aggregate",
                "at least one",
            ),
            (
                "ordering = \"unordered\"\nevent_types = [\"a.*\"]",
                "event_types",
                "needs `event_type`",
            ),
            (
                "ordering = \"unordered\"\nevent_type = \"/t\"\nevent_types = []",
                "event_types",
                "at least one",
            ),
            (
                "ordering = \"unordered\"\nevent_type = \"/t\"\nevent_types = [\"a\", \"\"]",
                "event_types",
                "empty pattern",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"data.id\"",
                "event_id",
                "must start with `/`",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"/a~2b\"",
                "event_id",
                "`~`",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"/a~\"",
                "event_id",
                "`~`",
            ),
            (
                "ordering = \"unordered\"\naggregate = [\"/a\", \"b\"]",
                "aggregate",
                "\"b\"",
            ),
            (
                "ordering = \"unordered\"\nidempotency_key = \"header:\"",
                "idempotency_key",
                "names no header",
            ),
            (
                "ordering = \"unordered\"\nevent_type = \"header:Bad Name\"",
                "event_type",
                "not a valid header name",
            ),
            (
                "ordering = \"unordered\"\nstate = \"header:X-State\"",
                "state",
                "not a header",
            ),
            (
                "ordering = \"in-order\"\naggregate = \"/k\"\nsequence = \"header:Authorization\"",
                "sequence",
                "carries a signature or a credential",
            ),
            (
                "ordering = \"unordered\"\nevent_id = \"header:X-Hub-Signature-256\"",
                "event_id",
                "carries a signature or a credential",
            ),
            (
                "ordering = \"latest-wins\"\naggregate = [\"/k\", \"header:Cookie\"]\nsequence = \"/n\"",
                "aggregate",
                "carries a signature or a credential",
            ),
        ];
    for (text, key, fragment) in cases {
        let err = config_error(text);
        assert_eq!(err.key, key, "{text}: {err}");
        assert!(err.problem.contains(fragment), "{text}: {err}");
        assert!(err.to_string().starts_with(&format!("{key}: ")), "{err}");
    }
    // The consistent minimum of each ordering compiles.
    contract("ordering = \"unordered\"");
    contract(LATEST);
    contract("ordering = \"in-order\"\naggregate = \"/a\"\nsequence = \"/s\"");
    contract("ordering = \"unordered\"\nsequence = \"/s\"\nstate = \"\"");
}

#[test]
fn ids_are_strings_or_decimal_integers_under_the_json_rule() {
    let c = contract(LATEST);
    let h = HeaderMap::new();
    let e = event(&c, json!({"id": 42, "key": -7, "seq": 1}), &h, None);
    assert_eq!(e.event_id.as_str(), "42");
    assert_eq!(e.aggregate[0].as_str(), "-7");
    let e = event(
        &c,
        json!({"id": "évt ü", "key": u64::MAX, "seq": 1}),
        &h,
        None,
    );
    assert_eq!(e.event_id.as_str(), "évt ü");
    assert_eq!(e.aggregate[0].as_str(), u64::MAX.to_string());
    let e = event(
        &c,
        json!({"id": "x".repeat(200), "key": "k", "seq": 1}),
        &h,
        None,
    );
    assert_eq!(e.event_id.as_str().len(), 200);

    let bad = [
        (json!(1.5), "fractional or out-of-range"),
        (json!(1e300), "fractional or out-of-range"),
        (json!(true), "got a boolean"),
        (json!({"a": 1}), "got an object"),
        (json!(["a"]), "got an array"),
        (json!(""), "must not be empty"),
        (json!("x".repeat(201)), "at most 200 bytes"),
        (json!("a\nb"), "control characters"),
        (json!("a\u{85}b"), "control characters"),
    ];
    for (id, fragment) in bad {
        let found = problems(&c, json!({"id": id, "key": "k", "seq": 1}), &h);
        assert_eq!(found.len(), 1, "{id}: {found:?}");
        assert_eq!(found[0].0, "/id");
        assert!(found[0].1.contains(fragment), "{id}: {found:?}");
    }
}

#[test]
fn missing_required_locations_are_named_and_optional_ones_absent() {
    let c = contract(
        r#"
            event_id = "/data/object/id"
            idempotency_key = "header:Idempotency-Key"
            aggregate = ["/data/object/object", "/data/object/id"]
            sequence = "header:X-Seq"
            event_type = "/type"
            ordering = "latest-wins"
            state = "/data/object"
            "#,
    );
    let h = HeaderMap::new();
    let found = problems(&c, json!({"data": {"object": {"object": null}}}), &h);
    assert_eq!(
        found,
        [
            ("/data/object/id".to_owned(), "is required".to_owned()),
            ("/data/object/object".to_owned(), "is required".to_owned()),
            ("/data/object/id".to_owned(), "is required".to_owned()),
            ("header:X-Seq".to_owned(), "is required".to_owned()),
        ]
    );
    // A step through a scalar finds nothing, like an absent key.
    let found = problems(&c, json!({"data": "flat"}), &headers(&[("x-seq", "3")]));
    assert!(found.iter().all(|(_, p)| p == "is required"), "{found:?}");

    let body = json!({"data": {"object": {"object": "invoice", "id": "in_1"}}});
    let e = event(&c, body, &headers(&[("x-seq", "3")]), None);
    assert_eq!(e.idempotency_key, None);
    assert_eq!(e.event_type, None);
    assert_eq!(e.state, Some(json!({"object": "invoice", "id": "in_1"})));
    // The state's location absent: no state, the event still parses.
    let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"\nstate = \"/nope\"");
    assert_eq!(event(&c, json!({"id": "a"}), &h, None).state, None);
    // An optional location holding the wrong type is still a 400.
    let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"\nidempotency_key = \"/k\"\nevent_type = \"/t\"");
    let found = problems(&c, json!({"id": "a", "k": [], "t": false}), &h);
    assert_eq!(
        found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
        ["/t", "/k"]
    );
}

#[test]
fn the_delivery_id_stands_in_for_an_unlocated_event_id() {
    let c = contract("ordering = \"unordered\"");
    let h = HeaderMap::new();
    let e = event(&c, json!({}), &h, Some("msg_1"));
    assert_eq!(e.event_id.as_str(), "msg_1");
    // Unordered without aggregate: each event is its own aggregate.
    assert_eq!(e.aggregate, [Ident::parse("msg_1").unwrap()]);
    assert_eq!(e.state, Some(json!({})));

    let err = c.parse(json!({}), &h, None).unwrap_err();
    assert_eq!(err.problems.len(), 1);
    assert_eq!(err.problems[0].field, "event_id");
    assert!(err.problems[0].problem.starts_with("is required"));
    let err = c.parse(json!({}), &h, Some("a\u{7}")).unwrap_err();
    assert_eq!(err.problems[0].field, "event_id");
    assert!(err.problems[0].problem.contains("delivery id header"));

    // A located event id ignores the delivery id, even when absent.
    let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"");
    let found = problems(&c, json!({}), &h);
    assert_eq!(found, [("/id".to_owned(), "is required".to_owned())]);
    let e = event(&c, json!({"id": "evt"}), &h, Some("msg_1"));
    assert_eq!(e.event_id.as_str(), "evt");
}

#[test]
fn sequences_are_integers_or_rfc3339_timestamps() {
    let c = contract(LATEST);
    let h = HeaderMap::new();
    let seq = |v: Value| {
        event(&c, json!({"id": "e", "key": "k", "seq": v}), &h, None)
            .sequence
            .unwrap()
    };
    let int = |n| JsonSequence {
        value: Sequence::new(n).unwrap(),
        source: SequenceSource::Integer,
    };
    let stamp = |n| JsonSequence {
        value: Sequence::new(n).unwrap(),
        source: SequenceSource::Timestamp,
    };
    assert_eq!(seq(json!(0)), int(0));
    assert_eq!(seq(json!(i64::MAX)), int(i64::MAX));
    assert_eq!(seq(json!("0042")), int(42));
    assert_eq!(seq(json!("1970-01-01T00:00:01Z")), stamp(1_000_000));
    assert_eq!(
        seq(json!("2024-03-01T12:00:00.123456789+01:00")),
        stamp(1_709_290_800_123_456)
    );
    // GitLab's Ruby-written times: the instants their RFC 3339 spellings name.
    assert_eq!(
        seq(json!("2015-05-17 18:08:09 UTC")),
        seq(json!("2015-05-17T18:08:09Z"))
    );
    assert_eq!(
        seq(json!("2021-04-28 21:50:00 +0200")),
        seq(json!("2021-04-28T19:50:00Z"))
    );

    let bad = [
        (json!(-1), "must not be negative"),
        (json!(u64::MAX), "at most 9223372036854775807"),
        (json!(1.5), "must be an integer"),
        (json!("9223372036854775808"), "at most 9223372036854775807"),
        (json!("-1"), "RFC 3339"),
        (json!(""), "RFC 3339"),
        (json!("2024-03-01 12:00"), "RFC 3339"),
        (json!("2015-05-17 18:08:09 CEST"), "RFC 3339"),
        (json!("2015-05-17 18:08:09 +02"), "RFC 3339"),
        (json!("1969-12-31T23:59:59Z"), "before 1970"),
        (json!(true), "got a boolean"),
    ];
    for (v, fragment) in bad {
        let found = problems(&c, json!({"id": "e", "key": "k", "seq": v}), &h);
        assert_eq!(found.len(), 1, "{v}: {found:?}");
        assert_eq!(found[0].0, "/seq");
        assert!(found[0].1.contains(fragment), "{v}: {found:?}");
    }
}

#[test]
fn in_order_needs_integer_sequences() {
    let c = contract("ordering = \"in-order\"\naggregate = \"/k\"\nsequence = \"header:X-Seq\"\nevent_id = \"/id\"");
    let body = || json!({"id": "e", "k": "a"});
    let e = event(&c, body(), &headers(&[("x-seq", "7")]), None);
    assert_eq!(e.sequence.unwrap().value.get(), 7);
    let found = problems(&c, body(), &headers(&[("x-seq", "2024-01-01T00:00:00Z")]));
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, "header:X-Seq");
    assert!(found[0].1.contains("in-order"), "{found:?}");
}

#[test]
fn header_locations_are_read_once_and_as_text() {
    let c = contract("ordering = \"unordered\"\nevent_id = \"header:X-Id\"");
    let found = problems(&c, json!({}), &headers(&[("x-id", "a"), ("x-id", "b")]));
    assert_eq!(found[0].0, "header:X-Id");
    assert!(found[0].1.contains("more than once"));
    let mut h = HeaderMap::new();
    h.insert("x-id", HeaderValue::from_bytes(b"\xff\xfe").unwrap());
    let found = problems(&c, json!({}), &h);
    assert_eq!(
        found,
        [("header:X-Id".to_owned(), "must be UTF-8 text".to_owned())]
    );
    let mut h = HeaderMap::new();
    h.insert("x-id", HeaderValue::from_bytes("évt".as_bytes()).unwrap());
    assert_eq!(event(&c, json!({}), &h, None).event_id.as_str(), "évt");
}

#[test]
fn pointers_follow_rfc_6901() {
    let body = json!({"a/b": {"m~n": [10, {"": "deep"}]}, "": 1, "items": ["x", "y"]});
    let at = |p: &str| match Location::parse(p).unwrap() {
        Location::Pointer { tokens, .. } => resolve_pointer(&body, &tokens).cloned(),
        Location::Header { .. } | Location::Literal { .. } => unreachable!(),
    };
    assert_eq!(at(""), Some(body.clone()));
    assert_eq!(at("/"), Some(json!(1)));
    assert_eq!(at("/a~1b/m~0n/0"), Some(json!(10)));
    assert_eq!(at("/a~1b/m~0n/1/"), Some(json!("deep")));
    assert_eq!(at("/items/1"), Some(json!("y")));
    for absent in [
        "/items/01",
        "/items/-",
        "/items/2",
        "/items/+1",
        "/a~1b/m~0n/0/x",
        "/ab",
    ] {
        assert_eq!(at(absent), None, "{absent}");
    }
    // `~01` is `~1` unescaped once, never `/`.
    assert_eq!(
        Location::parse("/~01").unwrap(),
        Location::Pointer {
            text: "/~01".into(),
            tokens: vec!["~1".into()]
        }
    );
}

#[test]
fn event_types_are_read_first() {
    let c = contract(
        r#"
            event_id = "header:X-GitHub-Delivery"
            event_type = "header:X-GitHub-Event"
            event_types = ["pull_request", "issue*"]
            aggregate = "/repository/full_name"
            sequence = "/updated_at"
            ordering = "latest-wins"
            "#,
    );
    // A type outside the list is ignored whatever the body holds.
    let h = headers(&[("x-github-event", "ping"), ("x-github-delivery", "d-1")]);
    assert_eq!(
        c.parse(json!([1, 2]), &h, None).unwrap(),
        JsonParsed::Ignored {
            event_id: Some(EventId::parse("d-1").unwrap()),
            event_type: Some(Ident::parse("ping").unwrap()),
            place: None,
        }
    );
    // Its place is read when every location of it reads cleanly, only to log it there.
    let placed = json!({"repository": {"full_name": "octo/repo"},
                            "updated_at": "2024-05-01T10:20:30Z"});
    assert_eq!(
        c.parse(placed.clone(), &h, None).unwrap(),
        JsonParsed::Ignored {
            event_id: Some(EventId::parse("d-1").unwrap()),
            event_type: Some(Ident::parse("ping").unwrap()),
            place: Some(IgnoredPlace {
                aggregate: vec![Ident::parse("octo/repo").unwrap()],
                sequence: 1_714_558_830_000_000,
            }),
        }
    );
    let mut unplaced = placed;
    unplaced["updated_at"] = json!(true);
    assert!(matches!(
        c.parse(unplaced, &h, None).unwrap(),
        JsonParsed::Ignored { place: None, .. }
    ));
    let h = headers(&[("x-github-event", "push"), ("x-github-delivery", "")]);
    assert_eq!(
        c.parse(json!({}), &h, None).unwrap(),
        JsonParsed::Ignored {
            event_id: None,
            event_type: Some(Ident::parse("push").unwrap()),
            place: None,
        }
    );
    // No type at all is outside the list too.
    assert!(matches!(
        c.parse(json!({}), &HeaderMap::new(), None).unwrap(),
        JsonParsed::Ignored {
            event_type: None,
            ..
        }
    ));
    // An accepted type goes on to the other fields.
    let h = headers(&[("x-github-event", "issues"), ("x-github-delivery", "d-2")]);
    let found = problems(&c, json!({}), &h);
    assert_eq!(
        found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
        ["/repository/full_name", "/updated_at"]
    );
    // A type of the wrong type is a 400, with the rest of the problems.
    let c = contract(
        "ordering = \"unordered\"\nevent_id = \"/id\"\nevent_type = \"/t\"\nevent_types = [\"*\"]",
    );
    let found = problems(&c, json!({"t": {}}), &HeaderMap::new());
    assert_eq!(
        found.iter().map(|(f, _)| f.as_str()).collect::<Vec<_>>(),
        ["/t", "/id"]
    );
}

/// A plain recursive glob matcher, slow and obviously right, to check [`Glob`] against.
fn reference_glob(pattern: &[u8], text: &[u8]) -> bool {
    match pattern.split_first() {
        None => text.is_empty(),
        Some((b'*', rest)) => (0..=text.len()).any(|i| reference_glob(rest, &text[i..])),
        Some((c, rest)) => text.first() == Some(c) && reference_glob(rest, &text[1..]),
    }
}

#[test]
fn globs_match_stars_and_literals() {
    let yes = [
        ("invoice.*", "invoice.paid"),
        ("invoice.*", "invoice."),
        ("*", ""),
        ("*.created", "customer.created"),
        ("a*b*c", "abc"),
        ("a*b*c", "axxbyybc"),
        ("pull_request", "pull_request"),
        ("a**", "a"),
    ];
    let no = [
        ("invoice.*", "invoice"),
        ("invoice.*", "xinvoice.paid"),
        ("pull_request", "pull_request_review"),
        ("a*b*c", "acb"),
        ("ab*ba", "aba"),
        ("a.b", "axb"),
    ];
    for (p, t) in yes {
        assert!(Glob::new(p).matches(t), "{p} {t}");
    }
    for (p, t) in no {
        assert!(!Glob::new(p).matches(t), "{p} {t}");
    }
}

#[test]
fn a_stripe_event() {
    let c = contract(
        r#"
            event_id = "/id"
            aggregate = ["/data/object/object", "/data/object/id"]
            sequence = "/created"
            event_type = "/type"
            event_types = ["invoice.*", "customer.*"]
            ordering = "latest-wins"
            state = "/data/object"
            "#,
    );
    let body =
        br#"{"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","api_version":"2023-10-16",
            "created":1686089970,"livemode":false,"pending_webhooks":0,
            "request":{"id":null,"idempotency_key":null},"type":"invoice.paid",
            "data":{"object":{"id":"in_1NG8Dt2eZvKYlo2C","object":"invoice","amount_paid":2000,
            "customer":"cus_9s6XKzkNRiz8i3","status":"paid"}}}"#;
    let JsonParsed::Event(e) = c
        .parse_bytes(body, &HeaderMap::new(), Some("ignored"))
        .unwrap()
    else {
        panic!("an invoice event is accepted");
    };
    assert_eq!(e.event_id.as_str(), "evt_1NG8Du2eZvKYlo2CUI79vXWy");
    assert_eq!(
        e.aggregate.iter().map(Ident::as_str).collect::<Vec<_>>(),
        ["invoice", "in_1NG8Dt2eZvKYlo2C"]
    );
    assert_eq!(
        e.sequence,
        Some(JsonSequence {
            value: Sequence::new(1_686_089_970).unwrap(),
            source: SequenceSource::Integer
        })
    );
    assert_eq!(e.event_type.unwrap().as_str(), "invoice.paid");
    assert_eq!(e.state.unwrap()["amount_paid"], json!(2000));
    let charge = String::from_utf8_lossy(body).replace("invoice.paid", "charge.succeeded");
    assert!(matches!(
        c.parse_bytes(charge.as_bytes(), &HeaderMap::new(), None),
        Ok(JsonParsed::Ignored { .. })
    ));
}

#[test]
fn a_github_event() {
    let c = contract(
        r#"
            event_type = "header:X-GitHub-Event"
            event_types = ["pull_request"]
            aggregate = ["/repository/full_name", "/pull_request/number"]
            sequence = "/pull_request/updated_at"
            ordering = "latest-wins"
            state = "/pull_request"
            "#,
    );
    let body = br#"{"action":"synchronize","number":7,
            "pull_request":{"number":7,"state":"open","title":"Fix",
              "updated_at":"2024-05-01T10:20:30Z"},
            "repository":{"id":1296269,"full_name":"octo/repo"},
            "sender":{"login":"octocat"}}"#;
    let h = headers(&[
        ("x-github-event", "pull_request"),
        ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
    ]);
    // The scheme hands over X-GitHub-Delivery as the delivery id.
    let delivery = h["x-github-delivery"].to_str().unwrap();
    let JsonParsed::Event(e) = c.parse_bytes(body, &h, Some(delivery)).unwrap() else {
        panic!("a pull_request event is accepted");
    };
    assert_eq!(e.event_id.as_str(), delivery);
    // A part holding `/` stays one part.
    assert_eq!(
        e.aggregate.iter().map(Ident::as_str).collect::<Vec<_>>(),
        ["octo/repo", "7"]
    );
    let seq = e.sequence.unwrap();
    assert_eq!(seq.source, SequenceSource::Timestamp);
    assert_eq!(seq.value.get(), 1_714_558_830_000_000);
    assert_eq!(e.state.unwrap()["title"], json!("Fix"));
}

#[test]
fn a_shopify_event() {
    let c = contract(
        r#"
            event_type = "header:X-Shopify-Topic"
            event_types = ["orders/*"]
            aggregate = "/id"
            sequence = "/updated_at"
            ordering = "latest-wins"
            "#,
    );
    let body = br#"{"id":820982911946154508,"email":"jon@example.com",
            "updated_at":"2024-05-01T06:20:30-04:00","total_price":"199.65"}"#;
    let h = headers(&[("x-shopify-topic", "orders/updated")]);
    let JsonParsed::Event(e) = c.parse_bytes(body, &h, Some("b54557e4-bdd9-4b37")).unwrap() else {
        panic!("an orders/updated event is accepted");
    };
    assert_eq!(e.event_id.as_str(), "b54557e4-bdd9-4b37");
    assert_eq!(e.aggregate[0].as_str(), "820982911946154508");
    assert_eq!(e.sequence.unwrap().value.get(), 1_714_558_830_000_000);
    assert_eq!(e.event_type.unwrap().as_str(), "orders/updated");
    assert_eq!(e.state.unwrap()["total_price"], json!("199.65"));
    let h = headers(&[("x-shopify-topic", "products/update")]);
    assert!(matches!(
        c.parse_bytes(body, &h, Some("d")),
        Ok(JsonParsed::Ignored { .. })
    ));
}

/// Any JSON value, a few levels deep, leaning to the shapes ids and sequences take.
fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        "[a-z0-9.*]{0,8}".prop_map(Value::from),
        "\\PC{0,4}".prop_map(Value::from),
        Just(Value::from("2024-05-01T10:20:30Z")),
    ];
    leaf.prop_recursive(2, 12, 3, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Escapes a key as an RFC 6901 reference token.
fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

proptest::proptest! {
    #[test]
    fn pointers_round_trip_and_find_what_was_put_there(
        keys in proptest::collection::vec("[a-z/~01]{0,5}|\\PC{0,4}", 0..6),
        leaf in "[ -~]{1,20}",
    ) {
        let text: String = keys.iter().map(|k| format!("/{}", escape(k))).collect();
        let location = Location::parse(&text).unwrap();
        proptest::prop_assert_eq!(location.as_str(), text.as_str());
        let Location::Pointer { tokens, .. } = &location else {
            return Err(proptest::test_runner::TestCaseError::fail("a pointer"));
        };
        proptest::prop_assert_eq!(tokens, &keys);
        let mut body = json!(leaf.clone());
        for key in keys.iter().rev() {
            body = json!({ key.as_str(): body });
        }
        proptest::prop_assert_eq!(resolve_pointer(&body, tokens), Some(&json!(leaf)));
        // serde_json's own reading of the pointer agrees.
        proptest::prop_assert_eq!(body.pointer(&text), Some(&json!(leaf)));
    }

    #[test]
    fn text_and_integer_ids_behave(text in "\\PC{0,60}|[ -~]{190,210}|.{0,3}", n in proptest::prelude::any::<i64>()) {
        let c = contract("ordering = \"unordered\"\nevent_id = \"/id\"");
        let h = HeaderMap::new();
        let valid = (1..=200).contains(&text.len())
            && !text.chars().any(|c| c.is_control() || crate::domain::is_invisible_format(c));
        match c.parse(json!({"id": text}), &h, None) {
            Ok(JsonParsed::Event(e)) => {
                proptest::prop_assert!(valid);
                proptest::prop_assert_eq!(e.event_id.as_str(), text.as_str());
                proptest::prop_assert_eq!(e.aggregate[0].as_str(), text.as_str());
            }
            Ok(other) => proptest::prop_assert!(false, "{:?}", other),
            Err(err) => {
                proptest::prop_assert!(!valid);
                proptest::prop_assert_eq!(err.problems.len(), 1);
                proptest::prop_assert_eq!(&err.problems[0].field, "/id");
            }
        }
        let e = event(&c, json!({"id": n}), &h, None);
        proptest::prop_assert_eq!(e.event_id.as_str(), n.to_string());
        // The same id as text is the same event id.
        let as_text = event(&c, json!({"id": n.to_string()}), &h, None);
        proptest::prop_assert_eq!(e.event_id, as_text.event_id);
    }

    #[test]
    fn globs_agree_with_a_reference_matcher(pattern in "[ab*]{1,8}", text in "[ab]{0,10}") {
        proptest::prop_assert_eq!(
            Glob::new(&pattern).matches(&text),
            reference_glob(pattern.as_bytes(), text.as_bytes())
        );
    }

    /// The fuzz target `json_contract` in miniature, so CI checks it without
    /// nightly: bodies near a valid one, or raw bytes, never panic, and the
    /// delivery id changes nothing when the body locates its own event id.
    #[test]
    fn hostile_bodies_are_named_problems_never_panics(
        id in proptest::option::of(json_value()),
        key in proptest::option::of(json_value()),
        seq in proptest::option::of(json_value()),
        kind in proptest::option::of(json_value()),
        raw in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..48),
        as_raw in proptest::prelude::any::<bool>(),
    ) {
        let body = if as_raw {
            raw
        } else {
            let mut map = Map::new();
            for (name, value) in [("id", id), ("key", key), ("seq", seq), ("t", kind)] {
                if let Some(value) = value {
                    map.insert(name.to_owned(), value);
                }
            }
            serde_json::to_vec(&map).unwrap()
        };
        let c = contract(&format!("{LATEST}\nevent_type = \"/t\"\nevent_types = [\"a*\"]"));
        let h = HeaderMap::new();
        let plain = c.parse_bytes(&body, &h, None);
        if let Err(err) = &plain {
            proptest::prop_assert!(!err.problems.is_empty());
        }
        let with = c.parse_bytes(&body, &h, Some("msg_prop"));
        proptest::prop_assert_eq!(plain, with);
    }

    #[test]
    fn digit_strings_and_numbers_are_the_same_sequence(n in 0..=i64::MAX) {
        let c = contract(LATEST);
        let h = HeaderMap::new();
        let of = |v: Value| event(&c, json!({"id": "e", "key": "k", "seq": v}), &h, None).sequence;
        proptest::prop_assert_eq!(of(json!(n)), of(json!(n.to_string())));
        proptest::prop_assert_eq!(of(json!(n)).unwrap().value.get(), n);
    }
}

/// json ingest should cost about what save-game's does (docs/benchmarks.md); this prints the
/// ratio on similar bodies (run with `--ignored --nocapture`, in release for
/// numbers that mean anything). No assertion: timings vary by machine.
#[test]
#[ignore]
fn parse_cost_against_save_game() {
    let save = br#"{"event_id":"evt_0001","event_type":"inventory.updated","payload_version":1,
            "occurred_at":"2024-05-01T10:20:30Z","player_id":"player_1","save_slot":"slot_a",
            "sequence":42,"idempotency_key":"idem_0001",
            "data":{"added_items":[{"item_id":"sword","qty":1},{"item_id":"potion","qty":3}],
            "removed_items":[{"item_id":"gold","qty":50}]}}"#;
    let json_body = br#"{"id":"evt_0001","type":"inventory.updated","api_version":1,
            "occurred_at":"2024-05-01T10:20:30Z","player":"player_1","slot":"slot_a",
            "created":42,"request":{"idempotency_key":"idem_0001"},
            "data":{"added_items":[{"item_id":"sword","qty":1},{"item_id":"potion","qty":3}],
            "removed_items":[{"item_id":"gold","qty":50}]}}"#;
    let c = contract(
        r#"
            event_id = "/id"
            idempotency_key = "/request/idempotency_key"
            aggregate = ["/player", "/slot"]
            sequence = "/created"
            event_type = "/type"
            event_types = ["inventory.*"]
            ordering = "in-order"
            state = "/data"
            "#,
    );
    let h = headers(&[("webhook-id", "msg_1")]);
    let rounds = 200_000;
    let time = |f: &dyn Fn()| {
        let start = std::time::Instant::now();
        for _ in 0..rounds {
            f();
        }
        start.elapsed()
    };
    let save_cost = time(&|| {
        std::hint::black_box(crate::domain::kind::save::SaveEvent::parse(
            std::hint::black_box(save),
        ))
        .unwrap();
    });
    let json_cost = time(&|| {
        std::hint::black_box(c.parse_bytes(std::hint::black_box(json_body), &h, None)).unwrap();
    });
    println!(
        "save-game {:?}/parse, json {:?}/parse, json/save-game = {:.2}",
        save_cost / rounds,
        json_cost / rounds,
        json_cost.as_secs_f64() / save_cost.as_secs_f64()
    );
}

#[test]
fn alternatives_are_tried_in_order_and_the_first_present_wins() {
    let c = contract(
        r#"
            event_id = "header:X-Id|/id"
            aggregate = ["/repo", "/pull_request/number|/issue/number"]
            sequence = "/pull_request/n|/issue/n"
            state = "/pull_request|/issue"
            ordering = "latest-wins"
        "#,
    );
    let body = json!({"id": "b", "repo": "web",
                          "pull_request": {"number": 7, "n": 2},
                          "issue": {"number": 9, "n": 1}});
    // Both present: the first alternative wins, header or pointer alike.
    let e = event(&c, body.clone(), &headers(&[("x-id", "h")]), None);
    assert_eq!(e.event_id.as_str(), "h");
    assert_eq!(e.aggregate[1].as_str(), "7");
    assert_eq!(e.sequence.unwrap().value.get(), 2);
    assert_eq!(e.state, Some(json!({"number": 7, "n": 2})));
    // The first absent (or null): the next.
    let issue = json!({"id": "b", "repo": "web", "pull_request": null,
                           "issue": {"number": 9, "n": 1}});
    let e = event(&c, issue, &HeaderMap::new(), None);
    assert_eq!(e.event_id.as_str(), "b");
    assert_eq!(e.aggregate[1].as_str(), "9");
    assert_eq!(e.sequence.unwrap().value.get(), 1);
    assert_eq!(e.state, Some(json!({"number": 9, "n": 1})));
    // None present: the whole text is named; a bad value names its alternative.
    let p = problems(&c, json!({"id": "b", "repo": "web"}), &HeaderMap::new());
    assert!(p.contains(&(
        "/pull_request/number|/issue/number".into(),
        "is required".into()
    )));
    let p = problems(
        &c,
        json!({"id": "b", "repo": "web", "issue": {"number": [1], "n": 1}}),
        &HeaderMap::new(),
    );
    assert_eq!(p[0].0, "/issue/number", "{p:?}");
    // A header sent twice is a problem, not a reason to try the next alternative.
    let p = problems(&c, body, &headers(&[("x-id", "1"), ("x-id", "2")]));
    assert_eq!(p[0].0, "header:X-Id", "{p:?}");
}

#[test]
fn an_empty_alternative_or_a_bad_unwrap_is_a_config_error() {
    let cases = [
        ("ordering = \"unordered\"\nevent_id = \"/a|\"", "event_id"),
        ("ordering = \"unordered\"\nevent_id = \"|/a\"", "event_id"),
        (
            "ordering = \"latest-wins\"\naggregate = [\"/a\", \"/b||/c\"]\nsequence = \"/s\"",
            "aggregate",
        ),
        (
            "ordering = \"unordered\"\nstate = \"/a|header:X-S\"",
            "state",
        ),
        (
            "ordering = \"unordered\"\nunwrap = \"header:X-P\"",
            "unwrap",
        ),
        ("ordering = \"unordered\"\nunwrap = \"payload\"", "unwrap"),
    ];
    for (text, key) in cases {
        let err = config_error(text);
        assert_eq!(err.key, key, "{text}: {err}");
    }
    assert!(config_error("ordering = \"unordered\"\nevent_id = \"/a|\"")
        .problem
        .contains("empty alternative"));
    assert!(toml::from_str::<JsonSourceSpec>("body_format = \"xml\"").is_err());
    assert_eq!(
        spec("body_format = \"form\"").body_format,
        Some(BodyFormat::Form)
    );
}

#[test]
fn unwrap_problems_name_the_location() {
    let c = contract(
        r#"
            body_format = "form"
            unwrap = "/payload"
            event_id = "/id"
            ordering = "unordered"
        "#,
    );
    let h = HeaderMap::new();
    for (body, fragment) in [
        (&b"other=1"[..], "is required"),
        (b"payload=%7Bnot", "must be a string holding JSON"),
        (b"payload=1&payload=2", "got an array"),
        (
            b"payload=%7B%22id%22%3A1%2C%22id%22%3A2%7D",
            "must be a string holding JSON",
        ),
    ] {
        let err = c.parse_bytes(body, &h, None).unwrap_err();
        assert_eq!(err.problems[0].field, "/payload", "{err}");
        assert!(err.problems[0].problem.contains(fragment), "{err}");
    }
    let parsed = c
        .parse_bytes(b"payload=%7B%22id%22%3A%22e1%22%7D", &h, None)
        .unwrap();
    let JsonParsed::Event(e) = parsed else {
        panic!("{parsed:?}")
    };
    assert_eq!(e.event_id.as_str(), "e1");
    // Without `state`, the state is the unwrapped document.
    assert_eq!(e.state, Some(json!({"id": "e1"})));
    // A form source without `unwrap` keeps the fields object.
    let c = contract("body_format = \"form\"\nevent_id = \"/id\"\nordering = \"unordered\"");
    assert_eq!(
        c.state_of(b"id=e2&a=1&a=2", "").unwrap(),
        Some(json!({"id": "e2", "a": ["1", "2"]}))
    );
    // A JSON source does not read forms.
    let c = contract("event_id = \"/id\"\nordering = \"unordered\"");
    assert_eq!(
        c.parse_bytes(b"id=e3", &h, None).unwrap_err().problems[0].field,
        "$"
    );
}
