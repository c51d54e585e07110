//! The bodies of a `json` source (docs/contract.md, json sources), a pure function of the seed:
//! every generated value is written at the source's configured location (a body
//! pointer, its nested objects created, or a `header:` location's request
//! header), with the source's ordering: sequences that rise with gaps (and
//! ties, for timestamps) for latest-wins, contiguous integers for in-order,
//! one event per aggregate for unordered; types inside and outside
//! `event_types`.

use anyhow::{bail, Context};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};

use super::place::{place_of, Place};
use super::stream::{Aggregate, AggregateRef, Stream, StreamEvent, StreamSpec};
use inhook::config::SourceConfig;
use inhook::domain::clock;
use inhook::domain::kind::json::contract::{
    AggregateLocations, BodyFormat, Glob, JsonContract, JsonOrdering, JsonSourceSpec,
};
use inhook::domain::{AggregateKey, Ident};

/// How the sequences of a latest-wins source are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SequenceFormat {
    /// Integers.
    Integer,
    /// RFC 3339 timestamps, one-second steps, ties included.
    Timestamp,
}

impl SequenceFormat {
    /// The format as the flag writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            SequenceFormat::Integer => "integer",
            SequenceFormat::Timestamp => "timestamp",
        }
    }
}

/// A `json` source as the simulator publishes to it: its compiled contract and where each field goes.
#[derive(Debug, Clone)]
pub struct JsonTarget {
    /// The source name in `/webhooks/{name}`.
    pub source: String,
    /// The contract the expected state is read with (the library's own).
    pub contract: JsonContract,
    event_id: Place,
    idempotency_key: Option<Place>,
    aggregate: Vec<Place>,
    sequence: Option<Place>,
    event_type: Option<Place>,
    event_types: Option<Vec<String>>,
    state: Place,
    first_sequence: i64,
    format: SequenceFormat,
    unsupported_share: f64,
}

impl JsonTarget {
    /// The target of `source` as configured, or why the simulator cannot publish to it.
    pub fn new(
        source: &SourceConfig,
        format: SequenceFormat,
        unsupported_share: f64,
    ) -> anyhow::Result<Self> {
        let Some(spec) = inhook::domain::kind::json::JsonKind::spec_of(source.kind.as_ref()) else {
            bail!(
                "source {} is not kind = \"json\": --source takes a json source (the built-in \
                 kinds are simulated without it)",
                source.name
            );
        };
        if spec.body_format.is_some_and(|f| f != BodyFormat::Json) || spec.unwrap.is_some() {
            bail!(
                "source {} reads form bodies or unwraps a field (body_format, unwrap): the \
                 simulator publishes plain JSON bodies only",
                source.name
            );
        }
        if source.batch.is_some()
            || spec.event_id.as_deref() == Some(inhook::domain::kind::json::contract::BODY_EVENT_ID)
        {
            bail!(
                "source {} takes batches or keys events by their body (batch, event_id = \"body\"): \
                 the simulator publishes one event per delivery, each with an id of its own",
                source.name
            );
        }
        Self::of_spec(
            &source.name,
            spec,
            source.first_sequence,
            format,
            unsupported_share,
        )
        .with_context(|| format!("source {}", source.name))
    }

    fn of_spec(
        name: &str,
        spec: &JsonSourceSpec,
        first_sequence: i64,
        format: SequenceFormat,
        unsupported_share: f64,
    ) -> anyhow::Result<Self> {
        let contract = JsonContract::compile(spec)?;
        let place = |raw: &Option<String>| raw.as_deref().map(place_of).transpose();
        let aggregate = match &spec.aggregate {
            None => Vec::new(),
            Some(AggregateLocations::One(one)) => vec![place_of(one)?],
            Some(AggregateLocations::Many(many)) => many
                .iter()
                .map(|raw| place_of(raw))
                .collect::<anyhow::Result<_>>()?,
        };
        if format == SequenceFormat::Timestamp && contract.ordering() == JsonOrdering::InOrder {
            bail!("--sequence-format timestamp: an in-order source needs integer sequences");
        }
        Ok(Self {
            source: name.to_owned(),
            event_id: place(&spec.event_id)?.unwrap_or(Place::DeliveryId),
            idempotency_key: place(&spec.idempotency_key)?,
            aggregate,
            sequence: place(&spec.sequence)?,
            event_type: place(&spec.event_type)?,
            event_types: spec.event_types.clone(),
            state: place(&spec.state)?.unwrap_or(Place::Body(Vec::new())),
            first_sequence,
            format,
            unsupported_share,
            contract,
        })
    }

