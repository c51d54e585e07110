//! The one outbound HTTP client setup (docs/forwarding.md; TLS): the forwarder, `inhook
//! send`, `simulate` and `bench` all reach `https://` URLs through rustls (ring), trusting the
//! system's root certificates plus, optionally, a private CA's PEM file. None follows a
//! redirect (it would re-send a signed delivery to wherever the answer points) or takes a
//! proxy from the environment. Each caller adds its own settings (timeouts, pool sizes) to
//! the builder it gets; what a CLI command prints of an answer is bounded and escaped.

use std::error::Error as StdError;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

/// Where the roots a client trusts by default came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootSource {
    /// The operating system's store (`SSL_CERT_FILE` / `SSL_CERT_DIR` move it).
    System,
    /// The Mozilla roots built into inhook, because the system offered none.
    Bundled,
}

/// The system's roots, read once per process (the store is read from disk).
pub fn system_roots() -> &'static (RootCertStore, RootSource) {
    static ROOTS: OnceLock<(RootCertStore, RootSource)> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let found = rustls_native_certs::load_native_certs();
        let first_error = found.errors.first().map(ToString::to_string);
        let (roots, source) = trusted(found.certs);
        if source == RootSource::Bundled {
            let why = first_error.unwrap_or_else(|| "no certificate found".into());
            let message = format!(
                "the system offers no root certificates ({why}): https:// URLs are verified \
                 against the Mozilla roots built into inhook"
            );
            // The CLI commands run without a log subscriber: they say it on standard error.
            if tracing::dispatcher::has_been_set() {
                tracing::warn!("{message}");
            } else {
                eprintln!("inhook: warning: {message}");
            }
        }
        (roots, source)
    })
}

/// The usable roots among `native`; the bundled Mozilla roots when none is.
fn trusted(native: Vec<CertificateDer<'static>>) -> (RootCertStore, RootSource) {
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(native);
    if roots.is_empty() {
        let bundled = RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        return (bundled, RootSource::Bundled);
    }
    (roots, RootSource::System)
}

