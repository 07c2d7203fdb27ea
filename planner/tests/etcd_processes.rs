//! Two `dnsplan-planner` processes on a real three-member etcd cluster, with no authority in
//! their write path (`[store] kind = "etcd"`): one holds the lease and publishes, the other
//! stands by without taking the lease while the first lives; the active one is killed with
//! SIGKILL, the standby takes the lease over with a higher epoch when the etcd lease expires,
//! and no generation is ever published twice. The processes are followed through their JSON
//! logs and the store is read directly; nothing sleeps to synchronise.
//!
//! Teeth, checked once by hand: with etcd's lease acquire not comparing the live lease key
//! (any planner gets the lease, as if none were held), the standby took the lease while the
//! active planner lived and the test failed on "the standby stayed standby".

mod support;

use dnsplan_common::{Generation, Store};
use dnsplan_tests::daemon::{self, Daemon, LogLine};
use dnsplan_tests::etcd::EtcdCluster;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use support::{Backends, config_text};
use tokio::sync::mpsc;

/// How long one step may take: a lease TTL (1 s on this cluster) plus health checks and
/// process starts on a loaded machine.
const WITHIN: Duration = Duration::from_secs(20);
const PREFIX: &str = "/planners-on-etcd/";

fn spawn(id: &str, config: &Path, lines: mpsc::UnboundedSender<LogLine>) -> anyhow::Result<Daemon> {
    let config = config.display().to_string();
    Daemon::spawn(Path::new(env!("CARGO_BIN_EXE_dnsplan-planner")), &["--config", &config, "--id", id], id, lines)
}

async fn until(
    lines: &mut mpsc::UnboundedReceiver<LogLine>,
    log: &mut Vec<LogLine>,
    want: impl Fn(&LogLine) -> bool,
) -> anyhow::Result<LogLine> {
    daemon::until(lines, WITHIN, |l| log.push(l.clone()), want).await
}

/// Every line already received, into `log`.
fn drain(lines: &mut mpsc::UnboundedReceiver<LogLine>, log: &mut Vec<LogLine>) {
    while let Ok(line) = lines.try_recv() {
        log.push(line);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planners_on_etcd_keep_one_active_and_a_standby_takes_over() -> anyhow::Result<()> {
    let started = Instant::now();
    let cluster = EtcdCluster::start(3, &[]).await?;
    let store = cluster.store(PREFIX).await?;
    let dir = tempfile::tempdir()?;
    let mut backends = Backends::start().await?;
    let endpoints: Vec<String> = cluster.endpoints().iter().map(|e| format!("\"{e}\"")).collect();
    let etcd = format!("kind = \"etcd\"\nendpoints = [{}]\nprefix = \"{PREFIX}\"", endpoints.join(", "));
    let text = config_text(backends.port, "").replace("url = \"http://127.0.0.1:1\"", &etcd) + "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;

    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut log = Vec::new();
    let mut processes = BTreeMap::new();
    processes.insert("p1".to_string(), spawn("p1", &config, tx.clone())?);
    processes.insert("p2".to_string(), spawn("p2", &config, tx.clone())?);
    let first = until(&mut lines, &mut log, |l| l.message == "plan published").await?.who;
    let survivor = if first == "p1" { "p2" } else { "p1" };
    let lease = store.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease after a publish"))?;
    assert_eq!(lease.holder, first, "the publisher holds the lease");

    // While the active planner lives, the standby (deciding every 50 ms, its lease attempts
    // refused) stays standby: a change is published by the active one, under the same epoch.
    backends.stop("127.0.2.5")?;
    let second = until(&mut lines, &mut log, |l| l.message == "plan published" && l.generation > Some(1)).await?;
    drain(&mut lines, &mut log);
    assert_eq!(second.who, first, "a second planner published while the active one lived");
    let held = store.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease"))?;
    assert_eq!((held.holder.as_str(), held.epoch), (first.as_str(), lease.epoch), "the standby stayed standby");
    let stolen: Vec<_> = log.iter().filter(|l| l.who == survivor && l.message == "holding the planner lease: active").collect();
    assert!(stolen.is_empty(), "the standby went active while the active planner lived: {stolen:?}");

    // SIGKILL the active planner; the standby takes over once etcd expires its lease.
    processes.remove(&first);
    until(&mut lines, &mut log, |l| l.who == survivor && l.message == "holding the planner lease: active").await?;
    let taken = store.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease after the takeover"))?;
    assert_eq!(taken.holder, survivor);
    assert!(taken.epoch > lease.epoch, "takeover must raise the epoch: {lease:?} -> {taken:?}");

    // And acts: another backend goes away, the survivor publishes the change.
    let before = store.latest().await?;
    backends.stop("127.0.1.5")?;
    until(&mut lines, &mut log, |l| l.who == survivor && l.message == "plan published").await?;
    drain(&mut lines, &mut log);

    let plans = store.list(Generation::NONE, 1_000).await?;
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(p.generation, Generation(i as u64 + 1), "generations are contiguous");
    }
    let mut published: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for l in log.iter().filter(|l| l.message == "plan published") {
        published.entry(l.generation.unwrap_or_default()).or_default().push(&l.who);
    }
    assert!(published.values().all(|who| who.len() == 1), "a generation was published twice: {published:?}");
    for p in &plans {
        let logged = published.get(&p.generation.0).and_then(|who| who.first()).copied().unwrap_or_default();
        assert_eq!(p.author.to_string(), format!("planner:{logged}"), "plan {} in the store was not logged by its author", p.generation);
    }
    let after: Vec<_> = plans.iter().filter(|p| p.generation > before).collect();
    assert!(!after.is_empty() && after.iter().all(|p| p.author.to_string() == format!("planner:{survivor}")), "{after:?}");
    drop(processes);
    println!("planners on etcd: {} plans, takeover epoch {} -> {}, in {:?}", plans.len(), lease.epoch, taken.epoch, started.elapsed());
    Ok(())
}
