//! RFC 2136 benchmark: a change of N names (default 1,000) enacted by three enactors (zones a,
//! b, c, in this process, on an embedded store) onto a real Knot, BIND 9 and PowerDNS (SQLite
//! backend), one after the other: the time from the publish until every name's write is
//! acknowledged and recorded, and the UPDATEs sent by outcome. The plan before it is enacted
//! first, so that the measured plan changes every name of a primary that has them all. Run it
//! through `bench/rfc2136.sh`.
//!
//! Usage: rfc2136-bench [NAMES]

use anyhow::Context;
use dnsplan_common::tsig::{TsigKey, TsigKeyConfig};
use dnsplan_common::{DnsName, EndpointName, Generation, SledStore, Store, ZoneId};
use dnsplan_enactor::config::{Settings, Target};
use dnsplan_enactor::rfc2136::{Fence, IN_FLIGHT_DEFAULT, Rfc2136Settings};
use dnsplan_enactor::{Enactor, Metrics};
use dnsplan_tests::bind::{Bind, BindSpec, BindZone};
use dnsplan_tests::fixtures::{self, name, plan, planner};
use dnsplan_tests::knot::{KeyAction, Knot, KnotSpec, KnotZone, TsigKey as ServerKey};
use dnsplan_tests::pdns::PowerDns;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

const KEY_NAME: &str = "dnsplan-enactor.";
const SECRET_B64: &str = "ZG5zcGxhbi1lbmFjdG9yLWJlbmNoLXNlY3JldC0wMDE=";
/// Longest wait for one plan to be enacted.
const ENACT_MAX: Duration = Duration::from_secs(300);

fn zone_text() -> String {
    format!(
        "$ORIGIN {z}\n@ 300 IN SOA ns1 hostmaster 1 3600 600 604800 30\n@ 300 IN NS ns1\nns1 300 IN A 192.0.2.53\n",
        z = fixtures::DNS_ZONE
    )
}

fn server_keys() -> Vec<ServerKey> {
    vec![ServerKey {
        name: KEY_NAME.into(),
        algorithm: "hmac-sha256".into(),
        secret_base64: SECRET_B64.into(),
        actions: vec![KeyAction::Update],
    }]
}

/// Waits until the store records every one of `names` at `g` (each recorded once the server
/// acknowledged its write).
async fn until_recorded(store: &SledStore, names: &[EndpointName], g: Generation) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let version = store.version().await?;
        let active = store.active_all().await?;
        if names.iter().all(|n| active.endpoints.get(n).is_some_and(|r| r.generation >= g)) {
            return Ok(());
        }
        anyhow::ensure!(started.elapsed() < ENACT_MAX, "plan {g} was not enacted within {ENACT_MAX:?}");
        store.wait_for_change(version, Duration::from_secs(1)).await?;
    }
}

/// Enacts plan 1 then plan 2 (every name changed) onto `server`; returns plan 2's time and
/// its UPDATEs by outcome.
async fn run(server: SocketAddr, names: &[EndpointName]) -> anyhow::Result<(Duration, Vec<(&'static str, u64)>)> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path())?;
    let config: TsigKeyConfig = serde_json::from_value(serde_json::json!({ "name": KEY_NAME, "secret": SECRET_B64 }))?;
    let key = TsigKey::from_config(&config, dir.path())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut all = Vec::new();
    let mut tasks = Vec::new();
    for id in ["a", "b", "c"] {
        let mut settings = Settings::new(id, ZoneId::parse(id)?);
        settings.max_removal_fraction = 1.0;
        settings.target = Target::Rfc2136(Rfc2136Settings {
            server,
            dns_zone: DnsName::parse(fixtures::DNS_ZONE)?,
            key: key.clone(),
            timeout: Duration::from_secs(5),
            attempts: 2,
            in_flight: IN_FLIGHT_DEFAULT,
            fence: Fence::Prerequisites,
        });
        let metrics = Arc::new(Metrics::register(&mut Registry::default(), id));
        let mut stop = stop_rx.clone();
        tasks.push(tokio::spawn(Enactor::new(store.clone(), settings, metrics.clone()).run(async move {
            let _ = stop.wait_for(|s| *s).await;
        })));
        all.push(metrics);
    }
    store.publish(&plan(1, names, planner())).await?;
    until_recorded(&store, names, Generation(1)).await?;
    let outcomes = ["applied", "peer_wrote", "prerequisite_failed", "contended", "error"];
    let count = |o| all.iter().map(|m| m.target_updates(o)).sum::<u64>();
    let before: Vec<u64> = outcomes.iter().map(|o| count(o)).collect();
    let started = Instant::now();
    store.publish(&plan(2, names, planner())).await?;
    until_recorded(&store, names, Generation(2)).await?;
    let took = started.elapsed();
    let by_outcome = outcomes.iter().zip(before).map(|(o, b)| (*o, count(o) - b)).collect();
    let _ = stop_tx.send(true);
    for task in tasks {
        task.await?;
    }
    Ok((took, by_outcome))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let names: usize = std::env::args().nth(1).map(|a| a.parse().context("NAMES must be a number")).transpose()?.unwrap_or(1_000);
    anyhow::ensure!((1..=20_000).contains(&names), "NAMES must be between 1 and 20000");
    dnsplan_common::open_files::raise_to_hard();
    let names: Vec<EndpointName> = (0..names).map(|i| name(&format!("b{i:05}"))).collect();
    let zone = || vec![KnotZone { origin: fixtures::DNS_ZONE.into(), text: Some(zone_text()), zone_extra: Vec::new() }];
    println!("{} names changed, three enactors, in_flight {IN_FLIGHT_DEFAULT}", names.len());
    println!("{:<10}{:>10}{:>12}  UPDATEs by outcome", "server", "enacted", "names/s");
    let report = |server: &str, (took, by): (Duration, Vec<(&'static str, u64)>)| {
        let outcomes: Vec<String> = by.iter().filter(|(_, n)| *n > 0).map(|(o, n)| format!("{o} {n}")).collect();
        println!(
            "{server:<10}{:>8.0}ms{:>12.0}  {}",
            took.as_secs_f64() * 1000.0,
            names.len() as f64 / took.as_secs_f64(),
            outcomes.join(", ")
        );
    };
    let knot = Knot::start(&KnotSpec { zones: zone(), keys: server_keys(), extra_config: String::new() }).await?;
    report("Knot", run(knot.addr(), &names).await?);
    drop(knot);
    let bind_zones = vec![BindZone { origin: fixtures::DNS_ZONE.into(), text: Some(zone_text()), zone_extra: Vec::new() }];
    let bind = Bind::start(&BindSpec { zones: bind_zones, keys: server_keys(), extra_config: String::new() }).await?;
    report("BIND", run(bind.addr(), &names).await?);
    drop(bind);
    let pdns = PowerDns::start(fixtures::DNS_ZONE, &zone_text(), &server_keys()).await?;
    report("PowerDNS", run(pdns.addr(), &names).await?);
    Ok(())
}
