//! Control-plane benchmark: a plan of N endpoints (default 10,000) enacted by three enactors
//! on the embedded store (as `dnsplan up` runs them) and through the control API (as separate
//! daemons do); plans changing 1 endpoint, 1% and 10% of them, each timed as publish and as
//! apply (published to enacted everywhere); and publish-to-served latency seen by a DNS
//! client. Run it through `bench/plans.sh`; figures are printed with a raw store baseline
//! from the same run (fenced applies/s with one writer), because only ratios travel.
//!
//! Then the same on etcd, beside sled's figures from the same run: a three-member etcd
//! cluster on loopback (its data on disk, as sled's, unless `--etcd-in-memory`), three
//! enactors on `EtcdStore` directly (no authority in their write path, each with its own
//! connection), the same plans, and publish-to-served latency on each of two authorities
//! following etcd (`[store] kind = "etcd"`, in process, started after the plans), probed at
//! once. `--no-etcd` leaves the etcd part out. `--etcd-max-txn-ops=N` starts the members
//! with `--max-txn-ops N` and lets the enactors' stores use it (etcd's default is 128, 31
//! endpoint switches per transaction).
//!
//! `--dnssec`: the authority behind the control API signs the zone (`[dns_zone.dnssec]`, an
//! ECDSA key of its own), so publish-to-served includes signing what each change touches.
//!
//! Usage: plans-bench [--no-etcd] [--etcd-in-memory] [--etcd-max-txn-ops=N] [--dnssec] [ENDPOINTS]
//! (default 10000)

use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::{ActiveState, publish_told};
use dnsplan_common::{EndpointName, Generation, Plan, PlanDelta, SledStore, Store};
use dnsplan_enactor::{Enactor, Metrics, Settings};
use dnsplan_etcd::EtcdStore;
use dnsplan_tests::etcd::EtcdCluster;
use dnsplan_tests::fixtures::{endpoint_for, name, planner};
use dnsplan_tests::stack::{Authority, TOKEN};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

const LATENCY_SAMPLES: usize = 50;
/// Plans the enactors' cleanup keeps.
const CLEANUP_RETAIN: u64 = 20;

/// One-endpoint plans each store publishes as changes in `phases`.
const PUBLISH_SAMPLES: usize = 20;
/// How long one plan may take to be enacted everywhere, or served, before the bench fails.
const PLAN_DEADLINE: Duration = Duration::from_secs(120);
/// How long an authority on etcd may take to start and serve, and to stop.
const AUTHORITY_DEADLINE: Duration = Duration::from_secs(60);
/// The key prefix of the store on etcd.
const ETCD_PREFIX: &str = "/bench/";

/// Three enactors on `store` until the returned sender is dropped.
fn start_enactors<S: Store>(store: S) -> anyhow::Result<tokio::sync::watch::Sender<bool>> {
    start_enactors_on([store.clone(), store.clone(), store])
}

