//! The stream: every aggregate's contiguous events, a pure function of the
//! seed. Every body follows its source's contract, and no inventory delta
//! removes more than the slot holds when applied in order.

use std::fmt;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::place::Place;
use inhook::domain::clock;
use inhook::domain::kind::presence::Presence;
use inhook::domain::kind::save::SaveEvent;
use inhook::domain::kind::save::SaveState;
use inhook::domain::kind::SourceKind;
use inhook::domain::AggregateKey;

/// Which aggregate an event belongs to, by its ids in the payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AggregateRef {
    /// A presence user.
    User(String),
    /// A player's save slot.
    Slot {
        /// The player.
        player_id: String,
        /// The slot.
        save_slot: String,
    },
    /// An aggregate of a `json` source, read through the generic aggregates API.
    Json {
        /// The source.
        source: String,
        /// The key its located parts make.
        key: AggregateKey,
    },
}

impl AggregateRef {
    /// The contract the aggregate's events follow.
    pub fn kind(&self) -> SourceKind {
        match self {
            AggregateRef::User(_) => SourceKind::Presence,
            AggregateRef::Slot { .. } => SourceKind::SaveGame,
            AggregateRef::Json { .. } => SourceKind::Json,
        }
    }

    /// The read API path of the aggregate's state (ids are generated URL-safe).
    pub(super) fn read_path(&self) -> String {
        match self {
            AggregateRef::User(user) => format!("/v1/presence/{user}"),
            AggregateRef::Slot {
                player_id,
                save_slot,
            } => format!("/v1/saves/{player_id}/{save_slot}"),
            // The key's text form escapes `%` and `/` inside a part; the path escapes `%` again.
            AggregateRef::Json { source, key } => format!(
                "/v1/sources/{source}/aggregates/{}",
                key.to_string().replace('%', "%25")
            ),
        }
    }
}

impl fmt::Display for AggregateRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AggregateRef::User(user) => write!(f, "presence {user}"),
            AggregateRef::Slot {
                player_id,
                save_slot,
            } => write!(f, "save {player_id}/{save_slot}"),
            AggregateRef::Json { source, key } => write!(f, "{source} {key}"),
        }
    }
}

/// One generated event, exactly as its publisher would send it once.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEvent {
    /// The event's `event_id`.
    pub event_id: String,
    /// The event's `idempotency_key`, when it carries one.
    pub idempotency_key: Option<String>,
    /// Its sequence in the aggregate: 1, 2, 3, …
    pub sequence: i64,
    /// The JSON body.
    pub body: Map<String, Value>,
    /// Request headers a `json` source reads located fields from (`header:Name`).
    pub headers: Vec<(String, String)>,
    /// Where the event id is written, so a redelivery under a new id writes it there.
    pub id_at: Place,
    /// Whether its type is outside the source's `event_types`: every delivery of it
    /// must be answered `ignored_unsupported`, and it changes no state.
    pub unsupported: bool,
}

impl StreamEvent {
    /// An event of a built-in kind: everything in the body, the id at `/event_id`.
    pub fn built_in(
        event_id: String,
        idempotency_key: Option<String>,
        sequence: i64,
        body: Map<String, Value>,
    ) -> Self {
        Self {
            event_id,
            idempotency_key,
            sequence,
            body,
            headers: Vec::new(),
            id_at: Place::Body(vec!["event_id".into()]),
            unsupported: false,
        }
    }

    /// The delivery id the request is signed with, when the event id is the delivery's
    /// (else the scheme derives one from the body, as a publisher's retry resends it).
    pub fn delivery_id(&self) -> Option<&str> {
        (self.id_at == Place::DeliveryId).then_some(self.event_id.as_str())
    }

    /// The same event redelivered under `event_id` (its idempotency key unchanged).
    pub fn redelivered_as(&self, event_id: &str) -> Self {
        let mut copy = self.clone();
        copy.event_id = event_id.to_owned();
        copy.id_at
            .write(&mut copy.body, &mut copy.headers, json!(event_id));
        copy
    }
}

/// The event id of a redelivery under a new id with the same idempotency key.
pub(super) fn new_event_id(event_id: &str) -> String {
    format!("{event_id}_dup")
}

/// One aggregate and its events in sequence order.
#[derive(Debug, Clone, PartialEq)]
pub struct Aggregate {
    /// Whose events these are.
    pub key: AggregateRef,
    /// The events, sequence 1 first.
    pub events: Vec<StreamEvent>,
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct StreamSpec {
    /// Seed of every random choice.
    pub seed: u64,
    /// Events in total.
    pub events: usize,
    /// Aggregates in total.
    pub aggregates: usize,
    /// Share of the aggregates that are presence users.
    pub presence_share: f64,
}

impl StreamSpec {
    /// A short tag in every generated id. It depends on every setting, so two
    /// runs against one server share ids (and so converge) only when they
    /// generate the very same stream: a shorter run with the same seed would
    /// otherwise replay a prefix of a longer one and expect an older state.
    pub(super) fn tag(&self) -> String {
        self.tag_with(&[])
    }

