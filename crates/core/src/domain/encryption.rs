//! Encryption at rest (docs/encryption.md): envelope encryption with no I/O. Each
//! aggregate has a random data key; a named master key wraps it; every stored body,
//! header set, state and error text of the aggregate is sealed under its data key with
//! AES-256-GCM (ring), bound to its row and column as associated data. Destroying an
//! aggregate's data key leaves its ciphertexts unreadable for good (erasure).

use std::fmt;

use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};

/// Bytes of a master key and of a data key.
pub const KEY_BYTES: usize = 32;

/// The first bytes of a sealed byte column. A logged body is never plaintext starting
/// with a NUL byte (every kind parses its body as JSON before it is logged), so a sealed
/// value and a plaintext one written before encryption was on never look alike.
const MAGIC: [u8; 4] = [0x00, b'I', b'H', 0x01];

/// The prefix of a sealed text column: stored texts (JSON, inhook's own error words)
/// never start with it.
const TEXT_PREFIX: &str = "sealed:v1:";

/// Bytes of the GCM tag.
const TAG_LEN: usize = 16;

/// The header of a sealed value: magic, data key id, nonce.
const HEADER_LEN: usize = MAGIC.len() + 8 + NONCE_LEN;

/// A master key's id as configured (`k1` in `k1:BASE64`): letters, digits, `-`, `_`, `.`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(String);

impl KeyId {
    /// Longest id accepted.
    const MAX_LEN: usize = 64;

    /// `raw` as a key id, if it is one.
    pub fn parse(raw: &str) -> Option<Self> {
        let valid = !raw.is_empty()
            && raw.len() <= Self::MAX_LEN
            && raw
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        valid.then(|| Self(raw.to_owned()))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why the configured master keys cannot be used. Never holds a key's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    /// `[encryption] keys` is present but empty.
    #[error("[encryption] keys lists no key: give at least one \"id:BASE64_32_BYTES\"")]
    NoKeys,
    /// An entry is not `id:base64`.
    #[error(
        "[encryption] keys: entry {position} is not \"id:BASE64_32_BYTES\" (an id of letters, \
         digits, '-', '_' or '.', a colon, then the key in standard base64)"
    )]
    Malformed {
        /// Its place in the list, from 1.
        position: usize,
    },
    /// The value is not standard base64.
    #[error("[encryption] keys: key {id} is not standard base64")]
    NotBase64 {
        /// The key's id.
        id: KeyId,
    },
    /// The value decodes to another length than 32 bytes.
    #[error(
        "[encryption] keys: key {id} is {len} bytes; a key is 32 bytes (openssl rand -base64 32)"
    )]
    WrongLength {
        /// The key's id.
        id: KeyId,
        /// The length it decoded to.
        len: usize,
    },
    /// Two entries share an id.
    #[error("[encryption] keys: the id {id} is given twice")]
    Duplicate {
        /// The id.
        id: KeyId,
    },
}

/// A sealed value that does not open: tampered with, copied from another row, or sealed
/// under a data key that was destroyed (erased) or a master key that is not configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("undecryptable: {0}")]
pub struct Undecryptable(pub &'static str);

/// One master key: wraps and unwraps data keys.
pub struct MasterKey {
    id: KeyId,
    key: LessSafeKey,
}

impl fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MasterKey({})", self.id)
    }
}

/// The configured master keys: the first wraps new data keys, every one unwraps.
pub struct MasterKeys {
    keys: Vec<MasterKey>,
    /// A digest of the list as configured, to tell a changed list on a reload (SHA-256
    /// of 32 random bytes gives nothing of them away); never shown.
    fingerprint: [u8; 32],
}

