//! The active set: fenced switches, the applied-change slots, and the reads of what is served.

use crate::active_log::ActiveLog;
use crate::client::{Compare, CompareOp, GetOptions, GetResponse, KeyValue, Txn, TxnOp};
use crate::handle::*;
use crate::keys::{Keys, prefix_end};
use crate::txn::*;
use dnsplan_common::Generation;
use dnsplan_common::codec::{self, CodecError};
use dnsplan_common::names::EndpointName;
use dnsplan_common::plan::validate_endpoint;
use dnsplan_common::store::{
    ACTIVE_PAGE_MAX, ActiveRecord, ActiveState, ApplyOutcome, StoreError, StoreResult, StoreVersion, check_generation, content_changed,
    fence_step, plan_says,
};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long `active_since` waits for its log of the active writes to receive the last switch
/// (normally a millisecond or two after the commit) before it asks etcd instead.
pub(crate) const ACTIVE_LOG_WAIT: Duration = Duration::from_millis(100);

/// `key`'s value is `observed` (absent when `None`).
/// A read of every slot of the applied-change counter.
pub(crate) fn get_applied(keys: &Keys) -> TxnOp {
    get_range(keys.applied(), prefix_end(&keys.applied()), 0)
}

/// The counts of one slot of the applied-change counter: its applied changes and its content
/// changes (apply transactions that changed what is served), each big-endian.
pub(crate) fn slot_counts(kv: &KeyValue) -> StoreResult<(u64, u64)> {
    match kv.value().split_first_chunk::<8>() {
        Some((applied, content)) if content.len() == 8 => {
            let content: [u8; 8] = content.try_into().map_err(|_| corrupt_slot(16))?;
            Ok((u64::from_be_bytes(*applied), u64::from_be_bytes(content)))
        }
        _ => Err(corrupt_slot(kv.value().len())),
    }
}

fn corrupt_slot(len: usize) -> StoreError {
    StoreError::Corrupt { what: "applied-change count".to_owned(), source: CodecError::LengthMismatch { declared: 16, actual: len } }
}

/// The applied-change count and the content-change count (the sums of the slots) and the
/// revision of the last switch (every switch writes a slot), from a `get_applied` read.
pub(crate) fn applied_of(response: &GetResponse) -> StoreResult<(u64, u64, i64)> {
    let (mut applied, mut content) = (0u64, 0u64);
    let mut last = 0;
    for kv in response.kvs() {
        let (a, c) = slot_counts(kv)?;
        applied = applied.wrapping_add(a);
        content = content.wrapping_add(c);
        last = last.max(kv.mod_revision());
    }
    Ok((applied, content, last))
}

impl EtcdStore {
    /// The fenced write of `apply`, `retire` and `apply_many`. A batch larger than one
    /// transaction commits part by part; one refused part-way (`Pruned`, `Unavailable`) keeps
    /// the parts before it, which a retry finds `Unchanged`.
    pub(crate) async fn switch_many(
        &self,
        g: Generation,
        items: Vec<(EndpointName, ActiveState)>,
    ) -> StoreResult<Vec<StoreResult<ApplyOutcome>>> {
        let keys = &self.inner.keys;
        let (_, r) = self.read("apply", vec![get(keys.latest()), get(keys.horizon())]).await?;
        let latest = Generation(be_u64(first(&r[0]), "latest generation")?.unwrap_or(0));
        let horizon = Generation(be_u64(first(&r[1]), "horizon")?.unwrap_or(Generation::FIRST.0));
        check_generation(g, latest, horizon)?;
        let plan = match self.plan_contents(g).await {
            Ok(plan) => plan,
            Err(StoreError::PlanNotFound(_)) => {
                let (_, r) = self.read("apply", vec![get(keys.horizon())]).await?;
                let horizon = Generation(be_u64(first(&r[0]), "horizon")?.unwrap_or(Generation::FIRST.0));
                return Err(StoreError::Pruned { attempted: g, horizon });
            }
            Err(err) => return Err(err),
        };
        // Pair check, then the content check: plans are immutable, so what plan `g` says is
        // the same now as at the write; the write itself is fenced on the horizon, which keeps
        // plan `g` stored.
        let mut results: Vec<Option<StoreResult<ApplyOutcome>>> = Vec::with_capacity(items.len());
        let mut pending = Vec::new();
        for (i, (name, state)) in items.iter().enumerate() {
            if let ActiveState::Serving(records) = state
                && let Err(err) = validate_endpoint(name, records)
            {
                results.push(Some(Err(err.into())));
                continue;
            }
            if let Some(plan) = plan_says(&plan.entry(name), state) {
                results.push(Some(Err(StoreError::ContentMismatch { endpoint: name.clone(), generation: g, plan })));
                continue;
            }
            results.push(None);
            pending.push(i);
        }
        let records: Vec<Vec<u8>> =
            items.iter().map(|(_, state)| codec::encode(&ActiveRecord { generation: g, state: state.clone() })).collect();
        // Parts that fit etcd's limits on operations and request size.
        let bytes_max = self.inner.config.request_bytes_max / 2;
        let mut part: Vec<usize> = Vec::new();
        let mut part_bytes = 0;
        for i in pending {
            let size = records[i].len() + 3 * keys.active(&items[i].0).len() + 64;
            if !part.is_empty() && (part.len() == self.inner.config.switches_per_txn() || part_bytes + size > bytes_max) {
                self.switch_part(g, &items, &records, &std::mem::take(&mut part), &mut results).await?;
                part_bytes = 0;
            }
            part.push(i);
            part_bytes += size;
        }
        if !part.is_empty() {
            self.switch_part(g, &items, &records, &part, &mut results).await?;
        }
        Ok(results.into_iter().map(|r| r.expect("every item has a result")).collect())
    }

