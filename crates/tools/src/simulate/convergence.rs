//! Checking convergence: reading every aggregate back through the read API
//! until it shows the expected state, and reporting those that never do.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::expected::Expected;
use super::publisher::Publisher;
use super::stream::AggregateRef;
use inhook::forward::outbound::describe_error;

/// The most of an aggregate's state read back (a server answering more is misbehaving).
const STATE_BODY_BYTES: usize = 4 << 20;

/// An aggregate whose state read back differs from the expected one.
#[derive(Debug, Clone)]
pub struct Mismatch {
    /// The aggregate.
    pub aggregate: AggregateRef,
    /// The expected state, in the API's shape (null: no state expected).
    pub expected: Value,
    /// What the API answered last.
    pub got: String,
}

impl Publisher {
    /// Reads every aggregate until all equal their expected state or `timeout`
    /// passes; returns those that still differ. Fails at once if the API refuses the token.
    pub async fn converge(
        &self,
        expected: Arc<Vec<(AggregateRef, Option<Expected>)>>,
        timeout: Duration,
    ) -> anyhow::Result<Vec<Mismatch>> {
        let deadline = Instant::now() + timeout;
        let mut pending: Vec<usize> = (0..expected.len()).collect();
        let limit = Arc::new(tokio::sync::Semaphore::new(self.options.concurrency.max(1)));
        loop {
            let mut reads = tokio::task::JoinSet::new();
            for &i in &pending {
                let (me, expected, limit) = (self.clone(), expected.clone(), limit.clone());
                reads.spawn(async move {
                    let _permit = limit.acquire_owned().await;
                    (i, me.read(&expected[i].0).await)
                });
            }
            let mut still = Vec::new();
            while let Some(joined) = reads.join_next().await {
                let (i, seen) = joined.context("a read task failed")?;
                let want = &expected[i].1;
                let ok = match (&seen, want) {
                    (Read::Found(body), Some(want)) => want.matches(body),
                    (Read::NotFound, None) => true,
                    (Read::Refused(code), _) => bail!(
                        "the read API answered {code}: pass --admin-token or set INHOOK_ADMIN_TOKEN"
                    ),
                    _ => false,
                };
                if !ok {
                    still.push((i, seen));
                }
            }
            if still.is_empty() {
                return Ok(Vec::new());
            }
            if Instant::now() >= deadline {
                let mut mismatches: Vec<Mismatch> = still
                    .into_iter()
                    .map(|(i, seen)| Mismatch {
                        aggregate: expected[i].0.clone(),
                        expected: expected[i]
                            .1
                            .as_ref()
                            .map_or(Value::Null, Expected::to_json),
                        got: seen.to_string(),
                    })
                    .collect();
                mismatches.sort_by_key(|m| m.aggregate.to_string());
                return Ok(mismatches);
            }
            pending = still.into_iter().map(|(i, _)| i).collect();
            pending.sort_unstable();
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn read(&self, aggregate: &AggregateRef) -> Read {
        let url = format!("{}{}", self.endpoint.next_url(), aggregate.read_path());
        let mut request = self.client.get(url);
        if let Some(token) = &self.admin_token {
            request = request.bearer_auth(String::from_utf8_lossy(token.expose()));
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => return Read::Failed(describe_error(&err)),
        };
        let code = response.status().as_u16();
        let text = match inhook::forward::outbound::read_capped(response, STATE_BODY_BYTES).await {
            Ok((body, false)) => String::from_utf8_lossy(&body).into_owned(),
            Ok((body, true)) => {
                return Read::Failed(inhook::forward::outbound::printable(&body, true))
            }
            Err(err) => return Read::Failed(describe_error(&err)),
        };
        match code {
            200 => serde_json::from_str(&text)
                .map(Read::Found)
                .unwrap_or_else(|_| {
                    Read::Failed(format!(
                        "200 with a body that is not JSON: {}",
                        inhook::forward::outbound::printable(text.as_bytes(), false)
                    ))
                }),
            404 => Read::NotFound,
            401 | 403 => Read::Refused(code),
            _ => Read::Failed(format!(
                "{code} {}",
                inhook::forward::outbound::printable(text.as_bytes(), false)
            )),
        }
    }
}

/// What one read of an aggregate's state came back with.
enum Read {
    Found(Value),
    NotFound,
    Refused(u16),
    Failed(String),
}

impl fmt::Display for Read {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Read::Found(body) => write!(f, "{body}"),
            Read::NotFound => f.write_str("404"),
            Read::Refused(code) => write!(f, "{code}"),
            Read::Failed(why) => f.write_str(why),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_mismatch_shows_what_the_api_answered() {
        let shown = |read: Read| read.to_string();
        assert_eq!(
            shown(Read::Found(json!({"sequence": 2}))),
            r#"{"sequence":2}"#
        );
        assert_eq!(shown(Read::NotFound), "404");
        assert_eq!(shown(Read::Refused(401)), "401");
        assert_eq!(shown(Read::Failed("503 busy".into())), "503 busy");
    }
}
