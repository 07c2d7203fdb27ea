//! Two `dnsplan-planner` processes against one store (an authority's control API): one
//! publishes; it is killed with SIGKILL; the other takes the lease over and goes on; no
//! generation is ever published twice.

mod support;

use dnsplan_common::store::remote::RemoteStore;
use dnsplan_common::{Generation, SledStore, Store};
use dnsplan_tests::daemon::{self, Daemon, LogLine};
use dnsplan_tests::stack::{Authority, TOKEN};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;
use support::{Backends, config_text, weight};
use tokio::sync::mpsc;

const WITHIN: Duration = Duration::from_secs(30);

fn spawn(id: &str, config: &Path, lines: mpsc::UnboundedSender<LogLine>) -> anyhow::Result<Daemon> {
    let config = config.display().to_string();
    Daemon::spawn(Path::new(env!("CARGO_BIN_EXE_dnsplan-planner")), &["--config", &config, "--id", id], id, lines)
}

async fn until(
    lines: &mut mpsc::UnboundedReceiver<LogLine>,
    log: &mut Vec<LogLine>,
    want: impl Fn(&LogLine) -> bool,
) -> anyhow::Result<String> {
    Ok(daemon::until(lines, WITHIN, |l| log.push(l.clone()), want).await?.who)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_planner_takes_over_without_publishing_any_generation_twice() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path().join("store"))?;
    let authority = Authority::start(store, dir.path()).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let mut backends = Backends::start().await?;
    let text = config_text(backends.port, "")
        .replace("url = \"http://127.0.0.1:1\"", &format!("url = \"{}\"\ntoken = \"{TOKEN}\"", authority.control))
        + "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;

    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut log = Vec::new();
    let mut processes = BTreeMap::new();
    processes.insert("p1".to_string(), spawn("p1", &config, tx.clone())?);
    processes.insert("p2".to_string(), spawn("p2", &config, tx.clone())?);
    let first = until(&mut lines, &mut log, |l| l.message == "plan published").await?;
    let survivor = if first == "p1" { "p2" } else { "p1" };
    let lease = remote.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease"))?;
    assert_eq!(lease.holder, first, "the publisher holds the lease");

    // Kill the active planner; the standby takes over within a lease TTL.
    processes.remove(&first);
    until(&mut lines, &mut log, |l| l.who == survivor && l.message == "holding the planner lease: active").await?;
    let taken = remote.lease().await?.ok_or_else(|| anyhow::anyhow!("no lease"))?;
    assert_eq!(taken.holder, survivor);
    assert!(taken.epoch > lease.epoch, "takeover must raise the epoch: {lease:?} -> {taken:?}");

    // And acts: a backend goes away, the survivor publishes the change.
    let before = remote.latest().await?;
    backends.stop("127.0.2.5")?;
    until(&mut lines, &mut log, |l| l.who == survivor && l.message == "plan published").await?;

    let plans = remote.list(Generation::NONE, 1_000).await?;
    for (i, p) in plans.iter().enumerate() {
        assert_eq!(p.generation, Generation(i as u64 + 1), "generations are contiguous");
    }
    let mut published: BTreeMap<u64, Vec<&str>> = BTreeMap::new();
    for l in log.iter().filter(|l| l.message == "plan published") {
        published.entry(l.generation.unwrap_or_default()).or_default().push(&l.who);
    }
    assert!(published.values().all(|who| who.len() == 1), "a generation was published twice: {published:?}");
    let after: Vec<_> = plans.iter().filter(|p| p.generation > before).collect();
    assert!(!after.is_empty() && after.iter().all(|p| p.author.to_string() == format!("planner:{survivor}")), "{after:?}");
    drop(processes);
    authority.stop().await?;
    Ok(())
}

