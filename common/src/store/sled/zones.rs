//! The zones added beside the store's first one (see `store::zones`): each zone's part of the
//! shared trees `zones:<tree>` is its keys prefixed with its origin (`keyed.rs`), its high-water
//! mark is `managed-zones/<origin>/store-high-water` in the store's directory, and the registry
//! tree `managed_zones` (origin → [`ManagedZone`] envelope) says which are live.
//!
//! The fence of a removal: every operation of a zone takes the zone's writer lock, and
//! [`Inner::guard`] refuses once the zone's `removed` flag is set. `remove_zone` sets it under
//! that lock, then writes the tombstone: an operation that got the lock before the removal
//! finished before it; any after it is refused, and a process that restarts finds the
//! tombstone (sled locks its directory, so this process is the only writer).

use super::*;
use crate::store::zones::{ManagedZone, ManagedZones, ZoneState, check_added, random_id};
use std::sync::atomic::{AtomicBool, Ordering};

/// An added zone's master file, in its `meta`.
const META_MASTER: &[u8] = b"master";
/// The registry's tree.
const REGISTRY: &str = "managed_zones";
/// The directory, in the store's, of the added zones' high-water marks.
const ZONES_DIR: &str = "managed-zones";

/// An added zone this process opened: its handle's shared part, and its trees (alive as long as
/// a call runs on them, after the last handle went).
pub(super) struct OpenZone {
    shared: std::sync::Weak<Shared>,
    inner: std::sync::Weak<Inner>,
}

impl OpenZone {
    /// The zone's shared part, while a handle holds it.
    pub(super) fn shared(&self) -> Option<Arc<Shared>> {
        self.shared.upgrade()
    }
}

/// Fences the zone `open` holds: every later call of its handles is refused.
fn fence(open: &OpenZone) {
    if let Some(shared) = open.shared.upgrade() {
        shared.zone.removed.store(true, Ordering::Release);
    }
    if let Some(inner) = open.inner.upgrade() {
        inner.zone.removed.store(true, Ordering::Release);
    }
}

/// Which zone's trees an [`Inner`] holds, and whether that zone was removed.
#[derive(Clone)]
pub(super) struct ZoneTrees {
    /// The zone's key prefix in the shared trees ([`keyed::zone_prefix`]): empty for the first
    /// zone, whose trees are its own.
    key_prefix: Arc<[u8]>,
    /// `None` for the first zone.
    origin: Option<DnsName>,
    /// The added zone's incarnation (0 for the first zone).
    pub(super) incarnation: u64,
    removed: Arc<AtomicBool>,
}

impl ZoneTrees {
    pub(super) fn first() -> ZoneTrees {
        ZoneTrees { key_prefix: Arc::from(Vec::new()), origin: None, incarnation: 0, removed: Arc::new(AtomicBool::new(false)) }
    }

