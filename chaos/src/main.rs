//! `dnsplan-chaos run SCENARIO|all [--seed N] [--duration SECS] [--unsafe-naive] [--report FILE]`
//!
//! Exit 0 when every scenario kept every invariant (with `--unsafe-naive`: when the harness
//! caught the 2025 behaviour); 1 otherwise; 2 on bad usage, and for `--unsafe-naive` in a build
//! without the naive enactor (feature `unsafe-naive`; test builds have it).

use clap::{Parser, Subcommand, ValueEnum};
use dnsplan_chaos::harness::{self, Bins, Faults, Report};
use dnsplan_chaos::{etcd, race};
use dnsplan_enactor::hooks::Behaviour;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(version, about = "dnsplan's chaos harness: real processes, real faults, every answer checked")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a scenario (or all of them in turn).
    Run {
        scenario: Scenario,
        /// Every random choice derives from it; a failure prints it.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Fault phase of each process scenario, in seconds.
        #[arg(long, default_value_t = 10)]
        duration: u64,
        /// Run the 2025 behaviour instead (aws-2025-race, aws-2025-race-secondary and
        /// aws-2025-race-etcd only; on etcd the 2025 store is written on etcd too);
        /// succeed only if it is caught.
        /// Needs a build with feature `unsafe-naive`.
        #[arg(long)]
        unsafe_naive: bool,
        /// Also write the reports as JSON here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Where dnsplan-authority, dnsplan-enactor and dnsplan-planner are (default: next to this binary).
        #[arg(long)]
        bin_dir: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Scenario {
    /// The incident's exact sequence, deterministic, on the real authority.
    #[value(name = "aws-2025-race")]
    Aws2025Race,
    /// The same race with a Knot secondary fed by NOTIFY and zone transfer (TSIG), watched
    /// and judged as the authority is. Needs `knotd` (Debian package knot).
    #[value(name = "aws-2025-race-secondary")]
    Aws2025RaceSecondary,
    /// The same race on a three-member etcd cluster (the `etcd` binary, Debian package
    /// etcd-server).
    #[value(name = "aws-2025-race-etcd")]
    Aws2025RaceEtcd,
    /// Two authorities and three enactors on a three-member etcd cluster: the etcd leader
    /// SIGKILLed during a plan storm and restarted, again and again.
    EtcdLeaderKill,
    /// Two authorities and three enactors on a three-member etcd cluster: an etcd follower
    /// SIGKILLed and kept down during a plan storm; no publish, read or control API call may fail.
    EtcdMemberDown,
    /// Two authorities and three enactors on etcd: every etcd member SIGKILLed, then one
    /// authority SIGKILLed a moment later and restarted during the outage; it must never
    /// answer older than it did before the kill.
    EtcdCrashInOutage,
    /// Two authorities and three enactors on etcd: one authority partitioned from etcd by a
    /// fault proxy (cut, one way, reset, delayed) keeps its last state and catches up after the heal.
    EtcdPartition,
    /// Enactors SIGKILLed and restarted while plans keep coming.
    EnactorKillLoop,
    /// The authority SIGKILLed and restarted on its own data.
    AuthorityKill9,
    /// Plans as fast as possible, with enactors frozen and thawed.
    PlannerStorm,
    /// Enactors delayed and partitioned from the store by a TCP fault proxy.
    Partition,
    /// One zone's backends slow and lossy: the planner shifts the zone once and does not flap.
    GrayZone,
    All,
}

/// `naive` is the 2025 enactor for `--unsafe-naive`, `None` for the fenced runs.
async fn run_one(
    scenario: Scenario,
    seed: u64,
    duration: Duration,
    naive: Option<Behaviour>,
    bins: &Option<Bins>,
) -> anyhow::Result<Report> {
    let bins = || bins.clone().ok_or_else(|| anyhow::anyhow!("process scenarios need the binaries (see --bin-dir)"));
    match scenario {
        Scenario::Aws2025Race | Scenario::Aws2025RaceSecondary | Scenario::Aws2025RaceEtcd => {
            let started = Instant::now();
            let (name, secondaries) = match scenario {
                Scenario::Aws2025RaceSecondary => ("aws-2025-race-secondary", race::Secondaries::Knot),
                Scenario::Aws2025RaceEtcd => ("aws-2025-race-etcd", race::Secondaries::None),
                _ => ("aws-2025-race", race::Secondaries::None),
            };
            let outcome = if scenario == Scenario::Aws2025RaceEtcd {
                etcd::run_race(naive).await?
            } else if let Some(naive) = naive {
                race::race_with(dnsplan_tests::naive::NaiveStore::as_in_2025(), naive, secondaries).await?
            } else {
                let dir = tempfile::tempdir()?;
                race::race_with(dnsplan_common::SledStore::open(dir.path())?, Behaviour::Fenced, secondaries).await?
            };
            let mut report = Report {
                scenario: name.into(),
                seed,
                unsafe_naive: naive.is_some(),
                answers_checked: outcome.answers + outcome.secondary.as_ref().map_or(0, |s| s.answers),
                snapshots_checked: outcome.snapshots,
                plans_published: outcome.plans as u64,
                converged: outcome.converged.is_ok(),
                violations: outcome.violations,
                ..Report::default()
            };
            report.fault("enactor held before its write");
            if let Err(e) = outcome.converged {
                report.violations.push(e);
            }
            if let Some(secondary) = outcome.secondary {
                report.fault("secondary following by zone transfer");
                report.converged &= secondary.converged.is_ok();
                report.violations.extend(secondary.violations);
                if let Err(e) = secondary.converged {
                    report.violations.push(e);
                }
            }
            report.duration_ms = started.elapsed().as_millis() as u64;
            Ok(report)
        }
        Scenario::EnactorKillLoop => harness::run_processes(bins()?, Faults::EnactorKill, "enactor-kill-loop", seed, duration).await,
        Scenario::AuthorityKill9 => harness::run_processes(bins()?, Faults::AuthorityKill, "authority-kill9", seed, duration).await,
        Scenario::PlannerStorm => harness::run_processes(bins()?, Faults::Storm, "planner-storm", seed, duration).await,
        Scenario::Partition => harness::run_processes(bins()?, Faults::Partition, "partition", seed, duration).await,
        Scenario::GrayZone => harness::run_gray_zone(bins()?, seed, duration).await,
        Scenario::EtcdLeaderKill => etcd::run_leader_kill(bins()?, seed, duration).await,
        Scenario::EtcdMemberDown => etcd::run_member_down(bins()?, seed, duration).await,
        Scenario::EtcdCrashInOutage => etcd::run_crash_in_outage(bins()?, seed, duration).await,
        Scenario::EtcdPartition => etcd::run_partition(bins()?, seed, duration).await,
        Scenario::All => unreachable_all(),
    }
}

fn unreachable_all() -> anyhow::Result<Report> {
    anyhow::bail!("`all` is expanded before running")
}

fn main() -> ExitCode {
    let Cmd::Run { scenario, seed, duration, unsafe_naive, report, bin_dir } = Cli::parse().command;
    let scenarios = match scenario {
        Scenario::All if unsafe_naive => vec![Scenario::Aws2025Race, Scenario::Aws2025RaceSecondary, Scenario::Aws2025RaceEtcd],
        Scenario::All => vec![
            Scenario::Aws2025Race,
            Scenario::Aws2025RaceSecondary,
            Scenario::EnactorKillLoop,
            Scenario::AuthorityKill9,
            Scenario::PlannerStorm,
            Scenario::Partition,
            Scenario::GrayZone,
            Scenario::Aws2025RaceEtcd,
            Scenario::EtcdLeaderKill,
            Scenario::EtcdMemberDown,
            Scenario::EtcdCrashInOutage,
            Scenario::EtcdPartition,
        ],
        s if unsafe_naive && !matches!(s, Scenario::Aws2025Race | Scenario::Aws2025RaceSecondary | Scenario::Aws2025RaceEtcd) => {
            eprintln!("error: --unsafe-naive applies to aws-2025-race, aws-2025-race-secondary and aws-2025-race-etcd only");
            return ExitCode::from(2);
        }
        s => vec![s],
    };
    let naive = match (unsafe_naive, Behaviour::NAIVE_2025) {
        (false, _) => None,
        (true, Some(naive)) => Some(naive),
        (true, None) => {
            eprintln!(
                "error: --unsafe-naive needs the naive 2025 enactor, which this build leaves out; \
                 build with `cargo build -p dnsplan-chaos --features unsafe-naive`"
            );
            return ExitCode::from(2);
        }
    };
    let dir = bin_dir.or_else(|| std::env::current_exe().ok().and_then(|p| p.parent().map(PathBuf::from)));
    let bins = dir.and_then(|d| Bins::in_dir(&d).ok());
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the runtime: {err}");
            return ExitCode::from(1);
        }
    };
    let mut reports = Vec::new();
    let mut ok = true;
    for s in scenarios {
        match runtime.block_on(run_one(s, seed, Duration::from_secs(duration), naive, &bins)) {
            Ok(report) => {
                println!("{}", report.summary());
                let caught = !report.violations.is_empty();
                if caught != unsafe_naive {
                    ok = false;
                    println!("  FAILED (seed {seed}){}", if unsafe_naive { ": the 2025 behaviour was NOT caught" } else { "" });
                }
                reports.push(report);
            }
            Err(err) => {
                ok = false;
                println!("{s:?}: could not run (seed {seed}): {err:#}");
            }
        }
    }
    if let Some(path) = report {
        match serde_json::to_string_pretty(&reports) {
            Ok(text) => {
                if let Err(err) = std::fs::write(&path, text) {
                    eprintln!("error: cannot write {}: {err}", path.display());
                    ok = false;
                }
            }
            Err(err) => eprintln!("error: {err}"),
        }
    }
    if ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
}
