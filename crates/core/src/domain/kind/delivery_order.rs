//! How a forwarded delivery is ordered within its (destination, aggregate)
//! (docs/forwarding.md), which decides what a dead one blocks. Each kind says
//! how its events are ordered ([`super::Kind::delivery_order`]); forwarding only reads
//! the order, never a kind's event types.

/// The part of an aggregate's state an event changes: a replayed latest-wins event is
/// superseded only by a newer delivered event of the same lane (a save slot's progress
/// snapshot is not made old by a newer inventory change; its inventory snapshot is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lane {
    /// The whole aggregate (presence, a `json` latest-wins source).
    Aggregate,
    /// One named part of it, one of a kind's [`super::Kind`] lanes (stored after a `:`).
    Part(&'static str),
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

/// The stored prefix of an in-order delivery; SQLite's triggers count blocked queues by it.
const IN_ORDER: &str = "in-order";
/// The stored prefix of a latest-wins delivery.
const LATEST_WINS: &str = "latest-wins";
/// The stored form of an order-free delivery.
const UNORDERED: &str = "unordered";

impl DeliveryOrder {
    /// Every order a kind can give, for parsing stored rows and naming them in SQL.
    pub fn all() -> impl Iterator<Item = DeliveryOrder> {
        let lanes =
            || std::iter::once(Lane::Aggregate).chain(super::LANES.iter().map(|l| Lane::Part(l)));
        lanes()
            .map(DeliveryOrder::InOrder)
            .chain(lanes().map(DeliveryOrder::LatestWins))
            .chain(std::iter::once(DeliveryOrder::Unordered))
    }

    /// The stored form: the rule, then `:` and the lane when it is a part.
    pub fn to_stored(self) -> String {
        let (rule, lane) = match self {
            DeliveryOrder::InOrder(lane) => (IN_ORDER, lane),
            DeliveryOrder::LatestWins(lane) => (LATEST_WINS, lane),
            DeliveryOrder::Unordered => return UNORDERED.to_owned(),
        };
        match lane {
            Lane::Aggregate => rule.to_owned(),
            Lane::Part(part) => format!("{rule}:{part}"),
        }
    }

    /// Reads the stored form back (`None`: no kind of this release orders so).
    pub fn parse(stored: &str) -> Option<Self> {
        if stored == UNORDERED {
            return Some(DeliveryOrder::Unordered);
        }
        let (rule, lane) = match stored.split_once(':') {
            None => (stored, Lane::Aggregate),
            Some((rule, part)) => (rule, Lane::Part(super::LANES.iter().find(|l| **l == part)?)),
        };
        match rule {
            IN_ORDER => Some(DeliveryOrder::InOrder(lane)),
            LATEST_WINS => Some(DeliveryOrder::LatestWins(lane)),
            _ => None,
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_orders_that_block_are_those_the_stores_triggers_name() {
        // SQLite's triggers (migration 14) count a queue blocked by `ordering LIKE 'in-order%'`.
        for order in DeliveryOrder::all() {
            assert_eq!(
                order.blocks_when_dead(),
                order.to_stored().starts_with("in-order"),
                "{order:?}"
            );
        }
    }

    #[test]
    fn every_order_reads_back_from_its_stored_form() {
        for order in DeliveryOrder::all() {
            assert_eq!(DeliveryOrder::parse(&order.to_stored()), Some(order));
        }
        assert_eq!(DeliveryOrder::parse("sideways"), None);
        assert_eq!(DeliveryOrder::parse("in-order:nowhere"), None);
        assert!(DeliveryOrder::InOrder(Lane::Aggregate).blocks_when_dead());
        assert_eq!(DeliveryOrder::Unordered.lane(), None);
        assert!(!DeliveryOrder::Unordered.blocks_when_dead());
    }
}
