//! A batch source's delivery (`batch = true`, docs/contract.md, batches): a JSON array of
//! events (SendGrid's Event Webhook). Verified once over the raw bytes; each element read
//! by the source's contract as a body of its own (its body the exact slice it was sent
//! as); then every element logged, with its own dedup, in one durable transaction, and
//! the delivery answered only after it commits. A bad element is a 400 naming its index,
//! and nothing of the batch is kept.

use axum::http::HeaderMap;
use tracing::warn;

use super::{
    answer_logged, body_key, log_decision, refund_rate_tokens, take_rate_tokens, verify_signature,
    Answer, ReadBody, Target,
};
use crate::config::SourceConfig;
use crate::domain::kind::json::batch::split_batch;
use crate::domain::kind::{Delivery, EventFields};
use crate::http::AppState;
use crate::operations::metrics;
use crate::store::{Admission, BatchAdmission, NewEvent, Refusal, SettleAt};

/// Steps 5–9 of docs/contract.md (ingress) for a batch: the signature, every element's
/// contract, then the limits and the store, all or nothing.
pub(super) async fn check_and_log(
    state: &AppState,
    source: &SourceConfig,
    target: &Target<'_>,
    headers: &HeaderMap,
    read: ReadBody,
    max_events: usize,
) -> Answer {
    // The body's share of the buffer budget is kept until the batch is answered.
    let ReadBody { body, hold: _hold } = read;
    let received_at_ms = state.clock.now_ms();
    let verified =
        match verify_signature(state, source, target, headers, &body, received_at_ms).await {
            // The secret that verified matters only to a handshake's answer.
            Ok((verified, _secret)) => verified,
            Err(refused) => return refused,
        };
    let elements = match split_batch(&body, max_events) {
        Ok(elements) => elements,
        Err(err) => {
            warn!(source = %source.name, problems = %err, "invalid batch");
            metrics::invalid_payload(&source.name);
            return Answer::InvalidPayload(err.problems);
        }
    };
    // Each element's fields, whether its type is ignored; `None`: ignored, no readable id.
    let mut parsed: Vec<Option<(EventFields, bool)>> = Vec::with_capacity(elements.len());
    for (index, element) in elements.iter().enumerate() {
        let delivery_id = verified.delivery_id.as_deref();
        match source.kind.parse(element, headers, delivery_id) {
            Ok(Delivery::Event(event)) => parsed.push(Some((event, false))),
            Ok(Delivery::Ignored {
                event: Some(event), ..
            }) => parsed.push(Some((event, true))),
            Ok(Delivery::Ignored { event: None, .. }) => parsed.push(None),
            Err(err) => {
                warn!(source = %source.name, index, problems = %err, "invalid batch element");
                metrics::invalid_payload(&source.name);
                return Answer::InvalidBatchElement {
                    index,
                    problems: err.problems,
                };
            }
        }
    }
    if parsed.iter().all(Option::is_none) {
        return answer(state, source, &parsed, Vec::new());
    }
    // A rate limit counts events: one token per element to log, all or none, so a batch
    // over the tokens left is refused whole and keeps nothing (docs/contract.md, batches).
    let events = parsed.iter().flatten().count() as u64;
    let charged = match take_rate_tokens(state, source, events) {
        Ok(charged) => charged,
        Err(wait) => {
            return Answer::RateLimited {
                retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
            }
        }
    };
    let backlog = super::backlog_of(state, source);
    let counted = parsed.iter().flatten().any(|(_, ignored)| !ignored);
    if counted && backlog >= source.max_backlog {
        warn!(source = %source.name, backlog, "backlog over max_backlog: batch refused");
        refund_rate_tokens(state, source, charged);
        return Answer::BacklogFull;
    }
    let rules = crate::store::SourceRules::for_source(source, &state.config.destinations);
    let kept = crate::ingress::kept_headers::keep(headers, &source.keep_headers);
    // A signed content is the whole batch's: each element's key adds its place in the array.
    let batch_key = body_key(source, &verified);
    let events: Vec<(&EventFields, bool, &[u8], usize)> = parsed
        .iter()
        .zip(&elements)
        .enumerate()
        .filter_map(|(index, (p, element))| {
            p.as_ref()
                .map(|(e, ignored)| (e, *ignored, *element, index))
        })
        .collect();
    let new: Vec<NewEvent<'_>> = events
        .iter()
        .map(|(event, ignored, element, index)| NewEvent {
            headers: &kept,
            source: &source.name,
            event,
            body: element,
            received_at_ms,
            signed_at: verified.signed_at,
            limits: crate::store::IngestLimits::for_source(source),
            ignored: *ignored,
            body_key: batch_key.for_element(*index),
            search_fields: &source.search_fields,
        })
        .collect();
    let settle: Vec<SettleAt<'_>> = events
        .iter()
        .map(|(_, ignored, _, _)| super::settle_at(source, (!ignored).then_some(&rules)))
        .collect();
    let admissions = match state.store.ingest_batch(&new, &settle).await {
        Ok(BatchAdmission::Logged(admissions)) => admissions,
        Ok(BatchAdmission::Refused { index, refusal }) => {
            refund_rate_tokens(state, source, charged);
            warn!(source = %source.name, index, "a limit refused a batch element: batch refused");
            return match refusal {
                Refusal::BacklogFull => Answer::BacklogFull,
                Refusal::AggregateBacklogFull => Answer::AggregateBacklogFull,
            };
        }
        Err(err) => {
            refund_rate_tokens(state, source, charged);
            return super::store_failed(source, err, "batch");
        }
    };
    // As for one delivery: only an element logged new (or an id resent with another body)
    // spends its token; the duplicates' come back.
    let unspent = admissions
        .iter()
        .filter(|admission| !super::spends_rate_token(admission))
        .count() as u64;
    refund_rate_tokens(state, source, unspent.min(charged));
    answer(state, source, &parsed, admissions)
}

/// The batch's answer: each element's, in order, as a single delivery's (its metrics and
/// decision line included); `admissions` are those of the elements logged, in order.
fn answer(
    state: &AppState,
    source: &SourceConfig,
    parsed: &[Option<(EventFields, bool)>],
    admissions: Vec<Admission>,
) -> Answer {
    let mut admissions = admissions.into_iter();
    let events = parsed
        .iter()
        .map(|element| {
            let Some((event, ignored)) = element else {
                return Answer::Unsupported { event_id: None };
            };
            let Some(admission) = admissions.next() else {
                return Answer::Internal;
            };
            if let Admission::Logged {
                out_of_order: true, ..
            } = &admission
            {
                metrics::out_of_order(&source.name);
            }
            let answer = answer_logged(state, source, event, *ignored, Ok(admission));
            log_decision(source, event, &answer);
            answer
        })
        .map(|answer| {
            answer
                .delivery_body()
                .map(|(_, body)| body)
                .ok_or("an element's answer is a delivery's")
        })
        .collect::<Result<Vec<_>, _>>();
    match events {
        Ok(events) => Answer::Batch { events },
        Err(problem) => {
            tracing::error!(source = %source.name, problem, "a batch element has no answer");
            Answer::Internal
        }
    }
}