impl MasterKeys {
    /// Parses `id:BASE64` entries (`[encryption] keys`, `INHOOK_ENCRYPTION_KEYS`).
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, KeyError> {
        if entries.is_empty() {
            return Err(KeyError::NoKeys);
        }
        let mut keys: Vec<MasterKey> = Vec::with_capacity(entries.len());
        let mut digest = ring::digest::Context::new(&ring::digest::SHA256);
        for (at, entry) in entries.iter().enumerate() {
            let malformed = KeyError::Malformed { position: at + 1 };
            let (id, value) = entry
                .as_ref()
                .trim()
                .split_once(':')
                .ok_or(malformed.clone())?;
            let id = KeyId::parse(id.trim()).ok_or(malformed)?;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(value.trim())
                .map_err(|_| KeyError::NotBase64 { id: id.clone() })?;
            if bytes.len() != KEY_BYTES {
                return Err(KeyError::WrongLength {
                    id,
                    len: bytes.len(),
                });
            }
            if keys.iter().any(|k| k.id == id) {
                return Err(KeyError::Duplicate { id });
            }
            digest.update(id.as_str().as_bytes());
            digest.update(&bytes);
            keys.push(MasterKey {
                key: aead_key(&bytes),
                id,
            });
        }
        let mut fingerprint = [0u8; 32];
        fingerprint.copy_from_slice(digest.finish().as_ref());
        Ok(Self { keys, fingerprint })
    }

    /// Whether `other` lists the same keys, in the same order.
    pub fn same_as(&self, other: &MasterKeys) -> bool {
        self.fingerprint == other.fingerprint
    }

    /// The key that wraps new data keys (the first configured).
    pub fn first(&self) -> &MasterKey {
        &self.keys[0]
    }

    /// The key named `id`, if configured.
    pub fn get(&self, id: &str) -> Option<&MasterKey> {
        self.keys.iter().find(|k| k.id.as_str() == id)
    }

    /// Every configured id, first first.
    pub fn ids(&self) -> impl Iterator<Item = &KeyId> {
        self.keys.iter().map(|k| &k.id)
    }
}

impl fmt::Debug for MasterKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.ids()).finish()
    }
}

fn aead_key(bytes: &[u8]) -> LessSafeKey {
    // AES-256 takes any 32 bytes: only a wrong length fails, and every caller has 32.
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, bytes).expect("a 32-byte AES-256 key"))
}

fn random<const N: usize>() -> [u8; N] {
    let mut bytes = [0u8; N];
    // The system's generator failing leaves no safe way to go on.
    SystemRandom::new()
        .fill(&mut bytes)
        .expect("the system random generator failed");
    bytes
}

/// A fresh nonce, from the thread's CSPRNG (ChaCha, seeded and reseeded from the
/// system): every event's values are sealed on the hot path, and this takes no system
/// call. 96 random bits: a repeat under one data key is out of reach at any event rate.
fn nonce() -> [u8; NONCE_LEN] {
    use rand::RngCore;
    let mut bytes = [0u8; NONCE_LEN];
    rand::thread_rng().fill_bytes(&mut bytes);
    bytes
}

/// What a wrapped data key is bound to: a wrapped key copied to another aggregate's
/// row does not unwrap.
fn wrap_aad(id: i64, source: &str, aggregate: &str) -> Vec<u8> {
    let mut aad = b"inhook/data-key/v1".to_vec();
    aad.extend_from_slice(&id.to_be_bytes());
    push_part(&mut aad, source.as_bytes());
    push_part(&mut aad, aggregate.as_bytes());
    aad
}

fn push_part(aad: &mut Vec<u8>, part: &[u8]) {
    aad.extend_from_slice(&(part.len() as u64).to_be_bytes());
    aad.extend_from_slice(part);
}

impl MasterKey {
    /// Its id.
    pub fn id(&self) -> &KeyId {
        &self.id
    }

