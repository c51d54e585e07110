//! `X-Hub-Signature-256: sha256=<hex>`.
#![no_main]

use inhook::ingress::signature::github;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if github::parse_signature(raw).is_some() {
        assert!(raw.starts_with("sha256=") && raw.len() == 7 + 64);
    }
});
