//! A real NSD (`nsd`, Debian package `nsd`) for tests: started on a free loopback port with
//! its config, zones and state in a temporary directory of its own, as the test's user (no
//! chroot, no privilege drop), ready once it answers, and stopped when dropped.
//!
//! As `knot`: zone text, TSIG keys and extra lines go in; an address comes out. A zone given
//! without text is a secondary, whose `zone_extra` names its primary (`request-xfr: ...`).
//! A missing `nsd` is a failing test with a message saying how to install it, never a skip.
//! Not responsible for judging what NSD serves: tests ask it over DNS themselves.

use crate::counterpart::{logs_at, sbin_binary, soa_at, stop};
use crate::ports::free_port;
use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long NSD may take to answer after it starts: it loads a small zone in milliseconds;
/// 30 s leaves room for a loaded test machine without hiding a hang.
pub const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long one readiness query waits before the next one is sent.
const PROBE_TIMEOUT: Duration = Duration::from_millis(100);
/// Ports tried: one taken between choosing and binding makes NSD exit.
const PORT_ATTEMPTS: usize = 5;

/// A TSIG key NSD knows (its `key:` clause).
#[derive(Clone, Debug)]
pub struct NsdKey {
    pub name: String,
    /// NSD's algorithm name, such as `hmac-sha256`.
    pub algorithm: String,
    pub secret_base64: String,
}

/// One zone NSD serves.
#[derive(Clone, Debug)]
pub struct NsdZone {
    pub origin: String,
    /// The zone file's text; `None` for a secondary, which starts empty.
    pub text: Option<String>,
    /// Extra lines of this zone's clause, each `key: value` (`request-xfr: ...`).
    pub zone_extra: Vec<String>,
}

/// What to start.
#[derive(Clone, Debug, Default)]
pub struct NsdSpec {
    pub zones: Vec<NsdZone>,
    pub keys: Vec<NsdKey>,
    /// Extra lines of the `server:` clause, each `key: value` (`minimal-responses: yes`).
    pub server_extra: Vec<String>,
}

