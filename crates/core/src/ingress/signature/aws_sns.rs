//! AWS SNS over HTTPS (docs/configuration.md, `signature = "aws-sns"`): the body is an SNS
//! JSON message signed with the private key of the X.509 certificate its `SigningCertURL`
//! names. Pure: the message is parsed, its string to sign built and its signature checked
//! against a certificate's key here; fetching the certificate (and confirming a
//! subscription) is the server's (`http::sns`), which asks [`SnsConfig::takes_topic`],
//! [`SnsConfig::cert_url`] and [`SnsConfig::subscribe_url`] first.
//!
//! AWS signs every topic's messages, whoever owns the topic: a valid signature proves
//! "some AWS customer's topic", not "ours". A source therefore names its topics
//! (`sns_topic_arns`, required) and takes no other.
//!
//! The format is AWS's "Verifying the signatures of Amazon SNS messages": the named fields,
//! in a fixed order, each written `Name\nvalue\n`; `SignatureVersion` 1 is RSA PKCS#1 v1.5
//! over SHA-1, 2 over SHA-256.

use ring::signature::{
    UnparsedPublicKey, VerificationAlgorithm, RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
    RSA_PKCS1_2048_8192_SHA256,
};
use serde::Deserialize;

use super::{SignatureError, Verified};

/// The hosts a certificate or subscription URL may name by default: AWS's SNS endpoints,
/// China's (`sns.cn-north-1.amazonaws.com.cn`) included, as AWS's own validators take them.
pub const DEFAULT_CERT_HOSTS: [&str; 2] = ["sns.*.amazonaws.com", "sns.*.amazonaws.com.cn"];

/// The path of every certificate AWS signs SNS messages with:
/// `/SimpleNotificationService-` and 32 lower-case hex digits, then `.pem`.
const CERT_PATH_PREFIX: &str = "/SimpleNotificationService-";
const CERT_PATH_SUFFIX: &str = ".pem";
const CERT_PATH_HEX_DIGITS: usize = 32;

/// Most bytes of a signature decoded: an RSA-8192 signature is 1024 bytes.
const MAX_SIGNATURE_BYTES: usize = 1024;

/// The kinds of SNS message (the `Type` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageType {
    /// A published message: an ordinary event.
    Notification,
    /// Sent once when the subscription is made: confirmed by a GET of its `SubscribeURL`.
    SubscriptionConfirmation,
    /// Sent when the subscription is deleted: answered, never stored.
    UnsubscribeConfirmation,
}

impl MessageType {
    /// The `Type` as SNS writes it.
    pub fn name(self) -> &'static str {
        match self {
            MessageType::Notification => "Notification",
            MessageType::SubscriptionConfirmation => "SubscriptionConfirmation",
            MessageType::UnsubscribeConfirmation => "UnsubscribeConfirmation",
        }
    }

    fn parse(raw: &str) -> Option<Self> {
        [
            MessageType::Notification,
            MessageType::SubscriptionConfirmation,
            MessageType::UnsubscribeConfirmation,
        ]
        .into_iter()
        .find(|t| t.name() == raw)
    }
}

/// The hash of a `SignatureVersion`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignatureVersion {
    /// `"1"`: RSA PKCS#1 v1.5 with SHA-1.
    Sha1,
    /// `"2"`: RSA PKCS#1 v1.5 with SHA-256.
    Sha256,
}

impl SignatureVersion {
    fn algorithm(self) -> &'static dyn VerificationAlgorithm {
        match self {
            SignatureVersion::Sha1 => &RSA_PKCS1_2048_8192_SHA1_FOR_LEGACY_USE_ONLY,
            SignatureVersion::Sha256 => &RSA_PKCS1_2048_8192_SHA256,
        }
    }
}

/// The fields of an SNS message, as sent (unknown ones ignored).
#[derive(Debug, Deserialize)]
struct RawMessage {
    #[serde(rename = "Type")]
    kind: Option<String>,
    #[serde(rename = "MessageId")]
    message_id: Option<String>,
    #[serde(rename = "Token")]
    token: Option<String>,
    #[serde(rename = "TopicArn")]
    topic_arn: Option<String>,
    #[serde(rename = "Subject")]
    subject: Option<String>,
    #[serde(rename = "Message")]
    message: Option<String>,
    #[serde(rename = "Timestamp")]
    timestamp: Option<String>,
    #[serde(rename = "SignatureVersion")]
    signature_version: Option<String>,
    #[serde(rename = "Signature")]
    signature: Option<String>,
    #[serde(rename = "SigningCertURL")]
    signing_cert_url: Option<String>,
    #[serde(rename = "SubscribeURL")]
    subscribe_url: Option<String>,
}

