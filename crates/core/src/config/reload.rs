//! What a reload (SIGHUP or `POST /v1/admin/reload`) may take from a freshly read config.
//! Only secrets change without a restart, so a config that would need more is refused
//! whole, naming the keys that need one: the running sources keep serving with the secrets
//! in force. Destinations follow the same rule: a destination's secret may rotate; any
//! other key of a running one, or dropping it, needs a restart (its queues, leases and
//! circuit are built from them); a new destination is forwarded to from the restart on.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use super::{Config, ConfigError};
use crate::ingress::signature::Secret;

/// The secrets in force for the running sources and destinations, shared by ingress, the
/// senders and the reload paths so that rotation needs no restart. There is no fallback to
/// the secrets read at start: a name not in the map verifies and signs nothing, so a
/// revoked secret cannot come back.
#[derive(Clone, Default)]
pub struct LiveSecrets(Arc<RwLock<InForce>>);

#[derive(Default)]
struct InForce {
    sources: HashMap<String, Vec<Secret>>,
    destinations: HashMap<String, Secret>,
}

impl LiveSecrets {
    /// The secrets of `config`'s sources and destinations.
    pub fn of(config: &Config) -> Self {
        let secrets = Self::default();
        secrets.take(config, config);
        secrets
    }

    /// Takes `fresh`'s secrets for the sources and destinations of `running`, all at once:
    /// no delivery is verified, and no request signed, with half of a rotation.
    fn take(&self, running: &Config, fresh: &Config) {
        let taken = InForce {
            sources: running
                .sources
                .iter()
                .filter_map(|s| fresh.source(&s.name))
                .map(|s| (s.name.clone(), s.secrets.clone()))
                .collect(),
            destinations: running
                .destinations
                .iter()
                .filter_map(|d| fresh.destination(&d.name))
                .map(|d| (d.name.clone(), d.secret.clone()))
                .collect(),
        };
        // A poisoned lock only means a panic elsewhere mid-write; the maps themselves are whole.
        *self.0.write().unwrap_or_else(|p| p.into_inner()) = taken;
    }

    /// Reads `running`'s config file (and the environment) again and, if it passes
    /// [`check_reload`], takes its secrets. On an error nothing changes. `trigger`
    /// (`SIGHUP`, `admin call`) is logged with the outcome, never a secret.
    pub fn reload(
        &self,
        running: &Config,
        trigger: &'static str,
    ) -> Result<ReloadPlan, ConfigError> {
        let outcome = Config::load(running.loaded_from.as_deref()).and_then(|fresh| {
            let plan = check_reload(running, &fresh)?;
            self.take(running, &fresh);
            Ok(plan)
        });
        match &outcome {
            Ok(plan) => tracing::info!(
                trigger,
                sources = plan.sources,
                from_environment = ?plan.from_environment,
                not_served_until_restart = ?plan.not_served_until_restart,
                destinations = plan.destinations,
                destinations_from_environment = ?plan.destinations_from_environment,
                destinations_not_served_until_restart = ?plan.destinations_not_served_until_restart,
                "secrets reloaded"
            ),
            Err(err) => tracing::warn!(trigger, error = %err, "config not reloaded"),
        }
        outcome
    }

    /// Takes `fresh`'s secrets if it passes [`check_reload`] against `running`, as
    /// [`LiveSecrets::reload`] does with a config it reads itself: for a service that
    /// embeds inhook and builds its config in code (docs/library.md).
    pub fn replace(&self, running: &Config, fresh: &Config) -> Result<ReloadPlan, ConfigError> {
        let plan = check_reload(running, fresh)?;
        self.take(running, fresh);
        Ok(plan)
    }

    /// The secrets in force for the source named `source`; none (nothing verifies) if unknown.
    pub fn source(&self, source: &str) -> Vec<Secret> {
        self.read().sources.get(source).cloned().unwrap_or_default()
    }

    /// The secret in force for the destination named `destination`; none (nothing is signed,
    /// so nothing is sent) if unknown.
    pub fn destination(&self, destination: &str) -> Option<Secret> {
        self.read().destinations.get(destination).cloned()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, InForce> {
        self.0.read().unwrap_or_else(|p| p.into_inner())
    }
}

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
/// Any other changed key, top-level or of a running source or destination, is an error
/// naming the keys: answering `reloaded` while they stay as they were would mislead.
pub fn check_reload(running: &Config, fresh: &Config) -> Result<ReloadPlan, ConfigError> {
    let mut problems = Vec::new();
    let changed = running.changed_keys(fresh);
    if !changed.is_empty() {
        problems.push(format!("{} changed", changed.join(", ")));
    }
    let from_environment = source_problems(running, fresh, &mut problems);
    let destinations_from_environment = destination_problems(running, fresh, &mut problems);
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

/// Adds to `problems` what stops `fresh` from replacing the secrets of `running`'s
/// sources; answers those whose secrets come from the environment.
fn source_problems(running: &Config, fresh: &Config, problems: &mut Vec<String>) -> Vec<String> {
    let mut from_environment = Vec::new();
    for source in &running.sources {
        let Some(next) = fresh.source(&source.name) else {
            problems.push(format!(
                "source {:?} is running but missing from the config read (dropped or renamed)",
                source.name
            ));
            continue;
        };
        if next.kind.source_kind() != source.kind.source_kind() {
            problems.push(format!(
                "source {:?}: kind changed from {:?} to {:?}",
                source.name,
                source.kind.source_kind(),
                next.kind.source_kind()
            ));
        }
        if next.kind.contract_settings() != source.kind.contract_settings() {
            // A json source's locations decide its aggregate keys and sequences: a change
            // would split logged aggregates from new ones. Nothing about them is trivially safe.
            problems.push(format!(
                "source {:?}: its json locations (event_id, aggregate, sequence, ordering, …) changed",
                source.name
            ));
        }
        if next.verifier.scheme() != source.verifier.scheme() {
            problems.push(format!(
                "source {:?}: signature changed from \"{}\" to \"{}\"",
                source.name, source.verifier, next.verifier
            ));
        } else if next.verifier != source.verifier {
            problems.push(format!(
                "source {:?}: its {} settings (signature_*, timestamp*, token_*, sns_*, public_url) changed",
                source.name, source.verifier
            ));
        }
        // Kind, signature, json locations and secrets are checked above; every other key
        // the source declares (config/source/mod.rs) needs a restart.
        let changed = source.changed_keys(next);
        if !changed.is_empty() {
            problems.push(format!(
                "source {:?}: {} changed",
                source.name,
                changed.join(", ")
            ));
        }
        if next.secrets_from_environment {
            from_environment.push(source.name.clone());
        }
    }
    from_environment
}

/// Adds to `problems` what stops `fresh` from replacing the secrets of `running`'s
/// destinations; answers those whose secret comes from the environment.
fn destination_problems(
    running: &Config,
    fresh: &Config,
    problems: &mut Vec<String>,
) -> Vec<String> {
    let mut from_environment = Vec::new();
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
            from_environment.push(destination.name.clone());
        }
    }
    from_environment
}

