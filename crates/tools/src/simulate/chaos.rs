//! The chaos plan: which copies of which events are sent, in what order, and
//! which are resent while in flight. A pure function of the stream and the
//! seed, so a failing run can be replayed exactly.

use std::collections::{HashSet, VecDeque};

use super::stream::{new_event_id, Stream, StreamEvent};
use inhook::domain::kind::SourceKind;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// Which copy of an event a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventCopy {
    /// The event as generated.
    Original,
    /// A redelivery with the same `event_id` and the same bytes.
    SameEventId,
    /// A redelivery under a new `event_id` with the same `idempotency_key`.
    NewEventId,
}

/// One planned delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    /// Index of the aggregate in the stream.
    pub aggregate: usize,
    /// The contract, and so the source, it goes to.
    pub kind: SourceKind,
    /// The event's sequence.
    pub sequence: i64,
    /// Which copy this is.
    pub copy: EventCopy,
    /// The `event_id` in the body.
    pub event_id: String,
    /// The `idempotency_key` in the body, if any.
    pub idempotency_key: Option<String>,
    /// The exact bytes to send.
    pub body: Vec<u8>,
    /// Headers sent beside the signature's (a `json` source's `header:` locations).
    pub headers: Vec<(String, String)>,
    /// The delivery id to sign with, when the event id is the delivery's.
    pub delivery_id: Option<String>,
    /// Whether the answer must be `ignored_unsupported` (a type outside `event_types`).
    pub unsupported: bool,
    /// Whether the identical request is sent again while the first is in flight.
    pub resend: bool,
}

/// How much chaos to plan.
#[derive(Debug, Clone)]
pub struct ChaosSpec {
    /// Seed of the plan's random choices.
    pub seed: u64,
    /// Reordering window, in deliveries of one aggregate.
    pub window: usize,
    /// Probability that an event gets a duplicate delivery.
    pub duplicate_rate: f64,
    /// Probability that a delivery is resent while in flight.
    pub resend_rate: f64,
}

/// The deliveries in the order they are started.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// Every delivery, in start order.
    pub deliveries: Vec<Delivery>,
    /// Events whose first delivery starts after one of a higher sequence of the same aggregate.
    pub reordered: usize,
}

impl Plan {
    /// Number of deliveries that are `copy`.
    pub fn count(&self, copy: EventCopy) -> usize {
        self.deliveries.iter().filter(|d| d.copy == copy).count()
    }

    /// Number of deliveries that are resent while in flight.
    pub fn resends(&self) -> usize {
        self.deliveries.iter().filter(|d| d.resend).count()
    }
}

