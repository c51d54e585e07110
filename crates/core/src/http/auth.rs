//! Who may call the admin API (`/v1/*`, and `/metrics` unless public), and the headers
//! every admin answer carries. With an `admin_token`, the bearer token decides. Without
//! one, only a direct loopback client naming a loopback `Host` is served: a local proxy
//! or sidecar would make every client look like loopback, and a foreign `Host` means a
//! DNS-rebound page. In both modes a state-changing call must come from this origin
//! and carry JSON, so a cross-site form post cannot replay or reload. A peer that keeps
//! sending wrong tokens is made to wait ([`TokenGuesses`]).

use crate::operations::log_throttle::{LogThrottle, NOISY_LOG_INTERVAL};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::uri::{Authority, Uri};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::answer::Answer;
use super::AppState;
use crate::ingress::signature::Secret;

/// Headers a proxy adds; any of them means the TCP peer is not the client.
const PROXY_HEADERS: [&str; 3] = ["forwarded", "x-forwarded-for", "x-real-ip"];

/// Wrong tokens a peer may send in a row before it must wait between tries.
const FREE_GUESSES: u32 = 10;
/// The longest a peer is made to wait between tries.
const LONGEST_WAIT: Duration = Duration::from_secs(60);
/// Peers remembered at most: past it, those not waiting are forgotten first.
const MOST_PEERS: usize = 16_384;

/// Wrong admin tokens per peer (an IPv6 /64 is one peer). Past [`FREE_GUESSES`] in a row,
/// a peer must wait before its next token is even compared: 1 s, doubling with each wrong
/// one up to [`LONGEST_WAIT`]; meanwhile every call carrying a token is answered 429, so a
/// right guess cannot be told from a wrong one. A right token clears the count.
#[derive(Default)]
pub struct TokenGuesses(Mutex<HashMap<IpAddr, Guesses>>);

#[derive(Clone, Copy)]
struct Guesses {
    wrong: u32,
    wait_until: Instant,
}

impl TokenGuesses {
    /// How long `peer` must still wait before a token of its is compared, if at all.
    fn wait(&self, peer: IpAddr, now: Instant) -> Option<Duration> {
        let guesses = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let until = guesses
            .get(&crate::ingress::peers::peer_key(peer))?
            .wait_until;
        (until > now).then(|| until - now)
    }

    /// Counts a wrong token from `peer`.
    fn wrong(&self, peer: IpAddr, now: Instant) {
        let mut guesses = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if guesses.len() >= MOST_PEERS {
            guesses.retain(|_, g| g.wait_until > now);
            if guesses.len() >= MOST_PEERS {
                guesses.clear();
            }
        }
        let entry = guesses
            .entry(crate::ingress::peers::peer_key(peer))
            .or_insert(Guesses {
                wrong: 0,
                wait_until: now,
            });
        entry.wrong = entry.wrong.saturating_add(1);
        if let Some(over) = entry.wrong.checked_sub(FREE_GUESSES) {
            let wait = Duration::from_secs(1u64 << over.min(6)).min(LONGEST_WAIT);
            entry.wait_until = now + wait;
        }
    }

    /// Forgets `peer`'s wrong tokens: it sent the right one.
    fn right(&self, peer: IpAddr) {
        let mut guesses = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !guesses.is_empty() {
            guesses.remove(&crate::ingress::peers::peer_key(peer));
        }
    }
}

/// Refused admin calls are logged one line per interval at most: a flood must not fill the log.
static REFUSED_LOG: LogThrottle = LogThrottle::new(NOISY_LOG_INTERVAL);

/// Lets a request through if [`admit`] does; otherwise answers its refusal.
pub(super) async fn require_admin(
    State(state): State<AppState>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    request: Request,
    next: Next,
) -> Response {
    let token = state.config.admin.admin_token.as_ref();
    let now = Instant::now();
    let offers_token = request.headers().contains_key(header::AUTHORIZATION);
    let outcome = match token.zip(state.token_guesses.wait(peer.ip(), now)) {
        Some((_, wait)) if offers_token => Err(Answer::TooManyWrongTokens {
            retry_after_s: wait.as_secs_f64().ceil().max(1.0) as u64,
        }),
        _ => admit(token, peer, request.method(), request.headers()),
    };
    if token.is_some() && offers_token {
        match &outcome {
            Err(Answer::Unauthorized(_)) => state.token_guesses.wrong(peer.ip(), now),
            Ok(()) => state.token_guesses.right(peer.ip()),
            Err(_) => {}
        }
    }
    match outcome {
        Ok(()) => next.run(request).await,
        Err(refusal) => {
            if let Some(suppressed) = REFUSED_LOG.admit() {
                tracing::info!(%peer, decision = refusal.decision(), suppressed, "admin call refused");
            }
            refusal.into_response()
        }
    }
}