/// A planner for a zone added to the store (`added_zone`) beside a planner for the store's
/// first zone, one store: each holds its own zone's lease at the same time and publishes only
/// its zone's plans; a backend that fails is planned out of both; the added zone removed and
/// added again is planned again by the same process, past the removed zone's generations.
///
/// Teeth: without `added_zone` taken (the planner on the first zone's store), the shop
/// planner's plans are refused as another DNS zone's, and "no plan of shop.test." is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn planners_of_two_zones_of_one_store_each_plan_their_own() -> anyhow::Result<()> {
    use dnsplan_common::store::zones::ManagedZones;
    let dir = tempfile::tempdir()?;
    let store = SledStore::open(dir.path().join("store"))?;
    let authority = Authority::start(store, dir.path()).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let shop_zone = dnsplan_common::DnsName::parse("shop.test.")?;
    let master = "$ORIGIN shop.test.\n@ 300 IN SOA ns1 hostmaster 1 3600 600 86400 30\n@ 300 IN NS ns1\nns1 300 IN A 192.0.2.7\n";
    assert!(remote.add_zone(&shop_zone, master).await?);
    let mut backends = Backends::start().await?;
    let store_line = format!("url = \"{}\"\ntoken = \"{TOKEN}\"", authority.control);
    let first =
        config_text(backends.port, "").replace("url = \"http://127.0.0.1:1\"", &store_line) + "[metrics]\nlisten = \"127.0.0.1:0\"\n";
    let shop = first
        .replace("example.test.", "shop.test.")
        .replace("dns_zone = \"shop.test.\"\n", "dns_zone = \"shop.test.\"\nadded_zone = true\n");
    std::fs::write(dir.path().join("first.toml"), first)?;
    std::fs::write(dir.path().join("shop.toml"), shop)?;

    let (tx, mut lines) = mpsc::unbounded_channel();
    let mut log = Vec::new();
    let _first = spawn("p-first", &dir.path().join("first.toml"), tx.clone())?;
    let _shop = spawn("p-shop", &dir.path().join("shop.toml"), tx.clone())?;
    let zone = remote.zone(&shop_zone).await?;
    // Both publish, in either order (waiting for one, then the other, lost the second's line
    // when it came first: seen once under load).
    let mut published = std::collections::BTreeSet::new();
    daemon::until(
        &mut lines,
        WITHIN,
        |l| log.push(l.clone()),
        |l| {
            if l.message == "plan published" {
                published.insert(l.who.clone());
            }
            published.len() == 2
        },
    )
    .await?;
    let (first_lease, shop_lease) = (remote.lease().await?, zone.lease().await?);
    assert_eq!(first_lease.map(|l| l.holder).as_deref(), Some("p-first"), "the first zone's lease");
    assert_eq!(shop_lease.map(|l| l.holder).as_deref(), Some("p-shop"), "shop.test.'s lease, held at the same time");
    for (store, zone_name, author) in [(&remote, "example.test.", "planner:p-first"), (&zone, "shop.test.", "planner:p-shop")] {
        let latest = store.latest().await?;
        anyhow::ensure!(latest > Generation::NONE, "no plan of {zone_name} is published");
        let plan = store.plan(latest).await?;
        assert_eq!(plan.plan().dns_zone.as_str(), zone_name);
        assert!(plan.plan().endpoints.keys().all(|n| n.as_str().ends_with(zone_name)), "{:?}", plan.plan().endpoints.keys());
        let plans = store.list(Generation::NONE, 1_000).await?;
        assert!(plans.iter().all(|p| p.author.to_string() == author), "{zone_name}: {plans:?}");
    }

    // A backend fails: each planner plans it out of its own zone.
    backends.stop("127.0.2.5")?;
    for (store, zone_name) in [(&remote, "example.test."), (&zone, "shop.test.")] {
        let deadline = std::time::Instant::now() + WITHIN;
        loop {
            let version = store.version().await?;
            let plan = store.plan(version.latest).await?;
            if weight(&plan, &format!("db.{zone_name}"), "127.0.2.5") == Some(0) {
                break;
            }
            anyhow::ensure!(std::time::Instant::now() < deadline, "127.0.2.5 still weighted in {zone_name}'s plan {}", version.latest);
            store.wait_for_change(version, Duration::from_secs(1)).await?;
        }
    }
    // Removed and added again: the same planner process plans the new incarnation, its first
    // plan numbered past the removed zone's last.
    let removed_latest = remote.zone(&shop_zone).await?.latest().await?;
    assert!(remote.remove_zone(&shop_zone).await?);
    assert!(remote.add_zone(&shop_zone, master).await?);
    let again = remote.zone(&shop_zone).await?;
    let deadline = std::time::Instant::now() + WITHIN;
    loop {
        let version = again.version().await?;
        if version.latest > Generation::NONE {
            let plans = again.list(Generation::NONE, 1_000).await?;
            assert!(plans.iter().all(|p| p.author.to_string() == "planner:p-shop"), "{plans:?}");
            assert!(
                plans.iter().all(|p| p.generation > removed_latest),
                "plans of the zone added again at or before {removed_latest}: {plans:?}"
            );
            break;
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "the planner never planned shop.test. added again");
        again.wait_for_change(version, Duration::from_secs(1)).await?;
    }
    drop(log);
    authority.stop().await?;
    Ok(())
}

