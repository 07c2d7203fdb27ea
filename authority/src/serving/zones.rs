//! The other DNS zones one authority serves beside the zone its store manages: static zones
//! (a master file each, as NSD and Knot serve them), from the config file's `[[zones]]` or
//! added at run time through the control API (`PUT /v1/zones/{origin}`, kept on disk in
//! `data_dir/zones/` so a restart serves them again).
//!
//! Each zone is a `Serving` of its own (snapshot, serial, transfers), so answers, AXFR and
//! IXFR of one never mix with another's. A query goes to the zone whose origin is the longest
//! suffix of its name (`pick`: one hash lookup per label); the zone the store manages stops
//! the walk, so a static parent zone never answers for it; a name in none of them goes to
//! the managed zone, which refuses it. With no other zone, `pick` is one atomic load.
//!
//! The table is swapped whole (`ArcSwap`) when a zone is added, replaced or removed: a query
//! sees the table before or after, never half of it. A replacement must carry a newer SOA
//! serial (RFC 1982) than the one served, so no secondary is asked to go backwards.

use crate::metrics::Metrics;
use crate::query::answer::AnswerLimits;
use crate::serving::Serving;
use crate::serving::policy::TransferPolicy;
use crate::serving::zone_image::{self, ZoneImage};
use crate::zone::dns_zone::{DnsZoneConfig, StaticZone};
use crate::zone::serial::serial_newer;
use crate::zone::snapshot::{NAME_WIRE_BYTES_MAX, wire_key};
use anyhow::Context;
use arc_swap::ArcSwap;
use hickory_proto::rr::Name;
/// The table's map: keys are names a client chose, so the hasher is seeded at random.
type Table = std::collections::HashMap<Box<[u8]>, Arc<OtherZone>, foldhash::fast::RandomState>;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// The directory in `data_dir` that holds the zones added at run time, a master file each.
pub const DIR_NAME: &str = "zones";

/// Where a zone came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The config file's `[[zones]]`: changed by editing it.
    Config,
    /// Added at run time, kept in `data_dir/zones/`.
    Added,
    /// A zone the store manages beside its first one: plans change its endpoints
    /// (`follow::added`).
    Managed,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::Added => "added",
            Source::Managed => "managed",
        }
    }
}

/// One other zone as `list` tells it.
pub struct Listed {
    pub origin: Name,
    pub serial: u32,
    /// Names with records.
    pub names: usize,
    pub source: Source,
    /// Queries it answered since the process started (or since it was added).
    pub queries: u64,
}

/// One other zone as served.
pub struct OtherZone {
    pub serving: Arc<Serving>,
    pub source: Source,
}

