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
            Err(_) => {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(5).collect();
                anyhow::bail!(
                    "{who} did not announce DNS within {STEP_WITHIN:?}: {}",
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                );
            }
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
            let dns = format!("listen = [\"127.0.0.1:{}\"]", dnsplan_tests::knot::free_port()?);
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
            until_serves(a.dns, &stack.store, names, first, STEP_WITHIN).await.map_err(|e| anyhow::anyhow!("{}: {e}", a.who))?;
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
            report.violations.push(format!("{} did not converge to plan {last}: {e}", a.who));
        }
    }
    let _ = audit_stop.send(true);
    let (lost, _reads) = auditor.await?;
    for ((watcher, a), restarted) in watchers.into_iter().zip(&stack.authorities).zip(&stack.restarted) {
        let history = watcher.stop().await?;
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

/// The storm: plans as fast as etcd acknowledges them (a short backoff after a refusal), until
/// `stop` or `PLANS_MAX`.
async fn storm_loop(mut storm: Storm, seed: u64, stop: channel::Receiver<bool>) -> anyhow::Result<Storm> {
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5707);
    while !*stop.borrow() && (storm.attempted.len() as u64) < PLANS_MAX {
        let pause = match storm.publish_next().await? {
            Some(_) => Duration::from_millis(rng.random_range(0..10)),
            None => Duration::from_millis(20),
        };
        // Pace (not synchronise): leaves the two cores to the daemons now and then.
        tokio::time::sleep(pause).await;
    }
    Ok(storm)
}

/// `etcd-leader-kill`: see the module documentation.
pub async fn run_leader_kill(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let report = Report { scenario: "etcd-leader-kill".into(), seed, ..Report::default() };
    let names = names();
    let (mut stack, storm) = EtcdStack::start(&bins, &names, false).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    let acked = storm.acked_max.clone();
    let (storm_stop, storm_stopped) = channel::channel(false);
    let storm_task = tokio::spawn(storm_loop(storm, seed, storm_stopped));

    let mut report = report;
    let end = Instant::now() + duration;
    let mut kills = 0;
    let mut result = Ok(());
    while (Instant::now() < end || kills < KILLS_MIN) && kills < FAULTS_MAX {
        let step = async {
            // The storm is on: a few plans acknowledged since the last fault.
            until_acked(&acked, acked.load(Ordering::SeqCst) + rng.random_range(3..=10), "before the kill").await?;
            let (i, id) = leader(&stack.cluster).await?;
            stack.cluster.kill(i)?;
            report.fault("etcd leader SIGKILL");
            let (_, new) = leader(&stack.cluster).await?;
            anyhow::ensure!(new != id, "the killed leader {id} is still named leader");
            report.fault("new etcd leader elected");
            // Writes go on with two members of three.
            until_acked(&acked, acked.load(Ordering::SeqCst) + 1, "with the leader killed").await?;
            stack.cluster.restart_killed().await?;
            report.fault("etcd member restarted");
            anyhow::Ok(())
        };
        kills += 1;
        if let Err(e) = step.await {
            result = Err(e);
            break;
        }
    }
    let _ = storm_stop.send(true);
    let storm = storm_task.await??;
    if let Err(e) = result {
        report.violations.push(format!("the storm stalled: {e:#}"));
    }
    finish(report, stack, storm, judges, &names, started).await
}

/// Control API calls made on each authority per fault, while the member is down.
const CONTROL_CALLS_PER_FAULT: usize = 40;

