//! The payload contracts: any body parses or names its problems, never panics;
//! a fallback event id changes only the event id.
#![no_main]

use http::HeaderMap;
use inhook::domain::kind::{built_in, Delivery, SourceKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let headers = HeaderMap::new();
    for kind in [SourceKind::Presence, SourceKind::SaveGame] {
        let kind = built_in(kind, 0);
        let plain = kind.parse(data, &headers, None);
        match &plain {
            Ok(Delivery::Event(event)) => {
                let id = event.event_id.as_str();
                assert!(!id.is_empty() && id.len() <= 128);
            }
            Ok(Delivery::Ignored { .. }) => {}
            Err(err) => assert!(!err.problems.is_empty()),
        }
        let with = kind.parse(data, &headers, Some("msg_fuzz"));
        if let Ok(event) = &plain {
            // The body's own id wins.
            assert_eq!(with.as_ref().ok(), Some(event));
        }
        if let (Ok(Delivery::Event(event)), Err(_)) = (&with, &plain) {
            assert_eq!(event.event_id.as_str(), "msg_fuzz");
        }
    }
});
