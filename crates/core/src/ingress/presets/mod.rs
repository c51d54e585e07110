//! Presets (docs/providers.md): one named table of source keys per publisher, kept as
//! data in `src/presets/NAME.toml`, merged under a `[[sources]]` table that says
//! `preset = "NAME"` (any key the source writes wins). Pure: text in, tables out.
//!
//! A preset file holds the source keys, then an `[about]` table (publisher, what the
//! secret is, what the user must set) that is never merged.

use crate::config::env_vars::{public_keys_env_var, secret_env_var, sns_topic_arns_env_var};

/// Every preset, by name, in the order `inhook presets` lists them.
pub const ALL: [(&str, &str); 39] = [
    ("stripe", include_str!("stripe.toml")),
    ("github", include_str!("github.toml")),
    ("gitlab", include_str!("gitlab.toml")),
    ("bitbucket", include_str!("bitbucket.toml")),
    ("shopify", include_str!("shopify.toml")),
    ("slack-events", include_str!("slack-events.toml")),
    (
        "slack-interactivity",
        include_str!("slack-interactivity.toml"),
    ),
    ("slack-commands", include_str!("slack-commands.toml")),
    (
        "discord-interactions",
        include_str!("discord-interactions.toml"),
    ),
    ("twilio", include_str!("twilio.toml")),
    ("sendgrid-events", include_str!("sendgrid-events.toml")),
    ("mailgun", include_str!("mailgun.toml")),
    ("postmark", include_str!("postmark.toml")),
    ("resend", include_str!("resend.toml")),
    ("clerk", include_str!("clerk.toml")),
    ("standard-webhooks", include_str!("standard-webhooks.toml")),
    ("zoom", include_str!("zoom.toml")),
    ("twitch-eventsub", include_str!("twitch-eventsub.toml")),
    ("linear", include_str!("linear.toml")),
    ("intercom", include_str!("intercom.toml")),
    ("hubspot", include_str!("hubspot.toml")),
    ("square", include_str!("square.toml")),
    ("paddle", include_str!("paddle.toml")),
    ("lemonsqueezy", include_str!("lemonsqueezy.toml")),
    ("pagerduty", include_str!("pagerduty.toml")),
    ("sentry", include_str!("sentry.toml")),
    ("vercel", include_str!("vercel.toml")),
    ("typeform", include_str!("typeform.toml")),
    ("calendly", include_str!("calendly.toml")),
    ("workos", include_str!("workos.toml")),
    ("mux", include_str!("mux.toml")),
    ("notion", include_str!("notion.toml")),
    ("x-activity", include_str!("x-activity.toml")),
    ("msgraph", include_str!("msgraph.toml")),
    ("dropbox", include_str!("dropbox.toml")),
    ("okta-event-hooks", include_str!("okta-event-hooks.toml")),
    ("aws-sns", include_str!("aws-sns.toml")),
    ("zendesk", include_str!("zendesk.toml")),
    ("trello", include_str!("trello.toml")),
];

/// One preset: its name and its file's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// The name a source's `preset` key gives.
    pub name: &'static str,
    /// The file, as embedded.
    pub text: &'static str,
}

/// What the listing and `inhook presets NAME` say of a preset, from its `[about]` table
/// and its keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct About {
    /// Who sends the webhooks.
    pub publisher: String,
    /// The `signature` scheme.
    pub scheme: String,
    /// The `handshake`, if any.
    pub handshake: Option<String>,
    /// What the source's secret is, in the publisher's words.
    pub secret: Option<String>,
    /// Whether `public_url` must be set (the signature covers the URL).
    pub public_url: bool,
    /// Whether the source verifies with `public_keys` rather than secrets.
    pub public_key: Option<String>,
    /// What the source's `sns_topic_arns` are, for a preset that needs topics rather than
    /// a secret (`aws-sns`).
    pub topics: Option<String>,
}

impl Preset {
    /// The preset named `name`.
    pub fn find(name: &str) -> Option<Self> {
        ALL.iter()
            .find(|(n, _)| *n == name)
            .map(|(name, text)| Self { name, text })
    }

    /// Every preset, in listing order.
    pub fn all() -> impl Iterator<Item = Self> {
        ALL.iter().map(|(name, text)| Self { name, text })
    }

