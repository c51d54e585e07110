//! `Stripe-Signature: t=…,v1=…[,v1=…]`.
#![no_main]

use inhook::ingress::signature::stripe::{self, MAX_ITEMS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(header) = stripe::parse_header(raw) {
        assert!(header.timestamp >= 0);
        assert!(!header.v1.is_empty() && header.v1.len() <= MAX_ITEMS);
        assert!(raw.contains("t=") && raw.contains("v1="));
    }
});
