//! A forwarded request (docs/forwarding.md): its stable `webhook-id`, and the headers of
//! one attempt, signed with Standard Webhooks v1 by the signing code ingress verifies with.

use std::fmt;

use base64::Engine;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use sha2::{Digest, Sha256};

use crate::ingress::signature::{standard_webhooks, try_sign, Scheme, Secret, SignError};

/// The `webhook-id` of an event's deliveries: `msg_` and the unpadded base64url of the
/// first 18 bytes of SHA-256(len(source) as 8 big-endian bytes, source, event_id).
///
/// Derived, not drawn: (source, event_id) is the event's unique key in the log, so
/// every destination, retry, replay and node computes the same id without sharing
/// any state, and a request resent after a crash carries it too. Hashed, so that the
/// id has one length and one alphabet whatever the publisher's event_id holds
/// (it may be 200 bytes of anything printable); 144 bits make a collision between
/// two events unthinkable; `msg_` is the Standard Webhooks convention.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct WebhookId(String);

impl WebhookId {
    /// The id of the event `event_id` of `source`.
    pub fn of(source: &str, event_id: &str) -> Self {
        let mut hash = Sha256::new();
        // Length-prefixed, so that no two (source, event_id) pairs hash the same input.
        hash.update((source.len() as u64).to_be_bytes());
        hash.update(source.as_bytes());
        hash.update(event_id.as_bytes());
        let digest = hash.finalize();
        let encoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&digest[..18]);
        WebhookId(format!("msg_{encoded}"))
    }

    /// Takes a stored id back.
    pub fn from_stored(stored: String) -> Self {
        WebhookId(stored)
    }

    /// The id as sent.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WebhookId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a forwarded request says about its event, beyond the body.
#[derive(Debug, Clone, Copy)]
pub struct ForwardedEvent<'a> {
    /// The event's `webhook-id`.
    pub webhook_id: &'a WebhookId,
    /// The source's name.
    pub source: &'a str,
    /// The logged event_id.
    pub event_id: &'a str,
    /// The logged event type (empty: no `inhook-event-type` header).
    pub event_type: &'a str,
    /// The aggregate in its text form (docs/contract.md, json sources).
    pub aggregate: &'a str,
    /// The logged sequence.
    pub sequence: i64,
    /// The raw body as received, sent byte for byte.
    pub body: &'a [u8],
    /// The body's media type: the `content-type` it was received with, else its source's
    /// (`application/json`, or a form source's `application/x-www-form-urlencoded`).
    pub content_type: &'a str,
}

/// Bytes a header value cannot carry as they are, and `%`, so that the value decodes back.
const HEADER_ESCAPED: &AsciiSet = &CONTROLS.add(b' ').add(b'%');
/// The same without `%`: an aggregate's text form already escapes it in its parts.
const AGGREGATE_ESCAPED: &AsciiSet = &CONTROLS.add(b' ');

