//! `SledStore`: the embedded `Store` on a sled database on local disk, compressed by sled
//! (zstd, `COMPRESSION_LEVEL`) when `open` creates it; a store created uncompressed stays so.
//!
//! Layout [`LAYOUT`] (one sled tree each; the files, one concern each, are named below):
//! - `plans`: generation (big-endian) → the whole plan's envelope, for plans published whole
//!   and for checkpoints; `plan_heads`: the same keys → [`PlanHead`], for plans published as
//!   their changes (`publish_changes`); `summaries`: the same keys → summary; `plan_changes`:
//!   the same keys → the plan's [`PlanChanges`] against its parent, written with the plan
//!   when it has a parent and the change is at most `PLAN_CHANGES_ENDPOINTS_MAX` endpoints.
//!   A plan published as changes is read by folding the changes after the newest plan stored
//!   whole at or below it onto that plan. So that reads stay near the cost of one whole
//!   plan, a plan is also written whole (a checkpoint, off the publish path) once the changes
//!   since the last whole plan add up to half its size, or to `CHECKPOINT_PLANS_MAX` plans.
//! - `active_runs`: the active records (each endpoint's fence and copied records) in runs of
//!   at most `ACTIVE_RUN_MAX` endpoints in name byte order: the first name of a run (the
//!   first run: a 0 byte, below every name) → [`ActiveRun`] envelope. An apply batch in name
//!   order rewrites a few runs, not a key per endpoint; a run grown past the limit is split
//!   when written. Records are never removed (a retired endpoint keeps a record), so runs
//!   only grow and split (`active.rs`, with the two trees after it).
//! - `fence_counts`: generation (big-endian) → how many endpoints serve with that fence (8
//!   bytes, big-endian) ++ the name of one of them, or nothing when that one has since moved
//!   on (a witness, for the operator; found again by a scan of `active_runs` when cleanup needs
//!   it). The first key is the oldest active generation. An apply batch writes one value per
//!   generation it touches, not two index entries per endpoint.
//! - `changes`: applied-change count of a batch's last switch (big-endian) → the names the
//!   batch switched, in order, separated by 0 bytes; the batches of the last
//!   `CHANGE_LOG_KEPT` switches, written in the same transaction as the switches, for
//!   `active_since`.
//! - `meta`: `latest`, `horizon` (oldest stored plan), `applied_changes`, `content_changes`
//!   (apply transactions that changed what is served), `control_changes`, `dns_zone`,
//!   `store_id`, `layout` (`meta.rs`, `layout.rs`); `pause`, `lease` (`control.rs`).
//! - `heartbeats`: enactor id → heartbeat envelope (`control.rs`).
//! - `contents`: endpoint name ++ 0 ++ generation (big-endian) → [`PlanEntry`] envelope: what
//!   each plan says of each endpoint, written at publish only for the endpoints the plan
//!   changes (its [`PlanChanges`]), so plan `g`'s content for a name is its newest entry at or
//!   below `g`. `contents_full`: generations whose whole content was written (the first plan,
//!   a change too large to record, a parent that could not be read): an entry older than such
//!   a generation is superseded by it, and a name the full plan does not serve is `Absent`.
//!   A whole content goes to `contents_chunks`, not `contents`: generation (big-endian) ++
//!   the first name of a run of `CONTENT_CHUNK_NAMES` names in byte order → [`ContentChunk`]
//!   envelope, so a plan of a million endpoints is a few thousand values, not a million keys.
//!   Plan `g`'s content for a name is then its newest `contents` entry at or below `g` if that
//!   is not older than the newest whole generation `f` at or below `g`, else what `f`'s chunk
//!   says (`Absent` when no chunk holds the name). A plan that is itself `f` is read from its
//!   chunks alone: a whole content has no `contents` entries.
//!   Applies are checked against these inside the writer lock, so no writer can switch an
//!   endpoint to records its plan does not hold. Cleanup removes the entries no stored plan
//!   can resolve to any more (`contents.rs`).
//!
//! Zones added beside the first one (`zones.rs`): one more set of the same trees, named
//! `zones:<tree>`, that every added zone shares, each key prefixed with its zone's origin
//! (`keyed.rs`), and the registry tree `managed_zones`; each zone has its own writer lock,
//! version and high-water mark.
//!
//! The plan trees are `plans.rs`'s. A store is opened, checked against its high-water mark and
//! recovered in `open.rs`: it must be of layout [`LAYOUT`] (a new store is marked with it); any
//! other is refused with a message naming both, as no release has written another. A write
//! that fails (a full disk) is `fault.rs`'s; cleanup is `cleanup.rs`'s.
//!
//! Concurrency: sled cannot scan inside a transaction, and cleanup must see every fence at
//! the moment it deletes, so one writer mutex serialises every operation; the writes of each
//! operation commit in one multi-tree sled transaction and are flushed before the mutex is
//! released. Readers take the same mutex, so they only ever see flushed state: nothing the
//! authority serves can be lost by a crash. sled locks its directory, so one process owns a
//! store and the mutex is the whole story. Large reads take only the bytes under the mutex
//! and decode them after it (a plan; the whole active state of `active_all` and of an
//! `active_since` that answers with everything): at 1,000,000 endpoints that decode is most
//! of a second, which no writer should wait for.
//!
//! Cleanup is logical first: moving `horizon` is the one atomic, durable step that deletes
//! plans; removing the bytes below it follows and is finished on the next open if a crash
//! interrupts it. The bytes kept start at the newest plan stored whole at or below the
//! horizon, which the plans above it are read from.

