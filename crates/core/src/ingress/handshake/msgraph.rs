//! Microsoft Graph's validation (handshake = "msgraph"): `POST ?validationToken=T`,
//! its token echoed as text when it is Graph's validation text.

use super::{echoable, query, text, Found, Parts, Refusal, GRAPH_VALIDATION_PREFIX};

/// What Graph's validation token is, as a refusal names it.
const GRAPH_SHAPE: &str = "Microsoft Graph's validation text: \"Validation: Testing client application reachability for subscription Request-Id: \" and a GUID";

pub(super) fn msgraph(parts: &Parts<'_>) -> Found {
    if parts.method != "POST" {
        return Ok(None);
    }
    let Some(token) = query(parts.path_and_query, "validationToken") else {
        // A notification: an ordinary delivery.
        return Ok(None);
    };
    let token = graph_validation(Some(token.as_slice()))?;
    Ok(Some(text(token)))
}

/// Whether `parts` is Microsoft Graph's validation request (`POST ?validationToken=`),
/// whatever its token: the HTTP layer verifies the source's token before answering it.
pub fn is_graph_validation(parts: &Parts<'_>) -> bool {
    parts.method == "POST" && query(parts.path_and_query, "validationToken").is_some()
}

/// Graph's validation token, echoed only when it is what Graph sends: its fixed text and
/// a GUID ([`GRAPH_VALIDATION_PREFIX`]), so that the echo reflects nothing of a caller's.
fn graph_validation(value: Option<&[u8]>) -> Result<&str, Refusal> {
    let what = "the query parameter validationToken";
    let text = echoable(value, what)?;
    let fits = text
        .strip_prefix(GRAPH_VALIDATION_PREFIX)
        .is_some_and(is_guid);
    if !fits {
        return Err(Refusal::NotShape {
            what,
            expected: GRAPH_SHAPE,
        });
    }
    Ok(text)
}

/// `8-4-4-4-12` hex digits, either case.
fn is_guid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, len)| g.len() == len && g.bytes().all(|b| b.is_ascii_hexdigit()))
}
