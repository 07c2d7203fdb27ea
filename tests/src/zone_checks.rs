//! Checks of a store's zones (`ManagedZones`), for every store that has them: each zone's
//! plans, fences, pause, lease and cleanup are its own, and a removed zone's late writes are
//! refused. Each check returns its violations, as the conformance suite does.

use crate::conformance::Violations;
use crate::fixtures::{endpoint_for, name_in, operator, plan_in, planner};
use dnsplan_common::store::ApplyItem;
use dnsplan_common::store::zones::{ManagedZones, ZoneState};
use dnsplan_common::{DnsName, Generation, PauseState, Store, StoreError, ValidatedPlan};
use std::time::Duration;

pub fn zone(origin: &str) -> DnsName {
    DnsName::parse(origin).expect("fixture zones are valid")
}

/// A master file for added zone `origin`: its SOA and apex NS.
pub fn master(origin: &DnsName) -> String {
    format!("$ORIGIN {origin}\n@ 3600 IN SOA ns1 hostmaster 1 3600 600 86400 60\n@ 3600 IN NS ns1\nns1 3600 IN A 192.0.2.53\n")
}

/// Publishes plan `g` of `zone` serving `labels`, its parent the store's latest (none before the
/// first plan, whatever `g`), and applies it to each.
pub async fn publish_and_apply<S: Store>(store: &S, zone: &DnsName, g: u64, labels: &[&str]) -> anyhow::Result<()> {
    let names: Vec<_> = labels.iter().map(|l| name_in(zone, l)).collect();
    let mut plan = plan_in(zone, g, &names, planner()).into_plan();
    plan.parent_generation = store.latest().await?;
    store.publish(&ValidatedPlan::new(plan)?).await?;
    let items: Vec<ApplyItem> = names.iter().map(|n| ApplyItem { endpoint: n.clone(), records: endpoint_for(Generation(g)) }).collect();
    for result in store.apply_many(Generation(g), &items).await? {
        result?;
    }
    Ok(())
}

/// Makes `store` busy: a plan of `zone` applied, automation paused and the planner lease held,
/// what would fail the conformance suite on another zone if pause or lease were shared.
pub async fn make_busy<S: Store>(store: &S, zone: &DnsName) -> anyhow::Result<()> {
    publish_and_apply(store, zone, 1, &["www"]).await?;
    store.pause(PauseState::by_operator("busy elsewhere", "alice", 1)).await?;
    store.acquire_lease("planner-busy", Duration::from_secs(300)).await?;
    Ok(())
}

/// The handle of zone `example.test.` (the fixtures' zone) added to `root`, whose first zone
/// (`busy.test.`) is made busy first: what the conformance suite gets for an added zone.
pub async fn added_beside_a_busy_zone<S: ManagedZones>(root: S) -> anyhow::Result<S> {
    make_busy(&root, &zone("busy.test.")).await?;
    let origin = crate::fixtures::dns_zone();
    root.add_zone(&origin, &master(&origin)).await?;
    Ok(root.zone(&origin).await?)
}

