//! The embedded store's own tests: its layout on disk, which the conformance suite cannot see.

use super::open::*;
use super::*;
use crate::names::ZoneId;
use crate::plan::{Author, Plan, Target};
use std::collections::{BTreeMap, BTreeSet};

fn endpoint(last: u8) -> Endpoint {
    let zone = ZoneId::parse("a").expect("zone");
    Endpoint { ttl_secs: 30, targets: vec![Target { address: [192, 0, 2, last].into(), zone, weight: 1 }] }
}

fn items(labels: &[&str], last: u8) -> Vec<ApplyItem> {
    labels
        .iter()
        .map(|l| ApplyItem { endpoint: DnsName::parse(&format!("{l}.example.test.")).expect("name"), records: endpoint(last) })
        .collect()
}

async fn store_with_plans(dir: &Path, plans: u64) -> SledStore {
    let store = SledStore::open(dir).expect("open");
    for g in 1..=plans {
        let plan = Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "test".into() },
            reason: "test".into(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints: items(&["a"], 1).into_iter().map(|i| (i.endpoint, i.records)).collect(),
            retired: BTreeSet::new(),
            rollback_of: None,
            provenance: Vec::new(),
        };
        store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish");
    }
    store
}

/// Plan `g` (parent `g - 1`) serving `count` endpoints `e0..`, each with records `last`.
fn uniform_plan(g: u64, count: usize, last: u8) -> ValidatedPlan {
    let labels: Vec<String> = (0..count).map(|i| format!("e{i}")).collect();
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    let origin = DnsName::parse("example.test.").expect("zone");
    zone_plan(&origin, g, items(&labels, last).into_iter().map(|i| (i.endpoint, i.records)).collect())
}

/// The names plan `generation`'s own content entries and chunks hold.
fn contents_of(store: &SledStore, generation: Generation) -> usize {
    let entries = store
        .inner()
        .contents
        .iter()
        .keys()
        .filter(|k| content_generation(k.as_ref().expect("key")).expect("generation") == generation)
        .count();
    let chunked: usize = store
        .inner()
        .contents_chunks
        .scan_prefix(generation.to_be_bytes())
        .values()
        .map(|chunk| codec::decode::<ContentChunk>(&chunk.expect("chunk")).expect("decodes").entries.len())
        .sum();
    entries + chunked
}

/// A history mark names the store (an id kept across opens, another for another store)
/// and the endpoint of the change at that count; none past the store's count.
#[tokio::test]
async fn history_marks_name_the_store_and_the_change() {
    let (one, two) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let first = {
        let store = store_serving_abcd(one.path(), 1).await;
        assert_eq!(store.apply_many(Generation(1), &items(&["a", "b", "c"], 1)).await.expect("apply").len(), 3);
        assert_eq!(store.apply_many(Generation(1), &items(&["d"], 1)).await.expect("apply").len(), 1);
        // Every count names its own switch, inside a batch of three or alone.
        for (count, label) in [(1, "a"), (2, "b"), (3, "c"), (4, "d")] {
            let mark = store.history_mark(count).await.expect("mark").expect("a mark");
            assert_eq!(mark.change, Some(DnsName::parse(&format!("{label}.example.test.")).expect("name")), "change {count}");
        }
        let mark = store.history_mark(1).await.expect("mark").expect("a mark at 1");
        let zero = store.history_mark(0).await.expect("mark").expect("a mark at 0");
        assert_eq!((zero.store_id, zero.change), (mark.store_id, None));
        assert_eq!(store.history_mark(5).await.expect("mark"), None, "a mark past the store's count");
        mark
    };
    let reopened = SledStore::open(one.path()).expect("open");
    assert_eq!(reopened.history_mark(1).await.expect("mark"), Some(first.clone()), "the id is kept across opens");
    let other = store_serving_abcd(two.path(), 1).await;
    other.apply_many(Generation(1), &items(&["a"], 1)).await.expect("apply");
    let mark = other.history_mark(1).await.expect("mark").expect("a mark");
    assert_ne!(mark.store_id, first.store_id, "two stores drew the same id");
}

/// A large plan's contents go in batches ahead of its transaction. A publish that wrote
/// them and then did not commit (a crash, here: the store dropped right after) leaves
/// entries for a generation no plan has; the store removes them when it opens, so the
/// plan that does take that generation is checked against its own content only.
#[tokio::test]
async fn contents_of_a_publish_that_did_not_commit_are_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wide = CONTENTS_IN_TXN_MAX + 500;
    {
        let store = store_with_plans(dir.path(), 1).await;
        // A large publish commits with its contents written ahead, and leaves no mark.
        store.publish(&uniform_plan(2, wide, 7)).await.expect("publish");
        // Its changes against plan 1: every `e` served, and `a` left out.
        assert_eq!(contents_of(&store, Generation(2)), wide + 1);
        assert!(store.inner().meta.get(META_CONTENTS_PENDING).expect("meta").is_none());
        // The next one writes its contents and dies before its transaction.
        let orphan = uniform_plan(3, wide, 9);
        let inner = store.inner();
        let _guard = inner.guard().expect("lock");
        inner.write_contents_ahead(Generation(3), &ContentWrite::whole(orphan.plan())).expect("write ahead");
        assert_eq!(contents_of(&store, Generation(3)), wide);
    }
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(contents_of(&store, Generation(3)), 0, "the entries of the publish that did not commit survived the reopen");
    assert!(store.inner().meta.get(META_CONTENTS_PENDING).expect("meta").is_none());
    // Plan 3 is now another one: plan 2 with `e0` changed, so it writes an entry for `e0`
    // alone. The dead publish's records for `e1` are refused at plan 3 (its entry would
    // have been found first), plan 3's own are taken.
    let mut plan = uniform_plan(3, wide, 7).into_plan();
    plan.endpoints.insert(items(&["e0"], 1)[0].endpoint.clone(), endpoint(11));
    store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish plan 3");
    assert_eq!(contents_of(&store, Generation(3)), 1);
    let refused = store.apply(&items(&["e1"], 9)[0].endpoint, Generation(3), &endpoint(9)).await;
    assert!(matches!(refused, Err(StoreError::ContentMismatch { .. })), "{refused:?}");
    store.apply(&items(&["e0"], 11)[0].endpoint, Generation(3), &endpoint(11)).await.expect("plan 3's own content");
    store.apply(&items(&["e1"], 7)[0].endpoint, Generation(3), &endpoint(7)).await.expect("plan 3's content, as plan 2's");
}