/// `etcd-member-down`: see the module documentation.
pub async fn run_member_down(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: "etcd-member-down".into(), seed, ..Report::default() };
    let names = names();
    let (mut stack, mut storm) = EtcdStack::start(&bins, &names, false).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    let controls =
        stack.authorities.iter().map(|a| Ok((a.who.clone(), RemoteStore::new(&a.control, None)?))).collect::<anyhow::Result<Vec<_>>>()?;
    // How long each member stays down (the fault's length, not a synchronisation).
    let hold = (duration / 4).clamp(Duration::from_millis(500), Duration::from_secs(5));
    let end = Instant::now() + duration;
    let mut faults = 0;
    let mut result = Ok(());
    while (Instant::now() < end || faults < KILLS_MIN) && faults < FAULTS_MAX {
        faults += 1;
        let step = async {
            let (leader_index, _) = leader(&stack.cluster).await?;
            // A follower, chosen by the seed.
            let follower = (leader_index + rng.random_range(1..stack.cluster.members.len())) % stack.cluster.members.len();
            stack.cluster.kill(follower)?;
            report.fault("etcd follower SIGKILL");
            // The first call after the kill is a read, as a daemon's is (the planner and the
            // enactors read before they write): a read on the killed member's connection moves
            // to a live member and marks that one failed. A write already sent on that
            // connection is ambiguous (it may have reached etcd), and is not moved to another
            // member, as etcd's own client does not; the store settles its outcome instead.
            storm
                .store
                .list(Generation::NONE, 1)
                .await
                .map_err(|e| anyhow::anyhow!("a read with etcd member {follower} of 3 down: {e}"))?;
            let down_until = Instant::now() + hold;
            let refused_before = storm.refused;
            let mut published = 0;
            let mut calls = 0;
            while Instant::now() < down_until || published < 3 {
                anyhow::ensure!((storm.attempted.len() as u64) < PLANS_MAX, "the storm ran out of plans");
                // With two members of three up, a publish is acknowledged at the first try.
                match storm.publish_next().await? {
                    Some(_) => published += 1,
                    None => anyhow::bail!("a publish failed with etcd member {follower} of 3 down"),
                }
                for (who, control) in &controls {
                    if calls >= CONTROL_CALLS_PER_FAULT * controls.len() {
                        break;
                    }
                    calls += 2;
                    control.version().await.map_err(|e| anyhow::anyhow!("{who}'s control API: GET /v1/version failed: {e}"))?;
                    control.list(Generation(0), 8).await.map_err(|e| anyhow::anyhow!("{who}'s control API: GET /v1/plans failed: {e}"))?;
                }
                // Pace (not synchronise): leaves the two cores to the daemons now and then.
                tokio::time::sleep(Duration::from_millis(rng.random_range(0..10))).await;
            }
            anyhow::ensure!(storm.refused == refused_before, "{} publishes refused with one member down", storm.refused - refused_before);
            report.fault("calls kept succeeding with a member down");
            // Enactors and both authorities' followers go on too.
            let newest = Generation(storm.acked_max.load(Ordering::SeqCst));
            converge_store(&stack.store, &names, newest).await?;
            for a in &stack.authorities {
                until_serves(a.dns, &stack.store, &names, newest, STEP_WITHIN).await.map_err(|e| anyhow::anyhow!("{}: {e}", a.who))?;
            }
            report.fault("authorities served the newest plan with a member down");
            stack.cluster.restart_killed().await?;
            report.fault("etcd member restarted");
            anyhow::Ok(())
        };
        if let Err(e) = step.await {
            result = Err(e);
            break;
        }
    }
    if let Err(e) = result {
        report.violations.push(format!("with one etcd member down: {e:#}"));
    }
    finish(report, stack, storm, judges, &names, started).await
}

/// How long etcd stays down after the authority's restart in `etcd-crash-in-outage` (the
/// fault's length, not a synchronisation).
const OUTAGE_AFTER_RESTART: Duration = Duration::from_millis(500);