/// Why a zone change was refused.
#[derive(Debug, thiserror::Error)]
pub enum ZoneChangeError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error("no zone {0} is served")]
    Missing(String),
    #[error("cannot keep zone {origin} on disk at {path}: {source}")]
    Io {
        origin: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Tells the added zones' task (`added::AddedZones`) that this authority's control API added
/// or removed a zone: it wakes at once, and starts a zone named as added before it reads the
/// whole registry (a zone is then served in the time its own start takes, whatever the number
/// of zones).
#[derive(Default)]
pub struct ZoneChanges {
    notify: tokio::sync::Notify,
    added: Mutex<Vec<dnsplan_common::DnsName>>,
}

impl ZoneChanges {
    /// Most zones named as added and not yet taken; more are found by the registry's read.
    const ADDED_MAX: usize = 1024;

    /// A zone was removed (or a change the registry's read finds): wakes the task.
    pub fn changed(&self) {
        self.notify.notify_one();
    }

    /// Zone `origin` was added to the store: wakes the task, naming it.
    pub fn added(&self, origin: dnsplan_common::DnsName) {
        if let Ok(mut added) = self.added.lock()
            && added.len() < Self::ADDED_MAX
        {
            added.push(origin);
        }
        self.notify.notify_one();
    }

    /// Waits until told, or `at_most`.
    pub async fn wait(&self, at_most: std::time::Duration) {
        let _ = tokio::time::timeout(at_most, self.notify.notified()).await;
    }

    /// The zones named as added since the last call.
    pub fn take_added(&self) -> Vec<dnsplan_common::DnsName> {
        self.added.lock().map(|mut added| std::mem::take(&mut *added)).unwrap_or_default()
    }
}

/// Every zone but the managed one, by the lower-case wire form of its origin.
pub struct ZoneTable {
    managed_key: Box<[u8]>,
    managed_origin: Name,
    zones: ArcSwap<Table>,
    /// What a new zone's `Serving` is made with.
    limits: AnswerLimits,
    metrics: Arc<Metrics>,
    transfer: Arc<TransferPolicy>,
    /// Where added zones are kept; `None`: not kept (tests of the table alone).
    dir: Option<PathBuf>,
    /// Changes one at a time (the check of a replacement's serial and the swap).
    writer: Mutex<()>,
    /// `[added_zones.dnssec]`: signs each zone added at run time (`AddedZonesDnssec::sign`).
    signer: Option<Signer>,
}

/// Signs a zone added at run time (blocking: its key directory is read, or made).
pub type Signer = Arc<dyn Fn(&mut StaticZone) -> anyhow::Result<()> + Send + Sync>;

impl ZoneTable {
    /// A table with no other zone, beside the managed zone `managed`.
    pub fn new(
        managed: &Name,
        limits: AnswerLimits,
        metrics: Arc<Metrics>,
        transfer: Arc<TransferPolicy>,
        dir: Option<PathBuf>,
    ) -> ZoneTable {
        ZoneTable {
            managed_key: wire_key(managed).into(),
            managed_origin: managed.clone(),
            zones: ArcSwap::from_pointee(Table::default()),
            limits,
            metrics,
            transfer,
            dir,
            writer: Mutex::new(()),
            signer: None,
        }
    }

    /// This table, signing each zone added at run time with `signer`.
    pub fn with_signer(mut self, signer: Option<Signer>) -> ZoneTable {
        self.signer = signer;
        self
    }

    /// `load_text`, then signed when the zones added at run time are.
    fn load_added_text(&self, origin: &str, text: &str) -> Result<StaticZone, ZoneChangeError> {
        let mut zone = load_text(origin, text)?;
        if let Some(sign) = &self.signer {
            sign(&mut zone).map_err(|e| ZoneChangeError::Invalid(format!("{e:#}")))?;
        }
        Ok(zone)
    }

    /// A table without other zones and nowhere to keep them, for tests.
    #[cfg(test)]
    fn empty(managed: &Name) -> ZoneTable {
        ZoneTable::new(managed, AnswerLimits::default(), Arc::new(Metrics::new()), Arc::new(TransferPolicy::closed()), None)
    }

    /// The zone that answers `packet`'s question, when it is not the managed zone; `None`
    /// for the managed zone, for a name in no zone, and for a packet whose question does not
    /// read (the managed zone's path answers those as it always has).
    pub fn pick(&self, packet: &[u8]) -> Option<Arc<Serving>> {
        let zones = self.zones.load();
        if zones.is_empty() {
            return None;
        }
        let mut key = [0u8; NAME_WIRE_BYTES_MAX];
        let len = question_key(packet, &mut key)?;
        let key = &key[..len];
        let mut at = 0;
        loop {
            let suffix = &key[at..];
            if suffix == &self.managed_key[..] {
                return None;
            }
            if let Some(zone) = zones.get(suffix) {
                return Some(zone.serving.clone());
            }
            if key[at] == 0 {
                return None;
            }
            at += usize::from(key[at]) + 1;
        }
    }

    /// Every other zone, by origin.
    pub fn list(&self) -> Vec<Listed> {
        let mut all: Vec<Listed> = self
            .zones
            .load()
            .values()
            .map(|z| {
                let snapshot = z.serving.snapshot.load();
                Listed {
                    origin: snapshot.zone.origin.clone(),
                    serial: snapshot.serial,
                    names: snapshot.entries().filter(|e| e.has_data()).count(),
                    source: z.source,
                    queries: z.serving.answered.load(std::sync::atomic::Ordering::Relaxed),
                }
            })
            .collect();
        all.sort_by(|a, b| a.origin.cmp(&b.origin));
        all
    }

    /// How many static zones come from the config file, and how many were added at run time.
    /// The signed static zones (`[[zones]]` with a `[zones.dnssec]` table).
    /// (A signed zone the store manages is signed again by its follower.)
    pub fn signed(&self) -> Vec<Arc<Serving>> {
        self.zones
            .load()
            .values()
            .filter(|z| z.serving.zone.signer.is_some() && z.source != Source::Managed)
            .map(|z| z.serving.clone())
            .collect()
    }

    /// The signed zones the store manages beside its first (`[added_zones.dnssec]`), signed
    /// again by their followers: for the earliest expiry.
    pub fn signed_managed(&self) -> Vec<Arc<Serving>> {
        self.zones
            .load()
            .values()
            .filter(|z| z.serving.zone.signer.is_some() && z.source == Source::Managed)
            .map(|z| z.serving.clone())
            .collect()
    }

    /// Whether any static zone is signed.
    pub fn has_signed(&self) -> bool {
        self.zones.load().values().any(|z| z.serving.zone.signer.is_some() && z.source != Source::Managed)
    }

    pub fn counts(&self) -> (usize, usize) {
        let zones = self.zones.load();
        let count = |source| zones.values().filter(|z| z.source == source).count();
        (count(Source::Config), count(Source::Added))
    }

    /// Serves `serving`, a zone the store manages beside its first one, in place of an
    /// earlier incarnation of it. Refused when a static zone has its origin.
    pub fn put_managed(&self, serving: Arc<Serving>) -> Result<(), ZoneChangeError> {
        self.put_managed_many(std::slice::from_ref(&serving)).pop().unwrap_or(Ok(()))
    }

    /// Serves every zone of `servings` as `put_managed` does, in one new table: a table copied
    /// for each zone made a start of n zones cost n² entries (10,000 zones: most of a restart).
    /// Each zone's result, in order.
    pub fn put_managed_many(&self, servings: &[Arc<Serving>]) -> Vec<Result<(), ZoneChangeError>> {
        let _writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut next = (*self.zones.load_full()).clone();
        let results = servings
            .iter()
            .map(|serving| {
                let origin = serving.zone.origin.clone();
                if origin == self.managed_origin {
                    return Err(ZoneChangeError::Conflict(format!("zone {origin} is the store's first zone ([dns_zone])")));
                }
                let key: Box<[u8]> = wire_key(&origin).into();
                if let Some(old) = next.get(&key)
                    && old.source != Source::Managed
                {
                    return Err(ZoneChangeError::Conflict(format!(
                        "zone {origin} is served as a static zone ({}); remove it before the store manages it",
                        old.source.as_str()
                    )));
                }
                next.insert(key, Arc::new(OtherZone { serving: serving.clone(), source: Source::Managed }));
                Ok(())
            })
            .collect();
        self.zones.store(Arc::new(next));
        results
    }

    /// Stops serving managed zone `origin`; `false` when it was not served as one.
    pub fn remove_managed(&self, origin: &Name) -> bool {
        let key: Box<[u8]> = wire_key(&origin.to_lowercase()).into();
        let _writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let zones = self.zones.load_full();
        if !zones.get(&key).is_some_and(|z| z.source == Source::Managed) {
            return false;
        }
        let mut next = (*zones).clone();
        next.remove(&key);
        self.zones.store(Arc::new(next));
        true
    }

    /// Whether `origin` is served as a static zone (from the config file or added).
    pub fn is_static(&self, origin: &Name) -> bool {
        self.zones.load().get(&wire_key(&origin.to_lowercase())[..]).is_some_and(|z| z.source != Source::Managed)
    }

    pub fn len(&self) -> usize {
        self.zones.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.zones.load().is_empty()
    }

    /// The zone `origin` serves, if it is one of these.
    pub fn get(&self, origin: &Name) -> Option<Arc<Serving>> {
        self.zones.load().get(&wire_key(&origin.to_lowercase())[..]).map(|z| z.serving.clone())
    }

    /// Adds the zones of the config file's `[[zones]]`, loaded on every core (`config_dir`
    /// resolves relative master files): an origin twice, or the managed one, is refused. For
    /// the start, before anything is served.
    ///
    /// A zone whose config table, master file and binary are those of the last start is read
    /// from the zones' image (`zone_image`) instead of parsed; the image is written again when
    /// any zone was parsed. Returns how many came from the image.
    pub fn add_configured(&self, configs: &[DnsZoneConfig], config_dir: &Path) -> anyhow::Result<usize> {
        let image_path = self.dir.as_ref().map(|dir| zone_image::path_in(dir));
        let image = image_path.as_deref().map(ZoneImage::read).unwrap_or_default();
        let from_image = std::sync::atomic::AtomicUsize::new(0);
        let loaded = load_parallel(configs, |config| -> anyhow::Result<(u64, StaticZone)> {
            let fingerprint = zone_image::fingerprint(config, config_dir).unwrap_or(0);
            // A signed zone is parsed at each start, its key read: the image keeps records,
            // never keys.
            if config.dnssec.is_none()
                && let Some(zone) = image.zone(config, fingerprint)
            {
                from_image.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                return Ok((fingerprint, zone));
            }
            Ok((fingerprint, StaticZone::load(config, config_dir).with_context(|| format!("zone {}", config.origin))?))
        })?;
        drop(image);
        // The image is written again only when an unsigned zone was parsed (a first start, a
        // changed file or binary), here, before the zones are served: encoded a zone at a
        // time, never a second copy of them all.
        let read_back = from_image.into_inner();
        let unsigned = loaded.iter().filter(|(_, zone)| zone.signer.is_none()).count();
        if let Some(path) = image_path.filter(|_| read_back < unsigned) {
            let zones: Vec<(u64, &StaticZone)> = loaded.iter().filter(|(_, z)| z.signer.is_none()).map(|(f, z)| (*f, z)).collect();
            if let Some(dir) = path.parent()
                && let Err(err) = std::fs::create_dir_all(dir).and_then(|()| ZoneImage::write(&path, &zones, true))
            {
                tracing::warn!(path = %path.display(), error = %err, "cannot write the zones' image; the next start parses every master file");
            }
        }
        self.insert_new(loaded.into_iter().map(|(_, zone)| (zone, Source::Config)).collect())?;
        Ok(read_back)
    }

    /// Adds or replaces the zone `origin` from master-file `text` (its SOA and apex NS in it),
    /// kept on disk first. A replacement must carry a newer serial; a zone of the config file,
    /// or the managed zone, cannot be replaced this way. Returns the serial served.
    pub fn add_text(&self, origin: &str, text: &str) -> Result<u32, ZoneChangeError> {
        let zone = self.load_added_text(origin, text)?;
        let path = self.dir.as_ref().map(|dir| dir.join(file_name(&zone.origin)));
        self.put(zone, Source::Added, path.as_deref().map(|p| (p, text)))
    }

    /// Removes the zone `origin`, added at run time, and its file.
    pub fn remove(&self, origin: &str) -> Result<(), ZoneChangeError> {
        let name = parse_origin(origin)?;
        let key: Box<[u8]> = wire_key(&name).into();
        let _writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let zones = self.zones.load_full();
        let Some(zone) = zones.get(&key) else { return Err(ZoneChangeError::Missing(name.to_string())) };
        if zone.source == Source::Config {
            return Err(ZoneChangeError::Conflict(format!(
                "zone {name} is defined in the config file ([[zones]]); remove it there and restart"
            )));
        }
        if zone.source == Source::Managed {
            return Err(ZoneChangeError::Conflict(format!(
                "zone {name} is managed by the store; remove it with `dnsplan zone remove --managed {name}`"
            )));
        }
        if let Some(dir) = &self.dir {
            // The fence first: if the removal of the file fails after it, the zone is still
            // served and its next add must only be newer.
            let served = zone.serving.snapshot.load().serial;
            let tombstone = dir.join(tombstone_name(&name));
            write_atomic(&tombstone, &format!("{served}\n")).map_err(|source| ZoneChangeError::Io {
                origin: name.to_string(),
                path: tombstone.clone(),
                source,
            })?;
            let path = dir.join(file_name(&name));
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(ZoneChangeError::Io { origin: name.to_string(), path, source }),
            }
        }
        let mut next = (*zones).clone();
        next.remove(&key);
        self.zones.store(Arc::new(next));
        tracing::info!(target: crate::serving::AUDIT_TARGET, action = "zone_remove", origin = %name, "zone removed");
        Ok(())
    }

    /// Reads back the zones added at run time (every `*.zone` file in the directory).
    pub fn load_added(&self) -> Result<usize, ZoneChangeError> {
        let Some(dir) = &self.dir else { return Ok(0) };
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(source) => return Err(ZoneChangeError::Io { origin: "(all)".into(), path: dir.clone(), source }),
        };
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| ZoneChangeError::Io { origin: "(all)".into(), path: dir.clone(), source })?;
            let path = entry.path();
            let Some(origin) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix("zone")) else { continue };
            files.push((origin.to_string(), path.clone()));
        }
        let loaded = load_parallel(&files, |(origin, path)| {
            let text = std::fs::read_to_string(path).map_err(|source| ZoneChangeError::Io {
                origin: origin.clone(),
                path: path.clone(),
                source,
            })?;
            self.load_added_text(origin, &text)
                .map_err(|e| ZoneChangeError::Invalid(format!("{}: {e} (fix or remove the file)", path.display())))
        })?;
        let count = loaded.len();
        self.insert_new(loaded.into_iter().map(|zone| (zone, Source::Added)).collect())?;
        Ok(count)
    }

    /// Inserts zones none of which is served yet (the start), into one new table.
    fn insert_new(&self, zones: Vec<(StaticZone, Source)>) -> Result<(), ZoneChangeError> {
        let _writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut next = (*self.zones.load_full()).clone();
        next.reserve(zones.len());
        for (zone, source) in zones {
            let origin = zone.origin.clone();
            if origin == self.managed_origin {
                return Err(ZoneChangeError::Conflict(format!(
                    "zone {origin} is the zone the store manages ([dns_zone]); it cannot also be a static zone"
                )));
            }
            let key: Box<[u8]> = wire_key(&origin).into();
            if next.contains_key(&key) {
                return Err(ZoneChangeError::Conflict(format!(
                    "zone {origin} is given twice (in [[zones]], or both there and added at run time in {}); keep one",
                    self.dir.as_ref().map_or_else(String::new, |d| d.display().to_string())
                )));
            }
            let serving = Serving::for_static(Arc::new(zone), self.limits, self.metrics.clone(), self.transfer.clone());
            next.insert(key, Arc::new(OtherZone { serving: Arc::new(serving), source }));
        }
        self.zones.store(Arc::new(next));
        Ok(())
    }

    fn put(&self, zone: StaticZone, source: Source, keep: Option<(&Path, &str)>) -> Result<u32, ZoneChangeError> {
        let origin = zone.origin.clone();
        if origin == self.managed_origin {
            return Err(ZoneChangeError::Conflict(format!(
                "zone {origin} is the zone the store manages ([dns_zone]); it cannot also be a static zone"
            )));
        }
        let key: Box<[u8]> = wire_key(&origin).into();
        // The serial it would serve: a signed zone's counts its signing too (`Snapshot::serial`).
        let serving = Serving::for_static(Arc::new(zone), self.limits, self.metrics.clone(), self.transfer.clone());
        let serial = serving.snapshot.load().serial;
        let _writer = self.writer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let zones = self.zones.load_full();
        if let Some(old) = zones.get(&key) {
            if old.source == Source::Managed {
                return Err(ZoneChangeError::Conflict(format!(
                    "zone {origin} is managed by the store (plans change its endpoints); it cannot also be a static zone"
                )));
            }
            if old.source == Source::Config || source == Source::Config {
                return Err(ZoneChangeError::Conflict(format!(
                    "zone {origin} is defined in the config file ([[zones]]); change it there and restart"
                )));
            }
            let served = old.serving.snapshot.load().serial;
            if !serial_newer(serial, served) {
                return Err(ZoneChangeError::Conflict(format!(
                    "zone {origin}: serial {serial} is not newer than the serial {served} served (RFC 1982); secondaries \
                     would keep the old zone: raise the SOA serial"
                )));
            }
        }
        // A zone removed is fenced at its last serial: an add that was sent before the removal
        // and arrives after it, or an old copy of the file, is refused.
        let tombstone = self.dir.as_ref().filter(|_| source == Source::Added).map(|dir| dir.join(tombstone_name(&origin)));
        if let Some(tombstone) = &tombstone
            && let Ok(text) = std::fs::read_to_string(tombstone)
            && let Ok(removed) = text.trim().parse::<u32>()
            && !serial_newer(serial, removed)
        {
            return Err(ZoneChangeError::Conflict(format!(
                "zone {origin} was removed at serial {removed}; an add of serial {serial} is older or the same (a late \
                 write, or an old file) and refused: raise the SOA serial above {removed} to serve it again"
            )));
        }
        if let Some((path, text)) = keep {
            write_atomic(path, &format!("$ORIGIN {origin}\n{text}")).map_err(|source| ZoneChangeError::Io {
                origin: origin.to_string(),
                path: path.to_path_buf(),
                source,
            })?;
        }
        if let Some(tombstone) = &tombstone
            && keep.is_some()
        {
            match std::fs::remove_file(tombstone) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(ZoneChangeError::Io { origin: origin.to_string(), path: tombstone.clone(), source }),
            }
        }
        let mut next = (*zones).clone();
        next.insert(key, Arc::new(OtherZone { serving: Arc::new(serving), source }));
        self.zones.store(Arc::new(next));
        if source == Source::Added {
            tracing::info!(target: crate::serving::AUDIT_TARGET, action = "zone_add", origin = %origin, serial, "zone added");
        }
        Ok(serial)
    }
}

