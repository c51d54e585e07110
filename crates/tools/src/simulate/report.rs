//! The report `inhook simulate` prints at the end of a run: what was planned,
//! what was sent and answered, and every aggregate that did not converge.

use std::collections::BTreeMap;
use std::time::Duration;

use super::chaos::{EventCopy, Plan};
use super::convergence::Mismatch;
use super::publisher::DeliveryReport;

/// Failures and mismatches listed one by one; the rest are only counted.
const LISTED: usize = 5;

/// The report of a run; `mismatches` is the reason they were not checked, if they were not.
pub(super) fn render(
    plan: &Plan,
    delivery: &DeliveryReport,
    mismatches: Result<&[Mismatch], String>,
    elapsed: Duration,
) -> String {
    let same = plan.count(EventCopy::SameEventId);
    let new = plan.count(EventCopy::NewEventId);
    let mut lines = vec![
        format!(
            "  deliveries:  {} planned, {} requests sent ({} resends in flight, {} retries)",
            plan.deliveries.len(),
            delivery.tally.requests,
            plan.resends(),
            delivery.tally.retries
        ),
        format!(
            "  duplicates:  {} ({same} same event_id, {new} new event_id with the same idempotency_key)",
            same + new
        ),
        format!(
            "  reordered:   {} events started after a higher sequence of their aggregate",
            plan.reordered
        ),
        format!("  answers:     {}", histogram(&delivery.tally.codes)),
        format!("  statuses:    {}", histogram(&delivery.tally.statuses)),
        format!("  failures:    {}", delivery.failures.len()),
    ];
    let unsupported = plan.deliveries.iter().filter(|d| d.unsupported).count();
    if unsupported > 0 {
        lines.insert(
            3,
            format!(
                "  unsupported: {unsupported} deliveries of types outside event_types \
                 (each must be answered {IGNORED}, or {DUPLICATE} when redelivered)"
            ),
        );
    }
    lines.extend(
        delivery
            .failures
            .iter()
            .take(LISTED)
            .map(|why| format!("    {why}")),
    );
    match mismatches {
        Ok(m) => {
            lines.push(format!("mismatches: {}", m.len()));
            lines.extend(m.iter().take(LISTED).map(|m| {
                format!(
                    "    {}: expected {}, got {}",
                    m.aggregate, m.expected, m.got
                )
            }));
        }
        Err(why) => lines.push(format!("mismatches: not checked ({why})")),
    }
    lines.push(format!(
        "  elapsed:     {:.1}s (delivery {:.1}s)",
        elapsed.as_secs_f64(),
        delivery.elapsed.as_secs_f64()
    ));
    lines.join("\n")
}

/// The answer a first delivery of a type outside `event_types` gets, and no other.
const IGNORED: &str = "ignored_unsupported";

/// A type outside `event_types` is logged, so its redeliveries (same event id, or a
/// new one with the same idempotency key, in whatever order they land) are duplicates.
const DUPLICATE: &str = "duplicate";

/// Deliveries answered 2xx with the wrong status for their type: a type outside
/// `event_types` must be `ignored_unsupported` (or a `duplicate` of such a delivery),
/// and only such a type may be `ignored_unsupported`.
pub(super) fn unexpected_answers(plan: &Plan, delivery: &DeliveryReport) -> Vec<String> {
    plan.deliveries
        .iter()
        .zip(&delivery.receipts)
        .filter_map(|(d, receipt)| {
            let receipt = receipt.as_ref()?;
            let ignored = receipt.status == IGNORED;
            let wrong = if d.unsupported {
                !ignored && receipt.status != DUPLICATE
            } else {
                ignored
            };
            wrong.then(|| {
                let want = if d.unsupported {
                    format!("{IGNORED} or {DUPLICATE}")
                } else {
                    format!("anything but {IGNORED}")
                };
                format!(
                    "{} (seq {}, {:?}) answered {} {}, expected {want}",
                    d.event_id, d.sequence, d.copy, receipt.code, receipt.status
                )
            })
        })
        .collect()
}