/// `etcd-crash-in-outage`: see the module documentation.
pub async fn run_crash_in_outage(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: "etcd-crash-in-outage".into(), seed, ..Report::default() };
    let names = names();
    let (mut stack, storm) = EtcdStack::start(&bins, &names, false).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    let acked = storm.acked_max.clone();
    let (storm_stop, storm_stopped) = channel::channel(false);
    let storm_task = tokio::spawn(storm_loop(storm, seed, storm_stopped));
    let end = Instant::now() + duration;
    let mut crashes = 0;
    let mut result = Ok(());
    while (Instant::now() < end || crashes < KILLS_MIN) && crashes < FAULTS_MAX {
        crashes += 1;
        let step = async {
            until_acked(&acked, acked.load(Ordering::SeqCst) + rng.random_range(3..=10), "before the outage").await?;
            let a = &stack.authorities[0];
            let (_, before) = served(a.dns, &names).await?;
            let before = before.ok_or_else(|| anyhow::anyhow!("{} answered no SOA serial before the outage", a.who))?;
            for member in 0..stack.cluster.members.len() {
                stack.cluster.kill(member)?;
            }
            report.fault("every etcd member SIGKILL");
            // When the crash lands in the outage, chosen by the seed (the fault's timing).
            tokio::time::sleep(Duration::from_millis(rng.random_range(0..=50))).await;
            stack.restart_authority(0)?;
            report.fault("authority SIGKILL+restart in the outage");
            let a = &stack.authorities[0];
            let (addresses, after) = served(a.dns, &names).await?;
            let after = after.ok_or_else(|| anyhow::anyhow!("{} answered no SOA serial after its restart", a.who))?;
            anyhow::ensure!(addresses.iter().all(|a| !a.is_empty()), "{} answered a name with no address after its restart", a.who);
            // RFC 1982: `after` is at or past `before`.
            anyhow::ensure!(
                after.wrapping_sub(before) < 1 << 31,
                "{} restarted in the outage older than it answered before: serial {after} after, {before} before",
                a.who
            );
            report.fault("restarted in the outage, not older");
            tokio::time::sleep(OUTAGE_AFTER_RESTART).await;
            stack.cluster.restart_killed().await?;
            report.fault("etcd restarted");
            // The storm goes on: each authority must reach the store's state as read now.
            for a in &stack.authorities {
                until_caught_up(a.dns, &stack.store, &names, CATCH_UP_WITHIN).await.map_err(|e| anyhow::anyhow!("{}: {e}", a.who))?;
            }
            report.fault("authorities caught up after the outage");
            anyhow::Ok(())
        };
        if let Err(e) = step.await {
            result = Err(e);
            break;
        }
    }
    let _ = storm_stop.send(true);
    let storm = storm_task.await??;
    if let Err(e) = result {
        report.violations.push(format!("a crash in an etcd outage: {e:#}"));
        // A step that failed in the outage left etcd down; the end needs it.
        if let Err(e) = stack.cluster.restart_killed().await {
            report.violations.push(format!("etcd did not come back: {e:#}"));
        }
    }
    finish(report, stack, storm, judges, &names, started).await
}

