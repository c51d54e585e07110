//! Forwarding's store flows (docs/forwarding.md), written once for every store over
//! the backend's `Tx`: delivery rows written with the decision, claims under a lease,
//! verdicts, listings, replay and skip. What may be sent, and what a replay does,
//! is decided by the pure rules of [`crate::forward::queue`]; these flows load a
//! queue (one destination, source and aggregate, rows in applied order) and write
//! what the rules say.

use std::collections::{HashMap, HashSet};

use super::backend::Param;
use super::backend::{int, one_int, opt_bytes, opt_int, opt_string, string, text, Cell, Tx};
use super::bulk::BulkJob;
use super::{cut_page, SourceRules, StoreError};
use crate::domain::encryption::{Binding, Column};
use crate::domain::kind::DeliveryOrder;
use crate::domain::kind::PendingRow;
use crate::domain::ordering::Outcome;
use crate::forward::answer::{AttemptRecord, Verdict};
use crate::forward::queue::{self, DeliveryStatus, NextSend, Queued, ReplayDecision};
use crate::forward::select::{deliveries_for, SettledEvent};

/// One delivery of an applied event to one destination, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryRecord {
    /// Row id: rising in applied order; listings page by it.
    pub id: i64,
    /// The destination's name.
    pub destination: String,
    /// The event's source.
    pub source: String,
    /// The event's row in the log, with the body to send (retention keeps it until the
    /// delivery is delivered or skipped).
    pub event_row: i64,
    /// The event's id.
    pub event_id: String,
    /// The aggregate, in stored form.
    pub aggregate: String,
    /// The event's sequence.
    pub sequence: i64,
    /// The event's type (empty when the kind locates none).
    pub event_type: String,
    /// The request's `webhook-id`, stable across retries, replays and nodes.
    pub webhook_id: String,
    /// How it is ordered in its aggregate.
    pub order: DeliveryOrder,
    /// Where it is in its life.
    pub status: DeliveryStatus,
    /// Requests started since it was written or last replayed (a claim starts one).
    pub attempts: i64,
    /// A retrying delivery's next attempt, unix milliseconds.
    pub next_attempt_at_ms: Option<i64>,
    /// The node holding an in-flight delivery.
    pub lease_owner: Option<String>,
    /// Until when that node holds it; afterwards another may claim it again.
    pub lease_until_ms: Option<i64>,
    /// The last failure (or why it was superseded).
    pub last_error: Option<String>,
    /// When it was written (the decision's time), unix milliseconds.
    pub created_at_ms: i64,
    /// When it got its 2xx.
    pub delivered_at_ms: Option<i64>,
    /// Its attempts, oldest first (filled by [`super::Store::delivery`] only).
    pub history: Vec<AttemptRecord>,
    /// The event's body to send, read with the claim (filled by
    /// [`super::Store::claim_deliveries`] only; none there when the event is gone).
    pub body: Option<Vec<u8>>,
    /// The event's kept request headers as a JSON object text (filled by the claim only).
    pub event_headers: Option<String>,
}

/// A verdict waiting to be recorded with others in one transaction (see
/// [`super::Store::record_delivery_attempts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingVerdict {
    /// The in-flight delivery.
    pub id: i64,
    /// What its attempt came to.
    pub verdict: Verdict,
    /// The attempt, for its history.
    pub attempt: AttemptRecord,
    /// When the verdict was reached, unix milliseconds (`delivered_at` of a 2xx).
    pub at_ms: i64,
}

/// Which deliveries of a destination a listing covers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryFilter {
    /// Only this status.
    pub status: Option<DeliveryStatus>,
    /// Only this aggregate, in stored form.
    pub aggregate: Option<String>,
}

/// A page of a destination's deliveries, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPage {
    /// The deliveries.
    pub items: Vec<DeliveryRecord>,
    /// The id to pass as cursor for the next page.
    pub next_cursor: Option<i64>,
}

/// What replaying one delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryReplay {
    /// No such delivery of this destination.
    NotFound,
    /// Back to `pending` with a fresh attempt budget, to be sent in its applied place.
    Requeued,
    /// Not sent: a newer latest-wins delivery of its lane was delivered (delivery `by`).
    Superseded {
        /// The newer delivered one.
        by: i64,
    },
    /// Only dead or skipped deliveries are replayed.
    NotReplayable(DeliveryStatus),
    /// Sending it now would put it after the later delivery `after`, already delivered.
    WouldReorder {
        /// The later delivered one.
        after: i64,
    },
}

/// What skipping one delivery did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliverySkip {
    /// No such delivery of this destination.
    NotFound,
    /// Now `skipped`: a dead in-order one no longer blocks its aggregate.
    Skipped,
    /// Only dead or retrying deliveries are skipped.
    NotSkippable(DeliveryStatus),
}

/// A persisted bulk replay of a destination's deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryReplayJob {
    /// The job's id.
    pub id: i64,
    /// The destination.
    pub destination: String,
    /// Which deliveries it replays (dead ones when the filter named no status).
    pub filter: DeliveryFilter,
    /// `running` or `done`.
    pub state: String,
    /// Matching deliveries when the job was created.
    pub total: i64,
    /// Deliveries requeued so far (those answered superseded or would-reorder are not).
    pub requeued: i64,
    /// Creation time, unix milliseconds.
    pub created_at_ms: i64,
    /// Last progress, unix milliseconds.
    pub updated_at_ms: i64,
}

/// One destination's figures for `GET /v1/destinations`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationStats {
    /// Deliveries waiting to be sent: pending and retrying.
    pub backlog: u64,
    /// Requests on the wire (leased, lease not necessarily live).
    pub in_flight: u64,
    /// Dead deliveries.
    pub dead: u64,
    /// Aggregates held by a dead in-order delivery.
    pub blocked_aggregates: u64,
    /// The latest failed attempt's result.
    pub last_error: Option<String>,
}

/// The columns [`record`] reads, in this order.
const COLUMNS: &str = "id, destination, source, event_row, event_id, aggregate, sequence, \
    event_type, webhook_id, ordering, status, attempts, next_attempt_at, lease_owner, \
    lease_until, last_error, created_at, delivered_at";