    /// One transaction's share of a batch: each endpoint's write conditional on its fence as
    /// read, on this store's slot of the applied-change counter as read and on the horizon, all
    /// at once.
    pub(crate) async fn switch_part(
        &self,
        g: Generation,
        items: &[(EndpointName, ActiveState)],
        records: &[Vec<u8>],
        part: &[usize],
        results: &mut [Option<StoreResult<ApplyOutcome>>],
    ) -> StoreResult<()> {
        let keys = &self.inner.keys;
        for attempt in 0..ATTEMPTS_MAX {
            let slot = self.inner.slot.load(Ordering::Relaxed);
            let slot_key = keys.applied_slot(slot);
            let mut gets = vec![get(slot_key.clone()), get(keys.horizon())];
            gets.extend(part.iter().map(|&i| get(keys.fence(&items[i].0))));
            // The records as served now, to tell whether a switch changes what is served.
            gets.extend(part.iter().map(|&i| get(keys.active(&items[i].0))));
            let (_, r) = self.read("apply", gets).await?;
            let slot_read = first(&r[0]);
            let (applied, content) = slot_read.map(slot_counts).transpose()?.unwrap_or((0, 0));
            let horizon = Generation(be_u64(first(&r[1]), "horizon")?.unwrap_or(Generation::FIRST.0));
            if g < horizon {
                return Err(StoreError::Pruned { attempted: g, horizon });
            }
            let mut outcomes = Vec::with_capacity(part.len());
            let mut compares = vec![Compare::value(keys.horizon(), CompareOp::Less, Generation(g.0 + 1).to_be_bytes().to_vec())];
            let mut ops = Vec::new();
            let mut count = applied;
            let mut content_moved = false;
            let (fences, served) = r[2..].split_at(part.len());
            for ((&i, fence), served) in part.iter().zip(fences).zip(served) {
                let (name, state) = &items[i];
                let current = be_u64(first(fence), &format!("fence of {name}"))?.map(Generation);
                let outcome = match fence_step(name, current, g) {
                    Ok(ApplyOutcome::Switched { previous }) => {
                        compares.push(cmp_u64(keys.fence(name), current.map(|c| c.0)));
                        ops.push(put(keys.active(name), records[i].clone()));
                        ops.push(put(keys.fence(name), g.to_be_bytes().to_vec()));
                        if let Some(old) = current {
                            ops.push(TxnOp::delete(keys.serving(old, name), None));
                        }
                        if matches!(state, ActiveState::Serving(_)) {
                            ops.push(put(keys.serving(g, name), Vec::new()));
                        }
                        count = count.wrapping_add(1);
                        let before = first(served).map(|kv| Self::decode_active(kv, &keys.active_all())).transpose()?;
                        content_moved |= content_changed(before.as_ref().map(|(_, record)| &record.state), state);
                        Ok(ApplyOutcome::Switched { previous })
                    }
                    decided => decided,
                };
                outcomes.push(outcome);
            }
            if ops.is_empty() {
                for (&i, outcome) in part.iter().zip(outcomes) {
                    results[i] = Some(outcome);
                }
                return Ok(());
            }
            compares.push(match slot_read {
                None => Compare::version(slot_key.clone(), CompareOp::Equal, 0),
                Some(kv) => Compare::value(slot_key.clone(), CompareOp::Equal, kv.value().to_vec()),
            });
            let content = content.wrapping_add(u64::from(content_moved));
            ops.push(put(slot_key, [count.to_be_bytes(), content.to_be_bytes()].concat()));
            let response = self.commit("apply", Txn::new().when(compares).and_then(ops)).await?;
            if response.succeeded() {
                for (&i, outcome) in part.iter().zip(outcomes) {
                    results[i] = Some(outcome);
                }
                return Ok(());
            }
            // A fence or the slot moved: if the slot, another writer is on it, so move on.
            self.inner.slot.store(fresh_nonce() as usize % APPLIED_SLOTS, Ordering::Relaxed);
            back_off(attempt).await;
        }
        Err(contention("apply"))
    }

