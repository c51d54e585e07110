//! `X-Slack-Signature: v0=<hex>`.
#![no_main]

use inhook::ingress::signature::slack;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if slack::parse_signature(raw).is_some() {
        assert!(raw.starts_with("v0=") && raw.len() == 3 + 64);
    }
});
