//! A deliberately naive store, for the conformance suite's teeth check only.
//!
//! It makes the mistakes of the automation behind the October 2025 outage: `apply` checks the
//! fence and writes later (check-then-act, with the lock dropped in between), `publish` does
//! the same with the latest generation, `cleanup` deletes by age alone, and nothing refuses a
//! generation whose plan is gone. `plan_changes` compares the two plans alone, missing an
//! endpoint that changed and changed back in between. Leases are checked, then acted on
//! later (acquire and leased publish alike), and automation may publish around the lease.
//! The suite must report violations against it.
//!
//! [`NaiveStore::as_in_2025`] goes further, for the enactor race tests: writes are not fenced
//! at all (the enactor's one-time check is the only guard, as in 2025), and the served records
//! belong to their plan, so age-only cleanup of a plan also removes the records that still
//! point at it. That is how the outage emptied a live endpoint.

use dnsplan_common::store::lease::{self, Lease};
use dnsplan_common::store::{
    ActiveRecord, ActiveSnapshot, ActiveState, ApplyOutcome, CleanupDecision, CleanupReport, Heartbeat, PauseState, Store, StoreError,
    StoreResult, StoreVersion,
};
use dnsplan_common::{Endpoint, EndpointName, Generation, PlanChanges, PlanSummary, ValidatedPlan};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

#[derive(Default)]
struct State {
    plans: BTreeMap<Generation, ValidatedPlan>,
    latest: Generation,
    active: BTreeMap<EndpointName, ActiveRecord>,
    applied_changes: u64,
    control_changes: u64,
    pause: Option<PauseState>,
    heartbeats: BTreeMap<String, Heartbeat>,
    lease: Option<Lease>,
}

#[derive(Clone)]
pub struct NaiveStore {
    state: Arc<Mutex<State>>,
    version: Arc<watch::Sender<StoreVersion>>,
    unfenced_2025: bool,
}

impl Default for NaiveStore {
    fn default() -> Self {
        NaiveStore { state: Arc::default(), version: Arc::new(watch::Sender::new(StoreVersion::default())), unfenced_2025: false }
    }
}

impl NaiveStore {
    /// The store of the 2025 automation: unfenced writes, records that belong to their plan.
    pub fn as_in_2025() -> NaiveStore {
        NaiveStore { unfenced_2025: true, ..NaiveStore::default() }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let out = f(&mut state);
        self.version.send_replace(StoreVersion {
            latest: state.latest,
            applied_changes: state.applied_changes,
            control_changes: state.control_changes,
        });
        out
    }

    async fn switch(&self, endpoint: &EndpointName, generation: Generation, state: ActiveState) -> StoreResult<ApplyOutcome> {
        // The check...
        let current = self.with(|s| s.active.get(endpoint).map(|a| a.generation));
        if self.unfenced_2025 {
            // No check at all: whatever the writer decided earlier is written.
            self.with(|s| {
                s.active.insert(endpoint.clone(), ActiveRecord { generation, state });
                s.applied_changes += 1;
            });
            return Ok(ApplyOutcome::Switched { previous: current.unwrap_or_default() });
        }
        match current {
            Some(active) if active > generation => {
                return Err(StoreError::Stale { endpoint: endpoint.clone(), active, attempted: generation });
            }
            Some(active) if active == generation => return Ok(ApplyOutcome::Unchanged),
            _ => {}
        }
        // ...and, some time later, the act, trusting the earlier check.
        yield_a_while().await;
        self.with(|s| {
            s.active.insert(endpoint.clone(), ActiveRecord { generation, state });
            s.applied_changes += 1;
        });
        Ok(ApplyOutcome::Switched { previous: current.unwrap_or_default() })
    }
}

