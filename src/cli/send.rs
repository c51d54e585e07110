//! `inhook send` (docs/api.md, command line): sign a JSON file with a source's scheme and POST it.

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};

use inhook::config::{signing_secret, Config};
use inhook::domain::clock;
use inhook::ingress::signature::{self, Scheme, Verifier};

/// Arguments of `inhook send`.
#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// Base URL of the inhook server.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// The source to post to.
    #[arg(long)]
    pub source: String,
    /// Sign as this preset's publisher does (docs/providers.md), without a --config:
    /// the source is taken to be configured with `preset = NAME`.
    #[arg(long)]
    pub preset: Option<String>,
    /// The base URL the publisher calls, for a preset whose signature covers the URL
    /// (`public_url`); with --preset only.
    #[arg(long, requires = "preset")]
    pub public_url: Option<String>,
    /// The secret to sign with; defaults to INHOOK_<SOURCE>_SECRET, then the source's in --config.
    #[arg(long)]
    pub secret: Option<String>,
    /// For an `ed25519` or `ecdsa-p256` source, the publisher's private key to sign with:
    /// the 32-byte Ed25519 seed in hex or base64, or a P-256 PKCS#8 key in base64 (or a PEM
    /// `PRIVATE KEY` block), as `inhook keygen --scheme ed25519|ecdsa-p256` prints them.
    #[arg(long, env = "INHOOK_SEND_PRIVATE_KEY", hide_env_values = true)]
    pub private_key: Option<String>,
    /// The signature scheme; defaults to the source's in --config (without --config,
    /// only the default sources `presence` and `save-game` are known).
    #[arg(long, value_parser = parse_scheme)]
    pub scheme: Option<Scheme>,
    /// The delivery id, for schemes that send one (standard-webhooks `webhook-id`, GitHub's
    /// `X-GitHub-Delivery`, Shopify's `X-Shopify-Event-Id`); default: derived from the body,
    /// so sending the same file again is a redelivery.
    #[arg(long)]
    pub delivery_id: Option<String>,
    /// An extra request header, `Name: value` (repeatable): an event type or id a
    /// source reads from a header. The scheme's own headers are refused, except its
    /// delivery id (`X-GitHub-Delivery`, `webhook-id`, …), which is then signed as given.
    #[arg(long = "header", value_name = "NAME: VALUE", value_parser = parse_header)]
    pub headers: Vec<ExtraHeader>,
    /// A PEM file of CA certificates to trust besides the system's, for an `https://` --url.
    #[arg(long, env = "INHOOK_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,
    /// The JSON body to send, or `-` for standard input.
    pub file: PathBuf,
}

/// How long `send` keeps trying a server that refuses the connection.
const CONNECT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

fn parse_scheme(raw: &str) -> Result<Scheme, signature::UnknownScheme> {
    raw.parse()
}

/// Why a `--header` cannot be added to the request. clap prints the words after the value
/// given; none holds a header's value, which may be a credential.
#[derive(Debug, thiserror::Error)]
pub enum HeaderArgError {
    /// No `:` between a name and a value.
    #[error("the header is not `Name: value`")]
    NotNameValue,
    /// The part before the `:` is not a header name.
    #[error("{name:?} is not a header name")]
    BadName {
        /// The part before the `:`, trimmed.
        name: String,
        /// The http crate's reason.
        #[source]
        source: reqwest::header::InvalidHeaderName,
    },
    /// The part after the `:` is not a header value.
    #[error("the value of {name} is not a valid header value")]
    BadValue {
        /// The header's name.
        name: reqwest::header::HeaderName,
        /// The http crate's reason.
        #[source]
        source: reqwest::header::InvalidHeaderValue,
    },
}

/// A request header `inhook send` adds.
#[derive(Debug, Clone)]
pub struct ExtraHeader {
    /// Its name (lower case).
    pub name: reqwest::header::HeaderName,
    /// Its value.
    pub value: reqwest::header::HeaderValue,
}

