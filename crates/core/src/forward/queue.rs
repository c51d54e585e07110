//! The rules of one (destination, aggregate) queue (docs/forwarding.md): one request at a
//! time, in the order the events were applied; a later delivery is not sent before
//! the earlier one got a 2xx or was given up; a dead in-order delivery blocks the
//! queue until it is replayed or skipped; a replayed latest-wins delivery is never
//! sent after a newer one of its lane was delivered. Pure: the store loads the
//! queue's rows in applied order, and writes what these functions decide.

use std::fmt;

use crate::domain::kind::DeliveryOrder;

/// Where a delivery is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryStatus {
    /// Written with the decision, not yet attempted.
    Pending,
    /// A request is on the wire (or was, when its node died: the lease tells).
    InFlight,
    /// Failed, waiting for its next attempt.
    Retrying,
    /// Answered 2xx.
    Delivered,
    /// Given up after `max_attempts`; a person replays or skips it.
    Dead,
    /// Skipped by a person, or superseded by a newer delivered event of its lane.
    Skipped,
}

impl DeliveryStatus {
    /// Every status, for parsing stored rows and API filters.
    pub const ALL: [DeliveryStatus; 6] = [
        DeliveryStatus::Pending,
        DeliveryStatus::InFlight,
        DeliveryStatus::Retrying,
        DeliveryStatus::Delivered,
        DeliveryStatus::Dead,
        DeliveryStatus::Skipped,
    ];

    /// The stored and API form.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryStatus::Pending => "pending",
            DeliveryStatus::InFlight => "in_flight",
            DeliveryStatus::Retrying => "retrying",
            DeliveryStatus::Delivered => "delivered",
            DeliveryStatus::Dead => "dead",
            DeliveryStatus::Skipped => "skipped",
        }
    }

    /// Reads the stored form back.
    pub fn parse(stored: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == stored)
    }
}

impl fmt::Display for DeliveryStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One delivery of a queue, as the rules need it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Queued {
    /// The delivery's row id.
    pub id: i64,
    /// How it is ordered.
    pub order: DeliveryOrder,
    /// Its status.
    pub status: DeliveryStatus,
    /// A retrying delivery's next attempt, unix milliseconds.
    pub next_attempt_at_ms: Option<i64>,
}

/// What a queue may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextSend {
    /// Send this delivery (mark it in flight first).
    Send(i64),
    /// Do not send this replayed latest-wins delivery: mark it skipped, superseded by `by`.
    Supersede {
        /// The delivery given up.
        id: i64,
        /// The newer delivered one of its lane.
        by: i64,
    },
    /// A request of this queue is on the wire.
    InFlight(i64),
    /// The first undecided delivery retries at this time (unix milliseconds).
    WaitUntil(i64),
    /// A dead in-order delivery holds the queue until it is replayed or skipped.
    Blocked(i64),
    /// Nothing to send.
    Idle,
}

/// The newest delivered delivery after `index` that changed the same lane as `queue[index]`,
/// if that is a latest-wins one: what supersedes it (sending it would put older after newer).
fn superseded_by(queue: &[Queued], index: usize) -> Option<i64> {
    let DeliveryOrder::LatestWins(lane) = queue[index].order else {
        return None;
    };
    queue[index + 1..]
        .iter()
        .rev()
        .find(|q| q.order.lane() == Some(lane) && q.status == DeliveryStatus::Delivered)
        .map(|q| q.id)
}

