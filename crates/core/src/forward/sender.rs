//! The sender (docs/forwarding.md): one task per destination claims the deliveries the
//! store's queue rules let go (one per aggregate at a time, in applied order), POSTs each
//! event's body byte for byte, signed, and records the verdict. The rules live in the
//! pure modules of [`crate::forward`]; this is the thin I/O layer around them.
//!
//! A claim leases a delivery to this node for longer than a request may take, so a
//! node that dies mid-request leaves it to be claimed again (same `webhook-id`).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tracing::{debug, error, warn};

use crate::config::template::Placed;
use crate::config::DestinationConfig;
use crate::domain::clock::pause;
use crate::domain::clock::Clock;
use crate::domain::contract::body::BodyFormat;
use crate::domain::AggregateKey;
use crate::forward::answer::{judge, AttemptRecord, Verdict};
use crate::forward::circuit::{Circuit, CircuitPolicy, CircuitState};
use crate::forward::message::{request_headers, ForwardedEvent, WebhookId};
use crate::forward::sink::{Outgoing, Sink, SinkError, Sinks, Unready};
use crate::store::{DeliveryQueue, DeliveryRecord, PendingVerdict, Store};

/// How long an idle destination waits before looking for due deliveries unasked, unless
/// configured (`forward_poll_ms`): only a safety net, since commits writing deliveries,
/// finished requests and retries falling due wake it.
pub const DEFAULT_POLL: Duration =
    Duration::from_millis(crate::config::processing::FORWARD_POLL_MS);
/// Verdicts written in one transaction at most.
const VERDICT_BATCH: usize = 256;
/// Pause after a store failure before trying again.
const STORE_BACKOFF: Duration = Duration::from_secs(1);

/// Why the senders of the configured destinations could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("destination {destination:?}")]
pub struct SendersError {
    /// The destination whose sink failed.
    pub destination: String,
    /// Why it failed (boxed: a rare error need not widen every `Result`).
    #[source]
    pub source: Box<SinkError>,
}

/// A name for this process in delivery leases: unique per start, so that a restarted
/// node never mistakes its predecessor's leases for its own.
pub fn node_id() -> String {
    format!("node-{}-{:016x}", std::process::id(), rand::random::<u64>())
}

/// Requests per second at most: a token bucket holding one second's worth.
#[derive(Debug, Clone)]
pub struct RateLimit {
    per_s: f64,
    tokens: f64,
    at_ms: i64,
}

impl RateLimit {
    /// A full bucket of `per_s` tokens at `now_ms`.
    pub fn new(per_s: u32, now_ms: i64) -> Self {
        Self {
            per_s: f64::from(per_s.max(1)),
            tokens: f64::from(per_s.max(1)),
            at_ms: now_ms,
        }
    }

    /// Takes up to `want` whole tokens at `now_ms`; answers how many it took.
    pub fn take(&mut self, want: usize, now_ms: i64) -> usize {
        let elapsed_s = (now_ms - self.at_ms).max(0) as f64 / 1000.0;
        self.tokens = (self.tokens + elapsed_s * self.per_s).min(self.per_s);
        self.at_ms = now_ms.max(self.at_ms);
        let took = (self.tokens.floor() as usize).min(want);
        self.tokens -= took as f64;
        took
    }

    /// Milliseconds between two tokens, at least 1.
    pub fn token_ms(&self) -> i64 {
        ((1000.0 / self.per_s).ceil() as i64).max(1)
    }

    /// Gives back `n` tokens taken but not used (fewer deliveries were due).
    pub fn give_back(&mut self, n: usize) {
        self.tokens = (self.tokens + n as f64).min(self.per_s);
    }
}

/// What one destination's task needs.
#[derive(Clone)]
pub struct Sender {
    /// The destination.
    pub destination: Arc<DestinationConfig>,
    /// The store holding its deliveries, as a sender works them.
    pub store: Arc<dyn DeliveryQueue>,
    /// Where its deliveries go: the destination's transport.
    pub sink: Arc<dyn Sink>,
    /// This node's name in leases.
    pub node_id: Arc<str>,
    /// Where "now" comes from.
    pub clock: Clock,
    /// Woken when deliveries may have become due (a store notification, a finished request).
    pub wake: Arc<Notify>,
    /// Rung to wake every sender of this node (a bulk replay may requeue another
    /// destination's deliveries); [`Sender::run_all`] shares its own.
    pub bell: Arc<Notify>,
    /// How long an idle sender waits unasked at most ([`DEFAULT_POLL`] unless configured).
    pub poll: Duration,
    /// This node's circuit breaker for the destination, also read by `GET /v1/destinations`.
    pub circuit: Arc<Mutex<Circuit>>,
    /// The secrets in force: each attempt is signed with the destination's secret of the
    /// moment, so a reload rotates it from the next attempt on.
    pub secrets: crate::config::LiveSecrets,
    /// Each form source's media type, by source name; an event of any other source is
    /// forwarded as `application/json` (docs/configuration.md, `body_format`).
    pub media_types: Arc<std::collections::HashMap<String, &'static str>>,
}

