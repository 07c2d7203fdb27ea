//! Changes a share of a running authority's endpoints for the transfer benchmark
//! (`bench/transfer.sh`): through the control API, as a separate enactor would, so that the
//! authority serves the change and its IXFR history holds it.
//!
//! Reads the latest plan, publishes the next one with every `--every`-th endpoint (in name
//! order, so the change is spread over the zone) given new addresses (each IPv4 address's
//! first octet and each IPv6 address's first byte with the top bit flipped: every record of a
//! changed name changes, and nothing else does), and applies the changed endpoints,
//! `APPLY_BATCH_MAX` at a time; the others keep the plan they were applied at. `--zone-body`
//! gets every endpoint of the new plan as absolute master-file lines, for a server given the
//! same zone by file. Prints the number of changed endpoints on stdout.

use anyhow::{Context, ensure};
use clap::Parser;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::store::{APPLY_BATCH_MAX, ApplyItem};
use dnsplan_common::{Author, Endpoint, Generation, Store, ValidatedPlan};
use std::collections::BTreeSet;
use std::io::{BufWriter, Write};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Instant, SystemTime};

#[derive(Parser)]
#[command(about = "Publishes and applies a plan changing every N-th endpoint of a running authority")]
struct Args {
    /// The authority's control API, such as `http://127.0.0.1:8053`.
    #[arg(long)]
    control: String,
    /// The control API's token.
    #[arg(long)]
    token: String,
    /// Change every N-th endpoint (100: 1% of them).
    #[arg(long, default_value_t = 100)]
    every: usize,
    /// Every endpoint of the new plan as master-file lines (absolute names, no header).
    #[arg(long)]
    zone_body: Option<PathBuf>,
}

fn flipped(address: IpAddr) -> IpAddr {
    match address {
        IpAddr::V4(a) => {
            let mut o = a.octets();
            o[0] ^= 0x80;
            IpAddr::from(o)
        }
        IpAddr::V6(a) => {
            let mut o = a.octets();
            o[0] ^= 0x80;
            IpAddr::from(o)
        }
    }
}

fn changed(endpoint: &Endpoint) -> Endpoint {
    let mut endpoint = endpoint.clone();
    for target in &mut endpoint.targets {
        target.address = flipped(target.address);
    }
    endpoint
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.every >= 1, "--every must be at least 1");
    let store = RemoteStore::new(&args.control, Some(args.token.clone())).context("--control")?;

    let started = Instant::now();
    let latest = store.latest().await.context("reading the latest generation")?;
    ensure!(latest > Generation::NONE, "the store holds no plan yet");
    let mut plan = store.plan(latest).await.with_context(|| format!("reading plan {latest}"))?.into_plan();
    let mut items = Vec::new();
    for (i, (name, endpoint)) in plan.endpoints.iter_mut().enumerate() {
        if i % args.every == 0 {
            *endpoint = changed(endpoint);
            items.push(ApplyItem { endpoint: name.clone(), records: endpoint.clone() });
        }
    }
    let next = Generation(latest.0 + 1);
    plan.generation = next;
    plan.parent_generation = latest;
    plan.created_at_unix_ms = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    plan.author = Author::Operator { name: "dns-bench-change".into() };
    plan.reason = format!("transfer benchmark: {} of {} endpoints change", items.len(), plan.endpoints.len());
    plan.retired = BTreeSet::new();
    plan.rollback_of = None;
    plan.provenance = vec![];
    let plan = ValidatedPlan::new(plan)?;
    eprintln!("change: plan {latest} read in {:.1}s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    store.publish(&plan).await.with_context(|| format!("publishing plan {next}"))?;
    eprintln!("change: plan {next} published in {:.1}s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    for chunk in items.chunks(APPLY_BATCH_MAX) {
        let outcomes = store.apply_many(next, chunk).await.with_context(|| format!("applying plan {next}"))?;
        for (item, outcome) in chunk.iter().zip(outcomes) {
            outcome.with_context(|| format!("applying {}", item.endpoint))?;
        }
    }
    eprintln!("change: {} endpoints applied in {:.1}s", items.len(), started.elapsed().as_secs_f64());

    if let Some(path) = &args.zone_body {
        let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        for (name, endpoint) in &plan.plan().endpoints {
            for target in &endpoint.targets {
                let kind = if target.address.is_ipv4() { "A" } else { "AAAA" };
                writeln!(out, "{name} {} IN {kind} {}", endpoint.ttl_secs, target.address)?;
            }
        }
        out.flush()?;
    }
    println!("{}", items.len());
    Ok(())
}