/// `load` of each of `items`, on every core, in order; the first error ends it.
fn load_parallel<T: Sync, Z: Send, E: Send>(items: &[T], load: impl Fn(&T) -> Result<Z, E> + Sync) -> Result<Vec<Z>, E> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(items.len().max(1));
    let chunk = items.len().div_ceil(threads).max(1);
    let load = &load;
    let parts: Vec<Result<Vec<Z>, E>> = std::thread::scope(|scope| {
        let handles: Vec<_> = items.chunks(chunk).map(|part| scope.spawn(move || part.iter().map(load).collect())).collect();
        // A panic in a loader is a bug of ours; it is not input.
        handles.into_iter().map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))).collect()
    });
    let mut all = Vec::with_capacity(items.len());
    for part in parts {
        all.extend(part?);
    }
    Ok(all)
}

/// The file that fences zone `origin` after its removal: the last serial it was served at.
fn tombstone_name(origin: &Name) -> String {
    format!("{}removed", origin.to_lowercase())
}

/// The file of zone `origin` in the zones directory: its name and `zone`
/// (`example.org.zone`).
fn file_name(origin: &Name) -> String {
    format!("{}zone", origin.to_lowercase())
}

/// A zone's name as given to the control API: labels of letters, digits, `-` and `_` only, as
/// its file's name in the zones directory is made of it (no `/`, no escapes).
fn parse_origin(origin: &str) -> Result<Name, ZoneChangeError> {
    let mut name = Name::from_ascii(origin).map_err(|e| ZoneChangeError::Invalid(format!("{origin:?} is not a DNS name: {e}")))?;
    name.set_fqdn(true);
    if name.is_root() {
        return Err(ZoneChangeError::Invalid("the root zone is not served".into()));
    }
    if !name.iter().all(|label| label.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')) {
        return Err(ZoneChangeError::Invalid(format!(
            "zone {origin:?}: a zone added at run time is named with letters, digits, '-' and '_' only"
        )));
    }
    Ok(name.to_lowercase())
}