/// Plan `g` serving `a` with records that change every plan, `b` with the same records
/// throughout, and `c` on even plans only.
fn churning_plan(g: u64) -> ValidatedPlan {
    let mut endpoints: std::collections::BTreeMap<_, _> =
        [(items(&["a"], 1)[0].endpoint.clone(), endpoint((g % 250) as u8 + 1)), (items(&["b"], 1)[0].endpoint.clone(), endpoint(1))].into();
    if g.is_multiple_of(2) {
        endpoints.insert(items(&["c"], 1)[0].endpoint.clone(), endpoint(2));
    }
    zone_plan(&DnsName::parse("example.test.").expect("zone"), g, endpoints)
}

async fn apply_plan(store: &SledStore, g: u64) {
    let plan = churning_plan(g);
    let batch: Vec<_> = plan.plan().endpoints.iter().map(|(n, r)| ApplyItem { endpoint: n.clone(), records: r.clone() }).collect();
    for result in store.apply_many(Generation(g), &batch).await.expect("batch") {
        result.expect("each endpoint carries its plan's records");
    }
}

/// Cleanup prunes what no stored plan resolves to: with 300 plans, an endpoint that
/// changes on every plan, one that never does and one that comes and goes, the content
/// entries stay a few per endpoint, and every endpoint still resolves.
#[tokio::test]
async fn plan_contents_stay_bounded_through_cleanup() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    for g in 1..=300 {
        store.publish(&churning_plan(g)).await.expect("publish");
        apply_plan(&store, g).await;
        store.cleanup(3).await.expect("cleanup");
        let entries = store.inner().contents.len();
        assert!(entries <= 3 * 4 + 3, "plan {g}: {entries} content entries for 3 endpoints and 3 plans kept");
        assert!(store.inner().contents_chunks.len() <= 1, "plan {g}: chunks of whole contents older than the horizon's are kept");
    }
    let c = items(&["c"], 1)[0].endpoint.clone();
    let r = store.apply(&c, Generation(299), &endpoint(2)).await;
    assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::NothingOf, .. })), "c is not in odd plans: {r:?}");
    assert!(store.inner().contents_full.len() <= 1, "markers older than the horizon go");
}

/// A store with plans 1..=`plans`, plan `g` serving a, b, c and d with `endpoint(g)`.
async fn store_serving_abcd(dir: &Path, plans: u8) -> SledStore {
    let store = SledStore::open(dir).expect("open");
    for g in 1..=plans {
        let mut plan = churning_plan(u64::from(g)).into_plan();
        plan.endpoints = items(&["a", "b", "c", "d"], g).into_iter().map(|i| (i.endpoint, i.records)).collect();
        store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish");
    }
    store
}

#[tokio::test]
async fn a_delta_names_only_what_switched() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_serving_abcd(dir.path(), 2).await;
    store.apply_many(Generation(1), &items(&["a", "b", "c", "d"], 1)).await.expect("batch");
    let seen = store.version().await.expect("version").applied_changes;
    store.apply_many(Generation(2), &items(&["b", "d"], 2)).await.expect("batch");
    let delta = store.active_since(seen).await.expect("delta");
    assert!(!delta.full, "the log reaches back: want a delta");
    let names: Vec<_> = delta.endpoints.keys().map(|n| n.as_str().to_owned()).collect();
    assert_eq!(names, ["b.example.test.", "d.example.test."]);
    assert_eq!(delta.applied_changes, seen + 2);
}

#[tokio::test]
async fn a_follower_behind_the_log_gets_the_whole_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_serving_abcd(dir.path(), 2).await;
    store.apply_many(Generation(1), &items(&["a"], 1)).await.expect("batch");
    store.apply_many(Generation(1), &items(&["b"], 1)).await.expect("batch");
    store.apply_many(Generation(2), &items(&["b"], 2)).await.expect("batch");
    // A store written before the log existed, or a log trimmed past the follower.
    store.inner().changes.remove(1u64.to_be_bytes()).expect("remove");
    let delta = store.active_since(0).await.expect("delta");
    assert!(delta.full, "the log misses change 1: want the whole state");
    assert_eq!(delta.endpoints.len(), 2);
    let delta = store.active_since(1).await.expect("delta");
    assert!(!delta.full, "changes 2 and 3 are in the log");
    assert_eq!(delta.endpoints.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["b.example.test."]);
}

/// Plan changes are recorded at publish and answered from the records while they reach
/// back; a gap in them, a cleaned-up range or a too-long gap makes the follower read the
/// plan whole, and the reopened store still has them.
#[tokio::test]
async fn plan_changes_come_from_records_kept_with_the_plans() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_with_plans(dir.path(), 4).await;
    let changes = store.plan_changes(Generation(1), Generation(4)).await.expect("changes");
    let changes = changes.expect("plans 2..=4 have recorded changes");
    assert!(changes.changes.is_empty(), "the fixture plans are all alike: {changes:?}");
    assert_eq!(changes.endpoint_count, 1);
    drop(store);
    let store = SledStore::open(dir.path()).expect("reopen");
    assert!(store.plan_changes(Generation(2), Generation(4)).await.expect("changes").is_some());
    // A plan without a record (the first plan has no parent; an older store kept none).
    store.inner().plan_changes.remove(3u64.to_be_bytes()).expect("remove");
    assert_eq!(store.plan_changes(Generation(1), Generation(4)).await.expect("changes"), None);
    assert!(store.plan_changes(Generation(3), Generation(4)).await.expect("changes").is_some());
    assert!(store.plan_changes(Generation(0), Generation(2)).await.expect("changes").is_none(), "plan 1 has no parent");
    assert!(matches!(store.plan_changes(Generation(1), Generation(9)).await, Err(StoreError::PlanNotFound(_))));
    let far = store_with_plans(tempfile::tempdir().expect("tempdir").path(), PLAN_CHANGES_GAP_MAX + 2).await;
    assert!(far.plan_changes(Generation(1), Generation(PLAN_CHANGES_GAP_MAX + 1)).await.expect("changes").is_some());
    assert!(far.plan_changes(Generation(1), Generation(PLAN_CHANGES_GAP_MAX + 2)).await.expect("changes").is_none(), "gap too long");
    // Cleanup removes the records with the plans.
    far.apply(&items(&["a"], 1)[0].endpoint, Generation(PLAN_CHANGES_GAP_MAX + 2), &endpoint(1)).await.expect("apply");
    far.cleanup(2).await.expect("cleanup");
    assert!(matches!(far.plan_changes(Generation(1), Generation(3)).await, Err(StoreError::PlanNotFound(_))));
    // Plan 65's record, its changes against the deleted plan 64, stays with plan 65.
    assert!(far.plan_changes(Generation(PLAN_CHANGES_GAP_MAX), Generation(PLAN_CHANGES_GAP_MAX + 2)).await.expect("changes").is_some());
    assert_eq!(far.plan_changes(Generation(PLAN_CHANGES_GAP_MAX - 1), Generation(PLAN_CHANGES_GAP_MAX + 2)).await.expect("changes"), None);
    assert_eq!(far.inner().plan_changes.len(), 2, "records below the horizon are gone");
}

