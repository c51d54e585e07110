//! The alerts' history (docs/api.md, alerts), the alerts firing now, the outbox of notices
//! per channel and the figures the alert rules read from the log, written once for both
//! stores (docs/configuration.md, alerts).
//!
//! An alert over figures every node reads from the shared store is decided once across
//! nodes: each transition is a conditional write on `alerts_firing` (start firing: insert
//! if absent; repeat: update if the last notice is older than `repeat_s`; resolve: delete),
//! and only the node whose write changed a row keeps the notice and queues it. A notice is
//! queued as one `alert_outbox` row per channel in the transaction that keeps it; a channel
//! sends its rows in id order, one attempt at a time under a lease, so that one node sends
//! a channel's head at a time and a node that dies leaves it to another.

use std::collections::BTreeMap;

use serde::Serialize;

use super::backend::{text, Cell, Param, Tx};
use super::rows::{all, Columns};
use super::StoreError;

/// One notice as kept: a rule started firing, repeated or resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AlertRecord {
    /// The row's id (rising in the order notices were decided).
    pub id: i64,
    /// The rule's name.
    pub alert: String,
    /// `firing` or `resolved`.
    pub state: String,
    /// What the rule watches (`dead`, `gap_held`, …).
    pub on: String,
    /// The source it is about, for source rules.
    pub source: Option<String>,
    /// The destination it is about, for destination rules.
    pub destination: Option<String>,
    /// When the alert started firing (unix ms).
    pub since_ms: i64,
    /// When this notice was decided (unix ms).
    pub at_ms: i64,
    /// Whether it repeats a firing notice.
    pub repeat: bool,
    /// One line a person reads.
    pub summary: String,
    /// The figures that fired it.
    pub figures: BTreeMap<String, i64>,
    /// The node that decided it, for a notice about that node's own view (its circuits,
    /// rejection counters, its reach of the store); none for one decided across nodes.
    pub node: Option<String>,
    /// Where it goes and how far each channel got (empty until kept).
    pub channels: Vec<NoticeChannel>,
}

/// One channel's copy of a kept notice in the outbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NoticeChannel {
    /// The channel: `destination:NAME`, `slack:HASH` or `email:RECIPIENTS`.
    pub channel: String,
    /// `pending`, `sent` or `given_up`.
    pub state: String,
    /// Attempts made so far.
    pub attempts: i64,
    /// When it was sent (unix ms).
    pub sent_ms: Option<i64>,
    /// The last failed attempt's reason (never a credential).
    pub error: Option<String>,
}

/// How a notice is decided: on the node's own view, or once across nodes by a conditional
/// write on the alert's row in `alerts_firing` (keyed by rule name and subject).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    /// A node's own condition: kept as decided.
    Own,
    /// Start firing, if no node has: `since` is the notice's `at`.
    Fire {
        /// The source or destination it is about ('' for none).
        subject: String,
    },
    /// Repeat, if the last notice was sent at or before `sent_before_ms`.
    Repeat {
        /// The source or destination it is about ('' for none).
        subject: String,
        /// The latest last-sent time a repeat may follow (`at` − `repeat_s`).
        sent_before_ms: i64,
    },
    /// Resolve, if it fires.
    Resolve {
        /// The source or destination it is about ('' for none).
        subject: String,
    },
}

/// An alert firing now, as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Firing {
    /// The rule's name.
    pub alert: String,
    /// The source or destination it is about ('' for none).
    pub subject: String,
    /// When it started firing (unix ms).
    pub since_ms: i64,
    /// When its last firing notice was decided (unix ms).
    pub last_sent_ms: i64,
}

/// A channel's head of the outbox, as one node found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Nothing pending.
    Idle,
    /// The head waits (for its next attempt, or another node's lease) until this time.
    Waiting(i64),
    /// This node holds the head's lease for one attempt.
    Taken(Box<Claimed>),
}

/// An outbox row this node holds the lease of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimed {
    /// The outbox row.
    pub outbox_id: i64,
    /// Attempts made before this one.
    pub attempts: i64,
    /// The notice.
    pub alert: AlertRecord,
}

/// The outcome of one attempt at an outbox row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempted {
    /// Taken by the channel.
    Sent,
    /// Failed; tried again at `next_attempt_ms`.
    Retry {
        /// Why (never a credential).
        error: String,
        /// When the next attempt is due (unix ms).
        next_attempt_ms: i64,
    },
    /// Refused for good, or out of attempts.
    GaveUp {
        /// Why (never a credential).
        error: String,
    },
}

