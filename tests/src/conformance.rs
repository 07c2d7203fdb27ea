//! The `Store` conformance suite: every guarantee of the `Store` contract as a check that
//! reports violations.
//!
//! Each check gets a fresh store from a [`Harness`] and returns what it saw go wrong. A
//! real store must return no violations; [`crate::naive::NaiveStore`] must return some (the
//! teeth check). Racing checks run bounded rounds and stop at the first violation.
//!
//! Each protection was also removed from `SledStore` once to see the suite catch it:
//! without the write-time fence comparison, `apply_is_fenced`, `race_2025_concurrent` and
//! `racing_applies_are_monotonic` fail; without the refusal of cleaned-up generations,
//! `cleanup_is_guarded` and `race_2025_sequence` fail (an old plan becomes active on a new
//! endpoint after its plan was deleted). The SIGKILL test in `tests/sled_crash.rs` fails
//! when `apply` stops flushing before it acknowledges. Without the lease check in a leased
//! publish, `lease_is_exclusive_and_fences_publish` and `leased_publish_is_fenced` fail.
//! Against the naive store, `racing_lease_acquires` and `leased_publish_is_fenced` catch the
//! check-then-act only in most runs (they race real threads), so the teeth check requires
//! only the deterministic lease check.

use crate::fixtures::{dns_zone, endpoint_for, name, operator, plan, planner};
use dnsplan_common::store::{ACTIVE_PAGE_MAX, ActiveState, ApplyItem, ApplyOutcome, PauseState, PlanSays, Store, StoreError};
use dnsplan_common::{
    Author, DnsName, Endpoint, EndpointName, Generation, Heartbeat, Plan, PlanChanges, PlanDelta, PlanEntry, ValidatedPlan,
    ValidationError, ZoneId,
};
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::Barrier;

/// Makes fresh, empty stores of one implementation.
pub trait Harness: Send + Sync {
    type S: Store;
    fn fresh(&self) -> impl Future<Output = anyhow::Result<Self::S>> + Send;
}

/// Violations found by one check.
#[derive(Debug, Default)]
pub struct Violations(Vec<String>);

impl Violations {
    pub fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }

    pub fn push(&mut self, what: String) {
        self.0.push(what);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The outcome of a whole suite run.
#[derive(Debug, Default)]
pub struct SuiteReport {
    pub checks: Vec<(&'static str, Violations)>,
}

impl SuiteReport {
    pub fn is_clean(&self) -> bool {
        self.checks.iter().all(|(_, v)| v.is_empty())
    }

    pub fn failed(&self) -> BTreeSet<&'static str> {
        self.checks.iter().filter(|(_, v)| !v.is_empty()).map(|(n, _)| *n).collect()
    }
}

impl fmt::Display for SuiteReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, violations) in &self.checks {
            if violations.is_empty() {
                writeln!(f, "ok   {name}")?;
            } else {
                writeln!(f, "FAIL {name}")?;
                for v in violations.0.iter().take(10) {
                    writeln!(f, "       {v}")?;
                }
            }
        }
        Ok(())
    }
}

/// Runs every check against fresh stores from `harness`.
pub async fn run_all<H: Harness>(harness: &H) -> anyhow::Result<SuiteReport> {
    let mut report = SuiteReport::default();
    macro_rules! run {
        ($($check:ident),* $(,)?) => {$(
            let violations = match $check(harness.fresh().await?).await {
                Ok(v) => v,
                // A store error where the check expected success is a violation too.
                Err(err) => Violations(vec![format!("check stopped: {err:#}")]),
            };
            report.checks.push((stringify!($check), violations));
        )*};
    }
    run!(
        publish_is_cas,
        pause_blocks_automation_only,
        apply_is_fenced,
        cleanup_is_guarded,
        retire_releases_cleanup,
        race_2025_sequence,
        race_2025_concurrent,
        racing_applies_are_monotonic,
        racing_publishes_have_no_gaps,
        snapshot_is_consistent,
        wait_for_change_wakes,
        heartbeats_round_trip,
        lease_is_exclusive_and_fences_publish,
        lease_expires,
        racing_lease_acquires,
        leased_publish_is_fenced,
        apply_many_is_fenced_per_item,
        active_since_follows,
        active_page_walks_the_state,
        plan_changes_cover_every_plan_between,
        apply_carries_the_plans_content,
        publish_changes_is_publish,
        publish_changes_keeps_the_rules,
        content_changes_count_what_is_served,
        dnssec_keys_are_cas,
    );
    Ok(report)
}

async fn publish_range<S: Store>(store: &S, generations: std::ops::RangeInclusive<u64>, labels: &[&str]) -> anyhow::Result<()> {
    let names: Vec<_> = labels.iter().map(|l| name(l)).collect();
    for g in generations {
        store.publish(&plan(g, &names, planner())).await?;
    }
    Ok(())
}

/// Publishes operator plan `g` serving `labels` and retiring `retired`.
async fn publish_retiring<S: Store>(store: &S, g: u64, labels: &[&str], retired: &[&str]) -> anyhow::Result<()> {
    let names: Vec<_> = labels.iter().map(|l| name(l)).collect();
    let mut raw = plan(g, &names, operator()).into_plan();
    raw.retired = retired.iter().map(|l| name(l)).collect();
    store.publish(&ValidatedPlan::new(raw)?).await?;
    Ok(())
}

fn with_parent(p: &ValidatedPlan, generation: u64, parent: u64) -> ValidatedPlan {
    let mut raw: Plan = p.clone().into_plan();
    raw.generation = Generation(generation);
    raw.parent_generation = Generation(parent);
    ValidatedPlan::new(raw).expect("still valid")
}

/// Publish is a CAS on the latest generation; plans read back as published.
pub async fn publish_is_cas<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let x = [name("x")];
    v.check(store.latest().await? == Generation::NONE, || "a fresh store has a latest plan".into());
    // None, or the zone it was made for (a zone added to a store knows its name at once).
    let zone = store.dns_zone().await?;
    v.check(zone.is_none() || zone == Some(dns_zone()), || format!("a fresh store has the DNS zone {zone:?}"));
    let first = plan(1, &x, planner());
    v.check(store.publish(&first).await.is_ok(), || "plan 1 on an empty store was refused".into());
    let zone = store.dns_zone().await?;
    v.check(zone.as_ref() == Some(&first.plan().dns_zone), || format!("after plan 1 the store's DNS zone is {zone:?}"));
    for (g, parent) in [(1, 0), (3, 2), (2, 0), (3, 1)] {
        let attempt = with_parent(&first, g, parent);
        match store.publish(&attempt).await {
            Err(StoreError::Conflict { latest, .. }) => {
                v.check(latest == Generation(1), || format!("conflict for {g}/{parent} reported latest {latest}, want 1"))
            }
            other => v.push(format!("publish of generation {g} with parent {parent} over latest 1: want Conflict, got {other:?}")),
        }
    }
    v.check(store.latest().await? == Generation(1), || "latest moved after refused publishes".into());
    match store.plan(Generation(1)).await {
        Ok(read) => v.check(read == first, || "plan 1 reads back different from what was published".into()),
        Err(e) => v.push(format!("plan 1 unreadable: {e}")),
    }
    v.check(matches!(store.plan(Generation(2)).await, Err(StoreError::PlanNotFound(_))), || "plan 2 found before publish".into());
    let mut other_zone = first.clone().into_plan();
    other_zone.generation = Generation(2);
    other_zone.parent_generation = Generation(1);
    other_zone.dns_zone = DnsName::parse("other.test")?;
    other_zone.endpoints = [(DnsName::parse("x.other.test")?, endpoint_for(Generation(2)))].into();
    let other_zone = ValidatedPlan::new(other_zone)?;
    v.check(matches!(store.publish(&other_zone).await, Err(StoreError::DnsZoneMismatch { .. })), || {
        "a plan for another DNS zone was accepted".into()
    });
    let zone = store.dns_zone().await?;
    v.check(zone.as_ref() == Some(&first.plan().dns_zone), || format!("after a refused plan for another zone the store's is {zone:?}"));
    publish_range(&store, 2..=5, &["x"]).await?;
    let listed: Vec<u64> = store.list(Generation(3), 2).await?.iter().map(|s| s.generation.0).collect();
    v.check(listed == [3, 4], || format!("list(3, 2) gave {listed:?}"));
    let all: Vec<u64> = store.list(Generation::NONE, 100).await?.iter().map(|s| s.generation.0).collect();
    v.check(all == [1, 2, 3, 4, 5], || format!("list(0, 100) gave {all:?}"));
    Ok(v)
}