/// The statuses the partial index `deliveries_active` covers, written exactly as its
/// predicate so that both stores' planners see a query's condition implies it.
const ACTIVE: &str = "('pending', 'in_flight', 'retrying', 'dead')";

/// The stored orders that block their aggregate when dead, as an SQL list.
fn blocking_orders() -> String {
    let quoted: Vec<String> = DeliveryOrder::all()
        .filter(|o| o.blocks_when_dead())
        .map(|o| format!("'{}'", o.to_stored()))
        .collect();
    format!("({})", quoted.join(", "))
}

/// Writes the deliveries of the applied events of `decisions` (in decision order, which
/// is the applied order the queues send in), inside the decision's transaction; answers
/// how many it wrote, and when any, wakes the other nodes' senders at the commit.
pub(crate) async fn write_deliveries<I: Tx>(
    io: &I,
    rules: &SourceRules,
    aggregate: &str,
    rows: &[PendingRow],
    decisions: &[(i64, Outcome)],
    now_ms: i64,
) -> Result<u64, StoreError> {
    let mut written = 0;
    if rules.destinations.is_empty() {
        return Ok(written);
    }
    for (row, outcome) in decisions {
        let Some(event) = rows.iter().find(|r| r.row == *row) else {
            continue;
        };
        let settled = SettledEvent {
            source: &rules.name,
            kind: rules.kind.as_ref(),
            event_id: &event.event_id,
            event_type: &event.event_type,
            outcome,
        };
        for delivery in deliveries_for(&rules.destinations, &settled) {
            io.execute(
                "INSERT INTO deliveries (destination, source, event_row, event_id, aggregate,
                     sequence, event_type, webhook_id, ordering, status, attempts, created_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 'pending', 0, $10)",
                &[
                    Param::owned(delivery.destination),
                    text(&rules.name),
                    Param::Int(*row),
                    text(&event.event_id),
                    text(aggregate),
                    Param::Int(event.sequence),
                    text(&event.event_type),
                    text(delivery.webhook_id.as_str()),
                    text(&delivery.order.to_stored()),
                    Param::Int(now_ms),
                ],
            )
            .await?;
            written += 1;
        }
    }
    if written > 0 {
        io.wake_senders().await?;
    }
    Ok(written)
}

/// Where a destination's claims stand in the ring of its queues, per destination: each
/// claim walks on from where the last one stopped, so every queue gets its turn and a
/// claim never reads the rows waiting behind a queue's first.
#[derive(Debug, Default)]
pub(crate) struct ClaimCursors(std::sync::Mutex<HashMap<String, QueueKey>>);

/// A queue of a destination: its source and aggregate.
pub(crate) type QueueKey = (String, String);

impl ClaimCursors {
    /// Where `destination`'s next claim starts (after this queue), if anywhere yet.
    pub(crate) fn get(&self, destination: &str) -> Option<QueueKey> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(destination)
            .cloned()
    }

    /// Remembers where `destination`'s last claim stopped (`None`: at the ring's start).
    pub(crate) fn set(&self, destination: &str, at: Option<QueueKey>) {
        let mut cursors = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match at {
            Some(at) => cursors.insert(destination.to_owned(), at),
            None => cursors.remove(destination),
        };
    }
}

/// Queues a claim looks at per statement beyond what it may claim: room to pass over
/// queues with a request on the wire, a retry not yet due or a dead delivery.
const WALK_SLACK: usize = 32;
/// Most queues one claim looks at, however few of them may send.
const WALK_MAX: usize = 4096;

/// The statement that walks `destination`'s queues ($1) in (source, aggregate) order,
/// one index seek per queue, from after ($2, $3) when `after` (else from the start),
/// at most $4 queues ($2 without `after`): each queue's first active delivery that is not a dead one its
/// order lets pass, with what decides whether it may go now.
fn walk_sql(after: bool) -> String {
    let first_row = format!(
        "FROM deliveries d WHERE d.destination = $1 AND d.status IN {ACTIVE}
             AND (d.status <> 'dead' OR d.ordering IN {blocking})",
        blocking = blocking_orders()
    );
    // Two seeks, not one row-value comparison: neither store seeks an index on
    // `(source, aggregate) > (a, b)` when a and b come from the walk's previous row.
    let next = |source: &str, aggregate: &str| {
        format!(
            "COALESCE(
                 (SELECT d.id {first_row} AND d.source = {source} AND d.aggregate > {aggregate}
                  ORDER BY d.aggregate, d.id LIMIT 1),
                 (SELECT d.id {first_row} AND d.source > {source}
                  ORDER BY d.source, d.aggregate, d.id LIMIT 1))"
        )
    };
    let start = if after {
        next("$2", "$3")
    } else {
        format!("(SELECT d.id {first_row} ORDER BY d.source, d.aggregate, d.id LIMIT 1)")
    };
    format!(
        "WITH RECURSIVE walk (id, source, aggregate, step) AS (
             SELECT n.id, n.source, n.aggregate, CAST(1 AS BIGINT) FROM deliveries n
             WHERE n.id = {start}
             UNION ALL
             SELECT n.id, n.source, n.aggregate, walk.step + 1 FROM walk
             JOIN deliveries n ON n.id = {next}
             WHERE walk.step < {steps})
         SELECT h.source, h.aggregate, h.status, h.next_attempt_at, h.lease_until
         FROM walk JOIN deliveries h ON h.id = walk.id ORDER BY walk.step",
        next = next("walk.source", "walk.aggregate"),
        steps = if after { "$4" } else { "$2" },
    )
}

