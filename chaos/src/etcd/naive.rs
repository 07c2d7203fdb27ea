//! `NaiveEtcdStore`: the 2025 automation's store on etcd, without fences, for the race scenario.

use super::*;

/// The store of the 2025 automation, on etcd: the same keys as `EtcdStore`, written with
/// plain puts. `apply` reads the fence and then writes whatever it was given, with nothing
/// compared at write time; cleanup deletes by age alone, and the active records older than the
/// plans it keeps go with them (records that pointed into their plan), as in
/// `NaiveStore::as_in_2025`. Reads, publish, leases,
/// heartbeats and the change feed are `EtcdStore`'s own. For the counterfactual only: the
/// harness must catch it.
#[derive(Clone)]
pub struct NaiveEtcdStore {
    inner: EtcdStore,
}

pub(super) fn unavailable(err: dnsplan_etcd::client::Error) -> StoreError {
    StoreError::Unavailable(err.to_string())
}

impl NaiveEtcdStore {
    pub fn new(inner: EtcdStore) -> NaiveEtcdStore {
        NaiveEtcdStore { inner }
    }

    fn key(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut key = self.inner.prefix().as_bytes().to_vec();
        for p in parts {
            key.extend_from_slice(p);
        }
        key
    }

    async fn get_u64(&self, key: Vec<u8>) -> StoreResult<Option<u64>> {
        let client = self.inner.client().clone();
        let r = client.get(key, None).await.map_err(unavailable)?;
        Ok(r.kvs().first().and_then(|kv| kv.value().try_into().ok()).map(u64::from_be_bytes))
    }

    /// The applied-change counter's first slot as the fenced store keeps it: the applied and the
    /// content-change counts, 8 bytes each (the naive store counts every switch as both).
    async fn counts(&self) -> StoreResult<(u64, u64)> {
        let client = self.inner.client().clone();
        let r = client.get(self.key(&[b"meta/applied"]), None).await.map_err(unavailable)?;
        let value = r.kvs().first().map(|kv| kv.value().to_vec()).unwrap_or_default();
        Ok(match value.split_first_chunk::<8>() {
            Some((applied, content)) => (u64::from_be_bytes(*applied), content.try_into().map(u64::from_be_bytes).unwrap_or(0)),
            None => (0, 0),
        })
    }

    /// The counter slot's value after one more switch than `counts`.
    fn counted(counts: (u64, u64)) -> Vec<u8> {
        [(counts.0 + 1).to_be_bytes(), (counts.1 + 1).to_be_bytes()].concat()
    }

    async fn write(&self, ops: Vec<dnsplan_etcd::client::TxnOp>) -> StoreResult<()> {
        let client = self.inner.client().clone();
        client.txn(dnsplan_etcd::client::Txn::new().and_then(ops)).await.map_err(unavailable)?;
        Ok(())
    }

    async fn switch(&self, endpoint: &EndpointName, g: Generation, state: ActiveState) -> StoreResult<ApplyOutcome> {
        use dnsplan_etcd::client::TxnOp;
        let name = endpoint.as_str().as_bytes();
        // The check (read, and trusted later)...
        let fence = self.get_u64(self.key(&[b"fence/", name])).await?;
        let counts = self.counts().await?;
        // ...and the act: nothing compared.
        let mut ops = vec![
            TxnOp::put(
                self.key(&[b"active/", name]),
                dnsplan_common::codec::encode(&ActiveRecord { generation: g, state: state.clone() }),
                None,
            ),
            TxnOp::put(self.key(&[b"fence/", name]), g.0.to_be_bytes().to_vec(), None),
            TxnOp::put(self.key(&[b"meta/applied"]), Self::counted(counts), None),
        ];
        if let Some(old) = fence.filter(|old| *old != g.0) {
            ops.push(TxnOp::delete(self.key(&[b"serving/", &old.to_be_bytes(), name]), None));
        }
        if matches!(state, ActiveState::Serving(_)) {
            ops.push(TxnOp::put(self.key(&[b"serving/", &g.0.to_be_bytes(), name]), Vec::new(), None));
        }
        self.write(ops).await?;
        Ok(ApplyOutcome::Switched { previous: Generation(fence.unwrap_or_default()) })
    }
}

