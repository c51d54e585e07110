//! `[[alerts]]` (docs/configuration.md, alerts): what an operator must hear about, and where
//! the notices go, validated at start. Every refusal names the rule and the key.

use serde::Deserialize;

use super::{ConfigError, DestinationConfig, SourceConfig};
use crate::ingress::signature::Secret;
use crate::operations::alerts::rules::{Condition, On, Rejected};

/// The window of a `rejections` rule when `per_s` is unset.
const DEFAULT_PER_S: u64 = 60;

/// Where one rule's notices go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Channel {
    /// A `[[destinations]]` entry, by name: signed and retried as events are.
    Destination(String),
    /// A Slack incoming webhook (the URL is its credential).
    Slack(Secret),
    /// Email over SMTP.
    Email {
        /// `smtp://` or `smtps://` URL, credentials included (a secret).
        smtp_url: Secret,
        /// The recipients.
        to: Vec<String>,
        /// The sender address.
        from: String,
        /// Certificates (PEM) trusted beside the system's for the SMTP server's TLS
        /// (`smtp_tls_ca_file`): a private CA's.
        tls_ca_file: Option<std::path::PathBuf>,
    },
}

/// One `[[alerts]]` rule, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlertRule {
    /// The rule's name, sent as `alert`.
    pub name: String,
    /// What fires it.
    pub condition: Condition,
    /// Where its notices go (at least one).
    pub channels: Vec<Channel>,
}

/// One recipient or several.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Recipients {
    One(String),
    Many(Vec<String>),
}

/// An `[[alerts]]` table as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileAlert {
    name: String,
    on: String,
    source: Option<String>,
    over: Option<u64>,
    after_s: Option<u64>,
    per_s: Option<u64>,
    rejected: Option<String>,
    repeat_s: Option<u64>,
    destination: Option<String>,
    slack_webhook_url: Option<String>,
    smtp_url: Option<String>,
    email_to: Option<Recipients>,
    email_from: Option<String>,
    smtp_tls_ca_file: Option<std::path::PathBuf>,
}

fn refused(rule: &str, key: &str, why: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("alert {rule:?}: {key} {why}"))
}

/// Validates the file's alert rules against the configured sources and destinations.
pub(super) fn alerts(
    file: Vec<FileAlert>,
    sources: &[SourceConfig],
    destinations: &[DestinationConfig],
) -> Result<Vec<AlertRule>, ConfigError> {
    let mut out: Vec<AlertRule> = Vec::with_capacity(file.len());
    for alert in file {
        super::check_name("alert", &alert.name)?;
        if out.iter().any(|o| o.name == alert.name) {
            return Err(ConfigError(format!(
                "alert {:?} is configured twice",
                alert.name
            )));
        }
        out.push(alert_rule(alert, sources, destinations)?);
    }
    Ok(out)
}

