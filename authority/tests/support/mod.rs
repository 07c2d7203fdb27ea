//! Shared by the authority's over-the-wire tests: an authority running in-process on real
//! sockets (port 0), a small DNS client built on hickory-proto, and plan helpers.
#![allow(dead_code)]

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_authority::run::{Bound, run};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Author, DnsName, Endpoint, Generation, Plan, Store, Target, ValidatedPlan, ZoneId};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const TOKEN: &str = "wire-test-token-0123456789";

pub const ZONE_FILE: &str = "$ORIGIN example.test.\n$TTL 3600\nns1 IN A 127.0.0.1\nwww IN CNAME api.example.test.\n@ IN TXT \"hello\"\n_sip._udp IN SRV 10 5 5060 sip.example.test.\nsip IN A 192.0.2.53\n";

pub fn config_text(data_dir: &Path, answer_addresses_max: usize) -> String {
    format!(
        r#"
data_dir = "{data}"
[dns]
listen = ["127.0.0.1:0"]
answer_addresses_max = {answer_addresses_max}
[control]
listen = "127.0.0.1:0"
token = "{TOKEN}"
[dns_zone]
origin = "example.test."
ns = ["ns1.example.test."]
master_file = "zone.db"
[dns_zone.soa]
mname = "ns1.example.test."
rname = "hostmaster.example.test."
ttl_secs = 300
minimum_secs = 30
"#,
        data = data_dir.display()
    )
}

pub struct TestAuthority {
    pub dns: SocketAddr,
    pub control: String,
    pub store: RemoteStore,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl TestAuthority {
    /// Starts an authority whose store lives in `dir/data`.
    pub async fn start(dir: &Path, answer_addresses_max: usize) -> anyhow::Result<TestAuthority> {
        TestAuthority::start_with(dir, answer_addresses_max, "").await
    }

    /// As `start`, with `extra` (TOML tables such as `[dns.rrl]`) at the end of the config.
    pub async fn start_with(dir: &Path, answer_addresses_max: usize, extra: &str) -> anyhow::Result<TestAuthority> {
        TestAuthority::start_text(dir, &(config_text(&dir.join("data"), answer_addresses_max) + extra)).await
    }

    /// Starts an authority with the config `text` (`config_text` changed as the test needs).
    pub async fn start_text(dir: &Path, text: &str) -> anyhow::Result<TestAuthority> {
        std::fs::write(dir.join("zone.db"), ZONE_FILE)?;
        let config_path = dir.join("authority.toml");
        std::fs::write(&config_path, text)?;
        let config = AuthorityConfig::load(&config_path)?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
        let dir: PathBuf = dir.into();
        let task = tokio::spawn(async move {
            run(config, &dir, async move { stop_rx.await.unwrap_or(()) }, move |b| {
                let _ = bound_tx.send(b);
            })
            .await
        });
        let bound = match bound_rx.await {
            Ok(bound) => bound,
            Err(_) => {
                let why = match task.await {
                    Ok(Err(err)) => format!("{err:#}"),
                    Ok(Ok(())) => "it returned".into(),
                    Err(err) => err.to_string(),
                };
                anyhow::bail!("authority stopped before binding: {why}");
            }
        };
        let control = format!("http://{}", bound.control);
        let store = RemoteStore::new(&control, Some(TOKEN.into()))?;
        Ok(TestAuthority { dns: bound.dns[0], control, store, stop: Some(stop_tx), task })
    }

    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }
}

#[derive(Clone, Copy)]
pub struct Ask {
    pub tcp: bool,
    pub edns: Option<u16>,
    pub edns_version: u8,
    /// The DO bit (RFC 3225) in the OPT record, when there is one.
    pub dnssec_ok: bool,
    pub class: DNSClass,
}

impl Default for Ask {
    fn default() -> Self {
        Ask { tcp: false, edns: Some(1232), edns_version: 0, dnssec_ok: false, class: DNSClass::IN }
    }
}

