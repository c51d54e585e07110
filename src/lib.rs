//! inhook — a webhook receiver that is correct under retries, duplicates and
//! reordering. A map of the crate, from the wire inwards:
//!
//! - [`http`]: the HTTP layer. `POST /webhooks/{source}` runs the checks of
//!   docs/contract.md in order; the read API (one module per resource) serves
//!   projections; the accept loop bounds connections; admin auth fails closed.
//!   Thin over the rest. [`log_throttle`] keeps its noisy warnings to one a period.
//! - [`signature`]: signature schemes, pure functions over raw bytes: one configurable
//!   HMAC the fixed HMAC schemes (the seeds', GitHub, Slack, Shopify) are aliases of,
//!   Stripe, Standard Webhooks, public keys, tokens; `aws-sns` alone waits, for the
//!   certificate it fetches.
//! - [`handshake`]: the publishers' endpoint handshakes, one module each, behind one entry
//!   point the HTTP layer calls.
//! - [`kind`]: one module per kind (`presence`, `save`, `json`), each holding its contract
//!   (raw body to a typed event), its rules, its projection, its defaults, its delivery order
//!   and its views, behind the [`kind::Kind`] trait; nothing outside names a kind.
//! - [`contract`]: what the kinds' contracts share: the named problems of a 400 and the
//!   field readers.
//! - [`ordering`]: the ordering rules (latest-wins, in-order with holds and skipped gaps,
//!   order-free) as pure functions from state and pending events to decisions.
//! - [`store`]: the store by role — [`store::EventLog`] for ingress, [`store::Settling`]
//!   for workers, [`store::DeliveryQueue`] for senders, [`store::Reads`] and
//!   [`store::Repairs`] for the API, [`store::Keys`], [`store::Upkeep`],
//!   [`store::Figures`], [`store::AlertLog`] — each caller given only its own
//!   ([`store::Store`] is all of them, for the wiring); one implementation of their flows
//!   over a small backend, SQLite or PostgreSQL (over TLS).
//! - [`forward`]: forwarding to `[[destinations]]` (docs/forwarding.md), in one home: what
//!   is sent, in which order, signed how, and what an answer means (pure rules); the
//!   sender, one task per destination that claims, sends through its sink (one module
//!   per destination type) and records.
//! - [`mask`]: `mask_fields` applied to anything inhook shows; [`kept_headers`]: which request
//!   headers are kept with an event and shown.
//! - [`outbound`]: the one TLS setup of every outbound HTTP client (forwarder and CLI).
//! - [`worker`]: applies async events by settling due aggregates; [`replays`]: one task
//!   that steps every bulk replay, of events and of deliveries.
//! - [`config`], [`app`], [`cli`]: configuration, wiring, and the command line, one module per
//!   command.
//! - `tools` (the cargo feature `tools`, on by default): the load generator of `inhook bench`
//!   and the chaos publisher of `inhook simulate`, which checks the above end to end; the
//!   core does not depend on them.
//! - [`encryption`]: encryption at rest (docs/encryption.md): master keys, per-aggregate data
//!   keys, sealing bound to a row; pure, the store holds the keys.
//! - [`presets`]: the publishers' presets (docs/providers.md), one TOML table each, merged
//!   under a source that names one.
//! - [`alerts`]: `[[alerts]]` rules (pure evaluation in `alerts::rules`), the task that
//!   gathers their figures each tick, and the channels notices go out on.
//! - [`stats`]: figures over time, counted per minute in memory and flushed to the store.
//! - [`domain`]: ids, sequences, statuses shared by all of the above.
//! - [`embed`]: the public facade for a Rust service that mounts the receiver on its own
//!   axum `Router` and consumes applied events in process (docs/library.md), re-exported
//!   here: [`Settings`], [`Inhook`], [`Builder`], [`Applied`], [`AppliedEvents`], [`Pending`].

pub mod alerts;
pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod contract;
pub mod domain;
pub mod embed;
pub mod encryption;
pub mod forward;
pub mod handshake;
pub mod http;
pub mod kept_headers;
pub mod kind;
pub mod log_throttle;
pub mod mask;
pub mod metrics;
pub mod ordering;
pub mod outbound;
pub mod peers;
pub mod presets;
pub mod replays;
pub mod retry;
pub mod search;
pub mod signature;
pub mod stats;
pub mod store;
pub mod telemetry;
#[cfg(feature = "tools")]
pub mod tools;
pub mod worker;

pub use embed::{Applied, AppliedEvents, Builder, Inhook, Pending, Settings};
