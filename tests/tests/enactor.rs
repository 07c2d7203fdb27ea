//! The enactor's behaviour on an embedded store: it refuses plans that strip too much weight
//! and keeps going, retries transient store errors, and its reconcile pass heals a record the
//! store lost.

use dnsplan_common::store::{CleanupDecision, CleanupReport, Lease};
use dnsplan_common::{
    ActiveRecord, ActiveSnapshot, ActiveState, ApplyOutcome, Author, Endpoint, EndpointName, Generation, Heartbeat, PauseState,
    PlanSummary, SledStore, Store, StoreError, StoreResult, StoreVersion, Target, ValidatedPlan, ZoneId,
};
use dnsplan_enactor::hooks::{Event, HookFuture, Hooks};
use dnsplan_enactor::metrics::{HowLabels, ReasonLabels};
use dnsplan_enactor::{Enactor, Metrics, Settings};
use dnsplan_tests::fixtures::{self, name, planner};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(20);

struct Events {
    events: mpsc::UnboundedSender<Event>,
    /// When set, each cleanup reports its plan here and waits for a permit.
    cleanup_gate: Option<(mpsc::UnboundedSender<Generation>, Arc<tokio::sync::Semaphore>)>,
}

impl Hooks for Events {
    fn before_write<'a>(&'a self, _: &'a str, _: Generation, _: &'a EndpointName) -> HookFuture<'a> {
        Box::pin(async {})
    }
    fn before_cleanup<'a>(&'a self, _: &'a str, generation: Generation) -> HookFuture<'a> {
        Box::pin(async move {
            if let Some((reached, open)) = &self.cleanup_gate {
                let _ = reached.send(generation);
                if let Ok(permit) = open.acquire().await {
                    permit.forget();
                }
            }
        })
    }
    fn event(&self, event: Event) {
        let _ = self.events.send(event);
    }
}

/// A running enactor, its metrics and its events.
struct Running {
    metrics: Arc<Metrics>,
    events: mpsc::UnboundedReceiver<Event>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    fn start<S: Store>(store: S, tune: impl FnOnce(&mut Settings)) -> anyhow::Result<Running> {
        Running::start_with(store, tune, None)
    }

    fn start_with<S: Store>(
        store: S,
        tune: impl FnOnce(&mut Settings),
        cleanup_gate: Option<(mpsc::UnboundedSender<Generation>, Arc<tokio::sync::Semaphore>)>,
    ) -> anyhow::Result<Running> {
        let mut settings = Settings::new("en-test", ZoneId::parse("a")?);
        settings.retry.base = Duration::from_millis(1);
        settings.retry.max = Duration::from_millis(5);
        tune(&mut settings);
        let metrics = Arc::new(Metrics::register(&mut Registry::default(), "en-test"));
        let (tx, events) = mpsc::unbounded_channel();
        let enactor = Enactor::new(store, settings, metrics.clone()).with_hooks(Arc::new(Events { events: tx, cleanup_gate }));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(enactor.run(async move {
            let _ = stopped.await;
        }));
        Ok(Running { metrics, events, stop, task })
    }

    /// The next event, within the deadline.
    async fn next(&mut self) -> anyhow::Result<Event> {
        tokio::time::timeout(WITHIN, self.events.recv()).await?.ok_or_else(|| anyhow::anyhow!("enactor stopped"))
    }

    /// Events until one matches, within one deadline for the whole wait (an enactor that
    /// keeps failing keeps sending events).
    async fn until(&mut self, want: impl Fn(&Event) -> bool) -> anyhow::Result<Event> {
        let events = &mut self.events;
        tokio::time::timeout(WITHIN, async {
            loop {
                let event = events.recv().await.ok_or_else(|| anyhow::anyhow!("enactor stopped"))?;
                if want(&event) {
                    return Ok(event);
                }
            }
        })
        .await
        .map_err(|_| anyhow::anyhow!("no matching event within {WITHIN:?}"))?
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        self.task.await?;
        Ok(())
    }
}

fn done(g: u64) -> impl Fn(&Event) -> bool {
    move |e| matches!(e, Event::PlanDone { generation, .. } if *generation == Generation(g))
}

fn endpoint(addresses: &[&str]) -> Endpoint {
    let targets = addresses
        .iter()
        .map(|a| Target { address: a.parse().expect("test address"), zone: ZoneId::parse("a").expect("zone"), weight: 1 })
        .collect();
    Endpoint { ttl_secs: 30, targets }
}

