//! `dnsplan-enactor --config enactor.toml [--id ID] [--zone ZONE]`: applies the newest plan
//! in the store `[store]` names, an authority's control API or etcd directly, and serves its
//! metrics.

use anyhow::Context;
use clap::Parser;
use dnsplan_common::Store;
use dnsplan_common::daemon::{self, StartFailure};
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_common::store_config::{EtcdStoreConfig, StoreConfig};
use dnsplan_enactor::args::Args;
use dnsplan_enactor::{Enactor, EnactorConfig, Metrics, http};
use dnsplan_etcd::{ConnectError, EtcdConfig, EtcdStore};
use prometheus_client::registry::Registry;
use std::future::Future;
use std::sync::Arc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    daemon::init(args.log.log_format);
    // Before any socket or file is opened: connections come out of this limit.
    dnsplan_common::open_files::raise_to_hard();
    // Before anything slow: a SIGTERM during start-up is then a clean stop, not a kill.
    let shutdown = daemon::shutdown_signal();
    tokio::pin!(shutdown);
    let config = EnactorConfig::load(&args.config, args.id, args.zone)?;
    // `Store` returns `impl Future`s, so each store is a concrete type: `run` is generic and
    // each arm calls it with its own store.
    match &config.store {
        StoreConfig::Control(c) => {
            let store = c.connect().context("setting up the store client")?;
            run(store, &config, shutdown).await
        }
        StoreConfig::Etcd(etcd) => {
            let keyring = config.settings().keyring;
            let connect = || connect_etcd(etcd, keyring.clone());
            match daemon::start_with_retry("the store on etcd", connect, shutdown.as_mut()).await {
                Ok(Some(store)) => run(store, &config, shutdown).await,
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
async fn connect_etcd(
    settings: &EtcdStoreConfig,
    keyring: Option<std::sync::Arc<dnsplan_common::signing::Keyring>>,
) -> Result<EtcdStore, StartFailure> {
    let mut config = EtcdConfig::from_settings(settings);
    config.keyring = keyring;
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

async fn run<S: ManagedZones>(store: S, config: &EnactorConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let mut registry = Registry::with_prefix("dnsplan");
    if !config.dns_zones.is_empty() {
        return run_zones(store, config, registry, shutdown).await;
    }
    let metrics = Arc::new(Metrics::register(&mut registry, &config.id));
    serve_metrics(config, registry).await?;
    daemon::announce(&format!("enactor  {} in zone {} against {}", config.id, config.zone, config.store.describe()));
    Enactor::new(store, config.settings(), metrics).run(shutdown).await;
    Ok(())
}

/// Serves the metrics in `registry` on the configured listener until the process ends.
async fn serve_metrics(config: &EnactorConfig, registry: Registry) -> anyhow::Result<()> {
    let listen = config.metrics.listen;
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding metrics on {listen}"))?;
    daemon::announce(&format!("metrics  http://{}/metrics", listener.local_addr()?));
    let id = config.id.clone();
    tokio::spawn(async move { http::serve(listener, registry, &id, std::future::pending()).await });
    Ok(())
}

/// One enactor loop per zone of `dns_zones`, each on its zone's store, with metrics labelled
/// `dns_zone`. A zone not (yet) in the store is looked for again until it is; each loop stops
/// at shutdown.
async fn run_zones<S: ManagedZones>(
    store: S,
    config: &EnactorConfig,
    mut registry: Registry,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let families = dnsplan_enactor::Families::register(&mut registry);
    let metrics: Vec<Arc<Metrics>> =
        config.dns_zones.iter().map(|zone| Arc::new(families.zone_enactor(&config.id, zone.as_str()))).collect();
    serve_metrics(config, registry).await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut loops = tokio::task::JoinSet::new();
    for (zone, metrics) in config.dns_zones.iter().cloned().zip(metrics) {
        let (store, settings, stopped) = (store.clone(), config.settings(), stopped.clone());
        daemon::announce(&format!(
            "enactor  {} in zone {} for DNS zone {zone} against {}",
            config.id,
            config.zone,
            config.store.describe()
        ));
        loops.spawn(dnsplan_enactor::zones::enact_zone(store, zone, settings, metrics, stopped));
    }
    shutdown.await;
    let _ = stop.send(true);
    while loops.join_next().await.is_some() {}
    Ok(())
}