/// What the queue (its deliveries in applied order) may do at `now_ms`.
pub fn next_send(queue: &[Queued], now_ms: i64) -> NextSend {
    if let Some(q) = queue.iter().find(|q| q.status == DeliveryStatus::InFlight) {
        return NextSend::InFlight(q.id);
    }
    for (index, q) in queue.iter().enumerate() {
        match q.status {
            DeliveryStatus::Delivered | DeliveryStatus::Skipped | DeliveryStatus::InFlight => {}
            DeliveryStatus::Dead if q.order.blocks_when_dead() => return NextSend::Blocked(q.id),
            DeliveryStatus::Dead => {}
            DeliveryStatus::Pending | DeliveryStatus::Retrying => {
                if let Some(by) = superseded_by(queue, index) {
                    return NextSend::Supersede { id: q.id, by };
                }
                return match q.next_attempt_at_ms {
                    Some(at) if q.status == DeliveryStatus::Retrying && at > now_ms => {
                        NextSend::WaitUntil(at)
                    }
                    _ => NextSend::Send(q.id),
                };
            }
        }
    }
    NextSend::Idle
}

/// What a replay of one delivery does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayDecision {
    /// It goes back to `pending`, attempts reset, and is sent in its applied place.
    Requeue,
    /// Answered `superseded`, not sent: a newer latest-wins delivery of its lane was delivered.
    Superseded {
        /// The newer delivered one.
        by: i64,
    },
    /// Only dead or skipped deliveries are replayed; this one is in another status.
    NotReplayable(DeliveryStatus),
    /// Sending it now would put it after a later delivery that was already sent (an
    /// in-order delivery skipped while later ones went on).
    WouldReorder {
        /// The later delivery already delivered, or on its way.
        after: i64,
    },
}

/// What replaying delivery `id` of `queue` does (`None`: not in the queue).
pub fn replay(queue: &[Queued], id: i64) -> Option<ReplayDecision> {
    let index = queue.iter().position(|q| q.id == id)?;
    let q = queue[index];
    if !matches!(q.status, DeliveryStatus::Dead | DeliveryStatus::Skipped) {
        return Some(ReplayDecision::NotReplayable(q.status));
    }
    if let Some(by) = superseded_by(queue, index) {
        return Some(ReplayDecision::Superseded { by });
    }
    if q.order.blocks_when_dead() {
        // A dead in-order delivery held everything after it, so only a skipped one can have
        // later deliveries delivered, or one in flight that may be delivered before this one
        // is sent again; sending it now would break the order.
        if let Some(after) = queue[index + 1..].iter().find(|l| {
            matches!(
                l.status,
                DeliveryStatus::Delivered | DeliveryStatus::InFlight
            )
        }) {
            return Some(ReplayDecision::WouldReorder { after: after.id });
        }
    }
    Some(ReplayDecision::Requeue)
}