/// Why an outbound HTTP client could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClientSetupError {
    /// The private CA's PEM file cannot be used; the error names the setting that gave it.
    #[error(transparent)]
    CaFile(#[from] PemRootsError),
    /// rustls refused the protocol versions of its own provider.
    #[error("TLS setup")]
    Tls(#[source] rustls::Error),
}

/// inhook's outbound TLS: rustls (ring), the system's roots plus the certificates of
/// `ca_file` (errors name it as `named_by`, the setting that gave it). Every outbound
/// connection (HTTP, and each broker sink) is made with it.
pub fn tls_client_config(
    ca_file: Option<&Path>,
    named_by: &'static str,
) -> Result<rustls::ClientConfig, ClientSetupError> {
    let mut roots = system_roots().0.clone();
    if let Some(path) = ca_file {
        roots.roots.extend(pem_roots(path, named_by)?.roots);
    }
    Ok(rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(ClientSetupError::Tls)?
    .with_root_certificates(roots)
    .with_no_client_auth())
}

/// A reqwest builder on inhook's TLS stack ([`tls_client_config`]); no redirects followed
/// (a 3xx is the answer) and no proxy from the environment.
pub fn client_builder(
    ca_file: Option<&Path>,
    named_by: &'static str,
) -> Result<reqwest::ClientBuilder, ClientSetupError> {
    let tls = tls_client_config(ca_file, named_by)?;
    Ok(reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .user_agent(concat!("inhook/", env!("CARGO_PKG_VERSION"))))
}

/// The most of an answer's body a CLI command prints.
pub const SHOWN_BODY_BYTES: usize = 4096;

/// Reads at most `limit` bytes of `response`'s body (a server may send gigabytes); answers
/// them and whether more were left unread.
pub async fn read_capped(
    mut response: reqwest::Response,
    limit: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = limit - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// `body` as a terminal may show it: invalid UTF-8 replaced, control and invisible
/// format characters escaped (`\u{1b}`), so an answer cannot rewrite the screen or hide
/// text; `cut` adds a note that the body went on.
pub fn printable(body: &[u8], cut: bool) -> String {
    let mut shown = String::with_capacity(body.len());
    for c in String::from_utf8_lossy(body).chars() {
        if c.is_control() || crate::domain::is_invisible_format(c) {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    if cut {
        shown.push_str(" … (cut)");
    }
    shown
}

/// Reads `response`'s body bounded to [`SHOWN_BODY_BYTES`] and escaped by [`printable`]:
/// what a CLI command prints of an answer. A body that breaks off shows what arrived.
pub async fn shown_body(response: reqwest::Response) -> String {
    match read_capped(response, SHOWN_BODY_BYTES).await {
        Ok((body, cut)) => printable(&body, cut),
        Err(err) => format!(
            "(the body broke off: {})",
            describe_error(&err.without_url())
        ),
    }
}

/// An error and its causes on one line (reqwest's own text alone says only "error sending request").
pub fn describe_error(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// Whether the peer's port refused the connection, so that nothing of the request was sent
/// and trying again cannot deliver it twice.
pub fn connection_refused(err: &(dyn StdError + 'static)) -> bool {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        cause = err.source();
    }
    false
}

/// The TLS certificate check that refused a request, if that is why it failed: no
/// retry can succeed, so the commands stop at once and say which check it was.
pub fn certificate_problem(err: &(dyn StdError + 'static)) -> Option<String> {
    let mut cause = Some(err);
    while let Some(err) = cause {
        if let Some(
            tls @ (rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented),
        ) = rustls_cause(err)
        {
            return Some(format!("the server's certificate is refused: {tls}"));
        }
        cause = err.source();
    }
    None
}

/// The rustls error `err` is or wraps: an `io::Error` hides what it wraps from
/// `source()`, and the TLS connector nests one inside another.
fn rustls_cause<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    if let Some(tls) = err.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    let inner = err.downcast_ref::<std::io::Error>()?.get_ref()?;
    rustls_cause(inner)
}

/// What a CLI command says when a request to `url` failed: the certificate problem
/// and how to trust a private CA, or the error with its causes.
pub fn cli_failure(url: &str, err: &(dyn StdError + 'static)) -> String {
    match certificate_problem(err) {
        Some(problem) => format!(
            "{url}: {problem} (trusted: the system's root certificates, and those of \
             --tls-ca-file when given)"
        ),
        None => format!("{url}: {}", describe_error(err)),
    }
}

/// Why a PEM file of trusted certificates cannot be used; says the setting that named it
/// (`sslrootcert`, `tls_ca_file`, `--tls-ca-file`) and its path.
#[derive(Debug, thiserror::Error)]
pub enum PemRootsError {
    /// The file could not be read.
    #[error("{what} {}", path.display())]
    Unreadable {
        /// The setting that named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        #[source]
        source: std::io::Error,
    },
    /// A PEM section could not be decoded.
    #[error("{what} {}: not PEM", path.display())]
    NotPem {
        /// The setting that named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the PEM reader found.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// A certificate that cannot be a trusted root.
    #[error("{what} {}: unusable certificate", path.display())]
    Unusable {
        /// The setting that named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
    /// The file holds no certificate.
    #[error("{what} {}: no certificate in it", path.display())]
    Empty {
        /// The setting that named the file.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
}

/// The certificates of the PEM file at `path` as trusted roots; errors start with
/// `what` (the key that named the file) and the path.
pub fn pem_roots(path: &Path, what: &'static str) -> Result<RootCertStore, PemRootsError> {
    let path_buf = || path.to_path_buf();
    let pem = std::fs::read(path).map_err(|source| PemRootsError::Unreadable {
        what,
        path: path_buf(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|source| PemRootsError::NotPem {
            what,
            path: path_buf(),
            source,
        })?;
        roots.add(cert).map_err(|source| PemRootsError::Unusable {
            what,
            path: path_buf(),
            source,
        })?;
    }
    if roots.is_empty() {
        return Err(PemRootsError::Empty {
            what,
            path: path_buf(),
        });
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printed_answers_escape_what_a_terminal_would_obey() {
        assert_eq!(printable(b"{\"ok\":true}", false), "{\"ok\":true}");
        assert_eq!(
            printable(b"a\x1b[2Jb\r\n\xe2\x80\xaec\xff", true),
            "a\\u{1b}[2Jb\\u{d}\\u{a}\\u{202e}c\u{fffd} … (cut)"
        );
    }

    #[test]
    fn the_system_roots_are_loaded_on_this_machine() {
        let (roots, source) = system_roots();
        assert_eq!(*source, RootSource::System);
        assert!(!roots.is_empty());
    }

    #[test]
    fn no_usable_system_root_falls_back_to_the_bundled_ones() {
        let (roots, source) = trusted(vec![CertificateDer::from(vec![0u8, 1, 2])]);
        assert_eq!(source, RootSource::Bundled);
        assert_eq!(roots.len(), webpki_roots::TLS_SERVER_ROOTS.len());
    }

    #[test]
    fn a_ca_file_that_is_not_pem_is_refused_by_the_setting_that_named_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "nothing").unwrap();
        let err = client_builder(Some(&path), "--tls-ca-file")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--tls-ca-file "), "{err}");
        assert!(client_builder(None, "--tls-ca-file").is_ok());
    }

    #[test]
    fn an_error_is_described_with_its_causes_once() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let outer = std::io::Error::other(inner);
        assert_eq!(describe_error(&outer), "refused");
    }

    #[test]
    fn a_certificate_refusal_is_found_among_the_causes() {
        let tls = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        // As the TLS connector answers it: an io::Error in an io::Error.
        let wrapped =
            std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
        let problem = certificate_problem(&wrapped).expect("a certificate problem");
        assert!(problem.contains("UnknownIssuer"), "{problem}");
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert_eq!(certificate_problem(&refused), None);
        assert!(cli_failure("https://x", &refused).ends_with(": refused"));
    }
}
