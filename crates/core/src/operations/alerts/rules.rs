//! The alert rules' evaluation (docs/configuration.md, alerts): given the figures observed
//! at one tick and what was firing before, which alerts start firing, repeat or resolve.
//! Pure: no clock, no store, no network; the watcher gathers the figures and sends.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::Serialize;

/// What a rule watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum On {
    /// Dead events of a source, more than `over`.
    Dead,
    /// An event held for a gap longer than `after_s`.
    GapHeld,
    /// A destination whose requests fail, more than `over` in a row.
    DestinationFailing,
    /// A destination's circuit open (or probing) for `after_s`.
    CircuitOpen,
    /// Rejected deliveries of a source, more than `over` within `per_s`.
    Rejections,
    /// Undecided events of a source, more than `over`.
    Backlog,
    /// No delivery from a source for longer than `after_s`.
    SourceSilent,
    /// The store unreachable for `after_s`.
    StoreUnavailable,
}

impl On {
    /// Every kind, in the order the documentation lists them.
    pub const ALL: [On; 8] = [
        On::Dead,
        On::GapHeld,
        On::DestinationFailing,
        On::CircuitOpen,
        On::Rejections,
        On::Backlog,
        On::SourceSilent,
        On::StoreUnavailable,
    ];

    /// The name in `on = "…"`, in notices and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            On::Dead => "dead",
            On::GapHeld => "gap_held",
            On::DestinationFailing => "destination_failing",
            On::CircuitOpen => "circuit_open",
            On::Rejections => "rejections",
            On::Backlog => "backlog",
            On::SourceSilent => "source_silent",
            On::StoreUnavailable => "store_unavailable",
        }
    }

    /// The kind named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|on| on.as_str() == name)
    }

    /// Whether its alerts are decided once across nodes: its figures are the shared
    /// store's. A destination's circuit and failures and the rejection counters are each
    /// node's own, and a node that cannot reach the store cannot share a decision in it.
    pub fn shared(self) -> bool {
        matches!(
            self,
            On::Dead | On::GapHeld | On::Backlog | On::SourceSilent
        )
    }

    /// What one firing of the rule is about.
    fn scope(self) -> Scope {
        match self {
            On::Dead | On::GapHeld | On::Rejections | On::Backlog | On::SourceSilent => {
                Scope::Source
            }
            On::DestinationFailing | On::CircuitOpen => Scope::Destination,
            On::StoreUnavailable => Scope::Store,
        }
    }
}

/// What one alert of a rule is about: each source, each destination, or the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scope {
    Source,
    Destination,
    Store,
}

/// Which rejections a `rejections` rule counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Every delivery answered 4xx.
    All,
    /// Only those whose signature did not verify.
    Signature,
}

/// One `[[alerts]]` rule's condition, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// What it watches.
    pub on: On,
    /// Only this source (source rules); every source when unset.
    pub source: Option<String>,
    /// The count the figure must exceed (`dead`, `destination_failing`, `rejections`, `backlog`).
    pub over: u64,
    /// The duration bound, in seconds (`gap_held`, `source_silent`; for `circuit_open` and
    /// `store_unavailable`, how long the condition lasts before it fires).
    pub after_s: u64,
    /// The window rejections are counted over, in seconds.
    pub per_s: u64,
    /// Which rejections count.
    pub rejected: Rejected,
    /// At most one repeat of a firing notice per this many seconds; none when unset.
    pub repeat_s: Option<u64>,
}

/// One source's figures at a tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SourceFigures {
    /// The source's name.
    pub name: String,
    /// Dead events in the store.
    pub dead: u64,
    /// Undecided events (received, held, retrying).
    pub backlog: u64,
    /// When the oldest held event was received (unix ms); none when nothing is held.
    pub oldest_held_ms: Option<i64>,
    /// When its latest delivery was received (unix ms); none when it never sent one.
    pub last_received_ms: Option<i64>,
    /// Deliveries rejected since the node started (a counter).
    pub rejected: u64,
    /// Deliveries whose signature failed since the node started (a counter).
    pub bad_signatures: u64,
}

