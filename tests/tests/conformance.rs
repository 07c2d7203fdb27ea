//! Runs the `Store` conformance suite against `SledStore` on disk, and against the naive
//! store to prove that the suite has teeth.

use dnsplan_common::SledStore;
use dnsplan_common::Store;
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_tests::conformance::{Harness, run_all};
use dnsplan_tests::naive::NaiveStore;
use dnsplan_tests::zone_checks::{added_beside_a_busy_zone, make_busy, master, removal_fences_late_writes, zone, zones_are_isolated};

struct Sled {
    dir: tempfile::TempDir,
}

impl Harness for Sled {
    type S = SledStore;
    async fn fresh(&self) -> anyhow::Result<SledStore> {
        Ok(SledStore::open(tempfile::tempdir_in(self.dir.path())?.keep())?)
    }
}

struct Naive;

impl Harness for Naive {
    type S = NaiveStore;
    async fn fresh(&self) -> anyhow::Result<NaiveStore> {
        Ok(NaiveStore::default())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sled_store_passes_the_suite() -> anyhow::Result<()> {
    let report = run_all(&Sled { dir: tempfile::tempdir()? }).await?;
    assert!(report.is_clean(), "SledStore violates the Store contract:\n{report}");
    Ok(())
}

/// The teeth check: every protection the suite tests is missing from the naive store, and
/// the suite must notice each one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn naive_store_fails_the_suite() -> anyhow::Result<()> {
    let report = run_all(&Naive).await?;
    println!("{report}");
    let failed = report.failed();
    for must_fail in [
        "cleanup_is_guarded",
        "retire_releases_cleanup",
        "race_2025_sequence",
        "race_2025_concurrent",
        "racing_applies_are_monotonic",
        "racing_publishes_have_no_gaps",
        "lease_is_exclusive_and_fences_publish",
        "plan_changes_cover_every_plan_between",
        "apply_carries_the_plans_content",
        "publish_changes_is_publish",
        "publish_changes_keeps_the_rules",
        "content_changes_count_what_is_served",
    ] {
        assert!(failed.contains(must_fail), "the suite did not catch the naive store in {must_fail}:\n{report}");
    }
    Ok(())
}

/// A store whose first zone (`busy.test.`) holds a plan, is paused and has its planner lease
/// held, and whose added zone `example.test.` is what the suite gets: a pause or lease shared
/// across zones would fail the suite's publish and lease checks.
struct SledAddedZone {
    dir: tempfile::TempDir,
}

impl Harness for SledAddedZone {
    type S = SledStore;
    async fn fresh(&self) -> anyhow::Result<SledStore> {
        let root = SledStore::open(tempfile::tempdir_in(self.dir.path())?.keep())?;
        added_beside_a_busy_zone(root).await
    }
}

/// The suite on the first zone while an added zone is paused and its lease held.
struct SledFirstZone {
    dir: tempfile::TempDir,
}

impl Harness for SledFirstZone {
    type S = SledStore;
    async fn fresh(&self) -> anyhow::Result<SledStore> {
        let root = SledStore::open(tempfile::tempdir_in(self.dir.path())?.keep())?;
        let busy = zone("busy.test.");
        root.add_zone(&busy, &master(&busy)).await?;
        make_busy(&root.zone(&busy).await?, &busy).await?;
        Ok(root)
    }
}

/// Teeth: with one `meta` tree for every zone (where pause, lease, counts and the DNS zone
/// live), this test and `sled_zones_are_isolated` fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sled_zones_each_pass_the_suite_beside_a_paused_and_leased_zone() -> anyhow::Result<()> {
    let report = run_all(&SledAddedZone { dir: tempfile::tempdir()? }).await?;
    assert!(report.is_clean(), "an added zone of SledStore violates the Store contract:\n{report}");
    let report = run_all(&SledFirstZone { dir: tempfile::tempdir()? }).await?;
    assert!(report.is_clean(), "the first zone of SledStore, beside an added one, violates the Store contract:\n{report}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_zones_are_isolated() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let violations = zones_are_isolated(SledStore::open(dir.path())?, &zone("first.test.")).await?;
    assert!(violations.is_empty(), "{violations:?}");
    Ok(())
}

/// Teeth: without the checks of `Inner::guard` and `SledStore::current`, the held handle's
/// writes are refused only as "being reopened" (and one that got hold of the zone's trees
/// before the removal would land after it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sled_zone_removal_fences_late_writes_and_survives_a_restart() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let violations = removal_fences_late_writes(SledStore::open(dir.path())?).await?;
    assert!(violations.is_empty(), "{violations:?}");
    // After a restart: the zone added a third time is live, still past its plans of before;
    // a zone removed stays so.
    let root = SledStore::open(dir.path())?;
    let origin = zone("gone.zones.test.");
    let again = root.zone(&origin).await?;
    assert_eq!(again.latest().await?, dnsplan_common::Generation::NONE);
    assert_eq!(again.generation_base().await?, dnsplan_common::Generation(4));
    dnsplan_tests::zone_checks::publish_and_apply(&again, &origin, 5, &["www"]).await?;
    assert_eq!(again.latest().await?, dnsplan_common::Generation(5));
    assert!(root.remove_zone(&origin).await?);
    drop((again, root));
    let root = SledStore::open(dir.path())?;
    match root.zone(&origin).await {
        Err(dnsplan_common::StoreError::ZoneGone { .. }) => {}
        other => panic!("a removed zone opened after a restart: {:?}", other.map(|_| ())),
    }
    Ok(())
}