fn parse_header(raw: &str) -> Result<ExtraHeader, HeaderArgError> {
    let (name, value) = raw.split_once(':').ok_or(HeaderArgError::NotNameValue)?;
    let name =
        reqwest::header::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|source| {
            HeaderArgError::BadName {
                name: name.trim().to_owned(),
                source,
            }
        })?;
    let value = reqwest::header::HeaderValue::from_str(value.trim()).map_err(|source| {
        HeaderArgError::BadValue {
            name: name.clone(),
            source,
        }
    })?;
    Ok(ExtraHeader { name, value })
}

/// The scheme `send` signs with: `--scheme`, else the source's in the config
/// (the default sources' without `--config`). An unknown source is an error, not a guess;
/// a configurable scheme (`hmac`, `token`, `basic`) signs with its source's settings.
fn send_scheme(
    args: &SendArgs,
    config_path: Option<&std::path::Path>,
    source: Option<&inhook::config::SourceConfig>,
) -> anyhow::Result<Verifier> {
    let configured = source.map(|s| &s.verifier);
    match (args.scheme, configured) {
        (Some(scheme), Some(verifier)) if verifier.scheme() == scheme => {
            return Ok(verifier.clone())
        }
        (Some(scheme), _) if scheme.is_configurable() => bail!(
            "--scheme {scheme} signs with its source's settings: pass --config with the file \
             where source {:?} has signature = \"{scheme}\"",
            args.source
        ),
        (Some(scheme), _) => return Ok(Verifier::Fixed(scheme)),
        (None, Some(verifier)) => return Ok(verifier.clone()),
        (None, None) => {}
    }
    match config_path {
        Some(path) => bail!(
            "source {:?} is not in {}: name a configured source, or pass --scheme",
            args.source,
            path.display()
        ),
        None => bail!(
            "source {:?} is not a default source (presence, save-game): pass --config \
             with the file that configures it, or --scheme",
            args.source
        ),
    }
}

/// A config holding one source, `--source` configured with `preset = NAME` and the
/// signing secret, so `send` signs as that publisher does without a file.
fn preset_config(args: &SendArgs, preset: &str) -> anyhow::Result<Config> {
    if inhook::ingress::presets::Preset::find(preset).is_none() {
        let close = inhook::ingress::presets::close_names(preset);
        bail!(
            "no preset {preset:?}{}: `inhook presets` lists them",
            if close.is_empty() {
                String::new()
            } else {
                format!(" (did you mean {}?)", close.join(", "))
            }
        );
    }
    let secret = signing_secret(&args.source, args.secret.as_deref(), "--secret", None)?;
    // The name and preset were checked above (letters, digits, '-', '_'), so they need no
    // quoting; the secret and URL go through the environment map, never through TOML text.
    inhook::config::check_source_name(&args.source)?;
    let text = format!(
        "[[sources]]\nname = \"{}\"\npreset = \"{preset}\"\n",
        args.source
    );
    let mut env = std::collections::HashMap::new();
    env.insert(
        inhook::config::secret_env_var(&args.source),
        String::from_utf8_lossy(secret.expose()).into_owned(),
    );
    if let Some(url) = &args.public_url {
        env.insert("INHOOK_PUBLIC_URL".to_owned(), url.clone());
    }
    Ok(Config::from_parts(Some(&text), &env)?)
}

