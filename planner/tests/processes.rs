//! Two `dnsplan-planner` processes against one store (an authority's control API): one
//! publishes; it is killed with SIGKILL; the other takes the lease over and goes on; no
//! generation is ever published twice.

mod support;

use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Generation, SledStore, Store};
use dnsplan_tests::daemon::{self, Daemon, LogLine};
use dnsplan_tests::stack::{Authority, TOKEN};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use support::{Backends, config_text};
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(30);

fn spawn(id: &str, config: &Path, lines: mpsc::UnboundedSender<LogLine>) -> anyhow::Result<Daemon> {
    let config = config.display().to_string();
    Daemon::spawn(Path::new(env!("CARGO_BIN_EXE_dnsplan-planner")), &["--config", &config, "--id", id], id, lines)
}

async fn until(
    lines: &mut mpsc::UnboundedReceiver<LogLine>,
    log: &mut Vec<LogLine>,
    want: impl Fn(&LogLine) -> bool,
) -> anyhow::Result<String> {
    Ok(daemon::until(lines, WITHIN, |l| log.push(l.clone()), want).await?.who)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_planner_takes_over_without_publishing_any_generation_twice() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path().join("store"))?;
    let authority = Authority::start(store, dir.path()).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let mut backends = Backends::start().await?;
    let text = config_text(backends.port, "")
        .replace("url = \"http://127.0.0.1:1\"", &format!("url = \"{}\"\ntoken = \"{TOKEN}\"", authority.control))
        + "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;

    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut log = Vec::new();
    let mut processes = BTreeMap::new();
    processes.insert("p1".to_string(), spawn("p1", &config, tx.clone())?);
    processes.insert("p2".to_string(), spawn("p2", &config, tx.clone())?);
    let first = until(&mut lines, &mut log, |l| l.message == "plan published").await?;
    let survivor = if first == "p1" { "p2" } else { "p1" };
    let lease = remote.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease"))?;
    assert_eq!(lease.holder, first, "the publisher holds the lease");

    // Kill the active planner; the standby takes over within a lease TTL.
    processes.remove(&first);
    until(&mut lines, &mut log, |l| l.who == survivor && l.message == "holding the planner lease: active").await?;
    let taken = remote.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease"))?;
    assert_eq!(taken.holder, survivor);
    assert!(taken.epoch > lease.epoch, "takeover must raise the epoch: {lease:?} -> {taken:?}");

    // And acts: a backend goes away, the survivor publishes the change.
    let before = remote.latest().await?;
    backends.stop("127.0.2.5")?;
    until(&mut lines, &mut log, |l| l.who == survivor && l.message == "plan published").await?;

    let plans = remote.list(Generation::NONE, 1_000).await?;
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(p.generation, Generation(i as u64 + 1), "generations are contiguous");
    }
    let mut published: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for l in log.iter().filter(|l| l.message == "plan published") {
        published.entry(l.generation.unwrap_or_default()).or_default().push(&l.who);
    }
    assert!(published.values().all(|who| who.len() == 1), "a generation was published twice: {published:?}");
    let after: Vec<_> = plans.iter().filter(|p| p.generation > before).collect();
    assert!(!after.is_empty() && after.iter().all(|p| p.author.to_string() == format!("planner:{survivor}")), "{after:?}");
    drop(processes);
    authority.stop().await?;
    Ok(())
}
