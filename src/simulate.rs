//! `inhook simulate` (SPEC §5): a chaos publisher. It generates a contiguous
//! event stream over presence users and save slots, works out the in-order
//! state with the library's own projection code, delivers the stream the way
//! real publishers do (duplicates, reordering, concurrent senders, resends,
//! retries until 2xx), then reads the state back through the API and reports
//! every aggregate that differs.
//!
//! The stream, the chaos plan and the expected state are pure functions of
//! the seed; only [`Publisher`] does I/O, so tests can drive it in-process
//! (the crash test points it at a restarted server through [`Endpoint`]).

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use crate::clock;
use crate::config::{secret_env_var, Config};
use crate::contract::{Presence, PresenceEvent, SaveEvent, SourceKind};
use crate::ordering::{decide_presence, Outcome};
use crate::projection::{PresenceState, SaveState};
use crate::signature::{self, Scheme, Secret};

/// Arguments of `inhook simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// Base URL of the inhook server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Events to generate, over all aggregates.
    #[arg(long, default_value_t = 10_000)]
    pub events: usize,
    /// Aggregates (presence users plus save slots) the events are spread over.
    #[arg(long, default_value_t = 200)]
    pub aggregates: usize,
    /// Share of the aggregates that are presence users; the rest are save slots.
    #[arg(long, default_value_t = 0.5)]
    pub presence_share: f64,
    /// Seed of the stream and the chaos plan; random (and printed) when absent.
    #[arg(long)]
    pub seed: Option<u64>,
    /// How far (in events of one aggregate) a delivery may move from its place in sequence order.
    #[arg(long, default_value_t = 8)]
    pub window: usize,
    /// Concurrent senders.
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Probability that an event is delivered a second time (same `event_id`, or a new one with the same `idempotency_key`).
    #[arg(long, default_value_t = 0.2)]
    pub duplicate_rate: f64,
    /// Probability that a request is sent again while the first is in flight, as after a client timeout.
    #[arg(long, default_value_t = 0.05)]
    pub resend_rate: f64,
    /// Deliveries started per second; 0 sends as fast as the senders can.
    #[arg(long, default_value_t = 0)]
    pub rate: u64,
    /// Secret of the presence source; defaults to INHOOK_PRESENCE_SECRET, then --config.
    #[arg(long)]
    pub presence_secret: Option<String>,
    /// Secret of the save-game source; defaults to INHOOK_SAVE_GAME_SECRET, then --config.
    #[arg(long)]
    pub save_secret: Option<String>,
    /// Name of the presence source to post to.
    #[arg(long, default_value = "presence")]
    pub presence_source: String,
    /// Name of the save-game source to post to.
    #[arg(long, default_value = "save-game")]
    pub save_source: String,
    /// Bearer token for the read API.
    #[arg(long, env = "INHOOK_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// How long to wait for the state read back to equal the expected state.
    #[arg(long, default_value_t = 60)]
    pub settle_timeout_s: u64,
    /// How long one delivery may keep being retried before it counts as failed.
    #[arg(long, default_value_t = 120)]
    pub give_up_after_s: u64,
    /// Longest `Retry-After` honoured; longer ones are cut to this.
    #[arg(long, default_value_t = 2)]
    pub max_retry_after_s: u64,
    /// Time after which a request with no answer is abandoned and retried.
    #[arg(long, default_value_t = 10_000)]
    pub request_timeout_ms: u64,
}

// ---------------------------------------------------------------------------
// The stream: pure, from the seed.

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
}

impl AggregateRef {
    /// The contract the aggregate's events follow.
    pub fn kind(&self) -> SourceKind {
        match self {
            AggregateRef::User(_) => SourceKind::Presence,
            AggregateRef::Slot { .. } => SourceKind::SaveGame,
        }
    }

