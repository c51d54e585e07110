//! `X-Shopify-Hmac-SHA256: <base64>`.
#![no_main]

use inhook::ingress::signature::shopify;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if shopify::parse_signature(raw).is_some() {
        assert!((43..=44).contains(&raw.len()), "{raw:?}");
    }
});