    /// [`Self::tag`], also depending on `more` settings (a `json` run's own).
    pub(super) fn tag_with(&self, more: &[u64]) -> String {
        let mut h = self.seed;
        for &part in [
            self.events as u64,
            self.aggregates as u64,
            self.presence_share.to_bits(),
        ]
        .iter()
        .chain(more)
        {
            // splitmix64 steps: a cheap, stable mix (std's hashers are not stable across releases).
            h = (h ^ part).wrapping_add(0x9e37_79b9_7f4a_7c15);
            h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            h ^= h >> 31;
        }
        format!("{:08x}", h >> 32)
    }
}

/// A generated stream: every aggregate with its contiguous events.
#[derive(Debug, Clone, PartialEq)]
pub struct Stream {
    /// The aggregates, presence users first.
    pub aggregates: Vec<Aggregate>,
}

impl Stream {
    /// Number of events over all aggregates.
    pub fn event_count(&self) -> usize {
        self.aggregates.iter().map(|a| a.events.len()).sum()
    }

    /// Number of aggregates of `kind`.
    pub(super) fn aggregates_of(&self, kind: SourceKind) -> usize {
        self.aggregates
            .iter()
            .filter(|a| a.key.kind() == kind)
            .count()
    }
}

const ITEMS: [&str; 8] = [
    "pressed_flower",
    "old_stamp",
    "brass_key",
    "torn_map",
    "ink_bottle",
    "letter",
    "feather",
    "lantern_oil",
];
const SLOTS: [&str; 2] = ["slot_a", "slot_b"];
/// A fixed base for generated times, so a seed always yields the same bytes.
const BASE_UNIX_S: i64 = 1_780_000_000;

/// Generates the stream of `spec`: every event picks an aggregate at random,
/// and every event body parses with its source's contract.
pub fn generate(spec: &StreamSpec) -> Stream {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let tag = spec.tag();
    let users = ((spec.aggregates as f64) * spec.presence_share.clamp(0.0, 1.0)).round() as usize;
    let mut aggregates: Vec<Aggregate> = (0..spec.aggregates)
        .map(|i| Aggregate {
            key: if i < users {
                AggregateRef::User(format!("usr_{tag}_{i}"))
            } else {
                let j = i - users;
                AggregateRef::Slot {
                    player_id: format!("player_{tag}_{}", j / SLOTS.len()),
                    save_slot: SLOTS[j % SLOTS.len()].to_owned(),
                }
            },
            events: Vec::new(),
        })
        .collect();
    // The generator follows each slot's in-order state so that no delta removes more than there is.
    let mut saves: Vec<SaveState> = vec![SaveState::empty(1); spec.aggregates];
    if spec.aggregates == 0 {
        return Stream { aggregates };
    }
    for n in 0..spec.events {
        let a = rng.gen_range(0..spec.aggregates);
        let sequence = aggregates[a].events.len() as i64 + 1;
        let event_id = format!("evt_{tag}_{n}");
        let at_s = BASE_UNIX_S + n as i64;
        let event = match &aggregates[a].key {
            AggregateRef::User(user) => {
                // Every other user's publisher sends idempotency keys: both kinds of publisher exist.
                let keyed = a % 2 == 0;
                presence_event(&mut rng, user, keyed, event_id, sequence, at_s)
            }
            AggregateRef::Slot {
                player_id,
                save_slot,
            } => {
                let event = save_event(
                    &mut rng,
                    (player_id, save_slot),
                    &saves[a],
                    event_id,
                    sequence,
                    at_s,
                );
                let parsed = SaveEvent::parse(&serde_json::to_vec(&event.body).unwrap_or_default())
                    .expect("generated save-game bodies follow the contract");
                saves[a]
                    .apply(&parsed, 0)
                    .expect("generated deltas never take a quantity below zero");
                event
            }
            AggregateRef::Json { .. } => unreachable!("json streams come from json_body"),
        };
        aggregates[a].events.push(event);
    }
    Stream { aggregates }
}

/// The map inside a `json!` object literal.
pub(super) fn object(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        _ => unreachable!("json! of an object literal"),
    }
}