/// Up to `steps` of `destination`'s queues after `after` (from the start when `None`), in
/// ring order, each with whether its first delivery may go at `now_ms` (pending, a retry
/// due, a lease run out: a node that died holding it).
async fn walk_queues<I: Tx>(
    io: &I,
    destination: &str,
    after: Option<&QueueKey>,
    steps: usize,
    now_ms: i64,
) -> Result<Vec<(QueueKey, bool)>, StoreError> {
    let mut params = vec![text(destination)];
    if let Some((source, aggregate)) = after {
        params.extend([text(source), text(aggregate)]);
    }
    params.push(Param::Int(i64::try_from(steps).unwrap_or(i64::MAX)));
    let rows = io.query(&walk_sql(after.is_some()), &params).await?;
    rows.iter()
        .map(|row| {
            let may_go = match parse_status(&string(row, 2)?)? {
                DeliveryStatus::Pending => true,
                DeliveryStatus::Retrying => opt_int(row, 3)?.is_none_or(|at| at <= now_ms),
                DeliveryStatus::InFlight => opt_int(row, 4)?.is_none_or(|until| until <= now_ms),
                _ => false,
            };
            Ok(((string(row, 0)?, string(row, 1)?), may_go))
        })
        .collect()
}

/// Claims up to `limit` deliveries of `destination` that may be sent at `now_ms`, at
/// most one per queue and only what [`queue::next_send`] allows, leasing each to
/// `owner` until `lease_until_ms`. A queue another node is claiming is passed over.
/// Queues are visited in ring order from where `cursors` says the destination's last
/// claim stopped, a batch at a time (one walk, one lock statement, one read, one write
/// of each kind); where this one stops is kept there for the next.
pub(crate) async fn claim<I: Tx>(
    io: &I,
    destination: &str,
    owner: &str,
    (now_ms, lease_until_ms): (i64, i64),
    limit: usize,
    cursors: &ClaimCursors,
) -> Result<Vec<DeliveryRecord>, StoreError> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let after = cursors.get(destination);
    let lease = Lease {
        owner,
        now_ms,
        until_ms: lease_until_ms,
    };
    let steps = limit.saturating_add(WALK_SLACK).min(WALK_MAX);
    let mut claimed = Vec::new();
    let mut wraps_left = usize::from(after.is_some());
    let mut cursor = after;
    let mut seen = HashSet::new();
    let mut walked = 0;
    let mut came_round = false;
    while claimed.len() < limit && walked < WALK_MAX && !came_round {
        let want = limit - claimed.len();
        let queues = walk_queues(io, destination, cursor.as_ref(), steps, now_ms).await?;
        walked += steps;
        let at_end = queues.len() < steps;
        let mut candidates = Vec::new();
        for (key, may_go) in queues {
            if !seen.insert(key.clone()) {
                // Came round to where this claim started.
                came_round = true;
                break;
            }
            cursor = Some(key.clone());
            if may_go {
                candidates.push(key);
                if candidates.len() == want {
                    break;
                }
            }
        }
        let locked = lock_queues(io, destination, &candidates).await?;
        claimed.extend(claim_locked(io, destination, &locked, &lease).await?);
        if at_end && candidates.len() < want && !came_round {
            cursor = None;
            if wraps_left == 0 {
                break;
            }
            wraps_left -= 1;
        }
    }
    cursors.set(destination, cursor);
    claimed.sort_unstable();
    with_bodies(io, destination, &claimed).await
}

/// Who leases a claimed delivery, from when and until when.
struct Lease<'a> {
    owner: &'a str,
    now_ms: i64,
    until_ms: i64,
}

/// Takes, in one statement, the locks of those of `queues` of `destination` that no
/// other node is claiming; answers them in the order given.
async fn lock_queues<I: Tx>(
    io: &I,
    destination: &str,
    queues: &[QueueKey],
) -> Result<Vec<QueueKey>, StoreError> {
    if queues.is_empty() {
        return Ok(Vec::new());
    }
    let (sources, aggregates): (Vec<String>, Vec<String>) = queues.iter().cloned().unzip();
    // The key is the text `queue_key` makes, so that every node and version agrees on it.
    let rows = io
        .query(
            &format!(
                "SELECT q.source, q.aggregate FROM {} WHERE {}",
                I::source_aggregate_pairs(1, "q"),
                I::try_lock("$3 || q.source || $4 || q.aggregate"),
            ),
            &[
                Param::Texts(sources),
                Param::Texts(aggregates),
                Param::owned(queue_key_prefix(destination)),
                Param::owned(KEY_SEPARATOR.to_string()),
            ],
        )
        .await?;
    let locked: HashSet<QueueKey> = rows
        .iter()
        .map(|row| Ok((string(row, 0)?, string(row, 1)?)))
        .collect::<Result<_, StoreError>>()?;
    Ok(queues
        .iter()
        .filter(|q| locked.contains(*q))
        .cloned()
        .collect())
}

/// Sends what [`queue::next_send`] allows from each of the `locked` queues of
/// `destination`, at most one delivery per queue, in a constant number of statements:
/// one read of every queue, one write of the supersedes, one of the leases. Answers
/// the ids leased.
async fn claim_locked<I: Tx>(
    io: &I,
    destination: &str,
    locked: &[(String, String)],
    lease: &Lease<'_>,
) -> Result<Vec<i64>, StoreError> {
    if locked.is_empty() {
        return Ok(Vec::new());
    }
    let mut rows = load_queues(io, destination, locked, lease.now_ms).await?;
    let mut supersedes = Vec::new();
    let mut sends = Vec::new();
    for queue in locked {
        let Some(rows) = rows.get_mut(queue) else {
            continue;
        };
        loop {
            match queue::next_send(rows, lease.now_ms) {
                NextSend::Supersede { id, by } => {
                    supersedes.push((id, by));
                    mark(rows, id, DeliveryStatus::Skipped);
                }
                NextSend::Send(id) => {
                    sends.push(id);
                    break;
                }
                _ => break,
            }
        }
    }
    let mut rest = supersedes.as_slice();
    while !rest.is_empty() {
        let (part, next) = rest.split_at(chunk_len(rest.len()));
        let mut params = Vec::new();
        let values: Vec<String> = part
            .iter()
            .map(|(id, by)| {
                row_of(
                    &mut params,
                    vec![
                        ("BIGINT", Param::Int(*id)),
                        ("TEXT", Param::owned(format!("superseded by {by}"))),
                    ],
                )
            })
            .collect();
        io.execute(
            &format!(
                "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL,
                     lease_owner = NULL, lease_until = NULL, last_error = v.column2
                 FROM (VALUES {}) AS v
                 WHERE deliveries.id = v.column1 AND deliveries.status IN ('pending', 'retrying')",
                values.join(", ")
            ),
            &params,
        )
        .await?;
        rest = next;
    }
    if sends.is_empty() {
        return Ok(sends);
    }
    // Conditional: a verdict recorded meanwhile by an expired lease's holder (it takes no
    // queue lock) wins, and that queue waits.
    let leased = io
        .query(
            &format!(
                "UPDATE deliveries SET status = 'in_flight', attempts = attempts + 1,
                     next_attempt_at = NULL, lease_owner = $2, lease_until = $3
                 WHERE {} AND (status IN ('pending', 'retrying')
                       OR (status = 'in_flight' AND lease_until <= $4))
                 RETURNING id",
                I::in_ids("id", 1)
            ),
            &[
                Param::Ids(sends),
                text(lease.owner),
                Param::Int(lease.until_ms),
                Param::Int(lease.now_ms),
            ],
        )
        .await?;
    leased.iter().map(|row| int(row, 0)).collect()
}

