//! The control API's credentials and TLS, read again without a restart: on SIGHUP, and when
//! the config file or a TLS file changes (checked every `control.reload_check_secs`).
//!
//! The whole file is loaded and checked as at start; only then are the new credentials and
//! the new TLS config put in force, together. A file that does not load, or a certificate
//! that does not fit its key, changes nothing and is logged with the reason. Every other key
//! of the file is read only at start, and so is whether TLS is on (`[control.tls]` added or
//! removed takes a restart, and is logged as such).

use crate::config::AuthorityConfig;
use crate::control::access::{Access, Credentials};
use crate::serving::AUDIT_TARGET;
use dnsplan_common::tls::{ServerConfig, ServerTls};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// The files whose change means a reload: the config file and its TLS files.
fn watched(path: &Path, config: &AuthorityConfig) -> Vec<PathBuf> {
    let tls = config.control.tls.iter().flat_map(|t| t.files()).map(|(_, f)| f.to_owned());
    std::iter::once(path.to_owned()).chain(tls).collect()
}

fn contents(files: &[PathBuf]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|f| std::fs::read(f).ok()).collect()
}

/// What a reload puts in force.
struct Loaded {
    credentials: Credentials,
    tls: Option<ServerConfig>,
    files: Vec<PathBuf>,
}

fn load(path: &Path) -> Result<Loaded, String> {
    let config = AuthorityConfig::load(path).map_err(|e| e.to_string())?;
    let credentials = config.credentials()?;
    let tls = config.control.tls.as_ref().map(|t| t.server_config()).transpose()?;
    Ok(Loaded { credentials, tls, files: watched(path, &config) })
}

/// Follows the config at `path` (`config` as loaded at start) until `stop` resolves,
/// putting its credentials in `access` and its TLS in `tls` at each reload.
///
/// The SIGHUP handler is installed and the files are read before this returns, not when the
/// future first runs: a SIGHUP right after the start is a reload, not the default action's
/// end of the process, and a file changed right after the start is seen as changed.
pub fn follow(
    path: PathBuf,
    config: &AuthorityConfig,
    access: Access,
    tls: Option<ServerTls>,
    check_every: Option<Duration>,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let hangups = match signal(SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(err) => {
            tracing::warn!(%err, "cannot listen for SIGHUP; credentials and TLS are read again only when their files change");
            None
        }
    };
    let files = watched(&path, config);
    let last = contents(&files);
    run(path, files, last, hangups, access, tls, check_every, stop)
}

#[allow(clippy::too_many_arguments)]
async fn run(
    path: PathBuf,
    mut files: Vec<PathBuf>,
    mut last: Vec<Option<Vec<u8>>>,
    mut hangups: Option<tokio::signal::unix::Signal>,
    access: Access,
    tls: Option<ServerTls>,
    check_every: Option<Duration>,
    stop: impl std::future::Future<Output = ()>,
) {
    let mut ticks = check_every.map(|every| {
        let mut t = tokio::time::interval(every);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    tokio::pin!(stop);
    loop {
        let why = tokio::select! {
            _ = &mut stop => return,
            Some(()) = async { match hangups.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => "SIGHUP",
            _ = async { match ticks.as_mut() { Some(t) => t.tick().await, None => std::future::pending().await } } => "a file changed",
        };
        let now = contents(&files);
        if why != "SIGHUP" && now == last {
            continue;
        }
        last = now;
        match load(&path) {
            Ok(loaded) => {
                let summary = loaded.credentials.summary();
                access.replace(loaded.credentials);
                match (&tls, loaded.tls) {
                    (Some(swap), Some(config)) => swap.store(Arc::new(config)),
                    (None, None) => {}
                    (Some(_), None) | (None, Some(_)) => tracing::warn!(
                        "[control.tls] was added or removed: that takes a restart; the control API keeps serving as it started"
                    ),
                }
                files = loaded.files;
                last = contents(&files);
                tracing::info!(target: AUDIT_TARGET, reason = why, credentials = %summary, tls = tls.is_some(), "control credentials reloaded");
            }
            Err(err) => {
                tracing::error!(reason = why, error = %err, "control credentials not reloaded; the credentials and TLS in force stay")
            }
        }
    }
}