/// Plan `g` serving `count` endpoints, endpoint `g % count` with records of its own.
fn wide_plan(g: u64, count: usize) -> ValidatedPlan {
    let mut endpoints: std::collections::BTreeMap<_, _> =
        (0..count).map(|i| (DnsName::parse(&format!("e{i}.example.test.")).expect("name"), endpoint(1))).collect();
    if g > 1 {
        let changed = DnsName::parse(&format!("e{}.example.test.", g as usize % count)).expect("name");
        endpoints.insert(changed, endpoint((g % 250) as u8 + 2));
    }
    ValidatedPlan::new(Plan {
        generation: Generation(g),
        parent_generation: Generation(g - 1),
        created_at_unix_ms: g,
        author: Author::Planner { id: "p".into() },
        reason: format!("plan {g}"),
        dns_zone: DnsName::parse("example.test.").expect("zone"),
        endpoints,
        retired: BTreeSet::new(),
        rollback_of: None,
        provenance: Vec::new(),
    })
    .expect("valid")
}

fn whole_plans(store: &SledStore) -> Vec<u64> {
    store.inner().plans.iter().keys().map(|k| generation_key(&k.expect("key")).expect("key").0).collect()
}

/// Waits until the checkpoint thread is done (it clears `writing`), with a deadline.
fn wait_checkpoint_done(store: &SledStore) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while store.inner().chain_state().expect("chain").writing {
        assert!(std::time::Instant::now() < deadline, "the checkpoint did not finish");
        std::thread::yield_now();
    }
}

/// A one-endpoint change to a 1,000-endpoint plan published as changes writes no whole
/// plan: the plan is its head and its change, and reads back whole.
#[tokio::test]
async fn a_small_change_is_stored_as_its_change() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let first = wide_plan(1, 1_000);
    store.publish(&first).await.expect("publish");
    let mut previous = first;
    for g in 2..=20 {
        let next = wide_plan(g, 1_000);
        let delta = PlanDelta::between(previous.plan(), &next).expect("delta");
        assert_eq!(delta.changes.len(), if g == 2 { 1 } else { 2 }, "plan {g} changes what it should");
        store.publish_changes(&delta, None).await.expect("publish changes");
        assert_eq!(store.plan(Generation(g)).await.expect("read"), next);
        previous = next;
    }
    assert_eq!(whole_plans(&store), [1], "no plan was written whole");
    let chain = *store.inner().chain_state().expect("chain");
    assert_eq!(chain.plans, 19);
    assert!(chain.change_bytes * 2 < chain.base_bytes, "{chain:?}");
    // Read back the same after a restart.
    drop(store);
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(store.plan(Generation(20)).await.expect("read"), previous);
    assert_eq!(store.inner().chain_state().expect("chain").plans, 19, "the chain is counted again on open");
}

/// Once the changes since the last whole plan add up to half of it, the plan is written
/// whole off the publish path; cleanup keeps the bytes from the newest whole plan at or
/// below its horizon, and every plan from the horizon on still reads back.
#[tokio::test]
async fn checkpoints_bound_the_chain_and_cleanup_keeps_what_reads_need() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let mut plans = vec![wide_plan(1, 20)];
    store.publish(&plans[0]).await.expect("publish");
    for g in 2..=120 {
        let next = wide_plan(g, 20);
        let delta = PlanDelta::between(plans.last().expect("plan").plan(), &next).expect("delta");
        store.publish_changes(&delta, None).await.expect("publish changes");
        wait_checkpoint_done(&store);
        plans.push(next);
    }
    let whole = whole_plans(&store);
    assert!(whole.len() > 10, "checkpoints written: {whole:?}");
    let chain = *store.inner().chain_state().expect("chain");
    assert!(chain.change_bytes * 2 < chain.base_bytes + 2_000, "{chain:?}");
    for p in &plans {
        assert_eq!(&store.plan(p.generation()).await.expect("read"), p);
    }
    let report = store.cleanup(10).await.expect("cleanup");
    let horizon = report.horizon_after;
    assert_eq!(horizon, Generation(111));
    let base = *whole.iter().filter(|g| **g <= horizon.0).max().expect("a whole plan below the horizon");
    assert_eq!(whole_plans(&store).first(), Some(&base), "bytes kept from the newest whole plan at or below the horizon");
    let oldest_head = store.inner().plan_heads.iter().keys().next().map(|k| generation_key(&k.expect("key")).expect("key").0);
    assert!(oldest_head.is_none_or(|g| g >= base), "heads kept from {oldest_head:?}, whole plan {base}");
    for p in &plans {
        match store.plan(p.generation()).await {
            Ok(read) => assert!(p.generation() >= horizon && &read == p),
            Err(StoreError::PlanNotFound(_)) => assert!(p.generation() < horizon),
            Err(err) => panic!("plan {}: {err}", p.generation()),
        }
    }
    drop(store);
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(&store.plan(Generation(120)).await.expect("read"), plans.last().expect("plan"));
}

/// The fence counts as the active records give them: generation → serving endpoints.
fn recount(store: &SledStore) -> BTreeMap<Generation, u64> {
    let mut counts = BTreeMap::new();
    for (_, record) in store.inner().active_all_locked().expect("active").endpoints {
        if matches!(record.state, ActiveState::Serving(_)) {
            *counts.entry(record.generation).or_default() += 1;
        }
    }
    counts
}

fn stored_counts(store: &SledStore) -> BTreeMap<Generation, u64> {
    store
        .inner()
        .fence_counts
        .iter()
        .map(|entry| {
            let (key, value) = entry.expect("entry");
            (generation_key(&key).expect("key"), FenceCount::decode(&value).expect("count").count)
        })
        .collect()
}