/// Enactors in zones a, b and c, each on its store, until the returned sender is dropped.
fn start_enactors_on<S: Store>(stores: [S; 3]) -> anyhow::Result<tokio::sync::watch::Sender<bool>> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for (zone, store) in ["a", "b", "c"].into_iter().zip(stores) {
        let mut settings = Settings::new(&format!("bench-{zone}"), dnsplan_common::ZoneId::parse(zone)?);
        settings.max_removal_fraction = 1.0; // fixture plans replace every address
        settings.cleanup_retain = Some(CLEANUP_RETAIN);
        // Each figure is what one plan's change costs; the periodic write of every endpoint
        // (every 16th plan by default) would land in one of them at random.
        settings.full_write_every = u64::MAX;
        // Nor a reconcile (every 60 s by default), which at 1,000,000 endpoints lands in the
        // middle of the run.
        settings.reconcile_interval = Duration::from_secs(24 * 3600);
        let metrics = std::sync::Arc::new(Metrics::register(&mut Registry::default(), zone));
        let mut rx = stopped.clone();
        tokio::spawn(Enactor::new(store.clone(), settings, metrics).run(async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
    }
    Ok(stop)
}

/// How long one plan took: to publish, and from published to enacted everywhere.
struct Enacted {
    publish: Duration,
    /// The part of `publish` spent telling the plan as its changes against the parent, from
    /// the endpoints that can differ (`PlanDelta::between_named`, as the planner does), before
    /// the store's `publish_changes`.
    diff: Duration,
    /// Not part of `publish`: comparing the two plans whole (`PlanDelta::between`), what a
    /// caller that does not know its changes pays (`dnsplan plans publish FILE`).
    whole_diff: Duration,
    apply: Duration,
}

/// Publishes plan `g` where the first `changed` of `names` get generation `g`'s records and
/// the rest keep `keep`'s, then waits until every endpoint serves its records in plan `g`.
/// With `parent` (plan `g - 1`) the plan is sent as its changes against it, found from the
/// changed names as the planner finds them from its decision, else whole.
async fn enact<S: Store>(
    store: &S,
    g: u64,
    names: &[EndpointName],
    changed: usize,
    keep: Generation,
    parent: Option<&Plan>,
) -> anyhow::Result<(Enacted, Plan)> {
    let mut plan = dnsplan_tests::fixtures::plan(g, names, planner()).into_plan();
    for n in names.iter().skip(changed) {
        plan.endpoints.insert(n.clone(), endpoint_for(keep));
    }
    let plan = dnsplan_common::ValidatedPlan::new(plan)?;
    // Each changed endpoint's fence moves once (the first enactor switches it, the others
    // find it unchanged); unchanged endpoints are not written at all. Watching the counter
    // (in memory) keeps the observer off the store's lock.
    // A change larger than a change record (`PLAN_CHANGES_ENDPOINTS_MAX`) is published and
    // read whole, and each enactor then writes every endpoint: every fence moves.
    let changed = if changed > dnsplan_common::store::PLAN_CHANGES_ENDPOINTS_MAX { names.len() } else { changed };
    let before = store.version().await?.applied_changes;
    let whole = Instant::now();
    let whole_delta = parent.and_then(|parent| PlanDelta::between(parent, &plan));
    let whole_diff = whole.elapsed();
    // `publish_told`, with the time to tell the changes taken apart from the store's call.
    let started = Instant::now();
    let delta = parent.and_then(|parent| PlanDelta::between_named(parent, &plan, &names[..changed]));
    let diff = started.elapsed();
    anyhow::ensure!(delta == whole_delta, "plan {g}: the delta from the changed names is not the whole comparison's");
    publish_told(store, delta, &plan, None).await?;
    let published = Instant::now();
    let mut version = store.version().await?;
    while version.applied_changes < before + changed as u64 {
        anyhow::ensure!(published.elapsed() < PLAN_DEADLINE, "plan {g} was not enacted within {PLAN_DEADLINE:?}");
        version = store.wait_for_change(version, Duration::from_secs(30)).await?;
    }
    let enacted = Enacted { publish: published - started, diff, whole_diff, apply: published.elapsed() };
    let active = store.active_all().await?;
    let serves = |n: &EndpointName| {
        active.endpoints.get(n).is_some_and(|r| matches!(&r.state, ActiveState::Serving(e) if Some(e) == plan.plan().endpoints.get(n)))
    };
    anyhow::ensure!(names.iter().all(serves), "not every endpoint serves plan {g}");
    let switched = version.applied_changes - before;
    anyhow::ensure!(switched == changed as u64, "plan {g} switched {switched} endpoints, {changed} changed");
    // Every enactor done with plan `g` (its heartbeat follows the whole application), so none
    // still working on it is overtaken by the next plan: an enactor overtaken before it
    // finished a plan has no base and writes the next one in full, which the next figure
    // would count. Not part of the figures.
    all_enactors_done(store, Generation(g), published).await?;
    Ok((enacted, plan.into_plan()))
}

/// Waits until every bench enactor's heartbeat says it finished plan `g` (polled every 5 ms,
/// up to [`PLAN_DEADLINE`] after `since`).
async fn all_enactors_done<S: Store>(store: &S, g: Generation, since: Instant) -> anyhow::Result<()> {
    loop {
        let beats = store.heartbeats().await?;
        if ["bench-a", "bench-b", "bench-c"].iter().all(|id| beats.iter().any(|b| b.enactor_id == *id && b.last_applied >= g)) {
            return Ok(());
        }
        anyhow::ensure!(since.elapsed() < PLAN_DEADLINE, "the enactors did not all finish plan {g} within {PLAN_DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The plans of one store, with three enactors on it: a full plan, the plan after it, then
/// plans changing 1 endpoint, 1% and 10%. Prints one row each.
async fn phases<S: Store>(label: &str, store: &S, names: &[EndpointName]) -> anyhow::Result<u64> {
    let n = names.len();
    let row = |what: String, changed: usize, e: &Enacted| {
        let total = e.publish + e.apply;
        println!(
            "{:<52}{:>9.0}ms{:>10.1}ms{:>10.1}ms{:>12.0}",
            format!("{label}: {what}"),
            total.as_secs_f64() * 1e3,
            e.publish.as_secs_f64() * 1e3,
            e.apply.as_secs_f64() * 1e3,
            changed as f64 / total.as_secs_f64()
        );
    };
    let (e, plan) = enact(store, 1, names, n, Generation(1), None).await?;
    row("full plan enacted".into(), n, &e);
    // The plan after a full one also pays for the full one: each enactor's removal guard
    // catches up on its n switches (`active_since`) and reads the plan whole once more (its
    // base was a whole read). Then what a plan costs as a function of what it changes, each
    // sent as its changes (as the planner sends them), and once whole to compare.
    let (e, plan) = enact(store, 2, names, 1, Generation(1), Some(&plan)).await?;
    row("next plan (guards catch up on the full one)".into(), 1, &e);
    let (e, _) = enact(store, 3, names, 1, Generation(1), Some(&plan)).await?;
    row("plan changing 1 endpoint".into(), 1, &e);
    let (e, mut plan) = enact(store, 4, names, 1, Generation(1), None).await?;
    row("plan changing 1 endpoint, sent whole".into(), 1, &e);
    // The publish of one changed endpoint, as the planner sends it, over several plans.
    let (mut publishes, mut diffs, mut calls, mut whole_diffs) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut g = 5;
    for _ in 0..PUBLISH_SAMPLES {
        let (e, next) = enact(store, g, names, 1, Generation(1), Some(&plan)).await?;
        publishes.push(e.publish);
        diffs.push(e.diff);
        whole_diffs.push(e.whole_diff);
        calls.push(e.publish - e.diff);
        (plan, g) = (next, g + 1);
    }
    for samples in [&mut publishes, &mut diffs, &mut calls, &mut whole_diffs] {
        samples.sort();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{:<52}{:>21.1}ms", format!("{label}: publish of 1 changed endpoint p50 ({PUBLISH_SAMPLES} plans)"), ms(pct(&publishes, 0.5)));
    println!("{:<52}{:>21.1}ms", format!("{label}: publish of 1 changed endpoint p99"), ms(pct(&publishes, 0.99)));
    // Apart: the caller telling the change, and the store's `publish_changes`.
    println!("{:<52}{:>21.1}ms", format!("{label}:   telling the change (between_named) p50"), ms(pct(&diffs, 0.5)));
    println!("{:<52}{:>21.1}ms", format!("{label}:   the store's publish_changes p50"), ms(pct(&calls, 0.5)));
    println!("{:<52}{:>21.1}ms", format!("{label}:   the store's publish_changes p99"), ms(pct(&calls, 0.99)));
    // Not part of the publish above: what a caller that compares the plans whole pays.
    println!("{:<52}{:>21.1}ms", format!("{label}: whole comparison (PlanDelta::between) p50"), ms(pct(&whole_diffs, 0.5)));
    let one_pct = (n / 100).max(1);
    let (e, plan) = enact(store, g, names, one_pct, Generation(1), Some(&plan)).await?;
    row(format!("plan changing 1% ({one_pct})"), one_pct, &e);
    let ten_pct = (n / 10).max(1);
    let (e, _) = enact(store, g + 1, names, ten_pct, Generation(1), Some(&plan)).await?;
    row(format!("plan changing 10% ({ten_pct})"), ten_pct, &e);
    Ok(g + 1)
}

/// `--full-only=RUNS`: the full plan alone, published and enacted by three enactors on a new
/// store each run, embedded, then through the control API.
async fn full_plans(names: &[EndpointName], dir: &Path, runs: usize) -> anyhow::Result<()> {
    let row = |label: &str, run: usize, e: &Enacted| {
        let total = e.publish + e.apply;
        println!(
            "{:<52}{:>9.0}ms{:>10.1}ms{:>10.1}ms{:>12.0}",
            format!("{label}: full plan enacted (run {})", run + 1),
            total.as_secs_f64() * 1e3,
            e.publish.as_secs_f64() * 1e3,
            e.apply.as_secs_f64() * 1e3,
            names.len() as f64 / total.as_secs_f64()
        );
    };
    for run in 0..runs {
        let store = SledStore::open(dir.join(format!("full-{run}")))?;
        let stop = start_enactors(store.clone())?;
        let (e, _) = enact(&store, 1, names, names.len(), Generation(1), None).await?;
        row("embedded", run, &e);
        drop(stop);
    }
    for run in 0..runs {
        let remote_dir = dir.join(format!("full-remote-{run}"));
        std::fs::create_dir_all(&remote_dir)?;
        let authority = Authority::start(SledStore::open(remote_dir.join("store"))?, &remote_dir).await?;
        let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
        let stop = start_enactors(remote.clone())?;
        let (e, _) = enact(&remote, 1, names, names.len(), Generation(1), None).await?;
        row("remote", run, &e);
        drop(stop);
        authority.stop().await?;
    }
    Ok(())
}

/// The size of the zone file (master file) that serves what `plan` serves: a line per
/// address, names relative to the DNS zone, as `dns-bench-seed` writes it.
fn zone_file_bytes(plan: &Plan) -> usize {
    let origin = plan.dns_zone.as_str();
    plan.endpoints
        .iter()
        .map(|(name, records)| {
            let relative = name.as_str().strip_suffix(origin).map_or(name.as_str(), |r| r.trim_end_matches('.'));
            records.targets.iter().map(|t| format!("{relative} IN A {}\n", t.address).len()).sum::<usize>()
        })
        .sum()
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1).min(sorted.len() - 1)]
}

/// When `dns` first answers `name` with exactly `want`, counted from `started`; fails after
/// [`PLAN_DEADLINE`]. A query that fails (a lost datagram) is asked again.
async fn served_after(
    dns: SocketAddr,
    name: String,
    want: std::collections::BTreeSet<std::net::IpAddr>,
    started: Instant,
) -> anyhow::Result<Duration> {
    loop {
        if let Ok(answer) = dns_probe::query(dns, &name, RecordType::A, Duration::from_secs(1)).await
            && answer.addresses == want
        {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(started.elapsed() < PLAN_DEADLINE, "{dns} did not serve {name}'s new records within {PLAN_DEADLINE:?}");
    }
}

/// What `latency_everywhere` measured: the publish calls' durations, the publish-to-served
/// durations per address, and until served on all of them, each sorted; and the first
/// one-endpoint plan after the warm-up, served everywhere (not counted in the others).
struct Latency {
    publishes: Vec<Duration>,
    served: Vec<Vec<Duration>>,
    everywhere: Vec<Duration>,
    settle: Duration,
}

/// Publish-to-served latency: plans each changing one endpoint of `names` (the others keep
/// plan 1's records, as after `phases`), sent as their changes against the previous one (as
/// the planner sends them), each probed over DNS on every address of `dns` at once.
async fn latency_everywhere<S: Store>(store: &S, dns: &[SocketAddr], names: &[EndpointName], from: u64) -> anyhow::Result<Latency> {
    let target = &names[0];
    let (mut publishes, mut served, mut everywhere) = (Vec::new(), vec![Vec::new(); dns.len()], Vec::new());
    let mut settle = Duration::ZERO;
    let mut parent = store.plan(Generation(from - 1)).await?.into_plan();
    // Plan `from` is a warm-up and not counted; the enactors finish it before the next plan.
    // That next plan, `from + 1`, is not counted either: the authorities are still merging
    // the warm-up's whole state when it comes (every endpoint written again), and it waits
    // for that (about 150 ms at 100,000 names, 370 ms signed); it is reported on its own.
    for i in 0..=LATENCY_SAMPLES as u64 + 1 {
        let g = from + i;
        let mut plan = dnsplan_tests::fixtures::plan(g, &names[1..], planner()).into_plan();
        for records in plan.endpoints.values_mut() {
            *records = endpoint_for(Generation(1));
        }
        plan.endpoints.insert(target.clone(), endpoint_for(Generation(g)));
        let plan = dnsplan_common::ValidatedPlan::new(plan)?;
        let want: std::collections::BTreeSet<_> = endpoint_for(Generation(g)).targets.iter().map(|t| t.address).collect();
        let started = Instant::now();
        // After the warm-up (whose parent is whatever came before) only `target` changes, and
        // the plan is told from it as the planner tells its changes.
        let delta = if i == 0 {
            PlanDelta::between(&parent, &plan)
        } else {
            PlanDelta::between_named(&parent, &plan, std::slice::from_ref(target))
        };
        publish_told(store, delta, &plan, None).await?;
        let published = started.elapsed();
        let probes: Vec<_> =
            dns.iter().map(|&addr| tokio::spawn(served_after(addr, target.as_str().to_string(), want.clone(), started))).collect();
        let mut last = Duration::ZERO;
        for (k, probe) in probes.into_iter().enumerate() {
            let after = probe.await??;
            last = last.max(after);
            if i > 1 {
                served[k].push(after);
            }
        }
        if i > 1 {
            publishes.push(published);
            everywhere.push(last);
        } else if i == 1 {
            settle = last;
        } else {
            // The warm-up plan also puts back every endpoint the plans before this phase
            // changed, which the enactors are still writing when the target serves: the
            // figures are of one-endpoint changes, not of that backlog.
            all_enactors_done(store, Generation(g), started).await?;
        }
        parent = plan.into_plan();
    }
    publishes.sort();
    everywhere.sort();
    for s in &mut served {
        s.sort();
    }
    Ok(Latency { publishes, served, everywhere, settle })
}

/// An authority following the store on etcd, in this process, with the config a user writes
/// (`[store] kind = "etcd"`), so the connect and the saved local state are the shipped ones.
struct EtcdAuthority {
    dns: SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl EtcdAuthority {
    /// Starts one with its config and data in `dir`; returns once DNS answers, or fails after
    /// [`AUTHORITY_DEADLINE`].
    async fn start(dir: &Path, endpoints: &[String]) -> anyhow::Result<EtcdAuthority> {
        use dnsplan_authority::run::{Bound, run};
        std::fs::create_dir_all(dir)?;
        let quoted: Vec<String> = endpoints.iter().map(|e| format!("\"{e}\"")).collect();
        let text = format!(
            "{}\n[store]\nkind = \"etcd\"\nendpoints = [{}]\nprefix = \"{ETCD_PREFIX}\"\n",
            dnsplan_tests::stack::authority_config_text(&dir.join("data")),
            quoted.join(", ")
        );
        let path = dir.join("authority.toml");
        std::fs::write(&path, text)?;
        let config = dnsplan_authority::config::AuthorityConfig::load(&path)?;
        let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
        let config_dir = dir.to_path_buf();
        let task = tokio::spawn(async move {
            run(config, &config_dir, async move { stop_rx.await.unwrap_or(()) }, move |b| {
                let _ = bound_tx.send(b);
            })
            .await
        });
        match tokio::time::timeout(AUTHORITY_DEADLINE, bound_rx).await {
            Ok(Ok(bound)) => Ok(EtcdAuthority { dns: bound.dns[0], stop, task }),
            Ok(Err(_)) => match task.await {
                Ok(Err(err)) => anyhow::bail!("an authority on etcd stopped before serving: {err:#}"),
                other => anyhow::bail!("an authority on etcd stopped before serving: {other:?}"),
            },
            Err(_) => {
                task.abort();
                anyhow::bail!("an authority on etcd did not answer DNS within {AUTHORITY_DEADLINE:?}")
            }
        }
    }

    async fn stop(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        match tokio::time::timeout(AUTHORITY_DEADLINE, self.task).await {
            Ok(result) => result?,
            Err(_) => anyhow::bail!("an authority on etcd did not stop within {AUTHORITY_DEADLINE:?}"),
        }
    }
}

/// The etcd part: a three-member cluster on loopback (data under `dir`, or in memory), a
/// one-writer baseline, the plans of `phases` with three enactors on `EtcdStore`, then
/// publish-to-served on two authorities following etcd. Stops the authorities and the cluster
/// before it returns (the cluster also when it fails: dropping it kills its members).
async fn etcd_part(names: &[EndpointName], dir: &Path, in_memory: bool, txn_ops: Option<usize>) -> anyhow::Result<()> {
    let n = names.len();
    let txn_ops_arg = txn_ops.map(|t| t.to_string());
    let args: Vec<&str> = match &txn_ops_arg {
        Some(t) => vec!["--max-txn-ops", t],
        None => Vec::new(),
    };
    let cluster = match in_memory {
        true => EtcdCluster::start(3, &args).await?,
        false => EtcdCluster::start_with_data_under(dir, 3, &args).await?,
    };
    let connect = || async {
        let mut config = cluster.config(ETCD_PREFIX);
        if let Some(t) = txn_ops {
            config.txn_ops_max = t;
        }
        anyhow::Ok(EtcdStore::connect(config).await?)
    };
    let ms = |d: Duration| d.as_secs_f64() * 1e3;

    // Baseline: single-writer fenced applies, each its own transaction.
    let raw = cluster.store("/raw/").await?;
    let count = 200.min(n);
    raw.publish(&dnsplan_tests::fixtures::plan(1, &names[..count], planner())).await?;
    let started = Instant::now();
    for nm in &names[..count] {
        raw.apply(nm, Generation(1), &endpoint_for(Generation(1))).await?;
    }
    let baseline = count as f64 / started.elapsed().as_secs_f64();
    println!("{:<52}{:>11}{:>12}{:>12}{:>12.0}", format!("baseline: fenced apply, 1 writer, etcd ({count})"), "", "", "", baseline);
    drop(raw);

    // Three enactors on etcd directly, each with its own connection, as separate daemons.
    let store = connect().await?;
    let enactor_stores: [EtcdStore; 3] = [connect().await?, connect().await?, connect().await?];
    let stop = start_enactors_on(enactor_stores)?;
    let last = phases("etcd", &store, names).await?;

    // Two authorities following etcd, started after the plans (as the remote phase's
    // authority, they would otherwise share these two cores with the enactors and etcd).
    let endpoints = cluster.endpoints();
    let first = EtcdAuthority::start(&dir.join("etcd-authority-1"), &endpoints).await?;
    let second = match EtcdAuthority::start(&dir.join("etcd-authority-2"), &endpoints).await {
        Ok(second) => second,
        Err(err) => {
            let _ = first.stop().await;
            return Err(err);
        }
    };
    let measured = latency_everywhere(&store, &[first.dns, second.dns], names, last + 1).await;
    drop(stop);
    let stopped = (first.stop().await, second.stop().await);
    let Latency { publishes, served, everywhere, settle } = measured?;
    stopped.0?;
    stopped.1?;
    println!("{:<52}{:>9.1}ms", "etcd: publish-to-served, first plan after the warm-up", ms(settle));
    println!("{:<52}{:>9.1}ms", format!("etcd: publish of 1 changed endpoint p50 ({LATENCY_SAMPLES} plans)"), ms(pct(&publishes, 0.5)));
    println!("{:<52}{:>21.1}ms", "etcd: publish of 1 changed endpoint p99", ms(pct(&publishes, 0.99)));
    for (k, samples) in served.iter().enumerate() {
        let a = k + 1;
        println!(
            "{:<52}{:>9.1}ms",
            format!("etcd: publish-to-served p50, authority {a} ({LATENCY_SAMPLES} plans, {n}-name zone)"),
            ms(pct(samples, 0.5))
        );
        println!("{:<52}{:>9.1}ms", format!("etcd: publish-to-served p99, authority {a}"), ms(pct(samples, 0.99)));
    }
    println!("{:<52}{:>9.1}ms", "etcd: publish-to-served by both p50", ms(pct(&everywhere, 0.5)));
    println!("{:<52}{:>9.1}ms", "etcd: publish-to-served by both p99", ms(pct(&everywhere, 0.99)));
    drop(store);
    drop(cluster);
    Ok(())
}

/// Resident memory of this process, from /proc (Linux).
fn rss_bytes() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).context("statm has no resident field")?.parse()?;
    Ok(pages * 4096)
}

/// Bytes of resident memory the authority's serving snapshot takes per managed name (2-4
/// addresses each), measured around building one.
fn snapshot_bytes_per_name(n: usize) -> anyhow::Result<f64> {
    use dnsplan_authority::zone::dns_zone::StaticZone;
    let config = dnsplan_tests::stack::dns_zone_config(None);
    let zone = StaticZone::load(&config, std::path::Path::new("."))?;
    let mut active = dnsplan_common::ActiveSnapshot::default();
    let zone_a = dnsplan_common::ZoneId::parse("a")?;
    for i in 0..n {
        let name = name(&format!("m{i}"));
        let targets = (0..2 + i % 3)
            .map(|k| dnsplan_common::Target {
                address: std::net::Ipv4Addr::from(0x0a00_0000 + (i as u32) * 4 + k as u32).into(),
                zone: zone_a.clone(),
                weight: 1,
            })
            .collect();
        let records = dnsplan_common::Endpoint { ttl_secs: 300, targets };
        active.endpoints.insert(name, dnsplan_common::ActiveRecord { generation: Generation(1), state: ActiveState::Serving(records) });
    }
    let before = rss_bytes()?;
    let snapshot = dnsplan_authority::zone::snapshot::Snapshot::build(std::sync::Arc::new(zone), &active);
    let after = rss_bytes()?;
    anyhow::ensure!(snapshot.managed_count() == n, "the snapshot holds {} names, want {n}", snapshot.managed_count());
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    // The in-process authorities' and stores' logs, on stderr, only when asked for.
    if std::env::var_os("RUST_LOG").is_some() {
        dnsplan_common::daemon::init(dnsplan_common::daemon::LogFormat::Text);
    }
    let (mut n, mut etcd, mut in_memory, mut txn_ops, mut full_only, mut dnssec) = (10_000usize, true, false, None, None, false);
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--no-etcd" => etcd = false,
            "--dnssec" => dnssec = true,
            other if other.starts_with("--full-only=") => {
                let value = &other["--full-only=".len()..];
                full_only = Some(value.parse::<usize>().with_context(|| format!("--full-only takes a number, not {value:?}"))?);
            }
            "--etcd-in-memory" => in_memory = true,
            other if other.starts_with("--etcd-max-txn-ops=") => {
                let value = &other["--etcd-max-txn-ops=".len()..];
                txn_ops = Some(value.parse::<usize>().with_context(|| format!("--etcd-max-txn-ops takes a number, not {value:?}"))?);
            }
            other => {
                n = other.parse().with_context(|| {
                    format!(
                        "ENDPOINTS must be a number, not {other:?}; usage: plans-bench [--no-etcd] [--etcd-in-memory] [--etcd-max-txn-ops=N] [--full-only=RUNS] [--dnssec] [ENDPOINTS]"
                    )
                })?
            }
        }
    }
    if etcd {
        // Before the sled part, not after it.
        dnsplan_tests::etcd::check_etcd_installed()?;
    }
    let names: Vec<EndpointName> = (0..n).map(|i| name(&format!("e{i}"))).collect();
    // First, while the heap is fresh: later phases leave freed memory that a new snapshot
    // would reuse without growing the resident set.
    let per_name = snapshot_bytes_per_name(100_000)?;
    println!("control-plane benchmark: {n} endpoints, three enactors");
    println!("{:<52}{:>11}{:>12}{:>12}{:>12}", "figure", "total", "publish", "apply", "changed/s");

    // Baseline: single-writer fenced applies on the same disk, same run.
    let dir = tempfile::tempdir()?;
    let raw = SledStore::open(dir.path().join("raw"))?;
    let count = 1_000.min(n);
    raw.publish(&dnsplan_tests::fixtures::plan(1, &names[..count], planner())).await?;
    let started = Instant::now();
    for nm in &names[..count] {
        raw.apply(nm, Generation(1), &endpoint_for(Generation(1))).await?;
    }
    let baseline = count as f64 / started.elapsed().as_secs_f64();
    println!("{:<52}{:>11}{:>12}{:>12}{:>12.0}", "baseline: fenced apply, 1 writer, embedded", "", "", "", baseline);
    drop(raw);

    if let Some(runs) = full_only {
        return full_plans(&names, dir.path(), runs).await;
    }

    // Embedded: the store in-process, as `dnsplan up` runs the enactors.
    let embedded = SledStore::open(dir.path().join("embedded"))?;
    let stop = start_enactors(embedded.clone())?;
    let last = phases("embedded", &embedded, &names).await?;
    drop(stop);
    // The store on disk after those plans and a cleanup, beside the zone file that says
    // what the latest plan serves.
    embedded.cleanup(CLEANUP_RETAIN).await?;
    let zone = zone_file_bytes(embedded.plan(Generation(last)).await?.plan());
    let disk = dnsplan_tests::fixtures::dir_bytes(&dir.path().join("embedded"));
    println!(
        "{:<52}{:>9.1}MB  zone file {:.1} MB, {:.2}x",
        format!("embedded: store on disk ({last} plans, cleanup keeping {CLEANUP_RETAIN})"),
        disk as f64 / 1e6,
        zone as f64 / 1e6,
        disk as f64 / zone as f64
    );

    // Remote: the enactors through the control API, as separate daemons run.
    let remote_dir = dir.path().join("remote");
    std::fs::create_dir_all(&remote_dir)?;
    let store = SledStore::open(remote_dir.join("store"))?;
    let mut options = dnsplan_tests::stack::AuthorityOptions::default();
    if dnssec {
        dnsplan_common::dnssec::ZoneKey::create(&remote_dir.join("zone.key"), dnsplan_common::dnssec::ZoneAlgorithm::EcdsaP256Sha256)?;
        options.extra_config = "[dns_zone.dnssec]\nkey_file = \"zone.key\"\n".into();
        println!("the authority behind the control API signs the zone (ECDSA P-256)");
    }
    let authority = Authority::start_with(store, &remote_dir, &options).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let stop = start_enactors(remote.clone())?;
    let last = phases("remote", &remote, &names).await?;
    let Latency { publishes, mut served, settle, .. } = latency_everywhere(&remote, &[authority.dns], &names, last + 1).await?;
    let samples = served.pop().unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{:<52}{:>9.1}ms", "remote: publish-to-served, first plan after the warm-up", ms(settle));
    println!("{:<52}{:>9.1}ms", format!("remote: publish of 1 changed endpoint p50 ({LATENCY_SAMPLES} plans)"), ms(pct(&publishes, 0.5)));
    println!("{:<52}{:>21.1}ms", "remote: publish of 1 changed endpoint p99", ms(pct(&publishes, 0.99)));
    println!("{:<52}{:>9.1}ms", format!("remote: publish-to-served p50 ({LATENCY_SAMPLES} plans, {n}-name zone)"), ms(pct(&samples, 0.5)));
    println!("{:<52}{:>9.1}ms", "remote: publish-to-served p99", ms(pct(&samples, 0.99)));
    drop(stop);
    authority.stop().await?;
    println!("{:<52}{:>11.0}", "authority: snapshot bytes per managed name (100k)", per_name);

    if etcd {
        let where_ = if in_memory { "in memory (/dev/shm)" } else { "on disk, as sled's" };
        let ops = txn_ops.unwrap_or(128);
        println!(
            "etcd: three members on loopback, data {where_}, max-txn-ops {ops}; enactors on EtcdStore, no authority in their write path"
        );
        etcd_part(&names, dir.path(), in_memory, txn_ops).await?;
    }
    Ok(())
}
