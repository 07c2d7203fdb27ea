//! The October 2025 race, end to end on the real authority (see `dnsplan_chaos::race`): the
//! fenced stack survives it; the 2025 behaviour is caught by the same checker.
//!
//! Removing the store's fence comparison and its refusal of cleaned-up generations once made
//! the fenced test fail ("e0's active generation went back from 12 to 2", "active at plan 2,
//! which was deleted").
//!
//! The `_secondary` tests run the same story with a Knot secondary fed by zone transfer
//! (`knotd` must be installed; `.ci/run` installs it: a missing binary fails the test). Its
//! answers are judged as the authority's, and the 2025 behaviour must be caught on it too:
//! the empty answer and the older plan reach it through NOTIFY and IXFR.

use dnsplan_chaos::race::{Secondaries, names, race, race_with};
use dnsplan_common::SledStore;
use dnsplan_enactor::hooks::Behaviour;
use dnsplan_tests::naive::NaiveStore;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fenced_enactors_survive_the_2025_race() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let outcome = race(store, Behaviour::Fenced).await?;
    assert!(outcome.violations.is_empty(), "violations: {:#?}", &outcome.violations[..outcome.violations.len().min(20)]);
    assert!(outcome.answers > names().len(), "the prober must have watched the whole story ({} answers)", outcome.answers);
    // A really did try to write its old plan, and the store's fence turned it away.
    assert!(outcome.a_abandoned >= 1, "enactor a never hit the fence: the test did not exercise the race");
    outcome.converged.map_err(anyhow::Error::msg)?;
    Ok(())
}

/// The same on a three-member etcd cluster (`EtcdStore`): A's stale write is turned away by
/// etcd's transaction, and the naive enactor on the 2025 store on etcd is caught.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fenced_enactors_survive_the_2025_race_on_etcd_and_the_naive_ones_are_caught() -> anyhow::Result<()> {
    let outcome = dnsplan_chaos::etcd::run_race(None).await?;
    assert!(outcome.violations.is_empty(), "violations: {:#?}", &outcome.violations[..outcome.violations.len().min(20)]);
    assert!(outcome.a_abandoned >= 1, "enactor a never hit the fence on etcd: the test did not exercise the race");
    outcome.converged.map_err(anyhow::Error::msg)?;
    let naive = dnsplan_chaos::etcd::run_race(Some(Behaviour::Naive)).await?;
    let v = &naive.violations;
    assert!(v.iter().any(|v| v.contains("no address")), "the checker must see an empty answer on etcd: {v:#?}");
    assert!(v.iter().any(|v| v.contains("went back")), "the checker must see a generation going backwards on etcd: {v:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_2025_behaviour_is_caught() -> anyhow::Result<()> {
    let outcome = race(NaiveStore::as_in_2025(), Behaviour::Naive).await?;
    let v = &outcome.violations;
    assert!(v.iter().any(|v| v.contains("no address")), "the checker must see an empty answer: {v:#?}");
    assert!(v.iter().any(|v| v.contains("went back")), "the checker must see a generation going backwards: {v:#?}");
    assert!(v.iter().any(|v| v.contains("deleted") || v.contains("now has none")), "the checker must see the active plan deleted: {v:#?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_knot_secondary_survives_the_2025_race_secondary() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let outcome = race_with(store, Behaviour::Fenced, Secondaries::Knot).await?;
    assert!(outcome.violations.is_empty(), "violations: {:#?}", &outcome.violations[..outcome.violations.len().min(20)]);
    assert!(outcome.a_abandoned >= 1, "enactor a never hit the fence: the test did not exercise the race");
    outcome.converged.map_err(anyhow::Error::msg)?;
    let secondary = outcome.secondary.ok_or_else(|| anyhow::anyhow!("the race ran without its secondary"))?;
    let v = &secondary.violations;
    assert!(v.is_empty(), "violations on the secondary: {:#?}\n{}", &v[..v.len().min(20)], secondary.logs);
    assert!(secondary.answers > names().len(), "the secondary must have been watched through the story ({} answers)", secondary.answers);
    secondary.converged.map_err(|e| anyhow::anyhow!("{e}\n{}", secondary.logs))?;
    Ok(())
}

/// Teeth for the secondary: what the 2025 behaviour makes the authority serve reaches Knot by
/// zone transfer, and the same checker sees it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_2025_behaviour_is_caught_on_the_secondary() -> anyhow::Result<()> {
    let outcome = race_with(NaiveStore::as_in_2025(), Behaviour::Naive, Secondaries::Knot).await?;
    let secondary = outcome.secondary.ok_or_else(|| anyhow::anyhow!("the race ran without its secondary"))?;
    let v = &secondary.violations;
    assert!(v.iter().any(|v| v.contains("no address")), "the checker must see an empty answer on the secondary: {v:#?}");
    assert!(v.iter().any(|v| v.contains("went backwards")), "the checker must see the secondary go back to an older plan: {v:#?}");
    assert!(v.iter().any(|v| v.contains("after it was deleted")), "the checker must see the secondary serve a deleted plan: {v:#?}");
    Ok(())
}
