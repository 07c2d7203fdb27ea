//! The scenarios on etcd: a real three-member etcd cluster on loopback (`dnsplan_tests::etcd`),
//! two `dnsplan-authority` processes and three `dnsplan-enactor` processes on it
//! (`[store] kind = "etcd"`), a storm publisher in this process, faults on etcd itself, and
//! every authority watched and judged.
//!
//! - `etcd-leader-kill`: the etcd leader is SIGKILLed during a plan storm, a new leader must be
//!   elected by the two survivors, plans must keep being acknowledged, and the killed member
//!   comes back; again and again. Judged on both authorities: no empty answer, no generation
//!   served backwards, only published data; and in the store: no acknowledged write lost (a
//!   publish the storm saw acknowledged, a plan an enactor logged as applied: every later
//!   read must show it, and every acknowledged plan is still stored or cleaned up), and no
//!   fence ever went back in etcd's whole history.
//! - `etcd-member-down`: an etcd follower (not the leader) is SIGKILLed and kept down for a
//!   while during a plan storm, again and again. With two members of three up, no call may fail
//!   because of it: every publish and read of the storm after the kill (the first a read, as a
//!   daemon's is: a write already sent to the member as it died is ambiguous), and every read
//!   through each authority's control API (`GET /v1/version`, `GET /v1/plans`) during the
//!   fault must succeed, and both authorities must serve the newest plan while the member is
//!   down. Judged as `etcd-leader-kill` besides.
//! - `etcd-crash-in-outage`: every etcd member is SIGKILLed during a plan storm, and authority
//!   a is SIGKILLed a seeded 0-50 ms after, then started again with etcd still down; again
//!   and again. Restarted, a must answer at once, never with an older state than it answered
//!   before the kill (its SOA serial at least the one it gave, and every answer judged by the
//!   watcher, which sees no generation go backwards across the restart); b serves throughout;
//!   once etcd is back both catch up. Judged as `etcd-leader-kill` besides.
//! - `etcd-partition`: authority b reaches etcd only through one fault proxy per member
//!   (`proxy`), which partitions it, drops etcd's answers (one way), resets its connections
//!   or delays them, while plans go on. While cut off, b must keep serving the last state it
//!   had (same serial, same addresses), never empty; after each heal it must catch up within
//!   `CATCH_UP_WITHIN`.
//! - `aws-2025-race-etcd` (`run_race`): the deterministic 2025 race of `race` on a store on
//!   etcd; with `--unsafe-naive`, on [`NaiveEtcdStore`], the 2025 store written on etcd.
//!
//! Every loop is bounded by a deadline and a count; every wait polls a condition with a
//! deadline; every random choice comes from the seed.

mod naive;
mod scenarios;

pub use naive::NaiveEtcdStore;
pub use scenarios::{run_crash_in_outage, run_leader_kill, run_member_down, run_partition, run_race};

use crate::harness::{Bins, CONVERGE_WITHIN, FAULTS_MAX, PLANS_MAX, Report};
use crate::proxy::{Mode, Proxy};
use crate::race;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::{ActiveRecord, ActiveState, ApplyOutcome, CleanupDecision, CleanupReport, Heartbeat, PauseState, StoreVersion};
use dnsplan_common::store::{StoreError, StoreResult, lease::Lease};
use dnsplan_common::{Endpoint, EndpointName, Generation, PlanChanges, PlanSummary, Store, ValidatedPlan};
use dnsplan_enactor::hooks::Behaviour;
use dnsplan_etcd::EtcdStore;
use dnsplan_tests::daemon::{Daemon, LogLine};
use dnsplan_tests::etcd::EtcdCluster;
use dnsplan_tests::fixtures::{self, endpoint_for, name, planner};
use dnsplan_tests::stack::authority_config_text;
use dnsplan_tests::watch::{self, Watcher};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch as channel};