    /// The read API path of the aggregate's state (ids are generated URL-safe).
    pub fn read_path(&self) -> String {
        match self {
            AggregateRef::User(user) => format!("/v1/presence/{user}"),
            AggregateRef::Slot {
                player_id,
                save_slot,
            } => format!("/v1/saves/{player_id}/{save_slot}"),
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
    pub fn tag(&self) -> String {
        let mut h = self.seed;
        for part in [
            self.events as u64,
            self.aggregates as u64,
            self.presence_share.to_bits(),
        ] {
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
    pub fn aggregates_of(&self, kind: SourceKind) -> usize {
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
        };
        aggregates[a].events.push(event);
    }
    Stream { aggregates }
}

fn object(value: Value) -> Map<String, Value> {
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
    StreamEvent {
        event_id,
        idempotency_key,
        sequence,
        body,
    }
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
    StreamEvent {
        event_id,
        idempotency_key: Some(idempotency_key),
        sequence,
        body,
    }
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

// ---------------------------------------------------------------------------
// The expected state: the library's own rules, applied once, in order.

/// The state an aggregate must reach: what applying its stream once, in order, gives.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// A presence user.
    Presence {
        /// The presence of the newest event.
        status: Presence,
        /// Its sequence.
        sequence: i64,
    },
    /// A save slot.
    Save {
        /// The highest contiguous sequence.
        last_sequence: i64,
        /// The latest progress, if any.
        progress: Option<Map<String, Value>>,
        /// Item id to quantity, zero quantities absent.
        inventory: BTreeMap<String, i64>,
        /// Unlocked achievements.
        achievements: BTreeSet<String>,
    },
}

/// The in-order state of one aggregate, or `None` when it has no events (the API then answers 404).
pub fn expected_state(aggregate: &Aggregate) -> Option<Expected> {
    let last = aggregate.events.last()?;
    let bodies = aggregate
        .events
        .iter()
        .map(|e| serde_json::to_vec(&e.body).unwrap_or_default());
    match aggregate.key.kind() {
        SourceKind::Presence => {
            let mut state: Option<PresenceState> = None;
            for body in bodies {
                let event = PresenceEvent::parse(&body).expect("generated presence bodies parse");
                if decide_presence(state.as_ref(), &event) == Outcome::Applied {
                    state = Some(PresenceState::from_event(&event, 0));
                }
            }
            state.map(|s| Expected::Presence {
                status: s.presence,
                sequence: s.sequence.get(),
            })
        }
        SourceKind::SaveGame => {
            let mut state = SaveState::empty(1);
            for body in bodies {
                let event = SaveEvent::parse(&body).expect("generated save-game bodies parse");
                // An event the rules refuse leaves the state as it was, as on the server.
                let _ = state.apply(&event, 0);
            }
            Some(Expected::Save {
                last_sequence: last.sequence,
                progress: state.progress,
                inventory: state.inventory,
                achievements: state.achievements,
            })
        }
    }
}

/// The expected state of every aggregate of the stream, in the stream's order.
pub fn expected_states(stream: &Stream) -> Vec<(AggregateRef, Option<Expected>)> {
    stream
        .aggregates
        .iter()
        .map(|a| (a.key.clone(), expected_state(a)))
        .collect()
}

impl Expected {
    /// Whether a read API answer body shows this state (only the fields the stream decides).
    pub fn matches(&self, got: &Value) -> bool {
        match self {
            Expected::Presence { status, sequence } => {
                got["status"] == status.as_str() && got["sequence"] == *sequence
            }
            Expected::Save {
                last_sequence,
                progress,
                inventory,
                achievements,
            } => {
                let progress_ok = match progress {
                    Some(p) => got["progress"].as_object() == Some(p),
                    None => got["progress"].is_null(),
                };
                let inventory_got: Option<BTreeMap<String, i64>> =
                    serde_json::from_value(got["inventory"].clone()).ok();
                let achievements_got: Option<BTreeSet<String>> =
                    serde_json::from_value(got["achievements"].clone()).ok();
                got["last_sequence"] == *last_sequence
                    && progress_ok
                    && inventory_got.as_ref() == Some(inventory)
                    && achievements_got.as_ref() == Some(achievements)
            }
        }
    }

    /// The state in the read API's shape, for mismatch reports.
    pub fn to_json(&self) -> Value {
        match self {
            Expected::Presence { status, sequence } => {
                json!({"status": status.as_str(), "sequence": sequence})
            }
            Expected::Save {
                last_sequence,
                progress,
                inventory,
                achievements,
            } => json!({"last_sequence": last_sequence, "progress": progress,
                        "inventory": inventory, "achievements": achievements}),
        }
    }
}

// ---------------------------------------------------------------------------
// The chaos plan: pure, from the seed.

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
            let original = Delivery {
                aggregate: a,
                kind,
                sequence: event.sequence,
                copy: EventCopy::Original,
                event_id: event.event_id.clone(),
                idempotency_key: event.idempotency_key.clone(),
                body: serde_json::to_vec(&event.body).unwrap_or_default(),
                resend: false,
            };
            keyed.push((i as f64 + rng.gen::<f64>() * window, original.clone()));
            if rng.gen_bool(chaos.duplicate_rate) {
                let duplicate = if event.idempotency_key.is_some() && rng.gen_bool(0.5) {
                    let event_id = format!("{}_dup", event.event_id);
                    let mut body = event.body.clone();
                    body.insert("event_id".into(), json!(event_id));
                    Delivery {
                        copy: EventCopy::NewEventId,
                        event_id,
                        body: serde_json::to_vec(&body).unwrap_or_default(),
                        ..original
                    }
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

// ---------------------------------------------------------------------------
// Retry policy: pure.

/// Whether a publisher tries again after this answer code.
pub fn is_retryable(code: u16) -> bool {
    matches!(code, 409 | 429) || (500..=599).contains(&code)
}

/// How long to wait before attempt `attempt + 1` when the server gave no `Retry-After`:
/// exponential from 50 ms, capped at 1 s, with full jitter.
fn backoff(attempt: u32, jitter: f64) -> Duration {
    let ceiling_ms = (50u64 << attempt.min(5)).min(1_000);
    Duration::from_millis((ceiling_ms as f64 * jitter.clamp(0.0, 1.0)) as u64 + 10)
}

/// A `Retry-After` in whole seconds (the form inhook sends), capped at `cap`.
fn retry_after(raw: Option<&str>, cap: Duration) -> Option<Duration> {
    let seconds: u64 = raw?.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(cap))
}

// ---------------------------------------------------------------------------
// The I/O layer.

/// The servers' base URLs, shared so a test can point running senders at a
/// restarted server. With several (nodes behind a load balancer), requests
/// take them in turn, so a retry after a dead node goes to the next one.
#[derive(Debug, Clone)]
pub struct Endpoint {
    urls: Arc<Mutex<Vec<String>>>,
    turn: Arc<std::sync::atomic::AtomicUsize>,
}

impl Endpoint {
    /// An endpoint at `url` (no trailing slash needed).
    pub fn new(url: &str) -> Self {
        Self::many(&[url])
    }

    /// An endpoint taking `urls` in turn.
    pub fn many(urls: &[&str]) -> Self {
        Self {
            urls: Arc::new(Mutex::new(
                urls.iter()
                    .map(|u| u.trim_end_matches('/').to_owned())
                    .collect(),
            )),
            turn: Arc::default(),
        }
    }

    /// The base URL for the next request.
    pub fn get(&self) -> String {
        let turn = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.urls
            .lock()
            .ok()
            .and_then(|urls| urls.get(turn % urls.len().max(1)).cloned())
            .unwrap_or_default()
    }

    /// Points every later request at `url` alone.
    pub fn set(&self, url: &str) {
        if let Ok(mut urls) = self.urls.lock() {
            *urls = vec![url.trim_end_matches('/').to_owned()];
        }
    }

    /// Stops sending to `url` (a node taken out of the balancer).
    pub fn remove(&self, url: &str) {
        if let Ok(mut urls) = self.urls.lock() {
            if urls.len() > 1 {
                urls.retain(|u| u != url.trim_end_matches('/'));
            }
        }
    }
}

/// How one source is addressed and signed.
#[derive(Debug, Clone)]
pub struct SourceSigner {
    /// The source name in `/webhooks/{name}`.
    pub name: String,
    /// Its signature scheme.
    pub scheme: Scheme,
    /// The secret to sign with.
    pub secret: Secret,
}

/// How deliveries are sent and retried.
#[derive(Debug, Clone)]
pub struct SendOptions {
    /// Concurrent senders.
    pub concurrency: usize,
    /// Deliveries started per second; 0 for no limit.
    pub rate: u64,
    /// Total time one delivery may be retried.
    pub give_up_after: Duration,
    /// Cap on an honoured `Retry-After`.
    pub max_retry_after: Duration,
    /// Per-request timeout.
    pub request_timeout: Duration,
}

impl Default for SendOptions {
    fn default() -> Self {
        Self {
            concurrency: 16,
            rate: 0,
            give_up_after: Duration::from_secs(120),
            max_retry_after: Duration::from_secs(2),
            request_timeout: Duration::from_secs(10),
        }
    }
}

/// The 2xx answer that ended a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Receipt {
    /// The status code.
    pub code: u16,
    /// The answer's `status` (`applied`, `accepted`, `duplicate`, …).
    pub status: String,
    /// For a duplicate, which key matched.
    pub key: Option<String>,
}

/// Counters of requests and answers.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    /// HTTP requests sent, retries and resends included.
    pub requests: u64,
    /// Requests sent because an earlier attempt failed.
    pub retries: u64,
    /// Answers by code; `connection_error` when there was none.
    pub codes: BTreeMap<String, u64>,
    /// 2xx answers by `status` (duplicates by key).
    pub statuses: BTreeMap<String, u64>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.requests += other.requests;
        self.retries += other.retries;
        for (k, v) in other.codes {
            *self.codes.entry(k).or_default() += v;
        }
        for (k, v) in other.statuses {
            *self.statuses.entry(k).or_default() += v;
        }
    }
}

/// What delivering a plan did.
#[derive(Debug, Clone, Default)]
pub struct DeliveryReport {
    /// Request and answer counters.
    pub tally: Tally,
    /// Per planned delivery, the 2xx answer that ended it, or `None` if it failed.
    pub receipts: Vec<Option<Receipt>>,
    /// Why deliveries failed, one line each.
    pub failures: Vec<String>,
    /// Time from the first request to the last answer.
    pub elapsed: Duration,
}

/// An aggregate whose state read back differs from the expected one.
#[derive(Debug, Clone)]
pub struct Mismatch {
    /// The aggregate.
    pub aggregate: AggregateRef,
    /// The expected state, in the API's shape (null: no state expected).
    pub expected: Value,
    /// What the API answered last.
    pub got: String,
}

enum Attempt {
    Answered {
        code: u16,
        retry_after: Option<String>,
        body: Value,
    },
    NoAnswer(String),
}

/// Sends planned deliveries and reads state back: the publisher's side of the wire.
#[derive(Debug, Clone)]
pub struct Publisher {
    client: reqwest::Client,
    endpoint: Endpoint,
    presence: SourceSigner,
    save: SourceSigner,
    // A `Secret`, so that printing the publisher never shows the token.
    admin_token: Option<Secret>,
    options: SendOptions,
    answered: Arc<Mutex<Vec<(usize, Receipt)>>>,
}

impl Publisher {
    /// A publisher for the two sources, with one keep-alive connection pool for all senders.
    pub fn new(
        endpoint: Endpoint,
        presence: SourceSigner,
        save: SourceSigner,
        admin_token: Option<String>,
        options: SendOptions,
    ) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(options.concurrency.max(1) * 2)
            .timeout(options.request_timeout)
            .connect_timeout(Duration::from_secs(2))
            .build()
            .context("building the HTTP client")?;
        Ok(Self {
            client,
            endpoint,
            presence,
            save,
            admin_token: admin_token.map(Secret::new),
            options,
            answered: Arc::default(),
        })
    }

