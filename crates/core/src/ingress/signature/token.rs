//! `signature = "token"` (docs/configuration.md): the publisher sends a shared
//! token as it is, in a header (`token_header = "X-Gitlab-Token"`) or a query
//! parameter (`token_query = "token"`). The source's secrets are the accepted
//! tokens; each is compared in constant time.

use axum::http::HeaderName;
use subtle::ConstantTimeEq;

use super::{header_str, intern, Request, Secret, SignatureError, Verified};

/// Where the token travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenConfig {
    /// A request header, lower case.
    Header(&'static str),
    /// A query parameter.
    Query {
        /// The parameter's name.
        name: String,
        /// How explanations name it.
        what: &'static str,
    },
}

impl TokenConfig {
    /// Parses `token_header` / `token_query`: exactly one of them. The error names the key.
    pub fn parse(
        header: Option<&str>,
        query: Option<&str>,
    ) -> Result<Self, super::configurable::KeyError> {
        let refuse = |key, problem: String| super::configurable::KeyError { key, problem };
        match (header, query) {
            (Some(_), Some(_)) => Err(refuse(
                "token_query",
                "and token_header both say where the token is: keep one".into(),
            )),
            (None, None) => Err(refuse(
                "token_header",
                "or token_query is required for signature = \"token\"".into(),
            )),
            (Some(raw), None) => HeaderName::from_bytes(raw.trim().as_bytes())
                .map(|h| Self::Header(intern(h.as_str())))
                .map_err(|_| refuse("token_header", format!("{raw:?} is not a header name"))),
            (None, Some(raw)) => {
                if raw.is_empty()
                    || raw
                        .bytes()
                        .any(|b| !b.is_ascii_graphic() || b"&=#?".contains(&b))
                {
                    return Err(refuse(
                        "token_query",
                        format!("{raw:?} is not a query parameter name"),
                    ));
                }
                Ok(Self::Query {
                    name: raw.to_owned(),
                    what: intern(&format!("the query parameter {raw}")),
                })
            }
        }
    }

    /// The header the token travels in, if it travels in one.
    pub fn header(&self) -> Option<&'static str> {
        match self {
            Self::Header(h) => Some(h),
            Self::Query { .. } => None,
        }
    }

    /// How explanations name where the token is.
    pub fn what(&self) -> &'static str {
        match self {
            Self::Header(h) => h,
            Self::Query { what, .. } => what,
        }
    }

    /// Checks the delivery's token against every secret.
    pub fn verify(
        &self,
        request: &Request<'_>,
        secrets: &[Secret],
    ) -> Result<Verified, SignatureError> {
        let given = match self {
            Self::Header(h) => header_str(request.headers, h)?.as_bytes().to_vec(),
            Self::Query { name, what } => {
                query_value(request.path_and_query, name).ok_or(SignatureError::Absent { what })?
            }
        };
        let secret_index = matching_secret(&given, secrets).ok_or(SignatureError::Refused {
            what: self.what(),
            configured: secrets.len(),
        })?;
        Ok(Verified {
            secret_index,
            signed_at: None,
            delivery_id: None,
            signed_content: None,
        })
    }

    /// What a publisher sends: a header, or a query parameter.
    pub fn sign(&self, secret: &Secret) -> super::Signed {
        let token = String::from_utf8_lossy(secret.expose()).into_owned();
        match self {
            Self::Header(h) => super::Signed {
                headers: vec![(h, token)],
                query: None,
            },
            Self::Query { name, .. } => super::Signed {
                headers: Vec::new(),
                query: Some((name.clone(), token)),
            },
        }
    }
}

/// A token must be at least [`super::MIN_SHARED_SECRET_BYTES`] long, as an admin token:
/// a one-byte token is guessed at the first tries.
pub fn check_secret(secret: &Secret) -> Result<(), &'static str> {
    if secret.expose().len() < super::MIN_SHARED_SECRET_BYTES {
        return Err(
            "is shorter than 16 bytes: anyone who can reach the source could guess it. \
                    Use a random one, e.g. `openssl rand -hex 24`",
        );
    }
    Ok(())
}
const _: () = assert!(super::MIN_SHARED_SECRET_BYTES == 16);