/// A finished request's verdict on its way to the recorder, which writes those waiting
/// in one transaction. Its request slot is free already: `concurrency` counts requests
/// on the wire, and other aggregates need not wait for this one's verdict to be written.
struct Finished {
    delivery: DeliveryRecord,
    verdict: Verdict,
    attempt: AttemptRecord,
    /// The `outcome` label of `inhook_forward_attempts_total`.
    outcome: &'static str,
    at_ms: i64,
}

/// Why a sender's round claimed fewer deliveries than it had room for.
#[derive(Debug, Clone, Copy)]
struct Idle {
    /// Deliveries it could have taken before the claim: free request slots plus room in
    /// the buffer.
    room: usize,
    /// The circuit's position at the claim.
    state: CircuitState,
    /// The rate limit granted fewer than there was room for.
    rate_short: bool,
    /// When the oldest buffered delivery stops being sendable, to give it back in time.
    ready_until_ms: Option<i64>,
}

/// A sender's deliveries claimed ahead of its free request slots, oldest claim first: each
/// leased to this node and counted as an attempt, none on the wire yet.
struct Ready {
    queue: Mutex<VecDeque<DeliveryRecord>>,
    /// The lease one must have left to be sent ([`Sender::ready_lease_ms`]).
    min_lease_ms: i64,
}

impl Ready {
    /// An empty buffer whose deliveries go only with `min_lease_ms` of their lease left.
    fn new(min_lease_ms: i64) -> Self {
        Self {
            queue: Mutex::new(VecDeque::new()),
            min_lease_ms,
        }
    }

    /// Deliveries buffered.
    fn len(&self) -> usize {
        self.queue.lock().expect("ready").len()
    }

    /// Buffers `delivery`, in place of an older copy of it (a claim of its own expired lease).
    fn push(&self, delivery: DeliveryRecord) {
        let mut queue = self.queue.lock().expect("ready");
        queue.retain(|d| d.id != delivery.id);
        queue.push_back(delivery);
    }

    /// Whether `delivery` still has the lease to be sent at `now_ms`.
    fn sendable(&self, delivery: &DeliveryRecord, now_ms: i64) -> bool {
        delivery
            .lease_until_ms
            .is_some_and(|until| until.saturating_sub(now_ms) >= self.min_lease_ms)
    }

    /// The next delivery to send at `now_ms`: none while the circuit is not closed or
    /// shutdown has begun (the loop gives them back), or when the oldest waited too long.
    fn take(
        &self,
        circuit: &Mutex<Circuit>,
        shutdown: &watch::Receiver<bool>,
        now_ms: i64,
    ) -> Option<DeliveryRecord> {
        let mut queue = self.queue.lock().expect("ready");
        let sendable = queue.front().is_some_and(|d| self.sendable(d, now_ms))
            && !*shutdown.borrow()
            && circuit.lock().expect("circuit").state() == CircuitState::Closed;
        if sendable {
            queue.pop_front()
        } else {
            None
        }
    }

    /// Takes out what may not be sent at `now_ms`: everything unless the circuit is
    /// closed (it opened: nothing more goes until a probe closes it), else those that
    /// waited too long.
    fn take_unsendable(&self, state: CircuitState, now_ms: i64) -> Vec<DeliveryRecord> {
        let mut queue = self.queue.lock().expect("ready");
        if state != CircuitState::Closed {
            return queue.drain(..).collect();
        }
        let (keep, stale): (VecDeque<_>, VecDeque<_>) =
            queue.drain(..).partition(|d| self.sendable(d, now_ms));
        *queue = keep;
        stale.into()
    }

    /// Takes out every buffered delivery.
    fn take_all(&self) -> Vec<DeliveryRecord> {
        self.queue.lock().expect("ready").drain(..).collect()
    }

