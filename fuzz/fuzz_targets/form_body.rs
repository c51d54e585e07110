//! The form reader: any bytes read to a fields object of strings and arrays of strings,
//! or name their problem; never a panic. What it reads, encoded again, reads the same.
#![no_main]

use inhook::domain::kind::json::form::read_form;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let Ok(fields) = read_form(data) else {
        return;
    };
    let mut encoded = String::new();
    for (name, value) in &fields {
        let values = match value {
            Value::String(one) => vec![one.as_str()],
            Value::Array(many) => {
                assert!(many.len() >= 2);
                many.iter().map(|v| v.as_str().expect("a string")).collect()
            }
            other => panic!("a field is {other}"),
        };
        for value in values {
            if !encoded.is_empty() {
                encoded.push('&');
            }
            encoded.push_str(
                &percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC)
                    .to_string(),
            );
            encoded.push('=');
            encoded.push_str(
                &percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
                    .to_string(),
            );
        }
    }
    assert_eq!(read_form(encoded.as_bytes()).ok(), Some(fields));
});
