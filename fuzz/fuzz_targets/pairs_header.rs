//! A `pairs` signature header of `signature = "hmac"`: `t=…,v1=…;v1=…`.
#![no_main]

use inhook::ingress::signature::configurable::{parse_pairs, MAX_ENTRIES};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(pairs) = parse_pairs(raw, "v1", Some("t")) {
        assert!(!pairs.signatures.is_empty() && pairs.signatures.len() <= MAX_ENTRIES);
        assert!(raw.contains("v1"));
        // Every value is a piece of the header, trimmed.
        for value in pairs.signatures.iter().chain(pairs.timestamp.iter()) {
            assert!(raw.contains(value));
            assert_eq!(*value, value.trim());
        }
    }
});
