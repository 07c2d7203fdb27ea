//! The planner's loop: hold the lease, read the latest plan, decide, publish plan N+1 with a
//! compare-and-swap under the lease, and on a conflict read again and decide again.
//!
//! A standby planner (the lease is someone else's) keeps its health checks warm and tries for
//! the lease on every tick, so it takes over within one lease TTL of the active one dying.
//! While automation is paused nothing is published. The breaker pauses automation itself,
//! with its reason, so that `status` shows it and an operator's resume clears it.
//!
//! Plans are complete (see [`crate::decide`]). An endpoint that is served but missing from the
//! latest plan (a plan written by an older version, or an operator's plan that left it out
//! without retiring it) is *adopted*: at start and after every operator plan, the planner
//! compares the active state with the latest plan and carries such endpoints, with the
//! records they serve, into its next plan, so they neither go empty nor hold back cleanup.
//! Endpoints retired by a plan since their active generation are never adopted.
//!
//! The status says what the rules hold back (`deferred`, from [`crate::decide::Outcome`]):
//! a decision that defers a removal often publishes nothing, so neither the plans nor "no
//! change" would say why a dead target is still served. The list is the last decision's; it
//! is emptied on standby and while an operator pauses automation (nothing is decided then),
//! and kept while the breaker's pause lasts (it lists what the breaker stopped).
//!
//! Known limit: `PlannerState` (the zone shift, the window's removals) lives in memory, so a
//! standby that takes over starts with an empty window and derives a zone shift again from
//! health; the previous plan still bounds every step by the per-plan limit.

use crate::config::PlannerConfig;
use crate::decide::{Decision, Health, PlannerState, UNMANAGED_RULE, decide, summarize};
use crate::health::HealthBook;
use crate::metrics::{KindLabels, Metrics};
use dnsplan_common::daemon::Reachability;
use dnsplan_common::signing::sign_with;
use dnsplan_common::store::lease::now_unix_ms;
use dnsplan_common::store::{ACTIVE_PAGE_MAX, LIST_LIMIT_MAX, next_generation, publish_told};
use dnsplan_common::{
    ActiveState, Author, Endpoint, EndpointName, Generation, Lease, PauseState, Plan, PlanDelta, Provenance, Store, StoreError,
    StoreResult, ValidatedPlan,
};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Times one tick re-reads and re-decides after losing the publish CAS.
const CONFLICT_RETRIES: usize = 5;

/// What `/v1/status` of the planner shows (one type with its readers').
pub use dnsplan_common::status::{PlannerStatus as Status, TargetStatus};

pub struct Planner<S: Store> {
    store: S,
    config: Arc<PlannerConfig>,
    book: Arc<HealthBook>,
    metrics: Arc<Metrics>,
    status: Arc<Mutex<Status>>,
    state: PlannerState,
    lease: Option<Lease>,
    rng: SmallRng,
    /// The latest plan whose endpoints were last compared with the active state.
    adoption_checked: Option<Generation>,
    /// The plan this planner last published or read whole: while it is the latest, a tick
    /// reads its summary instead of the plan, and the next plan is sent as its changes.
    last_plan: Option<Arc<Plan>>,
    /// Whether the store answers: an outage is logged when it begins and ends, not per tick.
    reach: Reachability,
}

impl<S: Store> Planner<S> {
    pub fn new(store: S, config: Arc<PlannerConfig>, book: Arc<HealthBook>, metrics: Arc<Metrics>) -> Planner<S> {
        let status = Status { id: config.id.clone(), ..Status::default() };
        Planner {
            store,
            config,
            book,
            metrics,
            status: Arc::new(Mutex::new(status)),
            state: PlannerState::default(),
            lease: None,
            rng: SmallRng::from_rng(&mut rand::rng()),
            adoption_checked: None,
            last_plan: None,
            reach: Reachability::new("the store"),
        }
    }

    /// Keeps its status in `status` (one the daemon serves across planners it starts again).
    pub fn with_status(mut self, status: Arc<Mutex<Status>>) -> Self {
        self.status = status;
        self
    }

    /// A handle on the status the loop keeps up to date.
    pub fn status(&self) -> Arc<Mutex<Status>> {
        self.status.clone()
    }

