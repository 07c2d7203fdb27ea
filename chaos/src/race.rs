//! The `aws-2025-race` scenario: the October 2025 race, deterministic, end to end: three enactors on one store, the real
//! authority serving it over UDP, and a DNS client asking throughout.
//!
//! Enactor A takes plan N and is held just before its first write. Plans N+1..N+10 are
//! published; B and C apply N+10 everywhere and clean up, which deletes plan N. Then A is
//! released and writes. With the fenced store and enactor nothing bad is ever seen and
//! everything converges to N+10. With the 2025 behaviour (a one-time check, unfenced writes,
//! records that go with their plan on age-only cleanup) the checker must see violations:
//! that is the test proving its own teeth.
//!
//! `aws-2025-race-secondary` runs the same story with a Knot secondary (`knotd`, a real
//! process) fed by the authority through NOTIFY and IXFR/AXFR signed with TSIG, and watches it
//! as the authority is watched: it must never answer without an address, never serve a plan
//! older than one it served, never a deleted plan's addresses, and must converge to the last
//! plan. What the authority serves reaches the secondary only by zone transfer, so the 2025
//! behaviour must be caught on the secondary too. A missing `knotd` fails the run, saying
//! how to install it.

use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::zones::ManagedZones;
use dnsplan_common::{EndpointName, Generation, ValidatedPlan, ZoneId};
use dnsplan_enactor::config::VerifySettings;
use dnsplan_enactor::hooks::{Behaviour, Event, HookFuture, Hooks};
use dnsplan_enactor::metrics::ReasonLabels;
use dnsplan_enactor::{Enactor, Families, Settings};
use dnsplan_tests::fixtures::{self, endpoint_for, name, planner};
use dnsplan_tests::knot::{self, KeyAction, Knot, KnotSpec, KnotZone, TsigKey as KnotKey};
use dnsplan_tests::stack::{Authority, AuthorityOptions};
use dnsplan_tests::watch::{self, Watcher};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};

/// Plan N of the story.
const N: u64 = 2;
/// How many plans follow it while A is held.
const NEWER: u64 = 10;
const RETAIN: u64 = 5;
const CONVERGE_WITHIN: Duration = Duration::from_secs(20);
/// The TSIG key the authority and its secondary share (32 bytes, base64).
const XFR_KEY_NAME: &str = "dnsplan-xfr.";
const XFR_SECRET: &str = "ZG5zcGxhbi10cmFuc2Zlci10ZXN0LXNlY3JldC0zMmI=";
/// How long the secondary may take for its first transfer once asked: milliseconds for four
/// names; 20 s leaves room for a loaded machine without hiding a hang.
const FIRST_TRANSFER_WITHIN: Duration = Duration::from_secs(20);
/// Ports tried for the authority when the one chosen is taken before it binds.
const PORT_ATTEMPTS: usize = 3;
/// How long `knotc` may take to hand Knot a command over its control socket.
const KNOTC_WITHIN: Duration = Duration::from_secs(10);

/// What starts each violation seen on the secondary.
pub const SECONDARY_PREFIX: &str = "secondary: ";

/// Who serves the race's DNS zone besides the authority.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Secondaries {
    None,
    /// A Knot secondary, fed by zone transfer (TSIG) and told of each change by NOTIFY.
    Knot,
}

/// Holds enactor `a` before its write of the first endpoint at plan N until released (and the
/// others' writes of plan N until `a` is held), and forwards every enactor event.
struct Gate {
    hold: (String, Generation, EndpointName),
    reached: Mutex<Option<oneshot::Sender<()>>>,
    /// Set once A is held: the others write plan N only after A took it, as in the story.
    a_holding: tokio::sync::watch::Sender<bool>,
    release: Notify,
    /// After the release, A is held once more before its next cleanup, so that the state its
    /// writes left can be checked for certain.
    at_cleanup: Mutex<Option<oneshot::Sender<Generation>>>,
    released: AtomicBool,
    release_cleanup: Notify,
    /// After that cleanup, A's next write waits until this is set, so that the state right
    /// after the cleanup is checked before anything repairs it.
    writes_resume: tokio::sync::watch::Sender<bool>,
    hold_writes: AtomicBool,
    events: mpsc::UnboundedSender<Event>,
}