/// `etcd-partition`: see the module documentation.
pub async fn run_partition(bins: Bins, seed: u64, duration: Duration) -> anyhow::Result<Report> {
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut report = Report { scenario: "etcd-partition".into(), seed, ..Report::default() };
    let names = names();
    let (stack, mut storm) = EtcdStack::start(&bins, &names, true).await?;
    let judges = Judges::start(&stack, &storm, &names).await?;
    // How long each fault lasts (its length, not a synchronisation).
    let hold = (duration / 8).clamp(Duration::from_millis(300), Duration::from_secs(3));
    let b = &stack.authorities[1];
    let mut current = Generation(storm.acked_max.load(Ordering::SeqCst));
    let end = Instant::now() + duration;
    let mut faults = 0;
    // At least one of each fault, then until the duration is over.
    while (Instant::now() < end || faults < 4) && faults < FAULTS_MAX {
        let mode = match faults % 4 {
            0 => Mode::Partition,
            1 => Mode::OneWay,
            2 => Mode::Reset,
            _ => Mode::Delay(Duration::from_millis(rng.random_range(10..300))),
        };
        faults += 1;
        // b serves the store's state, then is cut off.
        let before = until_serves(b.dns, &stack.store, &names, current, CATCH_UP_WITHIN).await?;
        stack.set_proxies(mode);
        report.fault(match mode {
            Mode::Partition => "partition authority b from etcd",
            Mode::OneWay => "one-way partition of authority b (etcd's answers lost)",
            Mode::Reset => "reset authority b's etcd connections",
            _ => "delay authority b's etcd connections",
        });
        // etcd moves on without b.
        let had = current;
        for _ in 0..rng.random_range(1..=3) {
            current = storm.publish_one(STEP_WITHIN).await?;
        }
        converge_store(&stack.store, &names, current).await?;
        tokio::time::sleep(hold).await;
        if !matches!(mode, Mode::Delay(_)) {
            // Cut off, b serves its last state: the same serial, the same addresses.
            match served(b.dns, &names).await {
                Ok((addresses, serial)) if serial == Some(before) && addresses.iter().all(|a| *a == addresses_of(had)) => {
                    report.fault("authority b kept its last state while etcd moved on");
                }
                Ok((addresses, serial)) => report.violations.push(format!(
                    "authority b, cut off from etcd ({mode:?}), served serial {serial:?} and {addresses:?}, not its last state \
                     (serial {before}, plan {had}): the fault did not cut it off, or it lost its state"
                )),
                Err(e) => report.violations.push(format!("authority b, cut off from etcd ({mode:?}), got no answer: {e}")),
            }
        }
        stack.set_proxies(Mode::Pass);
        report.fault("heal");
        match until_serves(b.dns, &stack.store, &names, current, CATCH_UP_WITHIN).await {
            Ok(_) => report.fault(&format!("authority b caught up after {}", label(mode))),
            Err(e) => {
                report.violations.push(format!("authority b did not catch up after the heal ({mode:?}): {e}"));
                break;
            }
        }
    }
    finish(report, stack, storm, judges, &names, started).await
}

fn label(mode: Mode) -> &'static str {
    match mode {
        Mode::Partition => "partition",
        Mode::OneWay => "one-way",
        Mode::Reset => "reset",
        Mode::Delay(_) => "delay",
        Mode::Pass => "pass",
    }
}

/// `aws-2025-race-etcd`: the 2025 race of [`race`] on a three-member etcd cluster: the fenced
/// enactors on `EtcdStore`, or, with `naive`, the 2025 enactor on [`NaiveEtcdStore`].
pub async fn run_race(naive: Option<Behaviour>) -> anyhow::Result<race::Outcome> {
    let cluster = EtcdCluster::start(3, &[]).await?;
    let store = cluster.store("/race/").await?;
    let outcome = match naive {
        Some(naive) => race::race_with(NaiveEtcdStore::new(store), naive, race::Secondaries::None).await?,
        None => race::race_with(store, Behaviour::Fenced, race::Secondaries::None).await?,
    };
    drop(cluster);
    Ok(outcome)
}

/// The store of the 2025 automation, on etcd: the same keys as `EtcdStore`, written with
/// plain puts. `apply` reads the fence and then writes whatever it was given, with nothing
/// compared at write time; cleanup deletes by age alone, and the active records older than the
/// plans it keeps go with them (records that pointed into their plan), as in
/// `NaiveStore::as_in_2025`. Reads, publish, leases,
/// heartbeats and the change feed are `EtcdStore`'s own. For the counterfactual only: the
/// harness must catch it.
#[derive(Clone)]
pub struct NaiveEtcdStore {
    inner: EtcdStore,
}

fn unavailable(err: dnsplan_etcd::client::Error) -> StoreError {
    StoreError::Unavailable(err.to_string())
}

impl NaiveEtcdStore {
    pub fn new(inner: EtcdStore) -> NaiveEtcdStore {
        NaiveEtcdStore { inner }
    }

    fn key(&self, parts: &[&[u8]]) -> Vec<u8> {
        let mut key = self.inner.prefix().as_bytes().to_vec();
        for p in parts {
            key.extend_from_slice(p);
        }
        key
    }

