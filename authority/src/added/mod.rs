//! The zones the store manages beside its first one (`ManagedZones`), served (the layer of
//! `run`: it uses `follow` and `xfr`): each live zone of the store's registry gets a `Serving`
//! of its own, loaded from the zone's store with the records of the master file it was added
//! with, put in the zone table (`serving::zones`, source `managed`) and followed like the
//! first zone; a zone removed from the registry (or added again, a new incarnation) stops
//! being served, its tasks dropped with it, its directory removed.
//!
//! Each zone keeps a directory of its own on the authority's disk (`saved`): its IXFR history
//! survives a restart, and on etcd the state it served and the log of changes since are kept
//! as the first zone's are (`follow::kept`), so a restart answers for every zone it served at
//! once, before etcd answers ([`serve_kept`]), never with a state older than it answered with.
//!
//! The registry is read again when this authority's control API added or removed a zone (at
//! once) and every [`REREAD_EVERY`] (the changes other authorities of an etcd store made). A
//! zone this authority's control API added is started first, alone, before the registry is
//! read whole (`ZoneChanges`): at 10,000 zones the whole read is most of an add's time.
//!
//! RRL and the query counts are the listeners' and cover every zone. Not yet per zone: the
//! follower's metrics (an added zone's figures are kept apart, not exported).

pub mod book;
pub mod saved;

use crate::config::AddedZonesDnssec;
use crate::follow::image::Keeper;
use crate::follow::kept::{self, Keeping};
use crate::metrics::Metrics;
use crate::query::answer::AnswerLimits;
use crate::serving::KeysOf;
use crate::serving::Serving;
use crate::serving::policy::TransferPolicy;
use crate::serving::shared_keys::SharedKeys;
use crate::serving::zones::{ZoneChanges, ZoneTable, managed_zone_records_in};
use crate::zone::dns_zone::StaticZone;
use book::{Entry, ZoneBook};
use dnsplan_common::daemon::Reachability;
use dnsplan_common::names::DnsName;
use dnsplan_common::store::sled::{off_runtime, on_blocking_thread};
use dnsplan_common::store::zones::{ManagedZone, ManagedZones};
use hickory_proto::rr::Name;
use saved::SavedZone;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// How often the registry is read again without being told of a change.
pub const REREAD_EVERY: Duration = Duration::from_secs(2);

/// Most added zones started at once (`AddedZones::converge`).
const STARTS_AT_ONCE: usize = 8;

/// Most added zones put in the zone table at once, each batch one copy of the table.
const SERVE_AT_ONCE: usize = 256;

/// How the added zones are served: the settings they share with the first zone.
#[derive(Clone)]
pub struct Setup {
    pub table: Arc<ZoneTable>,
    pub limits: AnswerLimits,
    pub transfer: Arc<TransferPolicy>,
    /// Where each zone's directory is (`saved`).
    pub data_dir: PathBuf,
    /// On etcd, each zone's served state is kept on disk (`follow::kept`).
    pub keeping: Keeping,
    /// The authority's metrics: each zone's counters count there (`Metrics::for_added_zone`).
    pub metrics: Arc<Metrics>,
    /// What each zone is now, for the metrics and the status page.
    pub book: Arc<ZoneBook>,
    /// With a keyring: each zone serves only records a trusted plan says (`serving::trusted`).
    pub keyring: Option<Arc<dnsplan_common::signing::Keyring>>,
    /// `[added_zones.dnssec]`: each zone signed with its key directory (made when missing).
    pub dnssec: Option<AddedZonesDnssec>,
}

impl Setup {
    /// A zone's own check of what it serves (its plans' generations are its own, so each
    /// zone has its own verified plans).
    fn plan_check(&self) -> Option<Arc<crate::serving::trusted::PlanCheck>> {
        self.keyring.clone().map(|keyring| crate::serving::trusted::PlanCheck::new(keyring, self.metrics.clone()))
    }
}

/// The added zones served, and how to serve more.
pub struct AddedZones<S> {
    store: S,
    setup: Setup,
    /// Told by the control API when it added or removed a zone.
    changed: Arc<ZoneChanges>,
    /// Zones served at start from what their directory kept, before the store answered: taken
    /// over (followed) once the registry says the same incarnation is live, dropped otherwise.
    kept: HashMap<DnsName, KeptZone>,
}

/// A zone served from what its directory kept, not yet followed.
pub struct KeptZone {
    incarnation: u64,
    serving: Arc<Serving>,
    keeper: Option<Arc<Keeper>>,
}

/// One added zone served: its incarnation, and its follower, NOTIFY and keeper tasks
/// (dropped with it).
struct Served {
    incarnation: u64,
    _tasks: JoinSet<()>,
}