impl Store for NaiveStore {
    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        let latest = self.with(|s| s.latest);
        if plan.generation() != Generation(latest.0 + 1) || plan.plan().parent_generation != latest {
            return Err(StoreError::Conflict { attempted: plan.generation(), parent: plan.plan().parent_generation, latest });
        }
        if !plan.plan().author.is_operator()
            && let Some(p) = self.with(|s| s.pause.clone())
        {
            return Err(StoreError::Paused { reason: p.reason, by: p.by.to_string() });
        }
        if self.with(|s| s.plans.values().next().is_some_and(|p| p.plan().dns_zone != plan.plan().dns_zone)) {
            return Err(StoreError::Unavailable("other DNS zone".into()));
        }
        yield_a_while().await;
        self.with(|s| {
            s.plans.insert(plan.generation(), plan.clone());
            s.latest = s.latest.max(plan.generation());
        });
        Ok(())
    }

    /// Checks the lease, and publishes some time later trusting the check.
    async fn publish_leased(&self, plan: &ValidatedPlan, held: &Lease) -> StoreResult<()> {
        let current = self.with(|s| s.lease.clone());
        lease::check_holder(current.as_ref(), held, lease::now_unix_ms())?;
        yield_a_while().await;
        self.publish(plan).await
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        let current = self.with(|s| s.lease.clone());
        let granted = lease::decide_acquire(current.as_ref(), holder, ttl, lease::now_unix_ms())?;
        yield_a_while().await;
        self.with(|s| s.lease = Some(granted.clone()));
        Ok(granted)
    }

    async fn release_lease(&self, held: &Lease) -> StoreResult<()> {
        self.with(|s| {
            if let Some(released) = lease::decide_release(s.lease.as_ref(), held, lease::now_unix_ms()) {
                s.lease = Some(released);
            }
        });
        Ok(())
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        Ok(self.with(|s| s.lease.clone()))
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        self.with(|s| s.plans.get(&generation).cloned()).ok_or(StoreError::PlanNotFound(generation))
    }

    /// Compares the two plans alone and misses what changed in between.
    async fn plan_changes_unchecked(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        let plans = self.with(|s| (s.plans.get(&from).cloned(), s.plans.get(&to).cloned()));
        match plans {
            (Some(from), Some(to)) => Ok(PlanChanges::between(from.plan(), to.plan())),
            (_, None) => Err(StoreError::PlanNotFound(to)),
            (None, _) => Ok(None),
        }
    }

    async fn latest(&self) -> StoreResult<Generation> {
        Ok(self.with(|s| s.latest))
    }

    /// The naive store holds one zone, never added again.
    async fn generation_base(&self) -> StoreResult<Generation> {
        Ok(Generation::NONE)
    }

    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        Ok(self.with(|s| s.plans.range(from..).take(limit).map(|(_, p)| p.summary()).collect()))
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        dnsplan_common::validate_endpoint(endpoint, records)?;
        if generation > self.with(|s| s.latest) {
            return Err(StoreError::Unpublished { attempted: generation, latest: self.with(|s| s.latest) });
        }
        self.switch(endpoint, generation, ActiveState::Serving(records.clone())).await
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        self.switch(endpoint, generation, ActiveState::Retired).await
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        Ok(self.with(|s| s.active.get(endpoint).cloned()))
    }

    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        // Every switch counts as a change of content here: the serial moves with each.
        Ok(self.with(|s| ActiveSnapshot {
            applied_changes: s.applied_changes,
            content_changes: s.applied_changes,
            endpoints: s.active.clone(),
        }))
    }

    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        Ok(self.with(|s| age_only(s, retain)))
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        let unfenced_2025 = self.unfenced_2025;
        Ok(self.with(|s| {
            let decision = age_only(s, retain);
            s.plans.retain(|g, _| *g >= decision.horizon_after);
            s.control_changes += 1;
            if unfenced_2025 {
                // The records went with their plan.
                let before = s.active.len();
                s.active.retain(|_, record| record.generation >= decision.horizon_after);
                if s.active.len() != before {
                    s.applied_changes += 1;
                }
            }
            decision
        }))
    }

    async fn pause_unchecked(&self, state: PauseState) -> StoreResult<()> {
        self.with(|s| {
            s.pause = Some(state);
            s.control_changes += 1;
        });
        Ok(())
    }

    async fn resume(&self) -> StoreResult<()> {
        self.with(|s| {
            s.pause = None;
            s.control_changes += 1;
        });
        Ok(())
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        Ok(self.with(|s| s.pause.clone()))
    }

    async fn heartbeat_unchecked(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        if heartbeat.enactor_id.len() > dnsplan_common::store::HEARTBEAT_TEXT_BYTES_MAX {
            return Err(StoreError::TooManyHeartbeats);
        }
        self.with(|s| s.heartbeats.insert(heartbeat.enactor_id.clone(), heartbeat));
        Ok(())
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        Ok(self.with(|s| s.heartbeats.values().cloned().collect()))
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        Ok(*self.version.borrow())
    }

    async fn wait_for_change_unchecked(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        let mut rx = self.version.subscribe();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v != seen)).await;
        Ok(*rx.borrow())
    }
}

/// Age-only cleanup: keeps the last `retain` plans and nothing else, active or not.
fn age_only(s: &State, retain: u64) -> CleanupDecision {
    let horizon_before = s.plans.keys().next().copied().unwrap_or(Generation::FIRST);
    let horizon_after = Generation(s.latest.0.saturating_sub(retain) + 1).max(horizon_before);
    CleanupDecision {
        horizon_before,
        horizon_after,
        kept_for_rollback: Some((horizon_after, s.latest)),
        oldest_active: None,
        refused_active_or_newer: 0,
    }
}

/// Gives other tasks a chance to run between a check and the act that trusts it, as a slow
/// or descheduled enactor would. Yields, never sleeps: how long is up to the scheduler.
async fn yield_a_while() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

/// The naive store has one zone: none is added beside it.
impl dnsplan_common::store::zones::ManagedZones for NaiveStore {
    async fn zone(&self, origin: &dnsplan_common::DnsName) -> StoreResult<NaiveStore> {
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