    fn added(origin: &DnsName, incarnation: u64) -> ZoneTrees {
        ZoneTrees {
            key_prefix: keyed::zone_prefix(origin.as_str()),
            origin: Some(origin.clone()),
            incarnation,
            removed: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The zone's part of tree `name` (one of the module docs' trees) in `db`.
    pub(super) fn tree(&self, db: &sled::Db, name: &str) -> StoreResult<Keyed> {
        Ok(match self.origin {
            None => Keyed::whole(db.open_tree(name).map_err(io)?),
            Some(_) => Keyed::part(db.open_tree(format!("{SHARED}{name}")).map_err(io)?, self.key_prefix.clone()),
        })
    }

    /// [`StoreError::ZoneGone`] once the zone was removed.
    pub(super) fn check_live(&self) -> StoreResult<()> {
        match (&self.origin, self.removed.load(Ordering::Acquire)) {
            (Some(zone), true) => Err(StoreError::ZoneGone { zone: zone.clone() }),
            _ => Ok(()),
        }
    }
}

/// The prefix of the names of the trees the added zones share.
const SHARED: &str = "zones:";

/// The trees of a zone (each holds a part of each added zone).
pub(super) const TREES: [&str; 12] = [
    "plans",
    "summaries",
    "plan_changes",
    "plan_heads",
    "active_runs",
    "fence_counts",
    "changes",
    "heartbeats",
    "contents",
    "contents_full",
    "contents_chunks",
    "meta",
];

/// The prefix of the names of an added zone's own trees, as builds before the shared trees
/// kept them (`zone:<origin>/<tree>`); [`migrate`] moves them into the shared trees.
const OWN_TREES: &str = "zone:";

/// Removes every key of added zone `origin` from the shared trees (`meta` last: a zone whose
/// `meta` holds its layout is whole).
fn clear_zone(db: &sled::Db, origin: &DnsName) -> StoreResult<()> {
    let trees = ZoneTrees::added(origin, 0);
    for name in TREES {
        trees.tree(db, name)?.clear().map_err(io)?;
    }
    Ok(())
}

/// Moves the zones an earlier build kept in trees of their own into the shared trees: for each,
/// what a move a crash interrupted left in the shared trees is removed, each own tree is copied
/// (`meta` last, in one batch: a zone whose shared `meta` holds its layout was copied whole),
/// flushed, and then the own trees are dropped. Run once at open, before any zone is opened;
/// a crash at any point leaves the zone whole in its own trees or in the shared ones.
pub(super) fn migrate(db: &sled::Db) -> StoreResult<usize> {
    let mut zones: BTreeMap<String, Vec<sled::IVec>> = BTreeMap::new();
    for name in db.tree_names() {
        let Some(rest) = name.strip_prefix(OWN_TREES.as_bytes()) else { continue };
        let Some(slash) = rest.iter().rposition(|&b| b == b'/') else { continue };
        let origin = String::from_utf8_lossy(&rest[..slash]).into_owned();
        zones.entry(origin).or_default().push(name);
    }
    let mut moved = 0;
    for (origin, own) in &zones {
        let origin_name = DnsName::parse(origin).map_err(|e| {
            corrupt(
                format!("the trees of added zone {origin:?}"),
                codec::CodecError::Body { kind: "zone name".into(), detail: e.to_string() },
            )
        })?;
        let trees = ZoneTrees::added(&origin_name, 0);
        let copied = trees.tree(db, "meta")?.contains_key(open::META_LAYOUT).map_err(io)?;
        if !copied {
            clear_zone(db, &origin_name)?;
            for name in TREES {
                let own_name = format!("{OWN_TREES}{origin}/{name}");
                if !own.iter().any(|n| n.as_ref() == own_name.as_bytes()) {
                    continue;
                }
                let from = db.open_tree(own_name).map_err(io)?;
                let to = trees.tree(db, name)?;
                let mut batch = to.batch();
                let mut n = 0usize;
                for item in from.iter() {
                    let (key, value) = item.map_err(io)?;
                    batch.insert(key, value);
                    n += 1;
                    // `meta` is a few keys, applied in one batch; the others go in parts.
                    if name != "meta" && n.is_multiple_of(65_536) {
                        to.apply_batch(std::mem::replace(&mut batch, to.batch())).map_err(io)?;
                    }
                }
                to.apply_batch(batch).map_err(io)?;
            }
            db.flush().map_err(io)?;
        }
        for name in own {
            db.drop_tree(name).map_err(io)?;
        }
        tracing::info!(zone = %origin, "moved an added zone's trees into the trees the added zones share");
        moved += 1;
    }
    Ok(moved)
}

fn registry(db: &sled::Db) -> StoreResult<sled::Tree> {
    db.open_tree(REGISTRY).map_err(io)
}

/// Checks the registry in `db` against the directories of the added zones' high-water marks
/// in `path` (`managed-zones/<origin>/`, made when a zone is first opened, after its entry was
/// written and flushed): a zone with a mark and no entry at all is a registry that went back
/// (sled drops a damaged page and what was written after it without an error), which would
/// stop every authority serving the zone. Refused, naming the zones, unless `on_loss` accepts
/// it: their directories are then removed (the zones can be added again). The directory of a
/// removed zone (a crash between its tombstone and the directory's removal) is removed.
pub(super) fn check_registry(db: &sled::Db, path: &Path, on_loss: OnLoss) -> StoreResult<()> {
    let dir = path.join(ZONES_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => return Err(io(err)),
    };
    let registry = registry(db)?;
    let mut lost = Vec::new();
    for entry in entries {
        let zone_dir = entry.map_err(io)?.path();
        if !zone_dir.join(high_water::FILE_NAME).exists() {
            continue;
        }
        let name = zone_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        match registry.get(name.as_bytes()).map_err(io)? {
            Some(bytes) if codec::decode::<ManagedZone>(&bytes).is_ok_and(|z| z.is_live()) => {}
            Some(_) => std::fs::remove_dir_all(&zone_dir).map_err(io)?,
            None => lost.push((name, zone_dir)),
        }
    }
    if lost.is_empty() {
        return Ok(());
    }
    let names: Vec<&str> = lost.iter().map(|(name, _)| name.as_str()).collect();
    if on_loss == OnLoss::Refuse {
        return Err(StoreError::WentBack(format!(
            "the store in {} went back: its registry of zones lost {} (each has a high-water mark in {}, so it was added              and served). sled drops a damaged page and everything written after it without an error; opened as it is,              no authority would serve those zones. Ways out: restore a copy of the whole directory {} taken from this              store, or start once with --accept-store-loss, which keeps what is left (add the zones again after)",
            path.display(),
            names.join(", "),
            dir.display(),
            path.display(),
        )));
    }
    tracing::warn!(path = %path.display(), zones = %names.join(", "), "--accept-store-loss: the registry of zones lost these zones; add them again");
    for (name, zone_dir) in lost {
        // A tombstone past every count the zone served (its meta's, if left, and its mark's),
        // so that a zone added again starts its SOA serial past what secondaries hold.
        let origin = DnsName::parse(&name).map_err(|e| StoreError::BadRequest(format!("{}: {e}", zone_dir.display())))?;
        let meta = ZoneTrees::added(&origin, 0).tree(db, "meta")?;
        let count = |key: &[u8]| -> StoreResult<u64> {
            Ok(meta.get(key).map_err(io)?.and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok()).map_or(0, u64::from_be_bytes))
        };
        let (marked, marked_latest) = match HighWater::open(&zone_dir).map_err(io)?.1 {
            Found::Mark(mark) => (mark.applied_changes.saturating_add(1), mark.latest.0),
            Found::None | Found::Torn => (0, 0),
        };
        let (applied_changes, content_changes) = (count(META_APPLIED)?.max(marked), count(META_CONTENT)?.max(marked));
        let latest_generation = count(META_LATEST)?.max(count(META_GENERATION_BASE)?).max(marked_latest);
        let state = ZoneState::Removed { removed_unix_ms: lease::now_unix_ms(), applied_changes, content_changes, latest_generation };
        registry.insert(origin.as_str(), codec::encode(&ManagedZone { origin: origin.clone(), state })).map_err(io)?;
        db.flush().map_err(io)?;
        std::fs::remove_dir_all(&zone_dir).map_err(io)?;
    }
    Ok(())
}

