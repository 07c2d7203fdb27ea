//! Response-rate limiting groups clients by prefix, over real UDP from real source addresses:
//! with the default grouping (`ipv4_prefix_len` 24, `ipv6_prefix_len` 56), two clients in one
//! /24 or /56 share one rate bucket and a client in another prefix has its own.
//!
//! IPv4 runs on loopback (all of 127.0.0.0/8 is local on Linux). IPv6 needs addresses other
//! than ::1, so that test runs in a network namespace of its own: it runs its own test binary
//! again under `unshare --net` (root, util-linux's `unshare` and iproute2's `ip`; CI has all
//! three), filtered to itself, and the child puts the addresses on the namespace's loopback.
//! The namespace has no name and nothing else in it: it goes away with the child process,
//! however the child ends (the parent kills it if it outlives `CHILD_DEADLINE`). Without
//! namespaces the test fails, saying what is missing.
//!
//! Changing the default grouping to /32 and /64 (`config::default_rrl_ipv4_prefix`,
//! `default_rrl_ipv6_prefix`) made both tests fail on the shared-bucket assertion: the second
//! client got a whole burst of its own (checked once).

mod support;

use dnsplan_authority::config::AuthorityConfig;
use dnsplan_authority::run::{Bound, run_with_store};
use dnsplan_common::SledStore;
use hickory_proto::op::Message;
use hickory_proto::rr::RecordType;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;
use tokio::net::UdpSocket;

/// Longest wait for one answer. Every query gets one (`slip = 1` sends every limited answer
/// truncated instead of dropping it), and loopback does not lose datagrams.
const ANSWER_WAIT: Duration = Duration::from_secs(10);
/// Longest the child test in its namespace may take.
const CHILD_DEADLINE: Duration = Duration::from_secs(120);
/// Set in the child test's environment to the parent's network namespace, which the child
/// must not be in.
const CHILD_ENV: &str = "DNSPLAN_TEST_NETNS_PARENT";

/// One answer a second after a burst of `BURST`; every limited answer slips (TC=1), so each
/// query is answered and nothing is inferred from silence; nothing exempt. The prefix lengths
/// are the defaults, which is what these tests check.
const RRL: &str = "[dns.rrl]\nresponses_per_sec = 1\nburst_responses = 10\nslip = 1\nexempt = []\n";
const BURST: usize = 10;
const RATE_PER_SEC: f64 = 1.0;
const NAME: &str = "api.example.test.";

/// An authority in-process on `dns`, already serving `NAME` (two addresses) from its store.
struct Authority {
    dns: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Authority {
    async fn start(dir: &Path, dns: SocketAddr) -> anyhow::Result<Authority> {
        std::fs::write(dir.join("zone.db"), ZONE_FILE)?;
        let text = format!(
            "data_dir = \"{data}\"\n[dns]\nlisten = [\"{dns}\"]\n{RRL}[control]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n\
             [dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\nmaster_file = \"zone.db\"\n\
             [dns_zone.soa]\nmname = \"ns1.example.test.\"\nrname = \"hostmaster.example.test.\"\n",
            data = dir.join("data").display(),
        );
        let path = dir.join("authority.toml");
        std::fs::write(&path, text)?;
        let config = AuthorityConfig::load(&path)?;
        // The state is in the store before the authority starts, which serves it before it
        // binds: no waiting for the follower.
        let store = SledStore::open(&config.data_dir)?;
        let two = endpoint(30, vec![target("10.0.0.1", "a", 1), target("10.0.0.2", "b", 1)]);
        publish_and_apply(&store, &plan(1, &[(NAME, two)])).await?;
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let (bound_tx, bound_rx) = tokio::sync::oneshot::channel::<Bound>();
        let dir = dir.to_path_buf();
        let task = tokio::spawn(async move {
            run_with_store(store, config, &dir, async move { stop_rx.await.unwrap_or(()) }, move |b| {
                let _ = bound_tx.send(b);
            })
            .await
        });
        let bound = bound_rx.await.map_err(|_| anyhow::anyhow!("the authority stopped before binding"))?;
        Ok(Authority { dns: bound.dns[0], stop: Some(stop_tx), task })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task).await??;
        Ok(())
    }
}

