//! The `dnsplan-enactor` binary: the shipped example config loads, a bad config is a clear
//! error naming the key and line, metrics are served, and SIGTERM stops it with exit 0.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};

fn enactor(config: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dnsplan-enactor"));
    cmd.arg("--config").arg(config).env_remove("DNSPLAN_TOKEN");
    cmd
}

#[test]
fn the_example_config_loads() -> anyhow::Result<()> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/enactor.toml");
    let config = dnsplan_enactor::EnactorConfig::load(&example, None, None)?;
    assert_eq!((config.id.as_str(), config.zone.as_str()), ("enactor-a", "a"));
    assert_eq!(config.cleanup.retain_plans, 20);
    Ok(())
}

/// The example's commented `[target]` section, uncommented, loads as an RFC 2136 target with
/// its key read from the file next to the config; broken variants of it are clear errors.
#[test]
fn the_example_rfc2136_target_loads() -> anyhow::Result<()> {
    use dnsplan_enactor::config::Target;
    let example = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/enactor.toml"))?;
    let start = example.find("# [target]").ok_or_else(|| anyhow::anyhow!("the example documents no [target]"))?;
    let end = start + example[start..].find("\n\n").ok_or_else(|| anyhow::anyhow!("the [target] section does not end"))?;
    let section: String = example[start..end].lines().map(|l| format!("{}\n", l.strip_prefix("# ").unwrap_or(l))).collect();
    let uncommented = format!("{}{section}{}", &example[..start], &example[end..]);
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("enactor.toml");
    std::fs::write(&config, &uncommented)?;
    std::fs::write(dir.path().join("dnsplan-enactor.key"), "ZG5zcGxhbi1lbmFjdG9yLWtub3QtdGVzdC1zZWNyZXQ=\n")?;
    let loaded = dnsplan_enactor::EnactorConfig::load(&config, None, None)?;
    match loaded.settings().target {
        Target::Rfc2136(t) => {
            assert_eq!(t.server.to_string(), "192.0.2.53:53");
            assert_eq!(t.dns_zone.as_str(), "example.test.");
            assert_eq!(t.key.name().to_string(), "dnsplan-enactor.");
            assert_eq!((t.timeout.as_millis(), t.attempts, t.in_flight), (2_000, 3, 8));
        }
        Target::Store => anyhow::bail!("the example's target loaded as the store"),
    }
    let cases = [
        (uncommented.replace("secret_file = \"dnsplan-enactor.key\"", ""), "target.key: TSIG key dnsplan-enactor: no secret"),
        (uncommented.replace("dnsplan-enactor.key", "missing.key"), "cannot read secret_file"),
        (uncommented.replace("kind = \"rfc2136\"", "kind = \"nsupdate\""), "unknown variant `nsupdate`"),
        (uncommented.replace("attempts = 3", "attempts = 0"), "target.attempts"),
        (uncommented.replace("in_flight = 8", "in_flight = 65"), "target.in_flight: 65 must be in 1..=64"),
        (uncommented.replace("enabled = false\ndns_server = \"127.0.0.1:5353\"", "enabled = true"), "verify.dns_server: with"),
    ];
    for (text, want) in cases {
        std::fs::write(&config, &text)?;
        let out = enactor(&config).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{want}: the enactor started");
        assert!(stderr.contains(want), "{want:?} not in: {stderr}");
        assert!(!stderr.contains("ZG5zcGxh"), "the secret is never printed: {stderr}");
    }
    Ok(())
}

#[test]
fn bad_config_is_a_clear_error() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("enactor.toml");
    let base = "id = \"a\"\nzone = \"a\"\n[store]\nurl = \"http://127.0.0.1:1\"\n";
    let cases = [
        (format!("{base}[apply]\nreconcile_every = 5\n"), "reconcile_every"),
        (format!("{base}[apply]\nmax_removal_fraction = 1.5\n"), "apply.max_removal_fraction"),
        (format!("{base}[cleanup]\nretain_plans = 0\n"), "cleanup.retain_plans"),
        (format!("{base}[apply]\nbatch_size = 5000\n"), "apply.batch_size"),
        (format!("{base}[apply]\nfull_write_every = 0\n"), "apply.full_write_every"),
        (format!("{base}[apply]\nretry_attempts = \"five\"\n"), "line 6"),
        ("id = \"a b\"\nzone = \"a\"\n[store]\nurl = \"http://x\"\n".to_string(), "id:"),
        ("id = \"a\"\nzone = \"a\"\n[store]\nurl = \"ftp://x\"\n".to_string(), "store.url"),
    ];
    for (text, want) in cases {
        std::fs::write(&config, &text)?;
        let out = enactor(&config).output()?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{want}: the enactor started");
        assert!(stderr.contains(want), "{want:?} not in: {stderr}");
        assert!(!stderr.contains("panicked"), "panic: {stderr}");
    }
    let out = enactor(&config).args(["--zone", "Not A Zone!"]).output()?;
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--zone"));
    Ok(())
}