/// A pause refuses planner plans and lets operator plans through; resume lifts it.
pub async fn pause_blocks_automation_only<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let x = [name("x")];
    store.publish(&plan(1, &x, planner())).await?;
    let pause = PauseState::by_operator("incident 42", "alice", 1);
    store.pause(pause.clone()).await?;
    v.check(store.paused().await?.as_ref() == Some(&pause), || "paused() does not return the pause".into());
    match store.publish(&plan(2, &x, planner())).await {
        Err(StoreError::Paused { reason, .. }) => v.check(reason == "incident 42", || format!("pause error lost the reason: {reason}")),
        other => v.push(format!("planner publish while paused: want Paused, got {other:?}")),
    }
    v.check(store.publish(&plan(2, &x, operator())).await.is_ok(), || "operator publish refused while paused".into());
    store.resume().await?;
    v.check(store.paused().await?.is_none(), || "still paused after resume".into());
    v.check(store.publish(&plan(3, &x, planner())).await.is_ok(), || "planner publish refused after resume".into());
    Ok(v)
}

/// Older → Stale, equal → no-op, newer → switch with a copy of the records; unpublished
/// generations and empty endpoints are refused.
pub async fn apply_is_fenced<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let x = name("x");
    publish_range(&store, 1..=3, &["x"]).await?;
    let r = store.apply(&x, Generation(2), &endpoint_for(Generation(2))).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { previous: Generation::NONE })), || format!("first apply: {r:?}"));
    let r = store.apply(&x, Generation(2), &endpoint_for(Generation(2))).await;
    v.check(matches!(r, Ok(ApplyOutcome::Unchanged)), || format!("equal generation: want Unchanged, got {r:?}"));
    let r = store.apply(&x, Generation(1), &endpoint_for(Generation(1))).await;
    v.check(matches!(r, Err(StoreError::Stale { active: Generation(2), .. })), || format!("older generation: want Stale at 2, got {r:?}"));
    let active = store.active(&x).await?;
    v.check(
        active.as_ref().is_some_and(|a| a.generation == Generation(2) && a.state == ActiveState::Serving(endpoint_for(Generation(2)))),
        || format!("after a stale apply the active record is {active:?}"),
    );
    let r = store.apply(&x, Generation(3), &endpoint_for(Generation(3))).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { previous: Generation(2) })), || format!("newer generation: {r:?}"));
    let r = store.apply(&x, Generation(4), &endpoint_for(Generation(4))).await;
    v.check(matches!(r, Err(StoreError::Unpublished { .. })), || format!("unpublished generation 4: want Unpublished, got {r:?}"));
    let mut empty = endpoint_for(Generation(3));
    empty.targets.clear();
    let r = store.apply(&name("y"), Generation(3), &empty).await;
    v.check(matches!(r, Err(StoreError::Invalid(_))), || format!("empty endpoint: want Invalid, got {r:?}"));
    v.check(store.active(&name("y")).await?.is_none(), || "an empty endpoint became active".into());
    v.check(store.active(&x).await?.map(|a| a.generation) == Some(Generation(3)), || "active is not 3 at the end".into());
    Ok(v)
}

/// An apply carries exactly what its plan says: the store refuses, at write time, records (or
/// a retirement) that plan `g` does not hold for the endpoint, at an equal generation too, and
/// resolves an endpoint a plan left unchanged to the records it kept, across cleanup.
pub async fn apply_carries_the_plans_content<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let (a, b, c) = (name("a"), name("b"), name("c"));
    publish_range(&store, 1..=3, &["a", "b"]).await?;
    let mismatch = |r: &dnsplan_common::store::StoreResult<ApplyOutcome>, says: PlanSays| matches!(r, Err(StoreError::ContentMismatch { plan, .. }) if *plan == says);
    let r = store.apply(&a, Generation(2), &endpoint_for(Generation(3))).await;
    v.check(mismatch(&r, PlanSays::OtherRecords), || format!("plan 3's records under generation 2: want ContentMismatch, got {r:?}"));
    v.check(store.active(&a).await?.is_none(), || "refused records became active".into());
    let r = store.apply(&a, Generation(2), &endpoint_for(Generation(2))).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { .. })), || format!("plan 2's own records: {r:?}"));
    let r = store.apply(&a, Generation(2), &endpoint_for(Generation(1))).await;
    v.check(mismatch(&r, PlanSays::OtherRecords), || format!("other records at the active generation: want ContentMismatch, got {r:?}"));
    let r = store.retire(&a, Generation(3)).await;
    v.check(mismatch(&r, PlanSays::Serves), || format!("retiring an endpoint plan 3 serves: want ContentMismatch, got {r:?}"));
    let r = store.apply_many(Generation(3), &[item("a", 3), item("b", 2)]).await?;
    v.check(matches!(r.first(), Some(Ok(ApplyOutcome::Switched { .. }))), || format!("a batch's good item: {r:?}"));
    v.check(matches!(r.get(1), Some(r) if mismatch(r, PlanSays::OtherRecords)), || format!("a batch's bad item: {r:?}"));
    v.check(store.active(&b).await?.is_none(), || "a batch's refused item became active".into());
    // Plan 4 leaves b out; plan 5, an operator's, retires it.
    store.publish(&plan(4, std::slice::from_ref(&a), planner())).await?;
    let r = store.apply(&b, Generation(4), &endpoint_for(Generation(4))).await;
    v.check(mismatch(&r, PlanSays::NothingOf), || format!("an endpoint plan 4 does not name: want ContentMismatch, got {r:?}"));
    let mut retire = plan(5, std::slice::from_ref(&a), operator()).into_plan();
    retire.retired.insert(b.clone());
    store.publish(&ValidatedPlan::new(retire)?).await?;
    let r = store.apply(&b, Generation(5), &endpoint_for(Generation(5))).await;
    v.check(mismatch(&r, PlanSays::Retires), || format!("records for an endpoint plan 5 retires: want ContentMismatch, got {r:?}"));
    let r = store.retire(&b, Generation(5)).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { .. })), || format!("the retirement plan 5 holds: {r:?}"));
    // Plan 6 keeps a's records from plan 5 and adds c.
    let mut keep = plan(6, std::slice::from_ref(&c), planner()).into_plan();
    keep.endpoints.insert(a.clone(), endpoint_for(Generation(5)));
    store.publish(&ValidatedPlan::new(keep)?).await?;
    store.apply(&a, Generation(5), &endpoint_for(Generation(5))).await?;
    store.cleanup(1).await?;
    let r = store.apply(&a, Generation(6), &endpoint_for(Generation(5))).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { .. })), || format!("records plan 6 kept from plan 5, after cleanup: {r:?}"));
    let r = store.apply(&c, Generation(6), &endpoint_for(Generation(5))).await;
    v.check(mismatch(&r, PlanSays::OtherRecords), || format!("c with plan 5's records under 6: want ContentMismatch, got {r:?}"));
    let r = store.apply(&c, Generation(6), &endpoint_for(Generation(6))).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { .. })), || format!("c with plan 6's records: {r:?}"));
    Ok(v)
}

