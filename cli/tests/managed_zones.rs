//! A zone the store manages beside its first one, as shipped: `dnsplan up` (transfers open on
//! loopback, a real NSD secondary of the added zone told by NOTIFY), `dnsplan zone add
//! --managed FILE`, a `dnsplan-enactor` daemon with its config file enacting that zone
//! (`dns_zones`) against the stack's control API, and plans published with `dnsplan --zone`.
//! After each step the zone's whole AXFR from dnsplan is exactly the master file's records
//! plus the plan's, and the NSD secondary holds the same; the first zone's plans and pause are
//! not touched by the added zone's, and `--zone` status and verify tell of the added zone. Removed, the zone is no longer answered, the enactor's
//! writes and the CLI's calls to it are refused (before that, a SIGKILL and a restart of the
//! stack serve it as it was, IXFR from before the restart incremental); added again, it starts empty at a serial past
//! every one served (the secondary takes it), and the same enactor enacts it.

mod support;

use dnsplan_tests::nsd::{Nsd, NsdSpec, NsdZone};
use hickory_proto::rr::RecordType;
use std::collections::BTreeSet;
use std::process::{Child, Command, Stdio};
use std::time::Instant;
use support::dns::*;
use support::*;

const SHOP: &str = "$ORIGIN shop.test.
$TTL 300
@ IN SOA ns1.shop.test. hostmaster.shop.test. 100 3600 600 604800 30
@ IN NS ns1
ns1 IN A 192.0.2.7
www IN CNAME api
";

/// A plan file serving `api.shop.test.` at `addresses`.
fn plan_file(addresses: &[&str]) -> String {
    let targets: Vec<String> = addresses.iter().map(|a| format!("{{ address = \"{a}\", zone = \"a\", weight = 1 }}")).collect();
    format!("[endpoints.\"api.shop.test.\"]\nttl_secs = 60\ntargets = [{}]\n", targets.join(", "))
}

/// The zone's whole content as AXFR lines: the master file's records, the plan's addresses
/// for `api`, and the SOA at `serial` (twice, as AXFR ends with it).
fn expected(serial: u32, addresses: &[&str]) -> BTreeSet<String> {
    let soa = format!("shop.test. 300 in soa ns1.shop.test. hostmaster.shop.test. {serial} 3600 600 604800 30");
    let mut all: BTreeSet<String> = [
        soa,
        "shop.test. 300 in ns ns1.shop.test.".to_string(),
        "ns1.shop.test. 300 in a 192.0.2.7".to_string(),
        "www.shop.test. 300 in cname api.shop.test.".to_string(),
    ]
    .into_iter()
    .collect();
    all.extend(addresses.iter().map(|a| format!("api.shop.test. 60 in a {a}")));
    all
}

