//! A service with routes of its own and inhook's receiver nested under `/hooks`, over the
//! service's own SQLite file; a callback prints each applied event (docs/library.md).
//!
//! ```sh
//! cargo run --example embed
//! # in another shell: a signed ledger entry, answered by inhook inside the service
//! body='{"event_id":"e1","type":"entry.posted","account":"acct_1","seq":1}'
//! curl -s localhost:3000/hooks/webhooks/ledger -H 'content-type: application/json' \
//!   -H "X-Signature: $(printf %s "$body" | openssl dgst -sha256 -hmac ledger-secret | cut -d' ' -f2)" \
//!   -d "$body"
//! ```

use std::net::SocketAddr;

use axum::routing::get;
use axum::Router;
use inhook::{Applied, Inhook, Settings};

// docs-snippet: start (docs/library.md shows this part)
/// The receiver's sources and the in-process destination, as TOML (docs/configuration.md).
const CONFIG: &str = r#"
[[sources]]
name = "ledger"
kind = "json"
signature = "hmac-hex"
mode = "sync"
event_id = "/event_id"
aggregate = "/account"
sequence = "/seq"
ordering = "in-order"
event_type = "/type"

[[destinations]]
name = "app"
type = "in_process"
sources = ["ledger"]
"#;

/// Prints an applied event; an error would have it sent again after the backoff.
async fn on_entry(event: Applied) -> anyhow::Result<()> {
    let body = event.json()?;
    println!(
        "applied {} {} #{} (attempt {}): {body}",
        event.source, event.aggregate, event.sequence, event.attempt
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Settings::toml(CONFIG)
        .database("sqlite://embed-example.db")
        .secret("ledger", "ledger-secret")
        .load()?;
    let hooks = Inhook::builder(config)
        .on_applied("app", on_entry)
        .start()
        .await?;
    let app = Router::new()
        .route("/hello", get(|| async { "hello from the service" }))
        .nest("/hooks", hooks.router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("serving on http://{}", listener.local_addr()?);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await?;
    hooks.shutdown().await;
    Ok(())
}
// docs-snippet: end
