//! Shared by the CLI's end-to-end tests: `dnsplan up` as a real process on free ports, the
//! CLI run against it, and bounded waits on the store's change feed and on DNS answers.
#![allow(dead_code)] // each test binary uses its own part

pub mod dns;
pub mod etcd_authority;

use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Generation, Store, ValidatedPlan};
use std::collections::BTreeSet;
use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const WITHIN: Duration = Duration::from_secs(30);
pub const TOKEN: &str = "dnsplan-demo-token-change-me";
pub const BUILT_IN: &str = include_str!("../../../examples/dnsplan.toml");

pub struct Up {
    pub child: Child,
    pub dns: SocketAddr,
    pub control: String,
}

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub use dnsplan_tests::ports::free_port;

pub fn up(dir: &Path) -> anyhow::Result<Up> {
    up_with(dir, &[])
}

/// `dnsplan up` in `dir` as [`up`] does, with `extra` flags.
pub fn up_with(dir: &Path, extra: &[&str]) -> anyhow::Result<Up> {
    spawn_up(up_command(dir)?.args(extra))
}

/// Starts `command`, a `dnsplan up`, and reads where it listens from its stdout.
pub fn spawn_up(command: &mut Command) -> anyhow::Result<Up> {
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let (mut dns, mut control) = (None, None);
    let mut lines = std::io::BufReader::new(stdout).lines();
    for line in lines.by_ref() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("dnsplan up: DNS zone example.test. on ") {
            dns = rest.split_whitespace().next().and_then(|a| a.parse().ok());
        }
        if let Some(rest) = line.strip_prefix("control  ") {
            control = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.starts_with("stop with Ctrl-C") {
            break;
        }
    }
    // Keep reading stdout so the stack never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    let (Some(dns), Some(control)) = (dns, control) else { anyhow::bail!("dnsplan up did not say where it listens") };
    Ok(Up { child, dns, control })
}

/// The command of `dnsplan up` on the built-in config in `dir` (written there on first use,
/// with its demo backends on ports nobody else uses), its store in `dir/data`, DNS and the
/// control API on free loopback ports.
pub fn up_command(dir: &Path) -> anyhow::Result<Command> {
    let config = dir.join("dnsplan.toml");
    if !config.exists() {
        let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
        std::fs::write(&config, text)?;
    }
    let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
    command
        .arg("up")
        .arg("--config")
        .arg(config)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .args(["--dns", "127.0.0.1:0", "--listen-control", "127.0.0.1:0"])
        .env_remove("DNSPLAN_TOKEN");
    Ok(command)
}

pub fn dnsplan(up: &Up, args: &[&str]) -> anyhow::Result<Output> {
    Ok(Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(["--control", &up.control, "--token", TOKEN]).args(args).output()?)
}

pub fn ok(out: &Output) -> String {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "exit {}: {stdout}{}", out.status, String::from_utf8_lossy(&out.stderr));
    stdout
}

/// Waits on the store's change feed until the latest plan satisfies `want`.
pub async fn until_plan(store: &RemoteStore, want: impl Fn(&ValidatedPlan) -> bool) -> anyhow::Result<ValidatedPlan> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let version = store.version().await?;
        if version.latest > Generation::NONE {
            let plan = store.plan(version.latest).await?;
            if want(&plan) {
                return Ok(plan);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no plan as wanted within {WITHIN:?}");
        store.wait_for_change(version, Duration::from_secs(5)).await?;
    }
}

/// Asks DNS until the answer satisfies `want`.
pub async fn until_dns(dns: SocketAddr, name: &str, want: impl Fn(&BTreeSet<IpAddr>) -> bool) -> anyhow::Result<BTreeSet<IpAddr>> {
    let deadline = Instant::now() + WITHIN;
    loop {
        if let Ok(answer) = dns_probe::query(dns, name, RecordType::A, Duration::from_secs(1)).await
            && answer.has_addresses()
            && want(&answer.addresses)
        {
            return Ok(answer.addresses);
        }
        anyhow::ensure!(Instant::now() < deadline, "{name} never answered as wanted");
        tokio::task::yield_now().await;
    }
}

pub fn weight(plan: &ValidatedPlan, address: &str) -> Option<u32> {
    let address: IpAddr = address.parse().ok()?;
    plan.plan().endpoints.values().flat_map(|e| &e.targets).find(|t| t.address == address).map(|t| t.weight)
}

/// The workspace's root.
pub fn root() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The daemons, built next to `dnsplan`, once per test binary: where they are.
pub fn bin_dir() -> std::path::PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    BUILT.call_once(|| {
        let status = Command::new(env!("CARGO"))
            .args(["build", "--quiet", "-p", "dnsplan-authority", "-p", "dnsplan-enactor", "-p", "dnsplan-planner"])
            .current_dir(root())
            .status()
            .expect("cargo runs");
        assert!(status.success(), "building the daemons failed");
    });
    Path::new(env!("CARGO_BIN_EXE_dnsplan")).parent().expect("a directory").to_path_buf()
}
