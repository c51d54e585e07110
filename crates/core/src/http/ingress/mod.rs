//! `POST /webhooks/{source}`: the checks of docs/contract.md (ingress) in their fixed order —
//! source, caller (`allow_ips`), size, content type, signature, contract, store — with the
//! publishers' endpoint handshakes answered on the way, before the log (docs/contract.md,
//! handshakes); and `GET /webhooks/{source}` for the handshakes that come as a `GET`.

use crate::operations::log_throttle::{LogThrottle, NOISY_LOG_INTERVAL};
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use tracing::{info, warn, Instrument};

mod batch;

use super::answer::{Answer, ErrorBody, IngressBody};
use super::AppState;
use crate::config::{Mode, SourceConfig, BODY_RATE_GRACE_S};
use crate::domain::contract::body::BodyFormat;
use crate::domain::kind::{Delivery, EventFields};
use crate::domain::ordering::Outcome;
use crate::ingress::handshake::{self, Handshake};
use crate::ingress::signature;
use crate::operations::metrics;
use crate::store::{Admission, BodyKey, Decided, NewEvent, Refusal, SettleAt, StoreError};

/// Receives one delivery: verifies its signature, checks its contract, logs it durably
/// and answers (docs/contract.md, ingress). The signature headers are the source's scheme's
/// (`X-Signature`/`X-Timestamp`, `webhook-signature`, `X-Hub-Signature-256`,
/// `Stripe-Signature`, `X-Slack-Signature`, `X-Shopify-Hmac-Sha256`, …).
#[utoipa::path(post, path = "/webhooks/{source}", tag = "ingress", security(()),
    params(("source" = String, Path, description = "The configured source", example = "presence")),
    request_body(content = Object, content_type = "application/json",
        description = "The event, following the source's contract",
        example = json!({"event_id": "evt_1", "user_id": "usr_A", "presence": "ONLINE",
            "sequence_number": 1, "timestamp": 1_764_460_800})),
    responses(
        (status = 200, description = "Sync: applied, stale, unsupported or dead; or a duplicate; a batch \
            source (`batch = true`) answers each element; or a handshake answered (Slack, Zoom, Discord as JSON; \
            Twitch, Microsoft Graph as text/plain; `X-Content-Type-Options: nosniff`; nothing stored). A source's \
            own `response` (status, content type and body, any 2xx) replaces the delivery bodies",
            content((IngressBody = "application/json"), (String = "text/plain"))),
        (status = 202, description = "Logged durably; applied later (a batch: some element is)", body = IngressBody),
        (status = 400, description = "`invalid_payload`, each bad field named (a batch: the element's `index` too); or `invalid_handshake`: a handshake's value to echo is missing, empty, over 512 bytes or holds a control character, is not the publisher's shape (Zoom's plainToken an opaque token, Graph's validationToken its validation text), or a Twitch message's `Twitch-Eventsub-Message-Type` is not the type of its signed body", body = ErrorBody),
        (status = 401, description = "`missing_signature`, `invalid_signature` or `timestamp_out_of_tolerance`",
            body = ErrorBody),
        (status = 403, description = "`forbidden_peer`: the client address is not in the source's `allow_ips`; nothing read. \
            `forbidden_topic` (`aws-sns`): the message's `TopicArn` is not in the source's `sns_topic_arns`; nothing fetched, confirmed nor stored",
            body = ErrorBody),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        (status = 408, description = "`request_timeout`: the body did not arrive within `body_read_timeout_s`",
            body = ErrorBody),
        (status = 413, description = "`payload_too_large`", body = ErrorBody),
        (status = 502, description = "`certificate_unavailable` or `subscription_confirmation_failed` (`aws-sns`): a request inhook makes for the delivery failed; nothing stored, the publisher retries", body = ErrorBody),
        (status = 415, description = "`unsupported_media_type`", body = ErrorBody),
        (status = 429, description = "`backlog_full`, `aggregate_backlog_full` or `rate_limited`; nothing stored", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait"))),
        (status = 503, description = "`store_unavailable`, `verification_busy` (every core busy with costly signature checks) or `server_busy` (the bodies being read fill `max_buffered_body_bytes`); nothing stored", body = ErrorBody,
            headers(("Retry-After" = u32, description = "Seconds to wait"))),
    ))]
pub(super) async fn receive(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    source: Result<Path<String>, PathRejection>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = std::time::Instant::now();
    let Some(config) = configured_source(&state, source) else {
        return unknown_source();
    };
    // Who may call is decided before anything is read, and logs nothing: anyone can knock.
    let client = crate::ingress::peers::client_address(
        peer.ip(),
        &headers,
        &state.config.http.trusted_proxies,
    );
    if config
        .allow_ips
        .as_ref()
        .is_some_and(|allowed| !client.is_in(allowed))
    {
        crate::operations::stats::delivery(
            &config.name,
            Answer::FORBIDDEN_PEER.counted(),
            crate::domain::clock::now_ms(),
        );
        let response = Answer::FORBIDDEN_PEER.into_response();
        metrics::request(
            &config.name,
            response.status().as_u16(),
            started.elapsed().as_secs_f64(),
        );
        return response;
    }
    let span = tracing::info_span!(
        "delivery",
        source = %config.name,
        event_id = tracing::field::Empty,
        aggregate = tracing::field::Empty,
        sequence = tracing::field::Empty,
        decision = tracing::field::Empty,
    );
    let target = Target {
        method: method.as_str(),
        path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()),
        client: client.budget_key(),
    };
    let answer = answer(&state, config, &target, &headers, body)
        .instrument(span)
        .await;
    crate::operations::stats::delivery(&config.name, answer.counted(), state.clock.now_ms());
    let response = match &config.response {
        // The publisher reads or shows the source's own answer; errors keep their JSON.
        Some(custom) if answer.is_logged_delivery() => custom_response(custom),
        _ => answer.into_response(),
    };
    metrics::request(
        &config.name,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// A source's own answer to a logged delivery (docs/configuration.md, `response`), sent as
/// written; `nosniff`, so that a browser never reads it as anything but its content type.
fn custom_response(custom: &crate::config::SourceResponse) -> Response {
    (
        custom.status,
        [
            (header::CONTENT_TYPE, custom.content_type.clone()),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                axum::http::HeaderValue::from_static("nosniff"),
            ),
        ],
        custom.body.clone(),
    )
        .into_response()
}