/// How many zones the registry in `db` holds, live and removed.
pub(super) fn count_zones(db: &sled::Db) -> StoreResult<usize> {
    Ok(registry(db)?.len())
}

fn read_entry(registry: &sled::Tree, origin: &DnsName) -> StoreResult<Option<ManagedZone>> {
    registry
        .get(origin.as_str())
        .map_err(io)?
        .map(|bytes| codec::decode::<ManagedZone>(&bytes).map_err(|e| corrupt(format!("registry entry of zone {origin}"), e)))
        .transpose()
}

impl SledStore {
    /// Lowers the most zones the registry holds (tests of the limit).
    #[cfg(test)]
    pub(crate) fn set_registry_zones_max(&self, max: usize) {
        self.shared.database.registry_zones_max.store(max, Ordering::Relaxed);
    }

    /// The directory of added zone `origin`, which holds its high-water mark.
    fn zone_dir(&self, origin: &DnsName) -> PathBuf {
        self.shared.database.path.join(ZONES_DIR).join(origin.as_str())
    }

    /// The open database, through this handle's zone (the first zone's when this one is gone).
    fn db(&self) -> StoreResult<sled::Db> {
        let first = self.shared.database.first.lock().map_err(|_| poisoned())?.upgrade();
        let shared = first.unwrap_or_else(|| self.shared.clone());
        let inner = shared.inner.read().map_err(|_| poisoned())?.clone();
        inner.map(|inner| inner.db.clone()).ok_or_else(|| StoreError::Unavailable("the store is being reopened".into()))
    }

