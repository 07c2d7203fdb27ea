//! A real PowerDNS Authoritative server (`pdns_server` with its SQLite backend, Debian packages
//! `pdns-server` and `pdns-backend-sqlite3`) for the RFC 2136 tests: started in the foreground
//! on a free loopback port with its database and config in a temporary directory of its own,
//! ready once it answers the zone's SOA, and stopped when dropped.
//!
//! Set up as docs/rfc2136.md tells an operator: `dnsupdate=yes` and `allow-dnsupdate-from`
//! in `pdns.conf`, the keys imported with `pdnsutil import-tsig-key`, and the zone's
//! `TSIG-ALLOW-DNSUPDATE` metadata naming the key that may update it (`TSIG-ALLOW-AXFR` for
//! a transfer-only key). Its caches are off, so an answer always shows the last update.
//!
//! A missing program is a failing test with a message saying how to install it, never a skip.

use crate::counterpart::{logs_at, sbin_binary, soa_at, stop};
use crate::knot::{KeyAction, TsigKey};
use crate::ports::free_port;
use anyhow::Context;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long PowerDNS may take to answer the zone's SOA after it starts.
pub const START_DEADLINE: Duration = Duration::from_secs(20);
/// Ports tried: one taken between choosing and binding makes `pdns_server` fail to listen.
const PORT_ATTEMPTS: usize = 5;
/// Timeout of one probe of whether it serves the zone yet.
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Where Debian puts the SQLite schema.
const SCHEMA: &str = "/usr/share/pdns-backend-sqlite3/schema/schema.sqlite3.sql";

/// A running `pdns_server`, stopped (SIGTERM, then SIGKILL) when dropped.
pub struct PowerDns {
    child: Option<Child>,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

impl PowerDns {
    /// Starts PowerDNS serving `origin` from `zone_text`, with `keys` (an `Update` key may
    /// update the zone, a `Transfer` key may transfer it).
    pub async fn start(origin: &str, zone_text: &str, keys: &[TsigKey]) -> anyhow::Result<PowerDns> {
        let server = sbin_binary("pdns_server", "PowerDNS server", "pdns-server")?;
        let pdnsutil = sbin_binary("pdnsutil", "PowerDNS server", "pdns-server")?;
        anyhow::ensure!(
            Path::new(SCHEMA).is_file(),
            "{SCHEMA} is missing; install PowerDNS's SQLite backend with `apt-get install -y pdns-backend-sqlite3` (.ci/run does)"
        );
        let dir = tempfile::tempdir().context("creating PowerDNS's directory")?;
        let database = dir.path().join("pdns.sqlite3");
        let schema = std::fs::File::open(SCHEMA)?;
        let made = Command::new(sbin_binary("sqlite3", "PowerDNS server (its SQLite backend)", "sqlite3")?)
            .arg(&database)
            .stdin(schema)
            .output()?;
        anyhow::ensure!(made.status.success(), "creating the PowerDNS database: {}", String::from_utf8_lossy(&made.stderr));
        let mut exits = Vec::new();
        for attempt in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            std::fs::write(dir.path().join("pdns.conf"), config(dir.path(), &database, port))?;
            if attempt == 0 {
                let zone = dir.path().join("zone.db");
                std::fs::write(&zone, zone_text)?;
                let util = |args: &[&str]| -> anyhow::Result<()> {
                    let out = Command::new(&pdnsutil).arg(format!("--config-dir={}", dir.path().display())).args(args).output()?;
                    anyhow::ensure!(
                        out.status.success(),
                        "pdnsutil {args:?}: {}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                    Ok(())
                };
                util(&["load-zone", origin, &zone.display().to_string()])?;
                for key in keys {
                    util(&["import-tsig-key", &key.name, &key.algorithm, &key.secret_base64])?;
                    let kind = if key.actions.contains(&KeyAction::Update) { "TSIG-ALLOW-DNSUPDATE" } else { "TSIG-ALLOW-AXFR" };
                    util(&["add-meta", origin, kind, &key.name])?;
                }
            }
            let log = dir.path().join(format!("pdns-{attempt}.log"));
            let child = Command::new(&server)
                .arg(format!("--config-dir={}", dir.path().display()))
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log)?)
                .stderr(std::fs::File::create(log.with_extension("stderr"))?)
                .spawn()
                .map_err(|e| anyhow::anyhow!("cannot run {}: {e}", server.display()))?;
            let mut child = Some(child);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let start = Instant::now();
            loop {
                if let Some(status) = child.as_mut().and_then(|c| c.try_wait().transpose()) {
                    exits.push(format!("pdns_server exited ({}): {}", status?, logs_at(&log)));
                    break;
                }
                if soa_at(addr, origin, PROBE_TIMEOUT).await.is_some() {
                    return Ok(PowerDns { child, addr, _dir: dir, log });
                }
                if start.elapsed() > START_DEADLINE {
                    let logs = logs_at(&log);
                    stop(&mut child);
                    anyhow::bail!("pdns_server did not answer on {addr} within {START_DEADLINE:?}: {logs}");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        anyhow::bail!("pdns_server exited before answering, on {PORT_ATTEMPTS} ports:\n{}", exits.join("\n"))
    }

    /// Where PowerDNS answers DNS (UDP and TCP).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Everything PowerDNS logged so far, for failure messages.
    pub fn logs(&self) -> String {
        logs_at(&self.log)
    }
}

impl Drop for PowerDns {
    fn drop(&mut self) {
        stop(&mut self.child);
    }
}

/// `pdns.conf`: the SQLite backend, updates from loopback, no caches, everything in `dir`.
fn config(dir: &Path, database: &Path, port: u16) -> String {
    format!(
        "launch=gsqlite3\ngsqlite3-database={db}\nlocal-address=127.0.0.1\nlocal-port={port}\nsocket-dir={d}\n\
         dnsupdate=yes\nallow-dnsupdate-from=127.0.0.0/8\ndaemon=no\nguardian=no\ndisable-syslog=yes\nloglevel=4\n\
         cache-ttl=0\nnegquery-cache-ttl=0\nquery-cache-ttl=0\nzone-cache-refresh-interval=0\n\
         receiver-threads=1\ndistributor-threads=1\nwebserver=no\napi=no\n",
        db = database.display(),
        d = dir.display(),
    )
}