/// Plan `g` serving each name with the records given, by `author`, retiring `retired`.
fn plan_of(g: u64, endpoints: &[(&EndpointName, &Endpoint)], retired: &[&EndpointName], author: Author) -> anyhow::Result<ValidatedPlan> {
    let mut raw = plan(g, &[endpoints[0].0.clone()], author).into_plan();
    raw.endpoints = endpoints.iter().map(|(n, e)| ((*n).clone(), (*e).clone())).collect();
    raw.retired = retired.iter().map(|n| (*n).clone()).collect();
    Ok(ValidatedPlan::new(raw)?)
}

/// The content-change count (what the SOA serial derives from) moves once per apply that
/// changes what is served (new records, a TTL alone, a retirement) and never for one that only
/// moves fences to a newer plan with the same records, as each restart's or reconcile's plan
/// does; `active_since` carries it as the snapshot does.
pub async fn content_changes_count_what_is_served<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let (a, b) = (name("a"), name("b"));
    let records = endpoint_for(Generation(1));
    let longer = Endpoint { ttl_secs: records.ttl_secs + 30, ..records.clone() };
    let counts = async || -> anyhow::Result<(u64, u64)> {
        let all = store.active_all().await?;
        Ok((all.applied_changes, all.content_changes))
    };
    let start = counts().await?;
    let mut at = start;
    let mut step = async |what: &str, applied: u64, content: u64, v: &mut Violations| -> anyhow::Result<()> {
        let now = counts().await?;
        let moved = (now.0 - at.0, now.1 - at.1);
        v.check(moved == (applied, content), || {
            format!("{what}: applied and content counts moved by {moved:?}, want ({applied}, {content})")
        });
        at = now;
        Ok(())
    };
    store.publish(&plan_of(1, &[(&a, &records), (&b, &records)], &[], planner())?).await?;
    store
        .apply_many(
            Generation(1),
            &[ApplyItem { endpoint: a.clone(), records: records.clone() }, ApplyItem { endpoint: b.clone(), records: records.clone() }],
        )
        .await?;
    step("two new endpoints in one batch", 2, 1, &mut v).await?;
    store.publish(&plan_of(2, &[(&a, &records), (&b, &records)], &[], planner())?).await?;
    store.apply(&a, Generation(2), &records).await?;
    store.apply(&b, Generation(2), &records).await?;
    step("a newer plan with the same records", 2, 0, &mut v).await?;
    store.publish(&plan_of(3, &[(&a, &longer), (&b, &records)], &[], planner())?).await?;
    store.apply(&a, Generation(3), &longer).await?;
    step("a TTL alone", 1, 1, &mut v).await?;
    store.apply(&b, Generation(3), &records).await?;
    step("the same records again", 1, 0, &mut v).await?;
    store.publish(&plan_of(4, &[(&a, &longer)], &[&b], operator())?).await?;
    store.retire(&b, Generation(4)).await?;
    step("a retirement", 1, 1, &mut v).await?;
    store.apply(&a, Generation(4), &longer).await?;
    step("the same records beside it", 1, 0, &mut v).await?;
    let delta = store.active_since(start.0).await?;
    v.check((delta.applied_changes, delta.content_changes) == at, || {
        format!("active_since answers at {:?}, the snapshot at {at:?}", (delta.applied_changes, delta.content_changes))
    });
    let page = store.active_page(None, 1).await?;
    v.check(page.applied_changes == at.0, || format!("a page at {}, the snapshot at {}", page.applied_changes, at.0));
    Ok(v)
}

fn item(label: &str, g: u64) -> ApplyItem {
    ApplyItem { endpoint: name(label), records: endpoint_for(Generation(g)) }
}

/// A batch apply fences each item on its own, commits the switches and refuses what concerns
/// the whole batch.
pub async fn apply_many_is_fenced_per_item<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    publish_range(&store, 1..=3, &["a", "b", "c"]).await?;
    let before = store.version().await?.applied_changes;
    let r = store.apply_many(Generation(2), &[item("a", 2), item("b", 2)]).await?;
    v.check(r.iter().all(|r| matches!(r, Ok(ApplyOutcome::Switched { previous: Generation::NONE }))), || format!("first batch: {r:?}"));
    store.apply(&name("a"), Generation(3), &endpoint_for(Generation(3))).await?;
    let mut empty = item("d", 2);
    empty.records.targets.clear();
    let r = store.apply_many(Generation(2), &[item("a", 2), item("b", 2), item("c", 2), empty]).await?;
    v.check(r.len() == 4, || format!("want 4 results, got {r:?}"));
    v.check(matches!(r.first(), Some(Err(StoreError::Stale { active: Generation(3), .. }))), || {
        format!("a is at 3: want Stale, got {r:?}")
    });
    v.check(matches!(r.get(1), Some(Ok(ApplyOutcome::Unchanged))), || format!("b is at 2: want Unchanged, got {r:?}"));
    v.check(matches!(r.get(2), Some(Ok(ApplyOutcome::Switched { .. }))), || format!("c is new: want Switched, got {r:?}"));
    v.check(matches!(r.get(3), Some(Err(StoreError::Invalid(_)))), || format!("empty d: want Invalid, got {r:?}"));
    let active = store.active_all().await?;
    let at = |label: &str| active.endpoints.get(&name(label)).map(|a| a.generation.0);
    v.check(at("a") == Some(3) && at("b") == Some(2) && at("c") == Some(2) && at("d").is_none(), || {
        format!("after the batches: a {:?}, b {:?}, c {:?}, d {:?}", at("a"), at("b"), at("c"), at("d"))
    });
    v.check(active.applied_changes == before + 4, || format!("applied_changes moved by {}, want 4", active.applied_changes - before));
    let r = store.apply_many(Generation(4), &[item("a", 4)]).await;
    v.check(matches!(r, Err(StoreError::Unpublished { .. })), || format!("unpublished generation: want Unpublished, got {r:?}"));
    let r = store.apply_many(Generation(3), &[item("b", 3), item("b", 3)]).await;
    v.check(matches!(r, Err(StoreError::BadRequest(_))), || format!("a name twice: want BadRequest, got {r:?}"));
    v.check(store.active(&name("b")).await?.map(|a| a.generation) == Some(Generation(2)), || "a refused batch switched b".into());
    Ok(v)
}

/// A follower that merges `active_since` answers holds what `active_all` says.
pub async fn active_since_follows<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let labels = ["p", "q", "r", "s"];
    publish_range(&store, 1..=3, &labels).await?;
    publish_retiring(&store, 4, &labels[..3], &["s"]).await?;
    publish_range(&store, 5..=6, &labels[..3]).await?;
    let mut held = std::collections::BTreeMap::new();
    let mut seen = 0;
    let steps: [&[(&str, u64)]; 5] =
        [&[], &[("p", 1), ("q", 1)], &[("p", 2), ("r", 2)], &[("s", 3), ("q", 1)], &[("p", 6), ("q", 6), ("r", 6)]];
    for (step, applies) in steps.iter().enumerate() {
        for (label, g) in *applies {
            let _ = store.apply(&name(label), Generation(*g), &endpoint_for(Generation(*g))).await;
        }
        if step == 3 {
            store.retire(&name("s"), Generation(4)).await?;
        }
        let delta = store.active_since(seen).await?;
        if delta.full {
            held.clear();
        }
        held.extend(delta.endpoints);
        seen = delta.applied_changes;
        let truth = store.active_all().await?;
        v.check(seen == truth.applied_changes, || format!("step {step}: delta at {seen}, store at {}", truth.applied_changes));
        v.check(held == truth.endpoints, || format!("step {step}: follower holds {held:?}, store has {:?}", truth.endpoints));
    }
    Ok(v)
}