/// Each batch keeps the fence counts equal to a recount of the active records, through
/// applies, retires and stale writes; cleanup's oldest active generation is the first
/// count, and the endpoint it names serves with that fence, also after the endpoint the
/// count last named moved on.
#[tokio::test]
async fn fence_counts_follow_every_switch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let labels: Vec<String> = (0..12).map(|i| format!("e{i}")).collect();
    let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
    for g in 1..=6u64 {
        let mut plan = uniform_plan(g, 12, g as u8).into_plan();
        // Plan 3 retires e0..e3; the others serve them again.
        if g == 3 {
            for label in &labels[..4] {
                let name = DnsName::parse(&format!("{label}.example.test.")).expect("name");
                plan.endpoints.remove(&name);
                plan.retired.insert(name);
            }
        }
        store.publish(&ValidatedPlan::new(plan).expect("valid")).await.expect("publish");
    }
    // (plan, endpoints applied in one batch): a plan applied in parts, with some endpoints
    // left behind on older plans, and one stale batch.
    let steps: [(u64, &[&str]); 8] = [
        (1, &labels[..]),
        (2, &labels[..6]),
        (3, &labels[..8]),
        (2, &labels[6..]),
        (5, &labels[2..5]),
        (4, &labels[9..]),
        (1, &labels[..3]),
        (6, &labels[..1]),
    ];
    for (g, batch) in steps {
        let plan = store.plan(Generation(g)).await.expect("plan").into_plan();
        let items: Vec<ApplyItem> = batch
            .iter()
            .map(|l| DnsName::parse(&format!("{l}.example.test.")).expect("name"))
            .map(|name| match plan.endpoints.get(&name) {
                Some(records) => ApplyItem { endpoint: name, records: records.clone() },
                None => ApplyItem { endpoint: name, records: Endpoint { ttl_secs: 0, targets: vec![] } },
            })
            .collect();
        if g == 3 {
            for item in &items[..4] {
                store.retire(&item.endpoint, Generation(g)).await.expect("retire");
            }
            store.apply_many(Generation(g), &items[4..]).await.expect("batch");
        } else {
            store.apply_many(Generation(g), &items).await.expect("batch");
        }
        assert_eq!(stored_counts(&store), recount(&store), "after plan {g}'s batch {batch:?}");
        let decision = store.cleanup_preview(1).await.expect("preview");
        let (oldest, name) = decision.oldest_active.expect("something serves");
        assert_eq!(Some(&oldest), recount(&store).keys().next(), "after plan {g}'s batch");
        let record = store.active(&name).await.expect("active").expect("a record");
        assert_eq!(record.generation, oldest, "the named endpoint serves with the oldest fence");
        assert!(matches!(record.state, ActiveState::Serving(_)));
    }
    let reopened = {
        drop(store);
        SledStore::open(dir.path()).expect("reopen")
    };
    assert_eq!(stored_counts(&reopened), recount(&reopened), "after a reopen");
}

/// A whole plan's content is in chunks: each of its names is checked against its own
/// entry in whichever chunk holds it, a later plan's entries take precedence, and a later
/// plan that leaves a name out still does so after cleanup (the chunk below would answer
/// for the name otherwise).
#[tokio::test]
async fn whole_contents_are_chunked_and_later_plans_take_precedence() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let wide = CONTENT_CHUNK_NAMES * 2 + 50;
    let mut one = uniform_plan(1, wide, 1).into_plan();
    let gone = items(&["zz-retired"], 1)[0].endpoint.clone();
    one.retired.insert(gone.clone());
    store.publish(&ValidatedPlan::new(one).expect("valid")).await.expect("publish");
    assert_eq!(store.inner().contents_chunks.len(), 3, "{wide} names and one retired in chunks of {CONTENT_CHUNK_NAMES}");
    assert_eq!(contents_of(&store, Generation(1)), wide + 1);
    let name = |i: usize| items(&[&format!("e{i}")], 1)[0].endpoint.clone();
    for i in [0, 1, 99, 255, 256, 511, wide - 1] {
        store.apply(&name(i), Generation(1), &endpoint(1)).await.unwrap_or_else(|e| panic!("e{i}: {e}"));
        let r = store.apply(&name(i), Generation(1), &endpoint(2)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::OtherRecords, .. })), "e{i}: {r:?}");
    }
    let r = store.apply(&name(wide), Generation(1), &endpoint(1)).await;
    assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::NothingOf, .. })), "{r:?}");
    let r = store.apply(&gone, Generation(1), &endpoint(1)).await;
    assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::Retires, .. })), "{r:?}");
    store.retire(&gone, Generation(1)).await.expect("retire as plan 1 says");
    // Plan 2: e5 changes, e7 is left out; both recorded as entries of plan 2.
    let mut two = uniform_plan(2, wide, 1).into_plan();
    two.endpoints.insert(name(5), endpoint(9));
    two.endpoints.remove(&name(7));
    two.retired.insert(gone.clone());
    store.publish(&ValidatedPlan::new(two).expect("valid")).await.expect("publish");
    assert_eq!(store.inner().contents_chunks.len(), 3, "plan 2 is stored as its change");
    // Everything applied at plan 1 moves to plan 2, so cleanup can delete plan 1.
    let mut batch: Vec<ApplyItem> = [0, 1, 5, 6, 99, 255, 256, 511, wide - 1]
        .into_iter()
        .map(|i| ApplyItem { endpoint: name(i), records: endpoint(if i == 5 { 9 } else { 1 }) })
        .collect();
    batch.sort_by(|a, b| a.endpoint.as_str().cmp(b.endpoint.as_str()));
    for result in store.apply_many(Generation(2), &batch).await.expect("batch") {
        result.expect("plan 2's content");
    }
    for (g, cleanup) in [(2, false), (2, true)] {
        if cleanup {
            let report = store.cleanup(1).await.expect("cleanup");
            assert_eq!(report.horizon_after, Generation(2));
        }
        let r = store.apply(&name(7), Generation(g), &endpoint(1)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::NothingOf, .. })), "cleanup {cleanup}: {r:?}");
        let r = store.apply(&name(5), Generation(g), &endpoint(1)).await;
        assert!(matches!(r, Err(StoreError::ContentMismatch { plan: PlanSays::OtherRecords, .. })), "cleanup {cleanup}: {r:?}");
    }
    // A whole plan later: the older chunks go with cleanup.
    store.publish(&uniform_plan(3, 10, 3)).await.expect("publish");
    assert_eq!(store.inner().contents_chunks.len(), 3, "plan 3 is stored as its change");
    let mut big = uniform_plan(4, wide + 300, 4).into_plan();
    big.endpoints.extend((0..70_000).map(|i| (items(&[&format!("w{i}")], 4)[0].endpoint.clone(), endpoint(4))));
    store.publish(&ValidatedPlan::new(big).expect("valid")).await.expect("publish a change too large to record");
    let whole: Vec<u64> = store.inner().contents_full.iter().keys().map(|k| generation_key(&k.expect("key")).expect("g").0).collect();
    assert_eq!(whole, [1, 4]);
    for item in &mut batch {
        item.records = endpoint(4);
    }
    for result in store.apply_many(Generation(4), &batch).await.expect("batch") {
        result.expect("plan 4's content");
    }
    assert_eq!(store.cleanup(1).await.expect("cleanup").horizon_after, Generation(4));
    assert!(store.inner().contents_chunks.scan_prefix(Generation(1).to_be_bytes()).next().is_none(), "plan 1's chunks are gone");
    assert_eq!(contents_of(&store, Generation(4)), wide + 300 + 70_000);
}

