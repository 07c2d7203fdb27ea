//! Signed plans on etcd, from outside: keys made by `dnsplan key new`, their printed
//! `[[keyring.key]]` tables put in the shipped `dnsplan-authority`'s and `dnsplan-enactor`'s
//! config files, and a writer with direct access to etcd (our own store code without a
//! keyring, so its writes pass every CAS) trying to make DNS serve what no trusted author
//! signed: a plan of its own, then an active record of its own. After each step the
//! authority's whole zone (AXFR) is compared with what the trusted plan says.

mod support;

use dnsplan_common::signing::SigningKey;
use dnsplan_common::store::ApplyItem;
use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{ActiveState, Author, Generation, Store, StoreError, ValidatedPlan};
use dnsplan_etcd::EtcdStore;
use dnsplan_tests::daemon::{Daemon, LogLine};
use dnsplan_tests::etcd::EtcdCluster;
use dnsplan_tests::fixtures::{endpoint_for, name, plan};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::etcd_authority::{ETCD_AUTHORITY_TOKEN, etcd_authority};
use support::{WITHIN, bin_dir};

const PREFIX: &str = "/signed/";

/// `dnsplan key new NAME --file DIR/NAME.key --author AUTHOR`: the key and the table printed.
fn new_key(dir: &Path, name: &str, author: &str) -> anyhow::Result<(SigningKey, String)> {
    let file = dir.join(format!("{name}.key"));
    let out = Command::new(env!("CARGO_BIN_EXE_dnsplan"))
        .args(["key", "new", name, "--author", author, "--dns-zone", "example.test."])
        .arg("--file")
        .arg(&file)
        .output()?;
    anyhow::ensure!(out.status.success(), "key new: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout)?;
    let table = text[text.find("[[keyring.key]]").ok_or_else(|| anyhow::anyhow!("no table in {text}"))?..].to_owned();
    Ok((SigningKey::load(&file)?, table))
}

fn enactor_config(cluster: &EtcdCluster, keyring: &str) -> String {
    let endpoints: Vec<String> = cluster.all_endpoints().iter().map(|e| format!("\"{e}\"")).collect();
    format!(
        r#"id = "enactor-a"
zone = "a"
[store]
kind = "etcd"
endpoints = [{}]
prefix = "{PREFIX}"
[apply]
reconcile_interval_secs = 1
heartbeat_interval_secs = 1
max_removal_fraction = 1.0
[metrics]
listen = "127.0.0.1:0"
{keyring}
"#,
        endpoints.join(", ")
    )
}

/// The A records of the authority's zone, by its AXFR: every name it serves.
fn zone_addresses(dns: std::net::SocketAddr) -> anyhow::Result<BTreeSet<String>> {
    Ok(support::dns::axfr(dns, "example.test.")?.into_iter().filter(|rr| rr.split(' ').nth(3) == Some("a")).collect())
}

/// What the AXFR holds when `g`'s records are served for `names`.
fn zone_of(g: u64, names: &[&str]) -> BTreeSet<String> {
    let endpoint = endpoint_for(Generation(g));
    names.iter().flat_map(|n| endpoint.targets.iter().map(move |t| format!("{n}.example.test. 30 in a {}", t.address))).collect()
}

/// Waits until the authority's zone holds exactly `want`'s A records.
async fn until_zone(dns: std::net::SocketAddr, want: &BTreeSet<String>) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let got = zone_addresses(dns)?;
        if &got == want {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the zone never held {want:?}; it holds {got:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the enactor's heartbeat says `state`.
async fn until_heartbeat(store: &EtcdStore, state: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + WITHIN;
    loop {
        let heartbeats = store.heartbeats().await?;
        if heartbeats.iter().any(|h| h.state == state) {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the enactor never said {state:?}: {heartbeats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The authority's `dnsplan_untrusted_records_total`.
async fn untrusted_records(control: &str) -> anyhow::Result<u64> {
    let text = reqwest::get(format!("{control}/metrics")).await?.text().await?;
    Ok(text.lines().find_map(|l| l.strip_prefix("dnsplan_untrusted_records_total ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0))
}

/// Teeth, each shown once by removing its protection: without the store's check the unsigned
/// publish through it succeeds; without the enactor's, it applies mallory's plan (its
/// heartbeat never says "refusing 2"); without the follower's, the record written straight
/// into etcd is served (the AXFR holds mallory's address).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_or_record_written_straight_into_etcd_is_never_applied_or_served() -> anyhow::Result<()> {
    dnsplan_tests::etcd::check_etcd_installed()?;
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let (planner_key, planner_table) = new_key(d, "planner-1", "planner:planner-test")?;
    let (_alice, alice_table) = new_key(d, "alice", "operator:alice")?;
    let (mallory, _) = new_key(d, "mallory", "planner:planner-test")?;
    let keyring = format!("{planner_table}\n{alice_table}");

    let cluster = EtcdCluster::start(1, &[]).await?;
    // The writer with access to etcd: our own store code, without a keyring.
    let raw = cluster.store(PREFIX).await?;
    // A planner's store with the keyring refuses an unsigned plan before writing it.
    let mut checked = cluster.config(PREFIX);
    checked.keyring = dnsplan_common::signing::Keyring::from_config(&toml::from_str::<KeyringFile>(&keyring)?.keyring)
        .map_err(anyhow::Error::msg)?
        .map(Arc::new);
    let checked = EtcdStore::connect(checked).await?;
    let names = ["api", "db"];
    let endpoints: Vec<_> = names.iter().map(|n| name(n)).collect();
    let planner = Author::Planner { id: "planner-test".into() };
    match checked.publish(&plan(1, &endpoints, planner.clone())).await {
        Err(StoreError::Untrusted(why)) => assert!(why.contains("not signed"), "{why}"),
        other => panic!("an unsigned plan was not refused: {other:?}"),
    }
    checked.publish(&planner_key.sign(plan(1, &endpoints, planner.clone()))).await?;

    std::fs::create_dir_all(d.join("authority"))?;
    let authority = etcd_authority(&d.join("authority"), &cluster, PREFIX, &keyring)?;
    let enactor_toml = d.join("enactor.toml");
    std::fs::write(&enactor_toml, enactor_config(&cluster, &keyring))?;
    let (lines, _rx) = tokio::sync::mpsc::unbounded_channel::<LogLine>();
    let _enactor = Daemon::spawn(&bin_dir().join("dnsplan-enactor"), &["--config", &enactor_toml.display().to_string()], "enactor", lines)?;
    until_heartbeat(&raw, "idle").await?;
    until_zone(authority.dns, &zone_of(1, &names)).await?;

    // Through the control API, an unsigned operator plan is refused too (422, said why).
    let remote = RemoteStore::new(&authority.control, Some(ETCD_AUTHORITY_TOKEN.to_owned()))?;
    match remote.publish(&plan(2, &endpoints, Author::Operator { name: "alice".into() })).await {
        Err(StoreError::Untrusted(why)) => assert!(why.contains("not signed"), "{why}"),
        other => panic!("the control API took an unsigned plan: {other:?}"),
    }

    // Mallory's plan, straight into etcd: a valid CAS, a signature by a key not trusted.
    raw.publish(&mallory.sign(plan(2, &endpoints, planner.clone()))).await?;
    until_heartbeat(&raw, "refusing 2").await?;
    for endpoint in &endpoints {
        let active = raw.active(endpoint).await?.map(|r| r.generation);
        assert_eq!(active, Some(Generation(1)), "{endpoint} moved to mallory's plan");
    }
    assert_eq!(zone_addresses(authority.dns)?, zone_of(1, &names));

    // Mallory's record, straight into etcd (the store's own content check passes: it is what
    // mallory's plan says).
    let forged = ApplyItem { endpoint: name("api"), records: endpoint_for(Generation(2)) };
    for result in raw.apply_many(Generation(2), &[forged]).await? {
        result?;
    }
    // Until the authority has met it: refused (counted) or served (the zone changed).
    let deadline = Instant::now() + WITHIN;
    while untrusted_records(&authority.control).await? == 0 && zone_addresses(authority.dns)? == zone_of(1, &names) {
        anyhow::ensure!(Instant::now() < deadline, "the authority never met the record written into etcd");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(zone_addresses(authority.dns)?, zone_of(1, &names), "a record no trusted author signed is served");
    assert_eq!(untrusted_records(&authority.control).await?, 1);

    // One byte of a trusted plan changed after signing is refused as well.
    let signed = planner_key.sign(plan(3, &endpoints, planner.clone()));
    let mut tampered = signed.clone().into_plan();
    tampered.reason.replace_range(0..1, "T");
    let tampered = ValidatedPlan::new(tampered)?.with_signature(signed.signature().cloned());
    raw.publish(&tampered).await?;
    until_heartbeat(&raw, "refusing 3").await?;
    assert_eq!(zone_addresses(authority.dns)?, zone_of(1, &names));

    // The next plan its author signed is applied and served, over mallory's record.
    checked.publish(&planner_key.sign(plan(4, &endpoints, planner))).await?;
    until_zone(authority.dns, &zone_of(4, &names)).await?;
    let api = raw.active(&name("api")).await?.map(|r| (r.generation, r.state));
    assert_eq!(api, Some((Generation(4), ActiveState::Serving(endpoint_for(Generation(4))))));
    Ok(())
}

#[derive(serde::Deserialize)]
struct KeyringFile {
    keyring: dnsplan_common::signing::KeyringConfig,
}

/// `dnsplan up` with its demo token signs with its demo key and trusts only it: the embedded
/// planner's plans carry its signature, an unsigned plan is refused, and the CLI, sending the
/// demo token, signs an operator's rollback with it, which is applied and served. A keyring
/// of a daemon's config that lists the demo key is refused. Teeth: without the CLI's demo
/// key, the rollback is refused ("plan refused: ... not signed").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsplan_up_signs_with_its_demo_key_and_trusts_only_it() -> anyhow::Result<()> {
    use dnsplan_common::signing::{Keyring, KeyringConfig};
    let dir = tempfile::tempdir()?;
    let up = support::up(dir.path())?;
    let remote = RemoteStore::new(&up.control, Some(support::TOKEN.to_owned()))?;
    let first = support::until_plan(&remote, |_| true).await?;
    let demo = Keyring::from_config(&KeyringConfig::demo()).map_err(anyhow::Error::msg)?.expect("the demo keyring");
    assert_eq!(demo.verify(&first).map_err(|e| anyhow::anyhow!("{e}"))?, "demo");

    let mut unsigned = first.clone().into_plan();
    unsigned.generation = Generation(first.generation().0 + 1);
    unsigned.parent_generation = first.generation();
    unsigned.author = Author::Operator { name: "mallory".into() };
    match remote.publish(&ValidatedPlan::new(unsigned)?).await {
        Err(StoreError::Untrusted(why)) => assert!(why.contains("not signed"), "{why}"),
        other => panic!("dnsplan up took an unsigned plan: {other:?}"),
    }

    let rollback = support::ok(&support::dnsplan(&up, &["rollback", "--to", &first.generation().to_string(), "--reason", "signed"])?);
    assert!(rollback.contains("enacted: all"), "{rollback}");
    let latest = remote.plan(remote.latest().await?).await?;
    assert_eq!(latest.plan().rollback_of, Some(first.generation()));
    assert_eq!(demo.verify(&latest).map_err(|e| anyhow::anyhow!("{e}"))?, "demo");
    assert!(KeyringConfig::demo().check().is_err(), "a daemon's keyring takes the demo key");
    let shown = support::ok(&support::dnsplan(&up, &["plans", "show", &latest.generation().to_string()])?);
    let demo_key = dnsplan_common::signing::public_key_text(&dnsplan_common::signing::SigningKey::demo().public_key());
    assert!(shown.contains(&format!("signed by the key {demo_key}")), "{shown}");
    Ok(())
}

/// `dnsplan up` with a keyring and a planner key of its own: its planner signs with that key,
/// and an operator's rollback is taken only when signed by a key of the keyring
/// (`--signing-key`), not by the demo key the CLI uses by default with the demo token.
/// Teeth: with the demo keyring kept beside the file's, the demo-signed rollback is taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsplan_up_takes_a_keyring_and_planner_key_of_its_own() -> anyhow::Result<()> {
    use dnsplan_common::signing::{Keyring, KeyringConfig};
    let dir = tempfile::tempdir()?;
    let d = dir.path();
    let (planner_key, planner_table) = new_key(d, "planner", "planner:planner")?;
    let (_alice, alice_table) = new_key(d, "alice", "operator:*")?;
    let text = support::BUILT_IN.replace("18080", &support::free_port()?.to_string()).replace("15432", &support::free_port()?.to_string());
    let text = text.replace("[planner.planner]\n", "[planner.signing]\nkey_file = \"planner-1.key\"\n[planner.planner]\n");
    anyhow::ensure!(text.contains("planner-1.key"), "the built-in config has no [planner.planner] table to put the key before");
    std::fs::rename(d.join("planner.key"), d.join("planner-1.key"))?;
    std::fs::write(d.join("dnsplan.toml"), format!("{text}\n{planner_table}\n{alice_table}"))?;
    let up = support::spawn_up(&mut support::up_command(d)?)?;
    let remote = RemoteStore::new(&up.control, Some(support::TOKEN.to_owned()))?;
    let first = support::until_plan(&remote, |_| true).await?;
    let tables: KeyringFile = toml::from_str(&format!("{planner_table}\n{alice_table}"))?;
    let keyring = Keyring::from_config(&tables.keyring).map_err(anyhow::Error::msg)?.expect("two keys");
    assert_eq!(keyring.verify(&first).map_err(|e| anyhow::anyhow!("{e}"))?, "planner");
    assert_eq!(first.signature().map(|s| s.public_key), Some(planner_key.public_key()));

    let to = first.generation().to_string();
    let refused = support::dnsplan(&up, &["rollback", "--to", &to, "--reason", "demo key"])?;
    assert_eq!(refused.status.code(), Some(5), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("does not hold"), "{}", String::from_utf8_lossy(&refused.stderr));
    let alice = d.join("alice.key").display().to_string();
    let rollback = support::ok(&support::dnsplan(&up, &["--signing-key", &alice, "rollback", "--to", &to, "--reason", "alice"])?);
    assert!(rollback.contains("enacted: all"), "{rollback}");
    assert!(KeyringConfig::demo().key[0].public_key != tables.keyring.key[0].public_key);
    Ok(())
}