/// Undoes the claims of deliveries `ids` that `owner` still holds in flight and never
/// sent: the attempt the claim counted is taken back, and each goes back to `pending`, or
/// to `retrying` due at `now_ms` when it had attempts before; answers how many it released
/// and, when any, wakes the senders, so that they go at once rather than at lease expiry.
pub(crate) async fn release<I: Tx>(
    io: &I,
    owner: &str,
    ids: &[i64],
    now_ms: i64,
) -> Result<u64, StoreError> {
    let mut released = 0;
    let mut rest = ids;
    while !rest.is_empty() {
        let (part, next) = rest.split_at(chunk_len(rest.len()));
        let mut params = vec![text(owner), Param::Int(now_ms)];
        let placeholders: Vec<String> = part
            .iter()
            .map(|id| {
                params.push(Param::Int(*id));
                format!("${}", params.len())
            })
            .collect();
        // Every SET reads the row as it was, so `attempts` here is the claim's count.
        released += io
            .execute(
                &format!(
                    "UPDATE deliveries SET attempts = attempts - 1,
                         status = CASE WHEN attempts > 1 THEN 'retrying' ELSE 'pending' END,
                         next_attempt_at = CASE WHEN attempts > 1 THEN CAST($2 AS BIGINT) END,
                         lease_owner = NULL, lease_until = NULL
                     WHERE id IN ({}) AND status = 'in_flight' AND lease_owner = $1",
                    placeholders.join(", ")
                ),
                &params,
            )
            .await?;
        rest = next;
    }
    if released > 0 {
        io.wake_senders().await?;
    }
    Ok(released)
}

/// Deliveries `ids` of `destination` in id order, each with its event's body and kept
/// headers, in one query: the sender then reads nothing more before its request.
async fn with_bodies<I: Tx>(
    io: &I,
    destination: &str,
    ids: &[i64],
) -> Result<Vec<DeliveryRecord>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let columns: Vec<String> = COLUMNS.split(", ").map(|c| format!("d.{c}")).collect();
    let placeholders: Vec<String> = (2..ids.len() + 2).map(|n| format!("${n}")).collect();
    let mut params = vec![text(destination)];
    params.extend(ids.iter().map(|id| Param::Int(*id)));
    let rows = io
        .query(
            &format!(
                "SELECT {}, ev.body, ev.headers FROM deliveries d
                 LEFT JOIN events ev ON ev.id = d.event_row
                 WHERE d.destination = $1 AND d.id IN ({}) ORDER BY d.id",
                columns.join(", "),
                placeholders.join(", ")
            ),
            &params,
        )
        .await?;
    if rows.len() != ids.len() {
        return Err(StoreError::Internal(
            (format!("claimed {} deliveries, read {} back", ids.len(), rows.len())).into(),
        ));
    }
    let width = COLUMNS.split(", ").count();
    let keys = io.vault().keys_for(io, &rows).await?;
    rows.iter()
        .map(|row| {
            let mut found = record(row)?;
            let at = |column| Binding::event(column, &found.event_id);
            // A body that does not open, or an erased one (no logged body is empty), is
            // sent as none: the delivery is dead, named so.
            found.body = opt_bytes(row, width)?
                .filter(|b| !b.is_empty())
                .and_then(|b| keys.open(b, at(Column::Body)).ok());
            found.event_headers = keys
                .open_opt_text(opt_string(row, width + 1)?, at(Column::Headers))
                .unwrap_or_default();
            Ok(found)
        })
        .collect()
}

/// Records each verdict of `verdicts` as [`record_verdict`] does, in the caller's one
/// transaction and a few statements per chunk rather than two per verdict; answers, in
/// order, whether each was recorded (`owner` still held it in flight).
pub(crate) async fn record_verdicts<I: Tx>(
    io: &I,
    owner: &str,
    verdicts: &[PendingVerdict],
) -> Result<Vec<bool>, StoreError> {
    let mut recorded = Vec::with_capacity(verdicts.len());
    let mut rest = verdicts;
    while !rest.is_empty() {
        let (part, next) = rest.split_at(chunk_len(rest.len()));
        let mut params = vec![text(owner)];
        let mut values = Vec::with_capacity(part.len());
        for v in part {
            let (next_attempt_at, error, delivered_at) = verdict_columns(&v.verdict, v.at_ms);
            values.push(row_of(
                &mut params,
                vec![
                    ("BIGINT", Param::Int(v.id)),
                    ("TEXT", text(v.verdict.status().as_str())),
                    ("BIGINT", Param::OptInt(next_attempt_at)),
                    ("TEXT", Param::opt_owned(error)),
                    ("BIGINT", Param::OptInt(delivered_at)),
                ],
            ));
        }
        let changed = io
            .query(
                &format!(
                    "UPDATE deliveries SET status = v.column2, next_attempt_at = v.column3,
                         last_error = COALESCE(v.column4, deliveries.last_error),
                         delivered_at = v.column5, lease_owner = NULL, lease_until = NULL
                     FROM (VALUES {}) AS v
                     WHERE deliveries.id = v.column1 AND deliveries.status = 'in_flight'
                       AND deliveries.lease_owner = $1
                     RETURNING deliveries.id",
                    values.join(", ")
                ),
                &params,
            )
            .await?;
        let changed = changed
            .iter()
            .map(|row| int(row, 0))
            .collect::<Result<std::collections::HashSet<i64>, _>>()?;
        let done: Vec<&PendingVerdict> = part.iter().filter(|v| changed.contains(&v.id)).collect();
        let mut attempts = done.as_slice();
        while !attempts.is_empty() {
            let (some, others) = attempts.split_at(chunk_len(attempts.len()));
            let mut params = Vec::new();
            let values: Vec<String> = some
                .iter()
                .map(|v| {
                    let a = &v.attempt;
                    row_of(
                        &mut params,
                        vec![
                            ("BIGINT", Param::Int(v.id)),
                            ("BIGINT", Param::Int(a.attempt.into())),
                            ("BIGINT", Param::Int(a.at_ms)),
                            ("BIGINT", Param::Int(a.duration_ms)),
                            ("BIGINT", Param::OptInt(a.status.map(i64::from))),
                            ("TEXT", text(&a.result)),
                        ],
                    )
                })
                .collect();
            io.execute(
                &format!(
                    "INSERT INTO delivery_attempts
                         (delivery, attempt, at, duration_ms, http_status, result)
                     VALUES {}",
                    values.join(", ")
                ),
                &params,
            )
            .await?;
            attempts = others;
        }
        recorded.extend(part.iter().map(|v| changed.contains(&v.id)));
        rest = next;
    }
    Ok(recorded)
}

