//! What is forwarded (docs/contract.md, forwarding): every event the source's rules apply, to every
//! destination that names its source and whose `event_types` match; nothing
//! else (duplicates, stale, held, dead and ignored events). And how each
//! delivery is ordered within its aggregate, which decides what a dead one blocks.

use crate::config::{DestinationConfig, SourceConfig};
use crate::kind::json::contract::JsonOrdering;
use crate::kind::SourceKind;
use crate::ordering::Outcome;

use super::message::WebhookId;

/// The part of an aggregate's state an event changes: a replayed latest-wins event is
/// superseded only by a newer delivered event of the same lane (a save slot's progress
/// snapshot is not made old by a newer inventory change; its inventory snapshot is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The whole aggregate (presence, a `json` latest-wins source).
    Aggregate,
    /// A save slot's progress (`progress.saved`).
    Progress,
    /// A save slot's inventory (`inventory.snapshot`).
    Inventory,
}

/// How a delivery is ordered within its (destination, aggregate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeliveryOrder {
    /// A delta applied in sequence: dead, it blocks its aggregate until replayed or skipped.
    InOrder(Lane),
    /// A snapshot: dead, it is given up; replayed after a newer one of its lane was delivered, superseded.
    LatestWins(Lane),
    /// Order-free: dead, it is given up; a replay is always sent.
    Unordered,
}

impl DeliveryOrder {
    /// Every order, for parsing stored rows.
    pub const ALL: [DeliveryOrder; 6] = [
        DeliveryOrder::InOrder(Lane::Aggregate),
        DeliveryOrder::InOrder(Lane::Inventory),
        DeliveryOrder::LatestWins(Lane::Aggregate),
        DeliveryOrder::LatestWins(Lane::Progress),
        DeliveryOrder::LatestWins(Lane::Inventory),
        DeliveryOrder::Unordered,
    ];

    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryOrder::InOrder(Lane::Aggregate) => "in-order",
            DeliveryOrder::InOrder(Lane::Inventory) => "in-order:inventory",
            // No kind applies progress in order; stored as such should one ever do.
            DeliveryOrder::InOrder(Lane::Progress) => "in-order:progress",
            DeliveryOrder::LatestWins(Lane::Aggregate) => "latest-wins",
            DeliveryOrder::LatestWins(Lane::Progress) => "latest-wins:progress",
            DeliveryOrder::LatestWins(Lane::Inventory) => "latest-wins:inventory",
            DeliveryOrder::Unordered => "unordered",
        }
    }

    /// Reads the stored form back.
    pub fn parse(stored: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.as_str() == stored)
    }

    /// Whether a dead delivery of this order blocks the later ones of its aggregate.
    pub fn blocks_when_dead(self) -> bool {
        matches!(self, DeliveryOrder::InOrder(_))
    }

    /// The part of the aggregate it changes; none for an order-free event.
    pub fn lane(self) -> Option<Lane> {
        match self {
            DeliveryOrder::InOrder(lane) | DeliveryOrder::LatestWins(lane) => Some(lane),
            DeliveryOrder::Unordered => None,
        }
    }
}

/// How a source orders its events, as far as forwarding needs to know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceOrdering {
    /// Presence: latest-wins per user.
    Presence,
    /// Save-game: each event type has its own rule.
    SaveGame,
    /// A `json` source: one ordering for every event.
    Json(JsonOrdering),
}

impl SourceOrdering {
    /// The ordering of a configured source (a `json` source without a known ordering is unordered,
    /// as [`crate::kind::built_in`] makes it).
    pub fn of(source: &SourceConfig) -> Self {
        match source.kind {
            SourceKind::Presence => SourceOrdering::Presence,
            SourceKind::SaveGame => SourceOrdering::SaveGame,
            SourceKind::Json => SourceOrdering::Json(
                source
                    .json
                    .as_ref()
                    .and_then(|spec| spec.ordering.as_deref())
                    .and_then(|raw| JsonOrdering::ALL.into_iter().find(|o| o.as_str() == raw))
                    .unwrap_or(JsonOrdering::Unordered),
            ),
        }
    }

    /// How an event of `event_type` from this source is ordered when forwarded.
    pub fn delivery_order(self, event_type: &str) -> DeliveryOrder {
        match self {
            SourceOrdering::Presence => DeliveryOrder::LatestWins(Lane::Aggregate),
            SourceOrdering::Json(JsonOrdering::LatestWins) => {
                DeliveryOrder::LatestWins(Lane::Aggregate)
            }
            SourceOrdering::Json(JsonOrdering::InOrder) => DeliveryOrder::InOrder(Lane::Aggregate),
            SourceOrdering::Json(JsonOrdering::Unordered) => DeliveryOrder::Unordered,
            SourceOrdering::SaveGame => match event_type {
                "inventory.updated" => DeliveryOrder::InOrder(Lane::Inventory),
                "progress.saved" => DeliveryOrder::LatestWins(Lane::Progress),
                "inventory.snapshot" => DeliveryOrder::LatestWins(Lane::Inventory),
                // achievement.unlocked is order-free.
                _ => DeliveryOrder::Unordered,
            },
        }
    }
}

/// A settled event, as the store knows it in the decision's transaction.
#[derive(Debug, Clone, Copy)]
pub struct SettledEvent<'a> {
    /// The source's name.
    pub source: &'a str,
    /// How the source orders its events.
    pub ordering: SourceOrdering,
    /// The logged event_id.
    pub event_id: &'a str,
    /// The logged event type (empty when the kind locates none).
    pub event_type: &'a str,
    /// What the rules decided.
    pub outcome: &'a Outcome,
}

