//! The enactor's loop: learn of the newest plan, apply it endpoint by endpoint through the
//! store's fence, verify it over DNS, clean up, report a heartbeat; and re-apply the latest
//! plan in full every reconcile interval even when nothing changed.
//!
//! There is no "is my plan newer" check that later writes rely on. Each write is its own
//! compare-and-swap inside the store; `Stale` means a newer plan already holds that endpoint
//! and is skipped. A newer published plan preempts the one being applied.
//!
//! Where the endpoints go is the one seam `Settings::target` chooses: the store's
//! `apply_many`, or an RFC 2136 primary (`write_target`: each marker read, then a fenced UPDATE
//! per endpoint, then the acknowledged writes recorded in the store). Everything else (which
//! plan, what changed, the guard, verification, cleanup, heartbeats) is the same for both.
//!
//! The cleanup floor with an RFC 2136 target: the store stays the source of truth for plans,
//! and the markers are the fences for what the target serves. After the target acknowledges a
//! write (applied, or the marker already at this generation), the enactor records it in the
//! store through the store's own fence (`apply_many`; `Stale` there means a newer acknowledged
//! write is recorded). So for every name the store's active generation is at most the
//! marker's (the store records only what the target acknowledged, and both fences only move
//! forward), and cleanup, which deletes only plans older than the oldest active generation in
//! the store, never deletes a plan the target serves. The one gap: a name's first write
//! acknowledged by the target and not yet recorded (the enactor stopped in between) is not in
//! the store's floor until some enactor writes it again (the next reconcile reads the marker,
//! finds it at that generation and records it). Served records are copies on the target too,
//! so even then deletion changes nothing served. Reading every marker at cleanup time was the
//! alternative; recording writes keeps cleanup one store call and the store's floor the only
//! floor.
//!
//! Writing only what changed is safe: after the base (the plan this enactor last applied in
//! full), a skipped endpoint serves the base's records at some generation `g`; every plan from
//! `g` on has those records for it or leaves it out, and the fence admits only writes from
//! plans newer than `g`. A plan in between that changes it (a flap A→B→A) is in the store's
//! folded changes (`plan_changes`), so it is written.
//!
//! The hook points (`hooks`) are called in every build; they do nothing unless a test installs
//! its own. The naive 2025 enactor of the race tests lives in `naive`, built with feature
//! `testing` only; the one place that can choose it is the start of `apply_plan`.

use crate::config::{RetryPolicy, Settings, Target, VerifySettings};
use crate::hooks::{Behaviour, Event, Hooks, NoHooks};
use crate::metrics::Metrics;
use crate::rfc2136::{Rfc2136, TargetError, Written};
use crate::{guard, verify};
use dnsplan_common::daemon::Reachability;
use dnsplan_common::signing::Keyring;
use dnsplan_common::store::{ActiveSnapshot, ApplyItem, StoreVersion, WAIT_TIMEOUT_MAX};
use dnsplan_common::{
    ApplyOutcome, Author, Endpoint, EndpointName, Generation, Heartbeat, Plan, PlanEntry, Store, StoreError, StoreResult, ValidatedPlan,
};
use rand::RngExt;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;
use tracing::Instrument;

/// How long one long-poll on the store waits before asking again.
const WATCH_WAIT: Duration = Duration::from_secs(30);
/// Pause between retries of a failed long-poll, and before retrying after the store failed.
const STORE_DOWN_RETRY: Duration = Duration::from_secs(1);

#[cfg(feature = "testing")]
mod naive;
mod write_target;

use write_target::WriteTarget;

/// What one application writes: the whole plan, or its changes since the base.
struct Work {
    rollback: bool,
    serve: BTreeMap<EndpointName, Endpoint>,
    retire: BTreeSet<EndpointName>,
    /// Endpoints of the plan left unwritten because no plan since the base changed them.
    skipped: u64,
}

impl Work {
    /// All of `plan`.
    fn whole(plan: Plan) -> Work {
        Work { rollback: plan.rollback_of.is_some(), serve: plan.endpoints, retire: plan.retired, skipped: 0 }
    }

    /// What this work would write that `plan` does not say, if anything: the store's record
    /// of a plan's changes is not signed, so it is held to the signed plan.
    fn differs_from(&self, plan: &Plan) -> Option<String> {
        if self.rollback != plan.rollback_of.is_some() {
            return Some(format!("the store's changes of plan {} do not say whether it is a rollback as the plan does", plan.generation));
        }
        let served = self.serve.iter().find(|(name, records)| plan.endpoints.get(*name) != Some(*records));
        let retired = self.retire.iter().find(|name| !plan.retired.contains(*name));
        let name = served.map(|(name, _)| name).or(retired)?;
        Some(format!("the store's changes of plan {} write {name} otherwise than the signed plan says", plan.generation))
    }
}

