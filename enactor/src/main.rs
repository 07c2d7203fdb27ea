//! `dnsplan-enactor --config enactor.toml [--id ID] [--zone ZONE]`: applies the newest plan
//! through the authority's control API, and serves its metrics.

use anyhow::Context;
use clap::Parser;
use dnsplan_common::daemon;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_enactor::args::Args;
use dnsplan_enactor::{Enactor, EnactorConfig, Metrics, http};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    daemon::init(args.log.log_format);
    // Before any socket or file is opened: connections come out of this limit.
    dnsplan_common::open_files::raise_to_hard();
    // Before anything slow: a SIGTERM during start-up is then a clean stop, not a kill.
    let shutdown = daemon::shutdown_signal();
    let config = EnactorConfig::load(&args.config, args.id, args.zone)?;
    let store = RemoteStore::new(&config.store.url, config.store.token.clone()).context("setting up the store client")?;
    let mut registry = Registry::with_prefix("dnsplan");
    let metrics = Arc::new(Metrics::register(&mut registry, &config.id));

    {
        let listen = config.metrics.listen;
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen}"))?;
        daemon::announce(&format!("metrics  http://{}/metrics", listener.local_addr()?));
        // Served until the process ends, after the enactor's clean stop.
        let id = config.id.clone();
        tokio::spawn(async move { http::serve(listener, registry, &id, std::future::pending()).await });
    }
    daemon::announce(&format!("enactor  {} in zone {} against {}", config.id, config.zone, config.store.url));
    Enactor::new(store, config.settings(), metrics).run(shutdown).await;
    Ok(())
}
