//! Many zones from one stack, as shipped: `dnsplan up` serving the managed zone and a static
//! zone of its config file (`[[authority.zones]]`), then a zone added at run time with
//! `dnsplan zone add`, kept across a SIGKILL and a restart, replaced only by a newer serial,
//! and removed with `dnsplan zone remove`. After each step each static zone's whole AXFR and
//! the answers to a set of questions (apex, names, a wildcard, a delegation, a miss) are
//! compared with a real NSD serving the same master files; a second NSD, a secondary of the
//! added zone, is told of each add and replacement by NOTIFY and must then hold the zone
//! whole, well before its SOA refresh (an hour) would have it ask.

mod support;

use dnsplan_tests::nsd::{Nsd, NsdSpec, NsdZone};
use hickory_proto::rr::RecordType;
use std::net::SocketAddr;
use std::process::Command;
use support::dns::*;
use support::*;

const STATIC: &str = "$ORIGIN static.test.
$TTL 3600
@ IN SOA ns1.static.test. hostmaster.static.test. 10 3600 600 604800 30
@ IN NS ns1
ns1 IN A 192.0.2.1
www IN A 192.0.2.80
www IN AAAA 2001:db8::80
*.wild IN TXT \"wild\"
sub IN NS ns.sub
ns.sub IN A 192.0.2.53
alias IN CNAME www
";

fn added(serial: u32, address: &str) -> String {
    format!(
        "$ORIGIN added.test.
$TTL 300
@ IN SOA ns1.added.test. hostmaster.added.test. {serial} 3600 600 604800 30
@ IN NS ns1
ns1 IN A 192.0.2.2
api IN A {address}
"
    )
}

/// The questions asked of both servers in `zone`.
fn questions(zone: &str) -> Vec<(String, RecordType)> {
    let mut all = Vec::new();
    for name in ["", "www.", "ns1.", "x.wild.", "a.sub.", "alias.", "api.", "nope."] {
        for qtype in [RecordType::A, RecordType::AAAA, RecordType::SOA, RecordType::NS, RecordType::TXT] {
            all.push((format!("{name}{zone}"), qtype));
        }
    }
    all
}

/// `zone`'s whole AXFR and every answer to `questions(zone)` are the same from dnsplan and NSD.
fn same_as_nsd(dnsplan: SocketAddr, nsd: SocketAddr, zone: &str) -> anyhow::Result<()> {
    let (ours, theirs) = (axfr(dnsplan, zone)?, axfr(nsd, zone)?);
    anyhow::ensure!(ours == theirs, "AXFR of {zone} differs:\n dnsplan {ours:#?}\n nsd {theirs:#?}");
    for (name, qtype) in questions(zone) {
        let (a, b) = (ask(dnsplan, &name, qtype)?, ask(nsd, &name, qtype)?);
        let same = a.metadata.response_code == b.metadata.response_code
            && a.metadata.authoritative == b.metadata.authoritative
            && section(&a.answers) == section(&b.answers)
            && section(&a.authorities) == section(&b.authorities)
            && section(&a.additionals) == section(&b.additionals);
        anyhow::ensure!(same, "{name} {qtype} differs:\n dnsplan {a:?}\n nsd {b:?}");
    }
    Ok(())
}