/// An SNS message whose signed fields are all present and well formed (not yet verified).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `Type`.
    pub kind: MessageType,
    /// `MessageId`: the event id of a notification.
    pub message_id: String,
    /// `TopicArn`.
    pub topic_arn: String,
    /// `Timestamp` as sent (RFC 3339), signed.
    pub timestamp: String,
    /// `Timestamp` in unix seconds.
    pub signed_at: i64,
    /// `SignatureVersion`.
    pub version: SignatureVersion,
    /// `SigningCertURL`, as sent: checked by [`SnsConfig::cert_url`] before any fetch.
    pub signing_cert_url: String,
    /// `SubscribeURL` of a confirmation.
    pub subscribe_url: Option<String>,
    /// The string to sign, built once.
    string_to_sign: Vec<u8>,
    /// `Signature`, decoded.
    signature: Vec<u8>,
}

/// A refusal of the message's shape, with no value of it in the explanation.
fn rejected(what: &'static str, why: &'static str) -> SignatureError {
    SignatureError::Rejected { what, why }
}

impl Message {
    /// Parses a raw body as an SNS message and builds its string to sign. A body that is no
    /// SNS message, or lacks a signed field, is refused naming the field (never its value).
    pub fn parse(body: &[u8]) -> Result<Self, SignatureError> {
        let raw: RawMessage = serde_json::from_slice(body).map_err(|_| {
            rejected(
                "the body",
                "is not an SNS message (a JSON object of strings with Type, MessageId, Timestamp, Signature)",
            )
        })?;
        let absent = |what: &'static str| SignatureError::Absent { what };
        let kind_raw = raw.kind.as_deref().ok_or(absent("the SNS field Type"))?;
        let kind = MessageType::parse(kind_raw).ok_or(rejected(
            "the SNS field Type",
            "is none of Notification, SubscriptionConfirmation, UnsubscribeConfirmation",
        ))?;
        let version = match raw.signature_version.as_deref() {
            Some("1") => SignatureVersion::Sha1,
            Some("2") => SignatureVersion::Sha256,
            Some(_) => {
                return Err(rejected(
                    "the SNS field SignatureVersion",
                    "is neither \"1\" nor \"2\"",
                ))
            }
            None => return Err(absent("the SNS field SignatureVersion")),
        };
        let signature_b64 = raw
            .signature
            .as_deref()
            .ok_or(absent("the SNS field Signature"))?;
        if signature_b64.len() > MAX_SIGNATURE_BYTES.div_ceil(3) * 4 {
            return Err(rejected("the SNS field Signature", "is too long"));
        }
        let signature = {
            use base64::Engine;
            super::BASE64
                .decode(signature_b64)
                .map_err(|_| rejected("the SNS field Signature", "is not base64"))?
        };
        let signing_cert_url = raw
            .signing_cert_url
            .ok_or(absent("the SNS field SigningCertURL"))?;
        let message_id = raw.message_id.ok_or(absent("the SNS field MessageId"))?;
        let topic_arn = raw.topic_arn.ok_or(absent("the SNS field TopicArn"))?;
        let timestamp = raw.timestamp.ok_or(absent("the SNS field Timestamp"))?;
        let signed_at =
            time::OffsetDateTime::parse(&timestamp, &time::format_description::well_known::Rfc3339)
                .map_err(|_| rejected("the SNS field Timestamp", "is not an RFC 3339 time"))?
                .unix_timestamp();
        let text = raw.message.ok_or(absent("the SNS field Message"))?;
        // AWS's order: every field in alphabetical order, Subject only when sent, and the
        // confirmations' SubscribeURL and Token in place of Subject.
        let mut fields: Vec<(&str, &str)> = vec![("Message", &text), ("MessageId", &message_id)];
        match kind {
            MessageType::Notification => {
                if let Some(subject) = raw.subject.as_deref() {
                    fields.push(("Subject", subject));
                }
                fields.push(("Timestamp", &timestamp));
            }
            MessageType::SubscriptionConfirmation | MessageType::UnsubscribeConfirmation => {
                let subscribe = raw
                    .subscribe_url
                    .as_deref()
                    .ok_or(absent("the SNS field SubscribeURL"))?;
                let token = raw.token.as_deref().ok_or(absent("the SNS field Token"))?;
                fields.push(("SubscribeURL", subscribe));
                fields.push(("Timestamp", &timestamp));
                fields.push(("Token", token));
            }
        }
        fields.push(("TopicArn", &topic_arn));
        fields.push(("Type", kind.name()));
        let string_to_sign = string_to_sign(&fields);
        Ok(Self {
            kind,
            message_id,
            topic_arn,
            timestamp,
            signed_at,
            version,
            signing_cert_url,
            subscribe_url: raw.subscribe_url,
            string_to_sign,
            signature,
        })
    }

