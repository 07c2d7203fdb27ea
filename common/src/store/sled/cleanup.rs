//! Cleanup: which plans may go, and removing them.

use super::*;

impl Inner {
    /// Removes the bytes of plans below `horizon` that no plan from `horizon` on is read from:
    /// those older than the newest plan stored whole at or below it.
    pub(super) fn remove_plans_below(&self, horizon: Generation) -> StoreResult<()> {
        let Some(base) = self.plans.range(..=horizon.to_be_bytes()).next_back().transpose().map_err(io)? else {
            return Ok(());
        };
        let keep_from = generation_key(&base.0)?;
        for tree in [&self.plans, &self.plan_heads, &self.summaries, &self.plan_changes] {
            let mut batch = tree.batch();
            for key in tree.range(..keep_from.to_be_bytes().to_vec()).keys() {
                batch.remove(key.map_err(io)?);
            }
            tree.apply_batch(batch).map_err(io)?;
        }
        Ok(())
    }

    pub(super) fn decide(&self, retain: u64) -> StoreResult<CleanupDecision> {
        let oldest = match self.fence_counts.first().map_err(io)? {
            None => None,
            Some((key, value)) => {
                let g = generation_key(&key)?;
                let mut count = FenceCount::decode(&value)?;
                if count.witness.is_empty() {
                    count.witness = self.serving_at(g)?.as_str().as_bytes().to_vec();
                    // For the next decision; nothing depends on it, so it is not flushed.
                    self.fence_counts.insert(key, count.encode()).map_err(io)?;
                }
                Some((g, parse_name(&count.witness, "fence count witness")?))
            }
        };
        Ok(decide_cleanup(self.horizon()?, self.latest()?, oldest, retain))
    }

    /// An endpoint serving with fence `generation`, found by a scan of `active_runs` (the cost of
    /// a fence count whose witness moved on).
    pub(super) fn serving_at(&self, generation: Generation) -> StoreResult<EndpointName> {
        for run in self.active_runs.iter().values() {
            let run = codec::decode::<ActiveRun>(&run.map_err(io)?).map_err(|e| corrupt("active run", e))?;
            for (name, record) in run.records {
                if record.generation == generation && matches!(record.state, ActiveState::Serving(_)) {
                    return parse_name(name.as_bytes(), "active endpoint name");
                }
            }
        }
        Err(corrupt(
            format!("fence count of plan {generation}"),
            codec::CodecError::Body { kind: "fence count".into(), detail: "counts endpoints serving with it, but none does".into() },
        ))
    }

    pub(super) fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        let _guard = self.guard()?;
        self.decide(retain)
    }

    pub(super) fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        let _guard = self.guard()?;
        let decision = self.decide(retain)?;
        if decision.deleted_count() == 0 {
            return Ok(decision);
        }
        let control = self.meta_u64(META_CONTROL, 0)?.wrapping_add(1);
        let mut batch = self.meta.batch();
        batch.insert(META_HORIZON, &decision.horizon_after.to_be_bytes());
        batch.insert(META_CONTROL, &control.to_be_bytes());
        self.meta.apply_batch(batch).map_err(io)?;
        self.flush()?;
        // Space only: what no stored plan resolves to. A crash before it leaves entries that
        // are never read; they go with a later scan.
        self.prune_contents(decision.horizon_before, decision.horizon_after)?;
        self.remove_plans_below(decision.horizon_after)?;
        self.flush()?;
        self.publish_version()?;
        Ok(decision)
    }
}