    async fn get_u64(&self, key: Vec<u8>) -> StoreResult<Option<u64>> {
        let client = self.inner.client().clone();
        let r = client.get(key, None).await.map_err(unavailable)?;
        Ok(r.kvs().first().and_then(|kv| kv.value().try_into().ok()).map(u64::from_be_bytes))
    }

    async fn write(&self, ops: Vec<dnsplan_etcd::client::TxnOp>) -> StoreResult<()> {
        let client = self.inner.client().clone();
        client.txn(dnsplan_etcd::client::Txn::new().and_then(ops)).await.map_err(unavailable)?;
        Ok(())
    }

    async fn switch(&self, endpoint: &EndpointName, g: Generation, state: ActiveState) -> StoreResult<ApplyOutcome> {
        use dnsplan_etcd::client::TxnOp;
        let name = endpoint.as_str().as_bytes();
        // The check (read, and trusted later)...
        let fence = self.get_u64(self.key(&[b"fence/", name])).await?;
        let applied = self.get_u64(self.key(&[b"meta/applied"])).await?.unwrap_or(0);
        // ...and the act: nothing compared.
        let mut ops = vec![
            TxnOp::put(
                self.key(&[b"active/", name]),
                dnsplan_common::codec::encode(&ActiveRecord { generation: g, state: state.clone() }),
                None,
            ),
            TxnOp::put(self.key(&[b"fence/", name]), g.0.to_be_bytes().to_vec(), None),
            TxnOp::put(self.key(&[b"meta/applied"]), (applied + 1).to_be_bytes().to_vec(), None),
        ];
        if let Some(old) = fence.filter(|old| *old != g.0) {
            ops.push(TxnOp::delete(self.key(&[b"serving/", &old.to_be_bytes(), name]), None));
        }
        if matches!(state, ActiveState::Serving(_)) {
            ops.push(TxnOp::put(self.key(&[b"serving/", &g.0.to_be_bytes(), name]), Vec::new(), None));
        }
        self.write(ops).await?;
        Ok(ApplyOutcome::Switched { previous: Generation(fence.unwrap_or_default()) })
    }
}

impl Store for NaiveEtcdStore {
    async fn publish(&self, plan: &ValidatedPlan) -> StoreResult<()> {
        self.inner.publish(plan).await
    }

    async fn publish_leased(&self, plan: &ValidatedPlan, lease: &Lease) -> StoreResult<()> {
        self.inner.publish_leased(plan, lease).await
    }

    async fn acquire_lease(&self, holder: &str, ttl: Duration) -> StoreResult<Lease> {
        self.inner.acquire_lease(holder, ttl).await
    }

    async fn release_lease(&self, lease: &Lease) -> StoreResult<()> {
        self.inner.release_lease(lease).await
    }

    async fn lease(&self) -> StoreResult<Option<Lease>> {
        self.inner.lease().await
    }

    async fn plan(&self, generation: Generation) -> StoreResult<ValidatedPlan> {
        self.inner.plan(generation).await
    }

    async fn plan_changes(&self, from: Generation, to: Generation) -> StoreResult<Option<PlanChanges>> {
        self.inner.plan_changes(from, to).await
    }

    async fn latest(&self) -> StoreResult<Generation> {
        self.inner.latest().await
    }

    async fn list(&self, from: Generation, limit: usize) -> StoreResult<Vec<PlanSummary>> {
        self.inner.list(from, limit).await
    }

    async fn apply(&self, endpoint: &EndpointName, generation: Generation, records: &Endpoint) -> StoreResult<ApplyOutcome> {
        dnsplan_common::validate_endpoint(endpoint, records)?;
        let latest = self.inner.latest().await?;
        if generation > latest {
            return Err(StoreError::Unpublished { attempted: generation, latest });
        }
        self.switch(endpoint, generation, ActiveState::Serving(records.clone())).await
    }

