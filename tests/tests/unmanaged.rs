//! An endpoint removed from the planner's config: the planner's plans keep it as served
//! (unmanaged), so it keeps answering and never holds back cleanup; an operator retires it
//! and it answers NXDOMAIN.
//!
//! Without the carry-forward in `decide` (plans that leave the endpoint out), its fence stays
//! at the last plan that named it, cleanup deletes nothing from then on, and this test fails
//! on the count of stored plans (seen once: 23 plans stored at plan 23, and growing).

use dnsplan_cli::workflow;
use dnsplan_common::dns_probe::{self, RecordType, ResponseCode};
use dnsplan_common::{Author, Generation, Plan, SledStore, Store, ValidatedPlan, ZoneId};
use dnsplan_enactor::hooks::{Event, HookFuture, Hooks};
use dnsplan_enactor::{Enactor, Metrics, Settings};
use dnsplan_planner::config::PlannerConfig;
use dnsplan_planner::decide::{Decision, Health, HealthView, PlannerState, UNMANAGED_RULE, decide};
use dnsplan_tests::fixtures::name;
use prometheus_client::registry::Registry;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const PLANS: u64 = 1_000;
const RETAIN: u64 = 5;
const FULL_WRITE_EVERY: u64 = 16;
const WITHIN: Duration = Duration::from_secs(20);

struct Events(mpsc::UnboundedSender<Event>);

impl Hooks for Events {
    fn before_write<'a>(&'a self, _: &'a str, _: Generation, _: &'a dnsplan_common::EndpointName) -> HookFuture<'a> {
        Box::pin(async {})
    }
    fn before_cleanup<'a>(&'a self, _: &'a str, _: Generation) -> HookFuture<'a> {
        Box::pin(async {})
    }
    fn event(&self, event: Event) {
        let _ = self.0.send(event);
    }
}

/// The planner config: `api` with four targets, and `old` unless `with_old` is false.
fn config(with_old: bool) -> anyhow::Result<PlannerConfig> {
    let mut text = String::from(
        "id = \"p1\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://127.0.0.1:8053\"\n[policy]\nremoval_fraction_per_window = 1.0\nwindow_secs = 1\nbreaker_min_changed = 1000000\n",
    );
    text.push_str("[[endpoint]]\nname = \"api.example.test.\"\nttl_secs = 30\ncheck = { kind = \"tcp\", port = 80 }\n");
    for n in 1..=4 {
        text.push_str(&format!("[[endpoint.target]]\naddress = \"10.0.0.{n}\"\nzone = \"a\"\n"));
    }
    if with_old {
        text.push_str("[[endpoint]]\nname = \"old.example.test.\"\nttl_secs = 30\ncheck = { kind = \"tcp\", port = 80 }\n");
        text.push_str("[[endpoint.target]]\naddress = \"10.9.9.9\"\nzone = \"a\"\n");
    }
    PlannerConfig::parse(&text).map_err(|e| anyhow::anyhow!("test planner config: {e}"))
}

/// Decides with api's first target down on even steps, and publishes what was decided.
async fn plan_next(store: &SledStore, config: &PlannerConfig, step: u64, rng: &mut SmallRng) -> anyhow::Result<Plan> {
    let mut health = HealthView::new();
    for ep in config.endpoints() {
        for t in &ep.targets {
            let down = step.is_multiple_of(2) && t.address.to_string() == "10.0.0.1";
            health.insert((ep.name.clone(), t.address), if down { Health::Down } else { Health::Up });
        }
    }
    let latest = store.latest().await?;
    let previous = if latest.is_none() { None } else { Some(store.plan(latest).await?.into_plan()) };
    let outcome = decide(config, &health, previous.as_ref(), &PlannerState::default(), step * 1_000, rng);
    let Decision::Publish { endpoints, provenance, reason, .. } = outcome.decision else {
        anyhow::bail!("step {step}: the planner decided {}", outcome.decision.describe());
    };
    let next = latest.next().expect("far from exhausted");
    let plan = Plan {
        generation: next,
        parent_generation: latest,
        created_at_unix_ms: step * 1_000,
        author: Author::Planner { id: "p1".into() },
        reason,
        dns_zone: config.dns_zone.clone(),
        endpoints,
        retired: Default::default(),
        rollback_of: None,
        provenance,
    };
    store.publish(&ValidatedPlan::new(plan.clone())?).await?;
    Ok(plan)
}