    /// When the oldest buffered delivery stops being sendable.
    fn sendable_until_ms(&self) -> Option<i64> {
        let queue = self.queue.lock().expect("ready");
        queue
            .iter()
            .filter_map(|d| d.lease_until_ms)
            .min()
            .map(|until| until.saturating_sub(self.min_lease_ms))
    }
}

/// Each destination's circuit breaker on this node, shared by its sender and the API.
#[derive(Clone, Default)]
pub struct Circuits(Arc<std::collections::HashMap<String, Arc<Mutex<Circuit>>>>);

impl Circuits {
    /// The breakers of `senders`.
    pub fn of(senders: &[Sender]) -> Self {
        Circuits(Arc::new(
            senders
                .iter()
                .map(|s| (s.destination.name.clone(), Arc::clone(&s.circuit)))
                .collect(),
        ))
    }

    /// The breaker's position for `destination` and its failed requests in a row; none when
    /// no sender runs for it here.
    pub fn watch(&self, destination: &str) -> Option<(CircuitState, u32)> {
        self.0.get(destination).map(|c| {
            let circuit = c.lock().expect("circuit");
            (circuit.state(), circuit.failures())
        })
    }

    /// The breaker's position for `destination`; none when no sender runs for it here.
    pub fn state(&self, destination: &str) -> Option<CircuitState> {
        self.0
            .get(destination)
            .map(|c| c.lock().expect("circuit").state())
    }
}

impl Sender {
    /// The sender of each destination of `destinations`, through its type's sink.
    pub fn for_destinations(
        destinations: &[DestinationConfig],
        store: &Arc<dyn Store>,
        clock: Clock,
        secrets: &crate::config::LiveSecrets,
    ) -> Result<Vec<Sender>, SendersError> {
        Self::for_destinations_with(destinations, store, clock, secrets, Sinks::default())
    }

    /// [`Sender::for_destinations`], building their sinks with `sinks` (which holds the
    /// consumers of in-process destinations).
    pub fn for_destinations_with(
        destinations: &[DestinationConfig],
        store: &Arc<dyn Store>,
        clock: Clock,
        secrets: &crate::config::LiveSecrets,
        mut sinks: Sinks,
    ) -> Result<Vec<Sender>, SendersError> {
        let node_id: Arc<str> = node_id().into();
        let mut senders = Vec::with_capacity(destinations.len());
        for destination in destinations {
            let sink = sinks
                .for_destination(destination)
                .map_err(|source| SendersError {
                    destination: destination.name.clone(),
                    source: Box::new(source),
                })?;
            senders.push(Sender {
                destination: Arc::new(destination.clone()),
                store: store.clone(),
                sink,
                node_id: Arc::clone(&node_id),
                clock,
                wake: Arc::new(Notify::new()),
                bell: Arc::new(Notify::new()),
                poll: DEFAULT_POLL,
                circuit: Arc::new(Mutex::new(Circuit::new(CircuitPolicy::default()))),
                secrets: secrets.clone(),
                media_types: Arc::default(),
            });
        }
        Ok(senders)
    }

    /// Tells every sender the media type of each source whose bodies are not JSON.
    pub fn set_media_types(senders: &mut [Sender], sources: &[crate::config::SourceConfig]) {
        let media_types: std::collections::HashMap<String, &'static str> = sources
            .iter()
            .filter_map(|source| {
                let format = source.kind.body_format();
                (format != BodyFormat::Json).then(|| (source.name.clone(), format.media_type()))
            })
            .collect();
        let media_types = Arc::new(media_types);
        for sender in senders {
            sender.media_types = Arc::clone(&media_types);
        }
    }

    /// Prepares every sender's sink at once (a broker's stream or exchange), each within its
    /// destination's `timeout_s`. Nothing stops the start (docs/forwarding.md, sinks): a broker
    /// that cannot be reached, or lacks what a key names, is logged, and its deliveries
    /// retry until it can take them.
    pub async fn prepare_all(senders: &[Sender]) {
        let prepared = futures_util::future::join_all(senders.iter().map(|sender| async move {
            let limit = Duration::from_secs(sender.destination.timeout_s);
            (sender, sender.sink.prepare(limit).await)
        }))
        .await;
        for (sender, prepared) in prepared {
            let name = &sender.destination.name;
            match prepared {
                Ok(()) => {}
                Err(Unready::Unreachable(problem)) => {
                    warn!(destination = %name, %problem,
                          "the destination cannot be reached yet; its deliveries retry until it can");
                }
                Err(missing @ Unready::Missing { .. }) => {
                    error!(destination = %name, problem = %missing,
                           "the destination cannot take messages; its deliveries retry until it can");
                }
            }
        }
    }