/// What a delivery was sent to: what the configurable schemes may sign besides headers
/// and body (`{method}`, `{url}`), or read a token from (docs/configuration.md); and the
/// address its per-client budgets are kept under (its body buffer, the SNS certificate
/// fetches it may start).
struct Target<'a> {
    method: &'a str,
    path_and_query: &'a str,
    client: std::net::IpAddr,
}

/// Answers one delivery of a configured source; a refusal is logged, one line per interval.
async fn answer(
    state: &AppState,
    source: &SourceConfig,
    target: &Target<'_>,
    headers: &HeaderMap,
    body: Body,
) -> Answer {
    let answer = check_and_log(state, source, target, headers, body).await;
    if answer.is_rejection() {
        if let Some(suppressed) = REJECTED_LOG.admit() {
            info!(source = %source.name, decision = answer.decision(), suppressed, "delivery rejected");
        }
    }
    answer
}

/// The config of the source named in the path, if one is configured. A name that does
/// not decode cannot be a configured source.
fn configured_source(
    state: &AppState,
    source: Result<Path<String>, PathRejection>,
) -> Option<&SourceConfig> {
    let source = source.map(|Path(name)| name).unwrap_or_default();
    state.config.source(&source)
}

/// The 404 `unknown_source` answer, counted.
fn unknown_source() -> Response {
    let response = Answer::UnknownSource.into_response();
    metrics::request(metrics::UNKNOWN_SOURCE, response.status().as_u16(), 0.0);
    response
}

/// The checks of docs/contract.md (ingress, order of checks) in their order, in three stages:
/// the body read within its bounds (steps 2–4), its signature verified and its contract
/// parsed (5–6), then the delivery admitted: rate, backlog, store, answer (7–9).
async fn check_and_log(
    state: &AppState,
    source: &SourceConfig,
    target: &Target<'_>,
    headers: &HeaderMap,
    body: Body,
) -> Answer {
    let read = match read_body(state, source, target.client, headers, body).await {
        Ok(read) => read,
        Err(refused) => return refused,
    };
    // Microsoft Graph's validation comes as text/plain: answered, once the source's token
    // verified, before the content type is checked (docs/contract.md, handshakes).
    if let Some(answer) = early_post_handshake(state, source, target, headers, &read.body).await {
        return answer;
    }
    if let Err(refused) = check_content_type(source, headers) {
        return refused;
    }
    if let Some(max_events) = source.batch {
        return batch::check_and_log(state, source, target, headers, read, max_events).await;
    }
    let delivery = match verify_and_parse(state, source, target, headers, read).await {
        Ok(delivery) => delivery,
        Err(refused) => return refused,
    };
    admit(state, source, headers, delivery).await
}

/// A body read whole within `max_body_bytes`, `body_read_timeout_s` and the buffer budget,
/// declared `application/json` (docs/contract.md, ingress, steps 2–4).
struct ReadBody {
    body: axum::body::Bytes,
    /// Kept until the delivery is answered: it bounds the bodies in flight, not only those
    /// being read.
    hold: super::BodyHold,
}

/// Steps 2–4: the declared length, the body as it streams (time, size, buffer budget), then
/// the content type.
async fn read_body(
    state: &AppState,
    source: &SourceConfig,
    client: std::net::IpAddr,
    headers: &HeaderMap,
    body: Body,
) -> Result<ReadBody, Answer> {
    let limit = state.config.http.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > limit as u64) {
        discard(body, declared.unwrap_or(0)).await;
        return Err(Answer::PayloadTooLarge { limit });
    }
    // The budget is taken as bytes arrive, not from the declared length: a client that
    // declares a large body and trickles it holds only what it has sent (docs/configuration.md).
    let deadline = std::time::Duration::from_secs(state.config.http.body_read_timeout_s);
    let read = tokio::time::timeout(deadline, read_within_budget(state, client, body, limit)).await;
    let (body, hold) = match read {
        Ok(Ok(read)) => read,
        Ok(Err(BodyRead::TooLarge)) => return Err(Answer::PayloadTooLarge { limit }),
        Ok(Err(BodyRead::Broken | BodyRead::TooSlow)) => return Err(Answer::RequestTimeout),
        Ok(Err(BodyRead::BudgetFull)) => {
            if let Some(suppressed) = BUSY_LOG.admit() {
                warn!(source = %source.name, suppressed, "max_buffered_body_bytes in use: delivery refused");
            }
            return Err(Answer::BodyBudgetFull);
        }
        Err(_) => return Err(Answer::RequestTimeout),
    };
    Ok(ReadBody { body, hold })
}

