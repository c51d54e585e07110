//! A stored value read back as sealed (docs/encryption.md): whatever the bytes, reading
//! its key id and opening it never panics, and only a value sealed under the key opens.
#![no_main]

use inhook::domain::encryption::{is_sealed, sealed_key_id, sealed_text_key_id, Binding, Column, DataKey};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|raw: &[u8]| {
    let key = DataKey::generate();
    let binding = Binding::event(Column::Body, "evt");
    if sealed_key_id(raw).is_some() {
        assert!(is_sealed(raw));
    }
    assert!(key.open(raw, binding).is_err());
    if let Ok(text) = std::str::from_utf8(raw) {
        let _ = sealed_text_key_id(text);
        assert!(key.open_text(text, binding).is_err());
    }
    let sealed = key.seal(raw, binding);
    assert_eq!(key.open(&sealed, binding).unwrap(), raw);
});
