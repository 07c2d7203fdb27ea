//! `dnsplan-chaos` as CI runs it: a short version of every scenario must pass, and the
//! 2025 behaviour must be caught, on the authority and on its secondary (the harness proving
//! its own teeth).

use std::path::Path;
use std::process::Command;

/// The process scenarios start the real daemons, which must be built next to the harness.
fn build_daemons() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "-p", "dnsplan-authority", "-p", "dnsplan-enactor", "-p", "dnsplan-planner"])
        .current_dir(root)
        .status()
        .expect("cargo runs");
    assert!(status.success(), "building the daemons failed");
}

#[test]
fn every_scenario_passes_briefly_and_the_naive_counterfactual_is_caught() {
    build_daemons();
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_dnsplan-chaos"))
        .args(["run", "all", "--seed", "42", "--duration", "3", "--report"])
        .arg(&report)
        .output()
        .expect("the harness runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let scenarios = [
        "aws-2025-race",
        "aws-2025-race-secondary",
        "enactor-kill-loop",
        "authority-kill9",
        "planner-storm",
        "partition",
        "gray-zone",
        "aws-2025-race-etcd",
        "etcd-leader-kill",
        "etcd-member-down",
        "etcd-crash-in-outage",
        "etcd-partition",
    ];
    for scenario in scenarios {
        assert!(stdout.contains(&format!("{scenario}: seed 42")), "{scenario} did not run: {stdout}");
    }
    let reports: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&report).expect("report written")).expect("JSON");
    let reports = reports.as_array().expect("a list");
    assert_eq!(reports.len(), scenarios.len());
    let named = |name: &str| reports.iter().find(|r| r["scenario"] == name).unwrap_or_else(|| panic!("no report for {name}"));
    for r in reports {
        assert_eq!(r["violations"].as_array().map(Vec::len), Some(0), "{r}");
        assert_eq!(r["converged"], true, "{r}");
        assert!(r["answers_checked"].as_u64().unwrap_or(0) > 0, "{r}");
    }
    // Faults were really injected.
    for (scenario, fault) in [
        ("aws-2025-race-secondary", "secondary following by zone transfer"),
        ("enactor-kill-loop", "enactor SIGKILL+restart"),
        ("authority-kill9", "authority SIGKILL+restart"),
        ("partition", "partition enactors from the store"),
        ("etcd-member-down", "calls kept succeeding with a member down"),
        ("etcd-crash-in-outage", "restarted in the outage, not older"),
        ("etcd-leader-kill", "etcd leader SIGKILL"),
        ("etcd-partition", "partition authority b from etcd"),
    ] {
        let r = named(scenario);
        assert!(r["faults"][fault].as_u64().unwrap_or(0) > 0, "{r}");
    }

    let naive = Command::new(env!("CARGO_BIN_EXE_dnsplan-chaos")).args(["run", "aws-2025-race", "--unsafe-naive"]).output().expect("runs");
    let stdout = String::from_utf8_lossy(&naive.stdout);
    assert!(naive.status.success(), "the 2025 behaviour was not caught: {stdout}");
    for kind in ["empty answer", "backwards", "active plan deleted"] {
        assert!(stdout.contains(&format!("  {kind}: ")), "the checker missed {kind}: {stdout}");
    }
    let naive = Command::new(env!("CARGO_BIN_EXE_dnsplan-chaos"))
        .args(["run", "aws-2025-race-secondary", "--unsafe-naive"])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&naive.stdout);
    assert!(naive.status.success(), "the 2025 behaviour was not caught with a secondary: {stdout}");
    for kind in ["empty answer", "backwards", "deleted plan served"] {
        assert!(stdout.contains(&format!("  {kind} on the secondary: ")), "the checker missed {kind} on the secondary: {stdout}");
    }
}