/// Every key of the scenarios' store starts with it.
pub const PREFIX: &str = "/chaos/";
/// Leader kills a run makes at least, whatever its duration: "repeatedly".
pub const KILLS_MIN: u32 = 2;
/// How long the survivors may take to elect a new leader (election timeout 500 ms on the test
/// cluster; the bound is for a loaded two-core machine).
pub const ELECTION_WITHIN: Duration = Duration::from_secs(15);
/// How long one step may take: a plan acknowledged, a process started, the store converged.
pub const STEP_WITHIN: Duration = Duration::from_secs(20);
/// How long a partitioned authority may take to serve the store's state once healed (its etcd
/// client reconnects with backoff, then it reads what changed).
pub const CATCH_UP_WITHIN: Duration = Duration::from_secs(20);
/// Most reads the acknowledged-write auditor makes.
const AUDITS_MAX: u64 = 100_000;
const QUERY_TIMEOUT: Duration = Duration::from_secs(1);

/// The managed names of the etcd scenarios.
pub fn names() -> Vec<EndpointName> {
    (0..6).map(|i| name(&format!("svc{i}"))).collect()
}

fn quoted(endpoints: &[String]) -> String {
    endpoints.iter().map(|e| format!("\"{e}\"")).collect::<Vec<_>>().join(", ")
}

/// One `dnsplan-authority` process on etcd.
pub struct AuthorityProcess {
    pub who: String,
    pub dns: SocketAddr,
    /// The control API's base URL (`http://127.0.0.1:PORT`).
    pub control: String,
    pub log: PathBuf,
    _daemon: Daemon,
}

impl AuthorityProcess {
    /// Who it is and the last lines of its log, for an error that names it: a daemon that
    /// exited or stopped answering says why there.
    pub fn described(&self) -> String {
        format!("{} (its log ends: {})", self.who, log_tail(&self.log, 8))
    }
}

/// The last `lines` lines of the log at `path`, joined by " | ".
fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let tail: Vec<&str> = text.lines().rev().take(lines).collect();
    match tail.is_empty() {
        true => "nothing".into(),
        false => tail.into_iter().rev().collect::<Vec<_>>().join(" | "),
    }
}

/// Starts `dnsplan-authority` on `config`; returns once it announces its DNS address (it
/// prints it when DNS answers) and its control API (printed next).
fn start_authority(bin: &Path, config: &Path, who: &str, log: PathBuf) -> anyhow::Result<AuthorityProcess> {
    let mut child = Command::new(bin)
        .arg("--config")
        .arg(config)
        .env_remove("DNSPLAN_TOKEN")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log)?)
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let daemon = Daemon::adopt(who, child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + STEP_WITHIN;
    let mut dns = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                if let Some(addr) = line.strip_prefix("dns").and_then(|rest| rest.split_whitespace().next()) {
                    dns = Some(addr.parse()?);
                }
                if let (Some(dns), Some(control)) = (dns, line.strip_prefix("control").map(str::trim)) {
                    return Ok(AuthorityProcess { who: who.into(), dns, control: control.into(), log, _daemon: daemon });
                }
            }
            Err(_) => anyhow::bail!("{who} did not announce DNS within {STEP_WITHIN:?}: {}", log_tail(&log, 5)),
        }
    }
}

/// The storm publisher: fixture plans (whose content derives from the generation alone, so a
/// publish whose answer was lost and that is published again is the same plan).
pub struct Storm {
    store: EtcdStore,
    names: Vec<EndpointName>,
    /// Every plan a publish was attempted for: what may be served.
    pub attempted: BTreeMap<Generation, ValidatedPlan>,
    /// The publishes etcd acknowledged.
    pub acked: Vec<Generation>,
    /// The highest acknowledged generation, for the auditor and the fault loop.
    pub acked_max: Arc<AtomicU64>,
    /// Publishes refused or unanswered (etcd without a leader, a member down).
    pub refused: u64,
}

impl Storm {
    pub fn new(store: EtcdStore, names: Vec<EndpointName>) -> Storm {
        Storm { store, names, attempted: BTreeMap::new(), acked: Vec::new(), acked_max: Arc::default(), refused: 0 }
    }

