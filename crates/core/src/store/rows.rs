//! Stored rows decoded once for every backend: a row's [`Cell`]s read in column
//! order into the store's types.

use super::backend::Cell;
use super::filter::parse_status;
use super::vault::{undecryptable_error, KeySet};
use super::{AggregateState, AttemptRecord, EventRecord, ReplayJob, StateChange, StoreError};
use crate::domain::encryption::{Binding, Column};
use crate::domain::kind::PendingRow;
use crate::domain::ordering::HeldRef;
use crate::domain::DeadReason;

/// A row's columns, taken one after another in the order the query names them.
pub(crate) struct Columns {
    cells: std::vec::IntoIter<Cell>,
    at: usize,
}

impl Columns {
    /// The columns of `row`.
    pub fn of(row: Vec<Cell>) -> Self {
        Self {
            cells: row.into_iter(),
            at: 0,
        }
    }

    fn next(&mut self) -> Result<Cell, StoreError> {
        let at = self.at;
        self.at += 1;
        self.cells
            .next()
            .ok_or_else(|| StoreError::Internal(format!("a row without column {at}").into()))
    }

    fn unexpected(&self, wanted: &str, got: &Cell) -> StoreError {
        StoreError::Internal(
            (format!("column {}: {wanted} expected, got {got:?}", self.at - 1)).into(),
        )
    }

    /// The next column, an integer that may be NULL.
    pub fn opt_int(&mut self) -> Result<Option<i64>, StoreError> {
        match self.next()? {
            Cell::Int(value) => Ok(Some(value)),
            Cell::Null => Ok(None),
            other => Err(self.unexpected("an integer", &other)),
        }
    }

    /// The next column, an integer.
    pub fn int(&mut self) -> Result<i64, StoreError> {
        self.opt_int()?
            .ok_or_else(|| self.unexpected("an integer", &Cell::Null))
    }

    /// The next column, a boolean (stored or cast as an integer).
    pub fn boolean(&mut self) -> Result<bool, StoreError> {
        Ok(self.int()? != 0)
    }

    /// The next column, a text that may be NULL.
    pub fn opt_text(&mut self) -> Result<Option<String>, StoreError> {
        match self.next()? {
            Cell::Text(value) => Ok(Some(value)),
            Cell::Null => Ok(None),
            other => Err(self.unexpected("a text", &other)),
        }
    }

    /// The next column, a text.
    pub fn text(&mut self) -> Result<String, StoreError> {
        self.opt_text()?
            .ok_or_else(|| self.unexpected("a text", &Cell::Null))
    }

    /// The next column, bytes.
    pub fn bytes(&mut self) -> Result<Vec<u8>, StoreError> {
        match self.next()? {
            Cell::Bytes(value) => Ok(value),
            other => Err(self.unexpected("bytes", &other)),
        }
    }
}

/// Decodes every row with `decode`.
pub(crate) fn all<T>(
    rows: Vec<Vec<Cell>>,
    decode: impl Fn(&mut Columns) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    rows.into_iter()
        .map(|row| decode(&mut Columns::of(row)))
        .collect()
}

/// An aggregate's state, from the columns of `sql::LOAD_AGGREGATE`; a sealed state opened
/// with `keys` (one that does not open is an [`Undecryptable`] error).
pub(crate) fn aggregate_state(
    c: &mut Columns,
    keys: &KeySet,
) -> Result<AggregateState, StoreError> {
    let aggregate = c.text()?;
    let sequence = c.opt_int()?;
    let event_id = c.opt_text()?;
    let event_type = c.opt_text()?;
    let state = keys
        .open_text(c.text()?, Binding::event(Column::State, &aggregate))
        .map_err(undecryptable_error)?;
    let state = serde_json::from_str(&state).map_err(super::filter::json_err)?;
    Ok(AggregateState {
        aggregate,
        sequence,
        event_id,
        event_type,
        state,
        tag: c.opt_text()?,
        watermark: c.opt_int()?,
        updated_at_ms: c.int()?,
        skipped_gaps: c.opt_text()?,
    })
}

/// A pending row, from the columns of `sql::pending_columns`; its body opened with `keys`.
/// A body that does not open is read as empty: the kind refuses it, and the event goes
/// dead with the reason its contract gives, instead of holding its aggregate up.
pub(crate) fn pending_row(
    c: &mut Columns,
    was_held: bool,
    keys: &KeySet,
) -> Result<PendingRow, StoreError> {
    let row = c.int()?;
    let stored = c.bytes()?;
    let received_at_ms = c.int()?;
    let replayed = c.boolean()?;
    let event_id = c.text()?;
    let body = keys
        .open(stored, Binding::event(Column::Body, &event_id))
        .unwrap_or_default();
    Ok(PendingRow {
        row,
        body,
        received_at_ms,
        replayed,
        event_id,
        sequence: c.int()?,
        event_type: c.text()?,
        idempotency_key: c.opt_text()?,
        unordered: c.boolean()?,
        was_held,
        parsed: None,
    })
}

