//! Settling an aggregate, written once for every store: load the inputs over
//! [`Tx`], let the source's kind decide (pure), write the plan. The caller's
//! transaction holds the aggregate (SQLite's one writer; PostgreSQL's advisory lock).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use super::backend::{int, text, Cell, Tx};
use super::backend::{ChangeRow, Param, StateRow};
use super::vault::KeySet;
use super::{forwarding, rows, sql};
use super::{
    AggregateState, Decided, DecisionLine, EventRow, SettleReport, SourceRules, StoreError,
};
use crate::domain::encryption::{Binding, Column, DataKey};
use crate::domain::kind::{HeldReach, Kind, KindPlan, PendingRow, SettleInput};
use crate::domain::ordering::{final_at_ingest, ready_at_ingest, HeldRef, Outcome};

/// The aggregate's stored state.
pub(crate) async fn load_state<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
) -> Result<Option<AggregateState>, StoreError> {
    load_state_noting(io, source, aggregate, &mut SealedUnder::default()).await
}

/// The data key what a settle read was sealed under: the aggregate's key as it stands
/// (the transaction holds the aggregate, and an erasure leaves nothing of the old key
/// behind), so its writes are sealed under it without a lookup. None, or two keys (which
/// no store holds): the key is looked up.
#[derive(Default)]
struct SealedUnder {
    key: Option<Arc<DataKey>>,
    mixed: bool,
}

impl SealedUnder {
    fn note(&mut self, key: &Arc<DataKey>) {
        match &self.key {
            None => self.key = Some(Arc::clone(key)),
            Some(seen) if seen.id() != key.id() => self.mixed = true,
            Some(_) => {}
        }
    }

    fn note_all(&mut self, keys: &KeySet) {
        keys.keys().for_each(|key| self.note(key));
    }

    fn current(&self) -> Option<&Arc<DataKey>> {
        self.key.as_ref().filter(|_| !self.mixed)
    }
}

async fn load_state_noting<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    under: &mut SealedUnder,
) -> Result<Option<AggregateState>, StoreError> {
    load_state_from(io, source, aggregate, under, None).await
}

/// [`load_state_noting`], from the row `read` for the whole step if it was.
async fn load_state_from<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    under: &mut SealedUnder,
    read: Option<Vec<Vec<Cell>>>,
) -> Result<Option<AggregateState>, StoreError> {
    let found = match read {
        Some(found) => found,
        None => {
            io.query(sql::LOAD_AGGREGATE, &[text(source), text(aggregate)])
                .await?
        }
    };
    let keys = io.vault().keys_for(io, &found).await?;
    under.note_all(&keys);
    let mut states = rows::all(found, |c| rows::aggregate_state(c, &keys))?;
    Ok(states.pop())
}

/// The pending rows that are not held: received, or retrying and due.
async fn arriving_rows<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    now_ms: i64,
    under: &mut SealedUnder,
    read: Option<Vec<Vec<Cell>>>,
) -> Result<Vec<PendingRow>, StoreError> {
    let found = match read {
        Some(found) => found,
        None => {
            let params = [text(source), text(aggregate), Param::Int(now_ms)];
            io.query(sql::ARRIVING_ROWS, &params).await?
        }
    };
    let keys = io.vault().keys_for(io, &found).await?;
    under.note_all(&keys);
    rows::all(found, |c| rows::pending_row(c, false, &keys))
}

/// The held events, without their bodies, by sequence.
async fn held_refs<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    read: Option<Vec<Vec<Cell>>>,
) -> Result<Vec<HeldRef>, StoreError> {
    let found = match read {
        Some(found) => found,
        None => {
            io.query(sql::HELD_REFS, &[text(source), text(aggregate)])
                .await?
        }
    };
    rows::all(found, rows::held_ref)
}