    /// The source keys merged under a source (`[about]` dropped).
    pub fn keys(&self) -> Result<toml::Table, String> {
        let mut table: toml::Table = toml::from_str(self.text)
            .map_err(|e| format!("preset {:?} does not parse: {e}", self.name))?;
        table.remove("about");
        Ok(table)
    }

    /// What the listing shows.
    pub fn about(&self) -> Result<About, String> {
        let full: toml::Table = toml::from_str(self.text)
            .map_err(|e| format!("preset {:?} does not parse: {e}", self.name))?;
        let about = full.get("about").and_then(|a| a.as_table());
        let text = |key: &str| {
            about
                .and_then(|a| a.get(key))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        let keys = self.keys()?;
        let key = |k: &str| keys.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let uses_url = key("signed_content").is_some_and(|c| c.contains("{url}"))
            || key("signature").as_deref() == Some("twilio");
        Ok(About {
            publisher: text("publisher").unwrap_or_else(|| self.name.to_owned()),
            scheme: key("signature").unwrap_or_default(),
            // The aws-sns scheme confirms its subscription itself.
            handshake: key("handshake").or_else(|| {
                (key("signature").as_deref() == Some("aws-sns")).then(|| "aws-sns".to_owned())
            }),
            secret: text("secret"),
            public_url: uses_url,
            public_key: text("public_key"),
            topics: text("topics"),
        })
    }

    /// A `[[sources]]` table ready to paste: the name set to the preset's, the preset's
    /// keys as its file writes them, and comment lines
    /// for what the user must set.
    pub fn paste(&self) -> Result<String, String> {
        let about = self.about()?;
        let mut out = String::new();
        out.push_str(&format!(
            "# {} (inhook preset {:?}; docs/providers.md)\n",
            about.publisher, self.name
        ));
        out.push_str("[[sources]]\n");
        out.push_str(&format!("name = {:?}\n", self.name));
        // The `[[types]]` tables go last, as `[[sources.types]]`: a key written after them
        // would be one of the last entry's.
        let mut tables = String::new();
        let mut in_table = false;
        for line in self.text.lines() {
            if line.trim_start().starts_with("[about]") {
                break;
            }
            if line.trim().is_empty() {
                continue;
            }
            if line.trim() == "[[types]]" {
                in_table = true;
                tables.push_str("\n[[sources.types]]\n");
                continue;
            }
            let to = if in_table { &mut tables } else { &mut out };
            to.push_str(line);
            to.push('\n');
        }
        let env = secret_env_var(self.name);
        match (&about.public_key, &about.topics) {
            (_, Some(what)) => out.push_str(&format!(
                "# sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"]   # required: {what}; or set {} (comma-separated)\n",
                sns_topic_arns_env_var(self.name)
            )),
            (Some(what), None) => out.push_str(&format!(
                "# public_keys = [\"…\"]        # {what} (or {})\n",
                public_keys_env_var(self.name)
            )),
            (None, None) => out.push_str(&format!(
                "# secrets = [\"…\"]            # {}; or set {env}\n",
                about
                    .secret
                    .as_deref()
                    .unwrap_or("the publisher's signing secret")
            )),
        }
        if about.public_url {
            out.push_str(
                "# public_url = \"https://hooks.example.com\"   # required: the base URL the publisher calls (top level or here)\n",
            );
        }
        out.push_str(&tables);
        Ok(out)
    }
}

/// The presets whose names are close to `name` (a typo, a missing suffix), best first.
pub fn close_names(name: &str) -> Vec<&'static str> {
    let mut scored: Vec<(usize, &'static str)> = ALL
        .iter()
        .map(|(n, _)| (*n, distance(name, n)))
        .filter(|(n, d)| *d <= 3 || n.starts_with(name) || name.starts_with(n) || n.contains(name))
        .map(|(n, d)| (d, n))
        .collect();
    scored.sort();
    scored.into_iter().map(|(_, n)| n).take(5).collect()
}

