//! The plan chain: plans stored whole or as their changes, checkpoints, reads and lists.

use super::*;

/// Most plans published as changes after the newest plan stored whole before one is written
/// whole (see the module docs).
pub const CHECKPOINT_PLANS_MAX: u64 = 1_024;

/// The plans published as changes since the newest plan stored whole (the base), which
/// decide when the next checkpoint is due.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Chain {
    pub(super) base_bytes: u64,
    pub(super) plans: u64,
    pub(super) change_bytes: u64,
    /// A checkpoint is being written.
    pub(super) writing: bool,
}

impl Chain {
    pub(super) fn checkpoint_due(&self) -> bool {
        !self.writing && self.plans > 0 && (self.plans >= CHECKPOINT_PLANS_MAX || self.change_bytes * 2 >= self.base_bytes)
    }
}

/// What a read of a plan needs, taken under the lock and decoded after it.
pub(super) enum PlanBytes {
    Whole(sled::IVec),
    /// The newest plan stored whole below (none before the first plan), each later plan's
    /// changes in order, and the head of the plan read.
    Chain {
        base: Option<sled::IVec>,
        changes: Vec<sled::IVec>,
        head: sled::IVec,
    },
}

impl SledStore {
    /// The parent's decode runs on a blocking thread; the comparison with `plan` on the
    /// caller's, like the plan's encoding.
    pub(super) async fn changes_for(&self, plan: &ValidatedPlan) -> StoreResult<(Option<Vec<u8>>, ContentWrite)> {
        let changes = self.parent_changes(plan).await?;
        Ok(match changes {
            Some(changes) => (Some(codec::encode(&changes)), ContentWrite::changes(&changes)),
            None => (None, ContentWrite::whole(plan.plan())),
        })
    }

    pub(super) async fn parent_changes(&self, plan: &ValidatedPlan) -> StoreResult<Option<PlanChanges>> {
        let parent = plan.plan().parent_generation;
        if parent == Generation::NONE {
            return Ok(None);
        }
        let parent = match self.blocking(move |inner| inner.plan(parent)).await {
            Ok(parent) => parent,
            // Without the parent there is nothing to compare with; followers read this plan
            // whole. A publish that will conflict also ends up here.
            Err(StoreError::PlanNotFound(_)) => return Ok(None),
            Err(err @ StoreError::Corrupt { .. }) => {
                tracing::error!(error = %err, "cannot read the parent plan; this plan's changes are not recorded and followers read it whole");
                return Ok(None);
            }
            Err(err) => return Err(err),
        };
        Ok(PlanChanges::between(parent.plan(), plan.plan()))
    }
}

impl SledStore {
    /// Writes plan `generation` whole on a thread of its own, off the publish path. The
    /// thread holds the store only while it works; a store dropped first skips it, and the
    /// next publish finds the checkpoint due again.
    pub(super) fn spawn_checkpoint(&self, generation: Generation) {
        let weak = match self.current() {
            Ok(inner) => Arc::downgrade(&inner),
            Err(_) => return self.checkpoint_not_started(),
        };
        let spawned = std::thread::Builder::new().name("dnsplan-checkpoint".into()).spawn(move || {
            let Some(inner) = weak.upgrade() else { return };
            if let Err(err) = inner.write_checkpoint(generation) {
                tracing::warn!(error = %err, generation = generation.0, "could not write a plan whole; plans stay readable from their changes");
            }
        });
        if let Err(err) = spawned {
            tracing::warn!(error = %err, "could not start writing a plan whole; trying again after the next publish");
            self.checkpoint_not_started();
        }
    }

    pub(super) fn checkpoint_not_started(&self) {
        if let Ok(inner) = self.current()
            && let Ok(mut chain) = inner.chain_state()
        {
            chain.writing = false;
        }
    }
}

