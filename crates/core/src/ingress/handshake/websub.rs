//! WebSub's subscription check (handshake = "websub"):
//! `GET ?hub.mode=subscribe&hub.challenge=C` answered C.

use super::{query, query_echo, Found, Parts, Refusal};

pub(super) fn websub(parts: &Parts<'_>) -> Found {
    if parts.method != "GET" {
        return Ok(None);
    }
    let mode = query(parts.path_and_query, "hub.mode");
    if mode.as_deref() != Some(b"subscribe") {
        return Err(Refusal::Missing {
            what: "the query parameter hub.mode=subscribe",
        });
    }
    query_echo(parts, "hub.challenge", "the query parameter hub.challenge")
}
