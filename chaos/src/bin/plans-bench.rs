//! Control-plane benchmark: a plan of N endpoints (default 10,000) enacted by three enactors
//! on the embedded store (as `dnsplan up` runs them) and through the control API (as separate
//! daemons do); plans changing 1 endpoint, 1% and 10% of them, each timed as publish and as
//! apply (published to enacted everywhere); and publish-to-served latency seen by a DNS
//! client. Run it through `bench/plans.sh`; figures are printed with a raw store baseline
//! from the same run (fenced applies/s with one writer), because only ratios travel.
//!
//! Usage: plans-bench [ENDPOINTS] (default 10000)

use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::{ActiveState, publish_against};
use dnsplan_common::{EndpointName, Generation, Plan, SledStore, Store};
use dnsplan_enactor::{Enactor, Metrics, Settings};
use dnsplan_tests::fixtures::{endpoint_for, name, planner};
use dnsplan_tests::stack::{Authority, TOKEN};
use prometheus_client::registry::Registry;
use std::time::{Duration, Instant};

const LATENCY_SAMPLES: usize = 50;
/// One-endpoint plans each store publishes as changes in `phases`.
const PUBLISH_SAMPLES: usize = 20;

/// Three enactors on `store` until the returned sender is dropped.
fn start_enactors<S: Store>(store: S) -> anyhow::Result<tokio::sync::watch::Sender<bool>> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    for zone in ["a", "b", "c"] {
        let mut settings = Settings::new(&format!("bench-{zone}"), dnsplan_common::ZoneId::parse(zone)?);
        settings.max_removal_fraction = 1.0; // fixture plans replace every address
        settings.cleanup_retain = Some(20);
        // Each figure is what one plan's change costs; the periodic write of every endpoint
        // (every 16th plan by default) would land in one of them at random.
        settings.full_write_every = u64::MAX;
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
    apply: Duration,
}

/// Publishes plan `g` where the first `changed` of `names` get generation `g`'s records and
/// the rest keep `keep`'s, then waits until every endpoint serves its records in plan `g`.
/// With `parent` (plan `g - 1`) the plan is sent as its changes against it (what the planner
/// does), else whole.
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
    let before = store.version().await?.applied_changes;
    let started = Instant::now();
    publish_against(store, parent, &plan, None).await?;
    let published = Instant::now();
    let mut version = store.version().await?;
    while version.applied_changes < before + changed as u64 {
        version = store.wait_for_change(version, Duration::from_secs(30)).await?;
    }
    let enacted = Enacted { publish: published - started, apply: published.elapsed() };
    let active = store.active_all().await?;
    let serves = |n: &EndpointName| {
        active.endpoints.get(n).is_some_and(|r| matches!(&r.state, ActiveState::Serving(e) if Some(e) == plan.plan().endpoints.get(n)))
    };
    anyhow::ensure!(names.iter().all(serves), "not every endpoint serves plan {g}");
    let switched = version.applied_changes - before;
    anyhow::ensure!(switched == changed as u64, "plan {g} switched {switched} endpoints, {changed} changed");
    Ok((enacted, plan.into_plan()))
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
    let mut publishes = Vec::new();
    let mut g = 5;
    for _ in 0..PUBLISH_SAMPLES {
        let (e, next) = enact(store, g, names, 1, Generation(1), Some(&plan)).await?;
        publishes.push(e.publish);
        (plan, g) = (next, g + 1);
    }
    publishes.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{:<52}{:>21.1}ms", format!("{label}: publish of 1 changed endpoint p50 ({PUBLISH_SAMPLES} plans)"), ms(pct(&publishes, 0.5)));
    println!("{:<52}{:>21.1}ms", format!("{label}: publish of 1 changed endpoint p99"), ms(pct(&publishes, 0.99)));
    let one_pct = (n / 100).max(1);
    let (e, plan) = enact(store, g, names, one_pct, Generation(1), Some(&plan)).await?;
    row(format!("plan changing 1% ({one_pct})"), one_pct, &e);
    let ten_pct = (n / 10).max(1);
    let (e, _) = enact(store, g + 1, names, ten_pct, Generation(1), Some(&plan)).await?;
    row(format!("plan changing 10% ({ten_pct})"), ten_pct, &e);
    Ok(g + 1)
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p).ceil() as usize).saturating_sub(1).min(sorted.len() - 1)]
}

