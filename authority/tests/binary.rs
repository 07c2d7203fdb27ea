//! The `dnsplan-authority` binary: starts from its config, serves, and exits 0 on SIGTERM;
//! a bad config is a clear error naming the key and line, not a panic.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn sigterm_stops_cleanly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("zone.db"), support::ZONE_FILE)?;
    let config = dir.path().join("authority.toml");
    std::fs::write(&config, support::config_text(&dir.path().join("data"), 8))?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-authority"))
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut saw_control = false;
    for line in lines.by_ref() {
        if line?.starts_with("control") {
            saw_control = true;
            break;
        }
    }
    assert!(saw_control, "the authority did not report where it listens");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    let exit = child.wait()?;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    Ok(())
}

#[test]
fn bad_config_is_a_clear_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("authority.toml");
    let cases = [
        ("data_dir = \"d\"\n[control]\ntoken = \"0123456789abcdef0\"\n[dns_zone]\norigin = \"example.test.\"\nbogus = 1\n", "bogus"),
        ("data_dir = \"d\"\n[control]\ntoken = \"short\"\n[dns_zone]\norigin = \"example.test.\"\n", "shorter than 16 bytes"),
        ("data_dir = \"d\"\n[dns]\nlisten = [\"nope\"]\n", "line 3"),
        (
            "data_dir = \"d\"\n[control]\ntoken = \"0123456789abcdef0\"\n[dns_zone]\norigin = \"example.test.\"\nns = [\"ns1.example.test.\"]\n",
            "no SOA",
        ),
    ];
    for (text, want) in cases {
        std::fs::write(&config, text)?;
        let out =
            Command::new(env!("CARGO_BIN_EXE_dnsplan-authority")).arg("--config").arg(&config).env_remove("DNSPLAN_TOKEN").output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{want}: the authority started");
        assert!(stderr.contains(want), "{want:?} not in: {stderr}");
        assert!(!stderr.contains("panicked"), "panic: {stderr}");
    }
    Ok(())
}
