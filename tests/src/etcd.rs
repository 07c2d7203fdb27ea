//! A real etcd cluster on loopback for tests: `EtcdCluster::start` runs members of Debian's
//! `etcd` (etcd-server) on free ports in a temporary directory, waits until every member
//! answers a linearizable read (polling with a deadline), and kills them when dropped.
//!
//! Tests that need etcd fail, never skip, when the binary is missing: the message says to
//! install etcd-server. Members keep their data in memory-backed storage when the machine has
//! it (`/dev/shm`), since etcd syncs every commit to disk and tests commit thousands of times.

use anyhow::{Context, bail};
use dnsplan_etcd::{EtcdConfig, EtcdStore};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long a cluster may take to elect a leader and answer on every member. A healthy start
/// takes about a second; a loaded two-core machine building in parallel takes several.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts to start a cluster: a port found free can be taken by another process before etcd
/// binds it, and then that member exits at once.
const START_ATTEMPTS: usize = 3;
/// The binary, from PATH.
const ETCD_BINARY: &str = "etcd";

/// One member of a test cluster.
pub struct Member {
    pub name: String,
    pub client_url: String,
    pub peer_url: String,
    pub log: PathBuf,
    child: Option<Child>,
    /// The arguments it was started with, to start it again after a kill (`restart_killed`).
    args: Vec<String>,
}

/// A running cluster. Dropping it kills every member.
pub struct EtcdCluster {
    pub members: Vec<Member>,
    _dir: tempfile::TempDir,
}

fn scratch_dir() -> anyhow::Result<tempfile::TempDir> {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(dir) = tempfile::Builder::new().prefix("dnsplan-etcd-").tempdir_in(shm)
    {
        return Ok(dir);
    }
    Ok(tempfile::Builder::new().prefix("dnsplan-etcd-").tempdir()?)
}

/// Fails with what to install when the etcd binary is missing.
pub fn check_etcd_installed() -> anyhow::Result<()> {
    match Command::new(ETCD_BINARY).arg("--version").output() {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => bail!("`{ETCD_BINARY} --version` failed ({}); reinstall Debian's etcd-server", out.status),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("the `{ETCD_BINARY}` binary is not on PATH; install Debian's etcd-server (apt-get install etcd-server)")
        }
        Err(e) => Err(e).context(format!("cannot run `{ETCD_BINARY}`")),
    }
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

impl EtcdCluster {
    /// Starts `members` members with `extra_args` given to each (for example
    /// `--max-request-bytes 65536`) and waits until all of them answer.
    pub async fn start(members: usize, extra_args: &[&str]) -> anyhow::Result<EtcdCluster> {
        check_etcd_installed()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match Self::start_once(members, extra_args).await {
                Ok(cluster) => return Ok(cluster),
                Err(err) => last = Some(err),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    async fn start_once(count: usize, extra_args: &[&str]) -> anyhow::Result<EtcdCluster> {
        Self::start_once_in(scratch_dir()?, count, extra_args).await
    }

    /// Polls every member with a linearizable read until all answer, or fails at
    /// [`START_TIMEOUT`] with the members' last log lines.
    async fn wait_healthy(&mut self) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let mut healthy = vec![false; self.members.len()];
        loop {
            for (i, m) in self.members.iter_mut().enumerate() {
                if let Some(child) = &mut m.child
                    && let Some(status) = child.try_wait()?
                {
                    bail!("etcd member {} exited ({status}) while starting:\n{}", m.name, log_tail(&m.log));
                }
                if !healthy[i] {
                    healthy[i] = answers(&m.client_url).await;
                }
            }
            if healthy.iter().all(|h| *h) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let tails: Vec<String> = self.members.iter().map(|m| format!("{}:\n{}", m.name, log_tail(&m.log))).collect();
                bail!("etcd cluster not healthy within {START_TIMEOUT:?} (healthy: {healthy:?}):\n{}", tails.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().filter(|m| m.child.is_some()).map(|m| m.client_url.clone()).collect()
    }

    /// A store configuration for this cluster under `prefix`.
    pub fn config(&self, prefix: &str) -> EtcdConfig {
        EtcdConfig::new(self.endpoints(), prefix)
    }

    pub async fn store(&self, prefix: &str) -> anyhow::Result<EtcdStore> {
        Ok(EtcdStore::connect(self.config(prefix)).await?)
    }

    /// A plain client of the cluster, for what the store does not do (compaction).
    pub async fn client(&self) -> anyhow::Result<dnsplan_etcd::client::Client> {
        Ok(dnsplan_etcd::client::Client::new(&self.endpoints(), &Default::default())?)
    }

    /// Starts again every member that was killed, with its data (a member that finds its data
    /// directory rejoins the cluster), and waits until every member answers.
    pub async fn restart_killed(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if m.child.is_none() {
                m.child = Some(spawn_member(m)?);
            }
        }
        self.wait_healthy().await
    }

    /// Every member's client URL, killed ones included: what a daemon is configured with.
    pub fn all_endpoints(&self) -> Vec<String> {
        self.members.iter().map(|m| m.client_url.clone()).collect()
    }

    /// SIGKILLs member `index` (its data stays, it can be inspected in the logs).
    pub fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let m = self.members.get_mut(index).context("no such member")?;
        if let Some(mut child) = m.child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }
}

/// Starts `m` with its arguments, its output appended to its log.
fn spawn_member(m: &Member) -> anyhow::Result<Child> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(&m.log)?;
    Command::new(ETCD_BINARY)
        .args(&m.args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("cannot start `{ETCD_BINARY}`; install Debian's etcd-server"))
}