/// On etcd, serves every added zone whose directory kept a state (`follow::kept`) at once,
/// before the store answers, as the first zone's saved state is; the zones are taken over by
/// [`AddedZones`] once the store's registry is read. A zone whose directory cannot be used
/// is not served until the store answers (a WARN line each).
pub async fn serve_kept(setup: &Setup) -> HashMap<DnsName, KeptZone> {
    let mut kept = HashMap::new();
    // Signed zones are served once the store answers: what is kept holds no signatures.
    if setup.keeping != Keeping::OnDisk || setup.dnssec.is_some() {
        return kept;
    }
    let data_dir = setup.data_dir.clone();
    let found = match tokio::task::spawn_blocking(move || saved::read_all(&data_dir)).await {
        Ok(Ok(found)) => found,
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "cannot list the added zones kept on disk; they are served once the store answers");
            return kept;
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot list the added zones kept on disk; they are served once the store answers");
            return kept;
        }
    };
    // Read STARTS_AT_ONCE at a time, then put in the zone table at once.
    let permits = Arc::new(tokio::sync::Semaphore::new(STARTS_AT_ONCE));
    let mut reads = JoinSet::new();
    for found in found {
        let zone = match found.zone {
            Ok(zone) => zone,
            Err(why) => {
                tracing::warn!(dir = %found.dir.display(), "an added zone kept on disk is not served until the store answers: {why}");
                continue;
            }
        };
        let (setup, permits) = (setup.clone(), permits.clone());
        reads.spawn(async move {
            let _permit = permits.acquire_owned().await;
            let read = serve_one_kept(&setup, &found.dir, &zone).await;
            (zone.origin, read)
        });
    }
    let mut read = Vec::new();
    while let Some(done) = reads.join_next().await {
        let Ok((origin, one)) = done else { continue };
        match one {
            Ok(Some(one)) => read.push((origin, one)),
            Ok(None) => {}
            Err(err) => {
                tracing::warn!(zone = %origin, error = %format!("{err:#}"), "an added zone kept on disk is not served until the store answers")
            }
        }
    }
    let servings: Vec<Arc<Serving>> = read.iter().map(|(_, one)| one.serving.clone()).collect();
    for ((origin, one), put) in read.into_iter().zip(setup.table.put_managed_many(&servings)) {
        match put {
            Ok(()) => {
                tracing::info!(zone = %origin, endpoints = one.serving.snapshot.load().managed_count(), "serving the added zone's saved state at once; the store is followed once it answers");
                setup.book.set(&origin, Entry::Kept(one.serving.clone()));
                kept.insert(origin, one);
            }
            Err(err) => {
                tracing::warn!(zone = %origin, error = %format!("{err:#}"), "an added zone kept on disk is not served until the store answers")
            }
        }
    }
    kept
}

/// One zone as its directory kept it, ready to serve; `None` when it kept no state.
async fn serve_one_kept(setup: &Setup, dir: &Path, zone: &SavedZone) -> anyhow::Result<Option<KeptZone>> {
    let started = Instant::now();
    let records = parse(zone, dir).await?;
    let kept = kept::open(dir, records.clone()).await?;
    let keeper = kept.keeper(dir);
    let Some((snapshot, _)) = kept.state else { return Ok(None) };
    let serving = Serving::from_loaded(snapshot, records, setup.limits, Arc::new(setup.metrics.for_added_zone()), started)
        .with_transfer(setup.transfer.clone())
        .with_served_log(kept.served_log)
        .with_ixfr_log(dir)
        .with_plan_check(setup.plan_check());
    Ok(Some(KeptZone { incarnation: zone.incarnation, serving: Arc::new(serving), keeper: Some(keeper) }))
}

/// The zone's master file read (through its image in the zone's directory `dir`), off the
/// runtime's threads.
async fn parse(zone: &SavedZone, dir: &Path) -> anyhow::Result<Arc<StaticZone>> {
    let (at, master, dir) = (zone.origin.to_string(), zone.master.clone(), dir.to_path_buf());
    let (records, _from_image) = tokio::task::spawn_blocking(move || managed_zone_records_in(&dir, &at, &master)).await??;
    Ok(Arc::new(records))
}

impl<S: ManagedZones> AddedZones<S> {
    /// `kept`: the zones `serve_kept` serves already.
    pub fn new(store: S, setup: Setup, changed: Arc<ZoneChanges>, kept: HashMap<DnsName, KeptZone>) -> Self {
        AddedZones { store, setup, changed, kept }
    }

