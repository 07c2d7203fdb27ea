//! A planner whose own process runs out of file descriptors: every probe fails with EMFILE
//! on the checker's side, which says nothing about the targets. Their health becomes unknown
//! and no plan is published.
//!
//! Without the distinction (EMFILE counted as a failed check), every target goes down, the
//! endpoint with one really dead target fails open and the planner publishes a plan that puts
//! the dead target back (seen once). This test is alone in its binary: it lowers the
//! process's descriptor limit.

use dnsplan_common::{SledStore, Store};
use dnsplan_planner::health::{HealthBook, spawn_checks};
use dnsplan_planner::metrics::{KindLabels, Metrics, PROBE_RESULTS, ResultLabels};
use dnsplan_planner::{Planner, PlannerConfig};
use nix::sys::resource::{Resource, getrlimit, setrlimit};
use prometheus_client::registry::Registry;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod support;

use support::{Backends, WITHIN, config_text, wait_plan, weight};

/// The soft descriptor limit while exhausted: above what the test process already holds.
const EXHAUSTED_LIMIT: u64 = 512;

/// Polls a counter until `done`, within the deadline.
async fn until(what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    while !done() {
        anyhow::ensure!(Instant::now() < deadline, "{what} did not happen within {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_out_of_descriptors_publishes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let mut backends = Backends::start().await?;
    let config = Arc::new(PlannerConfig::parse(&config_text(backends.port, "")).map_err(anyhow::Error::msg)?);
    let targets = config.endpoints().map(|e| e.targets.len()).sum::<usize>() as u64;
    let metrics = Arc::new(Metrics::register(&mut Registry::default(), &config.id));
    let book = Arc::new(HealthBook::default());
    let _checks = spawn_checks(&config, book.clone(), metrics.clone());
    let planner = Planner::new(store.clone(), config, book, metrics.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(planner.run(async move {
        let _ = stopped.await;
    }));

    // One target really dead: removed by a plan.
    wait_plan(&store, |p| weight(p, "api.example.test.", "127.0.1.1") == Some(1)).await?;
    backends.stop("127.0.1.1")?;
    let removed = wait_plan(&store, |p| weight(p, "api.example.test.", "127.0.1.1") == Some(0)).await?;

    // Exhaust the process's descriptors. Probes in flight hold a few when the limit is reached
    // and give them back when they end: each poll below takes every one that is free again, or
    // probes would go on using them and the window would last seconds instead of a few probes.
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    setrlimit(Resource::RLIMIT_NOFILE, EXHAUSTED_LIMIT.min(hard), hard)?;
    let mut held = Vec::new();
    let mut hold_every_free = || loop {
        match std::fs::File::open("/dev/null") {
            Ok(file) => held.push(file),
            Err(err) => break err,
        }
    };
    let exhausted = hold_every_free();
    let probes = |result| metrics.probes.get_or_create(&ResultLabels { result }).get();
    let decisions = || ["no_change", "publish"].map(|kind| metrics.decisions.get_or_create(&KindLabels { kind }).get()).iter().sum::<u64>();
    let result = async {
        anyhow::ensure!(exhausted.raw_os_error() == Some(nix::errno::Errno::EMFILE as i32), "not EMFILE: {exhausted}");
        // Every target probed three times while exhausted, and the planner decided since.
        // Probes already connected when the descriptors ran out may still end as `fail`; the
        // ones that start now cannot open a socket, and each must be `inconclusive`.
        let before = probes("inconclusive");
        until("inconclusive probes while exhausted", || {
            hold_every_free();
            probes("inconclusive") >= before + 3 * targets
        })
        .await?;
        let decided = decisions();
        until("three more decisions", || {
            hold_every_free();
            decisions() >= decided + 3
        })
        .await?;
        anyhow::Ok(())
    }
    .await;
    anyhow::ensure!(held.len() as u64 <= EXHAUSTED_LIMIT, "held {} files under a limit of {EXHAUSTED_LIMIT}", held.len());
    drop(held);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard)?;
    result?;
    let latest = store.latest().await?;
    if latest != removed.generation() {
        // What was published and why, and what the probes said: a failure names its cause.
        let mut published = Vec::new();
        let mut generation = removed.generation();
        while let Some(next) = generation.next().filter(|g| *g <= latest) {
            let plan = store.plan(next).await?;
            published.push(format!("plan {next}: {} {:?}", plan.plan().reason, plan.plan().provenance));
            generation = next;
        }
        let counts = PROBE_RESULTS.map(|result| format!("{result} {}", probes(result)));
        anyhow::bail!(
            "a plan was published while the planner could not check anything: {}; probes: {}",
            published.join("; "),
            counts.join(", ")
        );
    }

    let _ = stop.send(());
    task.await?;
    Ok(())
}