    pub(crate) async fn read_version(&self) -> StoreResult<(StoreVersion, i64)> {
        let keys = &self.inner.keys;
        let (revision, r) = self.read("version", vec![get(keys.latest()), get_applied(keys), get(keys.control())]).await?;
        let version = StoreVersion {
            latest: Generation(be_u64(first(&r[0]), "latest generation")?.unwrap_or(0)),
            applied_changes: applied_of(&r[1])?.0,
            control_changes: be_u64(first(&r[2]), "control count")?.unwrap_or(0),
        };
        self.note_revision(version.applied_changes, revision);
        Ok((version, revision))
    }

    pub(crate) fn decode_active(kv: &KeyValue, prefix: &[u8]) -> StoreResult<(EndpointName, ActiveRecord)> {
        Self::decode_active_parts(kv.key(), kv.value(), prefix)
    }

    pub(crate) fn decode_active_parts(key: &[u8], value: &[u8], prefix: &[u8]) -> StoreResult<(EndpointName, ActiveRecord)> {
        let name = name_of(key, prefix, "active endpoint name")?;
        let record = codec::decode::<ActiveRecord>(value)
            .map_err(|e| StoreError::Corrupt { what: format!("active record of {name}"), source: e })?;
        Ok((name, record))
    }

    /// This store's log of the active writes, started (from `revision`) if it is not running.
    pub(crate) fn active_log(&self, revision: i64) -> Arc<ActiveLog> {
        let mut running = self.inner.active_log.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match &*running {
            Some(log) if !log.broken() => log.clone(),
            _ => {
                let log = Arc::new(ActiveLog::start(self.inner.client.clone(), self.inner.keys.active_all(), revision));
                *running = Some(log.clone());
                log
            }
        }
    }

    /// Test-only: how many `active_since` answers came from the store's own log of the active
    /// writes rather than from a read of etcd.
    #[cfg(feature = "testing")]
    pub fn active_since_from_log(&self) -> u64 {
        self.inner.from_log.load(Ordering::Relaxed)
    }

    /// A read of the active records last written after revision `from`, from key `start` on,
    /// a page at a time, at revision `at` (the current one when `None`): etcd reads the range
    /// and keeps the keys whose `mod_revision` is above `from`. Active records are never
    /// deleted, and compaction keeps each key's last write, so this is exactly what was written
    /// since `from`, however much history etcd has compacted.
    ///
    /// Not a watch from `from`: etcd delivers the history of a watch that starts in the past
    /// only from its unsynced-watcher loop, every 100 ms, where a read answers at once.
    pub(crate) fn written_after(&self, start: Vec<u8>, from: i64, at: Option<i64>) -> TxnOp {
        let options = GetOptions::new()
            .with_range(prefix_end(&self.inner.keys.active_all()))
            .with_min_mod_revision(from + 1)
            .with_limit(ACTIVE_PAGE_MAX as i64);
        TxnOp::get(start, Some(at.map_or(options.clone(), |at| options.with_revision(at))))
    }
}