use super::high_water::{self, Found, HighWater};
use super::lease;
use super::{
    ActiveDelta, ActivePage, ActiveRecord, ActiveSnapshot, ActiveState, ApplyItem, ApplyOutcome, CleanupDecision, CleanupReport,
    DELTA_ENDPOINTS_MAX, HEARTBEATS_MAX, Heartbeat, HistoryMark, KeysPut, KeysRecord, Lease, PLAN_CHANGES_GAP_MAX, PauseState, PlanSays,
    Store, StoreError, StoreFault, StoreResult, StoreVersion, check_generation, content_changed, decide_cleanup, fence_step, plan_says,
};
use crate::changes::{PlanChanges, PlanEntry, decode_changes};
use crate::codec;
use crate::delta::{PlanDelta, PlanHead, apply_entries};
use crate::generation::Generation;
use crate::names::{DnsName, EndpointName};
use crate::plan::{ENDPOINTS_PER_PLAN_MAX, ValidationError};
use crate::plan::{Endpoint, PlanSummary, ValidatedPlan, validate_endpoint};
use crate::signing::Keyring;
use crate::store::rules::check_trusted;
use compact_str::CompactString;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;
use tokio::sync::watch;

mod active;
mod cleanup;
mod contents;
mod control;
mod fault;
mod keyed;
mod layout;
mod meta;
mod open;
mod plans;
#[cfg(test)]
mod tests;
mod zones;

// Each concern's file adds to `Inner` and uses the others' items through these.
use active::*;
use contents::*;
use fault::*;
use keyed::Keyed;
use layout::*;
use open::open_db;
use plans::*;
use zones::ZoneTrees;

pub use active::CHANGE_LOG_KEPT;

thread_local! {
    /// Set on a blocking thread that runs a whole future ([`off_runtime`]): the store's calls
    /// made there run inline instead of each on a blocking thread of its own.
    static OFF_RUNTIME: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `future` to its end on one of the runtime's blocking threads, where every call of a
/// `SledStore` runs inline rather than being handed to a blocking thread and back: for work
/// made of many small store calls in a row (an added zone's start makes six or more; ten
/// thousand zones at a restart spent a third of their time in the handoffs). Its awaits on
/// anything else (timers, sockets, other stores) are driven by the runtime as usual.
pub async fn off_runtime<T: Send + 'static>(future: impl std::future::Future<Output = T> + Send + 'static) -> StoreResult<T> {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        OFF_RUNTIME.with(|off| off.set(true));
        let out = runtime.block_on(future);
        OFF_RUNTIME.with(|off| off.set(false));
        out
    })
    .await
    .map_err(|err| StoreError::Unavailable(format!("store task did not finish: {err}")))
}

