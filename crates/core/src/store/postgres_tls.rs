//! PostgreSQL over TLS, with libpq's meaning of the URL's `sslmode` and `sslrootcert`.
//!
//! tokio-postgres knows only `disable`, `prefer` and `require` and rejects `sslrootcert`,
//! so both parameters are taken out of the URL here and become a rustls client config
//! (ring provider) whose certificate checks are the ones libpq makes in each mode.

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::Utf8Error;
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore};
use tokio_postgres::config::SslMode as WireMode;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::forward::outbound::{pem_roots, PemRootsError};

/// Why the database URL's TLS settings cannot be used (docs/configuration.md, PostgreSQL
/// TLS). No variant holds the URL, whose password must never reach an error.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// `sslmode` is not one of libpq's modes (or is `allow`, which is not supported).
    #[error(
        "database URL: sslmode {0:?} is not one of disable, prefer, require, verify-ca, verify-full"
    )]
    UnknownMode(String),
    /// A TLS parameter's percent-encoded value does not decode to UTF-8.
    #[error("database URL: {key} is not valid UTF-8")]
    NotUtf8 {
        /// The parameter (`sslmode` or `sslrootcert`), never its value.
        key: String,
        /// What decoding found.
        #[source]
        source: Utf8Error,
    },
    /// `sslrootcert=system` without `sslmode=verify-full`, which libpq refuses too.
    #[error("database URL: sslrootcert=system needs sslmode=verify-full, not {}", mode_name(*.0))]
    SystemRootsNeedVerifyFull(SslMode),
    /// tokio-postgres refused the rest of the URL.
    #[error("invalid PostgreSQL URL")]
    InvalidUrl(#[source] tokio_postgres::Error),
    /// The root certificates could not be read.
    #[error(transparent)]
    Roots(#[from] PemRootsError),
    /// The certificate verifier could not be built on the roots.
    #[error("{trusted_by}")]
    Verifier {
        /// Where the roots came from: `sslrootcert` and its path, or the bundled roots.
        trusted_by: String,
        /// rustls's reason.
        #[source]
        source: rustls::client::VerifierBuilderError,
    },
    /// rustls refused the protocol versions of its own provider.
    #[error("TLS setup")]
    Tls(#[source] rustls::Error),
}

/// How much TLS a connection insists on and what it checks, as libpq's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plain TCP.
    Disable,
    /// TLS when the server offers it, plain when it refuses (libpq's default).
    Prefer,
    /// TLS or nothing; the certificate is checked only when a root certificate is given.
    Require,
    /// TLS with the certificate chain verified, whatever host name it names.
    VerifyCa,
    /// TLS with the certificate chain and the host name verified.
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, TlsConfigError> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            other => Err(TlsConfigError::UnknownMode(other.to_owned())),
        }
    }
}

/// The URL's TLS parameters, taken out of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsParams {
    /// `sslmode`, `prefer` when absent (as libpq).
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file of trusted certificates, or `system`.
    pub rootcert: Option<String>,
}

/// Splits `url` into the URL tokio-postgres understands (without `sslmode` and
/// `sslrootcert`, every other parameter kept) and the TLS parameters.
pub fn split_url(url: &str) -> Result<(String, TlsParams), TlsConfigError> {
    let mut params = TlsParams {
        mode: SslMode::Prefer,
        rootcert: None,
    };
    let Some((base, query)) = url.split_once('?') else {
        return Ok((url.to_owned(), params));
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let decoded = || {
            percent_decode_str(value)
                .decode_utf8()
                .map(|v| v.into_owned())
                .map_err(|source| TlsConfigError::NotUtf8 {
                    key: key.to_owned(),
                    source,
                })
        };
        match key {
            "sslmode" => params.mode = SslMode::parse(&decoded()?)?,
            "sslrootcert" => params.rootcert = Some(decoded()?).filter(|v| !v.is_empty()),
            _ => kept.push(pair),
        }
    }
    if params.rootcert.as_deref() == Some("system") && params.mode != SslMode::VerifyFull {
        // As libpq: trusting every public CA is safe only when the host name is checked too.
        return Err(TlsConfigError::SystemRootsNeedVerifyFull(params.mode));
    }
    let url = if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    };
    Ok((url, params))
}

