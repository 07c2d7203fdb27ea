//! A real BIND 9 server (`named`, Debian package `bind9`) for tests: started in the foreground
//! on a free loopback port with its config, zones and journals in a temporary directory of its
//! own, ready once it answers its zones' SOA, and stopped when dropped.
//!
//! Like `knot`: zone text, TSIG keys (each allowed what the test says) and extra config go
//! in, an address comes out. A key with [`KeyAction::Update`] may update every name of every
//! zone (`update-policy { grant KEY zonesub ANY; }`); one with [`KeyAction::Transfer`] may
//! transfer the zones. A zone given without text is a secondary whose `zone_extra` names its
//! primary.
//!
//! A missing `named` is a failing test with a message saying how to install it, never a skip.

use crate::counterpart::{logs_at, sbin_binary, soa_at, stop};
use crate::knot::{KeyAction, TsigKey};
use crate::ports::free_port;
use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long `named` may take to answer its zones' SOA after it starts: it loads a small zone
/// in well under a second; 20 s leaves room for a loaded test machine without hiding a hang.
pub const START_DEADLINE: Duration = Duration::from_secs(20);
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Ports tried: one taken between choosing and binding makes `named` fail to listen.
const PORT_ATTEMPTS: usize = 5;

/// One zone BIND serves.
#[derive(Clone, Debug)]
pub struct BindZone {
    /// The zone's origin, such as `example.test.`.
    pub origin: String,
    /// The zone file's text; `None` for a secondary.
    pub text: Option<String>,
    /// Extra statements inside this zone's block, each ending with `;` (for example
    /// `primaries { 127.0.0.1 port 5300; };`). A secondary needs its `type secondary;` here.
    pub zone_extra: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct BindSpec {
    pub zones: Vec<BindZone>,
    pub keys: Vec<TsigKey>,
    /// Whole top-level statements appended to `named.conf`.
    pub extra_config: String,
}

/// A running `named`, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct Bind {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
    log: PathBuf,
}

