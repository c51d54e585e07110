//! `inhook simulate` (docs/api.md, command line): a chaos publisher. It generates a contiguous
//! event stream over presence users and save slots (or, with `--source`, over
//! a `json` source's aggregates, written at the source's locations), works out
//! the in-order state with the library's own code, delivers the stream the way
//! real publishers do (duplicates, reordering, concurrent senders, resends,
//! retries until 2xx), then reads the state back through the API and reports
//! every aggregate that differs.
//!
//! The stream, the chaos plan and the expected state are pure functions of
//! the seed; only [`Publisher`] does I/O, so tests can drive it in-process
//! (the crash test points it at a restarted server through [`Endpoint`]).
//!
//! The parts, in the order a run uses them:
//! - `args`: the command's options and their check;
//! - `stream`: the generated events, pure from the seed;
//! - `json_body`: a `json` source's events instead, written at its configured locations;
//! - `expected`: the state applying them once, in order, gives;
//! - `chaos`: the delivery plan (duplicates, reordering, resends), pure from the seed;
//! - `retry_policy`: which answers are retried and after how long, pure;
//! - `publisher`: signing and sending the plan, with retries;
//! - `convergence`: reading the state back until it matches;
//! - `report` and `command`: the printed report, and the run that ties it all together.

mod args;
mod chaos;
mod command;
mod convergence;
mod expected;
mod json_body;
mod place;
mod publisher;
mod report;
mod retry_policy;
mod stream;

pub use args::SimulateArgs;
pub use chaos::{plan, ChaosSpec, Delivery, EventCopy, Plan};
pub use command::run;
pub use convergence::Mismatch;
pub use expected::{expected_json_states, expected_states, Expected};
pub use json_body::{generate_json, JsonTarget, SequenceFormat};
pub use place::Place;
pub use publisher::{
    DeliveryReport, Endpoint, Publisher, Receipt, SendOptions, SourceSigner, Tally,
};
pub use stream::{generate, Aggregate, AggregateRef, Stream, StreamEvent, StreamSpec};