/// One destination's figures at a tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestinationFigures {
    /// The destination's name.
    pub name: String,
    /// Its requests failed in a row (reset by a success).
    pub failures: u64,
    /// Whether its circuit is open or probing.
    pub circuit_open: bool,
    /// Its latest failed attempt's result.
    pub last_error: Option<String>,
}

/// Everything the rules read at one tick.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Figures {
    /// The tick's time, unix ms.
    pub now_ms: i64,
    /// When the watcher started (a source that never sent is silent since then).
    pub started_ms: i64,
    /// The sources' figures; none when the store could not be read (their rules keep their state).
    pub sources: Option<Vec<SourceFigures>>,
    /// The destinations' figures.
    pub destinations: Vec<DestinationFigures>,
    /// Why the store did not answer its ping; none when it did.
    pub store_error: Option<String>,
}

/// Whether a notice says an alert began or ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertState {
    /// The condition holds (sent when it starts, and as repeats).
    Firing,
    /// It no longer holds.
    Resolved,
}

impl AlertState {
    /// The stored and sent name.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertState::Firing => "firing",
            AlertState::Resolved => "resolved",
        }
    }
}

/// One notice to send and to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The index of the rule in the configuration.
    pub rule: usize,
    /// `firing` or `resolved`.
    pub state: AlertState,
    /// What the rule watches.
    pub on: On,
    /// The source it is about, for source rules.
    pub source: Option<String>,
    /// The destination it is about, for destination rules.
    pub destination: Option<String>,
    /// When the alert started firing (unix ms).
    pub since_ms: i64,
    /// When this notice was decided (unix ms).
    pub at_ms: i64,
    /// Whether it repeats a firing notice already sent.
    pub repeat: bool,
    /// One line a person reads.
    pub summary: String,
    /// The figures that fired it (or, resolved, the figures now).
    pub figures: BTreeMap<String, i64>,
}

/// One alert (a rule over one subject) between ticks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Instance {
    /// Since when the condition holds (not yet fired while shorter than the rule's hold).
    breached_since_ms: Option<i64>,
    /// Since when it fires, once it does.
    firing_since_ms: Option<i64>,
    /// When the last firing notice was decided.
    last_sent_ms: i64,
    /// Rejection counter samples within the window: (at, count).
    samples: VecDeque<(i64, u64)>,
}

/// What the rules remember between ticks, per rule and subject.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertBook {
    instances: HashMap<(usize, String), Instance>,
}

impl AlertBook {
    /// Whether the alert of rule `rule` over `subject` fires now.
    pub fn firing(&self, rule: usize, subject: &str) -> bool {
        self.instances
            .get(&(rule, subject.to_owned()))
            .is_some_and(|i| i.firing_since_ms.is_some())
    }

    /// Takes the store's word on whether the alert of rule `rule` over `subject` fires
    /// (`Some((since, last_sent))`) or not, for an alert decided across nodes: another node
    /// may have fired, repeated or resolved it since this one last looked.
    pub fn adopt(&mut self, rule: usize, subject: &str, firing: Option<(i64, i64)>) {
        let instance = self
            .instances
            .entry((rule, subject.to_owned()))
            .or_default();
        instance.firing_since_ms = firing.map(|(since, _)| since);
        if let Some((_, last_sent)) = firing {
            instance.last_sent_ms = last_sent;
        }
    }
}

/// One subject's reading of a rule at a tick.
struct Reading {
    /// Whether the condition holds.
    breached: bool,
    summary: String,
    figures: BTreeMap<String, i64>,
}

