//! Health-probe benchmark: N targets (default 5,000), each an HTTP backend on its own loopback
//! address, checked by the planner's health checker (`spawn_checks`, in this process) every
//! second with a 500 ms timeout, `fall` 3 and the default `probe_concurrency` (64). Measured
//! twice, with no target hanging and with a share of them (default 10%) accepting connections
//! and never answering: the probes per second by result, and how long a target that starts
//! failing with a 500 takes to be found down (ten targets, one after the other; with `fall` 3
//! and a 1 s interval, between 2 and 3 s by construction). Printed side by side with their ratio, because only ratios travel between
//! machines. Run it through `bench/probes.sh`.
//!
//! Usage: probes-bench [TARGETS] [HANGING_PERCENT]

use anyhow::Context;
use dnsplan_common::EndpointName;
use dnsplan_planner::config::PlannerConfig;
use dnsplan_planner::decide::Health;
use dnsplan_planner::health::{HealthBook, spawn_checks};
use dnsplan_planner::metrics::{Metrics, ResultLabels};
use dnsplan_tests::backends::{Behaviour, backend};
use prometheus_client::registry::Registry;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const INTERVAL_MS: u64 = 1_000;
const TIMEOUT_MS: u64 = 500;
/// Targets that start failing, one after the other, in each round.
const FAILING: usize = 10;
/// The window probes are counted over.
const WINDOW: Duration = Duration::from_secs(5);
/// Longest wait for any one state (all targets judged, one found down, one back up).
const WAIT_MAX: Duration = Duration::from_secs(60);

struct Figures {
    /// Probes per second by result: ok, fail (a hanging target's timeout is one), inconclusive.
    probes_per_sec: [f64; 3],
    removal_p50: Duration,
    removal_max: Duration,
    lag_note: String,
}

fn address(n: usize) -> IpAddr {
    IpAddr::from([127, 0, 10 + (n / 250) as u8, (n % 250 + 1) as u8])
}