/// A running `nsd`, stopped (SIGTERM, then SIGKILL) when dropped, so a failing assert does
/// not leave it serving.
pub struct Nsd {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Nsd {
    /// Starts NSD on a free loopback port and waits (bounded by [`START_DEADLINE`]) until it
    /// answers the SOA of every zone given with text, or anything at all with only
    /// secondaries. A port taken meanwhile makes NSD exit; then another is tried.
    pub async fn start(spec: &NsdSpec) -> anyhow::Result<Nsd> {
        let binary = nsd_binary()?;
        let dir = tempfile::tempdir().context("creating nsd's directory")?;
        for (i, zone) in spec.zones.iter().enumerate() {
            if let Some(text) = &zone.text {
                std::fs::write(dir.path().join(format!("zone{i}.db")), text)?;
            }
        }
        let mut exits = Vec::new();
        for attempt in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let config = dir.path().join("nsd.conf");
            std::fs::write(&config, nsd_config(dir.path(), port, spec))?;
            let log = dir.path().join(format!("nsd-{attempt}.log"));
            let child = Command::new(&binary)
                .arg("-d")
                .arg("-c")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log)?)
                .stderr(std::fs::File::create(log.with_extension("stderr"))?)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", binary.display()))?;
            let mut child = Some(child);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            match wait_ready(&mut child, addr, &log, dir.path(), spec).await {
                Ok(None) => return Ok(Nsd { child, addr, dir, log }),
                Ok(Some(exit)) => exits.push(exit),
                Err(err) => {
                    stop(&mut child);
                    return Err(err);
                }
            }
        }
        anyhow::bail!("nsd exited before answering, on {PORT_ATTEMPTS} ports:\n{}", exits.join("\n"))
    }

    /// Where NSD answers DNS (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The directory holding NSD's config, zone files and state.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything NSD logged so far, for failure messages.
    pub fn logs(&self) -> String {
        nsd_logs(&self.log, self.dir.path())
    }

    /// The SOA serial NSD serves for `origin` with authority now, `None` while it does not.
    pub async fn soa_serial(&self, origin: &str) -> Option<u32> {
        soa_at(self.addr, origin, PROBE_TIMEOUT).await
    }

    /// Polls `origin`'s SOA until NSD serves it, or fails after `deadline` (a secondary
    /// waiting for its first transfer, for instance).
    pub async fn wait_zone(&self, origin: &str, deadline: Duration) -> anyhow::Result<u32> {
        let start = Instant::now();
        loop {
            if let Some(serial) = self.soa_serial(origin).await {
                return Ok(serial);
            }
            if start.elapsed() > deadline {
                anyhow::bail!("nsd on {} did not serve the SOA of {origin} within {deadline:?}: {}", self.addr, self.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Polls until every zone given with text answers its SOA (`None`), NSD exits (`Some` of why),
/// or [`START_DEADLINE`] passes (an error). With only secondaries, until NSD answers anything.
async fn wait_ready(child: &mut Option<Child>, addr: SocketAddr, log: &Path, dir: &Path, spec: &NsdSpec) -> anyhow::Result<Option<String>> {
    let start = Instant::now();
    let loaded: Vec<&str> = spec.zones.iter().filter(|z| z.text.is_some()).map(|z| z.origin.as_str()).collect();
    let probe = spec.zones.first().map_or(".", |z| z.origin.as_str()).to_owned();
    loop {
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().transpose()) {
            return Ok(Some(format!("nsd exited ({}): {}", status?, nsd_logs(log, dir))));
        }
        let ready = if loaded.is_empty() {
            dns_probe::query(addr, &probe, RecordType::SOA, PROBE_TIMEOUT).await.is_ok()
        } else {
            let mut all = true;
            for origin in &loaded {
                all &= soa_at(addr, origin, PROBE_TIMEOUT).await.is_some();
            }
            all
        };
        if ready {
            return Ok(None);
        }
        if start.elapsed() > START_DEADLINE {
            anyhow::bail!("nsd did not answer on {addr} within {START_DEADLINE:?}: {}", nsd_logs(log, dir));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// NSD's logs: its log file and stderr, and what it logs to `nsd-log` in `dir`.
fn nsd_logs(log: &Path, dir: &Path) -> String {
    format!("{}{}", logs_at(log), std::fs::read_to_string(dir.join("nsd-log")).unwrap_or_default())
}

impl Drop for Nsd {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// `nsd` from PATH or the sbin directories Debian installs it in. Missing is an error, not a
/// reason to skip.
pub fn nsd_binary() -> anyhow::Result<PathBuf> {
    sbin_binary("nsd", "NSD", "nsd")
}

/// NSD's config: everything it writes inside `dir`, no privilege drop or chroot (it runs as
/// the test's user), one server process.
fn nsd_config(dir: &Path, port: u16, spec: &NsdSpec) -> String {
    let d = dir.display();
    let mut text = format!(
        "server:\n  ip-address: 127.0.0.1@{port}\n  do-ip6: no\n  username: \"\"\n  chroot: \"\"\n  zonesdir: \"{d}\"\n  \
         database: \"\"\n  pidfile: \"{d}/nsd.pid\"\n  xfrdfile: \"{d}/xfrd.state\"\n  xfrdir: \"{d}\"\n  zonelistfile: \
         \"{d}/zone.list\"\n  logfile: \"{d}/nsd-log\"\n  server-count: 1\n  verbosity: 2\n"
    );
    for line in &spec.server_extra {
        let _ = writeln!(text, "  {line}");
    }
    text.push_str("remote-control:\n  control-enable: no\n");
    for key in &spec.keys {
        let _ = write!(text, "key:\n  name: \"{}\"\n  algorithm: {}\n  secret: \"{}\"\n", key.name, key.algorithm, key.secret_base64);
    }
    for (i, zone) in spec.zones.iter().enumerate() {
        let _ = write!(text, "zone:\n  name: \"{}\"\n  zonefile: \"zone{i}.db\"\n", zone.origin);
        for line in &zone.zone_extra {
            let _ = writeln!(text, "  {line}");
        }
    }
    text
}
