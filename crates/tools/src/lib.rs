//! The user-facing tools, a crate of their own that the `inhook` binary ships: the load generator
//! (`inhook bench`) and the chaos publisher (`inhook simulate`). They talk to a server over
//! HTTP like any publisher; nothing in the core depends on them.

pub mod bench;
mod bench_api;
mod bench_forward;
pub mod simulate;