impl Hooks for Gate {
    fn before_write<'a>(&'a self, enactor: &'a str, generation: Generation, endpoint: &'a EndpointName) -> HookFuture<'a> {
        Box::pin(async move {
            if enactor == self.hold.0 && self.hold_writes.load(Ordering::SeqCst) {
                let _ = self.writes_resume.subscribe().wait_for(|resume| *resume).await;
                return;
            }
            if enactor != self.hold.0 && generation == self.hold.1 {
                let _ = self.a_holding.subscribe().wait_for(|holding| *holding).await;
                return;
            }
            if (enactor, generation, endpoint) != (self.hold.0.as_str(), self.hold.1, &self.hold.2) {
                return;
            }
            let first_time = self.reached.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(reached) = first_time {
                let _ = reached.send(());
                self.a_holding.send_replace(true);
                self.release.notified().await;
            }
        })
    }

    fn before_cleanup<'a>(&'a self, enactor: &'a str, generation: Generation) -> HookFuture<'a> {
        Box::pin(async move {
            if enactor != self.hold.0 || !self.released.load(Ordering::SeqCst) {
                return;
            }
            let first_time = self.at_cleanup.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(at_cleanup) = first_time {
                let _ = at_cleanup.send(generation);
                self.release_cleanup.notified().await;
                self.hold_writes.store(true, Ordering::SeqCst);
            }
        })
    }

    fn event(&self, event: Event) {
        let _ = self.events.send(event);
    }
}

/// What one run of the race saw.
#[derive(Debug)]
pub struct Outcome {
    pub violations: Vec<String>,
    pub answers: usize,
    pub snapshots: usize,
    pub plans: usize,
    /// Plans enactor A abandoned because the fence or the cleanup turned it away.
    pub a_abandoned: u64,
    pub converged: Result<(), String>,
    /// What the secondary was seen to serve, with `Secondaries::Knot`.
    pub secondary: Option<SecondaryOutcome>,
}

/// What was seen on the secondary, judged as the authority's answers are.
#[derive(Debug)]
pub struct SecondaryOutcome {
    pub violations: Vec<String>,
    pub answers: usize,
    pub converged: Result<(), String>,
    /// Knot's log, for a failure message.
    pub logs: String,
}

/// The managed names of the race.
pub fn names() -> Vec<EndpointName> {
    (0..4).map(|i| name(&format!("e{i}"))).collect()
}

async fn wait_done(events: &mut mpsc::UnboundedReceiver<Event>, enactors: &[&str], generation: Generation) -> anyhow::Result<()> {
    let mut waiting: Vec<&str> = enactors.to_vec();
    let wait = async {
        while let Some(event) = events.recv().await {
            if let Event::PlanDone { enactor, generation: g } = event
                && g == generation
            {
                waiting.retain(|e| *e != enactor);
                if waiting.is_empty() {
                    return Ok(());
                }
            }
        }
        anyhow::bail!("event stream ended")
    };
    tokio::time::timeout(CONVERGE_WITHIN, wait)
        .await
        .map_err(|_| anyhow::anyhow!("enactors {enactors:?} did not finish plan {generation}"))?
}

async fn wait_any_done(events: &mut mpsc::UnboundedReceiver<Event>, enactor: &str) -> anyhow::Result<Generation> {
    let wait = async {
        while let Some(event) = events.recv().await {
            if let Event::PlanDone { enactor: e, generation } = event
                && e == enactor
            {
                return Ok(generation);
            }
        }
        anyhow::bail!("event stream ended")
    };
    tokio::time::timeout(CONVERGE_WITHIN, wait).await.map_err(|_| anyhow::anyhow!("enactor {enactor} finished no plan"))?
}

