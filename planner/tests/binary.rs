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
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/planner.toml");
    let dir = tempfile::tempdir()?;
    // The example, with no store running and metrics on a free port.
    let text = std::fs::read_to_string(example)?.replace("127.0.0.1:8053", "127.0.0.1:1").replace("127.0.0.1:9102", "127.0.0.1:0");
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_dnsplan-planner"))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let first = BufReader::new(stdout).lines().next().transpose()?.unwrap_or_default();
    let addr = first
        .strip_prefix("metrics")
        .and_then(|rest| rest.trim().strip_prefix("http://"))
        .and_then(|rest| rest.strip_suffix("/metrics"))
        .ok_or_else(|| anyhow::anyhow!("the planner did not say where its metrics are: {first:?}"))?
        .to_owned();

    let started = std::time::Instant::now();
    let mut half = std::net::TcpStream::connect(&addr)?;
    half.write_all(b"GET /v1/status HTTP/1.1\r\nHost: te")?;

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
    assert!(answer.contains("dnsplan_planner_http_connections{planner=\"planner-1\"} 2"), "{answer}");
    drop(child);
    Ok(())
}

/// Log lines on a pipe: `text` (the default) carries no ANSI colour codes, since stderr is
/// not a terminal, and `--log-format json` is one JSON object a line. Before colours
/// followed the stream, the text lines came with escapes (`\x1b[2m`); checked once.
#[test]
fn logs_on_a_pipe_are_plain_text_or_json_lines() -> anyhow::Result<()> {
    use dnsplan_tests::daemon::{assert_json_lines, assert_plain_text, log_lines_until};
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/planner.toml");
    let dir = tempfile::tempdir()?;
    // The example, with no store running and metrics on a free port.
    let text = std::fs::read_to_string(example)?.replace("127.0.0.1:8053", "127.0.0.1:1").replace("127.0.0.1:9102", "127.0.0.1:0");
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, text)?;
    let planner = || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_dnsplan-planner"));
        command.arg("--config").arg(&config);
        command
    };
    assert_plain_text(&log_lines_until(&mut planner(), "planner running", DEADLINE)?);
    assert_json_lines(&log_lines_until(planner().args(["--log-format", "json"]), "planner running", DEADLINE)?);
    Ok(())
}

/// The daemon plans each `[[zone]]` of its config beside `dns_zone`: `/v1/zones` lists every
/// zone's status, `/v1/status` is the first zone's, and `/metrics` has one family per metric,
/// the `[[zone]]`'s series labelled `dns_zone`. (No store runs: the planners wait for it.)
#[tokio::test]
async fn several_zones_are_planned_and_listed() -> anyhow::Result<()> {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/planner.toml");
    let dir = tempfile::tempdir()?;
    let zone = "\n[[zone]]\ndns_zone = \"shop.test.\"\n[[zone.endpoint]]\nname = \"api.shop.test.\"\nttl_secs = 30\n\
                check = { kind = \"tcp\", port = 9 }\n[[zone.endpoint.target]]\naddress = \"127.0.0.41\"\nzone = \"a\"\n";
    let text = std::fs::read_to_string(example)?.replace("127.0.0.1:8053", "127.0.0.1:1").replace("127.0.0.1:9102", "127.0.0.1:0");
    let config = dir.path().join("planner.toml");
    std::fs::write(&config, format!("{text}{zone}"))?;
    let mut child = Running(
        Command::new(env!("CARGO_BIN_EXE_dnsplan-planner"))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let stdout = child.0.stdout.take().ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let first = lines.next().transpose()?.unwrap_or_default();
    let url = first.strip_prefix("metrics").map(str::trim).ok_or_else(|| anyhow::anyhow!("no metrics line: {first:?}"))?.to_owned();
    let announced = lines.next().transpose()?.unwrap_or_default();
    assert!(announced.contains("and 1 more zone"), "{announced}");
    let base = url.trim_end_matches("/metrics");
    let zones: serde_json::Value = reqwest::get(format!("{base}/v1/zones")).await?.json().await?;
    let listed: Vec<&str> = zones.as_array().map(|z| z.iter().filter_map(|z| z["dns_zone"].as_str()).collect()).unwrap_or_default();
    assert_eq!(listed, ["example.test.", "shop.test."], "{zones}");
    assert_eq!(zones[1]["planner"]["id"].as_str(), Some("planner-1"), "{zones}");
    let metrics = reqwest::get(&url).await?.text().await?;
    dnsplan_tests::exposition::assert_each_family_described_once(&metrics);
    for want in
        ["dnsplan_planner_active{planner=\"planner-1\"} 0", "dnsplan_planner_active{planner=\"planner-1\",dns_zone=\"shop.test.\"} 0"]
    {
        assert!(metrics.lines().any(|l| l == want), "want {want:?} in\n{metrics}");
    }
    drop(child);
    Ok(())
}