/// One source's marks in the log the alert rules read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceMarks {
    /// When its latest delivery was received (unix ms).
    pub last_received_ms: Option<i64>,
    /// When its oldest held event was received (unix ms).
    pub oldest_held_ms: Option<i64>,
}

const COLUMNS: &str =
    "id, alert, state, on_kind, source, destination, since, at, repeated, summary, figures, node";

fn record(c: &mut Columns) -> Result<AlertRecord, StoreError> {
    Ok(AlertRecord {
        id: c.int()?,
        alert: c.text()?,
        state: c.text()?,
        on: c.text()?,
        source: c.opt_text()?,
        destination: c.opt_text()?,
        since_ms: c.int()?,
        at_ms: c.int()?,
        repeat: c.boolean()?,
        summary: c.text()?,
        figures: serde_json::from_str(&c.text()?).map_err(super::filter::json_err)?,
        node: c.opt_text()?,
        channels: Vec::new(),
    })
}

/// Keeps `alert` (its id is the store's); the new row's id.
pub(crate) async fn insert<I: Tx>(io: &I, alert: &AlertRecord) -> Result<i64, StoreError> {
    let figures = serde_json::to_string(&alert.figures).map_err(super::filter::json_err)?;
    let params = [
        text(&alert.alert),
        text(&alert.state),
        text(&alert.on),
        Param::opt_text(alert.source.as_deref()),
        Param::opt_text(alert.destination.as_deref()),
        Param::Int(alert.since_ms),
        Param::Int(alert.at_ms),
        Param::Int(i64::from(alert.repeat)),
        text(&alert.summary),
        Param::owned(figures),
        Param::opt_text(alert.node.as_deref()),
    ];
    io.insert_row(
        "INSERT INTO alerts (alert, state, on_kind, source, destination, since, at, repeated, \
         summary, figures, node) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
         ON CONFLICT DO NOTHING",
        &params,
    )
    .await?
    .ok_or_else(|| StoreError::Internal("an alert row was not written".into()))
}

/// Kept notices, newest first, before the id `before` when given.
pub(crate) async fn page<I: Tx>(
    io: &I,
    before: Option<i64>,
    limit: usize,
) -> Result<Vec<AlertRecord>, StoreError> {
    let rows = io
        .query(
            &format!(
                "SELECT {COLUMNS} FROM alerts WHERE (CAST($1 AS BIGINT) IS NULL OR id < $1) \
                 ORDER BY id DESC LIMIT $2"
            ),
            &[Param::OptInt(before), Param::Int(limit as i64)],
        )
        .await?;
    let mut alerts = all(rows, record)?;
    if alerts.is_empty() {
        return Ok(alerts);
    }
    let ids: Vec<i64> = alerts.iter().map(|a| a.id).collect();
    let rows = io
        .query(
            &format!(
                "SELECT alert_id, channel, state, attempts, sent_at, error FROM alert_outbox \
                 WHERE {} ORDER BY id",
                I::in_ids("alert_id", 1)
            ),
            &[Param::Ids(ids)],
        )
        .await?;
    let channels = all(rows, |c| {
        Ok((
            c.int()?,
            NoticeChannel {
                channel: c.text()?,
                state: c.text()?,
                attempts: c.int()?,
                sent_ms: c.opt_int()?,
                error: c.opt_text()?,
            },
        ))
    })?;
    for (alert_id, channel) in channels {
        if let Some(alert) = alerts.iter_mut().find(|a| a.id == alert_id) {
            alert.channels.push(channel);
        }
    }
    Ok(alerts)
}

/// The one `since` a conditional write's `RETURNING since` answered, if it changed a row.
fn returned_since(rows: Vec<Vec<Cell>>) -> Option<i64> {
    match rows.into_iter().next().and_then(|r| r.into_iter().next()) {
        Some(Cell::Int(since)) => Some(since),
        _ => None,
    }
}