/// What one client got for its queries.
#[derive(Debug, Default)]
struct Tally {
    full: usize,
    slipped: usize,
}

/// `n` queries for `NAME` from `from`, one at a time, each answer read before the next query.
async fn ask_from(from: IpAddr, server: SocketAddr, n: usize) -> anyhow::Result<Tally> {
    let socket = UdpSocket::bind(SocketAddr::new(from, 0)).await.map_err(|e| anyhow::anyhow!("binding a client socket on {from}: {e}"))?;
    let mut tally = Tally::default();
    let mut buf = vec![0u8; 65_535];
    for _ in 0..n {
        let query = build_query(NAME, RecordType::A, Ask::default());
        let id = u16::from_be_bytes([query[0], query[1]]);
        socket.send_to(&query, server).await?;
        let len = tokio::time::timeout(ANSWER_WAIT, socket.recv(&mut buf))
            .await
            .map_err(|_| anyhow::anyhow!("{from}: no answer within {ANSWER_WAIT:?} (slip = 1 answers every query)"))??;
        let m = Message::from_vec(&buf[..len])?;
        anyhow::ensure!(m.metadata.id == id, "{from}: an answer to another query: {m:?}");
        if m.metadata.truncation {
            anyhow::ensure!(m.answers.is_empty(), "{from}: a slip carries no records: {m:?}");
            tally.slipped += 1;
        } else {
            anyhow::ensure!(m.answers.len() == 2, "{from}: a full answer has both addresses: {m:?}");
            tally.full += 1;
        }
    }
    Ok(tally)
}

/// `first` and `second` share a prefix, `other` is in another. `first` drains the bucket
/// with a burst; `second` then gets only what the rate refilled meanwhile (a bucket of its
/// own would give it a whole burst); `other` gets a whole burst.
///
/// A hash collision between `other`'s key and the shared one (1 in `table_size`, 262,144)
/// would limit `other` too: only more, never less, so the shared-bucket assertion holds
/// whatever the hash.
async fn check_grouping(server: SocketAddr, first: IpAddr, second: IpAddr, other: IpAddr) -> anyhow::Result<()> {
    let started = Instant::now();
    let a = ask_from(first, server, BURST).await?;
    assert_eq!(a.full, BURST, "{first} has a fresh bucket: {a:?}");
    let b = ask_from(second, server, BURST).await?;
    let elapsed_secs = started.elapsed().as_secs_f64();
    let refilled = (elapsed_secs * RATE_PER_SEC).ceil() as usize;
    assert!(
        a.full + b.full <= BURST + refilled,
        "{first} and {second} share one bucket: together they may get the burst of {BURST} plus {refilled} refilled in \
         {elapsed_secs:.2} s, but got {} and {} full answers ({second}: {b:?})",
        a.full,
        b.full
    );
    assert_eq!(b.slipped, BURST - b.full, "{second}: every limited answer slips");
    let c = ask_from(other, server, BURST).await?;
    assert_eq!(c.full, BURST, "{other} is in another prefix, with a bucket of its own: {c:?}");
    Ok(())
}

/// 127.0.1.1 and 127.0.1.2 share a bucket (one /24); 127.0.2.1 has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv4_clients_in_one_24_share_a_rate_bucket() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let auth = Authority::start(dir.path(), "127.0.0.1:0".parse()?).await?;
    let ip = |s: &str| s.parse::<IpAddr>();
    check_grouping(auth.dns, ip("127.0.1.1")?, ip("127.0.1.2")?, ip("127.0.2.1")?).await?;
    auth.stop().await
}