    /// Publishes the next plan; `None` when etcd refused or did not answer (the caller tries
    /// again) or `PLANS_MAX` is reached.
    pub async fn publish_next(&mut self) -> anyhow::Result<Option<Generation>> {
        if self.attempted.len() as u64 >= PLANS_MAX {
            return Ok(None);
        }
        let Ok(latest) = self.store.latest().await else {
            self.refused += 1;
            return Ok(None);
        };
        let plan = fixtures::plan(latest.0 + 1, &self.names, planner());
        let g = plan.generation();
        self.attempted.entry(g).or_insert_with(|| plan.clone());
        match self.store.publish(&plan).await {
            Ok(()) => {
                self.acked.push(g);
                self.acked_max.fetch_max(g.0, Ordering::SeqCst);
                Ok(Some(g))
            }
            Err(StoreError::Unavailable(_) | StoreError::Conflict { .. }) => {
                self.refused += 1;
                Ok(None)
            }
            Err(err) => Err(anyhow::anyhow!("publishing plan {g}: {err}")),
        }
    }

    /// Publishes one plan, trying again (with a short backoff) until etcd acknowledges it.
    pub async fn publish_one(&mut self, within: Duration) -> anyhow::Result<Generation> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(g) = self.publish_next().await? {
                return Ok(g);
            }
            anyhow::ensure!(Instant::now() < deadline, "no plan acknowledged within {within:?} ({} refused)", self.refused);
            // Backoff after a refusal, not a synchronisation.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The stack on etcd: the cluster, two authorities (`a`, and `b`, through the proxies when
/// the scenario partitions it), three enactors.
pub struct EtcdStack {
    pub authorities: Vec<AuthorityProcess>,
    /// Each authority's config file, to start it again (its DNS port is fixed in it).
    authority_configs: Vec<PathBuf>,
    authority_bin: PathBuf,
    /// Which authorities were killed on purpose: their watchers' unanswered queries are not
    /// violations (a resolver asks another server).
    restarted: Vec<bool>,
    _enactors: Vec<Daemon>,
    /// One per etcd member, between authority b and that member (`etcd-partition`).
    pub proxies: Vec<Proxy>,
    /// The highest generation any enactor logged as applied (every fixture plan changes every
    /// name, so every name's fence was at or past it when the line was written).
    pub applied: Arc<AtomicU64>,
    pub store: EtcdStore,
    pub cluster: EtcdCluster,
    _dir: tempfile::TempDir,
}

impl EtcdStack {
    /// Starts the cluster and the enactors, publishes plan 1 and waits until it is applied,
    /// then starts the authorities (b through fault proxies if `proxied_b`), and returns once
    /// both serve plan 1.
    pub async fn start(bins: &Bins, names: &[EndpointName], proxied_b: bool) -> anyhow::Result<(EtcdStack, Storm)> {
        let cluster = EtcdCluster::start(3, &[]).await?;
        let store = cluster.store(PREFIX).await?;
        let dir = tempfile::tempdir()?;
        let mut storm = Storm::new(store.clone(), names.to_vec());
        let first = storm.publish_one(STEP_WITHIN).await?;

        let enactor_config = dir.path().join("enactor.toml");
        std::fs::write(&enactor_config, enactor_config_text(&cluster.all_endpoints()))?;
        let (tx, mut lines) = mpsc::unbounded_channel::<LogLine>();
        let applied = Arc::new(AtomicU64::new(0));
        let seen = applied.clone();
        tokio::spawn(async move {
            while let Some(line) = lines.recv().await {
                if line.message == "plan applied"
                    && let Some(g) = line.generation
                {
                    seen.fetch_max(g, Ordering::SeqCst);
                }
            }
        });
        let config = enactor_config.display().to_string();
        let mut enactors = Vec::new();
        for zone in ["a", "b", "c"] {
            let id = format!("enactor-{zone}");
            enactors.push(Daemon::spawn(&bins.enactor, &["--config", &config, "--id", &id, "--zone", zone], &id, tx.clone())?);
        }
        drop(tx);
        converge_store(&store, names, first).await?;

        let mut proxies = Vec::new();
        if proxied_b {
            for m in &cluster.members {
                let upstream: SocketAddr = m.client_url.trim_start_matches("http://").parse()?;
                proxies.push(Proxy::start(upstream).await?);
            }
        }
        let (mut authorities, mut authority_configs) = (Vec::new(), Vec::new());
        for who in ["a", "b"] {
            let endpoints = if who == "b" && proxied_b {
                proxies.iter().map(|p| format!("http://{}", p.addr)).collect()
            } else {
                cluster.all_endpoints()
            };
            let data = dir.path().join(format!("authority-{who}"));
            std::fs::create_dir_all(&data)?;
            // A fixed DNS port, so that a restarted authority answers where it did.
            let dns = format!("listen = [\"127.0.0.1:{}\"]", dnsplan_tests::ports::free_port()?);
            let text = format!(
                "{}\n[store]\nkind = \"etcd\"\nendpoints = [{}]\nprefix = \"{PREFIX}\"\n",
                authority_config_text(&data.join("data")).replace("listen = [\"127.0.0.1:0\"]", &dns),
                quoted(&endpoints)
            );
            let config = data.join("authority.toml");
            std::fs::write(&config, text)?;
            authorities.push(start_authority(&bins.authority, &config, &format!("authority {who}"), data.join("authority.log"))?);
            authority_configs.push(config);
        }
        let stack = EtcdStack {
            authorities,
            restarted: vec![false; authority_configs.len()],
            authority_configs,
            authority_bin: bins.authority.clone(),
            _enactors: enactors,
            proxies,
            applied,
            store,
            cluster,
            _dir: dir,
        };
        for a in &stack.authorities {
            until_serves(a.dns, &stack.store, names, first, STEP_WITHIN).await.map_err(|e| anyhow::anyhow!("{}: {e}", a.described()))?;
        }
        Ok((stack, storm))
    }

