//! `inhook listen` (docs/forwarding.md): a local application for development that
//! verifies forwarded requests and prints one line each.

use anyhow::Context;
use axum::http::{HeaderMap, StatusCode};

use inhook::domain::clock;
use inhook::ingress::signature::{self, Scheme, Secret};

/// How far a forwarded request's `webhook-timestamp` may be from now, as the official
/// Standard Webhooks libraries allow.
const LISTEN_TOLERANCE_S: u64 = 300;

/// Arguments of `inhook listen`.
#[derive(Debug, clap::Args)]
pub struct ListenArgs {
    /// The port to listen on, on 127.0.0.1 (0: any free port, printed first).
    #[arg(long, default_value_t = 8081)]
    pub port: u16,
    /// The destination's `secret` (`whsec_…`) the requests are signed with.
    #[arg(long, env = "INHOOK_LISTEN_SECRET", hide_env_values = true)]
    pub secret: String,
    /// Print no line per request; on exit, print the counts and the busiest second.
    #[arg(long)]
    pub quiet: bool,
    /// Answer each request this many milliseconds after it arrived (a slow application).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
}

/// What `inhook listen` received, for its closing line.
#[derive(Debug, Default)]
struct Tally {
    /// Requests that verified.
    verified: u64,
    /// Requests that did not (answered 401).
    rejected: u64,
    /// The current second (unix) and the verified requests counted in it.
    second: (i64, u64),
    /// Most verified requests in one second so far.
    peak: u64,
}

impl Tally {
    /// Counts one request answered at `now_ms`.
    fn count(&mut self, verified: bool, now_ms: i64) {
        if !verified {
            self.rejected += 1;
            return;
        }
        self.verified += 1;
        let second = now_ms.div_euclid(1000);
        if self.second.0 != second {
            self.second = (second, 0);
        }
        self.second.1 += 1;
        self.peak = self.peak.max(self.second.1);
    }
}

/// Serves 127.0.0.1:`port` until interrupted: each request verified against `secret`
/// (401 when it does not verify) and printed as one line (unless `--quiet`), answered
/// after `--delay-ms`; on exit, one line of counts.
pub async fn listen(args: ListenArgs) -> anyhow::Result<()> {
    let secret = Secret::new(args.secret.as_str());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", args.port))
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{}", args.port))?;
    println!("listening on http://{}", listener.local_addr()?);
    let tally = std::sync::Arc::new(std::sync::Mutex::new(Tally::default()));
    let (quiet, delay) = (args.quiet, std::time::Duration::from_millis(args.delay_ms));
    let counted = std::sync::Arc::clone(&tally);
    let app = axum::Router::new().fallback(move |headers: HeaderMap, body: axum::body::Bytes| {
        let (secret, tally) = (secret.clone(), std::sync::Arc::clone(&counted));
        async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            received(&headers, &body, &secret, quiet, &tally)
        }
    });
    axum::serve(listener, app)
        .with_graceful_shutdown(inhook::runtime::app::shutdown_signal())
        .await?;
    let tally = tally.lock().expect("tally");
    println!(
        "received {} verified, {} rejected; busiest second {} req/s",
        tally.verified, tally.rejected, tally.peak
    );
    Ok(())
}

/// Verifies one forwarded request, counts it, and prints it (unless `quiet`): `aggregate
/// sequence type id`, the last thing before the answer, since scripts act on the line.
fn received(
    headers: &HeaderMap,
    body: &[u8],
    secret: &Secret,
    quiet: bool,
    tally: &std::sync::Mutex<Tally>,
) -> StatusCode {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-")
    };
    let now_s = clock::now_ms() / 1000;
    let verdict = signature::verify(
        Scheme::StandardWebhooks,
        headers,
        body,
        std::slice::from_ref(secret),
        now_s,
        LISTEN_TOLERANCE_S,
    );
    tally
        .lock()
        .expect("tally")
        .count(verdict.is_ok(), clock::now_ms());
    if let Err(err) = verdict {
        eprintln!(
            "rejected {}: {err}",
            header("inhook-event-id")
                .chars()
                .take(200)
                .collect::<String>()
        );
        return StatusCode::UNAUTHORIZED;
    }
    if quiet {
        return StatusCode::NO_CONTENT;
    }
    println!(
        "aggregate={} sequence={} type={} id={}",
        header("inhook-aggregate"),
        header("inhook-sequence"),
        header("inhook-event-type"),
        header("inhook-event-id")
    );
    StatusCode::NO_CONTENT
}
