//! Whole deliveries through `verify`, for every scheme: arbitrary values in
//! the scheme's headers and an arbitrary body must never panic, and never
//! verify (a forgery against fixed secrets would be a finding).
#![no_main]

use std::sync::OnceLock;

use http::{HeaderMap, HeaderValue};
use inhook::ingress::signature::{standard_webhooks, verify, Scheme, Secret};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let scheme = Scheme::ALL[pick as usize % Scheme::ALL.len()];
    // Header values, then the body, separated by 0xFF (never valid in a header value).
    let mut parts = rest.split(|&b| b == 0xFF);
    let mut headers = HeaderMap::new();
    for (name, _) in scheme.required_headers() {
        if let Some(value) = parts.next().and_then(|v| HeaderValue::from_bytes(v).ok()) {
            headers.insert(*name, value);
        }
    }
    let body: Vec<u8> = parts.flatten().copied().collect();
    static SECRETS: OnceLock<[Secret; 3]> = OnceLock::new();
    let secrets = SECRETS.get_or_init(|| {
        [
            Secret::new("whsec_c3RhbmRhcmQtd2ViaG9va3Mtb2xkLXNlY3JldA=="),
            Secret::new(standard_webhooks::format_keypair(&[1; 32]).0),
            Secret::new("plain-secret"),
        ]
    });
    let result = verify(scheme, &headers, &body, secrets, 1_800_000_000, 300);
    assert!(
        result.is_err(),
        "{scheme} verified fuzzed input: {result:?}"
    );
});
