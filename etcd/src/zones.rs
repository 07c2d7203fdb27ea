//! The zones added beside the store's first one (see `dnsplan_common::store::zones`).
//!
//! Keys, under the store's prefix: `zones/registry/<origin>` → the zone's [`ManagedZone`]
//! envelope; `zones/z/<origin>/` is the prefix of the zone's own store, the layout of `keys`
//! under it, plus `zones/z/<origin>/state/live` → the zone's incarnation, drawn when it was added. The
//! handle of a zone (another `EtcdStore` on the same client) adds to every transaction it sends
//! the compare "the live key holds the incarnation I was made with": removal writes the tombstone and
//! deletes the zone's whole prefix, live key included, in one transaction, so every later
//! transaction of a handle made before it fails that compare, and is answered
//! [`StoreError::ZoneGone`]; a zone added again draws another incarnation, so an old handle stays out
//! of the new zone too. The check is etcd's, at write time, like every other fence here.

use crate::active::slot_counts;
use crate::client::{Compare, CompareOp, Txn};
use crate::handle::ZoneFence;
use crate::txn::{be_u64, cmp_bytes, cmp_u64, delete_range, first, get, get_range, put};
use crate::{EtcdStore, LAYOUT, prefix_end};
use dnsplan_common::codec;
use dnsplan_common::names::DnsName;
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::zones::{MANAGED_ZONES_MAX, ManagedZone, ManagedZones, ZoneState, check_added, random_id};
use dnsplan_common::store::{Store, StoreError, StoreResult};

impl EtcdStore {
    fn registry_prefix(&self) -> Vec<u8> {
        format!("{}zones/registry/", self.inner.config.prefix).into_bytes()
    }

    fn registry_key(&self, origin: &DnsName) -> Vec<u8> {
        format!("{}zones/registry/{origin}", self.inner.config.prefix).into_bytes()
    }

    fn zone_prefix(&self, origin: &DnsName) -> String {
        format!("{}zones/z/{origin}/", self.inner.config.prefix)
    }

    fn live_key(&self, origin: &DnsName) -> Vec<u8> {
        format!("{}state/live", self.zone_prefix(origin)).into_bytes()
    }

    /// After a transaction of a zone handle failed: [`StoreError::ZoneGone`] when the zone's
    /// live key no longer holds the handle's incarnation (the zone was removed, or removed and added
    /// again); else the failure was another compare's.
    pub(crate) async fn check_zone_live(&self, fence: &ZoneFence) -> StoreResult<()> {
        let response = self.call("zone liveness", self.inner.client.txn(Txn::new().and_then(vec![get(fence.live_key.clone())]))).await?;
        let live = response.op_responses().into_iter().find_map(|r| match r {
            crate::client::TxnOpResponse::Get(g) => Some(first(&g).map(|kv| kv.value().to_vec())),
            _ => None,
        });
        match live {
            Some(Some(value)) if value == fence.token => Ok(()),
            _ => Err(StoreError::ZoneGone { zone: fence.origin.clone() }),
        }
    }

    /// The registry entry of `origin` and its raw value (compared by the writes).
    async fn entry(&self, origin: &DnsName) -> StoreResult<(Option<ManagedZone>, Option<Vec<u8>>, Option<Vec<u8>>)> {
        let (_, r) = self.read("zone registry", vec![get(self.registry_key(origin)), get(self.live_key(origin))]).await?;
        let raw = first(&r[0]).map(|kv| kv.value().to_vec());
        let entry = raw
            .as_deref()
            .map(|bytes| {
                codec::decode::<ManagedZone>(bytes)
                    .map_err(|e| StoreError::Corrupt { what: format!("registry entry of zone {origin}"), source: e })
            })
            .transpose()?;
        Ok((entry, raw, first(&r[1]).map(|kv| kv.value().to_vec())))
    }

    fn handle(&self, origin: &DnsName, token: Vec<u8>) -> EtcdStore {
        let mut config = self.inner.config.clone();
        config.prefix = self.zone_prefix(origin);
        let fence = ZoneFence { origin: origin.clone(), live_key: self.live_key(origin), token };
        EtcdStore::with_client(self.inner.client.clone(), config, Some(fence))
    }
}

