//! The `json` kind's contract: any body, with or without the delivery id,
//! parses or names its problems, never panics; accepted events hold ids that
//! follow the json rule and the aggregate parts configured.
#![no_main]

use http::{HeaderMap, HeaderValue};
use inhook::domain::kind::json::contract::{AggregateLocations, JsonContract, JsonParsed, JsonSourceSpec};
use libfuzzer_sys::fuzz_target;

/// A contract touching every kind of location: nested pointers, escapes, an
/// array index, headers, globs and a state subtree.
fn contract() -> JsonContract {
    let spec = JsonSourceSpec {
        event_id: Some("/id".into()),
        idempotency_key: Some("header:Idempotency-Key".into()),
        aggregate: Some(AggregateLocations::Many(vec![
            "/data/object/object".into(),
            "/data/a~1b/0".into(),
            "header:X-Shard".into(),
        ])),
        sequence: Some("/created".into()),
        event_type: Some("/type".into()),
        event_types: Some(vec!["invoice.*".into(), "*.created".into(), "ping".into()]),
        ordering: Some("latest-wins".into()),
        state: Some("/data/object".into()),
        body_format: None,
        unwrap: None,
    };
    JsonContract::compile(&spec).expect("the fixed spec compiles")
}

fuzz_target!(|data: &[u8]| {
    let contract = contract();
    let mut headers = HeaderMap::new();
    headers.insert("x-shard", HeaderValue::from_static("eu"));
    for delivery_id in [None, Some("msg_fuzz")] {
        match contract.parse_bytes(data, &headers, delivery_id) {
            Ok(JsonParsed::Event(event)) => {
                let id = event.event_id.as_str();
                assert!(!id.is_empty() && id.len() <= 200);
                assert_eq!(event.aggregate.len(), 3);
                assert_eq!(event.aggregate[2].as_str(), "eu");
                assert!(event.sequence.is_some());
            }
            Ok(JsonParsed::Ignored { .. }) => {}
            Err(err) => assert!(!err.problems.is_empty()),
        }
    }
});