    /// The source's ordering.
    pub fn ordering(&self) -> JsonOrdering {
        self.contract.ordering()
    }

    /// A type outside `event_types`, if the source has such a list and some type falls
    /// outside it: the first of a few unlike shapes that no pattern matches.
    fn unsupported_type(&self) -> Option<String> {
        let globs: Vec<Glob> = self
            .event_types
            .as_ref()?
            .iter()
            .map(|p| Glob::new(p))
            .collect();
        ["inhook.simulated.unsupported", "zz", "-"]
            .into_iter()
            .find(|t| !globs.iter().any(|g| g.matches(t)))
            .map(str::to_owned)
    }

    /// A type the source accepts: a pattern of `event_types` with its stars filled, or any type.
    fn supported_type(&self, rng: &mut StdRng) -> String {
        let word = ["created", "updated", "deleted"]
            .choose(rng)
            .copied()
            .unwrap_or("updated");
        match &self.event_types {
            Some(patterns) => patterns
                .choose(rng)
                .map(|p| p.replace('*', word))
                .unwrap_or_default(),
            None => format!("sim.{word}"),
        }
    }
}

/// One generated event's values, before they are written at their places.
struct Fields<'a> {
    event_id: String,
    idempotency_key: Option<String>,
    parts: &'a [String],
    sequence: i64,
    event_type: Option<String>,
    state: Value,
    unsupported: bool,
}

impl JsonTarget {
    /// Writes each value at its place: the state first, so that the locations
    /// inside it (an aggregate's `id` in Stripe's `data.object`) are written into it.
    fn event(&self, fields: Fields<'_>) -> StreamEvent {
        let mut body = Map::new();
        let mut headers = Vec::new();
        self.state.write(&mut body, &mut headers, fields.state);
        if let (Some(at), Some(t)) = (&self.event_type, &fields.event_type) {
            at.write(&mut body, &mut headers, json!(t));
        }
        if let Some(at) = &self.sequence {
            let value = sequence_value(self.format, fields.sequence);
            at.write(&mut body, &mut headers, value);
        }
        for (at, part) in self.aggregate.iter().zip(fields.parts) {
            at.write(&mut body, &mut headers, json!(part));
        }
        if let (Some(at), Some(key)) = (&self.idempotency_key, &fields.idempotency_key) {
            at.write(&mut body, &mut headers, json!(key));
        }
        self.event_id
            .write(&mut body, &mut headers, json!(fields.event_id));
        StreamEvent {
            event_id: fields.event_id,
            idempotency_key: fields.idempotency_key,
            sequence: ordered_value(self.format, fields.sequence),
            body,
            headers,
            id_at: self.event_id.clone(),
            unsupported: fields.unsupported,
        }
    }

    /// Moves the latest event of an aggregate whose highest sequence `top` is tied
    /// one step up: a tie there would make the state depend on the order of receipt.
    fn untie_highest(&self, aggregate: &mut Aggregate, top: i64) {
        let top_value = ordered_value(self.format, top);
        let tied = aggregate
            .events
            .iter()
            .filter(|e| !e.unsupported && e.sequence == top_value)
            .count();
        // Generated in order, the latest supported event is one of the tied.
        let latest = aggregate.events.iter_mut().rev().find(|e| !e.unsupported);
        let (true, Some(latest)) = (tied > 1, latest) else {
            return;
        };
        if let Some(at) = &self.sequence {
            let value = sequence_value(self.format, top + 1);
            at.write(&mut latest.body, &mut latest.headers, value);
        }
        latest.sequence = ordered_value(self.format, top + 1);
    }
}