/// Plans the deliveries of `stream`. Per aggregate, each delivery (original or
/// duplicate) lands at its event's place plus a random offset below `window`,
/// so an event is overtaken by at most `window - 1` later events of its
/// aggregate; aggregates are then interleaved at random.
pub fn plan(stream: &Stream, chaos: &ChaosSpec) -> Plan {
    // A different stream of randomness than the generator's, from the same seed.
    let mut rng = StdRng::seed_from_u64(chaos.seed ^ 0x9e37_79b9_7f4a_7c15);
    let window = chaos.window.max(1) as f64;
    let mut reordered = 0;
    let mut queues: Vec<VecDeque<Delivery>> = Vec::with_capacity(stream.aggregates.len());
    for (a, aggregate) in stream.aggregates.iter().enumerate() {
        let kind = aggregate.key.kind();
        let mut keyed: Vec<(f64, Delivery)> = Vec::new();
        for (i, event) in aggregate.events.iter().enumerate() {
            let delivery = |event: &StreamEvent, copy| Delivery {
                aggregate: a,
                kind,
                sequence: event.sequence,
                copy,
                event_id: event.event_id.clone(),
                idempotency_key: event.idempotency_key.clone(),
                body: serde_json::to_vec(&event.body).unwrap_or_default(),
                headers: event.headers.clone(),
                delivery_id: event.delivery_id().map(str::to_owned),
                unsupported: event.unsupported,
                resend: false,
            };
            let original = delivery(event, EventCopy::Original);
            keyed.push((i as f64 + rng.gen::<f64>() * window, original.clone()));
            if rng.gen_bool(chaos.duplicate_rate) {
                let duplicate = if event.idempotency_key.is_some() && rng.gen_bool(0.5) {
                    delivery(
                        &event.redelivered_as(&new_event_id(&event.event_id)),
                        EventCopy::NewEventId,
                    )
                } else {
                    Delivery {
                        copy: EventCopy::SameEventId,
                        ..original
                    }
                };
                keyed.push((i as f64 + rng.gen::<f64>() * window, duplicate));
            }
        }
        keyed.sort_by(|x, y| x.0.total_cmp(&y.0));
        let mut seen = HashSet::new();
        let mut highest = 0;
        for (_, d) in &keyed {
            if seen.insert(d.sequence) {
                if d.sequence < highest {
                    reordered += 1;
                }
                highest = highest.max(d.sequence);
            }
        }
        queues.push(keyed.into_iter().map(|(_, d)| d).collect());
    }
    let mut order: Vec<usize> = queues
        .iter()
        .enumerate()
        .flat_map(|(a, q)| std::iter::repeat_n(a, q.len()))
        .collect();
    order.shuffle(&mut rng);
    let deliveries = order
        .into_iter()
        .filter_map(|a| queues[a].pop_front())
        .map(|mut d| {
            d.resend = rng.gen_bool(chaos.resend_rate);
            d
        })
        .collect();
    Plan {
        deliveries,
        reordered,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Map, Value};

    use super::*;
    use crate::simulate::stream::{generate, StreamSpec};

    fn chaos(seed: u64) -> ChaosSpec {
        ChaosSpec {
            seed,
            window: 8,
            duplicate_rate: 0.2,
            resend_rate: 0.05,
        }
    }

    #[test]
    fn the_plan_is_a_function_of_the_stream_and_the_seed() {
        let (a, b) = (
            generate(&StreamSpec::sample(7)),
            generate(&StreamSpec::sample(7)),
        );
        assert_eq!(
            plan(&a, &chaos(7)).deliveries,
            plan(&b, &chaos(7)).deliveries
        );
        assert_ne!(
            plan(&a, &chaos(7)).deliveries,
            plan(&a, &chaos(8)).deliveries
        );
    }

    #[test]
    fn the_plan_delivers_everything_within_the_window_with_honest_duplicates() {
        let stream = generate(&StreamSpec::sample(5));
        let chaos = chaos(5);
        let plan = plan(&stream, &chaos);
        let mut first_seen: HashSet<(usize, i64)> = HashSet::new();
        // Per aggregate, the originals seen so far: a later original may overtake at most window-1.
        let mut seen_originals: Vec<Vec<i64>> = vec![Vec::new(); stream.aggregates.len()];
        for d in &plan.deliveries {
            let event = &stream.aggregates[d.aggregate].events[(d.sequence - 1) as usize];
            let body: Map<String, Value> = serde_json::from_slice(&d.body).unwrap();
            match d.copy {
                EventCopy::Original | EventCopy::SameEventId => {
                    assert_eq!(d.event_id, event.event_id);
                    assert_eq!(body, event.body, "a same-id duplicate has the same bytes");
                }
                EventCopy::NewEventId => {
                    assert_ne!(d.event_id, event.event_id);
                    assert_eq!(body["event_id"], json!(d.event_id));
                    assert!(event.idempotency_key.is_some());
                    assert_eq!(body["idempotency_key"], event.body["idempotency_key"]);
                    let mut same = body.clone();
                    same.insert("event_id".into(), json!(event.event_id));
                    assert_eq!(same, event.body, "only the event_id differs");
                }
            }
            if d.copy == EventCopy::Original {
                let overtaken_by = seen_originals[d.aggregate]
                    .iter()
                    .filter(|s| **s > d.sequence)
                    .count();
                assert!(overtaken_by < chaos.window, "overtaken by {overtaken_by}");
                seen_originals[d.aggregate].push(d.sequence);
            }
            first_seen.insert((d.aggregate, d.sequence));
        }
        assert_eq!(plan.count(EventCopy::Original), stream.event_count());
        assert_eq!(first_seen.len(), stream.event_count());
        let duplicates = plan.count(EventCopy::SameEventId) + plan.count(EventCopy::NewEventId);
        assert!((300..500).contains(&duplicates), "{duplicates} duplicates");
        assert!(plan.count(EventCopy::NewEventId) > 100);
        assert!(plan.reordered > 500, "only {} reordered", plan.reordered);
        assert!(plan.resends() > 50);
        let calm = super::plan(
            &stream,
            &ChaosSpec {
                window: 1,
                duplicate_rate: 0.0,
                resend_rate: 0.0,
                ..chaos
            },
        );
        assert_eq!(calm.reordered, 0);
        assert_eq!(calm.deliveries.len(), stream.event_count());
    }
}
