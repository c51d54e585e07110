//! The SNS message reader and URL check: any bytes parse to a message with its string to
//! sign, or are refused naming a field; never a panic. A URL passes only as https on an
//! allowed host.
#![no_main]

use inhook::ingress::signature::aws_sns::{Message, SnsConfig};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(message) = Message::parse(data) {
        let text = message.string_to_sign();
        assert!(text.starts_with(b"Message\n"));
        assert!(text.ends_with(format!("Type\n{}\n", message.kind.name()).as_bytes()));
    }
    if let Ok(raw) = std::str::from_utf8(data) {
        let config = SnsConfig::parse(None, None).expect("the defaults parse");
        if let Ok(url) = config.allowed_url("SigningCertURL", raw) {
            assert_eq!(url.scheme(), "https");
            let host = url.host_str().expect("a host");
            assert!(host.to_ascii_lowercase().ends_with(".amazonaws.com"), "{host}");
        }
    }
});
