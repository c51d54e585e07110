//! Erasure and key upkeep (docs/encryption.md), written once over [`Tx`]: forgetting
//! an aggregate, rewrapping data keys under the first master key (`inhook rekey`), and
//! sealing the rows written before encryption was on (`--encrypt-existing`).

use serde::Serialize;

use super::backend::{int, opt_bytes, opt_string, string, text, Cell, Param, Tx};
use super::vault::undecryptable_error;
use super::StoreError;
use crate::domain::encryption::{is_sealed, is_sealed_text, Binding, Column};

/// What forgetting one aggregate did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ForgetReport {
    /// Events now `erased`: no body, headers or error left; their dedup keys stay.
    pub events_erased: u64,
    /// Whether the aggregate had a state, now deleted.
    pub state_deleted: bool,
    /// Undelivered forwards now `skipped` with reason `erased`.
    pub deliveries_skipped: u64,
    /// Whether its data key was destroyed (encryption on): what any copy of the store
    /// holds of it no longer decrypts.
    pub data_key_destroyed: bool,
    /// Why the database's files were not rid of the erased copies once the erasure had
    /// committed (docs/encryption.md, what an erasure leaves in the files), if they were
    /// not: the erasure itself stands.
    #[serde(skip)]
    pub unscrubbed: Option<String>,
}

impl ForgetReport {
    /// Whether anything was stored for the aggregate to erase.
    pub fn found(&self) -> bool {
        self.events_erased > 0
            || self.state_deleted
            || self.deliveries_skipped > 0
            || self.data_key_destroyed
    }
}

/// What a backup taken before an erasure still holds, by whether the store encrypts.
pub fn backups_note(encrypted: bool) -> &'static str {
    if encrypted {
        "a backup taken before still holds the aggregate's wrapped data key, and with the \
         master key its data: keep data keys apart with a short retention (docs/encryption.md)"
    } else {
        "the bodies are deleted from the store, but backups taken before still hold them: \
         turn encryption on to make erasure reach backups (docs/encryption.md)"
    }
}

/// Forgets the aggregate: its events erased, its state and change-feed rows deleted, its
/// undelivered forwards skipped, its data key destroyed (the caller's transaction).
pub(crate) async fn forget<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    now_ms: i64,
) -> Result<ForgetReport, StoreError> {
    io.lock_aggregates(&[(source, aggregate)]).await?;
    let at = [text(source), text(aggregate)];
    io.execute(
        "UPDATE event_attempts SET error = NULL
         WHERE event_row IN (SELECT id FROM events WHERE source = $1 AND aggregate = $2)",
        &at,
    )
    .await?;
    // Its values go with its bodies: a plain store indexed them in clear.
    io.execute(
        "DELETE FROM event_search
         WHERE event_row IN (SELECT id FROM events WHERE source = $1 AND aggregate = $2)",
        &at,
    )
    .await?;
    let events_erased = io
        .execute(
            "UPDATE events SET status = 'erased', body = $3, headers = NULL, last_error = NULL,
                 data_key = NULL, next_attempt_at = NULL, decided_at = COALESCE(decided_at, $4)
             WHERE source = $1 AND aggregate = $2 AND status <> 'erased'",
            &[
                text(source),
                text(aggregate),
                Param::Bytes(Vec::new().into()),
                Param::Int(now_ms),
            ],
        )
        .await?;
    let state_deleted = super::reset::delete_state(io, &at).await?;
    io.execute(
        "DELETE FROM state_changes WHERE source = $1 AND aggregate = $2",
        &at,
    )
    .await?;
    let deliveries_skipped = skip_deliveries(io, source, aggregate).await?;
    let data_key_destroyed = io
        .execute(
            "DELETE FROM data_keys WHERE source = $1 AND aggregate = $2",
            &at,
        )
        .await?
        > 0;
    io.wake_workers().await?;
    Ok(ForgetReport {
        events_erased,
        state_deleted,
        deliveries_skipped,
        data_key_destroyed,
        unscrubbed: None,
    })
}

