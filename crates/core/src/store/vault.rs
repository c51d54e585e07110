//! The store's keys (docs/encryption.md): the configured master keys, the data keys of
//! the aggregates (table `data_keys`, each wrapped by a master key) cached unwrapped in
//! memory, and the body hasher. Written once over [`Tx`]: the flows seal what they
//! write and open what they read through the [`Vault`] their transaction carries.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex, OnceLock};

use sha2::Digest as _;

use super::backend::{opt_bytes, string, text, Cell, Param, Tx};
use super::StoreError;
use crate::domain::encryption::{
    is_sealed, is_sealed_text, sealed_key_id, sealed_text_key_id, Binding, BodyHasher, DataKey,
    MasterKeys, Undecryptable, BODY_HASH_KEY,
};

/// Most unwrapped data keys kept per map: a bounded cache, two generations of this many.
const CACHED_KEYS: usize = 50_000;

/// What a body key kept from a signed content starts with ([`Vault::signed_content_hash`]).
const SIGNED_CONTENT_KEY: &str = "signed:";

/// A map bounded by two generations: when the young one fills, it becomes the old one
/// and the old one is dropped; a hit in the old one moves back to the young one. Keys in
/// use stay; the least recently used go, a generation at a time.
struct Generations<K, V> {
    young: HashMap<K, V>,
    old: HashMap<K, V>,
}

impl<K: Hash + Eq, V: Clone> Generations<K, V> {
    fn new() -> Self {
        Self {
            young: HashMap::new(),
            old: HashMap::new(),
        }
    }

    fn get(&mut self, key: &K) -> Option<V> {
        if let Some(found) = self.young.get(key) {
            return Some(found.clone());
        }
        let (key, found) = self.old.remove_entry(key)?;
        self.insert(key, found.clone());
        Some(found)
    }

    fn insert(&mut self, key: K, value: V) {
        if self.young.len() >= CACHED_KEYS {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(key, value);
    }

    fn remove(&mut self, key: &K) {
        self.young.remove(key);
        self.old.remove(key);
    }
}

/// The data keys some rows were sealed under, unwrapped: what a flow opens them with.
#[derive(Default)]
pub(crate) struct KeySet {
    keys: HashMap<i64, Arc<DataKey>>,
}

impl KeySet {
    /// A sealed byte value's plaintext; a plaintext value (written before encryption was
    /// on) as it is.
    pub fn open(&self, value: Vec<u8>, binding: Binding<'_>) -> Result<Vec<u8>, Undecryptable> {
        let Some(id) = sealed_key_id(&value) else {
            return if is_sealed(&value) {
                Err(Undecryptable("a truncated sealed value"))
            } else {
                Ok(value)
            };
        };
        self.key(id)?.open(&value, binding)
    }

    /// A sealed text value's plaintext; a plaintext value as it is.
    pub fn open_text(&self, value: String, binding: Binding<'_>) -> Result<String, Undecryptable> {
        let Some(id) = sealed_text_key_id(&value) else {
            return if is_sealed_text(&value) {
                Err(Undecryptable("a truncated sealed text"))
            } else {
                Ok(value)
            };
        };
        self.key(id)?.open_text(&value, binding)
    }

    /// [`KeySet::open_text`] of a value that may be NULL.
    pub fn open_opt_text(
        &self,
        value: Option<String>,
        binding: Binding<'_>,
    ) -> Result<Option<String>, Undecryptable> {
        value.map(|v| self.open_text(v, binding)).transpose()
    }

    /// Every key of the set.
    pub fn keys(&self) -> impl Iterator<Item = &Arc<DataKey>> {
        self.keys.values()
    }

