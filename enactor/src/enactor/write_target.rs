//! Where an enactor writes, the one place that tells the two apart: the store itself (its
//! fenced `apply_many` and `retire`), or an RFC 2136 primary, where each name's marker is the
//! fence and the writes the server acknowledged are then recorded in the store through the
//! store's own fence. `Enactor::write` calls `write_batch` and `retire_one` and keeps one copy
//! of the bookkeeping (hooks, counts, what an abandoned application carries) for both.

use super::*;

/// The target of an enactor's writes (`[target]` in its config).
pub(super) enum WriteTarget {
    Store,
    Rfc2136(Rfc2136),
}

impl WriteTarget {
    pub(super) fn new(target: &Target) -> WriteTarget {
        match target {
            Target::Store => WriteTarget::Store,
            Target::Rfc2136(target) => WriteTarget::Rfc2136(Rfc2136::new(target.clone())),
        }
    }

    /// The RFC 2136 primary, when plans are written to one.
    pub(super) fn rfc2136(&self) -> Option<&Rfc2136> {
        match self {
            WriteTarget::Store => None,
            WriteTarget::Rfc2136(target) => Some(target),
        }
    }
}

impl<S: Store> Enactor<S> {
    /// Writes one batch of plan `generation` (every hook point passed before any write is
    /// sent); `full` on a pass that wrote every endpoint (a reconcile). Results are the
    /// store's words, one per item, for both targets.
    pub(super) async fn write_batch(
        &self,
        generation: Generation,
        batch: &[ApplyItem],
        full: bool,
    ) -> Result<Vec<StoreResult<ApplyOutcome>>, Step> {
        match &self.target {
            WriteTarget::Rfc2136(target) => self.write_target(target, generation, batch, full).await,
            WriteTarget::Store => {
                for item in batch {
                    self.hooks.before_write(&self.settings.id, generation, &item.endpoint).await;
                }
                let span = tracing::debug_span!("apply", endpoints = batch.len(), first = %batch[0].endpoint);
                match self.call("apply_many", || self.store.apply_many(generation, batch)).instrument(span).await {
                    Ok(results) => Ok(results),
                    Err(StoreError::Pruned { .. }) => Err(self.move_to_latest("pruned").await),
                    Err(err) => Err(Step::Failed(err)),
                }
            }
        }
    }

    /// Retires `name` at plan `generation`.
    pub(super) async fn retire_one(&self, generation: Generation, name: &EndpointName) -> Result<StoreResult<ApplyOutcome>, Step> {
        match &self.target {
            WriteTarget::Rfc2136(target) => self.retire_target(target, generation, name).await,
            WriteTarget::Store => {
                self.hooks.before_write(&self.settings.id, generation, name).await;
                let span = tracing::debug_span!("retire", endpoint = %name);
                Ok(self.call("retire", || self.store.retire(name, generation)).instrument(span).await)
            }
        }
    }