/// Adds `Cache-Control: no-store` and `X-Content-Type-Options: nosniff` to every `/v1/*`
/// answer, errors included: admin data must not stay in a shared cache or be sniffed.
pub(super) async fn mark_admin_answers(request: Request, next: Next) -> Response {
    let admin = request.uri().path().starts_with("/v1/");
    let mut response = next.run(request).await;
    if admin {
        let headers = response.headers_mut();
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
    }
    response
}

/// Decides whether a request may reach the admin API.
fn admit(
    token: Option<&Secret>,
    peer: SocketAddr,
    method: &Method,
    headers: &HeaderMap,
) -> Result<(), Answer> {
    match token {
        Some(token) => {
            if !bearer_matches(headers, token) {
                return Err(Answer::Unauthorized(
                    "missing or wrong admin token (Authorization: Bearer <admin_token>)",
                ));
            }
        }
        None => {
            if PROXY_HEADERS.iter().any(|name| headers.contains_key(*name)) {
                return Err(Answer::Unauthorized(
                    "no admin_token is configured and the request came through a proxy \
                     (Forwarded, X-Forwarded-For or X-Real-IP): only direct loopback clients are served",
                ));
            }
            if !is_loopback(peer) {
                return Err(Answer::Unauthorized(
                    "no admin_token is configured: only direct loopback clients are served",
                ));
            }
            if !headers
                .get(header::HOST)
                .and_then(|v| v.to_str().ok())
                .is_some_and(is_loopback_host)
            {
                return Err(Answer::Forbidden {
                    error: "forbidden_host",
                    detail: "no admin_token is configured: the Host must be localhost, 127.0.0.1 or [::1]",
                });
            }
        }
    }
    if !is_safe(method) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        if let Some(origin) = headers.get(header::ORIGIN) {
            let same = match (origin.to_str(), host) {
                (Ok(origin), Some(host)) => same_origin(origin, host),
                _ => false,
            };
            if !same {
                return Err(Answer::Forbidden {
                    error: "forbidden_origin",
                    detail: "a state-changing call must come from this server's own origin",
                });
            }
        }
        if carries_body(headers) && !super::ingress::is_json(headers) {
            return Err(Answer::UnsupportedMediaType {
                expected: "application/json",
            });
        }
    }
    Ok(())
}

/// Whether the method changes nothing (the only ones a cross-site page may send freely).
fn is_safe(method: &Method) -> bool {
    matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// Whether the request declares a body or its type.
fn carries_body(headers: &HeaderMap) -> bool {
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers.contains_key(header::CONTENT_TYPE)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|n| n.trim() != "0")
}

/// Compares SHA-256 digests in constant time, so neither the token's bytes nor its length leak.
fn bearer_matches(headers: &HeaderMap, token: &Secret) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, given)| given.trim())
    else {
        return false;
    };
    let given = Sha256::digest(given.as_bytes());
    let expected = Sha256::digest(token.expose());
    bool::from(given.ct_eq(&expected))
}

