//! A `dnsplan-authority` process following a store on etcd, with its config file, on ports
//! the system picks.

use super::{WITHIN, bin_dir};
use dnsplan_tests::etcd::EtcdCluster;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// The authorities' control token (the demo one is refused outside `dnsplan up`).
pub const ETCD_AUTHORITY_TOKEN: &str = "authorities-test-token-0123456789abcdef";

/// A `dnsplan-authority` process, killed (SIGKILL) when dropped.
pub struct Authority {
    pub child: Child,
    pub dns: SocketAddr,
    pub control: String,
}

impl Drop for Authority {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts an authority following `cluster` under `prefix`, its config in `dir` (with `extra` appended), its DNS and control API on
/// ports the system picks (read back from its log, so no other process can take them first),
/// its log in `dir/authority.log`.
pub fn etcd_authority(dir: &Path, cluster: &EtcdCluster, prefix: &str, extra: &str) -> anyhow::Result<Authority> {
    let endpoints: Vec<String> = cluster.all_endpoints().iter().map(|e| format!("\"{e}\"")).collect();
    let config = format!(
        r#"data_dir = "{data}"
[store]
kind = "etcd"
endpoints = [{endpoints}]
prefix = "{prefix}"
[dns]
listen = ["127.0.0.1:0"]
[dns.transfer]
tsig_required = false
[[dns.transfer.secondaries]]
address = "127.0.0.0/8"
[control]
listen = "127.0.0.1:0"
token = "{ETCD_AUTHORITY_TOKEN}"
[dns_zone]
origin = "example.test."
ns = ["ns1.example.test."]
[dns_zone.soa]
mname = "ns1.example.test."
rname = "hostmaster.example.test."
{extra}
"#,
        data = dir.join("data").display(),
        endpoints = endpoints.join(", "),
    );
    let path = dir.join("authority.toml");
    std::fs::write(&path, config)?;
    let mut child = Command::new(bin_dir().join("dnsplan-authority"))
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let log_path = dir.join("authority.log");
    let mut log = std::fs::File::create(&log_path)?;
    let (bound_tx, bound_rx) = std::sync::mpsc::channel();
    // Copies the log to its file for the whole life of the process; says where it serves.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = writeln!(log, "{line}");
            if let Some(bound) = serving_at(&line) {
                let _ = bound_tx.send(bound);
            }
        }
    });
    let mut authority = Authority { child, dns: SocketAddr::from(([127, 0, 0, 1], 0)), control: String::new() };
    match bound_rx.recv_timeout(WITHIN) {
        Ok((dns, control)) => {
            authority.dns = dns;
            authority.control = format!("http://{control}");
            Ok(authority)
        }
        Err(_) => {
            let exit = authority.child.try_wait()?;
            anyhow::bail!(
                "the authority did not say where it serves within {WITHIN:?} (exit: {exit:?}); its log:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            )
        }
    }
}

/// The DNS and control addresses of the authority's "authority serving dns=[A] control=B" line
/// (or "authority serving its saved state dns=[A] control=B", with the store unreachable).
pub fn serving_at(line: &str) -> Option<(SocketAddr, SocketAddr)> {
    let rest = &line[line.find("authority serving")?..];
    let rest = &rest[rest.find("dns=[")? + "dns=[".len()..];
    let dns = rest[..rest.find(']')?].split(", ").next()?.parse().ok()?;
    let control = rest[rest.find("control=")? + "control=".len()..].split_whitespace().next()?.parse().ok()?;
    Some((dns, control))
}