/// Whether the member at `url` serves a linearizable read within a second.
async fn answers(url: &str) -> bool {
    let attempt = async {
        let client = dnsplan_etcd::client::Client::new(&[url.to_string()], &Default::default())?;
        client.get("health", None).await?;
        Ok::<_, dnsplan_etcd::client::Error>(())
    };
    matches!(tokio::time::timeout(Duration::from_secs(1), attempt).await, Ok(Ok(())))
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            if let Some(mut child) = m.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

impl EtcdCluster {
    /// As [`EtcdCluster::start`], with the members' data in a new directory under `parent`
    /// instead of memory-backed storage: for benchmarks, where etcd's sync of every commit to
    /// disk is part of what is measured. Killed when dropped, as `start`'s.
    pub async fn start_with_data_under(parent: &Path, members: usize, extra_args: &[&str]) -> anyhow::Result<EtcdCluster> {
        check_etcd_installed()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let dir = tempfile::Builder::new().prefix("dnsplan-etcd-").tempdir_in(parent)?;
            match Self::start_once_in(dir, members, extra_args).await {
                Ok(cluster) => return Ok(cluster),
                Err(err) => last = Some(err),
            }
        }
        Err(last.expect("at least one attempt"))
    }

    /// A cluster of `count` new members with their data in `dir`, waited on until healthy.
    async fn start_once_in(dir: tempfile::TempDir, count: usize, extra_args: &[&str]) -> anyhow::Result<EtcdCluster> {
        let ports = crate::ports::free_ports(2 * count)?;
        let token = format!("dnsplan-test-{}-{}", std::process::id(), ports[0]);
        let mut members: Vec<Member> = (0..count)
            .map(|i| Member {
                name: format!("m{i}"),
                client_url: format!("http://127.0.0.1:{}", ports[2 * i]),
                peer_url: format!("http://127.0.0.1:{}", ports[2 * i + 1]),
                log: dir.path().join(format!("m{i}.log")),
                child: None,
                args: Vec::new(),
            })
            .collect();
        let initial: Vec<String> = members.iter().map(|m| format!("{}={}", m.name, m.peer_url)).collect();
        let initial = initial.join(",");
        for m in &mut members {
            let data_dir = dir.path().join(&m.name);
            let data_dir = data_dir.to_str().context("the data directory's path is not UTF-8")?;
            let mut args: Vec<&str> = vec!["--name", &m.name, "--data-dir", data_dir];
            args.extend(["--listen-client-urls", &m.client_url, "--advertise-client-urls", &m.client_url]);
            args.extend(["--listen-peer-urls", &m.peer_url, "--initial-advertise-peer-urls", &m.peer_url]);
            args.extend(["--initial-cluster", &initial, "--initial-cluster-state", "new", "--initial-cluster-token", &token]);
            // Faster elections than the defaults (100 ms, 1 s) keep starts short; still ten
            // heartbeats per election, as etcd recommends.
            args.extend(["--heartbeat-interval", "50", "--election-timeout", "500"]);
            args.extend(extra_args);
            m.args = args.into_iter().map(String::from).collect();
            m.child = Some(spawn_member(m)?);
        }
        let mut cluster = EtcdCluster { members, _dir: dir };
        cluster.wait_healthy().await?;
        Ok(cluster)
    }
}