/// The control API sends a plan stored whole as its stored envelope, and a plan stored as
/// changes encoded from the plan read: both decode to the plan published.
#[tokio::test]
async fn plan_envelopes_decode_to_the_plans_published() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let one = uniform_plan(1, 300, 1);
    let mut two = uniform_plan(2, 300, 1).into_plan();
    let first = two.endpoints.keys().next().expect("an endpoint").clone();
    two.endpoints.insert(first, endpoint(2));
    let two = ValidatedPlan::new(two).expect("valid");
    store.publish(&one).await.expect("publish 1");
    crate::store::publish_against(&store, Some(one.plan()), &two, None).await.expect("publish 2 as its changes");
    assert!(store.inner().plans.get(Generation(2).to_be_bytes()).expect("read").is_none(), "plan 2 is stored as its changes");
    for plan in [&one, &two] {
        let g = plan.generation();
        let envelope = store.plan_envelope(g).await.expect("envelope");
        assert_eq!(codec::decode_plan(&envelope).expect("decodes").plan(), plan.plan(), "plan {g}");
    }
    let stored = store.inner().plans.get(Generation(1).to_be_bytes()).expect("read").expect("plan 1 is stored whole");
    assert_eq!(store.plan_envelope(Generation(1)).await.expect("envelope"), stored.to_vec(), "sent as stored");
    let r = store.plan_envelope(Generation(3)).await;
    assert!(matches!(r, Err(StoreError::PlanNotFound(_))), "{r:?}");
}

/// Every run as stored: its key and its names.
fn stored_runs(store: &SledStore) -> Vec<(Vec<u8>, Vec<String>)> {
    store
        .inner()
        .active_runs
        .iter()
        .map(|entry| {
            let (key, value) = entry.expect("entry");
            let run = codec::decode::<ActiveRun>(&value).expect("run");
            (key.to_vec(), run.records.into_iter().map(|(name, _)| name.into_string()).collect())
        })
        .collect()
}

/// Endpoints applied in batches of scattered names land in runs that stay in name order,
/// within `ACTIVE_RUN_MAX`, each keyed by its first name (the first by a 0 byte); every
/// read (one name, a page walk, the whole state, a delta) gives each endpoint its own
/// record.
#[tokio::test]
async fn active_runs_split_in_name_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let count = ACTIVE_RUN_MAX * 5 + 17;
    store.publish(&uniform_plan(1, count, 1)).await.expect("publish");
    store.publish(&uniform_plan(2, count, 2)).await.expect("publish");
    // A fixed shuffle: an enactor's batches are in name order, a retry's or another
    // enactor's need not be.
    let mut order: Vec<usize> = (0..count).collect();
    let mut x = 7u64;
    for i in (1..order.len()).rev() {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    let name = |i: usize| items(&[&format!("e{i}")], 1)[0].endpoint.clone();
    for batch in order.chunks(100) {
        let mut items: Vec<ApplyItem> = batch.iter().map(|&i| ApplyItem { endpoint: name(i), records: endpoint(1) }).collect();
        items.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
        for result in store.apply_many(Generation(1), &items).await.expect("batch") {
            result.expect("plan 1's content");
        }
    }
    let seen = store.version().await.expect("version").applied_changes;
    // Plan 2 on every third endpoint, scattered through the runs.
    let moved: Vec<ApplyItem> = (0..count).step_by(3).map(|i| ApplyItem { endpoint: name(i), records: endpoint(2) }).collect();
    let mut moved_sorted = moved.clone();
    moved_sorted.sort_by(|a, b| a.endpoint.cmp(&b.endpoint));
    for batch in moved_sorted.chunks(crate::store::APPLY_BATCH_MAX) {
        for result in store.apply_many(Generation(2), batch).await.expect("batch") {
            result.expect("plan 2's content");
        }
    }
    let runs = stored_runs(&store);
    assert!(runs.len() >= count.div_ceil(ACTIVE_RUN_MAX), "{} runs for {count} endpoints", runs.len());
    assert_eq!(runs[0].0, FIRST_RUN);
    let mut all: Vec<String> = Vec::new();
    for (key, names) in &runs {
        assert!(!names.is_empty() && names.len() <= ACTIVE_RUN_MAX, "a run of {}", names.len());
        if key.as_slice() != FIRST_RUN {
            assert_eq!(key.as_slice(), names[0].as_bytes(), "a run is keyed by its first name");
        }
        all.extend(names.iter().cloned());
    }
    let mut want: Vec<String> = (0..count).map(|i| name(i).as_str().to_owned()).collect();
    want.sort();
    assert_eq!(all, want, "every endpoint once, in name byte order");
    let generation_of = |i: usize| Generation(if i.is_multiple_of(3) { 2 } else { 1 });
    for i in [0, 1, 2, 3, count / 2, count - 1] {
        let record = store.active(&name(i)).await.expect("active").expect("a record");
        assert_eq!(record.generation, generation_of(i), "e{i}");
    }
    let mut walked = Vec::new();
    let mut after = None;
    loop {
        let page = store.active_page(after.clone(), 7).await.expect("page");
        walked.extend(page.endpoints.iter().map(|(n, r)| (n.as_str().to_owned(), r.generation)));
        after = page.endpoints.last().map(|(n, _)| n.clone());
        if !page.more {
            break;
        }
    }
    let by_name: Vec<(String, Generation)> = (0..count).map(|i| (name(i).as_str().to_owned(), generation_of(i))).collect();
    let mut by_name = by_name;
    by_name.sort();
    assert_eq!(walked, by_name, "a walk in pages of 7");
    let whole = store.active_all().await.expect("all");
    assert_eq!(whole.endpoints.len(), count);
    let delta = store.active_since(seen).await.expect("delta");
    assert!(!delta.full);
    assert_eq!(delta.endpoints.len(), moved.len());
    assert!(delta.endpoints.values().all(|r| r.generation == Generation(2)));
    assert_eq!(stored_counts(&store), recount(&store));
}