fn plan_with(g: u64, api: Endpoint, author: Author, rollback_of: Option<Generation>) -> anyhow::Result<ValidatedPlan> {
    let mut plan = fixtures::plan(g, &[name("api")], author).into_plan();
    plan.endpoints.insert(name("api"), api);
    plan.rollback_of = rollback_of;
    Ok(ValidatedPlan::new(plan)?)
}

async fn serving<S: Store>(store: &S) -> anyhow::Result<(Generation, usize)> {
    let record = store.active(&name("api")).await?.ok_or_else(|| anyhow::anyhow!("api has no record"))?;
    let ActiveState::Serving(served) = record.state else { anyhow::bail!("api is retired") };
    Ok((record.generation, served.targets.len()))
}

#[tokio::test]
async fn refuses_a_plan_that_strips_too_much_weight_and_keeps_going() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let four = endpoint(&["192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"]);
    store.publish(&plan_with(1, four.clone(), planner(), None)?).await?;
    let mut en = Running::start(store.clone(), |_| {})?;
    en.until(done(1)).await?;

    // Plan 2 drops three of four targets: 75% of the weight, above the default 50%.
    store.publish(&plan_with(2, endpoint(&["192.0.2.1"]), planner(), None)?).await?;
    let refused = en.next().await?;
    assert!(matches!(refused, Event::PlanRefused { generation: Generation(2), .. }), "{refused:?}");
    assert_eq!(serving(&store).await?, (Generation(1), 4), "the refused plan must not be applied in part");
    assert_eq!(en.metrics.refusals.get_or_create(&ReasonLabels { reason: "removal" }).get(), 1);

    // Not wedged: a reasonable plan 3 is applied.
    store.publish(&plan_with(3, endpoint(&["192.0.2.1", "192.0.2.2", "192.0.2.3"]), planner(), None)?).await?;
    en.until(done(3)).await?;
    assert_eq!(serving(&store).await?, (Generation(3), 3));

    // An operator rollback is not limited: back to one target, in one step.
    let operator = Author::Operator { name: "alice".into() };
    store.publish(&plan_with(4, endpoint(&["192.0.2.9"]), operator, Some(Generation(2)))?).await?;
    en.until(done(4)).await?;
    assert_eq!(serving(&store).await?, (Generation(4), 1));
    let beats = store.heartbeats().await?;
    assert_eq!(beats.len(), 1);
    assert_eq!(beats[0].enactor_id, "en-test");
    en.stop().await?;
    // The last heartbeat says where it stopped.
    let beat = &store.heartbeats().await?[0];
    assert_eq!((beat.last_applied, beat.lag(), beat.state.as_str()), (Generation(4), 0, "stopped"));
    Ok(())
}

/// An operator's plan is the operator's decision: one that replaces an endpoint's only target
/// (100% of its weight, beyond the removal limit) is applied, as `plans publish` says in its
/// preview, and the planner's next plan, which carries its content, is applied after it. So
/// no operator plan can wedge automation (a refused plan 2, then a refused plan 3 with the
/// same content, and a dead backend served on).
///
/// Teeth: with the removal guard applied to operators' plans, this fails with "plan 2 by an
/// operator: want it done, got PlanRefused".
#[tokio::test]
async fn an_operators_plan_beyond_the_removal_limit_is_applied_and_automation_goes_on() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    store.publish(&plan_with(1, endpoint(&["192.0.2.1"]), planner(), None)?).await?;
    let mut en = Running::start(store.clone(), |_| {})?;
    en.until(done(1)).await?;

    let operator = Author::Operator { name: "alice".into() };
    store.publish(&plan_with(2, endpoint(&["192.0.2.2"]), operator, None)?).await?;
    let event = en.next().await?;
    assert!(matches!(event, Event::PlanDone { generation: Generation(2), .. }), "plan 2 by an operator: want it done, got {event:?}");
    assert_eq!(serving(&store).await?, (Generation(2), 1));

    store.publish(&plan_with(3, endpoint(&["192.0.2.2", "192.0.2.3"]), planner(), None)?).await?;
    en.until(done(3)).await?;
    assert_eq!(serving(&store).await?, (Generation(3), 2));
    assert_eq!(en.metrics.refusals.get_or_create(&ReasonLabels { reason: "removal" }).get(), 0);
    en.stop().await
}

