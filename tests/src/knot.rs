//! A real Knot DNS server (`knotd`, Debian package `knot`) for tests: started on a free
//! loopback port with its config, zones, journal and control socket in a temporary directory
//! of its own, ready once it answers its zone's SOA, and stopped when dropped.
//!
//! The API is general on purpose: zone text, TSIG keys (each allowed what the test says) and
//! extra config go in; an address comes out. A primary takes dynamic updates (the enactor's
//! RFC 2136 target); a zone given without text is a secondary whose config names its primary
//! through `extra_config` and `zone_extra`.
//!
//! A missing `knotd` is a failing test with a message saying how to install it, never a skip.
//! Not responsible for judging what Knot serves: tests ask it over DNS themselves.

use crate::counterpart::{logs_at, sbin_binary, soa_at, stop};
use crate::ports::free_port;
use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long `knotd` may take to answer its zone's SOA after it starts. It loads a small zone
/// in milliseconds; 20 s leaves room for a loaded test machine without hiding a hang.
pub const START_DEADLINE: Duration = Duration::from_secs(20);
/// How long one readiness query waits before the next one is sent.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Ports tried: one taken between choosing and binding makes `knotd` fail to listen.
const PORT_ATTEMPTS: usize = 5;

/// What a TSIG key may do on a zone (Knot's ACL `action`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyAction {
    /// RFC 2136 dynamic updates.
    Update,
    /// Zone transfers out (AXFR/IXFR).
    Transfer,
    /// NOTIFY in (a secondary told by its primary).
    Notify,
}

impl KeyAction {
    fn knot_name(self) -> &'static str {
        match self {
            KeyAction::Update => "update",
            KeyAction::Transfer => "transfer",
            KeyAction::Notify => "notify",
        }
    }
}

/// A TSIG key Knot knows, and what it allows on every zone of this server.
#[derive(Clone, Debug)]
pub struct TsigKey {
    /// The key's name, as a DNS name (`dnsplan-enactor.` or without the final dot).
    pub name: String,
    /// Knot's algorithm name, such as `hmac-sha256`.
    pub algorithm: String,
    /// The secret, base64.
    pub secret_base64: String,
    pub actions: Vec<KeyAction>,
}

/// One zone Knot serves.
#[derive(Clone, Debug)]
pub struct KnotZone {
    /// The zone's origin, such as `example.test.`.
    pub origin: String,
    /// The zone file's text; `None` for a secondary, which starts empty.
    pub text: Option<String>,
    /// Extra lines of this zone's entry, each `key: value` (for example `master: primary`).
    pub zone_extra: Vec<String>,
}

/// What to start.
#[derive(Clone, Debug, Default)]
pub struct KnotSpec {
    pub zones: Vec<KnotZone>,
    pub keys: Vec<TsigKey>,
    /// Whole top-level sections appended to the config as they are (for example `remote:`).
    pub extra_config: String,
}