    /// The bytes the publisher signed.
    pub fn string_to_sign(&self) -> &[u8] {
        &self.string_to_sign
    }

    /// Checks the signature with the certificate's key: the message's id and signed time
    /// are then proven (the time is judged by the caller, against the tolerance window).
    pub fn verify(&self, key: &CertKey, received_at: i64) -> Result<Verified, SignatureError> {
        if !key.is_valid_at(received_at) {
            return Err(rejected(
                "the SigningCertURL certificate",
                "is outside its validity period",
            ));
        }
        UnparsedPublicKey::new(self.version.algorithm(), &key.rsa_public_key)
            .verify(&self.string_to_sign, &self.signature)
            .map_err(|_| SignatureError::Mismatch {
                header: "Signature",
                signatures: 1,
                tried: 1,
                configured: 1,
            })?;
        Ok(Verified {
            secret_index: 0,
            signed_at: Some(self.signed_at),
            delivery_id: Some(self.message_id.clone()),
            signed_content: None,
        })
    }
}

/// AWS's string to sign: `Name\nvalue\n` for each field, in the order given.
pub fn string_to_sign(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, value) in fields {
        for part in [name, "\n", value, "\n"] {
            out.extend_from_slice(part.as_bytes());
        }
    }
    out
}

/// The RSA public key of a signing certificate, and when the certificate is valid.
#[derive(Clone, PartialEq, Eq)]
pub struct CertKey {
    /// PKCS#1 `RSAPublicKey` DER, as ring reads it.
    rsa_public_key: Vec<u8>,
    not_before: i64,
    not_after: i64,
}

impl std::fmt::Debug for CertKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKey")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertKey {
    /// Reads the first certificate of a PEM file (what `SigningCertURL` serves); its key must
    /// be RSA. The explanation never quotes the file.
    pub fn from_pem(pem: &[u8]) -> Result<Self, &'static str> {
        use rustls::pki_types::pem::PemObject;
        let der = rustls::pki_types::CertificateDer::pem_slice_iter(pem)
            .next()
            .ok_or("holds no PEM certificate")?
            .map_err(|_| "holds no PEM certificate")?;
        Self::from_der(&der)
    }

    /// Reads one DER certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, &'static str> {
        let (_, cert) =
            x509_parser::parse_x509_certificate(der).map_err(|_| "is not an X.509 certificate")?;
        let spki = cert.public_key();
        if spki.algorithm.algorithm != x509_parser::oid_registry::OID_PKCS1_RSAENCRYPTION {
            return Err("holds no RSA key");
        }
        let validity = cert.validity();
        Ok(Self {
            rsa_public_key: spki.subject_public_key.data.to_vec(),
            not_before: validity.not_before.timestamp(),
            not_after: validity.not_after.timestamp(),
        })
    }

    /// Whether the certificate is valid at `at` (unix seconds).
    pub fn is_valid_at(&self, at: i64) -> bool {
        (self.not_before..=self.not_after).contains(&at)
    }
}

/// One entry of `sns_cert_hosts`: a host name, where a `*` label stands for exactly one label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(Vec<String>);