fn alert_rule(
    a: FileAlert,
    sources: &[SourceConfig],
    destinations: &[DestinationConfig],
) -> Result<AlertRule, ConfigError> {
    let name = a.name;
    let on = On::parse(&a.on).ok_or_else(|| {
        let all: Vec<_> = On::ALL.iter().map(|on| on.as_str()).collect();
        refused(&name, "on", format!("must be one of {}", all.join(", ")))
    })?;
    let source_rule = matches!(
        on,
        On::Dead | On::GapHeld | On::Rejections | On::Backlog | On::SourceSilent
    );
    if let Some(source) = &a.source {
        if !source_rule {
            return Err(refused(
                &name,
                "source",
                format!("does not apply to on = {:?}", on.as_str()),
            ));
        }
        if !sources.iter().any(|s| s.name == *source) {
            return Err(refused(
                &name,
                "source",
                format!("{source:?} is not a configured source"),
            ));
        }
    }
    let fits = |key: &str, given: bool, fits: bool| {
        if given && !fits {
            Err(refused(
                &name,
                key,
                format!("does not apply to on = {:?}", on.as_str()),
            ))
        } else {
            Ok(())
        }
    };
    let counted = matches!(
        on,
        On::Dead | On::DestinationFailing | On::Rejections | On::Backlog
    );
    fits("over", a.over.is_some(), counted)?;
    fits("after_s", a.after_s.is_some(), !counted)?;
    fits("per_s", a.per_s.is_some(), on == On::Rejections)?;
    fits("rejected", a.rejected.is_some(), on == On::Rejections)?;
    let required = |key: &str, value: Option<u64>, needed: bool| match value {
        None if needed => Err(refused(
            &name,
            key,
            format!("is required for on = {:?}", on.as_str()),
        )),
        value => Ok(value.unwrap_or(0)),
    };
    let over = required("over", a.over, on == On::Backlog)?;
    let after_s = required(
        "after_s",
        a.after_s,
        matches!(on, On::GapHeld | On::SourceSilent),
    )?;
    let per_s = a.per_s.unwrap_or(DEFAULT_PER_S);
    if per_s == 0 {
        return Err(refused(&name, "per_s", "must be at least 1"));
    }
    let rejected = match a.rejected.as_deref() {
        None | Some("any") => Rejected::All,
        Some("signature") => Rejected::Signature,
        Some(_) => {
            return Err(refused(
                &name,
                "rejected",
                "must be \"any\" or \"signature\"",
            ))
        }
    };
    if a.repeat_s == Some(0) {
        return Err(refused(
            &name,
            "repeat_s",
            "must be at least 1 (leave it out for no repeats)",
        ));
    }
    let mut channels = Vec::new();
    if let Some(destination) = a.destination {
        if !destinations.iter().any(|d| d.name == destination) {
            return Err(refused(
                &name,
                "destination",
                format!("{destination:?} is not a configured [[destinations]] entry"),
            ));
        }
        channels.push(Channel::Destination(destination));
    }
    if let Some(url) = a.slack_webhook_url {
        // The URL is the webhook's credential: the refusal never shows it.
        let parsed = reqwest::Url::parse(&url)
            .map_err(|_| refused(&name, "slack_webhook_url", "is not a URL"))?;
        if !matches!(parsed.scheme(), "https" | "http") {
            return Err(refused(
                &name,
                "slack_webhook_url",
                "must be an https:// URL",
            ));
        }
        channels.push(Channel::Slack(Secret::new(url)));
    }
    match (a.smtp_url, a.email_to) {
        (Some(url), Some(to)) => {
            let parsed = reqwest::Url::parse(&url)
                .map_err(|_| refused(&name, "smtp_url", "is not a URL"))?;
            if !matches!(parsed.scheme(), "smtp" | "smtps") || parsed.host_str().is_none() {
                return Err(refused(
                    &name,
                    "smtp_url",
                    "must be smtp://host:port or smtps://host:port (user and password optional)",
                ));
            }
            let to = match to {
                Recipients::One(one) => vec![one],
                Recipients::Many(many) => many,
            };
            if to.is_empty() {
                return Err(refused(&name, "email_to", "names no recipient"));
            }
            for address in to.iter().chain(a.email_from.iter()) {
                if address.parse::<lettre::Address>().is_err() {
                    return Err(refused(
                        &name,
                        "email_to",
                        format!("{address:?} is not an email address"),
                    ));
                }
            }
            let from = a
                .email_from
                .unwrap_or_else(|| format!("inhook@{}", parsed.host_str().unwrap_or("localhost")));
            if from.parse::<lettre::Address>().is_err() {
                return Err(refused(
                    &name,
                    "email_from",
                    "is required: the SMTP host is no mail domain",
                ));
            }
            if let Some(path) = &a.smtp_tls_ca_file {
                let pem = std::fs::read(path).map_err(|err| {
                    refused(
                        &name,
                        "smtp_tls_ca_file",
                        format!("{}: cannot be read: {err}", path.display()),
                    )
                })?;
                if lettre::transport::smtp::client::Certificate::from_pem(&pem).is_err() {
                    return Err(refused(
                        &name,
                        "smtp_tls_ca_file",
                        format!("{}: holds no PEM certificate", path.display()),
                    ));
                }
            }
            channels.push(Channel::Email {
                smtp_url: Secret::new(url),
                to,
                from,
                tls_ca_file: a.smtp_tls_ca_file,
            });
        }
        (Some(_), None) => return Err(refused(&name, "email_to", "is required with smtp_url")),
        (None, _) if a.smtp_tls_ca_file.is_some() => {
            return Err(refused(&name, "smtp_tls_ca_file", "is only for smtp_url"))
        }
        (None, Some(_)) => return Err(refused(&name, "smtp_url", "is required with email_to")),
        (None, None) => {}
    }
    if channels.is_empty() {
        return Err(refused(
            &name,
            "destination",
            "(or slack_webhook_url, or smtp_url with email_to) is required: where the notices go",
        ));
    }
    Ok(AlertRule {
        name,
        condition: Condition {
            on,
            source: a.source,
            over,
            after_s,
            per_s,
            rejected,
            repeat_s: a.repeat_s,
        },
        channels,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::Config;

    const BASE: &str = r#"
[[sources]]
name = "stripe"
kind = "presence"
secrets = ["s3cret-value-long-enough"]

[[destinations]]
name = "ops"
url = "https://ops.example.com/hooks"
sources = ["stripe"]
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"#;

    fn load(alerts: &str) -> Result<Config, String> {
        Config::from_parts(Some(&format!("{BASE}\n{alerts}")), &HashMap::new())
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_rule_reads_its_bounds_and_channels() {
        let config = load(
            r#"
[[alerts]]
name = "forged"
on = "rejections"
rejected = "signature"
source = "stripe"
over = 5
per_s = 30
repeat_s = 600
destination = "ops"
slack_webhook_url = "https://hooks.slack.com/services/T/B/x"
smtp_url = "smtp://mail.example.com:25"
email_to = "oncall@example.com"
"#,
        )
        .unwrap();
        let rule = &config.observability.alerts[0];
        assert_eq!(rule.name, "forged");
        assert_eq!(rule.condition.on, On::Rejections);
        assert_eq!(rule.condition.rejected, Rejected::Signature);
        assert_eq!((rule.condition.over, rule.condition.per_s), (5, 30));
        assert_eq!(rule.condition.repeat_s, Some(600));
        assert_eq!(rule.channels.len(), 3);
        assert!(matches!(&rule.channels[2], Channel::Email { to, from, .. }
            if to == &["oncall@example.com"] && from == "inhook@mail.example.com"));
        assert_eq!(
            config.observability.alert_tick_ms,
            crate::config::Observability::default().alert_tick_ms
        );
    }

    #[test]
    fn what_cannot_work_is_refused_at_start_naming_the_rule_and_key() {
        let cases = [
            (
                "name = \"a\"\non = \"dead\"\ndestination = \"nowhere\"",
                "alert \"a\": destination \"nowhere\" is not a configured [[destinations]] entry",
            ),
            (
                "name = \"a\"\non = \"late\"\ndestination = \"ops\"",
                "alert \"a\": on must be one of dead, gap_held",
            ),
            (
                "name = \"a\"\non = \"dead\"",
                "alert \"a\": destination (or slack_webhook_url",
            ),
            (
                "name = \"a\"\non = \"dead\"\ndestination = \"ops\"\nsmtp_tls_ca_file = \"/etc/hostname\"",
                "alert \"a\": smtp_tls_ca_file is only for smtp_url",
            ),
            (
                "name = \"a\"\non = \"dead\"\nsmtp_url = \"smtps://mail.example.com\"\n\
                 email_to = \"ops@example.com\"\nsmtp_tls_ca_file = \"/nonexistent/ca.pem\"",
                "alert \"a\": smtp_tls_ca_file /nonexistent/ca.pem: cannot be read",
            ),
            (
                "name = \"a\"\non = \"backlog\"\ndestination = \"ops\"",
                "alert \"a\": over is required for on = \"backlog\"",
            ),
            (
                "name = \"a\"\non = \"source_silent\"\ndestination = \"ops\"",
                "alert \"a\": after_s is required",
            ),
            (
                "name = \"a\"\non = \"dead\"\nafter_s = 3\ndestination = \"ops\"",
                "alert \"a\": after_s does not apply to on = \"dead\"",
            ),
            (
                "name = \"a\"\non = \"circuit_open\"\nsource = \"stripe\"\ndestination = \"ops\"",
                "alert \"a\": source does not apply",
            ),
            (
                "name = \"a\"\non = \"dead\"\nsource = \"github\"\ndestination = \"ops\"",
                "alert \"a\": source \"github\" is not a configured source",
            ),
            (
                "name = \"a\"\non = \"dead\"\nsmtp_url = \"smtp://mail.example.com\"",
                "alert \"a\": email_to is required with smtp_url",
            ),
            (
                "name = \"a\"\non = \"dead\"\nslack_webhook_url = \"ftp://x/secret-token\"",
                "alert \"a\": slack_webhook_url must be an https:// URL",
            ),
        ];
        for (rule, expected) in cases {
            let err = load(&format!("[[alerts]]\n{rule}\n")).unwrap_err();
            assert!(err.contains(expected), "{rule}: {err}");
            assert!(!err.contains("secret-token"), "{err}");
        }
        let twice = "[[alerts]]\nname = \"a\"\non = \"dead\"\ndestination = \"ops\"\n";
        let err = load(&format!("{twice}{twice}")).unwrap_err();
        assert!(err.contains("alert \"a\" is configured twice"), "{err}");
    }
}
