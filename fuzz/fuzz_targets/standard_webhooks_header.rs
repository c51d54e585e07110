//! `webhook-signature` lists, and Standard Webhooks keys as configured.
#![no_main]

use inhook::ingress::signature::standard_webhooks::{self, Key, Signature, MAX_SIGNATURES};
use inhook::ingress::signature::Secret;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(signatures) = standard_webhooks::parse_signatures(raw) {
        assert!(!signatures.is_empty() && signatures.len() <= MAX_SIGNATURES);
        for s in &signatures {
            match s {
                Signature::V1(_) => assert!(raw.contains("v1,")),
                Signature::V1a(_) => assert!(raw.contains("v1a,")),
            }
        }
    }
    // A key that parses signs, or is a public key that refuses to.
    let secret = Secret::new(raw);
    if let Ok(key) = Key::parse(&secret) {
        let signed = inhook::ingress::signature::try_sign(
            inhook::ingress::signature::Scheme::StandardWebhooks,
            b"{}",
            &secret,
            1_800_000_000,
            Some("msg_fuzz"),
        );
        assert_eq!(signed.is_ok(), !matches!(key, Key::Public(_)));
    }
});