    /// The handle of live zone `origin`, opened if this process has not yet; `zones` is the
    /// database's lock of zone changes, held.
    fn open_zone(&self, zones: &mut BTreeMap<DnsName, OpenZone>, origin: &DnsName) -> StoreResult<SledStore> {
        if let Some(open) = zones.get(origin) {
            if let Some(shared) = open.shared.upgrade() {
                return Ok(SledStore { shared });
            }
            // Every handle was dropped, but a call still runs on the zone's trees: the new
            // handle takes the same `Inner`, so the zone keeps one writer lock.
            if let Some(inner) = open.inner.upgrade() {
                let shared = Arc::new(Shared {
                    path: self.zone_dir(origin),
                    zone: inner.zone.clone(),
                    version: inner.version.clone(),
                    high_water: inner.high_water.clone(),
                    inner: RwLock::new(Some(inner.clone())),
                    database: self.shared.database.clone(),
                });
                zones.insert(origin.clone(), OpenZone { shared: Arc::downgrade(&shared), inner: Arc::downgrade(&inner) });
                return Ok(SledStore { shared });
            }
        }
        let db = self.db()?;
        let Some(incarnation) = read_entry(&registry(&db)?, origin)?.and_then(|entry| entry.incarnation()) else {
            return Err(StoreError::ZoneGone { zone: origin.clone() });
        };
        let dir = self.zone_dir(origin);
        std::fs::create_dir_all(&dir).map_err(io)?;
        let (high_water, found) = HighWater::open(&dir).map_err(|err| {
            StoreError::Unavailable(format!(
                "cannot open zone {origin}'s high-water mark {}: {err}",
                dir.join(high_water::FILE_NAME).display()
            ))
        })?;
        let (high_water, version) = (Arc::new(Mutex::new(high_water)), Arc::new(watch::Sender::new(StoreVersion::default())));
        let trees = ZoneTrees::added(origin, incarnation);
        let on_loss = self.shared.database.on_loss;
        let inner = Arc::new(Inner::from_db(db, &trees, &dir, version.clone(), high_water.clone(), Some((found, on_loss)))?);
        let weak_inner = Arc::downgrade(&inner);
        let shared = Arc::new(Shared {
            path: dir,
            zone: trees,
            inner: RwLock::new(Some(inner)),
            version,
            high_water,
            database: self.shared.database.clone(),
        });
        zones.insert(origin.clone(), OpenZone { shared: Arc::downgrade(&shared), inner: weak_inner });
        Ok(SledStore { shared })
    }

    fn zone_sync(&self, origin: &DnsName) -> StoreResult<SledStore> {
        let mut zones = self.shared.database.zones.lock().map_err(|_| poisoned())?;
        self.open_zone(&mut zones, origin)
    }