pub fn build_query(name: &str, qtype: RecordType, ask: Ask) -> Vec<u8> {
    let mut msg = Message::new(rand::random(), MessageType::Query, OpCode::Query);
    let mut q = Query::query(Name::from_ascii(name).expect("test names are valid"), qtype);
    q.set_query_class(ask.class);
    msg.add_query(q);
    msg.metadata.recursion_desired = true;
    if let Some(size) = ask.edns {
        let mut edns = Edns::new();
        edns.set_max_payload(size).set_version(ask.edns_version).set_dnssec_ok(ask.dnssec_ok);
        msg.set_edns(edns);
    }
    msg.to_vec().expect("test queries encode")
}

/// Sends raw bytes over UDP and returns the raw reply, or `None` if none came within `wait`.
pub async fn exchange_udp(server: SocketAddr, packet: &[u8], wait: Duration) -> anyhow::Result<Option<Vec<u8>>> {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await?;
    socket.send_to(packet, server).await?;
    let mut buf = vec![0u8; 65_535];
    match tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
        Ok(r) => {
            let (len, _) = r?;
            Ok(Some(buf[..len].to_vec()))
        }
        Err(_) => Ok(None),
    }
}

pub async fn exchange_tcp(server: SocketAddr, packet: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(server)).await??;
    stream.write_all(&(packet.len() as u16).to_be_bytes()).await?;
    stream.write_all(packet).await?;
    let len = tokio::time::timeout(Duration::from_secs(5), stream.read_u16()).await??;
    let mut buf = vec![0u8; usize::from(len)];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf)).await??;
    Ok(buf)
}

/// One query and its decoded reply, with its raw bytes.
pub async fn ask(server: SocketAddr, name: &str, qtype: RecordType, ask: Ask) -> anyhow::Result<(Message, Vec<u8>)> {
    let packet = build_query(name, qtype, ask);
    let raw = if ask.tcp {
        exchange_tcp(server, &packet).await?
    } else {
        // Loopback does not lose packets, but a retry costs nothing.
        let mut reply = None;
        for _ in 0..3 {
            reply = exchange_udp(server, &packet, Duration::from_secs(2)).await?;
            if reply.is_some() {
                break;
            }
        }
        reply.ok_or_else(|| anyhow::anyhow!("no UDP reply for {name} {qtype}"))?
    };
    Ok((Message::from_vec(&raw)?, raw))
}