impl Inner {
    pub(super) fn chain_state(&self) -> StoreResult<MutexGuard<'_, Chain>> {
        self.chain.lock().map_err(|_| StoreError::Unavailable("store lock poisoned by an earlier failure; restart the process".into()))
    }

    /// The plans after the newest plan stored whole, as the store holds them now.
    pub(super) fn read_chain(&self) -> StoreResult<Chain> {
        let latest = self.latest()?;
        let Some((key, base)) = self.plans.range(..=latest.to_be_bytes()).next_back().transpose().map_err(io)? else {
            return Ok(Chain::default());
        };
        let mut chain = Chain { base_bytes: base.len() as u64, ..Chain::default() };
        let after = generation_key(&key)?.next().unwrap_or(Generation(u64::MAX));
        for value in self.plan_changes.range(after.to_be_bytes()..=latest.to_be_bytes()).values() {
            chain.plans += 1;
            chain.change_bytes += value.map_err(io)?.len() as u64;
        }
        Ok(chain)
    }

    /// Whether plan `generation` is stored, whole or as changes.
    pub(super) fn stored(&self, generation: Generation) -> StoreResult<bool> {
        let key = generation.to_be_bytes();
        Ok(self.plans.contains_key(key).map_err(io)?
            || (self.plan_heads.contains_key(key).map_err(io)? && self.plan_changes.contains_key(key).map_err(io)?))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish(
        &self,
        generation: Generation,
        parent: Generation,
        dns_zone: &DnsName,
        is_operator: bool,
        lease: Option<&Lease>,
        plan: Vec<u8>,
        summary: Vec<u8>,
        changes: Option<Vec<u8>>,
        contents: ContentWrite,
    ) -> StoreResult<()> {
        let _guard = self.guard()?;
        self.remove_pending_contents()?;
        self.check_publish(generation, parent, dns_zone, is_operator, lease)?;
        let key = generation.to_be_bytes();
        // Invariant: a plan's changes are recorded exactly when its contents are written as
        // changes; cleanup relies on it to find what to prune.
        assert_eq!(changes.is_some(), !contents.full, "plan {generation}: changes recorded and contents written whole");
        let ahead = contents.len() > CONTENTS_IN_TXN_MAX;
        if ahead && let Err(err) = self.write_contents_ahead(generation, &contents) {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        let trees = (
            self.plans.tree(),
            self.summaries.tree(),
            self.plan_changes.tree(),
            self.meta.tree(),
            self.contents.tree(),
            self.contents_full.tree(),
            self.contents_chunks.tree(),
        );
        let committed = trees
            .transaction(|(plans, summaries, plan_changes, meta, content, content_full, content_chunks)| {
                let (plans, summaries, plan_changes) =
                    (self.plans.view(plans), self.summaries.view(summaries), self.plan_changes.view(plan_changes));
                let (meta, content) = (self.meta.view(meta), self.contents.view(content));
                let (content_full, content_chunks) = (self.contents_full.view(content_full), self.contents_chunks.view(content_chunks));
                plans.insert(key, plan.as_slice())?;
                summaries.insert(key, summary.as_slice())?;
                if let Some(changes) = &changes {
                    plan_changes.insert(key, changes.as_slice())?;
                }
                if ahead {
                    meta.remove(META_CONTENTS_PENDING)?;
                } else {
                    for (k, v) in &contents.entries {
                        content.insert(k.as_slice(), v.as_slice())?;
                    }
                    for (k, v) in &contents.chunks {
                        content_chunks.insert(k.as_slice(), v.as_slice())?;
                    }
                }
                if contents.full {
                    content_full.insert(key, &[])?;
                }
                meta.insert(META_LATEST, &key)?;
                meta.insert(META_DNS_ZONE, dns_zone.as_str().as_bytes())?;
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(tx_error);
        if let Err(err) = committed {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        self.flush()?;
        {
            let mut chain = self.chain_state()?;
            *chain = Chain { base_bytes: plan.len() as u64, writing: chain.writing, ..Chain::default() };
        }
        self.publish_version()
    }

    /// The checks every publish makes under the lock before it writes: the lease (the fencing
    /// token, in the same critical section as the CAS), the CAS, the pause, the DNS zone.
    pub(super) fn check_publish(
        &self,
        generation: Generation,
        parent: Generation,
        dns_zone: &DnsName,
        is_operator: bool,
        lease: Option<&Lease>,
    ) -> StoreResult<()> {
        let current = self.read_lease()?;
        match lease {
            Some(lease) => lease::check_holder(current.as_ref(), lease, lease::now_unix_ms())?,
            None if !is_operator => lease::check_unleased(current.as_ref(), lease::now_unix_ms())?,
            None => {}
        }
        let latest = self.latest()?;
        let after = if latest.is_none() { self.generation_base()? } else { latest };
        let next = after.next().ok_or(StoreError::Exhausted(after))?;
        if generation != next || parent != latest {
            return Err(StoreError::Conflict { attempted: generation, parent, latest });
        }
        if !is_operator && let Some(pause) = self.paused()? {
            return Err(StoreError::Paused { reason: pause.reason, by: pause.by.to_string() });
        }
        if let Some(stored) = self.meta.get(META_DNS_ZONE).map_err(io)? {
            let stored = DnsName::parse(&String::from_utf8_lossy(&stored))
                .map_err(|e| corrupt("stored DNS zone", codec::CodecError::Body { kind: "DNS zone".into(), detail: e.to_string() }))?;
            if &stored != dns_zone {
                return Err(StoreError::DnsZoneMismatch { attempted: dns_zone.clone(), stored });
            }
        }
        Ok(())
    }

    /// Publishes `delta` as its changes: the CAS and every check of `publish`, the whole-plan
    /// rules from the parent's counts and each named endpoint's entry in the parent, and one
    /// transaction writing the head, the summary, the changes and their `contents`. Costs
    /// what changed. Returns whether a checkpoint is now due, or `None` when the delta is
    /// not published here because its answer needs the parent read whole: the first plan
    /// (no parent), or an automation plan that leaves some of the parent's retirements in
    /// place (refused, and the refusal names one). The caller then publishes it whole.
    pub(super) fn publish_changes(&self, delta: &PlanDelta, lease: Option<&Lease>) -> StoreResult<Option<bool>> {
        let head = &delta.head;
        let (generation, parent, is_operator) = (head.generation, head.parent_generation, head.author.is_operator());
        let _guard = self.guard()?;
        self.remove_pending_contents()?;
        self.check_publish(generation, parent, &head.dns_zone, is_operator, lease)?;
        if parent.is_none() {
            return Ok(None);
        }
        let key = generation.to_be_bytes();
        let parent_summary = self.summaries.get(parent.to_be_bytes()).map_err(io)?.ok_or_else(|| {
            corrupt(format!("the summary of the latest plan {parent} is missing"), codec::CodecError::Truncated { len: 0 })
        })?;
        let parent_summary = codec::decode::<PlanSummary>(&parent_summary).map_err(|e| corrupt("plan summary", e))?;
        let (mut served, mut retired) = (parent_summary.endpoint_count, parent_summary.retired_count);
        let mut changes = std::collections::BTreeMap::new();
        let mut reader = self.content_reader(parent)?;
        for (name, entry) in &delta.changes {
            let before = self.content_at(name, &mut reader)?;
            if &before == entry {
                continue;
            }
            match before {
                PlanEntry::Serve(_) => served = served.saturating_sub(1),
                PlanEntry::Retire => retired = retired.saturating_sub(1),
                PlanEntry::Absent => {}
            }
            match entry {
                PlanEntry::Serve(_) => served += 1,
                PlanEntry::Retire => retired += 1,
                PlanEntry::Absent => {}
            }
            changes.insert(name.clone(), entry.clone());
        }
        let total = served + retired;
        if total > ENDPOINTS_PER_PLAN_MAX as u64 {
            return Err(StoreError::Invalid(ValidationError::TooManyEndpoints { count: total as usize }));
        }
        if total == 0 {
            return Err(StoreError::Invalid(ValidationError::NoEndpoints));
        }
        if retired > 0 && !is_operator {
            return Ok(None);
        }
        let summary = PlanSummary {
            generation,
            parent_generation: parent,
            created_at_unix_ms: head.created_at_unix_ms,
            author: head.author.clone(),
            reason: head.reason.clone(),
            endpoint_count: served,
            retired_count: retired,
            rollback_of: head.rollback_of,
        };
        let changes = PlanChanges {
            from: parent,
            to: generation,
            dns_zone: head.dns_zone.clone(),
            rollback_of: head.rollback_of,
            endpoint_count: served,
            changes,
        };
        let contents = ContentWrite::changes(&changes);
        let (head_bytes, summary_bytes, changes_bytes) = (codec::encode(head), codec::encode(&summary), codec::encode(&changes));
        let dns_zone = head.dns_zone.as_str().as_bytes();
        let ahead = contents.entries.len() > CONTENTS_IN_TXN_MAX;
        if ahead && let Err(err) = self.write_contents_ahead(generation, &contents) {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        let trees = (self.plan_heads.tree(), self.summaries.tree(), self.plan_changes.tree(), self.meta.tree(), self.contents.tree());
        let committed = trees
            .transaction(|(plan_heads, summaries, plan_changes, meta, content)| {
                let (plan_heads, summaries) = (self.plan_heads.view(plan_heads), self.summaries.view(summaries));
                let (plan_changes, meta, content) =
                    (self.plan_changes.view(plan_changes), self.meta.view(meta), self.contents.view(content));
                plan_heads.insert(key, head_bytes.as_slice())?;
                summaries.insert(key, summary_bytes.as_slice())?;
                plan_changes.insert(key, changes_bytes.as_slice())?;
                if ahead {
                    meta.remove(META_CONTENTS_PENDING)?;
                } else {
                    for (k, v) in &contents.entries {
                        content.insert(k.as_slice(), v.as_slice())?;
                    }
                }
                meta.insert(META_LATEST, &key)?;
                meta.insert(META_DNS_ZONE, dns_zone)?;
                Ok::<_, ConflictableTransactionError<StoreError>>(())
            })
            .map_err(tx_error);
        if let Err(err) = committed {
            let _ = self.remove_pending_contents();
            return Err(err);
        }
        self.flush()?;
        let due = {
            let mut chain = self.chain_state()?;
            chain.plans += 1;
            chain.change_bytes += changes_bytes.len() as u64;
            let due = chain.checkpoint_due();
            chain.writing |= due;
            due
        };
        self.publish_version()?;
        Ok(Some(due))
    }

    /// What reading plan `generation` needs, taken under the lock.
    pub(super) fn plan_bytes(&self, generation: Generation) -> StoreResult<PlanBytes> {
        let _guard = self.guard()?;
        if generation < self.horizon()? {
            return Err(StoreError::PlanNotFound(generation));
        }
        let key = generation.to_be_bytes();
        if let Some(bytes) = self.plans.get(key).map_err(io)? {
            return Ok(PlanBytes::Whole(bytes));
        }
        let head = self.plan_heads.get(key).map_err(io)?.ok_or(StoreError::PlanNotFound(generation))?;
        let (base, from) = match self.plans.range(..key).next_back().transpose().map_err(io)? {
            Some((key, bytes)) => (Some(bytes), generation_key(&key)?),
            None => (None, Generation::NONE),
        };
        let first = Generation(from.0 + 1).to_be_bytes();
        let changes = self.plan_changes.range(first..=key).values().collect::<Result<Vec<_>, _>>().map_err(io)?;
        if changes.len() as u64 != generation.0 - from.0 {
            return Err(corrupt(
                format!("plan {generation} is stored as changes, but some of the changes after plan {from} are missing"),
                codec::CodecError::Truncated { len: 0 },
            ));
        }
        Ok(PlanBytes::Chain { base, changes, head })
    }

    pub(super) fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        // Plans are immutable: decoding outside the lock cannot see a torn plan, and keeps a
        // large decode from stalling every other operation.
        let (base, changes, head) = match self.plan_bytes(generation)? {
            PlanBytes::Whole(bytes) => return codec::decode_plan(&bytes).map_err(|e| corrupt(format!("plan {generation}"), e)),
            PlanBytes::Chain { base, changes, head } => (base, changes, head),
        };
        let (mut endpoints, mut retired) = match base {
            Some(bytes) => {
                let base = codec::decode::<crate::plan::Plan>(&bytes).map_err(|e| corrupt(format!("the plan below {generation}"), e))?;
                (base.endpoints, base.retired)
            }
            None => Default::default(),
        };
        for bytes in changes {
            let step = decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?;
            apply_entries(&mut endpoints, &mut retired, step.changes);
        }
        let head = codec::decode::<PlanHead>(&head).map_err(|e| corrupt(format!("plan {generation}'s head"), e))?;
        ValidatedPlan::new(head.with_endpoints(endpoints, retired))
            .map_err(|e| corrupt(format!("plan {generation}, read from its changes"), codec::CodecError::Invalid(e)))
    }

    /// Writes plan `generation` whole (a checkpoint), then takes stock of the chain again.
    pub(super) fn write_checkpoint(&self, generation: Generation) -> StoreResult<()> {
        let plan = self.plan(generation);
        let _guard = self.guard()?;
        let written = match plan {
            Ok(plan) if generation >= self.horizon()? => {
                self.plans.insert(generation.to_be_bytes(), codec::encode_plan(&plan)).map_err(io)?;
                self.flush()
            }
            Ok(_) | Err(StoreError::PlanNotFound(_)) => Ok(()),
            Err(err) => Err(err),
        };
        let chain = self.read_chain();
        let mut state = self.chain_state()?;
        state.writing = false;
        if let Ok(chain) = &chain {
            *state = *chain;
        }
        written.and(chain.map(|_| ()))
    }

    pub(super) fn plan_changes(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        if to.0.checked_sub(from.0).is_none_or(|gap| gap > PLAN_CHANGES_GAP_MAX) {
            return Ok(None);
        }
        let records = {
            let _guard = self.guard()?;
            if to < self.horizon()? || to > self.latest()? {
                return Err(StoreError::PlanNotFound(to));
            }
            let (first, last) = (Generation(from.0 + 1).to_be_bytes(), to.to_be_bytes());
            let records = self.plan_changes.range(first..=last).values().collect::<Result<Vec<_>, _>>().map_err(io)?;
            if records.len() as u64 != to.0 - from.0 {
                return Ok(None);
            }
            records
        };
        let mut folded: Option<PlanChanges> = None;
        for bytes in records {
            let step = decode_changes(&bytes).map_err(|e| corrupt("plan changes", e))?;
            folded = match folded {
                None => Some(step),
                Some(acc) => match acc.then(step) {
                    Some(next) => Some(next),
                    None => return Ok(None),
                },
            };
        }
        Ok(folded.filter(|c| c.from == from && c.to == to))
    }

    pub(super) fn list(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        let _guard = self.guard()?;
        let from = from.max(self.horizon()?);
        self.summaries
            .range(from.to_be_bytes()..)
            .values()
            .take(limit)
            .map(|bytes| {
                let bytes = bytes.map_err(io)?;
                codec::decode::<PlanSummary>(&bytes).map_err(|e| corrupt("plan summary", e))
            })
            .collect()
    }
}
