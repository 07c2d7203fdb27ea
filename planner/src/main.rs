//! `dnsplan-planner --config planner.toml [--id ID]`: health-checks the targets and publishes
//! plans to the store `[store]` names, an authority's control API or etcd directly; serves
//! `/metrics`, `/healthz` and `/v1/status`.

use anyhow::Context;
use clap::Parser;
use dnsplan_common::Store;
use dnsplan_common::daemon::{self, StartFailure};
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_common::store_config::{EtcdStoreConfig, StoreConfig};
use dnsplan_etcd::{ConnectError, EtcdConfig, EtcdStore};
use dnsplan_planner::PlannerConfig;
use dnsplan_planner::args::Args;
use dnsplan_planner::health::{HealthBook, spawn_checks};
use dnsplan_planner::http;
use dnsplan_planner::metrics::Metrics;
use dnsplan_planner::planner::Status;
use dnsplan_planner::zones::{plan_zones, zone_metrics};
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
            let store = c.connect().context("setting up the store client")?;
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

/// The planner of every zone of the config (`dns_zone`, the store's first zone or with
/// `added_zone` an added one, and each `[[zone]]`), a `Planner` each, sharing the health checks.
async fn run<S: ManagedZones>(store: S, config: Arc<PlannerConfig>, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut registry = Registry::with_prefix("dnsplan");
    let metrics = Arc::new(Metrics::register(&mut registry, &config.id));
    let book = Arc::new(HealthBook::default());
    let _checks = spawn_checks(&config, book.clone(), metrics.clone());
    let configs: Vec<Arc<PlannerConfig>> = config.each_zone().into_iter().map(Arc::new).collect();
    let zone_metrics = zone_metrics(&metrics, &configs);
    let statuses: Vec<Arc<std::sync::Mutex<Status>>> =
        configs.iter().map(|_| Arc::new(std::sync::Mutex::new(Status { id: config.id.clone(), ..Default::default() }))).collect();
    {
        let listen = config.metrics.listen;
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen}"))?;
        daemon::announce(&format!("metrics  http://{}/metrics", listener.local_addr()?));
        // Served until the process ends, after the planners' clean stop.
        let zones: Vec<http::ZoneStatus> =
            configs.iter().zip(&statuses).map(|(c, s)| http::ZoneStatus { dns_zone: c.dns_zone.clone(), status: s.clone() }).collect();
        let id = config.id.clone();
        tokio::spawn(async move { http::serve(listener, registry, &id, zones, std::future::pending()).await });
    }
    let others = match configs.len() - 1 {
        0 => String::new(),
        n => format!(" and {n} more zone{}", if n == 1 { "" } else { "s" }),
    };
    daemon::announce(&format!("planner  {} for {}{others} against {}", config.id, config.dns_zone, config.store.describe()));
    plan_zones(store, configs, book, zone_metrics, statuses, shutdown).await;
    Ok(())
}