/// Generates the stream of `spec` for `target`. Unordered sources get one event
/// per aggregate (the state of several would depend on the order of receipt);
/// latest-wins sequences rise with gaps, ties only below an aggregate's highest
/// (so its state is that one event's); in-order ones are contiguous from
/// `first_sequence`. An event of a type outside `event_types` takes no sequence
/// of its aggregate: it carries one above every other, so applying it would show.
pub fn generate_json(spec: &StreamSpec, target: &JsonTarget) -> Stream {
    let mut rng = StdRng::seed_from_u64(spec.seed);
    // Two runs share ids only when they generate the very same bodies.
    let tag = spec.tag_with(&[target.format as u64, target.unsupported_share.to_bits()]);
    let unordered = target.ordering() == JsonOrdering::Unordered;
    let count = if unordered {
        spec.events
    } else {
        spec.aggregates
    };
    let unsupported_type = target.unsupported_type();
    let mut aggregates: Vec<Aggregate> = Vec::with_capacity(count);
    let mut parts_of: Vec<Vec<String>> = Vec::with_capacity(count);
    for i in 0..count {
        let parts: Vec<String> = (0..target.aggregate.len())
            .map(|j| {
                if j + 1 == target.aggregate.len() {
                    format!("agg_{tag}_{i}")
                } else {
                    // Leading parts shared by several aggregates, as `customer` in `customer/cus_1`.
                    format!("part{j}_{}", i % 3)
                }
            })
            .collect();
        let key = (!parts.is_empty()).then(|| key_of(&parts));
        aggregates.push(Aggregate {
            key: AggregateRef::Json {
                source: target.source.clone(),
                key: key.unwrap_or_else(|| key_of(&[format!("evt_{tag}_{i}")])),
            },
            events: Vec::new(),
        });
        parts_of.push(parts);
    }
    if count == 0 {
        return Stream { aggregates };
    }
    // Per aggregate: the sequence of its latest supported event.
    let mut last: Vec<Option<i64>> = vec![None; count];
    for n in 0..spec.events {
        let a = if unordered {
            n
        } else {
            rng.gen_range(0..count)
        };
        let unsupported = unsupported_type.is_some() && rng.gen_bool(target.unsupported_share);
        let event_id = format!("evt_{tag}_{n}");
        let step: i64 = match target.format {
            // A tie now and then: the same second as the event before.
            SequenceFormat::Timestamp => rng.gen_range(0..3),
            SequenceFormat::Integer => rng.gen_range(1..4),
        };
        let next = match (target.ordering(), last[a]) {
            (JsonOrdering::InOrder, None) => target.first_sequence,
            (JsonOrdering::InOrder, Some(s)) => s + 1,
            (_, None) => 1,
            (_, Some(s)) => s + step,
        };
        let sequence = if unsupported {
            next + 1_000
        } else {
            last[a] = Some(next);
            next
        };
        let event_type = if unsupported {
            unsupported_type.clone()
        } else {
            target
                .event_type
                .is_some()
                .then(|| target.supported_type(&mut rng))
        };
        let state = json!({"note": format!("state of {event_id}"), "n": n,
                           "level": rng.gen_range(0..100)});
        // A new-id redelivery of an event that is its own aggregate would be another
        // aggregate: such sources get no idempotency keys.
        let idempotency_key = (target.idempotency_key.is_some() && !target.aggregate.is_empty())
            .then(|| format!("idem_{tag}_{n}"));
        let event = target.event(Fields {
            event_id,
            idempotency_key,
            parts: &parts_of[a],
            sequence,
            event_type,
            state,
            unsupported,
        });
        aggregates[a].events.push(event);
    }
    for (aggregate, top) in aggregates.iter_mut().zip(&last) {
        if let Some(top) = *top {
            target.untie_highest(aggregate, top);
        }
    }
    Stream { aggregates }
}

/// A one-part or many-part key of generated (always valid) parts.
fn key_of(parts: &[String]) -> AggregateKey {
    AggregateKey::of_parts(
        parts
            .iter()
            .map(|p| Ident::parse_located(p).expect("generated parts are valid ids"))
            .collect(),
    )
}

/// Generated timestamps start here, in seconds.
const BASE_UNIX_S: i64 = 1_780_000_000;

