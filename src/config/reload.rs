//! What a reload (SIGHUP or `POST /v1/admin/reload`) may take from a freshly read config.
//! Only secrets change without a restart, so a config that would need more is refused
//! whole: the running sources keep serving with the secrets in force. Destinations follow
//! the same rule: a destination's secret may rotate; any other key of a running one, or
//! dropping it, needs a restart (its queues, leases and circuit are built from them);
//! a new destination is forwarded to from the restart on.

use super::{Config, ConfigError};

/// What a reload of a config that passed [`check_reload`] does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReloadPlan {
    /// Running sources whose secrets are now those of the config read.
    pub sources: usize,
    /// Running sources whose secrets come from `INHOOK_<SOURCE>_SECRET`: edits to the
    /// file's secrets changed nothing for them.
    pub from_environment: Vec<String>,
    /// Sources new in the file: not served until a restart.
    pub not_served_until_restart: Vec<String>,
    /// Running destinations whose secret is now that of the config read.
    pub destinations: usize,
    /// Running destinations whose secret comes from `INHOOK_DEST_<NAME>_SECRET`.
    pub destinations_from_environment: Vec<String>,
    /// Destinations new in the file: nothing is forwarded to them until a restart.
    pub destinations_not_served_until_restart: Vec<String>,
}

