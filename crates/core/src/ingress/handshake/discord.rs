//! Discord's interactions PING (handshake = "discord"): a signed body of type 1,
//! answered `{"type":1}`.

use super::{ContentType, Found, Reply};

pub(super) fn discord(body: &[u8]) -> Found {
    #[derive(serde::Deserialize)]
    struct Interaction {
        #[serde(rename = "type")]
        kind: Option<serde_json::Value>,
    }
    let Ok(interaction) = serde_json::from_slice::<Interaction>(body) else {
        return Ok(None);
    };
    // A PING is type 1, whatever else it carries (id, application_id, token, …).
    if interaction.kind.and_then(|k| k.as_u64()) != Some(1) {
        return Ok(None);
    }
    Ok(Some(Reply {
        content_type: ContentType::Json,
        body: br#"{"type":1}"#.to_vec(),
    }))
}
