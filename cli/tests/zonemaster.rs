//! Zonemaster (the DNS health checker registries run on delegations) on a multi-zone stack, as
//! shipped: `dnsplan up` with its config file serving its first zone (static records from a
//! master file and a planned endpoint), a static zone of its config and a zone added to its
//! store at run time with `dnsplan zone add --managed`, each delegated from a `test.` TLD
//! under a root of our own, on two name server addresses; and NSD serving the same zone files
//! the same way. Everything runs inside a network namespace of its own (`unshare -rn`), on
//! port 53 as Zonemaster needs, so nothing leaves the machine (`tests/zonemaster/lab.sh`).
//!
//! For each zone, what Zonemaster says at NOTICE and above must be what it says of NSD, with no
//! ERROR or CRITICAL (the lab's own notices remain: no IPv6 name servers, an unsigned zone).
//!
//! The first zone is signed (DNSSEC), by dnsplan, and for NSD by Knot (`kzonesign`) with the
//! same key: its DS is in the TLD. Zonemaster's DNSSEC module says nothing above INFO of a
//! zone signed well, so its INFO messages are compared too (signatures' expiry dates left out:
//! they are made seconds apart), and they must show the zone was checked as signed.
//!
//! Teeth of the DNSSEC part, checked once: with one bit of the SOA's RRSIG flipped, dnsplan's
//! zone gets Zonemaster's `ERROR DNSSEC09 DS09_RRSIG_NOT_VALID_BY_DNSKEY`.
//!
//! Teeth, checked once: with the added zone not added to the store (answered REFUSED), it fails
//! on Zonemaster's `NS_FAILED rcode=REFUSED` (ERROR) and `CANNOT_CONTINUE` (CRITICAL) for
//! shop.test.

mod support;

use dnsplan_tests::counterpart::sbin_binary;
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

const ZONES: [&str; 3] = ["example.test.", "static.test.", "shop.test."];

/// Runs the lab with `mode` (`nsd` or `dnsplan`) in `dir`; each zone's messages at NOTICE and
/// above, and the DNSSEC module's at INFO, as `LEVEL MODULE TESTCASE TAG args`, sorted.
fn lab(mode: &str, dir: &Path) -> anyhow::Result<Vec<BTreeSet<String>>> {
    let script = support::root().join("cli/tests/zonemaster/lab.sh");
    let out = Command::new("timeout")
        .args(["900", "unshare", "-rn", "sh"])
        .arg(&script)
        .args([mode, dir.to_str().unwrap_or_default(), env!("CARGO_BIN_EXE_dnsplan")])
        .env("PATH", format!("{}:/usr/sbin:/sbin", std::env::var("PATH").unwrap_or_default()))
        .output()?;
    let log = std::fs::read_to_string(dir.join("server.log")).unwrap_or_default();
    anyhow::ensure!(
        out.status.success(),
        "the {mode} lab failed ({}):\n{}{}\nthe server's log:\n{log}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ZONES
        .iter()
        .map(|zone| {
            let text = std::fs::read_to_string(dir.join(format!("zonemaster-{zone}.txt")))?;
            // `--raw` lines: seconds since start, level, module, test case, tag, arguments.
            let messages: BTreeSet<String> = text
                .lines()
                .filter_map(|l| l.trim_start().split_once(' '))
                .filter(|(secs, _)| secs.parse::<f64>().is_ok())
                .map(|(_, rest)| rest.split_whitespace().collect::<Vec<_>>())
                .filter(|words| words.first() != Some(&"INFO") || words.get(1) == Some(&"DNSSEC"))
                .map(|words| without_dates(&words.join(" ")))
                .collect();
            // Signed, the zone's algorithm was checked; unsigned, Zonemaster said so.
            let ran = if *zone == SIGNED { "ALGORITHM_OK algo_descr=ECDSA Curve P-256" } else { "NOT_SIGNED" };
            anyhow::ensure!(
                messages.iter().any(|m| m.contains(ran)),
                "Zonemaster did not run through for {zone} with {mode} (no {ran}):\n{text}"
            );
            Ok(messages)
        })
        .collect()
}

/// The zone the lab signs.
const SIGNED: &str = "example.test.";

/// `message` with each `date=…;` argument's value left out.
fn without_dates(message: &str) -> String {
    message.split("; ").map(|arg| if arg.contains("date=") { "date=…" } else { arg }).collect::<Vec<_>>().join("; ")
}

#[test]
fn a_multi_zone_stack_passes_zonemaster_as_nsd_does() -> anyhow::Result<()> {
    sbin_binary("zonemaster-cli", "Zonemaster", "zonemaster-cli")?;
    sbin_binary("nsd", "NSD", "nsd")?;
    sbin_binary("unshare", "unshare", "util-linux")?;
    sbin_binary("kzonesign", "kzonesign", "knot-dnssecutils")?;
    sbin_binary("keymgr", "keymgr", "knot")?;
    let (nsd_dir, ours_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    // One key for both: the DNSKEY, DS and key tags Zonemaster reports are then the same.
    let made = Command::new(env!("CARGO_BIN_EXE_dnsplan"))
        .args(["zone", "key", "new"])
        .arg(nsd_dir.path().join("zone.key"))
        .args(["--dns-zone", SIGNED])
        .output()?;
    anyhow::ensure!(made.status.success(), "dnsplan zone key new: {}", String::from_utf8_lossy(&made.stderr));
    std::fs::copy(nsd_dir.path().join("zone.key"), ours_dir.path().join("zone.key"))?;
    let nsd = lab("nsd", nsd_dir.path())?;
    let ours = lab("dnsplan", ours_dir.path())?;
    for ((zone, theirs), ours) in ZONES.iter().zip(&nsd).zip(&ours) {
        let bad: Vec<&String> = ours.iter().filter(|m| m.starts_with("ERROR") || m.starts_with("CRITICAL")).collect();
        assert!(bad.is_empty(), "Zonemaster's errors for {zone} served by dnsplan:\n{bad:#?}");
        assert_eq!(ours, theirs, "what Zonemaster says of {zone}: dnsplan (left), NSD (right)");
    }
    Ok(())
}
