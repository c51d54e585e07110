//! Forwarding applied events to the user's application (docs/forwarding.md), in one
//! home: pure rules the store and the sender build on, the sender, and the sinks. The
//! rules do no I/O: the store persists delivery rows in the decision's transaction and
//! asks them what to write; the sender asks what to send next and what an answer means.
//!
//! - [`select`]: which settled events produce a delivery for which destination,
//!   and how each delivery is ordered ([`crate::domain::kind::DeliveryOrder`]).
//! - [`message`]: a delivery's stable `webhook-id` and the signed request
//!   (Standard Webhooks headers, `inhook-*` headers, the body byte for byte).
//! - [`queue`]: per (destination, aggregate), which delivery may go now,
//!   what blocks, and what a replay or a skip does.
//! - [`answer`]: an attempt's result as delivered, retry at, or dead.
//! - [`circuit`]: the per-destination circuit breaker.
//! - [`sender`]: the I/O around these rules, one task per destination that claims, sends
//!   through its [`sink`] and records.
//! - [`sink`]: one module per destination `type` (HTTP, NATS, RabbitMQ, Redis, in process).
//!
//! A destination's configuration is [`crate::config::DestinationConfig`].

pub mod answer;
pub mod circuit;
pub mod message;
pub mod outbound;
pub mod queue;
pub mod select;
pub mod sender;
pub mod sink;