/// Every `plan_changes` answer that is not `None` names exactly the endpoints some plan in
/// between changed (a flap back, a retirement, a return, a left-out endpoint), with their
/// entries in the newer plan; a backwards range is refused and an unpublished plan is not
/// found.
pub async fn plan_changes_cover_every_plan_between<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    // Each step: served endpoints with the generation whose records they get, retired ones.
    type Step = (&'static [(&'static str, u64)], &'static [&'static str], Option<u64>);
    let steps: [Step; 6] = [
        (&[("a", 1), ("b", 1), ("c", 1), ("d", 1)], &[], None),
        (&[("a", 2), ("b", 2), ("c", 1), ("d", 1)], &[], None),
        (&[("a", 2), ("b", 1), ("d", 1)], &[], None),
        (&[("a", 2), ("b", 1), ("c", 1)], &["d"], None),
        (&[("a", 2), ("b", 1), ("d", 1)], &[], Some(3)),
        (&[("a", 6), ("b", 1), ("d", 1), ("e", 6)], &[], None),
    ];
    let mut plans = Vec::new();
    for (i, (served, retired, rollback_of)) in steps.iter().enumerate() {
        let g = i as u64 + 1;
        let author = if retired.is_empty() && rollback_of.is_none() { planner() } else { operator() };
        let mut p = plan(g, &[name("a")], author).into_plan();
        p.endpoints = served.iter().map(|(l, r)| (name(l), endpoint_for(Generation(*r)))).collect();
        p.retired = retired.iter().map(|l| name(l)).collect();
        p.rollback_of = rollback_of.map(Generation);
        let p = ValidatedPlan::new(p)?;
        store.publish(&p).await?;
        plans.push(p.into_plan());
    }
    let everyone: BTreeSet<DnsName> = plans.iter().flat_map(|p| p.endpoints.keys().chain(&p.retired).cloned()).collect();
    for from in 1..plans.len() {
        for to in from + 1..=plans.len() {
            let (f, t) = (Generation(from as u64), Generation(to as u64));
            let Some(got) = store.plan_changes(f, t).await? else { continue };
            let last = &plans[to - 1];
            let want: BTreeMap<DnsName, PlanEntry> = everyone
                .iter()
                .filter(|n| (from..to).any(|k| PlanEntry::of(&plans[k - 1], n) != PlanEntry::of(&plans[k], n)))
                .map(|n| (n.clone(), PlanEntry::of(last, n)))
                .collect();
            v.check(got.changes == want, || format!("changes {from}..{to}: got {:?}, want {want:?}", got.changes));
            v.check((got.from, got.to) == (f, t), || format!("changes {from}..{to} answered as {}..{}", got.from, got.to));
            v.check(got.rollback_of == last.rollback_of && got.endpoint_count == last.endpoints.len() as u64, || {
                format!(
                    "changes {from}..{to}: rollback_of {:?} and {} endpoints, plan {to} has {:?} and {}",
                    got.rollback_of,
                    got.endpoint_count,
                    last.rollback_of,
                    last.endpoints.len()
                )
            });
        }
    }
    let r = store.plan_changes(Generation(3), Generation(3)).await;
    v.check(matches!(r, Err(StoreError::BadRequest(_))), || format!("changes 3..3: want BadRequest, got {r:?}"));
    let r = store.plan_changes(Generation(5), Generation(7)).await;
    v.check(matches!(r, Err(StoreError::PlanNotFound(_))), || format!("changes to unpublished plan 7: want PlanNotFound, got {r:?}"));
    Ok(v)
}

/// Paging through `active_page` yields every active endpoint once, in name order, retired
/// ones included, and a page limit outside 1..=ACTIVE_PAGE_MAX is refused.
pub async fn active_page_walks_the_state<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let labels = ["e", "a", "d", "b", "c"];
    publish_range(&store, 1..=1, &labels).await?;
    publish_retiring(&store, 2, &["e", "a", "b", "c"], &["d"]).await?;
    for label in labels {
        store.apply(&name(label), Generation(1), &endpoint_for(Generation(1))).await?;
    }
    store.retire(&name("d"), Generation(2)).await?;
    let truth = store.active_all().await?;
    let mut walked = Vec::new();
    let mut after = None;
    for _ in 0..labels.len() + 1 {
        let page = store.active_page(after.take(), 2).await?;
        v.check(page.endpoints.len() <= 2, || format!("a page of limit 2 holds {}", page.endpoints.len()));
        v.check(page.applied_changes == truth.applied_changes, || {
            format!("page at {}, store at {}", page.applied_changes, truth.applied_changes)
        });
        after = page.endpoints.last().map(|(n, _)| n.clone());
        walked.extend(page.endpoints);
        if !page.more {
            break;
        }
    }
    let want: Vec<_> = truth.endpoints.into_iter().collect();
    v.check(walked == want, || format!("paging gave {walked:?}, the whole state is {want:?}"));
    let past = store.active_page(Some(name("z")), 2).await?;
    v.check(past.endpoints.is_empty() && !past.more, || format!("a page after the last name holds {past:?}"));
    for limit in [0, ACTIVE_PAGE_MAX + 1] {
        let refused = matches!(store.active_page(None, limit).await, Err(StoreError::BadRequest(_)));
        v.check(refused, || format!("a page limit of {limit} was not refused as a bad request"));
    }
    Ok(v)
}

/// Cleanup deletes only plans older than the oldest active one and the last `retain`.
pub async fn cleanup_is_guarded<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let x = name("x");
    publish_range(&store, 1..=20, &["x"]).await?;
    store.apply(&x, Generation(10), &endpoint_for(Generation(10))).await?;
    let preview = store.cleanup_preview(3).await?;
    let report = store.cleanup(3).await?;
    v.check(preview == report, || format!("preview {preview:?} differs from cleanup {report:?}"));
    v.check(report.deleted() == Some((Generation(1), Generation(9))), || format!("deleted {:?}, want 1..=9", report.deleted()));
    v.check(report.refused_active_or_newer == 8, || format!("refused {} plans, want 8 (10..=17)", report.refused_active_or_newer));
    for g in 1..=20 {
        let found = store.plan(Generation(g)).await.is_ok();
        v.check(found == (g >= 10), || format!("after cleanup(3) with 10 active, plan {g} found={found}"));
    }
    let r = store.apply(&name("late"), Generation(5), &endpoint_for(Generation(5))).await;
    v.check(r.is_err(), || format!("apply of cleaned-up plan 5 to a new endpoint was accepted: {r:?}"));
    let again = store.cleanup(3).await?;
    v.check(again.deleted_count() == 0, || "a second cleanup deleted more".into());
    v.check(store.active(&x).await?.map(|a| a.state) == Some(ActiveState::Serving(endpoint_for(Generation(10)))), || {
        "cleanup changed what x serves".into()
    });
    Ok(v)
}

/// An operator retirement stops an endpoint holding back cleanup; cleanup never changes
/// what the other endpoints serve.
pub async fn retire_releases_cleanup<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let (x, y) = (name("x"), name("y"));
    publish_range(&store, 1..=30, &["x", "y"]).await?;
    store.apply(&x, Generation(1), &endpoint_for(Generation(1))).await?;
    store.apply(&y, Generation(30), &endpoint_for(Generation(30))).await?;
    let report = store.cleanup(5).await?;
    v.check(report.deleted_count() == 0, || format!("cleanup deleted {:?} while x is active at plan 1", report.deleted()));
    v.check(store.plan(Generation(1)).await.is_ok(), || "plan 1 (active for x) was deleted".into());
    let mut retire = plan(31, std::slice::from_ref(&y), operator()).into_plan();
    retire.retired.insert(x.clone());
    store.publish(&ValidatedPlan::new(retire)?).await?;
    let r = store.retire(&x, Generation(31)).await;
    v.check(matches!(r, Ok(ApplyOutcome::Switched { previous: Generation(1) })), || format!("retire: {r:?}"));
    let before = store.active_all().await?;
    let report = store.cleanup(5).await?;
    v.check(report.deleted() == Some((Generation(1), Generation(26))), || {
        format!("after retiring x cleanup deleted {:?}, want 1..=26", report.deleted())
    });
    let after = store.active_all().await?;
    v.check(before == after, || "cleanup changed the active records".into());
    v.check(store.active(&x).await?.map(|a| a.state) == Some(ActiveState::Retired), || "x is not retired".into());
    Ok(v)
}

