//! The zones the store manages beside its first one (`ManagedZones`), served (the layer of
//! `run`: it uses `follow` and `xfr`): each live zone
//! of the store's registry gets a `Serving` of its own, loaded from the zone's store with the
//! records of the master file it was added with, put in the zone table (`serving::zones`,
//! source `managed`) and followed like the first zone; a zone removed from the registry (or
//! added again, a new incarnation) stops being served, its tasks dropped with it.
//!
//! The registry is read again when this authority's control API added or removed a zone (at
//! once) and every [`REREAD_EVERY`] (the changes other authorities of an etcd store made).
//!
//! RRL and the query counts are the listeners' and cover every zone. Not yet per zone: the
//! follower's metrics (an added zone's figures are kept apart, not exported) and the
//! persistent IXFR journal (its IXFR history is in memory).

use crate::metrics::Metrics;
use crate::query::answer::AnswerLimits;
use crate::serving::Serving;
use crate::serving::policy::TransferPolicy;
use crate::serving::zones::{ZoneTable, managed_zone_records};
use dnsplan_common::daemon::Reachability;
use dnsplan_common::names::DnsName;
use dnsplan_common::store::zones::{ManagedZone, ManagedZones};
use hickory_proto::rr::Name;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinSet;

/// How often the registry is read again without being told of a change.
pub const REREAD_EVERY: Duration = Duration::from_secs(2);

/// The added zones served, and how to serve more.
pub struct AddedZones<S> {
    store: S,
    table: Arc<ZoneTable>,
    limits: AnswerLimits,
    transfer: Arc<TransferPolicy>,
    /// Told by the control API when it added or removed a zone.
    changed: Arc<Notify>,
}

/// One added zone served: its incarnation, and its follower and NOTIFY tasks (dropped with it).
struct Served {
    incarnation: u64,
    _tasks: JoinSet<()>,
}

impl<S: ManagedZones> AddedZones<S> {
    pub fn new(store: S, table: Arc<ZoneTable>, limits: AnswerLimits, transfer: Arc<TransferPolicy>, changed: Arc<Notify>) -> Self {
        AddedZones { store, table, limits, transfer, changed }
    }

    /// Serves the registry's live zones until the task is dropped.
    pub async fn keep(self) {
        let mut served: HashMap<DnsName, Served> = HashMap::new();
        let mut unreadable = false;
        loop {
            match self.store.zones().await {
                Ok(zones) => {
                    if std::mem::take(&mut unreadable) {
                        tracing::info!("the store's registry of zones is read again");
                    }
                    self.converge(&zones, &mut served).await;
                }
                Err(err) if !unreadable => {
                    unreadable = true;
                    tracing::warn!(error = %format!("{err:#}"), "cannot read the store's registry of zones; the added zones served stay as they are");
                }
                Err(_) => {}
            }
            // Paces the re-reads for changes other authorities made; a change made here wakes
            // it at once.
            let _ = tokio::time::timeout(REREAD_EVERY, self.changed.notified()).await;
        }
    }

    /// Starts serving the live zones not served (or served at another incarnation), and stops
    /// serving the others.
    async fn converge(&self, zones: &[ManagedZone], served: &mut HashMap<DnsName, Served>) {
        let live: HashMap<&DnsName, u64> = zones.iter().filter_map(|z| z.incarnation().map(|i| (&z.origin, i))).collect();
        let gone: Vec<DnsName> =
            served.iter().filter(|(origin, s)| live.get(origin) != Some(&s.incarnation)).map(|(origin, _)| origin.clone()).collect();
        for origin in gone {
            served.remove(&origin);
            if let Ok(name) = Name::from_ascii(origin.as_str()) {
                self.table.remove_managed(&name);
            }
            tracing::info!(zone = %origin, "no longer serving the removed zone");
        }
        for (origin, incarnation) in live {
            if served.contains_key(origin) {
                continue;
            }
            match self.start(origin).await {
                Ok((tasks, serving)) => {
                    let endpoints = serving.snapshot.load().managed_count();
                    match self.table.put_managed(serving) {
                        Ok(()) => {
                            tracing::info!(zone = %origin, endpoints, "serving the zone the store manages");
                            served.insert(origin.clone(), Served { incarnation, _tasks: tasks });
                        }
                        Err(err) => tracing::error!(zone = %origin, error = %err, "not serving the zone the store manages"),
                    }
                }
                Err(err) => {
                    tracing::warn!(zone = %origin, error = %format!("{err:#}"), "cannot serve the zone the store manages yet; trying again")
                }
            }
        }
    }

    /// Loads zone `origin` from its store, with its follower and NOTIFY tasks.
    async fn start(&self, origin: &DnsName) -> anyhow::Result<(JoinSet<()>, Arc<Serving>)> {
        let store = self.store.zone(origin).await?;
        let master = self.store.zone_master(origin).await?;
        let at = origin.to_string();
        let records = tokio::task::spawn_blocking(move || managed_zone_records(&at, &master)).await??;
        // Kept apart from the exported figures, which are the first zone's.
        let metrics = Arc::new(Metrics::new());
        let serving = Serving::load(&store, Arc::new(records), self.limits, metrics).await?.with_transfer(self.transfer.clone());
        let serving = Arc::new(serving);
        let mut tasks = JoinSet::new();
        let reach = Arc::new(Reachability::new("the store of an added zone"));
        tasks.spawn(serving.clone().follow(store, reach));
        crate::xfr::notify::spawn(&mut tasks, &serving);
        Ok((tasks, serving))
    }
}