impl HostPattern {
    /// Parses `sns.*.amazonaws.com`, `localhost`, `127.0.0.1`: labels of letters, digits, `-`,
    /// or a whole `*`.
    pub fn parse(raw: &str) -> Result<Self, String> {
        let labels: Vec<String> = raw.split('.').map(str::to_ascii_lowercase).collect();
        let fine = |label: &String| {
            label == "*"
                || (!label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-'))
        };
        if raw.is_empty() || !labels.iter().all(fine) {
            return Err(format!(
                "{raw:?} is not a host name (labels of letters, digits or '-', or a whole '*' for one label)"
            ));
        }
        Ok(Self(labels))
    }

    /// Whether `host` (a URL's host, any case) matches.
    pub fn matches(&self, host: &str) -> bool {
        let labels: Vec<&str> = host.split('.').collect();
        labels.len() == self.0.len()
            && self.0.iter().zip(labels).all(|(want, got)| {
                if want == "*" {
                    !got.is_empty()
                } else {
                    want.eq_ignore_ascii_case(got)
                }
            })
    }
}

/// A source's `aws-sns` settings: the hosts certificates and subscription URLs may come
/// from, and the topics it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnsConfig {
    /// `sns_cert_hosts`.
    pub cert_hosts: Vec<HostPattern>,
    /// `sns_topic_arns`: the only topics this source takes, matched exactly; never empty.
    pub topic_arns: Vec<String>,
}

impl SnsConfig {
    /// Parses `sns_cert_hosts` (default [`DEFAULT_CERT_HOSTS`]) and `sns_topic_arns`
    /// (required: the caller says where it looked when there is none); the error names the
    /// key.
    pub fn parse(
        hosts: Option<&[String]>,
        topic_arns: &[String],
    ) -> Result<Self, super::configurable::KeyError> {
        let hosts: Vec<String> = match hosts {
            Some(hosts) => hosts.to_vec(),
            None => DEFAULT_CERT_HOSTS.map(str::to_owned).to_vec(),
        };
        let problem =
            |key: &'static str, problem: String| super::configurable::KeyError { key, problem };
        if hosts.is_empty() {
            return Err(problem(
                "sns_cert_hosts",
                "is empty, so no certificate could be fetched".into(),
            ));
        }
        let cert_hosts = hosts
            .iter()
            .map(|h| HostPattern::parse(h))
            .collect::<Result<_, _>>()
            .map_err(|e| problem("sns_cert_hosts", e))?;
        if topic_arns.is_empty() {
            return Err(problem(
                "sns_topic_arns",
                "is empty, so no topic could deliver: list the topics this source takes".into(),
            ));
        }
        for arn in topic_arns {
            check_topic_arn(arn).map_err(|e| problem("sns_topic_arns", e))?;
        }
        Ok(Self {
            cert_hosts,
            topic_arns: topic_arns.to_vec(),
        })
    }

    /// Whether this source takes the message's topic: one of `sns_topic_arns`, exactly.
    pub fn takes_topic(&self, message: &Message) -> bool {
        self.topic_arns.contains(&message.topic_arn)
    }

    /// Checks a `SigningCertURL` before inhook fetches it: https on a host of
    /// `sns_cert_hosts` ([`Self::subscribe_url`]), and AWS's certificate path,
    /// `/SimpleNotificationService-<32 hex digits>.pem`, with no query nor fragment: no
    /// other URL of those hosts (an SNS API action among them) is ever fetched for a
    /// certificate. The reason never quotes the URL.
    pub fn cert_url(&self, raw: &str) -> Result<reqwest::Url, SignatureError> {
        const FIELD: &str = "SigningCertURL";
        let url = self.allowed_url(FIELD, raw)?;
        if !is_cert_path(url.path()) || url.query().is_some() || url.fragment().is_some() {
            return Err(rejected(
                FIELD,
                "is not an SNS certificate URL (path /SimpleNotificationService-<32 hex digits>.pem, no query)",
            ));
        }
        Ok(url)
    }

    /// Checks a `SubscribeURL` before inhook GETs it to confirm a subscription: https, no
    /// credentials, a host of `sns_cert_hosts`. The reason never quotes the URL.
    pub fn subscribe_url(&self, raw: &str) -> Result<reqwest::Url, SignatureError> {
        self.allowed_url("SubscribeURL", raw)
    }

