//! Stored rows decoded once for every backend: a row's [`Cell`]s read in column
//! order into the store's types.

use super::backend::Cell;
use super::filter::parse_status;
use super::{AggregateState, AttemptRecord, EventRecord, ReplayJob, StateChange, StoreError};
use crate::domain::DeadReason;
use crate::kind::PendingRow;
use crate::ordering::HeldRef;

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

/// An aggregate's state, from the columns of `sql::LOAD_AGGREGATE`.
pub(crate) fn aggregate_state(c: &mut Columns) -> Result<AggregateState, StoreError> {
    let aggregate = c.text()?;
    let sequence = c.opt_int()?;
    let event_id = c.opt_text()?;
    let event_type = c.opt_text()?;
    let state = serde_json::from_str(&c.text()?).map_err(super::filter::json_err)?;
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

/// A pending row, from the columns of `sql::pending_columns`.
pub(crate) fn pending_row(c: &mut Columns, was_held: bool) -> Result<PendingRow, StoreError> {
    Ok(PendingRow {
        row: c.int()?,
        body: c.bytes()?,
        received_at_ms: c.int()?,
        replayed: c.boolean()?,
        event_id: c.text()?,
        sequence: c.int()?,
        event_type: c.text()?,
        idempotency_key: c.opt_text()?,
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

/// An event, from the columns of `sql::EVENT_COLUMNS`.
pub(crate) fn event_record(c: &mut Columns) -> Result<EventRecord, StoreError> {
    Ok(EventRecord {
        row: c.int()?,
        source: c.text()?,
        event_id: c.text()?,
        event_type: c.text()?,
        aggregate: c.text()?,
        sequence: c.int()?,
        idempotency_key: c.opt_text()?,
        body: c.bytes()?,
        signature_valid: c.boolean()?,
        signed_at: c.opt_int()?,
        received_at_ms: c.int()?,
        status: parse_status(&c.text()?)?,
        attempts: c.int()?,
        next_attempt_at_ms: c.opt_int()?,
        last_error: c.opt_text()?,
        dead_reason: c
            .opt_text()?
            .map(|raw| {
                DeadReason::parse(&raw).ok_or_else(|| {
                    StoreError::Internal(format!("unknown dead reason {raw:?} in store").into())
                })
            })
            .transpose()?,
        decided_at_ms: c.opt_int()?,
        replays: c.int()?,
        headers: c.opt_text()?,
        history: Vec::new(),
    })
}

/// An attempt of an event's history, from the columns of `sql::ATTEMPT_HISTORY`.
pub(crate) fn attempt(c: &mut Columns) -> Result<AttemptRecord, StoreError> {
    Ok(AttemptRecord {
        at_ms: c.int()?,
        kind: c.text()?,
        error: c.opt_text()?,
    })
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

/// An applied change, from `id, source, aggregate, kind, at, state`.
pub(crate) fn state_change(c: &mut Columns) -> Result<StateChange, StoreError> {
    Ok(StateChange {
        id: c.int()?,
        source: c.text()?,
        aggregate: c.text()?,
        kind: c.text()?,
        at_ms: c.int()?,
        state: c.text()?,
    })
}
