//! Process plumbing shared by dnsplan's daemons (feature `daemon`): tracing setup and the
//! `--log-format` flag, the shutdown signal, TOML config loading with errors that name the
//! file, key and line, and the control token's environment variable.

use serde::de::DeserializeOwned;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// Environment variable that supplies (and overrides) the control API's bearer token, for the
/// authority that checks it and for every client that sends it.
pub const TOKEN_ENV: &str = "DNSPLAN_TOKEN";

/// The tokens printed in the examples and the demo. Anyone who read the README knows them, so
/// the authority refuses them, except `dnsplan up` with its control API on loopback.
pub const PLACEHOLDER_TOKENS: [&str; 2] = ["dnsplan-demo-token-change-me", "change-me-to-a-long-random-token"];

/// Whether `token` is one of [`PLACEHOLDER_TOKENS`].
pub fn is_placeholder_token(token: &str) -> bool {
    PLACEHOLDER_TOKENS.contains(&token)
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path}: {detail}")]
    Parse { path: PathBuf, detail: String },
    #[error("config file {path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
}

impl ConfigError {
    pub fn invalid(path: &Path, detail: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { path: path.into(), detail: detail.into() }
    }
}

/// Reads and parses a TOML config file. Types should `deny_unknown_fields`, so that a typo is
/// an error naming the key and the line rather than a silently ignored setting.
pub fn load_toml<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.into(), source })?;
    toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.into(), detail: e.to_string() })
}

/// `relative` resolved against the directory of the config file at `config_path`.
pub fn relative_to_config(config_path: &Path, relative: &Path) -> PathBuf {
    if relative.is_absolute() { relative.into() } else { config_path.parent().unwrap_or(Path::new(".")).join(relative) }
}

/// Prints one line for the person who started the daemon (where it listens). A closed or
/// broken stdout is ignored: a daemon must not die because nobody reads its banner.
pub fn announce(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// The `Content-Type` of every `/metrics` response.
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The labels every series of a daemon's own metrics carries: its id under `key` (`planner`,
/// `enactor`), and `dns_zone` for the loop of a zone added to the store, so that one process's
/// zones are one family per metric (the first zone's series carry no `dns_zone`).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct DaemonLabels {
    key: &'static str,
    pub id: std::sync::Arc<String>,
    pub dns_zone: Option<std::sync::Arc<String>>,
}

impl DaemonLabels {
    pub fn new(key: &'static str, id: std::sync::Arc<String>, dns_zone: Option<&str>) -> DaemonLabels {
        DaemonLabels { key, id, dns_zone: dns_zone.map(|z| std::sync::Arc::new(z.to_owned())) }
    }
}

impl prometheus_client::encoding::EncodeLabelSet for DaemonLabels {
    fn encode(&self, encoder: &mut prometheus_client::encoding::LabelSetEncoder) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeLabel;
        (self.key, self.id.as_str()).encode(encoder.encode_label())?;
        if let Some(zone) = &self.dns_zone {
            ("dns_zone", zone.as_str()).encode(encoder.encode_label())?;
        }
        Ok(())
    }
}

/// A registry as Prometheus (OpenMetrics) text.
pub fn metrics_text(registry: &prometheus_client::registry::Registry) -> String {
    metrics_text_of(&[registry])
}

/// Several registries as one OpenMetrics exposition (the one-process stack serves the
/// authority's, the planner's and the enactors' metrics together).
pub fn metrics_text_of(registries: &[&prometheus_client::registry::Registry]) -> String {
    use prometheus_client::encoding::text::{encode_eof, encode_registry};
    let mut out = String::new();
    // Writing into a String cannot fail.
    for registry in registries {
        let _ = encode_registry(&mut out, registry);
    }
    let _ = encode_eof(&mut out);
    out
}

/// The control token: `DNSPLAN_TOKEN` if set, else the configured one.
pub fn token_from_env_or(configured: Option<String>) -> Option<String> {
    std::env::var(TOKEN_ENV).ok().filter(|t| !t.is_empty()).or(configured)
}

/// First wait of a daemon that cannot reach its store at start; it doubles up to
/// [`START_RETRY_MAX`]. Short, so a daemon started together with its store starts at once.
pub const START_RETRY_MIN: std::time::Duration = std::time::Duration::from_millis(200);
/// Longest wait between attempts at start: a daemon follows its store within this long of the
/// store coming back. An attempt costs a refused connect per member (or one connect timeout
/// for an unreachable one), so trying every second for hours costs nothing.
pub const START_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Why one attempt to reach the store at start failed.
#[derive(Debug)]
pub enum StartFailure {
    /// Waiting will not help (a bad setting): the daemon exits with this.
    Fatal(String),
    /// The store did not answer or refused for now: try again.
    Retry(String),
}