/// The full rows of the given held events.
async fn held_rows<I: Tx>(
    io: &I,
    held: &[HeldRef],
    under: &mut SealedUnder,
) -> Result<Vec<PendingRow>, StoreError> {
    if held.is_empty() {
        return Ok(Vec::new());
    }
    let statement = format!("{} WHERE {}", sql::PENDING_FROM_EVENTS, I::in_ids("id", 1));
    let ids = held.iter().map(|h| h.row).collect();
    let found = io.query(&statement, &[Param::Ids(ids)]).await?;
    let keys = io.vault().keys_for(io, &found).await?;
    under.note_all(&keys);
    rows::all(found, |c| rows::pending_row(c, true, &keys))
}

/// Sequences at or above `from` taken by decided events (a conflict takes none).
async fn occupied<I: Tx>(
    io: &I,
    source: &str,
    aggregate: &str,
    from: i64,
) -> Result<BTreeSet<i64>, StoreError> {
    let params = [text(source), text(aggregate), Param::Int(from)];
    let found = io.query(sql::OCCUPIED, &params).await?;
    found.iter().map(|row| int(row, 0)).collect()
}

/// What a settle reads first, read for every aggregate of a worker step at once
/// ([`read_step`]): the state row, the arriving rows and the held refs, each as the
/// statement for one aggregate answers them.
#[derive(Default)]
pub(crate) struct FirstReads {
    state: Vec<Vec<Cell>>,
    arriving: Vec<Vec<Cell>>,
    held: Vec<Vec<Cell>>,
}

/// The first reads of every aggregate of `work`, by (source, aggregate), in one statement
/// per table for the whole step where the backend gains by it ([`Tx::SETTLE_READS_BY_STEP`]:
/// PostgreSQL, where a statement per aggregate and table was most of a step's statements,
/// docs/benchmarks.md); none elsewhere, each settle then reads its own.
pub(crate) async fn read_step<I: Tx>(
    io: &I,
    work: &[(SourceRules, String)],
    now_ms: i64,
) -> Result<HashMap<(String, String), FirstReads>, StoreError> {
    let mut reads = HashMap::new();
    if !I::SETTLE_READS_BY_STEP || work.len() < 2 {
        return Ok(reads);
    }
    for (rules, aggregate) in work {
        reads.insert(
            (rules.name.clone(), aggregate.clone()),
            FirstReads::default(),
        );
    }
    let (sources, aggregates): (Vec<String>, Vec<String>) = reads.keys().cloned().unzip();
    let pairs = I::source_aggregate_pairs(1, "a");
    let states = format!(
        "SELECT s.source, s.aggregate, s.aggregate, s.sequence, s.event_id, s.event_type,
                s.state, s.tag, s.watermark, s.updated_at, s.skipped_gaps
         FROM aggregate_state s JOIN {pairs}
           ON s.source = a.source AND s.aggregate = a.aggregate"
    );
    let arriving = format!(
        "SELECT e.source, e.aggregate, e.id, e.body, e.received_at, e.replays > 0, e.event_id,
                e.sequence, e.event_type, e.idempotency_key, e.unordered IS NOT NULL
         FROM events e JOIN {pairs} ON e.source = a.source AND e.aggregate = a.aggregate
         WHERE e.status IN ('received', 'retrying')
           AND (e.status = 'received' OR e.next_attempt_at <= $3)
         ORDER BY e.source, e.aggregate, e.sequence, e.id"
    );
    let held = format!(
        "SELECT e.source, e.aggregate, e.sequence, e.id, e.received_at
         FROM events e JOIN {pairs} ON e.source = a.source AND e.aggregate = a.aggregate
         WHERE e.status = 'held'
         ORDER BY e.source, e.aggregate, e.sequence, e.id"
    );
    let both = || {
        [
            Param::Texts(sources.clone()),
            Param::Texts(aggregates.clone()),
        ]
    };
    let [s, a] = both();
    let arriving_params = [s, a, Param::Int(now_ms)];
    // Pipelined where the backend pipelines: one round trip for the three.
    let (states, arriving, held) = futures_util::future::join3(
        io.query(&states, &both()),
        io.query(&arriving, &arriving_params),
        io.query(&held, &both()),
    )
    .await;
    let mut file = |found: Vec<Vec<Cell>>,
                    pick: fn(&mut FirstReads) -> &mut Vec<Vec<Cell>>|
     -> Result<(), StoreError> {
        for mut row in found {
            let mut key = row.drain(..2);
            let (Some(Cell::Text(source)), Some(Cell::Text(aggregate))) = (key.next(), key.next())
            else {
                return Err(StoreError::Internal(
                    "a step read without its aggregate".into(),
                ));
            };
            drop(key);
            if let Some(reads) = reads.get_mut(&(source, aggregate)) {
                pick(reads).push(row);
            }
        }
        Ok(())
    };
    file(states?, |r| &mut r.state)?;
    file(arriving?, |r| &mut r.arriving)?;
    file(held?, |r| &mut r.held)?;
    Ok(reads)
}