    fn allowed_url(&self, field: &'static str, raw: &str) -> Result<reqwest::Url, SignatureError> {
        let url = reqwest::Url::parse(raw).map_err(|_| rejected(field, "is not a URL"))?;
        if url.scheme() != "https" {
            return Err(rejected(field, "is not https"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(rejected(field, "carries credentials"));
        }
        let host = url.host_str().unwrap_or_default();
        if !self.cert_hosts.iter().any(|p| p.matches(host)) {
            return Err(rejected(field, "names a host outside sns_cert_hosts"));
        }
        Ok(url)
    }
}

/// Whether `path` is AWS's certificate path: `/SimpleNotificationService-`, 32 lower-case
/// hex digits, `.pem`.
fn is_cert_path(path: &str) -> bool {
    path.strip_prefix(CERT_PATH_PREFIX)
        .and_then(|rest| rest.strip_suffix(CERT_PATH_SUFFIX))
        .is_some_and(|hex| {
            hex.len() == CERT_PATH_HEX_DIGITS
                && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
}

/// Checks one entry of `sns_topic_arns`: `arn:<partition>:sns:<region>:<12-digit
/// account>:<topic name>`, matched exactly. A `*` is refused: in the account it would take
/// any AWS customer's topic of that name, the very thing the list is there to stop.
fn check_topic_arn(raw: &str) -> Result<(), String> {
    if raw.contains('*') {
        return Err(format!(
            "{raw:?}: topics are matched exactly, '*' is no wildcard: list each topic (a wildcard account would take any AWS customer's topic of that name)"
        ));
    }
    let bad = |why: &str| {
        Err(format!(
            "{raw:?} is not an SNS topic ARN ({why}; e.g. \"arn:aws:sns:us-east-1:123456789012:orders\")"
        ))
    };
    let parts: Vec<&str> = raw.split(':').collect();
    let [arn, partition, service, region, account, name] = parts[..] else {
        return bad("six parts separated by ':'");
    };
    let word = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    };
    if arn != "arn" || !(partition == "aws" || partition.starts_with("aws-")) || !word(partition) {
        return bad("it starts arn:aws:, or arn:aws-cn:, arn:aws-us-gov:");
    }
    if service != "sns" {
        return bad("the service is sns");
    }
    if !word(region) {
        return bad("the region is a name such as us-east-1");
    }
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return bad("the account is 12 digits");
    }
    let base = name.strip_suffix(".fifo").unwrap_or(name);
    if base.is_empty()
        || name.len() > 256
        || !base
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return bad("the topic name is 1 to 256 letters, digits, '-' or '_', a FIFO topic's ending in .fifo");
    }
    Ok(())
}

/// The test key's signer, shared with tests/integration/aws_sns.rs.
#[cfg(test)]
#[path = "../../../../../tests/fixtures/aws_sns/rsa_sign.rs"]
mod fixture_signer;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const CERT: &[u8] = include_bytes!("../../../../../tests/fixtures/aws_sns/cert.pem");
    const NOW: i64 = 1_800_000_000;
    const CERT_URL: &str = "https://sns.us-east-1.amazonaws.com/SimpleNotificationService-f3ecfb7224c7233fe7bb5f59f96de52f.pem";
    const TOPIC: &str = "arn:aws:sns:us-west-2:123456789012:MyTopic";

    /// A config taking [`TOPIC`], with `hosts` (the default when `None`).
    fn sns_config(hosts: Option<&[String]>) -> SnsConfig {
        SnsConfig::parse(hosts, &[TOPIC.to_owned()]).unwrap()
    }

    /// Signs `fields` (without Signature) as SNS would, with the fixture's key.
    fn signed(mut message: serde_json::Value, version: &str) -> Vec<u8> {
        message["SignatureVersion"] = version.into();
        message["SigningCertURL"] = CERT_URL.into();
        let get = |name: &str| message.get(name).and_then(|v| v.as_str());
        let kind = get("Type").unwrap();
        let names: &[&str] = if kind == "Notification" {
            &[
                "Message",
                "MessageId",
                "Subject",
                "Timestamp",
                "TopicArn",
                "Type",
            ]
        } else {
            &[
                "Message",
                "MessageId",
                "SubscribeURL",
                "Timestamp",
                "Token",
                "TopicArn",
                "Type",
            ]
        };
        let fields: Vec<(&str, &str)> = names
            .iter()
            .filter_map(|n| get(n).map(|v| (*n, v)))
            .collect();
        let sig = rsa_sign(&string_to_sign(&fields), version);
        message["Signature"] = super::super::base64_encode(&sig).into();
        serde_json::to_vec(&message).unwrap()
    }

    use super::fixture_signer::rsa_sign;

    fn notification() -> serde_json::Value {
        serde_json::json!({
            "Type": "Notification",
            "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
            "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
            "Subject": "My First Message",
            "Message": "{\"order\":\"ord_1\",\"status\":\"paid\"}",
            "Timestamp": "2027-01-15T08:00:00.000Z",
            "UnsubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=Unsubscribe"
        })
    }

