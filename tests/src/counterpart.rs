//! What every real DNS server the tests start (Knot, NSD, BIND, PowerDNS) has in common: where
//! its binary is, whether it serves a zone yet, its logs, and how it is stopped.

use dnsplan_common::dns_probe::{self, RecordType, ResponseCode};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// How long a stopped server has after SIGTERM before SIGKILL.
pub(crate) const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// `name` from PATH or the sbin directories Debian installs servers in. Missing is an error
/// naming what to install (`what`: the server, `package`: its Debian package), not a reason to
/// skip.
pub fn sbin_binary(name: &str, what: &str, package: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    for dir in dirs {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    anyhow::bail!(
        "the `{name}` binary is not installed (looked in PATH, /usr/sbin, /usr/local/sbin, /sbin); this test runs against a real \
         {what} and cannot run without it: install it with `apt-get install -y {package}` (.ci/run does)"
    )
}

/// The SOA serial `addr` serves for `origin` with authority, if it does, asked with `timeout`.
pub(crate) async fn soa_at(addr: SocketAddr, origin: &str, timeout: Duration) -> Option<u32> {
    match dns_probe::query(addr, origin, RecordType::SOA, timeout).await {
        Ok(a) if a.rcode == ResponseCode::NoError && a.authoritative => a.soa_serial,
        _ => None,
    }
}

/// A server's log file and its captured stderr (`<log>.stderr`), for an error message.
pub(crate) fn logs_at(log: &Path) -> String {
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    format!("{}{}", read(log), read(&log.with_extension("stderr")))
}

/// SIGTERM (which lets a server stop its child processes; SIGKILL would leave them), then
/// SIGKILL if it has not stopped within [`STOP_DEADLINE`].
pub(crate) fn stop(child: &mut Option<Child>) {
    let Some(mut child) = child.take() else { return };
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    if rx.recv_timeout(STOP_DEADLINE).is_err() {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
}