/// The aggregate's new state as a row to save, its state text sealed under `key` when
/// encryption is on.
fn state_row(source: &str, state: &AggregateState, key: Option<&DataKey>) -> StateRow {
    let shown = state.state.to_string();
    let stored = match key {
        Some(key) => key.seal_text(&shown, Binding::event(Column::State, &state.aggregate)),
        None => shown,
    };
    StateRow {
        source: source.to_owned(),
        aggregate: state.aggregate.clone(),
        sequence: state.sequence,
        event_id: state.event_id.clone(),
        event_type: state.event_type.clone(),
        state: stored,
        tag: state.tag.clone(),
        watermark: state.watermark,
        updated_at_ms: state.updated_at_ms,
        skipped_gaps: state.skipped_gaps.clone(),
    }
}

/// What settles decided, not written yet: a worker step of many aggregates (and a batch
/// deciding at ingest) writes each table once for all of them, so that PostgreSQL runs one
/// statement per table, and its statement triggers fire once, however many aggregates the
/// step settled (docs/benchmarks.md, issue #45). The settles of one step touch different
/// aggregates, and none reads what another writes.
#[derive(Default)]
pub(crate) struct Writes {
    states: Vec<StateRow>,
    changes: Vec<ChangeRow>,
    /// Decisions by the hold timeout of their source.
    decisions: Vec<(i64, Vec<(i64, Outcome)>)>,
}

impl Writes {
    /// Adds `other`'s writes after these.
    pub fn append(&mut self, other: Writes) {
        // An upsert may touch a row once: an aggregate settled twice keeps its last state.
        for state in other.states {
            let same =
                |s: &&mut StateRow| s.source == state.source && s.aggregate == state.aggregate;
            match self.states.iter_mut().find(same) {
                Some(earlier) => *earlier = state,
                None => self.states.push(state),
            }
        }
        self.changes.extend(other.changes);
        for (hold_timeout_ms, decisions) in other.decisions {
            match self
                .decisions
                .iter_mut()
                .find(|(h, _)| *h == hold_timeout_ms)
            {
                Some((_, all)) => all.extend(decisions),
                None => self.decisions.push((hold_timeout_ms, decisions)),
            }
        }
    }