async fn until(what: &str, done: impl Fn() -> bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while !done() {
        anyhow::ensure!(started.elapsed() < WAIT_MAX, "{what} did not happen within {WAIT_MAX:?}");
        // A poll of the health book, bounded by WAIT_MAX.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(started.elapsed())
}

/// One round with `hanging` targets (the last ones) hanging.
async fn round(config: &PlannerConfig, targets: usize, hanging: usize, failing: &[Arc<AtomicBool>]) -> anyhow::Result<Figures> {
    let book = Arc::new(HealthBook::default());
    let metrics = Arc::new(Metrics::register(&mut Registry::default(), "bench"));
    let checks = spawn_checks(config, book.clone(), metrics.clone());
    let health = |n: usize| -> anyhow::Result<Option<Health>> {
        let key = (EndpointName::parse(&format!("t{n}.example.test."))?, address(n));
        Ok(book.view().get(&key).copied())
    };
    let judged = || {
        let view = book.view();
        let down = view.values().filter(|h| **h == Health::Down).count();
        let up = view.values().filter(|h| **h == Health::Up).count();
        up == targets - hanging && down == hanging
    };
    until("every target judged", judged).await?;
    let counts = || ["ok", "fail", "inconclusive"].map(|result| metrics.probes.get_or_create(&ResultLabels { result }).get() as f64);
    let (before, started) = (counts(), Instant::now());
    // The measuring window's length, not a synchronisation.
    tokio::time::sleep(WINDOW).await;
    let (after, secs) = (counts(), started.elapsed().as_secs_f64());
    let probes_per_sec = [0, 1, 2].map(|i| (after[i] - before[i]) / secs);
    let mut removals = Vec::new();
    for (n, flag) in failing.iter().enumerate() {
        flag.store(true, Ordering::SeqCst);
        removals.push(until("a failing target found down", || matches!(health(n), Ok(Some(Health::Down)))).await?);
        flag.store(false, Ordering::SeqCst);
        until("a failing target back up", || matches!(health(n), Ok(Some(Health::Up)))).await?;
    }
    removals.sort();
    let lag_note = format!("{} probes in flight, {} slow targets", metrics.probes_in_flight.get(), metrics.probe_slow_targets.get());
    drop(checks);
    Ok(Figures { probes_per_sec, removal_p50: removals[removals.len() / 2], removal_max: removals[removals.len() - 1], lag_note })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let targets: usize = args.next().map(|a| a.parse().context("TARGETS must be a number")).transpose()?.unwrap_or(5_000);
    let percent: usize = args.next().map(|a| a.parse().context("HANGING_PERCENT must be a number")).transpose()?.unwrap_or(10);
    anyhow::ensure!((FAILING + 1..=50_000).contains(&targets), "TARGETS must be between {} and 50000", FAILING + 1);
    anyhow::ensure!(percent < 90, "HANGING_PERCENT must be below 90");
    dnsplan_common::open_files::raise_to_hard();
    let hanging = targets * percent / 100;
    let failing: Vec<Arc<AtomicBool>> = (0..FAILING).map(|_| Arc::new(AtomicBool::new(false))).collect();
    let hang = Arc::new(AtomicBool::new(false));
    let mut port = 0;
    for n in 0..targets {
        let (behaviour, switch) = match n {
            n if n < FAILING => (Behaviour::FailsLater, failing[n].clone()),
            n if n >= targets - hanging => (Behaviour::HangsLater, hang.clone()),
            _ => (Behaviour::Ok, hang.clone()),
        };
        port = backend(address(n), port, behaviour, switch).await.with_context(|| format!("a backend on {}", address(n)))?;
    }
    let mut text = "id = \"bench\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:1\"\n".to_string();
    for n in 0..targets {
        text.push_str(&format!(
            "[[endpoint]]\nname = \"t{n}.example.test.\"\nttl_secs = 30\ncheck = {{ kind = \"http\", port = {port}, interval_ms = {INTERVAL_MS}, timeout_ms = {TIMEOUT_MS} }}\n[[endpoint.target]]\naddress = \"{}\"\nzone = \"a\"\n",
            address(n)
        ));
    }
    let config = PlannerConfig::parse(&text).map_err(anyhow::Error::msg)?;
    println!(
        "{targets} targets, HTTP every {INTERVAL_MS} ms, timeout {TIMEOUT_MS} ms, fall 3, probe_concurrency {}",
        config.planner.probe_concurrency.0
    );
    let calm = round(&config, targets, 0, &failing).await?;
    hang.store(true, Ordering::SeqCst);
    let hung = round(&config, targets, hanging, &failing).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!("{:<44}{:>12}{:>14}{:>8}", "", "no hang", format!("{percent}% hang"), "ratio");
    for (i, what) in ["probes/s ok (answering targets)", "probes/s failed (hanging: timed out)", "probes/s inconclusive"].iter().enumerate()
    {
        let ratio =
            if calm.probes_per_sec[i] > 0.0 { format!("{:.2}", hung.probes_per_sec[i] / calm.probes_per_sec[i]) } else { "-".into() };
        println!("{what:<44}{:>12.0}{:>14.0}{ratio:>8}", calm.probes_per_sec[i], hung.probes_per_sec[i]);
    }
    println!(
        "{:<44}{:>12.0}{:>14.0}{:>8.2}",
        "  expected ok (one per interval each)",
        targets as f64 * 1000.0 / INTERVAL_MS as f64,
        (targets - hanging) as f64 * 1000.0 / INTERVAL_MS as f64,
        (targets - hanging) as f64 / targets as f64
    );
    println!(
        "{:<44}{:>10.0}ms{:>12.0}ms{:>8.2}",
        "a failing target found down, p50",
        ms(calm.removal_p50),
        ms(hung.removal_p50),
        ms(hung.removal_p50) / ms(calm.removal_p50)
    );
    println!(
        "{:<44}{:>10.0}ms{:>12.0}ms{:>8.2}",
        format!("  max of {FAILING}"),
        ms(calm.removal_max),
        ms(hung.removal_max),
        ms(hung.removal_max) / ms(calm.removal_max)
    );
    println!("at the end: no hang {}; {percent}% hang {}", calm.lag_note, hung.lag_note);
    Ok(())
}