    /// Wraps the data key `key` of the aggregate: nonce then ciphertext and tag.
    pub fn wrap(&self, key: &DataKey, source: &str, aggregate: &str) -> Vec<u8> {
        let nonce = random::<NONCE_LEN>();
        let mut sealed = key.raw.to_vec();
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(wrap_aad(key.id, source, aggregate)),
                &mut sealed,
            )
            .expect("sealing 32 bytes cannot overflow");
        let mut wrapped = nonce.to_vec();
        wrapped.extend_from_slice(&sealed);
        wrapped
    }

    /// The data key `id` of the aggregate, from what [`MasterKey::wrap`] made.
    pub fn unwrap(
        &self,
        id: i64,
        wrapped: &[u8],
        source: &str,
        aggregate: &str,
    ) -> Result<DataKey, Undecryptable> {
        if wrapped.len() != NONCE_LEN + KEY_BYTES + TAG_LEN {
            return Err(Undecryptable("a wrapped data key of the wrong length"));
        }
        let (nonce, sealed) = wrapped.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce)
            .map_err(|_| Undecryptable("a wrapped data key without its nonce"))?;
        let mut buffer = sealed.to_vec();
        let raw = self
            .key
            .open_in_place(
                nonce,
                Aad::from(wrap_aad(id, source, aggregate)),
                &mut buffer,
            )
            .map_err(|_| Undecryptable("a data key that does not unwrap"))?;
        let mut bytes = [0u8; KEY_BYTES];
        bytes.copy_from_slice(raw);
        Ok(DataKey::from_raw(id, bytes))
    }
}

/// A column that holds sealed values: part of each value's associated data, so that a
/// ciphertext moved to another column does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Column {
    /// An event's raw body.
    Body,
    /// An event's kept request headers.
    Headers,
    /// An event's error texts: its last error, its dead reason's detail, its history's.
    LastError,
    /// An aggregate's state.
    State,
    /// A change-feed row's state.
    Change,
}

impl Column {
    fn label(self) -> &'static [u8] {
        match self {
            Column::Body => b"body",
            Column::Headers => b"headers",
            Column::LastError => b"last_error",
            Column::State => b"state",
            Column::Change => b"change",
        }
    }
}

/// What one sealed value is bound to within its aggregate (whose data key already binds
/// the source and aggregate): its column and its row (an event's id; the aggregate's key
/// for its state and its change-feed rows).
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    /// The column.
    pub column: Column,
    /// The row within the aggregate.
    pub row: &'a str,
}

impl<'a> Binding<'a> {
    /// A column of the event `event_id`.
    pub fn event(column: Column, event_id: &'a str) -> Self {
        Self {
            column,
            row: event_id,
        }
    }

    fn aad(&self, key_id: i64) -> Vec<u8> {
        let mut aad = b"inhook/value/v1".to_vec();
        aad.extend_from_slice(&key_id.to_be_bytes());
        push_part(&mut aad, self.column.label());
        push_part(&mut aad, self.row.as_bytes());
        aad
    }
}

/// One aggregate's data key, unwrapped.
pub struct DataKey {
    id: i64,
    raw: [u8; KEY_BYTES],
    key: LessSafeKey,
}

impl fmt::Debug for DataKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DataKey({})", self.id)
    }
}

impl DataKey {
    /// A new random data key with a random positive id: made before its row is written,
    /// so that what it seals names it already.
    pub fn generate() -> Self {
        let id = i64::from_be_bytes(random::<8>()) & i64::MAX;
        Self::from_raw(id.max(1), random::<KEY_BYTES>())
    }

    fn from_raw(id: i64, raw: [u8; KEY_BYTES]) -> Self {
        Self {
            id,
            key: aead_key(&raw),
            raw,
        }
    }

    /// Its id, stored with every value it seals.
    pub fn id(&self) -> i64 {
        self.id
    }