/// A store held open is reported as in use, after `OPEN_LOCK_WAIT` of retries (the time
/// a store just dropped, or a process that just exited, takes to let go), not as an I/O
/// error at once.
#[test]
fn a_store_in_use_is_waited_for_then_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let held = SledStore::open(dir.path()).expect("open");
    let started = std::time::Instant::now();
    let refused = SledStore::open(dir.path()).err().expect("a second open while the first holds the lock");
    assert!(matches!(&refused, StoreError::Unavailable(why) if why.contains("in use by another process")), "{refused}");
    assert!(started.elapsed() >= OPEN_LOCK_WAIT, "refused after {:?}, before retrying for {OPEN_LOCK_WAIT:?}", started.elapsed());
    drop(held);
}

/// Whether sled compresses the store in `dir`, as it recorded when it created it.
fn compressed(dir: &Path) -> bool {
    let conf = std::fs::read(dir.join("conf")).expect("sled's conf");
    let conf = String::from_utf8_lossy(&conf);
    assert!(conf.contains("use_compression: "), "sled's conf names its compression: {conf}");
    conf.contains("use_compression: true")
}

/// A new store is compressed; a store created without compression (by an older dnsplan)
/// opens as it is, keeps its plans and records, and stays uncompressed (sled refuses to
/// change it).
#[tokio::test]
async fn a_store_created_uncompressed_opens_as_it_is() {
    let fresh = tempfile::tempdir().expect("tempdir");
    drop(SledStore::open(fresh.path()).expect("open"));
    assert!(compressed(fresh.path()), "a new store is compressed");

    let dir = tempfile::tempdir().expect("tempdir");
    drop(sled::Config::new().path(dir.path()).use_compression(false).open().expect("an uncompressed sled store"));
    let store = SledStore::open(dir.path()).expect("open an uncompressed store");
    store.publish(&uniform_plan(1, 3, 1)).await.expect("publish");
    store.apply_many(Generation(1), &items(&["e0", "e1", "e2"], 1)).await.expect("apply");
    let active = store.active_all().await.expect("active");
    drop(store);
    let store = SledStore::open(dir.path()).expect("reopen");
    assert_eq!(store.plan(Generation(1)).await.expect("plan 1"), uniform_plan(1, 3, 1));
    assert_eq!(store.active_all().await.expect("active"), active);
    assert_eq!(active.endpoints.len(), 3);
    drop(store);
    assert!(!compressed(dir.path()), "the store stays as it was created");
}

/// A new store is marked with [`LAYOUT`] and opens again; a store of another layout, or of none
/// (written before versions), is refused with both layouts named and its data left as it was.
#[tokio::test]
async fn a_store_of_another_layout_is_refused_naming_both() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = store_with_plans(dir.path(), 2).await;
    assert_eq!(store.inner().meta_u64(META_LAYOUT, 0).expect("layout"), LAYOUT, "a new store is marked");
    drop(store);
    let mut store = SledStore::open(dir.path()).expect("a store of this layout opens");
    for (stored, named) in [(Some(LAYOUT - 1), format!("has layout {}", LAYOUT - 1)), (None, "has no layout version".to_string())] {
        match stored {
            Some(layout) => store.inner().meta.insert(META_LAYOUT, &layout.to_be_bytes()).map(drop).expect("layout"),
            None => store.inner().meta.remove(META_LAYOUT).map(drop).expect("layout"),
        }
        store.inner().db.flush().expect("flush");
        drop(store);
        let refused = SledStore::open(dir.path()).err().expect("a store of another layout is refused");
        let text = refused.to_string();
        assert!(text.contains(&named) && text.contains(&format!("opens layout {LAYOUT} only")), "{text}");
        // Nothing was converted or lost: marked back, it opens with its plans.
        let db = sled::Config::new().path(dir.path()).use_compression(true).open().expect("sled");
        db.open_tree("meta").expect("meta").insert(META_LAYOUT, &LAYOUT.to_be_bytes()).expect("layout");
        db.flush().expect("flush");
        drop(db);
        store = SledStore::open(dir.path()).expect("reopen");
        assert_eq!(store.latest().await.expect("latest"), Generation(2));
    }

    // The way out the error gives: an empty store beside a copy of the old one's high-water
    // mark, opened once accepting the loss, starts its counts (and so the SOA serial) past the
    // old store's.
    for result in store.apply_many(Generation(2), &items(&["a"], 1)).await.expect("apply") {
        assert!(matches!(result, Ok(ApplyOutcome::Switched { .. })), "{result:?}");
    }
    let served = store.inner().counts().expect("counts");
    assert!(served.0 > 0 && served.1 > 0, "{served:?}");
    drop(store);
    let fresh = tempfile::tempdir().expect("tempdir");
    std::fs::copy(dir.path().join(high_water::FILE_NAME), fresh.path().join(high_water::FILE_NAME)).expect("copy the mark");
    let refused = SledStore::open(fresh.path()).err().expect("an empty store behind the mark is refused without the flag");
    assert!(matches!(refused, StoreError::WentBack(_)), "{refused}");
    let store = SledStore::open_with(fresh.path(), OnLoss::Accept).expect("open accepting the loss");
    let (applied, content) = store.inner().counts().expect("counts");
    assert!(applied > served.0 && content > served.1, "{applied}, {content} past {served:?}");
}

/// A reopen after a failed write (a full disk) opens every added zone's trees again: a zone
/// handle held across it serves its own state, and its writes land again.
#[tokio::test]
async fn a_reopen_opens_the_added_zones_again() {
    use crate::store::zones::ManagedZones;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = SledStore::open(dir.path()).expect("open");
    let origin = DnsName::parse("example.test.").expect("zone");
    assert!(root.add_zone(&origin, "").await.expect("add"));
    let zone = root.zone(&origin).await.expect("zone");
    let plan = |g: u64| zone_plan(&origin, g, items(&["www"], g as u8).into_iter().map(|i| (i.endpoint, i.records)).collect());
    zone.publish(&plan(1)).await.expect("publish");
    zone.apply_many(Generation(1), &items(&["www"], 1)).await.expect("apply");
    root.shared.database.reopen().expect("reopen");
    let active = zone.active_all().await.expect("read after the reopen");
    assert_eq!(active.endpoints.len(), 1, "the zone's state after the reopen: {active:?}");
    zone.publish(&plan(2)).await.expect("publish after the reopen");
    let outcomes = zone.apply_many(Generation(2), &items(&["www"], 2)).await.expect("apply after the reopen");
    assert!(matches!(outcomes[0], Ok(ApplyOutcome::Switched { .. })), "{outcomes:?}");
    assert_eq!(root.latest().await.expect("latest"), Generation::NONE, "the first zone has no plan");
}

