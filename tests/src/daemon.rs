//! Real daemon processes for tests: started with JSON logs that are followed line by line (no
//! polling), signalled (SIGSTOP, SIGCONT, SIGTERM), and killed with SIGKILL when dropped.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;

/// One log event: which daemon said what, about which generation (from the event's fields or
/// its span).
#[derive(Clone, Debug)]
pub struct LogLine {
    pub who: String,
    /// `TRACE` to `ERROR`.
    pub level: String,
    pub message: String,
    pub generation: Option<u64>,
    /// The event's `error` field, if it has one.
    pub error: Option<String>,
}

/// Reads one JSON log line of `tracing-subscriber`; `None` for anything else.
pub fn parse(who: &str, line: &str) -> Option<LogLine> {
    let value: serde_json::Value = serde_json::from_str(line).ok()?;
    let message = value.pointer("/fields/message")?.as_str()?.to_owned();
    let generation = [value.pointer("/fields/generation"), value.pointer("/span/generation")]
        .into_iter()
        .flatten()
        .find_map(|g| g.as_str().and_then(|s| s.parse().ok()).or(g.as_u64()));
    let level = value.get("level").and_then(|l| l.as_str()).unwrap_or_default().to_owned();
    let error = value.pointer("/fields/error").and_then(|e| e.as_str()).map(str::to_owned);
    Some(LogLine { who: who.into(), level, message, generation, error })
}

pub struct Daemon {
    pub who: String,
    child: Child,
}

impl Daemon {
    /// Starts `bin args… --log-format json` with `RUST_LOG=info` and no `DNSPLAN_TOKEN`, and
    /// sends each log line, parsed, to `lines`.
    pub fn spawn(bin: &Path, args: &[&str], who: &str, lines: mpsc::UnboundedSender<LogLine>) -> anyhow::Result<Daemon> {
        let mut child = Command::new(bin)
            .args(args)
            .args(["--log-format", "json"])
            .env("RUST_LOG", "info")
            .env_remove("DNSPLAN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?;
        let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
        let owner = who.to_owned();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(parsed) = parse(&owner, &line) {
                    let _ = lines.send(parsed);
                }
            }
        });
        Ok(Daemon { who: who.into(), child })
    }

    /// Takes charge of a process started elsewhere (SIGKILL on drop).
    pub fn adopt(who: &str, child: Child) -> Daemon {
        Daemon { who: who.into(), child }
    }

    pub fn signal(&self, signal: &str) -> anyhow::Result<()> {
        let status = Command::new("kill").args([signal, &self.child.id().to_string()]).status()?;
        anyhow::ensure!(status.success(), "kill {signal} {} failed", self.who);
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads log lines until one satisfies `want`, within `within`; every line read is also
/// given to `seen` (to keep a log).
pub async fn until(
    lines: &mut mpsc::UnboundedReceiver<LogLine>,
    within: Duration,
    mut seen: impl FnMut(&LogLine),
    mut want: impl FnMut(&LogLine) -> bool,
) -> anyhow::Result<LogLine> {
    let wait = async {
        while let Some(line) = lines.recv().await {
            seen(&line);
            if want(&line) {
                return Ok(line);
            }
        }
        anyhow::bail!("the daemons' logs ended")
    };
    tokio::time::timeout(within, wait).await.map_err(|_| anyhow::anyhow!("the expected log line did not come within {within:?}"))?
}

/// A child process killed when dropped.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `command` with stderr on a pipe (never a terminal), stdout discarded,
/// `RUST_LOG=info` and neither `NO_COLOR` nor `DNSPLAN_TOKEN` (so that only the pipe can turn
/// colours off), reads its stderr until a line contains `until`, kills it and returns every
/// line read. Fails when the process ends first or nothing matched within `within`.
pub fn log_lines_until(command: &mut Command, until: &str, within: Duration) -> anyhow::Result<Vec<String>> {
    let mut child = Killed(
        command
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .env_remove("DNSPLAN_TOKEN")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()?,
    );
    let stderr = child.0.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr"))?;
    let (tx, rx) = std::sync::mpsc::channel();
    // Ends when the process closes stderr (it ends, or is killed on return).
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = std::time::Instant::now() + within;
    let mut lines = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) => {
                let done = line.contains(until);
                lines.push(line);
                if done {
                    return Ok(lines);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                anyhow::bail!("no log line with {until:?} within {within:?}; read:\n{}", lines.join("\n"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.0.wait()?;
                anyhow::bail!("the process ended ({status}) before a log line with {until:?}; read:\n{}", lines.join("\n"))
            }
        }
    }
}

/// Checks log lines as `--log-format text` on a pipe must be: no ANSI escape anywhere (a file
/// or a log collector would keep them as text), and some line at all.
pub fn assert_plain_text(lines: &[String]) {
    assert!(!lines.is_empty(), "no log line");
    for line in lines {
        assert!(!line.contains('\x1b'), "an ANSI escape in a log line written to a pipe: {line:?}");
    }
}

/// Checks log lines as `--log-format json` must be: each one JSON object with a level and a
/// message.
pub fn assert_json_lines(lines: &[String]) {
    assert!(!lines.is_empty(), "no log line");
    for line in lines {
        let value: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|err| panic!("not a JSON line ({err}): {line:?}"));
        assert!(value["level"].is_string(), "no level: {line}");
        assert!(value.pointer("/fields/message").is_some_and(serde_json::Value::is_string), "no message: {line}");
    }
}