/// Skips the aggregate's undelivered forwards with reason `erased`, queue by queue under
/// each queue's lock (as a claim takes it). A request in flight may finish (its body was
/// read), but its lease is gone: its verdict is not recorded, nor is it sent again.
async fn skip_deliveries<I: Tx>(io: &I, source: &str, aggregate: &str) -> Result<u64, StoreError> {
    let destinations = io
        // Every destination with deliveries: PostgreSQL's counts of new ones may still be
        // deltas, not folded yet.
        .query(
            "SELECT destination FROM delivery_counts
             UNION SELECT destination FROM delivery_count_deltas",
            &[],
        )
        .await?;
    let mut skipped = 0;
    for row in &destinations {
        let destination = string(row, 0)?;
        let key = super::forwarding::queue_key(&destination, source, aggregate);
        io.query(I::LOCK_KEY, &[text(&key)]).await?;
        skipped += io
            .execute(
                "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,
                     lease_owner = NULL, lease_until = NULL, last_error = 'erased'
                 WHERE destination = $1 AND source = $2 AND aggregate = $3
                   AND status IN ('pending', 'in_flight', 'retrying', 'dead')",
                &[text(&destination), text(source), text(aggregate)],
            )
            .await?;
    }
    if skipped > 0 {
        io.wake_senders().await?;
    }
    Ok(skipped)
}

/// How far a rekey or an encryption of existing rows got in one step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyStep {
    /// Rows rewritten by this step.
    pub done: u64,
    /// Where the next step starts (a row id or a key id); `None`: nothing is left.
    pub next: Option<i64>,
}

/// Rewraps up to `batch` data keys not wrapped under the first master key, from key id
/// `after` on. A key rewrapped meanwhile by another rekey is left as it is: the update
/// names the master key it read.
pub(crate) async fn rekey_step<I: Tx>(
    io: &I,
    after: i64,
    batch: usize,
) -> Result<KeyStep, StoreError> {
    let vault = io.vault();
    let Some(masters) = vault.masters() else {
        return Ok(KeyStep::default());
    };
    let first = masters.first();
    let found = io
        .query(
            "SELECT id, source, aggregate, master_key, wrapped FROM data_keys
             WHERE id > $1 AND master_key <> $2 ORDER BY id LIMIT $3",
            &[
                Param::Int(after),
                text(first.id().as_str()),
                Param::Int(batch as i64),
            ],
        )
        .await?;
    let mut step = KeyStep::default();
    for row in &found {
        let id = int(row, 0)?;
        let (source, aggregate, master) = (string(row, 1)?, string(row, 2)?, string(row, 3)?);
        let wrapped = opt_bytes(row, 4)?.unwrap_or_default();
        let old = masters.get(&master).ok_or_else(|| {
            StoreError::Internal(
                format!("data key {id} is wrapped under the master key {master}, which is not configured")
                    .into(),
            )
        })?;
        let key = old
            .unwrap(id, &wrapped, &source, &aggregate)
            .map_err(undecryptable_error)?;
        let rewrapped = first.wrap(&key, &source, &aggregate);
        step.done += io
            .execute(
                "UPDATE data_keys SET master_key = $2, wrapped = $3 WHERE id = $1 AND master_key = $4",
                &[
                    Param::Int(id),
                    text(first.id().as_str()),
                    Param::Bytes(rewrapped.into()),
                    text(&master),
                ],
            )
            .await?;
        step.next = Some(id);
    }
    if found.len() < batch {
        step.next = None;
        rekey_store_keys(io).await?;
    }
    Ok(step)
}

/// Rewraps the store's own keys (the body hasher's) under the first master key.
async fn rekey_store_keys<I: Tx>(io: &I) -> Result<(), StoreError> {
    let Some(masters) = io.vault().masters() else {
        return Ok(());
    };
    let first = masters.first();
    let found = io
        .query(
            "SELECT name, master_key, wrapped FROM store_keys WHERE master_key <> $1",
            &[text(first.id().as_str())],
        )
        .await?;
    for row in &found {
        let (name, master) = (string(row, 0)?, string(row, 1)?);
        let wrapped = opt_bytes(row, 2)?.unwrap_or_default();
        let Some(old) = masters.get(&master) else {
            continue;
        };
        let hasher = crate::domain::encryption::BodyHasher::unwrap(old, &wrapped)
            .map_err(undecryptable_error)?;
        io.execute(
            "UPDATE store_keys SET master_key = $2, wrapped = $3 WHERE name = $1 AND master_key = $4",
            &[
                text(&name),
                text(first.id().as_str()),
                Param::Bytes(hasher.wrap(first).into()),
                text(&master),
            ],
        )
        .await?;
    }
    Ok(())
}