/// Runs `f` on a blocking thread, or inline on one already ([`off_runtime`]).
pub async fn on_blocking_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> StoreResult<T> {
    if OFF_RUNTIME.with(std::cell::Cell::get) {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(|err| StoreError::Unavailable(format!("store task did not finish: {err}")))
}
pub use fault::REOPEN_EVERY;
pub use open::{LAYOUT, OPEN_LOCK_WAIT, OnLoss};
pub use plans::CHECKPOINT_PLANS_MAX;

/// The embedded store: one DNS zone's plans, fences and control state. The handle `open`
/// returns is the store's first zone (the single zone of a store before zones were added);
/// [`SledStore::zone`] hands out the others (`zones.rs`). Clones share one database.
#[derive(Clone)]
pub struct SledStore {
    shared: Arc<Shared>,
}

/// One zone of the database, as this process holds it.
struct Shared {
    /// The zone's directory, which holds its high-water mark: the store's own for the first
    /// zone, `managed-zones/<origin>` in it for an added one.
    path: PathBuf,
    zone: ZoneTrees,
    /// The zone's trees in the open database; `None` while a reopen replaces it, so that the
    /// old database lets go of sled's lock.
    inner: RwLock<Option<Arc<Inner>>>,
    version: Arc<watch::Sender<StoreVersion>>,
    high_water: Arc<Mutex<HighWater>>,
    database: Arc<Database>,
}

/// What outlives one opening of the database: sled refuses every call after an I/O error
/// (a full disk), so the store reopens it (see [`Database::failed`]), every zone at once.
struct Database {
    path: PathBuf,
    fault: Mutex<Option<Fault>>,
    /// The added zones this process holds open, so that a reopen opens their trees again; its
    /// lock orders zone additions, removals and reopens.
    zones: Mutex<BTreeMap<DnsName, zones::OpenZone>>,
    /// The first zone, which a reopen opens and proves with a write first.
    first: Mutex<std::sync::Weak<Shared>>,
    /// What opening a zone behind its high-water mark does.
    on_loss: OnLoss,
    /// The registry writes of this process (the only one that opens the database), for
    /// `ManagedZones::registry_version`.
    registry_writes: std::sync::atomic::AtomicU64,
    /// How many zones the registry holds, live and removed: counted at open, then moved by each
    /// addition of a new zone (under `zones`), so an addition does not read the whole registry.
    registry_zones: std::sync::atomic::AtomicUsize,
    /// Most zones the registry holds ([`MANAGED_ZONES_MAX`](crate::store::zones::MANAGED_ZONES_MAX); lower in tests).
    registry_zones_max: std::sync::atomic::AtomicUsize,
    /// The keys trusted to author plans, for every zone (`set_keyring`); `None` trusts all.
    keyring: RwLock<Option<Arc<Keyring>>>,
}

/// A write that failed, until a reopen writes again.
struct Fault {
    shown: StoreFault,
    /// When it was last logged at ERROR.
    logged: std::time::Instant,
    /// A reopen thread is running.
    reopening: bool,
}

struct Inner {
    db: sled::Db,
    plans: Keyed,
    summaries: Keyed,
    /// Generation (big-endian) → that plan's changes against its parent.
    plan_changes: Keyed,
    /// Generation (big-endian) → the head of a plan published as its changes.
    plan_heads: Keyed,
    /// First name of a run → the run's active records (see the module docs).
    active_runs: Keyed,
    /// Generation → serving endpoints with that fence and a witness (see the module docs).
    fence_counts: Keyed,
    /// Applied-change count of a batch's last switch → the batch's names: the log
    /// `active_since` reads.
    changes: Keyed,
    meta: Keyed,
    heartbeats: Keyed,
    /// Endpoint name ++ 0 ++ generation → what that plan says of the endpoint (see the module
    /// docs).
    contents: Keyed,
    /// Generation → empty: plans whose whole content was written.
    contents_full: Keyed,
    /// Generation ++ first name → a run of a whole content (see the module docs).
    contents_chunks: Keyed,
    /// Serialises every operation; see the module docs.
    lock: Mutex<()>,
    /// Which zone's trees these are, and whether it was removed.
    zone: ZoneTrees,
    version: Arc<watch::Sender<StoreVersion>>,
    /// Written after each write that moves the version (see `high_water`).
    high_water: Arc<Mutex<HighWater>>,
    /// What lies after the newest plan stored whole; changed under `lock`.
    chain: Mutex<Chain>,
}

impl SledStore {
    /// Opens (or creates) the store in directory `path`; a store behind its high-water mark
    /// is refused (`OnLoss::Refuse`).
    pub fn open(path: impl AsRef<Path>) -> StoreResult<SledStore> {
        SledStore::open_with(path, OnLoss::Refuse)
    }

    /// Opens (or creates) the store in directory `path`, doing `on_loss` with a store behind
    /// its high-water mark.
    pub fn open_with(path: impl AsRef<Path>, on_loss: OnLoss) -> StoreResult<SledStore> {
        let path = path.as_ref();
        let (high_water, found) = HighWater::open(path).map_err(|err| {
            StoreError::Unavailable(format!(
                "cannot open the store's high-water mark {}: {err}",
                path.join(high_water::FILE_NAME).display()
            ))
        })?;
        let high_water = Arc::new(Mutex::new(high_water));
        let version = Arc::new(watch::Sender::new(StoreVersion::default()));
        let inner = Inner::open(path, version.clone(), high_water.clone(), Some((found, on_loss)))?;
        zones::migrate(&inner.db)?;
        zones::check_registry(&inner.db, path, on_loss)?;
        let registry_zones = zones::count_zones(&inner.db)?;
        let database = Arc::new(Database {
            path: path.to_path_buf(),
            fault: Mutex::new(None),
            zones: Mutex::new(BTreeMap::new()),
            first: Mutex::new(std::sync::Weak::new()),
            on_loss,
            // From a random start, so a client that saw a number before a restart never takes
            // the same number after one for an unchanged registry.
            registry_writes: std::sync::atomic::AtomicU64::new(crate::store::zones::random_id() >> 1),
            registry_zones: std::sync::atomic::AtomicUsize::new(registry_zones),
            registry_zones_max: std::sync::atomic::AtomicUsize::new(crate::store::zones::MANAGED_ZONES_MAX),
            keyring: RwLock::new(None),
        });
        let shared = Arc::new(Shared {
            path: path.to_path_buf(),
            zone: ZoneTrees::first(),
            inner: RwLock::new(Some(Arc::new(inner))),
            version,
            high_water,
            database,
        });
        *shared.database.first.lock().map_err(|_| poisoned())? = Arc::downgrade(&shared);
        Ok(SledStore { shared })
    }

    /// Trusts only plans `keyring` trusts, in every zone of the database, from now on (a
    /// publish of any other is `StoreError::Untrusted`); `None` trusts every plan. Plans
    /// published as their changes are then built and stored whole, as the signature is the
    /// whole plan's.
    pub fn set_keyring(&self, keyring: Option<Arc<Keyring>>) {
        *self.shared.database.keyring.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = keyring;
    }

    fn keyring(&self) -> Option<Arc<Keyring>> {
        self.shared.database.keyring.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    #[cfg(test)]
    fn inner(&self) -> Arc<Inner> {
        self.current().expect("the store is open")
    }

    /// The open database; while a failed write is not yet undone by a reopen, an error that
    /// says why (sled refuses every call after it anyway).
    fn current(&self) -> StoreResult<Arc<Inner>> {
        self.shared.zone.check_live()?;
        if let Some(fault) = self.fault() {
            return Err(StoreError::Unavailable(fault.to_string()));
        }
        let inner = self.shared.inner.read().map_err(|_| poisoned())?.clone();
        inner.ok_or_else(|| StoreError::Unavailable(format!("the store at {} is being reopened", self.shared.path.display())))
    }

    async fn blocking<T, F>(&self, f: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> StoreResult<T> + Send + 'static,
    {
        let inner = self.current()?;
        let database = self.shared.database.clone();
        on_blocking_thread(move || {
            let result = f(&inner);
            // A call that raced a removal of its zone finds the zone's trees dropped: the
            // removal, not a fault of the database.
            if let Err(StoreError::Io(_)) = &result {
                inner.zone.check_live()?;
            }
            drop(inner);
            if let Err(err @ StoreError::Io(_)) = &result {
                Database::failed(&database, &fault_text(err));
            }
            result
        })
        .await?
    }
}

impl Store for SledStore {
    async fn publish_changes(&self, delta: &PlanDelta, lease: Option<&Lease>) -> StoreResult<()> {
        delta.check()?;
        // A signature is the whole plan's: built whole, checked and stored whole with it.
        if delta.signature.is_some() || self.keyring().is_some() {
            return super::publish_changes_whole(self, delta, lease).await;
        }
        let (owned, lease_owned) = (delta.clone(), lease.cloned());
        match self.blocking(move |inner| inner.publish_changes(&owned, lease_owned.as_ref())).await? {
            None => super::publish_changes_whole(self, delta, lease).await,
            Some(checkpoint_due) => {
                if checkpoint_due {
                    self.spawn_checkpoint(delta.generation());
                }
                Ok(())
            }
        }
    }

    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        check_trusted(self.keyring().as_deref(), plan)?;
        let (changes, contents) = self.changes_for(plan).await?;
        let bytes = codec::encode_plan(plan);
        let summary = codec::encode(&plan.summary());
        let p = plan.plan();
        let (generation, parent, zone, is_operator) = (p.generation, p.parent_generation, p.dns_zone.clone(), p.author.is_operator());
        self.blocking(move |inner| inner.publish(generation, parent, &zone, is_operator, None, bytes, summary, changes, contents)).await
    }

    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        check_trusted(self.keyring().as_deref(), plan)?;
        let (changes, contents) = self.changes_for(plan).await?;
        let bytes = codec::encode_plan(plan);
        let summary = codec::encode(&plan.summary());
        let p = plan.plan();
        let (generation, parent, zone, is_operator) = (p.generation, p.parent_generation, p.dns_zone.clone(), p.author.is_operator());
        let lease = lease.clone();
        self.blocking(move |inner| inner.publish(generation, parent, &zone, is_operator, Some(&lease), bytes, summary, changes, contents))
            .await
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let holder = holder.to_owned();
        self.blocking(move |inner| inner.acquire_lease(&holder, ttl)).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        let lease = lease.clone();
        self.blocking(move |inner| inner.release_lease(&lease)).await
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        self.blocking(|inner| {
            let _guard = inner.guard()?;
            inner.read_lease()
        })
        .await
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        self.blocking(move |inner| inner.plan(generation)).await
    }

    async fn plan_changes_unchecked(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        self.blocking(move |inner| inner.plan_changes(from, to)).await
    }

    async fn latest(&self) -> StoreResult<Generation> {
        self.shared.zone.check_live()?;
        Ok(self.shared.version.borrow().latest)
    }

    async fn generation_base(&self) -> StoreResult<Generation> {
        self.blocking(|inner| inner.generation_base()).await
    }

    async fn dns_zone(&self) -> StoreResult<Option<DnsName>> {
        self.blocking(|inner| inner.dns_zone()).await
    }

    async fn history_mark(&self, applied: u64) -> StoreResult<Option<HistoryMark>> {
        self.blocking(move |inner| inner.history_mark(applied)).await
    }

    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.blocking(move |inner| inner.list(from, limit)).await
    }

    async fn plan_envelope(&self, generation: Generation) -> StoreResult<Vec<u8>> {
        self.blocking(move |inner| match inner.plan_bytes(generation)? {
            PlanBytes::Whole(bytes) => Ok(bytes.to_vec()),
            PlanBytes::Chain { .. } => Ok(codec::encode_plan(&inner.plan(generation)?)),
        })
        .await
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        let (name, state) = (endpoint.clone(), ActiveState::Serving(records.clone()));
        self.blocking(move |inner| inner.switch(&name, generation, state)).await
    }

    async fn apply_many_unchecked(&self, generation: Generation, items: &[ApplyItem]) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        let items: Vec<_> = items.iter().map(|i| (i.endpoint.clone(), ActiveState::Serving(i.records.clone()))).collect();
        self.blocking(move |inner| inner.switch_many(generation, items)).await
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        let name = endpoint.clone();
        self.blocking(move |inner| inner.switch(&name, generation, ActiveState::Retired)).await
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        let name = endpoint.clone();
        self.blocking(move |inner| {
            let _guard = inner.guard()?;
            inner.read_active(&name)
        })
        .await
    }

    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        self.blocking(|inner| inner.active_all()).await
    }

    async fn active_page_unchecked(&self, after: Option<EndpointName>, limit: usize) -> StoreResult<ActivePage> {
        self.blocking(move |inner| inner.active_page(after.as_ref(), limit)).await
    }

    async fn active_since(&self, since: u64) -> StoreResult<ActiveDelta> {
        self.blocking(move |inner| inner.active_since(since)).await
    }

    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        self.blocking(move |inner| inner.cleanup_preview(retain)).await
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        self.blocking(move |inner| inner.cleanup(retain)).await
    }

    async fn pause_unchecked(&self, state: PauseState) -> StoreResult<()> {
        self.blocking(move |inner| inner.set_pause(Some(state))).await
    }

    async fn resume(&self) -> StoreResult<()> {
        self.blocking(|inner| inner.set_pause(None)).await
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.blocking(|inner| {
            let _guard = inner.guard()?;
            inner.paused()
        })
        .await
    }

    async fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        self.blocking(move |inner| inner.heartbeat(heartbeat)).await
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.blocking(|inner| inner.heartbeats()).await
    }

    async fn dnssec_keys(&self) -> StoreResult<Option<KeysRecord>> {
        self.blocking(|inner| inner.dnssec_keys()).await
    }

    async fn put_dnssec_keys_unchecked(&self, expected: Option<u64>, bytes: Vec<u8>) -> StoreResult<KeysPut> {
        self.blocking(move |inner| inner.put_dnssec_keys(expected, &bytes)).await
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        self.shared.zone.check_live()?;
        Ok(*self.shared.version.borrow())
    }

    /// Set by a failed write, cleared once a reopened database has written again.
    fn fault(&self) -> Option<StoreFault> {
        self.shared.database.fault.lock().ok()?.as_ref().map(|f| f.shown.clone())
    }

    fn disk_free_bytes(&self) -> Option<u64> {
        fs2::available_space(&self.shared.database.path).ok()
    }

    async fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        let mut rx = self.shared.version.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            self.shared.zone.check_live()?;
            let current = *rx.borrow_and_update();
            if current != seen {
                return Ok(current);
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Err(_elapsed) => return Ok(current),
                // The sender lives as long as the store; a closed channel means it is gone.
                Ok(Err(_closed)) => return Err(StoreError::Unavailable("store closed".into())),
                Ok(Ok(())) => {}
            }
        }
    }
}