/// Whether the TCP peer is loopback, an IPv4-mapped IPv6 address (`::ffff:127.0.0.1`,
/// from a dual-stack listener) counting as the IPv4 address it maps.
fn is_loopback(peer: SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// Whether a `Host` header names this machine by a loopback name, on any port.
fn is_loopback_host(host: &str) -> bool {
    let Ok(authority) = host.parse::<Authority>() else {
        return false;
    };
    let name = authority.host();
    name.eq_ignore_ascii_case("localhost") || name == "127.0.0.1" || name == "[::1]"
}

/// Whether `origin` (`scheme://host[:port]`) is the origin `host` (a `Host` header) serves,
/// ports defaulting by the origin's scheme.
fn same_origin(origin: &str, host: &str) -> bool {
    let Ok(origin) = origin.parse::<Uri>() else {
        return false;
    };
    let default_port = match origin.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        _ => return false,
    };
    let (Some(from), Ok(host)) = (origin.authority(), host.parse::<Authority>()) else {
        return false;
    };
    from.host().eq_ignore_ascii_case(host.host())
        && from.port_u16().unwrap_or(default_port) == host.port_u16().unwrap_or(default_port)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    header::HeaderName::from_static(k),
                    HeaderValue::from_static(v),
                )
            })
            .collect()
    }

    #[test]
    fn an_ipv4_mapped_loopback_peer_is_loopback() {
        for (peer, loopback) in [
            ("127.0.0.1:1", true),
            ("[::1]:1", true),
            ("[::ffff:127.0.0.1]:1", true),
            ("[::ffff:127.9.9.9]:1", true),
            ("[::ffff:10.0.0.1]:1", false),
            ("10.0.0.1:1", false),
            ("[2001:db8::1]:1", false),
        ] {
            assert_eq!(is_loopback(peer.parse().unwrap()), loopback, "{peer}");
        }
    }

    #[test]
    fn only_loopback_names_are_loopback_hosts() {
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "127.0.0.1:1",
            "[::1]:8080",
            "[::1]",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.2",
            "",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn same_origin_compares_host_and_port() {
        assert!(same_origin("http://127.0.0.1:8080", "127.0.0.1:8080"));
        assert!(same_origin("https://Admin.Example", "admin.example"));
        assert!(same_origin("http://admin.example", "admin.example:80"));
        assert!(!same_origin("http://evil.example:8080", "127.0.0.1:8080"));
        assert!(!same_origin("http://127.0.0.1:9090", "127.0.0.1:8080"));
        assert!(!same_origin("null", "127.0.0.1:8080"));
        assert!(!same_origin("file://", "127.0.0.1:8080"));
    }

    #[test]
    fn the_bearer_must_match_whole() {
        let token = Secret::new("s3cret-token");
        assert!(bearer_matches(
            &headers(&[("authorization", "Bearer s3cret-token")]),
            &token
        ));
        assert!(bearer_matches(
            &headers(&[("authorization", "bearer s3cret-token")]),
            &token
        ));
        for wrong in [
            "Bearer s3cret",
            "Bearer s3cret-token-",
            "Basic s3cret-token",
            "s3cret-token",
        ] {
            assert!(
                !bearer_matches(&headers(&[("authorization", wrong)]), &token),
                "{wrong}"
            );
        }
        assert!(!bearer_matches(&headers(&[]), &token));
    }

    #[test]
    fn state_changing_calls_need_this_origin_and_json() {
        let peer: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let host = ("host", "127.0.0.1:8080");
        let code = |method: Method, pairs: &[(&'static str, &'static str)]| {
            admit(None, peer, &method, &headers(pairs))
                .err()
                .map(|a| a.decision())
        };
        assert_eq!(code(Method::POST, &[host]), None);
        assert_eq!(
            code(
                Method::POST,
                &[
                    host,
                    ("origin", "http://127.0.0.1:8080"),
                    ("content-type", "application/json")
                ]
            ),
            None
        );
        assert_eq!(
            code(Method::POST, &[host, ("origin", "http://evil.example")]),
            Some("forbidden_origin")
        );
        assert_eq!(
            code(Method::POST, &[host, ("content-type", "text/plain")]),
            Some("unsupported_media_type")
        );
        assert_eq!(
            code(Method::POST, &[host, ("content-length", "3")]),
            Some("unsupported_media_type")
        );
        // A read from another origin changes nothing; CORS keeps its answer from the page.
        assert_eq!(
            code(Method::GET, &[host, ("origin", "http://evil.example")]),
            None
        );
        assert_eq!(
            code(Method::GET, &[("host", "evil.example")]),
            Some("forbidden_host")
        );
        assert_eq!(
            code(Method::GET, &[host, ("x-forwarded-for", "203.0.113.5")]),
            Some("unauthorized")
        );
    }
}