impl Store for NaiveEtcdStore {
    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        self.inner.publish(plan).await
    }

    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        self.inner.publish_leased(plan, lease).await
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        self.inner.acquire_lease(holder, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.inner.release_lease(lease).await
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        self.inner.lease().await
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        self.inner.plan(generation).await
    }

    async fn plan_changes_unchecked(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        self.inner.plan_changes(from, to).await
    }

    async fn latest(&self) -> StoreResult<Generation> {
        self.inner.latest().await
    }
    async fn generation_base(&self) -> StoreResult<Generation> {
        self.inner.generation_base().await
    }

    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.inner.list(from, limit).await
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        dnsplan_common::validate_endpoint(endpoint, records)?;
        let latest = self.inner.latest().await?;
        if generation > latest {
            return Err(StoreError::Unpublished { attempted: generation, latest });
        }
        self.switch(endpoint, generation, ActiveState::Serving(records.clone())).await
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        self.switch(endpoint, generation, ActiveState::Retired).await
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.inner.active(endpoint).await
    }

    async fn active_all(&self) -> StoreResult<dnsplan_common::store::ActiveSnapshot> {
        self.inner.active_all().await
    }

    /// Age-only: keeps the last `retain` plans and nothing else, active or not.
    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        let latest = self.inner.latest().await?;
        let horizon_before = self.inner.list(Generation::NONE, 1).await?.first().map(|p| p.generation).unwrap_or(Generation::FIRST);
        let horizon_after = Generation(latest.0.saturating_sub(retain) + 1).max(horizon_before);
        Ok(CleanupDecision {
            horizon_before,
            horizon_after,
            kept_for_rollback: Some((horizon_after, latest)),
            oldest_active: None,
            refused_active_or_newer: 0,
        })
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        use dnsplan_etcd::client::{DeleteOptions, TxnOp};
        let decision = self.cleanup_preview(retain).await?;
        let (before, after) = (decision.horizon_before, decision.horizon_after);
        let range = |kind: &[u8]| {
            TxnOp::delete(
                self.key(&[kind, &before.0.to_be_bytes()]),
                Some(DeleteOptions::new().with_range(self.key(&[kind, &after.0.to_be_bytes()]))),
            )
        };
        let control = self.get_u64(self.key(&[b"meta/control"])).await?.unwrap_or(0);
        let mut ops = Vec::new();
        if after > before {
            ops.extend([
                TxnOp::put(self.key(&[b"state/horizon"]), after.0.to_be_bytes().to_vec(), None),
                TxnOp::put(self.key(&[b"meta/control"]), (control + 1).to_be_bytes().to_vec(), None),
                range(b"plans/"),
                range(b"summaries/"),
                range(b"changes/"),
            ]);
        }
        // The records went with their plan.
        let active = self.inner.active_all().await?;
        let gone: Vec<(&EndpointName, &ActiveRecord)> = active.endpoints.iter().filter(|(_, r)| r.generation < after).collect();
        for (name, record) in &gone {
            let name = name.as_str().as_bytes();
            ops.push(TxnOp::delete(self.key(&[b"active/", name]), None));
            ops.push(TxnOp::delete(self.key(&[b"fence/", name]), None));
            ops.push(TxnOp::delete(self.key(&[b"serving/", &record.generation.0.to_be_bytes(), name]), None));
        }
        if !gone.is_empty() {
            ops.push(TxnOp::put(self.key(&[b"meta/applied"]), Self::counted(self.counts().await?), None));
        }
        if !ops.is_empty() {
            self.write(ops).await?;
        }
        Ok(decision)
    }

    async fn pause_unchecked(&self, state: PauseState) -> StoreResult<()> {
        self.inner.pause(state).await
    }

    async fn resume(&self) -> StoreResult<()> {
        self.inner.resume().await
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.inner.paused().await
    }

    async fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        self.inner.heartbeat(heartbeat).await
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.inner.heartbeats().await
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        self.inner.version().await
    }

    async fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        self.inner.wait_for_change(seen, timeout).await
    }
}

/// The 2025 automation had one zone: none is added beside it.
impl dnsplan_common::store::zones::ManagedZones for NaiveEtcdStore {
    async fn zone(&self, origin: &dnsplan_common::DnsName) -> StoreResult<NaiveEtcdStore> {
        Err(StoreError::ZoneGone { zone: origin.clone() })
    }

    async fn add_zone(&self, origin: &dnsplan_common::DnsName, _master: &str) -> StoreResult<bool> {
        Err(StoreError::BadRequest(format!("the naive store has one zone; {origin} is not added")))
    }

    async fn zone_master(&self, origin: &dnsplan_common::DnsName) -> StoreResult<String> {
        Err(StoreError::ZoneGone { zone: origin.clone() })
    }

    async fn remove_zone(&self, _origin: &dnsplan_common::DnsName) -> StoreResult<bool> {
        Ok(false)
    }

    async fn zones(&self) -> StoreResult<Vec<dnsplan_common::store::zones::ManagedZone>> {
        Ok(Vec::new())
    }
    async fn registry_version(&self) -> StoreResult<u64> {
        Ok(0)
    }
}