/// Whether delivery `status` may be skipped by a person: a dead one (which unblocks its
/// queue), or one waiting to retry (a person giving up on it early).
pub fn may_skip(status: DeliveryStatus) -> bool {
    matches!(status, DeliveryStatus::Dead | DeliveryStatus::Retrying)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::kind::Lane;
    const PROGRESS: Lane = Lane::Part("progress");
    const INVENTORY: Lane = Lane::Part("inventory");
    use DeliveryStatus::*;

    const WHOLE: DeliveryOrder = DeliveryOrder::LatestWins(Lane::Aggregate);
    const IN_ORDER: DeliveryOrder = DeliveryOrder::InOrder(Lane::Aggregate);

    fn q(id: i64, order: DeliveryOrder, status: DeliveryStatus) -> Queued {
        Queued {
            id,
            order,
            status,
            next_attempt_at_ms: (status == Retrying).then_some(1_000),
        }
    }

    #[test]
    fn the_first_undecided_delivery_goes_and_nothing_passes_it() {
        let queue = [
            q(1, IN_ORDER, Delivered),
            q(2, IN_ORDER, Retrying),
            q(3, IN_ORDER, Pending),
        ];
        assert_eq!(next_send(&queue, 999), NextSend::WaitUntil(1_000));
        assert_eq!(next_send(&queue, 1_000), NextSend::Send(2));
        let mut flying = queue;
        flying[2].status = InFlight;
        assert_eq!(next_send(&flying, 5_000), NextSend::InFlight(3));
        assert_eq!(next_send(&[], 0), NextSend::Idle);
        assert_eq!(next_send(&[q(1, WHOLE, Delivered)], 0), NextSend::Idle);
    }

    #[test]
    fn a_dead_in_order_delivery_blocks_and_a_dead_snapshot_does_not() {
        let blocked = [q(1, IN_ORDER, Dead), q(2, WHOLE, Pending)];
        assert_eq!(next_send(&blocked, 0), NextSend::Blocked(1));
        for order in [WHOLE, DeliveryOrder::Unordered] {
            let queue = [q(1, order, Dead), q(2, IN_ORDER, Pending)];
            assert_eq!(next_send(&queue, 0), NextSend::Send(2), "{order:?}");
        }
        let skipped = [q(1, IN_ORDER, Skipped), q(2, WHOLE, Pending)];
        assert_eq!(next_send(&skipped, 0), NextSend::Send(2));
    }

    #[test]
    fn a_replayed_snapshot_after_a_newer_delivered_one_is_superseded() {
        let queue = [q(1, WHOLE, Dead), q(2, WHOLE, Delivered)];
        assert_eq!(
            replay(&queue, 1),
            Some(ReplayDecision::Superseded { by: 2 })
        );
        let other_lane = [
            q(1, DeliveryOrder::LatestWins(PROGRESS), Dead),
            q(2, DeliveryOrder::LatestWins(INVENTORY), Delivered),
            q(3, DeliveryOrder::Unordered, Delivered),
        ];
        assert_eq!(replay(&other_lane, 1), Some(ReplayDecision::Requeue));
        let unordered = [
            q(1, DeliveryOrder::Unordered, Dead),
            q(2, DeliveryOrder::Unordered, Delivered),
        ];
        assert_eq!(replay(&unordered, 1), Some(ReplayDecision::Requeue));
        // Replayed while the newer one was on the wire: caught before sending.
        let requeued = [q(1, WHOLE, Pending), q(2, WHOLE, Delivered)];
        assert_eq!(
            next_send(&requeued, 0),
            NextSend::Supersede { id: 1, by: 2 }
        );
    }

    #[test]
    fn replay_takes_dead_or_skipped_ones_and_never_reorders() {
        let queue = [q(1, IN_ORDER, Dead), q(2, IN_ORDER, Pending)];
        assert_eq!(replay(&queue, 1), Some(ReplayDecision::Requeue));
        assert_eq!(
            replay(&queue, 2),
            Some(ReplayDecision::NotReplayable(Pending))
        );
        assert_eq!(replay(&queue, 9), None);
        let skipped_then_sent = [q(1, IN_ORDER, Skipped), q(2, IN_ORDER, Delivered)];
        assert_eq!(
            replay(&skipped_then_sent, 1),
            Some(ReplayDecision::WouldReorder { after: 2 })
        );
        // A later delivery on its way may be delivered before this one is sent again.
        let skipped_then_flying = [q(1, IN_ORDER, Skipped), q(2, IN_ORDER, InFlight)];
        assert_eq!(
            replay(&skipped_then_flying, 1),
            Some(ReplayDecision::WouldReorder { after: 2 })
        );
        assert!(may_skip(Dead) && may_skip(Retrying));
        assert!(!may_skip(InFlight) && !may_skip(Delivered) && !may_skip(Pending));
        for status in DeliveryStatus::ALL {
            assert_eq!(DeliveryStatus::parse(status.as_str()), Some(status));
        }
    }

    /// A simulated destination: aggregates with mixed orders, answers drawn from 2xx,
    /// 500, 429 with Retry-After, timeouts and refused connections, requests completing
    /// in random interleavings, and a person replaying and skipping now and then.
    mod simulation {
        use super::*;
        use crate::domain::retry::RetryPolicy;
        use crate::forward::answer::{judge, AttemptResult, Verdict};
        use proptest::prelude::*;

        const ORDERS: [DeliveryOrder; 4] = [
            DeliveryOrder::InOrder(INVENTORY),
            DeliveryOrder::LatestWins(INVENTORY),
            DeliveryOrder::LatestWins(PROGRESS),
            DeliveryOrder::Unordered,
        ];

        fn answer(code: u8) -> AttemptResult {
            match code % 7 {
                0..=2 => AttemptResult::http(200 + u16::from(code % 3), None),
                3 => AttemptResult::http(500, None),
                4 => AttemptResult::http(
                    if code.is_multiple_of(2) { 429 } else { 503 },
                    Some(&(code % 5).to_string()),
                ),
                5 => AttemptResult::TimedOut { after_s: 1 },
                _ => AttemptResult::ConnectionFailed("connection refused".into()),
            }
        }

        /// Whether the delivery at `index` may be sent: every earlier one got a 2xx or was given up.
        fn earlier_settled(queue: &[Queued], index: usize) -> bool {
            queue[..index].iter().all(|q| match q.status {
                DeliveryStatus::Delivered | DeliveryStatus::Skipped => true,
                DeliveryStatus::Dead => !q.order.blocks_when_dead(),
                _ => false,
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn first_acceptances_follow_the_applied_order_and_one_request_flies_per_aggregate(
                aggregates in prop::collection::vec(prop::collection::vec(0usize..4, 1..7), 1..5),
                answers in prop::collection::vec(any::<u8>(), 1..64),
                picks in prop::collection::vec(any::<u8>(), 1..64),
                people in prop::collection::vec(any::<u8>(), 1..64),
                max_attempts in 1u32..5,
                person_acts in any::<bool>(),
            ) {
                let policy = RetryPolicy { base_ms: 10, max_delay_ms: 2_000, max_attempts };
                let mut next_id = 0;
                let mut queues: Vec<Vec<Queued>> = aggregates
                    .iter()
                    .map(|orders| orders.iter().map(|&o| {
                        next_id += 1;
                        Queued { id: next_id, order: ORDERS[o], status: DeliveryStatus::Pending, next_attempt_at_ms: None }
                    }).collect())
                    .collect();
                let mut attempts = vec![0u32; next_id as usize + 1];
                let mut ever_sent = vec![false; next_id as usize + 1];
                let mut accepted: Vec<Vec<i64>> = vec![Vec::new(); queues.len()];
                let mut flying: Vec<(usize, usize)> = Vec::new();
                let (mut now, mut answered, mut step) = (0i64, 0usize, 0usize);
                let mut replayed = false;
                for _ in 0..10_000 {
                    step += 1;
                    // People act for a while, then stop: one who replays a delivery that
                    // always fails, forever, would keep it undecided to the end.
                    if person_acts && step < 2_000 {
                        let act = people[step % people.len()];
                        let agg = usize::from(act) % queues.len();
                        let index = (usize::from(act) / 4) % queues[agg].len();
                        let q = queues[agg][index];
                        if act % 8 == 0 {
                            if replay(&queues[agg], q.id) == Some(ReplayDecision::Requeue) {
                                prop_assert!(matches!(q.status, DeliveryStatus::Dead | DeliveryStatus::Skipped));
                                queues[agg][index].status = DeliveryStatus::Pending;
                                attempts[q.id as usize] = 0;
                                replayed = true;
                            }
                        } else if act % 8 == 1 && may_skip(q.status) {
                            queues[agg][index].status = DeliveryStatus::Skipped;
                        }
                    }
                    for (agg, queue) in queues.iter_mut().enumerate() {
                        match next_send(queue, now) {
                            NextSend::Send(id) => {
                                let index = queue.iter().position(|q| q.id == id).unwrap();
                                prop_assert!(earlier_settled(queue, index), "{id} sent early: {queue:?}");
                                queue[index].status = DeliveryStatus::InFlight;
                                attempts[id as usize] += 1;
                                ever_sent[id as usize] = true;
                                flying.push((agg, index));
                            }
                            NextSend::Supersede { id, by } => {
                                let index = queue.iter().position(|q| q.id == id).unwrap();
                                prop_assert!(replayed && by > id);
                                queue[index].status = DeliveryStatus::Skipped;
                            }
                            NextSend::InFlight(id) => {
                                prop_assert!(flying.iter().any(|&(a, i)| a == agg && queue[i].id == id));
                            }
                            NextSend::WaitUntil(at) => prop_assert!(at > now),
                            NextSend::Blocked(_) | NextSend::Idle => {}
                        }
                        let in_flight = queue.iter().filter(|q| q.status == DeliveryStatus::InFlight).count();
                        prop_assert!(in_flight <= 1, "two in flight: {queue:?}");
                    }
                    if !flying.is_empty() {
                        let (agg, index) = flying.remove(usize::from(picks[step % picks.len()]) % flying.len());
                        let result = answer(answers[answered % answers.len()]);
                        answered += 1;
                        now += 1;
                        let q = &mut queues[agg][index];
                        match judge(&result, attempts[q.id as usize], &policy, now, 0.5) {
                            Verdict::Delivered => {
                                q.status = DeliveryStatus::Delivered;
                                accepted[agg].push(q.id);
                            }
                            Verdict::RetryAt { at_ms, .. } => {
                                prop_assert!(at_ms >= now && at_ms <= now + policy.max_delay_ms + policy.max_delay_ms / 4);
                                q.status = DeliveryStatus::Retrying;
                                q.next_attempt_at_ms = Some(at_ms);
                            }
                            Verdict::Dead { .. } => {
                                prop_assert_eq!(attempts[q.id as usize], max_attempts);
                                q.status = DeliveryStatus::Dead;
                            }
                        }
                        continue;
                    }
                    let due = queues.iter().filter_map(|queue| match next_send(queue, now) {
                        NextSend::WaitUntil(at) => Some(at),
                        _ => None,
                    }).min();
                    match due {
                        Some(at) => now = at,
                        None if person_acts && step < 2_000 => now += 1,
                        None => break,
                    }
                }
                prop_assert!(flying.is_empty());
                for (agg, queue) in queues.iter().enumerate() {
                    // First acceptances in applied order. Only a person's replay may accept an
                    // earlier delivery after a later one, and never within one lane: an
                    // order-free one, or a snapshot after a change to another part.
                    let position = |id: &i64| queue.iter().position(|q| q.id == *id).unwrap();
                    let positions: Vec<usize> = accepted[agg].iter().map(position).collect();
                    for (at, &later) in positions.iter().enumerate() {
                        for &earlier in &positions[at + 1..] {
                            if earlier < later {
                                let (e, l) = (queue[earlier].order, queue[later].order);
                                prop_assert!(
                                    replayed && (e.lane().is_none() || e.lane() != l.lane()),
                                    "accepted out of order: {:?} {queue:?}", accepted[agg]
                                );
                            }
                        }
                    }
                    // Everything ends decided, but what a dead in-order delivery blocks, which never went.
                    let blocker = queue.iter().position(|q| q.status == DeliveryStatus::Dead && q.order.blocks_when_dead());
                    for (index, q) in queue.iter().enumerate() {
                        match blocker {
                            Some(b) if index > b && !person_acts => {
                                prop_assert!(!ever_sent[q.id as usize], "sent behind a dead in-order delivery: {queue:?}");
                            }
                            Some(b) if index > b => {}
                            _ => prop_assert!(
                                matches!(q.status, DeliveryStatus::Delivered | DeliveryStatus::Dead | DeliveryStatus::Skipped),
                                "undecided without a blocker: {queue:?}"
                            ),
                        }
                    }
                }
            }
        }
    }
}