/// Every endpoint answers with plan `target`'s addresses, over DNS, within the deadline.
async fn wait_converged(dns: std::net::SocketAddr, target: Generation) -> Result<(), String> {
    let want: std::collections::BTreeSet<IpAddr> = endpoint_for(target).targets.iter().map(|t| t.address).collect();
    let start = tokio::time::Instant::now();
    for name in names() {
        loop {
            let got = dns_probe::query(dns, name.as_str(), RecordType::A, Duration::from_secs(1)).await;
            if matches!(&got, Ok(a) if a.addresses == want) {
                break;
            }
            if start.elapsed() > CONVERGE_WITHIN {
                return Err(format!("{name} did not converge to plan {target}: last answer {got:?}"));
            }
            tokio::task::yield_now().await;
        }
    }
    Ok(())
}

/// Starts a Knot secondary of the race's DNS zone and the authority serving `store`, which
/// allows Knot to transfer with the key and notifies it of each change; returns once Knot
/// serves the zone at the authority's serial.
async fn authority_with_knot<S: ManagedZones>(store: S, dir: &std::path::Path) -> anyhow::Result<(Authority, Knot)> {
    // Knot must name its primary and the primary its secondary: the authority's port is
    // chosen first and Knot started on it, then the authority with Knot's address. The port
    // is only free when chosen: taken meanwhile (by Knot itself, say), another is tried.
    let mut failures = Vec::new();
    for _ in 0..PORT_ATTEMPTS {
        let port = dnsplan_tests::ports::free_port()?;
        let knot = knot_secondary(port).await?;
        if knot.addr().port() == port {
            failures.push(format!("knot took port {port}"));
            continue;
        }
        let transfer = format!(
            "[[dns.transfer.keys]]\nname = \"{XFR_KEY_NAME}\"\nsecret = \"{XFR_SECRET}\"\n[[dns.transfer.secondaries]]\naddress = \
             \"127.0.0.1/32\"\nkey = \"{XFR_KEY_NAME}\"\nnotify = \"{}\"\n",
            knot.addr()
        );
        match Authority::start_with(store.clone(), dir, &AuthorityOptions { dns_port: port, extra_config: transfer }).await {
            Ok(authority) => {
                first_transfer(&authority, &knot).await?;
                return Ok((authority, knot));
            }
            Err(err) => failures.push(format!("port {port}: {err:#}")),
        }
    }
    anyhow::bail!("the authority did not start on a port chosen for it in {PORT_ATTEMPTS} tries: {failures:?}")
}

/// A Knot secondary of the race's DNS zone whose primary is on `port`, allowing NOTIFY with
/// the key.
async fn knot_secondary(port: u16) -> anyhow::Result<Knot> {
    Knot::start(&KnotSpec {
        zones: vec![KnotZone { origin: fixtures::DNS_ZONE.into(), text: None, zone_extra: vec!["master: primary".into()] }],
        keys: vec![KnotKey {
            name: XFR_KEY_NAME.into(),
            algorithm: "hmac-sha256".into(),
            secret_base64: XFR_SECRET.into(),
            actions: vec![KeyAction::Notify],
        }],
        extra_config: format!("remote:\n  - id: primary\n    address: 127.0.0.1@{port}\n    key: {XFR_KEY_NAME}\n"),
    })
    .await
}