/// Teeth, checked once each: without the zone table in the listeners (`with_zones`), every
/// static zone's question is REFUSED and the first comparison fails; without reading the
/// added zones back at start (`load_added`), "added.test. not served after the restart";
/// without the serial check, the same serial is taken again; without the NOTIFY of an added
/// zone (`notify::spawn_static`), "the secondary was not told of the new zone".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_zones_are_served_beside_the_managed_one_added_and_removed_at_run_time() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("static.zone"), STATIC)?;
    let text = BUILT_IN.replace("18080", &free_port()?.to_string()).replace("15432", &free_port()?.to_string());
    let text = format!(
        "{text}\n[[authority.zones]]\norigin = \"static.test.\"\nmaster_file = \"static.zone\"\n\n[authority.dns.transfer]\n\
         tsig_required = false\n[[authority.dns.transfer.secondaries]]\naddress = \"127.0.0.1\"\n"
    );
    std::fs::write(dir.path().join("dnsplan.toml"), text)?;
    let nsd = Nsd::start(&NsdSpec {
        zones: vec![
            NsdZone { origin: "static.test.".into(), text: Some(STATIC.into()), zone_extra: vec!["provide-xfr: 127.0.0.1 NOKEY".into()] },
            NsdZone {
                origin: "added.test.".into(),
                text: Some(added(5, "10.5.0.1")),
                zone_extra: vec!["provide-xfr: 127.0.0.1 NOKEY".into()],
            },
        ],
        keys: Vec::new(),
        server_extra: vec!["minimal-responses: yes".into(), "rrl-ratelimit: 0".into()],
    })
    .await?;

    // The secondary first, so the stack's config can name where it takes NOTIFY; the stack's
    // DNS port chosen before either starts.
    let dns_port = free_port()?;
    let secondary = Nsd::start(&NsdSpec {
        zones: vec![NsdZone {
            origin: "added.test.".into(),
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
    let config = dir.path().join("dnsplan.toml");
    let text = std::fs::read_to_string(&config)?;
    std::fs::write(&config, format!("{text}notify = \"{}\"\n", secondary.addr()))?;
    let start = || -> anyhow::Result<Up> {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan"));
        command.arg("up").arg("--config").arg(&config).arg("--data-dir").arg(dir.path().join("data"));
        command.args(["--dns", &format!("127.0.0.1:{dns_port}"), "--listen-control", "127.0.0.1:0"]).env_remove("DNSPLAN_TOKEN");
        spawn_up(&mut command)
    };
    let up = start()?;
    until_serial(up.dns, "static.test.", 10)?;
    same_as_nsd(up.dns, nsd.addr(), "static.test.")?;
    let managed = ask(up.dns, "example.test.", RecordType::SOA)?;
    assert!(managed.metadata.authoritative && !managed.answers.is_empty(), "the managed zone beside it: {managed:?}");
    assert!(refused(up.dns, "other.test.")?, "a zone nobody serves");

    // Added at run time, from a file.
    let file = dir.path().join("added.zone");
    std::fs::write(&file, added(5, "10.5.0.1"))?;
    let said = ok(&dnsplan(&up, &["zone", "add", file.to_str().unwrap_or_default()])?);
    assert!(said.contains("zone added.test. served: serial 5"), "{said}");
    until_serial(up.dns, "added.test.", 5)?;
    same_as_nsd(up.dns, nsd.addr(), "added.test.")?;
    until_serial(secondary.addr(), "added.test.", 5).map_err(|e| anyhow::anyhow!("the secondary was not told of the new zone: {e}"))?;
    anyhow::ensure!(axfr(secondary.addr(), "added.test.")? == axfr(up.dns, "added.test.")?, "the secondary's copy differs");
    let list = ok(&dnsplan(&up, &["zone", "list"])?);
    for row in ["example.test.", "static.test.", "added.test."] {
        assert!(list.contains(row), "{row} not in:\n{list}");
    }
    let listed: dnsplan_common::status::ZoneList = serde_json::from_str(&ok(&dnsplan(&up, &["--output", "json", "zone", "list"])?))?;
    let counted = listed.zones.iter().find(|z| z.origin == "static.test.").map_or(0, |z| z.queries);
    assert!(counted >= questions("static.test.").len() as u64, "static.test. counted {counted} queries: {listed:?}");
    let metrics = reqwest::get(format!("{}/metrics", up.control)).await?.text().await?;
    for line in ["dnsplan_static_zones{source=\"config\"} 1", "dnsplan_static_zones{source=\"added\"} 1"] {
        assert!(metrics.contains(line), "{line} not in the metrics");
    }

    // The same serial again: refused, the zone served as it was.
    std::fs::write(&file, added(5, "10.5.0.9"))?;
    let out = dnsplan(&up, &["zone", "add", file.to_str().unwrap_or_default()])?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && said.contains("serial 5 is not newer than the serial 5 served"), "{said}");
    same_as_nsd(up.dns, nsd.addr(), "added.test.")?;
    // A newer serial replaces it, and the secondary is told.
    std::fs::write(&file, added(6, "10.5.0.9"))?;
    ok(&dnsplan(&up, &["zone", "add", file.to_str().unwrap_or_default()])?);
    until_serial(up.dns, "added.test.", 6)?;
    until_serial(secondary.addr(), "added.test.", 6).map_err(|e| anyhow::anyhow!("the secondary was not told of the replacement: {e}"))?;
    anyhow::ensure!(axfr(secondary.addr(), "added.test.")? == axfr(up.dns, "added.test.")?, "the secondary's copy differs");

    // Killed and started again: the added zone is served from disk, as replaced.
    drop(up);
    let up = start()?;
    until_serial(up.dns, "static.test.", 10)?;
    until_serial(up.dns, "added.test.", 6).map_err(|e| anyhow::anyhow!("added.test. not served after the restart: {e}"))?;
    anyhow::ensure!(axfr(secondary.addr(), "added.test.")? == axfr(up.dns, "added.test.")?, "the restart served another added.test.");

    // A zone of the config file is not removed at run time; an added one is, for good.
    let out = dnsplan(&up, &["zone", "remove", "static.test."])?;
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && said.contains("defined in the config file"), "{said}");
    ok(&dnsplan(&up, &["zone", "remove", "added.test."])?);
    assert!(refused(up.dns, "added.test.")?, "added.test. still served after its removal");
    drop(up);
    let up = start()?;
    until_serial(up.dns, "static.test.", 10)?;
    assert!(refused(up.dns, "added.test.")?, "added.test. served again after a restart");
    same_as_nsd(up.dns, nsd.addr(), "static.test.")?;
    drop((nsd, secondary));
    Ok(())
}