impl ManagedZones for EtcdStore {
    async fn zone(&self, origin: &DnsName) -> StoreResult<EtcdStore> {
        match self.entry(origin).await? {
            (Some(entry), _, Some(token)) if entry.is_live() => Ok(self.handle(origin, token)),
            _ => Err(StoreError::ZoneGone { zone: origin.clone() }),
        }
    }

    async fn add_zone(&self, origin: &DnsName, master: &str) -> StoreResult<bool> {
        check_added(origin, self.dns_zone().await?.as_ref(), master)?;
        // The incarnation an attempt whose reply was lost may have committed.
        let mut sent: Option<u64> = None;
        for attempt in 0..crate::ATTEMPTS_MAX {
            let (entry, raw, _) = self.entry(origin).await?;
            if let Some(live) = entry.as_ref().and_then(ManagedZone::incarnation) {
                // Ours, committed by an attempt whose answer was lost, or another's.
                return Ok(sent == Some(live));
            }
            if entry.is_none() {
                let prefix = self.registry_prefix();
                let count = self
                    .inner
                    .client
                    .get(prefix.clone(), Some(crate::client::GetOptions::new().with_range(prefix_end(&prefix)).with_count_only()));
                let count = self.call("zone count", count).await?.count();
                if usize::try_from(count).unwrap_or(usize::MAX) >= MANAGED_ZONES_MAX {
                    return Err(StoreError::BadRequest(format!(
                        "the store's registry holds {MANAGED_ZONES_MAX} zones, live and removed; no more are added"
                    )));
                }
            }
            let restart = entry.as_ref().map(ManagedZone::restart).unwrap_or_default();
            let zone = self.zone_prefix(origin);
            // What a publish that died between its chunks and its commit left after the
            // removal (chunks are written before the transaction that would have been fenced).
            let registry_key = self.registry_key(origin);
            let cleaned = Txn::new()
                .when(vec![cmp_bytes(registry_key.clone(), raw.as_deref())])
                .and_then(vec![delete_range(zone.clone().into_bytes(), prefix_end(zone.as_bytes()))]);
            if !self.txn("zone add", cleaned).await?.succeeded() {
                crate::txn::back_off(attempt).await;
                continue;
            }
            let incarnation = random_id();
            let entry = ManagedZone { origin: origin.clone(), state: ZoneState::Live { added_unix_ms: now_unix_ms(), incarnation } };
            let mut ops = vec![
                put(registry_key.clone(), codec::encode(&entry)),
                put(self.live_key(origin), incarnation.to_be_bytes().to_vec()),
                put(format!("{zone}state/layout").into_bytes(), LAYOUT.to_be_bytes().to_vec()),
                put(format!("{zone}state/dns_zone").into_bytes(), origin.as_str().as_bytes().to_vec()),
                put(format!("{zone}state/master").into_bytes(), master.as_bytes().to_vec()),
            ];
            if restart.applied_changes > 0 {
                let counts = [restart.applied_changes.to_be_bytes(), restart.content_changes.to_be_bytes()].concat();
                ops.push(put(format!("{zone}meta/applied").into_bytes(), counts));
            }
            if !restart.generation_base.is_none() {
                let first = restart.generation_base.next().ok_or(StoreError::Exhausted(restart.generation_base))?;
                ops.push(put(format!("{zone}state/generation_base").into_bytes(), restart.generation_base.to_be_bytes().to_vec()));
                ops.push(put(format!("{zone}state/horizon").into_bytes(), first.to_be_bytes().to_vec()));
            }
            let added = Txn::new().when(vec![cmp_bytes(registry_key, raw.as_deref())]).and_then(ops);
            sent = Some(incarnation);
            match self.txn("zone add", added).await {
                Ok(response) if response.succeeded() => return Ok(true),
                Ok(_) => {}
                // Committed or not: the next read of the registry tells.
                Err(StoreError::Unavailable(detail)) => {
                    tracing::debug!(zone = %origin, detail, "zone add without an answer; reading it back")
                }
                Err(err) => return Err(err),
            }
            crate::txn::back_off(attempt).await;
        }
        Err(crate::txn::contention("zone add"))
    }

    async fn zone_master(&self, origin: &DnsName) -> StoreResult<String> {
        let zone = self.zone(origin).await?;
        let (_, r) = zone.read("zone master", vec![get(format!("{}state/master", self.zone_prefix(origin)).into_bytes())]).await?;
        let bytes = first(&r[0]).map(|kv| kv.value().to_vec()).unwrap_or_default();
        String::from_utf8(bytes).map_err(|e| crate::txn::corrupt("an added zone's master file", e.to_string()))
    }

