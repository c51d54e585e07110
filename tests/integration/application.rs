//! A stand-in for the user's application that forwarding tests point destinations at: a
//! real axum server that verifies every request, records what it accepted, counts requests
//! of one aggregate on the wire at once, and fails at random (docs/contract.md's (forwarding)
//! failure modes).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use inhook::ingress::signature::Secret;

use crate::support::now_s;

/// The aggregate every request of which is answered 500.
pub const POISON: &str = "slot_poison";
/// The destination's secret.
pub const DEST_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// How the application misbehaves.
#[derive(Clone, Copy)]
pub struct Behaviour {
    /// Share of requests failed (at most twice per event): 3/7 of them 500, 3/7 429 +
    /// `Retry-After: 1`, 1/7 answered after the sender's 1 s `timeout_s`.
    pub fail_rate: f64,
    /// Up to this many milliseconds (at random) before a request is accepted, so that
    /// requests stay on the wire a while (a SIGKILL then finds some there).
    pub accept_delay_ms: u64,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            fail_rate: 0.35,
            accept_delay_ms: 0,
        }
    }
}

/// What the application saw.
#[derive(Default)]
pub struct Seen {
    /// How it answers.
    pub behaviour: Behaviour,
    /// Requests received, all answers included.
    pub requests: usize,
    /// Answers by kind: 500, 429, slow (answered after `timeout_s`).
    pub failures: [usize; 3],
    /// Requests that arrived while another of their aggregate was still in flight.
    pub overlaps: usize,
    /// Requests whose signature did not verify.
    pub bad_signatures: usize,
    /// Per aggregate, requests on the wire now.
    pub in_flight: HashMap<String, usize>,
    /// Requests on the wire now: (event id, `node` query parameter of the URL).
    pub on_the_wire: Vec<(String, String)>,
    /// Per aggregate, the accepted (2xx) requests: (event id, body).
    pub accepted: HashMap<String, Vec<(String, Vec<u8>)>>,
    /// Per event id, every `webhook-id` it came with.
    pub webhook_ids: HashMap<String, HashSet<String>>,
    /// Per event id, requests received.
    pub requested: HashMap<String, usize>,
    /// Per event id, failures answered so far (at most two, so that a normal event always arrives).
    pub failed: HashMap<String, usize>,
    /// Per event id, when it was last answered 429 with `Retry-After: 1`.
    pub throttled_at: HashMap<String, std::time::Instant>,
    /// Requests that came back sooner than the `Retry-After` they were given.
    pub too_soon: usize,
    /// Whether [`POISON`]'s aggregate is accepted now (the application was fixed).
    pub cured: bool,
    /// Per `node` query parameter, requests received.
    pub by_node: HashMap<String, usize>,
    /// The node whose next request to accept is held on the wire for [`STALL_MS`] first.
    pub stall_node: Option<String>,
    /// The event of the request so held, once it arrived.
    pub stalled: Option<String>,
}

/// How long the request of [`Seen::stall_node`] is held: a kill meanwhile surely cuts it.
pub const STALL_MS: u64 = 800;

impl Seen {
    /// A fresh record for an application behaving as `behaviour`.
    pub fn behaving(behaviour: Behaviour) -> Arc<Mutex<Self>> {
        Arc::new(Mutex::new(Self {
            behaviour,
            ..Self::default()
        }))
    }

    /// Per event id, how many times it was accepted.
    pub fn acceptances(&self) -> HashMap<&str, usize> {
        let mut count: HashMap<&str, usize> = HashMap::new();
        for (event_id, _) in self.accepted.values().flatten() {
            *count.entry(event_id.as_str()).or_default() += 1;
        }
        count
    }
}

/// Leaves the in-flight counts when a request ends, however it ends.
struct InFlight {
    seen: Arc<Mutex<Seen>>,
    aggregate: String,
    wire: (String, String),
    ended: bool,
}