/// How many data keys are not wrapped under the first master key yet.
pub(crate) async fn rekey_left<I: Tx>(io: &I) -> Result<u64, StoreError> {
    let Some(masters) = io.vault().masters() else {
        return Ok(0);
    };
    let found = io
        .query(
            "SELECT COUNT(*) FROM data_keys WHERE master_key <> $1",
            &[text(masters.first().id().as_str())],
        )
        .await?;
    Ok(u64::try_from(super::backend::one_int(&found)?).unwrap_or(0))
}

/// Seals the plaintext rows of up to `batch` aggregates from the events after row
/// `after`: each event's body, headers and errors, and the aggregate's state and change
/// rows, under the aggregate's data key (made when it has none). Resumable: a sealed row
/// is never sealed twice, and the cursor is only where to look next.
pub(crate) async fn encrypt_step<I: Tx>(
    io: &I,
    after: i64,
    batch: usize,
) -> Result<KeyStep, StoreError> {
    if !io.vault().encrypting() {
        return Ok(KeyStep::default());
    }
    if after == i64::MAX {
        return encrypt_leftovers(io, batch).await;
    }
    let found = io
        .query(
            "SELECT id, source, aggregate FROM events
             WHERE id > $1 AND data_key IS NULL AND status <> 'erased' ORDER BY id LIMIT $2",
            &[Param::Int(after), Param::Int(batch as i64)],
        )
        .await?;
    let mut step = KeyStep::default();
    let mut aggregates: Vec<(String, String)> = Vec::new();
    for row in &found {
        step.next = Some(int(row, 0)?);
        let pair = (string(row, 1)?, string(row, 2)?);
        if !aggregates.contains(&pair) {
            aggregates.push(pair);
        }
    }
    for (source, aggregate) in &aggregates {
        step.done += encrypt_aggregate(io, source, aggregate).await?;
    }
    if found.len() < batch {
        // The events are done; states and change rows whose events were purged are next.
        step.next = Some(i64::MAX);
    }
    Ok(step)
}

/// Seals the plaintext states and change rows of up to `batch` aggregates that have no
/// plaintext event left (their events purged); `next` is `None` once none is left.
async fn encrypt_leftovers<I: Tx>(io: &I, batch: usize) -> Result<KeyStep, StoreError> {
    let mut found = io
        .query(
            "SELECT source, aggregate FROM aggregate_state WHERE state NOT LIKE 'sealed:v1:%'
             LIMIT $1",
            &[Param::Int(batch as i64)],
        )
        .await?;
    if found.is_empty() {
        found = io
            .query(
                "SELECT DISTINCT source, aggregate FROM state_changes
                 WHERE state NOT LIKE 'sealed:v1:%' LIMIT $1",
                &[Param::Int(batch as i64)],
            )
            .await?;
    }
    let mut step = KeyStep::default();
    for row in &found {
        encrypt_aggregate(io, &string(row, 0)?, &string(row, 1)?).await?;
        step.done += 1;
    }
    step.next = (!found.is_empty()).then_some(i64::MAX);
    Ok(step)
}

