//! The SOA serial moves only when what is served changes. A plan that changes one endpoint
//! moves every endpoint's fence (each is at the newest plan), and those with the same records
//! must not move the serial: with 10,000 endpoints it moved by 10,000 per plan, and a
//! secondary was notified of changes that were not there. A restart serves the same serial.

mod support;

use dnsplan_common::Store;
use dnsplan_common::dns_probe::{self, RecordType};
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{ActiveSnapshot, Generation};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use support::*;

/// The SOA serial `dns` answers for the zone.
async fn serial(dns: SocketAddr) -> anyhow::Result<u32> {
    let answer = dns_probe::query(dns, "example.test.", RecordType::SOA, Duration::from_secs(2)).await?;
    answer.soa_serial.ok_or_else(|| anyhow::anyhow!("{dns} answered the zone's SOA query without a SOA"))
}

/// Waits until a plan newer than `after` is the latest and every endpoint's fence is at it
/// (the enactors applied it whole), and returns the active state then.
async fn until_applied_past(store: &RemoteStore, after: Generation) -> anyhow::Result<ActiveSnapshot> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let version = store.version().await?;
        if version.latest > after {
            let active = store.active_all().await?;
            if !active.endpoints.is_empty() && active.endpoints.values().all(|r| r.generation == version.latest) {
                return Ok(active);
            }
        }
        anyhow::ensure!(Instant::now() < deadline, "no plan after {after} applied whole within {WITHIN:?}");
        store.wait_for_change(version, Duration::from_secs(5)).await?;
    }
}

/// Waits until `dns` serves serial `want`, or fails saying what it serves.
async fn until_serial(dns: SocketAddr, want: u32) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let now = serial(dns).await;
        if now.as_ref().ok() == Some(&want) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{dns} serves serial {now:?}, want {want}");
        tokio::task::yield_now().await;
    }
}

/// Teeth: with the serial derived from the applied-change count (every fence switch), a
/// failed backend of `api` moves the serial by 2 (`db`'s fence moved too), and the first
/// `until_serial` fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_changed_records_move_the_serial() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    // The built-in config, with its demo backends on free ports as `up` writes it, and the
    // enactors' full re-apply every 2 s instead of 30 s, so the test need not wait for it.
    let config = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let reconcile = "reconcile_interval_secs = 30";
    anyhow::ensure!(config.contains(reconcile), "the built-in config no longer says {reconcile:?}");
    std::fs::write(dir.path().join("dnsplan.toml"), config.replace(reconcile, "reconcile_interval_secs = 2"))?;
    let up = up(dir.path())?;
    let store = RemoteStore::new(&up.control, Some(TOKEN.into()))?;
    let first = until_applied_past(&store, Generation::NONE).await?;
    until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
    let before = serial(up.dns).await?;

    // A backend of `api` fails: the planner's next plan changes `api` alone. The enactors
    // write `api` at once and move `db`'s fence at their next full re-apply, in a transaction
    // of its own that changes no record.
    ok(&dnsplan(&up, &["backend", "fail", "127.0.0.11"])?);
    until_plan(&store, |p| weight(p, "127.0.0.11") == Some(0)).await?;
    let changed = until_applied_past(&store, Generation(1)).await?;
    let applied = changed.applied_changes - first.applied_changes;
    let content = changed.content_changes - first.content_changes;
    assert_eq!(applied, 2, "both fences moved");
    assert_eq!(content, 1, "one transaction changed records, the re-apply of db's changed none");
    let after = before.wrapping_add(content as u32);
    until_serial(up.dns, after).await?;
    // The serial served, as a metric.
    let metrics = reqwest::get(format!("{}/metrics", up.control)).await?.text().await?;
    assert!(metrics.lines().any(|l| l == format!("dnsplan_soa_serial {after}")), "no dnsplan_soa_serial {after} in /metrics");

    // A restart on the same store serves the same serial.
    drop(up);
    let up = support::up(dir.path())?;
    until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
    until_serial(up.dns, after).await?;
    Ok(())
}