    /// Runs every sender of `senders` until `shutdown` turns true, waking each on `store_wake`
    /// (rung after a commit that wrote deliveries, here or, through the store, on another node).
    pub async fn run_all(
        senders: Vec<Sender>,
        store_wake: Arc<Notify>,
        shutdown: watch::Receiver<bool>,
    ) {
        let wakes: Vec<Arc<Notify>> = senders.iter().map(|s| Arc::clone(&s.wake)).collect();
        let mut tasks = JoinSet::new();
        for mut sender in senders {
            sender.bell = Arc::clone(&store_wake);
            tasks.spawn(sender.run(shutdown.clone()));
        }
        let mut stop = shutdown.clone();
        let fan_out = async {
            loop {
                store_wake.notified().await;
                for wake in &wakes {
                    wake.notify_one();
                }
            }
        };
        tokio::select! {
            () = fan_out => {}
            _ = stop.wait_for(|s| *s) => {}
        }
        while tasks.join_next().await.is_some() {}
    }

    /// Claims and sends this destination's deliveries until `shutdown` turns true, then
    /// gives back those claimed but not sent and waits for the requests on the wire (each
    /// bounded by `timeout_s`).
    ///
    /// While the circuit is closed it claims ahead of its free request slots, up to
    /// `concurrency` deliveries more ([`Ready`]): a slot whose request ends takes the next
    /// at once, and the claims, refilling the buffer in bigger rounds, stay out of each
    /// request's cycle. The store leases at most one delivery per aggregate, so a buffered
    /// one holds its aggregate's place and order is kept.
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let name = self.destination.name.clone();
        let concurrency = self.destination.concurrency.max(1);
        let slots = Arc::new(Semaphore::new(concurrency));
        let ready = Arc::new(Ready::new(self.ready_lease_ms()));
        let circuit = Arc::clone(&self.circuit);
        let mut rate = self
            .destination
            .rate_limit_per_s
            .map(|per_s| RateLimit::new(per_s, self.clock.now_ms()));
        let lease_ms = self.lease_ms();
        let mut requests = JoinSet::new();
        let (verdicts, finished) = mpsc::unbounded_channel();
        let recorder = tokio::spawn(self.clone().record_all(finished));
        let mut store_ok = true;
        while !*shutdown.borrow() {
            while requests.try_join_next().is_some() {}
            let now_ms = self.clock.now_ms();
            let state = circuit.lock().expect("circuit").state();
            let unsendable = ready.take_unsendable(state, now_ms);
            if !unsendable.is_empty() {
                if let Some(rate) = rate.as_mut() {
                    rate.give_back(unsendable.len());
                }
                self.release(unsendable, now_ms).await;
            }
            let mut free = slots.available_permits();
            // Free slots take what is buffered first: no claim stands between them and it.
            while free > 0 {
                let Some(delivery) = ready.take(&circuit, &shutdown, now_ms) else {
                    break;
                };
                let permit = Arc::clone(&slots)
                    .try_acquire_owned()
                    .expect("a slot was free");
                self.start(
                    &mut requests,
                    permit,
                    delivery,
                    &ready,
                    &verdicts,
                    &shutdown,
                );
                free -= 1;
            }
            let room = free + concurrency.saturating_sub(ready.len());
            let want = match state {
                CircuitState::Closed => room,
                // Claimed only for a free slot, never ahead: the buffer was given back.
                CircuitState::Open { until_ms } if now_ms >= until_ms => free.min(1),
                CircuitState::Open { .. } | CircuitState::Probing => 0,
            };
            let granted = match rate.as_mut() {
                Some(rate) => rate.take(want, now_ms),
                None => want,
            };
            let claimed = if granted == 0 {
                Vec::new()
            } else {
                match self
                    .store
                    .claim_deliveries(
                        &name,
                        &self.node_id,
                        now_ms,
                        now_ms.saturating_add(lease_ms),
                        granted,
                    )
                    .await
                {
                    Ok(claimed) => {
                        if !store_ok {
                            tracing::info!(destination = %name, "store reachable again; forwarding resumes");
                            store_ok = true;
                        }
                        claimed
                    }
                    Err(err) => {
                        if store_ok {
                            warn!(destination = %name, error = %err, "cannot claim deliveries; backing off");
                            store_ok = false;
                        }
                        if let Some(rate) = rate.as_mut() {
                            rate.give_back(granted);
                        }
                        pause(&mut shutdown, STORE_BACKOFF, None).await;
                        continue;
                    }
                }
            };
            if let Some(rate) = rate.as_mut() {
                rate.give_back(granted - claimed.len());
            }
            let got = claimed.len();
            let mut claimed = claimed.into_iter();
            // Slots freed during the claim are filled too; what is left waits in the buffer.
            for delivery in claimed.by_ref() {
                let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                    ready.push(delivery);
                    break;
                };
                // A request claimed while closed goes even if the circuit opened meanwhile:
                // its failure is then already counted as the destination being down.
                let _ = circuit.lock().expect("circuit").permit(now_ms);
                self.start(
                    &mut requests,
                    permit,
                    delivery,
                    &ready,
                    &verdicts,
                    &shutdown,
                );
            }
            claimed.for_each(|delivery| ready.push(delivery));
            if got == 0 || got < granted {
                let idle = Idle {
                    room,
                    state,
                    rate_short: got == granted && granted < want,
                    ready_until_ms: ready.sendable_until_ms(),
                };
                let wait = self.idle_wait(idle, rate.as_ref(), now_ms).await;
                pause(&mut shutdown, wait, Some(&self.wake)).await;
            }
        }
        // Given back first, so that another node (or this one restarted) sends them at once
        // while the requests on the wire finish.
        let unsent = ready.take_all();
        if !unsent.is_empty() {
            self.release(unsent, self.clock.now_ms()).await;
        }
        while requests.join_next().await.is_some() {}
        drop(verdicts);
        if let Err(err) = recorder.await {
            warn!(destination = %name, error = %err, "the verdict recorder failed");
        }
    }

    /// How long a claim leases a delivery: the request, then recording its verdict after
    /// it (the claim read the body), in milliseconds.
    fn lease_ms(&self) -> i64 {
        (self.destination.timeout_s as i64)
            .saturating_add(self.destination.lease_margin_s as i64)
            .saturating_mul(1000)
    }

    /// The lease a buffered delivery must have left to be sent: a whole request plus half
    /// the margin, so that waiting in the buffer never cuts a request short nor leaves its
    /// verdict less than half the margin to be recorded in.
    fn ready_lease_ms(&self) -> i64 {
        let margin_ms = (self.destination.lease_margin_s as i64).saturating_mul(1000);
        (self.destination.timeout_s as i64)
            .saturating_mul(1000)
            .saturating_add(margin_ms / 2)
    }

    /// Sends `delivery` in a request slot held by `permit`, then, in the same slot, the
    /// buffered deliveries that may go, one after another, until the buffer has none.
    fn start(
        &self,
        requests: &mut JoinSet<()>,
        permit: OwnedSemaphorePermit,
        delivery: DeliveryRecord,
        ready: &Arc<Ready>,
        verdicts: &mpsc::UnboundedSender<Finished>,
        shutdown: &watch::Receiver<bool>,
    ) {
        let sender = self.clone();
        let circuit = Arc::clone(&self.circuit);
        let (ready, verdicts, shutdown) = (Arc::clone(ready), verdicts.clone(), shutdown.clone());
        requests.spawn(async move {
            let mut next = Some(delivery);
            while let Some(mut delivery) = next {
                let done = sender.send(&mut delivery, &circuit).await;
                if let Some((verdict, attempt, outcome, at_ms)) = done {
                    // The recorder outlives every request, so the send cannot fail.
                    let _ = verdicts.send(Finished {
                        delivery,
                        verdict,
                        attempt,
                        outcome,
                        at_ms,
                    });
                }
                next = ready.take(&circuit, &shutdown, sender.clock.now_ms());
                // The loop refills the buffer, or fills the slot once this one leaves it.
                sender.wake.notify_one();
            }
            drop(permit);
            sender.wake.notify_one();
        });
    }

    /// Gives back `unsent`, claimed by this node but never sent; on failure they wait for
    /// their leases to run out.
    async fn release(&self, unsent: Vec<DeliveryRecord>, now_ms: i64) {
        let ids: Vec<i64> = unsent.iter().map(|d| d.id).collect();
        match self
            .store
            .release_deliveries(&self.node_id, &ids, now_ms)
            .await
        {
            Ok(released) => debug!(destination = %self.destination.name, claimed = ids.len(),
                                   released, "gave back deliveries claimed ahead"),
            Err(err) => warn!(destination = %self.destination.name, deliveries = ids.len(),
                              error = %err,
                              "cannot give back deliveries claimed ahead; sent when their leases run out"),
        }
    }

    /// Writes the verdicts of finished requests until every request's sender is gone: all
    /// those waiting at once in one transaction, then wakes the sender (their queues'
    /// next deliveries may go).
    async fn record_all(self, mut finished: mpsc::UnboundedReceiver<Finished>) {
        let mut batch = Vec::with_capacity(VERDICT_BATCH);
        while finished.recv_many(&mut batch, VERDICT_BATCH).await > 0 {
            self.record(&batch).await;
            batch.clear();
            self.wake.notify_one();
        }
    }

    /// How long to wait, unless woken, when nothing more may be claimed now: until the
    /// next thing that falls due by time (a retry, a lease, the circuit's next probe, a
    /// rate limit token, a buffered delivery to give back), or the poll. Finished
    /// requests and commits wake the sender.
    async fn idle_wait(&self, idle: Idle, rate: Option<&RateLimit>, now_ms: i64) -> Duration {
        let until = |at_ms: i64| {
            let ms = u64::try_from(at_ms.saturating_sub(now_ms)).unwrap_or(0);
            Duration::from_millis(ms).min(self.poll)
        };
        // A buffered delivery that waited too long is given back before its lease runs out.
        let wait = self.idle_wait_unbuffered(idle, rate, now_ms).await;
        idle.ready_until_ms
            .map_or(wait, |at_ms| wait.min(until(at_ms)))
    }

    /// [`Sender::idle_wait`] but for the buffer's deliveries.
    async fn idle_wait_unbuffered(
        &self,
        idle: Idle,
        rate: Option<&RateLimit>,
        now_ms: i64,
    ) -> Duration {
        let until = |at_ms: i64| {
            let ms = u64::try_from(at_ms.saturating_sub(now_ms)).unwrap_or(0);
            Duration::from_millis(ms).min(self.poll)
        };
        if idle.room == 0 {
            return self.poll;
        }
        match idle.state {
            CircuitState::Closed => {}
            CircuitState::Open { until_ms } if now_ms < until_ms => return until(until_ms),
            CircuitState::Open { .. } | CircuitState::Probing => return self.poll,
        }
        if let Some(rate) = rate.filter(|_| idle.rate_short) {
            return until(now_ms.saturating_add(rate.token_ms()));
        }
        match self
            .store
            .next_delivery_due(&self.destination.name, now_ms)
            .await
        {
            Ok(Some(at_ms)) => until(at_ms),
            Ok(None) => self.poll,
            Err(err) => {
                debug!(destination = %self.destination.name, error = %err,
                       "cannot read when a delivery falls due; polling");
                self.poll.min(STORE_BACKOFF)
            }
        }
    }

    /// Sends one claimed delivery; answers its verdict, the attempt, the attempt's outcome
    /// label and when it ended, or none when no request could go (the lease ran out).
    async fn send(
        &self,
        delivery: &mut DeliveryRecord,
        circuit: &Mutex<Circuit>,
    ) -> Option<(Verdict, AttemptRecord, &'static str, i64)> {
        let destination = &self.destination;
        let attempt = u32::try_from(delivery.attempts.max(1)).unwrap_or(u32::MAX);
        let at_ms = self.clock.now_ms();
        let dead = |error: String| {
            let record = AttemptRecord {
                attempt,
                at_ms,
                duration_ms: 0,
                status: None,
                result: error.clone(),
            };
            Some((Verdict::Dead { error }, record, "failed", at_ms))
        };
        let Some(body) = delivery.body.take() else {
            return dead("the event's body is no longer stored".to_owned());
        };
        let webhook_id = WebhookId::from_stored(delivery.webhook_id.clone());
        let aggregate = AggregateKey::text_of_stored(&delivery.aggregate);
        // The content type as received, kept with the event; else the source's media type
        // (events logged without it, or with a value cut at the kept length).
        let received_type =
            crate::ingress::kept_headers::received_content_type(delivery.event_headers.as_deref());
        let forwarded = ForwardedEvent {
            webhook_id: &webhook_id,
            source: &delivery.source,
            event_id: &delivery.event_id,
            event_type: &delivery.event_type,
            aggregate: &aggregate,
            sequence: delivery.sequence,
            body: &body,
            content_type: received_type.as_deref().unwrap_or_else(|| {
                self.media_types
                    .get(&delivery.source)
                    .copied()
                    .unwrap_or("application/json")
            }),
        };
        // A sink's messages are signed when its destination has a secret; a type that
        // requires one never goes unsigned.
        let secret = self
            .secrets
            .destination(&destination.name)
            .filter(|secret| !secret.expose().is_empty());
        if secret.is_none() && destination.target.requires_secret() {
            return dead("the destination has no secret in force".to_owned());
        }
        let headers = match request_headers(&forwarded, secret.as_ref(), attempt, at_ms / 1000) {
            Ok(headers) => headers,
            Err(problem) => return dead(format!("cannot build the request: {problem}")),
        };
        // The request must end while the lease holds: after it, another node may send this
        // delivery again, and two requests of one aggregate would be on the wire at once.
        let leased_ms = delivery
            .lease_until_ms
            .map_or(0, |until| until.saturating_sub(self.clock.now_ms()));
        let Some(limit) = request_limit(destination.timeout_s, leased_ms) else {
            warn!(destination = %destination.name, delivery = delivery.id,
                  "the lease ran out before the request could go; sent again when it is claimed");
            return None;
        };
        let started = Instant::now();
        let message = Outgoing {
            headers,
            body,
            placed: Placed {
                source: &delivery.source,
                aggregate: &aggregate,
                event_type: &delivery.event_type,
            },
            event_id: &delivery.event_id,
            sequence: delivery.sequence,
        };
        let result = match self.sink.send(message, limit).await {
            Ok(result) => result,
            Err(problem) => {
                warn!(destination = %destination.name, delivery = delivery.id, %problem,
                      "the message cannot be sent; the delivery is dead");
                return dead(problem.reason().to_owned());
            }
        };
        let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let done_ms = self.clock.now_ms();
        let verdict = judge(
            &result,
            attempt,
            &destination.retry,
            done_ms,
            rand::random::<f64>(),
        );
        {
            let mut circuit = circuit.lock().expect("circuit");
            // docs/contract.md "Circuit breaker": only a destination that is down or
            // overloaded pauses it; an application refusing an event (4xx other than 429)
            // answered, so it is up, and that event retries or dies on its own.
            match verdict {
                Verdict::Delivered => circuit.on_success(),
                _ if result.counts_against_circuit() => {
                    circuit.on_failure(&delivery.aggregate, done_ms)
                }
                _ => circuit.on_success(),
            }
        }
        let record = AttemptRecord::new(attempt, at_ms, duration_ms, &result);
        Some((verdict, record, result.outcome_label(), done_ms))
    }

    /// Records the attempts and verdicts of `batch` in one transaction, and counts them.
    async fn record(&self, batch: &[Finished]) {
        let name = &self.destination.name;
        for finished in batch {
            crate::operations::metrics::forward_attempt(name, finished.outcome);
        }
        let verdicts: Vec<PendingVerdict> = batch
            .iter()
            .map(|f| PendingVerdict {
                id: f.delivery.id,
                verdict: f.verdict.clone(),
                attempt: f.attempt.clone(),
                at_ms: f.at_ms,
            })
            .collect();
        let recorded = match self
            .store
            .record_delivery_attempts(&self.node_id, &verdicts)
            .await
        {
            Ok(recorded) => recorded,
            Err(err) => {
                warn!(destination = %name, deliveries = batch.len(), error = %err,
                      "cannot record delivery attempts; sent again when their leases run out");
                return;
            }
        };
        let now_ms = self.clock.now_ms();
        for (finished, recorded) in batch.iter().zip(recorded) {
            let delivery = &finished.delivery;
            if !recorded {
                debug!(destination = %name, delivery = delivery.id,
                       "lease taken over by another node; verdict not recorded");
                continue;
            }
            match &finished.verdict {
                Verdict::Delivered => {
                    let lag_ms = now_ms.saturating_sub(delivery.created_at_ms);
                    crate::operations::metrics::forward_lag(name, lag_ms);
                    crate::operations::stats::forwarded(
                        name,
                        crate::operations::stats::Forwarded::Delivered { lag_ms },
                    );
                }
                Verdict::Dead { error } => {
                    crate::operations::metrics::forward_dead(name);
                    crate::operations::stats::forwarded(
                        name,
                        crate::operations::stats::Forwarded::Dead,
                    );
                    warn!(destination = %name, delivery = delivery.id, source = %delivery.source,
                          event_id = %delivery.event_id, error = %error, "delivery dead");
                }
                Verdict::RetryAt { .. } => {
                    crate::operations::stats::forwarded(
                        name,
                        crate::operations::stats::Forwarded::Failed,
                    );
                }
            }
        }
    }
}

