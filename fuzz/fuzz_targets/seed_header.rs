//! `X-Signature` and every `*-timestamp` header: hex and unix-time parsing.
#![no_main]

use inhook::ingress::signature::{parse_unix_timestamp, seed};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Some(signature) = seed::parse_signature(raw) {
        assert_eq!(raw.len(), 64);
        assert_eq!(hex_lower(&signature), raw.to_ascii_lowercase());
    }
    if let Some(ts) = parse_unix_timestamp(raw) {
        assert!(ts >= 0);
        assert!(raw.bytes().all(|b| b.is_ascii_digit()), "{raw:?}");
        assert_eq!(raw.parse::<i64>().ok(), Some(ts));
    }
});

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