    fn key(&self, id: i64) -> Result<&DataKey, Undecryptable> {
        self.keys
            .get(&id)
            .map(|k| k.as_ref())
            .ok_or(Undecryptable("its data key is gone (erased) or unknown"))
    }
}

/// The ids of the data keys the sealed cells of `rows` name.
fn sealed_ids(rows: &[Vec<Cell>]) -> Vec<i64> {
    let mut ids: Vec<i64> = rows
        .iter()
        .flatten()
        .filter_map(|cell| match cell {
            Cell::Bytes(bytes) => sealed_key_id(bytes),
            Cell::Text(text) => sealed_text_key_id(text),
            _ => None,
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A data key made for an aggregate that had none, to be written with the first row it seals.
#[derive(Debug, Clone)]
pub(crate) struct NewDataKey {
    /// Its id, which the sealed values name.
    pub id: i64,
    /// The master key that wraps it.
    pub master: String,
    /// It, wrapped.
    pub wrapped: Vec<u8>,
}

/// Writes a new data key; nothing when the aggregate has one already (made by another
/// delivery of the same batch or another node): the event row's guard then finds this
/// one missing and the delivery is sealed again under the aggregate's key.
pub(crate) const ADD_DATA_KEY: &str =
    "INSERT INTO data_keys (id, source, aggregate, master_key, wrapped, created_at)
     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING";

/// The data key of an aggregate.
const AGGREGATE_KEY: &str =
    "SELECT id, master_key, wrapped FROM data_keys WHERE source = $1 AND aggregate = $2";

/// Whether a data key exists (it does unless erased).
pub(crate) const DATA_KEY_EXISTS: &str = "SELECT COUNT(*) FROM data_keys WHERE id = $1";

/// A stored key of the store itself (the body hasher's).
const STORE_KEY: &str = "SELECT master_key, wrapped FROM store_keys WHERE name = $1";

/// Writes a store key unless another node wrote it first.
const ADD_STORE_KEY: &str = "INSERT INTO store_keys (name, master_key, wrapped, created_at)
     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING";

/// Every master key id the store's keys are wrapped under: a loose index scan, a few
/// lookups however many aggregates there are.
const MASTER_KEYS_USED: &str = "WITH RECURSIVE used(k) AS (
         SELECT MIN(master_key) FROM data_keys
         UNION ALL
         SELECT (SELECT MIN(master_key) FROM data_keys WHERE master_key > used.k)
         FROM used WHERE used.k IS NOT NULL)
     SELECT k FROM used WHERE k IS NOT NULL
     UNION
     SELECT master_key FROM store_keys";

/// Why a store cannot start with the configured keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeysMissing {
    /// Some data is wrapped under master keys that are not configured.
    #[error(
        "the store holds data encrypted under the master key{} {}, which {} not configured \
         ([encryption] keys or INHOOK_ENCRYPTION_KEYS): add {} back (a rekey can then move \
         everything under the first key)",
        if .0.len() == 1 { "" } else { "s" },
        .0.join(", "),
        if .0.len() == 1 { "is" } else { "are" },
        if .0.len() == 1 { "it" } else { "them" }
    )]
    MasterKeys(Vec<String>),
}

/// The store's keys: none when encryption is off.
pub struct Vault {
    masters: Option<Arc<MasterKeys>>,
    by_id: Mutex<Generations<i64, Arc<DataKey>>>,
    by_aggregate: Mutex<Generations<(String, String), Arc<DataKey>>>,
    body_hasher: OnceLock<BodyHasher>,
}

impl std::fmt::Debug for Vault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vault")
            .field("encrypting", &self.masters.is_some())
            .finish_non_exhaustive()
    }
}

