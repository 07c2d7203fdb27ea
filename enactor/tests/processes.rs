//! Three `dnsplan-enactor` processes against one authority keep DNS correct while one of them
//! is frozen (SIGSTOP) in the middle of a plan, ten newer plans are published and cleaned up
//! after, another is killed (SIGKILL) and restarted, and the frozen one resumes.
//!
//! The processes are followed through their JSON logs (no polling, no sleeps); a DNS prober
//! and a store observer watch the whole time and the checker judges what they saw.

use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Generation, SledStore, Store, ValidatedPlan};
use dnsplan_tests::daemon::{self, Daemon, LogLine};
use dnsplan_tests::fixtures::{self, endpoint_for, name, planner};
use dnsplan_tests::stack::{Authority, TOKEN};
use dnsplan_tests::watch::{self, Watcher};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(30);

fn spawn(id: &str, config: &Path, lines: mpsc::UnboundedSender<LogLine>) -> anyhow::Result<Daemon> {
    let config = config.display().to_string();
    Daemon::spawn(Path::new(env!("CARGO_BIN_EXE_dnsplan-enactor")), &["--config", &config, "--id", id, "--zone", id], id, lines)
}

/// Waits until every enactor in `who` logged `message` about generation `g`.
async fn until_all(lines: &mut mpsc::UnboundedReceiver<LogLine>, who: &[&str], message: &str, g: u64) -> anyhow::Result<()> {
    let mut waiting: Vec<&str> = who.to_vec();
    daemon::until(
        lines,
        WITHIN,
        |_| {},
        |line| {
            if line.message == message && line.generation == Some(g) {
                waiting.retain(|w| *w != line.who);
            }
            waiting.is_empty()
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{who:?} did not log {message:?} for plan {g}: {e}"))?;
    Ok(())
}

fn config_text(control: &str, dns: std::net::SocketAddr) -> String {
    format!(
        r#"
id = "overridden"
zone = "overridden"
[store]
url = "{control}"
token = "{TOKEN}"
[apply]
reconcile_interval_secs = 1
retry_base_ms = 5
retry_max_ms = 100
# Fixture plans replace every address (so answers tell generations apart); the removal
# guard has its own tests.
max_removal_fraction = 1.0
[cleanup]
retain_plans = 5
[verify]
enabled = true
dns_server = "{dns}"
[metrics]
listen = "127.0.0.1:0"
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_enactor_processes_keep_dns_correct_through_the_race() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path().join("store"))?;
    let names: Vec<_> = (0..8).map(|i| name(&format!("svc{i}"))).collect();
    let mut published: BTreeMap<Generation, ValidatedPlan> = BTreeMap::new();
    let first = fixtures::plan(1, &names, planner());
    store.publish(&first).await?;
    for n in &names {
        store.apply(n, Generation(1), &endpoint_for(Generation(1))).await?;
    }
    published.insert(Generation(1), first);
    let authority = Authority::start(store.clone(), dir.path()).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let watcher = Watcher::start(authority.dns, fixtures::dns_zone(), names.clone(), remote.clone());

    let config = dir.path().join("enactor.toml");
    std::fs::write(&config, config_text(&authority.control, authority.dns))?;
    let (tx, mut lines) = mpsc::unbounded_channel();
    let a = spawn("a", &config, tx.clone())?;
    let mut b = spawn("b", &config, tx.clone())?;
    let c = spawn("c", &config, tx.clone())?;
    until_all(&mut lines, &["a", "b", "c"], "plan applied", 1).await?;

    // Plan 2, and A frozen wherever it is in applying it.
    let mut publish = async |g: u64| -> anyhow::Result<()> {
        let plan = fixtures::plan(g, &names, planner());
        remote.publish(&plan).await?;
        published.insert(Generation(g), plan);
        Ok(())
    };
    publish(2).await?;
    a.signal("-STOP")?;
    // Eight more plans; B is killed in the middle and restarted.
    for g in 3..=6 {
        publish(g).await?;
    }
    b.signal("-KILL")?;
    drop(b);
    b = spawn("b", &config, tx.clone())?;
    for g in 7..=12 {
        publish(g).await?;
    }
    until_all(&mut lines, &["b", "c"], "plan applied", 12).await?;
    // Their cleanups follow: wait (on the store, not a timer) until plan 2 is gone.
    let cleaned = async {
        loop {
            let version = remote.version().await?;
            let horizon = remote.list(Generation::NONE, 1).await?.first().map(|p| p.generation).unwrap_or_default();
            if horizon > Generation(2) {
                return anyhow::Ok(());
            }
            remote.wait_for_change(version, WITHIN).await?;
        }
    };
    tokio::time::timeout(WITHIN, cleaned).await.map_err(|_| anyhow::anyhow!("cleanup never deleted plan 2"))??;

    // A resumes with whatever it held and must end at plan 12 like the others.
    a.signal("-CONT")?;
    until_all(&mut lines, &["a"], "plan applied", 12).await?;
    watcher.checkpoint().await?;
    let history = watcher.stop().await?;
    let violations = watch::check(&history, &published);
    assert!(violations.is_empty(), "violations: {:#?}", &violations[..violations.len().min(20)]);
    let active = remote.active_all().await?;
    assert!(active.endpoints.values().all(|r| r.generation == Generation(12)), "not converged: {active:?}");
    let beats = remote.heartbeats().await?;
    assert_eq!(beats.len(), 3, "{beats:?}");
    drop((a, b, c));
    authority.stop().await?;
    Ok(())
}