    /// Every 2xx answer received so far by this publisher and its clones, with
    /// its delivery's index in the plan, in the order received: a crash test
    /// compares it with the log right after a SIGKILL.
    pub fn answered(&self) -> Vec<(usize, Receipt)> {
        self.answered.lock().map(|a| a.clone()).unwrap_or_default()
    }

    fn signer(&self, kind: SourceKind) -> &SourceSigner {
        match kind {
            SourceKind::Presence => &self.presence,
            SourceKind::SaveGame => &self.save,
        }
    }

    fn sign(&self, delivery: &Delivery) -> Vec<(&'static str, String)> {
        let signer = self.signer(delivery.kind);
        signature::sign(
            signer.scheme,
            &delivery.body,
            &signer.secret,
            clock::now_ms() / 1000,
        )
    }

    /// Sends every delivery of `plan` with the configured concurrency, each until 2xx or given up.
    pub async fn deliver(&self, plan: Arc<Plan>) -> DeliveryReport {
        let started = Instant::now();
        let next = Arc::new(AtomicUsize::new(0));
        let mut senders = tokio::task::JoinSet::new();
        for _ in 0..self.options.concurrency.max(1) {
            let (me, plan, next) = (self.clone(), plan.clone(), next.clone());
            senders.spawn(async move {
                let mut tally = Tally::default();
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(delivery) = plan.deliveries.get(i) else {
                        break;
                    };
                    if me.options.rate > 0 {
                        let due =
                            started + Duration::from_secs_f64(i as f64 / me.options.rate as f64);
                        tokio::time::sleep_until(due.into()).await;
                    }
                    done.push((i, me.deliver_one(i, delivery, &mut tally).await));
                }
                (tally, done)
            });
        }
        let mut report = DeliveryReport {
            receipts: vec![None; plan.deliveries.len()],
            ..DeliveryReport::default()
        };
        while let Some(joined) = senders.join_next().await {
            match joined {
                Ok((tally, done)) => {
                    report.tally.merge(tally);
                    for (i, result) in done {
                        match result {
                            Ok(receipt) => report.receipts[i] = Some(receipt),
                            Err(why) => report.failures.push(why),
                        }
                    }
                }
                Err(err) => report.failures.push(format!("a sender task failed: {err}")),
            }
        }
        report.elapsed = started.elapsed();
        report
    }

    /// One delivery; a resend fires the identical request again while the first is in flight.
    async fn deliver_one(
        &self,
        index: usize,
        delivery: &Delivery,
        tally: &mut Tally,
    ) -> Result<Receipt, String> {
        let headers = self.sign(delivery);
        if !delivery.resend {
            return self.until_done(index, delivery, headers, tally).await;
        }
        let mut second = Tally::default();
        let pause = Duration::from_millis(rand::thread_rng().gen_range(0..20));
        let (first, again) = tokio::join!(
            self.until_done(index, delivery, headers.clone(), tally),
            async {
                tokio::time::sleep(pause).await;
                self.until_done(index, delivery, headers.clone(), &mut second)
                    .await
            }
        );
        tally.merge(second);
        // Both copies must end in 2xx; the first copy's answer is the delivery's.
        match (first, again) {
            (Ok(receipt), Ok(_)) => Ok(receipt),
            (Err(why), _) | (_, Err(why)) => Err(why),
        }
    }

    /// Sends until a 2xx, a final 4xx, or the time budget is spent.
    async fn until_done(
        &self,
        index: usize,
        delivery: &Delivery,
        mut headers: Vec<(&'static str, String)>,
        tally: &mut Tally,
    ) -> Result<Receipt, String> {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            tally.requests += 1;
            let (wait, last) = match self.attempt(delivery, &headers).await {
                Attempt::Answered { code, body, .. } if (200..300).contains(&code) => {
                    *tally.codes.entry(code.to_string()).or_default() += 1;
                    let status = body["status"].as_str().unwrap_or("?").to_owned();
                    let key = body["key"].as_str().map(str::to_owned);
                    let label = match &key {
                        Some(key) => format!("{status}/{key}"),
                        None => status.clone(),
                    };
                    *tally.statuses.entry(label).or_default() += 1;
                    let receipt = Receipt { code, status, key };
                    if let Ok(mut answered) = self.answered.lock() {
                        answered.push((index, receipt.clone()));
                    }
                    return Ok(receipt);
                }
                Attempt::Answered {
                    code,
                    retry_after: after,
                    body,
                } => {
                    *tally.codes.entry(code.to_string()).or_default() += 1;
                    if !is_retryable(code) {
                        return Err(format!(
                            "{} (seq {}, {:?}) answered {code}: {body}",
                            delivery.event_id, delivery.sequence, delivery.copy
                        ));
                    }
                    let wait = retry_after(after.as_deref(), self.options.max_retry_after)
                        .unwrap_or_else(|| backoff(attempt, rand::thread_rng().gen()));
                    (wait, format!("{code} {body}"))
                }
                Attempt::NoAnswer(why) => {
                    *tally.codes.entry("connection_error".into()).or_default() += 1;
                    (backoff(attempt, rand::thread_rng().gen()), why)
                }
            };
            if started.elapsed() + wait > self.options.give_up_after {
                return Err(format!(
                    "{} (seq {}) gave up after {} attempts in {:.1}s; last: {last}",
                    delivery.event_id,
                    delivery.sequence,
                    attempt + 1,
                    started.elapsed().as_secs_f64()
                ));
            }
            tokio::time::sleep(wait).await;
            attempt += 1;
            tally.retries += 1;
            // A publisher's next attempt is signed anew, so a long outage never ages it out of tolerance.
            headers = self.sign(delivery);
        }
    }

    async fn attempt(&self, delivery: &Delivery, headers: &[(&'static str, String)]) -> Attempt {
        let url = format!(
            "{}/webhooks/{}",
            self.endpoint.get(),
            self.signer(delivery.kind).name
        );
        let mut request = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .body(delivery.body.clone());
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => return Attempt::NoAnswer(error_chain(&err)),
        };
        let code = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // An answer cut off mid-body is no answer: the publisher cannot know what happened.
        match response.text().await {
            Ok(text) => Attempt::Answered {
                code,
                retry_after,
                body: serde_json::from_str(&text).unwrap_or(Value::String(text)),
            },
            Err(err) => Attempt::NoAnswer(error_chain(&err)),
        }
    }

    /// Reads every aggregate until all equal their expected state or `timeout`
    /// passes; returns those that still differ. Fails at once if the API refuses the token.
    pub async fn converge(
        &self,
        expected: Arc<Vec<(AggregateRef, Option<Expected>)>>,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Mismatch>> {
        let deadline = Instant::now() + timeout;
        let mut pending: Vec<usize> = (0..expected.len()).collect();
        let limit = Arc::new(tokio::sync::Semaphore::new(self.options.concurrency.max(1)));
        loop {
            let mut reads = tokio::task::JoinSet::new();
            for &i in &pending {
                let (me, expected, limit) = (self.clone(), expected.clone(), limit.clone());
                reads.spawn(async move {
                    let _permit = limit.acquire_owned().await;
                    (i, me.read(&expected[i].0).await)
                });
            }
            let mut still = Vec::new();
            while let Some(joined) = reads.join_next().await {
                let (i, seen) = joined.context("a read task failed")?;
                let want = &expected[i].1;
                let ok = match (&seen, want) {
                    (Read::Found(body), Some(want)) => want.matches(body),
                    (Read::NotFound, None) => true,
                    (Read::Refused(code), _) => bail!(
                        "the read API answered {code}: pass --admin-token or set INHOOK_ADMIN_TOKEN"
                    ),
                    _ => false,
                };
                if !ok {
                    still.push((i, seen));
                }
            }
            if still.is_empty() {
                return Ok(Vec::new());
            }
            if Instant::now() >= deadline {
                let mut mismatches: Vec<Mismatch> = still
                    .into_iter()
                    .map(|(i, seen)| Mismatch {
                        aggregate: expected[i].0.clone(),
                        expected: expected[i]
                            .1
                            .as_ref()
                            .map_or(Value::Null, Expected::to_json),
                        got: seen.to_string(),
                    })
                    .collect();
                mismatches.sort_by_key(|m| m.aggregate.to_string());
                return Ok(mismatches);
            }
            pending = still.into_iter().map(|(i, _)| i).collect();
            pending.sort_unstable();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn read(&self, aggregate: &AggregateRef) -> Read {
        let url = format!("{}{}", self.endpoint.get(), aggregate.read_path());
        let mut request = self.client.get(url);
        if let Some(token) = &self.admin_token {
            request = request.bearer_auth(String::from_utf8_lossy(token.expose()));
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => return Read::Failed(error_chain(&err)),
        };
        let code = response.status().as_u16();
        let text = response.text().await.unwrap_or_default();
        match code {
            200 => serde_json::from_str(&text)
                .map(Read::Found)
                .unwrap_or_else(|_| {
                    Read::Failed(format!("200 with a body that is not JSON: {text}"))
                }),
            404 => Read::NotFound,
            401 | 403 => Read::Refused(code),
            _ => Read::Failed(format!("{code} {text}")),
        }
    }
}

enum Read {
    Found(Value),
    NotFound,
    Refused(u16),
    Failed(String),
}

impl fmt::Display for Read {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Read::Found(body) => write!(f, "{body}"),
            Read::NotFound => f.write_str("404"),
            Read::Refused(code) => write!(f, "{code}"),
            Read::Failed(why) => f.write_str(why),
        }
    }
}

fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

// ---------------------------------------------------------------------------
// The command.

/// Runs `inhook simulate`: generate, deliver with chaos, check, report.
pub async fn run(config_path: Option<PathBuf>, args: SimulateArgs) -> anyhow::Result<()> {
    check_args(&args)?;
    // The config file, when given, supplies secrets, schemes and the admin token the flags leave out.
    let config = match &config_path {
        Some(path) => Some(Config::load(Some(path)).context("loading --config")?),
        None => None,
    };
    let signer = |name: &str, flag: &Option<String>, seed_scheme: Scheme| {
        let from_config = config.as_ref().and_then(|c| c.source(name));
        let var = secret_env_var(name);
        let secret = match flag.clone().or_else(|| std::env::var(&var).ok()) {
            Some(raw) => Secret::new(raw.split(',').next().unwrap_or_default().trim()),
            None => match from_config.and_then(|s| s.secrets.first().cloned()) {
                Some(secret) => secret,
                None => bail!("no secret for source {name}: pass its --*-secret flag or set {var}"),
            },
        };
        Ok(SourceSigner {
            name: name.to_owned(),
            scheme: from_config.map_or(seed_scheme, |s| s.scheme),
            secret,
        })
    };
    let presence = signer(
        &args.presence_source,
        &args.presence_secret,
        Scheme::HmacHex,
    )?;
    let save = signer(
        &args.save_source,
        &args.save_secret,
        Scheme::HmacTimestamped,
    )?;
    let admin_token = args.admin_token.clone().or_else(|| {
        config
            .as_ref()
            .and_then(|c| c.admin_token.as_ref())
            .map(|t| String::from_utf8_lossy(t.expose()).into_owned())
    });
    let seed = args.seed.unwrap_or_else(rand::random);
    let started = Instant::now();
    let stream = generate(&StreamSpec {
        seed,
        events: args.events,
        aggregates: args.aggregates,
        presence_share: args.presence_share,
    });
    let plan = plan(
        &stream,
        &ChaosSpec {
            seed,
            window: args.window,
            duplicate_rate: args.duplicate_rate,
            resend_rate: args.resend_rate,
        },
    );
    let expected = Arc::new(expected_states(&stream));
    let publisher = Publisher::new(
        Endpoint::new(&args.url),
        presence,
        save,
        admin_token,
        SendOptions {
            concurrency: args.concurrency,
            rate: args.rate,
            give_up_after: Duration::from_secs(args.give_up_after_s),
            max_retry_after: Duration::from_secs(args.max_retry_after_s),
            request_timeout: Duration::from_millis(args.request_timeout_ms),
        },
    )?;
    println!(
        "inhook simulate: seed {seed}, {} events over {} aggregates ({} presence users, {} save slots) to {}",
        stream.event_count(),
        stream.aggregates.len(),
        stream.aggregates_of(SourceKind::Presence),
        stream.aggregates_of(SourceKind::SaveGame),
        args.url
    );
    let plan = Arc::new(plan);
    let delivery = publisher.deliver(plan.clone()).await;
    // A failed delivery makes the expected state unreachable: waiting for it would only burn the timeout.
    let checked = if delivery.failures.is_empty() {
        publisher
            .converge(expected, Duration::from_secs(args.settle_timeout_s))
            .await
    } else {
        Err(anyhow::anyhow!("deliveries failed"))
    };
    let mismatches = match &checked {
        Ok(m) => Ok(m.as_slice()),
        Err(err) => Err(format!("{err:#}")),
    };
    print_report(&plan, &delivery, mismatches, started.elapsed());
    if !delivery.failures.is_empty() {
        bail!("{} deliveries failed", delivery.failures.len());
    }
    match checked? {
        m if !m.is_empty() => bail!(
            "{} aggregates differ from the in-order state after {}s",
            m.len(),
            args.settle_timeout_s
        ),
        _ => Ok(()),
    }
}

fn check_args(args: &SimulateArgs) -> anyhow::Result<()> {
    for (name, p) in [
        ("--duplicate-rate", args.duplicate_rate),
        ("--resend-rate", args.resend_rate),
        ("--presence-share", args.presence_share),
    ] {
        if !(0.0..=1.0).contains(&p) {
            bail!("{name} must be between 0 and 1, not {p}");
        }
    }
    if args.window == 0 || args.concurrency == 0 {
        bail!("--window and --concurrency must be at least 1");
    }
    if args.events > 0 && args.aggregates == 0 {
        bail!("--aggregates must be at least 1");
    }
    Ok(())
}

fn histogram(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn print_report(
    plan: &Plan,
    delivery: &DeliveryReport,
    mismatches: Result<&[Mismatch], String>,
    elapsed: Duration,
) {
    let same = plan.count(EventCopy::SameEventId);
    let new = plan.count(EventCopy::NewEventId);
    println!(
        "  deliveries:  {} planned, {} requests sent ({} resends in flight, {} retries)",
        plan.deliveries.len(),
        delivery.tally.requests,
        plan.resends(),
        delivery.tally.retries
    );
    println!(
        "  duplicates:  {} ({same} same event_id, {new} new event_id with the same idempotency_key)",
        same + new
    );
    println!(
        "  reordered:   {} events started after a higher sequence of their aggregate",
        plan.reordered
    );
    println!("  answers:     {}", histogram(&delivery.tally.codes));
    println!("  statuses:    {}", histogram(&delivery.tally.statuses));
    println!("  failures:    {}", delivery.failures.len());
    for why in delivery.failures.iter().take(5) {
        println!("    {why}");
    }
    match mismatches {
        Ok(m) => {
            println!("mismatches: {}", m.len());
            for m in m.iter().take(5) {
                println!(
                    "    {}: expected {}, got {}",
                    m.aggregate, m.expected, m.got
                );
            }
        }
        Err(why) => println!("mismatches: not checked ({why})"),
    }
    println!(
        "  elapsed:     {:.1}s (delivery {:.1}s)",
        elapsed.as_secs_f64(),
        delivery.elapsed.as_secs_f64()
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::Event;

    fn spec(seed: u64) -> StreamSpec {
        StreamSpec {
            seed,
            events: 2_000,
            aggregates: 40,
            presence_share: 0.5,
        }
    }

    fn chaos(seed: u64) -> ChaosSpec {
        ChaosSpec {
            seed,
            window: 8,
            duplicate_rate: 0.2,
            resend_rate: 0.05,
        }
    }

    #[test]
    fn the_stream_is_a_function_of_the_seed() {
        assert_eq!(generate(&spec(7)), generate(&spec(7)));
        assert_ne!(generate(&spec(7)), generate(&spec(8)));
        let (a, b) = (generate(&spec(7)), generate(&spec(7)));
        assert_eq!(
            plan(&a, &chaos(7)).deliveries,
            plan(&b, &chaos(7)).deliveries
        );
        let shorter = StreamSpec {
            events: 1_000,
            ..spec(7)
        };
        assert_ne!(shorter.tag(), spec(7).tag(), "a prefix run gets fresh ids");
        assert_eq!(spec(7).tag(), spec(7).tag());
    }

    #[test]
    fn every_aggregate_is_contiguous_and_every_body_follows_its_contract() {
        let stream = generate(&spec(1));
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
                let parsed = Event::parse(aggregate.key.kind(), &body).unwrap();
                assert_eq!(parsed.event_id().as_str(), event.event_id);
                assert_eq!(parsed.sequence().get(), event.sequence);
                assert_eq!(
                    parsed.idempotency_key().map(|k| k.as_str().to_owned()),
                    event.idempotency_key
                );
                types.insert(parsed.event_type().to_owned());
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
        let stream = generate(&spec(3));
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
    fn expected_state_is_the_in_order_result() {
        let user = Aggregate {
            key: AggregateRef::User("u".into()),
            events: [("ONLINE", 1), ("BUSY", 2), ("OFFLINE", 3)]
                .iter()
                .map(|(p, s)| StreamEvent {
                    event_id: format!("e{s}"),
                    idempotency_key: None,
                    sequence: *s,
                    body: object(
                        json!({"event_id": format!("e{s}"), "user_id": "u", "presence": p, "sequence_number": s}),
                    ),
                })
                .collect(),
        };
        assert_eq!(
            expected_state(&user),
            Some(Expected::Presence {
                status: Presence::Offline,
                sequence: 3
            })
        );
        let save = |seq: i64, event_type: &str, data: Value| StreamEvent {
            event_id: format!("s{seq}"),
            idempotency_key: Some(format!("k{seq}")),
            sequence: seq,
            body: object(
                json!({"event_id": format!("s{seq}"), "event_type": event_type,
                "player_id": "p", "save_slot": "a", "sequence": seq,
                "idempotency_key": format!("k{seq}"), "data": data}),
            ),
        };
        let slot = Aggregate {
            key: AggregateRef::Slot {
                player_id: "p".into(),
                save_slot: "a".into(),
            },
            events: vec![
                save(
                    1,
                    "inventory.updated",
                    json!({"added_items": [{"item_id": "gem", "qty": 3}]}),
                ),
                save(
                    2,
                    "inventory.snapshot",
                    json!({"items": [{"item_id": "gem", "qty": 1}]}),
                ),
                save(
                    3,
                    "inventory.updated",
                    json!({"removed_items": [{"item_id": "gem", "qty": 1}],
                                                    "added_items": [{"item_id": "key", "qty": 2}]}),
                ),
                save(
                    4,
                    "achievement.unlocked",
                    json!({"achievement_id": "first"}),
                ),
                save(5, "progress.saved", json!({"chapter": 2})),
                save(6, "quest.started", json!({})),
            ],
        };
        let want = Expected::Save {
            last_sequence: 6,
            progress: Some(object(json!({"chapter": 2}))),
            inventory: BTreeMap::from([("key".to_owned(), 2)]),
            achievements: BTreeSet::from(["first".to_owned()]),
        };
        assert_eq!(expected_state(&slot), Some(want.clone()));
        let api = json!({"player_id": "p", "save_slot": "a", "last_sequence": 6,
            "progress": {"chapter": 2}, "inventory": {"key": 2}, "achievements": ["first"],
            "updated_at": "2026-01-01T00:00:00Z"});
        assert!(want.matches(&api));
        let mut behind = api.clone();
        behind["last_sequence"] = json!(5);
        assert!(!want.matches(&behind));
        let mut extra = api;
        extra["inventory"]["gem"] = json!(1);
        assert!(!want.matches(&extra));
        assert_eq!(
            expected_state(&Aggregate {
                key: AggregateRef::User("none".into()),
                events: vec![]
            }),
            None
        );
    }

    #[test]
    fn the_plan_delivers_everything_within_the_window_with_honest_duplicates() {
        let stream = generate(&spec(5));
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

    #[test]
    fn retries_follow_the_publisher_policy() {
        for code in [409, 429, 500, 503] {
            assert!(is_retryable(code), "{code}");
        }
        for code in [400, 401, 404, 413, 415] {
            assert!(!is_retryable(code), "{code}");
        }
        let cap = Duration::from_secs(2);
        assert_eq!(retry_after(Some("1"), cap), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(Some("30"), cap), Some(cap));
        assert_eq!(
            retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT"), cap),
            None
        );
        assert!(backoff(20, 1.0) <= Duration::from_millis(1_010));
        assert!(backoff(0, 1.0) < backoff(3, 1.0));
    }
}