/// Keeps `alert` if `transition`'s conditional write changes its row (always for
/// [`Transition::Own`]), with one pending outbox row per channel of `channels`, in one
/// transaction: the notice kept (its id, and the `since` the store holds), or none when
/// another node decided this transition already.
pub(crate) async fn keep<I: Tx>(
    io: &I,
    mut alert: AlertRecord,
    transition: &Transition,
    channels: &[String],
) -> Result<Option<AlertRecord>, StoreError> {
    let since = match transition {
        Transition::Own => Some(alert.since_ms),
        Transition::Fire { subject } => {
            let inserted = io
                .execute(
                    "INSERT INTO alerts_firing (alert, subject, since, last_sent, repeats) \
                     VALUES ($1, $2, $3, $3, 0) ON CONFLICT DO NOTHING",
                    &[text(&alert.alert), text(subject), Param::Int(alert.at_ms)],
                )
                .await?;
            (inserted > 0).then_some(alert.at_ms)
        }
        Transition::Repeat {
            subject,
            sent_before_ms,
        } => returned_since(
            io.query(
                "UPDATE alerts_firing SET last_sent = $3, repeats = repeats + 1 \
                 WHERE alert = $1 AND subject = $2 AND last_sent <= $4 RETURNING since",
                &[
                    text(&alert.alert),
                    text(subject),
                    Param::Int(alert.at_ms),
                    Param::Int(*sent_before_ms),
                ],
            )
            .await?,
        ),
        Transition::Resolve { subject } => returned_since(
            io.query(
                "DELETE FROM alerts_firing WHERE alert = $1 AND subject = $2 RETURNING since",
                &[text(&alert.alert), text(subject)],
            )
            .await?,
        ),
    };
    let Some(since) = since else {
        return Ok(None);
    };
    alert.since_ms = since;
    alert.id = insert(io, &alert).await?;
    alert.channels.clear();
    for channel in channels {
        io.execute(
            "INSERT INTO alert_outbox (alert_id, channel, state, attempts, next_attempt_at) \
             VALUES ($1, $2, 'pending', 0, $3)",
            &[Param::Int(alert.id), text(channel), Param::Int(alert.at_ms)],
        )
        .await?;
        alert.channels.push(NoticeChannel {
            channel: channel.clone(),
            state: "pending".into(),
            attempts: 0,
            sent_ms: None,
            error: None,
        });
    }
    Ok(Some(alert))
}

/// Every alert firing now, as the store holds it.
pub(crate) async fn firing<I: Tx>(io: &I) -> Result<Vec<Firing>, StoreError> {
    let rows = io
        .query(
            "SELECT alert, subject, since, last_sent FROM alerts_firing",
            &[],
        )
        .await?;
    all(rows, |c| {
        Ok(Firing {
            alert: c.text()?,
            subject: c.text()?,
            since_ms: c.int()?,
            last_sent_ms: c.int()?,
        })
    })
}

/// Where a channel's oldest pending row stands for `node` at `now_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Head {
    /// Nothing to take: [`Claim::Idle`] or [`Claim::Waiting`].
    Not(Claim),
    /// Due, and no other node's lease runs on it.
    Due {
        /// The outbox row.
        outbox_id: i64,
        /// Its notice.
        alert_id: i64,
        /// Attempts made so far.
        attempts: i64,
    },
}

/// Reads `channel`'s oldest pending row: whether `node` may take it now. A read, so that
/// an idle channel's look costs no write transaction.
pub(crate) async fn head<I: Tx>(
    io: &I,
    channel: &str,
    node: &str,
    now_ms: i64,
) -> Result<Head, StoreError> {
    let rows = io
        .query(
            "SELECT id, alert_id, attempts, next_attempt_at, leased_by, lease_until \
             FROM alert_outbox WHERE channel = $1 AND state = 'pending' ORDER BY id LIMIT 1",
            &[text(channel)],
        )
        .await?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(Head::Not(Claim::Idle));
    };
    let mut c = Columns::of(row);
    let (outbox_id, alert_id, attempts, next_attempt_ms) = (c.int()?, c.int()?, c.int()?, c.int()?);
    let (leased_by, lease_until) = (c.opt_text()?, c.opt_int()?);
    if next_attempt_ms > now_ms {
        return Ok(Head::Not(Claim::Waiting(next_attempt_ms)));
    }
    if let (Some(holder), Some(until)) = (&leased_by, lease_until) {
        if holder != node && until > now_ms {
            return Ok(Head::Not(Claim::Waiting(until)));
        }
    }
    Ok(Head::Due {
        outbox_id,
        alert_id,
        attempts,
    })
}