/// How long a request may take: `timeout_s`, cut to the `leased_ms` left of its lease so
/// that it never outlives it; none when too little is left to send it at all.
fn request_limit(timeout_s: u64, leased_ms: i64) -> Option<Duration> {
    let timeout = Duration::from_secs(timeout_s);
    let leased = Duration::from_millis(u64::try_from(leased_ms).ok()?);
    (leased >= MIN_REQUEST).then(|| timeout.min(leased))
}

/// The shortest request worth starting: less would time out before any answer could come.
const MIN_REQUEST: Duration = Duration::from_millis(100);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_limit_grants_a_second_s_worth_then_refills_with_time() {
        let mut rate = RateLimit::new(10, 0);
        assert_eq!(rate.take(32, 0), 10);
        assert_eq!(rate.take(32, 50), 0);
        assert_eq!(rate.take(32, 300), 3);
        rate.give_back(2);
        assert_eq!(rate.take(1, 300), 1);
        assert_eq!(rate.take(32, 300), 1);
        assert_eq!(
            rate.take(32, 60_000),
            10,
            "never more than one second's worth"
        );
    }

    #[test]
    fn a_request_never_outlives_its_lease() {
        let second = Duration::from_secs(1);
        assert_eq!(request_limit(1, 31_000), Some(second));
        assert_eq!(request_limit(10, 1_500), Some(Duration::from_millis(1_500)));
        assert_eq!(request_limit(10, 99), None);
        assert_eq!(request_limit(10, -5), None);
    }

    /// A delivery claimed with its lease running until `lease_until_ms`.
    fn leased(id: i64, lease_until_ms: i64) -> DeliveryRecord {
        DeliveryRecord {
            id,
            destination: "app".into(),
            source: "saves".into(),
            event_row: id,
            event_id: format!("e{id}"),
            aggregate: format!("a{id}"),
            sequence: 1,
            event_type: String::new(),
            webhook_id: format!("msg_{id}"),
            order: crate::domain::kind::DeliveryOrder::Unordered,
            status: crate::forward::queue::DeliveryStatus::InFlight,
            attempts: 1,
            next_attempt_at_ms: None,
            lease_owner: Some("node".into()),
            lease_until_ms: Some(lease_until_ms),
            last_error: None,
            created_at_ms: 0,
            delivered_at_ms: None,
            history: Vec::new(),
            body: None,
            event_headers: None,
        }
    }

    #[test]
    fn a_buffered_delivery_goes_only_while_closed_with_lease_enough_left() {
        let ready = Ready::new(1_000);
        let circuit = Mutex::new(Circuit::new(CircuitPolicy::default()));
        let (stop, running) = watch::channel(false);
        ready.push(leased(1, 5_000));
        ready.push(leased(2, 6_000));
        ready.push(leased(1, 7_000));
        assert_eq!(
            ready.len(),
            2,
            "a claim of its own expired lease replaces the copy"
        );
        assert_eq!(ready.sendable_until_ms(), Some(5_000));
        assert_eq!(ready.take(&circuit, &running, 5_001).map(|d| d.id), None);
        assert_eq!(ready.take(&circuit, &running, 5_000).map(|d| d.id), Some(2));
        ready.push(leased(3, 9_000));
        assert!(ready
            .take_unsendable(CircuitState::Closed, 5_000)
            .is_empty());
        let stale = ready.take_unsendable(CircuitState::Closed, 7_000);
        assert_eq!(stale.iter().map(|d| d.id).collect::<Vec<_>>(), [1]);

        ready.push(leased(4, 9_000));
        {
            let mut circuit = circuit.lock().unwrap();
            for aggregate in ["x", "y", "z"].iter().cycle().take(10) {
                circuit.on_failure(aggregate, 7_000);
            }
        }
        let open = circuit.lock().unwrap().state();
        assert_ne!(open, CircuitState::Closed);
        assert_eq!(ready.take(&circuit, &running, 7_000).map(|d| d.id), None);
        let given_back = ready.take_unsendable(open, 7_000);
        assert_eq!(given_back.iter().map(|d| d.id).collect::<Vec<_>>(), [3, 4]);

        circuit.lock().unwrap().on_success();
        ready.push(leased(5, 9_000));
        stop.send(true).unwrap();
        assert_eq!(ready.take(&circuit, &running, 7_000).map(|d| d.id), None);
        assert_eq!(ready.take_all().len(), 1);
    }
}