/// The October 2025 sequence, made deterministic: enactor A holds plan 1 and stalls; plans
/// 2..=11 are published; enactor B applies 11 everywhere and cleans up; A wakes and writes
/// plan 1 everywhere, including an endpoint B never touched.
pub async fn race_2025_sequence<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let labels = ["e0", "e1", "e2", "e3"];
    let names: Vec<_> = labels.iter().map(|l| name(l)).collect();
    let mut old = names.clone();
    old.push(name("legacy"));
    store.publish(&plan(1, &old, planner())).await?;
    let held_by_a = store.plan(Generation(1)).await?;
    publish_range(&store, 2..=11, &labels).await?;
    for n in &names {
        store.apply(n, Generation(11), &endpoint_for(Generation(11))).await?;
    }
    store.cleanup(3).await?;
    for (n, records) in &held_by_a.plan().endpoints {
        if let Ok(ApplyOutcome::Switched { previous }) = store.apply(n, Generation(1), records).await {
            v.push(format!("stale plan 1 switched {n} (previous {previous})"));
        }
    }
    for n in &old {
        match store.active(n).await? {
            Some(active) => {
                let ok = matches!(&active.state, ActiveState::Serving(e) if !e.targets.is_empty());
                v.check(ok, || format!("{n} is not serving"));
                v.check(store.plan(active.generation).await.is_ok(), || {
                    format!("{n} is active at plan {} which was deleted", active.generation)
                });
                v.check(*n == name("legacy") || active.generation == Generation(11), || format!("{n} went back to {}", active.generation));
            }
            None => v.check(*n == name("legacy"), || format!("{n} has no records")),
        }
    }
    Ok(v)
}

/// Rounds of the same race run concurrently: a stale apply and a fresh apply plus cleanup
/// start together at a barrier. Stops at the first violation.
pub async fn race_2025_concurrent<S: Store>(store: S) -> anyhow::Result<Violations> {
    const ROUNDS: u64 = 150;
    let mut v = Violations::default();
    for round in 0..ROUNDS {
        let endpoint = name(&format!("r{round}"));
        let old = Generation(2 * round + 1);
        let new = Generation(2 * round + 2);
        store.publish(&plan(old.0, std::slice::from_ref(&endpoint), planner())).await?;
        store.publish(&plan(new.0, std::slice::from_ref(&endpoint), planner())).await?;
        let barrier = Arc::new(Barrier::new(2));
        let stale = {
            let (store, endpoint, barrier) = (store.clone(), endpoint.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                store.apply(&endpoint, old, &endpoint_for(old)).await
            })
        };
        let fresh = {
            let (store, endpoint, barrier) = (store.clone(), endpoint.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let r = store.apply(&endpoint, new, &endpoint_for(new)).await;
                store.cleanup(1).await?;
                r
            })
        };
        let (_, fresh) = (stale.await?, fresh.await?);
        v.check(fresh.is_ok(), || format!("round {round}: the newest plan was refused: {fresh:?}"));
        let active = store.active(&endpoint).await?;
        v.check(active.as_ref().map(|a| a.generation) == Some(new), || {
            format!("round {round}: active is {:?}, want {new}", active.map(|a| a.generation))
        });
        if !v.is_empty() {
            break;
        }
    }
    Ok(v)
}

/// Many tasks apply random generations to a few endpoints while an observer watches: each
/// endpoint's observed generations never decrease and end at the maximum applied, and each
/// active record is exactly its plan's copy.
pub async fn racing_applies_are_monotonic<S: Store>(store: S) -> anyhow::Result<Violations> {
    const ROUNDS: usize = 12;
    const WRITERS: u64 = 6;
    const APPLIES_PER_WRITER: usize = 25;
    const PLANS: u64 = 40;
    let mut v = Violations::default();
    let labels = ["a", "b", "c"];
    let every: Vec<String> = (0..ROUNDS).flat_map(|round| labels.iter().map(move |l| format!("{l}{round}"))).collect();
    publish_range(&store, 1..=PLANS, &every.iter().map(String::as_str).collect::<Vec<_>>()).await?;
    for round in 0..ROUNDS {
        let names: Vec<_> = labels.iter().map(|l| name(&format!("{l}{round}"))).collect();
        let done = Arc::new(AtomicBool::new(false));
        let observer = {
            let (store, names, done) = (store.clone(), names.clone(), done.clone());
            tokio::spawn(async move {
                let mut seen: BTreeMap<_, Vec<Generation>> = BTreeMap::new();
                while !done.load(Ordering::Acquire) {
                    for n in &names {
                        if let Ok(Some(a)) = store.active(n).await {
                            seen.entry(n.clone()).or_default().push(a.generation);
                        }
                    }
                    tokio::task::yield_now().await;
                }
                seen
            })
        };
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (store, names) = (store.clone(), names.clone());
            writers.push(tokio::spawn(async move {
                let mut rng = rand::rngs::StdRng::seed_from_u64(round as u64 * 1_000 + w);
                let mut applied = Vec::new();
                for _ in 0..APPLIES_PER_WRITER {
                    let n = &names[rng.random_range(0..names.len())];
                    let g = Generation(rng.random_range(1..=PLANS));
                    let r = store.apply(n, g, &endpoint_for(g)).await;
                    applied.push((n.clone(), g, r));
                }
                applied
            }));
        }
        let mut max: BTreeMap<_, Generation> = BTreeMap::new();
        for w in writers {
            for (n, g, r) in w.await? {
                let e = max.entry(n.clone()).or_default();
                *e = (*e).max(g);
                match r {
                    Ok(ApplyOutcome::Switched { previous }) => {
                        v.check(previous < g, || format!("{n}: switched to {g} from newer {previous}"))
                    }
                    Ok(ApplyOutcome::Unchanged) | Err(StoreError::Stale { .. }) => {}
                    Err(e) => v.push(format!("{n}@{g}: unexpected error {e}")),
                }
            }
        }
        done.store(true, Ordering::Release);
        for (n, seq) in observer.await? {
            if let Some(w) = seq.windows(2).find(|w| w[1] < w[0]) {
                v.push(format!("round {round}: {n} went backwards from {} to {}", w[0], w[1]));
            }
        }
        for (n, want) in &max {
            let active = store.active(n).await?;
            let ok = active.as_ref().is_some_and(|a| a.generation == *want && a.state == ActiveState::Serving(endpoint_for(*want)));
            v.check(ok, || format!("round {round}: {n} ended at {:?}, want {want} with its records", active.map(|a| a.generation)));
        }
        if !v.is_empty() {
            break;
        }
    }
    Ok(v)
}

