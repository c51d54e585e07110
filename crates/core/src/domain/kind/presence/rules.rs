//! The presence rule (docs/contract.md, processing): latest-wins by `sequence_number`.

use super::contract::PresenceEvent;
use super::projection::PresenceState;
use crate::domain::ordering::Outcome;

/// Decides a presence event against the user's current state (latest-wins).
pub fn decide_presence(current: Option<&PresenceState>, event: &PresenceEvent) -> Outcome {
    match current {
        Some(state) if event.sequence <= state.sequence => Outcome::Stale,
        _ => Outcome::Applied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{EventId, Ident, Sequence};
    use proptest::prelude::*;

    fn presence_event(
        seq: i64,
        presence: crate::domain::kind::presence::Presence,
    ) -> PresenceEvent {
        PresenceEvent {
            event_id: EventId::parse(&format!("p{seq}")).unwrap(),
            user_id: Ident::parse("u").unwrap(),
            presence,
            sequence: Sequence::new(seq).unwrap(),
            timestamp: None,
            idempotency_key: None,
        }
    }

    proptest! {
        /// G5 for presence: any arrival order, with duplicates, ends on the highest sequence's value.
        #[test]
        fn presence_converges_to_the_last_in_order(
            values in proptest::collection::vec(0usize..4, 1..20),
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 1..40),
        ) {
            use crate::domain::kind::presence::Presence;
            let stream: Vec<PresenceEvent> = values
                .iter()
                .enumerate()
                .map(|(i, v)| presence_event(i as i64 + 1, Presence::ALL[*v]))
                .collect();
            let arrivals = order
                .iter()
                .map(|i| i.index(stream.len()))
                .chain(0..stream.len());
            let mut state: Option<PresenceState> = None;
            for i in arrivals {
                let event = &stream[i];
                if decide_presence(state.as_ref(), event) == Outcome::Applied {
                    state = Some(PresenceState::from_event(event, 0));
                }
            }
            let last = stream.last().unwrap();
            prop_assert_eq!(state.map(|s| (s.presence, s.sequence)), Some((last.presence, last.sequence)));
        }
    }
}
