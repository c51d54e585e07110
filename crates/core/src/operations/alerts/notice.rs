//! What a notice says, in each receiver's words (docs/configuration.md, alerts): the JSON
//! body a destination receives, Slack's message, and an email's subject and text.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::domain::clock;
use crate::store::alerts::AlertRecord;

/// The JSON body of a notice sent to a `[[destinations]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NoticeBody<'a> {
    /// The rule's name.
    pub alert: &'a str,
    /// `firing` or `resolved`.
    pub state: &'a str,
    /// What the rule watches.
    pub on: &'a str,
    /// The source it is about, for source rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source: Option<&'a str>,
    /// The destination it is about, for destination rules.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub destination: Option<&'a str>,
    /// When the alert started firing (RFC 3339).
    pub since: String,
    /// When this notice was decided (RFC 3339).
    pub at: String,
    /// Whether it repeats a firing notice already sent.
    pub repeat: bool,
    /// One line a person reads.
    pub summary: &'a str,
    /// The figures that fired it.
    pub figures: &'a BTreeMap<String, i64>,
    /// The node that decided it, for a notice about that node's own view.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<&'a str>,
}

impl<'a> NoticeBody<'a> {
    /// The body of the kept notice `alert`.
    pub fn of(alert: &'a AlertRecord) -> Self {
        Self {
            alert: &alert.alert,
            state: &alert.state,
            on: &alert.on,
            source: alert.source.as_deref(),
            destination: alert.destination.as_deref(),
            since: clock::rfc3339(alert.since_ms),
            at: clock::rfc3339(alert.at_ms),
            repeat: alert.repeat,
            summary: &alert.summary,
            figures: &alert.figures,
            node: alert.node.as_deref(),
        }
    }
}

/// One line naming the alert and its state: a Slack message's text, an email's subject.
pub fn headline(alert: &AlertRecord) -> String {
    let state = match (alert.state.as_str(), alert.repeat) {
        ("firing", true) => "still firing",
        (state, _) => state,
    };
    let subject = alert
        .source
        .as_deref()
        .or(alert.destination.as_deref())
        .map(|s| format!(" ({s})"))
        .unwrap_or_default();
    format!(
        "[inhook] {} {state}{subject}: {}",
        alert.alert, alert.summary
    )
}

/// The figures as `name = value` pairs, one line.
fn figures_line(alert: &AlertRecord) -> String {
    let pairs: Vec<String> = alert
        .figures
        .iter()
        .map(|(name, value)| format!("{name} = {value}"))
        .collect();
    pairs.join(", ")
}

/// A Slack incoming webhook's message: `text` (shown in notifications) and blocks.
pub fn slack_message(alert: &AlertRecord) -> serde_json::Value {
    let mark = if alert.state == "resolved" {
        ":white_check_mark:"
    } else {
        ":rotating_light:"
    };
    serde_json::json!({
        "text": headline(alert),
        "blocks": [
            {
                "type": "section",
                "text": {
                    "type": "mrkdwn",
                    "text": format!("{mark} *{}* {}\n{}", alert.alert, alert.state, alert.summary),
                },
            },
            {
                "type": "context",
                "elements": [{
                    "type": "mrkdwn",
                    "text": format!(
                        "on `{}` · since {} · {}",
                        alert.on,
                        clock::rfc3339(alert.since_ms),
                        figures_line(alert)
                    ),
                }],
            },
        ],
    })
}

/// An email's text body.
pub fn email_text(alert: &AlertRecord) -> String {
    let mut text = format!(
        "{}\n\nalert: {}\nstate: {}\non: {}\n",
        alert.summary, alert.alert, alert.state, alert.on
    );
    if let Some(source) = &alert.source {
        text.push_str(&format!("source: {source}\n"));
    }
    if let Some(destination) = &alert.destination {
        text.push_str(&format!("destination: {destination}\n"));
    }
    if let Some(node) = &alert.node {
        text.push_str(&format!("node: {node}\n"));
    }
    text.push_str(&format!(
        "since: {}\nat: {}\nfigures: {}\n",
        clock::rfc3339(alert.since_ms),
        clock::rfc3339(alert.at_ms),
        figures_line(alert)
    ));
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alert() -> AlertRecord {
        AlertRecord {
            id: 1,
            alert: "dead-events".into(),
            state: "firing".into(),
            on: "dead".into(),
            source: Some("stripe".into()),
            destination: None,
            since_ms: 1_700_000_000_000,
            at_ms: 1_700_000_000_000,
            repeat: false,
            summary: "2 dead events in stripe (alert over 0)".into(),
            figures: BTreeMap::from([("dead".into(), 2), ("over".into(), 0)]),
            node: None,
            channels: Vec::new(),
        }
    }

    #[test]
    fn the_body_carries_the_contract_fields() {
        let alert = alert();
        let body = serde_json::to_value(NoticeBody::of(&alert)).unwrap();
        assert_eq!(body["alert"], "dead-events");
        assert_eq!(body["state"], "firing");
        assert_eq!(body["on"], "dead");
        assert_eq!(body["source"], "stripe");
        assert!(body.get("destination").is_none());
        assert!(body.get("node").is_none(), "a shared alert names no node");
        assert_eq!(body["since"], "2023-11-14T22:13:20Z");
        assert_eq!(body["figures"]["dead"], 2);
    }

    #[test]
    fn slack_gets_text_and_blocks() {
        let message = slack_message(&alert());
        assert_eq!(
            message["text"],
            "[inhook] dead-events firing (stripe): 2 dead events in stripe (alert over 0)"
        );
        assert_eq!(message["blocks"][0]["type"], "section");
        assert!(message["blocks"][1]["elements"][0]["text"]
            .as_str()
            .unwrap()
            .contains("dead = 2"));
    }
}