/// A store that fails the first `fail_applies` applies as unreachable, acknowledges the
/// first apply of `lose` without writing it (a lost write), and sends other records than it
/// was given for `tamper` (a buggy writer).
#[derive(Clone)]
struct Faulty<S> {
    inner: S,
    /// How many times `latest` was asked.
    latest_calls: Arc<AtomicU32>,
    fail_applies: Arc<AtomicU32>,
    lose: Arc<Mutex<Option<EndpointName>>>,
    tamper: Arc<Mutex<Option<EndpointName>>>,
}

impl<S> Faulty<S> {
    fn new(inner: S) -> Faulty<S> {
        Faulty { inner, latest_calls: Arc::default(), fail_applies: Arc::default(), lose: Arc::default(), tamper: Arc::default() }
    }
}

impl<S: Store> Store for Faulty<S> {
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
    async fn latest(&self) -> StoreResult<Generation> {
        self.latest_calls.fetch_add(1, Ordering::SeqCst);
        self.inner.latest().await
    }
    async fn generation_base(&self) -> StoreResult<Generation> {
        self.inner.generation_base().await
    }
    async fn list_unchecked(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.inner.list(from, limit).await
    }
    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        if self.fail_applies.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok() {
            return Err(StoreError::Unavailable("injected: store unreachable".into()));
        }
        let lost = {
            let mut lose = self.lose.lock().unwrap_or_else(|p| p.into_inner());
            if lose.as_ref() == Some(endpoint) { lose.take().is_some() } else { false }
        };
        if lost {
            return Ok(ApplyOutcome::Switched { previous: Generation::NONE });
        }
        let tampered = self.tamper.lock().unwrap_or_else(|p| p.into_inner()).as_ref() == Some(endpoint);
        if tampered {
            let mut other = records.clone();
            other.ttl_secs += 1;
            return self.inner.apply(endpoint, generation, &other).await;
        }
        self.inner.apply(endpoint, generation, records).await
    }
    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        self.inner.retire(endpoint, generation).await
    }
    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.inner.active(endpoint).await
    }
    async fn active_all(&self) -> StoreResult<ActiveSnapshot> {
        self.inner.active_all().await
    }
    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        self.inner.cleanup_preview(retain).await
    }
    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        self.inner.cleanup(retain).await
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

/// An enactor started before any plan exists waits for one: it asks the store for the latest
/// plan once, not in a loop (which it did while its first reconcile stayed due, a core busy
/// until the first plan). Then it applies the first plan as soon as it is published.
#[tokio::test]
async fn an_enactor_on_an_empty_store_waits_without_spinning() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = Faulty::new(SledStore::open(dir.path())?);
    let calls = store.latest_calls.clone();
    let mut en = Running::start(store.clone(), |_| {})?;
    // A window to count in, not a wait for something to happen: the heartbeat (10 s) and
    // the reconcile (60 s) are far off, so nothing should ask again within it.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let asked = calls.load(Ordering::SeqCst);
    anyhow::ensure!((1..=3).contains(&asked), "an enactor with no plan to apply asked for the latest plan {asked} times in 300 ms");
    store.publish(&plan_with(1, endpoint(&["192.0.2.1"]), planner(), None)?).await?;
    en.until(done(1)).await?;
    assert_eq!(serving(&store).await?, (Generation(1), 1));
    en.stop().await
}

/// A writer that sends other records than its plan holds is refused by the store at write
/// time, and the enactor takes that as a refusal of the plan (counted, not retried, nothing
/// served from it), the same on the embedded store and through the control API. Before the
/// control API carried errors exactly, the remote store's refusal came back as another
/// variant and the enactor retried it as a store failure.
async fn a_store_refusal_is_a_refusal<S: Store>(store: S) -> anyhow::Result<()> {
    let api = name("api");
    let faulty = Faulty::new(store.clone());
    *faulty.tamper.lock().unwrap_or_else(|p| p.into_inner()) = Some(api.clone());
    store.publish(&plan_with(1, endpoint(&["192.0.2.1", "192.0.2.2"]), planner(), None)?).await?;
    let mut en = Running::start(faulty.clone(), |_| {})?;
    let refused = en.next().await?;
    assert!(matches!(refused, Event::PlanRefused { generation: Generation(1), .. }), "{refused:?}");
    assert_eq!(en.metrics.refusals.get_or_create(&ReasonLabels { reason: "content_mismatch" }).get(), 1);
    assert_eq!(en.metrics.store_retries.get(), 0, "a refusal is an answer, not a store failure to retry");
    assert_eq!(store.active(&api).await?, None, "nothing the plan does not hold was served");
    // The writer is fixed; the next plan goes through.
    *faulty.tamper.lock().unwrap_or_else(|p| p.into_inner()) = None;
    store.publish(&plan_with(2, endpoint(&["192.0.2.1", "192.0.2.3"]), planner(), None)?).await?;
    en.until(done(2)).await?;
    assert_eq!(serving(&store).await?, (Generation(2), 2));
    en.stop().await
}