    /// Writes one batch onto the RFC 2136 target, `in_flight` names (a target setting) at a
    /// time: their markers are read (the decisions), then each gets its fenced UPDATE (the
    /// hook points `before_write` sit between the two, where a slow writer holds a stale
    /// read). The
    /// writes the target acknowledged are then recorded in the store through its own fence,
    /// so that the store's fences, and the cleanup floor behind them, never run ahead of
    /// what the target serves. Results are the store's words for the same outcomes. On a
    /// `full` pass (a reconcile), the names already at this plan are checked for drift and
    /// repaired through the fence (`Rfc2136::repair_many`).
    async fn write_target(
        &self,
        target: &Rfc2136,
        generation: Generation,
        batch: &[ApplyItem],
        full: bool,
    ) -> Result<Vec<StoreResult<ApplyOutcome>>, Step> {
        // A part at a time (`in_flight` messages of `NAMES_PER_UPDATE` names), each read just
        // before it is written: the other enactors then find the names they reach already
        // written (unchanged, a read) instead of all reading the whole batch first and each
        // sending every UPDATE.
        let mut written = Vec::with_capacity(batch.len());
        for part in batch.chunks(target.settings().in_flight.max(1) * crate::rfc2136::NAMES_PER_UPDATE) {
            let names: Vec<EndpointName> = part.iter().map(|item| item.endpoint.clone()).collect();
            let markers = target.read_markers(&names).await.map_err(Step::TargetFailed)?;
            // As for the store, every write of the part waits for its hook before any is sent.
            for item in part {
                self.hooks.before_write(&self.settings.id, generation, &item.endpoint).await;
            }
            let writes = part.iter().zip(markers).map(|(item, marker)| (item.endpoint.clone(), item.records.clone(), marker)).collect();
            written.extend(target.write_many(generation, writes, self.metrics.clone()).await.map_err(Step::TargetFailed)?);
        }
        if full {
            let at_plan: Vec<(EndpointName, Endpoint)> = batch
                .iter()
                .zip(&written)
                .filter(|(_, w)| matches!(w, Written::Unchanged))
                .map(|(item, _)| (item.endpoint.clone(), item.records.clone()))
                .collect();
            if !at_plan.is_empty() {
                target.repair_many(generation, at_plan, self.metrics.clone()).await.map_err(Step::TargetFailed)?;
            }
        }
        let mut results = Vec::with_capacity(batch.len());
        let mut acknowledged = Vec::new();
        for (item, written) in batch.iter().zip(written) {
            if !matches!(written, Written::Stale { .. }) {
                acknowledged.push(item.clone());
            }
            results.push(written_as_store_result(&item.endpoint, generation, written));
        }
        if !acknowledged.is_empty() {
            self.record_in_store(generation, &acknowledged).await?;
        }
        Ok(results)
    }

    /// Retires `name` on the RFC 2136 target (its addresses deleted, its marker moved on),
    /// then in the store.
    async fn retire_target(
        &self,
        target: &Rfc2136,
        generation: Generation,
        name: &EndpointName,
    ) -> Result<StoreResult<ApplyOutcome>, Step> {
        let marker = target.read_marker(name).await.map_err(Step::TargetFailed)?;
        self.hooks.before_write(&self.settings.id, generation, name).await;
        let written = target.write(name, generation, None, marker, &self.metrics).await.map_err(Step::TargetFailed)?;
        if !matches!(written, Written::Stale { .. }) {
            match self.call("retire", || self.store.retire(name, generation)).await {
                Ok(_) | Err(StoreError::Stale { .. }) => {}
                Err(StoreError::Pruned { .. }) => return Err(self.move_to_latest("pruned").await),
                Err(err) => return Err(Step::Failed(err)),
            }
        }
        Ok(written_as_store_result(name, generation, written))
    }

    /// Records writes the target acknowledged in the store, through its fence. A `Stale` item
    /// means a newer acknowledged write is recorded already; other refusals are logged (the
    /// target has the records; the store's floor only stays lower, which is safe).
    async fn record_in_store(&self, generation: Generation, acknowledged: &[ApplyItem]) -> Result<(), Step> {
        let span = tracing::debug_span!("record", endpoints = acknowledged.len());
        match self.call("apply_many", || self.store.apply_many(generation, acknowledged)).instrument(span).await {
            Ok(results) => {
                for (item, result) in acknowledged.iter().zip(results) {
                    match result {
                        Ok(_) | Err(StoreError::Stale { .. }) => {}
                        Err(err) => {
                            tracing::warn!(endpoint = %item.endpoint, error = %err, "the store did not record a write the target acknowledged")
                        }
                    }
                }
                Ok(())
            }
            Err(StoreError::Pruned { .. }) => Err(self.move_to_latest("pruned").await),
            Err(err) => Err(Step::Failed(err)),
        }
    }
}

/// An RFC 2136 write's outcome in the store's words, so one `record_write` counts both.
fn written_as_store_result(endpoint: &EndpointName, generation: Generation, written: Written) -> StoreResult<ApplyOutcome> {
    match written {
        Written::Switched { previous } => Ok(ApplyOutcome::Switched { previous }),
        Written::Unchanged => Ok(ApplyOutcome::Unchanged),
        Written::Stale { active } => Err(StoreError::Stale { endpoint: endpoint.clone(), active, attempted: generation }),
    }
}
