//! `dnsplan-planner --config planner.toml [--id ID]`: health-checks the targets and publishes
//! plans to the store `[store]` names, an authority's control API or etcd directly; serves
//! `/metrics`, `/healthz` and `/v1/status`.

use anyhow::Context;
use clap::Parser;
use dnsplan_common::Store;
use dnsplan_common::daemon::{self, StartFailure};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::zones::{ManagedZones, wait_for_zone, zone_gone};
use dnsplan_common::store_config::{EtcdStoreConfig, StoreConfig};
use dnsplan_etcd::{ConnectError, EtcdConfig, EtcdStore};
use dnsplan_planner::args::Args;
use dnsplan_planner::health::{HealthBook, spawn_checks};
use dnsplan_planner::http;
use dnsplan_planner::metrics::Metrics;
use dnsplan_planner::{Planner, PlannerConfig};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    daemon::init(args.log.log_format);
    // Before any socket or file is opened: connections come out of this limit.
    dnsplan_common::open_files::raise_to_hard();
    let shutdown = daemon::shutdown_signal();
    tokio::pin!(shutdown);
    let mut config = PlannerConfig::load(&args.config)?;
    if let Some(id) = args.id {
        anyhow::ensure!(!id.is_empty() && id.len() <= dnsplan_common::plan::AUTHOR_BYTES_MAX, "--id: give 1..=128 bytes");
        config.id = id;
    }
    let config = Arc::new(config);
    // `Store` returns `impl Future`s, so each store is a concrete type: `run` is generic and
    // each arm calls it with its own store.
    match &config.store {
        StoreConfig::Control(c) => {
            let store = RemoteStore::new(&c.url, c.token.clone()).context("setting up the store client")?;
            run(store, config.clone(), shutdown).await
        }
        StoreConfig::Etcd(etcd) => {
            let connect = || connect_etcd(etcd);
            match daemon::start_with_retry("the store on etcd", connect, shutdown.as_mut()).await {
                Ok(Some(store)) => run(store, config.clone(), shutdown).await,
                Ok(None) => Ok(()),
                Err(err) => Err(anyhow::anyhow!(err)),
            }
        }
    }
}

/// Connects to etcd and reads the store's version once, so that the daemon starts only once
/// etcd answers. Connecting is always retried: the settings were checked when the config was
/// loaded, and `ConnectError::Config` also reports a cluster that did not answer in time. A
/// store that answers with something other than an outage (bad data under the prefix) is fatal.
async fn connect_etcd(settings: &EtcdStoreConfig) -> Result<EtcdStore, StartFailure> {
    let config = EtcdConfig::from_settings(settings);
    let store =
        EtcdStore::connect(config).await.map_err(|err: ConnectError| StartFailure::Retry(format!("{:#}", anyhow::Error::new(err))))?;
    match store.version().await {
        Ok(_) => Ok(store),
        Err(err @ (dnsplan_common::StoreError::Unavailable(_) | dnsplan_common::StoreError::Io(_))) => {
            Err(StartFailure::Retry(format!("{:#}", anyhow::Error::new(err))))
        }
        Err(err) => Err(StartFailure::Fatal(format!("{:#}", anyhow::Error::new(err)))),
    }
}

/// The planner on `store`'s first zone, or with `added_zone` on the zone `dns_zone` once the
/// store has it, started again on each new incarnation of the zone (removed and added again).
async fn run<S: ManagedZones>(store: S, config: Arc<PlannerConfig>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut registry = Registry::with_prefix("dnsplan");
    let metrics = Arc::new(Metrics::register(&mut registry, &config.id));
    let book = Arc::new(HealthBook::default());
    let _checks = spawn_checks(&config, book.clone(), metrics.clone());
    let status = Arc::new(std::sync::Mutex::new(dnsplan_planner::planner::Status { id: config.id.clone(), ..Default::default() }));
    {
        let listen = config.metrics.listen;
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen}"))?;
        daemon::announce(&format!("metrics  http://{}/metrics", listener.local_addr()?));
        // Served until the process ends, after the planner's clean stop.
        let (id, status) = (config.id.clone(), status.clone());
        tokio::spawn(async move { http::serve(listener, registry, &id, status, std::future::pending()).await });
    }
    daemon::announce(&format!("planner  {} for {} against {}", config.id, config.dns_zone, config.store.describe()));
    let planner = |store| Planner::new(store, config.clone(), book.clone(), metrics.clone()).with_status(status.clone());
    if !config.added_zone {
        planner(store).run(shutdown).await;
        return Ok(());
    }
    tokio::pin!(shutdown);
    loop {
        let Some(zone) = wait_for_zone(&store, &config.dns_zone, shutdown.as_mut()).await else { return Ok(()) };
        tokio::select! {
            () = planner(zone.clone()).run(shutdown.as_mut()) => return Ok(()),
            () = zone_gone(&zone) => {
                tracing::warn!(dns_zone = %config.dns_zone, "the zone was removed or added again; planning its new incarnation");
            }
        }
    }
}
