//! One planner process, several zones: `dns_zone` and each `[[zone]]` of the config
//! (`PlannerConfig::each_zone`) is planned by a `Planner` of its own (its lease, plans, pause,
//! metrics series and status), all sharing the process's health checks (`HealthBook`, one
//! probe per target whatever the zones).

use crate::config::PlannerConfig;
use crate::health::HealthBook;
use crate::metrics::Metrics;
use crate::planner::{Planner, Status};
use dnsplan_common::store::zones::{ManagedZones, wait_for_zone, zone_gone};
use std::future::Future;
use std::sync::{Arc, Mutex};

/// Plans the zone of `config` until `shutdown`: the store's first zone, or with `added_zone`
/// the zone `dns_zone` once the store has it, planned again on each new incarnation of the
/// zone (removed and added again). Its status is kept in `status`.
pub async fn plan_zone<S: ManagedZones>(
    store: S,
    config: Arc<PlannerConfig>,
    book: Arc<HealthBook>,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<Status>>,
    shutdown: impl Future<Output = ()>,
) {
    let planner = |store| Planner::new(store, config.clone(), book.clone(), metrics.clone()).with_status(status.clone());
    if !config.added_zone {
        planner(store).run(shutdown).await;
        return;
    }
    tokio::pin!(shutdown);
    loop {
        let Some(zone) = wait_for_zone(&store, &config.dns_zone, shutdown.as_mut()).await else { return };
        tokio::select! {
            () = planner(zone.clone()).run(shutdown.as_mut()) => return,
            () = zone_gone(&zone) => {
                tracing::warn!(dns_zone = %config.dns_zone, "the zone was removed or added again; planning its new incarnation");
            }
        }
    }
}

/// The metrics of each zone of `configs` (`PlannerConfig::each_zone`): `first`'s for
/// `dns_zone`, `Metrics::for_zone` for the others. Made before the metrics are served, so every
/// zone's series are there from the first scrape.
pub fn zone_metrics(first: &Arc<Metrics>, configs: &[Arc<PlannerConfig>]) -> Vec<Arc<Metrics>> {
    configs
        .iter()
        .enumerate()
        .map(|(i, config)| if i == 0 { first.clone() } else { Arc::new(first.for_zone(config.dns_zone.as_str())) })
        .collect()
}

/// Plans every zone of `configs` (`PlannerConfig::each_zone`) until `shutdown`, each with its
/// metrics (`zone_metrics`) and its status in `statuses`, in the same order, on the health of
/// `book`.
pub async fn plan_zones<S: ManagedZones>(
    store: S,
    configs: Vec<Arc<PlannerConfig>>,
    book: Arc<HealthBook>,
    metrics: Vec<Arc<Metrics>>,
    statuses: Vec<Arc<Mutex<Status>>>,
    shutdown: impl Future<Output = ()>,
) {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut loops = tokio::task::JoinSet::new();
    for ((config, status), metrics) in configs.into_iter().zip(statuses).zip(metrics) {
        let mut stopped = stopped.clone();
        let until_stop = async move {
            let _ = stopped.wait_for(|stop| *stop).await;
        };
        loops.spawn(plan_zone(store.clone(), config, book.clone(), metrics, status, until_stop));
    }
    shutdown.await;
    let _ = stop.send(true);
    // Each planner gives its lease up before it returns.
    while loops.join_next().await.is_some() {}
}
