//! The process-level harness: a real `dnsplan-authority` and three real `dnsplan-enactor`
//! processes on loopback, a scripted plan publisher, faults (SIGKILL and restart, SIGSTOP and
//! SIGCONT, plan storms), and the `watch` prober and observer judging the whole run.
//!
//! Every loop is bounded by the run's duration and a count, and every random choice comes
//! from the run's seed.

use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{EndpointName, Generation, Store, ValidatedPlan};
use dnsplan_tests::daemon::Daemon;
use dnsplan_tests::fixtures::{self, name, planner};
use dnsplan_tests::ports::free_port;
use dnsplan_tests::watch::{self, CheckOptions, Watcher};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "chaos-harness-token-0123456789";
/// Most faults one run injects, whatever its duration.
pub const FAULTS_MAX: u32 = 200;
/// Most plans one run publishes.
pub const PLANS_MAX: u64 = 5_000;
/// How long the stack may take to converge once faults stop.
pub const CONVERGE_WITHIN: Duration = Duration::from_secs(30);

/// Where the binaries are: by default next to `dnsplan-chaos` itself (cargo builds them all
/// into one directory).
#[derive(Clone, Debug)]
pub struct Bins {
    pub authority: PathBuf,
    pub enactor: PathBuf,
    pub planner: PathBuf,
}

impl Bins {
    pub fn in_dir(dir: &Path) -> anyhow::Result<Bins> {
        let bins =
            Bins { authority: dir.join("dnsplan-authority"), enactor: dir.join("dnsplan-enactor"), planner: dir.join("dnsplan-planner") };
        for b in [&bins.authority, &bins.enactor, &bins.planner] {
            anyhow::ensure!(
                b.exists(),
                "{} is missing; build the workspace first (cargo build --workspace) or pass --bin-dir",
                b.display()
            );
        }
        Ok(bins)
    }
}

/// What a run reports.
#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub scenario: String,
    pub seed: u64,
    pub unsafe_naive: bool,
    pub duration_ms: u64,
    pub answers_checked: usize,
    pub snapshots_checked: usize,
    pub plans_published: u64,
    pub faults: BTreeMap<String, u32>,
    pub converged: bool,
    pub violations: Vec<String>,
}

impl Report {
    pub fn fault(&mut self, kind: &str) {
        *self.faults.entry(kind.to_owned()).or_default() += 1;
    }

    /// A few lines for a person.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let mut out = format!(
            "{}: seed {}, {:.1} s, {} answers and {} snapshots checked, {} plans, faults: {}, converged: {}, violations: {}",
            self.scenario,
            self.seed,
            self.duration_ms as f64 / 1_000.0,
            self.answers_checked,
            self.snapshots_checked,
            self.plans_published,
            if faults.is_empty() { "none".into() } else { faults.join(", ") },
            if self.converged { "yes" } else { "NO" },
            self.violations.len()
        );
        // Grouped by kind, a few examples each, so that no kind hides behind another.
        let kinds = [
            ("empty answer", "no address"),
            ("no answer", "got no answer"),
            ("unpublished data", "no published plan"),
            ("backwards", "went back"),
            ("active plan deleted", "which was deleted"),
            ("deleted plan served", "after it was deleted"),
            ("records vanished", "now has none"),
            ("not converged", "did not converge"),
            ("acknowledged write lost", "acknowledged write lost"),
            ("last state not kept while cut off", "not its last state"),
            ("no catch-up after the heal", "did not catch up after the heal"),
            ("storm stalled", "the storm stalled"),
        ];
        // A secondary's violations (`race::SECONDARY_PREFIX`) apart from the authority's.
        for (place, on_secondary) in [("", false), (" on the secondary", true)] {
            for (kind, marker) in kinds {
                let found: Vec<&String> = self
                    .violations
                    .iter()
                    .filter(|v| v.starts_with(crate::race::SECONDARY_PREFIX) == on_secondary && v.contains(marker))
                    .collect();
                if found.is_empty() {
                    continue;
                }
                out.push_str(&format!("\n  {kind}{place}: {}", found.len()));
                for v in found.iter().take(2) {
                    out.push_str(&format!("\n    {v}"));
                }
            }
        }
        // Any other violation (a step that failed, a judge that could not judge), in full.
        let other: Vec<&String> = self.violations.iter().filter(|v| kinds.iter().all(|(_, marker)| !v.contains(marker))).collect();
        if !other.is_empty() {
            out.push_str(&format!("\n  other: {}", other.len()));
            for v in other.iter().take(4) {
                out.push_str(&format!("\n    {v}"));
            }
        }
        out
    }
}

