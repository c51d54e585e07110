//! The handshake detector and answerer over arbitrary query, header and body: never a panic,
//! and whatever it answers echoes at most 512 bytes of text without control characters.
#![no_main]

use http::{HeaderMap, HeaderValue};
use inhook::ingress::handshake::{detect, Handshake, Outcome, Parts, MAX_ECHO_BYTES};
use inhook::ingress::signature::Secret;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: (u8, bool, &str, &[u8], &[u8])| {
    let (which, get, query, header, body) = data;
    let handshake = Handshake::ALL[usize::from(which) % Handshake::ALL.len()];
    let mut headers = HeaderMap::new();
    if let Ok(value) = HeaderValue::from_bytes(header) {
        headers.insert("x-okta-verification-challenge", value.clone());
        headers.insert("twitch-eventsub-message-type", value);
    }
    let path_and_query = format!("/webhooks/s?{query}");
    let secret = Secret::new("fuzz-secret");
    let parts = Parts {
        method: if get { "GET" } else { "POST" },
        path_and_query: &path_and_query,
        headers: &headers,
        body,
        secret: Some(&secret),
    };
    if let Outcome::Answer(reply) = detect(handshake, &parts) {
        let text = std::str::from_utf8(&reply.body).expect("an answer is UTF-8");
        // The answer is the echoed value or a small JSON object around it (and a MAC).
        assert!(reply.body.len() <= MAX_ECHO_BYTES * 6 + 128, "{}", reply.body.len());
        assert!(!text.chars().any(char::is_control), "{text:?}");
    }
});