/// Has Knot transfer the zone now, and waits until it serves the authority's serial.
async fn first_transfer(authority: &Authority, knot: &Knot) -> anyhow::Result<()> {
    let origin = fixtures::DNS_ZONE;
    // Knot tried its first transfer before the authority listened and now waits out a
    // backoff, and the authority sends no NOTIFY for what it serves at start: ask Knot to
    // transfer now, through its control socket.
    let knotc = knot::knotd_binary()?.with_file_name("knotc");
    let command = tokio::process::Command::new(&knotc)
        .arg("-s")
        .arg(knot.dir().join("knot.sock"))
        .args(["zone-refresh", origin])
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(KNOTC_WITHIN, command)
        .await
        .map_err(|_| anyhow::anyhow!("{} zone-refresh took over {KNOTC_WITHIN:?}", knotc.display()))?
        .map_err(|e| anyhow::anyhow!("cannot run {} (Debian package knot): {e}", knotc.display()))?;
    anyhow::ensure!(output.status.success(), "knotc zone-refresh failed: {}", String::from_utf8_lossy(&output.stderr));
    let want = dns_probe::query(authority.dns, origin, RecordType::SOA, Duration::from_secs(1)).await?.soa_serial;
    let start = tokio::time::Instant::now();
    loop {
        let got = knot.wait_zone(origin, FIRST_TRANSFER_WITHIN).await?;
        if Some(got) == want {
            break;
        }
        anyhow::ensure!(
            start.elapsed() < FIRST_TRANSFER_WITHIN,
            "knot serves serial {got}, the authority {want:?}, after {FIRST_TRANSFER_WITHIN:?}: {}",
            knot.logs()
        );
        tokio::task::yield_now().await;
    }
    Ok(())
}

/// Runs the race on `store` with enactors of `behaviour`: `Fenced` on a `SledStore` must see
/// no violation; `Naive` on `NaiveStore::as_in_2025` must see some.
pub async fn race<S: ManagedZones>(store: S, behaviour: Behaviour) -> anyhow::Result<Outcome> {
    race_with(store, behaviour, Secondaries::None).await
}