    /// Serves the registry's live zones until the task is dropped.
    pub async fn keep(mut self) {
        let mut served: HashMap<DnsName, Served> = HashMap::new();
        let mut unreadable = false;
        let mut swept = false;
        // The registry version last read whole: it is read again only when the version moved
        // (one key on etcd, whatever the number of zones).
        let mut seen = None;
        loop {
            for origin in self.changed.take_added() {
                self.start_added(&origin, &mut served).await;
            }
            let version = self.store.registry_version().await;
            if let (Ok(now), Some(then)) = (&version, seen)
                && *now == then
            {
                self.changed.wait(REREAD_EVERY).await;
                continue;
            }
            match self.store.zones().await {
                Ok(zones) => {
                    if std::mem::take(&mut unreadable) {
                        tracing::info!("the store's registry of zones is read again");
                    }
                    self.converge(&zones, &mut served).await;
                    // Read whole again next time while some live zone could not be started.
                    seen = version.ok().filter(|_| served.len() == zones.iter().filter(|z| z.is_live()).count());
                    if !swept {
                        swept = true;
                        self.sweep(&zones).await;
                    }
                }
                Err(err) if !unreadable => {
                    unreadable = true;
                    tracing::warn!(error = %format!("{err:#}"), "cannot read the store's registry of zones; the added zones served stay as they are");
                }
                Err(_) => {}
            }
            // Paces the re-reads for changes other authorities made; a change made here wakes
            // it at once.
            self.changed.wait(REREAD_EVERY).await;
        }
    }

    /// Starts zone `origin`, which this authority's control API just added, before the whole
    /// registry is read: one registry entry read, not all of them. Served already, or not
    /// live (removed meanwhile), or failing: left to `converge`, which the registry's read
    /// right after runs.
    async fn start_added(&mut self, origin: &DnsName, served: &mut HashMap<DnsName, Served>) {
        if served.contains_key(origin) || self.kept.contains_key(origin) {
            return;
        }
        let Some(incarnation) = self.store.zone(origin).await.ok().and_then(|zone| zone.incarnation()) else { return };
        match prepare(&self.store, &self.setup, origin, incarnation, None).await {
            Ok(prepared) => self.serve_ready(&mut vec![(origin.clone(), incarnation, prepared)], served),
            Err((err, _)) => {
                tracing::debug!(zone = %origin, error = %format!("{err:#}"), "the zone just added is started by the registry's read")
            }
        }
    }

    /// Starts serving the live zones not served (or served at another incarnation), and stops
    /// serving the others.
    async fn converge(&mut self, zones: &[ManagedZone], served: &mut HashMap<DnsName, Served>) {
        let live: HashMap<&DnsName, u64> = zones.iter().filter_map(|z| z.incarnation().map(|i| (&z.origin, i))).collect();
        let gone: Vec<DnsName> =
            served.iter().filter(|(origin, s)| live.get(origin) != Some(&s.incarnation)).map(|(origin, _)| origin.clone()).collect();
        let stale: Vec<DnsName> =
            self.kept.iter().filter(|(origin, k)| live.get(origin) != Some(&k.incarnation)).map(|(origin, _)| origin.clone()).collect();
        for origin in gone.into_iter().chain(stale) {
            served.remove(&origin);
            self.kept.remove(&origin);
            self.setup.book.remove(&origin);
            if let Ok(name) = Name::from_ascii(origin.as_str()) {
                self.setup.table.remove_managed(&name);
            }
            let dir = saved::dir_in(&self.setup.data_dir, &origin);
            if let Err(err) = tokio::task::spawn_blocking(move || saved::remove(&dir)).await.map_err(std::io::Error::other).and_then(|r| r)
            {
                tracing::warn!(zone = %origin, error = %err, "cannot remove the directory of a zone no longer served");
            }
            tracing::info!(zone = %origin, "no longer serving the removed zone");
        }
        self.setup.book.retain(|origin| live.contains_key(origin));
        // Started STARTS_AT_ONCE at a time: a start waits on the store and the disk as much as
        // it parses, and ten thousand zones started one by one took a restart's whole time.
        let permits = Arc::new(tokio::sync::Semaphore::new(STARTS_AT_ONCE));
        let mut starts = JoinSet::new();
        for (origin, incarnation) in live {
            if served.contains_key(origin) {
                continue;
            }
            let (store, setup, origin, kept) = (self.store.clone(), self.setup.clone(), origin.clone(), self.kept.remove(origin));
            let permits = permits.clone();
            starts.spawn(async move {
                let _permit = permits.acquire_owned().await;
                // On one blocking thread, its store calls inline: a start is a dozen of them.
                let at = origin.clone();
                let started = off_runtime(async move { prepare(&store, &setup, &at, incarnation, kept).await })
                    .await
                    .unwrap_or_else(|err| Err((err.into(), None)));
                (origin, incarnation, started)
            });
        }
        let mut ready = Vec::new();
        while let Some(done) = starts.join_next().await {
            let Ok((origin, incarnation, started)) = done else { continue };
            match started {
                Ok(prepared) => ready.push((origin, incarnation, prepared)),
                Err((err, kept)) => {
                    let why = format!("{err:#}");
                    if let Some(kept) = kept {
                        self.kept.insert(origin.clone(), kept);
                    } else if self.setup.book.get(&origin).is_none_or(|e| e.serving().is_none()) {
                        self.setup.book.set(&origin, Entry::NotServed(why.clone()));
                    }
                    tracing::warn!(zone = %origin, error = %why, "cannot serve the zone the store manages yet; trying again")
                }
            }
            // Served SERVE_AT_ONCE at a time, each batch in one copy of the zone table.
            if ready.len() >= SERVE_AT_ONCE || starts.is_empty() {
                self.serve_ready(&mut ready, served);
            }
        }
    }

