//! A user's presence as stored and shown (docs/api.md, read API): the pure effect of an
//! applied presence event.

use serde::Serialize;

use super::contract::{Presence, PresenceEvent};
use crate::domain::Sequence;

/// A user's current presence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PresenceState {
    /// The latest presence by sequence.
    pub presence: Presence,
    /// The sequence of the event that set it.
    pub sequence: Sequence,
    /// When it was applied, unix milliseconds.
    pub updated_at_ms: i64,
}

impl PresenceState {
    /// The state after applying `event` at `now_ms` (the caller has checked it is newer).
    pub fn from_event(event: &PresenceEvent, now_ms: i64) -> Self {
        Self {
            presence: event.presence,
            sequence: event.sequence,
            updated_at_ms: now_ms,
        }
    }

    /// Whether the presence has not been updated for longer than `stale_after_ms`.
    pub fn is_stale(&self, now_ms: i64, stale_after_ms: i64) -> bool {
        now_ms.saturating_sub(self.updated_at_ms) > stale_after_ms
    }
}

/// The API shape of a presence (docs/api.md, read API).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PresenceView {
    /// The user.
    pub user_id: String,
    /// The latest presence by sequence.
    pub status: Presence,
    /// The sequence of the event that set it.
    pub sequence: i64,
    /// When it was applied (RFC 3339).
    pub updated_at: String,
    /// Whether it has not been updated for longer than the source's `stale_after_s`.
    pub stale: bool,
}

/// The API shape of a presence; `stale` is judged at `now_ms`.
pub fn presence_view(
    user_id: &str,
    state: &PresenceState,
    now_ms: i64,
    stale_after_ms: i64,
) -> PresenceView {
    PresenceView {
        user_id: user_id.to_owned(),
        status: state.presence,
        sequence: state.sequence.get(),
        updated_at: crate::domain::clock::rfc3339(state.updated_at_ms),
        stale: state.is_stale(now_ms, stale_after_ms),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presence_goes_stale_after_the_window() {
        let state = PresenceState {
            presence: Presence::Busy,
            sequence: Sequence::new(1).unwrap(),
            updated_at_ms: 1_000,
        };
        assert!(!state.is_stale(1_000 + 900_000, 900_000));
        assert!(state.is_stale(1_001 + 900_000, 900_000));
    }
}