/// Why a plan application stopped before it finished.
#[derive(Debug)]
enum Step {
    /// Every endpoint is at this plan's generation or newer.
    Done {
        /// What the plan serves of the endpoints it wrote, for verification.
        written: BTreeMap<EndpointName, Endpoint>,
        changed: Vec<EndpointName>,
        /// Every endpoint of the plan was written (not only those that changed).
        wrote_all: bool,
    },
    /// Stop and apply `to` instead.
    MoveTo {
        to: Generation,
        reason: &'static str,
    },
    Refused {
        reason: &'static str,
        detail: String,
    },
    DeadlinePassed,
    Failed(StoreError),
    /// The RFC 2136 target failed or refused (unreachable, TSIG, ACL, not authoritative).
    TargetFailed(TargetError),
}

pub struct Enactor<S: Store> {
    store: S,
    settings: Settings,
    metrics: Arc<Metrics>,
    last_applied: Generation,
    latest_seen: Generation,
    /// Plans refused, so that each is reported once and not retried on every change.
    refused: BTreeSet<Generation>,
    /// The plan this enactor applied in full last (every write switched, was unchanged or
    /// met a newer generation, and what it did not write no plan since its base changed), the
    /// base for writing only what changed.
    base: Option<Generation>,
    /// The generation of the last plan written in full (every endpoint).
    last_full_write: Generation,
    /// The store's active state as last read (see `active_now`).
    active: std::sync::Mutex<Option<Arc<ActiveSnapshot>>>,
    /// Endpoints written since the base by applications abandoned for a newer plan, as of
    /// that plan's generation (see `changes_since`): the next application skips those no plan
    /// since has changed, so plans that keep arriving faster than an application ends do not
    /// make every one of them rewrite the same endpoints.
    carried: Option<(Generation, BTreeSet<EndpointName>)>,
    /// What the application in progress has written (or found held by a newer plan), and the
    /// carried endpoints it skipped: carried to the next if it is abandoned. A list, in the
    /// order written, made a set only then: an insert per write into a set of a million
    /// names cost more than the writes' own share of the enactor.
    attempt_done: std::sync::Mutex<Vec<EndpointName>>,
    state: String,
    /// Called at fixed points of the loop; `NoHooks` unless a test installs its own.
    hooks: Arc<dyn Hooks>,
    /// Always `Fenced` outside the race tests: without feature `testing` it has no other value.
    behaviour: Behaviour,
    /// Where plans are written: the store, or an RFC 2136 primary (see `write_target`).
    target: WriteTarget,
    /// Whether the store answers: an outage is logged when it begins and ends, not per call.
    reach: Reachability,
}

impl<S: Store> Enactor<S> {
    pub fn new(store: S, settings: Settings, metrics: Arc<Metrics>) -> Enactor<S> {
        Enactor {
            target: WriteTarget::new(&settings.target),
            store,
            settings,
            metrics,
            last_applied: Generation::NONE,
            latest_seen: Generation::NONE,
            refused: BTreeSet::new(),
            base: None,
            carried: None,
            attempt_done: std::sync::Mutex::new(Vec::new()),
            last_full_write: Generation::NONE,
            active: std::sync::Mutex::new(None),
            state: "starting".into(),
            hooks: Arc::new(NoHooks),
            behaviour: Behaviour::Fenced,
            reach: Reachability::new("the store"),
        }
    }

    pub fn with_hooks(mut self, hooks: Arc<dyn Hooks>) -> Self {
        self.hooks = hooks;
        self
    }

    pub fn with_behaviour(mut self, behaviour: Behaviour) -> Self {
        self.behaviour = behaviour;
        self
    }