/// Step 4: a form source takes form bodies only, every other source JSON only
/// (docs/configuration.md, `body_format`).
fn check_content_type(source: &SourceConfig, headers: &HeaderMap) -> Result<(), Answer> {
    let format = source.kind.body_format();
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    // SNS posts its JSON as `text/plain` (docs/configuration.md, `aws-sns`).
    let sns_text = matches!(source.verifier, signature::Verifier::AwsSns(_))
        && signature::aws_sns::is_sns_media_type(content_type);
    if !format.accepts(content_type) && !sns_text {
        return Err(Answer::UnsupportedMediaType {
            expected: format.media_type(),
        });
    }
    Ok(())
}

/// A delivery whose signature verified and whose body follows the source's contract
/// (docs/contract.md, ingress, steps 5–6): what admitting it needs.
struct VerifiedDelivery {
    /// The fields the kind read from the body, parsed once.
    event: EventFields,
    /// An event type outside the source's `event_types`: logged, never applied.
    ignored: bool,
    body: axum::body::Bytes,
    received_at_ms: i64,
    /// The signed timestamp, for timestamped schemes.
    signed_at: Option<i64>,
    /// What besides its ids makes it a duplicate ([`body_key`]).
    body_key: BodyKey,
    /// The body's share of the buffer budget, kept until the delivery is answered.
    hold: super::BodyHold,
}

/// What besides its ids makes a verified delivery a duplicate of a logged one
/// (docs/contract.md, duplicates): what its signature covers, where that is less than the
/// raw body or a canonical form of it (Mailgun's token, Twilio's sorted fields); else the
/// raw body, where nothing signed bounds a replay; else nothing.
fn body_key(source: &SourceConfig, verified: &signature::Verified) -> BodyKey {
    if source.verifier.dedups_by_signed_content() {
        // A verifier that dedups by its signed content always reports it.
        return verified
            .signed_content
            .map_or(BodyKey::RawBody, BodyKey::SignedContent);
    }
    if source.verifier.dedups_by_body() {
        BodyKey::RawBody
    } else {
        BodyKey::None
    }
}

/// Steps 5–6: the signature, then the contract; the event's fields go on the span.
async fn verify_and_parse(
    state: &AppState,
    source: &SourceConfig,
    target: &Target<'_>,
    headers: &HeaderMap,
    read: ReadBody,
) -> Result<VerifiedDelivery, Answer> {
    let received_at_ms = state.clock.now_ms();
    let (verified, matched) =
        verify_signature(state, source, target, headers, &read.body, received_at_ms).await?;
    // A signed handshake (SNS's confirmations among them) is answered once its signature
    // verified, before the contract and the store: never logged, never forwarded
    // (docs/contract.md, handshakes).
    let parts = handshake::Parts {
        method: target.method,
        path_and_query: target.path_and_query,
        headers,
        body: &read.body,
        secret: matched.as_ref(),
    };
    if let Some(answer) =
        handshake_answer(state, source, handshake::Stage::SignedPost, &parts).await
    {
        return Err(answer);
    }
    let delivery_id = verified.delivery_id.as_deref();
    let (event, ignored) = parse_event(source, headers, &read.body, delivery_id)?;
    let span = tracing::Span::current();
    span.record("event_id", event.event_id.as_str());
    span.record("aggregate", tracing::field::display(&event.aggregate));
    span.record("sequence", event.sequence);
    Ok(VerifiedDelivery {
        event,
        ignored,
        body: read.body,
        received_at_ms,
        signed_at: verified.signed_at,
        body_key: body_key(source, &verified),
        hold: read.hold,
    })
}

/// The event a verified body carries and whether its type is ignored; the answer when
/// there is none to log.
fn parse_event(
    source: &SourceConfig,
    headers: &HeaderMap,
    body: &[u8],
    delivery_id: Option<&str>,
) -> Result<(EventFields, bool), Answer> {
    // The body is parsed once, here: the kind reads every field the layers below need.
    match source.kind.parse(body, headers, delivery_id) {
        Ok(Delivery::Event(event)) => Ok((event, false)),
        Ok(Delivery::Ignored {
            event: Some(event), ..
        }) => Ok((event, true)),
        Ok(Delivery::Ignored {
            event: None,
            event_type,
        }) => {
            info!(source = %source.name, event_type = event_type.as_deref(),
                  decision = "ignored_unsupported",
                  "event type outside the source's event_types, without a readable event_id: not logged");
            Err(Answer::Unsupported { event_id: None })
        }
        Err(err) => {
            warn!(source = %source.name, problems = %err, "invalid payload");
            metrics::invalid_payload(&source.name);
            Err(Answer::InvalidPayload(err.problems))
        }
    }
}

/// Steps 7–9: the rate limit, the backlog, the store's transaction, then the answer, its
/// metrics and its decision line. The body's budget is held until the answer is made.
async fn admit(
    state: &AppState,
    source: &SourceConfig,
    headers: &HeaderMap,
    delivery: VerifiedDelivery,
) -> Answer {
    let logged = match log_within_limits(state, source, headers, &delivery).await {
        Ok(logged) => logged,
        Err(refused) => return refused,
    };
    if let Ok(Admission::Logged {
        out_of_order: true, ..
    }) = &logged
    {
        metrics::out_of_order(&source.name);
    }
    let answer = answer_logged(state, source, &delivery.event, delivery.ignored, logged);
    tracing::Span::current().record("decision", answer.decision());
    log_decision(source, &delivery.event, &answer);
    // The body's bytes go back to the budget only now that the delivery is answered.
    let VerifiedDelivery { hold, .. } = delivery;
    drop(hold);
    answer
}