    fn add_zone_sync(&self, origin: &DnsName, master: &str) -> StoreResult<bool> {
        let mut zones = self.shared.database.zones.lock().map_err(|_| poisoned())?;
        let db = self.db()?;
        let first = {
            let first = self.shared.database.first.lock().map_err(|_| poisoned())?.upgrade();
            let inner = first.and_then(|shared| shared.inner.read().ok().and_then(|inner| inner.clone()));
            inner.map(|inner| inner.dns_zone()).transpose()?.flatten()
        };
        check_added(origin, first.as_ref(), master)?;
        let registry = registry(&db)?;
        let old = read_entry(&registry, origin)?;
        if old.as_ref().is_some_and(ManagedZone::is_live) {
            return Ok(false);
        }
        let max = self.shared.database.registry_zones_max.load(Ordering::Relaxed);
        if old.is_none() && self.shared.database.registry_zones.load(Ordering::Relaxed) >= max {
            return Err(StoreError::BadRequest(format!("the store's registry holds {max} zones, live and removed; no more are added")));
        }
        // A handle of an earlier incarnation this process still holds (a removal whose
        // tombstone was written but not confirmed) is fenced before its trees go.
        if let Some(open) = zones.remove(origin) {
            fence(&open);
        }
        // What an earlier incarnation (or an addition a crash interrupted) left: its trees
        // and its high-water mark, which names another store id.
        self.drop_trees(&db, origin)?;
        let dir = self.zone_dir(origin);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io(err)),
        }
        // The zone's meta before its registry entry: a crash between the two leaves trees no
        // entry names, which the next addition drops.
        let restart = old.as_ref().map(ManagedZone::restart).unwrap_or_default();
        let meta = ZoneTrees::added(origin, 0).tree(&db, "meta")?;
        let mut batch = meta.batch();
        batch.insert(open::META_LAYOUT, &open::LAYOUT.to_be_bytes());
        batch.insert(META_DNS_ZONE, origin.as_str().as_bytes());
        batch.insert(META_APPLIED, &restart.applied_changes.to_be_bytes());
        batch.insert(META_CONTENT, &restart.content_changes.to_be_bytes());
        if !restart.generation_base.is_none() {
            let first = restart.generation_base.next().ok_or(StoreError::Exhausted(restart.generation_base))?;
            batch.insert(META_GENERATION_BASE, &restart.generation_base.to_be_bytes());
            batch.insert(META_HORIZON, &first.to_be_bytes());
        }
        batch.insert(META_MASTER, master.as_bytes());
        // Its store id now, flushed with the rest: the zone's first open then writes nothing.
        batch.insert(META_STORE_ID, &random_id().to_be_bytes());
        meta.apply_batch(batch).map_err(io)?;
        let entry = ManagedZone {
            origin: origin.clone(),
            state: ZoneState::Live { added_unix_ms: lease::now_unix_ms(), incarnation: random_id() },
        };
        registry.insert(origin.as_str(), codec::encode(&entry)).map_err(io)?;
        self.shared.database.registry_writes.fetch_add(1, Ordering::Release);
        if old.is_none() {
            self.shared.database.registry_zones.fetch_add(1, Ordering::Relaxed);
        }
        db.flush().map_err(io)?;
        Ok(true)
    }

    fn remove_zone_sync(&self, origin: &DnsName) -> StoreResult<bool> {
        let mut zones = self.shared.database.zones.lock().map_err(|_| poisoned())?;
        let handle = match self.open_zone(&mut zones, origin) {
            Ok(handle) => handle,
            Err(StoreError::ZoneGone { .. }) => return Ok(false),
            Err(err) => return Err(err),
        };
        let inner = handle.current()?;
        let db = inner.db.clone();
        {
            let _guard = inner.guard()?;
            let (applied_changes, content_changes) = inner.counts()?;
            let latest_generation = inner.latest()?.max(inner.generation_base()?).0;
            // Fenced first, under the writer lock: a removal that fails after this leaves the
            // zone refusing this process's writes until it is opened again, never a write after
            // a tombstone that did reach the disk.
            handle.shared.zone.removed.store(true, Ordering::Release);
            zones.remove(origin);
            let state = ZoneState::Removed { removed_unix_ms: lease::now_unix_ms(), applied_changes, content_changes, latest_generation };
            let entry = ManagedZone { origin: origin.clone(), state };
            registry(&db)?.insert(origin.as_str(), codec::encode(&entry)).map_err(io)?;
            self.shared.database.registry_writes.fetch_add(1, Ordering::Release);
            db.flush().map_err(io)?;
        }
        // Waiters on the zone's changes wake, and find it gone.
        handle.shared.version.send_modify(|_| {});
        drop(handle.shared.inner.write().map_err(|_| poisoned())?.take());
        drop(inner);
        self.drop_trees(&db, origin)?;
        match std::fs::remove_dir_all(self.zone_dir(origin)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                tracing::warn!(zone = %origin, error = %err, "could not remove the removed zone's directory; the next addition does")
            }
        }
        Ok(true)
    }

    /// Removes every key of zone `origin` from the shared trees.
    fn drop_trees(&self, db: &sled::Db, origin: &DnsName) -> StoreResult<()> {
        clear_zone(db, origin)
    }

    fn zones_sync(&self) -> StoreResult<Vec<ManagedZone>> {
        let registry = registry(&self.db()?)?;
        registry
            .iter()
            .map(|item| {
                let (key, bytes) = item.map_err(io)?;
                codec::decode::<ManagedZone>(&bytes).map_err(|e| corrupt(format!("registry entry {}", String::from_utf8_lossy(&key)), e))
            })
            .collect()
    }

    async fn zone_call<T: Send + 'static>(&self, f: impl FnOnce(&SledStore) -> StoreResult<T> + Send + 'static) -> StoreResult<T> {
        let store = self.clone();
        let result = super::on_blocking_thread(move || f(&store)).await?;
        // sled refuses every call after an I/O error until the database is opened again.
        if let Err(err @ StoreError::Io(_)) = &result {
            Database::failed(&self.shared.database, &fault_text(err));
        }
        result
    }
}