    /// Decides on every health change and every `decide_interval_ms`, until `shutdown`;
    /// then gives the lease up so that a standby takes over at once.
    pub async fn run(mut self, shutdown: impl Future<Output = ()>) {
        tokio::pin!(shutdown);
        tracing::info!(planner = %self.config.id, endpoints = self.config.endpoints.len(), "planner running");
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.tick() => {}
            }
            tokio::select! {
                _ = &mut shutdown => break,
                _ = self.book.changed.notified() => {}
                _ = tokio::time::sleep(self.config.decide_interval()) => {}
            }
        }
        if let Some(lease) = self.lease.take() {
            match self.call(self.store.release_lease(&lease)).await {
                Ok(()) => tracing::info!(planner = %self.config.id, epoch = lease.epoch, "lease released"),
                Err(err) => tracing::warn!(error = %err, "could not release the lease; it expires by itself"),
            }
        }
        tracing::info!(planner = %self.config.id, "planner stopped");
    }

    async fn call<T>(&self, fut: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        let timeout = Duration::from_millis(self.config.planner.call_timeout_ms.0);
        tokio::time::timeout(timeout, fut)
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable(format!("store call timed out after {timeout:?}"))))
    }

    fn set_status(&self, f: impl FnOnce(&mut Status)) {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut status);
    }

    /// One round: lease, pause, decide, publish.
    pub async fn tick(&mut self) {
        self.report_health();
        let ttl = Duration::from_millis(self.config.planner.lease_ttl_ms.0);
        match self.call(self.store.acquire_lease(&self.config.id, ttl)).await {
            Ok(lease) => {
                self.reach.answered();
                if self.lease.as_ref().map(|l| l.epoch) != Some(lease.epoch) {
                    tracing::info!(planner = %self.config.id, epoch = lease.epoch, "holding the planner lease: active");
                }
                self.lease = Some(lease);
            }
            Err(StoreError::LeaseHeld { holder, epoch, .. }) => {
                self.reach.answered();
                if self.lease.take().is_some() || self.status.lock().map(|s| s.active).unwrap_or(false) {
                    tracing::warn!(planner = %self.config.id, %holder, epoch, "the lease is held elsewhere: standing by");
                }
                self.metrics.active.set(0);
                self.metrics.set_deferred(&[]);
                self.set_status(|s| {
                    s.active = false;
                    s.lease = None;
                    s.deferred = Vec::new();
                    s.last_decision = format!("standby: {holder} holds the lease (epoch {epoch})");
                });
                return;
            }
            Err(err) => {
                if is_transient(&err) {
                    self.reach.failed(&format_args!("acquiring the lease: {err}"));
                } else {
                    tracing::warn!(planner = %self.config.id, error = %err, "cannot acquire the lease; not deciding");
                }
                self.set_status(|s| s.last_decision = format!("store unreachable: {err}"));
                return;
            }
        }
        let lease = self.lease.clone();
        self.metrics.active.set(1);
        self.set_status(|s| {
            s.active = true;
            s.lease = lease;
        });
        let paused = match self.call(self.store.paused()).await {
            Ok(p) => p,
            Err(err) if is_transient(&err) => {
                self.reach.failed(&format_args!("reading the pause state: {err}"));
                return;
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the pause state; not deciding");
                return;
            }
        };
        self.metrics.paused.set(i64::from(paused.is_some()));
        if let Some(p) = paused {
            // Nothing is decided while paused: what was held back is not being reconsidered,
            // except that a breaker's pause keeps the list of what the breaker stopped.
            let clear = !p.is_breaker();
            if clear {
                self.metrics.set_deferred(&[]);
            }
            self.set_status(|s| {
                if clear {
                    s.deferred = Vec::new();
                }
                s.last_decision = format!("paused by {}: {}", p.by, p.reason);
                s.paused = Some(p);
            });
            return;
        }
        self.set_status(|s| s.paused = None);
        for _ in 0..CONFLICT_RETRIES {
            match self.decide_and_publish().await {
                Err(StoreError::Conflict { latest, .. }) => {
                    self.metrics.publish_conflicts.inc();
                    tracing::info!(latest = %latest, "another plan was published first; deciding again");
                }
                Err(StoreError::NotLeaseHolder { .. }) => {
                    tracing::warn!(planner = %self.config.id, "lost the lease while publishing: standing by");
                    self.lease = None;
                    self.metrics.active.set(0);
                    self.metrics.set_deferred(&[]);
                    self.set_status(|s| s.deferred = Vec::new());
                    return;
                }
                Err(StoreError::Paused { .. }) => return,
                Err(err) if is_transient(&err) => {
                    self.reach.failed(&format_args!("deciding or publishing: {err}"));
                    return;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "deciding or publishing failed; trying again next tick");
                    return;
                }
                Ok(()) => return,
            }
        }
    }

    async fn decide_and_publish(&mut self) -> StoreResult<()> {
        let latest = self.call(self.store.latest()).await?;
        let mut previous = if latest > Generation::NONE { Some(self.latest_plan(latest).await?) } else { None };
        let adopted = match &previous {
            Some(p) if self.adoption_checked.is_none() || (p.author.is_operator() && self.adoption_checked != Some(p.generation)) => {
                let adopted = self.served_but_missing(p).await?;
                self.adoption_checked = Some(p.generation);
                adopted
            }
            _ => BTreeMap::new(),
        };
        if let Some(p) = previous.as_mut()
            && !adopted.is_empty()
        {
            tracing::warn!(planner = %self.config.id, count = adopted.len(), latest = %latest, "endpoints are served but missing from the latest plan; adopting them as served");
            Arc::make_mut(p).endpoints.extend(adopted.iter().map(|(n, e)| (n.clone(), e.clone())));
        }
        let now = now_unix_ms();
        let mut outcome = decide(&self.config, &self.book.view(), previous.as_deref(), &self.state, now, &mut self.rng);
        if !adopted.is_empty()
            && matches!(outcome.decision, Decision::NoChange)
            && let Some(p) = &previous
        {
            // Adopting is a change of the plan even when nothing else changed.
            let provenance = adopted
                .keys()
                .map(|n| Provenance {
                    endpoint: n.clone(),
                    rule: UNMANAGED_RULE.into(),
                    detail: format!("served but missing from plan {latest}: adopted as served until an operator retires it"),
                })
                .collect();
            let reason = format!("{} endpoint(s) served but missing from plan {latest}: adopted as served", adopted.len());
            outcome.decision = Decision::Publish { endpoints: p.endpoints.clone(), changed: BTreeSet::new(), provenance, reason };
        }
        let held = summarize(&outcome.deferred).map(|h| format!("; {h}")).unwrap_or_default();
        match outcome.decision {
            Decision::NoChange => {
                self.metrics.decision("no_change");
                self.keep(outcome.state);
                self.metrics.set_deferred(&outcome.deferred);
                self.set_status(|s| {
                    s.last_decision = format!("no change (latest plan {latest}){held}");
                    s.deferred = outcome.deferred;
                });
                Ok(())
            }
            Decision::Breaker { reason } => {
                self.metrics.decision("breaker");
                self.metrics.breaker_trips.inc();
                tracing::error!(planner = %self.config.id, %reason, "breaker tripped: publishing nothing; an operator must resume automation");
                let pause = PauseState {
                    reason: reason.chars().take(1_000).collect(),
                    by: Author::Planner { id: self.config.id.clone() },
                    since_unix_ms: now,
                };
                self.metrics.set_deferred(&outcome.deferred);
                self.set_status(|s| {
                    s.last_decision = format!("{reason}{held}");
                    s.deferred = outcome.deferred;
                });
                self.call(self.store.pause(pause)).await
            }
            Decision::Publish { endpoints, changed, provenance, reason } => {
                self.metrics.decision("publish");
                let next = self.call(next_generation(&self.store, latest)).await?;
                let plan = Plan {
                    generation: next,
                    parent_generation: latest,
                    created_at_unix_ms: now,
                    author: Author::Planner { id: self.config.id.clone() },
                    reason: reason.clone(),
                    dns_zone: self.config.dns_zone.clone(),
                    endpoints,
                    retired: Default::default(),
                    rollback_of: None,
                    provenance,
                };
                let plan = sign_with(self.config.signing.key.as_deref(), ValidatedPlan::new(plan)?);
                let lease = self.lease.clone().ok_or(StoreError::NotLeaseHolder { holder: None, epoch: 0, attempted_epoch: 0 })?;
                // Sent as its changes against the latest plan as the store holds it (not as
                // adopted here), found from what can differ: what the decision changed, what
                // was adopted, and the parent's retirements (a planner's plan retires none).
                // Comparing only those keeps the publish proportional to the change.
                let parent = self.last_plan.take();
                let delta = parent.as_deref().and_then(|parent| {
                    PlanDelta::between_named(parent, &plan, changed.iter().chain(adopted.keys()).chain(&parent.retired))
                });
                self.call(publish_told(&self.store, delta, &plan, Some(&lease))).await?;
                self.last_plan = Some(Arc::new(plan.into_plan()));
                self.metrics.plans_published.inc();
                self.metrics.last_published_generation.set(next.0 as i64);
                tracing::info!(planner = %self.config.id, generation = next.0, %reason, "plan published");
                self.keep(outcome.state);
                self.metrics.set_deferred(&outcome.deferred);
                self.set_status(|s| {
                    s.last_published = Some(next);
                    s.last_decision = format!("published {next}: {reason}{held}");
                    s.deferred = outcome.deferred;
                });
                Ok(())
            }
        }
    }

    /// Plan `latest` whole: the one this planner holds when the store's summary of `latest`
    /// is that plan's (a store replaced under the planner has other plans under the same
    /// numbers), else read from the store.
    async fn latest_plan(&mut self, latest: Generation) -> StoreResult<Arc<Plan>> {
        if let Some(held) = self.last_plan.clone().filter(|p| p.generation == latest) {
            let summary = self.call(self.store.list(latest, 1)).await?;
            if summary.first().is_some_and(|s| s == &ValidatedPlan::summary_of(&held)) {
                return Ok(held);
            }
        }
        let read = Arc::new(self.call(self.store.plan(latest)).await?.into_plan());
        self.last_plan = Some(read.clone());
        Ok(read)
    }

    /// The endpoints the active state serves that `latest` neither serves nor retires, and
    /// that no plan since their active generation retired, with the records they serve. Reads
    /// the active state a page at a time.
    async fn served_but_missing(&self, latest: &Plan) -> StoreResult<BTreeMap<EndpointName, Endpoint>> {
        let mut missing = BTreeMap::new();
        let mut oldest = latest.generation;
        let mut after = None;
        loop {
            let page = self.call(self.store.active_page(after.take(), ACTIVE_PAGE_MAX)).await?;
            for (name, record) in page.endpoints {
                if let ActiveState::Serving(records) = record.state
                    && !latest.endpoints.contains_key(&name)
                    && !latest.retired.contains(&name)
                {
                    oldest = oldest.min(record.generation);
                    missing.insert(name.clone(), records);
                }
                after = Some(name);
            }
            if !page.more {
                break;
            }
        }
        if missing.is_empty() {
            return Ok(missing);
        }
        // Retirements since: a retirement the enactors have not applied yet must not be undone.
        // Cleanup never deletes a plan newer than the oldest active one, so these are stored.
        let mut from = oldest.next().unwrap_or(oldest);
        while from < latest.generation {
            let summaries = self.call(self.store.list(from, LIST_LIMIT_MAX)).await?;
            let Some(last) = summaries.last().map(|s| s.generation) else { break };
            for summary in summaries.iter().filter(|s| s.retired_count > 0 && s.generation <= latest.generation) {
                for name in self.call(self.store.plan(summary.generation)).await?.plan().retired.iter() {
                    missing.remove(name);
                }
            }
            from = last.next().unwrap_or(last);
            if last >= latest.generation {
                break;
            }
        }
        Ok(missing)
    }

    fn keep(&mut self, state: PlannerState) {
        self.metrics.zone_shifted.set(i64::from(state.shifted.is_some()));
        let shifted = state.shifted.as_ref().map(|s| s.zone.to_string());
        self.set_status(|s| s.zone_shifted = shifted);
        self.state = state;
    }

    fn report_health(&self) {
        let view = self.book.view();
        let mut targets = Vec::new();
        let mut counts = [0i64; 3];
        for ep in self.config.endpoints() {
            for t in &ep.targets {
                let h = view.get(&(ep.name.clone(), t.address)).copied().unwrap_or(Health::Unknown);
                counts[match h {
                    Health::Up => 0,
                    Health::Down => 1,
                    Health::Unknown => 2,
                }] += 1;
                targets.push(TargetStatus { endpoint: ep.name.clone(), address: t.address, zone: t.zone.to_string(), health: h });
            }
        }
        for (i, kind) in ["up", "down", "unknown"].into_iter().enumerate() {
            self.metrics.targets.get_or_create(&KindLabels { kind }).set(counts[i]);
        }
        self.set_status(|s| s.targets = targets);
    }
}

/// An outage of the store (timeouts, unreachable), as against an answer.
fn is_transient(err: &StoreError) -> bool {
    matches!(err, StoreError::Unavailable(_) | StoreError::Io(_))
}