impl Bind {
    /// Starts `named -g` on a free loopback port and waits (bounded by [`START_DEADLINE`])
    /// until it answers the SOA of every zone given with text.
    pub async fn start(spec: &BindSpec) -> anyhow::Result<Bind> {
        let binary = named_binary()?;
        let dir = tempfile::tempdir().context("creating named's directory")?;
        let mut exits = Vec::new();
        for attempt in 0..PORT_ATTEMPTS {
            for (i, zone) in spec.zones.iter().enumerate() {
                // Fresh each attempt: a journal of an earlier attempt must not replay.
                let _ = std::fs::remove_file(dir.path().join(format!("zone{i}.db.jnl")));
                if let Some(text) = &zone.text {
                    std::fs::write(dir.path().join(format!("zone{i}.db")), text)?;
                }
            }
            let port = free_port()?;
            let config = dir.path().join("named.conf");
            std::fs::write(&config, named_config(dir.path(), port, spec))?;
            let log = dir.path().join(format!("named-{attempt}.log"));
            let child = Command::new(&binary)
                .arg("-g")
                .args(["-n", "1"])
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
                Ok(None) => return Ok(Bind { child, addr, dir, log }),
                Ok(Some(exit)) => exits.push(exit),
                Err(err) => {
                    stop(&mut child);
                    return Err(err);
                }
            }
        }
        anyhow::bail!("named exited before answering, on {PORT_ATTEMPTS} ports:\n{}", exits.join("\n"))
    }

    /// Where BIND answers DNS (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The directory holding BIND's config, zone files and journals.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything BIND logged so far, for failure messages.
    pub fn logs(&self) -> String {
        logs_at(&self.log)
    }

    /// The SOA serial BIND serves for `origin` now, `None` while it does not serve the zone.
    pub async fn soa_serial(&self, origin: &str) -> Option<u32> {
        soa_at(self.addr, origin, PROBE_TIMEOUT).await
    }

    /// Polls `origin`'s SOA until BIND serves it, or fails after `deadline`.
    pub async fn wait_zone(&self, origin: &str, deadline: Duration) -> anyhow::Result<u32> {
        let start = Instant::now();
        loop {
            if let Some(serial) = self.soa_serial(origin).await {
                return Ok(serial);
            }
            if start.elapsed() > deadline {
                anyhow::bail!("named on {} did not serve the SOA of {origin} within {deadline:?}: {}", self.addr, self.logs());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Bind {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

async fn wait_ready(child: &mut Option<Child>, addr: SocketAddr, log: &Path, spec: &BindSpec) -> anyhow::Result<Option<String>> {
    let start = Instant::now();
    let loaded: Vec<&str> = spec.zones.iter().filter(|z| z.text.is_some()).map(|z| z.origin.as_str()).collect();
    let probe = spec.zones.first().map_or(".", |z| z.origin.as_str()).to_owned();
    loop {
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().transpose()) {
            return Ok(Some(format!("named exited ({}): {}", status?, logs_at(log))));
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
            anyhow::bail!("named did not answer on {addr} within {START_DEADLINE:?}: {}", logs_at(log));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `named` from PATH or the sbin directories Debian installs it in. Missing is an error.
pub fn named_binary() -> anyhow::Result<PathBuf> {
    sbin_binary("named", "BIND 9 server", "bind9")
}

/// `named.conf`: everything inside `dir`, no recursion, no control channel, no NOTIFY unless
/// a zone asks, one key statement per key, and per zone the rights the keys are given.
fn named_config(dir: &Path, port: u16, spec: &BindSpec) -> String {
    let d = dir.display();
    let mut text = format!(
        "options {{\n  directory \"{d}\";\n  listen-on port {port} {{ 127.0.0.1; }};\n  listen-on-v6 {{ none; }};\n  pid-file \
         \"{d}/named.pid\";\n  session-keyfile \"{d}/session.key\";\n  managed-keys-directory \"{d}\";\n  recursion no;\n  \
         dnssec-validation no;\n  notify no;\n}};\ncontrols {{ }};\n"
    );
    for key in &spec.keys {
        let _ = writeln!(text, "key \"{}\" {{ algorithm {}; secret \"{}\"; }};", key.name, key.algorithm, key.secret_base64);
    }
    text.push_str(&spec.extra_config);
    if !text.ends_with('\n') {
        text.push('\n');
    }
    let with = |action: KeyAction| spec.keys.iter().filter(move |k| k.actions.contains(&action)).map(|k| k.name.as_str());
    for (i, zone) in spec.zones.iter().enumerate() {
        let _ = writeln!(text, "zone \"{}\" {{", zone.origin);
        let _ = writeln!(text, "  file \"zone{i}.db\";");
        if zone.text.is_some() {
            text.push_str("  type primary;\n");
            let grants: Vec<String> = with(KeyAction::Update).map(|k| format!("grant {k} zonesub ANY;")).collect();
            if !grants.is_empty() {
                let _ = writeln!(text, "  update-policy {{ {} }};", grants.join(" "));
            }
            let transfers: Vec<String> = with(KeyAction::Transfer).map(|k| format!("key {k};")).collect();
            if !transfers.is_empty() {
                let _ = writeln!(text, "  allow-transfer {{ {} }};", transfers.join(" "));
            }
        }
        let notifiers: Vec<String> = with(KeyAction::Notify).map(|k| format!("key {k};")).collect();
        if zone.text.is_none() && !notifiers.is_empty() {
            let _ = writeln!(text, "  allow-notify {{ {} }};", notifiers.join(" "));
        }
        for line in &zone.zone_extra {
            let _ = writeln!(text, "  {line}");
        }
        text.push_str("};\n");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// BIND starts with a zone and a key, answers its SOA, and is gone after the drop.
    #[tokio::test]
    async fn bind_serves_its_zone_and_stops_on_drop() -> anyhow::Result<()> {
        let spec = BindSpec {
            zones: vec![BindZone {
                origin: "example.test.".into(),
                text: Some(
                    "$ORIGIN example.test.\n@ 300 IN SOA ns1 hostmaster 7 3600 600 604800 30\n@ 300 IN NS ns1\nns1 300 IN A 192.0.2.1\n"
                        .into(),
                ),
                zone_extra: Vec::new(),
            }],
            keys: vec![TsigKey {
                name: "test-key.".into(),
                algorithm: "hmac-sha256".into(),
                secret_base64: "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LTMyYg==".into(),
                actions: vec![KeyAction::Update],
            }],
            extra_config: String::new(),
        };
        let bind = Bind::start(&spec).await?;
        assert_eq!(bind.soa_serial("example.test.").await, Some(7), "{}", bind.logs());
        let addr = bind.addr();
        drop(bind);
        let after = dns_probe::query(addr, "example.test.", RecordType::SOA, Duration::from_millis(300)).await;
        assert!(after.is_err(), "named still answers after the drop: {after:?}");
        Ok(())
    }
}
