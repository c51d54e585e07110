//! `inhook verify` (docs/api.md, command line): check a saved delivery offline. It explains a
//! failure well enough to fix it, without ever printing a secret or the
//! signature it expected.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use axum::http::{HeaderMap, HeaderName, HeaderValue};

use inhook::config::{public_keys_env_var, Config, SourceConfig};
use inhook::domain::clock;
use inhook::domain::kind::Delivery;
use inhook::ingress::signature::{self, Scheme, SignatureError, Verified, Verifier};

/// Arguments of `inhook verify`.
#[derive(Debug, clap::Args)]
pub struct VerifyArgs {
    /// The configured source whose scheme, secrets and tolerance apply.
    #[arg(long)]
    pub source: String,
    /// The delivery's headers, one `Name: value` per line.
    #[arg(long)]
    pub headers: PathBuf,
    /// Judge the signed timestamp as of this unix time, in seconds (default: now).
    #[arg(long)]
    pub at: Option<i64>,
    /// The path and query the delivery was sent to, for schemes that sign `{url}` or read
    /// a token from the query (default: /webhooks/SOURCE).
    #[arg(long)]
    pub path: Option<String>,
    /// The raw body exactly as received, or `-` for standard input.
    pub body_file: PathBuf,
}

/// Runs `inhook verify`: `Ok` if the delivery verifies, an explanation otherwise.
pub fn verify(config_path: Option<&Path>, args: VerifyArgs) -> anyhow::Result<()> {
    // Only the source being checked needs a secret, not every configured one.
    let config = Config::load_for_store(config_path)?;
    let Some(source) = config.source(&args.source) else {
        bail!(
            "no source {:?} in the configuration (configured: {})",
            args.source,
            config
                .sources
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    };
    if source.verifier.scheme() == Scheme::AwsSns {
        // Verifying needs the certificate at SigningCertURL: fetching it is the server's job.
        bail!(
            "source {:?} uses aws-sns: only the server verifies it, fetching the certificate its SigningCertURL names",
            source.name
        );
    }
    if source.secrets.is_empty() && source.verifier.scheme().public_key().is_some() {
        bail!(
            "source {:?} has no public key: set {} (several comma-separated) or `public_keys` in the config file",
            source.name,
            public_keys_env_var(&source.name)
        );
    }
    if source.secrets.is_empty() {
        bail!(
            "source {:?} has no secret: set {} (several comma-separated) or `secrets` in the config file",
            source.name,
            source.secrets_var
        );
    }
    let text = std::fs::read_to_string(&args.headers)
        .with_context(|| format!("reading {}", args.headers.display()))?;
    let headers = parse_headers_file(&text)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.headers.display()))?;
    let body = read_body(&args.body_file)?;
    let at = args.at.unwrap_or_else(|| clock::now_ms().div_euclid(1000));
    let at_label = if args.at.is_some() { "--at" } else { "now" };
    let path = args
        .path
        .clone()
        .unwrap_or_else(|| format!("/webhooks/{}", source.name));
    let request = signature::Request {
        headers: &headers,
        body: &body,
        method: "POST",
        path_and_query: &path,
    };
    match source
        .verifier
        .verify(&request, &source.secrets, at, source.tolerance_s)
    {
        Ok(verified) => {
            print!(
                "{}",
                success_report(source, &verified, &headers, &body, at, at_label)
            );
            Ok(())
        }
        Err(err) => bail!(
            "{}",
            failure_report(source, &headers, &body, &err, at_label)
        ),
    }
}

/// What a verified delivery proved, and whether its body would be accepted.
fn success_report(
    source: &SourceConfig,
    verified: &Verified,
    headers: &HeaderMap,
    body: &[u8],
    at: i64,
    at_label: &str,
) -> String {
    let what = match source.verifier.scheme().public_key() {
        Some(_) => "public key",
        None => "secret",
    };
    let mut out = format!(
        "verified: source {:?} ({}), {what} #{} of {} matched\n",
        source.name,
        source.verifier,
        verified.secret_index,
        source.secrets.len()
    );
    if let Some(ts) = verified.signed_at {
        let skew = ts - at;
        out += &format!(
            "signed at {ts} ({}), {}s {} {at_label}; tolerance {}s\n",
            clock::rfc3339(ts.saturating_mul(1000)),
            skew.unsigned_abs(),
            if skew < 0 { "before" } else { "after" },
            source.tolerance_s
        );
    }
    if let Some(id) = &verified.delivery_id {
        out += &format!("delivery id: {id}\n");
    }
    out += &match source
        .kind
        .parse(body, headers, verified.delivery_id.as_deref())
    {
        Ok(Delivery::Event(event)) => format!(
            "payload: follows the {} contract (event_id {})\n",
            source.kind.source_kind().as_str(),
            event.event_id
        ),
        Ok(Delivery::Ignored { event_type, .. }) => format!(
            "payload: follows the {} contract; its type {} is not accepted (200 ignored_unsupported)\n",
            source.kind.source_kind().as_str(),
            event_type.as_deref().unwrap_or("(none)")
        ),
        Err(err) => format!(
            "payload: the signature is good, but the body would be refused 400 invalid_payload: {err}\n"
        ),
    };
    out
}