/// What to warn of at start about `url`'s TLS, if anything: `sslmode=prefer` (the default)
/// to a host that is not this machine falls back to plain TCP when anyone on the path
/// answers that the server offers no TLS, sending the password and every event in clear.
pub fn start_warning(url: &str) -> Option<String> {
    let (base, params) = split_url(url).ok()?;
    if params.mode != SslMode::Prefer {
        return None;
    }
    let config: tokio_postgres::Config = base.parse().ok()?;
    let remote = config.get_hosts().iter().any(|host| match host {
        tokio_postgres::config::Host::Tcp(name) => {
            let name = name.trim_start_matches('[').trim_end_matches(']');
            name != "localhost"
                && !name
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        #[cfg(unix)]
        tokio_postgres::config::Host::Unix(_) => false,
    });
    remote.then(|| {
        "the database URL has sslmode=prefer (the default) for a host that is not this machine: \
         anyone on the path can strip TLS. Set sslmode=verify-full (or require) to insist on it"
            .to_owned()
    })
}

fn mode_name(mode: SslMode) -> &'static str {
    match mode {
        SslMode::Disable => "disable",
        SslMode::Prefer => "prefer",
        SslMode::Require => "require",
        SslMode::VerifyCa => "verify-ca",
        SslMode::VerifyFull => "verify-full",
    }
}

/// Where the trusted roots come from.
enum Roots {
    /// A PEM file: `sslrootcert`, or libpq's default `~/.postgresql/root.crt` when it exists.
    File(PathBuf),
    /// The Mozilla roots built into inhook (`sslrootcert=system`, or a verify mode without a file).
    Bundled,
}

impl Roots {
    fn of(params: &TlsParams, home: Option<&Path>) -> Option<Self> {
        match params.rootcert.as_deref() {
            Some("system") => Some(Self::Bundled),
            Some(path) => Some(Self::File(PathBuf::from(path))),
            None => {
                let default = home.map(|h| h.join(".postgresql/root.crt"));
                match default.filter(|f| f.is_file()) {
                    Some(file) => Some(Self::File(file)),
                    None if matches!(params.mode, SslMode::VerifyCa | SslMode::VerifyFull) => {
                        Some(Self::Bundled)
                    }
                    None => None,
                }
            }
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::File(path) => format!("sslrootcert {}", path.display()),
            Self::Bundled => "the bundled Mozilla root certificates".into(),
        }
    }

    fn load(&self) -> Result<RootCertStore, PemRootsError> {
        let path = match self {
            Self::Bundled => {
                return Ok(RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                })
            }
            Self::File(path) => path,
        };
        pem_roots(path, "sslrootcert")
    }
}

/// Parses `url` into tokio-postgres's config and the TLS connector for its connections.
pub fn configure(url: &str) -> Result<(tokio_postgres::Config, MakeRustlsConnect), TlsConfigError> {
    let (url, params) = split_url(url)?;
    let mut config: tokio_postgres::Config = url.parse().map_err(TlsConfigError::InvalidUrl)?;
    config.ssl_mode(match params.mode {
        SslMode::Disable => WireMode::Disable,
        SslMode::Prefer => WireMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => WireMode::Require,
    });
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let connector = connector(params.mode, Roots::of(&params, home.as_deref()))?;
    Ok((config, connector))
}

