//! `inhook serve` and `inhook migrate` (docs/api.md, command line): run the receiver, or
//! bring the schema up to date and exit.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;

use inhook::config::{Config, Database};
use inhook::runtime::app::{open_store, shutdown_signal, Application};

/// Runs `inhook migrate`: the schema and the pending upgrade steps, to the end.
pub async fn migrate(config_path: Option<&Path>) -> anyhow::Result<()> {
    let config = Config::load_for_store(config_path)?;
    let store = open_store(&config).await?;
    inhook::runtime::app::prune_stored_headers(store.as_ref(), &config)
        .await
        .context("applying the kept-headers allowlist to stored events")?;
    println!("schema is up to date");
    Ok(())
}

/// Runs `inhook serve` until a shutdown signal.
pub async fn serve(mut config: Config) -> anyhow::Result<()> {
    let _telemetry = inhook::operations::telemetry::init(
        config.observability.log_json,
        config.observability.otlp_endpoint.as_deref(),
    )?;
    let generated_token = config.generate_admin_token();
    if generated_token.is_some() {
        // The token itself goes to standard output once, never to the log.
        tracing::warn!(
            "no admin_token configured: /v1/* takes a token generated for this run, printed on \
             standard output; set admin_token (or INHOOK_ADMIN_TOKEN) to choose one"
        );
    } else if config.admin.admin_token.is_none() {
        tracing::warn!(
            "admin_open_to_loopback: /v1/* answers direct loopback clients without a token \
             (no proxy headers, loopback Host); a proxy on this host opens it to everyone it serves"
        );
    }
    for warning in start_warnings(&config) {
        tracing::warn!("{warning}");
    }
    let sources: Vec<_> = config.sources.iter().map(|s| s.name.clone()).collect();
    let store = config.store.database.to_string();
    let app = Application::build(config).await?;
    reload_secrets_on_sighup(app.secrets(), app.config());
    let addr = app.local_addr()?;
    tracing::info!(%addr, %store, ?sources, "inhook started");
    // Tests and scripts read this line to learn the bound port.
    println!("inhook listening on http://{addr}");
    use std::io::Write;
    if let Some(token) = generated_token {
        // Whoever started the server may have stopped reading: a closed pipe is no reason to stop.
        let _ = writeln!(
            std::io::stdout(),
            "inhook admin token for this run: {token}\n\
             inhook dashboard: http://{addr}/#token={token}"
        );
    }
    // After the lines scripts read first (the address, then the token), never before them.
    let _ = writeln!(std::io::stdout(), "inhook store: {store}");
    app.run_until_stopped(shutdown_signal()).await
}

/// On SIGHUP, reloads the secrets exactly as `POST /v1/admin/reload` does: rotation needs no
/// restart, other settings need one. A config that fails the reload checks is reported and
/// the secrets in force stay.
fn reload_secrets_on_sighup(secrets: inhook::config::LiveSecrets, running: Arc<Config>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        // Registered before the server says it listens: an early SIGHUP must not kill it.
        let Ok(mut hangups) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: secrets reload needs a restart");
            return;
        };
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                // The outcome is logged by `reload`; there is no one else to tell.
                let _ = secrets.reload(&running, "SIGHUP");
            }
        });
    }
    #[cfg(not(unix))]
    let _ = (secrets, running);
}

/// What `inhook serve` warns of at start: the config's own warnings, after the store's
/// (a PostgreSQL URL whose TLS can be stripped, docs/configuration.md, PostgreSQL over TLS).
/// Never holds a secret.
fn start_warnings(config: &Config) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Database::Postgres(url) = &config.store.database {
        warnings.extend(inhook::store::postgres_tls::start_warning(url));
    }
    warnings.extend(config.start_warnings());
    warnings
}

#[cfg(test)]
mod tests {

    use super::*;

    /// An environment of `pairs`, as the config reads it.
    fn env(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn start_warnings_name_stripped_tls_and_unsigned_header_locations() {
        let text = r#"
            database = "postgres://inhook@db.example:5432/inhook"
            [[sources]]
            name = "hooks"
            kind = "json"
            signature = "github"
            secrets = ["s"]
            ordering = "latest-wins"
            aggregate = ["/repo", "header:X-Tenant"]
            sequence = "header:X-Seq"
            [[sources]]
            name = "signed"
            kind = "json"
            signature = "standard-webhooks"
            secrets = ["whsec_c2VjcmV0"]
            ordering = "in-order"
            aggregate = "/k"
            sequence = "header:Webhook-Timestamp"
        "#;
        let warnings = start_warnings(&Config::from_parts(Some(text), &env(&[])).unwrap());
        assert_eq!(warnings.len(), 3, "{warnings:#?}");
        assert!(warnings[0].contains("sslmode=prefer"), "{warnings:#?}");
        assert!(warnings[1].contains("\"hooks\": sequence comes from the header X-Seq"));
        assert!(warnings[2].contains("\"hooks\": aggregate comes from the header X-Tenant"));
        let secrets = env(&[
            ("INHOOK_PRESENCE_SECRET", "a"),
            ("INHOOK_SAVE_GAME_SECRET", "b"),
        ]);
        let quiet = start_warnings(&Config::from_parts(None, &secrets).unwrap());
        assert!(quiet.is_empty(), "{quiet:?}");
    }

    #[test]
    fn a_signature_that_leaves_the_body_out_is_warned_of_once_per_source() {
        let text = r#"
            [[sources]]
            name = "mg"
            preset = "mailgun"
            secrets = ["mailgun-signing-key"]
            [[sources]]
            name = "fields"
            kind = "json"
            signature = "hmac"
            signature_header = "X-Sig"
            signed_content = "{header:X-Id}.{pointer:/id}"
            secrets = ["fields-secret"]
            event_id = "/id"
            ordering = "unordered"
            [[sources]]
            name = "whole"
            kind = "json"
            signature = "hmac"
            signature_header = "X-Sig"
            signed_content = "{header:X-Id}.{body}"
            secrets = ["whole-secret"]
            event_id = "/id"
            ordering = "unordered"
        "#;
        let warnings = start_warnings(&Config::from_parts(Some(text), &env(&[])).unwrap());
        assert_eq!(warnings.len(), 2, "{warnings:#?}");
        assert!(
            warnings[0].starts_with("source \"mg\": the hmac signature does not cover the body")
                && warnings[0].contains("\"{timestamp}{pointer:/signature/token}\""),
            "{warnings:#?}"
        );
        assert!(
            warnings[1].starts_with("source \"fields\"")
                && warnings[1].contains("\"{header:x-id}.{pointer:/id}\""),
            "{warnings:#?}"
        );
        let all = warnings.concat();
        assert!(!all.contains("mailgun-signing-key") && !all.contains("fields-secret"));
    }
}
