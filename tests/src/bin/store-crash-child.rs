//! Test helper for the SIGKILL crash test: publishes plans and applies them to a few
//! endpoints in a loop on the `SledStore` in the given directory, printing `ack <endpoint>
//! <generation>` after every acknowledged apply and `published <generation>` after every
//! acknowledged publish. The parent kills it with SIGKILL at an arbitrary moment.
//!
//! Usage: store-crash-child DIR ENDPOINTS

use anyhow::Context;
use dnsplan_common::{Generation, SledStore, Store, StoreError};
use dnsplan_tests::fixtures::{endpoint_for, name, plan, planner};
use std::io::Write;

/// Stops by itself even if nobody kills it.
const ROUNDS_MAX: u64 = 100_000;
/// Cleanup runs every this many plans, keeping this many.
const CLEANUP_EVERY: u64 = 7;
const RETAIN: u64 = 5;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().context("usage: store-crash-child DIR ENDPOINTS")?;
    let endpoints: usize = args.next().context("usage: store-crash-child DIR ENDPOINTS")?.parse().context("ENDPOINTS must be a number")?;
    let names: Vec<_> = (0..endpoints).map(|i| name(&format!("e{i}"))).collect();
    let store = SledStore::open(&dir)?;
    let mut out = std::io::stdout().lock();
    for _ in 0..ROUNDS_MAX {
        let next = Generation(store.latest().await?.0 + 1);
        store.publish(&plan(next.0, &names, planner())).await?;
        writeln!(out, "published {next}")?;
        out.flush()?;
        for n in &names {
            match store.apply(n, next, &endpoint_for(next)).await {
                Ok(_) => {
                    writeln!(out, "ack {n} {next}")?;
                    out.flush()?;
                }
                Err(StoreError::Stale { .. }) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if next.0.is_multiple_of(CLEANUP_EVERY) {
            store.cleanup(RETAIN).await?;
        }
    }
    Ok(())
}
