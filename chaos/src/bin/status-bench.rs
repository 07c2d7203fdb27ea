//! Status-poller benchmark: does polling `/v1/status` move what matters? An in-process
//! authority over a sled store of N endpoints (default 100,000) is measured twice, alone and
//! with 8 clients polling `/v1/status` as fast as they can: DNS latency (p50, p99 of UDP
//! queries) and authenticated write latency (publish one plan changing one endpoint and apply
//! it through the control API). Figures are printed side by side with their ratio, because
//! only ratios travel between machines. Run it through `bench/status.sh`.
//!
//! Usage: status-bench [ENDPOINTS] (default 100000)

use anyhow::Context;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::{APPLY_BATCH_MAX, ApplyItem};
use dnsplan_common::{EndpointName, Generation, SledStore, Store};
use dnsplan_tests::fixtures::{endpoint_for, name, plan, planner};
use dnsplan_tests::stack::{Authority, TOKEN};
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = match std::env::args().nth(1) {
        Some(arg) => arg.parse().context("ENDPOINTS must be a number")?,
        None => 100_000,
    };
    anyhow::ensure!(n >= 2, "ENDPOINTS must be at least 2");
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path().join("store"))?;
    let names: Vec<EndpointName> = (0..n).map(|i| name(&format!("n{i:07}"))).collect();
    let started = Instant::now();
    store.publish(&plan(1, &names, planner())).await?;
    let items: Vec<ApplyItem> = names.iter().map(|e| ApplyItem { endpoint: e.clone(), records: endpoint_for(Generation(1)) }).collect();
    for chunk in items.chunks(APPLY_BATCH_MAX) {
        store.apply_many(Generation(1), chunk).await?;
    }
    eprintln!("seeded {n} endpoints in {:.1} s", started.elapsed().as_secs_f64());
    let authority = Authority::start(store.clone(), dir.path()).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    // The authority follows the store: wait until it serves every endpoint.
    let last = names.last().context("no endpoint")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    while !dns_probe::query(authority.dns, last.as_str(), RecordType::A, Duration::from_secs(2)).await?.has_addresses() {
        anyhow::ensure!(Instant::now() < deadline, "the authority did not serve {last} in time");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut next = 2;
    let mut figures = Vec::new();
    for pollers in [0, POLLERS] {
        let stop = Arc::new(AtomicBool::new(false));
        let polls = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..pollers {
            let (stop, polls, url) = (stop.clone(), polls.clone(), format!("{}/v1/status", authority.control));
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
        let (dns, writes) = measure(&remote, authority.dns, &names, &mut next).await?;
        stop.store(true, Ordering::Relaxed);
        for t in tasks {
            t.await?;
        }
        figures.push(Figures {
            dns_p50: pct(&dns, 0.5),
            dns_p99: pct(&dns, 0.99),
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
    authority.stop().await
}