/// A real stack on loopback: one authority, three enactors, fixed ports so that restarts
/// come back where clients expect them.
pub struct Stack {
    /// Between the enactors and the control API, when the scenario wants one.
    pub proxy: Option<crate::proxy::Proxy>,
    dir: tempfile::TempDir,
    bins: Bins,
    pub dns: SocketAddr,
    pub control: String,
    authority: Option<Daemon>,
    enactors: Vec<(String, Option<Daemon>)>,
}

impl Stack {
    pub async fn start(bins: Bins, with_proxy: bool) -> anyhow::Result<Stack> {
        let dir = tempfile::tempdir()?;
        let (dns_port, control_port) = (free_port()?, free_port()?);
        let dns: SocketAddr = format!("127.0.0.1:{dns_port}").parse()?;
        let control = format!("http://127.0.0.1:{control_port}");
        let proxy = if with_proxy { Some(crate::proxy::Proxy::start(format!("127.0.0.1:{control_port}").parse()?).await?) } else { None };
        let enactor_store = proxy.as_ref().map(|p| format!("http://{}", p.addr)).unwrap_or_else(|| control.clone());
        let authority_text = dnsplan_tests::stack::authority_config_text(&dir.path().join("data"))
            .replacen("listen = [\"127.0.0.1:0\"]", &format!("listen = [\"{dns}\"]"), 1)
            .replacen("listen = \"127.0.0.1:0\"", &format!("listen = \"127.0.0.1:{control_port}\""), 1)
            .replace(dnsplan_tests::stack::TOKEN, TOKEN);
        std::fs::write(dir.path().join("authority.toml"), authority_text)?;
        let enactor_text = format!(
            "id = \"x\"\nzone = \"x\"\n[store]\nurl = \"{enactor_store}\"\ntoken = \"{TOKEN}\"\n[apply]\nreconcile_interval_secs = 1\nretry_base_ms = 5\nretry_max_ms = 200\ncall_timeout_ms = 2000\n# Fixture plans replace every address.\nmax_removal_fraction = 1.0\n[cleanup]\nretain_plans = 50\n[verify]\nenabled = true\ndns_server = \"{dns}\"\ntimeout_ms = 2000\n[metrics]\nlisten = \"127.0.0.1:0\"\n"
        );
        std::fs::write(dir.path().join("enactor.toml"), enactor_text)?;
        let mut stack = Stack {
            proxy,
            dir,
            bins,
            dns,
            control,
            authority: None,
            enactors: ["a", "b", "c"].iter().map(|z| (z.to_string(), None)).collect(),
        };
        stack.start_authority()?;
        for i in 0..stack.enactors.len() {
            stack.start_enactor(i)?;
        }
        Ok(stack)
    }

    /// Starts the authority and returns once it says where it listens. Like a supervisor,
    /// tries again (three times in all) if it exits at once; the last error carries its log.
    pub fn start_authority(&mut self) -> anyhow::Result<()> {
        let mut last = None;
        for _ in 0..3 {
            match self.start_authority_once() {
                Ok(()) => return Ok(()),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("the authority did not start")))
    }

    fn start_authority_once(&mut self) -> anyhow::Result<()> {
        let log_path = self.dir.path().join("authority.log");
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&log_path)?;
        let mut child = Command::new(&self.bins.authority)
            .arg("--config")
            .arg(self.dir.path().join("authority.toml"))
            .env_remove("DNSPLAN_TOKEN")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let ready = lines.by_ref().map_while(Result::ok).any(|l| l.starts_with("control"));
        std::thread::spawn(move || for _ in lines {});
        if !ready {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            // The last lines that are not backtrace frames: the error itself.
            let frame = |l: &&str| {
                let l = l.trim_start();
                l.starts_with("at ") || l.split_once(':').is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            };
            let tail: Vec<&str> = log.lines().rev().filter(|l| !frame(l)).take(5).collect();
            anyhow::bail!("the authority exited before serving: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" | "));
        }
        self.authority = Some(Daemon::adopt("authority", child));
        Ok(())
    }

    pub fn kill_authority(&mut self) {
        self.authority = None; // Drop sends SIGKILL and reaps.
    }

