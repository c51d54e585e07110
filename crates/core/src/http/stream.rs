//! `GET /v1/stream`: server-sent events of applied state changes.
//!
//! One [`ChangeFeed`] per server reads the store's new changes (every
//! [`FEED_POLL`], since other nodes write them too) and fans them out through a
//! broadcast channel, so an idle stream costs no query. A stream first catches
//! up from the store by its cursor (`Last-Event-ID`), then follows the feed; one
//! that falls behind the channel catches up from the store again, so none loses
//! a change. The feed releases ids in order and waits briefly at a gap, since on
//! PostgreSQL a change can commit after one with a later id. At most
//! `max_streams` streams are open at once; all end on shutdown.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{broadcast, watch, OwnedSemaphorePermit, Semaphore};
use utoipa::IntoParams;

use super::answer::{Answer, ErrorBody};
use super::api::aggregate_filter;
use super::api::extract::Query;
use super::AppState;
use crate::domain::AggregateKey;
use crate::store::{StateChange, Store, StoreError};

/// How often the feed looks for new changes (they may come from other nodes).
const FEED_POLL: Duration = Duration::from_millis(200);

/// How long the feed and the streams wait after a store error before reading again.
const STORE_BACKOFF: Duration = Duration::from_secs(1);

/// How long the feed waits for a missing change id before it takes it as rolled back.
const GAP_GRACE: Duration = Duration::from_secs(2);

/// Changes read from the store at once.
const BATCH: usize = 256;

/// What masks a change as shown: the configured fields, and the kind of each source, which
/// knows where in its changes the body's values are.
#[derive(Clone)]
pub struct ChangeMask {
    fields: Vec<String>,
    kinds: std::collections::HashMap<String, Arc<dyn crate::domain::kind::Kind>>,
}

impl ChangeMask {
    /// The masking of `config`'s `mask_fields` over its sources.
    pub fn of(config: &crate::config::Config) -> Self {
        Self {
            fields: config.admin.mask_fields.clone(),
            kinds: config
                .sources
                .iter()
                .map(|s| (s.name.clone(), Arc::clone(&s.kind)))
                .collect(),
        }
    }
}

/// One applied change, masked and serialized once for every stream.
#[derive(Debug)]
pub struct FeedChange {
    id: i64,
    kind: String,
    source: String,
    /// The stored aggregate key, for `?aggregate=` filters.
    aggregate: String,
    /// The SSE `data` line: source, aggregate as shown and the masked state.
    data: String,
}

impl FeedChange {
    fn of(change: StateChange, mask: &ChangeMask) -> Self {
        let mut state = serde_json::from_str(&change.state).unwrap_or(serde_json::Value::Null);
        match mask.kinds.get(&change.source) {
            Some(kind) => kind.mask_stream_state(&mut state, &mask.fields),
            // Every source that writes changes is configured (a reload keeps them all); were
            // one not, nothing would say what to mask, so nothing is shown.
            None => state = serde_json::Value::Null,
        }
        let data = json!({
            "source": change.source,
            "aggregate": AggregateKey::text_of_stored(&change.aggregate),
            "state": state,
        });
        Self {
            id: change.id,
            kind: change.kind,
            source: change.source,
            aggregate: change.aggregate,
            data: data.to_string(),
        }
    }

    fn event(&self) -> Event {
        Event::default()
            .id(self.id.to_string())
            .event(&self.kind)
            .data(&self.data)
    }
}

/// The change feed every stream of this server follows, and the cap on open streams.
pub struct ChangeFeed {
    changes: broadcast::Sender<Arc<FeedChange>>,
    /// The last change released to the streams (every lower id is released or was skipped);
    /// starts at the store's last change.
    after: std::sync::atomic::AtomicI64,
    slots: Arc<Semaphore>,
    closing: watch::Sender<bool>,
}

impl ChangeFeed {
    /// A feed starting after change `after`, allowing `max_streams` open streams, each of
    /// which may fall `buffer` changes behind before it catches up from the store.
    pub fn new(after: i64, max_streams: usize, buffer: usize) -> Self {
        Self {
            changes: broadcast::channel(buffer).0,
            after: after.into(),
            slots: Arc::new(Semaphore::new(max_streams)),
            closing: watch::channel(false).0,
        }
    }