/// The source's backlog as last refreshed (every second): a cheap early refusal; the
/// store decides the limit itself, in the transaction that would log.
fn backlog_of(state: &AppState, source: &SourceConfig) -> u64 {
    state
        .tallies
        .of(&source.name)
        .map_or(0, |tally| tally.backlog())
}

/// Where an event is decided: `rules` is `None` for an ignored event (the workers mark
/// it). Async still answers 202; with `decide_at_ingest` the event is decided at once
/// when its aggregate is ready.
fn settle_at<'r>(
    source: &SourceConfig,
    rules: Option<&'r crate::store::SourceRules>,
) -> SettleAt<'r> {
    match (rules, source.mode) {
        (None, _) => SettleAt::Worker,
        (Some(rules), Mode::Sync) => SettleAt::Ingest(rules),
        (Some(rules), Mode::Async) if source.decide_at_ingest => SettleAt::IfReady(rules),
        (Some(_), Mode::Async) => SettleAt::Worker,
    }
}

/// Whether an admission spends the publisher's rate budget: only a newly logged event
/// does, so replays of a captured delivery cannot starve its genuine ones. A conflicting
/// duplicate (an id resent with another body) is no replay: it spends its token.
fn spends_rate_token(admission: &Admission) -> bool {
    matches!(
        admission,
        Admission::Logged { .. }
            | Admission::Duplicate {
                body_differs: true,
                ..
            }
    )
}

/// The answer to a store that could not log `what` (a delivery, a batch): nothing stored.
fn store_failed(source: &SourceConfig, err: StoreError, what: &str) -> Answer {
    match err {
        StoreError::Unavailable(detail) => {
            warn!(source = %source.name, %detail, "store unavailable; {what} not stored");
            Answer::StoreUnavailable
        }
        err => {
            tracing::error!(source = %source.name, detail = %err, "store failed; {what} not stored");
            Answer::Internal
        }
    }
}

/// What the store made of the delivery; `Err` is the answer of one refused before the
/// store was asked: out of rate tokens (and no replay), or over the backlog.
async fn log_within_limits(
    state: &AppState,
    source: &SourceConfig,
    headers: &HeaderMap,
    delivery: &VerifiedDelivery,
) -> Result<Result<Admission, StoreError>, Answer> {
    let charged = match take_rate_token(state, source) {
        Ok(charged) => charged,
        Err(wait) => {
            return replay_when_rate_limited(state, source, delivery, wait)
                .await
                .map(Ok)
        }
    };
    let backlog = backlog_of(state, source);
    if backlog >= source.max_backlog && !delivery.ignored {
        warn!(source = %source.name, backlog, "backlog over max_backlog: delivery refused");
        refund_rate_token(state, source, charged);
        return Err(Answer::BacklogFull);
    }
    let logged = ingest(state, source, headers, delivery).await;
    if !logged.as_ref().is_ok_and(spends_rate_token) {
        refund_rate_token(state, source, charged);
    }
    Ok(logged)
}

/// Out of tokens: a replay of a logged delivery is still answered as the duplicate it is
/// (2xx, so its sender stops), without storing anything; an id resent with another body
/// is not, it waits like any delivery.
async fn replay_when_rate_limited(
    state: &AppState,
    source: &SourceConfig,
    delivery: &VerifiedDelivery,
    wait: std::time::Duration,
) -> Result<Admission, Answer> {
    match logged_copy(state, source, &delivery.event, &delivery.body).await {
        Some(
            duplicate @ Admission::Duplicate {
                body_differs: false,
                ..
            },
        ) => Ok(duplicate),
        _ => Err(Answer::RateLimited {
            retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
        }),
    }
}

/// Logs the delivery in one transaction, deciding it there in sync mode (and in async
/// mode with `decide_at_ingest`, when its aggregate is ready).
async fn ingest(
    state: &AppState,
    source: &SourceConfig,
    headers: &HeaderMap,
    delivery: &VerifiedDelivery,
) -> Result<Admission, StoreError> {
    let rules = (!delivery.ignored)
        .then(|| crate::store::SourceRules::for_source(source, &state.config.destinations));
    let settle = settle_at(source, rules.as_ref());
    let new = NewEvent {
        headers: &crate::ingress::kept_headers::keep(headers, &source.keep_headers),
        source: &source.name,
        event: &delivery.event,
        body: &delivery.body,
        received_at_ms: delivery.received_at_ms,
        signed_at: delivery.signed_at,
        limits: crate::store::IngestLimits::for_source(source),
        ignored: delivery.ignored,
        body_key: delivery.body_key,
        search_fields: &source.search_fields,
    };
    state.store.ingest(new, settle).await
}

/// The answer to what the store made of the delivery, with its metrics and log lines.
fn answer_logged(
    state: &AppState,
    source: &SourceConfig,
    event: &EventFields,
    ignored: bool,
    logged: Result<Admission, StoreError>,
) -> Answer {
    match logged {
        Ok(Admission::Duplicate {
            key,
            original,
            body_differs,
        }) => {
            let key = answered_key(source, key);
            answer_duplicate(state, source, event, key, &original, body_differs)
        }
        Ok(Admission::Refused(Refusal::BacklogFull)) => {
            warn!(source = %source.name, "backlog over max_backlog: delivery refused");
            Answer::BacklogFull
        }
        Ok(Admission::Refused(Refusal::AggregateBacklogFull)) => {
            warn!(source = %source.name, aggregate = %event.aggregate,
                  "aggregate over max_held_per_aggregate: delivery refused");
            Answer::AggregateBacklogFull
        }
        Ok(Admission::Logged { decided, .. }) => answer_new(state, source, event, ignored, decided),
        Err(err) => store_failed(source, err, "delivery"),
    }
}