    async fn remove_zone(&self, origin: &DnsName) -> StoreResult<bool> {
        // The incarnation an attempt whose reply was lost may have removed.
        let mut removing: Option<Vec<u8>> = None;
        for attempt in 0..crate::ATTEMPTS_MAX {
            let (entry, raw, token) = self.entry(origin).await?;
            let (Some(_), Some(token)) = (entry.filter(ManagedZone::is_live), token) else {
                // Removed: by an attempt of ours whose answer was lost (the live key it compared
                // is gone), or by another caller before.
                return Ok(removing.is_some());
            };
            removing = Some(token.clone());
            let zone = self.handle(origin, token.clone());
            let keys = &zone.inner.keys;
            let (_, slots) = zone
                .read(
                    "zone counts",
                    vec![get_range(keys.applied(), prefix_end(&keys.applied()), 0), get(keys.latest()), get(keys.generation_base())],
                )
                .await?;
            let latest = be_u64(first(&slots[1]), "latest generation")?;
            let base = be_u64(first(&slots[2]), "generation base")?.unwrap_or(0);
            let (mut applied, mut content) = (0u64, 0u64);
            for kv in slots[0].kvs() {
                let (a, c) = slot_counts(kv)?;
                applied = applied.saturating_add(a);
                content = content.saturating_add(c);
            }
            let latest_generation = latest.unwrap_or(0).max(base);
            let state = ZoneState::Removed {
                removed_unix_ms: now_unix_ms(),
                applied_changes: applied,
                content_changes: content,
                latest_generation,
            };
            let tombstone = ManagedZone { origin: origin.clone(), state };
            let prefix = self.zone_prefix(origin);
            // The compare on the slots' range: no apply of the zone committed since they were
            // read (its counts would be missed by the tombstone).
            let slots_revision = slots[0].kvs().iter().map(|kv| kv.mod_revision()).max().unwrap_or(0);
            let txn = Txn::new()
                .when(vec![
                    cmp_bytes(self.registry_key(origin), raw.as_deref()),
                    Compare::value(self.live_key(origin), CompareOp::Equal, token),
                    Compare::mod_revision(keys.applied(), CompareOp::Less, slots_revision + 1).with_range(prefix_end(&keys.applied())),
                    // No plan published since `latest` was read (the tombstone keeps it).
                    cmp_u64(keys.latest(), latest),
                ])
                .and_then(vec![
                    put(self.registry_key(origin), codec::encode(&tombstone)),
                    delete_range(prefix.clone().into_bytes(), prefix_end(prefix.as_bytes())),
                ]);
            match self.txn("zone remove", txn).await {
                Ok(response) if response.succeeded() => return Ok(true),
                Ok(_) => {}
                // Committed or not: the next read of the registry tells.
                Err(StoreError::Unavailable(detail)) => {
                    tracing::debug!(zone = %origin, detail, "zone removal without an answer; reading it back")
                }
                Err(err) => return Err(err),
            }
            crate::txn::back_off(attempt).await;
        }
        Err(crate::txn::contention("zone remove"))
    }

    async fn zones(&self) -> StoreResult<Vec<ManagedZone>> {
        self.read_all("zone registry", self.registry_prefix()).await
    }

    /// The revision the registry was last written at: entries are never deleted (a removal
    /// writes a tombstone), so it moves with every addition and removal. One key comes back,
    /// whatever the number of zones; etcd sorts the registry's index to find it (in memory,
    /// a few milliseconds at 100,000 zones), which a version key written with every change
    /// would spare.
    async fn registry_version(&self) -> StoreResult<u64> {
        let prefix = self.registry_prefix();
        let options = crate::client::GetOptions::new().with_range(prefix_end(&prefix)).with_keys_only().with_newest_first().with_limit(1);
        let newest = self.call("zone registry version", self.inner.client.get(prefix, Some(options))).await?;
        Ok(newest.kvs().first().map_or(0, |kv| u64::try_from(kv.mod_revision).unwrap_or(0)))
    }

    fn incarnation(&self) -> Option<u64> {
        let fence = self.inner.zone.as_ref()?;
        Some(u64::from_be_bytes(fence.token.as_slice().try_into().unwrap_or_default()))
    }
}
