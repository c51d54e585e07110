//! What the API, the workers' polling and the metrics read, written once for
//! every store over [`Tx`].

use super::backend::Param;
use super::backend::{int, one_int, string, text, Cell, Tx};
use super::filter::{self, parse_status, where_of};
use super::sql::EVENT_COLUMNS;
use super::{rows, sql};
use super::{
    AggregatePage, AggregateState, EventFilter, EventPage, EventRecord, ReplayJob, StateChange,
    StoreError,
};
use crate::domain::EventStatus;

/// Answers when the database does.
pub(crate) async fn ping<I: Tx>(io: &I) -> Result<(), StoreError> {
    io.query(sql::PING, &[]).await.map(drop)
}

/// One aggregate's state.
pub(crate) async fn aggregate<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
) -> Result<Option<AggregateState>, StoreError> {
    super::settle::load_state(io, source, aggregate).await
}

/// A page of a source's aggregates, optionally of one tag, after `cursor`.
pub(crate) async fn aggregates_page<I: Tx>(
    io: &I,
    source: &str,
    tag: Option<String>,
    limit: usize,
    cursor: Option<String>,
) -> Result<AggregatePage, StoreError> {
    let params = [
        text(source),
        Param::opt_owned(tag),
        Param::opt_owned(cursor),
        Param::Int(limit as i64 + 1),
    ];
    let found = io.query(sql::AGGREGATES_PAGE, &params).await?;
    let keys = io.vault().keys_for(io, &found).await?;
    Ok(AggregatePage::of(
        rows::all(found, |c| rows::aggregate_state(c, &keys))?,
        limit,
    ))
}

/// Aggregates with events due now, at most `limit`.
pub(crate) async fn due_aggregates<I: Tx>(
    io: &I,
    now_ms: i64,
    limit: usize,
) -> Result<Vec<(String, String)>, StoreError> {
    let params = [Param::Int(now_ms), Param::Int(limit as i64)];
    let found = io.query(sql::DUE_AGGREGATES, &params).await?;
    found
        .iter()
        .map(|row| Ok((string(row, 0)?, string(row, 1)?)))
        .collect()
}

/// One event with its attempt history.
pub(crate) async fn event<I: Tx>(
    io: &I,
    source: &str,
    event_id: &str,
) -> Result<Option<EventRecord>, StoreError> {
    let found = io
        .query(&sql::EVENT_BY_ID, &[text(source), text(event_id)])
        .await?;
    let keys = io.vault().keys_for(io, &found).await?;
    let Some(mut record) = rows::all(found, |c| rows::event_record(c, &keys))?.pop() else {
        return Ok(None);
    };
    let history = io
        .query(sql::ATTEMPT_HISTORY, &[Param::Int(record.row)])
        .await?;
    let keys = io.vault().keys_for(io, &history).await?;
    let event_id = record.event_id.clone();
    record.history = rows::all(history, |c| rows::attempt(c, &keys, &event_id))?;
    Ok(Some(record))
}

/// A page of the events `filter` matches, newest first, before row `cursor`.
pub(crate) async fn events<I: Tx>(
    io: &I,
    filter: &EventFilter,
    limit: usize,
    cursor: Option<i64>,
) -> Result<EventPage, StoreError> {
    let (mut clauses, mut values) = filter::filter_sql(filter, |n| format!("${n}"));
    if let Some(cursor) = cursor {
        values.push(Param::Int(cursor));
        clauses.push(format!("id < ${}", values.len()));
    }
    values.push(Param::Int(limit as i64 + 1));
    let statement = format!(
        "SELECT {EVENT_COLUMNS} FROM events WHERE {} ORDER BY id DESC LIMIT ${}",
        where_of(&clauses),
        values.len()
    );
    let found = io.query(&statement, &values).await?;
    let keys = io.vault().keys_for(io, &found).await?;
    Ok(EventPage::of(
        rows::all(found, |c| rows::event_record(c, &keys))?,
        limit,
    ))
}

/// Events per source and status, from the counts the triggers keep.
pub(crate) async fn status_counts<I: Tx>(
    io: &I,
) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
    io.fold_event_counts().await?;
    counts(io.query(I::STATUS_COUNTS, &[]).await?)
}

/// Undecided events per source and status.
pub(crate) async fn undecided_counts<I: Tx>(
    io: &I,
) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
    counts(io.query(I::UNDECIDED_COUNTS, &[]).await?)
}

fn counts(found: Vec<Vec<Cell>>) -> Result<Vec<(String, EventStatus, u64)>, StoreError> {
    found
        .iter()
        .map(|row| {
            let n = u64::try_from(int(row, 2)?).unwrap_or(0);
            Ok((string(row, 0)?, parse_status(&string(row, 1)?)?, n))
        })
        .collect()
}

/// The id of the latest applied change (0: none yet).
pub(crate) async fn last_change_id<I: Tx>(io: &I) -> Result<i64, StoreError> {
    let found = io
        .query(
            "SELECT CAST(COALESCE(MAX(id), 0) AS BIGINT) FROM state_changes",
            &[],
        )
        .await?;
    one_int(&found)
}

/// Applied changes after `after`, optionally of one source and aggregate.
pub(crate) async fn changes_after<I: Tx>(
    io: &I,
    after: i64,
    source: Option<String>,
    aggregate: Option<String>,
    limit: usize,
) -> Result<Vec<StateChange>, StoreError> {
    let params = [
        Param::Int(after),
        Param::opt_owned(source),
        Param::opt_owned(aggregate),
        Param::Int(limit as i64),
    ];
    let found = io
        .query(
            "SELECT id, source, aggregate, kind, at, state FROM state_changes
             WHERE id > $1 AND (CAST($2 AS TEXT) IS NULL OR source = $2)
               AND (CAST($3 AS TEXT) IS NULL OR aggregate = $3)
             ORDER BY id LIMIT $4",
            &params,
        )
        .await?;
    let keys = io.vault().keys_for(io, &found).await?;
    rows::all(found, |c| rows::state_change(c, &keys))
}

/// The ids of the applied changes after `after`, at most `limit`.
pub(crate) async fn change_ids_after<I: Tx>(
    io: &I,
    after: i64,
    limit: usize,
) -> Result<Vec<i64>, StoreError> {
    let found = io
        .query(
            "SELECT id FROM state_changes WHERE id > $1 ORDER BY id LIMIT $2",
            &[Param::Int(after), Param::Int(limit as i64)],
        )
        .await?;
    found.iter().map(|row| int(row, 0)).collect()
}

/// A bulk replay of events, by id.
pub(crate) async fn replay_job<I: Tx>(io: &I, id: i64) -> Result<Option<ReplayJob>, StoreError> {
    let found = io.query(sql::REPLAY_JOB, &[Param::Int(id)]).await?;
    Ok(rows::all(found, |c| rows::replay_job(id, c))?.pop())
}