/// The key a duplicate is answered and counted under: with `event_id = "body"` the event
/// id is the body's SHA-256, so a duplicate found by it was found by the body.
fn answered_key(source: &SourceConfig, key: crate::store::DedupKey) -> crate::store::DedupKey {
    match key {
        crate::store::DedupKey::EventId if source.kind.ids_events_by_body() => {
            crate::store::DedupKey::Body
        }
        key => key,
    }
}

/// A delivery of a logged event: counted, and a conflicting one (another body) warned of.
fn answer_duplicate(
    state: &AppState,
    source: &SourceConfig,
    event: &EventFields,
    key: crate::store::DedupKey,
    original: &crate::domain::EventId,
    body_differs: bool,
) -> Answer {
    if body_differs {
        // Counted each time; logged one line per interval, the original's history
        // holds it once.
        if let Some(suppressed) = CONFLICT_LOG.admit() {
            warn!(source = %source.name, event_id = %event.event_id, suppressed,
                  "publisher error: event_id resent with a different body");
        }
        metrics::conflicting_duplicate(&source.name);
        if let Some(tally) = state.tallies.of(&source.name) {
            tally.count_conflicting_duplicate();
        }
    }
    metrics::duplicate(&source.name, key);
    if let Some(tally) = state.tallies.of(&source.name) {
        tally.count_duplicate();
    }
    tracing::debug!(source = %source.name, event_id = %event.event_id,
                    original = %original, key = key.as_str(), "duplicate of a logged event");
    Answer::Duplicate {
        event_id: event.event_id.clone(),
        key,
    }
}

/// A newly logged event: left to the worker, or decided in the ingest transaction.
fn answer_new(
    state: &AppState,
    source: &SourceConfig,
    event: &EventFields,
    ignored: bool,
    decided: Option<Decided>,
) -> Answer {
    match decided {
        None if ignored => {
            // Counted as the built-in kinds count their unknown types.
            let report = crate::store::SettleReport {
                unsupported: 1,
                ..Default::default()
            };
            crate::operations::stats::count_settled(&source.name, &report);
            Answer::Unsupported {
                event_id: Some(event.event_id.clone()),
            }
        }
        None => {
            state.wake.notify_one();
            Answer::Accepted {
                event_id: event.event_id.clone(),
            }
        }
        Some(decided) if source.mode == Mode::Async => {
            // Decided in the ingest transaction: reported as the worker reports its decisions.
            crate::operations::stats::report_settled(
                &source.name,
                &event.aggregate.storage_key(),
                &decided.report,
            );
            if decided.report.deliveries > 0 {
                state.forward_wake.notify_one();
            }
            Answer::Accepted {
                event_id: event.event_id.clone(),
            }
        }
        Some(decided) => {
            if decided.report.deliveries > 0 {
                state.forward_wake.notify_one();
            }
            crate::operations::stats::count_settled(&source.name, &decided.report);
            sync_answer(event, decided)
        }
    }
}

/// The delivery's decision line; an accepted one gets a debug line only.
fn log_decision(source: &SourceConfig, event: &EventFields, answer: &Answer) {
    if let Answer::Accepted { .. } = answer {
        // Not a decision (docs/contract.md, processing): the worker's line is the event's one
        // decision line.
        tracing::debug!(source = %source.name, event_id = %event.event_id, "accepted");
    } else {
        info!(
            source = %source.name,
            event_id = %event.event_id,
            idempotency_key = event.idempotency_key.as_ref().map(|k| k.as_str()),
            aggregate = %event.aggregate,
            sequence = event.sequence,
            decision = answer.decision(),
            "decision"
        );
    }
}

/// Longest a costly signature check waits for a free core before its delivery gets a 503.
const COSTLY_CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Verifies the delivery's signature with the secrets in force now (a reload may have
/// rotated them). Costly checks (ed25519, lists of signatures) run on a blocking thread
/// under [`AppState::costly_checks`], so that a flood of them cannot stall the async
/// threads that serve every other request.
async fn verify_signature(
    state: &AppState,
    source: &SourceConfig,
    target: &Target<'_>,
    headers: &HeaderMap,
    body: &axum::body::Bytes,
    received_at_ms: i64,
) -> Result<(signature::Verified, Option<signature::Secret>), Answer> {
    let (verifier, tolerance_s) = (&source.verifier, source.tolerance_s);
    let received_at = received_at_ms.div_euclid(1000);
    let secrets = state.secrets.source(&source.name);
    let ignored = verifier.ignored_signatures(headers);
    if ignored > 0 {
        warn!(source = %source.name, ignored,
              checked = signature::standard_webhooks::MAX_CHECKED_SIGNATURES,
              "more signatures than are checked: the rest are ignored");
    }
    let (verdict, secrets) = if verifier.is_costly(headers) {
        let waited = tokio::time::timeout(
            COSTLY_CHECK_WAIT,
            std::sync::Arc::clone(&state.costly_checks).acquire_owned(),
        )
        .await;
        let Ok(Ok(permit)) = waited else {
            warn!(source = %source.name, "every core busy with costly signature checks: delivery refused");
            return Err(Answer::VerificationBusy);
        };
        let (headers, body, verifier) = (headers.clone(), body.clone(), verifier.clone());
        let (method, path_and_query) = (target.method.to_owned(), target.path_and_query.to_owned());
        let check = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let request = signature::Request {
                headers: &headers,
                body: &body,
                method: &method,
                path_and_query: &path_and_query,
            };
            // The secrets come back: a handshake answers with the one that verified.
            (
                verifier
                    .verify(&request, &secrets, received_at, tolerance_s)
                    .map_err(signature::Refusal::Signature),
                secrets,
            )
        });
        match check.await {
            Ok(checked) => checked,
            Err(err) => {
                tracing::error!(source = %source.name, %err, "signature check failed to run");
                return Err(Answer::Internal);
            }
        }
    } else {
        let request = signature::Request {
            headers,
            body,
            method: target.method,
            path_and_query: target.path_and_query,
        };
        // `aws-sns` waits here for its certificate; every other scheme checks at once.
        let verdict = verifier
            .verify_waiting(&request, &secrets, received_at, tolerance_s, target.client)
            .await;
        (verdict, secrets)
    };
    // The secret that verified, for a handshake answered with it (Zoom's encryptedToken).
    let verdict = verdict.map(|verified| {
        let matched = source
            .handshake
            .and_then(|_| secrets.get(verified.secret_index).cloned());
        (verified, matched)
    });
    verdict.map_err(|refusal| verification_refused(source, refusal))
}

