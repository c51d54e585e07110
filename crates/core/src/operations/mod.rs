//! What the operator sees of a running node: metrics ([`metrics`]), figures over time
//! ([`stats`]), alert rules and their notices ([`alerts`]), logs and traces ([`telemetry`],
//! [`log_throttle`]).

pub mod alerts;
pub mod log_throttle;
pub mod metrics;
pub mod stats;
pub mod telemetry;
