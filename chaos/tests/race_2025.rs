//! The October 2025 race, end to end on the real authority (see `dnsplan_chaos::race`): the
//! fenced stack survives it; the 2025 behaviour is caught by the same checker.
//!
//! Removing the store's fence comparison and its refusal of cleaned-up generations once made
//! the fenced test fail ("e0's active generation went back from 12 to 2", "active at plan 2,
//! which was deleted").

use dnsplan_chaos::race::{names, race};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_2025_behaviour_is_caught() -> anyhow::Result<()> {
    let outcome = race(NaiveStore::as_in_2025(), Behaviour::Naive).await?;
    let v = &outcome.violations;
    assert!(v.iter().any(|v| v.contains("no address")), "the checker must see an empty answer: {v:#?}");
    assert!(v.iter().any(|v| v.contains("went back")), "the checker must see a generation going backwards: {v:#?}");
    assert!(v.iter().any(|v| v.contains("deleted") || v.contains("now has none")), "the checker must see the active plan deleted: {v:#?}");
    Ok(())
}