    pub fn start_enactor(&mut self, i: usize) -> anyhow::Result<()> {
        let zone = self.enactors[i].0.clone();
        let child = Command::new(&self.bins.enactor)
            .arg("--config")
            .arg(self.dir.path().join("enactor.toml"))
            .args(["--id", &format!("enactor-{zone}"), "--zone", &zone])
            .env_remove("DNSPLAN_TOKEN")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.enactors[i].1 = Some(Daemon::adopt(&format!("enactor-{zone}"), child));
        Ok(())
    }

    pub fn kill_enactor(&mut self, i: usize) {
        self.enactors[i].1 = None;
    }

    pub fn signal_enactor(&self, i: usize, signal: &str) -> anyhow::Result<()> {
        match &self.enactors[i].1 {
            Some(p) => p.signal(signal),
            None => Ok(()),
        }
    }

    pub fn store(&self) -> anyhow::Result<RemoteStore> {
        Ok(RemoteStore::new(&self.control, Some(TOKEN.into()))?)
    }
}

/// The scripted planner: publishes fixture plans for `names`, remembering each.
pub struct Publisher {
    store: RemoteStore,
    names: Vec<EndpointName>,
    pub published: BTreeMap<Generation, ValidatedPlan>,
}

impl Publisher {
    pub fn new(store: RemoteStore, names: Vec<EndpointName>) -> Publisher {
        Publisher { store, names, published: BTreeMap::new() }
    }

    /// Publishes the next plan; transient store errors (the authority restarting) are retried
    /// by the caller's next call.
    pub async fn publish_next(&mut self) -> anyhow::Result<Option<Generation>> {
        if self.published.len() as u64 >= PLANS_MAX {
            return Ok(None);
        }
        let latest = match self.store.latest().await {
            Ok(l) => l,
            Err(_) => return Ok(None),
        };
        let plan = fixtures::plan(latest.0 + 1, &self.names, planner());
        match self.store.publish(&plan).await {
            Ok(()) => {
                let g = plan.generation();
                self.published.insert(g, plan);
                Ok(Some(g))
            }
            Err(dnsplan_common::StoreError::Unavailable(_) | dnsplan_common::StoreError::Conflict { .. }) => Ok(None),
            Err(err) => Err(err.into()),
        }
    }
}

/// The faults of a process scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Faults {
    /// SIGKILL a random enactor and start it again.
    EnactorKill,
    /// SIGKILL the authority and start it again on the same ports and data.
    AuthorityKill,
    /// Plans as fast as the store takes them, with a random enactor frozen (SIGSTOP) and
    /// thawed (SIGCONT) now and then.
    Storm,
    /// The enactors reach the store through a fault proxy that delays and partitions them.
    Partition,
}

