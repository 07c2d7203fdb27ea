//! The `dnsplan-planner` binary: the shipped example config loads, a bad config is a clear
//! error naming the key and line, and SIGTERM stops it with exit 0.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

#[test]
fn the_example_config_loads() -> anyhow::Result<()> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/planner.toml");
    let config = dnsplan_planner::PlannerConfig::load(&example)?;
    assert_eq!(config.endpoints().count(), 2);
    assert_eq!(config.id, "planner-1");
    Ok(())
}

#[test]
fn bad_config_is_a_clear_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, "id = \"p\"\ndns_zone = \"example.test.\"\n[store]\nurl = \"http://x\"\n[policy]\nfail_open = 0.5\n")?;
    let out = Command::new(env!("CARGO_BIN_EXE_dnsplan-planner")).arg("--config").arg(&config).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("fail_open") && stderr.contains("line 6"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    Ok(())
}

#[test]
fn sigterm_stops_cleanly() -> anyhow::Result<()> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/planner.toml");
    let dir = tempfile::tempdir()?;
    // The example, with no store running and metrics on a free port.
    let text = std::fs::read_to_string(example)?.replace("127.0.0.1:8053", "127.0.0.1:1").replace("127.0.0.1:9102", "127.0.0.1:0");
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-planner"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().transpose()?.unwrap_or_default();
    assert!(first.starts_with("metrics"), "{first}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    let exit = child.wait()?;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    drop(lines);
    Ok(())
}
