//! Plans: staged in chunks, published by one transaction, settled when a reply is lost, read and cached.

use crate::client::{Compare, CompareOp, GetOptions, Txn, TxnOp};
use crate::control::*;
use crate::handle::*;
use crate::keys::{Keys, prefix_end};
use crate::txn::*;
use dnsplan_common::Generation;
use dnsplan_common::changes::{PlanChanges, PlanEntry};
use dnsplan_common::codec::{self};
use dnsplan_common::names::{DnsName, EndpointName};
use dnsplan_common::plan::ValidatedPlan;
use dnsplan_common::store::lease::{self, Lease};
use dnsplan_common::store::{PLAN_CHANGES_GAP_MAX, PauseState, Store, StoreError, StoreResult};
use std::sync::Arc;

/// Decoded plans kept for content checks and parent comparisons. Plans are immutable, so a
/// cached plan is never wrong; 8 covers every generation enactors apply at once.
pub(crate) const PLAN_CACHE_MAX: usize = 8;

/// Abandoned staging areas removed per publish (see `sweep_staging`): garbage goes a little
/// at a time, and never delays a publish much.
pub(crate) const STAGING_SWEEP_MAX: i64 = 16;

/// What one plan says of its endpoints: the plan itself, or an older plan and the changes
/// from it (the entry of every endpoint whose entry differs, in the newer plan).
pub(crate) enum PlanContents {
    Whole(Arc<ValidatedPlan>),
    Changed { base: Arc<ValidatedPlan>, changes: PlanChanges },
}

impl PlanContents {
    pub(crate) fn entry(&self, name: &EndpointName) -> PlanEntry {
        match self {
            PlanContents::Whole(plan) => PlanEntry::of(plan.plan(), name),
            PlanContents::Changed { base, changes } => {
                changes.changes.get(name).cloned().unwrap_or_else(|| PlanEntry::of(base.plan(), name))
            }
        }
    }
}

/// What etcd holds of a publish that failed (see `settle`).
pub(crate) enum Settled {
    Committed,
    NotCommitted,
}

/// A publish's large values live in chunks; these are what its transaction writes.
pub(crate) struct Staged {
    /// The staging key and nonce, when anything was chunked.
    pub(crate) staging: Option<(Vec<u8>, u64)>,
    pub(crate) plan: Vec<u8>,
    pub(crate) changes: Option<Vec<u8>>,
}

pub(crate) const BLOB_INLINE: u8 = b'I';

pub(crate) const BLOB_CHUNKED: u8 = b'C';

pub(crate) const KIND_PLAN: u8 = b'p';

pub(crate) const KIND_CHANGES: u8 = b'c';

/// A chunked value's manifest: nonce, kind, chunk count, total length.
pub(crate) fn manifest(nonce: u64, kind: u8, chunks: u32, len: u64) -> Vec<u8> {
    let mut m = vec![BLOB_CHUNKED];
    m.extend_from_slice(&nonce.to_be_bytes());
    m.push(kind);
    m.extend_from_slice(&chunks.to_be_bytes());
    m.extend_from_slice(&len.to_be_bytes());
    m
}

pub(crate) fn inline(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.push(BLOB_INLINE);
    v.extend_from_slice(bytes);
    v
}

