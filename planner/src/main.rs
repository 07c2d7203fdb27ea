//! `dnsplan-planner --config planner.toml [--id ID]`: health-checks the targets and publishes
//! plans through the authority's control API; serves `/metrics`, `/healthz` and `/v1/status`.

use anyhow::Context;
use clap::Parser;
use dnsplan_common::daemon;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_planner::args::Args;
use dnsplan_planner::health::{HealthBook, spawn_checks};
use dnsplan_planner::http;
use dnsplan_planner::metrics::Metrics;
use dnsplan_planner::{Planner, PlannerConfig};
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    daemon::init(args.log.log_format);
    // Before any socket or file is opened: connections come out of this limit.
    dnsplan_common::open_files::raise_to_hard();
    let shutdown = daemon::shutdown_signal();
    let mut config = PlannerConfig::load(&args.config)?;
    if let Some(id) = args.id {
        anyhow::ensure!(!id.is_empty() && id.len() <= dnsplan_common::plan::AUTHOR_BYTES_MAX, "--id: give 1..=128 bytes");
        config.id = id;
    }
    let config = Arc::new(config);
    let store = RemoteStore::new(&config.store.url, config.store.token.clone()).context("setting up the store client")?;
    let mut registry = Registry::with_prefix("dnsplan");
    let metrics = Arc::new(Metrics::register(&mut registry, &config.id));
    let book = Arc::new(HealthBook::default());
    let _checks = spawn_checks(&config, book.clone(), metrics.clone());
    let planner = Planner::new(store, config.clone(), book, metrics);
    let status = planner.status();

    {
        let listen = config.metrics.listen;
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen}"))?;
        daemon::announce(&format!("metrics  http://{}/metrics", listener.local_addr()?));
        // Served until the process ends, after the planner's clean stop.
        let id = config.id.clone();
        tokio::spawn(async move { http::serve(listener, registry, &id, status, std::future::pending()).await });
    }
    daemon::announce(&format!("planner  {} for {} against {}", config.id, config.dns_zone, config.store.url));
    planner.run(shutdown).await;
    Ok(())
}