/// Counts as `key count` pairs in key order, or `none`.
fn histogram(counts: &BTreeMap<String, u64>) -> String {
    if counts.is_empty() {
        return "none".into();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::simulate::chaos::Delivery;
    use crate::simulate::publisher::Tally;
    use crate::simulate::stream::AggregateRef;

    fn delivery(copy: EventCopy, resend: bool) -> Delivery {
        Delivery {
            aggregate: 0,
            kind: inhook::domain::kind::SourceKind::Presence,
            sequence: 1,
            copy,
            event_id: "evt_1".into(),
            idempotency_key: None,
            body: Vec::new(),
            headers: Vec::new(),
            delivery_id: None,
            unsupported: false,
            resend,
        }
    }

    #[test]
    fn the_report_counts_the_plan_and_the_answers_and_lists_the_first_failures() {
        let plan = Plan {
            deliveries: vec![
                delivery(EventCopy::Original, true),
                delivery(EventCopy::SameEventId, false),
                delivery(EventCopy::NewEventId, false),
            ],
            reordered: 1,
        };
        let sent = DeliveryReport {
            tally: Tally {
                requests: 5,
                retries: 1,
                codes: BTreeMap::from([("200".into(), 3), ("503".into(), 1)]),
                statuses: BTreeMap::new(),
            },
            receipts: Vec::new(),
            failures: (0..7).map(|i| format!("failure {i}")).collect(),
            elapsed: Duration::from_millis(1_500),
        };
        let mismatch = Mismatch {
            aggregate: AggregateRef::User("usr_1".into()),
            expected: json!({"sequence": 2}),
            got: "404".into(),
        };
        let text = render(&plan, &sent, Ok(&[mismatch]), Duration::from_secs(3));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "  deliveries:  3 planned, 5 requests sent (1 resends in flight, 1 retries)"
        );
        assert!(lines[1].starts_with("  duplicates:  2 (1 same event_id, 1 new event_id"));
        assert!(lines[2].starts_with("  reordered:   1 events"));
        assert_eq!(lines[3], "  answers:     200 3, 503 1");
        assert_eq!(lines[4], "  statuses:    none");
        assert_eq!(lines[5], "  failures:    7");
        assert_eq!(
            lines[6..11],
            [
                "    failure 0",
                "    failure 1",
                "    failure 2",
                "    failure 3",
                "    failure 4"
            ]
        );
        assert_eq!(lines[11], "mismatches: 1");
        assert_eq!(
            lines[12],
            r#"    presence usr_1: expected {"sequence":2}, got 404"#
        );
        assert_eq!(lines[13], "  elapsed:     3.0s (delivery 1.5s)");
        assert_eq!(lines.len(), 14);

        let unchecked = render(
            &plan,
            &sent,
            Err("deliveries failed".into()),
            Duration::ZERO,
        );
        assert!(unchecked.contains("\nmismatches: not checked (deliveries failed)\n"));
    }

    #[test]
    fn an_unsupported_type_must_be_answered_ignored_or_duplicate_and_only_it_ignored() {
        let unsupported = Delivery {
            unsupported: true,
            ..delivery(EventCopy::Original, false)
        };
        let plan = Plan {
            deliveries: vec![
                unsupported.clone(),
                unsupported.clone(),
                unsupported,
                delivery(EventCopy::Original, false),
                delivery(EventCopy::SameEventId, false),
                delivery(EventCopy::NewEventId, false),
            ],
            reordered: 0,
        };
        let receipt = |status: &str| {
            Some(crate::simulate::publisher::Receipt {
                code: 200,
                status: status.into(),
                key: None,
            })
        };
        let sent = DeliveryReport {
            receipts: vec![
                receipt("ignored_unsupported"),
                receipt("applied"),
                // A redelivery of a logged ignored type.
                receipt("duplicate"),
                receipt("applied"),
                receipt("ignored_unsupported"),
                None,
            ],
            ..DeliveryReport::default()
        };
        assert_eq!(
            unexpected_answers(&plan, &sent),
            [
                "evt_1 (seq 1, Original) answered 200 applied, expected ignored_unsupported or duplicate",
                "evt_1 (seq 1, SameEventId) answered 200 ignored_unsupported, expected anything but ignored_unsupported",
            ]
        );
        let text = render(&plan, &sent, Ok(&[]), Duration::ZERO);
        assert!(
            text.lines()
                .nth(3)
                .unwrap()
                .starts_with("  unsupported: 3 deliveries of types outside event_types"),
            "{text}"
        );
    }
}