    /// `plaintext` sealed for `binding`: magic, key id, nonce, ciphertext and tag.
    pub fn seal(&self, plaintext: &[u8], binding: Binding<'_>) -> Vec<u8> {
        let nonce = nonce();
        let mut sealed = Vec::with_capacity(HEADER_LEN + plaintext.len() + TAG_LEN);
        sealed.extend_from_slice(&MAGIC);
        sealed.extend_from_slice(&self.id.to_be_bytes());
        sealed.extend_from_slice(&nonce);
        sealed.extend_from_slice(plaintext);
        let mut body = sealed.split_off(HEADER_LEN);
        self.key
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(binding.aad(self.id)),
                &mut body,
            )
            .expect("a value under 64 GiB seals");
        sealed.extend_from_slice(&body);
        sealed
    }

    /// `plaintext` sealed as a text column's value.
    pub fn seal_text(&self, plaintext: &str, binding: Binding<'_>) -> String {
        let sealed = self.seal(plaintext.as_bytes(), binding);
        let mut text = String::with_capacity(TEXT_PREFIX.len() + sealed.len() * 4 / 3 + 4);
        text.push_str(TEXT_PREFIX);
        base64::engine::general_purpose::STANDARD.encode_string(&sealed, &mut text);
        text
    }

    /// The plaintext of a value [`DataKey::seal`] made for `binding`.
    pub fn open(&self, sealed: &[u8], binding: Binding<'_>) -> Result<Vec<u8>, Undecryptable> {
        if sealed_key_id(sealed) != Some(self.id) {
            return Err(Undecryptable("sealed under another data key"));
        }
        let nonce = Nonce::try_assume_unique_for_key(&sealed[MAGIC.len() + 8..HEADER_LEN])
            .map_err(|_| Undecryptable("a sealed value without its nonce"))?;
        let mut body = sealed[HEADER_LEN..].to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(binding.aad(self.id)), &mut body)
            .map_err(|_| Undecryptable("a sealed value that does not open under its key"))?
            .len();
        body.truncate(plain);
        Ok(body)
    }

    /// The plaintext of a value [`DataKey::seal_text`] made for `binding`.
    pub fn open_text(&self, sealed: &str, binding: Binding<'_>) -> Result<String, Undecryptable> {
        let bytes = sealed_text_bytes(sealed).ok_or(Undecryptable("not a sealed text"))?;
        let plain = self.open(&bytes, binding)?;
        String::from_utf8(plain).map_err(|_| Undecryptable("a sealed text that is not UTF-8"))
    }
}

/// The data key id a sealed byte value names; `None` for a plaintext value.
pub fn sealed_key_id(value: &[u8]) -> Option<i64> {
    if value.len() < HEADER_LEN + TAG_LEN || value[..MAGIC.len()] != MAGIC {
        return None;
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&value[MAGIC.len()..MAGIC.len() + 8]);
    Some(i64::from_be_bytes(id))
}

/// Whether a byte value is sealed (as opposed to plaintext written before encryption).
pub fn is_sealed(value: &[u8]) -> bool {
    value.starts_with(&MAGIC)
}

/// Whether a text value is sealed.
pub fn is_sealed_text(value: &str) -> bool {
    value.starts_with(TEXT_PREFIX)
}

fn sealed_text_bytes(value: &str) -> Option<Vec<u8>> {
    let encoded = value.strip_prefix(TEXT_PREFIX)?;
    base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()
}

/// The data key id a sealed text value names; `None` for a plaintext value.
pub fn sealed_text_key_id(value: &str) -> Option<i64> {
    if !is_sealed_text(value) {
        return None;
    }
    // Only the header is needed: decode just enough base64 for it.
    let head: String = value[TEXT_PREFIX.len()..]
        .chars()
        .take(HEADER_LEN.div_ceil(3) * 4)
        .collect();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(head)
        .ok()?;
    if bytes.len() < MAGIC.len() + 8 || bytes[..MAGIC.len()] != MAGIC {
        return None;
    }
    let mut id = [0u8; 8];
    id.copy_from_slice(&bytes[MAGIC.len()..MAGIC.len() + 8]);
    Some(i64::from_be_bytes(id))
}