/// The answer to a delivery its verifier refused, logged and counted.
fn verification_refused(source: &SourceConfig, refusal: signature::Refusal) -> Answer {
    match refusal {
        signature::Refusal::Signature(err) => signature_rejected(source, err),
        signature::Refusal::ForbiddenTopic { topic } => {
            // Anyone can name any topic: one line per interval, the ARN logged escaped.
            if let Some(suppressed) = TOPIC_LOG.admit() {
                warn!(source = %source.name, ?topic, suppressed,
                      "SNS message from a topic outside sns_topic_arns: refused, nothing fetched");
            }
            Answer::FORBIDDEN_TOPIC
        }
        signature::Refusal::CertificateUnavailable { host, why } => {
            if let Some(suppressed) = FETCH_LOG.admit() {
                warn!(source = %source.name, host = host.as_str(), why, suppressed,
                      "SNS signing certificate unavailable: delivery refused");
            }
            Answer::UpstreamFailed {
                error: "certificate_unavailable",
            }
        }
    }
}

/// The 401 of a delivery whose signature did not verify, logged and counted.
fn signature_rejected(source: &SourceConfig, err: signature::SignatureError) -> Answer {
    // Anyone can send a bad signature: one line per interval, the metric counts them all.
    if let Some(suppressed) = SIGNATURE_LOG.admit() {
        warn!(source = %source.name, reason = err.code(), detail = %err, suppressed,
              "signature rejected");
    }
    metrics::signature_failure(&source.name, err.code());
    Answer::SignatureRejected(err)
}

/// Answers `GET /webhooks/{source}` for a source whose handshake comes as a `GET` (X's CRC,
/// Dropbox, Okta, WebSub; docs/contract.md, handshakes). Every other source answers 405, as
/// a route without `GET` does. Okta's request carries the source's token, verified first.
#[utoipa::path(get, path = "/webhooks/{source}", tag = "ingress", security(()),
    params(("source" = String, Path, description = "A configured source with a GET handshake", example = "dropbox"),
        ("challenge" = Option<String>, Query, description = "Dropbox: echoed as text/plain"),
        ("crc_token" = Option<String>, Query, description = "X: an opaque token (base64 characters, at most 128), answered with its HMAC"),
        ("hub.mode" = Option<String>, Query, description = "WebSub: `subscribe`"),
        ("hub.challenge" = Option<String>, Query, description = "WebSub: echoed as text/plain"),
        ("X-Okta-Verification-Challenge" = Option<String>, Header, description = "Okta: echoed in `verification`")),
    responses(
        (status = 200, description = "The handshake answered (`X-Content-Type-Options: nosniff`); nothing stored",
            content((String = "text/plain"), (super::answer::HandshakeBody = "application/json"))),
        (status = 400, description = "`invalid_handshake`: the value to echo is missing, empty, over 512 bytes or holds a control character; X's crc_token is not an opaque token (1 to 128 characters of A-Z, a-z, 0-9, `+`, `/`, `=`, `_`, `-`, not a JSON value)",
            body = ErrorBody),
        (status = 401, description = "Okta: `missing_signature` or `invalid_signature` (the source's token)",
            body = ErrorBody),
        (status = 403, description = "`forbidden_peer`: the client address is not in the source's `allow_ips`",
            body = ErrorBody),
        (status = 404, description = "`unknown_source`", body = ErrorBody),
        (status = 405, description = "The source has no handshake answered to a GET: deliveries are POSTs"),
    ))]