/// Why a delivery did not verify, in terms of the scheme's rules.
fn failure_report(
    source: &SourceConfig,
    headers: &HeaderMap,
    body: &[u8],
    err: &SignatureError,
    at_label: &str,
) -> String {
    let scheme = &source.verifier;
    let mut out = format!(
        "not verified ({}): source {:?} uses {scheme}: {err}\n",
        err.code(),
        source.name
    );
    match err {
        SignatureError::Missing { .. } | SignatureError::Malformed { .. } => {
            out += &format!("{scheme} deliveries carry:\n");
            for (name, format) in scheme.required_headers() {
                let state = if headers.contains_key(name) {
                    "present"
                } else {
                    "absent"
                };
                out += &format!("  {name}: {format} ({state})\n");
            }
            if headers.is_empty() {
                out += "the headers file holds no header: expected one `Name: value` per line\n";
            }
        }
        SignatureError::Mismatch { .. } | SignatureError::KeyMismatch { .. } => {
            out += &format!(
                "the body file holds {} bytes; the signature covers them exactly as received, so a \
                 re-serialized JSON body or an editor's trailing newline does not verify\n",
                body.len()
            );
            if body.last() == Some(&b'\n') {
                out += "note: the body ends with a newline; publishers rarely send one\n";
            }
            if scheme.scheme() == Scheme::StandardWebhooks {
                out += "note: whsec_ secrets check v1 signatures, whpk_/whsk_ keys check v1a\n";
            }
            match scheme {
                Verifier::Hmac(config) | Verifier::PublicKey(config) => {
                    out += &hmac_settings(config);
                }
                Verifier::Twilio(config) => out += &twilio_settings(config),
                _ => {}
            }
        }
        SignatureError::Absent { what } => {
            out += &format!("the delivery must hold {what}");
            if let Verifier::Hmac(config) | Verifier::PublicKey(config) = scheme {
                out += &format!("\n{}", hmac_settings(config));
            } else if let Verifier::Token(_) | Verifier::Twilio(_) = scheme {
                out += " (pass --path with the path and query the delivery was sent to)\n";
            } else {
                out += "\n";
            }
        }
        SignatureError::Refused { .. } => {
            out += "each configured secret is compared with it exactly: a trailing space or \
                    newline in the secret or the delivery does not match\n";
        }
        SignatureError::Rejected { .. } => {
            out += "an aws-sns message is checked against sns_cert_hosts and sns_topic_arns\n";
        }
        SignatureError::TimestampOutOfTolerance { .. } => {
            out += &format!(
                "the signature itself is valid; the timestamp is judged against {at_label}. To check \
                 an old delivery, pass --at with the unix time it was received\n"
            );
        }
    }
    out.trim_end().to_owned()
}

/// What a configured HMAC signs, so the user can compare with the publisher's documentation.
fn hmac_settings(config: &signature::configurable::HmacConfig) -> String {
    use signature::configurable::{Format, TimestampAt};
    use signature::template::Part;
    let content: String = config
        .content
        .parts()
        .iter()
        .map(|part| match part {
            Part::Literal(text) => text.clone(),
            Part::Body => "{body}".into(),
            Part::Timestamp => "{timestamp}".into(),
            Part::Header(name) => format!("{{header:{name}}}"),
            Part::Method => "{method}".into(),
            Part::Url => "{url}".into(),
            Part::Pointer(p) => format!("{{pointer:{p}}}"),
        })
        .collect();
    let with = match config.public_key {
        Some(algorithm) => format!(
            "a {}, checked with each of the source's public keys",
            algorithm.signature_name()
        ),
        None => format!("HMAC-{}", config.algorithm.name().to_uppercase()),
    };
    let mut out = format!(
        "the source signs \"{content}\" with {with} ({} in {}{}",
        config.encoding.name(),
        config.header,
        match &config.format {
            Format::Plain => String::new(),
            Format::Pairs { signature_key } => format!(", every {signature_key}= entry"),
        }
    );
    if !config.prefix.is_empty() {
        out += &format!(", after the prefix {:?}", config.prefix);
    }
    out += ")\n";
    if let Some(ts) = &config.timestamp {
        let at = match &ts.at {
            TimestampAt::Header(h) => format!("the header {h}"),
            TimestampAt::Pointer(p) => format!("the body field {p}"),
            TimestampAt::Pair(k) => format!("the {k}= entry of {}", config.header),
        };
        out += &format!("the timestamp is read from {at}, as {}\n", ts.unit.format());
    }
    if let Some(url) = &config.public_url {
        out += &format!(
            "{{url}} is {url} followed by the path and query (pass --path if they differ from /webhooks/<source>)\n"
        );
    }
    out
}

