//! A private CA made by the test, and an HTTPS front signed by it: what a destination
//! or an inhook server behind a TLS-terminating proxy looks like to inhook's clients.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

/// A self-signed CA certificate whose common name is `name`, with its parameters and key.
pub fn self_signed_ca(
    name: &str,
) -> (rcgen::CertificateParams, rcgen::KeyPair, rcgen::Certificate) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    (params, key, cert)
}

/// A CA of the test's own, its certificate in a PEM file, and a certificate it issued
/// for `localhost`; no system trusts it.
pub struct TestCa {
    dir: tempfile::TempDir,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl TestCa {
    /// A fresh CA and its `localhost` server certificate.
    pub fn new() -> Self {
        let (ca_params, ca_key, ca_cert) = self_signed_ca("inhook test CA");
        let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &issuer)
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem()).unwrap();
        let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
        )
        .unwrap();
        Self {
            dir,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(tls)),
        }
    }

    /// The PEM file of the CA's certificate (what `tls_ca_file` / `--tls-ca-file` names).
    pub fn file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// Serves HTTPS for `localhost` on a free loopback port, passing each connection's
    /// bytes on to the plain HTTP server at `upstream`; answers the port. The front runs
    /// on a thread of its own, so a test may block on a CLI run meanwhile.
    pub fn https_front(&self, upstream: SocketAddr) -> u16 {
        self.front(move |tcp, acceptor| async move {
            // A client that refuses the certificate ends here.
            let Ok(mut tls) = acceptor.accept(tcp).await else {
                return;
            };
            let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await else {
                return;
            };
            let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
        })
    }

    /// Listens on a free loopback port and hands each connection, with the acceptor of the
    /// CA's `localhost` certificate, to `serve` (a protocol may speak before its TLS
    /// handshake); answers the port. On a thread of its own, as [`TestCa::https_front`].
    pub fn front<F, Fut>(&self, serve: F) -> u16
    where
        F: Fn(tokio::net::TcpStream, tokio_rustls::TlsAcceptor) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let acceptor = self.acceptor.clone();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).unwrap();
                loop {
                    let Ok((tcp, _)) = listener.accept().await else {
                        return;
                    };
                    tokio::spawn(serve(tcp, acceptor.clone()));
                }
            });
        });
        port
    }
}