/// The headers of one attempt at `attempt_at` (unix seconds; `webhook-timestamp` is the
/// time of this attempt so that a replay days later verifies), `attempt` counting from 1.
/// Signed when `secret` is given (always for HTTP; a sink's secret is optional), else
/// only `webhook-id` of the Standard Webhooks headers. Values outside visible ASCII
/// (non-ASCII ids or keys) are percent-encoded.
pub fn request_headers(
    event: &ForwardedEvent<'_>,
    secret: Option<&Secret>,
    attempt: u32,
    attempt_at: i64,
) -> Result<Vec<(&'static str, String)>, SignError> {
    let mut headers = vec![("content-type", event.content_type.to_owned())];
    match secret {
        Some(secret) => headers.extend(try_sign(
            Scheme::StandardWebhooks,
            event.body,
            secret,
            attempt_at,
            Some(event.webhook_id.as_str()),
        )?),
        None => headers.push((
            standard_webhooks::ID_HEADER,
            event.webhook_id.as_str().to_owned(),
        )),
    }
    headers.push(("inhook-source", event.source.to_owned()));
    headers.push((
        "inhook-event-id",
        utf8_percent_encode(event.event_id, HEADER_ESCAPED).to_string(),
    ));
    if !event.event_type.is_empty() {
        headers.push((
            "inhook-event-type",
            utf8_percent_encode(event.event_type, HEADER_ESCAPED).to_string(),
        ));
    }
    headers.push((
        "inhook-aggregate",
        utf8_percent_encode(event.aggregate, AGGREGATE_ESCAPED).to_string(),
    ));
    headers.push(("inhook-sequence", event.sequence.to_string()));
    headers.push(("inhook-attempt", attempt.to_string()));
    debug_assert!(
        secret.is_none()
            || headers
                .iter()
                .any(|(name, _)| *name == standard_webhooks::SIGNATURE_HEADER)
    );
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ingress::signature::{verify, SignatureError};
    use axum::http::{HeaderMap, HeaderName, HeaderValue};

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    fn header_map(headers: &[(&'static str, String)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            map.insert(
                HeaderName::from_static(name),
                HeaderValue::from_str(value).expect("a valid header value"),
            );
        }
        map
    }

    fn event<'a>(id: &'a WebhookId, body: &'a [u8]) -> ForwardedEvent<'a> {
        ForwardedEvent {
            webhook_id: id,
            source: "save-game",
            event_id: "évt 1%",
            event_type: "inventory.updated",
            aggregate: "player_1/slot%2Fa",
            sequence: 7,
            body,
            content_type: "application/json",
        }
    }

    #[test]
    fn the_webhook_id_is_stable_per_event_and_distinct_across_events() {
        let id = WebhookId::of("stripe", "evt_1");
        assert_eq!(id, WebhookId::of("stripe", "evt_1"));
        assert_eq!(id.as_str().len(), "msg_".len() + 24);
        assert!(id.as_str().starts_with("msg_"));
        assert!(id.as_str()[4..]
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
        assert_ne!(id, WebhookId::of("stripe", "evt_2"));
        assert_ne!(id, WebhookId::of("github", "evt_1"));
        assert_ne!(WebhookId::of("a", "b\nc"), WebhookId::of("a\nb", "c"));
        // Pinned: a change would resend every stored delivery under a new id.
        assert_eq!(id.as_str(), "msg_fdqDYR-c4N8F5TigUUA9vb1G");
        assert_eq!(id, WebhookId::from_stored(id.to_string()));
    }

    #[test]
    fn a_forwarded_request_verifies_with_the_standard_webhooks_verifier() {
        let id = WebhookId::of("save-game", "évt 1%");
        let body = br#"{"event_type":"inventory.updated", "odd spacing" : 1}"#;
        let secret = Secret::new(SECRET);
        let now = 1_700_000_000;
        let headers = request_headers(&event(&id, body), Some(&secret), 3, now).unwrap();
        let map = header_map(&headers);
        assert_eq!(map["webhook-id"], id.as_str());
        assert_eq!(map["webhook-timestamp"], now.to_string().as_str());
        assert!(map["webhook-signature"]
            .to_str()
            .unwrap()
            .starts_with("v1,"));
        assert_eq!(map["content-type"], "application/json");
        assert_eq!(map["inhook-source"], "save-game");
        assert_eq!(map["inhook-event-id"], "%C3%A9vt%201%25");
        assert_eq!(map["inhook-event-type"], "inventory.updated");
        assert_eq!(map["inhook-aggregate"], "player_1/slot%2Fa");
        assert_eq!(map["inhook-sequence"], "7");
        assert_eq!(map["inhook-attempt"], "3");
        let verified = verify(
            Scheme::StandardWebhooks,
            &map,
            body,
            &[Secret::new("whsec_b3RoZXI="), secret.clone()],
            now + 10,
            300,
        )
        .unwrap();
        assert_eq!(verified.secret_index, 1);
        assert_eq!(verified.delivery_id.as_deref(), Some(id.as_str()));
        let mut tampered = body.to_vec();
        tampered.push(b' ');
        assert!(matches!(
            verify(
                Scheme::StandardWebhooks,
                &map,
                &tampered,
                &[secret],
                now,
                300
            ),
            Err(SignatureError::Mismatch { .. })
        ));
    }

    #[test]
    fn a_retry_days_later_signs_its_own_time_and_keeps_its_id() {
        let id = WebhookId::of("s", "e");
        let secret = Secret::new(SECRET);
        let first =
            header_map(&request_headers(&event(&id, b"{}"), Some(&secret), 1, 1_000).unwrap());
        let later_at = 1_000 + 3 * 24 * 3600;
        let later =
            header_map(&request_headers(&event(&id, b"{}"), Some(&secret), 9, later_at).unwrap());
        assert_eq!(first["webhook-id"], later["webhook-id"]);
        assert_ne!(first["webhook-signature"], later["webhook-signature"]);
        assert!(verify(
            Scheme::StandardWebhooks,
            &later,
            b"{}",
            &[secret],
            later_at,
            300
        )
        .is_ok());
        let untyped = ForwardedEvent {
            event_type: "",
            ..event(&id, b"{}")
        };
        let headers = request_headers(&untyped, Some(&Secret::new(SECRET)), 1, 1_000).unwrap();
        assert!(!headers.iter().any(|(name, _)| *name == "inhook-event-type"));
        // A form source's body goes with its own media type.
        let form = ForwardedEvent {
            content_type: "application/x-www-form-urlencoded",
            ..event(&id, b"a=1")
        };
        let headers = request_headers(&form, None, 1, 1_000).unwrap();
        assert_eq!(
            header_map(&headers)["content-type"],
            "application/x-www-form-urlencoded"
        );
    }

    #[test]
    fn a_key_that_cannot_sign_v1_is_an_error_never_an_unsigned_request() {
        let id = WebhookId::of("s", "e");
        let err =
            request_headers(&event(&id, b"{}"), Some(&Secret::new("whpk_!!")), 1, 1).unwrap_err();
        assert!(!err.to_string().contains("!!"), "{err}");
    }

    #[test]
    fn a_sink_without_a_secret_sends_the_id_and_metadata_unsigned() {
        let id = WebhookId::of("s", "e");
        let headers = request_headers(&event(&id, b"{}"), None, 2, 1_000).unwrap();
        let names: Vec<&str> = headers.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names,
            [
                "content-type",
                "webhook-id",
                "inhook-source",
                "inhook-event-id",
                "inhook-event-type",
                "inhook-aggregate",
                "inhook-sequence",
                "inhook-attempt"
            ]
        );
        assert_eq!(headers[1].1, id.as_str());
    }
}