/// Runs `inhook send`.
pub async fn send(config_path: Option<PathBuf>, args: SendArgs) -> anyhow::Result<()> {
    let body = if args.file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading standard input")?;
        buf
    } else {
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?
    };
    // Secrets optional: a source whose secret is not set here is no reason to refuse another.
    let config = match &args.preset {
        Some(preset) => preset_config(&args, preset)?,
        None => Config::load_for_store(config_path.as_deref())?,
    };
    let source = config.source(&args.source);
    let scheme = send_scheme(&args, config_path.as_deref(), source)?;
    let path = format!("/webhooks/{}", args.source);
    let secret = match scheme.scheme().public_key() {
        // The receiver holds only public keys: the publisher's private key signs.
        Some(algorithm) => {
            let Some(raw) = args.private_key.as_deref() else {
                bail!(
                    "source {:?} verifies {} signatures with public keys: pass --private-key \
                     (the key `inhook keygen --scheme {}` prints)",
                    args.source,
                    algorithm.name(),
                    algorithm.name()
                );
            };
            signature::Secret::new(raw.trim())
        }
        None => signing_secret(
            &args.source,
            args.secret.as_deref(),
            "--secret",
            Some(&config),
        )?,
    };
    let mut url = format!("{}{path}", args.url.trim_end_matches('/'));
    let id_header = scheme.delivery_id_header();
    let header_id = args
        .headers
        .iter()
        .find(|h| Some(h.name.as_str()) == id_header)
        .map(|h| {
            h.value
                .to_str()
                .context("the delivery id header is not text")
        })
        .transpose()?;
    let given_id = match (args.delivery_id.as_deref(), header_id) {
        (Some(flag), Some(header)) if flag != header => {
            bail!("--delivery-id and the {scheme} delivery id header disagree: give one")
        }
        (flag, header) => flag.or(header),
    };
    let mut given = axum::http::HeaderMap::new();
    for extra in &args.headers {
        given.append(extra.name.clone(), extra.value.clone());
    }
    let to_sign = signature::Request {
        headers: &given,
        body: &body,
        method: "POST",
        path_and_query: &path,
    };
    let signed = scheme
        .sign(&to_sign, &secret, clock::now_ms() / 1000, given_id)
        .with_context(|| format!("signing with the {scheme} scheme"))?;
    if let Some((name, value)) = &signed.query {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        url += &format!(
            "?{}={}",
            utf8_percent_encode(name, NON_ALPHANUMERIC),
            utf8_percent_encode(value, NON_ALPHANUMERIC)
        );
    }
    let signed = signed.headers;
    let client =
        inhook::forward::outbound::client_builder(args.tls_ca_file.as_deref(), "--tls-ca-file")?
            .build()
            .context("building the HTTP client")?;
    // A form source takes form bodies (docs/configuration.md, `body_format`).
    let media_type = source
        .map(|s| s.kind.body_format())
        .unwrap_or_default()
        .media_type();
    let mut request = client.post(&url).header("content-type", media_type);
    for extra in &args.headers {
        let name = extra.name.as_str();
        if name == "content-type" {
            bail!("--header {name}: send posts the source's media type ({media_type})");
        }
        if signed.iter().any(|(own, _)| own.eq_ignore_ascii_case(name)) && Some(name) != id_header {
            bail!("--header {name}: the {scheme} scheme sets this header itself");
        }
    }
    for (name, value) in signed {
        request = request.header(name, value);
    }
    for extra in args
        .headers
        .iter()
        .filter(|h| Some(h.name.as_str()) != id_header)
    {
        request = request.header(extra.name.clone(), extra.value.clone());
    }
    let request = request.body(body);
    // A server started a moment before (`inhook serve &`, then `inhook send`, as the docs'
    // examples run) may not listen yet: a refused connection carried nothing, so it is
    // tried again for a few seconds before send gives up.
    let patience = tokio::time::Instant::now() + CONNECT_PATIENCE;
    let response = loop {
        let attempt = request
            .try_clone()
            .expect("a body of bytes clones")
            .send()
            .await;
        match attempt {
            Err(e)
                if inhook::forward::outbound::connection_refused(&e)
                    && tokio::time::Instant::now() < patience =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            attempt => break attempt,
        }
    }
    .map_err(|e| {
        anyhow::anyhow!(
            "posting to {}",
            inhook::forward::outbound::cli_failure(&url, &e.without_url())
        )
    })?;
    let status = response.status();
    let location = response
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|l| inhook::forward::outbound::printable(l.as_bytes(), false));
    let text = inhook::forward::outbound::shown_body(response).await;
    println!("{} {text}", status.as_u16());
    if let Some(location) = location.filter(|_| status.is_redirection()) {
        bail!("server answered {status} to {location}; redirects are not followed");
    }
    if !status.is_success() {
        bail!("server answered {status}");
    }
    Ok(())
}
