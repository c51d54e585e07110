//! The public-key parsers (`public_keys` of `ed25519` and `ecdsa-p256` sources, and
//! `inhook send --private-key`), and the Twilio form reader: configuration and delivery
//! text never panics them, and what they accept is what they say.
#![no_main]

use inhook::ingress::signature::public_key::{
    parse_ed25519, parse_p256_spki, p256_spki_base64, Algorithm, PrivateKey,
};
use inhook::ingress::signature::twilio::{parse_form, MAX_PARAMETERS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(key) = parse_ed25519(raw) {
        assert_eq!(key.len(), 32);
    }
    if let Ok(point) = parse_p256_spki(raw) {
        assert_eq!(point[0], 0x04);
        // What parses prints back as the SPKI it came from.
        assert_eq!(parse_p256_spki(&p256_spki_base64(&point)), Ok(point));
    }
    for algorithm in [Algorithm::Ed25519, Algorithm::EcdsaP256] {
        if let Ok(key) = PrivateKey::parse(algorithm, raw) {
            assert!(!format!("{key:?}").contains(raw.trim()) || raw.trim().is_empty());
        }
    }
    if let Some(params) = parse_form(raw.as_bytes()) {
        assert!(params.len() <= MAX_PARAMETERS);
        assert!(params.windows(2).all(|w| w[0] < w[1]));
    }
});
