//! AWS SNS's subscription handshake (docs/contract.md, handshakes): a verified
//! `SubscriptionConfirmation` is confirmed by a GET of its `SubscribeURL`, an
//! `UnsubscribeConfirmation` answered; neither is stored. The only handshake that makes a
//! request, bounded as the certificate fetches are ([`aws_sns::confirm_subscription`]).

use crate::ingress::signature::aws_sns::{self, Message, MessageType, SnsConfig};

/// The handshake's name in `inhook_handshakes_total{kind}`.
pub const NAME: &str = "aws-sns";

/// What a verified SNS message that is no event became.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confirmation {
    /// A `SubscriptionConfirmation`, confirmed: 200.
    Confirmed {
        /// The message's topic (one of `sns_topic_arns`).
        topic: String,
    },
    /// A `SubscriptionConfirmation` whose confirmation failed: 502, SNS resends it.
    Failed {
        /// The message's topic.
        topic: String,
        /// Why, as fixed text (never the URL: it carries the subscription's token).
        why: &'static str,
    },
    /// An `UnsubscribeConfirmation`: answered 200, not stored.
    Unsubscribed {
        /// The message's topic.
        topic: String,
    },
    /// A topic outside `sns_topic_arns`: refused at verification already, never confirmed.
    ForbiddenTopic,
}

/// What the verified SNS message `body` is to the handshake: `None` for a notification
/// (an event), else what became of its confirmation.
pub async fn confirm(config: &SnsConfig, body: &[u8]) -> Option<Confirmation> {
    // Verified already: parsing again cannot fail, and costs less than carrying it.
    let message = Message::parse(body).ok()?;
    if !config.takes_topic(&message) {
        return Some(Confirmation::ForbiddenTopic);
    }
    let topic = message.topic_arn;
    match message.kind {
        MessageType::Notification => None,
        MessageType::UnsubscribeConfirmation => Some(Confirmation::Unsubscribed { topic }),
        MessageType::SubscriptionConfirmation => {
            // Checked at verification already; a confirmation is never taken for an event.
            let url = message
                .subscribe_url
                .as_deref()
                .and_then(|raw| config.subscribe_url(raw).ok());
            let confirmed = match url {
                Some(url) => aws_sns::confirm_subscription(url).await,
                None => Err("SubscribeURL is not allowed"),
            };
            Some(match confirmed {
                Ok(()) => Confirmation::Confirmed { topic },
                Err(why) => Confirmation::Failed { topic, why },
            })
        }
    }
}