    /// A watcher (DNS prober and store observer) on every authority.
    pub async fn watch(&self, names: &[EndpointName]) -> anyhow::Result<Vec<Watcher<EtcdStore>>> {
        let mut watchers = Vec::new();
        for a in &self.authorities {
            watchers.push(Watcher::start_caught_up(a.dns, fixtures::dns_zone(), names.to_vec(), self.store.clone()).await?);
        }
        Ok(watchers)
    }

    /// SIGKILLs authority `index` and starts it again on its config; returns once it answers
    /// DNS.
    fn restart_authority(&mut self, index: usize) -> anyhow::Result<()> {
        self.restarted[index] = true;
        let killed = self.authorities.remove(index);
        let (who, log) = (killed.who.clone(), killed.log.clone());
        // Its daemon goes with it: SIGKILL, and waited for.
        drop(killed);
        let restarted = start_authority(&self.authority_bin, &self.authority_configs[index], &who, log)?;
        self.authorities.insert(index, restarted);
        Ok(())
    }

    fn set_proxies(&self, mode: Mode) {
        for p in &self.proxies {
            p.set(mode);
        }
    }
}

fn enactor_config_text(endpoints: &[String]) -> String {
    format!(
        r#"id = "overridden"
zone = "overridden"
[store]
kind = "etcd"
endpoints = [{}]
prefix = "{PREFIX}"
[apply]
reconcile_interval_secs = 1
retry_base_ms = 5
retry_max_ms = 200
# Fixture plans replace every address.
max_removal_fraction = 1.0
[cleanup]
retain_plans = 50
[metrics]
listen = "127.0.0.1:0"
"#,
        quoted(endpoints)
    )
}

/// Waits on the store's change feed until every name is active at `target` or newer.
async fn converge_store(store: &EtcdStore, names: &[EndpointName], target: Generation) -> anyhow::Result<()> {
    let deadline = Instant::now() + CONVERGE_WITHIN;
    loop {
        match store.version().await {
            Ok(version) => {
                if let Ok(active) = store.active_all().await
                    && names.iter().all(|n| active.endpoints.get(n).is_some_and(|r| r.generation >= target))
                {
                    return Ok(());
                }
                let _ = store.wait_for_change(version, Duration::from_secs(1)).await;
            }
            // No leader for a moment: a bounded pause before asking again.
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
        anyhow::ensure!(Instant::now() < deadline, "the store did not converge to plan {target} within {CONVERGE_WITHIN:?}");
    }
}

/// What `dns` serves: every name's addresses and the SOA serial.
async fn served(dns: SocketAddr, names: &[EndpointName]) -> anyhow::Result<(Vec<BTreeSet<IpAddr>>, Option<u32>)> {
    let mut addresses = Vec::new();
    for n in names {
        addresses.push(dns_probe::query(dns, n.as_str(), RecordType::A, QUERY_TIMEOUT).await?.addresses);
    }
    let soa = dns_probe::query(dns, fixtures::DNS_ZONE, RecordType::SOA, QUERY_TIMEOUT).await?;
    Ok((addresses, soa.soa_serial))
}

fn addresses_of(g: Generation) -> BTreeSet<IpAddr> {
    endpoint_for(g).targets.iter().map(|t| t.address).collect()
}

/// Polls `dns` until it serves plan `g` for every name with a serial at least the serial of
/// the store's content-change count as read first; returns that serial.
async fn until_serves(dns: SocketAddr, store: &EtcdStore, names: &[EndpointName], g: Generation, within: Duration) -> anyhow::Result<u32> {
    let want = addresses_of(g);
    until_served(dns, store, names, within, &format!("serve plan {g}"), |addresses| addresses.iter().all(|a| *a == want)).await
}

/// Polls `dns` until its SOA serial is at least the serial of the store's content-change
/// count as read first, with an address for every name: the authority has caught up with a
/// store that moves on meanwhile (the watcher judges what it served on the way).
async fn until_caught_up(dns: SocketAddr, store: &EtcdStore, names: &[EndpointName], within: Duration) -> anyhow::Result<u32> {
    until_served(dns, store, names, within, "catch up", |addresses| addresses.iter().all(|a| !a.is_empty())).await
}

/// Polls `dns` until the addresses of `names` pass `check` and its SOA serial is at least the
/// serial of the store's content-change count as read first (serial_base 0); returns the
/// serial. `what` names the wait in the error.
async fn until_served(
    dns: SocketAddr,
    store: &EtcdStore,
    names: &[EndpointName],
    within: Duration,
    what: &str,
    check: impl Fn(&[BTreeSet<IpAddr>]) -> bool,
) -> anyhow::Result<u32> {
    let deadline = Instant::now() + within;
    let mut content = None;
    loop {
        if content.is_none() {
            content = store.active_all().await.ok().map(|s| s.content_changes as u32);
        }
        let got = served(dns, names).await;
        if let (Some(content), Ok((addresses, Some(serial)))) = (content, &got)
            && check(addresses)
            && serial.wrapping_sub(content) < 1 << 31
        {
            return Ok(*serial);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{dns} did not {what} (the store's content-change count {content:?}) within {within:?}: last {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls until `acked` reaches `at_least`.
async fn until_acked(acked: &AtomicU64, at_least: u64, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + STEP_WITHIN;
    while acked.load(Ordering::SeqCst) < at_least {
        anyhow::ensure!(
            Instant::now() < deadline,
            "{what}: no plan {at_least} acknowledged within {STEP_WITHIN:?} (last {})",
            acked.load(Ordering::SeqCst)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Reads every store write that was acknowledged before the read began, and reports those the
/// read does not show: a publish acknowledged to the storm (the latest generation must be at
/// least it), a plan an enactor logged as applied (every name must be at least at it). etcd's
/// reads here are transactions, linearizable.
async fn audit(
    store: EtcdStore,
    names: Vec<EndpointName>,
    published: Arc<AtomicU64>,
    applied: Arc<AtomicU64>,
    mut stop: channel::Receiver<bool>,
) -> (Vec<String>, u64) {
    let (mut violations, mut reads) = (Vec::new(), 0);
    let mut version = StoreVersion::default();
    for _ in 0..AUDITS_MAX {
        if *stop.borrow() {
            break;
        }
        let (published_floor, applied_floor) = (published.load(Ordering::SeqCst), applied.load(Ordering::SeqCst));
        if let Ok(latest) = store.latest().await {
            reads += 1;
            if latest.0 < published_floor {
                violations
                    .push(format!("acknowledged write lost: plan {published_floor} was acknowledged, then etcd's latest was {latest}"));
            }
        }
        if let Ok(snapshot) = store.active_all().await {
            reads += 1;
            for n in &names {
                let g = snapshot.endpoints.get(n).map(|r| r.generation.0).unwrap_or_default();
                if g < applied_floor {
                    violations.push(format!(
                        "acknowledged write lost: {n} at plan {g} after an enactor acknowledged plan {applied_floor} applied"
                    ));
                }
            }
        }
        tokio::select! {
            next = store.wait_for_change(version, Duration::from_millis(500)) => match next {
                Ok(next) => version = next,
                // No leader: retry at a bounded rate.
                Err(_) => { let _ = tokio::time::timeout(Duration::from_millis(50), stop.changed()).await; }
            },
            _ = stop.changed() => {}
        }
    }
    (violations, reads)
}

/// Every write of every fence under `PREFIX`, from etcd's whole history (a watch from revision
/// 1 replays it): what went back, and how many writes were read.
async fn fence_history(store: &EtcdStore) -> anyhow::Result<(Vec<String>, usize)> {
    use dnsplan_etcd::client::{EventType, GetOptions, WatchOptions};
    let client = store.client().clone();
    let key = format!("{PREFIX}fence/");
    let current = client.get(key.as_str(), Some(GetOptions::new().with_prefix())).await?;
    let Some(now) = current.kvs().iter().map(|kv| kv.mod_revision()).max() else { anyhow::bail!("no fence in the store") };
    let mut stream = client.watch(key.as_str(), Some(WatchOptions::new().with_prefix().with_start_revision(1))).await?;
    let mut fences: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let (mut violations, mut writes) = (Vec::new(), 0);
    let replay = async {
        while let Some(response) = stream.message().await? {
            anyhow::ensure!(!response.canceled(), "the watch was cancelled (compacted at {})", response.compact_revision());
            let mut last = 0;
            for event in response.events() {
                let Some(kv) = event.kv() else { continue };
                last = kv.mod_revision();
                if event.event_type() != EventType::Put {
                    violations.push(format!("fence {} deleted at revision {last}", String::from_utf8_lossy(kv.key())));
                    continue;
                }
                writes += 1;
                let generation = u64::from_be_bytes(kv.value().try_into().map_err(|_| anyhow::anyhow!("a fence is not 8 bytes"))?);
                let before = fences.insert(kv.key().to_vec(), generation).unwrap_or_default();
                if generation < before {
                    violations.push(format!(
                        "etcd history: {} went back from {before} to {generation} at revision {last}",
                        String::from_utf8_lossy(kv.key())
                    ));
                }
            }
            if last >= now {
                return anyhow::Ok(());
            }
        }
        anyhow::bail!("the watch ended before revision {now}")
    };
    tokio::time::timeout(STEP_WITHIN, replay)
        .await
        .map_err(|_| anyhow::anyhow!("etcd's history not replayed within {STEP_WITHIN:?}"))??;
    Ok((violations, writes))
}

/// Every acknowledged publish is still there, the same plan, or was cleaned up (below the
/// oldest stored plan); and the latest generation is at least the last one acknowledged.
async fn acked_plans_kept(store: &EtcdStore, storm: &Storm) -> anyhow::Result<Vec<String>> {
    let mut violations = Vec::new();
    let latest = store.latest().await?;
    let horizon = store.list(Generation::NONE, 1).await?.first().map(|p| p.generation).unwrap_or_default();
    if let Some(max) = storm.acked.iter().max()
        && latest < *max
    {
        violations.push(format!("acknowledged write lost: plan {max} was acknowledged, the latest is {latest}"));
    }
    for g in storm.acked.iter().filter(|g| **g >= horizon) {
        match store.plan(*g).await {
            Ok(plan) if Some(plan.plan()) == storm.attempted.get(g).map(|p| p.plan()) => {}
            Ok(_) => violations.push(format!("acknowledged write lost: plan {g} in etcd is not the plan published")),
            Err(err) => violations.push(format!("acknowledged write lost: plan {g} (oldest stored plan {horizon}): {err}")),
        }
    }
    Ok(violations)
}

/// The index and member id of the member every live member names as leader.
async fn leader(cluster: &EtcdCluster) -> anyhow::Result<(usize, u64)> {
    let deadline = Instant::now() + ELECTION_WITHIN;
    loop {
        let live = cluster.endpoints();
        let mut ids = Vec::new();
        let mut leaders = BTreeSet::new();
        let mut all_answered = true;
        for (i, m) in cluster.members.iter().enumerate() {
            if !live.contains(&m.client_url) {
                continue;
            }
            match member_status(&m.client_url).await {
                Some((id, leader)) => {
                    ids.push((i, id));
                    leaders.insert(leader);
                }
                None => all_answered = false,
            }
        }
        if all_answered
            && leaders.len() == 1
            && let Some(&(i, id)) = ids.iter().find(|(_, id)| leaders.contains(id))
        {
            return Ok((i, id));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the live etcd members did not agree on a live leader within {ELECTION_WITHIN:?} (they named {leaders:?}; members {ids:?})"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A member's own id and the leader it knows (0: none), asked of it alone.
async fn member_status(url: &str) -> Option<(u64, u64)> {
    let status = async {
        let client = dnsplan_etcd::client::Client::new(&[url.to_string()], &Default::default())?;
        client.status().await
    };
    match tokio::time::timeout(Duration::from_secs(1), status).await {
        Ok(Ok(s)) => Some((s.header()?.member_id(), s.leader())),
        _ => None,
    }
}

/// What judges a run on etcd while it runs: a watcher on every authority and the auditor of
/// acknowledged writes.
struct Judges {
    watchers: Vec<Watcher<EtcdStore>>,
    audit_stop: channel::Sender<bool>,
    auditor: tokio::task::JoinHandle<(Vec<String>, u64)>,
}

impl Judges {
    async fn start(stack: &EtcdStack, storm: &Storm, names: &[EndpointName]) -> anyhow::Result<Judges> {
        let watchers = stack.watch(names).await?;
        let (audit_stop, stopped) = channel::channel(false);
        let auditor = tokio::spawn(audit(stack.store.clone(), names.to_vec(), storm.acked_max.clone(), stack.applied.clone(), stopped));
        Ok(Judges { watchers, audit_stop, auditor })
    }
}

/// The end of a process scenario on etcd: a last plan, convergence of the store and of every
/// authority, then every check.
async fn finish(
    mut report: Report,
    stack: EtcdStack,
    mut storm: Storm,
    judges: Judges,
    names: &[EndpointName],
    started: Instant,
) -> anyhow::Result<Report> {
    let Judges { watchers, audit_stop, auditor } = judges;
    let last = storm.publish_one(CONVERGE_WITHIN).await?;
    report.converged = true;
    if let Err(e) = converge_store(&stack.store, names, last).await {
        report.converged = false;
        report.violations.push(format!("did not converge to plan {last}: {e}"));
    }
    for a in &stack.authorities {
        if let Err(e) = until_serves(a.dns, &stack.store, names, last, CONVERGE_WITHIN).await {
            report.converged = false;
            report.violations.push(format!("{} did not converge to plan {last}: {e}", a.described()));
        }
    }
    let _ = audit_stop.send(true);
    let (lost, _reads) = auditor.await?;
    for ((watcher, a), restarted) in watchers.into_iter().zip(&stack.authorities).zip(&stack.restarted) {
        // A watcher that cannot take its last checkpoint is a violation beside the others,
        // which are kept: the first failure is the one that explains the rest.
        let history = match watcher.stop().await {
            Ok(history) => history,
            Err(e) => {
                report.violations.push(format!("{}: the last checkpoint: {e:#}", a.described()));
                continue;
            }
        };
        report.answers_checked += history.answers.len();
        report.snapshots_checked += history.snapshots.len();
        let options = watch::CheckOptions { unanswered_ok: *restarted };
        report.violations.extend(watch::check_with(&history, &storm.attempted, options).into_iter().map(|v| format!("{}: {v}", a.who)));
    }
    report.violations.extend(lost);
    report.violations.extend(acked_plans_kept(&stack.store, &storm).await?);
    let (went_back, _writes) = fence_history(&stack.store).await?;
    report.violations.extend(went_back);
    report.plans_published = storm.acked.len() as u64;
    report.duration_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}