fn connector(mode: SslMode, roots: Option<Roots>) -> Result<MakeRustlsConnect, TlsConfigError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = match (mode, roots) {
        (SslMode::Disable, _) | (_, None) => Verifier::anything(Arc::clone(&provider)),
        (mode, Some(roots)) => {
            let trusted_by = roots.describe();
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots.load()?), {
                Arc::clone(&provider)
            })
            .build()
            .map_err(|source| TlsConfigError::Verifier {
                trusted_by: trusted_by.clone(),
                source,
            })?;
            Verifier {
                provider: Arc::clone(&provider),
                chain: Some(webpki),
                check_name: mode == SslMode::VerifyFull,
                trusted_by,
            }
        }
    };
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsConfigError::Tls)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(config))
}

/// The server certificate check of one `sslmode`: none (`prefer` and `require` without
/// a root certificate, as libpq), the chain (`verify-ca`), or the chain and the host name.
#[derive(Debug)]
struct Verifier {
    provider: Arc<CryptoProvider>,
    chain: Option<Arc<WebPkiServerVerifier>>,
    check_name: bool,
    trusted_by: String,
}

impl Verifier {
    fn anything(provider: Arc<CryptoProvider>) -> Self {
        Self {
            provider,
            chain: None,
            check_name: false,
            trusted_by: String::new(),
        }
    }
}

/// A certificate check that failed, said in libpq's terms.
#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl StdError for Refused {}

fn refused(message: String) -> rustls::Error {
    rustls::Error::Other(rustls::OtherError(Arc::new(Refused(message))))
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        // webpki checks the chain first and the name last, so a name error means the chain is good.
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Err(refused(format!(
                "host name mismatch: the server's certificate is not valid for {}",
                server_name.to_str()
            ))),
            // A root of the same name as the real issuer but another key fails on the signature.
            Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer
                | CertificateError::BadSignature
                | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. },
            )) => Err(refused(format!(
                "the server's certificate is not trusted by {}",
                self.trusted_by
            ))),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// Renders a connection failure with its causes, which tokio-postgres's own message