#[tokio::test]
async fn a_store_refusal_is_a_refusal_on_the_embedded_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    a_store_refusal_is_a_refusal(SledStore::open(dir.path())?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_refusal_is_a_refusal_through_the_control_api() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let authority = dnsplan_tests::stack::Authority::start(SledStore::open(dir.path().join("store"))?, dir.path()).await?;
    let remote = dnsplan_common::store::remote::RemoteStore::new(&authority.control, Some(dnsplan_tests::stack::TOKEN.into()))?;
    a_store_refusal_is_a_refusal(remote).await?;
    authority.stop().await
}

#[tokio::test]
async fn retries_transient_errors_and_reconcile_heals_a_lost_write() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sled = SledStore::open(dir.path())?;
    let names = [name("api"), name("db"), name("www")];
    let store = Faulty {
        fail_applies: Arc::new(AtomicU32::new(3)),
        lose: Arc::new(Mutex::new(Some(names[1].clone()))),
        ..Faulty::new(sled.clone())
    };
    store.publish(&fixtures::plan(1, &names, planner())).await?;
    let mut en = Running::start(store.clone(), |s| {
        s.reconcile_interval = Duration::from_millis(100);
        s.retry.attempts = 5;
    })?;
    // Three injected failures, retried within one call's five attempts.
    en.until(done(1)).await?;
    assert_eq!(en.metrics.store_retries.get(), 3);
    assert_eq!(en.metrics.store_errors.get(), 0);
    // db's write was acknowledged and lost; the store does not have it.
    assert_eq!(sled.active(&names[1]).await?, None);
    // The next reconcile pass applies the latest plan in full again and heals it.
    en.until(done(1)).await?;
    let healed = sled.active(&names[1]).await?.ok_or_else(|| anyhow::anyhow!("db was not healed"))?;
    assert_eq!(healed.generation, Generation(1));
    en.stop().await?;
    Ok(())
}

#[tokio::test]
async fn gives_up_after_the_retries_and_recovers_later() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let sled = SledStore::open(dir.path())?;
    let names = [name("api")];
    let store = Faulty { fail_applies: Arc::new(AtomicU32::new(4)), ..Faulty::new(sled.clone()) };
    store.publish(&fixtures::plan(1, &names, planner())).await?;
    let mut en = Running::start(store, |s| s.retry.attempts = 2)?;
    // Two attempts fail, the plan is abandoned, the loop comes back and the next two fail,
    // then it goes through: an outage longer than the retries never wedges the enactor.
    let first = en.next().await?;
    assert!(matches!(first, Event::PlanAbandoned { generation: Generation(1), .. }), "{first:?}");
    en.until(done(1)).await?;
    assert_eq!(en.metrics.store_errors.get(), 2);
    assert_eq!(en.metrics.plans_abandoned.get_or_create(&ReasonLabels { reason: "store_error" }).get(), 2);
    assert_eq!(sled.active(&names[0]).await?.map(|r| r.generation), Some(Generation(1)));
    en.stop().await?;
    Ok(())
}

