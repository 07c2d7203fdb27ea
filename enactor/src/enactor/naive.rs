//! The October 2025 enactor, for the race tests' counterfactual only (feature `testing`): one
//! check that the plan is newer than anything active, then every write trusting it. It reads
//! every plan whole, runs no removal guard, and never looks at newer plans while it writes.
//! Rollbacks it writes as the fenced enactor does.
//!
//! Nothing here is built without the feature, so no production enactor can run it.

use super::{Enactor, Step, Work};
use dnsplan_common::store::StoreVersion;
use dnsplan_common::{Generation, Store, StoreError};
use std::time::Instant;
use tokio::sync::watch;

impl<S: Store> Enactor<S> {
    pub(super) async fn apply_naive(&self, generation: Generation, deadline: Instant, versions: &watch::Receiver<StoreVersion>) -> Step {
        let work = match self.whole_plan(generation).await {
            Ok(work) => work,
            Err(step) => return step,
        };
        if work.rollback {
            return self.write(generation, work, deadline, versions).await;
        }
        let active = match self.active_now().await {
            Ok(active) => active,
            Err(err) => return Step::Failed(err),
        };
        let newest_active = active.endpoints.values().map(|r| r.generation).max().unwrap_or_default();
        let Work { serve, .. } = work;
        if newest_active >= generation {
            return Step::Done { written: serve, changed: Vec::new(), wrote_all: true };
        }
        let mut changed = Vec::new();
        for (name, records) in &serve {
            self.hooks.before_write(&self.settings.id, generation, name).await;
            match self.call("apply", || self.store.apply(name, generation, records)).await {
                Ok(_) => changed.push(name.clone()),
                Err(StoreError::Stale { .. }) => {}
                Err(err) => return Step::Failed(err),
            }
        }
        Step::Done { written: serve, changed, wrote_all: true }
    }
}