    fn confirmation() -> serde_json::Value {
        serde_json::json!({
            "Type": "SubscriptionConfirmation",
            "MessageId": "165545c9-2a5c-472c-8df2-7ff2be2b3b1b",
            "Token": "2336412f37fb687f5d51e6e241d09c805a5a57b30d712f794cc5f6a988666d92768dd60a747ba6f3beb71854e285d6ad02428b09ceece29417f1f02d609c582afbacc99c583a916b9981dd2728f4ae6fdb82efd087cc3b7849e05798d2d2785c03b0879594eeac82c01f235d0e717736",
            "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
            "Message": "You have chosen to subscribe to the topic arn:aws:sns:us-west-2:123456789012:MyTopic.\nTo confirm the subscription, visit the SubscribeURL included in this message.",
            "SubscribeURL": "https://sns.us-west-2.amazonaws.com/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-west-2:123456789012:MyTopic&Token=2336412f37",
            "Timestamp": "2027-01-15T08:00:00.000Z"
        })
    }

    fn key() -> CertKey {
        CertKey::from_pem(CERT).unwrap()
    }

    #[test]
    fn both_signature_versions_verify_and_prove_the_id_and_time() {
        for version in ["1", "2"] {
            for body in [
                signed(notification(), version),
                signed(confirmation(), version),
            ] {
                let message = Message::parse(&body).unwrap();
                let verified = message.verify(&key(), NOW).unwrap();
                // The fixtures' Timestamp is NOW.
                assert_eq!(verified.signed_at, Some(NOW));
                assert_eq!(
                    verified.delivery_id.as_deref(),
                    Some(message.message_id.as_str())
                );
            }
        }
    }

    #[test]
    fn the_string_to_sign_follows_aws_order_and_subject_is_optional() {
        let message = Message::parse(&signed(notification(), "1")).unwrap();
        let text = String::from_utf8(message.string_to_sign().to_vec()).unwrap();
        assert!(text.starts_with("Message\n{\"order\""), "{text}");
        assert!(text.contains("\nMessageId\n22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324\nSubject\nMy First Message\nTimestamp\n2027-01-15T08:00:00.000Z\nTopicArn\narn:aws:sns:us-west-2:123456789012:MyTopic\nType\nNotification\n"), "{text}");
        let mut without = notification();
        without.as_object_mut().unwrap().remove("Subject");
        let message = Message::parse(&signed(without, "2")).unwrap();
        let text = String::from_utf8(message.string_to_sign().to_vec()).unwrap();
        assert!(!text.contains("Subject"), "{text}");
        assert!(message.verify(&key(), NOW).is_ok());
        let confirm = Message::parse(&signed(confirmation(), "1")).unwrap();
        let text = String::from_utf8(confirm.string_to_sign().to_vec()).unwrap();
        // The Message itself holds a newline: find each name where a field starts.
        let at = |name: &str| text.find(&format!("\n{name}\n")).unwrap();
        let names = [
            "MessageId",
            "SubscribeURL",
            "Timestamp",
            "Token",
            "TopicArn",
            "Type",
        ];
        assert!(text.starts_with("Message\n"), "{text}");
        assert!(names.windows(2).all(|w| at(w[0]) < at(w[1])), "{text}");
        assert_eq!(confirm.kind, MessageType::SubscriptionConfirmation);
    }

    #[test]
    fn tampering_and_a_swapped_version_are_mismatches() {
        let body = signed(notification(), "2");
        let mut value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        value["Message"] = "{\"order\":\"ord_1\",\"status\":\"refunded\"}".into();
        let tampered = Message::parse(&serde_json::to_vec(&value).unwrap()).unwrap();
        let err = tampered.verify(&key(), NOW).unwrap_err();
        assert_eq!(err.code(), "invalid_signature");
        let mut value: serde_json::Value = serde_json::from_slice(&body).unwrap();
        value["SignatureVersion"] = "1".into();
        let swapped = Message::parse(&serde_json::to_vec(&value).unwrap()).unwrap();
        assert_eq!(
            swapped.verify(&key(), NOW).unwrap_err().code(),
            "invalid_signature"
        );
    }

