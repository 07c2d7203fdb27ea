//! One planner, several zones, as shipped: `dnsplan up` whose config plans a zone added to the
//! store (`[[planner.zone]]`) beside its first one, with demo backends for both. The added zone
//! (`dnsplan zone add --managed FILE`) is planned, enacted and served from the health of its
//! own targets: its whole AXFR is the master file's records plus every healthy target, and a
//! target that fails its checks leaves it; the first zone goes on as before. The planner's
//! metrics are one family per metric, the added zone's series labelled `dns_zone`.
//!
//! Teeth, checked once: with `plan_zones` planning the first zone alone, "shop.test.'s whole
//! AXFR" never has `api.shop.test.`.

mod support;

use std::collections::BTreeSet;
use std::time::Instant;
use support::dns::*;
use support::*;

const SHOP: &str = "$ORIGIN shop.test.
$TTL 300
@ IN SOA ns1.shop.test. hostmaster.shop.test. 100 3600 600 604800 30
@ IN NS ns1
ns1 IN A 192.0.2.7
";

/// The zone's records but its SOA: the master file's and `api` at `addresses`.
fn expected(addresses: &[&str]) -> BTreeSet<String> {
    let mut all: BTreeSet<String> =
        ["shop.test. 300 in ns ns1.shop.test.".to_string(), "ns1.shop.test. 300 in a 192.0.2.7".to_string()].into_iter().collect();
    all.extend(addresses.iter().map(|a| format!("api.shop.test. 30 in a {a}")));
    all
}

/// Waits until `server`'s AXFR of shop.test., its SOA aside, is `want`.
fn until_axfr(server: std::net::SocketAddr, want: &BTreeSet<String>) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let got: BTreeSet<String> =
            axfr(server, "shop.test.").unwrap_or_default().into_iter().filter(|l| l.split(' ').nth(3) != Some("soa")).collect();
        if &got == want {
            return Ok(());
        }
        anyhow::ensure!(start.elapsed() < WITHIN, "shop.test.'s whole AXFR from {server}:\n{got:#?}\nnot\n{want:#?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_planner_plans_every_zone_of_its_config() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let check_port = free_port()?;
    let shop_planned = format!(
        "\n[[planner.zone]]\ndns_zone = \"shop.test.\"\n[[planner.zone.endpoint]]\nname = \"api.shop.test.\"\nttl_secs = 30\n\
         check = {{ kind = \"tcp\", port = {check_port}, interval_ms = 300, timeout_ms = 200, rise = 2, fall = 2 }}\n\
         [[planner.zone.endpoint.target]]\naddress = \"127.0.0.41\"\nzone = \"a\"\n\
         [[planner.zone.endpoint.target]]\naddress = \"127.0.0.42\"\nzone = \"b\"\n\
         [[planner.zone.endpoint.target]]\naddress = \"127.0.0.43\"\nzone = \"c\"\n"
    );
    let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    // Transfers open to loopback, so that the test reads the zones whole.
    let transfers = "\n[authority.dns.transfer]\ntsig_required = false\n[[authority.dns.transfer.secondaries]]\naddress = \"127.0.0.1\"\n";
    std::fs::write(dir.path().join("dnsplan.toml"), format!("{text}{transfers}{shop_planned}"))?;
    let up = spawn_up(&mut up_command(dir.path())?)?;
    until_dns(up.dns, "api.example.test.", |a| a.len() == 6).await?;

    // Added to the store: planned by the stack's planner, enacted by its enactors, served.
    let zone_file = dir.path().join("shop.zone");
    std::fs::write(&zone_file, SHOP)?;
    ok(&dnsplan(&up, &["zone", "add", "--managed", zone_file.to_str().unwrap_or_default()])?);
    until_axfr(up.dns, &expected(&["127.0.0.41", "127.0.0.42", "127.0.0.43"]))?;
    let plans: serde_json::Value =
        serde_json::from_str(&ok(&dnsplan(&up, &["--zone", "shop.test.", "--output", "json", "plans", "list"])?))?;
    let by_planner = plans.as_array().map_or(0, |p| p.iter().filter(|p| p.to_string().contains("\"planner\"")).count());
    assert!(by_planner >= 1, "no plan of shop.test. by the planner: {plans}");

    // A target of the added zone fails its checks: the planner takes it out of that zone.
    ok(&dnsplan(&up, &["backend", "fail", "127.0.0.42"])?);
    until_axfr(up.dns, &expected(&["127.0.0.41", "127.0.0.43"])).map_err(|e| anyhow::anyhow!("a failed target stayed: {e}"))?;
    // The first zone is planned as before: every api target still served.
    let first = ask(up.dns, "api.example.test.", hickory_proto::rr::RecordType::A)?;
    assert_eq!(first.answers.len(), 6, "the first zone's api after the added zone's failure: {first:?}");

    // One family per metric, the added zone's series labelled `dns_zone`.
    let metrics = reqwest::get(format!("{}/metrics", up.control)).await?.text().await?;
    dnsplan_tests::exposition::assert_each_family_described_once(&metrics);
    let published = |labels: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("dnsplan_planner_plans_published_total{{{labels}}} ")).map(str::to_owned))
            .and_then(|n| n.parse::<u64>().ok())
    };
    assert!(published("planner=\"planner\",dns_zone=\"shop.test.\"").is_some_and(|n| n >= 2), "shop.test.'s plans not counted:\n{metrics}");
    assert!(published("planner=\"planner\"").is_some_and(|n| n >= 1), "the first zone's plans not counted:\n{metrics}");
    Ok(())
}