/// As `race`, with `secondaries` fed by the authority and watched and judged the same way.
pub async fn race_with<S: ManagedZones>(store: S, behaviour: Behaviour, secondaries: Secondaries) -> anyhow::Result<Outcome> {
    let dir = tempfile::tempdir()?;
    let names = names();
    let mut published: BTreeMap<Generation, ValidatedPlan> = BTreeMap::new();
    let first = fixtures::plan(1, &names, planner());
    store.publish(&first).await?;
    for name in &names {
        store.apply(name, Generation(1), &endpoint_for(Generation(1))).await?;
    }
    published.insert(Generation(1), first);

    let (authority, knot) = match secondaries {
        Secondaries::None => (Authority::start(store.clone(), dir.path()).await?, None),
        Secondaries::Knot => {
            let (authority, knot) = authority_with_knot(store.clone(), dir.path()).await?;
            (authority, Some(knot))
        }
    };
    let watcher = Watcher::start(authority.dns, fixtures::dns_zone(), names.clone(), store.clone());
    let secondary_watcher = knot.as_ref().map(|k| Watcher::start_secondary(k.addr(), fixtures::dns_zone(), names.clone(), store.clone()));
    // The authority's and the secondary's views of the same moment, for certain.
    let checkpoint = async || -> anyhow::Result<()> {
        watcher.checkpoint().await?;
        if let Some(secondary) = &secondary_watcher {
            secondary.checkpoint().await?;
        }
        Ok(())
    };

    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (reached_tx, reached) = oneshot::channel();
    let (at_cleanup_tx, at_cleanup) = oneshot::channel();
    let gate = Arc::new(Gate {
        hold: ("a".into(), Generation(N), names[0].clone()),
        reached: Mutex::new(Some(reached_tx)),
        a_holding: tokio::sync::watch::Sender::new(false),
        release: Notify::new(),
        at_cleanup: Mutex::new(Some(at_cleanup_tx)),
        released: AtomicBool::new(false),
        release_cleanup: Notify::new(),
        writes_resume: tokio::sync::watch::Sender::new(false),
        hold_writes: AtomicBool::new(false),
        events: events_tx,
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let families = Families::register(&mut Registry::default());
    let mut tasks = Vec::new();
    let mut a_metrics = None;
    for id in ["a", "b", "c"] {
        let mut settings = Settings::new(id, ZoneId::parse(id)?);
        settings.cleanup_retain = Some(RETAIN);
        // Each fixture plan replaces every address (so that answers tell generations apart);
        // the removal guard, tested on its own, would rightly refuse that.
        settings.max_removal_fraction = 1.0;
        // No reconcile during the story: the sequence, not the timer, must decide.
        settings.reconcile_interval = Duration::from_secs(3_600);
        settings.verify = Some(VerifySettings { dns_server: authority.dns, timeout: Duration::from_secs(5), endpoints_max: 100 });
        let metrics = Arc::new(families.enactor(id));
        if id == "a" {
            a_metrics = Some(metrics.clone());
        }
        let enactor = Enactor::new(store.clone(), settings, metrics).with_hooks(gate.clone()).with_behaviour(behaviour);
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(enactor.run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
    }
    wait_done(&mut events, &["a", "b", "c"], Generation(1)).await?;

    // Plan N: B and C apply it, A takes it and is held before its first write.
    let plan_n = fixtures::plan(N, &names, planner());
    store.publish(&plan_n).await?;
    published.insert(Generation(N), plan_n);
    tokio::time::timeout(CONVERGE_WITHIN, reached).await.map_err(|_| anyhow::anyhow!("enactor a never took plan {N}"))??;
    wait_done(&mut events, &["b", "c"], Generation(N)).await?;

    // N+1..N+10 while A is held; B and C finish the last one and clean up after it.
    let last = Generation(N + NEWER);
    for g in N + 1..=last.0 {
        let plan = fixtures::plan(g, &names, planner());
        store.publish(&plan).await?;
        published.insert(Generation(g), plan);
    }
    wait_done(&mut events, &["b", "c"], last).await?;
    anyhow::ensure!(store.plan(Generation(N)).await.is_err(), "the story needs plan {N} deleted before A resumes");
    // Plan N+10 everywhere, seen for certain before A resumes: a secondary, which follows by
    // transfer, would otherwise skip this state and never be seen to go back from it.
    checkpoint().await?;

    // A resumes and writes; what it left is checked before its cleanup and after.
    gate.released.store(true, Ordering::SeqCst);
    gate.release.notify_one();
    tokio::time::timeout(CONVERGE_WITHIN, at_cleanup).await.map_err(|_| anyhow::anyhow!("enactor a never finished a plan"))??;
    checkpoint().await?;
    gate.release_cleanup.notify_one();
    wait_any_done(&mut events, "a").await?;
    checkpoint().await?;
    gate.writes_resume.send_replace(true);
    let converged = if behaviour == Behaviour::Fenced { wait_converged(authority.dns, last).await } else { Ok(()) };
    let secondary_converged = match &knot {
        Some(knot) if behaviour == Behaviour::Fenced => wait_converged(knot.addr(), last).await,
        _ => Ok(()),
    };

    let history = watcher.stop().await?;
    let secondary_history = match secondary_watcher {
        Some(w) => Some(w.stop().await?),
        None => None,
    };
    let _ = stop_tx.send(true);
    for task in tasks {
        task.await?;
    }
    authority.stop().await?;
    let violations = watch::check(&history, &published);
    let secondary = match (secondary_history, knot) {
        (Some(history), Some(knot)) => Some(SecondaryOutcome {
            violations: watch::check(&history, &published).into_iter().map(|v| format!("{SECONDARY_PREFIX}{v}")).collect(),
            answers: history.answers.len(),
            converged: secondary_converged.map_err(|e| format!("{SECONDARY_PREFIX}{e}")),
            logs: knot.logs(),
        }),
        _ => None,
    };
    let a_metrics = a_metrics.ok_or_else(|| anyhow::anyhow!("enactor a has metrics"))?;
    let a_abandoned =
        ["pruned", "newer_plan"].iter().map(|&reason| a_metrics.plans_abandoned.get_or_create(&ReasonLabels { reason }).get()).sum();
    Ok(Outcome {
        violations,
        answers: history.answers.len(),
        snapshots: history.snapshots.len(),
        plans: published.len(),
        a_abandoned,
        converged,
        secondary,
    })
}