/// The position of the secret equal to `given`, every secret compared in constant time.
pub(crate) fn matching_secret(given: &[u8], secrets: &[Secret]) -> Option<usize> {
    let mut found = None;
    for (i, secret) in secrets.iter().enumerate() {
        // No early exit: every secret is compared whichever matches.
        let hit: bool = secret.expose().ct_eq(given).into();
        if hit && found.is_none() {
            found = Some(i);
        }
    }
    found
}

/// The percent-decoded value of the first query parameter `name`, if present.
pub fn query_value(path_and_query: &str, name: &str) -> Option<Vec<u8>> {
    let query = path_and_query.split_once('?')?.1;
    let query = query.split('#').next().unwrap_or_default();
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        let key = decode(key);
        (key == name.as_bytes()).then(|| decode(value))
    })
}

fn decode(raw: &str) -> Vec<u8> {
    let plus = raw.replace('+', " ");
    percent_encoding::percent_decode_str(&plus).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue};

    fn request<'a>(headers: &'a HeaderMap, path: &'a str) -> Request<'a> {
        Request {
            headers,
            body: b"{}",
            method: "POST",
            path_and_query: path,
        }
    }

    #[test]
    fn a_gitlab_token_header_verifies_with_any_listed_token() {
        let config = TokenConfig::parse(Some("X-Gitlab-Token"), None).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-gitlab-token", HeaderValue::from_static("tok-2"));
        let secrets = [Secret::new("tok-1"), Secret::new("tok-2")];
        let v = config
            .verify(&request(&headers, "/webhooks/g"), &secrets)
            .unwrap();
        assert_eq!(v.secret_index, 1);
        headers.insert("x-gitlab-token", HeaderValue::from_static("tok-3"));
        let err = config
            .verify(&request(&headers, "/webhooks/g"), &secrets)
            .unwrap_err();
        assert_eq!(err.code(), "invalid_signature");
        assert!(!err.to_string().contains("tok-"), "{err}");
        assert_eq!(
            config.verify(&request(&HeaderMap::new(), "/"), &secrets),
            Err(SignatureError::Missing {
                header: "x-gitlab-token"
            })
        );
        // A prefix of a token is not the token.
        headers.insert("x-gitlab-token", HeaderValue::from_static("tok-"));
        assert!(config.verify(&request(&headers, "/"), &secrets).is_err());
    }

    #[test]
    fn a_query_token_is_decoded_and_compared() {
        let config = TokenConfig::parse(None, Some("token")).unwrap();
        let headers = HeaderMap::new();
        let secrets = [Secret::new("a b/c")];
        for path in ["/w?x=1&token=a+b%2Fc", "/w?token=a%20b/c"] {
            assert!(
                config.verify(&request(&headers, path), &secrets).is_ok(),
                "{path}"
            );
        }
        assert_eq!(
            config
                .verify(&request(&headers, "/w?tokens=a"), &secrets)
                .unwrap_err()
                .code(),
            "missing_signature"
        );
        assert_eq!(
            config
                .verify(&request(&headers, "/w?token=x"), &secrets)
                .unwrap_err()
                .code(),
            "invalid_signature"
        );
    }

    #[test]
    fn a_token_is_at_least_sixteen_bytes() {
        assert_eq!(check_secret(&Secret::new("sixteen-bytes-ok")), Ok(()));
        for short in ["t", "fifteen-bytes!!"] {
            let err = check_secret(&Secret::new(short)).unwrap_err();
            assert!(err.starts_with("is shorter than 16 bytes"), "{err}");
        }
        // Every scheme refuses an empty or blank secret first.
        for scheme in [super::super::Scheme::Token, super::super::Scheme::Hmac] {
            assert_eq!(scheme.check_secret(&Secret::new("")), Err("is empty"));
            assert!(scheme
                .check_secret(&Secret::new(" \t "))
                .unwrap_err()
                .starts_with("is blank"));
        }
        assert!(super::super::Scheme::Hmac
            .check_secret(&Secret::new("s"))
            .is_ok());
    }

    #[test]
    fn settings_name_their_key() {
        assert_eq!(
            TokenConfig::parse(None, None).unwrap_err().key,
            "token_header"
        );
        assert_eq!(
            TokenConfig::parse(Some("a"), Some("b")).unwrap_err().key,
            "token_query"
        );
        assert_eq!(
            TokenConfig::parse(Some("a b"), None).unwrap_err().key,
            "token_header"
        );
        assert_eq!(
            TokenConfig::parse(None, Some("a&b")).unwrap_err().key,
            "token_query"
        );
    }
}