/// Checks `fresh` against the `running` config. A running source missing from `fresh`
/// (dropped or renamed), or whose kind or signature scheme changed, is an error naming it:
/// taking its secrets would either revive old ones or check them with the wrong scheme.
pub fn check_reload(running: &Config, fresh: &Config) -> Result<ReloadPlan, ConfigError> {
    let mut problems = Vec::new();
    let mut from_environment = Vec::new();
    for source in &running.sources {
        let Some(next) = fresh.source(&source.name) else {
            problems.push(format!(
                "source {:?} is running but missing from the config read (dropped or renamed)",
                source.name
            ));
            continue;
        };
        if next.kind != source.kind {
            problems.push(format!(
                "source {:?}: kind changed from {:?} to {:?}",
                source.name, source.kind, next.kind
            ));
        }
        if next.json != source.json {
            // A json source's locations decide its aggregate keys and sequences: a change
            // would split logged aggregates from new ones. Nothing about them is trivially safe.
            problems.push(format!(
                "source {:?}: its json locations (event_id, aggregate, sequence, ordering, …) changed",
                source.name
            ));
        }
        if next.scheme != source.scheme {
            problems.push(format!(
                "source {:?}: signature changed from \"{}\" to \"{}\"",
                source.name, source.scheme, next.scheme
            ));
        }
        if next.secrets_from_environment {
            from_environment.push(source.name.clone());
        }
    }
    let mut destinations_from_environment = Vec::new();
    for destination in running.destinations.iter() {
        let Some(next) = fresh.destination(&destination.name) else {
            problems.push(format!(
                "destination {:?} is running but missing from the config read (dropped or renamed)",
                destination.name
            ));
            continue;
        };
        let changed = destination.changed_keys(next);
        if !changed.is_empty() {
            problems.push(format!(
                "destination {:?}: {} changed",
                destination.name,
                changed.join(", ")
            ));
        }
        if next.secret_from_environment {
            destinations_from_environment.push(destination.name.clone());
        }
    }
    if !problems.is_empty() {
        return Err(ConfigError(format!(
            "{}; that needs a restart, nothing was changed",
            problems.join("; ")
        )));
    }
    Ok(ReloadPlan {
        sources: running.sources.len(),
        from_environment,
        not_served_until_restart: fresh
            .sources
            .iter()
            .filter(|s| running.source(&s.name).is_none())
            .map(|s| s.name.clone())
            .collect(),
        destinations: running.destinations.len(),
        destinations_from_environment,
        destinations_not_served_until_restart: fresh
            .destinations
            .iter()
            .filter(|d| running.destination(&d.name).is_none())
            .map(|d| d.name.clone())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const RUNNING: &str = r#"
        [[sources]]
        name = "p"
        kind = "presence"
        secrets = ["p-secret"]
        [[sources]]
        name = "s"
        kind = "save-game"
        secrets = ["s-secret"]
    "#;

    fn config(text: &str, env: &[(&str, &str)]) -> Config {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_parts(Some(text), &env).unwrap()
    }

    #[test]
    fn a_dropped_or_renamed_source_is_refused_by_name() {
        let running = config(RUNNING, &[]);
        let dropped = RUNNING.replace(
            "[[sources]]\n        name = \"s\"\n        kind = \"save-game\"\n        secrets = [\"s-secret\"]",
            "",
        );
        let renamed = RUNNING.replace("name = \"s\"", "name = \"s2\"");
        for text in [dropped, renamed] {
            let err = check_reload(&running, &config(&text, &[]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("\"s\"") && err.contains("missing"), "{err}");
            assert!(!err.contains("s-secret"), "{err}");
        }
    }

    #[test]
    fn a_changed_kind_or_scheme_is_refused() {
        let running = config(RUNNING, &[]);
        let kind = RUNNING.replace("kind = \"presence\"", "kind = \"save-game\"");
        let err = check_reload(&running, &config(&kind, &[])).unwrap_err();
        assert!(err.to_string().contains("kind changed"), "{err}");
        let scheme = RUNNING.replace(
            "kind = \"presence\"",
            "kind = \"presence\"\n        signature = \"hmac-timestamped\"",
        );
        let err = check_reload(&running, &config(&scheme, &[])).unwrap_err();
        assert!(err.to_string().contains("signature changed"), "{err}");
    }

    #[test]
    fn a_json_source_keeps_its_locations_until_a_restart() {
        let json = format!(
            "{RUNNING}\n[[sources]]\nname = \"j\"\nkind = \"json\"\nsignature = \"github\"\n\
             secrets = [\"j-secret\"]\nordering = \"latest-wins\"\naggregate = \"/repo\"\nsequence = \"/n\"\n"
        );
        let running = config(&json, &[]);
        let rotated = json.replace("j-secret", "j-secret-2");
        assert!(check_reload(&running, &config(&rotated, &[])).is_ok());
        let moved = json.replace("aggregate = \"/repo\"", "aggregate = [\"/repo\", \"/pr\"]");
        let err = check_reload(&running, &config(&moved, &[])).unwrap_err();
        assert!(err.to_string().contains("json locations"), "{err}");
    }

    #[test]
    fn the_plan_names_environment_secrets_and_new_sources() {
        let env = [("INHOOK_S_SECRET", "from-env")];
        let running = config(RUNNING, &env);
        let grown = format!(
            "{RUNNING}\n[[sources]]\nname = \"n\"\nkind = \"presence\"\nsecrets = [\"n-secret\"]\n"
        );
        let plan = check_reload(&running, &config(&grown, &env)).unwrap();
        assert_eq!(
            plan,
            ReloadPlan {
                sources: 2,
                from_environment: vec!["s".into()],
                not_served_until_restart: vec!["n".into()],
                destinations: 0,
                destinations_from_environment: Vec::new(),
                destinations_not_served_until_restart: Vec::new(),
            }
        );
    }

    const FORWARDING: &str = r#"
        [[destinations]]
        name = "app"
        url = "https://app.example/hooks"
        sources = ["s"]
        secret = "whsec_b2xkLXNlY3JldA=="
    "#;

    #[test]
    fn a_destination_may_rotate_its_secret_and_nothing_else() {
        let text = format!("{RUNNING}{FORWARDING}");
        let running = config(&text, &[]);
        let rotated = text.replace("whsec_b2xkLXNlY3JldA==", "whsec_bmV3LXNlY3JldA==");
        let plan = check_reload(&running, &config(&rotated, &[])).unwrap();
        assert_eq!(plan.destinations, 1);
        let plan = check_reload(
            &running,
            &config(&text, &[("INHOOK_DEST_APP_SECRET", "whsec_ZW52")]),
        )
        .unwrap();
        assert_eq!(plan.destinations_from_environment, ["app"]);
        for (edited, named) in [
            (
                text.replace("https://app.example/hooks", "https://other.example/"),
                "url changed",
            ),
            (
                text.replace(
                    "sources = [\"s\"]",
                    "sources = [\"s\", \"p\"]\nconcurrency = 2",
                ),
                "sources, concurrency changed",
            ),
            (
                text.replace("name = \"app\"", "name = \"app2\""),
                "\"app\" is running but missing",
            ),
        ] {
            let err = check_reload(&running, &config(&edited, &[]))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(named) && err.contains("needs a restart"),
                "{err}"
            );
            assert!(!err.contains("b2xk"), "{err}");
        }
        let grown = format!(
            "{text}\n[[destinations]]\nname = \"audit\"\nurl = \"http://127.0.0.1:1/\"\n\
             sources = [\"p\"]\nsecret = \"whsec_YXVkaXQ=\"\n"
        );
        let plan = check_reload(&running, &config(&grown, &[])).unwrap();
        assert_eq!(plan.destinations_not_served_until_restart, ["audit"]);
    }
}