/// Publish-to-served latency: plans each changing one endpoint of `names` (the others keep
/// plan 1's records, as after `phases`), sent as their changes against the previous one (as
/// the planner sends them). Returns the publish calls' durations and the publish-to-served
/// durations, each sorted.
async fn latency(
    store: &RemoteStore,
    dns: std::net::SocketAddr,
    names: &[EndpointName],
    from: u64,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let target = &names[0];
    let (mut publishes, mut served) = (Vec::new(), Vec::new());
    let mut parent = store.plan(Generation(from - 1)).await?.into_plan();
    // Plan `from` is a warm-up and not counted.
    for i in 0..=LATENCY_SAMPLES as u64 {
        let g = from + i;
        let mut plan = dnsplan_tests::fixtures::plan(g, &names[1..], planner()).into_plan();
        for records in plan.endpoints.values_mut() {
            *records = endpoint_for(Generation(1));
        }
        plan.endpoints.insert(target.clone(), endpoint_for(Generation(g)));
        let plan = dnsplan_common::ValidatedPlan::new(plan)?;
        let want: std::collections::BTreeSet<_> = endpoint_for(Generation(g)).targets.iter().map(|t| t.address).collect();
        let started = Instant::now();
        publish_against(store, Some(&parent), &plan, None).await?;
        let published = started.elapsed();
        loop {
            let answer = dns_probe::query(dns, target.as_str(), RecordType::A, Duration::from_secs(1)).await?;
            if answer.addresses == want {
                if i > 0 {
                    publishes.push(published);
                    served.push(started.elapsed());
                }
                break;
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(30), "plan {g} was never served");
        }
        parent = plan.into_plan();
    }
    publishes.sort();
    served.sort();
    Ok((publishes, served))
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
    use dnsplan_authority::dns_zone::StaticZone;
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
    let snapshot = dnsplan_authority::snapshot::Snapshot::build(std::sync::Arc::new(zone), &active);
    let after = rss_bytes()?;
    anyhow::ensure!(snapshot.managed_count() == n, "the snapshot holds {} names, want {n}", snapshot.managed_count());
    Ok(after.saturating_sub(before) as f64 / n as f64)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::args().nth(1).map(|a| a.parse()).transpose().context("ENDPOINTS must be a number")?.unwrap_or(10_000);
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

    // Embedded: the store in-process, as `dnsplan up` runs the enactors.
    let embedded = SledStore::open(dir.path().join("embedded"))?;
    let stop = start_enactors(embedded.clone())?;
    phases("embedded", &embedded, &names).await?;
    drop(stop);

    // Remote: the enactors through the control API, as separate daemons run.
    let remote_dir = dir.path().join("remote");
    std::fs::create_dir_all(&remote_dir)?;
    let store = SledStore::open(remote_dir.join("store"))?;
    let authority = Authority::start(store, &remote_dir).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let stop = start_enactors(remote.clone())?;
    let last = phases("remote", &remote, &names).await?;
    let (publishes, samples) = latency(&remote, authority.dns, &names, last + 1).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{:<52}{:>9.1}ms", format!("remote: publish of 1 changed endpoint p50 ({LATENCY_SAMPLES} plans)"), ms(pct(&publishes, 0.5)));
    println!("{:<52}{:>21.1}ms", "remote: publish of 1 changed endpoint p99", ms(pct(&publishes, 0.99)));
    println!("{:<52}{:>9.1}ms", format!("remote: publish-to-served p50 ({LATENCY_SAMPLES} plans, {n}-name zone)"), ms(pct(&samples, 0.5)));
    println!("{:<52}{:>9.1}ms", "remote: publish-to-served p99", ms(pct(&samples, 0.99)));
    drop(stop);
    authority.stop().await?;
    println!("{:<52}{:>11.0}", "authority: snapshot bytes per managed name (100k)", per_name);
    Ok(())
}