impl EtcdStore {
    /// The keys of publishes in progress or abandoned (their chunks wait under them).
    pub async fn staging_keys(&self) -> StoreResult<usize> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("staging", vec![get_range(keys.staging_all(), prefix_end(&keys.staging_all()), 0)]).await?;
        Ok(r[0].kvs().len())
    }

    /// How many chunk keys the store holds.
    pub async fn chunk_keys(&self) -> StoreResult<usize> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("chunks", vec![get_range(keys.blobs(), prefix_end(&keys.blobs()), 0)]).await?;
        Ok(r[0].kvs().len())
    }

    pub(crate) fn cached_plan(&self, g: Generation) -> Option<Arc<ValidatedPlan>> {
        self.inner.plans.lock().ok()?.iter().find(|p| p.generation() == g).cloned()
    }

    pub(crate) fn cache_plan(&self, plan: Arc<ValidatedPlan>) {
        if let Ok(mut cache) = self.inner.plans.lock() {
            if cache.iter().any(|p| p.generation() == plan.generation()) {
                return;
            }
            cache.push_back(plan);
            while cache.len() > PLAN_CACHE_MAX {
                cache.pop_front();
            }
        }
    }

    /// What plan `g` says of each endpoint, for the content check: the plan if cached, else
    /// the newest cached plan below it with the changes since (a read of the change records,
    /// a few bytes for a small change), else the plan read whole. Each enactor's store has
    /// the plan it applied last cached, so a plan that changes one endpoint of 10,000 is not
    /// read whole by every enactor.
    pub(crate) async fn plan_contents(&self, g: Generation) -> StoreResult<PlanContents> {
        if let Some(plan) = self.cached_plan(g) {
            return Ok(PlanContents::Whole(plan));
        }
        let base = self.inner.plans.lock().ok().and_then(|cache| {
            cache
                .iter()
                .filter(|p| p.generation() < g && g.0 - p.generation().0 <= PLAN_CHANGES_GAP_MAX)
                .max_by_key(|p| p.generation())
                .cloned()
        });
        if let Some(base) = base
            && let Ok(Some(changes)) = self.plan_changes(base.generation(), g).await
        {
            return Ok(PlanContents::Changed { base, changes });
        }
        Ok(PlanContents::Whole(self.load_plan(g).await?))
    }

    /// A stored value, inline or in chunks. Chunks are immutable while their manifest exists
    /// (cleanup removes both in one transaction), so a missing chunk under a present manifest
    /// is corruption; under a removed one, the plan was cleaned up meanwhile.
    pub(crate) async fn read_blob(&self, g: Generation, key: &[u8], value: &[u8], what: &str) -> StoreResult<Vec<u8>> {
        match value.split_first() {
            Some((&BLOB_INLINE, rest)) => Ok(rest.to_vec()),
            Some((&BLOB_CHUNKED, rest)) if rest.len() == 8 + 1 + 4 + 8 => {
                let nonce = u64::from_be_bytes(rest[0..8].try_into().expect("8 bytes"));
                let kind = rest[8];
                let chunks = u32::from_be_bytes(rest[9..13].try_into().expect("4 bytes"));
                let len = u64::from_be_bytes(rest[13..21].try_into().expect("8 bytes"));
                if len > codec::BODY_BYTES_MAX as u64 + codec::HEADER_BYTES as u64 {
                    return Err(corrupt(what, format!("manifest claims {len} bytes")));
                }
                let mut bytes = Vec::with_capacity(len as usize);
                for index in 0..chunks {
                    let chunk = self.inner.keys.blob_chunk(g, nonce, kind, index);
                    let (_, r) = self.read(what, vec![get(chunk)]).await?;
                    let Some(kv) = first(&r[0]) else {
                        let (_, r) = self.read(what, vec![get(key.to_vec())]).await?;
                        if r[0].kvs().is_empty() {
                            return Err(StoreError::PlanNotFound(g));
                        }
                        return Err(corrupt(what, format!("chunk {index} of {chunks} is missing")));
                    };
                    bytes.extend_from_slice(kv.value());
                }
                if bytes.len() as u64 != len {
                    return Err(corrupt(what, format!("chunks hold {} bytes, the manifest says {len}", bytes.len())));
                }
                Ok(bytes)
            }
            _ => Err(corrupt(what, "neither an inline value nor a chunk manifest")),
        }
    }

    /// Plan `g` decoded, from the cache or from etcd.
    pub(crate) async fn load_plan(&self, g: Generation) -> StoreResult<Arc<ValidatedPlan>> {
        if let Some(plan) = self.cached_plan(g) {
            return Ok(plan);
        }
        let plan = Arc::new(self.read_plan(g).await?);
        self.cache_plan(plan.clone());
        Ok(plan)
    }

    pub(crate) async fn read_plan(&self, g: Generation) -> StoreResult<ValidatedPlan> {
        let what = format!("plan {g}");
        let (_, r) = self.read(&what, vec![get(self.inner.keys.plan(g))]).await?;
        let Some(kv) = first(&r[0]) else { return Err(StoreError::PlanNotFound(g)) };
        let bytes = self.read_blob(g, kv.key(), kv.value(), &what).await?;
        let plan = codec::decode_plan(&bytes).map_err(|e| StoreError::Corrupt { what: what.clone(), source: e })?;
        if plan.generation() != g {
            return Err(corrupt(what, format!("holds plan {}", plan.generation())));
        }
        Ok(plan)
    }

    pub(crate) async fn parent_changes(&self, plan: &ValidatedPlan) -> StoreResult<Option<PlanChanges>> {
        let parent = plan.plan().parent_generation;
        if parent.is_none() {
            return Ok(None);
        }
        let parent = match self.load_plan(parent).await {
            Ok(parent) => parent,
            Err(StoreError::PlanNotFound(_)) => return Ok(None),
            Err(err @ StoreError::Corrupt { .. }) => {
                tracing::error!(error = %err, "cannot read the parent plan; this plan's changes are not recorded and followers read it whole");
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        Ok(PlanChanges::between(parent.plan(), plan.plan()))
    }

    /// Writes the values of plan `g` too large for one request in chunks under a fresh nonce,
    /// registered first under a staging key that the publish transaction requires and removes.
    pub(crate) async fn stage(&self, g: Generation, plan: &[u8], changes: Option<&[u8]>) -> StoreResult<Staged> {
        let config = &self.inner.config;
        let large = |b: &[u8]| b.len() > config.inline_bytes_max();
        if !large(plan) && !changes.is_some_and(large) {
            return Ok(Staged { staging: None, plan: inline(plan), changes: changes.map(inline) });
        }
        let nonce = fresh_nonce();
        let staging = self.inner.keys.staging(g, nonce);
        let kv = &self.inner.client;
        self.call("publish staging", kv.put(staging.clone(), lease::now_unix_ms().to_be_bytes().to_vec(), None)).await?;
        let write = async |bytes: &[u8], kind: u8| -> StoreResult<Vec<u8>> {
            if !large(bytes) {
                return Ok(inline(bytes));
            }
            let mut count = 0u32;
            for (index, chunk) in bytes.chunks(config.chunk_bytes()).enumerate() {
                let key = self.inner.keys.blob_chunk(g, nonce, kind, index as u32);
                self.call("publish chunk", kv.put(key, chunk.to_vec(), None)).await?;
                count += 1;
            }
            Ok(manifest(nonce, kind, count, bytes.len() as u64))
        };
        let staged = async {
            let plan = write(plan, KIND_PLAN).await?;
            let changes = match changes {
                Some(c) => Some(write(c, KIND_CHANGES).await?),
                None => None,
            };
            Ok::<_, StoreError>((plan, changes))
        }
        .await;
        match staged {
            Ok((plan, changes)) => Ok(Staged { staging: Some((staging, nonce)), plan, changes }),
            Err(err) => {
                self.discard(g, nonce).await;
                Err(err)
            }
        }
    }

    /// Removes a staging area and its chunks (a publish that did not commit).
    pub(crate) async fn discard(&self, g: Generation, nonce: u64) {
        let keys = &self.inner.keys;
        let set = keys.blob_set(g, nonce);
        let txn = Txn::new().and_then(vec![delete_range(set.clone(), prefix_end(&set)), TxnOp::delete(keys.staging(g, nonce), None)]);
        if let Err(err) = self.txn("discard staging", txn).await {
            tracing::warn!(generation = %g, error = %err, "could not remove an uncommitted publish's chunks; a later publish removes them");
        }
    }

    /// Removes staging areas of generations at or below `latest`: their publish can never
    /// commit (its transaction requires `latest` to be one less), so they are garbage left by
    /// a publisher that died between chunks and commit.
    pub(crate) async fn sweep_staging(&self, latest: Generation) -> StoreResult<()> {
        let keys = &self.inner.keys;
        let end = keys.staging(Generation(latest.0.saturating_add(1)), 0);
        let gets =
            vec![TxnOp::get(keys.staging_all(), Some(GetOptions::new().with_range(end).with_limit(STAGING_SWEEP_MAX).with_keys_only()))];
        let (_, r) = self.read("staging sweep", gets).await?;
        for kv in r[0].kvs() {
            let rest = Keys::strip(kv.key(), &keys.staging_all()).unwrap_or_default();
            if rest.len() != 16 {
                tracing::warn!(key = ?kv.key(), "a staging key of the wrong shape; removing it");
                self.call("staging sweep", self.inner.client.delete(kv.key().to_vec(), None)).await?;
                continue;
            }
            let g = Generation::from_be_bytes(rest[..8].try_into().expect("8 bytes"));
            let nonce = u64::from_be_bytes(rest[8..].try_into().expect("8 bytes"));
            tracing::warn!(generation = %g, "removing the chunks of a publish that never committed");
            self.discard(g, nonce).await;
        }
        Ok(())
    }

    pub(crate) async fn publish_inner(&self, plan: &ValidatedPlan, lease: Option<&Lease>) -> StoreResult<()> {
        dnsplan_common::store::check_trusted(self.inner.config.keyring.as_deref(), plan)?;
        let changes = self.parent_changes(plan).await?;
        let plan_bytes = codec::encode_plan(plan);
        let summary = codec::encode(&plan.summary());
        let changes_bytes = changes.as_ref().map(codec::encode);
        let p = plan.plan();
        let (g, parent, zone, is_operator) = (p.generation, p.parent_generation, p.dns_zone.clone(), p.author.is_operator());
        let keys = &self.inner.keys;
        let mut staged: Option<Staged> = None;
        // Whether the error ending the publish came from its own transaction: etcd may have
        // committed it (a timeout after the commit), so it is settled against what etcd holds.
        let mut ambiguous = false;
        let result = async {
            for attempt in 0..ATTEMPTS_MAX {
                let (_, r) = self
                    .read(
                        "publish",
                        vec![
                            get(keys.latest()),
                            get(keys.pause()),
                            get(keys.lease_record()),
                            get(keys.lease_live()),
                            get(keys.dns_zone()),
                            get(keys.generation_base()),
                        ],
                    )
                    .await?;
                let latest = be_u64(first(&r[0]), "latest generation")?;
                let pause = first(&r[1]).map(|kv| kv.value().to_vec());
                let record = first(&r[2])
                    .map(|kv| codec::decode::<Lease>(kv.value()))
                    .transpose()
                    .map_err(|e| StoreError::Corrupt { what: "planner lease".into(), source: e })?;
                let live = first(&r[3]).map(|kv| kv.value().to_vec());
                let stored_zone = first(&r[4]).map(|kv| kv.value().to_vec());
                // The same decisions, in the same order, as the embedded store.
                let now = lease::now_unix_ms();
                let current = lease_view(record, live.as_deref(), now)?;
                match lease {
                    Some(lease) => lease::check_holder(current.as_ref(), lease, now)?,
                    None if !is_operator => lease::check_unleased(current.as_ref(), now)?,
                    None => {}
                }
                let latest = Generation(latest.unwrap_or(0));
                // Written once, when the zone is added, before any plan.
                let after = if latest.is_none() { Generation(be_u64(first(&r[5]), "generation base")?.unwrap_or(0)) } else { latest };
                let next = after.next().ok_or(StoreError::Exhausted(after))?;
                if g != next || parent != latest {
                    return Err(StoreError::Conflict { attempted: g, parent, latest });
                }
                if !is_operator && let Some(pause) = &pause {
                    let pause =
                        codec::decode::<PauseState>(pause).map_err(|e| StoreError::Corrupt { what: "pause state".into(), source: e })?;
                    return Err(StoreError::Paused { reason: pause.reason, by: pause.by.to_string() });
                }
                if let Some(stored) = &stored_zone {
                    let stored = DnsName::parse(&String::from_utf8_lossy(stored)).map_err(|e| corrupt("stored DNS zone", e.to_string()))?;
                    if stored != zone {
                        return Err(StoreError::DnsZoneMismatch { attempted: zone.clone(), stored });
                    }
                }
                if staged.is_none() {
                    staged = Some(self.stage(g, &plan_bytes, changes_bytes.as_deref()).await?);
                }
                let s = staged.as_ref().expect("staged above");
                // The compares restate every condition decided above.
                let mut compares = vec![cmp_u64(keys.latest(), (!latest.is_none()).then_some(latest.0))];
                match lease {
                    Some(lease) => compares.push(Compare::value(keys.lease_live(), CompareOp::Equal, lease_token(lease))),
                    None if !is_operator => compares.push(Compare::version(keys.lease_live(), CompareOp::Equal, 0)),
                    None => {}
                }
                if !is_operator {
                    compares.push(Compare::version(keys.pause(), CompareOp::Equal, 0));
                }
                compares.push(cmp_bytes(keys.dns_zone(), stored_zone.as_deref()));
                let mut ops = vec![
                    put(keys.plan(g), s.plan.clone()),
                    put(keys.summary(g), summary.clone()),
                    put(keys.latest(), g.to_be_bytes().to_vec()),
                ];
                if let Some(c) = &s.changes {
                    ops.push(put(keys.plan_changes(g), c.clone()));
                }
                if stored_zone.is_none() {
                    ops.push(put(keys.dns_zone(), zone.as_str().as_bytes().to_vec()));
                }
                if latest.is_none() {
                    ops.push(put(keys.horizon(), g.to_be_bytes().to_vec()));
                    ops.push(put(keys.layout(), LAYOUT.to_be_bytes().to_vec()));
                }
                if let Some((staging, _)) = &s.staging {
                    compares.push(Compare::version(staging.clone(), CompareOp::Greater, 0));
                    ops.push(TxnOp::delete(staging.clone(), None));
                }
                let response = match self.commit("publish", Txn::new().when(compares).and_then(ops)).await {
                    Ok(response) => response,
                    Err(err) => {
                        ambiguous = true;
                        return Err(err);
                    }
                };
                if response.succeeded() {
                    return Ok(());
                }
                back_off(attempt).await;
            }
            Err(contention("publish"))
        }
        .await;
        let result = match (result, &staged) {
            (Err(err), Some(s)) => match self.settle(g, s, ambiguous).await {
                Settled::Committed => {
                    tracing::info!(generation = %g, error = %err, "the publish's reply was lost, but etcd committed it");
                    Ok(())
                }
                Settled::NotCommitted => Err(err),
            },
            (result, _) => result,
        };
        if result.is_ok() {
            self.cache_plan(Arc::new(plan.clone()));
            if let Err(err) = self.sweep_staging(g).await {
                tracing::warn!(error = %err, "could not look for abandoned publishes");
            }
        }
        result
    }

    /// After a publish that failed: whether etcd holds this publish's own plan `g` (its
    /// transaction committed and only the reply was lost, when `ambiguous`), and otherwise the
    /// removal of its chunks and staging key. One transaction does both, so the chunks of a
    /// committed plan are never removed, and a commit still in flight finds its staging key gone
    /// and fails. A plan that is not chunked has nothing to remove: only an ambiguous error is
    /// settled, and one still in flight may yet commit (the caller is told `Unavailable`).
    pub(crate) async fn settle(&self, g: Generation, s: &Staged, ambiguous: bool) -> Settled {
        let keys = &self.inner.keys;
        let mut ours = vec![Compare::value(keys.plan(g), CompareOp::Equal, s.plan.clone())];
        if let Some(changes) = &s.changes {
            ours.push(Compare::value(keys.plan_changes(g), CompareOp::Equal, changes.clone()));
        }
        let remove = match &s.staging {
            Some((staging, nonce)) => {
                let set = keys.blob_set(g, *nonce);
                vec![delete_range(set.clone(), prefix_end(&set)), TxnOp::delete(staging.clone(), None)]
            }
            None if ambiguous => Vec::new(),
            None => return Settled::NotCommitted,
        };
        match self.txn("publish settle", Txn::new().when(ours).or_else(remove)).await {
            // A chunked plan's manifest names this publish's nonce: only its own commit put it
            // there. An inline plan with the same bytes is the same plan.
            Ok(r) if r.succeeded() && ambiguous => Settled::Committed,
            Ok(_) => Settled::NotCommitted,
            Err(err) => {
                tracing::warn!(generation = %g, error = %err, "could not settle a failed publish; a later publish or cleanup removes its chunks");
                Settled::NotCommitted
            }
        }
    }
}