/// The records beside the managed endpoints of a zone added to the store, from master-file
/// `text` (as a static zone added at run time is read).
pub fn managed_zone_records(origin: &str, text: &str) -> Result<StaticZone, ZoneChangeError> {
    load_text(origin, text)
}

/// As `managed_zone_records`, through the zone's image in its directory `dir`
/// (`zone_image`, of this one zone): read from it when its fingerprint (the zone's text and
/// the running binary) is this text's, else parsed and the image written for the next start
/// (one that cannot be written is a WARN line: the zone is parsed again then). Hickory's
/// reader was most of a start of 10,000 added zones. The second value: read from the image.
pub fn managed_zone_records_in(dir: &Path, origin: &str, text: &str) -> Result<(StaticZone, bool), ZoneChangeError> {
    let name = parse_origin(origin)?;
    let config = managed_config(&name, text);
    let path = dir.join(zone_image::FILE_NAME);
    let fingerprint = zone_image::fingerprint(&config, Path::new(".")).unwrap_or(0);
    if let Some(zone) = ZoneImage::read(&path).zone(&config, fingerprint) {
        return Ok((zone, true));
    }
    let zone = load_text(origin, text)?;
    // Not fsynced: on the path of a zone added at run time, and a cache (see `write`).
    if let Err(err) = ZoneImage::write(&path, &[(fingerprint, &zone)], false) {
        tracing::warn!(path = %path.display(), error = %err, "cannot write the zone's image; it is parsed again at the next start");
    }
    Ok((zone, false))
}