/// What Twilio signs, so the user can compare the URL with the one set in Twilio's console.
fn twilio_settings(config: &signature::twilio::TwilioConfig) -> String {
    format!(
        "Twilio signs the URL it called, {}<path and query> (pass --path if they differ from \
         /webhooks/<source>; public_url must match the console's URL exactly, scheme and port \
         included), then every form parameter sorted by name, name then value; a JSON body is \
         covered by the bodySHA256 query parameter instead\n",
        config.public_url
    )
}

fn read_body(path: &Path) -> anyhow::Result<Vec<u8>> {
    if path.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading standard input")?;
        return Ok(buf);
    }
    std::fs::read(path).with_context(|| format!("reading {}", path.display()))
}

/// A line of a headers file that is not a request header; no variant holds a header's
/// value (a signature, say).
#[derive(Debug, thiserror::Error)]
pub enum HeadersFileError {
    /// No `:` between a name and a value.
    #[error("line {line}: expected `Name: value`")]
    NotNameValue {
        /// The line's number, from 1.
        line: usize,
    },
    /// The part before the `:` is not a header name.
    #[error("line {line}: {name:?} is not a header name")]
    BadName {
        /// The line's number, from 1.
        line: usize,
        /// The part before the `:`, trimmed.
        name: String,
        /// The http crate's reason.
        #[source]
        source: axum::http::header::InvalidHeaderName,
    },
    /// The part after the `:` is not header text.
    #[error("line {line}: the value of {name} is not valid header text")]
    BadValue {
        /// The line's number, from 1.
        line: usize,
        /// The header's name.
        name: HeaderName,
        /// The http crate's reason.
        #[source]
        source: axum::http::header::InvalidHeaderValue,
    },
}

/// Parses a headers file: one `Name: value` per line. Blank lines, `#`
/// comments and an HTTP request line (as `curl -v` or a proxy log shows
/// one) are skipped, so a saved request can be pasted as it is.
pub fn parse_headers_file(text: &str) -> Result<HeaderMap, HeadersFileError> {
    let mut headers = HeaderMap::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || is_request_line(line) {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(HeadersFileError::NotNameValue { line: n });
        };
        let name = HeaderName::from_bytes(name.trim().as_bytes()).map_err(|source| {
            HeadersFileError::BadName {
                line: n,
                name: name.trim().to_owned(),
                source,
            }
        })?;
        let value =
            HeaderValue::from_str(value.trim()).map_err(|source| HeadersFileError::BadValue {
                line: n,
                name: name.clone(),
                source,
            })?;
        headers.append(name, value);
    }
    Ok(headers)
}

fn is_request_line(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let method = words.next().unwrap_or_default();
    matches!(method, "POST" | "PUT" | "GET" | "PATCH")
        && words.nth(1).is_some_and(|v| v.starts_with("HTTP/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_files_parse_like_a_saved_request() {
        let text = "POST /webhooks/gh HTTP/1.1\r\n# saved by hand\r\nX-Hub-Signature-256: sha256=ab\r\n\r\ncontent-type:application/json\r\nWebhook-Signature: v1,a\nwebhook-signature: v1a,b\n";
        let headers = parse_headers_file(text).unwrap();
        assert_eq!(headers["x-hub-signature-256"], "sha256=ab");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers.get_all("webhook-signature").iter().count(), 2);
        assert_eq!(
            parse_headers_file("X-Signature abc")
                .unwrap_err()
                .to_string(),
            "line 1: expected `Name: value`"
        );
        assert!(parse_headers_file("\nBad Name: x")
            .unwrap_err()
            .to_string()
            .starts_with("line 2:"));
    }
}
