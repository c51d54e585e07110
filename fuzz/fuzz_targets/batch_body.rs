//! The batch splitter: any bytes split into element slices or name a problem with the
//! array's frame; never a panic. A body that is a valid JSON array splits into exactly its
//! elements, each slice parsing to the element.
#![no_main]

use inhook::domain::kind::json::batch::split_batch;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    let split = split_batch(data, 64);
    if let Ok(parts) = &split {
        for part in parts {
            assert!(!part.is_empty());
            let inside = data.as_ptr_range();
            assert!(inside.contains(&part.as_ptr()), "a slice of the body");
        }
    }
    if let Ok(Value::Array(elements)) = serde_json::from_slice::<Value>(data) {
        if elements.len() <= 64 {
            let parts = split.as_ref().expect("a JSON array splits");
            assert_eq!(parts.len(), elements.len());
            for (part, element) in parts.iter().zip(&elements) {
                assert_eq!(&serde_json::from_slice::<Value>(part).unwrap(), element);
            }
        }
    }
    if let Err(err) = &split {
        assert_eq!(err.problems[0].field, "$");
    }
});