#[tokio::test]
async fn writes_only_what_changed_and_everything_every_nth_plan() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let names: Vec<EndpointName> = (0..10).map(|i| name(&format!("e{i}"))).collect();
    let plan = |g: u64, changed: usize| -> anyhow::Result<ValidatedPlan> {
        // The first `changed` names get generation g's records; the rest keep plan 1's.
        let mut plan = fixtures::plan(g, &names, planner()).into_plan();
        for n in names.iter().skip(changed) {
            plan.endpoints.insert(n.clone(), fixtures::endpoint_for(Generation(1)));
        }
        Ok(ValidatedPlan::new(plan)?)
    };
    let generations =
        |active: &ActiveSnapshot| names.iter().map(|n| active.endpoints.get(n).map_or(0, |r| r.generation.0)).collect::<Vec<_>>();
    store.publish(&plan(1, 10)?).await?;
    let mut en = Running::start(store.clone(), |s| {
        s.full_write_every = 3;
        s.max_removal_fraction = 1.0; // fixture plans replace every address of a changed name
    })?;
    en.until(done(1)).await?;
    // Plan 2 changes e0 only: only e0 is written; the others keep generation 1 and plan 2's
    // records, which are plan 1's.
    let published = plan(2, 1)?;
    store.publish(&published).await?;
    en.until(done(2)).await?;
    let active = store.active_all().await?;
    assert_eq!(generations(&active), [2, 1, 1, 1, 1, 1, 1, 1, 1, 1]);
    for (n, records) in &published.plan().endpoints {
        assert_eq!(active.endpoints.get(n).map(|r| &r.state), Some(&ActiveState::Serving(records.clone())), "{n} serves plan 2");
    }
    assert_eq!(en.metrics.skipped_unchanged.get(), 9);
    assert_eq!(reads(&en, "whole"), 1, "plan 1 is read whole");
    assert_eq!(reads(&en, "changes"), 1, "plan 2 is read as its changes");
    // Plan 3 changes e0 and e1; plan 4 is three plans after the last full write: everything.
    store.publish(&plan(3, 2)?).await?;
    en.until(done(3)).await?;
    assert_eq!(generations(&store.active_all().await?), [3, 3, 1, 1, 1, 1, 1, 1, 1, 1]);
    store.publish(&plan(4, 2)?).await?;
    en.until(done(4)).await?;
    assert_eq!(generations(&store.active_all().await?), [4; 10], "a full write moves every fence");
    assert_eq!((reads(&en, "whole"), reads(&en, "changes")), (2, 2), "plan 4 is read whole");
    en.stop().await?;
    Ok(())
}

fn reads(en: &Running, how: &'static str) -> u64 {
    en.metrics.plan_reads.get_or_create(&HowLabels { how }).get()
}

/// An endpoint that changed and changed back between two plans this enactor applied is
/// written again: another enactor may have applied the change in between, and the change
/// back is what must be served. Comparing the two plans alone would skip it.
#[tokio::test]
async fn an_endpoint_that_changed_and_changed_back_is_written_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let names: Vec<EndpointName> = (0..4).map(|i| name(&format!("e{i}"))).collect();
    let plan = |g: u64, e0: Generation| -> anyhow::Result<ValidatedPlan> {
        let mut plan = fixtures::plan(g, &names, planner()).into_plan();
        for n in &names {
            plan.endpoints.insert(n.clone(), fixtures::endpoint_for(Generation(1)));
        }
        plan.endpoints.insert(names[0].clone(), fixtures::endpoint_for(e0));
        Ok(ValidatedPlan::new(plan)?)
    };
    store.publish(&plan(1, Generation(1))?).await?;
    let (reached_tx, mut reached) = mpsc::unbounded_channel();
    let open = Arc::new(tokio::sync::Semaphore::new(0));
    let mut en = Running::start_with(
        store.clone(),
        |s| {
            s.max_removal_fraction = 1.0;
            s.full_write_every = 100;
        },
        Some((reached_tx, open.clone())),
    )?;
    // The enactor has applied plan 1 and waits before its cleanup.
    assert_eq!(tokio::time::timeout(WITHIN, reached.recv()).await?, Some(Generation(1)));
    // Meanwhile plan 2 moves e0, another enactor applies it, and plan 3 moves it back.
    let two = plan(2, Generation(2))?;
    store.publish(&two).await?;
    store.apply(&names[0], Generation(2), &two.plan().endpoints[&names[0]]).await?;
    store.publish(&plan(3, Generation(1))?).await?;
    open.add_permits(100);
    en.until(done(3)).await?;
    let e0 = store.active(&names[0]).await?;
    assert_eq!(
        e0,
        Some(ActiveRecord { generation: Generation(3), state: ActiveState::Serving(fixtures::endpoint_for(Generation(1))) }),
        "e0 serves plan 3, not plan 2"
    );
    assert_eq!(reads(&en, "changes"), 1, "plan 3 is read as its changes since plan 1");
    assert_eq!(en.metrics.skipped_unchanged.get(), 3);
    en.stop().await?;
    Ok(())
}

