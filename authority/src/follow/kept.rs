//! What an authority on etcd keeps of a zone it serves, in a directory of its own disk: the
//! state last saved (`served-state`, `local_state`) and the log of changes served since
//! (`served-log`, `serving::local_log`). [`open`] reads both back at start, so the zone is
//! answered from them at once, before etcd answers; [`keeper`] writes the state again as it
//! changes. The store's first zone keeps them in `data_dir`, each zone added beside it in its
//! own directory (`added::saved`): one copy of the rules for every zone.

use crate::follow::image;
use crate::follow::local_state;
use crate::serving::local_log::{self, LocalLog};
use crate::zone::dns_zone::StaticZone;
use crate::zone::snapshot::Snapshot;
use dnsplan_common::store::ActiveDelta;
use std::path::Path;
use std::sync::Arc;

/// Where the state an authority serves is kept for its next start.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Keeping {
    /// On its own disk (this module), served before the store answers: on etcd.
    OnDisk,
    /// In the store, on the same disk (the embedded store; the first zone has its serving
    /// image beside it, `image`).
    InStore,
}

/// The state kept in a directory, as read back at start.
pub struct Kept {
    /// The saved state with the logged changes merged over it, and the applied-change count
    /// it was saved at; `None` when there is none (a first start) or it was refused (said in
    /// a log line): then the zone is answered once the store is read.
    pub state: Option<(Snapshot, u64)>,
    /// The log each change is made durable in before it is served; `None` when it cannot be
    /// opened (said in an ERROR line: a restart may then answer with the older saved state).
    pub served_log: Option<Arc<LocalLog>>,
}

impl Kept {
    /// The keeper of this directory's saved state: writes it as the served state changes,
    /// emptying the log of what each write saves.
    pub fn keeper(&self, dir: &Path) -> Arc<image::Keeper> {
        keeper(dir, self.state.as_ref().map(|(_, saved_at)| *saved_at), self.served_log.clone())
    }
}

/// The keeper of the state saved in `dir`: `saved`, the applied-change count of the state read
/// back at start (`None`: none was, so it is written at once).
pub fn keeper(dir: &Path, saved: Option<u64>, served_log: Option<Arc<LocalLog>>) -> Arc<image::Keeper> {
    let path = local_state::path_in(dir);
    match served_log {
        Some(log) => image::Keeper::with_served_log(path, saved, local_state::SAVE_INTERVAL, log),
        None => image::Keeper::new(path, saved, local_state::SAVE_INTERVAL),
    }
}

/// Reads back what `dir` keeps of `zone`: the saved state, and the log's changes after it
/// merged over it. Without a saved state, the log's changes have no base to apply to, so it
/// is emptied. Every refusal is a log line naming the file; none is an error of the start.
pub async fn open(dir: &Path, zone: Arc<StaticZone>) -> anyhow::Result<Kept> {
    let state_path = local_state::path_in(dir);
    let read = {
        let (file, zone) = (state_path.clone(), zone);
        tokio::task::spawn_blocking(move || image::read(&file, zone)).await?
    };
    let base = match &read {
        Ok(Some((_, snapshot))) => Some(snapshot.applied_changes),
        _ => None,
    };
    let (served_log, changes) = open_log(dir, base).await?;
    let state = match read {
        Ok(Some((_, snapshot))) => {
            let saved_at = snapshot.applied_changes;
            let logged = changes.len();
            let snapshot =
                tokio::task::spawn_blocking(move || changes.iter().fold(snapshot, |snapshot, delta| snapshot.apply(delta))).await?;
            tracing::info!(
                applied_changes = snapshot.applied_changes,
                endpoints = snapshot.managed_count(),
                logged_changes = logged,
                path = %state_path.display(),
                "serving the state saved on disk at once; the store is followed once it answers"
            );
            Some((snapshot, saved_at))
        }
        Ok(None) => {
            tracing::info!(path = %state_path.display(), "no saved state yet (first start); DNS answers once the store is read");
            None
        }
        Err(err) => {
            tracing::error!(error = %format!("{:#}", anyhow::Error::new(err)), "the saved state is not served; DNS answers once the store is read");
            None
        }
    };
    Ok(Kept { state, served_log })
}

/// Opens the log of served changes in `dir` and reads its changes after `base` (the saved
/// state's applied-change count); without a base they have nothing to apply to, so the log is
/// emptied. `None` when it cannot be opened (an ERROR line).
pub async fn open_log(dir: &Path, base: Option<u64>) -> anyhow::Result<(Option<Arc<LocalLog>>, Vec<ActiveDelta>)> {
    let log_path = local_log::path_in(dir);
    let opened = tokio::task::spawn_blocking(move || {
        let (log, changes) = LocalLog::open(&log_path, base.unwrap_or(u64::MAX))?;
        if base.is_none() {
            log.compact(u64::MAX)?;
        }
        Ok::<_, local_log::LogError>((Arc::new(log), changes))
    })
    .await?;
    Ok(match opened {
        Ok((log, changes)) => (Some(log), changes),
        Err(err) => {
            tracing::error!(error = %format!("{:#}", anyhow::Error::new(err)), "cannot open the log of served changes; serving without it (a restart may answer with the older saved state)");
            (None, Vec::new())
        }
    })
}
