//! Enacting zones the store manages beside its first one (`ManagedZones`): a loop per zone on
//! the zone's handle, started again on the zone's new incarnation when it was removed and added
//! again (nothing carried over), and, for `dnsplan up`, every zone of the store's registry
//! (`enact_added_zones`), a loop each, started when a zone is added and stopped when it is
//! removed.

use crate::config::Settings;
use crate::enactor::Enactor;
use crate::metrics::Metrics;
use dnsplan_common::names::DnsName;
use dnsplan_common::store::zones::{ManagedZones, wait_for_zone, zone_gone};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

/// How often `enact_added_zones` reads the store's registry for zones added or removed (and a
/// loop, that its zone was removed or added again).
pub use dnsplan_common::store::zones::ZONE_REREAD_EVERY;

/// Enacts zone `zone` until `stopped` says so: on the zone's handle, looked for until the
/// store has it, and again on each new incarnation.
pub async fn enact_zone<S: ManagedZones>(
    store: S,
    zone: DnsName,
    settings: Settings,
    metrics: Arc<Metrics>,
    stopped: watch::Receiver<bool>,
) {
    loop {
        let mut until_stopped = stopped.clone();
        let stop = async move {
            let _ = until_stopped.wait_for(|stop| *stop).await;
        };
        let Some(handle) = wait_for_zone(&store, &zone, stop).await else { return };
        let mut until_stop = stopped.clone();
        let until_stop = async move {
            let _ = until_stop.wait_for(|stop| *stop).await;
        };
        tokio::select! {
            () = Enactor::new(handle.clone(), settings.clone(), metrics.clone()).run(until_stop) => return,
            () = zone_gone(&handle) => {
                tracing::warn!(dns_zone = %zone, "the zone was removed or added again; its old incarnation is no longer enacted");
            }
        }
    }
}

/// Enacts every zone the store manages beside its first one, as its registry says, until
/// `stopped`: `metrics(zone)` gives each loop its metrics.
pub async fn enact_added_zones<S: ManagedZones>(
    store: S,
    settings: Settings,
    metrics: impl Fn(&DnsName) -> Arc<Metrics>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut loops: HashMap<DnsName, tokio::task::AbortHandle> = HashMap::new();
    let mut tasks = tokio::task::JoinSet::new();
    // The registry is read whole only when its version moved (at 100,000 zones it is
    // megabytes; its version is one number).
    let mut seen = None;
    loop {
        let version = store.registry_version().await.ok();
        let zones = if version.is_none() || version != seen { store.zones().await.ok() } else { None };
        if let Some(zones) = zones {
            seen = version;
            let live: std::collections::HashSet<&DnsName> = zones.iter().filter(|z| z.is_live()).map(|z| &z.origin).collect();
            loops.retain(|zone, task| {
                let keep = live.contains(&zone);
                if !keep {
                    task.abort();
                }
                keep
            });
            for zone in live {
                if !loops.contains_key(zone) {
                    let run = enact_zone(store.clone(), zone.clone(), settings.clone(), metrics(zone), stopped.clone());
                    loops.insert(zone.clone(), tasks.spawn(run));
                }
            }
        }
        // Finished loops (aborted ones) are collected as they end.
        while tasks.try_join_next().is_some() {}
        tokio::select! {
            _ = stopped.wait_for(|stop| *stop) => break,
            _ = tokio::time::sleep(ZONE_REREAD_EVERY) => {}
        }
    }
    while tasks.join_next().await.is_some() {}
}
