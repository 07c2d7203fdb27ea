//! The DNS zones one store manages: its first zone (the single zone of a store before any was
//! added) and the zones added beside it, each with its own plans, fences, cleanup, pause and
//! lease. A zone handle is a [`Store`] of its own; the registry of zones says which are live.
//!
//! A removed zone is fenced: its registry entry becomes a tombstone in the same step that the
//! zone's writes start being refused ([`StoreError::ZoneGone`]), so a late write of an enactor
//! or planner that still holds the zone never lands. The tombstone keeps the counts the zone had
//! reached and its latest plan's generation; a zone added again under the same name starts past
//! them, so its SOA serial never goes back for a secondary that still holds the old one, and its
//! first plan's generation is past every plan of the removed zone (a fence the removed zone's
//! plans wrote outside the store, an RFC 2136 server's markers, takes the new plans as newer, and
//! a late write of the removed zone's enactor as older).

use super::{Store, StoreError, StoreResult};
use crate::Generation;
use crate::codec::{self, Record};
use crate::names::DnsName;
use serde::{Deserialize, Serialize};
use std::future::Future;

/// Most zones, live and removed, one store's registry holds (`add_zone` refuses beyond), on
/// sled as on etcd. On sled every added zone's keys are in one set of trees the added zones
/// share, so each costs the same whatever the number: measured with `bench/zones.sh --managed`,
/// 10,000 zones of 100 names are served after a restart in 9 s (bench/RESULTS.md).
pub const MANAGED_ZONES_MAX: usize = 100_000;

/// One zone of the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagedZone {
    pub origin: DnsName,
    pub state: ZoneState,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ZoneState {
    /// Plans are published and applied. `incarnation` is drawn at random when the zone is
    /// added: a client that names it is refused by a zone added again since.
    Live { added_unix_ms: u64, incarnation: u64 },
    /// As `Removed`, written before tombstones kept the latest generation (read, never
    /// written): a zone added again past one starts its plans at generation 1.
    RemovedCounts { removed_unix_ms: u64, applied_changes: u64, content_changes: u64 },
    /// Every write is refused. The counts and the latest plan's generation it had reached,
    /// past which a zone added again under this name starts.
    Removed { removed_unix_ms: u64, applied_changes: u64, content_changes: u64, latest_generation: u64 },
}

/// Where a zone added under a name starts: past what a removed zone of that name reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Restart {
    pub applied_changes: u64,
    pub content_changes: u64,
    /// The generation the zone's first plan follows ([`Store::generation_base`]).
    pub generation_base: Generation,
}

impl ManagedZone {
    pub fn is_live(&self) -> bool {
        matches!(self.state, ZoneState::Live { .. })
    }

    /// The live zone's incarnation.
    pub fn incarnation(&self) -> Option<u64> {
        match self.state {
            ZoneState::Live { incarnation, .. } => Some(incarnation),
            ZoneState::Removed { .. } | ZoneState::RemovedCounts { .. } => None,
        }
    }

    /// Where a zone added again under this name starts: its counts past the removed one's, so
    /// its serial moves on, and its plans past the removed one's latest.
    pub fn restart(&self) -> Restart {
        let counts = |applied: u64, content: u64| (applied.saturating_add(1), content.saturating_add(1));
        match self.state {
            ZoneState::Live { .. } => Restart::default(),
            ZoneState::RemovedCounts { applied_changes, content_changes, .. } => {
                let (applied_changes, content_changes) = counts(applied_changes, content_changes);
                Restart { applied_changes, content_changes, generation_base: Generation::NONE }
            }
            ZoneState::Removed { applied_changes, content_changes, latest_generation, .. } => {
                let (applied_changes, content_changes) = counts(applied_changes, content_changes);
                Restart { applied_changes, content_changes, generation_base: Generation(latest_generation) }
            }
        }
    }
}

impl Record for ManagedZone {
    const KIND: u8 = 18;
    const KIND_NAME: &'static str = "managed zone";
    const BODY_BYTES_MAX: usize = codec::SMALL_BODY_BYTES_MAX;
}