/// The IPv6 clients: two in fd00:0:0::/56, one in fd00:0:0:100::/56, and the server's address.
const V6_FIRST: &str = "fd00:0:0:1::1";
const V6_SECOND: &str = "fd00:0:0:2::1";
const V6_OTHER: &str = "fd00:0:0:100::1";
const V6_SERVER: &str = "fd00:0:0:ff::53";

/// fd00:0:0:1::1 and fd00:0:0:2::1 share a bucket (one /56, two /64s); fd00:0:0:100::1 has
/// its own. Runs in a network namespace of its own (see the module docs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_clients_in_one_56_share_a_rate_bucket() -> anyhow::Result<()> {
    match std::env::var(CHILD_ENV) {
        Ok(parent_namespace) => ipv6_in_own_namespace(&parent_namespace).await,
        Err(_) => run_in_new_namespace("ipv6_clients_in_one_56_share_a_rate_bucket").await,
    }
}

/// The network namespace this process is in, such as `net:[4026531840]`.
fn network_namespace() -> anyhow::Result<String> {
    let link = std::fs::read_link("/proc/self/ns/net").map_err(|e| anyhow::anyhow!("reading /proc/self/ns/net: {e}"))?;
    Ok(link.display().to_string())
}

/// Runs this test binary's `test` in a new network namespace and fails with its output if it
/// does not pass.
async fn run_in_new_namespace(test: &str) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let child = Command::new("unshare")
        .args(["--net", "--"])
        .arg(&exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, network_namespace()?)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!(
                "this test needs a network namespace of its own, made with `unshare --net` (util-linux): running it failed: {e}"
            )
        })?;
    // `unshare` runs the test binary in its own place, so this is the process to kill.
    let pid = child.id();
    let waiting = tokio::task::spawn_blocking(move || child.wait_with_output());
    let output = match tokio::time::timeout(CHILD_DEADLINE, waiting).await {
        Ok(joined) => joined??,
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid.to_string()]).status();
            anyhow::bail!("the test in its own network namespace did not finish within {CHILD_DEADLINE:?}; killed it");
        }
    };
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    anyhow::ensure!(
        output.status.success(),
        "the test in its own network namespace failed ({}); its output follows. (Making the namespace needs root \
         (CAP_SYS_ADMIN, CAP_NET_ADMIN), util-linux's `unshare` and iproute2's `ip`.)\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        output.status
    );
    anyhow::ensure!(stdout.contains("test result: ok. 1 passed"), "the child did not run the test:\n{stdout}\n{stderr}");
    Ok(())
}

/// Runs `ip args…`, failing with what it said.
fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new("ip").args(args).output().map_err(|e| anyhow::anyhow!("running `ip {}` (iproute2): {e}", args.join(" ")))?;
    anyhow::ensure!(out.status.success(), "`ip {}` failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    Ok(())
}

/// The child: in a fresh namespace, loopback up with the test's addresses, then the test.
async fn ipv6_in_own_namespace(parent_namespace: &str) -> anyhow::Result<()> {
    let here = network_namespace()?;
    // Never change the addresses of the namespace the tests were started in.
    anyhow::ensure!(here != parent_namespace, "{CHILD_ENV} is set but this process is in its parent's network namespace ({here})");
    ip(&["link", "set", "lo", "up"])?;
    for addr in [V6_FIRST, V6_SECOND, V6_OTHER, V6_SERVER] {
        ip(&["-6", "addr", "add", &format!("{addr}/128"), "dev", "lo", "nodad"])?;
    }
    let dir = tempfile::tempdir()?;
    let server = SocketAddr::new(V6_SERVER.parse()?, 0);
    let auth = Authority::start(dir.path(), server).await?;
    check_grouping(auth.dns, V6_FIRST.parse()?, V6_SECOND.parse()?, V6_OTHER.parse()?).await?;
    auth.stop().await
}