    /// Puts the zones of `ready` in the zone table at once (those not already there, kept from
    /// disk) and follows each; a zone the table refuses is not served, and says why.
    fn serve_ready(&self, ready: &mut Vec<(DnsName, u64, Prepared<S>)>, served: &mut HashMap<DnsName, Served>) {
        let fresh: Vec<Arc<Serving>> = ready.iter().filter(|(_, _, p)| p.fresh).map(|(_, _, p)| p.serving.clone()).collect();
        let mut put = self.setup.table.put_managed_many(&fresh).into_iter();
        for (origin, incarnation, prepared) in ready.drain(..) {
            if prepared.fresh {
                if let Some(Err(err)) = put.next() {
                    let why = format!("{err:#}");
                    self.setup.book.set(&origin, Entry::NotServed(why.clone()));
                    tracing::warn!(zone = %origin, error = %why, "cannot serve the zone the store manages yet; trying again");
                    continue;
                }
                tracing::info!(zone = %origin, endpoints = prepared.serving.snapshot.load().managed_count(), "serving the zone the store manages");
            }
            served.insert(origin.clone(), Served { incarnation, _tasks: follow(&self.setup, &origin, prepared) });
        }
    }

    /// Removes the directories of zones the registry does not have live (removed while this
    /// authority was stopped), once, after the registry was first read.
    async fn sweep(&self, zones: &[ManagedZone]) {
        let data_dir = self.setup.data_dir.clone();
        let keep: std::collections::HashSet<PathBuf> =
            zones.iter().filter(|z| z.incarnation().is_some()).map(|z| saved::dir_in(&data_dir, &z.origin)).collect();
        let swept = tokio::task::spawn_blocking(move || {
            let mut removed = 0;
            for found in saved::read_all(&data_dir)? {
                if !keep.contains(&found.dir) {
                    // One that cannot be removed does not keep the others.
                    match saved::remove(&found.dir) {
                        Ok(()) => removed += 1,
                        Err(err) => tracing::warn!(dir = %found.dir.display(), error = %err, "cannot remove the directory of a zone no longer in the store"),
                    }
                }
            }
            Ok::<_, std::io::Error>(removed)
        })
        .await;
        match swept {
            Ok(Ok(0)) => {}
            Ok(Ok(removed)) => tracing::info!(removed, "removed the directories of zones no longer in the store"),
            Ok(Err(err)) => tracing::warn!(error = %err, "cannot remove the directories of zones no longer in the store"),
            Err(err) => tracing::warn!(error = %err, "cannot remove the directories of zones no longer in the store"),
        }
    }
}

/// A zone ready to be served: its `Serving`, its keeper (on etcd) and its store handle;
/// `fresh` when it is not in the zone table yet (not served from what its directory kept).
struct Prepared<S> {
    serving: Arc<Serving>,
    keeper: Option<Arc<Keeper>>,
    zone_store: S,
    fresh: bool,
}