/// How many of `n` items the next statement of a batch takes: the largest power of two
/// up to 64, so that the statements' texts (one per list length) stay few in the stores'
/// prepared-statement caches.
fn chunk_len(n: usize) -> usize {
    let n = n.clamp(1, 64);
    1 << n.ilog2()
}

/// One `VALUES` row of `columns`, each cast to its type (the first row names the
/// columns' types for both stores), its parameters appended to `params`.
fn row_of<'a>(params: &mut Vec<Param<'a>>, columns: Vec<(&str, Param<'a>)>) -> String {
    let cells: Vec<String> = columns
        .into_iter()
        .map(|(ty, param)| {
            params.push(param);
            format!("CAST(${} AS {ty})", params.len())
        })
        .collect();
    format!("({})", cells.join(", "))
}

/// The `next_attempt_at`, `last_error` and `delivered_at` a verdict reached at `now_ms` writes.
fn verdict_columns(verdict: &Verdict, now_ms: i64) -> (Option<i64>, Option<String>, Option<i64>) {
    match verdict {
        Verdict::Delivered => (None, None, Some(now_ms)),
        Verdict::RetryAt { at_ms, error } => (Some(*at_ms), Some(error.clone()), None),
        Verdict::Dead { error } => (None, Some(error.clone()), None),
    }
}

/// Records the verdict of an attempt at delivery `id`, if `owner` still holds it in
/// flight; answers whether it did (a node whose lease was taken over records nothing).
pub(crate) async fn record_verdict<I: Tx>(
    io: &I,
    id: i64,
    owner: &str,
    verdict: &Verdict,
    attempt: &AttemptRecord,
    now_ms: i64,
) -> Result<bool, StoreError> {
    let (next_attempt_at, error, delivered_at) = verdict_columns(verdict, now_ms);
    let changed = io
        .execute(
            "UPDATE deliveries SET status = $3, next_attempt_at = $4,
                 last_error = COALESCE($5, last_error), delivered_at = $6,
                 lease_owner = NULL, lease_until = NULL
             WHERE id = $1 AND status = 'in_flight' AND lease_owner = $2",
            &[
                Param::Int(id),
                text(owner),
                text(verdict.status().as_str()),
                Param::OptInt(next_attempt_at),
                Param::opt_owned(error),
                Param::OptInt(delivered_at),
            ],
        )
        .await?;
    if changed == 0 {
        return Ok(false);
    }
    io.execute(
        "INSERT INTO delivery_attempts (delivery, attempt, at, duration_ms, http_status, result)
         VALUES ($1, $2, $3, $4, $5, $6)",
        &[
            Param::Int(id),
            Param::Int(attempt.attempt.into()),
            Param::Int(attempt.at_ms),
            Param::Int(attempt.duration_ms),
            Param::OptInt(attempt.status.map(i64::from)),
            text(&attempt.result),
        ],
    )
    .await?;
    Ok(true)
}

