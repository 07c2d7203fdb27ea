//! `dnsplan-enactor --config enactor.toml [--id ID] [--zone ZONE]`: applies the newest plan
//! through the authority's control API, and serves its metrics.

use anyhow::Context;
use axum::routing::get;
use clap::Parser;
use dnsplan_common::daemon;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_enactor::args::Args;
use dnsplan_enactor::{Enactor, EnactorConfig, Metrics};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    daemon::init(&args.log_format);
    // Before any socket or file is opened: connections come out of this limit.
    dnsplan_common::open_files::raise_to_hard();
    // Before anything slow: a SIGTERM during start-up is then a clean stop, not a kill.
    let shutdown = daemon::shutdown_signal();
    let config = EnactorConfig::load(&args.config, args.id, args.zone)?;
    let store = RemoteStore::new(&config.store.url, config.store.token.clone()).context("setting up the store client")?;
    let mut registry = Registry::with_prefix("dnsplan");
    let metrics = Arc::new(Metrics::register(&mut registry, &config.id));
    let registry = Arc::new(registry);

    {
        let listen = config.metrics.listen;
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen}"))?;
        daemon::announce(&format!("metrics  http://{}/metrics", listener.local_addr()?));
        let app = axum::Router::new().route("/metrics", get(move || render(registry.clone()))).route("/healthz", get(|| async { "ok\n" }));
        tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, app).await {
                tracing::error!(error = %err, "metrics server failed");
            }
        });
    }
    daemon::announce(&format!("enactor  {} in zone {} against {}", config.id, config.zone, config.store.url));
    Enactor::new(store, config.settings(), metrics).run(shutdown).await;
    Ok(())
}

async fn render(registry: Arc<Registry>) -> ([(axum::http::HeaderName, &'static str); 1], String) {
    ([(axum::http::header::CONTENT_TYPE, daemon::METRICS_CONTENT_TYPE)], daemon::metrics_text(&registry))
}