/// Prepares zone `origin` at `incarnation`: the state served from its directory at start
/// (`kept`), or else loaded from its store. On an error, the kept zone is given back (it is
/// served as it was).
async fn prepare<S: ManagedZones>(
    store: &S,
    setup: &Setup,
    origin: &DnsName,
    incarnation: u64,
    kept: Option<KeptZone>,
) -> Result<Prepared<S>, (anyhow::Error, Option<KeptZone>)> {
    let zone_store = match store.zone(origin).await {
        Ok(zone_store) => zone_store,
        Err(err) => return Err((err.into(), kept)),
    };
    // Removed and added again since the registry was read: the next read starts the new one.
    if let Some(now) = zone_store.incarnation()
        && now != incarnation
    {
        let err = anyhow::anyhow!("zone {origin} was added again (incarnation {now}, not {incarnation}) since the registry was read");
        return Err((err, kept));
    }
    match kept {
        Some(kept) => Ok(Prepared { serving: kept.serving, keeper: kept.keeper, zone_store, fresh: false }),
        None => {
            let (serving, keeper) = load(store, &zone_store, setup, origin, incarnation).await.map_err(|err| (err, None))?;
            Ok(Prepared { serving, keeper, zone_store, fresh: true })
        }
    }
}

/// Added zone `origin`'s keys shared through its store `zone_store` (`kek_file`), when they
/// are.
fn shared_keys<S: ManagedZones>(setup: &Setup, zone_store: &S) -> Option<SharedKeys> {
    let kek = setup.dnssec.as_ref()?.kek.clone()?;
    Some(SharedKeys::new(zone_store.clone(), kek))
}

/// Follows zone `origin`, served: its keeper, follower and NOTIFY tasks, returned.
fn follow<S: ManagedZones>(setup: &Setup, origin: &DnsName, prepared: Prepared<S>) -> JoinSet<()> {
    let Prepared { serving, keeper, zone_store, .. } = prepared;
    let mut tasks = JoinSet::new();
    if let Some(keeper) = keeper {
        tasks.spawn(keeper.keep_saved(serving.clone(), zone_store.clone()));
    }
    // A zone signed with a key directory follows it (rolls, keys changed by the CLI).
    if let Some(every) = serving.zone.signer.as_ref().and_then(|s| s.key_check()) {
        tasks.spawn(crate::serving::keep_keys(serving.clone(), every, KeysOf::Managed(shared_keys(setup, &zone_store))));
    }
    let reach = Arc::new(Reachability::named(format!("the store of zone {origin}")));
    setup.book.set(origin, Entry::Following { serving: serving.clone(), reach: reach.clone() });
    tasks.spawn(serving.clone().follow(zone_store, reach));
    crate::xfr::notify::spawn(&mut tasks, &serving);
    tasks
}

/// Loads zone `origin` from its store `zone_store` (its master file from `store`'s registry),
/// with a directory of its own (not yet in the zone table).
async fn load<S: ManagedZones>(
    store: &S,
    zone_store: &S,
    setup: &Setup,
    origin: &DnsName,
    incarnation: u64,
) -> anyhow::Result<(Arc<Serving>, Option<Arc<Keeper>>)> {
    let master = store.zone_master(origin).await?;
    let zone = SavedZone { origin: origin.clone(), incarnation, master };
    // The directory and the master file's records in one trip off the runtime's threads: at a
    // restart of ten thousand zones each trip is a thread woken and waited for.
    let (data_dir, saved) = (setup.data_dir.clone(), zone.clone());
    let dnssec = setup.dnssec.clone();
    // Keys shared through the store: taken from it, or made here and written to it first.
    if let (Some(shared), Some(config)) = (shared_keys(setup, zone_store), &dnssec) {
        let dir = config.zone_config(origin.as_str()).key_dir.unwrap_or_default();
        let make = config.create_keys.then(|| {
            let (config, origin, dir) = (config.clone(), origin.to_string(), dir.clone());
            move || config.make_keys(&origin, &dir)
        });
        shared.pull_or_make(&dir, origin.as_str(), make).await?;
    }
    let (dir, records) = on_blocking_thread(move || {
        let dir = saved::open(&data_dir, &saved)?;
        let (mut records, _from_image) = managed_zone_records_in(&dir, saved.origin.as_str(), &saved.master)?;
        if let Some(dnssec) = &dnssec {
            dnssec.sign(&mut records)?;
        }
        anyhow::Ok((dir, Arc::new(records)))
    })
    .await??;
    let (served_log, keeper) = match setup.keeping {
        Keeping::OnDisk => {
            let (log, _) = kept::open_log(&dir, None).await?;
            (log.clone(), Some(kept::keeper(&dir, None, log)))
        }
        Keeping::InStore => (None, None),
    };
    let metrics = Arc::new(setup.metrics.for_added_zone());
    let serving = Serving::load(zone_store, records, setup.limits, metrics, setup.plan_check())
        .await?
        .with_transfer(setup.transfer.clone())
        .with_served_log(served_log)
        .with_ixfr_log(&dir);
    Ok((Arc::new(serving), keeper))
}
