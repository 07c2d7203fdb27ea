//! Seeds the serving benchmark (`bench/dns.sh`): one DNS zone of N managed names, as a plan
//! applied through the authority's store and as a master file for other servers, plus the
//! query files dnsperf replays.
//!
//! Name `i` is `e{i}.ORIGIN` with `2 + i % 3` A records (`10+k.i>>16.i>>8.i`, k = 0..), TTL
//! 300. The plan (generation 1, by an operator) is published into the store at `--data-dir`
//! (the authority's `data_dir`) and every endpoint is applied, `APPLY_BATCH_MAX` at a time
//! (one transaction and one flush each). `--zone-file` gets the whole zone (SOA, NS, the glue
//! of `ns1` and every name); `--static-zone-file`, for the authority's `dns_zone.master_file`,
//! gets the same SOA, NS and glue without the managed names. `--queries-positive` holds names
//! drawn uniformly from the N names; `--queries-nx` the same with every 20th line (5%) a name
//! that does not exist (`nx{j}.ORIGIN`). Everything derives from `--seed`.

use anyhow::{Context, ensure};
use clap::Parser;
use dnsplan_common::store::{APPLY_BATCH_MAX, ApplyItem};
use dnsplan_common::{Author, DnsName, Endpoint, EndpointName, Generation, Plan, SledStore, Store, Target, ValidatedPlan, ZoneId};
use rand::rngs::SmallRng;
use rand::{RngExt, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufWriter, Write};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::Instant;

const TTL_SECS: u32 = 300;
/// Every NX_EVERY-th line of the mixed query file is a name that does not exist (5%).
const NX_EVERY: usize = 20;

#[derive(Parser)]
#[command(about = "Seeds the serving benchmark: a plan in the authority's store, a master file and dnsperf query files")]
struct Args {
    /// The authority's `data_dir` (its store); must not hold a plan yet.
    #[arg(long)]
    data_dir: PathBuf,
    /// Managed names in the zone.
    #[arg(long)]
    names: usize,
    /// The DNS zone's origin, equal to the authority's `dns_zone.origin`.
    #[arg(long, default_value = "bench.test.")]
    origin: String,
    /// The whole zone as an RFC 1035 master file (for Knot and NSD).
    #[arg(long)]
    zone_file: PathBuf,
    /// SOA, NS and glue only (the authority's static records).
    #[arg(long)]
    static_zone_file: Option<PathBuf>,
    #[arg(long)]
    queries_positive: PathBuf,
    #[arg(long)]
    queries_nx: PathBuf,
    /// Lines in each query file.
    #[arg(long, default_value_t = 1_000_000)]
    queries: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

fn endpoint(i: usize) -> Endpoint {
    let [_, a, b, c] = (i as u32).to_be_bytes();
    let zones = ["a", "b", "c", "d"];
    let targets = (0..2 + i % 3)
        .map(|k| Target {
            address: IpAddr::V4(Ipv4Addr::new(10 + k as u8, a, b, c)),
            zone: ZoneId::parse(zones[k]).expect("fixed zone ids are valid"),
            weight: 1,
        })
        .collect();
    Endpoint { ttl_secs: TTL_SECS, targets }
}

/// The apex records every server gets, in master-file form.
fn zone_header(origin: &str) -> String {
    format!(
        "$ORIGIN {origin}\n$TTL {TTL_SECS}\n\
         @ 3600 IN SOA ns1.{origin} hostmaster.{origin} 1 3600 600 604800 30\n\
         @ 3600 IN NS ns1.{origin}\n\
         ns1 3600 IN A 127.0.0.1\n"
    )
}

fn create(path: &Path) -> anyhow::Result<BufWriter<std::fs::File>> {
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    Ok(BufWriter::with_capacity(1 << 20, file))
}

fn write_zone(path: &Path, origin: &str, n: usize) -> anyhow::Result<()> {
    let mut out = create(path)?;
    out.write_all(zone_header(origin).as_bytes())?;
    for i in 0..n {
        for t in &endpoint(i).targets {
            writeln!(out, "e{i} IN A {}", t.address)?;
        }
    }
    out.flush()?;
    Ok(())
}

fn write_queries(path: &Path, origin: &str, n: usize, lines: usize, nx: bool, seed: u64) -> anyhow::Result<()> {
    let bare = origin.trim_end_matches('.');
    let mut rng = SmallRng::seed_from_u64(seed);
    let mut out = create(path)?;
    for line in 0..lines {
        if nx && line % NX_EVERY == NX_EVERY - 1 {
            writeln!(out, "nx{}.{bare} A", rng.random_range(0..n.max(1) as u64 * 10))?;
        } else {
            writeln!(out, "e{}.{bare} A", rng.random_range(0..n))?;
        }
    }
    out.flush()?;
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.names >= 1, "--names must be at least 1");
    ensure!(args.names < 1 << 24, "--names must be below 2^24 (the addresses encode the index)");
    let dns_zone = DnsName::parse(&args.origin).context("--origin")?;
    let origin = dns_zone.as_str().to_string();

    let started = Instant::now();
    write_zone(&args.zone_file, &origin, args.names)?;
    if let Some(path) = &args.static_zone_file {
        std::fs::write(path, zone_header(&origin)).with_context(|| format!("writing {}", path.display()))?;
    }
    write_queries(&args.queries_positive, &origin, args.names, args.queries, false, args.seed)?;
    write_queries(&args.queries_nx, &origin, args.names, args.queries, true, args.seed.wrapping_add(1))?;
    eprintln!("seed: zone and query files written in {:.1}s", started.elapsed().as_secs_f64());

    let started = Instant::now();
    let endpoints: BTreeMap<EndpointName, Endpoint> =
        (0..args.names).map(|i| Ok((DnsName::parse(&format!("e{i}.{origin}"))?, endpoint(i)))).collect::<anyhow::Result<_>>()?;
    let plan = ValidatedPlan::new(Plan {
        generation: Generation(1),
        parent_generation: Generation::NONE,
        created_at_unix_ms: 1_700_000_000_000,
        author: Author::Operator { name: "dns-bench-seed".into() },
        reason: format!("serving benchmark: {} names", args.names),
        dns_zone,
        endpoints,
        retired: BTreeSet::new(),
        rollback_of: None,
        provenance: vec![],
    })?;
    let store = SledStore::open(&args.data_dir).with_context(|| format!("opening the store in {}", args.data_dir.display()))?;
    store.publish(&plan).await.context("publishing plan 1")?;
    eprintln!("seed: plan 1 ({} endpoints) published in {:.1}s", args.names, started.elapsed().as_secs_f64());

    let started = Instant::now();
    let items: Vec<ApplyItem> = plan.into_plan().endpoints.into_iter().map(|(endpoint, records)| ApplyItem { endpoint, records }).collect();
    for chunk in items.chunks(APPLY_BATCH_MAX) {
        let outcomes = store.apply_many(Generation(1), chunk).await.context("applying plan 1")?;
        for (item, outcome) in chunk.iter().zip(outcomes) {
            outcome.with_context(|| format!("applying {}", item.endpoint))?;
        }
    }
    let version = store.version().await?;
    ensure!(version.applied_changes >= args.names as u64, "only {} of {} endpoints were applied", version.applied_changes, args.names);
    eprintln!("seed: {} endpoints applied in {:.1}s", args.names, started.elapsed().as_secs_f64());
    Ok(())
}