/// Levenshtein distance between `a` and `b`, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// Merges `preset`'s keys under `source` (the source's own keys win) and answers the
/// keys that came from the preset, in the preset's order.
pub fn merge(source: &mut toml::Table, preset: &Preset) -> Result<Vec<String>, String> {
    let mut taken = Vec::new();
    for (key, value) in preset.keys()? {
        if !source.contains_key(&key) {
            source.insert(key.clone(), value);
            taken.push(key);
        }
    }
    Ok(taken)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses_and_names_its_publisher_and_scheme() {
        assert_eq!(ALL.len(), 39);
        for preset in Preset::all() {
            let keys = preset.keys().unwrap();
            assert_eq!(
                keys.get("kind").and_then(|v| v.as_str()),
                Some("json"),
                "{}",
                preset.name
            );
            let about = preset.about().unwrap();
            assert!(!about.scheme.is_empty(), "{} has no scheme", preset.name);
            assert_ne!(
                about.publisher, preset.name,
                "{} has no publisher",
                preset.name
            );
            assert!(!keys.contains_key("name"), "{} sets a name", preset.name);
            // docs/contract.md, missing locations: a preset never refuses a verified body.
            assert_eq!(
                keys.get("missing_locations").and_then(|v| v.as_str()),
                Some("unordered"),
                "{}",
                preset.name
            );
            assert!(
                !keys.contains_key("secrets"),
                "{} sets secrets",
                preset.name
            );
        }
    }

    #[test]
    fn names_are_unique_and_valid() {
        let mut names: Vec<&str> = ALL.iter().map(|(n, _)| *n).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), ALL.len());
    }

    #[test]
    fn close_names_catch_typos_and_prefixes() {
        assert_eq!(close_names("strpe")[0], "stripe");
        assert!(close_names("slack").contains(&"slack-events"));
        assert!(close_names("twitch").contains(&"twitch-eventsub"));
        assert!(close_names("zzzzzzzzzzzz").is_empty());
    }

    #[test]
    fn the_source_keys_win_over_the_preset() {
        let mut source: toml::Table =
            toml::from_str("name = \"s\"\nordering = \"unordered\"").unwrap();
        let taken = merge(&mut source, &Preset::find("stripe").unwrap()).unwrap();
        assert_eq!(source["ordering"].as_str(), Some("unordered"));
        assert!(!taken.contains(&"ordering".to_owned()));
        assert!(taken.contains(&"signature".to_owned()));
        assert!(!source.contains_key("about"));
    }

    proptest::proptest! {
        #[test]
        fn the_merged_table_is_the_source_over_the_preset(
            which in 0..ALL.len(),
            own in proptest::collection::btree_map("[a-z_]{1,12}", "[a-z]{0,8}", 0..8),
        ) {
            let preset = Preset::all().nth(which).unwrap();
            let mut source: toml::Table = own
                .iter()
                .map(|(k, v)| (k.clone(), toml::Value::String(v.clone())))
                .collect();
            let taken = merge(&mut source, &preset).unwrap();
            let keys = preset.keys().unwrap();
            for (k, v) in &own {
                proptest::prop_assert_eq!(source[k].as_str(), Some(v.as_str()));
                proptest::prop_assert!(!taken.contains(k));
            }
            for (k, v) in &keys {
                if !own.contains_key(k) {
                    proptest::prop_assert_eq!(&source[k], v);
                    proptest::prop_assert!(taken.contains(k));
                }
            }
            proptest::prop_assert_eq!(source.len(), own.len() + taken.len());
        }
    }

    #[test]
    fn the_aws_sns_paste_asks_for_its_topics_and_no_secret() {
        let text = Preset::find("aws-sns").unwrap().paste().unwrap();
        assert!(
            text.contains("\n# sns_topic_arns = [\"arn:aws:sns:us-east-1:123456789012:orders\"]   # required: ")
                && text.contains("INHOOK_AWS_SNS_SNS_TOPIC_ARNS"),
            "{text}"
        );
        assert!(
            !text.contains("secrets") && !text.contains("public_keys"),
            "{text}"
        );
    }

    #[test]
    fn a_pasted_preset_keeps_its_types_under_the_source() {
        let text = Preset::find("github").unwrap().paste().unwrap();
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        let source = parsed["sources"].as_array().unwrap()[0].as_table().unwrap();
        let keys = Preset::find("github").unwrap().keys().unwrap();
        assert_eq!(source["types"], keys["types"]);
        assert!(!parsed.contains_key("types"));
    }

    #[test]
    fn paste_sets_the_name_and_says_what_to_set() {
        let text = Preset::find("hubspot").unwrap().paste().unwrap();
        assert!(text.contains("[[sources]]\nname = \"hubspot\"\n"));
        assert!(text.contains("INHOOK_HUBSPOT_SECRET"));
        assert!(text.contains("# public_url ="));
        assert!(!text.contains("[about]"));
        let parsed: toml::Table = toml::from_str(&text).unwrap();
        assert!(parsed.contains_key("sources"));
    }
}
