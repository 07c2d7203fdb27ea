//! The `dnsplan-authority` binary under a small open-file limit, with its descriptors
//! attacked from outside: idle TCP connections to the DNS port and the control API, more
//! than the process could hold.
//!
//! The authority fits its connection caps under the limit at start (one WARN line), so no
//! accept fails: UDP keeps answering, the log stays a few lines long, and TCP answers again
//! once the connections close. Checked once by removing the protections: without the caps
//! (the configured 1,024 DNS connections under a limit of 256) and the accept backoff,
//! accepts failed with EMFILE in a loop writing a WARN line each (774,028 lines by the time
//! the UDP queries were done); without the caps alone, accepts failed (and were counted)
//! while the backoff kept the log short.

mod support;

use hickory_proto::op::{Message, ResponseCode};
use hickory_proto::rr::RecordType;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The open-file limit the authority runs under (soft and hard).
const LIMIT: u64 = 256;
/// Idle connections opened to the DNS port: more than the limit.
const DNS_ATTACKERS: usize = 600;
/// Idle connections opened to the control API: more than the limit less the DNS ones.
const CONTROL_ATTACKERS: usize = 300;
/// UDP queries that must all be answered while the connections are held.
const UDP_QUERIES: usize = 50;
/// Most log lines the whole run may write: start, the one about lowered caps, one line per
/// second per kind of refusal, stop.
const LOG_LINES_MAX: usize = 100;
/// How long anything we wait for may take; far more than it needs.
const DEADLINE: Duration = Duration::from_secs(30);

fn config_text(data_dir: &Path) -> String {
    // Held DNS connections are not closed as idle during the test.
    format!(
        r#"
data_dir = "{data}"
[dns]
listen = ["127.0.0.1:0"]
tcp_idle_timeout_secs = 120
[control]
listen = "127.0.0.1:0"
token = "{token}"
header_timeout_secs = 120
[dns_zone]
origin = "example.test."
ns = ["ns1.example.test."]
master_file = "zone.db"
[dns_zone.soa]
mname = "ns1.example.test."
rname = "hostmaster.example.test."
"#,
        data = data_dir.display(),
        token = support::TOKEN
    )
}

struct Authority {
    child: Child,
    dns: SocketAddr,
    control: String,
}

impl Drop for Authority {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary after `ulimit {ulimit}` (through the shell: setting the limit in the
/// child ourselves would need unsafe code), its log going to `log`.
fn start(dir: &Path, ulimit: &str, log: &Path) -> anyhow::Result<Authority> {
    std::fs::write(dir.join("zone.db"), support::ZONE_FILE)?;
    let config = dir.join("authority.toml");
    std::fs::write(&config, config_text(&dir.join("data")))?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {ulimit} && exec \"$0\" --config \"$1\""))
        .arg(env!("CARGO_BIN_EXE_dnsplan-authority"))
        .arg(&config)
        .env_remove("DNSPLAN_TOKEN")
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log)?)
        .spawn()?;
    let stdout = child.stdout.take().expect("piped");
    let (mut dns, mut control) = (None, None);
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some("dns"), Some(addr)) => dns = Some(addr.parse()?),
            (Some("control"), Some(url)) => {
                control = Some(url.to_owned());
                break;
            }
            _ => {}
        }
    }
    let authority = Authority { child, dns: dns.unwrap_or(([0, 0, 0, 0], 0).into()), control: control.unwrap_or_default() };
    if authority.control.is_empty() {
        anyhow::bail!("the authority did not say where it listens; its log: {}", std::fs::read_to_string(log)?);
    }
    Ok(authority)
}

/// The soft and hard open-file limits of process `pid`.
fn open_files_limit(pid: u32) -> anyhow::Result<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
    let line = limits.lines().find(|l| l.starts_with("Max open files")).unwrap_or_default();
    let numbers: Vec<u64> = line.split_whitespace().skip(3).take(2).filter_map(|n| n.parse().ok()).collect();
    match numbers[..] {
        [soft, hard] => Ok((soft, hard)),
        _ => anyhow::bail!("no open-file limit in {line:?}"),
    }
}