#[tokio::test]
async fn serves_metrics_and_stops_on_sigterm() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("enactor.toml");
    // No store is running: the enactor must stay up, retry, and say so in its metrics.
    std::fs::write(
        &config,
        "id = \"en-m\"\nzone = \"a\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[apply]\nretry_base_ms = 1\nretry_max_ms = 5\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
    )?;
    let mut child = enactor(&config).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut url = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("metrics") {
            url = Some(rest.trim().to_owned());
            break;
        }
    }
    let url = url.ok_or_else(|| anyhow::anyhow!("the enactor did not say where its metrics are"))?;
    let body = reqwest::get(&url).await?.text().await?;
    assert!(body.contains("dnsplan_enactor_plans_applied_total{enactor=\"en-m\"}"), "{body}");
    assert!(body.contains("dnsplan_enactor_apply_duration_seconds"), "{body}");
    let status = Command::new("kill").args(["-TERM", &child.id().to_string()]).status()?;
    assert!(status.success());
    let exit = child.wait()?;
    assert!(exit.success(), "exit after SIGTERM: {exit}");
    Ok(())
}

/// The daemon with several `dns_zones` serves one family per metric, each zone's loop a series
/// labelled `dns_zone`: every `# HELP` and `# TYPE` line once, as Prometheus requires to parse
/// the page. Teeth, checked once: with the metrics of each zone registered in a sub-registry
/// labelled `dns_zone` (as before), "repeated: # HELP dnsplan_enactor_apply_duration_seconds".
#[tokio::test]
async fn several_zones_are_one_family_per_metric() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("enactor.toml");
    // No store is running: the loops look for their zones; the metrics are served meanwhile.
    std::fs::write(
        &config,
        "id = \"en-z\"\nzone = \"a\"\ndns_zones = [\"one.test.\", \"two.test.\"]\n[store]\nurl = \"http://127.0.0.1:1\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n",
    )?;
    let child = enactor(&config).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?;
    let mut child = Running(child);
    let stdout = child.0.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let url = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("metrics").map(|rest| rest.trim().to_owned()))
        .ok_or_else(|| anyhow::anyhow!("the enactor did not say where its metrics are"))?;
    let body = reqwest::get(&url).await?.text().await?;
    dnsplan_tests::exposition::assert_each_family_described_once(&body);
    for zone in ["one.test.", "two.test."] {
        let want = format!("dnsplan_enactor_plans_applied_total{{enactor=\"en-z\",dns_zone=\"{zone}\"}} 0");
        assert!(body.lines().any(|l| l == want), "want {want:?} in\n{body}");
    }
    Ok(())
}

/// A process killed when dropped, so that a failing test leaves none behind.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long anything we wait for may take: far more than the listener's 10 s header timeout.
const DEADLINE: std::time::Duration = std::time::Duration::from_secs(30);

/// The metrics listener serves through the daemons' bounded HTTP server
/// (`dnsplan_common::http_server` with `Limits::METRICS`): a connection that sends half a
/// request head is closed after the 10 s header timeout, a whole request is answered
/// meanwhile, and its connections are counted. With `axum::serve` (as before) the half-sent
/// request was held for as long as the client liked: checked once, the test failed after
/// `DEADLINE`.
#[test]
fn the_metrics_listener_closes_half_sent_requests() -> anyhow::Result<()> {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("enactor.toml");
    std::fs::write(&config, "id = \"en-h\"\nzone = \"a\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n")?;
    let mut child = Running(enactor(&config).stdout(Stdio::piped()).stderr(Stdio::null()).spawn()?);
    let stdout = child.0.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut addr = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if let Some(rest) = line.strip_prefix("metrics") {
            addr = rest.trim().strip_prefix("http://").and_then(|r| r.strip_suffix("/metrics")).map(str::to_owned);
            break;
        }
    }
    let addr = addr.ok_or_else(|| anyhow::anyhow!("the enactor did not say where its metrics are"))?;

    let started = std::time::Instant::now();
    let mut half = std::net::TcpStream::connect(&addr)?;
    half.write_all(b"GET /metrics HTTP/1.1\r\nHost: te")?;

    let mut whole = std::net::TcpStream::connect(&addr)?;
    whole.set_read_timeout(Some(DEADLINE))?;
    whole.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    whole.read_to_string(&mut answer)?;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    half.set_read_timeout(Some(DEADLINE))?;
    let mut rest = Vec::new();
    match half.read_to_end(&mut rest) {
        Ok(_) => {}
        Err(err) if matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
            anyhow::bail!("a half-sent request was still held after {:?}", started.elapsed())
        }
        Err(_) => {} // reset: closed too
    }
    assert!(started.elapsed() >= std::time::Duration::from_secs(10), "closed before the header timeout: {:?}", started.elapsed());
    // Both connections were open when the whole request was answered.
    assert!(answer.contains("dnsplan_enactor_http_connections{enactor=\"en-h\"} 2"), "{answer}");
    drop(child);
    Ok(())
}

/// Log lines on a pipe: `text` (the default) carries no ANSI colour codes, since stderr is
/// not a terminal, and `--log-format json` is one JSON object a line. Before colours
/// followed the stream, the text lines came with escapes (`\x1b[2m`); checked once.
#[test]
fn logs_on_a_pipe_are_plain_text_or_json_lines() -> anyhow::Result<()> {
    use dnsplan_tests::daemon::{assert_json_lines, assert_plain_text, log_lines_until};
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("enactor.toml");
    // No store is running: the enactor starts and logs all the same.
    std::fs::write(&config, "id = \"en-l\"\nzone = \"a\"\n[store]\nurl = \"http://127.0.0.1:1\"\n[metrics]\nlisten = \"127.0.0.1:0\"\n")?;
    assert_plain_text(&log_lines_until(&mut enactor(&config), "enactor running", DEADLINE)?);
    assert_json_lines(&log_lines_until(enactor(&config).args(["--log-format", "json"]), "enactor running", DEADLINE)?);
    Ok(())
}