fn presence_event(
    rng: &mut StdRng,
    user: &str,
    keyed: bool,
    event_id: String,
    sequence: i64,
    at_s: i64,
) -> StreamEvent {
    let presence = Presence::ALL
        .choose(rng)
        .copied()
        .unwrap_or(Presence::Online);
    let mut body = object(json!({
        "event_id": event_id,
        "user_id": user,
        "presence": presence.as_str(),
        "sequence_number": sequence,
        "timestamp": at_s,
    }));
    let idempotency_key = keyed.then(|| format!("{user}:presence:{sequence}"));
    if let Some(key) = &idempotency_key {
        body.insert("idempotency_key".into(), json!(key));
    }
    StreamEvent::built_in(event_id, idempotency_key, sequence, body)
}

fn items_json(items: &[(&str, i64)]) -> Value {
    items
        .iter()
        .map(|(id, qty)| json!({"item_id": id, "qty": qty}))
        .collect()
}

fn save_event(
    rng: &mut StdRng,
    (player_id, save_slot): (&str, &str),
    state: &SaveState,
    event_id: String,
    sequence: i64,
    at_s: i64,
) -> StreamEvent {
    let roll = rng.gen_range(0..100);
    let (event_type, data) = match roll {
        0..=49 => ("inventory.updated", inventory_delta(rng, state)),
        50..=69 => (
            "progress.saved",
            json!({"chapter": sequence / 10 + 1, "checkpoint": format!("cp_{sequence}"),
                   "play_time_s": sequence * 37 + rng.gen_range(0..30)}),
        ),
        70..=84 => (
            "achievement.unlocked",
            json!({"achievement_id": format!("ach_{}", rng.gen_range(0..12))}),
        ),
        85..=95 => {
            let count = rng.gen_range(0..=3);
            let items: Vec<(&str, i64)> = ITEMS
                .choose_multiple(rng, count)
                .map(|id| (*id, rng.gen_range(1..=9)))
                .collect();
            ("inventory.snapshot", json!({"items": items_json(&items)}))
        }
        _ => (
            "quest.started",
            json!({"quest_id": format!("q_{}", rng.gen_range(0..5))}),
        ),
    };
    let idempotency_key = format!("{player_id}:{save_slot}:{sequence}:{event_type}");
    let body = object(json!({
        "event_id": event_id,
        "event_type": event_type,
        "payload_version": 1,
        "occurred_at": clock::rfc3339(at_s * 1000),
        "player_id": player_id,
        "save_slot": save_slot,
        "sequence": sequence,
        "idempotency_key": idempotency_key,
        "data": data,
    }));
    StreamEvent::built_in(event_id, Some(idempotency_key), sequence, body)
}

/// An `inventory.updated` data object that is valid on `state` applied in order:
/// it removes at most what the inventory holds before the delta.
fn inventory_delta(rng: &mut StdRng, state: &SaveState) -> Value {
    let held: Vec<(&String, &i64)> = state.inventory.iter().collect();
    let removals = if held.is_empty() {
        0
    } else {
        rng.gen_range(0..=held.len().min(2))
    };
    let removed: Vec<(&str, i64)> = held
        .choose_multiple(rng, removals)
        .map(|(id, qty)| {
            // Now and then empty the item exactly, the edge where zero must disappear.
            let take = if rng.gen_bool(0.3) {
                **qty
            } else {
                rng.gen_range(1..=**qty)
            };
            (id.as_str(), take)
        })
        .collect();
    let additions = if removed.is_empty() {
        rng.gen_range(1..=2)
    } else {
        rng.gen_range(0..=2)
    };
    let added: Vec<(&str, i64)> = ITEMS
        .choose_multiple(rng, additions)
        .map(|id| (*id, rng.gen_range(1..=5)))
        .collect();
    let mut data = Map::new();
    data.insert("reason".into(), json!("simulated"));
    if !added.is_empty() {
        data.insert("added_items".into(), items_json(&added));
    }
    if !removed.is_empty() {
        data.insert("removed_items".into(), items_json(&removed));
    }
    Value::Object(data)
}