/// Many publishers race for the next generation: every generation is published exactly
/// once, with no gaps, and holds the plan of the publisher that was told it won.
pub async fn racing_publishes_have_no_gaps<S: Store>(store: S) -> anyhow::Result<Violations> {
    const ROUNDS: u64 = 10;
    const PUBLISHERS: usize = 6;
    const PLANS_PER_ROUND: u64 = 40;
    const ATTEMPTS_MAX: usize = 2_000;
    let mut v = Violations::default();
    let mut winners: BTreeMap<Generation, Vec<String>> = BTreeMap::new();
    for round in 1..=ROUNDS {
        let target = round * PLANS_PER_ROUND;
        let barrier = Arc::new(Barrier::new(PUBLISHERS));
        let mut tasks = Vec::new();
        for p in 0..PUBLISHERS {
            let (store, barrier) = (store.clone(), barrier.clone());
            tasks.push(tokio::spawn(async move {
                let x = [name("x")];
                let id = format!("p{p}");
                let mut won = Vec::new();
                barrier.wait().await;
                for _ in 0..ATTEMPTS_MAX {
                    let latest = store.latest().await?;
                    if latest.0 >= target {
                        break;
                    }
                    let attempt = plan(latest.0 + 1, &x, dnsplan_common::Author::Planner { id: id.clone() });
                    match store.publish(&attempt).await {
                        Ok(()) => won.push(attempt.generation()),
                        Err(StoreError::Conflict { .. }) => {}
                        Err(e) => return Err(anyhow::Error::from(e)),
                    }
                }
                Ok::<_, anyhow::Error>((id, won))
            }));
        }
        for t in tasks {
            let (id, won) = t.await??;
            for g in won {
                winners.entry(g).or_default().push(id.clone());
            }
        }
        for (g, ids) in &winners {
            v.check(ids.len() == 1, || format!("generation {g} was acknowledged to {ids:?}"));
            if let (Ok(stored), [id]) = (store.plan(*g).await, ids.as_slice()) {
                let author = stored.plan().author.to_string();
                v.check(author == format!("planner:{id}"), || format!("generation {g} acknowledged to {id} but holds {author}'s plan"));
            }
        }
        let latest = store.latest().await?;
        let gens: Vec<u64> = winners.keys().map(|g| g.0).collect();
        v.check(gens == (1..=latest.0).collect::<Vec<_>>(), || format!("acknowledged generations {gens:?} are not 1..={latest}"));
        if !v.is_empty() {
            break;
        }
    }
    Ok(v)
}

/// `active_all` agrees with `active` and counts every switch.
pub async fn snapshot_is_consistent<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    publish_range(&store, 1..=3, &["x", "y", "z"]).await?;
    let mut switches = 0;
    for (label, g) in [("x", 1), ("y", 2), ("x", 3), ("z", 3), ("x", 2), ("y", 2)] {
        if let Ok(ApplyOutcome::Switched { .. }) = store.apply(&name(label), Generation(g), &endpoint_for(Generation(g))).await {
            switches += 1;
        }
    }
    let snapshot = store.active_all().await?;
    v.check(snapshot.applied_changes == switches, || format!("applied_changes is {}, want {switches}", snapshot.applied_changes));
    for label in ["x", "y", "z"] {
        let n = name(label);
        let single = store.active(&n).await?;
        v.check(snapshot.endpoints.get(&n) == single.as_ref(), || format!("snapshot and active() disagree on {n}"));
    }
    v.check(snapshot.endpoints.len() == 3, || format!("snapshot has {} endpoints", snapshot.endpoints.len()));
    Ok(v)
}

/// A waiter wakes on publish, apply and pause, and returns at its timeout otherwise.
pub async fn wait_for_change_wakes<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let x = name("x");
    let seen = store.version().await?;
    let quiet = store.wait_for_change(seen, Duration::from_millis(50)).await?;
    v.check(quiet == seen, || "wait_for_change returned a change when nothing changed".into());
    for what in ["publish", "apply", "pause"] {
        let seen = store.version().await?;
        let waiter = {
            let store = store.clone();
            tokio::spawn(async move { store.wait_for_change(seen, Duration::from_secs(30)).await })
        };
        match what {
            "publish" => store.publish(&plan(1, std::slice::from_ref(&x), planner())).await?,
            "apply" => drop(store.apply(&x, Generation(1), &endpoint_for(Generation(1))).await?),
            _ => store.pause(PauseState::by_operator("r", "b", 0)).await?,
        }
        match tokio::time::timeout(Duration::from_secs(30), waiter).await {
            Ok(Ok(Ok(now))) => v.check(now != seen, || format!("waiter woke on {what} without a change")),
            other => v.push(format!("waiter did not wake on {what}: {other:?}")),
        }
    }
    Ok(v)
}

/// Heartbeats are stored per enactor id and updated in place.
pub async fn heartbeats_round_trip<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    for (id, zone, g) in [("en-a", "a", 1), ("en-b", "b", 2), ("en-c", "c", 3), ("en-a", "a", 4)] {
        store
            .heartbeat(Heartbeat {
                enactor_id: id.into(),
                zone: ZoneId::parse(zone)?,
                last_applied: Generation(g),
                latest_seen: Generation(g + 1),
                at_unix_ms: g,
                state: "idle".into(),
            })
            .await?;
    }
    let beats = store.heartbeats().await?;
    let got: HashSet<(String, u64)> = beats.iter().map(|b| (b.enactor_id.clone(), b.last_applied.0)).collect();
    let want: HashSet<(String, u64)> = [("en-a".to_string(), 4), ("en-b".into(), 2), ("en-c".into(), 3)].into();
    v.check(got == want, || format!("heartbeats {got:?}, want {want:?}"));
    let too_long = Heartbeat {
        enactor_id: "x".repeat(1_000),
        zone: ZoneId::parse("a")?,
        last_applied: Generation(1),
        latest_seen: Generation(1),
        at_unix_ms: 0,
        state: "idle".into(),
    };
    v.check(store.heartbeat(too_long).await.is_err(), || "a 1000-byte enactor id was accepted".into());
    Ok(v)
}

fn planner_as(id: &str) -> dnsplan_common::Author {
    dnsplan_common::Author::Planner { id: id.into() }
}

const LEASE_TTL: Duration = Duration::from_secs(30);

/// One live lease at a time; renewals keep the epoch; a new holder gets a higher one; publish
/// checks the lease as a fencing token, and automation cannot bypass it.
pub async fn lease_is_exclusive_and_fences_publish<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let e = [name("e0")];
    let a = store.acquire_lease("planner-a", LEASE_TTL).await?;
    let b_refused = store.acquire_lease("planner-b", LEASE_TTL).await;
    v.check(matches!(&b_refused, Err(StoreError::LeaseHeld { holder, .. }) if holder == "planner-a"), || {
        format!("a second holder got a live lease: {b_refused:?}")
    });
    let renewed = store.acquire_lease("planner-a", LEASE_TTL).await?;
    v.check(renewed.epoch == a.epoch, || format!("renewal changed the epoch {} -> {}", a.epoch, renewed.epoch));
    let unleased = store.publish(&plan(1, &e, planner_as("planner-b"))).await;
    v.check(matches!(unleased, Err(StoreError::NotLeaseHolder { .. })), || format!("automation published around the lease: {unleased:?}"));
    store.publish_leased(&plan(1, &e, planner_as("planner-a")), &a).await?;
    store.publish(&plan(2, &e, operator())).await?; // operators are not bound by the lease
    store.release_lease(&a).await?;
    let b = store.acquire_lease("planner-b", LEASE_TTL).await?;
    v.check(b.epoch > a.epoch, || format!("takeover did not raise the epoch ({} -> {})", a.epoch, b.epoch));
    let fenced = store.publish_leased(&plan(3, &e, planner_as("planner-a")), &a).await;
    v.check(matches!(fenced, Err(StoreError::NotLeaseHolder { .. })), || format!("a lost lease still published: {fenced:?}"));
    store.publish_leased(&plan(3, &e, planner_as("planner-b")), &b).await?;
    let current = store.lease().await?;
    v.check(current.as_ref().map(|l| (l.holder.as_str(), l.epoch)) == Some(("planner-b", b.epoch)), || {
        format!("lease() reports {current:?}")
    });
    Ok(v)
}