/// Seals every plaintext row of one aggregate; how many events it sealed.
async fn encrypt_aggregate<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
) -> Result<u64, StoreError> {
    io.lock_aggregates(&[(source, aggregate)]).await?;
    let vault = io.vault();
    let Some(key) = vault.aggregate_key(io, source, aggregate, true).await? else {
        return Ok(0);
    };
    let at = [text(source), text(aggregate)];
    let events = io
        .query(
            "SELECT id, event_id, body, headers, last_error, body_sha256 FROM events
             WHERE source = $1 AND aggregate = $2 AND data_key IS NULL AND status <> 'erased'",
            &at,
        )
        .await?;
    let mut sealed = 0;
    for row in &events {
        let (id, event_id) = (int(row, 0)?, string(row, 1)?);
        let seal = |value: Option<String>, column| {
            value.map(|v| {
                if is_sealed_text(&v) {
                    v
                } else {
                    key.seal_text(&v, Binding::event(column, &event_id))
                }
            })
        };
        let body = opt_bytes(row, 2)?.unwrap_or_default();
        // The body-equality key becomes the keyed hash: a plain SHA-256 would let whoever
        // holds the database test a guessed body.
        let hash = opt_string(row, 5)?.map(|stored| vault.rehash(&stored, &body));
        let body = if is_sealed(&body) {
            body
        } else {
            key.seal(&body, Binding::event(Column::Body, &event_id))
        };
        io.execute(
            "UPDATE events SET body = $2, headers = $3, last_error = $4, body_sha256 = $5,
                 data_key = $6
             WHERE id = $1",
            &[
                Param::Int(id),
                Param::Bytes(body.into()),
                Param::opt_owned(seal(opt_string(row, 3)?, Column::Headers)),
                Param::opt_owned(seal(opt_string(row, 4)?, Column::LastError)),
                Param::opt_owned(hash),
                Param::Int(key.id()),
            ],
        )
        .await?;
        // Its search index rows held the values in clear, as a plain store indexes them:
        // keyed now, as a sealed event's are (docs/api.md, search).
        let indexed = io
            .query(
                "SELECT field, value FROM event_search WHERE event_row = $1",
                &[Param::Int(id)],
            )
            .await?;
        for entry in &indexed {
            let (field, value) = (string(entry, 0)?, string(entry, 1)?);
            io.execute(
                "UPDATE event_search SET value = $3 WHERE event_row = $1 AND field = $2",
                &[
                    Param::Int(id),
                    text(&field),
                    Param::owned(vault.search_key(&field, &value)),
                ],
            )
            .await?;
        }
        let history = io
            .query(
                "SELECT id, error FROM event_attempts WHERE event_row = $1 AND error IS NOT NULL",
                &[Param::Int(id)],
            )
            .await?;
        for entry in &history {
            let error = seal(opt_string(entry, 1)?, Column::LastError);
            io.execute(
                "UPDATE event_attempts SET error = $2 WHERE id = $1",
                &[Param::Int(int(entry, 0)?), Param::opt_owned(error)],
            )
            .await?;
        }
        sealed += 1;
    }
    let state = io
        .query(
            "SELECT state FROM aggregate_state WHERE source = $1 AND aggregate = $2",
            &at,
        )
        .await?;
    if let Some(Some(plain)) = state.first().map(|r| opt_string(r, 0)).transpose()? {
        if !is_sealed_text(&plain) {
            let sealed_state = key.seal_text(&plain, Binding::event(Column::State, aggregate));
            io.execute(
                "UPDATE aggregate_state SET state = $3 WHERE source = $1 AND aggregate = $2",
                &[text(source), text(aggregate), Param::owned(sealed_state)],
            )
            .await?;
        }
    }
    let changes = io
        .query(
            "SELECT id, state FROM state_changes WHERE source = $1 AND aggregate = $2",
            &at,
        )
        .await?;
    for change in changes.iter().filter(|c| plain_text(c, 1)) {
        let plain = string(change, 1)?;
        let sealed_change = key.seal_text(&plain, Binding::event(Column::Change, aggregate));
        io.execute(
            "UPDATE state_changes SET state = $2 WHERE id = $1",
            &[Param::Int(int(change, 0)?), Param::owned(sealed_change)],
        )
        .await?;
    }
    Ok(sealed)
}

fn plain_text(row: &[Cell], at: usize) -> bool {
    matches!(row.get(at), Some(Cell::Text(t)) if !is_sealed_text(t))
}

/// How many events are still stored in plaintext.
pub(crate) async fn plaintext_left<I: Tx>(io: &I) -> Result<u64, StoreError> {
    let found = io
        .query(
            "SELECT COUNT(*) FROM events WHERE data_key IS NULL AND status <> 'erased'",
            &[],
        )
        .await?;
    Ok(u64::try_from(super::backend::one_int(&found)?).unwrap_or(0))
}