/// The keyed hash that stands for a body in the body-equality dedup when encryption is
/// on: a plain SHA-256 would let whoever holds the database test a guessed body.
pub struct BodyHasher {
    key: ring::hmac::Key,
    /// The search index's own key, derived from this one: rotation rewraps the stored
    /// key and never changes it, so a search after `inhook rekey` finds the old events.
    search: ring::hmac::Key,
    raw: [u8; KEY_BYTES],
}

impl fmt::Debug for BodyHasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BodyHasher")
    }
}

/// What the search key is derived from the body hasher's key with.
const SEARCH_KEY_LABEL: &[u8] = b"inhook search index v1";

/// The name the body hasher's key is stored under, as the associated data of its wrapping.
pub const BODY_HASH_KEY: &str = "body_hash";

impl BodyHasher {
    /// A new random hasher.
    pub fn generate() -> Self {
        Self::from_raw(random::<KEY_BYTES>())
    }

    fn from_raw(raw: [u8; KEY_BYTES]) -> Self {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &raw);
        let derived = ring::hmac::sign(&key, SEARCH_KEY_LABEL);
        Self {
            search: ring::hmac::Key::new(ring::hmac::HMAC_SHA256, derived.as_ref()),
            key,
            raw,
        }
    }

    /// The keyed hash a search index row holds for the value `value` at the pointer
    /// `field`, in hex: the field is length-prefixed, so no two pairs share a message.
    pub fn search_hash(&self, field: &str, value: &str) -> String {
        let mut ctx = ring::hmac::Context::with_key(&self.search);
        ctx.update(&(field.len() as u64).to_be_bytes());
        ctx.update(field.as_bytes());
        ctx.update(value.as_bytes());
        hex::encode(ctx.sign().as_ref())
    }

    /// The hash of `body`, in hex.
    pub fn hash(&self, body: &[u8]) -> String {
        hex::encode(ring::hmac::sign(&self.key, body).as_ref())
    }

    /// Its key wrapped by `master` (stored in `store_keys`).
    pub fn wrap(&self, master: &MasterKey) -> Vec<u8> {
        let key = DataKey::from_raw(0, self.raw);
        master.wrap(&key, "", BODY_HASH_KEY)
    }

    /// The hasher whose key [`BodyHasher::wrap`] wrapped.
    pub fn unwrap(master: &MasterKey, wrapped: &[u8]) -> Result<Self, Undecryptable> {
        let key = master.unwrap(0, wrapped, "", BODY_HASH_KEY)?;
        Ok(Self::from_raw(key.raw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(entries: &[&str]) -> MasterKeys {
        MasterKeys::parse(entries).unwrap()
    }

    const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
    const K2: &str = "k2:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";

    #[test]
    fn keys_parse_first_encrypts_all_decrypt() {
        let masters = keys(&[K2, K1]);
        assert_eq!(format!("{masters:?}"), r#"[KeyId("k2"), KeyId("k1")]"#);
        assert_eq!(masters.first().id().as_str(), "k2");
        assert!(masters.get("k1").is_some());
        assert!(masters.get("k3").is_none());
    }

    #[test]
    fn bad_keys_name_the_id_never_the_value() {
        let short = "k9:c2hvcnQ=";
        let err = MasterKeys::parse(&[short]).unwrap_err();
        assert_eq!(
            err,
            KeyError::WrongLength {
                id: KeyId("k9".into()),
                len: 5
            }
        );
        assert!(!err.to_string().contains("c2hvcnQ"));
        assert!(matches!(
            MasterKeys::parse(&["k1:not base64!!"]).unwrap_err(),
            KeyError::NotBase64 { .. }
        ));
        assert_eq!(
            MasterKeys::parse(&["nocolon"]).unwrap_err(),
            KeyError::Malformed { position: 1 }
        );
        assert!(matches!(
            MasterKeys::parse(&[K1, K1]).unwrap_err(),
            KeyError::Duplicate { .. }
        ));
        assert_eq!(
            MasterKeys::parse::<&str>(&[]).unwrap_err(),
            KeyError::NoKeys
        );
    }

    #[test]
    fn a_sealed_value_opens_only_in_its_row_and_column() {
        let key = DataKey::generate();
        let binding = Binding::event(Column::Body, "evt-1");
        let sealed = key.seal(b"{\"email\":\"a@b.c\"}", binding);
        assert!(is_sealed(&sealed));
        assert_eq!(sealed_key_id(&sealed), Some(key.id()));
        assert_eq!(
            key.open(&sealed, binding).unwrap(),
            b"{\"email\":\"a@b.c\"}"
        );
        assert!(key
            .open(&sealed, Binding::event(Column::Body, "evt-2"))
            .is_err());
        assert!(key
            .open(&sealed, Binding::event(Column::Headers, "evt-1"))
            .is_err());
        let mut tampered = sealed.clone();
        *tampered.last_mut().unwrap() ^= 1;
        assert!(key.open(&tampered, binding).is_err());
        assert!(DataKey::generate().open(&sealed, binding).is_err());
    }

    #[test]
    fn sealed_texts_name_their_key_and_round_trip() {
        let key = DataKey::generate();
        let binding = Binding::event(Column::State, "player-1");
        let sealed = key.seal_text("{\"level\":3}", binding);
        assert!(is_sealed_text(&sealed));
        assert!(!sealed.contains("level"));
        assert_eq!(sealed_text_key_id(&sealed), Some(key.id()));
        assert_eq!(key.open_text(&sealed, binding).unwrap(), "{\"level\":3}");
        assert_eq!(sealed_text_key_id("{\"level\":3}"), None);
    }

    #[test]
    fn a_wrapped_key_unwraps_only_for_its_aggregate_under_its_master() {
        let masters = keys(&[K1, K2]);
        let key = DataKey::generate();
        let wrapped = masters.first().wrap(&key, "shop", "customer-1");
        let again = masters
            .first()
            .unwrap(key.id(), &wrapped, "shop", "customer-1")
            .unwrap();
        let sealed = key.seal(b"x", Binding::event(Column::Body, "e"));
        assert_eq!(
            again
                .open(&sealed, Binding::event(Column::Body, "e"))
                .unwrap(),
            b"x"
        );
        assert!(masters
            .first()
            .unwrap(key.id(), &wrapped, "shop", "customer-2")
            .is_err());
        assert!(masters
            .get("k2")
            .unwrap()
            .unwrap(key.id(), &wrapped, "shop", "customer-1")
            .is_err());
    }

    #[test]
    fn the_body_hash_is_keyed_and_survives_wrapping() {
        let masters = keys(&[K1]);
        let hasher = BodyHasher::generate();
        let again = BodyHasher::unwrap(masters.first(), &hasher.wrap(masters.first())).unwrap();
        assert_eq!(hasher.hash(b"body"), again.hash(b"body"));
        assert_ne!(hasher.hash(b"body"), BodyHasher::generate().hash(b"body"));
        assert_eq!(hasher.hash(b"body").len(), 64);
        assert_eq!(
            hasher.search_hash("/a", "x"),
            again.search_hash("/a", "x"),
            "the search key survives rewrapping"
        );
    }

    #[test]
    fn the_search_hash_is_keyed_and_apart_from_the_body_hash() {
        let hasher = BodyHasher::generate();
        let h = hasher.search_hash("/a", "bc");
        assert_eq!(h.len(), 64);
        assert_ne!(h, hasher.search_hash("/ab", "c"), "the field is delimited");
        assert_ne!(h, hasher.search_hash("/a", "bd"));
        assert_ne!(h, BodyHasher::generate().search_hash("/a", "bc"));
        assert_ne!(h, hasher.hash(b"/abc"));
    }

    #[test]
    fn plaintext_values_are_not_taken_for_sealed_ones() {
        assert!(!is_sealed(b"{\"a\":1}"));
        assert_eq!(sealed_key_id(b"\x00IH\x01short"), None);
        assert!(!is_sealed_text("{\"a\":1}"));
    }
}