fn soa_query() -> Vec<u8> {
    support::build_query("example.test.", RecordType::SOA, support::Ask::default())
}

fn is_soa_answer(reply: &[u8]) -> bool {
    Message::from_vec(reply).is_ok_and(|m| m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty())
}

/// Opens up to `count` idle connections to `addr`, stopping at the first that cannot be made.
fn open_idle(addr: SocketAddr, count: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(count);
    for _ in 0..count {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(2)) {
            Ok(stream) => held.push(stream),
            Err(_) => break,
        }
    }
    held
}

fn log_lines(log: &Path) -> anyhow::Result<usize> {
    Ok(std::fs::read_to_string(log)?.lines().count())
}

fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_from_outside_cannot_exhaust_descriptors() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("authority.log");
    let authority = start(dir.path(), &format!("-n {LIMIT}"), &log)?;
    assert_eq!(open_files_limit(authority.child.id())?, (LIMIT, LIMIT), "not under the test's limit");
    let query = soa_query();
    assert!(is_soa_answer(&support::exchange_tcp(authority.dns, &query).await?), "TCP does not answer before the attack");

    let (dns, control) = (authority.dns, authority.control.trim_start_matches("http://").parse::<SocketAddr>()?);
    let attack = tokio::task::spawn_blocking(move || (open_idle(dns, DNS_ATTACKERS), open_idle(control, CONTROL_ATTACKERS)));
    let (dns_held, control_held) = attack.await?;
    assert!(dns_held.len() + control_held.len() > LIMIT as usize, "only {} + {} connections were made", dns_held.len(), control_held.len());

    for i in 0..UDP_QUERIES {
        let reply = support::exchange_udp(authority.dns, &query, Duration::from_secs(2)).await?;
        assert!(reply.as_deref().is_some_and(is_soa_answer), "UDP query {i} unanswered while connections are held: {reply:?}");
    }
    let lines = log_lines(&log)?;
    assert!(lines <= LOG_LINES_MAX, "{lines} log lines while the connections are held");

    drop(dns_held);
    drop(control_held);
    let started = Instant::now();
    loop {
        match support::exchange_tcp(authority.dns, &query).await {
            Ok(reply) if is_soa_answer(&reply) => break,
            other => assert!(started.elapsed() < DEADLINE, "TCP does not answer after the connections closed: {other:?}"),
        }
    }
    let client = reqwest::Client::builder().timeout(DEADLINE).build()?;
    let metrics = client.get(format!("{}/metrics", authority.control)).send().await?.text().await?;
    assert_eq!(metric(&metrics, "dnsplan_dns_tcp_accept_errors_total"), Some(0.0), "{metrics}");
    assert_eq!(metric(&metrics, "dnsplan_control_accept_errors_total"), Some(0.0), "{metrics}");
    assert!(metric(&metrics, "dnsplan_dns_tcp_refused_total").is_some_and(|n| n > 0.0), "{metrics}");

    let text = std::fs::read_to_string(&log)?;
    assert!(text.contains("connection caps lowered to fit the open-file limit"), "{text}");
    assert!(text.lines().count() <= LOG_LINES_MAX, "{} log lines", text.lines().count());
    Ok(())
}

/// Started with a soft limit below its hard one, the authority raises the soft limit.
#[test]
fn the_soft_open_file_limit_is_raised_to_the_hard_one() -> anyhow::Result<()> {
    let hard = dnsplan_common::open_files::limit()?.hard;
    assert!(hard > LIMIT, "the test needs a hard open-file limit above {LIMIT}, not {hard}");
    let dir = tempfile::tempdir()?;
    let log = dir.path().join("authority.log");
    let authority = start(dir.path(), &format!("-S -n {LIMIT}"), &log)?;
    assert_eq!(open_files_limit(authority.child.id())?, (hard, hard));
    Ok(())
}