impl ManagedZones for SledStore {
    async fn zone(&self, origin: &DnsName) -> StoreResult<SledStore> {
        let origin = origin.clone();
        self.zone_call(move |store| store.zone_sync(&origin)).await
    }

    async fn add_zone(&self, origin: &DnsName, master: &str) -> StoreResult<bool> {
        let (origin, master) = (origin.clone(), master.to_owned());
        self.zone_call(move |store| store.add_zone_sync(&origin, &master)).await
    }

    async fn zone_master(&self, origin: &DnsName) -> StoreResult<String> {
        let zone = self.zone(origin).await?;
        zone.blocking(|inner| {
            let _guard = inner.guard()?;
            let bytes = inner.meta.get(META_MASTER).map_err(io)?.unwrap_or_default();
            String::from_utf8(bytes.to_vec())
                .map_err(|e| corrupt("an added zone's master file", codec::CodecError::Body { kind: "text".into(), detail: e.to_string() }))
        })
        .await
    }

    async fn remove_zone(&self, origin: &DnsName) -> StoreResult<bool> {
        let origin = origin.clone();
        self.zone_call(move |store| store.remove_zone_sync(&origin)).await
    }

    async fn zones(&self) -> StoreResult<Vec<ManagedZone>> {
        self.zone_call(SledStore::zones_sync).await
    }

    /// The registry writes of this process: only this process opens the database.
    async fn registry_version(&self) -> StoreResult<u64> {
        Ok(self.shared.database.registry_writes.load(Ordering::Acquire))
    }

    fn incarnation(&self) -> Option<u64> {
        self.shared.zone.origin.as_ref().map(|_| self.shared.zone.incarnation)
    }
}