/// Two added zones beside the first: what one does (publish, apply, pause, lease, cleanup)
/// changes nothing in the others. `root` is a fresh store whose first zone is `first`.
pub async fn zones_are_isolated<S: ManagedZones>(root: S, first: &DnsName) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let (a_zone, b_zone) = (zone("a.zones.test."), zone("b.zones.test."));
    v.check(root.add_zone(&a_zone, &master(&a_zone)).await?, || "adding zone a said it was there already".into());
    v.check(!root.add_zone(&a_zone, &master(&a_zone)).await?, || "adding zone a twice said it added it again".into());
    v.check(root.add_zone(&b_zone, &master(&b_zone)).await?, || "adding zone b said it was there already".into());
    let (a, b) = (root.zone(&a_zone).await?, root.zone(&b_zone).await?);
    let kept = root.zone_master(&a_zone).await?;
    v.check(kept == master(&a_zone), || format!("zone a's master file reads back as {kept:?}"));

    // Each zone's plans start at 1 and are its own.
    publish_and_apply(&root, first, 1, &["www"]).await?;
    publish_and_apply(&a, &a_zone, 1, &["www", "api"]).await?;
    publish_and_apply(&b, &b_zone, 1, &["db"]).await?;
    for (who, store, want) in [("first", &root, first), ("a", &a, &a_zone), ("b", &b, &b_zone)] {
        let latest = store.latest().await?;
        v.check(latest == Generation(1), || format!("zone {who}'s latest plan is {latest}, not 1"));
        let stored = store.dns_zone().await?;
        v.check(stored.as_ref() == Some(want), || format!("zone {who}'s store says it serves {stored:?}, not {want}"));
        let active = store.active_all().await?;
        let foreign: Vec<_> = active.endpoints.keys().filter(|n| !n.is_in(want)).collect();
        v.check(foreign.is_empty(), || format!("zone {who} holds endpoints of another zone: {foreign:?}"));
    }
    // A plan of another zone is refused.
    let wrong = plan_in(&b_zone, 2, &[name_in(&b_zone, "db")], planner());
    match a.publish(&wrong).await {
        Err(StoreError::DnsZoneMismatch { .. }) => {}
        other => v.push(format!("zone a took a plan of zone b: {other:?}")),
    }

    // A pause of zone a stops a's automation only.
    a.pause(PauseState::by_operator("maintenance of a", "alice", 1)).await?;
    match a.publish(&plan_in(&a_zone, 2, &[name_in(&a_zone, "www")], planner())).await {
        Err(StoreError::Paused { .. }) => {}
        other => v.push(format!("a paused zone took automation's plan: {other:?}")),
    }
    if let Err(err) = b.publish(&plan_in(&b_zone, 2, &[name_in(&b_zone, "db")], planner())).await {
        v.push(format!("a pause of zone a refused zone b's plan: {err}"));
    }
    if let Err(err) = root.publish(&plan_in(first, 2, &[name_in(first, "www")], planner())).await {
        v.push(format!("a pause of zone a refused the first zone's plan: {err}"));
    }
    v.check(b.paused().await?.is_none(), || "zone b reads as paused".into());
    a.resume().await?;

    // The planner lease of zone a does not hold zone b's.
    let held = a.acquire_lease("planner-a", Duration::from_secs(30)).await?;
    match b.acquire_lease("planner-b", Duration::from_secs(30)).await {
        Ok(lease) => b.release_lease(&lease).await?,
        Err(err) => v.push(format!("zone a's lease kept zone b's planner out: {err}")),
    }
    a.release_lease(&held).await?;

    // Cleanup of zone b deletes b's old plans only.
    publish_and_apply(&b, &b_zone, 3, &["db"]).await?;
    let report = b.cleanup(1).await?;
    v.check(report.deleted_count() > 0, || format!("cleanup of zone b deleted nothing: {report:?}"));
    for (who, store) in [("first", &root), ("a", &a)] {
        if let Err(err) = store.plan(Generation(1)).await {
            v.push(format!("cleanup of zone b took zone {who}'s plan 1: {err}"));
        }
    }
    // Zone a's changes do not wake zone b's waiters.
    let seen = b.version().await?;
    publish_and_apply(&a, &a_zone, 2, &["www"]).await?;
    let after = b.wait_for_change(seen, Duration::from_millis(300)).await?;
    v.check(after == seen, || format!("zone b's version moved from {seen:?} to {after:?} on a change of zone a"));
    let listed: Vec<_> = root.zones().await?.into_iter().filter(|z| z.is_live()).map(|z| z.origin).collect();
    v.check(listed == vec![a_zone.clone(), b_zone.clone()], || format!("the live zones listed are {listed:?}"));
    Ok(v)
}

