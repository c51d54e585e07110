//! Forwarding applied events to the user's application (docs/forwarding.md), as pure
//! rules the store and the sender build on. No I/O here: the store persists delivery
//! rows in the decision's transaction and asks these modules what to write; the
//! sender asks what to send next and what an answer means.
//!
//! - [`select`]: which settled events produce a delivery for which destination,
//!   and how each delivery is ordered ([`crate::kind::DeliveryOrder`]).
//! - [`message`]: a delivery's stable `webhook-id` and the signed request
//!   (Standard Webhooks headers, `inhook-*` headers, the body byte for byte).
//! - [`queue`]: per (destination, aggregate), which delivery may go now,
//!   what blocks, and what a replay or a skip does.
//! - [`answer`]: an attempt's result as delivered, retry at, or dead.
//! - [`circuit`]: the per-destination circuit breaker.
//!
//! The I/O around these rules is [`crate::sender`]. A destination's configuration is [`crate::config::DestinationConfig`].

pub mod answer;
pub mod circuit;
pub mod message;
pub mod queue;
pub mod select;
