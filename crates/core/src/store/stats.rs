//! Figures over time (docs/api.md, stats), written once for every store over [`Tx`]: one row
//! per scope, name, minute and figure, added to by every node's flush, so that several nodes
//! on one database add up.

use super::backend::{int, string, text, Param, Tx};
use super::StoreError;

/// What a row of figures is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum StatScope {
    /// A configured source.
    Source,
    /// A configured destination.
    Destination,
}

impl StatScope {
    /// The stored word.
    pub fn as_str(self) -> &'static str {
        match self {
            StatScope::Source => "source",
            StatScope::Destination => "destination",
        }
    }
}

/// How a stored figure meets the same figure another flush wrote for its minute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Counts: added.
    Add,
    /// Samples (a backlog, a last time): the greatest is kept.
    Max,
}

/// One figure of one minute, as a flush writes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatRow {
    /// What it is about.
    pub scope: StatScope,
    /// The source's or destination's name.
    pub name: String,
    /// The minute's start, unix milliseconds.
    pub minute_ms: i64,
    /// The figure's stored name (docs/api.md, stats).
    pub figure: String,
    /// Its value.
    pub value: i64,
    /// How it meets what is stored.
    pub combine: Combine,
}

/// One figure summed over the minutes of one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatCell {
    /// The step, from 0 at the first.
    pub slot: i64,
    /// The figure's stored name.
    pub figure: String,
    /// The sum of its minutes.
    pub sum: i64,
    /// The greatest of its minutes.
    pub max: i64,
}

/// What the overview reads of its sources' figures.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceStats {
    /// `(source, figure, count)` of the `rejected:` figures.
    pub rejected: Vec<(String, String, i64)>,
    /// `(source, unix ms)` of each source's last delivery.
    pub last_delivery: Vec<(String, i64)>,
}

const ADD: &str =
    "INSERT INTO stats (scope, name, minute, figure, value) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (scope, name, minute, figure) DO UPDATE SET value = stats.value + EXCLUDED.value";

const MAX: &str =
    "INSERT INTO stats (scope, name, minute, figure, value) VALUES ($1, $2, $3, $4, $5)
     ON CONFLICT (scope, name, minute, figure) DO UPDATE
     SET value = CASE WHEN EXCLUDED.value > stats.value THEN EXCLUDED.value ELSE stats.value END";

/// Adds `rows` to the stored figures. Taken in key order, as the caller gives them: two
/// nodes flushing at once never wait on each other's rows crosswise.
pub(crate) async fn add<I: Tx>(io: &I, rows: &[StatRow]) -> Result<(), StoreError> {
    for row in rows {
        let statement = match row.combine {
            Combine::Add => ADD,
            Combine::Max => MAX,
        };
        io.execute(
            statement,
            &[
                text(row.scope.as_str()),
                text(&row.name),
                Param::Int(row.minute_ms),
                text(&row.figure),
                Param::Int(row.value),
            ],
        )
        .await?;
    }
    Ok(())
}

/// The figures of `name` in `[from_ms, to_ms)`, per step of `step_ms` from `from_ms`.
pub(crate) async fn series<I: Tx>(
    io: &I,
    scope: StatScope,
    name: &str,
    (from_ms, to_ms, step_ms): (i64, i64, i64),
) -> Result<Vec<StatCell>, StoreError> {
    let rows = io
        .query(
            "SELECT (minute - $3) / $5 AS slot, figure, CAST(SUM(value) AS BIGINT), MAX(value)
             FROM stats WHERE scope = $1 AND name = $2 AND minute >= $3 AND minute < $4
             GROUP BY slot, figure",
            &[
                text(scope.as_str()),
                text(name),
                Param::Int(from_ms),
                Param::Int(to_ms),
                Param::Int(step_ms),
            ],
        )
        .await?;
    rows.iter()
        .map(|row| {
            Ok(StatCell {
                slot: int(row, 0)?,
                figure: string(row, 1)?,
                sum: int(row, 2)?,
                max: int(row, 3)?,
            })
        })
        .collect()
}

/// Per source, the sum since `since_ms` of every figure whose name is `like` (an SQL pattern).
async fn source_totals<I: Tx>(
    io: &I,
    since_ms: i64,
    like: &str,
) -> Result<Vec<(String, String, i64)>, StoreError> {
    let rows = io
        .query(
            "SELECT name, figure, CAST(SUM(value) AS BIGINT) FROM stats
             WHERE scope = 'source' AND minute >= $1 AND figure LIKE $2
             GROUP BY name, figure",
            &[Param::Int(since_ms), text(like)],
        )
        .await?;
    rows.iter()
        .map(|row| Ok((string(row, 0)?, string(row, 1)?, int(row, 2)?)))
        .collect()
}

/// The last `figure` stored for each of `names` (a source's `last_at`), read newest first
/// along the key, so that a long quiet stretch costs nothing.
async fn latest<I: Tx>(
    io: &I,
    scope: StatScope,
    names: &[String],
    figure: &str,
) -> Result<Vec<(String, i64)>, StoreError> {
    let mut found = Vec::new();
    for name in names {
        let rows = io
            .query(
                "SELECT value FROM stats WHERE scope = $1 AND name = $2 AND figure = $3
                 ORDER BY minute DESC LIMIT 1",
                &[text(scope.as_str()), text(name), text(figure)],
            )
            .await?;
        if let Some(row) = rows.first() {
            found.push((name.clone(), int(row, 0)?));
        }
    }
    Ok(found)
}

/// The overview's figures of `names`: rejections since `since_ms`, last deliveries.
pub(crate) async fn source_stats<I: Tx>(
    io: &I,
    names: &[String],
    since_ms: i64,
) -> Result<SourceStats, StoreError> {
    Ok(SourceStats {
        rejected: source_totals(io, since_ms, "rejected:%").await?,
        last_delivery: latest(io, StatScope::Source, names, "last_at").await?,
    })
}

/// Deletes the figures of minutes before `before_ms`.
pub(crate) async fn purge<I: Tx>(io: &I, before_ms: i64) -> Result<u64, StoreError> {
    io.execute(
        "DELETE FROM stats WHERE minute < $1",
        &[Param::Int(before_ms)],
    )
    .await
}