/// One delivery of `destination` with its attempts.
pub(crate) async fn delivery<I: Tx>(
    io: &I,
    destination: &str,
    id: i64,
) -> Result<Option<DeliveryRecord>, StoreError> {
    let Some(mut record) = by_id(io, destination, id).await? else {
        return Ok(None);
    };
    let attempts = io
        .query(
            "SELECT attempt, at, duration_ms, http_status, result FROM delivery_attempts
             WHERE delivery = $1 ORDER BY id",
            &[Param::Int(id)],
        )
        .await?;
    record.history = attempts
        .iter()
        .map(|row| {
            Ok(AttemptRecord {
                attempt: u32::try_from(int(row, 0)?).unwrap_or(u32::MAX),
                at_ms: int(row, 1)?,
                duration_ms: int(row, 2)?,
                status: opt_int(row, 3)?.and_then(|s| u16::try_from(s).ok()),
                result: string(row, 4)?,
            })
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(Some(record))
}

/// A page of `destination`'s deliveries matching `filter`, newest first, before id `cursor`.
pub(crate) async fn deliveries<I: Tx>(
    io: &I,
    destination: &str,
    filter: &DeliveryFilter,
    limit: usize,
    cursor: Option<i64>,
) -> Result<DeliveryPage, StoreError> {
    let (mut clauses, mut params) = filter_sql(destination, filter);
    if let Some(cursor) = cursor {
        params.push(Param::Int(cursor));
        clauses.push(format!("id < ${}", params.len()));
    }
    params.push(Param::Int(
        i64::try_from(limit.saturating_add(1)).unwrap_or(i64::MAX),
    ));
    let rows = io
        .query(
            &format!(
                "SELECT {COLUMNS} FROM deliveries WHERE {} ORDER BY id DESC LIMIT ${}",
                clauses.join(" AND "),
                params.len()
            ),
            &params,
        )
        .await?;
    let mut items: Vec<DeliveryRecord> =
        rows.iter().map(|r| record(r)).collect::<Result<_, _>>()?;
    let next_cursor = cut_page(&mut items, limit).map(|d| d.id);
    Ok(DeliveryPage { items, next_cursor })
}

/// Replays delivery `id` of `destination` as [`queue::replay`] decides.
pub(crate) async fn replay<I: Tx>(
    io: &I,
    destination: &str,
    id: i64,
) -> Result<DeliveryReplay, StoreError> {
    let Some(found) = by_id(io, destination, id).await? else {
        return Ok(DeliveryReplay::NotFound);
    };
    let key = queue_key(destination, &found.source, &found.aggregate);
    io.query(I::LOCK_KEY, &[text(&key)]).await?;
    let rows = load_queue(
        io,
        (destination, &found.source, &found.aggregate),
        Some(id),
        None,
    )
    .await?;
    let decision = queue::replay(&rows, id)
        .ok_or_else(|| StoreError::Internal(format!("delivery {id} left its queue").into()))?;
    Ok(match decision {
        ReplayDecision::Requeue => {
            io.execute(
                "UPDATE deliveries SET status = 'pending', attempts = 0, next_attempt_at = NULL,
                     lease_owner = NULL, lease_until = NULL
                 WHERE id = $1",
                &[Param::Int(id)],
            )
            .await?;
            io.wake_senders().await?;
            DeliveryReplay::Requeued
        }
        ReplayDecision::Superseded { by } => DeliveryReplay::Superseded { by },
        ReplayDecision::NotReplayable(status) => DeliveryReplay::NotReplayable(status),
        ReplayDecision::WouldReorder { after } => DeliveryReplay::WouldReorder { after },
    })
}

/// Persists a bulk replay of `destination`'s deliveries matching `filter` (dead ones
/// when it names no status).
pub(crate) async fn create_replay_job<I: Tx>(
    io: &I,
    destination: &str,
    filter: &DeliveryFilter,
    now_ms: i64,
) -> Result<DeliveryReplayJob, StoreError> {
    let filter = DeliveryFilter {
        status: Some(filter.status.unwrap_or(DeliveryStatus::Dead)),
        aggregate: filter.aggregate.clone(),
    };
    let (clauses, params) = filter_sql(destination, &filter);
    let total = one_int(
        &io.query(
            &format!(
                "SELECT COUNT(*) FROM deliveries WHERE {}",
                clauses.join(" AND ")
            ),
            &params,
        )
        .await?,
    )?;
    let created = io
        .query(
            "INSERT INTO delivery_replay_jobs
                 (destination, status, aggregate, state, total, created_at, updated_at)
             VALUES ($1, $2, $3, 'running', $4, $5, $5) RETURNING id",
            &[
                text(destination),
                text(filter.status.unwrap_or(DeliveryStatus::Dead).as_str()),
                Param::opt_text(filter.aggregate.as_deref()),
                Param::Int(total),
                Param::Int(now_ms),
            ],
        )
        .await?;
    io.wake_senders().await?;
    Ok(DeliveryReplayJob {
        id: one_int(&created)?,
        destination: destination.to_owned(),
        filter,
        state: "running".into(),
        total,
        requeued: 0,
        created_at_ms: now_ms,
        updated_at_ms: now_ms,
    })
}

/// A bulk replay of deliveries, by id.
pub(crate) async fn replay_job<I: Tx>(
    io: &I,
    id: i64,
) -> Result<Option<DeliveryReplayJob>, StoreError> {
    let rows = io
        .query(
            "SELECT id, destination, status, aggregate, state, total, requeued, created_at,
                    updated_at
             FROM delivery_replay_jobs WHERE id = $1",
            &[Param::Int(id)],
        )
        .await?;
    rows.first()
        .map(|row| {
            Ok(DeliveryReplayJob {
                id: int(row, 0)?,
                destination: string(row, 1)?,
                filter: DeliveryFilter {
                    status: Some(parse_status(&string(row, 2)?)?),
                    aggregate: opt_string(row, 3)?,
                },
                state: string(row, 4)?,
                total: int(row, 5)?,
                requeued: int(row, 6)?,
                created_at_ms: int(row, 7)?,
                updated_at_ms: int(row, 8)?,
            })
        })
        .transpose()
}

/// A bulk replay of a destination's deliveries: each queue's matching deliveries
/// replayed in applied order, as [`replay`] does.
impl BulkJob for DeliveryReplayJob {
    const JOBS: &'static str = "delivery_replay_jobs";
    const ROWS: &'static str = "deliveries";
    // A replayed delivery wakes the senders itself.
    const WAKES_WORKERS: bool = false;

    async fn load<I: Tx>(io: &I, id: i64) -> Result<Option<Self>, StoreError> {
        replay_job(io, id).await
    }

    fn conditions(&self) -> (Vec<String>, Vec<Param<'_>>) {
        filter_sql(&self.destination, &self.filter)
    }

    async fn requeue<I: Tx>(
        &self,
        io: &I,
        source: &str,
        aggregate: &str,
        _now_ms: i64,
    ) -> Result<u64, StoreError> {
        let (mut clauses, mut params) = self.conditions();
        params.extend([text(source), text(aggregate)]);
        let n = params.len();
        clauses.push(format!("source = ${} AND aggregate = ${n}", n - 1));
        let ids = io
            .query(
                &format!(
                    "SELECT id FROM deliveries WHERE {} ORDER BY id",
                    clauses.join(" AND ")
                ),
                &params,
            )
            .await?;
        let mut requeued = 0;
        for row in &ids {
            if replay(io, &self.destination, int(row, 0)?).await? == DeliveryReplay::Requeued {
                requeued += 1;
            }
        }
        Ok(requeued)
    }
}

/// The conditions of `filter` over `destination`'s deliveries, with `$n` placeholders.
fn filter_sql<'a>(
    destination: &'a str,
    filter: &'a DeliveryFilter,
) -> (Vec<String>, Vec<Param<'a>>) {
    let mut params = vec![text(destination)];
    let mut clauses = vec!["destination = $1".to_owned()];
    if let Some(status) = filter.status {
        params.push(text(status.as_str()));
        clauses.push(format!("status = ${}", params.len()));
    }
    if let Some(aggregate) = &filter.aggregate {
        params.push(text(aggregate));
        clauses.push(format!("aggregate = ${}", params.len()));
    }
    (clauses, params)
}

/// Skips delivery `id` of `destination` if [`queue::may_skip`] allows it.
pub(crate) async fn skip<I: Tx>(
    io: &I,
    destination: &str,
    id: i64,
) -> Result<DeliverySkip, StoreError> {
    let Some(found) = by_id(io, destination, id).await? else {
        return Ok(DeliverySkip::NotFound);
    };
    let key = queue_key(destination, &found.source, &found.aggregate);
    io.query(I::LOCK_KEY, &[text(&key)]).await?;
    // Read again under the queue's lock: a claim may have moved it meanwhile.
    let status = by_id(io, destination, id)
        .await?
        .map_or(found.status, |d| d.status);
    if !queue::may_skip(status) {
        return Ok(DeliverySkip::NotSkippable(status));
    }
    io.execute(
        "UPDATE deliveries SET status = 'skipped', next_attempt_at = NULL
         WHERE id = $1 AND status IN ('dead', 'retrying')",
        &[Param::Int(id)],
    )
    .await?;
    io.wake_senders().await?;
    Ok(DeliverySkip::Skipped)
}

/// When, after `now_ms`, `destination`'s earliest retrying delivery is due again or
/// in-flight lease runs out. What is due already but was not claimed waits on something
/// that wakes the sender (a request of its queue ending) or on the poll (another node's).
pub(crate) async fn next_due<I: Tx>(
    io: &I,
    destination: &str,
    now_ms: i64,
) -> Result<Option<i64>, StoreError> {
    let rows = io
        .query(
            "SELECT MIN(t) FROM (
                 SELECT MIN(next_attempt_at) AS t FROM deliveries
                 WHERE destination = $1 AND status = 'retrying' AND next_attempt_at > $2
                 UNION ALL
                 SELECT MIN(lease_until) AS t FROM deliveries
                 WHERE destination = $1 AND status = 'in_flight' AND lease_until > $2) due",
            &[text(destination), Param::Int(now_ms)],
        )
        .await?;
    rows.first().map_or(Ok(None), |row| opt_int(row, 0))
}