impl Default for Vault {
    fn default() -> Self {
        Self::new(None)
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The maps hold no invariant a panic could break halfway.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The failure of a value that does not open, for the caller's answer.
pub(crate) fn undecryptable_error(err: Undecryptable) -> StoreError {
    StoreError::Undecryptable(err)
}

impl Vault {
    /// The keys of a store that encrypts under `masters` (none: encryption off).
    pub fn new(masters: Option<Arc<MasterKeys>>) -> Self {
        Self {
            masters,
            by_id: Mutex::new(Generations::new()),
            by_aggregate: Mutex::new(Generations::new()),
            body_hasher: OnceLock::new(),
        }
    }

    /// Whether new rows are sealed.
    pub fn encrypting(&self) -> bool {
        self.masters.is_some()
    }

    /// The configured master keys.
    pub fn masters(&self) -> Option<&MasterKeys> {
        self.masters.as_deref()
    }

    /// Checks that every master key the store uses is configured, and loads (or makes)
    /// the body hasher: run once at start, before anything is sealed or opened.
    pub(crate) async fn unlock<I: Tx>(&self, io: &I) -> Result<(), StoreError> {
        let used = io.query(MASTER_KEYS_USED, &[]).await?;
        let mut missing: Vec<String> = Vec::new();
        for row in &used {
            let id = string(row, 0)?;
            if self.masters.as_ref().and_then(|m| m.get(&id)).is_none() {
                missing.push(id);
            }
        }
        if !missing.is_empty() {
            missing.sort();
            // Words only: the operator reads them once, not again as a cause.
            let err = KeysMissing::MasterKeys(missing);
            return Err(StoreError::Internal(err.to_string().into()));
        }
        let Some(masters) = &self.masters else {
            return Ok(());
        };
        if self.body_hasher.get().is_some() {
            return Ok(());
        }
        let first = masters.first();
        let fresh = BodyHasher::generate();
        let params = [
            text(BODY_HASH_KEY),
            text(first.id().as_str()),
            Param::Bytes(fresh.wrap(first).into()),
            Param::Int(crate::domain::clock::now_ms()),
        ];
        io.execute(ADD_STORE_KEY, &params).await?;
        let found = io.query(STORE_KEY, &[text(BODY_HASH_KEY)]).await?;
        let row = found
            .first()
            .ok_or_else(|| StoreError::Internal("the body hash key was not kept".into()))?;
        let master = string(row, 0)?;
        let wrapped = opt_bytes(row, 1)?.unwrap_or_default();
        let master = masters
            .get(&master)
            .ok_or_else(|| StoreError::Internal("the body hash key's master key".into()))?;
        let hasher = BodyHasher::unwrap(master, &wrapped).map_err(undecryptable_error)?;
        let _ = self.body_hasher.set(hasher);
        Ok(())
    }

    /// The body-equality dedup key of `body`: its SHA-256, keyed when encryption is on.
    /// (A signed content's is [`Vault::signed_content_hash`].)
    pub fn body_hash(&self, body: &[u8]) -> String {
        match self.body_hasher.get() {
            Some(hasher) => hasher.hash(body),
            None => hex::encode(sha2::Sha256::digest(body)),
        }
    }

    /// What a search index row holds for the (normalised) `value` at `field`: the value
    /// itself, or its keyed hash when encryption is on, so that the store never holds a
    /// sealed body's value in clear (docs/api.md, search).
    pub fn search_key(&self, field: &str, value: &str) -> String {
        match self.body_hasher.get() {
            Some(hasher) => hasher.search_hash(field, value),
            None => value.to_owned(),
        }
    }

    /// The body key of a delivery deduplicated by what its signature covers: `signed:`
    /// and the signed content's SHA-256 (`digest`), that SHA-256 keyed when encryption is
    /// on. The prefix keeps it apart from a raw body's hash, and lets [`Vault::rehash`]
    /// key it without the signed content, which is not stored.
    pub fn signed_content_hash(&self, digest: &[u8; 32]) -> String {
        let hashed = match self.body_hasher.get() {
            Some(hasher) => hasher.hash(digest),
            None => hex::encode(digest),
        };
        format!("{SIGNED_CONTENT_KEY}{hashed}")
    }

    /// The keyed form of a plaintext row's body key `stored`, as a delivery logged now
    /// would get it: a raw body's from `body`, a signed content's from the SHA-256 it holds.
    pub(crate) fn rehash(&self, stored: &str, body: &[u8]) -> String {
        let digest = stored
            .strip_prefix(SIGNED_CONTENT_KEY)
            .and_then(crate::ingress::signature::hex_32);
        match digest {
            Some(digest) => self.signed_content_hash(&digest),
            None => self.body_hash(body),
        }
    }

    /// The cached data key of an aggregate, for sealing at ingest without a query. The
    /// event row's guard catches a key erased since by another node.
    pub(crate) fn cached_for(&self, source: &str, aggregate: &str) -> Option<Arc<DataKey>> {
        lock(&self.by_aggregate).get(&(source.to_owned(), aggregate.to_owned()))
    }

    /// Forgets the cached key of an aggregate (erased, or found stale).
    pub(crate) fn forget_cached(&self, source: &str, aggregate: &str) {
        let key = (source.to_owned(), aggregate.to_owned());
        let mut by_aggregate = lock(&self.by_aggregate);
        if let Some(data_key) = by_aggregate.get(&key) {
            lock(&self.by_id).remove(&data_key.id());
        }
        by_aggregate.remove(&key);
    }

    /// Remembers `key` as the aggregate's.
    pub(crate) fn remember(&self, source: &str, aggregate: &str, key: Arc<DataKey>) {
        lock(&self.by_id).insert(key.id(), Arc::clone(&key));
        lock(&self.by_aggregate).insert((source.to_owned(), aggregate.to_owned()), key);
    }

    fn unwrap_row(
        &self,
        id: i64,
        master: &str,
        wrapped: &[u8],
        source: &str,
        aggregate: &str,
    ) -> Result<Arc<DataKey>, StoreError> {
        let masters = self
            .masters
            .as_ref()
            .ok_or_else(|| undecryptable_error(Undecryptable("encryption is not configured")))?;
        let master = masters.get(master).ok_or_else(|| {
            undecryptable_error(Undecryptable("its master key is not configured"))
        })?;
        let key = master
            .unwrap(id, wrapped, source, aggregate)
            .map_err(undecryptable_error)?;
        Ok(Arc::new(key))
    }

    /// The aggregate's data key as stored now (the caller holds the aggregate); with
    /// `create`, one is made and written when it has none. `None`: encryption off, or no
    /// key and none made.
    pub(crate) async fn aggregate_key<I: Tx>(
        &self,
        io: &I,
        source: &str,
        aggregate: &str,
        create: bool,
    ) -> Result<Option<Arc<DataKey>>, StoreError> {
        let Some(masters) = &self.masters else {
            return Ok(None);
        };
        if let Some(found) = self.stored_key(io, source, aggregate).await? {
            return Ok(Some(found));
        }
        if !create {
            return Ok(None);
        }
        let (_, new) = self.new_key(masters, source, aggregate);
        io.execute(ADD_DATA_KEY, &new.params(source, aggregate))
            .await?;
        // Another node may have written its own first: the stored one is the aggregate's.
        self.stored_key(io, source, aggregate).await
    }

    /// The aggregate's stored data key, unwrapped and remembered.
    pub(crate) async fn stored_key<I: Tx>(
        &self,
        io: &I,
        source: &str,
        aggregate: &str,
    ) -> Result<Option<Arc<DataKey>>, StoreError> {
        let found = io
            .query(AGGREGATE_KEY, &[text(source), text(aggregate)])
            .await?;
        let Some(row) = found.first() else {
            return Ok(None);
        };
        let id = super::backend::int(row, 0)?;
        let cached = lock(&self.by_id).get(&id);
        if let Some(cached) = cached {
            self.remember(source, aggregate, Arc::clone(&cached));
            return Ok(Some(cached));
        }
        let master = string(row, 1)?;
        let wrapped = opt_bytes(row, 2)?.unwrap_or_default();
        let key = self.unwrap_row(id, &master, &wrapped, source, aggregate)?;
        self.remember(source, aggregate, Arc::clone(&key));
        Ok(Some(key))
    }

    /// A new data key for the aggregate, and what writes it (not remembered until written).
    pub(crate) fn new_key(
        &self,
        masters: &MasterKeys,
        source: &str,
        aggregate: &str,
    ) -> (Arc<DataKey>, NewDataKey) {
        let key = DataKey::generate();
        let first = masters.first();
        let new = NewDataKey {
            id: key.id(),
            master: first.id().as_str().to_owned(),
            wrapped: first.wrap(&key, source, aggregate),
        };
        (Arc::new(key), new)
    }

    /// The data keys the sealed cells of `rows` name, from the cache or the store. A key
    /// that is gone (erased) is left out: what it sealed does not open.
    pub(crate) async fn keys_for<I: Tx>(
        &self,
        io: &I,
        rows: &[Vec<Cell>],
    ) -> Result<KeySet, StoreError> {
        let ids = sealed_ids(rows);
        self.keys_by_id(io, &ids).await
    }

    /// The data keys `ids`, from the cache or the store.
    pub(crate) async fn keys_by_id<I: Tx>(
        &self,
        io: &I,
        ids: &[i64],
    ) -> Result<KeySet, StoreError> {
        let mut set = KeySet::default();
        let mut missing = Vec::new();
        {
            let mut cached = lock(&self.by_id);
            for id in ids {
                match cached.get(id) {
                    Some(key) => {
                        set.keys.insert(*id, key);
                    }
                    None => missing.push(*id),
                }
            }
        }
        if missing.is_empty() {
            return Ok(set);
        }
        let statement = format!(
            "SELECT id, master_key, wrapped, source, aggregate FROM data_keys WHERE {}",
            I::in_ids("id", 1)
        );
        let found = io.query(&statement, &[Param::Ids(missing)]).await?;
        for row in &found {
            let id = super::backend::int(row, 0)?;
            let (source, aggregate) = (string(row, 3)?, string(row, 4)?);
            let wrapped = opt_bytes(row, 2)?.unwrap_or_default();
            let key = self.unwrap_row(id, &string(row, 1)?, &wrapped, &source, &aggregate)?;
            lock(&self.by_id).insert(id, Arc::clone(&key));
            set.keys.insert(id, key);
        }
        Ok(set)
    }
}

impl NewDataKey {
    /// The parameters of [`ADD_DATA_KEY`].
    pub fn params<'a>(&'a self, source: &'a str, aggregate: &'a str) -> [Param<'a>; 6] {
        [
            Param::Int(self.id),
            text(source),
            text(aggregate),
            text(&self.master),
            Param::Bytes(self.wrapped.as_slice().into()),
            Param::Int(crate::domain::clock::now_ms()),
        ]
    }
}

/// Fails with [`StoreError::StaleKey`] when `row` was sealed under a data key that is not stored
/// (erased since it was cached, or a new one another delivery's key beat).
pub(crate) async fn check_key<I: Tx>(io: &I, row: &super::EventRow) -> Result<(), StoreError> {
    let Some(id) = row.data_key() else {
        return Ok(());
    };
    let found = io.query(DATA_KEY_EXISTS, &[Param::Int(id)]).await?;
    if super::backend::one_int(&found)? == 0 {
        return Err(StoreError::StaleKey);
    }
    Ok(())
}

/// Deletes the new data key `row` was sealed under when the row itself was not logged (a
/// duplicate): no key is left for an aggregate that has no row.
pub(crate) async fn drop_unused_key<I: Tx>(
    io: &I,
    row: &super::EventRow,
) -> Result<(), StoreError> {
    if let Some(new) = row.sealed.as_ref().and_then(|s| s.new_key.as_ref()) {
        io.execute("DELETE FROM data_keys WHERE id = $1", &[Param::Int(new.id)])
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signed_content_key_is_apart_from_a_body_key_and_rehashed_without_the_content() {
        let plain = Vault::default();
        let digest: [u8; 32] = sha2::Sha256::digest(b"1700000000token-1").into();
        let signed = plain.signed_content_hash(&digest);
        assert_eq!(signed, format!("signed:{}", hex::encode(digest)));
        // The SHA-256 of a body equal to the signed content is another key.
        assert_ne!(plain.body_hash(b"1700000000token-1"), signed);

        // Encryption on: a new delivery gets the keyed forms, and a plaintext row's keys
        // become the same ones, the signed content's from the SHA-256 it keeps.
        let sealed = Vault::default();
        assert!(sealed.body_hasher.set(BodyHasher::generate()).is_ok());
        let keyed = sealed.signed_content_hash(&digest);
        assert!(keyed.starts_with("signed:") && keyed != signed);
        assert_eq!(sealed.rehash(&signed, b"any stored body"), keyed);
        let body = b"{\"a\":1}";
        assert_eq!(
            sealed.rehash(&plain.body_hash(body), body),
            sealed.body_hash(body)
        );
        // A malformed signed key is hashed as a body, never panics.
        assert_eq!(sealed.rehash("signed:zz", body), sealed.body_hash(body));
    }
}