/// A held event's reference, from the columns of `sql::HELD_REFS`.
pub(crate) fn held_ref(c: &mut Columns) -> Result<HeldRef, StoreError> {
    Ok(HeldRef {
        sequence: c.int()?,
        row: c.int()?,
        received_at_ms: c.int()?,
    })
}

/// An event, from the columns of `sql::EVENT_COLUMNS`; its sealed columns opened with
/// `keys`. One that does not open leaves them empty and the record marked
/// [`EventRecord::undecryptable`]: that event alone is answered 500.
pub(crate) fn event_record(c: &mut Columns, keys: &KeySet) -> Result<EventRecord, StoreError> {
    let row = c.int()?;
    let source = c.text()?;
    let event_id = c.text()?;
    let at = |column| Binding::event(column, &event_id);
    let event_type = c.text()?;
    let aggregate = c.text()?;
    let sequence = c.int()?;
    let idempotency_key = c.opt_text()?;
    let body = keys.open(c.bytes()?, at(Column::Body));
    let signature_valid = c.boolean()?;
    let signed_at = c.opt_int()?;
    let received_at_ms = c.int()?;
    let status = parse_status(&c.text()?)?;
    let attempts = c.int()?;
    let next_attempt_at_ms = c.opt_int()?;
    let last_error = keys.open_opt_text(c.opt_text()?, at(Column::LastError));
    let dead_reason = dead_reason(c.opt_text()?)?;
    let decided_at_ms = c.opt_int()?;
    let replays = c.int()?;
    let headers = keys.open_opt_text(c.opt_text()?, at(Column::Headers));
    let unordered = c.opt_text()?;
    let undecryptable = body.is_err() || last_error.is_err() || headers.is_err();
    Ok(EventRecord {
        row,
        source,
        event_id,
        event_type,
        aggregate,
        sequence,
        idempotency_key,
        body: body.unwrap_or_default(),
        signature_valid,
        signed_at,
        received_at_ms,
        status,
        attempts,
        next_attempt_at_ms,
        last_error: last_error.unwrap_or_default(),
        dead_reason,
        decided_at_ms,
        replays,
        headers: headers.unwrap_or_default(),
        unordered,
        history: Vec::new(),
        undecryptable,
    })
}

/// A stored dead reason code, parsed.
fn dead_reason(raw: Option<String>) -> Result<Option<DeadReason>, StoreError> {
    raw.map(|raw| {
        DeadReason::parse(&raw).ok_or_else(|| {
            StoreError::Internal(format!("unknown dead reason {raw:?} in store").into())
        })
    })
    .transpose()
}

/// An attempt of the history of the event `event_id`, from the columns of
/// `sql::ATTEMPT_HISTORY`; its error opened with `keys` (`undecryptable` when it does not).
pub(crate) fn attempt(
    c: &mut Columns,
    keys: &KeySet,
    event_id: &str,
) -> Result<AttemptRecord, StoreError> {
    let at_ms = c.int()?;
    let kind = c.text()?;
    let error = keys
        .open_opt_text(c.opt_text()?, Binding::event(Column::LastError, event_id))
        .unwrap_or_else(|_| Some("undecryptable".to_owned()));
    Ok(AttemptRecord { at_ms, kind, error })
}

/// A bulk replay of events, from the columns of `sql::REPLAY_JOB`.
pub(crate) fn replay_job(id: i64, c: &mut Columns) -> Result<ReplayJob, StoreError> {
    Ok(ReplayJob {
        id,
        filter: serde_json::from_str(&c.text()?).map_err(super::filter::json_err)?,
        state: c.text()?,
        total: c.int()?,
        requeued: c.int()?,
        created_at_ms: c.int()?,
        updated_at_ms: c.int()?,
    })
}

/// An applied change, from `id, source, aggregate, kind, at, state`; its state opened
/// with `keys` (one that does not open is an [`Undecryptable`] error).
pub(crate) fn state_change(c: &mut Columns, keys: &KeySet) -> Result<StateChange, StoreError> {
    let id = c.int()?;
    let source = c.text()?;
    let aggregate = c.text()?;
    let kind = c.text()?;
    let at_ms = c.int()?;
    // One change that does not open must not stop the feed of every stream: it is
    // shown as a null state, and logged.
    let state = keys
        .open_text(c.text()?, Binding::event(Column::Change, &aggregate))
        .unwrap_or_else(|err| {
            tracing::error!(change = id, %source, detail = %err, "a change-feed row does not decrypt");
            "null".to_owned()
        });
    Ok(StateChange {
        id,
        source,
        aggregate,
        kind,
        at_ms,
        state,
    })
}