    /// Runs until `shutdown` resolves. Never returns early: store outages, refused plans and
    /// failed verifications are logged, counted and reported, and the loop goes on.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        let (mut versions, watcher) = watch_store(self.store.clone(), self.settings.call_timeout);
        let _watcher = AbortOnDrop(watcher);
        let mut next_reconcile = Instant::now();
        let mut next_heartbeat = Instant::now();
        tracing::info!(enactor = %self.settings.id, zone = %self.settings.zone, "enactor running");
        loop {
            // Shutdown interrupts a plan in flight: each write is fenced on its own, so
            // stopping between (or during) writes leaves nothing half-done that matters.
            let wake = tokio::select! {
                _ = &mut shutdown => break,
                wake = self.step(&mut next_reconcile, &mut next_heartbeat, &versions) => wake,
            };
            let wake = tokio::time::Instant::from_std(wake);
            // Wake for a plan newer than any we have handled, not for every apply elsewhere.
            let handled = self.latest_seen;
            tokio::select! {
                _ = &mut shutdown => break,
                watching = async { versions.wait_for(|v| v.latest > handled).await.is_ok() } => {
                    if !watching {
                        // The watcher is gone (it never ends on its own); fall back to the timer.
                        tokio::time::sleep_until(wake).await;
                    }
                }
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
        self.state = "stopped".into();
        self.heartbeat().await;
        tracing::info!(enactor = %self.settings.id, "enactor stopped");
    }

    /// One pass: read the latest generation, apply it if new or if a reconcile is due, send a
    /// heartbeat if due. Returns when the loop should look again at the latest.
    async fn step(
        &mut self,
        next_reconcile: &mut Instant,
        next_heartbeat: &mut Instant,
        versions: &watch::Receiver<StoreVersion>,
    ) -> Instant {
        let mut wake = Instant::now() + self.settings.heartbeat_interval;
        match self.call("latest", || self.store.latest()).await {
            Ok(latest) => {
                self.see_latest(latest);
                let due = Instant::now() >= *next_reconcile;
                if due {
                    // Moved on even with no plan to reconcile: a reconcile left due would make
                    // the loop wake at once, again and again, until the first plan.
                    *next_reconcile = Instant::now() + self.settings.reconcile_interval;
                }
                let fresh = latest > self.last_applied && !self.refused.contains(&latest);
                if latest > Generation::NONE && (fresh || due) {
                    if due {
                        tracing::debug!(enactor = %self.settings.id, generation = %latest, "reconciling the latest plan in full");
                    }
                    self.enact(latest, due, versions).await;
                    *next_heartbeat = Instant::now();
                } else if latest > Generation::NONE && !self.refused.contains(&latest) {
                    self.state = "idle".into();
                }
            }
            Err(err) => {
                if !is_transient(&err) {
                    tracing::error!(enactor = %self.settings.id, error = %err, "cannot read the latest plan; retrying");
                }
                self.state = "store-unreachable".into();
                wake = wake.min(Instant::now() + STORE_DOWN_RETRY);
            }
        }
        if Instant::now() >= *next_heartbeat {
            self.heartbeat().await;
            *next_heartbeat = Instant::now() + self.settings.heartbeat_interval;
        }
        if self.last_applied < self.latest_seen && !self.refused.contains(&self.latest_seen) {
            // The last attempt did not finish (store error, deadline): try again soon.
            wake = wake.min(Instant::now() + STORE_DOWN_RETRY);
        }
        wake.min(*next_reconcile).min(*next_heartbeat)
    }

    fn see_latest(&mut self, latest: Generation) {
        self.latest_seen = self.latest_seen.max(latest);
        self.metrics.latest_generation.set(self.latest_seen.0 as i64);
        self.metrics.lag_generations.set(self.latest_seen.0.saturating_sub(self.last_applied.0) as i64);
    }

    /// Applies `target`, following newer plans as they appear, then verifies and cleans up.
    /// `full` writes every endpoint (a reconcile); otherwise only what changed since the base
    /// plan, unless a full write is due.
    async fn enact(&mut self, target: Generation, full: bool, versions: &watch::Receiver<StoreVersion>) {
        let deadline = Instant::now() + self.settings.plan_deadline;
        let mut generation = target;
        let mut moves = 0u32;
        loop {
            let started = Instant::now();
            self.state = format!("applying {generation}");
            let span = tracing::info_span!("plan", enactor = %self.settings.id, generation = %generation);
            let full = full || generation.0.saturating_sub(self.last_full_write.0) >= self.settings.full_write_every;
            if let Ok(mut done) = self.attempt_done.lock() {
                done.clear();
            }
            let step = self.apply_plan(generation, full, deadline, versions).instrument(span.clone()).await;
            let done = self.attempt_done.lock().map(|mut done| std::mem::take(&mut *done)).unwrap_or_default();
            self.carried = match &step {
                Step::MoveTo { .. } => Some((generation, done.into_iter().collect())),
                _ => None,
            };
            match step {
                Step::Done { written, changed, wrote_all } => {
                    if wrote_all {
                        self.last_full_write = self.last_full_write.max(generation);
                    }
                    self.metrics.apply_seconds.observe(started.elapsed().as_secs_f64());
                    self.metrics.plans_applied.inc();
                    self.last_applied = self.last_applied.max(generation);
                    self.base = Some(generation);
                    self.metrics.last_applied_generation.set(self.last_applied.0 as i64);
                    self.see_latest(generation);
                    tracing::info!(parent: &span, generation = generation.0, changed = changed.len(), elapsed_ms = started.elapsed().as_millis() as u64, "plan applied");
                    let verified = match &self.settings.verify {
                        Some(v) => self.verify(generation, &written, &changed, v, versions).instrument(span.clone()).await,
                        None => true,
                    };
                    if verified {
                        self.hooks.before_cleanup(&self.settings.id, generation).await;
                        self.cleanup().instrument(span.clone()).await;
                        self.state = "idle".into();
                    } else {
                        self.state = format!("verify-failed {generation}");
                    }
                    self.event_done(generation);
                    return;
                }
                Step::MoveTo { to, reason } => {
                    self.metrics.abandoned(reason);
                    self.event_abandoned(generation);
                    moves += 1;
                    // A move always goes forward; bound the chain in case a store misbehaves.
                    if to <= generation || moves > 1_000 {
                        tracing::error!(parent: &span, to = %to, reason, "cannot move to a newer plan; will retry from the latest");
                        return;
                    }
                    tracing::info!(parent: &span, to = %to, reason, "abandoning this plan for a newer one");
                    generation = to;
                }
                Step::Refused { reason, detail } => {
                    self.metrics.refused(reason);
                    self.refused.insert(generation);
                    // Bound the memory of refusals; the oldest matter least.
                    while self.refused.len() > 1_024 {
                        self.refused.pop_first();
                    }
                    self.state = format!("refusing {generation}");
                    tracing::error!(parent: &span, reason, detail = %detail, "refusing plan {generation}: {detail}; waiting for a newer plan or an operator");
                    self.event_refused(generation);
                    return;
                }
                Step::DeadlinePassed => {
                    self.metrics.abandoned("deadline");
                    tracing::warn!(parent: &span, deadline_secs = self.settings.plan_deadline.as_secs(), "plan application passed its deadline; starting again from the latest plan");
                    self.event_abandoned(generation);
                    return;
                }
                Step::Failed(err) => {
                    self.metrics.abandoned("store_error");
                    if is_transient(&err) {
                        // `call` reported the outage when it began.
                        tracing::info!(parent: &span, error = %err, "store unreachable during the plan; starting again from the latest plan once it answers");
                    } else {
                        tracing::error!(parent: &span, error = %err, "plan application failed; starting again from the latest plan");
                    }
                    self.state = "store-unreachable".into();
                    self.event_abandoned(generation);
                    return;
                }
                Step::TargetFailed(err) => {
                    self.metrics.abandoned("target_error");
                    let error = crate::rfc2136::describe(&err);
                    if err.is_transient() && self.target.rfc2136().is_some_and(Rfc2136::is_unreachable) {
                        // The target logged the outage when it began, with its cause.
                        tracing::debug!(parent: &span, error = %error, "the RFC 2136 server is unreachable; starting again from the latest plan once it answers");
                    } else {
                        tracing::error!(parent: &span, error = %error, "writing to the RFC 2136 target failed; starting again from the latest plan");
                    }
                    self.state = if err.is_transient() { "target-unreachable".into() } else { "target-refusing".into() };
                    self.event_abandoned(generation);
                    return;
                }
            }
        }
    }

    async fn apply_plan(&self, generation: Generation, full: bool, deadline: Instant, versions: &watch::Receiver<StoreVersion>) -> Step {
        // The race tests' 2025 enactor takes over here; without feature `testing` there is
        // no other arm.
        match self.behaviour {
            Behaviour::Fenced => {}
            #[cfg(feature = "testing")]
            Behaviour::Naive => return self.apply_naive(generation, deadline, versions).await,
        }
        // With a keyring, the plan is read whole and its signature checked before anything
        // is written; what is written is then checked against it, changes or not.
        let trusted = match self.settings.keyring.clone() {
            Some(keyring) => match self.trusted_plan(generation, &keyring).await {
                Ok(plan) => Some(plan),
                Err(step) => return step,
            },
            None => None,
        };
        let work = match self.base.filter(|base| !full && *base < generation) {
            Some(base) => match self.changes_since(base, generation).await {
                Ok(Some(work)) => self.without_carried(base, generation, work).await,
                other => other,
            },
            None => Ok(None),
        };
        let work = match (work, trusted) {
            (Ok(Some(work)), Some(plan)) => match work.differs_from(&plan) {
                None => work,
                Some(detail) => return Step::Refused { reason: "untrusted", detail },
            },
            (Ok(Some(work)), None) => work,
            (Ok(None), Some(plan)) => Work::whole(plan),
            (Ok(None), None) => match self.whole_plan(generation).await {
                Ok(work) => work,
                Err(step) => return step,
            },
            (Err(step), _) => return step,
        };
        self.write(generation, work, deadline, versions).await
    }

    /// Writes `work` through the store's fence: the removal guard (rollbacks and operators'
    /// plans pass it), then the
    /// endpoints in batches and the retirements, checking before each for a newer plan and
    /// the deadline.
    async fn write(&self, generation: Generation, work: Work, deadline: Instant, versions: &watch::Receiver<StoreVersion>) -> Step {
        if !work.rollback {
            let active = match self.active_now().await {
                Ok(active) => active,
                Err(err) => return Step::Failed(err),
            };
            if let Some(removal) = guard::excessive_removal(generation, &work.serve, &active, self.settings.max_removal_fraction) {
                // An operator's plan is the operator's decision, as a rollback is: `plans
                // publish` showed the removal before it was confirmed. Refusing it would also
                // refuse every planner plan after it that carries its content.
                match self.call("list", || self.store.list(generation, 1)).await {
                    Ok(summaries) => match summaries.into_iter().find(|s| s.generation == generation).map(|s| s.author) {
                        Some(Author::Operator { name }) => {
                            tracing::warn!(operator = %name, detail = %removal, "plan {generation} is an operator's: applying it beyond the removal limit");
                        }
                        _ => return Step::Refused { reason: "removal", detail: removal.to_string() },
                    },
                    Err(err) => return Step::Failed(err),
                }
            }
        }

        let wrote_all = work.skipped == 0;
        let mut changed = Vec::new();
        let mut pending: Vec<ApplyItem> =
            work.serve.iter().map(|(name, records)| ApplyItem { endpoint: name.clone(), records: records.clone() }).collect();
        // Enactors of one zone start at different points of the plan, set by their ids, and
        // go round: each first writes endpoints the others have not reached, and finds the
        // rest already switched (`Unchanged`, a read). Started at one point, they would all
        // race for the same endpoints, which on etcd means transactions that fail and retry.
        let start = start_of(&self.settings.id, pending.len());
        pending.rotate_left(start);
        if self.target.rfc2136().is_some() {
            let peers = self.live_peers().await;
            share_first(&mut pending, &peers, &self.settings.id);
        }
        self.metrics.skipped_unchanged.inc_by(work.skipped);
        for batch in pending.chunks(self.settings.batch_size.max(1)) {
            if let Some(step) = self.preempted(generation, deadline, versions) {
                return step;
            }
            let results = match self.write_batch(generation, batch, wrote_all).await {
                Ok(results) => results,
                Err(step) => return step,
            };
            for (item, result) in batch.iter().zip(results) {
                let written = matches!(result, Ok(_) | Err(StoreError::Stale { .. }));
                if let Some(step) = self.record_write(&item.endpoint, result, &mut changed).await {
                    return step;
                }
                if written && let Ok(mut done) = self.attempt_done.lock() {
                    done.push(item.endpoint.clone());
                }
            }
        }
        for name in &work.retire {
            if let Some(step) = self.preempted(generation, deadline, versions) {
                return step;
            }
            let result = match self.retire_one(generation, name).await {
                Ok(result) => result,
                Err(step) => return step,
            };
            let written = matches!(result, Ok(_) | Err(StoreError::Stale { .. }));
            if let Some(step) = self.record_write(name, result, &mut changed).await {
                return step;
            }
            if written && let Ok(mut done) = self.attempt_done.lock() {
                done.push(name.clone());
            }
        }
        Step::Done { written: work.serve, changed, wrote_all }
    }

    /// Plan `generation` whole, once `keyring` trusts it: signed by a key it holds, for the
    /// plan's zone and author, over exactly these bytes. Refused otherwise, so neither a plan
    /// written straight into the store nor one changed after it was signed is applied.
    async fn trusted_plan(&self, generation: Generation, keyring: &Keyring) -> Result<Plan, Step> {
        let plan = match self.call("plan", || self.store.plan(generation)).await {
            Ok(plan) => plan,
            Err(StoreError::PlanNotFound(_) | StoreError::Pruned { .. }) => return Err(self.move_to_latest("pruned").await),
            Err(err) => return Err(Step::Failed(err)),
        };
        if plan.generation() != generation {
            let detail = format!("the store returned plan {} when asked for {generation}", plan.generation());
            return Err(Step::Refused { reason: "invalid", detail });
        }
        match keyring.verify(&plan) {
            Ok(key) => {
                tracing::debug!(generation = %generation, key, "plan signature verified");
                self.metrics.plan_read("whole");
                Ok(plan.into_plan())
            }
            Err(err) => Err(Step::Refused { reason: "untrusted", detail: err.to_string() }),
        }
    }

    /// Plan `generation` whole, validated again: the same validation as publish, on what we
    /// are about to write (the second line of defence).
    async fn whole_plan(&self, generation: Generation) -> Result<Work, Step> {
        let plan = match self.call("plan", || self.store.plan(generation)).await {
            Ok(plan) => {
                self.metrics.plan_read("whole");
                plan
            }
            Err(StoreError::PlanNotFound(_) | StoreError::Pruned { .. }) => return Err(self.move_to_latest("pruned").await),
            Err(err) => return Err(Step::Failed(err)),
        };
        let plan = match ValidatedPlan::new(plan.into_plan()) {
            Ok(plan) if plan.generation() == generation => plan,
            Ok(plan) => {
                return Err(Step::Refused {
                    reason: "invalid",
                    detail: format!("the store returned plan {} when asked for {generation}", plan.generation()),
                });
            }
            Err(err) => return Err(Step::Refused { reason: "invalid", detail: err.to_string() }),
        };
        Ok(Work::whole(plan.into_plan()))
    }

    /// What plan `generation` changed since the base, when the store can say it in less than
    /// the plan; `None` to read the plan whole.
    ///
    /// Why writing only these is safe: once the base is applied, each of its endpoints serves
    /// the base's entry at some generation `g` (the base, or a newer plan met as `Stale`),
    /// and every plan from `g` to the base has that same entry (by induction: what an earlier
    /// application skipped, no plan had changed). The fence admits only writes newer than
    /// `g`. An endpoint that no plan after the base changed has that entry in every plan up
    /// to this one, so any write it can still receive carries exactly what it serves. The
    /// store folds the changes of *every* plan in between, so an endpoint that changed and
    /// changed back (which another enactor may have written) is written again.
    async fn changes_since(&self, base: Generation, generation: Generation) -> Result<Option<Work>, Step> {
        let changes = match self.call("plan_changes", || self.store.plan_changes(base, generation)).await {
            Ok(Some(changes)) => changes,
            Ok(None) => return Ok(None),
            Err(StoreError::PlanNotFound(_) | StoreError::Pruned { .. }) => return Err(self.move_to_latest("pruned").await),
            Err(err) => return Err(Step::Failed(err)),
        };
        if let Err(err) = changes.check().map_err(|e| e.to_string()).and_then(|()| {
            if (changes.from, changes.to) == (base, generation) {
                Ok(())
            } else {
                Err(format!("changes from plan {} to {} when asked for {base} to {generation}", changes.from, changes.to))
            }
        }) {
            // The plan itself is checked on its own; a bad change record must not stop it.
            tracing::error!(error = %err, "the store's plan changes are invalid; reading the plan whole");
            return Ok(None);
        }
        self.metrics.plan_read("changes");
        let mut work = Work { rollback: changes.rollback_of.is_some(), serve: BTreeMap::new(), retire: BTreeSet::new(), skipped: 0 };
        for (name, entry) in changes.changes {
            match entry {
                PlanEntry::Serve(records) => {
                    work.serve.insert(name, records);
                }
                PlanEntry::Retire => {
                    work.retire.insert(name);
                }
                PlanEntry::Absent => {}
            }
        }
        work.skipped = changes.endpoint_count.saturating_sub(work.serve.len() as u64);
        Ok(Some(work))
    }

    /// `work` without the carried endpoints (written as of plan `g`, after the base) that no
    /// plan from `g` to `generation` changed: each serves its entry in `g`, which is its entry
    /// in `generation` too, at `g` or a newer generation, so it already is what the base
    /// argument of `changes_since` needs, as if this application had written it. Any other
    /// answer keeps `work` whole.
    async fn without_carried(&self, base: Generation, generation: Generation, mut work: Work) -> Result<Option<Work>, Step> {
        let Some((g, carried)) = self.carried.as_ref().filter(|(g, _)| base < *g && *g < generation) else { return Ok(Some(work)) };
        let since = match self.call("plan_changes", || self.store.plan_changes(*g, generation)).await {
            Ok(Some(changes)) if (changes.from, changes.to) == (*g, generation) && changes.check().is_ok() => changes,
            Ok(_) => return Ok(Some(work)),
            Err(StoreError::PlanNotFound(_) | StoreError::Pruned { .. }) => return Err(self.move_to_latest("pruned").await),
            Err(err) => return Err(Step::Failed(err)),
        };
        let kept: Vec<&EndpointName> = carried.iter().filter(|n| !since.changes.contains_key(*n)).collect();
        let mut skipped = 0u64;
        for name in &kept {
            if work.serve.remove(*name).is_some() || work.retire.remove(*name) {
                skipped += 1;
            }
        }
        work.skipped += skipped;
        if let Ok(mut done) = self.attempt_done.lock() {
            done.extend(kept.into_iter().cloned());
        }
        tracing::debug!(carried_from = %g, skipped, "skipping endpoints an abandoned application already wrote");
        Ok(Some(work))
    }

    /// The store's active state, for the guard: a copy kept up to date with `active_since`, so
    /// each plan reads only what switched since the last one, not the whole state.
    async fn active_now(&self) -> StoreResult<Arc<ActiveSnapshot>> {
        // Taken out, so that merging needs no copy; a failed read starts again from scratch.
        let held = self.active.lock().ok().and_then(|mut slot| slot.take());
        let since = held.as_ref().map_or(0, |a| a.applied_changes);
        let delta = self.call("active_since", || self.store.active_since(since)).await?;
        let mut next = match (held, delta.full) {
            (Some(held), false) => Arc::unwrap_or_clone(held),
            _ => ActiveSnapshot::default(),
        };
        next.applied_changes = delta.applied_changes;
        next.endpoints.extend(delta.endpoints);
        let next = Arc::new(next);
        if let Ok(mut slot) = self.active.lock() {
            *slot = Some(next.clone());
        }
        Ok(next)
    }

    /// Whether to stop before the next write: past the deadline, or a newer plan exists.
    fn preempted(&self, generation: Generation, deadline: Instant, versions: &watch::Receiver<StoreVersion>) -> Option<Step> {
        if Instant::now() >= deadline {
            return Some(Step::DeadlinePassed);
        }
        let newest = versions.borrow().latest;
        (newest > generation).then_some(Step::MoveTo { to: newest, reason: "newer_plan" })
    }

    /// Counts one write's outcome; `Some` when the plan cannot go on.
    async fn record_write(&self, name: &EndpointName, result: StoreResult<ApplyOutcome>, changed: &mut Vec<EndpointName>) -> Option<Step> {
        match result {
            Ok(ApplyOutcome::Switched { previous }) => {
                self.metrics.write("switched");
                tracing::debug!(endpoint = %name, previous = %previous, "switched");
                changed.push(name.clone());
                None
            }
            Ok(ApplyOutcome::Unchanged) => {
                self.metrics.write("unchanged");
                None
            }
            Err(StoreError::Stale { active, .. }) => {
                // A newer plan already holds this endpoint: skip it, never overwrite.
                self.metrics.write("stale");
                tracing::info!(endpoint = %name, active = %active, "a newer plan is already active here; skipped");
                None
            }
            Err(StoreError::Pruned { .. }) => Some(self.move_to_latest("pruned").await),
            Err(StoreError::Invalid(err)) => Some(Step::Refused { reason: "invalid", detail: err.to_string() }),
            // The store holds this plan's content and refused what was sent: a fault on the
            // writer's side. The reconcile pass reads the plan whole and tries again.
            Err(err @ StoreError::ContentMismatch { .. }) => Some(Step::Refused { reason: "content_mismatch", detail: err.to_string() }),
            Err(err) => Some(Step::Failed(err)),
        }
    }

    async fn move_to_latest(&self, reason: &'static str) -> Step {
        match self.call("latest", || self.store.latest()).await {
            Ok(to) => Step::MoveTo { to, reason },
            Err(err) => Step::Failed(err),
        }
    }

    /// Checks over DNS that each changed endpoint answers only with this plan's addresses.
    async fn verify(
        &self,
        generation: Generation,
        written: &BTreeMap<EndpointName, Endpoint>,
        changed: &[EndpointName],
        settings: &VerifySettings,
        versions: &watch::Receiver<StoreVersion>,
    ) -> bool {
        let mut checks = verify::checks_for(written, changed, settings.endpoints_max);
        let total = checks.len();
        let outcome = verify::run(&mut checks, settings, || versions.borrow().latest > generation).await;
        match outcome {
            verify::Outcome::Served => {
                tracing::info!(checked = total, "verified over DNS");
                true
            }
            verify::Outcome::Superseded => {
                tracing::info!("a newer plan was published during verification; it will be verified instead");
                true
            }
            verify::Outcome::Mismatch { failing, example } => {
                self.metrics.verify_failures.inc();
                tracing::error!(failing, checked = total, example = %example, "the authority does not serve this plan within {:?}; cleanup skipped", settings.timeout);
                false
            }
        }
    }

    async fn cleanup(&self) {
        let Some(retain) = self.settings.cleanup_retain else { return };
        match self.call("cleanup", || self.store.cleanup(retain)).await {
            Ok(report) => {
                self.metrics.cleanup_deleted_plans.inc_by(report.deleted_count());
                if let Some((first, last)) = report.deleted() {
                    tracing::info!(first = %first, last = %last, oldest_active = ?report.oldest_active.as_ref().map(|(g, _)| g), "cleaned up old plans");
                }
            }
            Err(err) => tracing::warn!(error = %err, "cleanup failed; the next plan will try again"),
        }
    }

    /// The ids of the enactors that sent the store a heartbeat within three intervals, this
    /// one included, sorted: the writers a plan's names are shared among on an RFC 2136
    /// target. A store that does not answer leaves this one alone.
    async fn live_peers(&self) -> Vec<String> {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default();
        let live = u64::try_from((self.settings.heartbeat_interval * 3).as_millis()).unwrap_or(u64::MAX);
        let beats = tokio::time::timeout(self.settings.call_timeout, self.store.heartbeats()).await;
        let mut ids: Vec<String> = match beats {
            Ok(Ok(beats)) => beats.into_iter().filter(|b| now.saturating_sub(b.at_unix_ms) <= live).map(|b| b.enactor_id).collect(),
            _ => Vec::new(),
        };
        ids.push(self.settings.id.clone());
        ids.sort();
        ids.dedup();
        ids
    }

    async fn heartbeat(&self) {
        let beat = Heartbeat {
            enactor_id: self.settings.id.clone(),
            zone: self.settings.zone.clone(),
            last_applied: self.last_applied,
            latest_seen: self.latest_seen,
            at_unix_ms: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or_default(),
            state: self.state.chars().take(dnsplan_common::store::HEARTBEAT_TEXT_BYTES_MAX / 4).collect(),
        };
        // One attempt: a missed heartbeat is reported again at the next interval.
        match tokio::time::timeout(self.settings.call_timeout, self.store.heartbeat(beat)).await {
            Ok(Ok(())) => self.reach.answered(),
            Ok(Err(err)) if is_transient(&err) => {
                self.reach.failed(&format_args!("heartbeat: {err}"));
            }
            Ok(Err(err)) => tracing::warn!(error = %err, "heartbeat failed"),
            Err(_) => {
                self.reach.failed(&format_args!("heartbeat timed out after {:?}", self.settings.call_timeout));
            }
        }
    }

    /// One store call with a timeout, retried with jittered backoff on transient errors.
    async fn call<T, F, Fut>(&self, what: &'static str, mut op: F) -> StoreResult<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        let mut attempt = 1;
        loop {
            let result = match tokio::time::timeout(self.settings.call_timeout, op()).await {
                Ok(result) => result,
                Err(_) => Err(StoreError::Unavailable(format!("store call {what} timed out after {:?}", self.settings.call_timeout))),
            };
            match result {
                Err(err) if is_transient(&err) => {
                    if attempt >= self.settings.retry.attempts {
                        self.metrics.store_errors.inc();
                        // Logged once per outage (and once when it ends), not per attempt.
                        self.reach.failed(&format_args!("{what}: {err}"));
                        return Err(err);
                    }
                    self.metrics.store_retries.inc();
                    let wait = backoff(self.settings.retry, attempt);
                    tracing::debug!(call = what, attempt, wait_ms = wait.as_millis() as u64, error = %err, "store call failed; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                other => {
                    self.reach.answered();
                    return other;
                }
            }
        }
    }

    fn event_done(&self, generation: Generation) {
        self.hooks.event(Event::PlanDone { enactor: self.settings.id.clone(), generation });
    }
    fn event_abandoned(&self, generation: Generation) {
        self.hooks.event(Event::PlanAbandoned { enactor: self.settings.id.clone(), generation });
    }
    fn event_refused(&self, generation: Generation) {
        self.hooks.event(Event::PlanRefused { enactor: self.settings.id.clone(), generation });
    }
}

/// Timeouts and an unreachable store are worth retrying; refusals are answers.
fn is_transient(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable(_) | StoreError::Io(_))
}

/// Full jitter: a random wait in `[0, min(max, base * 2^(attempt-1))]`.
pub fn backoff(policy: RetryPolicy, attempt: u32) -> Duration {
    let ceiling = policy.base.saturating_mul(1u32 << attempt.saturating_sub(1).min(20)).min(policy.max);
    let ceiling_us = u64::try_from(ceiling.as_micros()).unwrap_or(u64::MAX);
    Duration::from_micros(rand::rng().random_range(0..=ceiling_us))
}

/// Follows the store's version with long-polls, so that a newer plan preempts the one being
/// applied without a store call per endpoint.
fn watch_store<S: Store>(store: S, call_timeout: Duration) -> (watch::Receiver<StoreVersion>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(StoreVersion::default());
    let task = tokio::spawn(async move {
        let mut seen = StoreVersion::default();
        loop {
            let wait = WATCH_WAIT.min(WAIT_TIMEOUT_MAX);
            match tokio::time::timeout(wait + call_timeout, store.wait_for_change(seen, wait)).await {
                Ok(Ok(version)) => {
                    seen = version;
                    tx.send_if_modified(|v| {
                        let changed = *v != version;
                        *v = version;
                        changed
                    });
                }
                Ok(Err(err)) => {
                    tracing::debug!(error = %err, "watching the store failed; retrying");
                    tokio::time::sleep(STORE_DOWN_RETRY).await;
                }
                Err(_) => tokio::time::sleep(STORE_DOWN_RETRY).await,
            }
        }
    });
    (rx, task)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Where an enactor with this id starts writing a plan of `len` endpoints: a hash of the id,
/// the same on every run, so enactors of one zone spread their starts.
/// Orders `pending` for an RFC 2136 target: this enactor's share first, then the others'.
/// `peers` are the live enactors (sorted ids, `me` among them); a name's share is its hash
/// modulo their count, and an enactor's share is the one at its place among them. Each writes
/// its own share while the others write theirs, then goes over theirs, finding them written
/// (a marker read each) or taking over a silent peer's.
fn share_first(pending: &mut [ApplyItem], peers: &[String], me: &str) {
    use std::hash::{Hash, Hasher};
    let Some(mine) = peers.iter().position(|p| p == me) else { return };
    let share = |item: &ApplyItem| {
        // A hash every enactor computes the same way, whatever its build: FNV-1a.
        let mut hasher = Fnv(0xcbf2_9ce4_8422_2325);
        item.endpoint.as_str().hash(&mut hasher);
        (hasher.finish() % peers.len() as u64) as usize
    };
    // Stable: within each part the order (and its rotation) stays.
    pending.sort_by_key(|item| share(item) != mine);
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl std::hash::Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0 ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}

fn start_of(id: &str, len: usize) -> usize {
    use std::hash::{Hash, Hasher};
    if len == 0 {
        return 0;
    }
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    (hasher.finish() % len as u64) as usize
}
