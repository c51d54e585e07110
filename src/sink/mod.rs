//! Where forwarded events go (docs/contract.md, forwarding): one module per destination type,
//! each behind [`Sink`]. The sender's loop (claims under a lease, the circuit, verdicts)
//! and the store do not know the type; a sink only sends one message and says how the
//! attempt ended.

pub mod http;

use std::time::Duration;

use crate::forward::answer::AttemptResult;

/// One forwarded event as a sink sends it: its signed headers (Standard Webhooks and
/// `inhook-*`) and its body, byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The headers, names lower case, values already encoded for the wire.
    pub headers: Vec<(&'static str, String)>,
    /// The event's raw body.
    pub body: Vec<u8>,
}

/// A message that cannot be sent at all: a bug, reported (and the delivery given up)
/// rather than sent unsigned or altered. Never holds a header's value.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Unsendable(pub String);

/// One destination's transport.
#[async_trait::async_trait]
pub trait Sink: Send + Sync + std::fmt::Debug {
    /// Sends `message`, ending within `limit`; how the attempt ended, or why the message
    /// cannot be sent at all.
    async fn send(&self, message: Outgoing, limit: Duration) -> Result<AttemptResult, Unsendable>;
}