/// `destination`'s backlog, requests in flight, dead deliveries, blocked aggregates and last error.
pub(crate) async fn stats<I: Tx>(
    io: &I,
    destination: &str,
) -> Result<DestinationStats, StoreError> {
    // Kept by triggers (migration 14): a few rows, however many deliveries are dead.
    let counts = io
        .query(
            "SELECT status, CAST(SUM(n) AS BIGINT) FROM (
                 SELECT status, n FROM delivery_counts WHERE destination = $1
                 UNION ALL
                 SELECT status, n FROM delivery_count_deltas WHERE destination = $1) c
             GROUP BY status",
            &[text(destination)],
        )
        .await?;
    let mut stats = DestinationStats::default();
    for row in &counts {
        let n = u64::try_from(int(row, 1)?).unwrap_or(0);
        let status = string(row, 0)?;
        if status == BLOCKED_AGGREGATES {
            stats.blocked_aggregates = n;
            continue;
        }
        match parse_status(&status)? {
            DeliveryStatus::Pending | DeliveryStatus::Retrying => stats.backlog += n,
            DeliveryStatus::InFlight => stats.in_flight += n,
            DeliveryStatus::Dead => stats.dead += n,
            _ => {}
        }
    }
    if !I::COUNTS_BLOCKED_AGGREGATES {
        let blocked = io
            .query(
                &format!(
                    "SELECT COUNT(*) FROM (SELECT DISTINCT source, aggregate FROM deliveries
                     WHERE destination = $1 AND status = 'dead' AND ordering IN {}) b",
                    blocking_orders()
                ),
                &[text(destination)],
            )
            .await?;
        stats.blocked_aggregates = u64::try_from(one_int(&blocked)?).unwrap_or(0);
    }
    let last = io
        .query(
            // CROSS JOIN: SQLite walks the failed attempts newest first (an index of them
            // alone) and looks each one's delivery up, instead of reading every delivery of
            // the destination first (docs/benchmarks.md, scrapes).
            // A broker's confirmed publish has no HTTP status: it is told by its result,
            // written as the literal of the partial index `delivery_attempts_failed` (the
            // text of `forward::answer::CONFIRMED`), which SQLite uses only for a verbatim match.
            "SELECT a.result FROM delivery_attempts a CROSS JOIN deliveries d
             WHERE d.id = a.delivery AND d.destination = $1
               AND ((a.http_status IS NULL AND a.result <> 'delivered')
                    OR a.http_status < 200 OR a.http_status > 299)
             ORDER BY a.id DESC LIMIT 1",
            &[text(destination)],
        )
        .await?;
    stats.last_error = last.first().map(|row| string(row, 0)).transpose()?;
    Ok(stats)
}

/// The pseudo-status under which SQLite's triggers count a destination's blocked queues.
const BLOCKED_AGGREGATES: &str = "blocked_aggregates";

/// What separates the parts of a queue's key.
const KEY_SEPARATOR: char = '\u{1f}';

/// The key of a queue's lock, the same on every node and version.
pub(crate) fn queue_key(destination: &str, source: &str, aggregate: &str) -> String {
    format!(
        "{}{source}{KEY_SEPARATOR}{aggregate}",
        queue_key_prefix(destination)
    )
}

/// What every key of `destination`'s queues starts with; a claim appends the rest in SQL.
fn queue_key_prefix(destination: &str) -> String {
    format!("deliveries{KEY_SEPARATOR}{destination}{KEY_SEPARATOR}")
}