/// A zone whose every handle was dropped while a call still ran on its trees opens again on
/// the same trees and writer lock, never on a second set beside them (two writers on one zone).
#[tokio::test]
async fn a_zone_opened_again_while_a_call_runs_keeps_one_writer_lock() {
    use crate::store::zones::ManagedZones;
    let dir = tempfile::tempdir().expect("tempdir");
    let root = SledStore::open(dir.path()).expect("open");
    let origin = DnsName::parse("example.test.").expect("zone");
    assert!(root.add_zone(&origin, "").await.expect("add"));
    let first = root.zone(&origin).await.expect("zone");
    // What a call in flight holds.
    let running = first.current().expect("the zone's trees");
    drop(first);
    let again = root.zone(&origin).await.expect("zone again");
    assert!(Arc::ptr_eq(&running, &again.current().expect("the zone's trees")), "a second set of trees and lock for one zone");
    drop((running, again));
    // With nothing running on it, the zone opens afresh.
    let fresh = root.zone(&origin).await.expect("zone afresh");
    assert_eq!(fresh.latest().await.expect("latest"), Generation::NONE);
}

/// The registry holds at most `MANAGED_ZONES_MAX` zones, live and removed (lowered to 2 here):
/// a third is refused, naming the limit; a removed zone keeps its place (its tombstone keeps
/// its counts), and is added again; the count survives a restart.
#[tokio::test]
async fn the_registry_refuses_zones_past_its_limit() {
    use crate::store::zones::ManagedZones;
    let dir = tempfile::tempdir().expect("tempdir");
    let zone = |n: &str| DnsName::parse(n).expect("zone");
    let refused = |result: StoreResult<bool>| match result {
        Err(StoreError::BadRequest(why)) => assert!(why.contains("holds 2 zones, live and removed"), "{why}"),
        other => panic!("a third zone: {other:?}"),
    };
    {
        let root = SledStore::open(dir.path()).expect("open");
        root.set_registry_zones_max(2);
        assert!(root.add_zone(&zone("a.test."), "").await.expect("a"));
        assert!(root.add_zone(&zone("b.test."), "").await.expect("b"));
        refused(root.add_zone(&zone("c.test."), "").await);
        assert!(root.remove_zone(&zone("a.test.")).await.expect("remove"));
        refused(root.add_zone(&zone("c.test."), "").await);
        assert!(root.add_zone(&zone("a.test."), "").await.expect("a again"));
    }
    let root = SledStore::open(dir.path()).expect("open again");
    root.set_registry_zones_max(2);
    refused(root.add_zone(&zone("c.test."), "").await);
}

/// Copies added zone `origin`'s keys from the shared trees into trees of its own, named as
/// builds before the shared trees named them, and removes them from the shared trees: the
/// layout such a build left on disk.
fn keep_in_own_trees(db: &sled::Db, origin: &DnsName) {
    let prefix = keyed::zone_prefix(origin.as_str());
    for name in zones::TREES {
        let shared = db.open_tree(format!("zones:{name}")).expect("shared tree");
        let own = db.open_tree(format!("zone:{origin}/{name}")).expect("own tree");
        for item in shared.scan_prefix(&prefix[..]) {
            let (key, value) = item.expect("read");
            own.insert(&key[prefix.len()..], value).expect("copy");
            shared.remove(key).expect("remove");
        }
    }
    db.flush().expect("flush");
}

/// A store whose added zones an earlier build kept in trees of their own opens with each zone
/// as it was (its plans, its served state, its master file), moved into the shared trees, the
/// own trees gone; a move a crash interrupted (part of the keys copied, no `meta`) is done
/// again from the start, and own trees left beside a finished move are only dropped.
#[tokio::test]
async fn added_zones_in_trees_of_their_own_are_moved_into_the_shared_trees() {
    use crate::store::zones::ManagedZones;
    let dir = tempfile::tempdir().expect("tempdir");
    let origin = DnsName::parse("example.test.").expect("zone");
    let plan = |g: u64| zone_plan(&origin, g, items(&["www", "db"], g as u8).into_iter().map(|i| (i.endpoint, i.records)).collect());
    let before = {
        let root = SledStore::open(dir.path()).expect("open");
        assert!(root.add_zone(&origin, "$ORIGIN example.test.\n").await.expect("add"));
        let zone = root.zone(&origin).await.expect("zone");
        for g in 1..=2 {
            zone.publish(&plan(g)).await.expect("publish");
            zone.apply_many(Generation(g), &items(&["www", "db"], g as u8)).await.expect("apply");
        }
        let before = (zone.active_all().await.expect("active"), zone.plan(Generation(1)).await.expect("plan 1"));
        let db = root.inner().db.clone();
        drop(zone);
        keep_in_own_trees(&db, &origin);
        // A move a crash interrupted: a key copied, `meta` not.
        db.open_tree("zones:contents")
            .expect("tree")
            .insert([&keyed::zone_prefix(origin.as_str())[..], b"half-moved"].concat(), b"x".to_vec())
            .expect("insert");
        db.flush().expect("flush");
        before
    };
    let check = |root: &SledStore| {
        let names: Vec<String> = root.inner().db.tree_names().iter().map(|n| String::from_utf8_lossy(n).into_owned()).collect();
        assert!(!names.iter().any(|n| n.starts_with("zone:")), "own trees left: {names:?}");
    };
    let root = SledStore::open(dir.path()).expect("open the earlier layout");
    check(&root);
    let zone = root.zone(&origin).await.expect("zone after the move");
    assert_eq!(zone.active_all().await.expect("active"), before.0, "served state after the move");
    assert_eq!(zone.plan(Generation(1)).await.expect("plan 1"), before.1, "plan 1 after the move");
    assert_eq!(root.zone_master(&origin).await.expect("master"), "$ORIGIN example.test.\n");
    assert!(zone.current().expect("trees").contents.get(b"half-moved").expect("read").is_none(), "the interrupted move's key stayed");
    zone.publish(&plan(3)).await.expect("publish after the move");
    // Own trees beside a finished move (a crash before they were dropped) are dropped only.
    let db = root.inner().db.clone();
    db.open_tree(format!("zone:{origin}/plans")).expect("tree").insert(b"stale", b"x".to_vec()).expect("insert");
    drop((zone, db, root));
    let root = SledStore::open(dir.path()).expect("open again");
    check(&root);
    let zone = root.zone(&origin).await.expect("zone");
    assert_eq!(zone.latest().await.expect("latest"), Generation(3));
    assert_eq!(zone.active_all().await.expect("active"), before.0);
}

