//! Runs the `Store` conformance suite against `SledStore` on disk, and against the naive
//! store to prove that the suite has teeth.

use dnsplan_common::SledStore;
use dnsplan_tests::conformance::{Harness, run_all};
use dnsplan_tests::naive::NaiveStore;

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