/// An expired lease can be taken over, under a new epoch.
pub async fn lease_expires<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let ttl = dnsplan_common::store::lease::LEASE_TTL_MIN;
    let a = store.acquire_lease("planner-a", ttl).await?;
    // Waiting on the lease's own clock is the point here: retry until it has run out.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let b = loop {
        match store.acquire_lease("planner-b", LEASE_TTL).await {
            Ok(b) => break Some(b),
            Err(StoreError::LeaseHeld { expires_in_ms, .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(expires_in_ms.max(1))).await;
            }
            Err(_) => break None,
        }
    };
    match b {
        Some(b) => v.check(b.epoch > a.epoch, || format!("takeover after expiry kept epoch {}", b.epoch)),
        None => v.push(format!("a lease of {ttl:?} was still held after 5 s")),
    }
    Ok(v)
}

/// Many would-be planners race for a free lease: exactly one wins.
pub async fn racing_lease_acquires<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let contenders = 8;
    let barrier = Arc::new(Barrier::new(contenders));
    let mut tasks = Vec::new();
    for i in 0..contenders {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            store.acquire_lease(&format!("planner-{i}"), LEASE_TTL).await.is_ok()
        }));
    }
    let mut winners = 0;
    for t in tasks {
        winners += usize::from(t.await?);
    }
    v.check(winners == 1, || format!("{winners} planners hold the lease at once"));
    Ok(v)
}

/// A planner keeps publishing under its lease while another takes the lease over: no plan of
/// the old holder may be published after the takeover returned.
pub async fn leased_publish_is_fenced<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let e = [name("e0")];
    for round in 0..40u64 {
        let a = store.acquire_lease("planner-a", LEASE_TTL).await?;
        let start = store.latest().await?;
        let publisher = {
            let (store, a, e) = (store.clone(), a.clone(), e.clone());
            tokio::spawn(async move {
                for _ in 0..30 {
                    let latest = store.latest().await?;
                    match store.publish_leased(&plan(latest.0 + 1, &e, planner_as("planner-a")), &a).await {
                        Ok(()) | Err(StoreError::Conflict { .. }) => {}
                        Err(StoreError::NotLeaseHolder { .. }) => break,
                        Err(err) => return Err(anyhow::Error::from(err)),
                    }
                }
                anyhow::Ok(())
            })
        };
        for _ in 0..(round % 8) * 2 {
            tokio::task::yield_now().await;
        }
        // Planner A is presumed dead: its lease is released and B takes over.
        store.release_lease(&a).await?;
        let b = store.acquire_lease("planner-b", LEASE_TTL).await?;
        let at_takeover = store.latest().await?;
        publisher.await??;
        for summary in store.list(Generation(start.0 + 1), 1_000).await? {
            if summary.generation > at_takeover && summary.author == planner_as("planner-a") {
                v.push(format!("round {round}: plan {} by planner-a was published after planner-b took the lease", summary.generation));
            }
        }
        store.release_lease(&b).await?;
        if !v.is_empty() {
            break;
        }
    }
    Ok(v)
}

/// A plan published as its changes (`publish_changes`) is the plan: it reads back whole, its
/// recorded changes are its changes, and applies are checked against its content, whether
/// plans around it were published whole or as changes, and across cleanup.
pub async fn publish_changes_is_publish<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(2017);
    let labels: Vec<String> = (0..12).map(|i| format!("n{i}")).collect();
    let mut previous: Option<Plan> = None;
    let mut published = Vec::new();
    for g in 1..=40u64 {
        // Each name, per plan: left out, retired (operator plans only) or served with the
        // records of one of three generations.
        let operator_plan = g % 7 == 0;
        let mut p = plan(g, &[name("always")], if operator_plan { operator() } else { planner() }).into_plan();
        for label in &labels {
            match rng.random_range(0..6u64) {
                0 => {}
                1 if operator_plan => {
                    p.retired.insert(name(label));
                }
                k => {
                    p.endpoints.insert(name(label), endpoint_for(Generation(k + g % 3)));
                }
            }
        }
        if operator_plan && g > 2 {
            p.rollback_of = Some(Generation(g - 2));
        }
        let p = ValidatedPlan::new(p)?;
        let as_changes = previous.as_ref().filter(|_| g % 4 != 1).and_then(|prev| PlanDelta::between(prev, &p));
        match &as_changes {
            Some(delta) => store.publish_changes(delta, None).await?,
            None => store.publish(&p).await?,
        }
        let read = store.plan(Generation(g)).await?;
        v.check(read == p, || {
            format!("plan {g} (published {}) reads back different", if as_changes.is_some() { "as changes" } else { "whole" })
        });
        if let Some(prev) = &previous
            && let Some(recorded) = store.plan_changes(prev.generation, Generation(g)).await?
        {
            let want = PlanChanges::between(prev, p.plan()).map(|c| c.changes);
            v.check(Some(&recorded.changes) == want.as_ref(), || format!("plan {g}'s recorded changes are not its changes"));
            v.check(recorded.endpoint_count == p.plan().endpoints.len() as u64, || format!("plan {g}'s changes count the endpoints wrong"));
        }
        let summary = store.list(Generation(g), 1).await?;
        v.check(summary.first() == Some(&p.summary()), || format!("plan {g}'s summary: {summary:?}"));
        // Each endpoint the plan serves takes exactly its records at this generation.
        for (n, records) in p.plan().endpoints.iter().take(3) {
            let r = store.apply(n, Generation(g), records).await;
            v.check(r.is_ok(), || format!("plan {g}'s own records for {n}: {r:?}"));
            let other = endpoint_for(Generation(1_000 + g));
            let r = store.apply(n, Generation(g), &other).await;
            v.check(matches!(r, Err(StoreError::ContentMismatch { .. })), || format!("other records for {n} under plan {g}: {r:?}"));
        }
        published.push(p.clone());
        previous = Some(p.into_plan());
    }
    // The whole sequence reads back, and keeps reading back after cleanup.
    for p in &published {
        let read = store.plan(p.generation()).await?;
        v.check(&read == p, || format!("plan {} reads back different after later plans", p.generation()));
    }
    let report = store.cleanup(5).await?;
    let horizon = report.horizon_after;
    for p in &published {
        let read = store.plan(p.generation()).await;
        match read {
            Ok(read) => {
                v.check(p.generation() >= horizon && &read == p, || format!("after cleanup plan {} reads {read:?}", p.generation()))
            }
            Err(StoreError::PlanNotFound(_)) => {
                v.check(p.generation() < horizon, || format!("plan {} went with a cleanup to {horizon}", p.generation()))
            }
            Err(err) => v.push(format!("after cleanup, plan {}: {err}", p.generation())),
        }
    }
    // A plan published as changes after the cleanup reads back too.
    let last = published.last().map(|p| p.plan().clone()).ok_or_else(|| anyhow::anyhow!("no plan published"))?;
    let mut next = last.clone();
    next.generation = Generation(41);
    next.parent_generation = Generation(40);
    next.author = planner();
    next.retired.clear();
    next.rollback_of = None;
    next.endpoints.insert(name("late"), endpoint_for(Generation(41)));
    let next = ValidatedPlan::new(next)?;
    let delta = PlanDelta::between(&last, &next).ok_or_else(|| anyhow::anyhow!("plan 41 is no small change"))?;
    store.publish_changes(&delta, None).await?;
    v.check(store.plan(Generation(41)).await? == next, || "plan 41, published as changes after cleanup, reads back different".into());
    Ok(v)
}