impl InFlight {
    fn end(&mut self) {
        if !self.ended {
            self.ended = true;
            let mut seen = self.seen.lock().unwrap();
            *seen.in_flight.entry(self.aggregate.clone()).or_default() -= 1;
            if let Some(at) = seen.on_the_wire.iter().position(|w| *w == self.wire) {
                seen.on_the_wire.swap_remove(at);
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.end();
    }
}

/// The application's one route: verifies, counts overlaps, fails at random (at most twice
/// per event) as [`Behaviour`] says, and always with 500 for [`POISON`]'s aggregate. A
/// `node` query parameter names the sending node in [`Seen::on_the_wire`].
pub async fn destination(
    axum::extract::State(seen): axum::extract::State<Arc<Mutex<Seen>>>,
    query: axum::extract::RawQuery,
    headers: axum::http::HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (aggregate, event_id) = (header("inhook-aggregate"), header("inhook-event-id"));
    let node = query
        .0
        .as_deref()
        .and_then(|q| q.strip_prefix("node="))
        .unwrap_or_default()
        .to_owned();
    let verified = inhook::ingress::signature::verify(
        inhook::ingress::signature::Scheme::StandardWebhooks,
        &headers,
        &body,
        &[Secret::new(DEST_SECRET)],
        now_s(),
        300,
    )
    .is_ok();
    let draw: f64 = rand::random();
    let (answer, delay_ms) = {
        let mut seen = seen.lock().unwrap();
        seen.requests += 1;
        *seen.requested.entry(event_id.clone()).or_default() += 1;
        if !verified {
            seen.bad_signatures += 1;
        }
        seen.webhook_ids
            .entry(event_id.clone())
            .or_default()
            .insert(header("webhook-id"));
        let flying = seen.in_flight.entry(aggregate.clone()).or_default();
        *flying += 1;
        if *flying > 1 {
            seen.overlaps += 1;
        }
        seen.on_the_wire.push((event_id.clone(), node.clone()));
        *seen.by_node.entry(node.clone()).or_default() += 1;
        if let Some(at) = seen.throttled_at.remove(&event_id) {
            if at.elapsed() < std::time::Duration::from_millis(950) {
                seen.too_soon += 1;
            }
        }
        let (cured, rate) = (seen.cured, seen.behaviour.fail_rate);
        let failed = seen.failed.entry(event_id.clone()).or_default();
        let answer = if aggregate.ends_with(POISON) && !cured {
            0
        } else if *failed >= 2 || draw >= rate {
            3
        } else if draw < rate * 3.0 / 7.0 {
            0
        } else if draw < rate * 6.0 / 7.0 {
            1
        } else {
            2
        };
        if answer < 3 {
            *failed += 1;
            seen.failures[answer] += 1;
        }
        if answer == 1 {
            seen.throttled_at
                .insert(event_id.clone(), std::time::Instant::now());
        }
        let most = seen.behaviour.accept_delay_ms;
        let mut delay = (most > 0).then(|| rand::random::<u64>() % most);
        if answer == 3 && seen.stall_node.as_deref() == Some(node.as_str()) {
            seen.stall_node = None;
            seen.stalled = Some(event_id.clone());
            delay = Some(STALL_MS);
        }
        (answer, delay)
    };
    let mut flight = InFlight {
        seen: Arc::clone(&seen),
        aggregate: aggregate.clone(),
        wire: (event_id.clone(), node),
        ended: false,
    };
    match answer {
        0 => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        1 => (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "1")]).into_response(),
        2 => {
            // Out of flight just before the sender's 1 s timeout can have run out (it started
            // no later than this request arrived), then answered too late to count.
            tokio::time::sleep(std::time::Duration::from_millis(900)).await;
            flight.end();
            tokio::time::sleep(std::time::Duration::from_millis(700)).await;
            StatusCode::OK.into_response()
        }
        _ => {
            if let Some(ms) = delay_ms {
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            let mut seen = seen.lock().unwrap();
            seen.accepted
                .entry(aggregate)
                .or_default()
                .push((event_id, body.to_vec()));
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

/// Serves `app`, a test's stand-in for the user's application, on a free loopback port.
pub async fn serve_application(app: axum::Router) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// Serves [`destination`] at `/hooks`, recording into `seen`; answers the port.
pub async fn serve_recording(seen: &Arc<Mutex<Seen>>) -> u16 {
    serve_application(
        axum::Router::new()
            .route("/hooks", axum::routing::post(destination))
            .with_state(Arc::clone(seen)),
    )
    .await
}

/// The forwarded requests an application received: headers and body.
pub type Received = Arc<Mutex<Vec<(axum::http::HeaderMap, Vec<u8>)>>>;

/// Serves an application that records every request and answers 204; answers its port.
pub async fn recording_application(received: &Received) -> u16 {
    serve_application(
        axum::Router::new()
            .route(
                "/hooks",
                axum::routing::post(
                    |axum::extract::State(received): axum::extract::State<Received>,
                     headers: axum::http::HeaderMap,
                     body: axum::body::Bytes| async move {
                        received.lock().unwrap().push((headers, body.to_vec()));
                        axum::http::StatusCode::NO_CONTENT
                    },
                ),
            )
            .with_state(Arc::clone(received)),
    )
    .await
}