/// A running `knotd`, stopped (SIGTERM, then SIGKILL) when dropped, so a failing assert does
/// not leave it serving.
pub struct Knot {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Knot {
    /// Starts `knotd` on a free loopback port and waits (bounded by [`START_DEADLINE`]) until
    /// it answers the SOA of every zone given with text. A port taken meanwhile makes Knot
    /// fail; then another is tried.
    pub async fn start(spec: &KnotSpec) -> anyhow::Result<Knot> {
        let binary = knotd_binary()?;
        let dir = tempfile::tempdir().context("creating knotd's directory")?;
        for (i, zone) in spec.zones.iter().enumerate() {
            if let Some(text) = &zone.text {
                std::fs::write(dir.path().join(format!("zone{i}.db")), text)?;
            }
        }
        let mut exits = Vec::new();
        for attempt in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let config = dir.path().join("knot.conf");
            std::fs::write(&config, knot_config(dir.path(), port, spec))?;
            let log = dir.path().join(format!("knotd-{attempt}.log"));
            let child = Command::new(&binary)
                .arg("-c")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log)?)
                .stderr(std::fs::File::create(log.with_extension("stderr"))?)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", binary.display()))?;
            let mut child = Some(child);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            match wait_ready(&mut child, addr, &log, spec).await {
                Ok(None) => return Ok(Knot { child, addr, dir, log }),
                Ok(Some(exit)) => exits.push(exit),
                Err(err) => {
                    stop(&mut child);
                    return Err(err);
                }
            }
        }
        anyhow::bail!("knotd exited before answering, on {PORT_ATTEMPTS} ports:\n{}", exits.join("\n"))
    }

    /// The `knotd` process's id (to freeze it with SIGSTOP, as a secondary that falls behind).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Where Knot answers DNS (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The directory holding Knot's config, zone files and journal.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything Knot logged so far, for failure messages.
    pub fn logs(&self) -> String {
        logs_at(&self.log)
    }

    /// The SOA serial Knot serves for `origin` now, `None` while it does not serve the zone.
    pub async fn soa_serial(&self, origin: &str) -> Option<u32> {
        soa_at(self.addr, origin, PROBE_TIMEOUT).await
    }

    /// Polls `origin`'s SOA until Knot serves it, or fails after `deadline` (a secondary
    /// waiting for its first transfer, for instance).
    pub async fn wait_zone(&self, origin: &str, deadline: Duration) -> anyhow::Result<u32> {
        let start = Instant::now();
        loop {
            if let Some(serial) = self.soa_serial(origin).await {
                return Ok(serial);
            }
            if start.elapsed() > deadline {
                anyhow::bail!("knotd on {} did not serve the SOA of {origin} within {deadline:?}: {}", self.addr, self.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Knot {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// Polls until every zone given with text answers its SOA (`None`), Knot exits (`Some` of
/// why), or [`START_DEADLINE`] passes (an error). With only secondaries, until Knot answers
/// anything at all.
async fn wait_ready(child: &mut Option<Child>, addr: SocketAddr, log: &Path, spec: &KnotSpec) -> anyhow::Result<Option<String>> {
    let start = Instant::now();
    let loaded: Vec<&str> = spec.zones.iter().filter(|z| z.text.is_some()).map(|z| z.origin.as_str()).collect();
    let probe = spec.zones.first().map_or(".", |z| z.origin.as_str()).to_owned();
    loop {
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().transpose()) {
            return Ok(Some(format!("knotd exited ({}): {}", status?, logs_at(log))));
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
            anyhow::bail!("knotd did not answer on {addr} within {START_DEADLINE:?}: {}", logs_at(log));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `knotd` from PATH or the sbin directories Debian installs it in. Missing is an error, not a
/// reason to skip.
pub fn knotd_binary() -> anyhow::Result<PathBuf> {
    sbin_binary("knotd", "Knot DNS server", "knot")
}

/// Knot's config: everything it writes inside `dir`, one UDP and one TCP worker (tests are
/// small), zone files never rewritten (updates live in the journal), and one ACL per key.
fn knot_config(dir: &Path, port: u16, spec: &KnotSpec) -> String {
    let d = dir.display();
    let mut text = format!(
        "server:\n  rundir: \"{d}\"\n  listen: 127.0.0.1@{port}\n  udp-workers: 1\n  tcp-workers: 1\n  background-workers: 1\n\
         control:\n  listen: \"{d}/knot.sock\"\n\
         log:\n  - target: stderr\n    any: info\n\
         database:\n  storage: \"{d}\"\n"
    );
    if !spec.keys.is_empty() {
        text.push_str("key:\n");
        for key in &spec.keys {
            let _ = write!(text, "  - id: {}\n    algorithm: {}\n    secret: {}\n", key.name, key.algorithm, key.secret_base64);
        }
        text.push_str("acl:\n");
        for (i, key) in spec.keys.iter().enumerate() {
            let actions: Vec<&str> = key.actions.iter().map(|a| a.knot_name()).collect();
            let _ = write!(text, "  - id: acl{i}\n    key: {}\n    action: [{}]\n", key.name, actions.join(", "));
        }
    }
    text.push_str(&spec.extra_config);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push_str("zone:\n");
    let acls: Vec<String> = (0..spec.keys.len()).map(|i| format!("acl{i}")).collect();
    for (i, zone) in spec.zones.iter().enumerate() {
        let _ = write!(
            text,
            "  - domain: {}\n    storage: \"{d}\"\n    file: \"zone{i}.db\"\n    zonefile-sync: -1\n    zonefile-load: whole\n    \
             journal-content: changes\n    semantic-checks: off\n",
            zone.origin
        );
        if !acls.is_empty() {
            let _ = writeln!(text, "    acl: [{}]", acls.join(", "));
        }
        for line in &zone.zone_extra {
            let _ = writeln!(text, "    {line}");
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Knot starts with a zone and a key, answers its SOA, and is gone after the drop.
    #[tokio::test]
    async fn knot_serves_its_zone_and_stops_on_drop() -> anyhow::Result<()> {
        let spec = KnotSpec {
            zones: vec![KnotZone {
                origin: "example.test.".into(),
                text: Some(
                    "$ORIGIN example.test.\n@ 300 IN SOA ns1 hostmaster 7 3600 600 604800 30\n@ 300 IN NS ns1\nns1 300 IN A 192.0.2.1\n"
                        .into(),
                ),
                zone_extra: Vec::new(),
            }],
            keys: vec![TsigKey {
                name: "test-key".into(),
                algorithm: "hmac-sha256".into(),
                secret_base64: "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==".into(),
                actions: vec![KeyAction::Update],
            }],
            extra_config: String::new(),
        };
        let knot = Knot::start(&spec).await?;
        assert_eq!(knot.soa_serial("example.test.").await, Some(7), "{}", knot.logs());
        let addr = knot.addr();
        drop(knot);
        let after = dns_probe::query(addr, "example.test.", RecordType::SOA, Duration::from_millis(300)).await;
        assert!(after.is_err(), "knotd still answers after the drop: {after:?}");
        Ok(())
    }
}