/// The queue's rows the rules need, in applied order: from its first undecided one
/// (decided history before it changes nothing), or from `from` when given. With
/// `now_ms`, an in-flight row whose lease expired reads as pending: its node is gone.
async fn load_queue<I: Tx>(
    io: &I,
    (destination, source, aggregate): (&str, &str, &str),
    from: Option<i64>,
    now_ms: Option<i64>,
) -> Result<Vec<Queued>, StoreError> {
    // One round trip: the first undecided row is found in the same statement.
    let mut params = vec![text(destination), text(source), text(aggregate)];
    let start = match from {
        Some(id) => {
            params.push(Param::Int(id));
            "$4".to_owned()
        }
        None => format!(
            "(SELECT COALESCE(MIN(id), 0) FROM deliveries
              WHERE destination = $1 AND source = $2 AND aggregate = $3 AND status IN {ACTIVE})"
        ),
    };
    let rows = io
        .query(
            &format!(
                "SELECT id, ordering, status, next_attempt_at, lease_until FROM deliveries
                 WHERE destination = $1 AND source = $2 AND aggregate = $3 AND id >= {start}
                 ORDER BY id"
            ),
            &params,
        )
        .await?;
    rows.iter().map(|row| queued(row, 0, now_ms)).collect()
}

/// The rows of each of `queues` (source and aggregate of `destination`) as
/// [`load_queue`] reads them at `now_ms`, all in one query.
async fn load_queues<I: Tx>(
    io: &I,
    destination: &str,
    queues: &[(String, String)],
    now_ms: i64,
) -> Result<HashMap<(String, String), Vec<Queued>>, StoreError> {
    let (sources, aggregates) = queues.iter().map(|q| (q.0.clone(), q.1.clone())).unzip();
    // Each queue's start is found first (materialized), so that its rows are read from
    // there by index rather than its whole history filtered row by row. CROSS JOIN keeps
    // SQLite's planner from scanning the destination's every row instead (it does without
    // statistics); PostgreSQL plans it as the inner join it is.
    let rows = io
        .query(
            &format!(
                "WITH q AS MATERIALIZED (
                     SELECT p.source, p.aggregate,
                            (SELECT COALESCE(MIN(e.id), 0) FROM deliveries e
                             WHERE e.destination = $1 AND e.source = p.source
                               AND e.aggregate = p.aggregate AND e.status IN {ACTIVE}) AS start
                     FROM {})
                 SELECT q.source, q.aggregate, d.id, d.ordering, d.status, d.next_attempt_at,
                        d.lease_until
                 FROM q CROSS JOIN deliveries d
                 WHERE d.destination = $1 AND d.source = q.source AND d.aggregate = q.aggregate
                   AND d.id >= q.start",
                I::source_aggregate_pairs(2, "p")
            ),
            &[
                text(destination),
                Param::Texts(sources),
                Param::Texts(aggregates),
            ],
        )
        .await?;
    let mut found: HashMap<(String, String), Vec<Queued>> = HashMap::new();
    for row in &rows {
        found
            .entry((string(row, 0)?, string(row, 1)?))
            .or_default()
            .push(queued(row, 2, Some(now_ms))?);
    }
    for rows in found.values_mut() {
        rows.sort_unstable_by_key(|q| q.id);
    }
    Ok(found)
}

/// A queue's row read from columns `id, ordering, status, next_attempt_at, lease_until`
/// starting at `at`; with `now_ms`, an in-flight row whose lease expired reads as pending.
fn queued(row: &[Cell], at: usize, now_ms: Option<i64>) -> Result<Queued, StoreError> {
    let mut status = parse_status(&string(row, at + 2)?)?;
    let lease_until = opt_int(row, at + 4)?;
    if status == DeliveryStatus::InFlight
        && lease_until
            .zip(now_ms)
            .is_some_and(|(until, now)| until <= now)
    {
        status = DeliveryStatus::Pending;
    }
    Ok(Queued {
        id: int(row, at)?,
        order: parse_order(&string(row, at + 1)?)?,
        status,
        next_attempt_at_ms: opt_int(row, at + 3)?,
    })
}

fn mark(rows: &mut [Queued], id: i64, status: DeliveryStatus) {
    if let Some(row) = rows.iter_mut().find(|r| r.id == id) {
        row.status = status;
    }
}

/// Delivery `id`, if it is one of `destination`'s.
async fn by_id<I: Tx>(
    io: &I,
    destination: &str,
    id: i64,
) -> Result<Option<DeliveryRecord>, StoreError> {
    let rows = io
        .query(
            &format!("SELECT {COLUMNS} FROM deliveries WHERE id = $1 AND destination = $2"),
            &[Param::Int(id), text(destination)],
        )
        .await?;
    rows.first().map(|r| record(r)).transpose()
}

fn record(row: &[Cell]) -> Result<DeliveryRecord, StoreError> {
    Ok(DeliveryRecord {
        id: int(row, 0)?,
        destination: string(row, 1)?,
        source: string(row, 2)?,
        event_row: int(row, 3)?,
        event_id: string(row, 4)?,
        aggregate: string(row, 5)?,
        sequence: int(row, 6)?,
        event_type: string(row, 7)?,
        webhook_id: string(row, 8)?,
        order: parse_order(&string(row, 9)?)?,
        status: parse_status(&string(row, 10)?)?,
        attempts: int(row, 11)?,
        next_attempt_at_ms: opt_int(row, 12)?,
        lease_owner: opt_string(row, 13)?,
        lease_until_ms: opt_int(row, 14)?,
        last_error: opt_string(row, 15)?,
        created_at_ms: int(row, 16)?,
        delivered_at_ms: opt_int(row, 17)?,
        history: Vec::new(),
        body: None,
        event_headers: None,
    })
}

fn parse_status(stored: &str) -> Result<DeliveryStatus, StoreError> {
    DeliveryStatus::parse(stored)
        .ok_or_else(|| StoreError::Internal(format!("unknown delivery status {stored:?}").into()))
}

fn parse_order(stored: &str) -> Result<DeliveryOrder, StoreError> {
    DeliveryOrder::parse(stored)
        .ok_or_else(|| StoreError::Internal(format!("unknown delivery order {stored:?}").into()))
}