/// The zones of a store: the handle of each added zone, and their addition and removal.
pub trait ManagedZones: Store {
    /// The store of added zone `origin`: [`StoreError::ZoneGone`] unless it is live.
    fn zone(&self, origin: &DnsName) -> impl Future<Output = StoreResult<Self>> + Send;
    /// Adds zone `origin`, with `master`, the master file of its records beside the managed
    /// endpoints (SOA, NS, static records; opaque to the store, at most
    /// [`MASTER_BYTES_MAX`]); `false` when it was live already. The store's first zone cannot
    /// be added again.
    fn add_zone(&self, origin: &DnsName, master: &str) -> impl Future<Output = StoreResult<bool>> + Send;
    /// The master file added zone `origin` was added with.
    fn zone_master(&self, origin: &DnsName) -> impl Future<Output = StoreResult<String>> + Send;
    /// Removes zone `origin`, fencing its writes; `false` when it was not live.
    fn remove_zone(&self, origin: &DnsName) -> impl Future<Output = StoreResult<bool>> + Send;
    /// Every zone of the registry, live and removed, in name order.
    fn zones(&self) -> impl Future<Output = StoreResult<Vec<ManagedZone>>> + Send;
    /// A number that moves whenever the registry changes (a zone added or removed) and only
    /// then: a caller that follows the registry reads it first, and the whole registry (which
    /// at 100,000 zones is megabytes) only when it moved.
    fn registry_version(&self) -> impl Future<Output = StoreResult<u64>> + Send;
    /// The incarnation of the added zone this handle is of; `None` for the first zone.
    fn incarnation(&self) -> Option<u64> {
        None
    }
}

/// The body of `GET /v1/managed-version`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryVersion {
    pub version: u64,
}

/// The header a client of the control API sends with each call to an added zone: the
/// incarnation it resolved, so a zone removed and added again refuses it.
pub const INCARNATION_HEADER: &str = "dnsplan-zone-incarnation";

/// A random `u64` (not 0), for incarnations and store ids: the standard library's hasher keys
/// are drawn from the operating system's randomness.
pub fn random_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos());
    hasher.write_u32(std::process::id());
    hasher.finish().max(1)
}

/// Largest master file an added zone keeps in the store (etcd's default request limit is
/// 1.5 MiB): its SOA, NS and static records, the managed endpoints being the plans'.
pub const MASTER_BYTES_MAX: usize = 1024 * 1024;

/// Refuses to add `origin` as a zone beside the store's first zone `first`, or with a master
/// file over [`MASTER_BYTES_MAX`].
pub fn check_added(origin: &DnsName, first: Option<&DnsName>, master: &str) -> StoreResult<()> {
    if first == Some(origin) {
        return Err(StoreError::BadRequest(format!("{origin} is the store's first zone; it is not added again")));
    }
    if master.len() > MASTER_BYTES_MAX {
        return Err(StoreError::TooLong { what: format!("zone {origin}'s master file").into(), len: master.len(), max: MASTER_BYTES_MAX });
    }
    Ok(())
}

/// How often a daemon of an added zone reads the store's registry to learn that its zone was
/// removed or added again ([`zone_gone`]).
pub const ZONE_REREAD_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Zone `zone`'s handle, looked for again (at growing intervals, 5 s at most) until the store
/// has it; `None` once `stop` resolves first.
pub async fn wait_for_zone<S: ManagedZones>(store: &S, zone: &DnsName, stop: impl Future<Output = ()>) -> Option<S> {
    tokio::pin!(stop);
    let mut wait = std::time::Duration::from_millis(200);
    loop {
        match store.zone(zone).await {
            Ok(handle) => return Some(handle),
            Err(err) => tracing::warn!(dns_zone = %zone, error = %err, "the zone is not in the store (yet); looking again"),
        }
        tokio::select! {
            _ = &mut stop => return None,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(std::time::Duration::from_secs(5));
    }
}

/// Returns once `handle`, a zone's, is refused as [`StoreError::ZoneGone`] (the zone was
/// removed, or removed and added again: the handle is of the old incarnation), asked every
/// [`ZONE_REREAD_EVERY`]: one read of the zone's version, whatever the number of zones.
pub async fn zone_gone<S: Store>(handle: &S) {
    loop {
        tokio::time::sleep(ZONE_REREAD_EVERY).await;
        if let Err(StoreError::ZoneGone { .. }) = handle.version().await {
            return;
        }
    }
}