    /// Writes everything held, at `now_ms` (every settle of a step decides at one time).
    pub async fn apply<I: Tx>(self, io: &I, now_ms: i64) -> Result<(), StoreError> {
        if !self.states.is_empty() {
            io.save_states(&self.states).await?;
        }
        if !self.changes.is_empty() {
            io.add_changes(&self.changes).await?;
        }
        for (hold_timeout_ms, decisions) in &self.decisions {
            if !decisions.is_empty() {
                io.record_decisions(decisions, now_ms, *hold_timeout_ms)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Settles one aggregate inside the store's transaction: the one settle flow.
pub(crate) async fn settle<I: Tx>(
    io: &I,
    rules: &SourceRules,
    aggregate: &str,
    now_ms: i64,
) -> Result<Settled, StoreError> {
    let (settled, writes) = settle_deferred(io, rules, aggregate, now_ms, None).await?;
    writes.apply(io, now_ms).await?;
    Ok(settled)
}

/// [`settle`], its writes to the state, change and event rows handed back for the caller
/// to apply together with other aggregates' ([`Writes`]); `first`: what [`read_step`] read
/// for the aggregate, if it did.
pub(crate) async fn settle_deferred<I: Tx>(
    io: &I,
    rules: &SourceRules,
    aggregate: &str,
    now_ms: i64,
    first: Option<FirstReads>,
) -> Result<(Settled, Writes), StoreError> {
    let planned = plan_gated(io, rules, aggregate, now_ms, None, None, first)
        .await?
        .ok_or_else(|| StoreError::Internal("an ungated settle was left to the worker".into()))?;
    write_planned(io, rules, aggregate, now_ms, planned, &[]).await
}

/// Events of one aggregate not logged yet, settled before their rows are written (issue
/// #14: one write per event instead of an insert and then an update). `None`: the
/// aggregate is not ready at ingest; nothing was written, the rows are to be logged
/// undecided for the worker. Settled as at the latest of their receipts.
pub(crate) async fn plan_unlogged<I: Tx>(
    io: &I,
    rules: &SourceRules,
    aggregate: &str,
    unlogged: &[&EventRow],
) -> Result<Option<UnloggedPlan>, StoreError> {
    // Stand-in ids until the rows are logged: negative, as no row's id is, and rising
    // in the order given, as logged ids do (ties of a sequence go by row id).
    let stand_ins: Vec<i64> = (-(unlogged.len() as i64)..0).collect();
    let now_ms = unlogged.iter().map(|r| r.received_at).max().unwrap_or(0);
    let rows = unlogged
        .iter()
        .zip(&stand_ins)
        .map(|(r, id)| r.pending(*id));
    let planned = plan_gated(io, rules, aggregate, now_ms, Some(&stand_ins), rows, None);
    Ok(planned.await?.map(|mut planned| {
        for sealed in unlogged.iter().filter_map(|r| r.sealed.as_ref()) {
            planned.under.note(&sealed.key);
        }
        UnloggedPlan {
            planned,
            aggregate: aggregate.to_owned(),
            now_ms,
            stand_ins,
        }
    }))
}

/// A plan that decides events not logged yet, and nothing else.
pub(crate) struct UnloggedPlan {
    planned: Planned,
    aggregate: String,
    now_ms: i64,
    stand_ins: Vec<i64>,
}

impl UnloggedPlan {
    /// The outcome of the `nth` event given to [`plan_unlogged`], for its row to be logged with.
    pub fn outcome(&self, nth: usize) -> Result<&Outcome, StoreError> {
        self.planned
            .plan
            .decisions
            .iter()
            .find(|(row, _)| Some(row) == self.stand_ins.get(nth))
            .map(|(_, outcome)| outcome)
            .ok_or_else(|| StoreError::Internal("an event planned at ingest has no outcome".into()))
    }

    /// Writes the plan once the events are logged, already decided, as rows `logged` (in
    /// the order given to [`plan_unlogged`]); the outcome of each.
    pub async fn write_logged<I: Tx>(
        self,
        io: &I,
        rules: &SourceRules,
        logged: &[i64],
    ) -> Result<Vec<Decided>, StoreError> {
        let now_ms = self.now_ms;
        let (decided, writes) = self.write_logged_deferred(io, rules, logged).await?;
        writes.apply(io, now_ms).await?;
        Ok(decided)
    }

    /// [`Self::write_logged`], its state, change and event writes handed back ([`Writes`]),
    /// to be applied at the plan's time ([`Self::now_ms`]).
    pub async fn write_logged_deferred<I: Tx>(
        mut self,
        io: &I,
        rules: &SourceRules,
        logged: &[i64],
    ) -> Result<(Vec<Decided>, Writes), StoreError> {
        let renumbered: HashMap<i64, i64> = self
            .stand_ins
            .iter()
            .copied()
            .zip(logged.iter().copied())
            .collect();
        let renumber = |row: &mut i64| {
            if let Some(id) = renumbered.get(row) {
                *row = *id;
            }
        };
        self.planned
            .rows
            .iter_mut()
            .for_each(|r| renumber(&mut r.row));
        self.planned
            .plan
            .decisions
            .iter_mut()
            .for_each(|(row, _)| renumber(row));
        let (settled, writes) = write_planned(
            io,
            rules,
            &self.aggregate,
            self.now_ms,
            self.planned,
            logged,
        )
        .await?;
        Ok((settled.decided_each(logged)?, writes))
    }

    /// The time the plan decided at.
    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }
}

/// What settling read and decided, before anything is written.
struct Planned {
    before: Option<AggregateState>,
    rows: Vec<PendingRow>,
    plan: KindPlan,
    under: SealedUnder,
}

/// The reading and deciding half of the settle flow; with `fresh`, `None` unless the
/// aggregate is ready at ingest. `unlogged` joins the rows read as arriving.
async fn plan_gated<I: Tx>(
    io: &I,
    rules: &SourceRules,
    aggregate: &str,
    now_ms: i64,
    fresh: Option<&[i64]>,
    unlogged: impl IntoIterator<Item = PendingRow>,
    first: Option<FirstReads>,
) -> Result<Option<Planned>, StoreError> {
    let kind: &dyn Kind = rules.kind.as_ref();
    let mut under = SealedUnder::default();
    let (state, arriving, held) = match first {
        Some(first) => (Some(first.state), Some(first.arriving), Some(first.held)),
        None => (None, None, None),
    };
    let before = load_state_from(io, &rules.name, aggregate, &mut under, state).await?;
    let mut rows = arriving_rows(io, &rules.name, aggregate, now_ms, &mut under, arriving).await?;
    rows.extend(unlogged);
    let ready = |rows: &[PendingRow], held_in_reach: usize| {
        fresh.is_none_or(|fresh| {
            let pending: Vec<i64> = rows.iter().map(|r| r.row).collect();
            ready_at_ingest(&pending, held_in_reach, fresh)
        })
    };
    if !ready(&rows, 0) {
        return Ok(None);
    }
    let nothing = BTreeSet::new();
    let base = SettleInput {
        aggregate,
        before: before.as_ref(),
        rows: &[],
        occupied: &nothing,
        first_sequence: rules.first_sequence,
        now_ms,
        hold_timeout_ms: rules.hold_timeout_ms,
    };
    let plan = if kind.in_order() {
        let watermark = base.watermark();
        let arriving: Vec<i64> = rows.iter().map(|r| r.sequence).collect();
        let held = held_refs(io, &rules.name, aggregate, held).await?;
        let from = HeldReach::occupied_from(&arriving, &held, watermark);
        let occupied = occupied(io, &rules.name, aggregate, from).await?;
        let (mut reach, first) = HeldReach::start(
            &held,
            watermark,
            &occupied,
            &arriving,
            now_ms,
            rules.hold_timeout_ms,
        );
        if !ready(&rows, first.len()) {
            return Ok(None);
        }
        rows.extend(held_rows(io, first, &mut under).await?);
        loop {
            let input = SettleInput {
                rows: &rows,
                occupied: &occupied,
                ..base
            };
            match reach.settle(kind, &input) {
                Ok(plan) => break plan,
                Err(_) if fresh.is_some() => return Ok(None),
                Err(missing) => rows.extend(held_rows(io, &missing, &mut under).await?),
            }
        }
    } else {
        kind.settle(&SettleInput {
            rows: &rows,
            ..base
        })
    };
    if fresh.is_some_and(|fresh| !final_at_ingest(&plan.decisions, plan.gaps_skipped, fresh)) {
        return Ok(None);
    }
    Ok(Some(Planned {
        before,
        rows,
        plan,
        under,
    }))
}

/// The writing half of the settle flow, but for the state, change and event rows it hands
/// back ([`Writes`]). `logged`: rows logged already decided, whose decisions are not to be
/// recorded again.
async fn write_planned<I: Tx>(
    io: &I,
    rules: &SourceRules,
    aggregate: &str,
    now_ms: i64,
    planned: Planned,
    logged: &[i64],
) -> Result<(Settled, Writes), StoreError> {
    let Planned {
        before,
        rows,
        plan,
        under,
    } = planned;
    let kind: &dyn Kind = rules.kind.as_ref();
    let changed = plan.state.as_ref() != before.as_ref();
    let dies = plan
        .decisions
        .iter()
        .any(|(_, outcome)| matches!(outcome, Outcome::Dead { .. }));
    // The aggregate's key as stored now (the transaction holds the aggregate): a cached
    // one could have been erased by another node, and a state sealed under it lost.
    let key = match under.current() {
        _ if !(changed || dies) || !io.vault().encrypting() => None,
        Some(key) => Some(Arc::clone(key)),
        None => {
            io.vault()
                .aggregate_key(io, &rules.name, aggregate, true)
                .await?
        }
    };
    let decisions: std::borrow::Cow<'_, [(i64, Outcome)]> = match &key {
        Some(key) => sealed_details(&plan.decisions, &rows, key).into(),
        None => (&plan.decisions[..]).into(),
    };
    let mut writes = Writes::default();
    if let Some(state) = plan.state.as_ref().filter(|_| changed) {
        writes
            .states
            .push(state_row(&rules.name, state, key.as_deref()));
        let mut shown = kind.stream_text(&rules.name, state, now_ms);
        if let Some(key) = &key {
            shown = key.seal_text(&shown, Binding::event(Column::Change, aggregate));
        }
        writes.changes.push(ChangeRow {
            source: rules.name.clone(),
            aggregate: aggregate.to_owned(),
            kind: kind.source_kind().label(),
            at_ms: now_ms,
            state: shown,
        });
    }
    let recorded: Vec<(i64, Outcome)> = decisions
        .iter()
        .filter(|(row, _)| !logged.contains(row))
        .cloned()
        .collect();
    if !recorded.is_empty() {
        writes.decisions.push((rules.hold_timeout_ms, recorded));
    }
    let deliveries =
        forwarding::write_deliveries(io, rules, aggregate, &rows, &plan.decisions, now_ms).await?;
    let report = SettleReport {
        deliveries,
        ..report(&rows, &plan, now_ms)
    };
    let settled = Settled {
        report,
        decisions: plan.decisions,
        current_sequence: plan.current_sequence,
    };
    Ok((settled, writes))
}

/// `decisions` with each dead event's detail sealed under the aggregate's `key`, bound
/// to the event (a detail may quote the body it refused).
fn sealed_details(
    decisions: &[(i64, Outcome)],
    rows: &[PendingRow],
    key: &DataKey,
) -> Vec<(i64, Outcome)> {
    decisions
        .iter()
        .map(|(row, outcome)| {
            let sealed = match outcome {
                Outcome::Dead { reason, detail } => {
                    let event_id = rows
                        .iter()
                        .find(|r| r.row == *row)
                        .map_or("", |r| r.event_id.as_str());
                    Outcome::Dead {
                        reason: *reason,
                        detail: key.seal_text(detail, Binding::event(Column::LastError, event_id)),
                    }
                }
                other => other.clone(),
            };
            (*row, sealed)
        })
        .collect()
}

/// Counts and decision lines of a plan, for logs and metrics.
fn report(rows: &[PendingRow], plan: &KindPlan, now_ms: i64) -> SettleReport {
    let mut report = SettleReport {
        gaps_skipped: plan.gaps_skipped,
        ties: plan.ties,
        ..SettleReport::default()
    };
    let by_row: HashMap<i64, &PendingRow> = rows.iter().map(|r| (r.row, r)).collect();
    for (row, outcome) in &plan.decisions {
        let info = by_row.get(row);
        let (received_at_ms, was_held) =
            info.map_or((now_ms, false), |r| (r.received_at_ms, r.was_held));
        if let Some(info) = info.filter(|_| !(was_held && *outcome == Outcome::Held)) {
            report.decided.push(DecisionLine {
                event_id: info.event_id.clone(),
                idempotency_key: info.idempotency_key.clone(),
                sequence: Some(info.sequence),
                decision: super::status_of(outcome).0,
            });
        }
        match outcome {
            Outcome::Held => {
                report.held += 1;
                report.newly_held += u64::from(!was_held);
                continue;
            }
            Outcome::Applied => report.applied += 1,
            Outcome::Stale => report.stale += 1,
            Outcome::Unsupported => report.unsupported += 1,
            Outcome::Dead { reason, .. } => report.dead.push(*reason),
        }
        report.lags_ms.push(now_ms.saturating_sub(received_at_ms));
    }
    report
}

/// What one store transaction did to one aggregate.
pub(crate) struct Settled {
    /// Counts and decision lines.
    pub report: SettleReport,
    /// Every decided or held row with its outcome.
    pub decisions: Vec<(i64, Outcome)>,
    /// The aggregate's current sequence afterwards.
    pub current_sequence: Option<i64>,
}

impl Settled {
    /// The outcome of each of `rows`, rows just logged and settled at ingest: the whole
    /// report goes with the first, so that its metrics and decision lines count once.
    pub fn decided_each(self, rows: &[i64]) -> Result<Vec<Decided>, StoreError> {
        let mut report = Some(self.report);
        rows.iter()
            .map(|row| {
                let outcome = self
                    .decisions
                    .iter()
                    .find(|(r, _)| r == row)
                    .map(|(_, o)| o.clone())
                    .ok_or_else(|| StoreError::Internal("settled event has no outcome".into()))?;
                Ok(Decided {
                    outcome,
                    report: report.take().unwrap_or_default(),
                    current_sequence: self.current_sequence,
                })
            })
            .collect()
    }

    /// The sync-mode answer for `row`, one of the rows just settled.
    pub fn decided(self, row: i64) -> Result<Decided, StoreError> {
        let outcome = self
            .decisions
            .into_iter()
            .find(|(r, _)| *r == row)
            .map(|(_, o)| o)
            .ok_or_else(|| StoreError::Internal("settled event has no outcome".into()))?;
        Ok(Decided {
            outcome,
            report: self.report,
            current_sequence: self.current_sequence,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(aggregate: &str, sequence: i64) -> StateRow {
        StateRow {
            source: "save-game".into(),
            aggregate: aggregate.into(),
            sequence: Some(sequence),
            event_id: None,
            event_type: None,
            state: "{}".into(),
            tag: None,
            watermark: Some(sequence),
            updated_at_ms: sequence,
            skipped_gaps: None,
        }
    }

    fn writes(states: Vec<StateRow>, decisions: Vec<(i64, Vec<(i64, Outcome)>)>) -> Writes {
        Writes {
            states,
            changes: Vec::new(),
            decisions,
        }
    }

    #[test]
    fn a_step_writes_each_aggregate_once_and_its_decisions_by_hold_timeout() {
        let mut step = Writes::default();
        step.append(writes(
            vec![state("a", 1)],
            vec![(100, vec![(1, Outcome::Applied)])],
        ));
        step.append(writes(
            vec![state("b", 1)],
            vec![(200, vec![(2, Outcome::Held)])],
        ));
        step.append(writes(
            vec![state("a", 2)],
            vec![(100, vec![(3, Outcome::Stale)])],
        ));
        let sequences: Vec<(&str, Option<i64>)> = step
            .states
            .iter()
            .map(|s| (s.aggregate.as_str(), s.sequence))
            .collect();
        assert_eq!(
            sequences,
            [("a", Some(2)), ("b", Some(1))],
            "an upsert touches a row once: the later state of `a` replaces the earlier"
        );
        assert_eq!(
            step.decisions,
            [
                (100, vec![(1, Outcome::Applied), (3, Outcome::Stale)]),
                (200, vec![(2, Outcome::Held)]),
            ]
        );
    }
}