    #[test]
    fn missing_and_malformed_fields_are_named_never_quoted() {
        for field in [
            "Type",
            "Signature",
            "SignatureVersion",
            "SigningCertURL",
            "MessageId",
            "Timestamp",
            "TopicArn",
            "Message",
        ] {
            let body = signed(notification(), "1");
            let mut value: serde_json::Value = serde_json::from_slice(&body).unwrap();
            value.as_object_mut().unwrap().remove(field);
            let err = Message::parse(&serde_json::to_vec(&value).unwrap()).unwrap_err();
            assert_eq!(err.code(), "missing_signature", "{field}");
            assert!(err.to_string().contains(field), "{err}");
        }
        for (field, bad) in [
            ("Type", "Weird"),
            ("SignatureVersion", "3"),
            ("Timestamp", "yesterday"),
            ("Signature", "not base64!"),
        ] {
            let mut value: serde_json::Value =
                serde_json::from_slice(&signed(notification(), "1")).unwrap();
            value[field] = bad.into();
            let err = Message::parse(&serde_json::to_vec(&value).unwrap()).unwrap_err();
            assert_eq!(err.code(), "invalid_signature", "{field}");
            assert!(!err.to_string().contains(bad), "{err}");
        }
        assert_eq!(
            Message::parse(b"[1]").unwrap_err().code(),
            "invalid_signature"
        );
    }