/// Takes the lease of `channel`'s oldest pending row for `node` until `now_ms + lease_ms`,
/// unless it is not due yet or another node's lease on it runs: then it waits, and so do
/// the rows behind it (a channel sends in order).
pub(crate) async fn claim<I: Tx>(
    io: &I,
    channel: &str,
    node: &str,
    now_ms: i64,
    lease_ms: i64,
) -> Result<Claim, StoreError> {
    let (outbox_id, alert_id, attempts) = match head(io, channel, node, now_ms).await? {
        Head::Due {
            outbox_id,
            alert_id,
            attempts,
        } => (outbox_id, alert_id, attempts),
        Head::Not(claim) => return Ok(claim),
    };
    // Conditional: of two nodes that read the same free head, one takes it.
    let taken = io
        .execute(
            "UPDATE alert_outbox SET leased_by = $2, lease_until = $3 WHERE id = $1 \
             AND state = 'pending' AND (leased_by IS NULL OR lease_until <= $4 OR leased_by = $2)",
            &[
                Param::Int(outbox_id),
                text(node),
                Param::Int(now_ms.saturating_add(lease_ms)),
                Param::Int(now_ms),
            ],
        )
        .await?;
    if taken == 0 {
        return Ok(Claim::Waiting(now_ms.saturating_add(lease_ms)));
    }
    let rows = io
        .query(
            &format!("SELECT {COLUMNS} FROM alerts WHERE id = $1"),
            &[Param::Int(alert_id)],
        )
        .await?;
    let Some(alert) = all(rows, record)?.into_iter().next() else {
        // Its notice was purged with the history: nothing left to send.
        io.execute(
            "DELETE FROM alert_outbox WHERE id = $1",
            &[Param::Int(outbox_id)],
        )
        .await?;
        return Ok(Claim::Waiting(now_ms));
    };
    Ok(Claim::Taken(Box::new(Claimed {
        outbox_id,
        attempts,
        alert,
    })))
}

/// Records `node`'s attempt number `attempts` at the outbox row `outbox_id` and gives up
/// its lease; false when the lease had passed to another node (which then owns the row).
pub(crate) async fn attempted<I: Tx>(
    io: &I,
    outbox_id: i64,
    node: &str,
    attempts: i64,
    outcome: &Attempted,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let (state, error, next_attempt_ms, sent_ms) = match outcome {
        Attempted::Sent => ("sent", None, now_ms, Some(now_ms)),
        Attempted::Retry {
            error,
            next_attempt_ms,
        } => ("pending", Some(error.as_str()), *next_attempt_ms, None),
        Attempted::GaveUp { error } => ("given_up", Some(error.as_str()), now_ms, None),
    };
    let changed = io
        .execute(
            "UPDATE alert_outbox SET state = $3, attempts = $4, error = $5, \
             next_attempt_at = $6, sent_at = $7, leased_by = NULL, lease_until = NULL \
             WHERE id = $1 AND leased_by = $2",
            &[
                Param::Int(outbox_id),
                text(node),
                text(state),
                Param::Int(attempts),
                Param::opt_text(error),
                Param::Int(next_attempt_ms),
                Param::OptInt(sent_ms),
            ],
        )
        .await?;
    Ok(changed > 0)
}

/// The latest receipt and the oldest held event of `source`, each read through the
/// `(source, id)` and `(source, status, id)` indexes: one row each, whatever the log holds.
pub(crate) async fn source_marks<I: Tx>(io: &I, source: &str) -> Result<SourceMarks, StoreError> {
    let first =
        |rows: Vec<Vec<Cell>>| match rows.into_iter().next().and_then(|r| r.into_iter().next()) {
            Some(Cell::Int(at)) => Some(at),
            _ => None,
        };
    let last = io
        .query(
            "SELECT received_at FROM events WHERE source = $1 ORDER BY id DESC LIMIT 1",
            &[text(source)],
        )
        .await?;
    let held = io
        .query(
            "SELECT received_at FROM events WHERE source = $1 AND status = 'held' \
             ORDER BY id LIMIT 1",
            &[text(source)],
        )
        .await?;
    Ok(SourceMarks {
        last_received_ms: first(last),
        oldest_held_ms: first(held),
    })
}
