//! A planner on the embedded store, pointed at real TCP listeners on loopback: it publishes
//! the first plan, removes a target whose listener goes away, brings it back, and trips the
//! breaker (pausing automation) on a mass change.

use dnsplan_common::{Generation, SledStore, Store, ValidatedPlan};
use dnsplan_planner::health::{HealthBook, spawn_checks};
use dnsplan_planner::metrics::Metrics;
use dnsplan_planner::{Planner, PlannerConfig};
use prometheus_client::registry::Registry;
use std::sync::Arc;

mod support;

use support::{Backends, WITHIN, config_text, wait_plan, weight};

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    _checks: tokio::task::JoinSet<()>,
}

fn start(store: SledStore, config: PlannerConfig) -> Running {
    let config = Arc::new(config);
    let metrics = Arc::new(Metrics::register(&mut Registry::default(), &config.id));
    let book = Arc::new(HealthBook::default());
    let checks = spawn_checks(&config, book.clone(), metrics.clone());
    let planner = Planner::new(store, config, book, metrics);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(planner.run(async move {
        let _ = stopped.await;
    }));
    Running { stop, task, _checks: checks }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_real_listeners_up_and_down() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let mut backends = Backends::start().await?;
    let config = PlannerConfig::parse(&config_text(backends.port, "")).map_err(anyhow::Error::msg)?;
    let planner = start(store.clone(), config);

    let first = wait_plan(&store, |_| true).await?;
    assert_eq!(first.generation(), Generation(1));
    assert!(first.plan().endpoints.values().all(|e| e.targets.iter().all(|t| t.weight == 1)), "{first:?}");

    backends.stop("127.0.1.3")?;
    let removed = wait_plan(&store, |p| weight(p, "api.example.test.", "127.0.1.3") == Some(0)).await?;
    assert!(
        removed.plan().provenance.iter().any(|p| p.rule == "health" && p.detail.contains("127.0.1.3")),
        "{:?}",
        removed.plan().provenance
    );
    let others: Vec<u32> = removed
        .plan()
        .endpoints
        .values()
        .flat_map(|e| &e.targets)
        .filter(|t| t.address.to_string() != "127.0.1.3")
        .map(|t| t.weight)
        .collect();
    assert!(others.iter().all(|w| *w == 1), "healthy targets lost weight: {removed:?}");

    backends.start_again("127.0.1.3").await?;
    let back = wait_plan(&store, |p| weight(p, "api.example.test.", "127.0.1.3") == Some(1)).await?;
    assert!(back.generation() > removed.generation());
    // Generations are contiguous and every plan is this planner's.
    let plans = store.list(Generation::NONE, 1_000).await?;
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(p.generation, Generation(i as u64 + 1));
        assert_eq!(p.author.to_string(), "planner:p1");
    }
    let _ = planner.stop.send(());
    planner.task.await?;
    // A clean stop gives the lease up at once.
    let lease = store.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease"))?;
    assert!(!lease.is_live(dnsplan_common::store::lease::now_unix_ms()), "{lease:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mass_change_pauses_automation() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let mut backends = Backends::start().await?;
    let config = PlannerConfig::parse(&config_text(backends.port, "breaker_endpoint_fraction = 0.4\nbreaker_min_changed = 1"))
        .map_err(anyhow::Error::msg)?;
    let planner = start(store.clone(), config);
    let first = wait_plan(&store, |_| true).await?;

    // One target of each endpoint, in different zones (no zone is impaired).
    backends.stop("127.0.1.1")?;
    backends.stop("127.0.2.3")?;
    let paused = tokio::time::timeout(WITHIN, async {
        loop {
            let version = store.version().await?;
            if let Some(p) = store.paused().await? {
                return anyhow::Ok(p);
            }
            store.wait_for_change(version, WITHIN).await?;
        }
    })
    .await??;
    assert_eq!(paused.by, "planner:p1");
    assert!(paused.reason.contains("breaker"), "{paused:?}");
    assert_eq!(store.latest().await?, first.generation(), "nothing may be published when the breaker trips");
    let _ = planner.stop.send(());
    planner.task.await?;
    Ok(())
}

/// An endpoint served but missing from the latest plan (an operator's plan left it out) is
/// adopted into the planner's next plan as served and marked unmanaged; one a plan retired
/// since, which the enactors have not applied yet, is not brought back. Without the adoption
/// the left-out endpoint is missing from every later plan (seen once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_endpoints_missing_from_the_latest_plan_are_adopted() -> anyhow::Result<()> {
    use dnsplan_common::{Author, DnsName, Endpoint, Plan, Target, ZoneId};
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let (legacy, gone, never) =
        (DnsName::parse("legacy.example.test.")?, DnsName::parse("gone.example.test.")?, DnsName::parse("never.example.test.")?);
    let records = Endpoint { ttl_secs: 30, targets: vec![Target { address: "192.0.2.7".parse()?, zone: ZoneId::parse("a")?, weight: 1 }] };
    let operator_plan = |g: u64, endpoints: &[&DnsName], retired: &[&DnsName]| {
        ValidatedPlan::new(Plan {
            generation: Generation(g),
            parent_generation: Generation(g - 1),
            created_at_unix_ms: 0,
            author: Author::Operator { name: "alice".into() },
            reason: "by hand".into(),
            dns_zone: DnsName::parse("example.test.").expect("zone"),
            endpoints: endpoints.iter().map(|n| ((*n).clone(), records.clone())).collect(),
            retired: retired.iter().map(|n| (*n).clone()).collect(),
            rollback_of: None,
            provenance: vec![],
        })
    };
    store.publish(&operator_plan(1, &[&legacy, &gone], &[])?).await?;
    store.apply(&legacy, Generation(1), &records).await?;
    store.apply(&gone, Generation(1), &records).await?;
    // Plan 2 retires gone (not enacted yet); plan 3 leaves legacy out without retiring it.
    store.publish(&operator_plan(2, &[&legacy], &[&gone])?).await?;
    store.publish(&operator_plan(3, &[], &[&never])?).await?;

    let backends = Backends::start().await?;
    let config = PlannerConfig::parse(&config_text(backends.port, "")).map_err(anyhow::Error::msg)?;
    let planner = start(store.clone(), config);
    let next = wait_plan(&store, |p| p.generation() > Generation(3)).await?;
    assert_eq!(next.plan().endpoints.get(&legacy), Some(&records), "legacy is not carried as served: {next:?}");
    assert!(
        next.plan().provenance.iter().any(|p| p.endpoint == legacy && p.rule == dnsplan_planner::decide::UNMANAGED_RULE),
        "legacy is not marked unmanaged: {:?}",
        next.plan().provenance
    );
    assert!(!next.plan().endpoints.contains_key(&gone), "a retirement in flight was undone: {next:?}");
    let _ = planner.stop.send(());
    planner.task.await?;
    Ok(())
}
