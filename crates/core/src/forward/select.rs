//! What is forwarded (docs/forwarding.md): every event the source's rules apply, to every
//! destination that names its source and whose `event_types` match; nothing
//! else (duplicates, stale, held, dead and ignored events). Each delivery carries the order
//! its source's kind gives it ([`crate::domain::kind::DeliveryOrder`]).

use crate::config::DestinationConfig;
use crate::domain::kind::{DeliveryOrder, Kind};
use crate::domain::ordering::Outcome;

use super::message::WebhookId;

/// A settled event, as the store knows it in the decision's transaction.
#[derive(Debug, Clone, Copy)]
pub struct SettledEvent<'a> {
    /// The source's name.
    pub source: &'a str,
    /// The source's kind, which says how each of its events is ordered.
    pub kind: &'a dyn Kind,
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
    let order = event.kind.delivery_order(event.event_type);
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

    use crate::domain::kind::Lane;
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
        [[sources]]
        name = "ledger"
        kind = "json"
        signature = "hmac-hex"
        secrets = ["l"]
        event_id = "/id"
        aggregate = "/account"
        sequence = "/seq"
        ordering = "in-order"
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
        let stripe = config.source("stripe").unwrap().kind.as_ref();
        assert_eq!(
            stripe.delivery_order("invoice.paid"),
            DeliveryOrder::LatestWins(Lane::Aggregate)
        );
        let event = |source, event_type, outcome| SettledEvent {
            source,
            kind: stripe,
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
        let order = |source: &str, event_type: &str| {
            config
                .source(source)
                .unwrap()
                .kind
                .delivery_order(event_type)
        };
        assert_eq!(
            order("save-game", "inventory.updated"),
            DeliveryOrder::InOrder(Lane::Part("inventory"))
        );
        assert_eq!(
            order("save-game", "progress.saved"),
            DeliveryOrder::LatestWins(Lane::Part("progress"))
        );
        assert_eq!(
            order("save-game", "inventory.snapshot"),
            DeliveryOrder::LatestWins(Lane::Part("inventory"))
        );
        assert_eq!(
            order("save-game", "achievement.unlocked"),
            DeliveryOrder::Unordered
        );
        assert_eq!(
            order("presence", "x"),
            DeliveryOrder::LatestWins(Lane::Aggregate)
        );
        assert_eq!(
            order("ledger", "x"),
            DeliveryOrder::InOrder(Lane::Aggregate)
        );
    }
}
