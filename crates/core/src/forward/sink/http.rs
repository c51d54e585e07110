//! The HTTP sink (docs/forwarding.md): a `POST` of the body to the destination's
//! `url`, through inhook's outbound TLS, following no redirect; the answer's status and
//! `Retry-After` are what the rules judge.

use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};

use super::{Outgoing, Sink, Unsendable};
use crate::forward::answer::AttemptResult;
use crate::forward::outbound::describe_error;

/// Why the HTTP client of forwarded requests could not be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpClientError {
    /// The outbound TLS setup failed (`tls_ca_file`, named in the error).
    #[error(transparent)]
    Setup(#[from] crate::forward::outbound::ClientSetupError),
    /// reqwest refused the builder.
    #[error("HTTP client")]
    Build(#[source] reqwest::Error),
}

/// Builds the HTTP client forwarded requests go through: inhook's outbound TLS (the
/// system's roots plus `tls_ca_file`), no redirects followed (a 3xx is not a delivery)
/// and no proxy from the environment.
pub fn http_client(
    tls_ca_file: Option<&std::path::Path>,
) -> Result<reqwest::Client, HttpClientError> {
    crate::forward::outbound::client_builder(tls_ca_file, "tls_ca_file")?
        .build()
        .map_err(HttpClientError::Build)
}

/// A destination of `type = "http"` (the default).
#[derive(Debug, Clone)]
pub struct HttpSink {
    /// The client (shared by the destinations of one `tls_ca_file`).
    pub client: reqwest::Client,
    /// Where events are POSTed.
    pub url: String,
    /// The destination's `timeout_s`, named when a request times out.
    pub timeout_s: u64,
}

#[async_trait::async_trait]
impl Sink for HttpSink {
    async fn send(
        &self,
        message: Outgoing<'_>,
        limit: Duration,
    ) -> Result<AttemptResult, Unsendable> {
        let headers = header_map(&message.headers)?;
        let sent = self
            .client
            .post(&self.url)
            .headers(headers)
            .body(message.body)
            .timeout(limit)
            .send()
            .await;
        Ok(match sent {
            Ok(response) => AttemptResult::http(
                response.status().as_u16(),
                response
                    .headers()
                    .get(RETRY_AFTER)
                    .and_then(|v| v.to_str().ok()),
            ),
            Err(err) if err.is_timeout() => AttemptResult::TimedOut {
                after_s: self.timeout_s,
            },
            Err(err) => AttemptResult::ConnectionFailed(describe_error(&err.without_url())),
        })
    }
}

/// The headers as reqwest takes them; the message's values are percent-encoded, so a
/// failure here is a bug. The value (a signature, say) is not shown.
fn header_map(headers: &[(&'static str, String)]) -> Result<HeaderMap, Unsendable> {
    let mut map = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let value = HeaderValue::from_str(value).map_err(|_| Unsendable::Header(name))?;
        map.insert(HeaderName::from_static(name), value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ca_file_that_is_not_pem_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, "nothing").unwrap();
        let err = http_client(Some(&path)).unwrap_err().to_string();
        assert!(err.starts_with("tls_ca_file "), "{err}");
        assert!(http_client(None).is_ok());
    }

    #[test]
    fn a_header_value_the_wire_cannot_carry_is_refused_without_showing_it() {
        let headers = [("webhook-signature", "v1,secret\nvalue".to_owned())];
        let err = header_map(&headers).unwrap_err().to_string();
        assert_eq!(
            err,
            "cannot build the request: header webhook-signature is invalid"
        );
        let fine = [("webhook-id", "msg_1".to_owned())];
        assert_eq!(header_map(&fine).unwrap()["webhook-id"], "msg_1");
    }
}