/// The value written at the sequence's location.
fn sequence_value(format: SequenceFormat, sequence: i64) -> Value {
    match format {
        SequenceFormat::Integer => json!(sequence),
        SequenceFormat::Timestamp => json!(clock::rfc3339((BASE_UNIX_S + sequence) * 1000)),
    }
}

/// The integer the server orders by (microseconds since the epoch for a timestamp).
fn ordered_value(format: SequenceFormat, sequence: i64) -> i64 {
    match format {
        SequenceFormat::Integer => sequence,
        SequenceFormat::Timestamp => (BASE_UNIX_S + sequence) * 1_000_000,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::{BTreeMap, HashSet};

    use axum::http::{HeaderMap, HeaderName, HeaderValue};

    use super::*;
    use inhook::domain::kind::json::contract::JsonParsed;

    /// A target compiled from a source table's json keys, as the config file writes them.
    pub(in crate::simulate) fn target(keys: &str, format: SequenceFormat) -> JsonTarget {
        let spec: JsonSourceSpec = toml::from_str(keys).expect("json keys");
        JsonTarget::of_spec("src", &spec, 1, format, 0.2).expect("a target")
    }

    pub(in crate::simulate) const LATEST: &str = r#"
        idempotency_key = "header:Idempotency-Key"
        aggregate = ["/data/object/object", "/data/object/id"]
        sequence = "/created"
        event_type = "/type"
        event_types = ["customer.*", "invoice.paid"]
        ordering = "latest-wins"
        state = "/data/object"
    "#;

    fn spec(events: usize) -> StreamSpec {
        StreamSpec {
            seed: 4,
            events,
            aggregates: 12,
            presence_share: 0.0,
        }
    }

    /// What the source's own contract reads from a generated event.
    fn parse(target: &JsonTarget, event: &StreamEvent) -> JsonParsed {
        let mut headers = HeaderMap::new();
        for (name, value) in &event.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        let body = serde_json::to_vec(&event.body).unwrap();
        target
            .contract
            .parse_bytes(&body, &headers, event.delivery_id())
            .expect("a generated body follows its source's contract")
    }

    #[test]
    fn a_value_is_written_at_its_pointer_creating_objects_or_in_its_header() {
        let mut body = Map::new();
        let mut headers = Vec::new();
        Place::Body(vec!["a".into(), "b".into()]).write(&mut body, &mut headers, json!(1));
        Place::Body(vec!["a".into(), "c".into()]).write(&mut body, &mut headers, json!("x"));
        // A scalar in the way becomes an object: the later location wins.
        Place::Body(vec!["a".into(), "b".into(), "d".into()]).write(
            &mut body,
            &mut headers,
            json!(true),
        );
        Place::Body(Vec::new()).write(&mut body, &mut headers, json!({"top": 2}));
        assert_eq!(
            Value::Object(body.clone()),
            json!({"a": {"b": {"d": true}, "c": "x"}, "top": 2})
        );
        Place::Header("X-Seq".into()).write(&mut body, &mut headers, json!(7));
        Place::Header("x-seq".into()).write(&mut body, &mut headers, json!("8"));
        Place::DeliveryId.write(&mut body, &mut headers, json!("msg_1"));
        assert_eq!(headers, [("x-seq".to_owned(), "8".to_owned())]);
    }

    #[test]
    fn latest_wins_bodies_read_back_as_generated_with_ties_never_at_the_top() {
        let target = target(LATEST, SequenceFormat::Timestamp);
        let stream = generate_json(&spec(600), &target);
        assert_eq!(stream.event_count(), 600);
        assert_eq!(stream.aggregates.len(), 12);
        let (mut ties, mut unsupported) = (0, 0);
        for aggregate in &stream.aggregates {
            let AggregateRef::Json { source, key } = &aggregate.key else {
                panic!("a json aggregate");
            };
            assert_eq!(source, "src");
            let mut seen = BTreeMap::new();
            for event in &aggregate.events {
                assert_eq!(event.delivery_id(), Some(event.event_id.as_str()));
                match parse(&target, event) {
                    JsonParsed::Event(parsed) => {
                        assert!(!event.unsupported);
                        assert_eq!(parsed.event_id.as_str(), event.event_id);
                        assert_eq!(
                            inhook::domain::AggregateKey::of_parts(parsed.aggregate),
                            *key
                        );
                        let sequence = parsed.sequence.expect("located").value.get();
                        assert_eq!(sequence, event.sequence);
                        assert_eq!(
                            parsed.idempotency_key.map(|k| k.as_str().to_owned()),
                            event.idempotency_key
                        );
                        let state = parsed.state.expect("a state");
                        assert_eq!(state["id"], json!(key.parts()[1].as_str()));
                        assert!(event.body["created"].is_string(), "an RFC 3339 sequence");
                        *seen.entry(sequence).or_insert(0) += 1;
                    }
                    JsonParsed::Ignored { event_type, .. } => {
                        assert!(event.unsupported);
                        assert_eq!(
                            event_type.map(|t| t.as_str().to_owned()).as_deref(),
                            Some("inhook.simulated.unsupported")
                        );
                        unsupported += 1;
                    }
                }
            }
            ties += seen.values().filter(|n| **n > 1).count();
            if let Some((_, at_top)) = seen.last_key_value() {
                assert_eq!(*at_top, 1, "the highest sequence is one event's");
            }
        }
        assert!(ties > 20, "only {ties} ties");
        assert!(
            (60..180).contains(&unsupported),
            "{unsupported} unsupported"
        );
    }

    #[test]
    fn in_order_sequences_are_contiguous_from_the_first_and_unordered_events_are_alone() {
        let keys = r#"
            event_id = "/event/id"
            idempotency_key = "/event/key"
            aggregate = "/account"
            sequence = "header:X-Seq"
            ordering = "in-order"
        "#;
        let spec_of: JsonSourceSpec = toml::from_str(keys).unwrap();
        let target = JsonTarget::of_spec("src", &spec_of, 0, SequenceFormat::Integer, 0.2).unwrap();
        let stream = generate_json(&spec(300), &target);
        for aggregate in &stream.aggregates {
            let sequences: Vec<i64> = aggregate.events.iter().map(|e| e.sequence).collect();
            assert_eq!(sequences, (0..sequences.len() as i64).collect::<Vec<_>>());
            for event in &aggregate.events {
                assert_eq!(event.delivery_id(), None, "the id is in the body");
                assert!(matches!(parse(&target, event), JsonParsed::Event(_)));
                assert!(event.headers.iter().any(|(n, _)| n == "x-seq"));
            }
        }
        assert!(
            JsonTarget::of_spec("src", &spec_of, 0, SequenceFormat::Timestamp, 0.2)
                .unwrap_err()
                .to_string()
                .contains("in-order source needs integer sequences")
        );

        let unordered = target_unordered();
        let stream = generate_json(&spec(50), &unordered);
        assert_eq!(stream.aggregates.len(), 50, "one aggregate per event");
        let mut ids = HashSet::new();
        for aggregate in &stream.aggregates {
            let [event] = aggregate.events.as_slice() else {
                panic!("one event per aggregate");
            };
            assert!(ids.insert(event.event_id.clone()));
            assert_eq!(
                event.idempotency_key, None,
                "its own aggregate: no new-id copies"
            );
            let AggregateRef::Json { key, .. } = &aggregate.key else {
                panic!("json");
            };
            assert_eq!(key.to_string(), event.event_id);
        }
    }

    fn target_unordered() -> JsonTarget {
        target(
            r#"
            event_id = "header:X-Event-Id"
            idempotency_key = "/key"
            ordering = "unordered"
        "#,
            SequenceFormat::Integer,
        )
    }

    #[test]
    fn a_redelivery_under_a_new_id_writes_the_id_where_the_source_reads_it() {
        let target = target_unordered();
        let stream = generate_json(&spec(1), &target);
        let event = &stream.aggregates[0].events[0];
        let copy = event.redelivered_as("evt_other");
        assert_eq!(
            copy.headers,
            [("x-event-id".to_owned(), "evt_other".to_owned())]
        );
        assert_eq!(copy.body, event.body);
        let JsonParsed::Event(parsed) = parse(&target, &copy) else {
            panic!("an event");
        };
        assert_eq!(parsed.event_id.as_str(), "evt_other");
    }
}