/// Evaluates every rule over `figures`, updating `book`; the notices to send, in rule order.
pub fn evaluate(rules: &[Condition], figures: &Figures, book: &mut AlertBook) -> Vec<Notice> {
    let mut notices = Vec::new();
    for (index, rule) in rules.iter().enumerate() {
        match rule.on.scope() {
            Scope::Source => {
                let Some(sources) = &figures.sources else {
                    continue;
                };
                for source in sources {
                    if rule.source.as_ref().is_some_and(|s| *s != source.name) {
                        continue;
                    }
                    let key = (index, source.name.clone());
                    let instance = book.instances.entry(key).or_default();
                    let reading = read_source(rule, source, figures, instance);
                    notices.extend(step(index, rule, figures.now_ms, instance, reading).map(
                        |mut notice| {
                            notice.source = Some(source.name.clone());
                            notice
                        },
                    ));
                }
            }
            Scope::Destination => {
                for destination in &figures.destinations {
                    let key = (index, destination.name.clone());
                    let instance = book.instances.entry(key).or_default();
                    let reading = read_destination(rule, destination);
                    notices.extend(step(index, rule, figures.now_ms, instance, reading).map(
                        |mut notice| {
                            notice.destination = Some(destination.name.clone());
                            notice
                        },
                    ));
                }
            }
            Scope::Store => {
                let instance = book.instances.entry((index, String::new())).or_default();
                let reading = Reading {
                    breached: figures.store_error.is_some(),
                    summary: match &figures.store_error {
                        Some(error) => format!("the store is unreachable: {error}"),
                        None => "the store answers".into(),
                    },
                    figures: BTreeMap::from([(
                        "unreachable".to_owned(),
                        i64::from(figures.store_error.is_some()),
                    )]),
                };
                notices.extend(step(index, rule, figures.now_ms, instance, reading));
            }
        }
    }
    notices
}

fn figure(name: &str, value: u64) -> (String, i64) {
    (name.to_owned(), i64::try_from(value).unwrap_or(i64::MAX))
}

fn read_source(
    rule: &Condition,
    source: &SourceFigures,
    figures: &Figures,
    instance: &mut Instance,
) -> Reading {
    let name = &source.name;
    let now = figures.now_ms;
    match rule.on {
        On::Dead => Reading {
            breached: source.dead > rule.over,
            summary: format!(
                "{} dead events in {name} (alert over {})",
                source.dead, rule.over
            ),
            figures: BTreeMap::from([figure("dead", source.dead), figure("over", rule.over)]),
        },
        On::Backlog => Reading {
            breached: source.backlog > rule.over,
            summary: format!(
                "{} undecided events in {name} (alert over {})",
                source.backlog, rule.over
            ),
            figures: BTreeMap::from([figure("backlog", source.backlog), figure("over", rule.over)]),
        },
        On::GapHeld => {
            let held_s = source
                .oldest_held_ms
                .map_or(0, |at| (now.saturating_sub(at).max(0) / 1000) as u64);
            Reading {
                breached: source.oldest_held_ms.is_some() && held_s > rule.after_s,
                summary: format!(
                    "an event of {name} held for a gap for {held_s} s (alert after {} s)",
                    rule.after_s
                ),
                figures: BTreeMap::from([
                    figure("held_for_s", held_s),
                    figure("after_s", rule.after_s),
                ]),
            }
        }
        On::SourceSilent => {
            let last = source.last_received_ms.unwrap_or(figures.started_ms);
            let silent_s = (now.saturating_sub(last).max(0) / 1000) as u64;
            Reading {
                breached: silent_s > rule.after_s,
                summary: format!(
                    "no delivery from {name} for {silent_s} s (alert after {} s)",
                    rule.after_s
                ),
                figures: BTreeMap::from([
                    figure("silent_for_s", silent_s),
                    figure("after_s", rule.after_s),
                ]),
            }
        }
        On::Rejections => {
            let count = match rule.rejected {
                Rejected::All => source.rejected,
                Rejected::Signature => source.bad_signatures,
            };
            let window_ms = (rule.per_s.max(1) as i64).saturating_mul(1000);
            // The counters count from the node's start: zero then.
            if instance.samples.is_empty() {
                instance.samples.push_back((figures.started_ms, 0));
            }
            // The oldest sample still inside the window is the count the window started from.
            while instance
                .samples
                .front()
                .is_some_and(|(at, _)| now.saturating_sub(*at) > window_ms)
            {
                instance.samples.pop_front();
            }
            let base = instance.samples.front().map_or(count, |(_, c)| *c);
            instance.samples.push_back((now, count));
            let rejected = count.saturating_sub(base);
            let what = match rule.rejected {
                Rejected::All => "rejected deliveries",
                Rejected::Signature => "deliveries with a bad signature",
            };
            Reading {
                breached: rejected > rule.over,
                summary: format!(
                    "{rejected} {what} to {name} within {} s (alert over {})",
                    rule.per_s, rule.over
                ),
                figures: BTreeMap::from([
                    figure("rejected", rejected),
                    figure("over", rule.over),
                    figure("per_s", rule.per_s),
                ]),
            }
        }
        On::DestinationFailing | On::CircuitOpen | On::StoreUnavailable => {
            unreachable!("not a source rule")
        }
    }
}

