//! Store benchmark: fenced applies per second (each flushed before it is acknowledged), publishes
//! per second, and cleanup of many stored plans, on `SledStore` in a temporary directory.
//! Each figure is printed beside a raw sled baseline measured in the same run (insert + flush),
//! because this machine is noisy and only ratios travel. Run it through `bench/store.sh`.
//!
//! Usage: store-bench [PLANS_FOR_CLEANUP] (default 100000)

use anyhow::Context;
use dnsplan_common::{Generation, SledStore, Store};
use dnsplan_tests::fixtures::{dir_bytes, endpoint_for, name, plan, planner};
use std::time::{Duration, Instant};

const APPLIES: u64 = 2_000;
const CONCURRENT_WRITERS: u64 = 4;
const PUBLISHES: u64 = 1_000;

fn rate(count: u64, elapsed: Duration) -> f64 {
    count as f64 / elapsed.as_secs_f64()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() -> anyhow::Result<()> {
    let plans_for_cleanup: u64 =
        std::env::args().nth(1).map(|a| a.parse()).transpose().context("PLANS_FOR_CLEANUP must be a number")?.unwrap_or(100_000);
    let tmp = tempfile::tempdir()?;

    // Baseline: raw sled, one small insert and one flush per operation.
    let raw = sled::open(tmp.path().join("raw"))?;
    let started = Instant::now();
    for i in 0..APPLIES {
        raw.insert(i.to_be_bytes(), &[0u8; 64][..])?;
        raw.flush()?;
    }
    let raw_rate = rate(APPLIES, started.elapsed());
    drop(raw);

    let store = SledStore::open(tmp.path().join("store"))?;
    let endpoints: Vec<_> = (0..8).map(|i| name(&format!("e{i}"))).collect();
    for g in 1..=APPLIES {
        store.publish(&plan(g, &endpoints, planner())).await?;
    }
    let started = Instant::now();
    for g in 1..=APPLIES {
        store.apply(&endpoints[0], Generation(g), &endpoint_for(Generation(g))).await?;
    }
    let apply_rate = rate(APPLIES, started.elapsed());

    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..CONCURRENT_WRITERS {
        let (store, n) = (store.clone(), endpoints[1 + w as usize].clone());
        tasks.push(tokio::spawn(async move {
            for g in 1..=APPLIES / CONCURRENT_WRITERS {
                store.apply(&n, Generation(g), &endpoint_for(Generation(g))).await?;
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let concurrent_rate = rate(APPLIES, started.elapsed());

    let started = Instant::now();
    for g in APPLIES + 1..=APPLIES + PUBLISHES {
        store.publish(&plan(g, &endpoints, planner())).await?;
    }
    let publish_rate = rate(PUBLISHES, started.elapsed());
    drop(store);

    // Cleanup with many stored plans: fill a fresh store, keep one endpoint at the latest plan.
    let big = SledStore::open(tmp.path().join("big"))?;
    let started = Instant::now();
    for g in 1..=plans_for_cleanup {
        big.publish(&plan(g, &endpoints[..1], planner())).await?;
    }
    let fill_rate = rate(plans_for_cleanup, started.elapsed());
    let latest = Generation(plans_for_cleanup);
    big.apply(&endpoints[0], latest, &endpoint_for(latest)).await?;
    let size_before = dir_bytes(&tmp.path().join("big"));
    let started = Instant::now();
    let report = big.cleanup(20).await?;
    let cleanup_time = started.elapsed();
    let size_after = dir_bytes(&tmp.path().join("big"));

    println!("store benchmark (SledStore, every write flushed before it is acknowledged)");
    println!("{:<44} {:>12} {:>10}", "figure", "value", "vs raw");
    println!("{:<44} {:>10.0}/s {:>10}", "raw sled insert+flush (baseline)", raw_rate, "1.00");
    println!("{:<44} {:>10.0}/s {:>10.2}", "fenced apply, 1 writer", apply_rate, apply_rate / raw_rate);
    println!(
        "{:<44} {:>10.0}/s {:>10.2}",
        format!("fenced apply, {CONCURRENT_WRITERS} writers"),
        concurrent_rate,
        concurrent_rate / raw_rate
    );
    println!("{:<44} {:>10.0}/s {:>10.2}", "publish (8-endpoint plans)", publish_rate, publish_rate / raw_rate);
    println!("{:<44} {:>10.0}/s {:>10.2}", "publish (1-endpoint plans, filling)", fill_rate, fill_rate / raw_rate);
    println!(
        "{:<44} {:>10.1}ms {:>10}",
        format!("cleanup of {} of {plans_for_cleanup} plans", report.deleted_count()),
        cleanup_time.as_secs_f64() * 1e3,
        ""
    );
    println!("{:<44} {:>10.1}MB {:>10}", "store size before cleanup", size_before as f64 / 1e6, "");
    println!("{:<44} {:>10.1}MB {:>10}", "store size right after cleanup", size_after as f64 / 1e6, "");
    Ok(())
}
