//! Three `dnsplan-enactor` processes against one authority keep DNS correct while one of them
//! is frozen (SIGSTOP) in the middle of a plan, ten newer plans are published and cleaned up
//! after, another is killed (SIGKILL) and restarted, and the frozen one resumes.
//!
//! The processes are followed through their JSON logs (no polling, no sleeps); a DNS prober
//! and a store observer watch the whole time and the checker judges what they saw.

use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Generation, SledStore, Store, ValidatedPlan};
use dnsplan_tests::fixtures::{self, endpoint_for, name, planner};
use dnsplan_tests::stack::{Authority, TOKEN};
use dnsplan_tests::watch::{self, Watcher};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(30);

/// What the tests read from an enactor's log: who said what about which generation.
#[derive(Debug, Clone)]
struct Line {
    enactor: String,
    message: String,
    generation: Option<u64>,
}

fn parse(enactor: &str, line: &str) -> Option<Line> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let message = value.pointer("/fields/message")?.as_str()?.to_owned();
    let generation = [value.pointer("/fields/generation"), value.pointer("/span/generation")]
        .into_iter()
        .flatten()
        .find_map(|g| g.as_str().and_then(|s| s.parse().ok()).or(g.as_u64()));
    Some(Line { enactor: enactor.into(), message, generation })
}

struct Enactor {
    id: String,
    child: Child,
}

impl Enactor {
    fn spawn(id: &str, config: &Path, lines: mpsc::UnboundedSender<Line>) -> anyhow::Result<Enactor> {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-enactor"))
            .args(["--config", &config.display().to_string(), "--id", id, "--zone", id, "--log-format", "json"])
            .env("RUST_LOG", "info")
            .env_remove("DNSPLAN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let owner = id.to_owned();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(parsed) = parse(&owner, &line) {
                    let _ = lines.send(parsed);
                }
            }
        });
        Ok(Enactor { id: id.into(), child })
    }

    fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill {signal} {} failed", self.id);
        Ok(())
    }
}

impl Drop for Enactor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until every enactor in `who` logged `message` about generation `g`.
async fn until_all(lines: &mut mpsc::UnboundedReceiver<Line>, who: &[&str], message: &str, g: u64) -> anyhow::Result<()> {
    let mut waiting: Vec<&str> = who.to_vec();
    let wait = async {
        while let Some(line) = lines.recv().await {
            if line.message == message && line.generation == Some(g) {
                waiting.retain(|w| *w != line.enactor);
                if waiting.is_empty() {
                    return Ok(());
                }
            }
        }
        anyhow::bail!("enactor logs ended")
    };
    tokio::time::timeout(WITHIN, wait).await.map_err(|_| anyhow::anyhow!("{who:?} did not log {message:?} for plan {g}"))?
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
    let a = Enactor::spawn("a", &config, tx.clone())?;
    let mut b = Enactor::spawn("b", &config, tx.clone())?;
    let c = Enactor::spawn("c", &config, tx.clone())?;
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
    b = Enactor::spawn("b", &config, tx.clone())?;
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