fn read_destination(rule: &Condition, destination: &DestinationFigures) -> Reading {
    let name = &destination.name;
    let error = destination
        .last_error
        .as_deref()
        .map(|e| format!(": {e}"))
        .unwrap_or_default();
    match rule.on {
        On::DestinationFailing => Reading {
            breached: destination.failures > rule.over,
            summary: format!(
                "{} requests to {name} failed in a row (alert over {}){error}",
                destination.failures, rule.over
            ),
            figures: BTreeMap::from([
                figure("failures", destination.failures),
                figure("over", rule.over),
            ]),
        },
        On::CircuitOpen => Reading {
            breached: destination.circuit_open,
            summary: if destination.circuit_open {
                format!("the circuit of {name} is open{error}")
            } else {
                format!("the circuit of {name} is closed")
            },
            figures: BTreeMap::from([(
                "circuit_open".to_owned(),
                i64::from(destination.circuit_open),
            )]),
        },
        _ => unreachable!("not a destination rule"),
    }
}

/// How long a condition must last before it fires.
fn hold_ms(rule: &Condition) -> i64 {
    match rule.on {
        On::CircuitOpen | On::StoreUnavailable => (rule.after_s as i64).saturating_mul(1000),
        _ => 0,
    }
}

/// One subject's transition at a tick: a notice when it starts firing, repeats or resolves.
fn step(
    index: usize,
    rule: &Condition,
    now: i64,
    instance: &mut Instance,
    reading: Reading,
) -> Option<Notice> {
    let notice = |state, since_ms, repeat| Notice {
        rule: index,
        state,
        on: rule.on,
        source: None,
        destination: None,
        since_ms,
        at_ms: now,
        repeat,
        summary: reading.summary.clone(),
        figures: reading.figures.clone(),
    };
    if !reading.breached {
        instance.breached_since_ms = None;
        let since = instance.firing_since_ms.take()?;
        return Some(notice(AlertState::Resolved, since, false));
    }
    let breached_since = *instance.breached_since_ms.get_or_insert(now);
    match instance.firing_since_ms {
        None if now.saturating_sub(breached_since) >= hold_ms(rule) => {
            instance.firing_since_ms = Some(now);
            instance.last_sent_ms = now;
            Some(notice(AlertState::Firing, now, false))
        }
        None => None,
        Some(since) => {
            let repeat_ms = (rule.repeat_s? as i64).saturating_mul(1000);
            if now.saturating_sub(instance.last_sent_ms) < repeat_ms.max(1) {
                return None;
            }
            instance.last_sent_ms = now;
            Some(notice(AlertState::Firing, since, true))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn rule(on: On) -> Condition {
        Condition {
            on,
            source: None,
            over: 0,
            after_s: 0,
            per_s: 60,
            rejected: Rejected::All,
            repeat_s: None,
        }
    }

    fn source(name: &str) -> SourceFigures {
        SourceFigures {
            name: name.into(),
            ..SourceFigures::default()
        }
    }

    fn at(now_ms: i64, sources: Vec<SourceFigures>) -> Figures {
        Figures {
            now_ms,
            started_ms: 0,
            sources: Some(sources),
            destinations: vec![],
            store_error: None,
        }
    }

    #[test]
    fn a_dead_event_fires_once_and_resolves_once() {
        let rules = [rule(On::Dead)];
        let mut book = AlertBook::default();
        assert!(evaluate(&rules, &at(1_000, vec![source("a")]), &mut book).is_empty());
        let dead = SourceFigures {
            dead: 2,
            ..source("a")
        };
        let fired = evaluate(&rules, &at(2_000, vec![dead.clone()]), &mut book);
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].state, AlertState::Firing);
        assert_eq!(fired[0].source.as_deref(), Some("a"));
        assert_eq!(fired[0].figures["dead"], 2);
        assert!(evaluate(&rules, &at(3_000, vec![dead]), &mut book).is_empty());
        let resolved = evaluate(&rules, &at(4_000, vec![source("a")]), &mut book);
        assert_eq!(resolved.len(), 1);
        assert_eq!(resolved[0].state, AlertState::Resolved);
        assert_eq!(resolved[0].since_ms, 2_000);
        assert!(evaluate(&rules, &at(5_000, vec![source("a")]), &mut book).is_empty());
    }

    #[test]
    fn a_firing_alert_repeats_at_most_once_per_repeat_s() {
        let rules = [Condition {
            repeat_s: Some(10),
            ..rule(On::Backlog)
        }];
        let full = SourceFigures {
            backlog: 5,
            ..source("a")
        };
        let mut book = AlertBook::default();
        let mut sent = vec![];
        for second in 0..=30 {
            sent.extend(evaluate(
                &rules,
                &at(second * 1000, vec![full.clone()]),
                &mut book,
            ));
        }
        let times: Vec<_> = sent.iter().map(|n| (n.at_ms, n.repeat)).collect();
        assert_eq!(
            times,
            [(0, false), (10_000, true), (20_000, true), (30_000, true)]
        );
        assert!(sent.iter().all(|n| n.since_ms == 0));
    }

    #[test]
    fn a_source_rule_narrowed_to_one_source_ignores_the_others() {
        let rules = [Condition {
            source: Some("b".into()),
            ..rule(On::Dead)
        }];
        let dead = |name| SourceFigures {
            dead: 1,
            ..source(name)
        };
        let fired = evaluate(
            &rules,
            &at(0, vec![dead("a"), dead("b")]),
            &mut AlertBook::default(),
        );
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].source.as_deref(), Some("b"));
    }

    #[test]
    fn the_store_rule_waits_after_s_and_source_rules_keep_their_state_while_it_is_down() {
        let rules = [
            Condition {
                after_s: 5,
                ..rule(On::StoreUnavailable)
            },
            rule(On::Dead),
        ];
        let mut book = AlertBook::default();
        let dead = SourceFigures {
            dead: 1,
            ..source("a")
        };
        assert_eq!(evaluate(&rules, &at(0, vec![dead]), &mut book).len(), 1);
        let down = |now_ms| Figures {
            now_ms,
            store_error: Some("connection refused".into()),
            sources: None,
            ..Figures::default()
        };
        assert!(evaluate(&rules, &down(1_000), &mut book).is_empty());
        let fired = evaluate(&rules, &down(6_000), &mut book);
        assert_eq!(fired.len(), 1);
        assert_eq!(fired[0].on, On::StoreUnavailable);
        assert!(
            book.firing(1, "a"),
            "the dead alert neither resolved nor repeated"
        );
        let back = evaluate(&rules, &at(7_000, vec![source("a")]), &mut book);
        let states: Vec<_> = back.iter().map(|n| (n.on, n.state)).collect();
        assert_eq!(
            states,
            [
                (On::StoreUnavailable, AlertState::Resolved),
                (On::Dead, AlertState::Resolved)
            ]
        );
    }

    #[test]
    fn an_alert_another_node_fired_is_not_fired_again_and_resolves_with_its_since() {
        let rules = [rule(On::Dead)];
        let mut book = AlertBook::default();
        let dead = SourceFigures {
            dead: 1,
            ..source("a")
        };
        book.adopt(0, "a", Some((500, 500)));
        assert!(evaluate(&rules, &at(1_000, vec![dead]), &mut book).is_empty());
        let resolved = evaluate(&rules, &at(2_000, vec![source("a")]), &mut book);
        assert_eq!(resolved[0].state, AlertState::Resolved);
        assert_eq!(resolved[0].since_ms, 500);
        // Resolved elsewhere: a firing condition starts a new alert.
        book.adopt(0, "a", None);
        assert!(On::Dead.shared() && !On::Rejections.shared());
    }

    #[test]
    fn rejections_count_within_the_window_only() {
        let rules = [Condition {
            over: 2,
            per_s: 10,
            rejected: Rejected::Signature,
            ..rule(On::Rejections)
        }];
        let mut book = AlertBook::default();
        let bad = |n| SourceFigures {
            bad_signatures: n,
            rejected: 100,
            ..source("a")
        };
        assert!(evaluate(&rules, &at(0, vec![bad(0)]), &mut book).is_empty());
        assert!(evaluate(&rules, &at(1_000, vec![bad(2)]), &mut book).is_empty());
        let fired = evaluate(&rules, &at(2_000, vec![bad(3)]), &mut book);
        assert_eq!(fired[0].figures["rejected"], 3);
        // Eleven seconds on, the window holds only the samples of the last ten.
        let resolved = evaluate(&rules, &at(13_000, vec![bad(3)]), &mut book);
        assert_eq!(resolved[0].state, AlertState::Resolved);
    }

    #[test]
    fn rejections_before_the_first_tick_count_from_the_start() {
        let rules = [rule(On::Rejections)];
        let rejected = SourceFigures {
            rejected: 4,
            ..source("a")
        };
        let fired = evaluate(&rules, &at(500, vec![rejected]), &mut AlertBook::default());
        assert_eq!(fired[0].figures["rejected"], 4);
    }

    #[test]
    fn silence_counts_from_the_start_when_a_source_never_sent() {
        let rules = [Condition {
            after_s: 30,
            ..rule(On::SourceSilent)
        }];
        let mut book = AlertBook::default();
        assert!(evaluate(&rules, &at(30_000, vec![source("a")]), &mut book).is_empty());
        assert_eq!(
            evaluate(&rules, &at(31_000, vec![source("a")]), &mut book).len(),
            1
        );
        let sent = SourceFigures {
            last_received_ms: Some(31_500),
            ..source("a")
        };
        let resolved = evaluate(&rules, &at(32_000, vec![sent]), &mut book);
        assert_eq!(resolved[0].state, AlertState::Resolved);
    }

    #[test]
    fn destination_rules_fire_per_destination() {
        let rules = [rule(On::DestinationFailing), rule(On::CircuitOpen)];
        let mut book = AlertBook::default();
        let figures = Figures {
            now_ms: 0,
            destinations: vec![
                DestinationFigures {
                    name: "app".into(),
                    failures: 3,
                    circuit_open: true,
                    last_error: Some("HTTP 500".into()),
                },
                DestinationFigures {
                    name: "other".into(),
                    ..DestinationFigures::default()
                },
            ],
            ..Figures::default()
        };
        let fired = evaluate(&rules, &figures, &mut book);
        let what: Vec<_> = fired
            .iter()
            .map(|n| (n.on, n.destination.as_deref()))
            .collect();
        assert_eq!(
            what,
            [
                (On::DestinationFailing, Some("app")),
                (On::CircuitOpen, Some("app"))
            ]
        );
        assert!(fired[0].summary.contains("HTTP 500"));
    }

    proptest! {
        /// Whatever the figures do, an alert's notices alternate firing and resolved (repeats
        /// only between them), each resolved one names the since of the firing it ends,
        /// and repeats are at least `repeat_s` apart.
        #[test]
        fn notices_alternate_and_repeats_keep_their_distance(
            backlogs in proptest::collection::vec(0u64..4, 1..60),
            over in 0u64..3,
            repeat_s in proptest::option::of(1u64..5),
        ) {
            let rules = [Condition { over, repeat_s, ..rule(On::Backlog) }];
            let mut book = AlertBook::default();
            let mut firing_since: Option<i64> = None;
            let mut last_sent = i64::MIN;
            for (tick, backlog) in backlogs.iter().enumerate() {
                let now = tick as i64 * 1000;
                let figures = at(now, vec![SourceFigures { backlog: *backlog, ..source("a") }]);
                let notices = evaluate(&rules, &figures, &mut book);
                prop_assert!(notices.len() <= 1);
                let breached = *backlog > over;
                match notices.first() {
                    Some(n) if n.state == AlertState::Resolved => {
                        prop_assert!(!breached);
                        prop_assert_eq!(Some(n.since_ms), firing_since.take());
                    }
                    Some(n) if n.repeat => {
                        prop_assert!(breached);
                        prop_assert_eq!(Some(n.since_ms), firing_since);
                        let gap = now - last_sent;
                        prop_assert!(gap >= repeat_s.unwrap() as i64 * 1000);
                        last_sent = now;
                    }
                    Some(_) => {
                        prop_assert!(breached && firing_since.is_none());
                        firing_since = Some(now);
                        last_sent = now;
                    }
                    None => prop_assert_eq!(breached, firing_since.is_some()),
                }
            }
        }
    }
}