/// A planner with `signing.key_file` signs every plan it publishes, and a store whose keyring
/// trusts that key for `planner:*` takes them; its key file readable by others stops the start
/// with what to do. Teeth: without the signature, the store refuses every plan (no "plan
/// published"); without the mode check, the planner starts with the exposed key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_planner_signs_its_plans_with_its_key_file_and_refuses_one_others_can_read() -> anyhow::Result<()> {
    use dnsplan_common::signing::{Keyring, KeyringConfig, SigningKey, TrustedKeyConfig, public_key_text};
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir()?;
    let (key, pem) = SigningKey::generate().map_err(anyhow::Error::msg)?;
    let key_file = dir.path().join("planner.key");
    std::fs::write(&key_file, pem)?;
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o644))?;
    let keyring = KeyringConfig {
        key: vec![TrustedKeyConfig {
            name: "planner".into(),
            public_key: public_key_text(&key.public_key()),
            zones: vec!["example.test.".into()],
            authors: vec!["planner:*".into()],
        }],
    };
    let keyring = std::sync::Arc::new(Keyring::from_config(&keyring).map_err(anyhow::Error::msg)?.expect("a key"));
    let store = SledStore::open(dir.path().join("store"))?;
    store.set_keyring(Some(keyring.clone()));
    let authority = Authority::start(store, dir.path()).await?;
    let remote = RemoteStore::new(&authority.control, Some(TOKEN.into()))?;
    let backends = Backends::start().await?;
    let text = config_text(backends.port, "")
        .replace("url = \"http://127.0.0.1:1\"", &format!("url = \"{}\"\ntoken = \"{TOKEN}\"", authority.control))
        + "[metrics]\nlisten = \"127.0.0.1:0\"\n[signing]\nkey_file = \"planner.key\"\n";
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;

    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_dnsplan-planner"));
    command.args(["--config", &config.display().to_string()]);
    let lines = daemon::log_lines_until(&mut command, "chmod 600", WITHIN)?;
    assert!(lines.iter().any(|l| l.contains("signing.key_file") && l.contains("planner.key")), "{lines:?}");

    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o600))?;
    let (tx, mut lines) = mpsc::unbounded_channel();
    let _planner = spawn("p1", &config, tx)?;
    until(&mut lines, &mut Vec::new(), |l| l.message == "plan published").await?;
    let plan = remote.plan(remote.latest().await?).await?;
    assert_eq!(keyring.verify(&plan).map_err(|e| anyhow::anyhow!("{e}"))?, "planner");
    authority.stop().await?;
    Ok(())
}
