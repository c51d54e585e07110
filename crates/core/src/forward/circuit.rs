//! A destination's circuit breaker (docs/forwarding.md): after many failed requests in a
//! row across several aggregates, the destination is paused (open), probed with one
//! request after a pause that grows with each failed probe, and resumed (closed) on
//! a success. Failures of one aggregate alone never open it: a poison event must
//! not stop everyone else's. Nothing is lost while open; deliveries wait.
//!
//! A pure state machine; each node keeps one per destination.

/// When the circuit opens and how long it pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CircuitPolicy {
    /// Consecutive failed requests that open it.
    pub failures_to_open: u32,
    /// Distinct aggregates those failures must span (at least 2).
    pub distinct_aggregates: usize,
    /// The pause before the first probe, in milliseconds.
    pub first_pause_ms: i64,
    /// The longest pause, in milliseconds (each failed probe doubles it up to this).
    pub max_pause_ms: i64,
}

impl Default for CircuitPolicy {
    /// Ten failures in a row over three aggregates; probes after 5 s, doubling up to 5 min.
    fn default() -> Self {
        Self {
            failures_to_open: 10,
            distinct_aggregates: 3,
            first_pause_ms: 5_000,
            max_pause_ms: 300_000,
        }
    }
}

/// The breaker's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CircuitState {
    /// Requests flow.
    Closed,
    /// Paused until this time (unix milliseconds), then one probe.
    Open {
        /// When the probe may go.
        until_ms: i64,
    },
    /// The probe is on the wire; nothing else goes until it is answered.
    Probing,
}

/// Whether a request may go now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    /// Send it.
    Send,
    /// Send it as the one probe; its result closes or reopens the circuit.
    Probe,
    /// Hold it; until this time, or until the probe is answered (`None`).
    Wait(Option<i64>),
}

/// One destination's breaker.
#[derive(Debug, Clone)]
pub struct Circuit {
    policy: CircuitPolicy,
    state: CircuitState,
    failures: u32,
    /// The distinct aggregates of the current run of failures, up to the number needed.
    failing: Vec<String>,
    pause_ms: i64,
}

impl Circuit {
    /// A closed circuit; `distinct_aggregates` below 2 is raised to 2.
    pub fn new(policy: CircuitPolicy) -> Self {
        let policy = CircuitPolicy {
            distinct_aggregates: policy.distinct_aggregates.max(2),
            failures_to_open: policy.failures_to_open.max(1),
            ..policy
        };
        Self {
            state: CircuitState::Closed,
            failures: 0,
            failing: Vec::new(),
            pause_ms: policy.first_pause_ms,
            policy,
        }
    }

    /// The breaker's position, for `GET /v1/destinations` and the metric.
    pub fn state(&self) -> CircuitState {
        self.state
    }

    /// Whether a request may go at `now_ms`; an open circuit whose pause is over lets one probe go.
    pub fn permit(&mut self, now_ms: i64) -> Permit {
        match self.state {
            CircuitState::Closed => Permit::Send,
            CircuitState::Probing => Permit::Wait(None),
            CircuitState::Open { until_ms } if now_ms < until_ms => Permit::Wait(Some(until_ms)),
            CircuitState::Open { .. } => {
                self.state = CircuitState::Probing;
                Permit::Probe
            }
        }
    }

    /// Failed requests in a row since the last success (the `destination_failing` alert).
    pub fn failures(&self) -> u32 {
        self.failures
    }

    /// A request was answered 2xx: the destination is up.
    pub fn on_success(&mut self) {
        self.state = CircuitState::Closed;
        self.failures = 0;
        self.failing.clear();
        self.pause_ms = self.policy.first_pause_ms;
    }

