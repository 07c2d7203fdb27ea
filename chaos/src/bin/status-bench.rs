//! Status-poller benchmark: does polling `/v1/status` move what matters? The authority (the
//! real `dnsplan-authority` binary, a process of its own) serves a sled store of N endpoints
//! (default 100,000) and is measured twice, alone and with 8 clients polling `/v1/status` as
//! fast as they can: DNS latency (p50, p99 of UDP queries) and authenticated write latency
//! (publish one plan changing one endpoint and apply it through the control API). The
//! measuring client runs on a thread and runtime of its own, so the pollers (in this process)
//! do not delay it here; they share the machine's cores with the authority, as they would
//! share a host. Figures are printed side by side with their ratio, because only ratios
//! travel between machines. Run it through `bench/status.sh`.
//!
//! Usage: status-bench AUTHORITY_BINARY [ENDPOINTS] (default 100000)

use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::{APPLY_BATCH_MAX, ApplyItem};
use dnsplan_common::{EndpointName, Generation, SledStore, Store};
use dnsplan_tests::fixtures::{endpoint_for, name, plan, planner};
use dnsplan_tests::stack::{TOKEN, authority_config_text};
use std::io::BufRead;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

const POLLERS: usize = 8;
const DNS_SAMPLES: usize = 2_000;
const WRITE_SAMPLES: usize = 50;