/// A removed zone refuses every write of a handle still held (a late enactor or planner),
/// `zone` refuses it, and a zone added again under its name starts past the removed one's
/// counts and past its latest generation (plan 1 is refused, the first plan is 3), with no
/// write of the old handle in it.
pub async fn removal_fences_late_writes<S: ManagedZones>(root: S) -> anyhow::Result<Violations> {
    let mut v = Violations::default();
    let origin = zone("gone.zones.test.");
    let version = root.registry_version().await?;
    root.add_zone(&origin, &master(&origin)).await?;
    let added = root.registry_version().await?;
    v.check(added != version, || format!("the registry version stayed {version} when a zone was added"));
    let late = root.zone(&origin).await?;
    publish_and_apply(&late, &origin, 1, &["www"]).await?;
    publish_and_apply(&late, &origin, 2, &["www", "api"]).await?;
    let before = late.active_all().await?;
    let quiet = root.registry_version().await?;
    v.check(quiet == added, || format!("the registry version moved from {added} to {quiet} with no zone added or removed"));
    v.check(root.remove_zone(&origin).await?, || "remove_zone said the zone was not live".into());
    let removed_at = root.registry_version().await?;
    v.check(removed_at != quiet, || format!("the registry version stayed {quiet} when a zone was removed"));
    v.check(!root.remove_zone(&origin).await?, || "a second remove_zone said it removed the zone again".into());

    let refused = |what: &str, result: Result<(), StoreError>, v: &mut Violations| match result {
        Err(StoreError::ZoneGone { zone }) if zone == origin => {}
        other => v.push(format!("{what} on the removed zone: {other:?}, not ZoneGone")),
    };
    let www = name_in(&origin, "www");
    refused("apply", late.apply(&www, Generation(2), &endpoint_for(Generation(2))).await.map(|_| ()), &mut v);
    refused("publish", late.publish(&plan_in(&origin, 3, std::slice::from_ref(&www), operator())).await, &mut v);
    refused("pause", late.pause(PauseState::by_operator("late", "alice", 1)).await, &mut v);
    refused("cleanup", late.cleanup(1).await.map(|_| ()), &mut v);
    refused("a read of the version", late.version().await.map(|_| ()), &mut v);
    refused("zone()", root.zone(&origin).await.map(|_| ()), &mut v);

    let removed = root.zones().await?.into_iter().find(|z| z.origin == origin);
    let Some(ZoneState::Removed { content_changes, latest_generation, .. }) = removed.map(|z| z.state) else {
        v.push("the registry has no tombstone for the removed zone".into());
        return Ok(v);
    };
    v.check(latest_generation == 2, || format!("the tombstone keeps latest generation {latest_generation}, the zone had reached 2"));
    v.check(content_changes == before.content_changes, || {
        format!("the tombstone keeps content count {content_changes}, the zone had reached {}", before.content_changes)
    });

    // Added again: a new plan sequence, counts past the old ones, and still no way in for the
    // old handle.
    v.check(root.add_zone(&origin, &master(&origin)).await?, || "adding the removed zone again said it was live".into());
    let again = root.zone(&origin).await?;
    let fresh = again.active_all().await?;
    v.check(fresh.endpoints.is_empty(), || format!("the zone added again holds the old zone's endpoints: {:?}", fresh.endpoints.keys()));
    v.check(fresh.content_changes > before.content_changes, || {
        format!("the zone added again counts {} content changes, not past the old {}", fresh.content_changes, before.content_changes)
    });
    v.check(again.latest().await? == Generation::NONE, || "the zone added again has plans".into());
    let base = again.generation_base().await?;
    v.check(base == Generation(2), || format!("the zone added again starts its plans after generation {base}, not after 2"));
    match again.publish(&plan_in(&origin, 1, std::slice::from_ref(&www), planner())).await {
        Err(StoreError::Conflict { attempted: Generation(1), .. }) => {}
        other => v.push(format!("plan 1 of the zone added again, behind the removed zone's plan 2: {other:?}, not Conflict")),
    }
    publish_and_apply(&again, &origin, 3, &["www"]).await?;
    refused(
        "apply of the old handle after the zone was added again",
        late.apply(&www, Generation(3), &endpoint_for(Generation(3))).await.map(|_| ()),
        &mut v,
    );
    publish_and_apply(&again, &origin, 4, &["www", "api"]).await?;
    let report = again.cleanup(1).await?;
    v.check(again.list(Generation::NONE, 10).await?.iter().map(|p| p.generation).eq([Generation(4)]), || {
        format!("after a cleanup keeping 1 plan the zone added again lists other plans ({report:?})")
    });
    // Removed and added once more: past its own plans, not only the first removal's base.
    root.remove_zone(&origin).await?;
    root.add_zone(&origin, &master(&origin)).await?;
    let third = root.zone(&origin).await?.generation_base().await?;
    v.check(third == Generation(4), || format!("added a third time, the zone starts after generation {third}, not after 4"));
    Ok(v)
}