pub(super) async fn handshake_get(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>,
    source: Result<Path<String>, PathRejection>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
) -> Response {
    let started = std::time::Instant::now();
    let Some(config) = configured_source(&state, source) else {
        return unknown_source();
    };
    let Some(handshake) = config.handshake.filter(|h| h.answers_get()) else {
        return Answer::MethodNotAllowed.into_response();
    };
    let client = crate::ingress::peers::client_address(
        peer.ip(),
        &headers,
        &state.config.http.trusted_proxies,
    );
    let answer = if config
        .allow_ips
        .as_ref()
        .is_some_and(|allowed| !client.is_in(allowed))
    {
        Answer::FORBIDDEN_PEER
    } else {
        let target = Target {
            // HEAD is answered as a GET, without its body.
            method: if method == axum::http::Method::HEAD {
                "GET"
            } else {
                method.as_str()
            },
            path_and_query: uri.path_and_query().map_or("/", |p| p.as_str()),
            client: client.budget_key(),
        };
        get_handshake(&state, config, handshake, &target, &headers).await
    };
    if answer.is_rejection() {
        if let Some(suppressed) = REJECTED_LOG.admit() {
            info!(source = %config.name, decision = answer.decision(), suppressed, "handshake refused");
        }
    }
    let response = answer.into_response();
    metrics::request(
        &config.name,
        response.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// A `GET` handshake: verified first when the publisher signs it (Okta's token), then answered.
async fn get_handshake(
    state: &AppState,
    source: &SourceConfig,
    handshake: Handshake,
    target: &Target<'_>,
    headers: &HeaderMap,
) -> Answer {
    let secret = if handshake.stage() == handshake::Stage::SignedGet {
        let received_at_ms = state.clock.now_ms();
        let empty = axum::body::Bytes::new();
        match verify_signature(state, source, target, headers, &empty, received_at_ms).await {
            Ok((_, matched)) => matched,
            Err(refused) => return refused,
        }
    } else {
        // X's CRC is answered with the source's first secret (docs/configuration.md).
        state.secrets.source(&source.name).into_iter().next()
    };
    let parts = handshake::Parts {
        method: target.method,
        path_and_query: target.path_and_query,
        headers,
        body: &[],
        secret: secret.as_ref(),
    };
    let answer = handshake_answer(state, source, handshake.stage(), &parts).await;
    answer.unwrap_or_else(|| {
        Answer::InvalidHandshake(format!(
            "this source answers only its {handshake} handshake to a GET; deliveries are POSTs"
        ))
    })
}

/// Microsoft Graph's `POST ?validationToken=T`, answered before its content type is checked
/// (Graph posts it as `text/plain`), once the source's token (in the query of the
/// subscription's `notificationUrl`) verified: Graph signs nothing, and an echo for anyone
/// would be an open reflector.
async fn early_post_handshake(
    state: &AppState,
    source: &SourceConfig,
    target: &Target<'_>,
    headers: &HeaderMap,
    body: &axum::body::Bytes,
) -> Option<Answer> {
    source
        .handshake
        .filter(|h| h.stage() == handshake::Stage::EarlyPost)?;
    let parts = handshake::Parts {
        method: target.method,
        path_and_query: target.path_and_query,
        headers,
        body,
        secret: None,
    };
    if !handshake::is_graph_validation(&parts) {
        // A notification: an ordinary delivery, its token checked at step 5.
        return None;
    }
    let received_at_ms = state.clock.now_ms();
    if let Err(refused) =
        verify_signature(state, source, target, headers, body, received_at_ms).await
    {
        return Some(refused);
    }
    handshake_answer(state, source, handshake::Stage::EarlyPost, &parts).await
}

/// The answer to a source's handshakes at `stage` ([`handshake::answer`]), counted;
/// `None` when the request is no handshake.
async fn handshake_answer(
    state: &AppState,
    source: &SourceConfig,
    stage: handshake::Stage,
    parts: &handshake::Parts<'_>,
) -> Option<Answer> {
    let answered = handshake::answer(source.handshake, &source.verifier, stage, parts).await?;
    Some(match answered {
        handshake::Answered::Configured(handshake, Ok(reply)) => {
            metrics::handshake(&source.name, handshake.name());
            if let Some(tally) = state.tallies.of(&source.name) {
                tally.count_handshake();
            }
            // Never the echoed value: it is the publisher's, and anyone may send some.
            if let Some(suppressed) = HANDSHAKE_LOG.admit() {
                info!(source = %source.name, kind = handshake.name(), suppressed, "handshake answered");
            }
            Answer::Handshake(reply)
        }
        handshake::Answered::Configured(handshake, Err(refusal)) => {
            Answer::InvalidHandshake(format!("{handshake} handshake: {refusal}"))
        }
        handshake::Answered::Sns(confirmation) => sns_answer(source, confirmation),
    })
}

/// The answer to an SNS message that is no event: a confirmed subscription (200, or 502
/// when the confirmation failed), an unsubscription answered 200; neither stored.
fn sns_answer(source: &SourceConfig, confirmation: handshake::sns::Confirmation) -> Answer {
    use handshake::sns::{Confirmation, NAME};
    match confirmation {
        Confirmation::Confirmed { topic } => {
            metrics::handshake(&source.name, NAME);
            info!(source = %source.name, %topic, "SNS subscription confirmed");
            Answer::SnsConfirmed { kind: NAME }
        }
        Confirmation::Failed { topic, why } => {
            // The URL carries the subscription's token: never logged.
            warn!(source = %source.name, %topic, why,
                  "SNS subscription confirmation failed: SNS will resend it");
            Answer::UpstreamFailed {
                error: "subscription_confirmation_failed",
            }
        }
        Confirmation::Unsubscribed { topic } => {
            info!(source = %source.name, %topic, "SNS UnsubscribeConfirmation: answered, not stored");
            Answer::NotStored {
                reason: "unsubscribe_confirmation",
            }
        }
        Confirmation::ForbiddenTopic => Answer::FORBIDDEN_TOPIC,
    }
}

/// Messages from unlisted topics come in floods when anyone subscribes the endpoint.
static TOPIC_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Certificate fetch failures come in floods when anyone names a failing URL.
static FETCH_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Handshakes come as often as a publisher (or anyone, for unsigned ones) sends them.
static HANDSHAKE_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Takes a token from the source's bucket: `Ok(true)` when one was taken, `Ok(false)`
/// when the source has no limit, or how long until the next token.
fn take_rate_token(state: &AppState, source: &SourceConfig) -> Result<bool, std::time::Duration> {
    take_rate_tokens(state, source, 1).map(|taken| taken > 0)
}

/// Takes a token per event (`events`, a batch's elements) from the source's bucket, all
/// or none ([`super::tally::TokenBucket::take_n`]): how many were taken (0 when the source has no
/// limit), or how long until there are enough.
fn take_rate_tokens(
    state: &AppState,
    source: &SourceConfig,
    events: u64,
) -> Result<u64, std::time::Duration> {
    let Some(rate) = source.rate_limit_per_s.filter(|_| events > 0) else {
        return Ok(0);
    };
    match state.tallies.of(&source.name) {
        Some(tally) => tally.take_tokens(events, rate, std::time::Instant::now()),
        None => Ok(0),
    }
}

/// Gives back the token taken for a delivery that stored nothing.
fn refund_rate_token(state: &AppState, source: &SourceConfig, charged: bool) {
    refund_rate_tokens(state, source, u64::from(charged));
}

/// Gives back `tokens` taken for events that stored nothing (refused, or duplicates).
fn refund_rate_tokens(state: &AppState, source: &SourceConfig, tokens: u64) {
    let Some(rate) = source.rate_limit_per_s.filter(|_| tokens > 0) else {
        return;
    };
    if let Some(tally) = state.tallies.of(&source.name) {
        tally.refund_tokens(tokens, rate);
    }
}

/// The logged event this delivery repeats (same source and `event_id`), as the store
/// would report it. A failed lookup is no duplicate: the caller then answers 429.
async fn logged_copy(
    state: &AppState,
    source: &SourceConfig,
    event: &EventFields,
    body: &[u8],
) -> Option<Admission> {
    let record = state
        .store
        .event(&source.name, event.event_id.as_str())
        .await
        .ok()??;
    Some(Admission::Duplicate {
        key: crate::store::DedupKey::EventId,
        original: event.event_id.clone(),
        body_differs: record.body != body,
    })
}

fn sync_answer(event: &EventFields, decided: Decided) -> Answer {
    let event_id = event.event_id.clone();
    match decided.outcome {
        Outcome::Applied => Answer::Applied {
            sequence: event.sequence,
        },
        Outcome::Stale => Answer::Stale {
            sequence: event.sequence,
            current_sequence: decided.current_sequence,
        },
        Outcome::Unsupported => Answer::Unsupported {
            event_id: Some(event_id),
        },
        Outcome::Held => Answer::Accepted { event_id },
        Outcome::Dead { reason, .. } => Answer::Dead { event_id, reason },
    }
}

/// Refusals for a full body budget come in floods: one log line per interval.
static BUSY_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Deliveries refused before their signature was checked: anyone can send them.
static REJECTED_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Event ids resent with another body: whoever holds one signed body can send them.
static CONFLICT_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Deliveries whose signature did not verify: anyone can send them.
static SIGNATURE_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Most bytes of a refused body read (and dropped) so that the client, still
/// sending, gets a clean 413 instead of a reset connection.
const DRAIN_CAP: u64 = 4 * 1024 * 1024;

/// Why a body could not be read whole.
enum BodyRead {
    /// It grew past `max_body_bytes`.
    TooLarge,
    /// `max_buffered_body_bytes` had no room left for its next bytes.
    BudgetFull,
    /// The connection failed mid-body.
    Broken,
    /// The body came slower than `min_body_bytes_per_s` past its grace.
    TooSlow,
}

/// Reads `body` up to `limit` bytes, taking each chunk's bytes from the shared budget (and
/// the client's share of it) as it arrives; the returned hold keeps them until the delivery is
/// answered. Past [`BODY_RATE_GRACE_S`], the bytes must keep up with `min_body_bytes_per_s`:
/// a trickle is cut when it falls behind, not at the end of `body_read_timeout_s`.
async fn read_within_budget(
    state: &AppState,
    client: std::net::IpAddr,
    body: Body,
    limit: usize,
) -> Result<(axum::body::Bytes, super::BodyHold), BodyRead> {
    use futures_util::StreamExt;
    let started = tokio::time::Instant::now();
    let rate = state.config.http.min_body_bytes_per_s;
    // When `read` bytes fall behind the minimum rate.
    let behind_at = |read: usize| {
        let allowed = BODY_RATE_GRACE_S as f64 + read as f64 / rate as f64;
        started + std::time::Duration::from_secs_f64(allowed.min(86_400.0))
    };
    let mut stream = body.into_data_stream();
    let mut held = state.body_budget.hold(client);
    let mut buf = Vec::new();
    loop {
        let next = if rate == 0 {
            stream.next().await
        } else {
            match tokio::time::timeout_at(behind_at(buf.len()), stream.next()).await {
                Ok(next) => next,
                Err(_) => return Err(BodyRead::TooSlow),
            }
        };
        let Some(chunk) = next else { break };
        let chunk = chunk.map_err(|_| BodyRead::Broken)?;
        if buf.len() + chunk.len() > limit {
            return Err(BodyRead::TooLarge);
        }
        if chunk.is_empty() {
            continue;
        }
        if !state.body_budget.try_take(&mut held, chunk.len()) {
            return Err(BodyRead::BudgetFull);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok((axum::body::Bytes::from(buf), held))
}

/// Reads and drops a refused body, if it is small enough and arrives quickly.
async fn discard(body: Body, declared: u64) {
    use futures_util::StreamExt;
    if declared > DRAIN_CAP {
        return;
    }
    let mut stream = body.into_data_stream();
    let drain = async { while let Some(Ok(_)) = stream.next().await {} };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), drain).await;
}

/// `application/json`, with or without parameters such as `charset`.
pub(super) fn is_json(headers: &HeaderMap) -> bool {
    BodyFormat::Json.accepts(
        headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok()),
    )
}
