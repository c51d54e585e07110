//! The `signed_content` template of `signature = "hmac"`: any text parses or is
//! refused, and a parsed template renders without panicking.
#![no_main]

use http::HeaderMap;
use inhook::ingress::signature::template::{Input, Template};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &str| {
    if let Ok(template) = Template::parse(raw) {
        assert!(!template.parts().is_empty());
        let headers = HeaderMap::new();
        let input = Input {
            body: b"{}",
            timestamp: Some("1"),
            headers: &headers,
            method: "POST",
            url: Some("https://hooks.example.com/webhooks/a"),
            json: None,
        };
        let _ = template.render(&input);
    }
});
