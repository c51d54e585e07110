//! `X-Slack-Signature: v0=<hex>`.
#![no_main]

use inhook::ingress::signature::slack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if slack::parse_signature(raw).is_some() {
        // Read as `hmac` settings read a signature: spaces after the prefix are dropped.
        assert!(raw.starts_with("v0=") && raw[3..].trim().len() == 64);
    }
});