    /// A request for `aggregate` failed at `now_ms` (a 5xx, a 429, a timeout, no connection).
    pub fn on_failure(&mut self, aggregate: &str, now_ms: i64) {
        match self.state {
            CircuitState::Probing => {
                self.pause_ms = self
                    .pause_ms
                    .saturating_mul(2)
                    .min(self.policy.max_pause_ms);
                self.state = CircuitState::Open {
                    until_ms: now_ms.saturating_add(self.pause_ms),
                };
            }
            // A request sent before the circuit opened: already counted as down.
            CircuitState::Open { .. } => {}
            CircuitState::Closed => {
                self.failures = self.failures.saturating_add(1);
                if self.failing.len() < self.policy.distinct_aggregates
                    && !self.failing.iter().any(|a| a == aggregate)
                {
                    self.failing.push(aggregate.to_owned());
                }
                if self.failures >= self.policy.failures_to_open
                    && self.failing.len() >= self.policy.distinct_aggregates
                {
                    self.pause_ms = self.policy.first_pause_ms;
                    self.state = CircuitState::Open {
                        until_ms: now_ms.saturating_add(self.pause_ms),
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const POLICY: CircuitPolicy = CircuitPolicy {
        failures_to_open: 4,
        distinct_aggregates: 2,
        first_pause_ms: 1_000,
        max_pause_ms: 3_000,
    };

    #[test]
    fn it_opens_probes_with_growing_pauses_and_closes_on_success() {
        let mut circuit = Circuit::new(POLICY);
        for (i, aggregate) in ["a", "b", "a"].into_iter().enumerate() {
            circuit.on_failure(aggregate, i as i64);
            assert_eq!(circuit.permit(i as i64), Permit::Send);
        }
        circuit.on_failure("b", 10);
        assert_eq!(circuit.state(), CircuitState::Open { until_ms: 1_010 });
        assert_eq!(circuit.permit(1_009), Permit::Wait(Some(1_010)));
        assert_eq!(circuit.permit(1_010), Permit::Probe);
        assert_eq!(
            circuit.permit(1_010),
            Permit::Wait(None),
            "one probe at a time"
        );
        circuit.on_failure("c", 1_100);
        assert_eq!(circuit.state(), CircuitState::Open { until_ms: 3_100 });
        assert_eq!(circuit.permit(3_100), Permit::Probe);
        circuit.on_failure("c", 3_200);
        assert_eq!(
            circuit.state(),
            CircuitState::Open { until_ms: 6_200 },
            "capped at 3 s"
        );
        assert_eq!(circuit.permit(6_200), Permit::Probe);
        circuit.on_success();
        assert_eq!(circuit.state(), CircuitState::Closed);
        assert_eq!(circuit.permit(6_201), Permit::Send);
        // Closed again, a new run of failures starts from scratch and from the first pause.
        for (i, aggregate) in ["x", "y", "x", "y"].into_iter().enumerate() {
            circuit.on_failure(aggregate, 7_000 + i as i64);
        }
        assert_eq!(circuit.state(), CircuitState::Open { until_ms: 8_003 });
    }

    #[test]
    fn a_success_breaks_the_run_and_one_aggregate_alone_never_opens_it() {
        let mut circuit = Circuit::new(POLICY);
        for aggregate in ["a", "b", "a"] {
            circuit.on_failure(aggregate, 0);
        }
        circuit.on_success();
        circuit.on_failure("b", 0);
        assert_eq!(circuit.state(), CircuitState::Closed);
        let mut poisoned = Circuit::new(CircuitPolicy {
            distinct_aggregates: 1,
            ..POLICY
        });
        for now in 0..1_000 {
            poisoned.on_failure("poison", now);
        }
        assert_eq!(
            poisoned.state(),
            CircuitState::Closed,
            "at least two aggregates, always"
        );
    }

    proptest! {
        #[test]
        fn only_failures_across_aggregates_open_it_and_an_open_one_sends_nothing(
            results in prop::collection::vec((0u8..4, any::<bool>()), 0..200),
        ) {
            let mut circuit = Circuit::new(POLICY);
            let mut run: Vec<u8> = Vec::new();
            let mut now = 0i64;
            for (aggregate, ok) in results {
                now += 100;
                let permit = circuit.permit(now);
                if let CircuitState::Open { until_ms } = circuit.state() {
                    prop_assert_eq!(permit, Permit::Wait(Some(until_ms)));
                    prop_assert!(until_ms > now);
                    continue;
                }
                if permit == Permit::Wait(None) {
                    prop_assert_eq!(circuit.state(), CircuitState::Probing);
                }
                let was_closed = permit == Permit::Send;
                if ok {
                    circuit.on_success();
                    run.clear();
                    prop_assert_eq!(circuit.state(), CircuitState::Closed);
                } else {
                    circuit.on_failure(&aggregate.to_string(), now);
                    if was_closed {
                        run.push(aggregate);
                        let mut distinct = run.clone();
                        distinct.sort_unstable();
                        distinct.dedup();
                        let should_open = run.len() >= 4 && distinct.len() >= 2;
                        prop_assert_eq!(circuit.state() != CircuitState::Closed, should_open);
                        if should_open {
                            run.clear();
                        }
                    } else {
                        let open = matches!(circuit.state(), CircuitState::Open { .. });
                        prop_assert!(open);
                    }
                }
            }
        }
    }
}