    async fn retire(&self, endpoint: &EndpointName, generation: Generation) -> StoreResult<ApplyOutcome> {
        self.switch(endpoint, generation, ActiveState::Retired).await
    }

    async fn active(&self, endpoint: &EndpointName) -> StoreResult<Option<ActiveRecord>> {
        self.inner.active(endpoint).await
    }

    async fn active_all(&self) -> StoreResult<dnsplan_common::store::ActiveSnapshot> {
        self.inner.active_all().await
    }

    /// Age-only: keeps the last `retain` plans and nothing else, active or not.
    async fn cleanup_preview(&self, retain: u64) -> StoreResult<CleanupDecision> {
        let latest = self.inner.latest().await?;
        let horizon_before = self.inner.list(Generation::NONE, 1).await?.first().map(|p| p.generation).unwrap_or(Generation::FIRST);
        let horizon_after = Generation(latest.0.saturating_sub(retain) + 1).max(horizon_before);
        Ok(CleanupDecision {
            horizon_before,
            horizon_after,
            kept_for_rollback: Some((horizon_after, latest)),
            oldest_active: None,
            refused_active_or_newer: 0,
        })
    }

    async fn cleanup(&self, retain: u64) -> StoreResult<CleanupReport> {
        use dnsplan_etcd::client::{DeleteOptions, TxnOp};
        let decision = self.cleanup_preview(retain).await?;
        let (before, after) = (decision.horizon_before, decision.horizon_after);
        let range = |kind: &[u8]| {
            TxnOp::delete(
                self.key(&[kind, &before.0.to_be_bytes()]),
                Some(DeleteOptions::new().with_range(self.key(&[kind, &after.0.to_be_bytes()]))),
            )
        };
        let control = self.get_u64(self.key(&[b"meta/control"])).await?.unwrap_or(0);
        let mut ops = Vec::new();
        if after > before {
            ops.extend([
                TxnOp::put(self.key(&[b"state/horizon"]), after.0.to_be_bytes().to_vec(), None),
                TxnOp::put(self.key(&[b"meta/control"]), (control + 1).to_be_bytes().to_vec(), None),
                range(b"plans/"),
                range(b"summaries/"),
                range(b"changes/"),
            ]);
        }
        // The records went with their plan.
        let active = self.inner.active_all().await?;
        let gone: Vec<(&EndpointName, &ActiveRecord)> = active.endpoints.iter().filter(|(_, r)| r.generation < after).collect();
        for (name, record) in &gone {
            let name = name.as_str().as_bytes();
            ops.push(TxnOp::delete(self.key(&[b"active/", name]), None));
            ops.push(TxnOp::delete(self.key(&[b"fence/", name]), None));
            ops.push(TxnOp::delete(self.key(&[b"serving/", &record.generation.0.to_be_bytes(), name]), None));
        }
        if !gone.is_empty() {
            ops.push(TxnOp::put(self.key(&[b"meta/applied"]), (active.applied_changes + 1).to_be_bytes().to_vec(), None));
        }
        if !ops.is_empty() {
            self.write(ops).await?;
        }
        Ok(decision)
    }

    async fn pause(&self, state: PauseState) -> StoreResult<()> {
        self.inner.pause(state).await
    }

    async fn resume(&self) -> StoreResult<()> {
        self.inner.resume().await
    }

    async fn paused(&self) -> StoreResult<Option<PauseState>> {
        self.inner.paused().await
    }

    async fn heartbeat(&self, heartbeat: Heartbeat) -> StoreResult<()> {
        self.inner.heartbeat(heartbeat).await
    }

    async fn heartbeats(&self) -> StoreResult<Vec<Heartbeat>> {
        self.inner.heartbeats().await
    }

    async fn version(&self) -> StoreResult<StoreVersion> {
        self.inner.version().await
    }

    async fn wait_for_change(&self, seen: StoreVersion, timeout: Duration) -> StoreResult<StoreVersion> {
        self.inner.wait_for_change(seen, timeout).await
    }
}