/// Runs `attempt` until it succeeds, waiting [`START_RETRY_MIN`] doubling to
/// [`START_RETRY_MAX`] between attempts, or until `shutdown` (then `Ok(None)`). The first
/// failure is a WARN line saying that the daemon waits and why; later ones are logged again
/// only when the reason changes (else at debug), and success after a failure is an INFO line.
/// A `Fatal` failure ends it with that error.
pub async fn start_with_retry<T, F, Fut>(
    what: &str,
    mut attempt: F,
    mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Result<Option<T>, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StartFailure>>,
{
    let mut wait = START_RETRY_MIN;
    let mut last: Option<String> = None;
    let mut attempts = 0u64;
    loop {
        attempts += 1;
        let result = tokio::select! {
            _ = shutdown.as_mut() => return Ok(None),
            result = attempt() => result,
        };
        match result {
            Ok(value) => {
                if last.is_some() {
                    tracing::info!(attempts, "reached {what}");
                }
                return Ok(Some(value));
            }
            Err(StartFailure::Fatal(err)) => return Err(err),
            Err(StartFailure::Retry(err)) => {
                if last.as_deref() != Some(err.as_str()) {
                    tracing::warn!(error = %err, attempts, retry_max_secs = START_RETRY_MAX.as_secs(), "cannot reach {what} at start; waiting for it, retrying with backoff");
                } else {
                    tracing::debug!(error = %err, attempts, wait_ms = wait.as_millis() as u64, "{what} still unreachable");
                }
                last = Some(err);
            }
        }
        tokio::select! {
            _ = shutdown.as_mut() => return Ok(None),
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(START_RETRY_MAX);
    }
}

/// Whether something a running daemon calls (its store, an RFC 2136 server) answers, so that
/// an outage is logged once when it begins (WARN) and once when it ends (INFO, with the count
/// of calls that failed meanwhile), not on every failed call.
#[derive(Debug)]
pub struct Reachability {
    what: std::borrow::Cow<'static, str>,
    down: std::sync::atomic::AtomicBool,
    /// Calls that failed since the outage began.
    failures: std::sync::atomic::AtomicU64,
}

impl Reachability {
    pub const fn new(what: &'static str) -> Reachability {
        Reachability::starting(std::borrow::Cow::Borrowed(what), false)
    }

    /// As `new`, for a name known at run time (`the RFC 2136 server 192.0.2.1:53`).
    pub fn named(what: String) -> Reachability {
        Reachability::starting(std::borrow::Cow::Owned(what), false)
    }

    const fn starting(what: std::borrow::Cow<'static, str>, down: bool) -> Reachability {
        Reachability { what, down: std::sync::atomic::AtomicBool::new(down), failures: std::sync::atomic::AtomicU64::new(0) }
    }

    /// A call failed because it got no answer: WARN if it answered until now. Returns
    /// whether this failure began the outage.
    pub fn failed(&self, err: &dyn std::fmt::Display) -> bool {
        let began = !self.down.swap(true, std::sync::atomic::Ordering::Relaxed);
        self.failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if began {
            tracing::warn!(error = %err, "{} unreachable; retrying quietly until it answers", self.what);
        } else {
            tracing::debug!(error = %err, "{} still unreachable", self.what);
        }
        began
    }

    /// A call got an answer: INFO if it was unreachable until now.
    pub fn answered(&self) {
        if self.down.swap(false, std::sync::atomic::Ordering::Relaxed) {
            let failed = self.failures.swap(0, std::sync::atomic::Ordering::Relaxed);
            tracing::info!(failed_calls = failed, "{} reachable again", self.what);
        }
    }

    /// Not reached yet, before the first call (a daemon starting while its store is away).
    pub const fn unreached(what: &'static str) -> Reachability {
        Reachability::starting(std::borrow::Cow::Borrowed(what), true)
    }

    /// Sets the state without a log line, for a caller that logged the change itself.
    pub fn mark_quietly(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How a daemon writes its log lines (on stderr): `--log-format`, the same flag on every
/// daemon (`dnsplan-authority`, `dnsplan-enactor`, `dnsplan-planner`, `dnsplan up`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// For people: one line an event, coloured only on a terminal.
    #[default]
    Text,
    /// For log collectors: one JSON object a line.
    Json,
}

/// The logging flags every daemon flattens into its command line, so that the flag's name,
/// values and help are the same everywhere.
#[derive(Clone, Debug, clap::Args)]
pub struct LogArgs {
    /// Log lines on stderr: `text` (coloured only when stderr is a terminal and `NO_COLOR` is
    /// unset) or `json` (one object a line). `RUST_LOG` filters them (default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Whether log lines carry ANSI colour codes: only for a terminal (a file, pipe or journal
/// would keep the escape codes as text), and never with `NO_COLOR` set to anything but the
/// empty string (<https://no-color.org>).
pub fn ansi_wanted(stream_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stream_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs a tracing subscriber on stderr: `RUST_LOG` filter (default `info`), text or JSON
/// lines, colours as [`ansi_wanted`] says for stderr.
pub fn init(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = ansi_wanted(std::io::stderr().is_terminal(), std::env::var_os("NO_COLOR").as_deref());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT). The handlers are installed when this is called,
/// not when the future is first polled, so a signal that arrives while the daemon is still
/// busy starting up is not lost (nor does it kill the process with the default action).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams = signal(SignalKind::terminate()).and_then(|term| Ok((term, signal(SignalKind::interrupt())?)));
        async move {
            match streams {
                Ok((mut term, mut int)) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = int.recv() => {}
                    }
                }
                Err(err) => {
                    tracing::warn!(%err, "cannot listen for SIGTERM; only Ctrl-C stops this process");
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
            tracing::info!("shutdown requested");
        }
    }
    #[cfg(not(unix))]
    async move {
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("shutdown requested");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;

    /// Colours only on a terminal, and `NO_COLOR` (any value but empty) turns them off there
    /// too.
    #[test]
    fn ansi_only_on_a_terminal_without_no_color() {
        let cases = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("0"), false),
            (false, None, false),
            (false, Some("1"), false),
        ];
        for (terminal, no_color, want) in cases {
            assert_eq!(ansi_wanted(terminal, no_color.map(OsStr::new)), want, "terminal {terminal}, NO_COLOR {no_color:?}");
        }
    }

    /// An outage begins once and ends once, however many calls fail in between.
    #[test]
    fn reachability_changes_state_once_per_outage() {
        let reach = Reachability::new("the store");
        assert!(!reach.is_down());
        assert!(reach.failed(&"refused"), "the first failure begins the outage");
        assert!(!reach.failed(&"refused"), "later failures are the same outage");
        assert!(reach.is_down());
        reach.answered();
        assert!(!reach.is_down());
        assert!(reach.failed(&"refused"), "a new outage begins again");
    }

    /// Retries with backoff until the attempt succeeds; a fatal failure ends it; shutdown
    /// while waiting is `None`. Time is paused, so the backoff costs nothing here.
    #[tokio::test(start_paused = true)]
    async fn start_with_retry_backs_off_until_it_gets_through() {
        let mut calls = 0;
        let started = tokio::time::Instant::now();
        let never = std::future::pending::<()>();
        tokio::pin!(never);
        let got = start_with_retry(
            "the store",
            || {
                calls += 1;
                let n = calls;
                async move { if n < 4 { Err(StartFailure::Retry("refused".into())) } else { Ok(n) } }
            },
            never.as_mut(),
        )
        .await;
        assert_eq!(got, Ok(Some(4)));
        // 200 + 400 + 800 ms of backoff before the fourth attempt.
        assert_eq!(started.elapsed(), std::time::Duration::from_millis(1_400));

        let fatal = start_with_retry("the store", || async { Err::<(), _>(StartFailure::Fatal("bad".into())) }, never.as_mut()).await;
        assert_eq!(fatal, Err("bad".to_string()));

        let stop = tokio::time::sleep(std::time::Duration::from_secs(30));
        tokio::pin!(stop);
        let stopped = start_with_retry("the store", || async { Err::<(), _>(StartFailure::Retry("refused".into())) }, stop.as_mut()).await;
        assert_eq!(stopped, Ok(None));
    }

    /// `--log-format` takes `text` and `json` and nothing else, and defaults to `text`.
    #[test]
    fn log_format_values() {
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            log: LogArgs,
        }
        let parse = |args: &[&str]| Cli::try_parse_from(std::iter::once("daemon").chain(args.iter().copied())).map(|c| c.log.log_format);
        assert_eq!(parse(&[]).ok(), Some(LogFormat::Text));
        assert_eq!(parse(&["--log-format", "json"]).ok(), Some(LogFormat::Json));
        assert_eq!(parse(&["--log-format", "text"]).ok(), Some(LogFormat::Text));
        let err = parse(&["--log-format", "yaml"]).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("possible values: text, json"), "{err}");
    }
}