    #[test]
    fn cert_hosts_match_one_label_per_star_and_urls_must_be_https() {
        let config = sns_config(None);
        let hex = "f3ecfb7224c7233fe7bb5f59f96de52f";
        let ok = |url: &str| config.cert_url(url).is_ok();
        assert!(ok(CERT_URL));
        assert!(ok(&format!(
            "https://SNS.eu-west-1.amazonaws.com/SimpleNotificationService-{hex}.pem"
        )));
        assert!(ok(&format!(
            "https://sns.cn-north-1.amazonaws.com.cn/SimpleNotificationService-{hex}.pem"
        )));
        for host in [
            "http://sns.us-east-1.amazonaws.com",
            "https://sns.a.b.amazonaws.com",
            "https://sns.amazonaws.com",
            "https://sns.us-east-1.amazonaws.com.evil.example",
            "https://evil.example/sns.us-east-1.amazonaws.com",
            "https://user:pw@sns.us-east-1.amazonaws.com",
            "https://sns.us-east-1.amazonaws.com.cn.evil.example",
        ] {
            let url = format!("{host}/SimpleNotificationService-{hex}.pem");
            assert!(!ok(&url), "{url}");
        }
        assert!(!ok("not a url"));
        let err = config
            .cert_url("https://evil.example/secret-path")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "SigningCertURL names a host outside sns_cert_hosts"
        );
        let local = sns_config(Some(&["127.0.0.1".into(), "localhost".into()]));
        assert!(local
            .subscribe_url("https://127.0.0.1:8443/confirm?x=1")
            .is_ok());
        for bad in ["", "a..b", "sns.*x.amazonaws.com", "https://x", "a/b"] {
            let err = SnsConfig::parse(Some(&[bad.into()]), &[TOPIC.into()]).unwrap_err();
            assert_eq!(err.key, "sns_cert_hosts");
        }
        assert_eq!(
            SnsConfig::parse(Some(&[]), &[TOPIC.into()])
                .unwrap_err()
                .key,
            "sns_cert_hosts"
        );
    }

    #[test]
    fn only_aws_certificate_paths_are_fetched() {
        let config = sns_config(None);
        let host = "https://sns.us-east-1.amazonaws.com";
        let hex = "f3ecfb7224c7233fe7bb5f59f96de52f";
        assert!(config
            .cert_url(&format!("{host}/SimpleNotificationService-{hex}.pem"))
            .is_ok());
        for path in [
            // An SNS API action on the same host: never fetched as a certificate.
            "/?Action=ConfirmSubscription&TopicArn=arn:aws:sns:us-east-1:1:t&Token=x&f=.pem"
                .to_owned(),
            format!("/SimpleNotificationService-{hex}.pem?Action=Subscribe"),
            format!("/SimpleNotificationService-{hex}.pem#x"),
            format!("/SimpleNotificationService-{}.pem", hex.to_uppercase()),
            format!("/SimpleNotificationService-{}.pem", &hex[1..]),
            format!("/SimpleNotificationService-{hex}0.pem"),
            format!("/SimpleNotificationService-{hex}.pem/x"),
            format!("/x/SimpleNotificationService-{hex}.pem"),
            format!("/SimpleNotificationService-{hex}.crt"),
            "/cert.pem".to_owned(),
        ] {
            let err = config.cert_url(&format!("{host}{path}")).unwrap_err();
            assert_eq!(err.code(), "invalid_signature", "{path}");
            assert!(
                err.to_string()
                    .starts_with("SigningCertURL is not an SNS certificate URL"),
                "{path}: {err}"
            );
        }
        // A SubscribeURL is an API action: its path is free.
        assert!(config
            .subscribe_url(&format!("{host}/?Action=ConfirmSubscription&Token=x"))
            .is_ok());
    }

    #[test]
    fn sns_topic_arns_are_required_exact_and_well_formed() {
        let message = Message::parse(&signed(notification(), "1")).unwrap();
        let only = |arn: &str| SnsConfig::parse(None, &[arn.into()]).unwrap();
        assert!(only(TOPIC).takes_topic(&message));
        for other in [
            "arn:aws:sns:us-west-2:123456789012:Other",
            "arn:aws:sns:us-west-2:123456789012:mytopic",
            "arn:aws:sns:us-west-2:210987654321:MyTopic",
            "arn:aws:sns:us-east-1:123456789012:MyTopic",
        ] {
            assert!(!only(other).takes_topic(&message), "{other}");
        }
        assert_eq!(
            SnsConfig::parse(None, &[]).unwrap_err().key,
            "sns_topic_arns"
        );
        for good in [
            "arn:aws:sns:us-east-1:123456789012:orders",
            "arn:aws-cn:sns:cn-north-1:123456789012:orders_v2",
            "arn:aws-us-gov:sns:us-gov-west-1:123456789012:Orders-1",
            "arn:aws:sns:eu-west-1:123456789012:orders.fifo",
        ] {
            assert!(SnsConfig::parse(None, &[good.into()]).is_ok(), "{good}");
        }
        for bad in [
            "",
            "orders",
            "arn:aws:sns:us-east-1:123456789012:*",
            "arn:aws:sns:us-east-1:*:orders",
            "arn:aws:sns:*:123456789012:orders",
            "arn:aws:sqs:us-east-1:123456789012:orders",
            "arn:aws:sns:us-east-1:12345678901:orders",
            "arn:aws:sns:us-east-1:123456789012:",
            "arn:aws:sns:us-east-1:123456789012:.fifo",
            "arn:aws:sns:us-east-1:123456789012:a b",
            "arn:aws:sns:us-east-1:123456789012:orders:extra",
            "arn:gcp:sns:us-east-1:123456789012:orders",
            " arn:aws:sns:us-east-1:123456789012:orders",
        ] {
            let err = SnsConfig::parse(None, &[TOPIC.into(), bad.into()]).unwrap_err();
            assert_eq!(err.key, "sns_topic_arns", "{bad}");
        }
        let err = SnsConfig::parse(None, &["arn:aws:sns:us-east-1:*:orders".into()]).unwrap_err();
        assert!(err.problem.contains("matched exactly"), "{}", err.problem);
    }

    #[test]
    fn certificates_must_be_rsa_and_valid() {
        assert!(key().is_valid_at(NOW));
        assert!(!key().is_valid_at(0));
        let message = Message::parse(&signed(notification(), "1")).unwrap();
        assert_eq!(
            message.verify(&key(), 0).unwrap_err().code(),
            "invalid_signature"
        );
        assert!(CertKey::from_pem(b"no pem here").is_err());
        let ec = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".to_owned()])
            .unwrap()
            .self_signed(&ec)
            .unwrap();
        assert_eq!(
            CertKey::from_pem(cert.pem().as_bytes()),
            Err("holds no RSA key")
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        /// Any body parses or is refused, never panics, and never verifies unsigned.
        #[test]
        fn arbitrary_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            if let Ok(message) = Message::parse(&body) {
                prop_assert!(message.verify(&key(), NOW).is_err());
            }
        }

        /// Any string in a signed field changes what is signed.
        #[test]
        fn any_changed_field_breaks_the_signature(text in "[ -~]{0,40}") {
            let body = signed(notification(), "2");
            let mut value: serde_json::Value = serde_json::from_slice(&body).unwrap();
            prop_assume!(value["Subject"] != text.as_str());
            value["Subject"] = text.into();
            let message = Message::parse(&serde_json::to_vec(&value).unwrap()).unwrap();
            prop_assert!(message.verify(&key(), NOW).is_err());
        }
    }
}