/// Runs a process scenario for `duration`, then stops the faults and checks convergence and
/// the whole history.
pub async fn run_processes(bins: Bins, faults: Faults, scenario: &str, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: scenario.into(), seed, ..Report::default() };
    let mut stack = Stack::start(bins, faults == Faults::Partition).await?;
    let names: Vec<EndpointName> = (0..6).map(|i| name(&format!("svc{i}"))).collect();
    let store = stack.store()?;
    let mut publisher = Publisher::new(store.clone(), names.clone());
    // A first plan, served before the prober starts: from then on every name must answer.
    let deadline = Instant::now() + CONVERGE_WITHIN;
    while publisher.published.is_empty() {
        anyhow::ensure!(Instant::now() < deadline, "the first plan could not be published");
        publisher.publish_next().await?;
    }
    converge(&store, &names, *publisher.published.keys().last().unwrap_or(&Generation(1))).await?;
    // The store converged; the authority follows it a moment later.
    let watcher = Watcher::start_caught_up(stack.dns, fixtures::dns_zone(), names.clone(), store.clone()).await?;

    let end = started + duration;
    let mut frozen: Option<usize> = None;
    let mut faults_done = 0;
    while Instant::now() < end && faults_done < FAULTS_MAX {
        publisher.publish_next().await?;
        let wait = match faults {
            Faults::Storm => Duration::ZERO,
            _ => Duration::from_millis(rng.random_range(30..150)),
        };
        // Pace (not synchronise): the fault schedule is part of the scenario.
        tokio::time::sleep(wait).await;
        if rng.random_range(0..4) != 0 {
            continue;
        }
        faults_done += 1;
        match faults {
            Faults::EnactorKill => {
                let i = rng.random_range(0..3);
                stack.kill_enactor(i);
                stack.start_enactor(i)?;
                report.fault("enactor SIGKILL+restart");
            }
            Faults::AuthorityKill => {
                stack.kill_authority();
                report.fault("authority SIGKILL+restart");
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..200))).await;
                stack.start_authority()?;
            }
            Faults::Partition => {
                let proxy = stack.proxy.as_ref().ok_or_else(|| anyhow::anyhow!("partition needs the proxy"))?;
                // A cycle, so that every run sees each fault: partition, heal, one way, heal,
                // reset, heal, delay, heal, ...
                let mode = match faults_done % 8 {
                    1 => crate::proxy::Mode::Partition,
                    3 => crate::proxy::Mode::OneWay,
                    5 => crate::proxy::Mode::Reset,
                    7 => crate::proxy::Mode::Delay(Duration::from_millis(rng.random_range(10..300))),
                    _ => crate::proxy::Mode::Pass,
                };
                proxy.set(mode);
                report.fault(match mode {
                    crate::proxy::Mode::Partition => "partition enactors from the store",
                    crate::proxy::Mode::OneWay => "one-way partition (answers lost)",
                    crate::proxy::Mode::Reset => "reset enactors' connections",
                    crate::proxy::Mode::Delay(_) => "delay enactors' store calls",
                    crate::proxy::Mode::Pass => "heal the network",
                });
            }
            Faults::Storm => match frozen.take() {
                Some(i) => {
                    stack.signal_enactor(i, "-CONT")?;
                    report.fault("enactor SIGCONT");
                }
                None => {
                    let i = rng.random_range(0..3);
                    stack.signal_enactor(i, "-STOP")?;
                    frozen = Some(i);
                    report.fault("enactor SIGSTOP");
                }
            },
        }
    }
    if let Some(i) = frozen {
        stack.signal_enactor(i, "-CONT")?;
    }
    if let Some(proxy) = &stack.proxy {
        proxy.set(crate::proxy::Mode::Pass);
    }
    // Faults stop: one last plan, and everything must converge to it.
    let mut last = None;
    let deadline = Instant::now() + CONVERGE_WITHIN;
    while last.is_none() && Instant::now() < deadline {
        last = publisher.publish_next().await?;
    }
    let last = last.ok_or_else(|| anyhow::anyhow!("could not publish the final plan"))?;
    report.converged = converge(&store, &names, last).await.is_ok();
    let history = watcher.stop().await?;
    let options = CheckOptions { unanswered_ok: faults == Faults::AuthorityKill };
    report.violations = watch::check_with(&history, &publisher.published, options);
    if !report.converged {
        report.violations.push(format!("did not converge to plan {last} within {CONVERGE_WITHIN:?}"));
    }
    report.answers_checked = history.answers.len();
    report.snapshots_checked = history.snapshots.len();
    report.plans_published = publisher.published.len() as u64;
    report.duration_ms = started.elapsed().as_millis() as u64;
    drop(stack);
    Ok(report)
}

/// Waits on the store's change feed until every name is active at `target` or newer.
async fn converge(store: &RemoteStore, names: &[EndpointName], target: Generation) -> anyhow::Result<()> {
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        if let Ok(version) = store.version().await {
            if let Ok(active) = store.active_all().await
                && names.iter().all(|n| active.endpoints.get(n).is_some_and(|r| r.generation >= target))
            {
                return Ok(());
            }
            let _ = store.wait_for_change(version, Duration::from_secs(2)).await;
        } else {
            // The authority is restarting; its control API comes back within a moment.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::ensure!(Instant::now() < deadline, "not converged to plan {target}");
    }
}

/// The gray-zone backends: zone a's two targets answer slowly or not at all at random (a gray,
/// partial failure), zones b and c answer at once.
async fn gray_backends(port: u16, seed: u64) -> anyhow::Result<Vec<tokio::task::JoinHandle<()>>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tasks = Vec::new();
    for (i, host) in (41..=46).enumerate() {
        let listener = tokio::net::TcpListener::bind(format!("127.0.0.{host}:{port}")).await?;
        let gray = i < 2;
        let mut rng = SmallRng::seed_from_u64(seed.wrapping_add(i as u64));
        tasks.push(tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let roll: u32 = rng.random_range(0..10);
                tokio::spawn(async move {
                    if gray && roll < 2 {
                        return; // lost: the connection closes unanswered
                    }
                    if gray && roll < 6 {
                        tokio::time::sleep(Duration::from_millis(400)).await; // slower than the check's timeout
                    }
                    let mut buf = [0u8; 1024];
                    let _ = stream.read(&mut buf).await;
                    let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nconnection: close\r\n\r\nok\n").await;
                });
            }
        }));
    }
    Ok(tasks)
}

