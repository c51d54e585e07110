//! What runs: the wiring of one node ([`app`]), the workers that settle due aggregates
//! ([`worker`]) with their retry policy ([`retry`]), the task that steps bulk replays
//! ([`replays`]), and the clock everything reads ([`clock`]).

pub mod app;
pub mod clock;
pub mod replays;
pub mod retry;
pub mod worker;
