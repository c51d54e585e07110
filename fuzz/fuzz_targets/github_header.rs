//! `X-Hub-Signature-256: sha256=<hex>`.
#![no_main]

use inhook::ingress::signature::github;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if github::parse_signature(raw).is_some() {
        // Read as `hmac` settings read a signature: spaces after the prefix are dropped.
        assert!(raw.starts_with("sha256=") && raw[7..].trim().len() == 64);
    }
});
