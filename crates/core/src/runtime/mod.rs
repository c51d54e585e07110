//! What runs: the wiring of one node ([`app`]), the workers that settle due aggregates
//! ([`worker`]), and the task that steps bulk replays ([`replays`]).

pub mod app;
pub mod replays;
pub mod worker;