/// Publishes plan 3 from inside the enactor's writes of plan 2, once it has written
/// `after` of them, and counts the writes of each plan.
struct Storm {
    store: SledStore,
    plan3: ValidatedPlan,
    after: u32,
    writes: [AtomicU32; 4],
    events: mpsc::UnboundedSender<Event>,
}

impl Hooks for Storm {
    fn before_write<'a>(&'a self, _: &'a str, generation: Generation, _: &'a EndpointName) -> HookFuture<'a> {
        Box::pin(async move {
            let Some(count) = self.writes.get(generation.0 as usize) else { return };
            if count.fetch_add(1, Ordering::SeqCst) + 1 == self.after && generation == Generation(2) {
                let _ = self.store.publish(&self.plan3).await;
            }
        })
    }
    fn before_cleanup<'a>(&'a self, _: &'a str, _: Generation) -> HookFuture<'a> {
        Box::pin(async {})
    }
    fn event(&self, event: Event) {
        let _ = self.events.send(event);
    }
}

/// An application overtaken by a newer plan carries what it wrote to the next one: plan 3,
/// published while plan 2 (which changes all 1,000 endpoints) is a third written, rewrites
/// only the endpoints plan 2 had not reached (and the one plan 3 changes), not all 1,000 again;
/// and every endpoint serves plan 3 after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_overtaken_midway_is_not_written_again_by_the_next() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let names: Vec<EndpointName> = (0..1_000).map(|i| name(&format!("e{i:04}"))).collect();
    let mut plan3 = fixtures::plan(3, &names, planner()).into_plan();
    for records in plan3.endpoints.values_mut() {
        *records = fixtures::endpoint_for(Generation(2));
    }
    plan3.endpoints.insert(names[999].clone(), fixtures::endpoint_for(Generation(3)));
    let plan3 = ValidatedPlan::new(plan3)?;
    let (tx, mut events) = mpsc::unbounded_channel();
    let hooks = Arc::new(Storm { store: store.clone(), plan3: plan3.clone(), after: 300, writes: Default::default(), events: tx });
    let mut settings = Settings::new("en-storm", ZoneId::parse("a")?);
    settings.batch_size = 20;
    settings.full_write_every = u64::MAX;
    settings.reconcile_interval = Duration::from_secs(3_600);
    settings.max_removal_fraction = 1.0;
    let metrics = Arc::new(Metrics::register(&mut Registry::default(), "en-storm"));
    let enactor = Enactor::new(store.clone(), settings, metrics).with_hooks(hooks.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(enactor.run(async move {
        let _ = stopped.await;
    }));
    store.publish(&fixtures::plan(1, &names, planner())).await?;
    until_done(&mut events, 1).await?;
    store.publish(&fixtures::plan(2, &names, planner())).await?;
    until_done(&mut events, 3).await?;
    let _ = stop.send(());
    task.await?;
    let [_, _, at2, at3] = &hooks.writes;
    let (at2, at3) = (at2.load(Ordering::SeqCst), at3.load(Ordering::SeqCst));
    assert!((300..1_000).contains(&at2), "plan 2 was written {at2} times before plan 3 overtook it");
    assert!(at3 <= 1_000 - at2 + 20, "plan 3 rewrote {at3} endpoints; plan 2 had written {at2} of 1,000 before it was overtaken");
    let active = store.active_all().await?;
    for (n, records) in &plan3.plan().endpoints {
        let served = active.endpoints.get(n).map(|r| &r.state);
        assert_eq!(served, Some(&ActiveState::Serving(records.clone())), "{n} after plan 3");
    }
    Ok(())
}

async fn until_done(events: &mut mpsc::UnboundedReceiver<Event>, g: u64) -> anyhow::Result<()> {
    let want = done(g);
    // One deadline for the whole wait: an enactor that keeps failing keeps sending events.
    tokio::time::timeout(WITHIN, async {
        loop {
            let event = events.recv().await.ok_or_else(|| anyhow::anyhow!("enactor stopped"))?;
            if want(&event) {
                return Ok(());
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("plan {g} was not done within {WITHIN:?}"))?
}