/// `publish_changes` keeps every rule of `publish`: the CAS, the pause, the lease, the DNS
/// zone, and the whole plan's validation, checked against the parent the store holds.
pub async fn publish_changes_keeps_the_rules<S: Store>(store: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let (a, b, r) = (name("a"), name("b"), name("r"));
    let one = plan(1, &[a.clone(), b.clone()], planner());
    store.publish(&one).await?;
    let two = plan(2, &[a.clone(), b.clone()], planner());
    let delta = PlanDelta::between(one.plan(), &two).ok_or_else(|| anyhow::anyhow!("no delta"))?;
    // The CAS: a parent that is not the latest, a generation that does not follow it.
    let mut stale = delta.clone();
    stale.head.generation = Generation(3);
    stale.head.parent_generation = Generation(2);
    let got = store.publish_changes(&stale, None).await;
    v.check(matches!(got, Err(StoreError::Conflict { latest: Generation(1), .. })), || format!("changes of 3 over 2, latest 1: {got:?}"));
    let mut skip = delta.clone();
    skip.head.generation = Generation(3);
    let got = store.publish_changes(&skip, None).await;
    v.check(matches!(got, Err(StoreError::Conflict { .. })), || format!("changes of 3 over 1: {got:?}"));
    // The pause refuses automation.
    store.pause(PauseState::by_operator("test", "alice", 0)).await?;
    let got = store.publish_changes(&delta, None).await;
    v.check(matches!(got, Err(StoreError::Paused { .. })), || format!("automation changes while paused: {got:?}"));
    store.resume().await?;
    // The lease: a live lease refuses an unleased planner, a stale epoch, and takes its own.
    let lease = store.acquire_lease("planner-test", LEASE_TTL).await?;
    let got = store.publish_changes(&delta, None).await;
    v.check(matches!(got, Err(StoreError::NotLeaseHolder { .. })), || format!("unleased changes under a live lease: {got:?}"));
    let mut old = lease.clone();
    old.epoch = lease.epoch.saturating_sub(1);
    let got = store.publish_changes(&delta, Some(&old)).await;
    v.check(matches!(got, Err(StoreError::NotLeaseHolder { .. })), || format!("changes under a stale epoch: {got:?}"));
    v.check(store.latest().await? == Generation(1), || "a refused publish of changes moved the latest plan".into());
    store.publish_changes(&delta, Some(&lease)).await?;
    store.release_lease(&lease).await?;
    v.check(store.plan(Generation(2)).await? == two, || "leased changes read back different".into());
    // Another DNS zone.
    let mut zone = delta.clone();
    zone.head.generation = Generation(3);
    zone.head.parent_generation = Generation(2);
    zone.head.dns_zone = DnsName::parse("other.test")?;
    zone.changes = [(DnsName::parse("x.other.test")?, PlanEntry::Serve(endpoint_for(Generation(3))))].into();
    let got = store.publish_changes(&zone, None).await;
    v.check(matches!(got, Err(StoreError::DnsZoneMismatch { .. })), || format!("changes for another DNS zone: {got:?}"));
    // The whole plan's validation: nothing left to serve; an empty endpoint.
    let mut nothing = delta.clone();
    nothing.head.generation = Generation(3);
    nothing.head.parent_generation = Generation(2);
    nothing.changes = [(a.clone(), PlanEntry::Absent), (b.clone(), PlanEntry::Absent)].into();
    let got = store.publish_changes(&nothing, None).await;
    v.check(matches!(got, Err(StoreError::Invalid(ValidationError::NoEndpoints))), || format!("changes leaving nothing: {got:?}"));
    let mut empty = nothing.clone();
    empty.changes = [(a.clone(), PlanEntry::Serve(dnsplan_common::Endpoint { ttl_secs: 30, targets: vec![] }))].into();
    let got = store.publish_changes(&empty, None).await;
    v.check(matches!(got, Err(StoreError::Invalid(ValidationError::EmptyEndpoint { .. }))), || format!("an empty endpoint: {got:?}"));
    // An operator retires r; automation must then clear the retirement, naming it if not.
    let mut retire = nothing.clone();
    retire.head.author = operator();
    retire.changes = [(r.clone(), PlanEntry::Retire)].into();
    store.publish_changes(&retire, None).await?;
    let mut keeps = retire.clone();
    keeps.head.generation = Generation(4);
    keeps.head.parent_generation = Generation(3);
    keeps.head.author = planner();
    keeps.changes = [(a.clone(), PlanEntry::Serve(endpoint_for(Generation(4))))].into();
    let got = store.publish_changes(&keeps, None).await;
    v.check(matches!(&got, Err(StoreError::Invalid(ValidationError::RetireByAutomation { endpoint, .. })) if endpoint == &r), || {
        format!("automation changes keeping the operator's retirement of r: {got:?}")
    });
    keeps.changes.insert(r.clone(), PlanEntry::Absent);
    store.publish_changes(&keeps, None).await?;
    let four = store.plan(Generation(4)).await?;
    v.check(four.plan().retired.is_empty() && four.plan().endpoints.len() == 2, || format!("plan 4 reads {four:?}"));
    v.check(store.latest().await? == Generation(4), || "refused changes moved the latest plan".into());
    Ok(v)
}

/// The shared DNSSEC keys record is a compare-and-swap on its version: none at first; a write
/// expecting none lands once; a write expecting a version another write moved on is refused
/// and changes nothing; of writers racing from one version exactly one lands; a record at
/// the size limit goes through whole, one above it is refused.
pub async fn dnssec_keys_are_cas<S: Store>(store: S) -> anyhow::Result<Violations> {
    use dnsplan_common::store::{DNSSEC_KEYS_BYTES_MAX, KeysPut};
    let mut v = Violations::default();
    v.check(store.dnssec_keys().await?.is_none(), || "a new store holds DNSSEC keys".into());
    let first = match store.put_dnssec_keys(None, b"first".to_vec()).await? {
        KeysPut::Written { version } => version,
        other => {
            v.push(format!("the first write expecting none: {other:?}"));
            return Ok(v);
        }
    };
    let again = store.put_dnssec_keys(None, b"again".to_vec()).await?;
    v.check(again == KeysPut::Moved { current: Some(first) }, || format!("a second write expecting none: {again:?}"));
    let second = match store.put_dnssec_keys(Some(first), b"second".to_vec()).await? {
        KeysPut::Written { version } => version,
        other => {
            v.push(format!("a write expecting the current version: {other:?}"));
            return Ok(v);
        }
    };
    v.check(second != first, || format!("a write kept the version {first}"));
    let stale = store.put_dnssec_keys(Some(first), b"stale".to_vec()).await?;
    v.check(stale == KeysPut::Moved { current: Some(second) }, || format!("a write expecting an old version: {stale:?}"));
    let read = store.dnssec_keys().await?;
    v.check(read.as_ref().is_some_and(|r| r.version == second && r.bytes == b"second"), || format!("read back {read:?}"));
    // Writers racing from one version: one lands.
    let barrier = Arc::new(Barrier::new(8));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u8 {
        let (store, barrier) = (store.clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            store.put_dnssec_keys(Some(second), vec![b'r', i]).await
        });
    }
    let mut landed = 0;
    while let Some(put) = tasks.join_next().await {
        if matches!(put??, KeysPut::Written { .. }) {
            landed += 1;
        }
    }
    v.check(landed == 1, || format!("{landed} of 8 writers racing from version {second} landed"));
    let now = store.dnssec_keys().await?.map(|r| r.bytes).unwrap_or_default();
    v.check(now.len() == 2 && now[0] == b'r', || format!("after the race the record is {now:?}"));
    let current = store.dnssec_keys().await?.map(|r| r.version);
    let big: Vec<u8> = (0..DNSSEC_KEYS_BYTES_MAX).map(|i| b'a' + (i % 26) as u8).collect();
    match store.put_dnssec_keys(current, big.clone()).await? {
        KeysPut::Written { .. } => {
            let read = store.dnssec_keys().await?.map(|r| r.bytes);
            v.check(read.as_ref() == Some(&big), || "a record at the size limit read back otherwise".into());
        }
        other => v.push(format!("a record at the size limit: {other:?}")),
    }
    let current = store.dnssec_keys().await?.map(|r| r.version);
    let over = store.put_dnssec_keys(current, vec![b'x'; DNSSEC_KEYS_BYTES_MAX + 1]).await;
    v.check(matches!(over, Err(StoreError::TooLong { .. })), || format!("a record above the size limit: {over:?}"));
    Ok(v)
}