#[cfg(test)]
impl StreamSpec {
    /// The unit tests' stream: 2,000 events over 40 aggregates, half of them presence users.
    pub(super) fn sample(seed: u64) -> Self {
        Self {
            seed,
            events: 2_000,
            aggregates: 40,
            presence_share: 0.5,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashSet};

    use super::*;
    use inhook::domain::kind::{built_in, Delivery};

    #[test]
    fn the_stream_is_a_function_of_the_seed() {
        let spec = StreamSpec::sample;
        assert_eq!(generate(&spec(7)), generate(&spec(7)));
        assert_ne!(generate(&spec(7)), generate(&spec(8)));
        let shorter = StreamSpec {
            events: 1_000,
            ..spec(7)
        };
        assert_ne!(shorter.tag(), spec(7).tag(), "a prefix run gets fresh ids");
        assert_eq!(spec(7).tag(), spec(7).tag());
    }

    #[test]
    fn every_aggregate_is_contiguous_and_every_body_follows_its_contract() {
        let stream = generate(&StreamSpec::sample(1));
        assert_eq!(stream.event_count(), 2_000);
        assert_eq!(stream.aggregates_of(SourceKind::Presence), 20);
        let mut ids = HashSet::new();
        let mut keys = HashSet::new();
        let mut types = BTreeSet::new();
        for aggregate in &stream.aggregates {
            for (i, event) in aggregate.events.iter().enumerate() {
                assert_eq!(event.sequence, i as i64 + 1);
                assert!(ids.insert(event.event_id.clone()), "unique event_id");
                if let Some(key) = &event.idempotency_key {
                    assert!(keys.insert(key.clone()), "unique idempotency_key");
                }
                let body = serde_json::to_vec(&event.body).unwrap();
                let kind = built_in(aggregate.key.kind(), 0);
                let headers = axum::http::HeaderMap::new();
                let Ok(Delivery::Event(parsed)) = kind.parse(&body, &headers, None) else {
                    panic!("{} does not follow its contract", event.event_id);
                };
                assert_eq!(parsed.event_id.as_str(), event.event_id);
                assert_eq!(parsed.sequence, event.sequence);
                assert_eq!(
                    parsed.idempotency_key.map(|k| k.as_str().to_owned()),
                    event.idempotency_key
                );
                types.insert(parsed.event_type);
            }
        }
        for t in [
            "presence.changed",
            "progress.saved",
            "inventory.updated",
            "inventory.snapshot",
            "achievement.unlocked",
            "quest.started",
        ] {
            assert!(types.contains(t), "{t} generated");
        }
    }

    #[test]
    fn deltas_in_order_never_go_below_zero_and_do_remove_things() {
        let stream = generate(&StreamSpec::sample(3));
        let mut removals = 0;
        for aggregate in &stream.aggregates {
            if aggregate.key.kind() != SourceKind::SaveGame {
                continue;
            }
            let mut state = SaveState::empty(1);
            for event in &aggregate.events {
                removals += usize::from(event.body["data"].get("removed_items").is_some());
                let parsed = SaveEvent::parse(&serde_json::to_vec(&event.body).unwrap()).unwrap();
                state
                    .apply(&parsed, 0)
                    .expect("in order, every delta applies");
            }
        }
        assert!(removals > 50, "only {removals} removals");
    }

    #[test]
    fn the_presence_share_splits_the_aggregates_and_no_aggregates_means_no_events() {
        let spec = |presence_share| StreamSpec {
            presence_share,
            ..StreamSpec::sample(2)
        };
        let all_users = generate(&spec(1.0));
        assert_eq!(all_users.aggregates_of(SourceKind::Presence), 40);
        assert_eq!(all_users.aggregates_of(SourceKind::SaveGame), 0);
        let quarter = generate(&spec(0.25));
        assert_eq!(quarter.aggregates_of(SourceKind::Presence), 10);
        assert_eq!(quarter.aggregates_of(SourceKind::SaveGame), 30);
        assert_eq!(quarter.event_count(), 2_000);
        let empty = generate(&StreamSpec {
            aggregates: 0,
            ..StreamSpec::sample(2)
        });
        assert_eq!(empty.event_count(), 0);
        assert!(empty.aggregates.is_empty());
    }

    #[test]
    fn an_aggregate_names_its_contract_read_path_and_itself() {
        let user = AggregateRef::User("usr_1".into());
        assert_eq!(user.kind(), SourceKind::Presence);
        assert_eq!(user.read_path(), "/v1/presence/usr_1");
        assert_eq!(user.to_string(), "presence usr_1");
        let slot = AggregateRef::Slot {
            player_id: "player_1".into(),
            save_slot: "slot_a".into(),
        };
        assert_eq!(slot.kind(), SourceKind::SaveGame);
        assert_eq!(slot.read_path(), "/v1/saves/player_1/slot_a");
        assert_eq!(slot.to_string(), "save player_1/slot_a");
        let json = AggregateRef::Json {
            source: "stripe".into(),
            key: AggregateKey::parse_text("customer/a%2Fb").unwrap(),
        };
        assert_eq!(json.kind(), SourceKind::Json);
        assert_eq!(
            json.read_path(),
            "/v1/sources/stripe/aggregates/customer/a%252Fb"
        );
        assert_eq!(json.to_string(), "stripe customer/a%2Fb");
    }
}