impl Config {
    /// The top-level keys whose value differs from `other`'s: each needs a restart. Every
    /// section's keys are compared as the section declares them (`section!`); the admin
    /// token and the master keys, declared `apart`, are compared here.
    fn changed_keys(&self, other: &Config) -> Vec<&'static str> {
        // A token generated for this run is not in any file: the file's absence of one is no change.
        let token = |c: &Config| {
            c.admin
                .admin_token
                .as_ref()
                .filter(|_| !c.admin.admin_token_generated)
                .map(|t| t.expose().to_vec())
        };
        let token_changed = token(self) != token(other);
        // The store's keys are taken at start (docs/encryption.md, rotating).
        let keys_changed = match (&self.store.encryption, &other.store.encryption) {
            (Some(mine), Some(theirs)) => !mine.same_as(theirs),
            (mine, theirs) => mine.is_some() != theirs.is_some(),
        };
        token_changed
            .then_some("admin_token")
            .into_iter()
            .chain(keys_changed.then_some("encryption"))
            .chain(self.http.changed_keys(&other.http))
            .chain(self.store.changed_keys(&other.store))
            .chain(self.admin.changed_keys(&other.admin))
            .chain(self.processing.changed_keys(&other.processing))
            .chain(self.observability.changed_keys(&other.observability))
            .collect()
    }
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
    fn changed_alert_rules_need_a_restart() {
        let with = |over: u64| {
            format!(
                "alert_tick_ms = 500\n{RUNNING}\n[[alerts]]\nname = \"a\"\non = \"backlog\"\n\
                 over = {over}\nslack_webhook_url = \"https://hooks.slack.com/services/x\"\n"
            )
        };
        let running = config(&with(10), &[]);
        assert!(check_reload(&running, &config(&with(10), &[])).is_ok());
        let err = check_reload(&running, &config(&with(20), &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("alerts"), "{err}");
        assert!(!err.contains("hooks.slack.com"), "{err}");
    }

    #[test]
    fn changed_encryption_keys_need_a_restart() {
        const K1: &str = "k1:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";
        const K2: &str = "k2:ICEiIyQlJicoKSorLC0uLzAxMjM0NTY3ODk6Ozw9Pj8=";
        let with = |keys: &str| format!("encryption = {{ keys = [{keys}] }}\n{RUNNING}");
        let running = config(&with(&format!("{K1:?}")), &[]);
        assert!(check_reload(&running, &config(&with(&format!("{K1:?}")), &[])).is_ok());
        for edited in [
            with(&format!("{K2:?}, {K1:?}")),
            with(&format!("{K2:?}")),
            RUNNING.to_owned(),
        ] {
            let err = check_reload(&running, &config(&edited, &[]))
                .unwrap_err()
                .to_string();
            assert!(err.contains("encryption"), "{err}");
            assert!(!err.contains("AAECAwQF"), "a key value was shown: {err}");
        }
        // The environment's keys win over the file's.
        let from_env = config(
            RUNNING,
            &[("INHOOK_ENCRYPTION_KEYS", &format!("{K2}, {K1}"))],
        );
        let ids: Vec<&str> = from_env
            .store
            .encryption
            .as_ref()
            .unwrap()
            .ids()
            .map(|id| id.as_str())
            .collect();
        assert_eq!(ids, ["k2", "k1"]);
        let bad = format!("encryption = {{ keys = [\"k3:c2hvcnQ=\"] }}\n{RUNNING}");
        let err = Config::from_parts(Some(&bad), &HashMap::new())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("key k3 is 5 bytes") && !err.contains("c2hvcnQ"),
            "{err}"
        );
    }

    #[test]
    fn who_may_call_needs_a_restart() {
        let running = config(RUNNING, &[]);
        let allowed = RUNNING.replace(
            "kind = \"presence\"",
            "kind = \"presence\"\n        allow_ips = [\"192.0.2.0/24\"]",
        );
        let err = check_reload(&running, &config(&allowed, &[])).unwrap_err();
        assert!(
            err.to_string().contains("allow_ips") && err.to_string().contains("needs a restart"),
            "{err}"
        );
        let proxies = format!("trusted_proxies = [\"10.0.0.0/8\"]\n{RUNNING}");
        let err = check_reload(&running, &config(&proxies, &[])).unwrap_err();
        assert!(err.to_string().contains("trusted_proxies"), "{err}");
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