/// A delivery row to write with the decision. The store writes them in the order the
/// events were applied (a kind's `decisions` order), and that write order is the
/// applied order [`super::queue`] sends in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// The destination's name.
    pub destination: String,
    /// The request's `webhook-id`.
    pub webhook_id: WebhookId,
    /// How it is ordered in its aggregate.
    pub order: DeliveryOrder,
}

/// The deliveries one settled event produces: one per destination that wants it, none
/// unless it was applied.
pub fn deliveries_for(
    destinations: &[DestinationConfig],
    event: &SettledEvent<'_>,
) -> Vec<NewDelivery> {
    if *event.outcome != Outcome::Applied {
        return Vec::new();
    }
    let order = event.ordering.delivery_order(event.event_type);
    destinations
        .iter()
        .filter(|d| d.wants(event.source, event.event_type))
        .map(|d| NewDelivery {
            destination: d.name.clone(),
            webhook_id: WebhookId::of(event.source, event.event_id),
            order,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::domain::DeadReason;

    #[test]
    fn the_orders_that_block_are_those_the_stores_triggers_name() {
        // SQLite's triggers (migration 14) count a queue blocked by `ordering LIKE 'in-order%'`.
        for order in DeliveryOrder::ALL {
            assert_eq!(
                order.blocks_when_dead(),
                order.as_str().starts_with("in-order"),
                "{order:?}"
            );
        }
    }
    use std::collections::HashMap;

    const CONFIG: &str = r#"
        [[sources]]
        name = "presence"
        kind = "presence"
        secrets = ["p"]
        [[sources]]
        name = "save-game"
        kind = "save-game"
        secrets = ["s"]
        [[sources]]
        name = "stripe"
        kind = "json"
        signature = "stripe"
        secrets = ["whsec_x"]
        event_id = "/id"
        aggregate = "/data/object/id"
        sequence = "/created"
        event_type = "/type"
        ordering = "latest-wins"
        [[destinations]]
        name = "billing"
        url = "https://billing.example/hooks"
        sources = ["stripe"]
        event_types = ["invoice.*"]
        secret = "whsec_c2VjcmV0"
        [[destinations]]
        name = "everything"
        url = "http://127.0.0.1:9000/"
        sources = ["stripe", "save-game"]
        secret = "whsec_c2VjcmV0"
    "#;

    fn config() -> Config {
        Config::from_parts(Some(CONFIG), &HashMap::new()).unwrap()
    }

    fn names(deliveries: &[NewDelivery]) -> Vec<&str> {
        deliveries.iter().map(|d| d.destination.as_str()).collect()
    }

    #[test]
    fn only_applied_events_of_named_sources_and_matching_types_are_forwarded() {
        let config = config();
        let stripe = SourceOrdering::of(config.source("stripe").unwrap());
        assert_eq!(stripe, SourceOrdering::Json(JsonOrdering::LatestWins));
        let event = |source, event_type, outcome| SettledEvent {
            source,
            ordering: stripe,
            event_id: "evt_1",
            event_type,
            outcome,
        };
        let applied = Outcome::Applied;
        let paid = deliveries_for(
            &config.destinations,
            &event("stripe", "invoice.paid", &applied),
        );
        assert_eq!(names(&paid), ["billing", "everything"]);
        assert_eq!(
            paid[0].webhook_id, paid[1].webhook_id,
            "the same id for every destination"
        );
        let customer = deliveries_for(
            &config.destinations,
            &event("stripe", "customer.created", &applied),
        );
        assert_eq!(names(&customer), ["everything"]);
        let untyped = deliveries_for(&config.destinations, &event("stripe", "", &applied));
        assert_eq!(
            names(&untyped),
            ["everything"],
            "a filter never matches a missing type"
        );
        assert!(deliveries_for(
            &config.destinations,
            &event("presence", "presence", &applied)
        )
        .is_empty());
        for outcome in [
            Outcome::Stale,
            Outcome::Held,
            Outcome::Unsupported,
            Outcome::dead(DeadReason::SequenceConflict, "x"),
        ] {
            let settled = SettledEvent {
                outcome: &outcome,
                ..event("stripe", "invoice.paid", &applied)
            };
            assert!(
                deliveries_for(&config.destinations, &settled).is_empty(),
                "{outcome:?}"
            );
        }
    }

    #[test]
    fn each_event_is_ordered_as_its_source_rules_order_it() {
        let config = config();
        let save = SourceOrdering::of(config.source("save-game").unwrap());
        assert_eq!(
            save.delivery_order("inventory.updated"),
            DeliveryOrder::InOrder(Lane::Inventory)
        );
        assert_eq!(
            save.delivery_order("progress.saved"),
            DeliveryOrder::LatestWins(Lane::Progress)
        );
        assert_eq!(
            save.delivery_order("inventory.snapshot"),
            DeliveryOrder::LatestWins(Lane::Inventory)
        );
        assert_eq!(
            save.delivery_order("achievement.unlocked"),
            DeliveryOrder::Unordered
        );
        let presence = SourceOrdering::of(config.source("presence").unwrap());
        assert_eq!(
            presence.delivery_order("x"),
            DeliveryOrder::LatestWins(Lane::Aggregate)
        );
        assert_eq!(
            SourceOrdering::Json(JsonOrdering::InOrder).delivery_order("x"),
            DeliveryOrder::InOrder(Lane::Aggregate)
        );
        assert!(DeliveryOrder::InOrder(Lane::Aggregate).blocks_when_dead());
        assert_eq!(DeliveryOrder::Unordered.lane(), None);
        assert!(!DeliveryOrder::Unordered.blocks_when_dead());
        for order in DeliveryOrder::ALL {
            assert_eq!(DeliveryOrder::parse(order.as_str()), Some(order));
        }
        assert_eq!(DeliveryOrder::parse("sideways"), None);
    }
}