/// Asks DNS until `want` holds for the answer: the authority follows the store a moment after
/// an enactor reports a plan done.
async fn until_answer(
    dns: std::net::SocketAddr,
    name: &str,
    want: impl Fn(&dns_probe::DnsAnswer) -> bool,
) -> anyhow::Result<dns_probe::DnsAnswer> {
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let answer = dns_probe::query(dns, name, RecordType::A, Duration::from_secs(2)).await?;
        if want(&answer) {
            return Ok(answer);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "{name}: still {answer:?} after {WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn until_done(events: &mut mpsc::UnboundedReceiver<Event>, g: Generation) -> anyhow::Result<()> {
    loop {
        match tokio::time::timeout(WITHIN, events.recv()).await? {
            Some(Event::PlanDone { generation, .. }) if generation >= g => return Ok(()),
            Some(Event::PlanRefused { generation, .. }) => anyhow::bail!("the enactor refused plan {generation}"),
            Some(_) => {}
            None => anyhow::bail!("the enactor stopped"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_dropped_from_the_config_keeps_answering_and_never_blocks_cleanup() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path().join("store"))?;
    let authority = dnsplan_tests::stack::Authority::start(store.clone(), dir.path()).await?;
    let mut settings = Settings::new("en-a", ZoneId::parse("a")?);
    settings.cleanup_retain = Some(RETAIN);
    settings.full_write_every = FULL_WRITE_EVERY;
    let metrics = Arc::new(Metrics::register(&mut Registry::default(), "en-a"));
    let (tx, mut events) = mpsc::unbounded_channel();
    let enactor = Enactor::new(store.clone(), settings, metrics).with_hooks(Arc::new(Events(tx)));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(enactor.run(async move {
        let _ = stopped.await;
    }));

    let mut rng = SmallRng::seed_from_u64(16);
    let first = plan_next(&store, &config(true)?, 1, &mut rng).await?;
    until_done(&mut events, first.generation).await?;
    let old = name("old");
    let without_old = config(false)?;
    for step in 2..=PLANS {
        let plan = plan_next(&store, &without_old, step, &mut rng).await?;
        assert!(plan.endpoints.contains_key(&old), "plan {}: the planner dropped old", plan.generation);
        until_done(&mut events, plan.generation).await?;
        let stored = store.list(Generation::NONE, 2_000).await?.len() as u64;
        assert!(stored <= RETAIN + FULL_WRITE_EVERY + 1, "plan {}: {stored} plans stored (retain {RETAIN})", plan.generation);
    }
    let latest = store.plan(store.latest().await?).await?.into_plan();
    assert!(latest.provenance.iter().any(|p| p.endpoint == old && p.rule == UNMANAGED_RULE), "old is not marked unmanaged");
    let want: std::collections::BTreeSet<std::net::IpAddr> = ["10.9.9.9".parse()?].into();
    until_answer(authority.dns, old.as_str(), |a| a.addresses == want).await?;
    assert_eq!(workflow::unmanaged(&store, &latest).await?, [old.clone()].into());

    // The planner manages api: retiring it is refused. old is retired and goes away.
    let refused = workflow::publish_retirement(&store, &name("api"), "test", "alice", None).await;
    assert!(matches!(refused, Err(workflow::RetireError::Managed(_))), "{refused:?}");
    let retired = workflow::publish_retirement(&store, &old, "decommissioned", "alice", None).await?;
    until_done(&mut events, retired.generation()).await?;
    until_answer(authority.dns, old.as_str(), |a| a.rcode == ResponseCode::NXDomain).await?;
    // The planner's next plan no longer carries it, and publishes nothing for it.
    let next = plan_next(&store, &without_old, PLANS + 1, &mut rng).await?;
    assert!(!next.endpoints.contains_key(&old), "the planner brought old back");

    let _ = stop.send(());
    task.await?;
    authority.stop().await
}
