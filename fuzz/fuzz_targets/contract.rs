//! The payload contracts: any body parses or names its problems, never panics;
//! a fallback event id changes only the event id.
#![no_main]

use inhook::contract::{Event, SourceKind};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for kind in [SourceKind::Presence, SourceKind::SaveGame] {
        let plain = Event::parse(kind, data);
        match &plain {
            Ok(event) => {
                let id = event.event_id().as_str();
                assert!(!id.is_empty() && id.len() <= 128);
            }
            Err(err) => assert!(!err.problems.is_empty()),
        }
        let with = Event::parse_with_fallback(kind, data, Some("msg_fuzz"));
        if let Ok(event) = &plain {
            // The body's own id wins.
            assert_eq!(with.as_ref().ok(), Some(event));
        }
        if let (Ok(event), Err(_)) = (&with, &plain) {
            assert_eq!(event.event_id().as_str(), "msg_fuzz");
        }
    }
});