/// A registry that lost a zone it had served (its entry gone, the zone's high-water mark in
/// `managed-zones/` left: sled dropping the page) is refused at open, naming the zone; accepted
/// (`--accept-store-loss`), it opens with a tombstone past every count the zone served, so the
/// zone added again serves a serial past the old ones. The directory of a zone removed before
/// a crash is removed at open, without a refusal.
#[tokio::test]
async fn a_registry_that_lost_a_zone_is_refused_and_accepted_past_its_counts() {
    use crate::store::zones::ManagedZones;
    let dir = tempfile::tempdir().expect("tempdir");
    let (shop, gone) = (DnsName::parse("shop.test.").expect("zone"), DnsName::parse("gone.test.").expect("zone"));
    let plan = |origin: &DnsName, g: u64| {
        zone_plan(origin, g, vec![(DnsName::parse(&format!("www.{origin}")).expect("name"), endpoint(g as u8))].into_iter().collect())
    };
    let served = {
        let root = SledStore::open(dir.path()).expect("open");
        for origin in [&shop, &gone] {
            assert!(root.add_zone(origin, "").await.expect("add"));
            let zone = root.zone(origin).await.expect("zone");
            for g in 1..=3 {
                zone.publish(&plan(origin, g)).await.expect("publish");
                let items = [ApplyItem { endpoint: DnsName::parse(&format!("www.{origin}")).expect("name"), records: endpoint(g as u8) }];
                zone.apply_many(Generation(g), &items).await.expect("apply");
            }
        }
        let served = root.zone(&shop).await.expect("zone").inner().counts().expect("counts");
        // gone.test. removed, its directory left behind as by a crash before its removal.
        assert!(root.remove_zone(&gone).await.expect("remove"));
        std::fs::create_dir_all(dir.path().join("managed-zones/gone.test.")).expect("dir");
        std::fs::write(dir.path().join("managed-zones/gone.test.").join(high_water::FILE_NAME), b"").expect("mark");
        // shop.test.'s registry entry lost.
        let db = root.inner().db.clone();
        db.open_tree("managed_zones").expect("registry").remove("shop.test.").expect("remove the entry");
        db.flush().expect("flush");
        served
    };
    match SledStore::open(dir.path()) {
        Err(StoreError::WentBack(why)) => assert!(why.contains("lost shop.test.") && !why.contains("gone.test."), "{why}"),
        Err(other) => panic!("refused for another reason: {other}"),
        Ok(_) => panic!("a registry that lost a zone opened as it is"),
    }
    let root = SledStore::open_with(dir.path(), OnLoss::Accept).expect("accepted");
    assert!(!dir.path().join("managed-zones/gone.test.").exists(), "the removed zone's directory stayed");
    assert!(root.zones().await.expect("zones").iter().all(|z| !z.is_live()), "a zone live after the loss");
    assert!(root.add_zone(&shop, "").await.expect("add again"));
    let again = root.zone(&shop).await.expect("zone").inner().counts().expect("counts");
    assert!(again.0 > served.0 && again.1 > served.1, "counts {again:?} not past {served:?}");
}

/// Plan `g` (parent `g - 1`) of the zone `origin`, by an operator, serving `endpoints`.
fn zone_plan(origin: &DnsName, g: u64, endpoints: std::collections::BTreeMap<EndpointName, Endpoint>) -> ValidatedPlan {
    ValidatedPlan::new(Plan {
        generation: Generation(g),
        parent_generation: Generation(g - 1),
        created_at_unix_ms: 0,
        author: Author::Operator { name: "test".into() },
        reason: "test".into(),
        dns_zone: origin.clone(),
        endpoints,
        retired: BTreeSet::new(),
        rollback_of: None,
        provenance: vec![],
    })
    .expect("valid")
}

/// With a keyring the store publishes only plans it trusts, whole or as changes, in every
/// zone of the database; a signed plan's signature is stored with it and read back (whole,
/// as its envelope), so a follower can verify what it reads. Teeth: without the check in
/// `publish`, the unsigned plan is published ("an unsigned plan was published").
#[tokio::test]
async fn a_keyring_refuses_untrusted_plans_and_signatures_are_kept() {
    use crate::signing::{Keyring, KeyringConfig, SigningKey, TrustedKeyConfig, public_key_text};
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SledStore::open(dir.path()).expect("open");
    let (key, _) = SigningKey::generate().expect("key");
    let (other, _) = SigningKey::generate().expect("key");
    let config = KeyringConfig {
        key: vec![TrustedKeyConfig {
            name: "planner".into(),
            public_key: public_key_text(&key.public_key()),
            zones: vec!["*".into()],
            authors: vec!["planner:*".into()],
        }],
    };
    store.set_keyring(Keyring::from_config(&config).expect("keyring").map(Arc::new));
    let refused = store.publish(&wide_plan(1, 100)).await;
    assert!(matches!(refused, Err(StoreError::Untrusted(_))), "an unsigned plan was published: {refused:?}");
    assert!(matches!(store.publish(&other.sign(wide_plan(1, 100))).await, Err(StoreError::Untrusted(_))));
    let first = key.sign(wide_plan(1, 100));
    store.publish(&first).await.expect("a signed plan is published");
    let second = key.sign(wide_plan(2, 100));
    let delta = PlanDelta::between(first.plan(), &second).expect("delta");
    let mut forged = delta.clone();
    forged.changes.values_mut().for_each(|entry| *entry = crate::changes::PlanEntry::Serve(endpoint(99)));
    assert!(matches!(store.publish_changes(&forged, None).await, Err(StoreError::Untrusted(_))), "changes not the signed plan's");
    store.publish_changes(&delta, None).await.expect("signed changes are published");
    assert_eq!(store.plan(Generation(2)).await.expect("read"), second);
    let envelope = store.plan_envelope(Generation(2)).await.expect("envelope");
    assert_eq!(codec::decode_plan(&envelope).expect("decodes").signature(), second.signature());
}

/// Inside `off_runtime` a store call runs on the thread that runs the future (no handoff);
/// outside, on a blocking thread of its own, and the runtime's thread is free meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_calls_run_inline_only_inside_off_runtime() {
    let here = || std::thread::current().id();
    let (caller, call) =
        super::off_runtime(async move { (here(), super::on_blocking_thread(here).await.expect("a call")) }).await.expect("the future ran");
    assert_eq!(caller, call, "a call inside off_runtime was handed to another thread");
    let outside = super::on_blocking_thread(here).await.expect("a call");
    assert_ne!(here(), outside, "a call outside off_runtime ran on the runtime's thread");
    // The flag does not stay on the blocking threads once their future is done.
    for _ in 0..4 {
        let flagged = tokio::task::spawn_blocking(|| super::OFF_RUNTIME.with(std::cell::Cell::get)).await.expect("joined");
        assert!(!flagged, "a blocking thread kept running store calls inline after its future");
    }
}