pub fn addresses(msg: &Message) -> BTreeSet<IpAddr> {
    msg.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// Polls DNS until `check` accepts the answer or the deadline passes.
pub async fn until<F>(server: SocketAddr, name: &str, qtype: RecordType, deadline: Duration, mut check: F) -> anyhow::Result<Message>
where
    F: FnMut(&Message) -> bool,
{
    let start = Instant::now();
    loop {
        let (msg, _) = ask(server, name, qtype, Ask::default()).await?;
        if check(&msg) {
            return Ok(msg);
        }
        if start.elapsed() > deadline {
            anyhow::bail!("condition on {name} {qtype} not met within {deadline:?}; last answer: {msg:?}");
        }
        // Each round is a real UDP exchange; yield so the server's tasks run in between.
        tokio::task::yield_now().await;
    }
}

pub fn target(addr: &str, zone: &str, weight: u32) -> Target {
    Target { address: addr.parse().expect("test address"), zone: ZoneId::parse(zone).expect("test zone"), weight }
}

pub fn endpoint(ttl_secs: u32, targets: Vec<Target>) -> Endpoint {
    Endpoint { ttl_secs, targets }
}

/// Plan `g` (parent `g - 1`) serving `endpoints`.
pub fn plan(g: u64, endpoints: &[(&str, Endpoint)]) -> ValidatedPlan {
    let endpoints: BTreeMap<_, _> = endpoints.iter().map(|(n, e)| (DnsName::parse(n).expect("test name"), e.clone())).collect();
    ValidatedPlan::new(Plan {
        generation: Generation(g),
        parent_generation: Generation(g - 1),
        created_at_unix_ms: 0,
        author: Author::Planner { id: "wire-test".into() },
        reason: format!("wire test plan {g}"),
        dns_zone: DnsName::parse("example.test.").expect("zone"),
        endpoints,
        retired: BTreeSet::new(),
        rollback_of: None,
        provenance: vec![],
    })
    .expect("test plans are valid")
}

/// Publishes `plan` and applies every endpoint in it, and its retirements.
pub async fn publish_and_apply<S: Store>(store: &S, plan: &ValidatedPlan) -> anyhow::Result<()> {
    store.publish(plan).await?;
    for (name, e) in &plan.plan().endpoints {
        store.apply(name, plan.generation(), e).await?;
    }
    for name in &plan.plan().retired {
        store.retire(name, plan.generation()).await?;
    }
    Ok(())
}

/// Longest wait for the authority binary to start or to log a line; far more than either takes.
pub const PROCESS_WAIT: Duration = Duration::from_secs(30);

/// The `dnsplan-authority` binary, killed when dropped, with its JSON log lines on a channel.
pub struct AuthorityProcess {
    child: Child,
    pub control: String,
    logs: std::sync::mpsc::Receiver<serde_json::Value>,
}

impl Drop for AuthorityProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl AuthorityProcess {
    /// Starts the binary on the config `text` (written to `dir/authority.toml`, beside the
    /// test zone file) and waits until it says where its control API is.
    pub fn start(dir: &std::path::Path, text: &str) -> anyhow::Result<AuthorityProcess> {
        AuthorityProcess::start_zone(dir, text, ZONE_FILE)
    }

    /// As `start`, with the zone file `zone`.
    pub fn start_zone(dir: &std::path::Path, text: &str, zone: &str) -> anyhow::Result<AuthorityProcess> {
        AuthorityProcess::start_zone_env(dir, text, zone, &[])
    }

    /// As `start_zone`, with `env` added to the process's environment (a preloaded library
    /// that moves its clock, say).
    pub fn start_zone_env(
        dir: &std::path::Path,
        text: &str,
        zone: &str,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> anyhow::Result<AuthorityProcess> {
        std::fs::write(dir.join("zone.db"), zone)?;
        let path = dir.join("authority.toml");
        std::fs::write(&path, text)?;
        let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-authority"))
            .arg("--config")
            .arg(&path)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .env_remove("DNSPLAN_TOKEN")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("piped");
        let stderr = child.stderr.take().expect("piped");
        let (tx, logs) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(value) = serde_json::from_str::<serde_json::Value>(&line) {
                    let _ = tx.send(value);
                }
            }
        });
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(url) = line.strip_prefix("control").map(str::trim) {
                    let _ = addr_tx.send(url.to_owned());
                }
            }
        });
        let control =
            addr_rx.recv_timeout(PROCESS_WAIT).map_err(|_| anyhow::anyhow!("the authority did not say where its control API is"))?;
        Ok(AuthorityProcess { child, control, logs })
    }

    /// The first log line `want` accepts, within `PROCESS_WAIT`.
    pub fn log_until(&self, what: &str, want: impl Fn(&serde_json::Value) -> bool) -> anyhow::Result<serde_json::Value> {
        let deadline = std::time::Instant::now() + PROCESS_WAIT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.logs.recv_timeout(left) {
                Ok(line) if want(&line) => return Ok(line),
                Ok(_) => {}
                Err(_) => anyhow::bail!("no log line {what} within {PROCESS_WAIT:?}"),
            }
        }
    }

    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        anyhow::ensure!(Command::new("kill").args([signal, &self.child.id().to_string()]).status()?.success(), "kill {signal}");
        Ok(())
    }
}

pub fn message(line: &serde_json::Value) -> &str {
    line.pointer("/fields/message").and_then(|m| m.as_str()).unwrap_or_default()
}

pub fn field<'a>(line: &'a serde_json::Value, name: &str) -> &'a str {
    line.pointer(&format!("/fields/{name}")).and_then(|m| m.as_str()).unwrap_or_default()
}

/// Runs `ip` (iproute2) with `args`, failing the test with its error output.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|err| panic!("ip (iproute2) is needed: {err}"));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// A network namespace of the test's own, removed when dropped.
pub struct Netns(pub String);

impl Netns {
    pub fn new(role: &str) -> Netns {
        let ns = Netns(format!("dnsplan-{role}-{}", std::process::id()));
        ip(&["netns", "add", &ns.0]);
        ns
    }

    /// Runs `f` on a thread inside this namespace (processes it starts are inside too).
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/run/netns/{}", self.0);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|err| panic!("{path}: {err}"));
            nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                .unwrap_or_else(|err| panic!("setns {path}: {err} (needs CAP_SYS_ADMIN)"));
            f()
        })
        .join()
        .expect("the thread in the namespace")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}