struct Figures {
    dns_p50: Duration,
    dns_p99: Duration,
    write_p50: Duration,
    write_p99: Duration,
    polls: u64,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

async fn measure(
    remote: &RemoteStore,
    dns: std::net::SocketAddr,
    names: &[EndpointName],
    next: &mut u64,
) -> anyhow::Result<(Vec<Duration>, Vec<Duration>)> {
    let mut dns_times = Vec::with_capacity(DNS_SAMPLES);
    for i in 0..DNS_SAMPLES {
        let target = &names[(i * 7919) % names.len()];
        let started = Instant::now();
        let answer = dns_probe::query(dns, target.as_str(), RecordType::A, Duration::from_secs(2)).await?;
        dns_times.push(started.elapsed());
        anyhow::ensure!(answer.has_addresses(), "{target} answered {answer:?}");
    }
    let mut write_times = Vec::with_capacity(WRITE_SAMPLES);
    for _ in 0..WRITE_SAMPLES {
        let g = *next;
        *next += 1;
        // Plan g: every endpoint keeps plan 1's records but the first, which gets g's.
        let mut raw = plan(g, &names[..1], planner()).into_plan();
        raw.endpoints.extend(names[1..].iter().map(|n| (n.clone(), endpoint_for(Generation(1)))));
        let p = dnsplan_common::ValidatedPlan::new(raw)?;
        let started = Instant::now();
        remote.publish(&p).await?;
        remote.apply(&names[0], Generation(g), &endpoint_for(Generation(g))).await?;
        write_times.push(started.elapsed());
    }
    dns_times.sort();
    write_times.sort();
    Ok((dns_times, write_times))
}

/// The authority process; killed when dropped, so an error never leaves it running.
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `binary` on `config` and reads where it listens from the lines it announces on
/// standard output ("dns      ADDR (udp, tcp)", "control  http://ADDR").
fn start_authority(binary: &str, config: &std::path::Path) -> anyhow::Result<(Process, SocketAddr, String)> {
    let mut child = Command::new(binary)
        .arg("--config")
        .arg(config)
        .env_remove("DNSPLAN_TOKEN")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {binary}"))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let process = Process(child);
    let (mut dns, mut control) = (None, None);
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("dns") {
            dns = Some(rest.split_whitespace().next().context("no DNS address")?.parse()?);
        } else if let Some(rest) = line.strip_prefix("control") {
            control = Some(rest.trim().to_owned());
            break;
        }
    }
    match (dns, control) {
        (Some(dns), Some(control)) => Ok((process, dns, control)),
        _ => anyhow::bail!("{binary} ended before it announced its addresses"),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let binary = args.next().context("usage: status-bench AUTHORITY_BINARY [ENDPOINTS]")?;
    let n: usize = match args.next() {
        Some(arg) => arg.parse().context("ENDPOINTS must be a number")?,
        None => 100_000,
    };
    anyhow::ensure!(n >= 2, "ENDPOINTS must be at least 2");
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let names: Vec<EndpointName> = (0..n).map(|i| name(&format!("n{i:07}"))).collect();
    let started = Instant::now();
    {
        let store = SledStore::open(&data)?;
        store.publish(&plan(1, &names, planner())).await?;
        let items: Vec<ApplyItem> = names.iter().map(|e| ApplyItem { endpoint: e.clone(), records: endpoint_for(Generation(1)) }).collect();
        for chunk in items.chunks(APPLY_BATCH_MAX) {
            store.apply_many(Generation(1), chunk).await?;
        }
    }
    eprintln!("seeded {n} endpoints in {:.1} s", started.elapsed().as_secs_f64());
    let config = dir.path().join("authority.toml");
    std::fs::write(&config, authority_config_text(&data))?;
    let (_authority, dns, control) = start_authority(&binary, &config)?;
    // The authority serves what it loaded at once; wait until it answers the last name.
    let last = names.last().context("no endpoint")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !dns_probe::query(dns, last.as_str(), RecordType::A, Duration::from_secs(2)).await?.has_addresses() {
        anyhow::ensure!(Instant::now() < deadline, "the authority did not serve {last} in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let names = Arc::new(names);
    let mut next = 2;
    let mut figures = Vec::new();
    for pollers in [0, POLLERS] {
        let stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..pollers {
            let (stop, polls, url) = (stop.clone(), polls.clone(), format!("{control}/v1/status"));
            tasks.push(tokio::spawn(async move {
                let client = reqwest::Client::new();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(resp) = client.get(&url).send().await {
                        let _ = resp.bytes().await;
                        polls.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        // The measuring client on a thread and runtime of its own.
        let (control, names2, first) = (control.clone(), names.clone(), next);
        let measured = std::thread::spawn(move || -> anyhow::Result<(Vec<Duration>, Vec<Duration>, u64)> {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            // Its connections belong to this runtime.
            let remote = runtime.block_on(async { RemoteStore::new(&control, Some(TOKEN.into())) })?;
            let mut next = first;
            let (dns_times, write_times) = runtime.block_on(measure(&remote, dns, &names2, &mut next))?;
            Ok((dns_times, write_times, next))
        })
        .join()
        .map_err(|_| anyhow::anyhow!("the measuring thread panicked"))?;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await?;
        }
        let (dns_times, writes, after) = measured?;
        next = after;
        figures.push(Figures {
            dns_p50: pct(&dns_times, 0.5),
            dns_p99: pct(&dns_times, 0.99),
            write_p50: pct(&writes, 0.5),
            write_p99: pct(&writes, 0.99),
            polls: polls.load(Ordering::Relaxed),
        });
    }
    let (alone, polled) = (&figures[0], &figures[1]);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("{n} endpoints; {POLLERS} clients polling /v1/status made {} requests during the second run", polled.polls);
    println!("{:<28}{:>12}{:>16}{:>8}", "figure", "alone", "8 pollers", "ratio");
    for (label, a, b) in [
        ("DNS p50 (ms)", ms(alone.dns_p50), ms(polled.dns_p50)),
        ("DNS p99 (ms)", ms(alone.dns_p99), ms(polled.dns_p99)),
        ("write p50 (ms)", ms(alone.write_p50), ms(polled.write_p50)),
        ("write p99 (ms)", ms(alone.write_p99), ms(polled.write_p99)),
    ] {
        println!("{label:<28}{a:>12.3}{b:>16.3}{:>8.2}", b / a);
    }
    Ok(())
}