/// Waits until the stack's `/metrics` has every line of `want`, and returns it.
async fn until_metrics(up: &Up, want: &[&str]) -> anyhow::Result<String> {
    let start = Instant::now();
    loop {
        let text = reqwest::get(format!("{}/metrics", up.control)).await?.text().await?;
        if want.iter().all(|w| text.lines().any(|l| l == *w)) {
            return Ok(text);
        }
        if start.elapsed() > WITHIN {
            let status = dnsplan(up, &["--zone", "shop.test.", "status"])?;
            anyhow::bail!("/metrics never had {want:?}:\n{text}\nthe zone's status:\n{}", String::from_utf8_lossy(&status.stdout));
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Waits until `server`'s AXFR of shop.test. is `want`.
fn until_axfr(server: std::net::SocketAddr, want: &BTreeSet<String>) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let got = axfr(server, "shop.test.").unwrap_or_default();
        if &got == want {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < WITHIN, "{server}'s AXFR of shop.test.:\n{got:#?}\nnot\n{want:#?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A `dnsplan-enactor` enacting shop.test. against `control`, its log in `dir/enactor.log`.
struct Enactor(Child);

impl Drop for Enactor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn enactor(dir: &std::path::Path, control: &str) -> anyhow::Result<Enactor> {
    enactor_with(dir, control, "")
}

/// As [`enactor`], with `extra` (whole tables, such as a `[target]`) in its config file.
fn enactor_with(dir: &std::path::Path, control: &str, extra: &str) -> anyhow::Result<Enactor> {
    let config = format!(
        "id = \"shop-enactor\"\nzone = \"a\"\ndns_zones = [\"shop.test.\"]\n[store]\nkind = \"control\"\nurl = \"{control}\"\n\
         token = \"{TOKEN}\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n[verify]\nenabled = false\n[apply]\nheartbeat_interval_secs = 1\n{extra}"
    );
    let path = dir.join("enactor.toml");
    std::fs::write(&path, config)?;
    let log = std::fs::File::create(dir.join("enactor.log"))?;
    let child = Command::new(bin_dir().join("dnsplan-enactor"))
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "info")
        .env_remove("DNSPLAN_TOKEN")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()?;
    Ok(Enactor(child))
}

fn failed(out: &std::process::Output) -> String {
    assert!(!out.status.success(), "exit {}: {}", out.status, String::from_utf8_lossy(&out.stdout));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Teeth, checked once: without `AddedZones` in the authority, shop.test. is REFUSED ("not
/// served"). (Routing and the removal's fence have theirs in `authority/tests/remote_store.rs`
/// and the stores' zone checks.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_managed_zone_is_added_enacted_served_transferred_and_removed() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let dns_port = free_port()?;
    let secondary = Nsd::start(&NsdSpec {
        zones: vec![NsdZone {
            origin: "shop.test.".into(),
            text: None,
            zone_extra: vec![
                format!("request-xfr: 127.0.0.1@{dns_port} NOKEY"),
                "allow-notify: 127.0.0.1 NOKEY".into(),
                "provide-xfr: 127.0.0.1 NOKEY".into(),
            ],
        }],
        keys: Vec::new(),
        server_extra: Vec::new(),
    })
    .await?;
    let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let text = format!(
        "{text}\n[authority.dns.transfer]\ntsig_required = false\n[[authority.dns.transfer.secondaries]]\naddress = \"127.0.0.1\"\n\
         notify = \"{}\"\n",
        secondary.addr()
    );
    let config = dir.path().join("dnsplan.toml");
    std::fs::write(&config, text)?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
    command.arg("up").arg("--config").arg(&config).arg("--data-dir").arg(dir.path().join("data"));
    // Fixed ports: the secondary and the enactor find the stack again after its restart.
    let control = format!("127.0.0.1:{}", free_port()?);
    command.args(["--dns", &format!("127.0.0.1:{dns_port}"), "--listen-control", &control]).env_remove("DNSPLAN_TOKEN");
    let up = spawn_up(&mut command)?;
    until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;
    let first_plans = ok(&dnsplan(&up, &["--output", "json", "plans", "list"])?);

    // Added to the store: served at once with its master file's records, no endpoint yet.
    let zone_file = dir.path().join("shop.zone");
    std::fs::write(&zone_file, SHOP)?;
    let said = ok(&dnsplan(&up, &["zone", "add", "--managed", zone_file.to_str().unwrap_or_default()])?);
    assert!(said.contains("zone shop.test. added to the store"), "{said}");
    until_axfr(up.dns, &expected(100, &[])).map_err(|e| anyhow::anyhow!("not served: {e}"))?;
    let list = ok(&dnsplan(&up, &["zone", "list"])?);
    assert!(list.lines().any(|l| l.starts_with("shop.test.") && l.contains("managed")), "{list}");

    // Its enactor, and a plan published to it with --zone: enacted, served, transferred.
    let _enactor = enactor(dir.path(), &up.control)?;
    let plan = dir.path().join("plan.toml");
    std::fs::write(&plan, plan_file(&["10.7.0.1", "10.7.0.2"]))?;
    let plan_arg = plan.to_str().unwrap_or_default();
    let dns_arg = up.dns.to_string();
    let published = dnsplan(
        &up,
        &["--zone", "shop.test.", "plans", "publish", plan_arg, "--reason", "shop opens", "--yes", "--dns", &dns_arg, "--wait-secs", "30"],
    )?;
    let published_text = format!("{}{}", String::from_utf8_lossy(&published.stdout), String::from_utf8_lossy(&published.stderr));
    assert!(
        published.status.success(),
        "not enacted: {published_text}\nthe enactor's log:\n{}",
        std::fs::read_to_string(dir.path().join("enactor.log")).unwrap_or_default()
    );
    until_axfr(up.dns, &expected(101, &["10.7.0.1", "10.7.0.2"]))?;
    until_serial(secondary.addr(), "shop.test.", 101).map_err(|e| anyhow::anyhow!("the secondary was not told: {e}"))?;
    anyhow::ensure!(axfr(secondary.addr(), "shop.test.")? == axfr(up.dns, "shop.test.")?, "the secondary's copy differs");
    let www = ask(up.dns, "www.shop.test.", RecordType::A)?;
    assert!(www.metadata.authoritative && www.answers.len() == 3, "the CNAME into the managed endpoint: {www:?}");
    // Its metrics, bounded whatever the number of zones: counted by state with its
    // secondary, its transfers counted with every zone's, no series named after it (it is
    // in no trouble).
    let metrics =
        until_metrics(&up, &["dnsplan_managed_zones{state=\"following\"} 1", "dnsplan_managed_zone_secondaries{state=\"current\"} 1"])
            .await?;
    let sent = metrics.lines().find_map(|l| l.strip_prefix("dnsplan_dns_transfers_total{result=\"sent\"} ")).unwrap_or("0");
    assert!(sent.parse::<u64>()? >= 1, "the secondary's AXFR of the added zone not counted:\n{metrics}");
    assert!(!metrics.contains("zone=\"shop.test.\""), "a series named after a zone in no trouble:\n{metrics}");
    // Its status page, linked from the first zone's, with links to its own plans' pages.
    let first_page = reqwest::get(format!("{}/ui", up.control)).await?.text().await?;
    assert!(
        first_page.contains("1 zones: 1 following · 0 in trouble") && first_page.contains("href=\"/ui/managed/shop.test.\""),
        "/ui:\n{first_page}"
    );
    let zone_page = reqwest::get(format!("{}/ui/managed/shop.test.", up.control)).await?;
    assert!(zone_page.status().is_success(), "{}", zone_page.status());
    let zone_page = zone_page.text().await?;
    for want in ["dnsplan: shop.test.", "SOA serial 101", "api.shop.test.", "10.7.0.2", "href=\"/ui/managed/shop.test./plans/1\""] {
        assert!(zone_page.contains(want), "no {want:?} in /ui/managed/shop.test.:\n{zone_page}");
    }
    let plan_page = reqwest::get(format!("{}/ui/managed/shop.test./plans/1", up.control)).await?.text().await?;
    assert!(plan_page.contains("<h1>Plan 1</h1>") && plan_page.contains("shop opens"), "{plan_page}");

    // The added zone's plan and pause are its own: the first zone's plans are as they were
    // (its planner's only), and it is not paused.
    let plans_of_shop = ok(&dnsplan(&up, &["--zone", "shop.test.", "--output", "json", "plans", "list"])?);
    let shop: serde_json::Value = serde_json::from_str(&plans_of_shop)?;
    assert_eq!(shop.as_array().map(Vec::len), Some(1), "{plans_of_shop}");
    let first: serde_json::Value = serde_json::from_str(&ok(&dnsplan(&up, &["--output", "json", "plans", "list"])?))?;
    let operator_plans = first.as_array().map_or(0, |p| p.iter().filter(|p| p.to_string().contains("\"Operator\"")).count());
    assert_eq!(operator_plans, 0, "an operator plan in the first zone: {first}\n(before: {first_plans})");
    let status = ok(&dnsplan(&up, &["status"])?);
    assert!(!status.contains("PAUSED"), "the first zone paused by the added zone's operator plan:\n{status}");
    // Its own status: paused by its operator's plan, at its serial; verify asks its endpoints.
    let shop_status = ok(&dnsplan(&up, &["--zone", "shop.test.", "status"])?);
    assert!(shop_status.contains("PAUSED") && shop_status.contains("101"), "shop.test.'s status:\n{shop_status}");
    let verified = ok(&dnsplan(&up, &["--zone", "shop.test.", "verify", "--dns", &dns_arg])?);
    assert!(verified.contains("1 of 1 endpoints served as active"), "{verified}");

    // A second plan: one address less.
    std::fs::write(&plan, plan_file(&["10.7.0.2"]))?;
    ok(&dnsplan(
        &up,
        &["--zone", "shop.test.", "plans", "publish", plan_arg, "--reason", "shop opens", "--yes", "--dns", &dns_arg, "--wait-secs", "30"],
    )?);
    until_axfr(up.dns, &expected(102, &["10.7.0.2"]))?;
    until_serial(secondary.addr(), "shop.test.", 102)?;
    anyhow::ensure!(axfr(secondary.addr(), "shop.test.")? == axfr(up.dns, "shop.test.")?, "the secondary's copy differs");

    // Killed (SIGKILL) and started again: the added zone is served as it was, from the store,
    // and its IXFR history is kept (its own directory on disk): IXFR from 101 is incremental.
    drop(up);
    let up = spawn_up(&mut command)?;
    until_axfr(up.dns, &expected(102, &["10.7.0.2"])).map_err(|e| anyhow::anyhow!("after a restart: {e}"))?;
    assert!(ixfr_is_incremental(up.dns, "shop.test.", 101)?, "IXFR of shop.test. from 101 after a restart is the whole zone");

    // Removed: no longer answered, the CLI's calls to it refused.
    let said = ok(&dnsplan(&up, &["zone", "remove", "--managed", "shop.test."])?);
    assert!(said.contains("removed from the store"), "{said}");
    let start = Instant::now();
    while !refused(up.dns, "shop.test.")? {
        anyhow::ensure!(start.elapsed() < WITHIN, "shop.test. still served after its removal");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let gone = failed(&dnsplan(&up, &["--zone", "shop.test.", "plans", "list"])?);
    assert!(gone.contains("not managed by this stack"), "{gone}");
    // The enactor still holds the zone: its next heartbeat is refused, by the zone's fence.
    let log = dir.path().join("enactor.log");
    let start = Instant::now();
    while !std::fs::read_to_string(&log)?.contains("DNS zone shop.test. is not managed by this store") {
        anyhow::ensure!(
            start.elapsed() < WITHIN,
            "the enactor's writes after the removal were not refused:\n{}",
            std::fs::read_to_string(&log)?
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(ok(&dnsplan(&up, &["status"])?).contains("example.test."), "the first zone after the removal");
    until_dns(up.dns, "api.example.test.", |a| !a.is_empty()).await?;

    // Added again: a new incarnation, empty, its serial past every one served before (the
    // secondary takes it); the same enactor process enacts it, nothing carried over.
    ok(&dnsplan(&up, &["zone", "add", "--managed", zone_file.to_str().unwrap_or_default()])?);
    until_axfr(up.dns, &expected(103, &[]))?;
    std::fs::write(&plan, plan_file(&["10.7.0.3"]))?;
    ok(&dnsplan(
        &up,
        &["--zone", "shop.test.", "plans", "publish", plan_arg, "--reason", "reopened", "--yes", "--dns", &dns_arg, "--wait-secs", "30"],
    )?);
    until_axfr(up.dns, &expected(104, &["10.7.0.3"]))?;
    until_serial(secondary.addr(), "shop.test.", 104)
        .map_err(|e| anyhow::anyhow!("the secondary did not take the zone added again: {e}"))?;
    anyhow::ensure!(axfr(secondary.addr(), "shop.test.")? == axfr(up.dns, "shop.test.")?, "the secondary's copy differs");
    drop(secondary);
    Ok(())
}

/// `dnsplan up` alone, as a user's first hour has it: a zone added to its store is enacted by
/// the stack's own enactors (no enactor to configure), so a plan published with `--zone` is
/// served. Teeth: without `enact_added_zones` in `up`, the publish says "not enacted".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsplan_up_enacts_a_zone_added_to_its_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let text = format!(
        "{text}\n[authority.dns.transfer]\ntsig_required = false\n[[authority.dns.transfer.secondaries]]\naddress = \"127.0.0.1\"\n"
    );
    let config = dir.path().join("dnsplan.toml");
    std::fs::write(&config, text)?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
    command.arg("up").arg("--config").arg(&config).arg("--data-dir").arg(dir.path().join("data"));
    command.args(["--dns", "127.0.0.1:0", "--listen-control", "127.0.0.1:0"]).env_remove("DNSPLAN_TOKEN");
    let up = spawn_up(&mut command)?;
    let zone_file = dir.path().join("shop.zone");
    std::fs::write(&zone_file, SHOP)?;
    ok(&dnsplan(&up, &["zone", "add", "--managed", zone_file.to_str().unwrap_or_default()])?);
    let plan = dir.path().join("plan.toml");
    std::fs::write(&plan, plan_file(&["10.7.0.9"]))?;
    let dns_arg = up.dns.to_string();
    let args = ["--zone", "shop.test.", "plans", "publish", plan.to_str().unwrap_or_default(), "--reason", "first hour", "--yes"];
    let published = ok(&dnsplan(&up, &[&args[..], &["--dns", &dns_arg, "--wait-secs", "30"]].concat())?);
    assert!(published.contains("served"), "{published}");
    until_axfr(up.dns, &expected(101, &["10.7.0.9"]))?;
    let status = ok(&dnsplan(&up, &["--zone", "shop.test.", "status"])?);
    assert!(status.contains("enactor-a"), "the stack's enactors heartbeat in the added zone:\n{status}");

    // A second added zone: its plan 1 is not shop's plan 1. (The demo stack checks every
    // record against its signed plan; a check shared by the zones took shop's plan 1 for
    // blog's and served nothing of blog.)
    let blog_file = dir.path().join("blog.zone");
    std::fs::write(&blog_file, SHOP.replace("shop", "blog"))?;
    ok(&dnsplan(&up, &["zone", "add", "--managed", blog_file.to_str().unwrap_or_default()])?);
    std::fs::write(&plan, plan_file(&["10.8.0.9"]).replace("shop", "blog"))?;
    let args = ["--zone", "blog.test.", "plans", "publish", plan.to_str().unwrap_or_default(), "--reason", "second zone", "--yes"];
    ok(&dnsplan(&up, &[&args[..], &["--dns", &dns_arg, "--wait-secs", "30"]].concat())?);
    until_dns(up.dns, "api.blog.test.", |a| a.contains(&"10.8.0.9".parse().expect("address"))).await?;
    until_axfr(up.dns, &expected(101, &["10.7.0.9"]))?;
    Ok(())
}

/// The TSIG key the RFC 2136 enactor updates Knot with, and the one the test transfers with.
const UPDATE_KEY: &str = "dnsplan-enactor.";
const TRANSFER_KEY: &str = "transfer.";
/// 32 bytes, base64.
const SECRET_B64: &str = "ZG5zcGxhbi1lbmFjdG9yLWtub3QtdGVzdC1zZWNyZXQ=";

/// Knot's whole AXFR of shop.test. (signed with [`TRANSFER_KEY`]), its SOA lines left out:
/// Knot numbers its own serials.
fn knot_axfr(knot: std::net::SocketAddr) -> anyhow::Result<BTreeSet<String>> {
    let records = axfr_with(knot, "shop.test.", &["-y", &format!("hmac-sha256:{TRANSFER_KEY}:{SECRET_B64}")])?;
    Ok(records.into_iter().filter(|l| l.split(' ').nth(3) != Some("soa")).collect())
}

/// What Knot holds for shop.test. once plan `generation` serving `addresses` is enacted: its
/// own zone file's records, the addresses, and the marker of the plan they come from.
fn knot_expected(generation: u64, addresses: &[&str]) -> BTreeSet<String> {
    let mut all: BTreeSet<String> =
        ["shop.test. 300 in ns ns1.shop.test.", "ns1.shop.test. 300 in a 192.0.2.7", "www.shop.test. 300 in cname api.shop.test."]
            .into_iter()
            .map(str::to_owned)
            .collect();
    all.extend(addresses.iter().map(|a| format!("api.shop.test. 60 in a {a}")));
    all.insert(format!("_dnsplan.api.shop.test. 60 in txt \"{generation:020}\""));
    all
}

/// Publishes a plan of shop.test. serving `addresses` with the CLI, as an operator would,
/// waiting until Knot (`--dns`) answers it; then Knot's whole AXFR must be exactly
/// `knot_expected` at `generation`.
fn publish_onto_knot(
    up: &Up,
    dir: &std::path::Path,
    knot: std::net::SocketAddr,
    generation: u64,
    addresses: &[&str],
) -> anyhow::Result<()> {
    let plan = dir.join("plan.toml");
    std::fs::write(&plan, plan_file(addresses))?;
    let knot_arg = knot.to_string();
    let args = ["--zone", "shop.test.", "plans", "publish", plan.to_str().unwrap_or_default(), "--reason", "rfc2136", "--yes"];
    let published = dnsplan(up, &[&args[..], &["--dns", &knot_arg, "--wait-secs", "30"]].concat())?;
    let said = format!("{}{}", String::from_utf8_lossy(&published.stdout), String::from_utf8_lossy(&published.stderr));
    anyhow::ensure!(
        published.status.success(),
        "plan {generation} ({addresses:?}) not served by Knot: {said}\nthe enactor's log:\n{}",
        std::fs::read_to_string(dir.join("enactor.log")).unwrap_or_default()
    );
    let want = knot_expected(generation, addresses);
    let start = Instant::now();
    loop {
        let got = knot_axfr(knot)?;
        if got == want {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < WITHIN, "Knot's AXFR of shop.test. after plan {generation}:\n{got:#?}\nnot\n{want:#?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A zone removed and added again, enacted onto a real RFC 2136 primary (Knot) by a
/// `dnsplan-enactor` daemon with its config file: the primary still holds the removed zone's
/// markers, and the zone added again must be enacted all the same, because its plans start
/// past the removed zone's latest generation (`Store::generation_base`). After each plan,
/// Knot's whole AXFR is exactly its zone file plus the plan's addresses and marker.
///
/// Teeth, checked once: with the embedded store's generation base read as none (plans of the
/// zone added again start at 1 again, as before), the CLI published plan 1 and waited 30 s
/// for Knot to serve it: "1 endpoint(s) do not serve plan 1's content yet".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_added_again_is_enacted_onto_its_rfc2136_primary() -> anyhow::Result<()> {
    use dnsplan_tests::knot::{KeyAction, Knot, KnotSpec, KnotZone, TsigKey};
    let dir = tempfile::tempdir()?;
    let key = |name: &str, action| TsigKey {
        name: name.into(),
        algorithm: "hmac-sha256".into(),
        secret_base64: SECRET_B64.into(),
        actions: vec![action],
    };
    let knot = Knot::start(&KnotSpec {
        zones: vec![KnotZone { origin: "shop.test.".into(), text: Some(SHOP.into()), zone_extra: Vec::new() }],
        keys: vec![key(UPDATE_KEY, KeyAction::Update), key(TRANSFER_KEY, KeyAction::Transfer)],
        extra_config: String::new(),
    })
    .await?;
    let up = up(dir.path())?;
    let zone_file = dir.path().join("shop.zone");
    std::fs::write(&zone_file, SHOP)?;
    ok(&dnsplan(&up, &["zone", "add", "--managed", zone_file.to_str().unwrap_or_default()])?);
    std::fs::write(dir.path().join("enactor.key"), format!("{SECRET_B64}\n"))?;
    let target = format!(
        "[target]\nkind = \"rfc2136\"\nserver = \"{}\"\ndns_zone = \"shop.test.\"\n[target.key]\nname = \"{UPDATE_KEY}\"\n\
         secret_file = \"enactor.key\"\n",
        knot.addr()
    );
    let _enactor = enactor_with(dir.path(), &up.control, &target)?;
    anyhow::ensure!(knot_axfr(knot.addr())? == knot_expected(0, &[]).into_iter().filter(|l| !l.contains("_dnsplan")).collect());

    publish_onto_knot(&up, dir.path(), knot.addr(), 1, &["10.7.0.1"])?;
    publish_onto_knot(&up, dir.path(), knot.addr(), 2, &["10.7.0.2"])?;
    ok(&dnsplan(&up, &["zone", "remove", "--managed", "shop.test."])?);
    ok(&dnsplan(&up, &["zone", "add", "--managed", zone_file.to_str().unwrap_or_default()])?);
    // The same enactor process starts over on the new incarnation; Knot still has marker 2.
    publish_onto_knot(&up, dir.path(), knot.addr(), 3, &["10.7.0.3"])?;
    let plans = ok(&dnsplan(&up, &["--zone", "shop.test.", "--output", "json", "plans", "list"])?);
    let plans: serde_json::Value = serde_json::from_str(&plans)?;
    let generations: Vec<u64> = plans.as_array().into_iter().flatten().filter_map(|p| p["generation"].as_u64()).collect();
    assert_eq!(generations, vec![3], "the zone added again lists its own plans, numbered past the removed zone's");
    publish_onto_knot(&up, dir.path(), knot.addr(), 4, &["10.7.0.3", "10.7.0.4"])?;
    Ok(())
}

/// `dnsplan up` with `[authority.added_zones.dnssec]`, its config named relative to the
/// directory it runs in, as an operator types it: a zone added to its store is served signed,
/// its key directory made under `key_root` beside the config file.
///
/// Teeth, checked once: with the key root left relative and joined to "/" (as first written),
/// "ns1.shop.test. is not served signed" (the authority looked for `/keys/shop.test.`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsplan_up_signs_a_zone_added_to_its_store() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    std::fs::write(dir.path().join("dnsplan.toml"), format!("{text}\n[authority.added_zones.dnssec]\nkey_root = \"keys\"\n"))?;
    let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
    command
        .current_dir(dir.path())
        .args(["up", "--config", "dnsplan.toml", "--data-dir", "data", "--dns", "127.0.0.1:0", "--listen-control", "127.0.0.1:0"])
        .env_remove("DNSPLAN_TOKEN");
    let up = spawn_up(&mut command)?;
    std::fs::write(dir.path().join("shop.zone"), SHOP)?;
    ok(&dnsplan(&up, &["zone", "add", "--managed", dir.path().join("shop.zone").to_str().unwrap_or_default()])?);
    let start = Instant::now();
    loop {
        let out = Command::new("dig")
            .args(["+dnssec", "+norec", "+time=2", "+tries=1", "-p", &up.dns.port().to_string(), &format!("@{}", up.dns.ip())])
            .args(["ns1.shop.test.", "A"])
            .output()?;
        let answer = String::from_utf8_lossy(&out.stdout).into_owned();
        if answer.contains("RRSIG\tA 13 3 300") {
            break;
        }
        anyhow::ensure!(start.elapsed() < WITHIN, "ns1.shop.test. is not served signed:\n{answer}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let keys = dir.path().join("keys").join("shop.test.");
    assert!(keys.join("keys.toml").is_file(), "no key directory in {}", keys.display());
    let ds = ok(&std::process::Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(["zone", "ds", "--key-dir"]).arg(&keys).output()?);
    assert!(ds.starts_with("shop.test. 3600 IN DS "), "{ds}");
    Ok(())
}

/// What `dig +dnssec +norec` answers for `name` `qtype` at `up`'s DNS address.
fn dig_dnssec(up: &Up, name: &str, qtype: &str) -> anyhow::Result<String> {
    let out = Command::new("dig")
        .args(["+dnssec", "+norec", "+time=2", "+tries=1", "-p", &up.dns.port().to_string(), &format!("@{}", up.dns.ip())])
        .args([name, qtype])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `dig_dnssec` until `want` holds of its answer, or fails after `WITHIN` naming `what`.
fn until_dig(up: &Up, name: &str, qtype: &str, what: &str, want: impl Fn(&str) -> bool) -> anyhow::Result<String> {
    let start = Instant::now();
    loop {
        let answer = dig_dnssec(up, name, qtype)?;
        if want(&answer) {
            return Ok(answer);
        }
        anyhow::ensure!(start.elapsed() < WITHIN, "{what}: {name} {qtype}:\n{answer}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// The DNSKEY records of an answer, each as its RDATA.
fn dnskeys(answer: &str) -> BTreeSet<String> {
    answer
        .lines()
        .filter(|l| !l.starts_with(';') && l.contains("\tDNSKEY\t"))
        .filter_map(|l| l.split("\tDNSKEY\t").nth(1).map(str::to_owned))
        .collect()
}

/// `delv`'s first line for `name` `qtype` at `up`, with `anchor` for `zone` as its only trust
/// anchor.
fn delv_verdict(up: &Up, anchor: &std::path::Path, zone: &str, name: &str, qtype: &str) -> anyhow::Result<String> {
    let out = Command::new("delv")
        .arg("-a")
        .arg(anchor)
        .arg(format!("@{}", up.dns.ip()))
        .args(["-p", &up.dns.port().to_string(), name, qtype, &format!("+root={}", zone.trim_end_matches('.'))])
        .output()
        .map_err(|err| anyhow::anyhow!("delv (Debian package bind9-dnsutils) is needed: {err}"))?;
    Ok(String::from_utf8_lossy(&out.stdout).lines().next().unwrap_or_default().to_owned())
}

/// A static zone added at run time (`dnsplan zone add FILE`, not `--managed`) under `dnsplan up`
/// with `[authority.added_zones.dnssec]`: served signed with a key directory made for it, as
/// the store's zones are, and validated by BIND's `delv` with its KSK as the only anchor; a ZSK
/// roll started with `dnsplan zone key roll --zsk DIR` is served within `key_check_secs`; a
/// new version of the zone (`zone add` again, a newer serial) is signed with the same keys;
/// and after a SIGKILL and a restart, the zone is served signed with the same DNSKEY set.
///
/// Teeth, checked once: without the table's signer, "www.blog.test. is not served signed".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dnsplan_up_signs_a_static_zone_added_at_run_time_and_follows_its_keys() -> anyhow::Result<()> {
    const BLOG: &str = "$ORIGIN blog.test.\n$TTL 300\n@ IN SOA ns1.blog.test. hostmaster.blog.test. 7 3600 600 604800 30\n\
                        @ IN NS ns1\nns1 IN A 192.0.2.7\nwww IN A 192.0.2.80\n";
    let dir = tempfile::tempdir()?;
    let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let config = format!("{text}\n[authority.added_zones.dnssec]\nkey_root = \"keys\"\nalgorithm = \"ed25519\"\nkey_check_secs = 1\n");
    std::fs::write(dir.path().join("dnsplan.toml"), config)?;
    let start = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
        command
            .current_dir(dir.path())
            .args(["up", "--config", "dnsplan.toml", "--data-dir", "data", "--dns", "127.0.0.1:0", "--listen-control", "127.0.0.1:0"])
            .env_remove("DNSPLAN_TOKEN");
        spawn_up(&mut command)
    };
    let up = start()?;
    let zone_file = dir.path().join("blog.zone");
    std::fs::write(&zone_file, BLOG)?;
    ok(&dnsplan(&up, &["zone", "add", zone_file.to_str().unwrap_or_default()])?);
    until_dig(&up, "www.blog.test.", "A", "www.blog.test. is not served signed", |a| a.contains("RRSIG\tA 15 3 300"))?;
    let keys = dir.path().join("keys").join("blog.test.");
    let ds = ok(&Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(["zone", "ds", "--key-dir"]).arg(&keys).output()?);
    assert!(ds.starts_with("blog.test. 3600 IN DS "), "{ds}");
    let first = dnskeys(&dig_dnssec(&up, "blog.test.", "DNSKEY")?);
    assert_eq!(first.len(), 2, "a KSK and a ZSK: {first:?}");
    let ksk = first.iter().find(|k| k.starts_with("257 ")).cloned().unwrap_or_default();
    let anchor = dir.path().join("blog.anchor");
    let key_words: Vec<&str> = ksk.split_whitespace().collect();
    std::fs::write(
        &anchor,
        format!(
            "trust-anchors {{ blog.test. static-key {} {} {} \"{}\"; }};\n",
            key_words[0],
            key_words[1],
            key_words[2],
            key_words[3..].join("")
        ),
    )?;
    let validated = |step: &str, questions: &[(&str, &str, &str)]| -> anyhow::Result<()> {
        for (name, qtype, verdict) in questions {
            let said = delv_verdict(&up, &anchor, "blog.test.", name, qtype)?;
            anyhow::ensure!(said == *verdict, "{step}: delv {name} {qtype}: {said}");
        }
        Ok(())
    };
    let questions = [
        ("blog.test.", "DNSKEY", "; fully validated"),
        ("www.blog.test.", "A", "; fully validated"),
        ("nope.blog.test.", "A", "; negative response, fully validated"),
    ];
    validated("added", &questions)?;

    // A ZSK roll started by the operator on the zone's directory.
    ok(&Command::new(env!("CARGO_BIN_EXE_dnsplan")).args(["zone", "key", "roll", "--zsk"]).arg(&keys).output()?);
    let rolled = dnskeys(&until_dig(&up, "blog.test.", "DNSKEY", "the new ZSK is not published", |a| dnskeys(a).len() == 3)?);
    assert!(rolled.is_superset(&first), "{rolled:?} / {first:?}");
    validated("new ZSK published", &questions)?;

    // A new version of the zone: signed with the same keys.
    std::fs::write(&zone_file, BLOG.replace(" 7 3600", " 8 3600") + "new IN A 192.0.2.81\n")?;
    ok(&dnsplan(&up, &["zone", "add", zone_file.to_str().unwrap_or_default()])?);
    until_dig(&up, "new.blog.test.", "A", "the new version is not served signed", |a| a.contains("RRSIG\tA 15 3 300"))?;
    assert_eq!(dnskeys(&dig_dnssec(&up, "blog.test.", "DNSKEY")?), rolled, "the new version's keys");
    validated("new version", &[("new.blog.test.", "A", "; fully validated")])?;

    // SIGKILLed and started again: served signed from its kept file, with the same keys.
    drop(up);
    let up = start()?;
    let again = dnskeys(&until_dig(&up, "blog.test.", "DNSKEY", "not served signed after the restart", |a| !dnskeys(a).is_empty())?);
    assert_eq!(again, rolled, "the keys after a restart");
    for (name, qtype, verdict) in
        [("new.blog.test.", "A", "; fully validated"), ("nope.blog.test.", "A", "; negative response, fully validated")]
    {
        let said = delv_verdict(&up, &anchor, "blog.test.", name, qtype)?;
        anyhow::ensure!(said == verdict, "after the restart: delv {name} {qtype}: {said}");
    }
    Ok(())
}