/// leaves out ("error performing TLS handshake" says nothing of which check failed).
pub fn describe(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        let shown = match err
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        {
            Some(rustls::Error::Other(other)) => other.0.to_string(),
            _ => err.to_string(),
        };
        if !text.ends_with(&shown) {
            text = format!("{text}: {shown}");
        }
        cause = err.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(url: &str) -> Result<(String, TlsParams), TlsConfigError> {
        split_url(url)
    }

    #[test]
    fn prefer_to_a_remote_host_is_warned_of() {
        for remote in [
            "postgres://u@db.example:5432/x",
            "postgres://u@10.0.0.7/x?sslmode=prefer",
            "postgres://u@127.0.0.1,db.example/x",
        ] {
            assert!(start_warning(remote).is_some(), "{remote}");
        }
        for quiet in [
            "postgres://u@127.0.0.1:5432/x",
            "postgres://u@localhost/x",
            "postgres://u@[::1]/x",
            "postgres://u@db.example/x?sslmode=verify-full",
            "postgres://u@db.example/x?sslmode=require",
        ] {
            assert_eq!(start_warning(quiet), None, "{quiet}");
        }
    }

    #[test]
    fn absent_sslmode_is_prefer_and_the_url_is_untouched() {
        let (url, params) = split("postgres://u:pw@h:5432/db").unwrap();
        assert_eq!(url, "postgres://u:pw@h:5432/db");
        assert_eq!(params.mode, SslMode::Prefer);
        assert_eq!(params.rootcert, None);
    }

    #[test]
    fn tls_parameters_leave_the_url_and_the_others_stay() {
        let (url, params) = split(
            "postgres://u@h/db?connect_timeout=5&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&application_name=x",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u@h/db?connect_timeout=5&application_name=x"
        );
        assert_eq!(params.mode, SslMode::VerifyFull);
        assert_eq!(params.rootcert.as_deref(), Some("/etc/ca.pem"));
        let (url, _) = split("postgres://u@h/db?sslmode=require").unwrap();
        assert_eq!(url, "postgres://u@h/db");
    }

    #[test]
    fn every_libpq_mode_parses() {
        for (name, mode) in [
            ("disable", SslMode::Disable),
            ("prefer", SslMode::Prefer),
            ("require", SslMode::Require),
            ("verify-ca", SslMode::VerifyCa),
            ("verify-full", SslMode::VerifyFull),
        ] {
            let (_, params) = split(&format!("postgres://h/db?sslmode={name}")).unwrap();
            assert_eq!(params.mode, mode);
            assert_eq!(mode_name(mode), name);
        }
    }

    #[test]
    fn an_unknown_sslmode_is_named_and_the_password_is_not() {
        let err = describe(&split("postgres://u:hunter2@h/db?sslmode=bogus").unwrap_err());
        assert!(err.contains("sslmode \"bogus\""), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let err = describe(
            &configure("postgres://u:hunter2@h/db?sslmode=allow")
                .err()
                .unwrap(),
        );
        assert!(err.contains("sslmode \"allow\""), "{err}");
    }

    #[test]
    fn another_bad_parameter_is_named() {
        let err = describe(
            &configure("postgres://u:hunter2@h/db?sslcert=/client.pem")
                .err()
                .unwrap(),
        );
        assert!(err.contains("sslcert"), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
    }

    #[test]
    fn system_roots_need_verify_full() {
        let err =
            describe(&split("postgres://h/db?sslmode=require&sslrootcert=system").unwrap_err());
        assert!(err.contains("verify-full"), "{err}");
        let (_, params) = split("postgres://h/db?sslmode=verify-full&sslrootcert=system").unwrap();
        assert_eq!(params.rootcert.as_deref(), Some("system"));
    }

    #[test]
    fn roots_follow_libpq() {
        let params = |mode, rootcert: Option<&str>| TlsParams {
            mode,
            rootcert: rootcert.map(str::to_owned),
        };
        let no_home = None;
        assert!(Roots::of(&params(SslMode::Require, None), no_home).is_none());
        assert!(Roots::of(&params(SslMode::Prefer, None), no_home).is_none());
        assert!(matches!(
            Roots::of(&params(SslMode::Require, Some("/ca.pem")), no_home),
            Some(Roots::File(_))
        ));
        assert!(matches!(
            Roots::of(&params(SslMode::VerifyFull, None), no_home),
            Some(Roots::Bundled)
        ));
        // libpq's default root file counts when it exists, even for require.
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".postgresql")).unwrap();
        let root = home.path().join(".postgresql/root.crt");
        std::fs::write(&root, "").unwrap();
        match Roots::of(&params(SslMode::Require, None), Some(home.path())) {
            Some(Roots::File(file)) => assert_eq!(file, root),
            _ => panic!("the default root file is used"),
        }
    }

    #[test]
    fn an_unreadable_or_empty_root_file_is_a_clear_error() {
        let err = describe(
            &configure("postgres://h/db?sslmode=require&sslrootcert=/no/such/ca.pem")
                .err()
                .unwrap(),
        );
        assert!(err.starts_with("sslrootcert /no/such/ca.pem: "), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let err = describe(
            &configure(&format!(
                "postgres://h/db?sslmode=verify-ca&sslrootcert={}",
                empty.display()
            ))
            .err()
            .unwrap(),
        );
        assert!(err.contains("no certificate in it"), "{err}");
    }

    #[test]
    fn describe_walks_the_causes_without_repeating_them() {
        let tls = std::io::Error::other(refused("host name mismatch: x".into()));
        assert_eq!(describe(&Wrapper(tls)), "wrapped: host name mismatch: x");
        let plain = std::io::Error::other("wrapped");
        assert_eq!(describe(&Wrapper(plain)), "wrapped");
    }

    #[derive(Debug)]
    struct Wrapper(std::io::Error);

    impl fmt::Display for Wrapper {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }

    impl StdError for Wrapper {
        fn source(&self) -> Option<&(dyn StdError + 'static)> {
            Some(&self.0)
        }
    }
}
