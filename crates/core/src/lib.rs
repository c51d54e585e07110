//! inhook — a webhook receiver that is correct under retries, duplicates and
//! reordering. This crate is its core, embeddable (docs/library.md): the public API for a
//! Rust service is the facade in [`embed`], re-exported here ([`Settings`], [`Inhook`],
//! [`Builder`], [`Applied`], [`AppliedEvents`], [`Pending`]). The modules below are public
//! for the server binary, the tools and the test suite, and hidden from the documentation:
//! they may change between releases.
//!
//! The crate root is grouped by role, from the wire inwards:
//!
//! - [`http`]: the HTTP layer. `POST /webhooks/{source}` runs the checks of
//!   docs/contract.md in order; the read API (one module per resource) serves
//!   projections; the accept loop bounds connections; admin auth fails closed.
//!   Thin over the rest.
//! - [`ingress`]: what a delivery passes besides HTTP — the signature schemes, pure
//!   functions over raw bytes (one configurable HMAC the fixed HMAC schemes — the seeds',
//!   GitHub, Slack, Shopify — are aliases of; Stripe, Standard Webhooks, public keys,
//!   tokens; `aws-sns` alone waits, for the certificate it fetches); the publishers'
//!   endpoint handshakes, one module each behind one entry point; the presets; the headers
//!   kept; the peers believed.
//! - [`domain`]: what an event is and how it is decided, pure but for the clock — ids and statuses, one
//!   module per kind (`presence`, `save`, `json`: contract, rules, projection, delivery
//!   order, views) behind the `Kind` trait, the ordering rules (latest-wins, in-order with
//!   holds and skipped gaps, order-free), the retry policy, search pointers, masking,
//!   sealing at rest, the clock.
//! - [`store`]: the store by role — `EventLog` for ingress, `Settling` for workers,
//!   `DeliveryQueue` for senders, `Reads` and `Repairs` for the API, `Keys`, `Upkeep`,
//!   `Figures`, `AlertLog` — each caller given only its own (`Store` is all of them, for
//!   the wiring); one implementation of their flows over a small backend, SQLite or
//!   PostgreSQL.
//! - [`forward`]: forwarding to `[[destinations]]` (docs/forwarding.md): its pure rules,
//!   the sender, one module per destination type (their settings are read in [`config`],
//!   their queue's flows in [`store`]).
//! - [`runtime`]: the wiring of a node, the workers, bulk replays.
//! - [`operations`]: metrics, figures over time, alerts, logs and traces.
//! - [`config`]: the configuration (docs/configuration.md), its loading and reload.
//! - [`outbound`]: the one TLS setup of every outbound HTTP client (forwarding, the SNS
//!   certificates, alert notices, the command line), a leaf every layer may use.
//! - [`embed`]: the facade above.

#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod domain;
pub mod embed;
#[doc(hidden)]
pub mod forward;
#[doc(hidden)]
pub mod http;
#[doc(hidden)]
pub mod ingress;
#[doc(hidden)]
pub mod operations;
#[doc(hidden)]
pub mod outbound;
#[doc(hidden)]
pub mod runtime;
#[doc(hidden)]
pub mod store;

pub use embed::{Applied, AppliedEvents, Builder, Inhook, Pending, Settings};