/// `gray-zone`: a real planner checks six HTTP backends in three zones while zone a's are
/// slow and lossy. The planner must shift zone a away once and not flap, never take weight
/// from the healthy zones, and every answer must hold the invariants.
pub async fn run_gray_zone(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut report = Report { scenario: "gray-zone".into(), seed, ..Report::default() };
    let stack = Stack::start(bins.clone(), false).await?;
    let port = free_port()?;
    let backends = gray_backends(port, seed).await?;
    report.fault("zone a slow and lossy");
    let api = name("api");
    let mut planner_text = format!(
        "id = \"planner-1\"\ndns_zone = \"{zone}\"\n[store]\nurl = \"{control}\"\ntoken = \"{TOKEN}\"\n[planner]\ndecide_interval_ms = 100\nlease_ttl_ms = 2000\n[policy]\nzone_recovery_dwell_secs = 300\n[metrics]\nlisten = \"127.0.0.1:0\"\n[[endpoint]]\nname = \"{api}\"\nttl_secs = 30\ncheck = {{ kind = \"http\", port = {port}, path = \"/\", interval_ms = 250, timeout_ms = 200, rise = 2, fall = 2 }}\n",
        zone = fixtures::DNS_ZONE,
        control = stack.control,
    );
    for (i, host) in (41..=46).enumerate() {
        planner_text
            .push_str(&format!("[[endpoint.target]]\naddress = \"127.0.0.{host}\"\nzone = \"{}\"\n", ["a", "a", "b", "b", "c", "c"][i]));
    }
    let config = stack.dir.path().join("planner.toml");
    std::fs::write(&config, planner_text)?;
    let planner_log = stack.dir.path().join("planner.log");
    let planner = Daemon::adopt(
        "planner",
        Command::new(&bins.planner)
            .arg("--config")
            .arg(&config)
            .env_remove("DNSPLAN_TOKEN")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&planner_log)?)
            .spawn()?,
    );
    let store = stack.store()?;
    // The first plan: the watch starts once the name is served.
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        let version = store.version().await?;
        if store.active(&api).await?.is_some() {
            break;
        }
        if Instant::now() >= deadline {
            let log = std::fs::read_to_string(&planner_log).unwrap_or_default();
            anyhow::bail!(
                "the planner published nothing: {}",
                log.lines().filter(|l| l.contains("panicked") || l.contains("rror")).take(3).collect::<Vec<_>>().join(" | ")
            );
        }
        store.wait_for_change(version, Duration::from_secs(2)).await?;
    }
    let watcher = Watcher::start_caught_up(stack.dns, fixtures::dns_zone(), vec![api.clone()], store.clone()).await?;
    // The fault phase is the backends' own behaviour; the harness only waits it out.
    tokio::time::sleep(duration).await;
    let latest = store.latest().await?;
    report.converged = converge(&store, std::slice::from_ref(&api), latest).await.is_ok();
    let history = watcher.stop().await?;
    drop(planner);
    for b in backends {
        b.abort();
    }
    let mut published = BTreeMap::new();
    for summary in store.list(Generation::NONE, 1_000).await? {
        published.insert(summary.generation, store.plan(summary.generation).await?);
    }
    report.violations = watch::check(&history, &published);
    // Zone a shifted once, no flapping, healthy zones untouched.
    let weights = |p: &ValidatedPlan, zone: &str| -> Vec<u32> {
        p.plan()
            .endpoints
            .get(&api)
            .map(|e| e.targets.iter().filter(|t| t.zone.as_str() == zone).map(|t| t.weight).collect())
            .unwrap_or_default()
    };
    let zone_a: Vec<Vec<u32>> = published.values().map(|p| weights(p, "a")).collect();
    let changes = zone_a.windows(2).filter(|w| w[0] != w[1]).count();
    if changes > 1 {
        report.violations.push(format!("zone a's weights changed {changes} times (flapping): {zone_a:?}"));
    }
    if !zone_a.last().is_some_and(|w| w.iter().all(|x| *x == 0)) {
        report.violations.push(format!("zone a was never shifted away: {zone_a:?}"));
    }
    for zone in ["b", "c"] {
        if published.values().any(|p| weights(p, zone).contains(&0)) {
            report.violations.push(format!("a healthy zone ({zone}) lost weight"));
        }
    }
    if !report.converged {
        report.violations.push(format!("did not converge to plan {latest} within {CONVERGE_WITHIN:?}"));
    }
    report.answers_checked = history.answers.len();
    report.snapshots_checked = history.snapshots.len();
    report.plans_published = published.len() as u64;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}
