//! `[store] kind = "etcd"` in `planner.toml`: the example's commented etcd section loads when
//! uncommented; a bad one is an error naming key and line that never shows the password; and
//! a planner whose etcd does not answer says so, keeps waiting (no exit, no busy loop) and
//! stops cleanly on SIGTERM.

use dnsplan_common::store_config::{ETCD_PREFIX_DEFAULT, StoreConfig};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long the binary may take to say that it waits for etcd.
const WITHIN: Duration = Duration::from_secs(20);

/// The example with its `[store]` on etcd: the control API's `url` removed and the commented
/// etcd keys uncommented.
fn example_on_etcd() -> anyhow::Result<String> {
    let example = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/planner.toml"))?;
    let mut text = String::new();
    let mut inside = false;
    for line in example.lines() {
        inside = (inside || line.starts_with("# Or etcd v3 directly")) && !line.trim().is_empty();
        if line.starts_with("url = ") {
            continue;
        }
        match line.strip_prefix("# ") {
            Some(key) if inside && !key.starts_with('#') && key.contains(" = ") => text.push_str(key),
            _ => text.push_str(line),
        }
        text.push('\n');
    }
    Ok(text)
}

#[test]
fn the_examples_etcd_section_loads_uncommented() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("etcd-password"), "from-the-file\n")?;
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, example_on_etcd()?)?;
    let loaded = dnsplan_planner::PlannerConfig::load(&config)?;
    let StoreConfig::Etcd(etcd) = &loaded.store else { anyhow::bail!("not on etcd: {:?}", loaded.store) };
    assert_eq!(etcd.endpoints.len(), 3);
    assert_eq!(etcd.prefix, ETCD_PREFIX_DEFAULT);
    let (user, password) = etcd.credentials().ok_or_else(|| anyhow::anyhow!("no credentials"))?;
    assert_eq!((user.as_str(), password.expose()), ("dnsplan", "from-the-file"));
    assert!(!format!("{loaded:?}").contains("from-the-file"), "the password is in the config's Debug");
    Ok(())
}

#[test]
fn a_bad_etcd_store_is_a_clear_error_without_the_password() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("planner.toml");
    for (store, want) in [
        ("kind = \"etcd\"\nendpoints = [\"https://10.0.0.1:2379\"]\nusername = \"u\"\npassword = \"hunter2-pw\"", "store.ca_file: missing"),
        ("kind = \"etcd\"\nendpoints = [\"http://10.0.0.1:2379\"]\npassword = \"hunter2-pw\"", "store.username"),
        ("kind = \"etcd\"\nendpoints = [\"http://10.0.0.1:2379\"]\nusername = \"u\"\npassword_file = \"missing\"", "missing"),
    ] {
        let text = example_on_etcd()?;
        let start = text.find("[store]").ok_or_else(|| anyhow::anyhow!("no [store]"))?;
        let end = start + text[start..].find("\n[planner]").ok_or_else(|| anyhow::anyhow!("no [planner]"))?;
        std::fs::write(&config, format!("{}[store]\n{store}\n{}", &text[..start], &text[end..]))?;
        let out = Command::new(env!("CARGO_BIN_EXE_dnsplan-planner")).arg("--config").arg(&config).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{store}: {stderr}");
        assert!(stderr.contains(want), "{store}: want {want:?} in {stderr}");
        assert!(!stderr.contains("hunter2"), "{store}: the password is shown: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
    // Errors found by TOML carry the line.
    std::fs::write(&config, example_on_etcd()?.replace("prefix = ", "prefixx = "))?;
    let out = Command::new(env!("CARGO_BIN_EXE_dnsplan-planner")).arg("--config").arg(&config).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("prefixx") && stderr.contains("line "), "{stderr}");
    Ok(())
}

#[test]
fn a_planner_waits_for_etcd_and_stops_cleanly() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let free = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let text = example_on_etcd()?
        .replace("[\"http://10.0.0.1:2379\", \"http://10.0.0.2:2379\", \"http://10.0.0.3:2379\"]", &format!("[\"http://{free}\"]"))
        .replace("password_file = \"etcd-password\"", "password = \"hunter2-pw\"")
        .replace("127.0.0.1:9102", "127.0.0.1:0");
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;
    let mut child = Command::new(env!("CARGO_BIN_EXE_dnsplan-planner"))
        .arg("--config")
        .arg(&config)
        .env("RUST_LOG", "debug,h2=info,tower=info,hyper=info")
        .env_remove("DNSPLAN_ETCD_PASSWORD")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let started = Instant::now();
    let mut lines = Vec::new();
    // The wait is announced, then at least three more attempts follow (200 ms, 400 ms, 800 ms
    // apart): the planner neither exits nor gives up.
    while lines.iter().filter(|l: &&String| l.contains("still unreachable")).count() < 3 {
        let line = rx.recv_timeout(WITHIN.saturating_sub(started.elapsed()))?;
        lines.push(line);
        assert!(child.try_wait()?.is_none(), "the planner exited while etcd was away: {lines:#?}");
    }
    let waits = lines.iter().filter(|l| l.contains("cannot reach the store on etcd at start")).count();
    assert_eq!(waits, 1, "the wait is announced once: {lines:#?}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    anyhow::ensure!(status.success(), "kill -TERM failed");
    let deadline = Instant::now() + WITHIN;
    let exit = loop {
        if let Some(exit) = child.try_wait()? {
            break exit;
        }
        anyhow::ensure!(Instant::now() < deadline, "the planner did not stop within {WITHIN:?} of SIGTERM");
        lines.extend(rx.recv_timeout(Duration::from_millis(100)).ok());
    };
    lines.extend(rx.try_iter());
    assert!(exit.success(), "SIGTERM while waiting must be a clean stop: {exit:?}\n{lines:#?}");
    assert!(lines.iter().all(|l| !l.contains("hunter2")), "the password is in the log: {lines:#?}");
    Ok(())
}