/// The config of a zone read from master-file `text` alone.
fn managed_config(origin: &Name, text: &str) -> DnsZoneConfig {
    DnsZoneConfig {
        origin: origin.to_string(),
        soa: None,
        ns: Vec::new(),
        ns_ttl_secs: 3_600,
        master_file: None,
        records: Some(text.to_string()),
        dnssec: None,
    }
}

/// The static zone `origin` from master-file `text`, which must hold its SOA and apex NS, and
/// no `$INCLUDE` (a zone sent to the control API is whole: an include would read a file of the
/// server's, outside the zones directory).
fn load_text(origin: &str, text: &str) -> Result<StaticZone, ZoneChangeError> {
    let origin = parse_origin(origin)?;
    if let Some(line) = text.lines().position(|l| l.trim_start().get(..8).is_some_and(|d| d.eq_ignore_ascii_case("$INCLUDE"))) {
        return Err(ZoneChangeError::Invalid(format!(
            "zone {origin}, line {}: $INCLUDE is not taken in a zone added at run time; send the whole zone",
            line + 1
        )));
    }
    StaticZone::load(&managed_config(&origin, text), Path::new(".")).map_err(|e| ZoneChangeError::Invalid(format!("zone {origin}: {e}")))
}

/// Writes `text` to `path` through a file beside it, fsynced and renamed over it, then the
/// directory fsynced: after a crash the file is the old one or the new one.
fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The lower-case wire form of `packet`'s question name into `out`, and its length; `None`
/// when the packet has no question or its name does not read (no compression in a question).
fn question_key(packet: &[u8], out: &mut [u8; NAME_WIRE_BYTES_MAX]) -> Option<usize> {
    if packet.len() < 12 || packet[4..6] == [0, 0] {
        return None;
    }
    let (mut at, mut len) = (12, 0);
    loop {
        let label = usize::from(*packet.get(at)?);
        if label > 63 || len + label + 1 >= NAME_WIRE_BYTES_MAX {
            return None;
        }
        out[len] = label as u8;
        if label == 0 {
            return Some(len + 1);
        }
        for (dst, src) in out[len + 1..len + 1 + label].iter_mut().zip(packet.get(at + 1..at + 1 + label)?) {
            *dst = src.to_ascii_lowercase();
        }
        len += 1 + label;
        at += 1 + label;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any bytes: `pick` answers or declines, never panics, and a name it reads is the
        /// question's own.
        #[test]
        fn any_packet_is_picked_or_declined(packet in proptest::collection::vec(any::<u8>(), 0..300)) {
            let mut key = [0u8; NAME_WIRE_BYTES_MAX];
            if let Some(len) = question_key(&packet, &mut key) {
                prop_assert!(len >= 1 && key[len - 1] == 0 && len <= NAME_WIRE_BYTES_MAX);
            }
            let table = ZoneTable::empty(&Name::from_ascii("managed.test.").expect("name"));
            table.add_text("a.", ZONE).expect("zone");
            let _ = table.pick(&packet);
        }
    }

    fn query(name: &str) -> Vec<u8> {
        let mut p = vec![0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0];
        p.extend_from_slice(&wire_key(&Name::from_ascii(name).expect("name")));
        p.extend_from_slice(&[0, 1, 0, 1]);
        p
    }

    const ZONE: &str = "@ 300 IN SOA ns1 hostmaster 7 3600 600 604800 30\n@ 300 IN NS ns1\nns1 300 IN A 192.0.2.1\n";

    /// A query goes to the zone of the longest origin that ends its name, never past the
    /// managed zone; a replacement needs a newer serial; config zones and the managed zone
    /// cannot be changed at run time.
    #[test]
    fn queries_go_to_the_closest_zone_and_changes_are_checked() {
        let table = ZoneTable::empty(&Name::from_ascii("managed.test.").expect("name"));
        assert!(table.pick(&query("www.managed.test.")).is_none(), "no other zone");
        table.add_text("test.", ZONE).expect("parent");
        table.add_text("b.other.", ZONE).expect("b.other");
        table.add_text("a.b.other.", ZONE).expect("a.b.other");
        let origin_of = |name: &str| table.pick(&query(name)).map(|s| s.zone.origin.to_string());
        assert_eq!(origin_of("x.A.b.Other."), Some("a.b.other.".into()));
        assert_eq!(origin_of("b.other."), Some("b.other.".into()));
        assert_eq!(origin_of("other."), None, "in no zone");
        assert_eq!(origin_of("x.managed.test."), None, "the managed zone stops the walk");
        assert_eq!(origin_of("x.test."), Some("test.".into()));
        let err = table.add_text("b.other.", ZONE).expect_err("same serial").to_string();
        assert!(err.contains("serial 7 is not newer than the serial 7 served"), "{err}");
        table.add_text("b.other.", &ZONE.replace(" 7 ", " 8 ")).expect("newer serial");
        assert!(table.add_text("managed.test.", ZONE).is_err(), "the managed zone");
        let text = "@ 300 IN SOA ns1 hostmaster 7 3600 600 604800 30\n".to_string();
        assert!(table.add_text("c.other.", &text).expect_err("no NS").to_string().contains("no NS records"));
        for (origin, says) in [("a\\.\\.b.other.", "letters, digits"), ("d.other.", "$INCLUDE is not taken")] {
            let err = table.add_text(origin, &format!("$INCLUDE /etc/hostname\n{ZONE}")).expect_err(origin).to_string();
            assert!(err.contains(says), "{origin}: {err}");
        }
        table.remove("a.b.other.").expect("remove");
        assert_eq!(origin_of("x.a.b.other."), Some("b.other.".into()));
        assert!(matches!(table.remove("a.b.other."), Err(ZoneChangeError::Missing(_))));
        assert_eq!(table.len(), 2);
    }

    /// A removed zone is fenced at its last serial, across a restart (the tombstone is a file
    /// beside the zones): a late add of that serial or an older one is refused; a newer one
    /// serves it again and lifts the fence. Fails without the tombstone: the late add is
    /// served.
    #[test]
    fn a_removed_zone_refuses_late_adds() {
        let dir = tempfile::tempdir().expect("tempdir");
        let managed = Name::from_ascii("managed.test.").expect("name");
        let table = || {
            ZoneTable::new(
                &managed,
                AnswerLimits::default(),
                Arc::new(Metrics::new()),
                Arc::new(TransferPolicy::closed()),
                Some(dir.path().to_path_buf()),
            )
        };
        let first = table();
        first.add_text("z.other.", ZONE).expect("add at 7");
        first.remove("z.other.").expect("remove");
        drop(first);
        let again = table();
        assert_eq!(again.load_added().expect("load"), 0);
        let err = again.add_text("z.other.", ZONE).expect_err("a late add at 7").to_string();
        assert!(err.contains("was removed at serial 7"), "{err}");
        assert!(again.add_text("z.other.", &ZONE.replace(" 7 ", " 6 ")).is_err(), "an older one");
        again.add_text("z.other.", &ZONE.replace(" 7 ", " 8 ")).expect("a newer one");
        again.remove("z.other.").expect("remove at 8");
        assert!(again.add_text("z.other.", &ZONE.replace(" 7 ", " 8 ")).is_err(), "fenced at 8 now");
        again.add_text("z.other.", &ZONE.replace(" 7 ", " 9 ")).expect("9");
        assert!(!dir.path().join("z.other.removed").exists(), "the fence is lifted by a newer add");
    }

    /// An added zone's records come back from its image as parsed, only for the same text: a
    /// second read of the same text is the image's, another text is parsed (and imaged) again,
    /// and a damaged image is parsed.
    #[test]
    fn an_added_zone_reads_its_image_only_for_its_text() {
        let dir = tempfile::tempdir().expect("tempdir");
        let text = "$ORIGIN shop.test.\n$TTL 300\n@ SOA ns1 hostmaster 1 2 3 4 5\n@ NS ns1\nns1 A 192.0.2.7\nwww CNAME ns1\n";
        let described = |zone: &StaticZone| {
            let mut out: Vec<String> = zone.ns.iter().chain(&zone.records).map(|r| format!("{r} ttl {}", r.ttl)).collect();
            out.sort();
            (out, zone.serial_base, zone.soa_ttl_secs, zone.soa.to_string())
        };
        let (parsed, from_image) = managed_zone_records_in(dir.path(), "shop.test.", text).expect("parsed");
        assert!(!from_image);
        let (again, from_image) = managed_zone_records_in(dir.path(), "shop.test.", text).expect("read");
        assert!(from_image, "the same text was parsed again");
        assert_eq!(described(&again), described(&parsed));
        let other = text.replace("192.0.2.7", "192.0.2.8");
        let (changed, from_image) = managed_zone_records_in(dir.path(), "shop.test.", &other).expect("parsed");
        assert!(!from_image && described(&changed) != described(&parsed), "another text was read from the image");
        let path = dir.path().join(zone_image::FILE_NAME);
        let mut bytes = std::fs::read(&path).expect("image");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        std::fs::write(&path, bytes).expect("damage");
        let (read, from_image) = managed_zone_records_in(dir.path(), "shop.test.", &other).expect("parsed");
        assert!(!from_image && described(&read) == described(&changed), "a damaged image was read");
    }
}