    /// Reads new changes and fans them out until `stop`; then ends every open stream.
    pub async fn run(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        mask: ChangeMask,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut gap_since = None;
        while !*stop.borrow() {
            let step = self.step(store.as_ref(), &mask, &mut gap_since);
            let pause = match step.await {
                Ok(true) => Duration::ZERO,
                Ok(false) => FEED_POLL,
                Err(err) => {
                    tracing::warn!(error = %err, "change feed cannot read; retrying");
                    STORE_BACKOFF
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => {}
            }
        }
        self.closing.send_replace(true);
    }

    /// One read; returns whether more may be waiting. Ids are released in order: on
    /// PostgreSQL a transaction can commit after one that took a later id, so a gap
    /// in the ids is waited for (up to [`GAP_GRACE`]; a rolled-back one never fills).
    async fn step(
        &self,
        store: &dyn Store,
        mask: &ChangeMask,
        gap_since: &mut Option<Instant>,
    ) -> Result<bool, StoreError> {
        use std::sync::atomic::Ordering::SeqCst;
        let mut after = self.after.load(SeqCst);
        // While no stream listens only the ids are followed: reading the changes would
        // open every sealed state for nobody (docs/encryption.md, costs).
        let batch: Vec<(i64, Option<StateChange>)> = if self.changes.receiver_count() > 0 {
            let changes = store.changes_after(after, None, None, BATCH).await?;
            changes.into_iter().map(|c| (c.id, Some(c))).collect()
        } else {
            let ids = store.change_ids_after(after, BATCH).await?;
            ids.into_iter().map(|id| (id, None)).collect()
        };
        let full = batch.len() == BATCH;
        for (id, change) in batch {
            if id != after + 1 {
                let since = *gap_since.get_or_insert_with(Instant::now);
                if since.elapsed() < GAP_GRACE {
                    return Ok(false);
                }
            }
            *gap_since = None;
            after = id;
            // Only released ids: a stream catching up reads the store no further than this.
            // Released before the look at the receivers: a stream subscribing after that
            // look starts at or past this change.
            self.after.store(after, SeqCst);
            if self.changes.receiver_count() > 0 {
                // A stream that came while only ids were read gets this change read now;
                // if that read fails, the change is released again at the next step (a
                // stream that has it already skips it by id).
                let change = match change {
                    Some(change) => Some(change),
                    None => match store.changes_after(id - 1, None, None, 1).await {
                        Ok(found) => found.into_iter().find(|c| c.id == id),
                        Err(err) => {
                            self.after.store(id - 1, SeqCst);
                            return Err(err);
                        }
                    },
                };
                if let Some(change) = change {
                    // An error means every stream just left: nothing to deliver to.
                    let _ = self.changes.send(Arc::new(FeedChange::of(change, mask)));
                }
            }
        }
        Ok(full)
    }

    /// The last change released to the streams.
    fn released(&self) -> i64 {
        self.after.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// `?source=&aggregate=` of the change stream.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(super) struct StreamQuery {
    /// Only this source's changes.
    source: Option<String>,
    /// Only this aggregate's changes, in text form (docs/contract.md, json sources): a user id, or
    /// `player/slot`, with `%` and `/` inside an id written `%25` and `%2F`.
    aggregate: Option<String>,
    /// Without `Last-Event-ID`: start with the changes among the latest `last` change ids
    /// (at most 1000) instead of at the current end, so a new view opens with recent history.
    #[param(maximum = 1000)]
    last: Option<u32>,
}

/// The most changes `?last=` looks back over.
const MAX_LAST: u32 = 1_000;

/// Server-sent events of every applied state change, resumable with `Last-Event-ID`;
/// without it the stream starts at the current end.
#[utoipa::path(get, path = "/v1/stream", tag = "state", security(("admin_token" = [])),
    params(StreamQuery,
        ("Last-Event-ID" = Option<i64>, Header, description = "Resume after this change")),
    responses(
        (status = 200, description = "`presence` and `save` events whose data is the new state \
            (masked fields replaced); the stream ends when the server shuts down",
            body = String, content_type = "text/event-stream"),
        (status = 400, description = "Bad query string or `Last-Event-ID` (`bad_request`)", body = ErrorBody),
        (status = 401, description = "`unauthorized`: admin token missing or wrong; or, with no \
            `admin_token`, not a direct loopback client", body = ErrorBody),
        (status = 403, description = "`forbidden_host`: with no `admin_token`, a `Host` other than \
            localhost, 127.0.0.1 or [::1]", body = ErrorBody),
        (status = 503, description = "`too_many_streams`: this node already serves `max_streams` streams", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait"))),
    ))]
pub(super) async fn stream(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    Query(query): Query<StreamQuery>,
) -> Result<Response, Answer> {
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().parse::<i64>())
        .transpose()
        .map_err(|_| {
            Answer::BadRequest("Last-Event-ID must be an event id from this stream".into())
        })?;
    let feed = &state.feed;
    let slot = Arc::clone(&feed.slots)
        .try_acquire_owned()
        .map_err(|_| Answer::TooManyStreams)?;
    // Subscribed before the cursor is read: nothing published from here on is missed.
    let changes = feed.changes.subscribe();
    // Without a resume point: the current end, as released (a later commit of a lower id
    // still comes through the feed), or `last` ids before it.
    let look_back = query
        .last
        .map(|n| i64::from(n.min(MAX_LAST)))
        .filter(|n| *n > 0);
    let cursor = resume.unwrap_or_else(|| (feed.released() - look_back.unwrap_or(0)).max(0));
    let follower = Follower {
        store: Arc::clone(&state.store),
        mask: ChangeMask::of(&state.config),
        source: query.source.filter(|s| !s.is_empty()),
        aggregate: aggregate_filter(query.aggregate.as_deref())?,
        cursor,
        catching_up: resume.is_some() || look_back.is_some(),
        queue: VecDeque::new(),
        changes,
        closing: feed.closing.subscribe(),
        feed: Arc::clone(feed),
        _slot: slot,
    };
    let events = futures_util::stream::unfold(follower, |mut follower| async move {
        let change = follower.next().await?;
        Some((Ok::<_, Infallible>(change.event()), follower))
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// One open stream: where it is, what it wants, and its slot under `max_streams`.
struct Follower {
    store: Arc<dyn Store>,
    mask: ChangeMask,
    source: Option<String>,
    aggregate: Option<String>,
    /// The last change sent (or the start).
    cursor: i64,
    /// Reading from the store rather than the feed.
    catching_up: bool,
    queue: VecDeque<Arc<FeedChange>>,
    changes: broadcast::Receiver<Arc<FeedChange>>,
    closing: watch::Receiver<bool>,
    feed: Arc<ChangeFeed>,
    _slot: OwnedSemaphorePermit,
}

impl Follower {
    fn wants(&self, change: &FeedChange) -> bool {
        change.id > self.cursor
            && self.source.as_ref().is_none_or(|s| *s == change.source)
            && self
                .aggregate
                .as_ref()
                .is_none_or(|a| *a == change.aggregate)
    }

    /// The next change to send; `None` when the server shuts down.
    async fn next(&mut self) -> Option<Arc<FeedChange>> {
        loop {
            if *self.closing.borrow() {
                return None;
            }
            if let Some(change) = self.queue.pop_front() {
                self.cursor = change.id;
                return Some(change);
            }
            if self.catching_up {
                self.catch_up().await;
                continue;
            }
            tokio::select! {
                _ = self.closing.changed() => return None,
                received = self.changes.recv() => match received {
                    Ok(change) => {
                        if self.wants(&change) {
                            self.queue.push_back(change);
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(missed)) => {
                        tracing::info!(missed, "a slow stream catches up from the store");
                        self.catching_up = true;
                    }
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    }

    /// Reads one batch after the cursor from the store, up to what the feed released (what
    /// comes after reaches this stream through the feed); done when that is all.
    async fn catch_up(&mut self) {
        let released = self.feed.released();
        let batch = self
            .store
            .changes_after(
                self.cursor,
                self.source.as_deref(),
                self.aggregate.as_deref(),
                BATCH,
            )
            .await;
        match batch {
            Ok(batch) => {
                self.catching_up =
                    batch.len() == BATCH && batch.last().is_some_and(|c| c.id <= released);
                let mask = &self.mask;
                self.queue.extend(
                    batch
                        .into_iter()
                        .take_while(|change| change.id <= released)
                        .map(|change| Arc::new(FeedChange::of(change, mask))),
                );
            }
            Err(err) => {
                tracing::warn!(error = %err, "change stream cannot read; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(STORE_BACKOFF) => {}
                    _ = self.closing.changed() => {}
                }
            }
        }
    }
}
